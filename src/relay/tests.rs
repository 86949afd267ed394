//! The relay core on a virtual clock: every call gets a `Millis` chosen here
//! and a plain `u64` for the Unix `ts`, and effects are drained by hand.

use serde_json::{Value, json};

use super::*;
use crate::store::MAX_PAGE_BYTES;
use crate::time::Millis;

const TTL: u64 = 60_000;

fn limits() -> Limits {
    Limits {
        history_limit: 100,
        max_sessions: 8,
        max_pending: 4,
        max_waiters: 3,
        max_subscribers: 2,
        session_ttl_ms: TTL,
        draft_timeout_ms: 60_000,
        agent_grace_ms: 30_000,
        max_memory: 256 << 20,
    }
}

fn relay() -> Relay {
    Relay::in_memory(limits())
}

fn relay_with(f: impl FnOnce(&mut Limits)) -> Relay {
    let mut l = limits();
    f(&mut l);
    Relay::in_memory(l)
}

/// A reply that the in-memory engine gives at once.
#[track_caller]
fn now(reply: Reply) -> Vec<u8> {
    match reply {
        Reply::Now(body) => body,
        Reply::Wait => panic!("the in-memory engine answers at once"),
    }
}

/// A session id the tests know to be valid.
#[track_caller]
fn session(sid: &str) -> SessionId {
    SessionId::new(sid).expect("a valid session id")
}

fn conn(key: u32) -> ConnId {
    ConnId { key, generation: 0 }
}

#[track_caller]
fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

#[track_caller]
fn post_prompt(r: &mut Relay, now: u64, body: Value) -> Result<Value, ApiError> {
    r.post_prompt(
        Millis(now),
        1_700_000_000_000 + now,
        conn(0),
        body.to_string().as_bytes(),
    )
    .map(self::now)
    .map(|b| parse(&b))
}

/// Posts `{"session_id":sid,"client_msg_id":id,"prompt":text}` and expects success.
#[track_caller]
fn prompt(r: &mut Relay, now: u64, sid: &str, id: &str, text: &str) -> Value {
    post_prompt(
        r,
        now,
        json!({"session_id": sid, "client_msg_id": id, "prompt": text}),
    )
    .expect("prompt accepted")
}

#[track_caller]
fn post_response(r: &mut Relay, now: u64, body: Value) -> Result<Value, ApiError> {
    r.post_response(
        Millis(now),
        1_700_000_000_000 + now,
        conn(0),
        body.to_string().as_bytes(),
    )
    .map(self::now)
    .map(|b| parse(&b))
}

/// Posts a response and expects it stored; returns its WebSocket payload
/// `{"type":"message","data":…}`, from the session's history.
#[track_caller]
fn respond(r: &mut Relay, now: u64, sid: &str, cid: &str, aid: &str, text: &str) -> Value {
    let body =
        json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": aid, "text": text});
    let ack = post_response(r, now, body).expect("response accepted");
    assert_eq!(ack.get("duplicate"), None, "expected a new answer: {ack}");
    let history = messages(r, now, sid, all());
    let newest = history["messages"]
        .as_array()
        .and_then(|m| m.last())
        .expect("a stored message")
        .clone();
    assert_eq!(newest["data"]["assistant_msg_id"], aid, "{newest}");
    json!({"type": "message", "data": newest["data"]})
}

/// Subscribes and takes the whole replay at once (room without limit):
/// the frames' JSON payloads, as text.
#[track_caller]
fn subscribe_frames(
    r: &mut Relay,
    c: ConnId,
    sid: &str,
    after: Option<u64>,
    epoch: Option<&str>,
) -> Result<Vec<String>, ApiError> {
    let mut cursor = r
        .subscribe(Millis(0), c, &session(sid), after.map(Seq), epoch)?
        .expect("in memory, a subscriber is registered at once");
    let mut frames = Vec::new();
    assert!(r.refill(sid, &mut cursor, usize::MAX, true, &mut frames));
    // The log's frames: the agent's presence always comes last.
    let live = frames.pop().map(|f| payload_text(&f));
    assert!(live.is_some_and(|f| f.contains("\"presence\"")));
    Ok(frames.iter().map(|f| payload_text(f)).collect())
}

/// The text payload of one server frame.
#[track_caller]
fn payload_text(frame: &[u8]) -> String {
    let at = match frame[1] {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    String::from_utf8(frame[at..].to_vec()).expect("UTF-8 payload")
}

/// The effects queued, but for live frames (presence, receipts, parts).
fn effects(r: &mut Relay) -> Vec<Effect> {
    let mut out = Vec::new();
    r.take_effects(&mut out);
    out.retain(|e| !matches!(e, Effect::Broadcast { .. }));
    out
}

fn wait(timeout_ms: u64, after: Option<u64>) -> PromptsQuery {
    PromptsQuery {
        timeout_ms,
        wait: true,
        after: after.map(Seq),
    }
}

fn no_wait(after: Option<u64>) -> PromptsQuery {
    PromptsQuery {
        timeout_ms: 30_000,
        wait: false,
        after: after.map(Seq),
    }
}

#[track_caller]
fn ready(f: Result<Fetch, ApiError>) -> Value {
    match f {
        Ok(Fetch::Ready(body)) => parse(&body),
        other => panic!("expected Fetch::Ready, got {other:?}"),
    }
}

/// The `client_msg_id`s of a JSON array of prompts.
fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .expect("array")
        .iter()
        .map(|p| {
            p["client_msg_id"]
                .as_str()
                .expect("client_msg_id")
                .to_string()
        })
        .collect()
}

/// The pending prompts of `sid` right now, without parking.
#[track_caller]
fn pending_ids(r: &mut Relay, now: u64, sid: &str) -> Vec<String> {
    ids(&ready(r.get_prompts(
        Millis(now),
        conn(999),
        sid,
        no_wait(None),
    )))
}

fn all() -> MessagesQuery {
    MessagesQuery {
        limit: 1000,
        offset: 0,
        since: None,
        after: None,
    }
}

#[track_caller]
fn messages(r: &mut Relay, now: u64, sid: &str, q: MessagesQuery) -> Value {
    parse(&r.messages(Millis(now), sid, q).expect("messages"))
}

/// The `seq`s of a `/messages` body.
fn seqs(body: &Value) -> Vec<u64> {
    body["messages"]
        .as_array()
        .expect("messages array")
        .iter()
        .map(|m| m["data"]["seq"].as_u64().expect("seq"))
        .collect()
}

/// The `seq`s of WebSocket `message` frames (skipping anything else).
fn frame_seqs(frames: &[String]) -> Vec<u64> {
    frames
        .iter()
        .map(|f| parse(f.as_bytes()))
        .filter(|f| f["type"] == "message")
        .map(|f| f["data"]["seq"].as_u64().expect("seq"))
        .collect()
}

fn epoch_of(r: &mut Relay, sid: &str) -> String {
    let body = parse(
        &r.put_session(Millis(0), conn(0), &session(sid))
            .map(now)
            .expect("put"),
    );
    body["epoch"].as_str().expect("epoch").to_string()
}

#[track_caller]
fn assert_uuid_v4(s: &str) {
    let u = uuid::Uuid::parse_str(s).unwrap_or_else(|e| panic!("{s:?} is not a UUID: {e}"));
    assert_eq!(u.get_version_num(), 4, "{s} is not v4");
}

// ---- POST /prompt ----

