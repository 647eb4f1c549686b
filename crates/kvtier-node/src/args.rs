//! `kvtier serve`'s command line: a handful of named flags for the settings nearly every
//! run sets (where to listen, where the data lives, how much RAM and SSD, the shared tier,
//! the tokens), and `--set` for everything else.
//!
//! Nothing here restates a default. The `[default: …]` of a named flag and the list of
//! every setting at the end of `--help` are rendered from `Settings::default()` when the
//! command is built; each named flag is the setting at one dotted path ([`NAMED_FLAGS`]),
//! and a test holds `--flag V` to `--set path=V`.
//!
//! Order, later wins: defaults, the file (`--config`), the environment's `KVTIER__A__B`,
//! the named flags (and their own `KVTIER_…` variables), `--set`.
//!
//! The named flags of every other setting, and their `KVTIER_…` variables, were removed
//! (issue 36). A variable of that old form is refused at start, naming its replacement,
//! rather than ignored: a deployment that set `KVTIER_SSD_TTL` must not silently run with
//! the default TTL ([`refuse_retired_env`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::LazyLock;

use clap::{Arg, Args};
use kvtier_core::Error;

use crate::overrides;
use crate::settings::Settings;
use crate::units::ByteSize;

/// A named flag of `kvtier serve`: the clap argument `id` (its field) sets the setting at
/// `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedFlag {
    /// The argument's id (the field of [`ServeArgs`]).
    pub id: &'static str,
    /// The dotted path of the setting it sets.
    pub path: &'static str,
    /// Its environment variable.
    pub env: &'static str,
}

/// Every named flag that sets a setting. Any other setting is reached by `--set` or
/// `KVTIER__…` alone.
pub const NAMED_FLAGS: &[NamedFlag] = &[
    flag("listen", "listen", "KVTIER_LISTEN"),
    flag("data_dir", "data_dir", "KVTIER_DATA_DIR"),
    flag("ram", "ram", "KVTIER_RAM"),
    flag("ssd_capacity", "ssd.capacity", "KVTIER_SSD_CAPACITY"),
    flag(
        "remote_endpoints",
        "remote.endpoints",
        "KVTIER_REMOTE_ENDPOINTS",
    ),
    flag("remote_bucket", "remote.bucket", "KVTIER_REMOTE_BUCKET"),
    flag("cluster", "cluster.etcd", "KVTIER_CLUSTER"),
    flag("admin_token", "auth.admin_token", "KVTIER_ADMIN_TOKEN"),
    flag("data_token", "auth.data_token", "KVTIER_DATA_TOKEN"),
    flag(
        "allow_insecure_listen",
        "auth.allow_insecure_listen",
        "KVTIER_ALLOW_INSECURE_LISTEN",
    ),
];

const fn flag(id: &'static str, path: &'static str, env: &'static str) -> NamedFlag {
    NamedFlag { id, path, env }
}

/// Every setting's path and default, rendered once.
static DEFAULTS: LazyLock<BTreeMap<String, String>> = LazyLock::new(|| {
    overrides::paths(&Settings::default())
        .into_iter()
        .map(|(path, value)| (path, shown(value.as_deref())))
        .collect()
});

/// A default as `--help` shows it: `none` for an unset setting, `""` for empty text.
fn shown(value: Option<&str>) -> String {
    match value {
        None => "none".to_owned(),
        Some("") => "\"\"".to_owned(),
        Some(v) => v.to_owned(),
    }
}

/// `arg` with the default of its setting appended to its help, if it is a named flag.
fn with_default(arg: Arg) -> Arg {
    let Some(named) = NAMED_FLAGS.iter().find(|f| arg.get_id() == f.id) else {
        return arg;
    };
    let default = DEFAULTS.get(named.path).map_or("none", String::as_str);
    let suffix = format!("(setting `{}`) [default: {default}]", named.path);
    let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
    let long = arg.get_long_help().map(ToString::to_string);
    let arg = arg.help(format!("{help} {suffix}"));
    match long {
        Some(long) => arg.long_help(format!("{long} {suffix}")),
        None => arg,
    }
}

/// What `-h` says after the flags.
const SHORT_AFTER: &str = "Every other setting: --set PATH=VALUE, or KVTIER__PATH=VALUE in the \
environment (path parts joined by `__`, e.g. KVTIER__SSD__TTL=1d). `--help` lists every \
path with its default; docs/API.md says what each means.";

