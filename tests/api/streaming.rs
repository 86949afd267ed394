//! Streamed answers, the agent's presence and receipts over the real
//! binary: parts as `delta` frames, snapshots for a subscriber that joins
//! mid-answer, the final answer replacing the draft, drafts timing out,
//! every refusal, `presence` and `receipt` frames, and `GET /sessions/{id}`.
//! A frame is awaited by reading the socket, never by sleeping.

use crate::common;

use crate::common::{Server, Ws, assert_error, unique_session};
use serde_json::{Value, json};

/// `POST /response` with `"partial": true`.
#[track_caller]
fn part(srv: &Server, sid: &str, cid: &str, aid: &str, text: &str) -> common::Response {
    srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": aid,
                "text": text, "partial": true}),
    )
}

/// The next frame of one of the live types (`presence`, `receipt`,
/// `delta`, `delta_end`) or a `message`, skipping pings.
#[track_caller]
fn next(ws: &mut Ws) -> Value {
    ws.recv_any_skip_pings()
}

/// The next frame that is not a ping, a `presence` or a `receipt`.
#[track_caller]
fn content(ws: &mut Ws) -> Value {
    loop {
        let v = next(ws);
        if v["type"] != "presence" && v["type"] != "receipt" {
            return v;
        }
    }
}

/// Connects a subscriber and reads what comes after its replay up to and
/// including the `presence` frame (the snapshots come before it).
#[track_caller]
fn subscribe(srv: &Server, sid: &str) -> (Ws, Vec<Value>) {
    let mut ws = srv.ws(&format!("/ws/{sid}?after=0"));
    let mut before = Vec::new();
    loop {
        let v = next(&mut ws);
        if v["type"] == "presence" {
            before.push(v);
            return (ws, before);
        }
        before.push(v);
    }
}

/// A session with one prompt; its `client_msg_id`.
fn session_with_prompt(srv: &Server) -> (String, String) {
    let sid = unique_session();
    let ack = srv.prompt(&sid, "hello?", None);
    (sid, ack["client_msg_id"].as_str().unwrap().to_string())
}

#[test]
fn parts_reach_subscribers_and_the_final_answer_replaces_the_draft() {
    let srv = Server::start();
    let (sid, cid) = session_with_prompt(&srv);
    let (mut ws, first) = subscribe(&srv, &sid);
    assert_eq!(first.len(), 1, "no draft yet: only presence, got {first:?}");

    let r = part(&srv, &sid, &cid, "a-1", "Hel");
    assert_eq!(r.status, 200, "{}", r.text());
    let ack = r.json();
    assert_eq!(ack["ok"], true);
    assert_eq!(ack["assistant_msg_id"], "a-1");
    assert_eq!(ack["partial"], true);
    if !common::redis_mode() {
        // With two relays, the subscriber's relay may not have told Redis
        // yet that it has one (the contract's `delivered` is best effort).
        assert_eq!(ack["delivered"], true);
    }
    let mut first = content(&mut ws);
    if common::redis_mode() {
        // With two relays, the subscriber's relay may read the draft from
        // Redis before the part's publication reaches it: a snapshot then.
        first["data"].as_object_mut().unwrap().remove("snapshot");
    }
    assert_eq!(
        first,
        json!({"type": "delta", "data": {"session_id": sid, "client_msg_id": cid,
               "assistant_msg_id": "a-1", "part": 1, "text": "Hel"}})
    );
    assert_eq!(part(&srv, &sid, &cid, "a-1", "lo \"w\"\n").status, 200);
    let d = content(&mut ws);
    assert_eq!(d["data"]["part"], 2);
    assert_eq!(d["data"]["text"], "lo \"w\"\n");

    // A draft is not a message: not in history, the prompt still pending.
    let msgs = srv.messages(&sid, "");
    assert_eq!(msgs["total"], 1, "{msgs}");
    assert_eq!(srv.pending(&sid).len(), 1);

    let body = json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": "a-1",
                      "text": "Hello \"w\"\n"});
    let r = srv.post_json("/response", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().get("partial").is_none());
    let m = content(&mut ws);
    assert_eq!(m["type"], "message");
    assert_eq!(m["data"]["assistant_msg_id"], "a-1");
    assert_eq!(m["data"]["text"], "Hello \"w\"\n");
    assert!(srv.pending(&sid).is_empty());

    // The draft is gone: a new subscriber gets the message, no snapshot.
    let (_ws2, got) = subscribe(&srv, &sid);
    let types: Vec<_> = got.iter().map(|v| v["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["message", "presence"], "{got:?}");
    // And a part for a stored answer is refused.
    let r = part(&srv, &sid, &cid, "a-1", "more");
    assert_error(&r, 409, "Conflict");
}

#[test]
fn a_subscriber_joining_mid_answer_gets_a_snapshot_after_its_replay() {
    let srv = Server::start();
    let (sid, cid) = session_with_prompt(&srv);
    srv.respond(&sid, &cid, "an earlier answer");
    assert_eq!(part(&srv, &sid, &cid, "b-1", "one ").status, 200);
    assert_eq!(part(&srv, &sid, &cid, "b-1", "two ").status, 200);
    assert_eq!(part(&srv, &sid, &cid, "b-2", "other").status, 200);
    let (_ws, got) = subscribe(&srv, &sid);
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0]["type"], "message", "the replay comes first");
    let mut snaps: Vec<_> = got[1..3].iter().map(|v| v["data"].clone()).collect();
    snaps.sort_by_key(|d| d["assistant_msg_id"].as_str().unwrap().to_string());
    assert_eq!(
        snaps[0],
        json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": "b-1",
               "part": 2, "text": "one two ", "snapshot": true})
    );
    assert_eq!(snaps[1]["text"], "other");
    assert_eq!(snaps[1]["part"], 1);
    assert_eq!(got[3]["type"], "presence");
    // Drafts are not history.
    assert_eq!(srv.messages(&sid, "")["total"], 2);
}

