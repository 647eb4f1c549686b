//! What a newcomer meets first: README's API example, run as README prints it against a
//! real `kvtier serve`; every error answer in the JSON shape docs/API.md promises, axum's
//! own rejections included; `--print-config` printing sizes as they were written.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed expectation is a failed test"
)]

mod server;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use server::Server;

/// The README block that holds the API example (the one storing through `/v1/store/raw`).
fn readme_example() -> String {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&readme).unwrap();
    let blocks: Vec<&str> = text
        .split("```")
        .skip(1)
        .step_by(2)
        .filter(|b| b.contains("/v1/store/raw"))
        .collect();
    assert_eq!(blocks.len(), 1, "README has one API example block");
    let block = blocks[0];
    let block = block.strip_prefix("sh\n").expect("a sh block");
    block.to_string()
}

#[test]
fn readmes_api_example_runs_as_pasted_and_stores_finds_and_loads_its_blocks() {
    let block = readme_example();
    // Pasted literally, a placeholder such as `<digest>` would be sent as is.
    for (i, _) in block.match_indices('<') {
        let next = block[i + 1..].chars().next().unwrap_or(' ');
        assert!(
            !next.is_ascii_alphabetic(),
            "README's example holds a placeholder at `{}`",
            &block[i..(i + 20).min(block.len())]
        );
    }
    let defaults = kvtier_server::Settings::default();
    assert_eq!(
        defaults.listen.to_string(),
        "127.0.0.1:7700",
        "README's example talks to the default address"
    );
    assert!(block.contains("localhost:7700"));

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &[]);
    let addr = server.url.strip_prefix("http://").unwrap().to_string();
    let script = block.replace("localhost:7700", &addr);
    let work = dir.path().join("shell");
    std::fs::create_dir_all(&work).unwrap();
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&work)
        .output()
        .expect("bash (and curl) to run README's example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "README's example failed:\n{stdout}\n{stderr}"
    );
    for expected in [
        "\"status\":\"ok\"",
        "\"stored\":2",
        "\"matched_tokens\":8",
        "\"tiers\":\"rr\"",
        "\n384\n",
        "block 0 came back byte for byte",
        "kvtier_tier_resident_blocks{tier=\"ram\"} 2",
    ] {
        assert!(
            stdout.contains(expected),
            "README's example did not print `{expected}`:\n{stdout}\n{stderr}"
        );
    }
    assert!(!stdout.contains("\"error\""), "{stdout}");
    assert!(server.stop().success());
}

/// One raw HTTP/1.1 exchange: (status, content type, body).
fn exchange(addr: &str, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

#[test]
fn every_refusal_axum_or_ours_is_a_json_error_with_a_code() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--set", "max_body=4KiB"]);
    let addr = server.url.strip_prefix("http://").unwrap().to_string();
    let big = format!(
        "POST /v1/lookup HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        1 << 20
    );
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"GET /v1/lookup HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), 405, "method_not_allowed"),
        (b"DELETE /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), 405, "method_not_allowed"),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), 404, "no_such_endpoint"),
        (b"DELETE /v1/layouts/%FF%FE HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), 400, "bad_request"),
        (b"POST /v1/lookup HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\n{nope".to_vec(), 400, "bad_json"),
        (big.into_bytes(), 413, "body_too_large"),
        (b"POST /v1/store/raw?layout=00&tokens=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec(), 400, "bad_hex"),
        (b"POST /v1/store/raw?tokens=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec(), 400, "bad_query"),
        (b"POST /v1/store/raw?layout=00&tokens=1&durability=sometimes HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec(), 400, "bad_query"),
    ];
    for (request, status, code) in cases {
        let shown = String::from_utf8_lossy(&request[..request.len().min(60)]).to_string();
        let (got, content_type, body) = exchange(&addr, &request);
        assert_eq!(got, status, "{shown}: {body}");
        assert_eq!(content_type, "application/json", "{shown}: {body}");
        let v: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{shown}: {e}: {body:?}"));
        assert_eq!(v["error"]["code"], code, "{shown}: {body}");
        assert!(
            !v["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{shown}: {body}"
        );
    }
    // Every refusal is counted, also those the rate-limited log leaves out.
    let (_, _, metrics) = exchange(
        &addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    for series in [
        "kvtier_refused_total{kind=\"method_not_allowed\"} 2",
        "kvtier_refused_total{kind=\"bad_json\"} 1",
        "kvtier_refused_total{kind=\"body_too_large\"} 1",
    ] {
        assert!(
            metrics.contains(series),
            "missing `{series}` in:\n{metrics}"
        );
    }
    assert!(server.stop().success());
}

#[test]
fn print_config_prints_sizes_in_the_unit_they_were_written_in() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args([
            "serve",
            "--print-config",
            "--ram",
            "2GB",
            "--set",
            "max_body=512MiB",
        ])
        .args(["--ssd-capacity", "10TB", "--set", "idle_timeout=90s"])
        .env_remove("KVTIER_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = String::from_utf8(out.stdout).unwrap();
    for line in [
        "ram = \"2GB\"",
        "max_body = \"512MiB\"",
        "capacity = \"10TB\"",
        "idle_timeout = \"90s\"",
        "header_timeout = \"10s\"",
        "body_timeout = \"1m\"",
        "max_connections = 1024",
    ] {
        assert!(config.contains(line), "missing `{line}` in:\n{config}");
    }
}
