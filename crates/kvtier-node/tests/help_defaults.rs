//! `kvtier serve --help` states each flag's default; this test holds every stated default
//! to `Settings::default()`, the one definition, so the two cannot drift apart. A flag
//! names the setting at the same dotted path (`--ssd-min-free` is `ssd.min_free`); a
//! default stated in words ("none, no remote tier") is allowed only for a setting that
//! has no value by default.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::collections::BTreeMap;

use clap::{Args, Command};
use kvtier_node::{ServeArgs, Settings};

/// Every setting of `Settings::default()` by dotted path, as the settings file writes
/// its value (strings without quotes).
fn defaults() -> BTreeMap<String, String> {
    let text = toml::to_string(&Settings::default()).unwrap();
    let table: toml::Table = text.parse().unwrap();
    let mut out = BTreeMap::new();
    flatten("", &toml::Value::Table(table), &mut out);
    out
}

fn flatten(prefix: &str, v: &toml::Value, out: &mut BTreeMap<String, String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&path, v, out);
            }
        }
        toml::Value::String(s) => {
            out.insert(prefix.to_owned(), s.clone());
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

/// Whether two spellings name the same value (`60s` and `1m`, `1024MiB` and `1GiB`).
fn same_value(a: &str, b: &str) -> bool {
    use kvtier_node::units::{ByteSize, HumanDuration};
    a == b
        || matches!((a.parse::<HumanDuration>(), b.parse::<HumanDuration>()), (Ok(x), Ok(y)) if x == y)
        || matches!((a.parse::<ByteSize>(), b.parse::<ByteSize>()), (Ok(x), Ok(y)) if x == y)
}

/// The default a flag's help states, if it states one.
fn stated_default(help: &str) -> Option<String> {
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = help.rfind("[default: ")? + "[default: ".len();
    let end = help[start..].find(']')? + start;
    Some(help[start..end].to_owned())
}

#[test]
fn every_default_stated_in_help_is_the_settings_default() {
    let defaults = defaults();
    let by_flag: BTreeMap<String, (&String, &String)> = defaults
        .iter()
        .map(|(path, value)| (path.replace(['.', '_'], "-"), (path, value)))
        .collect();
    let cmd = ServeArgs::augment_args(Command::new("serve"));
    let mut checked = 0;
    let mut wrong = Vec::new();
    for arg in cmd.get_arguments() {
        let (Some(long), Some(help)) = (arg.get_long(), arg.get_help()) else {
            continue;
        };
        let Some(stated) = stated_default(&help.to_string()) else {
            continue;
        };
        // Exactly the path, or a section's setting the flag names without its section
        // (`--allow-insecure-listen` is `auth.allow_insecure_listen`).
        let setting = by_flag.get(long).or_else(|| {
            let mut within = by_flag
                .iter()
                .filter(|(flag, _)| flag.ends_with(&format!("-{long}")));
            match (within.next(), within.next()) {
                (Some((_, found)), None) => Some(found),
                _ => None,
            }
        });
        match setting {
            // No value by default (an empty string or list): stated in words.
            Some((_, value)) if value.is_empty() || *value == "[]" => {}
            Some((path, value)) => {
                checked += 1;
                if !same_value(&stated, value) {
                    wrong.push(format!(
                        "--{long} says [default: {stated}] but {path} defaults to {value}"
                    ));
                }
            }
            // A switch of the command line, not a setting: off unless given.
            None if matches!(arg.get_action(), clap::ArgAction::SetTrue) => {
                assert_eq!(stated, "false", "--{long}");
            }
            // A default in words is for a setting with no value by default.
            None => {
                let path_like = long.replace('-', "_");
                let words = stated.contains(' ')
                    || stated.starts_with("none")
                    || stated.chars().any(|c| c.is_ascii_uppercase());
                if !words {
                    wrong.push(format!(
                        "--{long} says [default: {stated}] but no setting at {path_like} has a default value"
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Most flags state a default that is checked; a refactoring that loses the mapping
    // would check none.
    assert!(checked >= 40, "only {checked} defaults checked");
}
