//! `kvtier serve --help` states defaults rendered from `Settings::default()`, the one
//! definition: each named flag's `[default: …]`, and the list of every setting by its
//! path at the end of the long help. These tests hold that rendering to the settings, each
//! named flag to the setting it says it sets (`--ram V` is `--set ram=V`), and the named
//! flags to a few.

#![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]

use std::collections::BTreeMap;

use clap::{Args, Command, FromArgMatches};
use kvtier_node::args::NAMED_FLAGS;
use kvtier_node::{ServeArgs, Settings, overrides};

fn command() -> Command {
    ServeArgs::augment_args(Command::new("serve"))
}

/// Every setting of `Settings::default()` by path, as `--help` shows it (`none`: unset,
/// `""`: empty text).
fn defaults() -> BTreeMap<String, String> {
    overrides::paths(&Settings::default())
        .into_iter()
        .map(|(p, v)| {
            let shown = match v.as_deref() {
                None => "none".to_owned(),
                Some("") => "\"\"".to_owned(),
                Some(v) => v.to_owned(),
            };
            (p, shown)
        })
        .collect()
}

fn parse(args: &[&str]) -> Settings {
    let matches = command()
        .try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    ServeArgs::from_arg_matches(&matches)
        .unwrap()
        .settings_from(Vec::new())
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[test]
fn every_named_flag_states_its_settings_default() {
    let defaults = defaults();
    let cmd = command();
    for f in NAMED_FLAGS {
        let arg = cmd.get_arguments().find(|a| a.get_id() == f.id).unwrap();
        let default = &defaults[f.path];
        for help in [arg.get_help(), arg.get_long_help()].into_iter().flatten() {
            let help = help.to_string();
            assert!(
                help.ends_with(&format!("(setting `{}`) [default: {default}]", f.path)),
                "--{}: {help}",
                arg.get_long().unwrap()
            );
        }
    }
    // The rendering is the value's own (`4GiB` as `ByteSize` writes it), not `none`.
    let ram = cmd.get_arguments().find(|a| a.get_id() == "ram").unwrap();
    let help = ram.get_help().unwrap().to_string();
    assert!(
        help.ends_with(&format!("[default: {}]", Settings::default().ram)),
        "{help}"
    );
}

#[test]
fn the_long_help_lists_every_setting_with_its_default() {
    let mut cmd = command();
    let help = cmd.render_long_help().to_string();
    let defaults = defaults();
    assert!(defaults.len() >= 50, "only {} settings", defaults.len());
    for (path, default) in &defaults {
        assert!(
            help.contains(&format!("\n  {path} = {default}\n"))
                || help.ends_with(&format!("\n  {path} = {default}")),
            "{path} = {default} missing from:\n{help}"
        );
    }
    // The short help points there.
    let short = cmd.render_help().to_string();
    assert!(short.contains("--set PATH=VALUE"), "{short}");
    assert!(short.contains("KVTIER__PATH=VALUE"), "{short}");
}

#[test]
fn each_named_flag_sets_the_setting_at_its_path() {
    // (argument id, flag and value, the same value as --set takes it)
    let cases: &[(&str, &[&str], &str)] = &[
        ("listen", &["--listen", "127.0.0.1:7711"], "127.0.0.1:7711"),
        ("data_dir", &["--data-dir", "/tmp/kv"], "/tmp/kv"),
        ("ram", &["--ram", "3GiB"], "3GiB"),
        ("ssd_capacity", &["--ssd-capacity", "10GB"], "10GB"),
        (
            "remote_endpoints",
            &[
                "--remote-endpoints",
                "http://127.0.0.1:9000,http://127.0.0.1:9001",
            ],
            r#"["http://127.0.0.1:9000", "http://127.0.0.1:9001"]"#,
        ),
        ("remote_bucket", &["--remote-bucket", "shared"], "shared"),
        (
            "cluster",
            &["--cluster", "etcd://127.0.0.1:2379"],
            "etcd://127.0.0.1:2379",
        ),
        (
            "admin_token",
            &["--admin-token", "admin-token-0123456789"],
            "admin-token-0123456789",
        ),
        (
            "data_token",
            &["--data-token", "data-token-0123456789"],
            "data-token-0123456789",
        ),
        (
            "allow_insecure_listen",
            &["--allow-insecure-listen"],
            "true",
        ),
    ];
    let ids: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let named: Vec<&str> = NAMED_FLAGS.iter().map(|f| f.id).collect();
    assert_eq!(ids, named, "a case for every named flag");
    for (f, (_, flag, value)) in NAMED_FLAGS.iter().zip(cases) {
        let by_flag = parse(flag);
        assert_ne!(by_flag, Settings::default(), "{flag:?} changed nothing");
        let by_path = parse(&["--set", &format!("{}={value}", f.path)]);
        assert_eq!(by_flag, by_path, "{flag:?} is not --set {}={value}", f.path);
    }
    // `--cluster-etcd` is the same flag as `--cluster`.
    assert_eq!(
        parse(&["--cluster-etcd", "etcd://127.0.0.1:2379"])
            .cluster
            .etcd,
        "etcd://127.0.0.1:2379"
    );
}

#[test]
fn the_named_flags_are_few_and_the_others_are_gone() {
    assert!(NAMED_FLAGS.len() <= 12, "{} named flags", NAMED_FLAGS.len());
    let cmd = command();
    let flags = cmd
        .get_arguments()
        .filter(|a| a.get_long().is_some())
        .count();
    // The named flags, --config, --print-config and --set.
    assert_eq!(flags, NAMED_FLAGS.len() + 3);
    for gone in [
        "--ssd-ttl",
        "--max-body",
        "--ssd-enabled",
        "--kv-events-endpoint",
    ] {
        let e = command()
            .try_get_matches_from(["serve", gone, "1"])
            .unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{gone}");
    }
}