#[test]
fn a_draft_without_new_parts_ends_with_delta_end() {
    let srv = Server::start_with(&[("RELAY_DRAFT_TIMEOUT", "0.3")]);
    let (sid, cid) = session_with_prompt(&srv);
    let (mut ws, _) = subscribe(&srv, &sid);
    assert_eq!(part(&srv, &sid, &cid, "c-1", "stuck").status, 200);
    assert_eq!(content(&mut ws)["type"], "delta");
    assert_eq!(
        content(&mut ws),
        json!({"type": "delta_end", "data": {"session_id": sid, "client_msg_id": cid,
               "assistant_msg_id": "c-1", "reason": "timeout"}})
    );
    let (_ws2, got) = subscribe(&srv, &sid);
    assert_eq!(got.len(), 1, "no snapshot of a dropped draft: {got:?}");
    // The answer can still be posted whole.
    srv.respond(&sid, &cid, "done");
}

#[test]
fn bad_parts_get_their_errors_and_change_nothing() {
    let srv = Server::start_with(&[("RELAY_MAX_PENDING", "2")]);
    let (sid, cid) = session_with_prompt(&srv);
    let r = srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": cid, "text": "x", "partial": true}),
    );
    assert_error(&r, 400, "Missing required field: assistant_msg_id");
    let r = srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": "d",
                "text": "x", "partial": "yes"}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("partial"));
    assert_error(
        &part(&srv, &unique_session(), &cid, "d-0", "x"),
        404,
        "Session not found",
    );
    assert_error(
        &part(&srv, &sid, "no-such-prompt", "d-0", "x"),
        404,
        "Prompt not found",
    );

    assert_eq!(part(&srv, &sid, &cid, "d-1", "first").status, 200);
    // The same draft for another prompt.
    let other = srv.prompt(&sid, "second?", None)["client_msg_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_error(&part(&srv, &sid, &other, "d-1", "x"), 409, "Conflict");
    // Past the size cap: refused, the draft unchanged.
    let big = "y".repeat(131_072);
    assert_error(
        &part(&srv, &sid, &cid, "d-1", &big),
        400,
        "Message exceeds size limit",
    );
    // Too many open drafts (the cap is RELAY_MAX_PENDING).
    assert_eq!(part(&srv, &sid, &other, "d-2", "second").status, 200);
    assert_eq!(part(&srv, &sid, &cid, "d-3", "third").status, 503);

    let (_ws, got) = subscribe(&srv, &sid);
    let mut texts: Vec<_> = got
        .iter()
        .filter(|v| v["type"] == "delta")
        .map(|v| {
            (
                v["data"]["assistant_msg_id"].clone(),
                v["data"]["text"].clone(),
            )
        })
        .collect();
    texts.sort_by_key(|(a, _)| a.as_str().unwrap().to_string());
    assert_eq!(
        texts,
        [
            (json!("d-1"), json!("first")),
            (json!("d-2"), json!("second"))
        ]
    );
    // A final answer whose text differs from a stored duplicate's: 409.
    let fin = json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": "d-1",
                     "text": "first and last"});
    assert_eq!(srv.post_json("/response", &fin).status, 200);
    let mut changed = fin.clone();
    changed["text"] = json!("something else");
    assert_error(&srv.post_json("/response", &changed), 409, "Conflict");
    assert_eq!(srv.messages(&sid, "")["total"], 3);
}

