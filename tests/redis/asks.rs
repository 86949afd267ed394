//! Asks across instances sharing Redis: a reply posted to one relay wakes
//! the `GET /asks` parked on another, reaches the subscribers of a third,
//! and every instance reads the same ask, the same reply and the same
//! refusals.

use crate::common::*;
use serde_json::json;

#[test]
fn a_reply_on_one_instance_wakes_the_ask_parked_on_another() {
    let redis = Redis::start();
    let [a, b, c]: [Server; 3] = redis.relays(3, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    assert_eq!(a.put(&format!("/sessions/{sid}")).status, 200);
    let mut ws = c.ws(&format!("/ws/{sid}"));
    let ack = a.post_json(
        "/ask",
        &json!({"session_id": sid, "ask_id": "k", "text": "Deploy?", "choices": ["yes", "no"]}),
    );
    assert_eq!(ack.status, 200, "{}", ack.text());
    // The agent waits on B; the person replies through C.
    let mut poll = b.conn();
    poll.send("GET", &format!("/asks/{sid}/k?timeout=30"), &[], None);
    b.wait_health("parked_polls", 1);
    let frame = loop {
        let v = ws.recv_json_skip_pings();
        if v["type"] == "ask" {
            break v;
        }
    };
    assert_eq!(frame["data"]["ask_id"], "k");
    let bad = c.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k", "text": "maybe"}),
    );
    assert_error(&bad, 400, "Invalid reply");
    let ok = c.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k", "text": "yes"}),
    );
    assert_eq!(ok.json(), json!({"ok": true, "seq": 2}));
    let got = poll.read_response();
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(
        got.json(),
        json!({"ask_id": "k", "state": "answered", "text": "yes"})
    );
    let frame = loop {
        let v = ws.recv_json_skip_pings();
        if v["type"] == "reply" {
            break v;
        }
    };
    assert_eq!(
        (frame["data"]["text"].clone(), frame["data"]["seq"].clone()),
        (json!("yes"), json!(2))
    );
    // Every instance knows the answer, and the first reply won.
    for srv in [&a, &b, &c] {
        let late = srv.post_json(
            "/reply",
            &json!({"session_id": sid, "ask_id": "k", "text": "no"}),
        );
        assert_eq!(late.json()["details"], "ask already answered");
        let state = srv.get(&format!("/asks/{sid}/k?wait=false"));
        assert_eq!(state.json()["state"], "answered");
    }
    let dup = b.post_json(
        "/ask",
        &json!({"session_id": sid, "ask_id": "k", "text": "Deploy?", "choices": ["yes", "no"]}),
    );
    assert_eq!(dup.json()["duplicate"], true);
}
