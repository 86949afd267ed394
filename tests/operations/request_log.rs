//! The debug request log: every request with method, path (never the query
//! string, where tokens live), status, bytes and duration, and the reason
//! of every error answer; nothing per request at `info`.

use crate::common::*;
use serde_json::Value;

/// The `request` events logged so far, parsed.
fn requests(srv: &Server) -> Vec<Value> {
    srv.logs()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "request")
        .collect()
}

#[track_caller]
fn find<'a>(logged: &'a [Value], method: &str, path: &str, status: u64) -> &'a Value {
    logged
        .iter()
        .find(|v| v["method"] == method && v["path"] == path && v["status"] == status)
        .unwrap_or_else(|| panic!("no request log for {method} {path} {status}: {logged:#?}"))
}

#[test]
fn every_request_is_logged_at_debug_with_the_reason_of_each_error() {
    let srv = Server::start_with(&[
        ("RELAY_CLIENT_TOKEN", "SECRET-CLIENT"),
        ("RELAY_MAX_BODY", "1024"),
        ("RELAY_RATE_LIMIT", "3"),
    ]);
    let auth = [
        ("Authorization", "Bearer SECRET-CLIENT"),
        ("Content-Type", "application/json"),
    ];
    let post = |body: &[u8], headers: &[(&str, &str)]| {
        srv.request("POST", "/prompt", headers, Some(body)).status
    };
    assert_eq!(post(b"{nope", &auth), 400);
    assert_eq!(post(b"{}", &[auth[0], ("Content-Type", "text/plain")]), 415);
    assert_eq!(post(&vec![b' '; 2048], &auth), 413);
    assert_eq!(post(b"{}", &[("Content-Type", "application/json")]), 401);
    for _ in 0..3 {
        post(b"{}", &auth);
    }
    assert_eq!(post(b"{}", &auth), 429);
    assert_eq!(srv.get("/nope").status, 404);
    assert_eq!(srv.get("/messages/bad%20id").status, 400);
    let r = srv.get("/ws/s?token=SECRET-WRONG&after=0");
    assert_eq!(r.status, 401);
    // The last request's line: the server logs it after it answers, and an
    // earlier 401 (of POST /prompt) must not stand in for it. With two
    // relays (TEST_WITH_REDIS) connections alternate between them and each
    // logs to its own pipe, so the line of the last request the other one
    // answered is waited for too: each relay's lines come in order.
    srv.wait_for_log("\"/ws/s\"");
    srv.wait_for_log("\"/messages/bad%20id\"");
    let logged = requests(&srv);
    let bad_json = find(&logged, "POST", "/prompt", 400);
    assert!(
        bad_json["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("Invalid JSON")),
        "{bad_json}"
    );
    for (status, reason) in [
        (415, "Content-Type must be application/json"),
        (401, "Unauthorized"),
        (429, "Too many requests"),
    ] {
        let v = find(&logged, "POST", "/prompt", status);
        assert!(
            v["reason"].as_str().is_some_and(|r| r.starts_with(reason)),
            "{v}"
        );
        assert!(v["bytes"].as_u64().is_some_and(|b| b > 0), "{v}");
        assert!(v["duration_ms"].is_u64(), "{v}");
    }
    find(&logged, "GET", "/nope", 404);
    let bad_id = find(&logged, "GET", "/messages/bad%20id", 400);
    assert!(
        bad_id["reason"]
            .as_str()
            .is_some_and(|r| r.contains("Invalid session_id"))
    );
    find(&logged, "GET", "/ws/s", 401);
    let all = srv.logs().join("\n");
    assert!(!all.contains("SECRET"), "a token reached the log");
    assert!(!all.contains("after=0"), "a query string reached the log");
    // A body over the cap is refused on its head, before a request exists:
    // logged as bad framing, with its status and reason.
    let framing = srv.wait_for_log("bad request framing");
    let v: Value = serde_json::from_str(&framing).unwrap();
    assert_eq!(v["status"], 413, "{v}");
    assert_eq!(v["reason"], "Message exceeds size limit", "{v}");
}

#[test]
fn info_logs_nothing_per_request() {
    let srv = Server::start_with(&[("RELAY_LOG", "info")]);
    for _ in 0..5 {
        srv.prompt(&unique_session(), "hello", None);
        assert_eq!(srv.get("/nope").status, 404);
    }
    srv.health();
    assert!(requests(&srv).is_empty(), "{:?}", srv.logs());
}
