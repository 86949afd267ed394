//! GET /messages, /healthz (+HEAD), /readyz, PUT/DELETE /sessions, routing errors (404, 405 +
//! Allow) and CORS, over the real binary.

use crate::common;

use crate::common::{Server, assert_error, now_ms, unique_session};
use serde_json::{Value, json};

/// Posts prompts with explicit ts and ids `c1..cN`; returns nothing, asserts each 200.
#[track_caller]
fn prompts_with_ts(srv: &Server, sid: &str, stamps: &[u64]) {
    for (i, ts) in stamps.iter().enumerate() {
        let body = json!({"session_id": sid, "prompt": format!("p{}", i + 1),
                          "client_msg_id": format!("c{}", i + 1), "ts": ts});
        let resp = srv.post_json("/prompt", &body);
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
}

#[track_caller]
fn seqs(body: &Value) -> Vec<u64> {
    body["messages"]
        .as_array()
        .expect("messages array")
        .iter()
        .map(|m| m["data"]["seq"].as_u64().expect("seq"))
        .collect()
}

// ---- GET /messages ----

#[test]
fn messages_of_unknown_session_is_404() {
    let srv = Server::start();
    let resp = srv.get(&format!("/messages/{}", unique_session()));
    assert_eq!(resp.status, 404, "{}", resp.text());
    assert!(resp.json()["error"].is_string());
}

#[test]
fn messages_lists_prompts_and_answers_oldest_first_with_paging_fields() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "q1", Some("c1"));
    srv.respond(&sid, "c1", "a1");
    srv.prompt(&sid, "q2", Some("c2"));
    let body = srv.messages(&sid, "");
    assert_eq!(body["session_id"], sid.as_str());
    assert_eq!(body["total"], 3);
    assert_eq!(body["limit"], 100);
    assert_eq!(body["offset"], 0);
    assert!(
        body["epoch"].as_str().is_some_and(common::is_uuid_v4),
        "{body}"
    );
    let kinds: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["prompt", "assistant", "prompt"]);
    assert_eq!(seqs(&body), [1, 2, 3]);
    assert_eq!(body["messages"][0]["data"]["prompt"], "q1");
    assert_eq!(body["messages"][1]["data"]["text"], "a1");
}

#[test]
fn messages_are_ordered_by_seq_not_by_client_ts() {
    let srv = Server::start();
    let sid = unique_session();
    prompts_with_ts(&srv, &sid, &[3000, 1000, 2000]);
    let body = srv.messages(&sid, "");
    let prompts: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"]["prompt"].as_str().unwrap())
        .collect();
    assert_eq!(prompts, ["p1", "p2", "p3"]);
}

#[test]
fn messages_limit_and_offset_page_while_total_counts_all() {
    let srv = Server::start();
    let sid = unique_session();
    prompts_with_ts(&srv, &sid, &[1, 2, 3, 4, 5]);
    let page = srv.messages(&sid, "?limit=2&offset=1");
    assert_eq!(seqs(&page), [2, 3]);
    assert_eq!(page["total"], 5);
    assert_eq!(page["limit"], 2);
    assert_eq!(page["offset"], 1);
    let tail = srv.messages(&sid, "?limit=10&offset=4");
    assert_eq!(seqs(&tail), [5]);
    let past = srv.messages(&sid, "?offset=9");
    assert_eq!(seqs(&past), Vec::<u64>::new());
    assert_eq!(past["total"], 5);
}

#[test]
fn messages_limit_above_1000_is_clamped() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", None);
    let body = srv.messages(&sid, "?limit=5000");
    assert_eq!(body["limit"], 1000);
    assert_eq!(seqs(&body), [1]);
}

#[test]
fn messages_negative_limit_or_offset_is_400() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", None);
    for query in ["?limit=-1", "?offset=-1"] {
        let resp = srv.get(&format!("/messages/{sid}{query}"));
        assert_eq!(resp.status, 400, "{query}: {}", resp.text());
        assert!(resp.json()["error"].is_string());
    }
}

#[test]
fn messages_since_keeps_only_later_timestamps() {
    let srv = Server::start();
    let sid = unique_session();
    prompts_with_ts(&srv, &sid, &[1000, 2000, 3000]);
    let body = srv.messages(&sid, "?since=2000");
    assert_eq!(seqs(&body), [3]);
    assert_eq!(body["total"], 1);
    assert_eq!(seqs(&srv.messages(&sid, "?since=999")), [1, 2, 3]);
}

