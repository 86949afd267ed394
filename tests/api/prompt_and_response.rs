//! POST /prompt and POST /response over the real binary: success bodies, idempotency, 404/409,
//! 415, and every 400 text of the contract. GET /messages, /healthz, sessions, routing and
//! CORS are in `endpoints.rs`; env-configured caps in `limits.rs`.

use crate::common;

use crate::common::{Server, assert_error, is_uuid_v4, now_ms, unique_session};
use serde_json::{Value, json};

/// POSTs a raw body with the JSON content type.
#[track_caller]
fn post_raw(srv: &Server, path: &str, body: &str) -> common::Response {
    srv.request(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        Some(body.as_bytes()),
    )
}

/// Asserts a 400 whose `error` mentions `field`.
#[track_caller]
fn assert_400_naming(resp: &common::Response, field: &str) {
    assert_eq!(resp.status, 400, "body: {}", resp.text());
    let body = resp.json();
    let error = body["error"].as_str().expect("error is a string");
    assert!(error.contains(field), "error {error:?} should name {field}");
}

#[track_caller]
fn message_total(srv: &Server, sid: &str) -> u64 {
    srv.messages(sid, "")["total"].as_u64().expect("total")
}

// ---- POST /prompt ----

#[test]
fn prompt_is_stored_and_acknowledged_with_its_client_msg_id() {
    let srv = Server::start();
    let sid = unique_session();
    let resp = srv.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "Hello", "client_msg_id": "m-1"}),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(
        resp.header("content-type")
            .is_some_and(|v| v.starts_with("application/json"))
    );
    assert_eq!(resp.json(), json!({"stored": true, "client_msg_id": "m-1"}));
    let pending = srv.pending(&sid);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["session_id"], sid.as_str());
    assert_eq!(pending[0]["client_msg_id"], "m-1");
    assert_eq!(pending[0]["prompt"], "Hello");
    assert_eq!(pending[0]["seq"], 1);
    assert!(pending[0].get("metadata").is_none(), "{}", pending[0]);
}

#[test]
fn prompt_without_client_msg_id_gets_a_generated_uuid_v4() {
    let srv = Server::start();
    let sid = unique_session();
    let ack = srv.prompt(&sid, "hi", None);
    assert_eq!(ack["stored"], true);
    let id = ack["client_msg_id"].as_str().expect("client_msg_id");
    assert!(is_uuid_v4(id), "{id} is not a UUID v4");
    assert_eq!(srv.pending(&sid)[0]["client_msg_id"], id);
    let other = srv.prompt(&sid, "again", None);
    assert_ne!(other["client_msg_id"], id, "generated ids must differ");
}

#[test]
fn first_prompt_creates_the_session() {
    let srv = Server::start();
    let sid = unique_session();
    let before = srv.get(&format!("/prompts/{sid}?wait=false"));
    assert_error(&before, 404, "Session not found");
    srv.prompt(&sid, "hello", Some("a"));
    assert_eq!(srv.pending(&sid).len(), 1);
}

#[test]
fn duplicate_prompt_is_acknowledged_but_not_stored() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "first é", Some("dup"));
    // The same text, escaped differently, with other metadata: a resend.
    let resend =
        br#"{"session_id":"SID","prompt":"first \u00e9","client_msg_id":"dup","metadata":{"x":1}}"#;
    let resend = String::from_utf8_lossy(resend).replace("SID", &sid);
    let mut conn = srv.conn();
    let resp = conn.request(
        "POST",
        "/prompt",
        &[("Content-Type", "application/json")],
        Some(resend.as_bytes()),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.json(),
        json!({"stored": true, "client_msg_id": "dup", "duplicate": true})
    );
    let pending = srv.pending(&sid);
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["prompt"], "first é", "first write wins");
    assert!(pending[0].get("metadata").is_none(), "{pending:?}");
    assert_eq!(message_total(&srv, &sid), 1);
}

