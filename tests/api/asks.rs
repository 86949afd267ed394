//! Questions from the agent over the real binary: `POST /ask`, `POST
//! /reply` and `GET /asks/{sid}/{ask_id}`, every rule of the contract,
//! the frames a subscriber gets, replay by `after`, `/messages`, and the
//! long-poll of an ask woken by a reply and by the ask's expiry. A poll is
//! known to be parked when /healthz counts it, never by sleeping.

use std::time::{Duration, Instant};

use crate::common::{Server, Ws, assert_error, is_uuid_v4, now_ms, unique_session};
use serde_json::{Value, json};

#[track_caller]
fn created(srv: &Server) -> String {
    let sid = unique_session();
    assert_eq!(srv.put(&format!("/sessions/{sid}")).status, 200);
    sid
}

/// `POST /ask` asserting 200; the ack.
#[track_caller]
fn ask(srv: &Server, body: Value) -> Value {
    let resp = srv.post_json("/ask", &body);
    assert_eq!(resp.status, 200, "POST /ask: {}", resp.text());
    resp.json()
}

/// The next ask or reply frame (agent presence and pings skipped).
#[track_caller]
fn next_asked(ws: &mut Ws) -> Value {
    loop {
        let v = ws.recv_json_skip_pings();
        if matches!(v["type"].as_str(), Some("ask" | "reply")) {
            return v;
        }
    }
}

#[test]
fn an_ask_is_stored_framed_and_answered_by_one_reply() {
    let srv = Server::start();
    let sid = created(&srv);
    srv.prompt(&sid, "deploy it", Some("c1"));
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    let before = now_ms();
    let ack = ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k1", "client_msg_id": "c1",
               "text": "Run `make deploy`?", "choices": ["yes", "no"], "default": "no",
               "metadata": {"k": 1}}),
    );
    assert_eq!(
        (ack["ok"].clone(), ack["ask_id"].clone(), ack["seq"].clone()),
        (json!(true), json!("k1"), json!(2))
    );
    let expires = ack["expires_ts"].as_u64().expect("expires_ts");
    assert!(
        expires >= before + 300_000 && expires <= now_ms() + 300_000,
        "default timeout 300 s"
    );
    assert!(ack.get("duplicate").is_none());
    let frame = next_asked(&mut ws);
    assert_eq!(frame["type"], "ask");
    let data = &frame["data"];
    assert_eq!(data["session_id"], sid.as_str());
    assert_eq!(data["ask_id"], "k1");
    assert_eq!(data["client_msg_id"], "c1");
    assert_eq!(data["text"], "Run `make deploy`?");
    assert_eq!(data["choices"], json!(["yes", "no"]));
    assert_eq!(data["default"], "no");
    assert_eq!(data["expires_ts"], expires);
    assert_eq!(data["metadata"], json!({"k": 1}));
    assert_eq!(data["seq"], 2);
    assert!(data["ts"].as_u64().is_some());
    // The same ask again is a duplicate; another text or choices a conflict.
    let again = ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k1", "text": "Run `make deploy`?", "choices": ["yes", "no"]}),
    );
    assert_eq!(
        (again["seq"].clone(), again["duplicate"].clone()),
        (json!(2), json!(true))
    );
    assert_eq!(again["expires_ts"], expires);
    let other = srv.post_json(
        "/ask",
        &json!({"session_id": sid, "ask_id": "k1", "text": "Other?"}),
    );
    assert_error(&other, 409, "Conflict");
    assert_eq!(other.json()["details"], "ask_id already used");
    let fewer = srv.post_json("/ask", &json!({"session_id": sid, "ask_id": "k1", "text": "Run `make deploy`?", "choices": ["yes"]}));
    assert_eq!(fewer.status, 409);
    // A reply that is none of the choices; then the reply.
    let bad = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k1", "text": "Yes"}),
    );
    assert_error(&bad, 400, "Invalid reply");
    assert_eq!(bad.json()["details"], "not one of the choices");
    let ok = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k1", "text": "yes"}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json(), json!({"ok": true, "seq": 3}));
    let frame = next_asked(&mut ws);
    assert_eq!(frame["type"], "reply");
    assert_eq!(frame["data"]["ask_id"], "k1");
    assert_eq!(frame["data"]["text"], "yes");
    assert_eq!(frame["data"]["seq"], 3);
    assert_eq!(frame["data"]["session_id"], sid.as_str());
    // First reply wins.
    let dup = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k1", "text": "yes"}),
    );
    assert_eq!(dup.json(), json!({"ok": true, "seq": 3, "duplicate": true}));
    let late = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k1", "text": "no"}),
    );
    assert_error(&late, 409, "Conflict");
    assert_eq!(late.json()["details"], "ask already answered");
    let state = srv.get(&format!("/asks/{sid}/k1?wait=false"));
    assert_eq!(state.status, 200);
    assert_eq!(
        state.json(),
        json!({"ask_id": "k1", "state": "answered", "text": "yes"})
    );
}

