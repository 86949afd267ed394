//! Input built to hurt, against the real binary: `metadata` too deep or with
//! numbers no float holds, bytes that are not HTTP at all, query numbers past
//! 64 bits, and chunked bodies that are mostly framing. Each is refused (or
//! clamped) at once, and nothing is stored.

mod common;

use common::{Response, Server, assert_error, unique_session};
use serde_json::{Value, json};

/// `depth` levels of nesting, alternating objects and arrays, the outermost
/// an object (level 1), the innermost holding the number 7.
fn nested(depth: usize) -> Value {
    let mut v = json!(7);
    for level in (1..=depth).rev() {
        v = if level % 2 == 1 {
            json!({ "k": v })
        } else {
            json!([v])
        };
    }
    v
}

/// POSTs a raw JSON body.
#[track_caller]
fn post_raw(srv: &Server, path: &str, body: &str) -> Response {
    srv.request(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    )
}

#[track_caller]
fn assert_invalid_metadata(resp: &Response) {
    assert_error(resp, 400, "Invalid metadata");
    assert!(resp.json()["details"].is_string(), "{}", resp.text());
}

#[test]
fn metadata_33_levels_deep_is_refused_and_nothing_is_stored() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "first", Some("c1"));
    let deep = nested(33);
    let resp = srv.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "p", "client_msg_id": "c2", "metadata": deep}),
    );
    assert_invalid_metadata(&resp);
    let resp = srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": "c1", "text": "t", "metadata": deep}),
    );
    assert_invalid_metadata(&resp);
    // Arrays count as levels too: one object around 32 arrays is 33.
    let arrays = format!("{{\"a\":{}1{}}}", "[".repeat(32), "]".repeat(32));
    let body = format!(r#"{{"session_id":"{sid}","prompt":"p","metadata":{arrays}}}"#);
    assert_invalid_metadata(&post_raw(&srv, "/prompt", &body));
    let history = srv.messages(&sid, "");
    assert_eq!(history["total"], 1, "{history}");
    assert_eq!(common::client_msg_ids(&srv.pending(&sid)), ["c1"]);
}

#[test]
fn metadata_exactly_32_levels_deep_is_stored_and_reads_back() {
    let srv = Server::start();
    let sid = unique_session();
    let meta = nested(32);
    let resp = srv.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "p", "client_msg_id": "c1", "metadata": meta}),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    let resp = srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": "c1", "text": "t", "metadata": meta}),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    // `Response::json` is serde_json with its default recursion limit.
    let history = srv.messages(&sid, "");
    assert_eq!(history["messages"][0]["data"]["metadata"], meta);
    assert_eq!(history["messages"][1]["data"]["metadata"], meta);
    srv.prompt(&sid, "second", Some("c2"));
    let resp = post_raw(
        &srv,
        "/prompt",
        &format!(r#"{{"session_id":"{sid}","prompt":"p","client_msg_id":"c3","metadata":{meta}}}"#),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    let pending = srv.pending(&sid);
    assert_eq!(pending.last().unwrap()["metadata"], meta);
}

#[test]
fn numbers_beyond_a_finite_float_are_refused_in_metadata_and_ts() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "first", Some("c1"));
    for n in ["1e400", "-1e400", "1E309"] {
        let meta = format!(r#"{{"ok":1.5,"list":[1,{{"n":{n}}}]}}"#);
        let body = format!(r#"{{"session_id":"{sid}","prompt":"p","metadata":{meta}}}"#);
        assert_invalid_metadata(&post_raw(&srv, "/prompt", &body));
        let body = format!(
            r#"{{"session_id":"{sid}","client_msg_id":"c1","text":"t","metadata":{meta}}}"#
        );
        assert_invalid_metadata(&post_raw(&srv, "/response", &body));
        let body = format!(r#"{{"session_id":"{sid}","prompt":"p","ts":{n}}}"#);
        let resp = post_raw(&srv, "/prompt", &body);
        assert_eq!(resp.status, 400, "ts {n}: {}", resp.text());
        assert!(resp.json()["error"].as_str().unwrap().contains("ts"));
    }
    // The same characters inside a string are only text.
    let body = format!(r#"{{"session_id":"{sid}","prompt":"p","metadata":{{"s":"1e400 [[["}}}}"#);
    assert_eq!(post_raw(&srv, "/prompt", &body).status, 200);
    assert_eq!(srv.messages(&sid, "")["total"], 2);
}
