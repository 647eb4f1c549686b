//! Any setting from the command line or the environment by its dotted path, derived from
//! the settings struct itself: `--set ssd.capacity=200GB`, or `KVTIER__SSD__CAPACITY=200GB`
//! in the environment (path segments joined by `__`, so a key's own `_` stays). A setting
//! added to `Settings` is reachable this way with nothing else written. Values are read
//! as in the settings file: a TOML value (`true`, `3`, `["http://a:9000"]`) or, when they
//! are not one or the setting is text, the text as written (`200GB`, `/var/lib/kvtier`).
//! A path that names no setting is refused, as an unknown key in the file is.
//!
//! Order, later wins: the settings file, then the environment's `KVTIER__…` variables,
//! then the named flags (and their own `KVTIER_…` variables), then `--set`
//! (`crate::args`). [`paths`] lists every setting by its path, unset ones included: what
//! `kvtier serve --help` prints.

use kvtier_core::Error;

use crate::Settings;

/// The prefix of a generic environment override.
pub const ENV_PREFIX: &str = "KVTIER__";

/// The environment variable that sets `path`: `ssd.min_free` is `KVTIER__SSD__MIN_FREE`.
pub fn env_name(path: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        path.split('.')
            .map(str::to_ascii_uppercase)
            .collect::<Vec<_>>()
            .join("__")
    )
}

/// Every setting of `settings` by its dotted path, in path order, with its value as
/// `--set` takes it (text as written, other values as TOML writes them: `true`, `3`,
/// `["http://a:9000"]`, `{}` for an empty table of named entries such as
/// `cluster.budgets`), or `None` for a setting that is not set (`ssd.dir`, the tokens).
pub fn paths(settings: &Settings) -> Vec<(String, Option<String>)> {
    // JSON, not TOML: TOML has no way to write an unset value, and the list must name
    // those settings too.
    let mut out = Vec::new();
    if let Ok(value) = serde_json::to_value(settings) {
        flatten("", &value, &mut out);
    }
    out.sort();
    out
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, Option<String>)>) {
    use serde_json::Value;
    let value = match v {
        Value::Object(fields) if !fields.is_empty() => {
            for (k, v) in fields {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&path, v, out);
            }
            return;
        }
        Value::Object(_) => Some("{}".to_owned()),
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    };
    out.push((prefix.to_owned(), value));
}

/// `PATH=VALUE` split at its first `=`.
pub fn parse_assignment(text: &str) -> Result<(String, String), String> {
    let (path, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not KEY.PATH=VALUE"))?;
    let path = path.trim();
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(format!("`{text}`: `{path}` is not a dotted setting path"));
    }
    Ok((path.to_owned(), value.to_owned()))
}

/// The assignments `vars` (the environment) make: every `KVTIER__A__B=V` as `a.b = V`,
/// in name order (so the result does not depend on the environment's order).
pub fn from_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vars
        .into_iter()
        .filter_map(|(name, value)| {
            let rest = name.strip_prefix(ENV_PREFIX)?;
            let path = rest
                .split("__")
                .map(str::to_ascii_lowercase)
                .collect::<Vec<_>>()
                .join(".");
            Some((path, value))
        })
        .collect();
    out.sort();
    out
}

