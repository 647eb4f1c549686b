//! Any setting of `kvtier serve` by its dotted path, with nothing written for it but the
//! settings struct: `--set a.b=v` on the command line and `KVTIER__A__B=v` in the
//! environment, in their documented order (file, generic environment, named flags,
//! `--set`), unknown paths refused like unknown keys in the file, and the variables of
//! the removed flags refused rather than ignored.

#![allow(clippy::unwrap_used, reason = "tests")]

use std::process::Command;

fn print_config(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(["serve", "--print-config"])
        .args(args)
        .env_remove("KVTIER_CONFIG")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn set_and_the_environment_reach_every_setting_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kvtier.toml");
    std::fs::write(
        &file,
        "ram = \"2GiB\"\n[ssd]\nretries = 1\ncapacity = \"1GB\"\n",
    )
    .unwrap();
    let (ok, config, err) = print_config(
        &[
            "--config",
            file.to_str().unwrap(),
            "--set",
            "ssd.maintenance_every=3s",
            "--ssd-capacity",
            "5GB",
            "--set",
            "kv_events.topic=kv",
        ],
        &[
            ("KVTIER__RAM", "3GiB"),
            ("KVTIER__SSD__RETRIES", "4"),
            ("KVTIER__SSD__CAPACITY", "2GB"),
            ("KVTIER__CLUSTER__NAME", "blue"),
        ],
    );
    assert!(ok, "{err}");
    assert!(
        config.contains("ram = \"3GiB\""),
        "environment over file:\n{config}"
    );
    assert!(
        config.contains("retries = 4"),
        "environment over file:\n{config}"
    );
    assert!(
        config.contains("capacity = \"5GB\""),
        "named flag over environment:\n{config}"
    );
    assert!(
        config.contains("maintenance_every = \"3s\""),
        "--set:\n{config}"
    );
    assert!(config.contains("topic = \"kv\""), "--set:\n{config}");
    assert!(config.contains("name = \"blue\""), "environment:\n{config}");

    // --set comes last: it wins over a named flag.
    let (ok, config, err) = print_config(&["--ram", "1GiB", "--set", "ram=5GiB"], &[]);
    assert!(ok, "{err}");
    assert!(config.contains("ram = \"5GiB\""), "{config}");
}

/// The variables of the named flags that were removed (`KVTIER_SSD_TTL`, …) are refused
/// at start, naming what replaces them, rather than ignored; the kept flags' variables
/// still work.
#[test]
fn a_retired_variable_fails_the_start_and_names_its_replacement() {
    let (ok, _, err) = print_config(&[], &[("KVTIER_SSD_TTL", "1d"), ("KVTIER_RAM", "1GiB")]);
    assert!(!ok, "KVTIER_SSD_TTL was accepted");
    assert!(err.contains("KVTIER_SSD_TTL"), "{err}");
    assert!(err.contains("KVTIER__SSD__TTL"), "{err}");
    assert!(err.contains("--set ssd.ttl="), "{err}");
    assert!(
        !err.contains("KVTIER_RAM "),
        "a kept variable was refused: {err}"
    );
    let (ok, config, err) = print_config(&[], &[("KVTIER_RAM", "1GiB")]);
    assert!(ok, "{err}");
    assert!(config.contains("ram = \"1GiB\""), "{config}");
    // A removed flag is an unknown argument.
    let (ok, _, err) = print_config(&["--ssd-ttl", "1d"], &[]);
    assert!(!ok && err.contains("--ssd-ttl"), "{err}");
}

#[test]
fn unknown_paths_and_bad_values_are_refused_by_name() {
    for (args, env, named) in [
        (&["--set", "ssd.capacitty=1GB"][..], &[][..], "capacitty"),
        (&["--set", "ram=lots"][..], &[][..], "lots"),
        (&["--set", "ram"][..], &[][..], "KEY.PATH=VALUE"),
        (&[][..], &[("KVTIER__SSD__NOPE", "1")][..], "nope"),
    ] {
        let (ok, _, err) = print_config(args, env);
        assert!(!ok, "{args:?} {env:?} was accepted");
        assert!(err.contains(named), "{args:?} {env:?}: {err}");
    }
}