#[test]
fn post_prompt_acks_stored_with_the_client_id_and_creates_the_session() {
    let mut r = relay();
    let ack = prompt(&mut r, 10, "s1", "c1", "hello");
    assert_eq!(ack, json!({"stored": true, "client_msg_id": "c1"}));
    assert!(r.has_session("s1"));
    assert_eq!(r.counts().sessions, 1);
    let pending = ready(r.get_prompts(Millis(20), conn(1), "s1", no_wait(None)));
    assert_eq!(
        pending,
        json!([{
            "session_id": "s1", "client_msg_id": "c1", "prompt": "hello",
            "ts": 1_700_000_000_010u64, "seq": 1
        }])
    );
}

#[test]
fn post_prompt_keeps_client_ts_and_metadata() {
    let mut r = relay();
    post_prompt(
        &mut r,
        0,
        json!({"session_id": "s", "prompt": "p", "client_msg_id": "c", "ts": 42, "metadata": {"k": [1]}}),
    )
    .unwrap();
    let list = ready(r.get_prompts(Millis(0), conn(1), "s", no_wait(None)));
    assert_eq!(list[0]["ts"], 42);
    assert_eq!(list[0]["metadata"], json!({"k": [1]}));
}

#[test]
fn post_prompt_without_id_generates_distinct_uuid_v4_ids() {
    let mut r = relay();
    let a = post_prompt(&mut r, 0, json!({"session_id": "s", "prompt": "x"})).unwrap();
    let b = post_prompt(&mut r, 0, json!({"session_id": "s", "prompt": "x"})).unwrap();
    let (a, b) = (
        a["client_msg_id"].as_str().unwrap(),
        b["client_msg_id"].as_str().unwrap(),
    );
    assert_uuid_v4(a);
    assert_uuid_v4(b);
    assert_ne!(a, b);
    assert_eq!(pending_ids(&mut r, 0, "s"), vec![a, b]);
}

#[test]
fn seq_increments_per_session_independently() {
    let mut r = relay();
    prompt(&mut r, 0, "a", "1", "x");
    prompt(&mut r, 0, "a", "2", "x");
    prompt(&mut r, 0, "b", "1", "x");
    assert_eq!(seqs(&messages(&mut r, 0, "a", all())), vec![1, 2]);
    assert_eq!(seqs(&messages(&mut r, 0, "b", all())), vec![1]);
}

#[test]
fn invalid_prompt_body_is_400_and_creates_no_session() {
    let mut r = relay();
    let e = post_prompt(&mut r, 0, json!({"session_id": "s"})).unwrap_err();
    assert_eq!(e.status, 400);
    assert_eq!(e.error, "Missing required field: prompt");
    assert!(!r.has_session("s"));
}

#[test]
fn duplicate_client_msg_id_is_acked_as_duplicate_and_stores_nothing() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "first");
    let ack = prompt(&mut r, 1, "s", "c1", "first");
    assert_eq!(
        ack,
        json!({"stored": true, "client_msg_id": "c1", "duplicate": true})
    );
    // Another text under the same id is a conflict, and stores nothing.
    let e = post_prompt(
        &mut r,
        1,
        json!({"session_id": "s", "prompt": "second", "client_msg_id": "c1"}),
    )
    .unwrap_err();
    assert_eq!(
        (e.status, e.details.as_deref()),
        (409, Some("client_msg_id already used"))
    );
    let all_msgs = messages(&mut r, 2, "s", all());
    assert_eq!(all_msgs["total"], 1);
    assert_eq!(
        all_msgs["messages"][0]["data"]["prompt"], "first",
        "first write wins"
    );
    assert_eq!(pending_ids(&mut r, 2, "s"), vec!["c1"]);
}

#[test]
fn duplicate_prompt_wakes_no_waiter() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    respond(&mut r, 0, "s", "c1", "a1", "done");
    assert!(matches!(
        r.get_prompts(Millis(1), conn(1), "s", wait(5_000, None)),
        Ok(Fetch::Park { .. })
    ));
    let ack = prompt(&mut r, 2, "s", "c1", "x");
    assert_eq!(ack["duplicate"], true);
    assert!(effects(&mut r).is_empty());
    assert_eq!(r.counts().parked_polls, 1);
}

#[test]
fn pending_cap_answers_503_but_a_duplicate_still_gets_200() {
    let mut r = relay(); // max_pending 4
    for i in 0..4 {
        prompt(&mut r, 0, "s", &format!("c{i}"), "x");
    }
    let e = post_prompt(
        &mut r,
        0,
        json!({"session_id": "s", "client_msg_id": "c4", "prompt": "x"}),
    )
    .unwrap_err();
    assert_eq!(e.status, 503);
    assert_eq!(e.error, "Service unavailable");
    let ack = prompt(&mut r, 0, "s", "c2", "x");
    assert_eq!(ack["duplicate"], true);
    assert_eq!(messages(&mut r, 0, "s", all())["total"], 4);
}

#[test]
fn answering_a_prompt_frees_a_pending_slot() {
    let mut r = relay();
    for i in 0..4 {
        prompt(&mut r, 0, "s", &format!("c{i}"), "x");
    }
    respond(&mut r, 0, "s", "c0", "a0", "ok");
    prompt(&mut r, 0, "s", "c4", "x");
    assert_eq!(pending_ids(&mut r, 0, "s"), vec!["c1", "c2", "c3", "c4"]);
}

#[test]
fn pending_cap_is_per_session() {
    let mut r = relay();
    for i in 0..4 {
        prompt(&mut r, 0, "a", &format!("c{i}"), "x");
    }
    prompt(&mut r, 0, "b", "c0", "x");
}

#[test]
fn session_cap_answers_503_for_new_sessions_only() {
    let mut r = relay_with(|l| l.max_sessions = 2);
    prompt(&mut r, 0, "a", "1", "x");
    prompt(&mut r, 0, "b", "1", "x");
    assert!(r.sessions_full());
    let e = post_prompt(&mut r, 0, json!({"session_id": "c", "prompt": "x"})).unwrap_err();
    assert_eq!(e.status, 503);
    assert_eq!(
        r.put_session(Millis(0), conn(0), &session("c"))
            .map(now)
            .unwrap_err()
            .status,
        503
    );
    assert_eq!(
        r.subscribe(Millis(0), conn(1), &session("c"), None, None)
            .unwrap_err()
            .status,
        503
    );
    assert!(!r.has_session("c"));
    // Existing sessions keep working at the cap.
    prompt(&mut r, 0, "a", "2", "x");
    r.subscribe(Millis(0), conn(1), &session("b"), None, None)
        .unwrap();
}

#[test]
fn deleting_a_session_makes_room_under_the_session_cap() {
    let mut r = relay_with(|l| l.max_sessions = 1);
    prompt(&mut r, 0, "a", "1", "x");
    r.delete_session(Millis(0), conn(0), "a").map(now).unwrap();
    prompt(&mut r, 0, "b", "1", "x");
}

// ---- GET /prompts ----

#[test]
fn get_prompts_on_an_unknown_session_is_404() {
    let mut r = relay();
    let e = r
        .get_prompts(Millis(0), conn(1), "nope", wait(1000, None))
        .unwrap_err();
    assert_eq!(e.status, 404);
    assert_eq!(parse(&e.body()), json!({"error": "Session not found"}));
    assert_eq!(r.counts().parked_polls, 0);
}