#[test]
fn history_replay_and_messages_hold_asks_and_replies() {
    let srv = Server::start();
    let sid = created(&srv);
    let ack = ask(&srv, json!({"session_id": sid, "text": "Name?"}));
    let id = ack["ask_id"].as_str().expect("ask_id").to_string();
    assert!(is_uuid_v4(&id), "{id}");
    srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": id, "text": "Ada"}),
    );
    let page = srv.messages(&sid, "");
    let kinds: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["ask", "reply"]);
    assert_eq!(page["messages"][1]["data"]["text"], "Ada");
    assert!(page["messages"][0]["data"].get("choices").is_none());
    // A subscriber resuming after the ask gets the reply alone.
    let mut ws = srv.ws(&format!("/ws/{sid}?after=1"));
    let frame = next_asked(&mut ws);
    assert_eq!(
        (frame["type"].clone(), frame["data"]["seq"].clone()),
        (json!("reply"), json!(2))
    );
    let mut ws = srv.ws(&format!("/ws/{sid}?after=0"));
    assert_eq!(next_asked(&mut ws)["type"], "ask");
    assert_eq!(next_asked(&mut ws)["type"], "reply");
    // GET /prompts still returns prompts only.
    assert!(srv.pending(&sid).is_empty());
}

#[test]
fn malformed_fields_are_named_and_unknown_things_are_404() {
    let srv = Server::start();
    let sid = created(&srv);
    for (body, error) in [
        (json!({"text": "x"}), "Missing required field: session_id"),
        (json!({"session_id": sid}), "Missing required field: text"),
        (
            json!({"session_id": sid, "text": 5}),
            "Invalid text: must be a string",
        ),
        (
            json!({"session_id": sid, "text": "x", "choices": []}),
            "Invalid choices",
        ),
        (
            json!({"session_id": sid, "text": "x", "choices": ["a", "a"]}),
            "Invalid choices",
        ),
        (
            json!({"session_id": sid, "text": "x", "choices": [""]}),
            "Invalid choices",
        ),
        (
            json!({"session_id": sid, "text": "x", "choices": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}),
            "Invalid choices",
        ),
        (
            json!({"session_id": sid, "text": "x", "choices": ["y".repeat(257)]}),
            "Invalid choices",
        ),
        (
            json!({"session_id": sid, "text": "x", "choices": ["a"], "default": "b"}),
            "Invalid default",
        ),
        (
            json!({"session_id": sid, "text": "x", "timeout": 0}),
            "Invalid timeout: must be a number of seconds from 1 to 86400",
        ),
        (
            json!({"session_id": sid, "text": "x", "timeout": 86401}),
            "Invalid timeout: must be a number of seconds from 1 to 86400",
        ),
        (
            json!({"session_id": sid, "text": "x", "timeout": "5"}),
            "Invalid timeout: must be a number of seconds from 1 to 86400",
        ),
        (
            json!({"session_id": sid, "text": "x", "ask_id": ""}),
            "Invalid ask_id: must be 1 to 256 bytes",
        ),
        (
            json!({"session_id": sid, "text": "x", "metadata": [1]}),
            "Invalid metadata: must be an object",
        ),
        (
            json!({"session_id": sid, "text": "x".repeat(128 * 1024 + 1)}),
            "Message exceeds size limit",
        ),
    ] {
        let resp = srv.post_json("/ask", &body);
        assert_error(&resp, 400, error);
    }
    // Without choices, any default.
    ask(
        &srv,
        json!({"session_id": sid, "text": "x", "default": "anything", "timeout": 1.5}),
    );
    let resp = srv.post_json(
        "/ask",
        &json!({"session_id": unique_session(), "text": "x"}),
    );
    assert_error(&resp, 404, "Session not found");
    let resp = srv.post_json(
        "/ask",
        &json!({"session_id": sid, "text": "x", "client_msg_id": "nope"}),
    );
    assert_error(&resp, 404, "Prompt not found");
    let resp = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "nope", "text": "x"}),
    );
    assert_error(&resp, 404, "Ask not found");
    let resp = srv.post_json(
        "/reply",
        &json!({"session_id": unique_session(), "ask_id": "k", "text": "x"}),
    );
    assert_error(&resp, 404, "Session not found");
    let resp = srv.post_json("/reply", &json!({"session_id": sid, "text": "x"}));
    assert_error(&resp, 400, "Missing required field: ask_id");
    let resp = srv.get(&format!("/asks/{sid}/nope"));
    assert_error(&resp, 404, "Ask not found");
    let resp = srv.get(&format!("/asks/{}/k", unique_session()));
    assert_error(&resp, 404, "Session not found");
    let resp = srv.request("POST", &format!("/asks/{sid}/k"), &[], None);
    assert_eq!(resp.status, 405);
    assert_eq!(resp.header("Allow"), Some("GET, OPTIONS"));
}