#[test]
fn a_client_msg_id_reused_with_another_prompt_is_409_and_stores_nothing() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "first", Some("dup"));
    let resp = srv.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "second", "client_msg_id": "dup"}),
    );
    assert_eq!(resp.status, 409, "{}", resp.text());
    assert_eq!(
        resp.json(),
        json!({"error": "Conflict", "details": "client_msg_id already used"})
    );
    let pending = srv.pending(&sid);
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0]["prompt"], "first");
    assert_eq!(message_total(&srv, &sid), 1);
    // Still refused once the prompt is answered (it is in history).
    srv.respond(&sid, "dup", "done");
    let resp = srv.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "second", "client_msg_id": "dup"}),
    );
    assert_eq!(resp.status, 409, "{}", resp.text());
    assert_eq!(message_total(&srv, &sid), 2);
}

#[test]
fn same_client_msg_id_in_another_session_is_not_a_duplicate() {
    let srv = Server::start();
    let (a, b) = (unique_session(), unique_session());
    srv.prompt(&a, "one", Some("same"));
    let ack = srv.prompt(&b, "two", Some("same"));
    assert!(ack.get("duplicate").is_none(), "{ack}");
    assert_eq!(srv.pending(&b).len(), 1);
}

#[test]
fn prompt_metadata_and_ts_are_kept() {
    let srv = Server::start();
    let sid = unique_session();
    let meta = json!({"lang": "en", "n": 3, "nested": {"x": [1, 2]}});
    let body = json!({"session_id": sid, "prompt": "p", "client_msg_id": "c",
                      "metadata": meta, "ts": 1234567890});
    assert_eq!(srv.post_json("/prompt", &body).status, 200);
    let p = &srv.pending(&sid)[0];
    assert_eq!(p["metadata"], meta);
    assert_eq!(p["ts"], 1234567890);
}

#[test]
fn prompt_without_ts_is_stamped_with_the_server_clock() {
    let srv = Server::start();
    let sid = unique_session();
    let before = now_ms();
    srv.prompt(&sid, "p", Some("c"));
    let after = now_ms();
    let ts = srv.pending(&sid)[0]["ts"]
        .as_u64()
        .expect("ts is an integer");
    // Generous window: the two clocks are the same machine's, but allow for skew in rounding.
    assert!(
        ts + 5_000 >= before && ts <= after + 5_000,
        "ts {ts} not near {before}..{after}"
    );
}

#[test]
fn null_metadata_means_absent() {
    let srv = Server::start();
    let sid = unique_session();
    let body = json!({"session_id": sid, "prompt": "p", "client_msg_id": "c", "metadata": null});
    assert_eq!(srv.post_json("/prompt", &body).status, 200);
    assert!(srv.pending(&sid)[0].get("metadata").is_none());
}

#[test]
fn unknown_fields_are_ignored() {
    let srv = Server::start();
    let sid = unique_session();
    let body = json!({"session_id": sid, "prompt": "p", "client_msg_id": "c", "colour": "blue"});
    assert_eq!(srv.post_json("/prompt", &body).status, 200);
    assert!(srv.pending(&sid)[0].get("colour").is_none());
}

#[test]
fn session_id_of_every_unreserved_character_is_accepted() {
    let srv = Server::start();
    for sid in ["A-Za-z0-9._~", "x", &"s".repeat(128)] {
        let resp = srv.post_json("/prompt", &json!({"session_id": sid, "prompt": "p"}));
        assert_eq!(resp.status, 200, "{sid}: {}", resp.text());
    }
}

#[test]
fn invalid_session_id_is_rejected() {
    let srv = Server::start();
    let too_long = "s".repeat(129);
    let rule = "1 to 128 characters from A-Z a-z 0-9 . _ ~ -";
    for sid in ["", "a b", "a/b", "a?b", "é", "a%20b", too_long.as_str()] {
        let resp = srv.post_json("/prompt", &json!({"session_id": sid, "prompt": "p"}));
        assert_error(&resp, 400, "Invalid session_id");
        assert_eq!(resp.json()["details"], rule, "body-level, {sid:?}");
        let resp = srv.post_json(
            "/response",
            &json!({"session_id": sid, "client_msg_id": "c", "text": "t"}),
        );
        assert_error(&resp, 400, "Invalid session_id");
        assert_eq!(resp.json()["details"], rule, "body-level, {sid:?}");
    }
    // The route-level check (a session id in the path) says the same.
    for path in [
        format!("/prompts/{too_long}?wait=false"),
        "/messages/a%20b".to_string(),
        "/ws/a~b!".to_string(),
    ] {
        let resp = srv.get(&path);
        assert_error(&resp, 400, "Invalid session_id");
        assert_eq!(resp.json()["details"], rule, "route-level, {path}");
    }
}