#[test]
fn get_prompts_returns_pending_oldest_first_without_answered_ones() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "z", "x");
    prompt(&mut r, 0, "s", "m", "x");
    prompt(&mut r, 0, "s", "a", "x");
    respond(&mut r, 0, "s", "m", "r", "done");
    let list = ready(r.get_prompts(Millis(0), conn(1), "s", wait(1000, None)));
    assert_eq!(ids(&list), vec!["z", "a"]);
    let seq: Vec<u64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seq, vec![1, 3]);
    assert_eq!(r.counts().parked_polls, 0);
}

#[test]
fn get_prompts_after_returns_only_greater_seqs() {
    let mut r = relay();
    for id in ["p1", "p2", "p3"] {
        prompt(&mut r, 0, "s", id, "x");
    }
    let list = ready(r.get_prompts(Millis(0), conn(1), "s", wait(1000, Some(1))));
    assert_eq!(ids(&list), vec!["p2", "p3"]);
    let list = ready(r.get_prompts(Millis(0), conn(1), "s", no_wait(Some(3))));
    assert_eq!(list, json!([]));
}

#[test]
fn get_prompts_wait_false_answers_empty_at_once() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    let list = ready(r.get_prompts(Millis(0), conn(1), "s", no_wait(None)));
    assert_eq!(list, json!([]));
    assert_eq!(r.counts().parked_polls, 0);
}

#[test]
fn get_prompts_parks_with_deadline_now_plus_timeout() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    let f = r
        .get_prompts(Millis(1_000), conn(1), "s", wait(2_500, None))
        .unwrap();
    assert_eq!(
        f,
        Fetch::Park {
            deadline: Millis(3_500),
            sid: Some(session("s")),
        }
    );
    assert_eq!(r.counts().parked_polls, 1);
    assert!(effects(&mut r).is_empty());
}

#[test]
fn get_prompts_with_zero_timeout_answers_empty_without_parking() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    let list = ready(r.get_prompts(Millis(0), conn(1), "s", wait(0, None)));
    assert_eq!(list, json!([]));
    assert_eq!(r.counts().parked_polls, 0);
}

#[test]
fn get_prompts_parks_when_after_excludes_every_pending_prompt() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "p1", "x");
    let f = r
        .get_prompts(Millis(0), conn(1), "s", wait(1_000, Some(1)))
        .unwrap();
    assert_eq!(
        f,
        Fetch::Park {
            deadline: Millis(1_000),
            sid: Some(session("s")),
        }
    );
}

#[test]
fn a_prompt_wakes_every_waiter_with_200_and_the_pending_set() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    for k in 1..=3 {
        r.get_prompts(Millis(0), conn(k), "s", wait(30_000, None))
            .unwrap();
    }
    assert_eq!(r.counts().parked_polls, 3);
    prompt(&mut r, 5, "s", "p1", "hi");
    let fx = effects(&mut r);
    assert_eq!(fx.len(), 3);
    let mut woken = Vec::new();
    for e in &fx {
        let Effect::Respond { to, status, body } = e else {
            panic!("unexpected effect {e:?}");
        };
        assert_eq!(*status, 200);
        assert_eq!(ids(&parse(body)), vec!["p1"]);
        woken.push(to.key);
    }
    woken.sort();
    assert_eq!(woken, vec![1, 2, 3]);
    assert_eq!(r.counts().parked_polls, 0);
    // Woken waiters are gone: the next prompt wakes nobody.
    prompt(&mut r, 6, "s", "p2", "hi");
    assert!(effects(&mut r).is_empty());
}

#[test]
fn a_prompt_wakes_each_waiter_with_its_own_after_and_leaves_excluded_ones_parked() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "p1", "x"); // seq 1, stays pending
    r.get_prompts(Millis(0), conn(1), "s", wait(30_000, Some(1)))
        .unwrap();
    r.get_prompts(Millis(0), conn(2), "s", wait(30_000, Some(2)))
        .unwrap();
    r.get_prompts(Millis(0), conn(3), "s", wait(30_000, Some(1)))
        .unwrap();
    prompt(&mut r, 1, "s", "p2", "x"); // seq 2: wakes 1 and 3, not 2
    let fx = effects(&mut r);
    let mut woken: Vec<u32> = Vec::new();
    for e in &fx {
        let Effect::Respond { to, status, body } = e else {
            panic!("unexpected effect {e:?}");
        };
        assert_eq!(*status, 200);
        assert_eq!(ids(&parse(body)), vec!["p2"], "after=1 excludes p1");
        woken.push(to.key);
    }
    woken.sort();
    assert_eq!(woken, vec![1, 3]);
    assert_eq!(r.counts().parked_polls, 1);
    prompt(&mut r, 2, "s", "p3", "x"); // seq 3 wakes conn 2
    let fx = effects(&mut r);
    assert_eq!(fx.len(), 1);
    let Effect::Respond { to, body, .. } = &fx[0] else {
        panic!("unexpected effect {:?}", fx[0]);
    };
    assert_eq!(*to, conn(2));
    assert_eq!(ids(&parse(body)), vec!["p3"]);
    assert_eq!(r.counts().parked_polls, 0);
}

#[test]
fn a_prompt_in_another_session_wakes_nobody() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    r.get_prompts(Millis(0), conn(1), "s", wait(30_000, None))
        .unwrap();
    prompt(&mut r, 0, "other", "p1", "x");
    assert!(effects(&mut r).is_empty());
    assert_eq!(r.counts().parked_polls, 1);
}

#[test]
fn waiter_cap_answers_503_but_wait_false_still_answers() {
    let mut r = relay(); // max_waiters 3
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    for k in 1..=3 {
        r.get_prompts(Millis(0), conn(k), "s", wait(30_000, None))
            .unwrap();
    }
    let e = r
        .get_prompts(Millis(0), conn(4), "s", wait(30_000, None))
        .unwrap_err();
    assert_eq!(e.status, 503);
    assert_eq!(r.counts().parked_polls, 3);
    assert_eq!(
        ready(r.get_prompts(Millis(0), conn(4), "s", no_wait(None))),
        json!([])
    );
    r.cancel_wait(conn(1), "s", Millis(0));
    r.get_prompts(Millis(0), conn(4), "s", wait(30_000, None))
        .unwrap();
}

#[test]
fn cancel_wait_removes_the_waiter() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    r.get_prompts(Millis(0), conn(1), "s", wait(30_000, None))
        .unwrap();
    r.get_prompts(Millis(0), conn(2), "s", wait(30_000, None))
        .unwrap();
    r.cancel_wait(conn(1), "s", Millis(0));
    assert_eq!(r.counts().parked_polls, 1);
    prompt(&mut r, 0, "s", "p", "x");
    let fx = effects(&mut r);
    assert_eq!(fx.len(), 1);
    assert!(matches!(fx[0], Effect::Respond { to, .. } if to == conn(2)));
}

#[test]
fn cancel_wait_of_an_unknown_or_stale_conn_changes_nothing() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    r.get_prompts(Millis(0), conn(1), "s", wait(30_000, None))
        .unwrap();
    r.cancel_wait(
        ConnId {
            key: 1,
            generation: 7,
        },
        "s",
        Millis(0),
    );
    r.cancel_wait(conn(9), "s", Millis(0));
    r.cancel_wait(conn(1), "no-such-session", Millis(0));
    assert_eq!(r.counts().parked_polls, 1);
    r.cancel_wait(conn(1), "s", Millis(0));
    r.cancel_wait(conn(1), "s", Millis(0));
    assert_eq!(r.counts().parked_polls, 0);
}

