//! `POST /cancel` over the real binary: a pending prompt stopped (stored
//! in history with the next `seq`, sent to subscribers as a `cancel`
//! frame, no longer pending, its draft ended with `delta_end`), a resend
//! answered as a duplicate, every refusal, answers to a cancelled prompt
//! refused, and the cancel replayed by `after` and listed by `/messages`.
//! Frames are awaited by reading the socket, never by sleeping.

use crate::common::{Response, Server, Ws, assert_error, unique_session};
use serde_json::{Value, json};

/// `POST /cancel` for `cid`, with a `reason` when given.
#[track_caller]
fn cancel(srv: &Server, sid: &str, cid: &str, reason: Option<&str>) -> Response {
    let mut body = json!({"session_id": sid, "client_msg_id": cid});
    if let Some(r) = reason {
        body["reason"] = Value::from(r);
    }
    srv.post_json("/cancel", &body)
}

/// The next frame that is not a ping, a `presence` or a `receipt`.
#[track_caller]
fn content(ws: &mut Ws) -> Value {
    loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] != "presence" && v["type"] != "receipt" {
            return v;
        }
    }
}

/// A subscriber that has read its replay up to the `presence` frame.
#[track_caller]
fn subscribe(srv: &Server, sid: &str, after: u64) -> (Ws, Vec<Value>) {
    let mut ws = srv.ws(&format!("/ws/{sid}?after={after}"));
    let mut before = Vec::new();
    loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] == "presence" {
            return (ws, before);
        }
        before.push(v);
    }
}

/// `POST /response` for `cid`, partial or final.
#[track_caller]
fn respond(srv: &Server, sid: &str, cid: &str, aid: &str, partial: bool) -> Response {
    let mut body = json!({"session_id": sid, "client_msg_id": cid,
                          "assistant_msg_id": aid, "text": "t"});
    if partial {
        body["partial"] = Value::from(true);
    }
    srv.post_json("/response", &body)
}

#[test]
fn a_cancel_is_stored_sent_and_ends_the_prompt() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "do it", Some("p1"));
    let (mut ws, replay) = subscribe(&srv, &sid, 0);
    assert!(replay.is_empty(), "a prompt is not a frame: {replay:?}");

    let r = cancel(&srv, &sid, "p1", Some("stop \"now\""));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"ok": true, "cancelled": true, "seq": 2}));

    let frame = content(&mut ws);
    assert_eq!(frame["type"], "cancel", "{frame}");
    let data = &frame["data"];
    assert_eq!(data["session_id"], sid.as_str());
    assert_eq!(data["client_msg_id"], "p1");
    assert_eq!(data["reason"], "stop \"now\"");
    assert_eq!(data["seq"], 2);
    assert!(data["ts"].as_u64().is_some_and(|t| t > 0), "{data}");

    // No longer pending, and in history as a `cancel` message whose data
    // is the frame's.
    assert!(srv.pending(&sid).is_empty());
    let msgs = srv.messages(&sid, "");
    assert_eq!(msgs["total"], 2, "{msgs}");
    assert_eq!(msgs["messages"][1], frame, "{msgs}");

    // A resend: the stored cancel's seq, nothing stored.
    let r = cancel(&srv, &sid, "p1", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"ok": true, "cancelled": true, "seq": 2, "duplicate": true})
    );
    // Answers to it, final or partial, are refused and change nothing.
    for partial in [true, false] {
        let r = respond(&srv, &sid, "p1", "a1", partial);
        assert_error(&r, 409, "Conflict");
        assert_eq!(r.json()["details"], "prompt cancelled");
    }
    assert_eq!(srv.messages(&sid, "")["total"], 2);

    // The next message takes the next seq, and reaches the subscriber
    // right after the cancel (nothing else was sent).
    srv.prompt(&sid, "again", Some("p2"));
    let r = respond(&srv, &sid, "p2", "a2", false);
    assert_eq!(r.status, 200, "{}", r.text());
    let m = content(&mut ws);
    assert_eq!(
        (&m["type"], &m["data"]["seq"]),
        (&json!("message"), &json!(4))
    );
}

