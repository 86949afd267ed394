//! Input built to hurt, against the real binary: `metadata` too deep or with
//! numbers no float holds, bytes that are not HTTP at all, query numbers past
//! 64 bits, and chunked bodies that are mostly framing. Each is refused (or
//! clamped) at once, and nothing is stored.

use crate::common;

use crate::common::{Response, Server, assert_error, unique_session};
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

// ---- bytes that are not HTTP ----

/// Sends `bytes` (no end of head among them) to a server whose request
/// timeout is 30 s, and asserts a `400` and a close arrive within 3 s: the
/// socket's read timeout is the bound, so a server that waited for the
/// request timeout fails the test instead of passing late.
#[track_caller]
fn assert_refused_at_once(srv: &Server, bytes: &[u8]) {
    let mut http = srv.conn();
    http.tcp()
        .set_read_timeout(Some(std::time::Duration::from_secs(3)))
        .unwrap();
    http.send_raw(bytes);
    let resp = http.read_response();
    assert_error(&resp, 400, "Malformed request head");
    assert_eq!(resp.header("Connection"), Some("close"));
    assert!(http.is_closed_by_peer(), "still open after {bytes:?}");
}

#[test]
fn tls_hello_binary_garbage_and_bad_methods_are_refused_at_once() {
    let srv = Server::start_with(&[("RELAY_REQUEST_TIMEOUT", "30")]);
    // A TLS 1.2/1.3 ClientHello's record and handshake headers, then random.
    let mut hello = vec![
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 24) as u8
    };
    hello.extend((0..32).map(|_| random()));
    assert_refused_at_once(&srv, &hello);
    let garbage: Vec<u8> = (0..64).map(|_| random() | 0x80).collect();
    assert_refused_at_once(&srv, &garbage);
    assert_refused_at_once(&srv, b"GET(1) /healthz HTTP/1.1\r\n");
    assert_refused_at_once(&srv, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    // The server is unharmed, and empty lines before a request are fine.
    let mut http = srv.conn();
    http.send_raw(b"\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(http.read_response().status, 200);
}

// ---- numbers past 64 bits in queries ----

#[test]
fn huge_query_numbers_clamp_or_match_nothing_and_negatives_are_400() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "q1", Some("c1"));
    srv.prompt(&sid, "q2", Some("c2"));
    let page = srv.messages(&sid, "?limit=10000000000000000000");
    assert_eq!(
        (page["limit"].as_u64(), page["total"].as_u64()),
        (Some(1000), Some(2))
    );
    assert_eq!(page["messages"].as_array().unwrap().len(), 2);
    assert_eq!(srv.messages(&sid, "?limit=1001")["limit"], 1000);
    let huge = "99999999999999999999999999";
    let page = srv.messages(&sid, &format!("?offset={huge}"));
    assert!(page["messages"].as_array().unwrap().is_empty(), "{page}");
    assert_eq!(
        (page["total"].as_u64(), page["offset"].as_u64()),
        (Some(2), Some(u64::MAX))
    );
    for filter in ["after", "since"] {
        let page = srv.messages(&sid, &format!("?{filter}={huge}"));
        assert_eq!(page["total"], 0, "{filter}: {page}");
    }
    let resp = srv.get(&format!("/prompts/{sid}?wait=false&after={huge}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json(), json!([]));
    for query in [
        "limit=-1",
        "limit=-10000000000000000000",
        "offset=-2",
        "after=-1",
    ] {
        let resp = srv.get(&format!("/messages/{sid}?{query}"));
        assert_eq!(resp.status, 400, "{query}: {}", resp.text());
    }
}

// ---- chunked framing ----

/// A `POST /prompt` head announcing a chunked body.
fn chunked_prompt_head() -> Vec<u8> {
    b"POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
      Transfer-Encoding: chunked\r\n\r\n"
        .to_vec()
}

#[test]
fn long_chunk_extensions_and_framing_floods_are_refused() {
    let srv = Server::start_with(&[("RELAY_MAX_BODY", "1024")]);
    // A size line of 300 bytes: 400 and close.
    let mut http = srv.conn();
    let mut raw = chunked_prompt_head();
    raw.extend_from_slice(format!("1;ext={}\r\n", "v".repeat(292)).as_bytes());
    http.send_raw(&raw);
    let resp = http.read_response();
    assert_error(&resp, 400, "Malformed chunked body");
    assert!(http.is_closed_by_peer());
    // One-byte chunks with 200-byte extensions: 413 once the framing passes
    // the body cap plus 64 KiB, while the body is a few hundred bytes.
    let mut http = srv.conn();
    let mut raw = chunked_prompt_head();
    let chunk = format!("1;e={}\r\n \r\n", "x".repeat(194));
    for _ in 0..(1024 + 64 * 1024) / 202 + 1 {
        raw.extend_from_slice(chunk.as_bytes());
    }
    http.send_raw(&raw);
    let resp = http.read_response();
    assert_error(&resp, 413, "Message exceeds size limit");
    // A body in small chunks with a short extension is fine.
    let body = format!(
        r#"{{"session_id":"{}","prompt":"chunky"}}"#,
        unique_session()
    );
    let mut raw = chunked_prompt_head();
    for piece in body.as_bytes().chunks(3) {
        raw.extend_from_slice(format!("{:x};n=1\r\n", piece.len()).as_bytes());
        raw.extend_from_slice(piece);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let mut http = srv.conn();
    http.send_raw(&raw);
    assert_eq!(http.read_response().status, 200);
}