#[test]
fn messages_after_keeps_only_later_seqs() {
    let srv = Server::start();
    let sid = unique_session();
    prompts_with_ts(&srv, &sid, &[10, 20, 30, 40]);
    let body = srv.messages(&sid, "?after=2");
    assert_eq!(seqs(&body), [3, 4]);
    assert_eq!(body["total"], 2);
    let paged = srv.messages(&sid, "?after=1&limit=1&offset=1");
    assert_eq!(seqs(&paged), [3]);
    assert_eq!(paged["total"], 3);
}

#[test]
fn messages_epoch_matches_the_sessions_epoch() {
    let srv = Server::start();
    let sid = unique_session();
    let put = srv.put(&format!("/sessions/{sid}"));
    assert_eq!(put.status, 200, "{}", put.text());
    assert_eq!(srv.messages(&sid, "")["epoch"], put.json()["epoch"]);
}

// ---- /healthz, /readyz ----

#[test]
fn healthz_reports_ok_timestamp_and_counters() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", None);
    let _ws = srv.ws(&format!("/ws/{sid}"));
    let h = srv.wait_health("subscribers", 1);
    assert_eq!(h["ok"], true);
    let ts = h["timestamp"].as_u64().expect("timestamp");
    assert!(ts.abs_diff(now_ms()) < 60_000, "timestamp {ts} is not now");
    assert_eq!(h["sessions"], 1);
    assert_eq!(h["parked_polls"], 0);
    assert!(h["connections"].as_u64().is_some_and(|n| n >= 1), "{h}");
}

#[test]
fn healthz_head_answers_without_a_body() {
    let srv = Server::start();
    let mut conn = srv.conn();
    let head = conn.request("HEAD", "/healthz", &[], None);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    // Had the server sent a body, it would be read here as a broken status line.
    let get = conn.request("GET", "/healthz", &[], None);
    assert_eq!(get.status, 200);
    assert_eq!(get.json()["ok"], true);
}

#[test]
fn readyz_is_ready_by_default() {
    let srv = Server::start();
    let resp = srv.get("/readyz");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json(), json!({"ready": true}));
}

// ---- PUT / DELETE /sessions ----

#[test]
fn put_session_creates_it_once_with_a_stable_epoch() {
    let srv = Server::start();
    let sid = unique_session();
    let first = srv.put(&format!("/sessions/{sid}"));
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    assert_eq!(first["session_id"], sid.as_str());
    assert_eq!(first["created"], true);
    assert!(
        first["epoch"].as_str().is_some_and(common::is_uuid_v4),
        "{first}"
    );
    let second = srv.put(&format!("/sessions/{sid}")).json();
    assert_eq!(second["created"], false);
    assert_eq!(second["epoch"], first["epoch"]);
    assert!(srv.pending(&sid).is_empty(), "an agent can poll at once");
}

#[test]
fn put_session_with_invalid_id_is_400() {
    let srv = Server::start();
    let resp = srv.put(&format!("/sessions/{}", "x".repeat(129)));
    assert_error(&resp, 400, "Invalid session_id");
}

#[test]
fn delete_session_removes_it_and_a_second_delete_is_404() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    let resp = srv.delete(&format!("/sessions/{sid}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json(), json!({"deleted": true}));
    assert_error(
        &srv.get(&format!("/prompts/{sid}?wait=false")),
        404,
        "Session not found",
    );
    assert_eq!(srv.get(&format!("/messages/{sid}")).status, 404);
    assert_eq!(srv.delete(&format!("/sessions/{sid}")).status, 404);
    let resp = srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": "c", "text": "t"}),
    );
    assert_error(&resp, 404, "Session not found");
}

#[test]
fn recreated_session_starts_afresh_with_a_new_epoch() {
    let srv = Server::start();
    let sid = unique_session();
    let old = srv.put(&format!("/sessions/{sid}")).json();
    srv.prompt(&sid, "p", Some("c"));
    assert_eq!(srv.delete(&format!("/sessions/{sid}")).status, 200);
    let ack = srv.prompt(&sid, "p", Some("c"));
    assert!(
        ack.get("duplicate").is_none(),
        "old dedupe state survived: {ack}"
    );
    let body = srv.messages(&sid, "");
    assert_ne!(body["epoch"], old["epoch"]);
    assert_eq!(seqs(&body), [1]);
}

#[test]
fn delete_session_closes_its_subscribers_with_1000() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    assert_eq!(srv.delete(&format!("/sessions/{sid}")).status, 200);
    assert_eq!(ws.expect_close(), 1000);
}

// ---- routing ----