#[test]
fn a_cancel_is_replayed_by_after() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "q", Some("p1"));
    assert_eq!(cancel(&srv, &sid, "p1", None).status, 200);
    let (_ws, replay) = subscribe(&srv, &sid, 0);
    assert_eq!(replay.len(), 1, "{replay:?}");
    assert_eq!(replay[0]["type"], "cancel");
    assert_eq!(replay[0]["data"]["seq"], 2);
    assert!(replay[0]["data"].get("reason").is_none(), "{replay:?}");
    let (_ws, replay) = subscribe(&srv, &sid, 2);
    assert!(replay.is_empty(), "after the cancel: {replay:?}");
    let page = srv.messages(&sid, "?after=1");
    assert_eq!(page["messages"][0]["type"], "cancel", "{page}");
}

#[test]
fn refusals_say_why() {
    let srv = Server::start();
    let sid = unique_session();
    let r = cancel(&srv, &sid, "p1", None);
    assert_error(&r, 404, "Session not found");
    srv.prompt(&sid, "q", Some("p1"));
    assert_error(&cancel(&srv, &sid, "nope", None), 404, "Prompt not found");
    srv.respond(&sid, "p1", "done");
    let r = cancel(&srv, &sid, "p1", None);
    assert_error(&r, 409, "Conflict");
    assert_eq!(r.json()["details"], "prompt already answered");
    assert_eq!(srv.messages(&sid, "")["total"], 2, "nothing stored");

    let cases = [
        (
            json!({"client_msg_id": "p1"}),
            "Missing required field: session_id",
        ),
        (
            json!({"session_id": sid}),
            "Missing required field: client_msg_id",
        ),
        (
            json!({"session_id": sid, "client_msg_id": 7}),
            "Invalid client_msg_id: must be a string",
        ),
        (
            json!({"session_id": "bad id!", "client_msg_id": "p1"}),
            "Invalid session_id",
        ),
    ];
    for (body, error) in cases {
        assert_error(&srv.post_json("/cancel", &body), 400, error);
    }
    let too_long = "x".repeat(257);
    for reason in [json!(too_long), json!(5), json!({"a": 1})] {
        let body = json!({"session_id": sid, "client_msg_id": "p1", "reason": reason});
        let r = srv.post_json("/cancel", &body);
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(
            r.json()["error"].as_str().unwrap().contains("reason"),
            "{}",
            r.text()
        );
    }
    let r = srv.request(
        "POST",
        "/cancel",
        &[("Content-Type", "text/plain")],
        Some(b"{}"),
    );
    assert_eq!(r.status, 415, "{}", r.text());
    // 256 bytes is allowed.
    srv.prompt(&sid, "q2", Some("p2"));
    let r = cancel(&srv, &sid, "p2", Some(&"é".repeat(128)));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_cancel_ends_the_draft_of_its_prompt() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "q", Some("p1"));
    srv.prompt(&sid, "other", Some("p2"));
    let (mut ws, _) = subscribe(&srv, &sid, 0);
    assert_eq!(respond(&srv, &sid, "p1", "a1", true).status, 200);
    assert_eq!(respond(&srv, &sid, "p2", "a2", true).status, 200);
    for _ in 0..2 {
        assert_eq!(content(&mut ws)["type"], "delta");
    }
    assert_eq!(cancel(&srv, &sid, "p1", None).status, 200);
    let mut got = [content(&mut ws), content(&mut ws)];
    got.sort_by_key(|v| v["type"].as_str().unwrap_or("").to_string());
    assert_eq!(got[0]["type"], "cancel", "{got:?}");
    assert_eq!(
        got[1],
        json!({"type": "delta_end", "data": {"session_id": sid, "client_msg_id": "p1",
               "assistant_msg_id": "a1", "reason": "cancelled"}})
    );
    // The other prompt's draft goes on; a new subscriber gets only it.
    let (_ws2, replay) = subscribe(&srv, &sid, 3);
    let drafts: Vec<_> = replay.iter().filter(|v| v["type"] == "delta").collect();
    assert_eq!(drafts.len(), 1, "{replay:?}");
    assert_eq!(drafts[0]["data"]["assistant_msg_id"], "a2");
    assert_eq!(srv.pending(&sid).len(), 1);
}

#[test]
fn a_parked_poll_is_not_woken_by_a_cancel() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "q", Some("p1"));
    let mut poll = srv.start_poll(&sid, "?after=1&timeout=30");
    srv.wait_health("parked_polls", 1);
    assert_eq!(cancel(&srv, &sid, "p1", None).status, 200);
    srv.prompt(&sid, "next", Some("p2"));
    let r = poll.read_response();
    assert_eq!(r.status, 200, "{}", r.text());
    let ids: Vec<_> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["client_msg_id"].clone())
        .collect();
    assert_eq!(ids, [json!("p2")], "woken by the prompt, not by the cancel");
}