#[test]
fn presence_follows_the_agent_and_receipts_mark_fetched_prompts() {
    let srv = Server::start_with(&[("RELAY_AGENT_GRACE", "0.3")]);
    let sid = unique_session();
    assert_eq!(srv.put(&format!("/sessions/{sid}")).status, 200);
    let info = srv.get(&format!("/sessions/{sid}")).json();
    assert_eq!(info["agent"], "offline");
    assert_eq!(info["agent_seen_ts"], Value::Null);
    assert_eq!(info["pending"], 0);
    assert_eq!(info["last_seq"], 0);
    let (mut ws, got) = subscribe(&srv, &sid);
    assert_eq!(got[0]["data"]["agent"], "offline");
    assert_eq!(got[0]["data"]["session_id"], sid.as_str());

    // An agent parks a poll: online.
    let mut poll = srv.start_poll(&sid, "?timeout=30");
    let v = next(&mut ws);
    assert_eq!(v["type"], "presence");
    assert_eq!(v["data"]["agent"], "online");
    assert!(v["data"]["since"].as_u64().unwrap() > 1_600_000_000_000);
    let info = srv.get(&format!("/sessions/{sid}")).json();
    assert_eq!(info["agent"], "online");
    assert!(info["agent_seen_ts"].as_u64().is_some());

    // A prompt wakes it: a receipt, once.
    let ack = srv.prompt(&sid, "do it", None);
    let cid = ack["client_msg_id"].as_str().unwrap();
    assert_eq!(poll.read_response().status, 200);
    let v = next(&mut ws);
    assert_eq!(v["type"], "receipt", "{v}");
    assert_eq!(v["data"]["client_msg_id"], cid);
    assert_eq!(v["data"]["state"], "fetched");
    assert!(v["data"]["ts"].as_u64().is_some());
    let info = srv.get(&format!("/sessions/{sid}")).json();
    assert_eq!(info["pending"], 1);
    assert_eq!(info["last_seq"], 1);
    // Fetched again: no second receipt (the next frame is the part's).
    assert_eq!(srv.pending(&sid).len(), 1);
    assert_eq!(part(&srv, &sid, cid, "e-1", "working").status, 200);
    assert_eq!(next(&mut ws)["type"], "delta");
    // A subscriber that connects now is told the prompt was fetched, then
    // gets the draft so far and the agent's state.
    let (_late, got) = subscribe(&srv, &sid);
    let types: Vec<_> = got.iter().map(|v| v["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["receipt", "delta", "presence"], "{got:?}");
    assert_eq!(got[0]["data"]["client_msg_id"], cid);
    assert_eq!(got[1]["data"]["snapshot"], true);
    assert_eq!(got[2]["data"]["agent"], "online");

    // No poll and the grace passed: offline.
    let v = next(&mut ws);
    assert_eq!(v["type"], "presence", "{v}");
    assert_eq!(v["data"]["agent"], "offline");
    assert_eq!(
        srv.get(&format!("/sessions/{sid}")).json()["agent"],
        "offline"
    );
}

#[test]
fn get_session_needs_a_token_and_knows_unknown_sessions() {
    let srv = Server::start_with(&[
        ("RELAY_CLIENT_TOKEN", "client-secret"),
        ("RELAY_AGENT_TOKEN", "agent-secret"),
    ]);
    let sid = unique_session();
    let path = format!("/sessions/{sid}");
    assert_eq!(srv.get(&path).status, 401);
    for token in ["client-secret", "agent-secret"] {
        let auth = format!("Bearer {token}");
        let r = srv.request("GET", &path, &[("Authorization", &auth)], None);
        assert_error(&r, 404, "Session not found");
    }
}

#[test]
fn drafts_are_never_persisted_and_do_not_survive_a_restart() {
    let dir = common::Dir::new("drafts");
    let env = [("RELAY_DATA_DIR", dir.path())];
    let mut srv = Server::start_with(&env);
    let (sid, cid) = session_with_prompt(&srv);
    let secret = "a draft that is never written down";
    assert_eq!(part(&srv, &sid, &cid, "p-1", secret).status, 200);
    // A write after the part is committed, so the part had its chance
    // to reach the disk too.
    srv.prompt(&sid, "later", None);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap_or_default();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "a draft reached the data directory"
        );
    }
    srv.kill9();
    let srv = Server::start_with(&env);
    let (_ws, got) = subscribe(&srv, &sid);
    assert_eq!(got.len(), 1, "no snapshot after a restart: {got:?}");
    // The prompt is still pending and the answer can be posted whole.
    assert_eq!(srv.pending(&sid).len(), 2);
    srv.respond(&sid, &cid, "the whole answer");
}