#[test]
fn an_expired_ask_refuses_its_reply_and_answers_its_default() {
    let srv = Server::start();
    let sid = created(&srv);
    ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k", "text": "Go?", "choices": ["go", "stop"], "default": "stop", "timeout": 1}),
    );
    // Parked until the ask expires (its own deadline, before the poll's).
    let start = Instant::now();
    let resp = srv.get(&format!("/asks/{sid}/k?timeout=5"));
    assert!(
        start.elapsed() < Duration::from_millis(4_000),
        "woken by expiry"
    );
    assert_eq!(
        resp.json(),
        json!({"ask_id": "k", "state": "expired", "text": "stop"})
    );
    let late = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k", "text": "go"}),
    );
    assert_error(&late, 409, "Conflict");
    assert_eq!(late.json()["details"], "ask expired");
    // Checks in order: answered before expired, expired before choices.
    let wrong = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k", "text": "neither"}),
    );
    assert_eq!(wrong.json()["details"], "ask expired");
}

#[test]
fn no_reply_is_taken_after_a_poll_was_told_its_ask_expired() {
    // Each poll is told "expired" by its own deadline; a reply sent the
    // moment that answer arrives must be refused, however the loop's
    // monotonic clock and the wall clock that decides replies disagree
    // (their milliseconds turn at different instants, fixed per process:
    // several servers cover several offsets).
    let servers: Vec<Server> = (0..8).map(|_| Server::start()).collect();
    let mut polls = Vec::new();
    for srv in &servers {
        for _ in 0..3 {
            let sid = created(srv);
            ask(
                srv,
                json!({"session_id": sid, "ask_id": "k", "text": "Go?", "default": "no", "timeout": 1}),
            );
            polls.push((srv, sid));
        }
    }
    std::thread::scope(|s| {
        for (srv, sid) in &polls {
            s.spawn(move || {
                let resp = srv.get(&format!("/asks/{sid}/k?timeout=5"));
                assert_eq!(resp.json()["state"], "expired", "{}", resp.text());
                let late = srv.post_json(
                    "/reply",
                    &json!({"session_id": sid, "ask_id": "k", "text": "yes"}),
                );
                assert_error(&late, 409, "Conflict");
                assert_eq!(late.json()["details"], "ask expired");
            });
        }
    });
}

#[test]
fn a_parked_ask_poll_is_woken_by_the_reply() {
    let srv = Server::start();
    let sid = created(&srv);
    ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k", "text": "Name?"}),
    );
    let mut poll = srv.conn();
    poll.send("GET", &format!("/asks/{sid}/k?timeout=60"), &[], None);
    srv.wait_health("parked_polls", 1);
    let ok = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k", "text": "Ada"}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let resp = poll.read_response();
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.json(),
        json!({"ask_id": "k", "state": "answered", "text": "Ada"})
    );
    srv.wait_health("parked_polls", 0);
}

#[test]
fn a_reply_that_pushes_its_ask_out_of_history_still_answers_the_parked_poll() {
    // Three messages kept: the ask and two prompts fill history, and the
    // reply, the fourth, drops the ask it answers (an answered ask that
    // history dropped is forgotten). The agent waiting on it still gets
    // the reply.
    let srv = Server::start_with(&[("RELAY_HISTORY_LIMIT", "3")]);
    let sid = created(&srv);
    ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k", "text": "Name?"}),
    );
    srv.prompt(&sid, "one", Some("c1"));
    srv.prompt(&sid, "two", Some("c2"));
    let mut poll = srv.conn();
    poll.send("GET", &format!("/asks/{sid}/k?timeout=60"), &[], None);
    srv.wait_health("parked_polls", 1);
    let ok = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k", "text": "Ada"}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let resp = poll.read_response();
    assert_eq!(
        (resp.status, resp.json()),
        (
            200,
            json!({"ask_id": "k", "state": "answered", "text": "Ada"})
        )
    );
}