/// `settings` with each `(path, value)` of `assignments` set, in order.
pub fn apply(settings: &Settings, assignments: &[(String, String)]) -> Result<Settings, Error> {
    if assignments.is_empty() {
        return Ok(settings.clone());
    }
    let text = toml::to_string(settings).map_err(|e| {
        Error::new(kvtier_core::ErrorKind::Internal, "print the settings").with_source(e)
    })?;
    let mut root: toml::Table = text.parse().map_err(|e| {
        Error::new(kvtier_core::ErrorKind::Internal, "read the settings back").with_source(e)
    })?;
    for (path, raw) in assignments {
        set(&mut root, path, raw)
            .map_err(|m| Error::invalid(format!("setting `{path}={raw}`: {m}")))?;
    }
    let named = assignments
        .iter()
        .map(|(p, _)| p.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    toml::Value::Table(root)
        .try_into::<Settings>()
        .map_err(|e| Error::invalid(format!("settings {named}: {}", e.message())))
}

/// Sets `path` in `root` to `raw`, read as the settings file reads a value.
fn set(root: &mut toml::Table, path: &str, raw: &str) -> Result<(), String> {
    let mut segments: Vec<&str> = path.split('.').collect();
    let Some(key) = segments.pop() else {
        return Err("an empty path".into());
    };
    let mut table = root;
    for seg in segments {
        let entry = table
            .entry(seg.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry
            .as_table_mut()
            .ok_or_else(|| format!("`{seg}` is a setting, not a section"))?;
    }
    let text_setting = matches!(table.get(key), Some(toml::Value::String(_)));
    let value = if text_setting {
        toml::Value::String(raw.to_owned())
    } else {
        // A TOML value when it is one (numbers, booleans, lists), else the text.
        format!("v = {raw}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
    };
    table.insert(key.to_owned(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
    }

    #[test]
    fn any_setting_is_set_by_its_path() {
        let s = apply(
            &Settings::default(),
            &pairs(&[
                ("ram", "2GiB"),
                ("ssd.capacity", "200GB"),
                ("ssd.enabled", "false"),
                ("ssd.retries", "7"),
                ("ssd.dir", "/var/lib/kvtier/ssd"),
                ("remote.endpoints", r#"["http://127.0.0.1:9000"]"#),
                ("cluster.name", "42"),
                ("header_timeout", "250ms"),
            ]),
        )
        .unwrap();
        assert_eq!(s.ram.0, 2 << 30);
        assert_eq!(s.ssd.capacity.0, 200_000_000_000);
        assert!(!s.ssd.enabled);
        assert_eq!(s.ssd.retries, 7);
        assert_eq!(
            s.ssd.dir.as_deref(),
            Some(std::path::Path::new("/var/lib/kvtier/ssd"))
        );
        assert_eq!(s.remote.endpoints, ["http://127.0.0.1:9000"]);
        // A text setting keeps the text, even when it reads as a number.
        assert_eq!(s.cluster.name, "42");
        assert_eq!(s.header_timeout.0, std::time::Duration::from_millis(250));
        // Everything else keeps its value.
        assert_eq!(s.max_body, Settings::default().max_body);
    }

    #[test]
    fn unknown_paths_and_bad_values_are_invalid() {
        let d = Settings::default();
        for (path, value) in [
            ("ssd.capacitty", "1GB"),
            ("nope", "1"),
            ("ssd.capacity", "lots"),
            ("ssd.enabled", "maybe"),
            ("ram.more", "1"),
        ] {
            let e = apply(&d, &pairs(&[(path, value)])).unwrap_err();
            assert_eq!(e.kind(), kvtier_core::ErrorKind::Invalid, "{path}: {e}");
        }
        assert!(parse_assignment("ssd.capacity").is_err());
        assert!(parse_assignment("ssd..capacity=1").is_err());
        assert_eq!(
            parse_assignment("a.b=c=d").unwrap(),
            ("a.b".to_owned(), "c=d".to_owned())
        );
    }

    #[test]
    fn the_environment_names_paths_with_double_underscores() {
        let got = from_env(pairs(&[
            ("KVTIER__SSD__MIN_FREE", "0B"),
            ("KVTIER_SSD_CAPACITY", "1GB"),
            ("KVTIER__RAM", "1GiB"),
            ("PATH", "/bin"),
        ]));
        assert_eq!(got, pairs(&[("ram", "1GiB"), ("ssd.min_free", "0B")]));
        let s = apply(&Settings::default(), &got).unwrap();
        assert_eq!((s.ram.0, s.ssd.min_free.0), (1 << 30, 0));
        assert_eq!(env_name("ssd.min_free"), "KVTIER__SSD__MIN_FREE");
        assert_eq!(
            from_env(pairs(&[(&env_name("ssd.min_free"), "0B")]))[0].0,
            "ssd.min_free"
        );
    }

    #[test]
    fn paths_name_every_setting_unset_ones_included_and_set_takes_them_back() {
        let listed = paths(&Settings::default());
        let get = |p: &str| {
            listed
                .iter()
                .find(|(path, _)| path == p)
                .unwrap_or_else(|| panic!("{p} missing"))
                .1
                .clone()
        };
        assert_eq!(get("ssd.capacity").as_deref(), Some("64GiB"));
        assert_eq!(get("ssd.enabled").as_deref(), Some("true"));
        assert_eq!(get("ssd.dir"), None);
        assert_eq!(get("auth.admin_token"), None);
        assert_eq!(get("remote.endpoints").as_deref(), Some("[]"));
        assert_eq!(get("cluster.budgets").as_deref(), Some("{}"));
        // Every listed value, set back at its path, changes nothing.
        let back: Vec<(String, String)> = listed
            .iter()
            .filter_map(|(p, v)| Some((p.clone(), v.clone()?)))
            .collect();
        assert_eq!(
            apply(&Settings::default(), &back).unwrap(),
            Settings::default()
        );
    }
}