/// What `--help` says after the flags: every setting by its path, with its default.
fn long_after() -> String {
    let mut text = String::from(
        "Every setting, by the path `--set PATH=VALUE` and `KVTIER__PATH=VALUE` take (path \
         parts joined by `__` in the variable: KVTIER__SSD__TTL=1d), with its default. A \
         value is read as in the settings file: a TOML value, or the text as written \
         (sizes 64GiB, durations 7d). `none`: not set; `\"\"`, `[]`, `{}`: empty.\n",
    );
    for (path, default) in DEFAULTS.iter() {
        text.push_str(&format!("\n  {path} = {default}"));
    }
    text
}

/// `kvtier serve` arguments. A named flag sets its setting over the file and the
/// environment's `KVTIER__…`; `--set` comes last.
#[derive(Debug, Clone, Default, Args)]
#[command(mut_args = with_default, after_help = SHORT_AFTER, after_long_help = long_after())]
pub struct ServeArgs {
    /// TOML configuration file (keys as printed by --print-config).
    #[arg(long, env = "KVTIER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Any setting by its dotted path, as in the settings file: `--set ssd.ttl=1d`
    /// (repeatable; applied after every other flag).
    #[arg(long = "set", value_name = "PATH=VALUE", value_parser = overrides::parse_assignment)]
    pub set: Vec<(String, String)>,
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "KVTIER_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Data directory (the SSD store lives under it).
    #[arg(long, env = "KVTIER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// RAM tier capacity.
    #[arg(long, env = "KVTIER_RAM", value_name = "SIZE")]
    pub ram: Option<ByteSize>,
    /// SSD tier capacity.
    #[arg(long, env = "KVTIER_SSD_CAPACITY", value_name = "SIZE")]
    pub ssd_capacity: Option<ByteSize>,
    /// S3 endpoint URLs of the shared remote tier, comma-separated; empty: no remote tier.
    #[arg(
        long,
        env = "KVTIER_REMOTE_ENDPOINTS",
        value_name = "URLS",
        value_delimiter = ','
    )]
    pub remote_endpoints: Option<Vec<String>>,
    /// The remote tier's bucket.
    #[arg(long, env = "KVTIER_REMOTE_BUCKET", value_name = "NAME")]
    pub remote_bucket: Option<String>,
    /// Cluster mode: etcd endpoints, `etcd://host:port,host:port` (needs a remote tier);
    /// empty: one replica on its own.
    #[arg(
        long = "cluster",
        visible_alias = "cluster-etcd",
        env = "KVTIER_CLUSTER",
        value_name = "ETCD_URL"
    )]
    pub cluster: Option<String>,
    /// Bearer token for the admin endpoints; none: they are disabled.
    #[arg(
        long,
        env = "KVTIER_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Bearer token the data endpoints require; none: no token required.
    #[arg(
        long,
        env = "KVTIER_DATA_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub data_token: Option<String>,
    /// Allow a non-loopback listen address without tokens.
    #[arg(long, env = "KVTIER_ALLOW_INSECURE_LISTEN", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub allow_insecure_listen: Option<bool>,
}

impl ServeArgs {
    /// Defaults, then the file, then the environment, then these arguments. A retired
    /// `KVTIER_…` variable in the environment is `Invalid` ([`refuse_retired_env`]).
    pub fn settings(&self) -> Result<Settings, Error> {
        self.settings_from(std::env::vars().collect())
    }

    /// [`ServeArgs::settings`] with `env` as the environment.
    pub fn settings_from(&self, env: Vec<(String, String)>) -> Result<Settings, Error> {
        refuse_retired_env(&env)?;
        let file = match &self.config {
            Some(path) => Settings::from_file(path)?,
            None => Settings::default(),
        };
        let mut s = overrides::apply(&file, &overrides::from_env(env))?;
        fn set<T: Clone>(slot: &mut T, v: &Option<T>) {
            if let Some(v) = v {
                *slot = v.clone();
            }
        }
        fn set_some<T: Clone>(slot: &mut Option<T>, v: &Option<T>) {
            if v.is_some() {
                slot.clone_from(v);
            }
        }
        set(&mut s.listen, &self.listen);
        set(&mut s.data_dir, &self.data_dir);
        set(&mut s.ram, &self.ram);
        set(&mut s.ssd.capacity, &self.ssd_capacity);
        set(&mut s.remote.endpoints, &self.remote_endpoints);
        set(&mut s.remote.bucket, &self.remote_bucket);
        set(&mut s.cluster.etcd, &self.cluster);
        set_some(&mut s.auth.admin_token, &self.admin_token);
        set_some(&mut s.auth.data_token, &self.data_token);
        set(
            &mut s.auth.allow_insecure_listen,
            &self.allow_insecure_listen,
        );
        let s = overrides::apply(&s, &self.set)?;
        s.validate()?;
        Ok(s)
    }
}