#[test]
fn malformed_json_is_invalid_json_with_details() {
    let srv = Server::start();
    let resp = post_raw(&srv, "/prompt", r#"{"session_id": "s", "prompt": "#);
    assert_error(&resp, 400, "Invalid JSON");
    let details = resp.json()["details"].clone();
    assert!(
        details.as_str().is_some_and(|d| !d.is_empty()),
        "details should carry the parser message: {details}"
    );
}

#[test]
fn body_that_is_not_an_object_is_rejected() {
    let srv = Server::start();
    for body in ["[1,2]", "\"text\"", "42", "null"] {
        let resp = post_raw(&srv, "/prompt", body);
        assert_eq!(resp.status, 400, "{body}: {}", resp.text());
        assert!(resp.json()["error"].is_string());
    }
}

#[test]
fn missing_prompt_fields_are_named() {
    let srv = Server::start();
    let resp = srv.post_json("/prompt", &json!({"prompt": "p"}));
    assert_error(&resp, 400, "Missing required field: session_id");
    let resp = srv.post_json("/prompt", &json!({"session_id": "s"}));
    assert_error(&resp, 400, "Missing required field: prompt");
}

#[test]
fn wrongly_typed_prompt_fields_are_named() {
    let srv = Server::start();
    let cases = [
        (json!({"session_id": 5, "prompt": "p"}), "session_id"),
        (json!({"session_id": "s", "prompt": 5}), "prompt"),
        (json!({"session_id": "s", "prompt": ["p"]}), "prompt"),
        (
            json!({"session_id": "s", "prompt": "p", "client_msg_id": 7}),
            "client_msg_id",
        ),
    ];
    for (body, field) in cases {
        assert_400_naming(&srv.post_json("/prompt", &body), field);
    }
}

#[test]
fn empty_or_overlong_client_msg_id_is_rejected() {
    let srv = Server::start();
    let sid = unique_session();
    for id in [String::new(), "c".repeat(257)] {
        let resp = srv.post_json(
            "/prompt",
            &json!({"session_id": sid, "prompt": "p", "client_msg_id": id}),
        );
        assert_eq!(resp.status, 400, "len {}: {}", id.len(), resp.text());
    }
    srv.prompt(&sid, "p", Some(&"c".repeat(256)));
}

#[test]
fn prompt_over_128_kib_exceeds_size_limit_counted_in_bytes() {
    let srv = Server::start();
    let sid = unique_session();
    // 65536 two-byte characters: exactly 131072 bytes, accepted.
    let exact = "é".repeat(65536);
    srv.prompt(&sid, &exact, Some("exact"));
    // One more character: 131074 bytes but only 65537 characters, rejected.
    let over = "é".repeat(65537);
    let resp = srv.post_json("/prompt", &json!({"session_id": sid, "prompt": over}));
    assert_error(&resp, 400, "Message exceeds size limit");
    assert_eq!(srv.pending(&sid).len(), 1);
}

#[test]
fn metadata_that_is_not_an_object_is_rejected() {
    let srv = Server::start();
    for meta in [json!([1]), json!("x"), json!(3), json!(true)] {
        let resp = srv.post_json(
            "/prompt",
            &json!({"session_id": "s", "prompt": "p", "metadata": meta}),
        );
        assert_400_naming(&resp, "metadata");
    }
}

#[test]
fn ts_that_is_not_a_non_negative_integer_is_rejected() {
    let srv = Server::start();
    for ts in [json!(-1), json!(1.5), json!("123"), json!([1])] {
        let resp = srv.post_json(
            "/prompt",
            &json!({"session_id": "s", "prompt": "p", "ts": ts}),
        );
        assert_400_naming(&resp, "ts");
    }
}

#[test]
fn post_without_json_content_type_is_415() {
    let srv = Server::start();
    let body = br#"{"session_id":"s","prompt":"p"}"#;
    for headers in [
        vec![],
        vec![("Content-Type", "text/plain")],
        vec![("Content-Type", "application/x-www-form-urlencoded")],
    ] {
        for path in ["/prompt", "/response"] {
            let resp = srv.request("POST", path, &headers, Some(body));
            assert_error(&resp, 415, "Content-Type must be application/json");
        }
    }
    let resp = srv.get("/prompts/s?wait=false");
    assert_eq!(
        resp.status, 404,
        "a rejected prompt must not create its session"
    );
}

#[test]
fn json_content_type_with_charset_parameter_is_accepted() {
    let srv = Server::start();
    let resp = srv.request(
        "POST",
        "/prompt",
        &[("Content-Type", "application/json; charset=utf-8")],
        Some(br#"{"session_id":"cs","prompt":"p"}"#),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
}

// ---- POST /response ----

#[test]
fn response_to_unknown_session_is_404() {
    let srv = Server::start();
    let resp = srv.post_json(
        "/response",
        &json!({"session_id": unique_session(), "client_msg_id": "c", "text": "t"}),
    );
    assert_error(&resp, 404, "Session not found");
}

#[test]
fn response_to_unknown_prompt_is_404() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    let resp = srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": "nope", "text": "t"}),
    );
    assert_error(&resp, 404, "Prompt not found");
}

#[test]
fn response_is_stored_and_answers_the_prompt() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    let ack = srv.respond(&sid, "c", "answer");
    assert_eq!(ack["ok"], true);
    assert_eq!(ack["delivered"], false, "no subscriber: {ack}");
    let amid = ack["assistant_msg_id"].as_str().expect("assistant_msg_id");
    assert!(is_uuid_v4(amid), "{amid} is not a UUID v4");
    assert!(
        srv.pending(&sid).is_empty(),
        "answered prompt is not pending"
    );
    let msgs = srv.messages(&sid, "");
    let data = &msgs["messages"][1]["data"];
    assert_eq!(msgs["messages"][1]["type"], "assistant");
    assert_eq!(data["assistant_msg_id"], amid);
    assert_eq!(data["client_msg_id"], "c");
    assert_eq!(data["session_id"], sid.as_str());
    assert_eq!(data["text"], "answer");
    assert_eq!(data["seq"], 2);
    assert!(data["ts"].is_u64());
}