#[test]
fn unknown_path_is_json_404() {
    let srv = Server::start();
    for path in ["/", "/nope", "/prompt/extra", "/healthz/x", "/api/prompt"] {
        let resp = srv.get(path);
        if path == "/" && resp.status == 200 {
            continue; // the optional web page
        }
        assert_error(&resp, 404, "Not found");
        assert!(
            resp.header("content-type")
                .is_some_and(|v| v.starts_with("application/json")),
            "{path}"
        );
    }
}

#[test]
fn wrong_method_is_405_with_allow() {
    let srv = Server::start();
    let cases = [
        ("GET", "/prompt", "POST"),
        ("PUT", "/response", "POST"),
        ("POST", "/prompts/s", "GET"),
        ("DELETE", "/messages/s", "GET"),
        ("POST", "/healthz", "GET"),
        ("POST", "/readyz", "GET"),
        ("POST", "/sessions/s", "PUT"),
    ];
    for (method, path, allowed) in cases {
        let resp = srv.request(method, path, &[], None);
        assert_eq!(resp.status, 405, "{method} {path}: {}", resp.text());
        let allow = resp
            .header("allow")
            .unwrap_or_else(|| panic!("{method} {path}: no Allow header"));
        assert!(
            allow.split(',').any(|m| m.trim() == allowed),
            "{method} {path}: Allow {allow:?} lacks {allowed}"
        );
        assert!(resp.json()["error"].is_string());
    }
    let allow = srv.request("PATCH", "/sessions/s", &[], None);
    let allow = allow.header("allow").expect("Allow").to_string();
    assert!(allow.contains("PUT") && allow.contains("DELETE"), "{allow}");
}

// ---- CORS ----

/// method, path, headers, body, expected status
type Case<'a> = (
    &'a str,
    &'a str,
    &'a [(&'a str, &'a str)],
    Option<&'a [u8]>,
    u16,
);

#[test]
fn preflight_is_204_with_cors_headers() {
    let srv = Server::start();
    let resp = srv.request(
        "OPTIONS",
        "/prompt",
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "content-type, authorization",
            ),
        ],
        None,
    );
    assert_eq!(resp.status, 204, "{}", resp.text());
    assert!(resp.body.is_empty());
    let origin = resp
        .header("access-control-allow-origin")
        .expect("allow-origin");
    assert!(origin == "*" || origin == "https://app.example", "{origin}");
    let methods = resp
        .header("access-control-allow-methods")
        .expect("-methods");
    assert!(methods.contains("POST"), "{methods}");
    let headers = resp
        .header("access-control-allow-headers")
        .expect("-headers")
        .to_ascii_lowercase();
    assert!(
        headers.contains("content-type") && headers.contains("authorization"),
        "{headers}"
    );
    let max_age = resp.header("access-control-max-age").expect("-max-age");
    assert!(max_age.parse::<u64>().is_ok(), "{max_age}");
}

#[test]
fn every_response_carries_allow_origin() {
    let srv = Server::start();
    let origin = [("Origin", "https://app.example")];
    let ct = [
        ("Origin", "https://app.example"),
        ("Content-Type", "application/json"),
    ];
    let cases: Vec<Case> = vec![
        ("GET", "/healthz", &origin, None, 200),
        ("GET", "/readyz", &origin, None, 200),
        ("PUT", "/sessions/cors", &origin, None, 200),
        (
            "POST",
            "/prompt",
            &ct,
            Some(br#"{"session_id":"cors","prompt":"p"}"#),
            200,
        ),
        ("GET", "/prompts/cors?wait=false", &origin, None, 200),
        ("GET", "/messages/cors", &origin, None, 200),
        ("GET", "/nope", &origin, None, 404),
        ("GET", "/prompt", &origin, None, 405),
        ("POST", "/prompt", &origin, Some(b"{}"), 415),
        ("POST", "/prompt", &ct, Some(b"{"), 400),
        (
            "POST",
            "/response",
            &ct,
            Some(br#"{"session_id":"x","client_msg_id":"c","text":"t"}"#),
            404,
        ),
        ("DELETE", "/sessions/cors", &origin, None, 200),
    ];
    for (method, path, headers, body, status) in cases {
        let resp = srv.request(method, path, headers, body);
        assert_eq!(resp.status, status, "{method} {path}: {}", resp.text());
        let allow = resp.header("access-control-allow-origin");
        assert!(
            matches!(allow, Some("*" | "https://app.example")),
            "{method} {path}: allow-origin {allow:?}"
        );
    }
}
