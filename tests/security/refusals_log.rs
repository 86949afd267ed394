//! Refused token checks in the server's log: one `info` line with the
//! route, the role it needs and the client, never the token presented, and
//! at most one a second however fast the refusals come, the next line
//! counting those left out.

use crate::common::Server;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The `token refused` lines logged so far, parsed.
fn refusals(srv: &Server) -> Vec<Value> {
    srv.logs()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "token refused")
        .collect()
}

#[test]
fn refused_tokens_are_logged_at_info_without_the_token_at_most_once_a_second() {
    let srv = Server::start_single_with(&[("RELAY_CLIENT_TOKEN", "the-right-token")]);
    let wrong = [("Authorization", "Bearer a-stale-token")];
    let resp = srv.request("GET", "/messages/demo", &wrong, None);
    assert_eq!(resp.status, 401);
    let line: Value = serde_json::from_str(&srv.wait_for_log("token refused")).unwrap();
    assert_eq!(line["level"], "info", "{line}");
    assert_eq!(line["route"], "messages", "{line}");
    assert_eq!(line["role"], "client or agent", "{line}");
    assert_eq!(line["status"], 401, "{line}");
    assert_eq!(line["client"], "127.0.0.1", "{line}");
    // A client retrying in a loop: refusals keep coming, lines do not,
    // and the next line (a second later) counts the ones left out.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(10);
    let mut sent = 1;
    let counted = loop {
        assert!(
            Instant::now() < deadline,
            "no second line: {:?}",
            srv.logs()
        );
        let resp = srv.request("GET", "/messages/demo", &wrong, None);
        assert_eq!(resp.status, 401);
        sent += 1;
        if let Some(later) = refusals(&srv).get(1) {
            break later["suppressed"].as_u64().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let lines = refusals(&srv).len() as u64;
    assert!(
        counted > 0 && lines + counted <= sent,
        "{lines} lines, {counted} counted, {sent} sent"
    );
    let seconds = started.elapsed().as_secs() + 1;
    assert!(lines <= seconds + 1, "{lines} lines in {seconds} s");
    let logs = srv.logs().join("\n");
    assert!(!logs.contains("a-stale-token"), "{logs}");
    assert!(!logs.contains("the-right-token"), "{logs}");
}
