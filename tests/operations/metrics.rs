//! `GET /metrics` against the real binary, read by the reference parser
//! (Python's `prometheus_client`, installed by scripts/install-test-deps.sh):
//! the exposition parses, and its counters follow the traffic.

use crate::common::*;
use serde_json::{Value, json};
use std::io::Write;
use std::process::{Command, Stdio};

/// Parses an exposition with prometheus_client and returns every sample as
/// `{"name","labels","value"}`; fails the test if it does not parse.
#[track_caller]
fn parse(text: &str) -> Vec<Value> {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append({"name": s.name, "labels": s.labels, "value": s.value, "type": fam.type})
print(json.dumps(out))
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3 (with prometheus_client, which scripts/test installs)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the exposition does not parse (or prometheus_client is missing: run scripts/test, which installs it): {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("parser output")
}

#[track_caller]
fn value(samples: &[Value], name: &str, labels: Value) -> f64 {
    samples
        .iter()
        .find(|s| s["name"] == name && (labels.is_null() || s["labels"] == labels))
        .and_then(|s| s["value"].as_f64())
        .unwrap_or_else(|| panic!("no sample {name} {labels}"))
}

#[test]
fn the_exposition_parses_and_counts_the_traffic() {
    // One relay: the counters are its own.
    let srv = Server::start_single();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    for i in 0..3 {
        srv.prompt(&sid, "q", Some(&format!("c{i}")));
        srv.respond(&sid, &format!("c{i}"), "a");
        ws.recv_json_skip_pings();
    }
    srv.prompt(&sid, "q", Some("c0")); // a duplicate
    assert_eq!(srv.get("/nope").status, 404);
    let r = srv.get("/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let samples = parse(&r.text());
    assert_eq!(
        value(&samples, "relay_prompts_stored_total", Value::Null),
        3.0
    );
    assert_eq!(
        value(&samples, "relay_responses_stored_total", Value::Null),
        3.0
    );
    assert_eq!(
        value(
            &samples,
            "relay_duplicates_total",
            json!({"kind": "prompt"})
        ),
        1.0
    );
    // Three answers, and the agent's presence: offline at connect, online
    // with its first answer.
    assert_eq!(value(&samples, "relay_frames_sent_total", Value::Null), 5.0);
    assert_eq!(value(&samples, "relay_subscribers", Value::Null), 1.0);
    assert_eq!(value(&samples, "relay_sessions", Value::Null), 1.0);
    assert_eq!(
        value(
            &samples,
            "relay_requests_total",
            json!({"route": "prompt", "status": "200"})
        ),
        4.0
    );
    assert_eq!(
        value(
            &samples,
            "relay_requests_total",
            json!({"route": "other", "status": "404"})
        ),
        1.0
    );
    assert_eq!(
        value(
            &samples,
            "relay_requests_total",
            json!({"route": "ws", "status": "101"})
        ),
        1.0
    );
    let turns = value(&samples, "relay_loop_turn_seconds_count", Value::Null);
    let inf = value(
        &samples,
        "relay_loop_turn_seconds_bucket",
        json!({"le": "+Inf"}),
    );
    assert!(
        turns > 0.0 && inf == turns,
        "{turns} turns, +Inf bucket {inf}"
    );
}

#[test]
fn a_metrics_token_guards_the_endpoint_and_nothing_else() {
    let srv = Server::start_with(&[("RELAY_METRICS_TOKEN", "scrape-me")]);
    assert_eq!(srv.get("/metrics").status, 401);
    let wrong = srv.request("GET", "/metrics", &[("Authorization", "Bearer nope")], None);
    assert_eq!(wrong.status, 401);
    let ok = srv.request(
        "GET",
        "/metrics",
        &[("Authorization", "Bearer scrape-me")],
        None,
    );
    assert_eq!(ok.status, 200);
    parse(&ok.text());
    assert_eq!(srv.get("/healthz").status, 200);
    srv.prompt(&unique_session(), "still open", None);
}

#[test]
fn with_persistence_the_storage_thread_is_measured_too() {
    let dir = std::env::temp_dir().join(format!("relay-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let srv = Server::start_with(&[("RELAY_DATA_DIR", dir.to_str().unwrap())]);
    let sid = unique_session();
    for i in 0..5 {
        srv.prompt(&sid, "q", Some(&format!("c{i}")));
    }
    let samples = parse(&srv.get("/metrics").text());
    let commits = value(&samples, "relay_storage_commits_total", Value::Null);
    let commands = value(&samples, "relay_storage_commands_total", Value::Null);
    assert!((1.0..=5.0).contains(&commits), "{commits} commits");
    assert_eq!(commands, 5.0, "five writes committed");
    assert_eq!(
        value(&samples, "relay_storage_errors_total", Value::Null),
        0.0
    );
    assert_eq!(
        value(&samples, "relay_storage_commit_seconds_count", Value::Null),
        commits
    );
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}