/// `Invalid` if `env` holds a variable of the form every setting's flag used to read
/// (`KVTIER_` and the path in capitals, `_` between its parts: `KVTIER_SSD_TTL`) whose
/// flag is gone; the message names the variable that replaces it. The named flags' own
/// variables ([`NAMED_FLAGS`]) are read as before.
pub fn refuse_retired_env(env: &[(String, String)]) -> Result<(), Error> {
    let retired: BTreeMap<String, &str> = DEFAULTS
        .keys()
        .map(|path| {
            let old = format!("KVTIER_{}", path.replace('.', "_").to_ascii_uppercase());
            (old, path.as_str())
        })
        .filter(|(old, _)| !NAMED_FLAGS.iter().any(|f| f.env == old))
        .collect();
    let mut found: Vec<String> = env
        .iter()
        .filter_map(|(name, _)| {
            let path = retired.get(name)?;
            Some(format!(
                "{name} (use {}=… or --set {path}=…)",
                overrides::env_name(path)
            ))
        })
        .collect();
    if found.is_empty() {
        return Ok(());
    }
    found.sort();
    Err(Error::invalid(format!(
        "kvtier serve no longer reads {}: the named flags and their KVTIER_… variables were \
         cut to a few common settings; every setting is KVTIER__PATH (parts joined by `__`) \
         or --set PATH=VALUE",
        found.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::time::Duration;

    use super::*;

    fn env(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect()
    }

    #[test]
    fn the_file_is_read_and_flags_and_set_win() {
        let dir = tempfile_dir();
        let file = dir.join("kvtier.toml");
        std::fs::write(
            &file,
            "ram = \"2GiB\"\n[ssd]\ncapacity = \"10GB\"\nttl = \"1h\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(file.clone()),
            ssd_capacity: Some("20GB".parse().unwrap()),
            set: vec![("ssd.ttl".into(), "2h".into())],
            ..ServeArgs::default()
        };
        let s = args.settings_from(Vec::new()).unwrap();
        assert_eq!(s.ram, ByteSize(2 << 30));
        assert_eq!(s.ssd.capacity, ByteSize(20_000_000_000));
        assert_eq!(s.ssd.ttl.0, Duration::from_secs(7200));
        std::fs::write(&file, "rma = \"2GiB\"\n").unwrap();
        let err = args.settings_from(Vec::new()).unwrap_err();
        assert!(err.to_string().contains("rma"), "{err}");
        assert_eq!(err.kind(), kvtier_core::ErrorKind::Invalid);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kvtier-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_retired_variable_is_refused_by_name_with_its_replacement() {
        let e = refuse_retired_env(&env(&[
            ("KVTIER_SSD_TTL", "1d"),
            ("KVTIER_MAX_TOKENS", "8"),
        ]))
        .unwrap_err();
        assert_eq!(e.kind(), kvtier_core::ErrorKind::Invalid);
        for named in [
            "KVTIER_SSD_TTL (use KVTIER__SSD__TTL=… or --set ssd.ttl=…)",
            "KVTIER_MAX_TOKENS (use KVTIER__MAX_TOKENS=…",
        ] {
            assert!(e.message().contains(named), "{e}");
        }
        // The named flags' variables, the generic form and unrelated names pass.
        refuse_retired_env(&env(&[
            ("KVTIER_RAM", "1GiB"),
            ("KVTIER_SSD_CAPACITY", "1GB"),
            ("KVTIER_CLUSTER", "etcd://127.0.0.1:2379"),
            ("KVTIER_ADMIN_TOKEN", "0123456789abcdef"),
            ("KVTIER__SSD__TTL", "1d"),
            ("KVTIER_BENCH_SERVER_WORKERS", "1"),
            ("KVTIER_CONFIG", "/etc/kvtier.toml"),
        ]))
        .unwrap();
    }

    #[test]
    fn every_named_flag_names_a_setting_and_an_argument() {
        let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
        for f in NAMED_FLAGS {
            assert!(DEFAULTS.contains_key(f.path), "{f:?}: no such setting");
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == f.id)
                .unwrap_or_else(|| panic!("{f:?}: no such argument"));
            assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(f.env), "{f:?}");
        }
    }
}