// ---- POST /response ----

#[test]
fn post_response_to_an_unknown_session_is_404() {
    let mut r = relay();
    let e = post_response(
        &mut r,
        0,
        json!({"session_id": "s", "client_msg_id": "c", "text": "t"}),
    )
    .unwrap_err();
    assert_eq!(e.status, 404);
    assert_eq!(e.error, "Session not found");
    assert!(!r.has_session("s"));
}

#[test]
fn post_response_to_an_unknown_prompt_is_404() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    let e = post_response(
        &mut r,
        0,
        json!({"session_id": "s", "client_msg_id": "c2", "text": "t"}),
    )
    .unwrap_err();
    assert_eq!(e.status, 404);
    assert_eq!(e.error, "Prompt not found");
    assert_eq!(messages(&mut r, 0, "s", all())["total"], 1);
}

#[test]
fn post_response_stores_with_seq_and_returns_the_broadcast_payload() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    let posted = post_response(
        &mut r,
        7,
        json!({"session_id": "s", "client_msg_id": "c1", "assistant_msg_id": "a1", "text": "answer", "metadata": {"m": 1}}),
    )
    .unwrap();
    assert_eq!(
        posted,
        json!({"ok": true, "assistant_msg_id": "a1", "delivered": false})
    );
    let data = json!({
        "session_id": "s", "assistant_msg_id": "a1", "client_msg_id": "c1",
        "text": "answer", "metadata": {"m": 1}, "ts": 1_700_000_000_007u64, "seq": 2
    });
    let history = messages(&mut r, 8, "s", all());
    assert_eq!(
        history["messages"][1],
        json!({"type": "assistant", "data": data})
    );
}

#[test]
fn post_response_to_a_watched_session_is_delivered_as_one_framed_effect() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    r.subscribe(Millis(0), conn(5), &session("s"), None, None)
        .unwrap();
    let ack = post_response(
        &mut r,
        7,
        json!({"session_id": "s", "client_msg_id": "c1", "assistant_msg_id": "a1", "text": "answer"}),
    )
    .unwrap();
    assert_eq!(ack["delivered"], true);
    let fx = effects(&mut r);
    let [
        Effect::Deliver {
            sid,
            seq,
            prev,
            frame,
        },
    ] = &fx[..]
    else {
        panic!("expected one Deliver, got {fx:?}");
    };
    assert_eq!((&**sid, *seq, *prev), ("s", Seq(2), Seq(0)));
    let payload = parse(payload_text(frame).as_bytes());
    assert_eq!(payload["type"], "message");
    assert_eq!(payload["data"]["text"], "answer");
    prompt(&mut r, 8, "s", "c2", "x");
    respond(&mut r, 8, "s", "c2", "a2", "second");
    let fx = effects(&mut r);
    let [Effect::Deliver { seq, prev, .. }] = &fx[..] else {
        panic!("expected one Deliver, got {fx:?}");
    };
    assert_eq!(
        (*seq, *prev),
        (Seq(4), Seq(2)),
        "prev is the answer before it"
    );
}

#[test]
fn post_response_marks_the_prompt_answered() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    prompt(&mut r, 0, "s", "c2", "x");
    respond(&mut r, 0, "s", "c1", "a1", "t");
    assert_eq!(pending_ids(&mut r, 0, "s"), vec!["c2"]);
}

#[test]
fn post_response_without_id_generates_a_uuid_v4() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    let posted = post_response(
        &mut r,
        0,
        json!({"session_id": "s", "client_msg_id": "c1", "text": "t"}),
    )
    .unwrap();
    assert_uuid_v4(posted["assistant_msg_id"].as_str().expect("an id"));
}

#[test]
fn post_response_wakes_no_waiter_and_emits_no_effect() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    r.get_prompts(Millis(0), conn(1), "s", wait(30_000, Some(1)))
        .unwrap();
    respond(&mut r, 0, "s", "c1", "a1", "t");
    assert!(effects(&mut r).is_empty());
    assert_eq!(r.counts().parked_polls, 1);
}

#[test]
fn resent_response_with_same_id_and_text_is_a_duplicate() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    respond(&mut r, 0, "s", "c1", "a1", "same");
    let again = post_response(
        &mut r,
        1,
        json!({"session_id": "s", "client_msg_id": "c1", "assistant_msg_id": "a1", "text": "same"}),
    )
    .unwrap();
    assert_eq!(
        again,
        json!({"ok": true, "assistant_msg_id": "a1", "delivered": false, "duplicate": true})
    );
    assert_eq!(messages(&mut r, 1, "s", all())["total"], 2);
}

#[test]
fn same_assistant_id_with_different_text_is_409() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    respond(&mut r, 0, "s", "c1", "a1", "one");
    let e = post_response(
        &mut r,
        0,
        json!({"session_id": "s", "client_msg_id": "c1", "assistant_msg_id": "a1", "text": "two"}),
    )
    .unwrap_err();
    assert_eq!(e.status, 409);
    assert_eq!(
        parse(&e.body()),
        json!({"error": "Conflict", "details": "assistant_msg_id already used"})
    );
    assert_eq!(messages(&mut r, 0, "s", all())["total"], 2);
}

#[test]
fn same_assistant_id_for_a_different_prompt_is_409() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    prompt(&mut r, 0, "s", "c2", "x");
    respond(&mut r, 0, "s", "c1", "a1", "same");
    let e = post_response(
        &mut r,
        0,
        json!({"session_id": "s", "client_msg_id": "c2", "assistant_msg_id": "a1", "text": "same"}),
    )
    .unwrap_err();
    assert_eq!(e.status, 409);
    assert_eq!(e.details.as_deref(), Some("assistant_msg_id already used"));
    assert_eq!(pending_ids(&mut r, 0, "s"), vec!["c2"], "c2 stays pending");
}

#[test]
fn several_responses_to_one_prompt_are_all_stored() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "c1", "x");
    let one = respond(&mut r, 0, "s", "c1", "a1", "part 1");
    let two = respond(&mut r, 0, "s", "c1", "a2", "part 2");
    assert_eq!(one["data"]["seq"], 2);
    assert_eq!(two["data"]["seq"], 3);
    let history = messages(&mut r, 0, "s", all());
    assert_eq!(seqs(&history), vec![1, 2, 3]);
    assert_eq!(history["messages"][2]["data"]["text"], "part 2");
}

// ---- WebSocket subscribe ----

/// `p1 a1 p2 a2 a3`: seqs 1..=5, assistant messages at 2, 4, 5.
fn conversation(r: &mut Relay, sid: &str) {
    prompt(r, 0, sid, "p1", "x");
    respond(r, 0, sid, "p1", "a1", "t1");
    prompt(r, 0, sid, "p2", "x");
    respond(r, 0, sid, "p2", "a2", "t2");
    respond(r, 0, sid, "p2", "a3", "t3");
}

#[test]
fn subscribe_creates_the_session_and_registers_the_subscriber() {
    let mut r = relay();
    let frames = subscribe_frames(&mut r, conn(1), "s", None, None).unwrap();
    assert!(frames.is_empty());
    assert!(r.has_session("s"));
    assert_eq!(r.subscribers("s"), &[conn(1)]);
    assert_eq!(r.counts().subscribers, 1);
    r.unsubscribe(conn(1), "s", Millis(0));
    assert!(r.subscribers("s").is_empty());
    assert_eq!(r.counts().subscribers, 0);
}