#[test]
fn response_keeps_given_assistant_msg_id_metadata_and_ts() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    let body = json!({"session_id": sid, "client_msg_id": "c", "text": "t",
                      "assistant_msg_id": "a-1", "metadata": {"model": "x"}, "ts": 42});
    let resp = srv.post_json("/response", &body);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.json(),
        json!({"ok": true, "assistant_msg_id": "a-1", "delivered": false})
    );
    let data = srv.messages(&sid, "")["messages"][1]["data"].clone();
    assert_eq!(data["metadata"], json!({"model": "x"}));
    assert_eq!(data["ts"], 42);
}

#[test]
fn response_is_delivered_when_a_subscriber_is_connected() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.prompt(&sid, "p", Some("c"));
    let ack = srv.respond(&sid, "c", "live");
    assert_eq!(ack["delivered"], true, "{ack}");
    let frame = ws.recv_json_skip_pings();
    assert_eq!(frame["type"], "message");
    assert_eq!(frame["data"]["text"], "live");
    assert_eq!(frame["data"]["assistant_msg_id"], ack["assistant_msg_id"]);
}

#[test]
fn duplicate_response_is_acknowledged_but_not_stored_or_broadcast() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.prompt(&sid, "p", Some("c"));
    let body =
        json!({"session_id": sid, "client_msg_id": "c", "text": "t", "assistant_msg_id": "a"});
    assert_eq!(srv.post_json("/response", &body).status, 200);
    assert_eq!(ws.recv_json_skip_pings()["data"]["assistant_msg_id"], "a");
    let again = srv.post_json("/response", &body);
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(
        again.json(),
        json!({"ok": true, "assistant_msg_id": "a", "delivered": false, "duplicate": true})
    );
    assert_eq!(message_total(&srv, &sid), 2, "prompt + one response");
    // The next frame is the next distinct response, not a re-broadcast of "a".
    let next =
        json!({"session_id": sid, "client_msg_id": "c", "text": "t2", "assistant_msg_id": "b"});
    assert_eq!(srv.post_json("/response", &next).status, 200);
    assert_eq!(ws.recv_json_skip_pings()["data"]["assistant_msg_id"], "b");
}