#[test]
fn an_ask_that_left_history_still_tells_its_parked_poll_it_expired() {
    // Three messages kept: three prompts after the ask push it out of
    // history, unanswered and open (kept, as a pending prompt is). The
    // poll parked until its expiry is told it expired, with its default.
    let srv = Server::start_with(&[("RELAY_HISTORY_LIMIT", "3")]);
    let sid = created(&srv);
    ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k", "text": "Name?", "default": "Bob", "timeout": 1}),
    );
    for id in ["c1", "c2", "c3"] {
        srv.prompt(&sid, "more", Some(id));
    }
    let mut poll = srv.conn();
    poll.send("GET", &format!("/asks/{sid}/k?timeout=60"), &[], None);
    let resp = poll.read_response();
    assert_eq!(
        (resp.status, resp.json()),
        (
            200,
            json!({"ask_id": "k", "state": "expired", "text": "Bob"})
        )
    );
}

#[test]
fn a_parked_ask_poll_times_out_open_and_waits_not_when_told() {
    let srv = Server::start();
    let sid = created(&srv);
    ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k", "text": "Name?"}),
    );
    let resp = srv.get(&format!("/asks/{sid}/k?wait=false"));
    assert_eq!(resp.json(), json!({"ask_id": "k", "state": "open"}));
    let resp = srv.get(&format!("/asks/{sid}/k?timeout=0.2"));
    assert_eq!(resp.json(), json!({"ask_id": "k", "state": "open"}));
    assert_eq!(srv.get(&format!("/asks/{sid}/k?timeout=-1")).status, 400);
    // A deleted session answers its parked ask polls 404.
    let mut poll = srv.conn();
    poll.send("GET", &format!("/asks/{sid}/k?timeout=60"), &[], None);
    srv.wait_health("parked_polls", 1);
    assert_eq!(srv.delete(&format!("/sessions/{sid}")).status, 200);
    assert_eq!(poll.read_response().status, 404);
}

#[test]
fn open_asks_count_with_pending_prompts_against_the_cap() {
    let srv = Server::start_with(&[("RELAY_MAX_PENDING", "2")]);
    let sid = created(&srv);
    srv.prompt(&sid, "p", Some("c1"));
    ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k1", "text": "?"}),
    );
    let resp = srv.post_json(
        "/ask",
        &json!({"session_id": sid, "ask_id": "k2", "text": "?"}),
    );
    assert_eq!(resp.status, 503, "{}", resp.text());
    let resp = srv.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "p", "client_msg_id": "c2"}),
    );
    assert_eq!(resp.status, 503, "{}", resp.text());
    // A resent ask is still a duplicate at the cap; a reply frees a place.
    let again = ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k1", "text": "?"}),
    );
    assert_eq!(again["duplicate"], true);
    srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k1", "text": "ok"}),
    );
    ask(
        &srv,
        json!({"session_id": sid, "ask_id": "k2", "text": "?"}),
    );
}

#[test]
fn ask_endpoints_take_their_roles_tokens() {
    let srv = Server::start_with(&[
        ("RELAY_CLIENT_TOKEN", "client-t"),
        ("RELAY_AGENT_TOKEN", "agent-t"),
    ]);
    let sid = unique_session();
    let auth = |t: &str| vec![("Authorization", format!("Bearer {t}"))];
    let put = srv.request(
        "PUT",
        &format!("/sessions/{sid}"),
        &[("Authorization", "Bearer client-t")],
        None,
    );
    assert_eq!(put.status, 200);
    let body = json!({"session_id": sid, "ask_id": "k", "text": "?"}).to_string();
    for (method, path, token, body, want) in [
        (
            "POST",
            "/ask".to_string(),
            "client-t",
            Some(body.as_str()),
            401,
        ),
        (
            "POST",
            "/ask".to_string(),
            "agent-t",
            Some(body.as_str()),
            200,
        ),
        (
            "GET",
            format!("/asks/{sid}/k?wait=false"),
            "client-t",
            None,
            401,
        ),
        (
            "GET",
            format!("/asks/{sid}/k?wait=false"),
            "agent-t",
            None,
            200,
        ),
    ] {
        let headers = auth(token);
        let mut h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if body.is_some() {
            h.push(("Content-Type", "application/json"));
        }
        let resp = srv.request(method, &path, &h, body.map(str::as_bytes));
        assert_eq!(
            resp.status,
            want,
            "{method} {path} with {token}: {}",
            resp.text()
        );
    }
    let reply = json!({"session_id": sid, "ask_id": "k", "text": "ok"}).to_string();
    for (token, want) in [("agent-t", 401), ("client-t", 200)] {
        let h = [
            ("Authorization", format!("Bearer {token}")),
            ("Content-Type", "application/json".into()),
        ];
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let resp = srv.request("POST", "/reply", &h, Some(reply.as_bytes()));
        assert_eq!(
            resp.status,
            want,
            "POST /reply with {token}: {}",
            resp.text()
        );
    }
}