#[test]
fn subscribe_without_after_replays_nothing() {
    let mut r = relay();
    conversation(&mut r, "s");
    let frames = subscribe_frames(&mut r, conn(1), "s", None, None).unwrap();
    assert!(frames.is_empty(), "{frames:?}");
}

#[test]
fn subscribe_with_after_replays_assistant_messages_after_it_oldest_first() {
    let mut r = relay();
    conversation(&mut r, "s");
    let frames = subscribe_frames(&mut r, conn(1), "s", Some(2), None).unwrap();
    assert_eq!(frame_seqs(&frames), vec![4, 5]);
    assert_eq!(frames.len(), 2, "no resync, no prompts: {frames:?}");
    let first = parse(frames[0].as_bytes());
    assert_eq!(first["data"]["assistant_msg_id"], "a2");
    let frames = subscribe_frames(&mut r, conn(2), "s", Some(0), None).unwrap();
    assert_eq!(frame_seqs(&frames), vec![2, 4, 5]);
}

#[test]
fn subscribe_with_a_different_epoch_sends_resync_then_all_retained_assistant_messages() {
    let mut r = relay();
    conversation(&mut r, "s");
    let epoch = epoch_of(&mut r, "s");
    let frames = subscribe_frames(&mut r, conn(1), "s", Some(4), Some("old-epoch")).unwrap();
    assert_eq!(
        parse(frames[0].as_bytes()),
        json!({"type": "resync", "epoch": epoch, "first_seq": 1})
    );
    assert_eq!(frame_seqs(&frames[1..]), vec![2, 4, 5]);
    assert_eq!(frames.len(), 4);
}

#[test]
fn subscribe_with_a_different_epoch_to_an_empty_session_resyncs_to_the_next_seq() {
    let mut r = relay();
    let epoch = epoch_of(&mut r, "s");
    let frames = subscribe_frames(&mut r, conn(1), "s", None, Some("old")).unwrap();
    assert_eq!(frames.len(), 1);
    assert_eq!(
        parse(frames[0].as_bytes()),
        json!({"type": "resync", "epoch": epoch, "first_seq": 1})
    );
}

#[test]
fn subscribe_after_a_trimmed_cursor_sends_resync_from_first_retained_seq() {
    let mut r = relay_with(|l| l.history_limit = 3);
    conversation(&mut r, "s"); // history keeps seqs 3, 4, 5
    let epoch = epoch_of(&mut r, "s");
    let frames = subscribe_frames(&mut r, conn(1), "s", Some(1), None).unwrap();
    assert_eq!(
        parse(frames[0].as_bytes()),
        json!({"type": "resync", "epoch": epoch, "first_seq": 3})
    );
    assert_eq!(frame_seqs(&frames[1..]), vec![4, 5]);
    // With the matching epoch, a trimmed cursor still resyncs.
    let frames = subscribe_frames(&mut r, conn(2), "s", Some(0), Some(&epoch)).unwrap();
    assert_eq!(parse(frames[0].as_bytes())["type"], "resync");
}

#[test]
fn subscribe_at_the_trim_boundary_sends_no_resync() {
    let mut r = relay_with(|l| l.history_limit = 3);
    conversation(&mut r, "s"); // first_seq 3: after=2 missed nothing
    let epoch = epoch_of(&mut r, "s");
    let frames = subscribe_frames(&mut r, conn(1), "s", Some(2), Some(&epoch)).unwrap();
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frame_seqs(&frames), vec![4, 5]);
}

#[test]
fn subscribe_with_matching_epoch_and_untrimmed_cursor_sends_no_resync() {
    let mut r = relay();
    conversation(&mut r, "s");
    let epoch = epoch_of(&mut r, "s");
    let frames = subscribe_frames(&mut r, conn(1), "s", Some(4), Some(&epoch)).unwrap();
    assert_eq!(frame_seqs(&frames), vec![5]);
    assert_eq!(frames.len(), 1);
    let frames = subscribe_frames(&mut r, conn(2), "s", None, Some(&epoch)).unwrap();
    assert!(frames.is_empty(), "{frames:?}");
}

#[test]
fn subscriber_cap_answers_503() {
    let mut r = relay(); // max_subscribers 2
    r.subscribe(Millis(0), conn(1), &session("s"), None, None)
        .unwrap();
    r.subscribe(Millis(0), conn(2), &session("s"), None, None)
        .unwrap();
    let e = r
        .subscribe(Millis(0), conn(3), &session("s"), None, None)
        .unwrap_err();
    assert_eq!(e.status, 503);
    assert_eq!(r.subscribers("s").len(), 2);
    assert_eq!(r.counts().subscribers, 2);
    r.subscribe(Millis(0), conn(3), &session("other"), None, None)
        .unwrap();
}

#[test]
fn epochs_differ_between_sessions_and_survive_activity() {
    let mut r = relay();
    let a = epoch_of(&mut r, "a");
    let b = epoch_of(&mut r, "b");
    assert_uuid_v4(&a);
    assert_ne!(a, b);
    conversation(&mut r, "a");
    assert_eq!(epoch_of(&mut r, "a"), a);
    assert_eq!(messages(&mut r, 0, "a", all())["epoch"], a.as_str());
}

#[test]
fn put_session_reports_created_only_the_first_time() {
    let mut r = relay();
    let first = parse(
        &r.put_session(Millis(0), conn(0), &session("s"))
            .map(now)
            .unwrap(),
    );
    let second = parse(
        &r.put_session(Millis(0), conn(0), &session("s"))
            .map(now)
            .unwrap(),
    );
    assert_eq!(first["created"], true);
    assert_eq!(second["created"], false);
    assert_eq!(first["session_id"], "s");
    assert_eq!(first["epoch"], second["epoch"]);
}

// ---- history and GET /messages ----

#[test]
fn history_limit_trims_oldest_and_messages_reflects_it() {
    let mut r = relay_with(|l| l.history_limit = 3);
    conversation(&mut r, "s");
    let body = messages(&mut r, 0, "s", all());
    assert_eq!(seqs(&body), vec![3, 4, 5]);
    assert_eq!(body["total"], 3);
}

#[test]
fn a_pending_prompt_trimmed_from_history_stays_pending_and_answerable() {
    let mut r = relay_with(|l| l.history_limit = 2);
    prompt(&mut r, 0, "s", "p1", "x");
    prompt(&mut r, 0, "s", "p2", "x");
    prompt(&mut r, 0, "s", "p3", "x");
    assert_eq!(seqs(&messages(&mut r, 0, "s", all())), vec![2, 3]);
    assert_eq!(pending_ids(&mut r, 0, "s"), vec!["p1", "p2", "p3"]);
    assert_eq!(prompt(&mut r, 0, "s", "p1", "x")["duplicate"], true);
    respond(&mut r, 0, "s", "p1", "a1", "late");
    assert_eq!(pending_ids(&mut r, 0, "s"), vec!["p2", "p3"]);
}

#[test]
fn messages_on_an_unknown_session_is_404() {
    let mut r = relay();
    assert_eq!(r.messages(Millis(0), "s", all()).unwrap_err().status, 404);
}