#[test]
fn reused_assistant_msg_id_with_other_content_is_409_conflict() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p1", Some("c1"));
    srv.prompt(&sid, "p2", Some("c2"));
    let first =
        json!({"session_id": sid, "client_msg_id": "c1", "text": "t", "assistant_msg_id": "a"});
    assert_eq!(srv.post_json("/response", &first).status, 200);
    let other_text = json!({"session_id": sid, "client_msg_id": "c1", "text": "changed", "assistant_msg_id": "a"});
    let other_prompt =
        json!({"session_id": sid, "client_msg_id": "c2", "text": "t", "assistant_msg_id": "a"});
    for body in [other_text, other_prompt] {
        let resp = srv.post_json("/response", &body);
        assert_error(&resp, 409, "Conflict");
        assert_eq!(resp.json()["details"], "assistant_msg_id already used");
    }
    assert_eq!(message_total(&srv, &sid), 3);
    assert_eq!(srv.pending(&sid).len(), 1, "c2 is still pending");
}

#[test]
fn several_responses_to_one_prompt_are_all_stored_and_broadcast() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.prompt(&sid, "p", Some("c"));
    let ids: Vec<String> = (1..=3)
        .map(|i| {
            let ack = srv.respond(&sid, "c", &format!("part {i}"));
            assert_eq!(ack["delivered"], true);
            ack["assistant_msg_id"].as_str().unwrap().to_string()
        })
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let frame = ws.recv_json_skip_pings();
        assert_eq!(frame["data"]["assistant_msg_id"], id.as_str());
        assert_eq!(frame["data"]["text"], format!("part {}", i + 1));
    }
    let msgs = srv.messages(&sid, "");
    assert_eq!(msgs["total"], 4);
    let seqs: Vec<u64> = msgs["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
}

#[test]
fn missing_response_fields_are_named() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    let full = json!({"session_id": sid, "client_msg_id": "c", "text": "t"});
    for field in ["session_id", "client_msg_id", "text"] {
        let mut body = full.clone();
        body.as_object_mut().unwrap().remove(field);
        let resp = srv.post_json("/response", &body);
        assert_error(&resp, 400, &format!("Missing required field: {field}"));
    }
    assert_eq!(srv.pending(&sid).len(), 1);
}

#[test]
fn invalid_response_fields_are_rejected() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    let base = json!({"session_id": sid, "client_msg_id": "c", "text": "t"});
    let cases = [
        ("text", json!(1), "text"),
        ("client_msg_id", json!(1), "client_msg_id"),
        ("assistant_msg_id", json!(1), "assistant_msg_id"),
        ("metadata", json!([1]), "metadata"),
        ("ts", json!(-5), "ts"),
        ("ts", json!("now"), "ts"),
    ];
    for (field, value, named) in cases {
        let mut body = base.clone();
        body[field] = value;
        assert_400_naming(&srv.post_json("/response", &body), named);
    }
    let mut body = base.clone();
    body["session_id"] = json!("bad id");
    assert_error(
        &srv.post_json("/response", &body),
        400,
        "Invalid session_id",
    );
    let mut body = base.clone();
    body["text"] = Value::from("x".repeat(131073));
    assert_error(
        &srv.post_json("/response", &body),
        400,
        "Message exceeds size limit",
    );
    let resp = post_raw(&srv, "/response", "{not json");
    assert_error(&resp, 400, "Invalid JSON");
    assert_eq!(srv.pending(&sid).len(), 1, "nothing was answered");
}

#[test]
fn empty_or_overlong_assistant_msg_id_is_rejected() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    for id in [String::new(), "a".repeat(257)] {
        let body =
            json!({"session_id": sid, "client_msg_id": "c", "text": "t", "assistant_msg_id": id});
        let resp = srv.post_json("/response", &body);
        assert_eq!(resp.status, 400, "len {}: {}", id.len(), resp.text());
    }
    assert_eq!(srv.pending(&sid).len(), 1);
}
