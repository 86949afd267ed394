//! A cancel across instances sharing sessions through Redis: taken by one
//! relay, it reaches the subscribers of another (the `cancel` frame, and
//! `delta_end` for the prompt's draft), the prompt is no longer pending
//! there, a poll parked there is not woken by it, and the answers and
//! resends sent there are decided by the same rule.

use crate::common::*;
use serde_json::{Value, json};

/// The next frame that is not a ping or a `presence`.
#[track_caller]
fn content(ws: &mut Ws) -> Value {
    loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] != "presence" && v["type"] != "receipt" {
            return v;
        }
    }
}

#[test]
fn a_cancel_taken_by_one_instance_reaches_the_others() {
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    a.prompt(&sid, "stop me", Some("p1"));
    a.prompt(&sid, "keep me", Some("p2"));
    // The agent's side on `b`: a subscriber, the pending prompts, a poll
    // parked after them.
    let mut ws = b.ws(&format!("/ws/{sid}"));
    b.wait_health("subscribers", 1);
    assert_eq!(client_msg_ids(&b.pending(&sid)), ["p1", "p2"]);
    let mut poll = b.conn();
    poll.send(
        "GET",
        &format!("/prompts/{sid}?after=2&timeout=10"),
        &[],
        None,
    );
    b.wait_health("parked_polls", 1);
    // A part of p1's answer through `a` reaches `b` (live, or as a
    // snapshot if `b` read the session after it).
    let part = json!({"session_id": sid, "client_msg_id": "p1", "assistant_msg_id": "a1",
                      "text": "work", "partial": true});
    assert_eq!(a.post_json("/response", &part).status, 200);
    let delta = content(&mut ws);
    assert_eq!(delta["type"], "delta", "{delta}");

    let cancel = json!({"session_id": sid, "client_msg_id": "p1", "reason": "changed my mind"});
    let r = a.post_json("/cancel", &cancel);
    assert_eq!(r.json(), json!({"ok": true, "cancelled": true, "seq": 3}));
    let mut got = [content(&mut ws), content(&mut ws)];
    got.sort_by_key(|v| v["type"].as_str().unwrap_or("").to_string());
    assert_eq!(got[0]["type"], "cancel", "{got:?}");
    assert_eq!(got[0]["data"]["seq"], 3);
    assert_eq!(got[0]["data"]["reason"], "changed my mind");
    assert_eq!(got[1]["type"], "delta_end", "{got:?}");
    assert_eq!(got[1]["data"]["reason"], "cancelled");
    assert_eq!(got[1]["data"]["assistant_msg_id"], "a1");

    // No longer pending on `b`; its parked poll still waits, and the next
    // prompt wakes it.
    assert_eq!(client_msg_ids(&b.pending(&sid)), ["p2"]);
    assert_eq!(b.health()["parked_polls"], 1);
    a.prompt(&sid, "next", Some("p4"));
    let woken = poll.read_response();
    assert_eq!(client_msg_ids(woken.json().as_array().unwrap()), ["p4"]);

    // The same rule on `b`: a resend is a duplicate, answers are refused.
    let r = b.post_json("/cancel", &cancel);
    assert_eq!(
        r.json(),
        json!({"ok": true, "cancelled": true, "seq": 3, "duplicate": true})
    );
    for partial in [true, false] {
        let mut answer = part.clone();
        answer["partial"] = json!(partial);
        let r = b.post_json("/response", &answer);
        assert_eq!(r.status, 409, "{}", r.text());
        assert_eq!(r.json()["details"], "prompt cancelled");
    }
    // Both instances read the same history.
    assert_eq!(a.messages(&sid, ""), b.messages(&sid, ""));
}