#[test]
fn messages_lists_prompts_and_assistant_messages_with_session_and_epoch() {
    let mut r = relay();
    conversation(&mut r, "s");
    let epoch = epoch_of(&mut r, "s");
    let body = messages(&mut r, 0, "s", all());
    assert_eq!(body["session_id"], "s");
    assert_eq!(body["epoch"], epoch.as_str());
    let types: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["prompt", "assistant", "prompt", "assistant", "assistant"]
    );
    assert_eq!(
        (
            body["total"].clone(),
            body["limit"].clone(),
            body["offset"].clone()
        ),
        (json!(5), json!(1000), json!(0))
    );
}

#[test]
fn messages_limit_and_offset_page_while_total_counts_all_matches() {
    let mut r = relay();
    conversation(&mut r, "s");
    let q = MessagesQuery {
        limit: 2,
        offset: 1,
        since: None,
        after: None,
    };
    let body = messages(&mut r, 0, "s", q);
    assert_eq!(seqs(&body), vec![2, 3]);
    assert_eq!(body["total"], 5);
    assert_eq!(body["limit"], 2);
    assert_eq!(body["offset"], 1);
}

#[test]
fn messages_offset_past_the_end_is_empty_with_total() {
    let mut r = relay();
    conversation(&mut r, "s");
    let q = MessagesQuery {
        limit: 10,
        offset: 9,
        since: None,
        after: None,
    };
    let body = messages(&mut r, 0, "s", q);
    assert_eq!(body["messages"], json!([]));
    assert_eq!(body["total"], 5);
}

#[test]
fn messages_limit_zero_lists_nothing_but_counts() {
    let mut r = relay();
    conversation(&mut r, "s");
    let q = MessagesQuery {
        limit: 0,
        offset: 0,
        since: None,
        after: None,
    };
    let body = messages(&mut r, 0, "s", q);
    assert_eq!(body["messages"], json!([]));
    assert_eq!(body["total"], 5);
}

#[test]
fn messages_since_keeps_strictly_later_ts() {
    let mut r = relay();
    for (id, ts) in [("p1", 100), ("p2", 200), ("p3", 300)] {
        post_prompt(
            &mut r,
            0,
            json!({"session_id": "s", "client_msg_id": id, "prompt": "x", "ts": ts}),
        )
        .unwrap();
    }
    let q = MessagesQuery {
        since: Some(200),
        ..all()
    };
    let body = messages(&mut r, 0, "s", q);
    assert_eq!(seqs(&body), vec![3]);
    assert_eq!(body["total"], 1);
}

#[test]
fn messages_after_filters_by_seq_before_paging() {
    let mut r = relay();
    conversation(&mut r, "s");
    let q = MessagesQuery {
        limit: 1,
        offset: 1,
        since: None,
        after: Some(Seq(2)),
    };
    let body = messages(&mut r, 0, "s", q);
    assert_eq!(seqs(&body), vec![4]);
    assert_eq!(body["total"], 3);
}

#[test]
fn messages_since_and_after_combine() {
    let mut r = relay();
    for (id, ts) in [("p1", 500), ("p2", 100), ("p3", 600)] {
        post_prompt(
            &mut r,
            0,
            json!({"session_id": "s", "client_msg_id": id, "prompt": "x", "ts": ts}),
        )
        .unwrap();
    }
    let q = MessagesQuery {
        since: Some(200),
        after: Some(Seq(1)),
        ..all()
    };
    assert_eq!(seqs(&messages(&mut r, 0, "s", q)), vec![3]);
}

// ---- DELETE /sessions ----

#[test]
fn delete_session_answers_waiters_404_closes_subscribers_1000_and_removes_it() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    r.get_prompts(Millis(0), conn(1), "s", wait(30_000, None))
        .unwrap();
    r.get_prompts(Millis(0), conn(2), "s", wait(30_000, None))
        .unwrap();
    r.subscribe(Millis(0), conn(3), &session("s"), None, None)
        .unwrap();
    let body = r.delete_session(Millis(0), conn(0), "s").map(now).unwrap();
    assert_eq!(parse(&body), json!({"deleted": true}));
    let fx = effects(&mut r);
    let mut not_found = Vec::new();
    let mut closed = Vec::new();
    for e in fx {
        match e {
            Effect::Respond { to, status, body } => {
                assert_eq!(status, 404);
                assert_eq!(parse(&body), json!({"error": "Session not found"}));
                not_found.push(to.key);
            }
            Effect::CloseSubscriber { to, code } => {
                assert_eq!(code, 1000);
                closed.push(to.key);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    not_found.sort();
    assert_eq!(not_found, vec![1, 2]);
    assert_eq!(closed, vec![3]);
    assert!(!r.has_session("s"));
    // Nothing held is counted either.
    let budget = 256 << 20;
    assert_eq!(
        r.counts(),
        Counts {
            memory_budget: budget,
            ..Counts::default()
        }
    );
    assert_eq!(
        r.delete_session(Millis(0), conn(0), "s")
            .map(now)
            .unwrap_err()
            .status,
        404
    );
    assert_eq!(
        r.get_prompts(Millis(0), conn(1), "s", no_wait(None))
            .unwrap_err()
            .status,
        404
    );
}

#[test]
fn delete_session_leaves_other_sessions_alone() {
    let mut r = relay();
    parked_and_subscribed(&mut r, "a");
    prompt(&mut r, 0, "b", "p", "x");
    r.delete_session(Millis(0), conn(0), "b").map(now).unwrap();
    assert!(effects(&mut r).is_empty());
    assert_eq!(r.counts().parked_polls, 1);
    assert_eq!(r.counts().subscribers, 1);
}

// ---- idle collection ----

#[test]
fn idle_session_is_collected_at_the_ttl_and_not_before() {
    let mut r = relay();
    r.put_session(Millis(1_000), conn(0), &session("s"))
        .map(now)
        .unwrap();
    assert_eq!(r.collect_idle(Millis(1_000 + TTL - 1)), 0);
    assert!(r.has_session("s"));
    assert_eq!(r.collect_idle(Millis(1_000 + TTL)), 1);
    assert!(!r.has_session("s"));
}

#[test]
fn session_with_a_waiter_is_not_collected() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    r.get_prompts(Millis(0), conn(1), "s", wait(10 * TTL, None))
        .unwrap();
    assert_eq!(r.collect_idle(Millis(5 * TTL)), 0);
    r.cancel_wait(conn(1), "s", Millis(5 * TTL));
    assert_eq!(r.collect_idle(Millis(7 * TTL)), 1);
}

#[test]
fn a_long_poll_ending_counts_as_activity() {
    // The contract collects a session after "no connections and no activity"
    // for the TTL; a poll parked until 5*TTL was a connection until then.
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("s"))
        .map(now)
        .unwrap();
    r.get_prompts(Millis(0), conn(1), "s", wait(5 * TTL, None))
        .unwrap();
    r.cancel_wait(conn(1), "s", Millis(5 * TTL)); // the shell calls this at the deadline
    assert_eq!(r.collect_idle(Millis(5 * TTL)), 0);
}

#[test]
fn session_with_a_subscriber_is_not_collected_and_unsubscribe_counts_as_activity() {
    let mut r = relay();
    r.subscribe(Millis(0), conn(1), &session("s"), None, None)
        .unwrap();
    assert_eq!(r.collect_idle(Millis(5 * TTL)), 0);
    r.unsubscribe(conn(1), "s", Millis(5 * TTL));
    assert_eq!(r.collect_idle(Millis(6 * TTL - 1)), 0);
    assert_eq!(r.collect_idle(Millis(6 * TTL)), 1);
}

#[test]
fn each_kind_of_request_postpones_collection() {
    type Touch = fn(&mut Relay, u64);
    let touches: [(&str, Touch); 5] = [
        ("post_prompt", |r, t| {
            prompt(r, t, "s", "later", "x");
        }),
        ("get_prompts", |r, t| {
            r.get_prompts(Millis(t), conn(1), "s", no_wait(None))
                .unwrap();
        }),
        ("post_response", |r, t| {
            respond(r, t, "s", "p0", "a-late", "x");
        }),
        ("messages", |r, t| {
            r.messages(Millis(t), "s", all()).unwrap();
        }),
        ("put_session", |r, t| {
            r.put_session(Millis(t), conn(0), &session("s"))
                .map(now)
                .unwrap();
        }),
    ];
    for (name, touch) in touches {
        let mut r = relay();
        prompt(&mut r, 0, "s", "p0", "x");
        touch(&mut r, TTL / 2);
        assert_eq!(r.collect_idle(Millis(TTL)), 0, "{name} did not touch");
        assert_eq!(r.collect_idle(Millis(TTL / 2 + TTL - 1)), 0, "{name}");
        assert_eq!(r.collect_idle(Millis(TTL / 2 + TTL)), 1, "{name}");
    }
}

#[test]
fn collection_only_takes_the_idle_sessions() {
    let mut r = relay();
    r.put_session(Millis(0), conn(0), &session("old"))
        .map(now)
        .unwrap();
    r.put_session(Millis(TTL / 2), conn(0), &session("new"))
        .map(now)
        .unwrap();
    assert_eq!(r.collect_idle(Millis(TTL)), 1);
    assert!(r.has_session("new"));
    assert_eq!(r.counts().sessions, 1);
}

// ---- bounded dedupe ----

#[test]
fn dedupe_maps_stay_bounded_by_history_and_pending() {
    let mut r = relay_with(|l| l.history_limit = 4);
    for i in 0..500 {
        let id = format!("p{i}");
        prompt(&mut r, i, "s", &id, "x");
        respond(&mut r, i, "s", &id, &format!("a{i}"), "t");
    }
    prompt(&mut r, 500, "s", "open", "x");
    let s = r.store.get("s").expect("session s");
    let (history, pending, prompts, responses) = s.sizes();
    assert_eq!(history, 4);
    assert_eq!(pending, 1);
    assert!(prompts <= 4 + 1, "prompts map: {prompts}");
    assert!(responses <= 4, "responses map: {responses}");
}

#[test]
fn an_answered_prompt_id_trimmed_from_history_can_be_posted_again() {
    let mut r = relay_with(|l| l.history_limit = 2);
    prompt(&mut r, 0, "s", "old", "x");
    respond(&mut r, 0, "s", "old", "a-old", "t");
    prompt(&mut r, 0, "s", "n1", "x");
    prompt(&mut r, 0, "s", "n2", "x"); // "old" and its answer are trimmed
    let ack = prompt(&mut r, 0, "s", "old", "again");
    assert_eq!(ack, json!({"stored": true, "client_msg_id": "old"}));
    assert_eq!(pending_ids(&mut r, 0, "s"), vec!["n1", "n2", "old"]);
}

#[test]
fn an_answered_prompt_still_in_history_stays_deduplicated() {
    let mut r = relay_with(|l| l.history_limit = 10);
    prompt(&mut r, 0, "s", "p", "x");
    respond(&mut r, 0, "s", "p", "a", "t");
    assert_eq!(prompt(&mut r, 0, "s", "p", "x")["duplicate"], true);
    assert!(pending_ids(&mut r, 0, "s").is_empty());
}

#[test]
fn a_messages_page_stops_before_max_page_bytes_and_reports_the_limit_applied() {
    // 40 prompts of 120 KiB: 4.7 MiB of history, more than one page holds.
    let mut r = relay_with(|l| l.max_pending = 100);
    let big = "x".repeat(120 * 1024);
    for i in 0..40 {
        prompt(&mut r, 0, "s", &format!("m{i}"), &big);
    }
    let q = |offset| MessagesQuery {
        limit: 1000,
        offset,
        since: None,
        after: None,
    };
    let first = r.messages(Millis(0), "s", q(0)).expect("page");
    assert!(
        first.len() <= MAX_PAGE_BYTES,
        "page of {} bytes",
        first.len()
    );
    let first = parse(&first);
    let got = first["messages"].as_array().expect("messages").len();
    assert!(got > 0 && got < 40, "one page cannot hold all 40: {got}");
    assert_eq!(first["limit"], got, "limit reports the count applied");
    assert_eq!(first["total"], 40);
    // The next page starts where the first stopped, and the pages cover all.
    let second = messages(&mut r, 0, "s", q(got));
    let seqs_second: Vec<u64> = second["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["data"]["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(seqs_second.first(), Some(&(got as u64 + 1)));
    assert_eq!(got + seqs_second.len(), 40);
}

/// Session `sid` with a poll parked on `conn(1)` and a subscriber on
/// `conn(2)`.
#[track_caller]
fn parked_and_subscribed(r: &mut Relay, sid: &str) {
    r.put_session(Millis(0), conn(0), &session(sid))
        .map(now)
        .unwrap();
    r.get_prompts(Millis(0), conn(1), sid, wait(30_000, None))
        .unwrap();
    r.subscribe(Millis(0), conn(2), &session(sid), None, None)
        .unwrap();
}

// ---- committed records ----

#[test]
fn a_write_is_counted_once_from_its_answer() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "p1", "hi");
    prompt(&mut r, 1, "s", "p1", "hi");
    respond(&mut r, 2, "s", "p1", "a1", "yo");
    let resent =
        json!({"session_id": "s", "client_msg_id": "p1", "assistant_msg_id": "a1", "text": "yo"});
    post_response(&mut r, 3, resent).unwrap();
    let s = r.stats();
    assert_eq!(
        (
            s.prompts_stored,
            s.prompt_duplicates,
            s.responses_stored,
            s.response_duplicates
        ),
        (1, 1, 1, 1)
    );
}

#[test]
fn records_committed_elsewhere_wake_and_deliver_like_a_local_write() {
    let mut r = relay();
    parked_and_subscribed(&mut r, "s");
    let prompt = Record::Prompt {
        sid: session("s"),
        seq: Seq(1),
        ts: 5,
        client_msg_id: "p1".into(),
        data: r#"{"session_id":"s","client_msg_id":"p1","prompt":"hi","ts":5,"seq":1}"#.into(),
    };
    assert!(!r.apply(Millis(1), [prompt]), "a prompt delivers nothing");
    let fx = effects(&mut r);
    let [Effect::Respond { to, status, body }] = &fx[..] else {
        panic!("expected the parked poll answered, got {fx:?}");
    };
    assert_eq!((*to, *status), (conn(1), 200));
    assert_eq!(ids(&parse(body)), vec!["p1"]);
    let answer = Record::Response {
        sid: session("s"),
        seq: Seq(2),
        ts: 6,
        client_msg_id: "p1".into(),
        assistant_msg_id: "a1".into(),
        data: r#"{"session_id":"s","assistant_msg_id":"a1","client_msg_id":"p1","text":"yo","ts":6,"seq":2}"#.into(),
    };
    assert!(r.apply(Millis(2), [answer]), "a subscriber is connected");
    let fx = effects(&mut r);
    let [Effect::Deliver { seq, prev, .. }] = &fx[..] else {
        panic!("expected one Deliver, got {fx:?}");
    };
    assert_eq!((*seq, *prev), (Seq(2), Seq(0)));
    assert!(
        pending_ids(&mut r, 3, "s").is_empty(),
        "the prompt is answered"
    );
    // Counted by the instance whose write it was, from its answer: records
    // may be another instance's writes.
    let s = r.stats();
    assert_eq!((s.prompts_stored, s.responses_stored), (0, 0));
    r.apply(Millis(4), [Record::Deleted { sid: session("s") }]);
    assert!(!r.has_session("s"));
    assert_eq!(
        effects(&mut r),
        vec![Effect::CloseSubscriber {
            to: conn(2),
            code: 1000
        }]
    );
    assert_eq!(r.counts().subscribers, 0);
}

/// A loop time before the turn's clock maps to the wall clock then,
/// not to now: a poll's end told a while later keeps its own time (the
/// other instances judge a stop by it).
#[test]
fn unix_at_maps_past_and_future_loop_times() {
    let mut r = relay();
    r.set_clock(Millis(10_000), 1_700_000_010_000);
    assert_eq!(r.unix_at(Millis(10_000)), 1_700_000_010_000);
    assert_eq!(r.unix_at(Millis(9_980)), 1_700_000_009_980);
    assert_eq!(r.unix_at(Millis(12_500)), 1_700_000_012_500);
}

/// A part heard after its final answer (the answer's reply and the
/// published part come on two links, read apart) sends nothing and opens
/// no draft; a part of a pending prompt is sent.
#[test]
fn a_part_heard_after_its_final_answer_is_dropped() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "p", "q");
    prompt(&mut r, 0, "s", "p2", "q2");
    respond(&mut r, 0, "s", "p", "a", "done");
    subscribe_frames(&mut r, conn(1), "s", None, None).expect("subscribed");
    let mut out = Vec::new();
    r.take_effects(&mut out);
    let sid = session("s");
    out.clear();
    r.part_published(Millis(0), &sid, "a", "p", 1, "\"late\"");
    r.take_effects(&mut out);
    assert!(out.is_empty(), "{out:?}");
    assert!(!r.drafting("s"), "no draft opened");
    r.part_published(Millis(0), &sid, "b", "p2", 1, "\"live\"");
    r.take_effects(&mut out);
    assert!(
        out.iter().any(|e| matches!(e, Effect::Broadcast { .. })),
        "{out:?}"
    );
}

/// Stops the prompt `cid` of `sid` through the relay's write path.
#[track_caller]
fn cancel(r: &mut Relay, sid: &str, cid: &str) {
    let body = json!({"session_id": sid, "client_msg_id": cid}).to_string();
    let w = crate::store::model::NewCancel::parse(body.as_bytes())
        .map(Write::Cancel)
        .expect("a valid cancel");
    r.write(Millis(0), 1_700_000_000_000, conn(0), w)
        .expect("cancel stored");
}

/// An open draft of `aid` for the prompt `cid`, as a read of the session
/// finds it.
fn read_draft(aid: &str, cid: &str) -> crate::store::seam::DraftState {
    crate::store::seam::DraftState {
        assistant_msg_id: aid.into(),
        client_msg_id: cid.into(),
        parts: 1,
        bytes: 4,
        deadline: u64::MAX,
        escaped: "part".into(),
    }
}

/// A read that ran before a draft's final answer or its prompt's cancel,
/// answered after the copy took them (the read's reply and what was
/// published since come on two links, read apart), reopens no draft and
/// sends no snapshot; a draft of a pending prompt it brings is sent.
#[test]
fn a_read_older_than_a_drafts_end_reopens_nothing() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "p", "q");
    prompt(&mut r, 0, "s", "p2", "q2");
    prompt(&mut r, 0, "s", "p3", "q3");
    respond(&mut r, 0, "s", "p", "a", "done");
    cancel(&mut r, "s", "p2");
    subscribe_frames(&mut r, conn(1), "s", None, None).expect("subscribed");
    let mut out = Vec::new();
    r.take_effects(&mut out);
    out.clear();
    let sid = session("s");
    let stale = vec![read_draft("a", "p"), read_draft("b", "p2")];
    r.live_synced(Millis(0), &sid, stale, Vec::new());
    r.take_effects(&mut out);
    assert!(
        !out.iter().any(|e| matches!(e, Effect::Broadcast { .. })),
        "{out:?}"
    );
    assert!(!r.drafting("s"), "no draft reopened");
    r.live_synced(Millis(0), &sid, vec![read_draft("c", "p3")], Vec::new());
    r.take_effects(&mut out);
    assert!(
        out.iter().any(|e| matches!(e, Effect::Broadcast { .. })),
        "{out:?}"
    );
    assert!(r.drafting("s"));
}

/// A part stored before its prompt's cancel and heard after it is stale
/// too: it sends nothing and opens no draft.
#[test]
fn a_part_heard_after_its_prompts_cancel_is_dropped() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "p", "q");
    cancel(&mut r, "s", "p");
    subscribe_frames(&mut r, conn(1), "s", None, None).expect("subscribed");
    let mut out = Vec::new();
    r.take_effects(&mut out);
    out.clear();
    r.part_published(Millis(0), &session("s"), "a", "p", 1, "\"late\"");
    r.take_effects(&mut out);
    assert!(out.is_empty(), "{out:?}");
    assert!(!r.drafting("s"), "no draft opened");
}

/// A copy replaced by a whole read that holds a draft's final answer
/// (a gap, or a new epoch, read the session again) ends the draft: a
/// subscriber catching up gets the answer's `message`, and no snapshot
/// of the draft after it.
#[test]
fn a_copy_replaced_with_a_drafts_answer_ends_the_draft() {
    let mut r = relay();
    prompt(&mut r, 0, "s", "p", "q");
    prompt(&mut r, 0, "s", "p2", "q2");
    let sid = session("s");
    r.part_published(Millis(0), &sid, "a", "p", 1, "\"part\"");
    r.part_published(Millis(0), &sid, "b", "p2", 1, "\"part\"");
    assert!(r.drafting("s"));
    // The log as a read brings it: the answer stored, no relay hook run.
    let body =
        json!({"session_id": "s", "client_msg_id": "p", "assistant_msg_id": "a", "text": "done"})
            .to_string();
    let answer = crate::store::model::NewResponse::parse(body.as_bytes()).expect("valid");
    let mut records = Vec::new();
    r.store
        .response(Millis(0), 1_700_000_000_000, answer, &mut records)
        .expect("stored");
    for record in records {
        r.store.apply(Millis(0), record);
    }
    r.drafts_settled(&sid);
    let mut frames = Vec::new();
    r.live_frames("s", &mut frames);
    let deltas: Vec<String> = frames
        .iter()
        .map(|f| payload_text(f))
        .filter(|t| t.contains("\"delta\""))
        .collect();
    assert_eq!(deltas.len(), 1, "{deltas:?}");
    assert!(
        deltas[0].contains("\"assistant_msg_id\":\"b\""),
        "{deltas:?}"
    );
}
