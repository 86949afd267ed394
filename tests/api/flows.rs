//! The seed spec's testing scenarios 1-8 and its three example flows, end to end over the real
//! binary: web clients on WebSockets, an agent on long-polls. Scenarios 9 and 10 (WebSocket
//! events, ping/pong) live in `tests/http/websocket.rs`.

use crate::common;

use std::collections::HashSet;
use std::thread;

use crate::common::{Server, Ws, client_msg_ids, unique_session};
use serde_json::{Value, json};

/// The agent's long-poll: `GET /prompts/{sid}?timeout=30`, asserting a 200 array.
#[track_caller]
fn agent_fetch(srv: &Server, sid: &str) -> Vec<Value> {
    let resp = srv.get(&format!("/prompts/{sid}?timeout=30"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    resp.json().as_array().expect("array").clone()
}

/// Next `message` frame's data, skipping application pings.
#[track_caller]
fn next_message(ws: &mut Ws) -> Value {
    let frame = ws.recv_json_skip_pings();
    assert_eq!(frame["type"], "message", "{frame}");
    frame["data"].clone()
}

#[test]
fn scenario_1_single_client_single_agent_one_cycle() {
    let srv = Server::start();
    let sid = unique_session();
    let mut client = srv.ws(&format!("/ws/{sid}"));
    let ack = srv.prompt(&sid, "Hello", None);
    let cmid = ack["client_msg_id"].as_str().unwrap().to_string();
    let prompts = agent_fetch(&srv, &sid);
    assert_eq!(client_msg_ids(&prompts), vec![cmid.clone()]);
    assert_eq!(prompts[0]["prompt"], "Hello");
    let reply = srv.respond(&sid, &cmid, "Hi there!");
    assert_eq!(reply["delivered"], true);
    let data = next_message(&mut client);
    assert_eq!(data["text"], "Hi there!");
    assert_eq!(data["client_msg_id"], cmid.as_str());
    assert_eq!(data["session_id"], sid.as_str());
    assert_eq!(data["assistant_msg_id"], reply["assistant_msg_id"]);
    assert!(srv.pending(&sid).is_empty());
}

#[test]
fn scenario_2_every_client_receives_the_same_response() {
    let srv = Server::start();
    let sid = unique_session();
    let mut clients: Vec<Ws> = (0..3).map(|_| srv.ws(&format!("/ws/{sid}"))).collect();
    srv.wait_health("subscribers", 3);
    srv.prompt(&sid, "question", Some("q"));
    assert_eq!(srv.respond(&sid, "q", "answer")["delivered"], true);
    let received: Vec<Value> = clients.iter_mut().map(next_message).collect();
    assert_eq!(received[0]["text"], "answer");
    assert!(received.iter().all(|d| *d == received[0]), "{received:?}");
}

#[test]
fn scenario_3_pending_prompts_are_handled_one_by_one() {
    let srv = Server::start();
    let sid = unique_session();
    let mut client = srv.ws(&format!("/ws/{sid}"));
    for i in 1..=3 {
        srv.prompt(&sid, &format!("p{i}"), Some(&format!("c{i}")));
    }
    let mut answered = Vec::new();
    loop {
        let pending = srv.pending(&sid);
        let Some(first) = pending.first() else { break };
        let cmid = first["client_msg_id"].as_str().unwrap().to_string();
        srv.respond(&sid, &cmid, &format!("answer to {cmid}"));
        assert_eq!(next_message(&mut client)["client_msg_id"], cmid.as_str());
        answered.push(cmid);
        assert!(answered.len() <= 3, "prompts never leave the pending set");
    }
    assert_eq!(answered, ["c1", "c2", "c3"], "oldest first");
}

#[test]
fn scenario_4_agent_fetches_all_pending_prompts_at_once() {
    let srv = Server::start();
    let sid = unique_session();
    for i in 1..=5 {
        srv.prompt(&sid, &format!("p{i}"), Some(&format!("c{i}")));
    }
    let prompts = agent_fetch(&srv, &sid);
    assert_eq!(client_msg_ids(&prompts), ["c1", "c2", "c3", "c4", "c5"]);
    let seqs: Vec<u64> = prompts.iter().map(|p| p["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
}

#[test]
fn scenario_5_reconnecting_client_catches_up_and_dedupes() {
    let srv = Server::start();
    let sid = unique_session();
    let mut first = srv.ws(&format!("/ws/{sid}"));
    srv.prompt(&sid, "p1", Some("c1"));
    srv.respond(&sid, "c1", "r1");
    let seen = next_message(&mut first);
    let last_seq = seen["seq"].as_u64().unwrap();
    first.close();
    srv.wait_health("subscribers", 0);
    // Missed while offline.
    srv.prompt(&sid, "p2", Some("c2"));
    let missed = srv.respond(&sid, "c2", "r2");
    assert_eq!(missed["delivered"], false, "nobody was connected");
    let mut back = srv.ws(&format!("/ws/{sid}?after={last_seq}"));
    let replayed = next_message(&mut back);
    assert_eq!(replayed["text"], "r2");
    assert_eq!(replayed["assistant_msg_id"], missed["assistant_msg_id"]);
    // A client reconnecting without a cursor may see r1 again; assistant_msg_id dedupes it.
    let mut fresh = srv.ws(&format!("/ws/{sid}?after=0"));
    let all = [next_message(&mut fresh), next_message(&mut fresh)];
    let unique: HashSet<&str> = all
        .iter()
        .chain([&seen, &replayed])
        .map(|d| d["assistant_msg_id"].as_str().unwrap())
        .collect();
    assert_eq!(unique.len(), 2, "two distinct responses in total");
    // A resent response is acknowledged as a duplicate and never re-broadcast.
    let resend = json!({"session_id": sid, "client_msg_id": "c2", "text": "r2",
                        "assistant_msg_id": missed["assistant_msg_id"]});
    let dup = srv.post_json("/response", &resend).json();
    assert_eq!(dup["duplicate"], true, "{dup}");
    srv.prompt(&sid, "p3", Some("c3"));
    srv.respond(&sid, "c3", "r3");
    assert_eq!(next_message(&mut back)["text"], "r3");
}

#[test]
fn scenario_6_concurrent_prompts_from_many_clients_are_all_stored() {
    let srv = Server::start();
    let sid = unique_session();
    let (clients, each) = (4, 10);
    thread::scope(|s| {
        for c in 0..clients {
            let (srv, sid) = (&srv, &sid);
            s.spawn(move || {
                for i in 0..each {
                    srv.prompt(sid, "hi", Some(&format!("k{c}-{i}")));
                }
            });
        }
    });
    let pending = srv.pending(&sid);
    assert_eq!(pending.len(), clients * each);
    let seqs: Vec<u64> = pending.iter().map(|p| p["seq"].as_u64().unwrap()).collect();
    let want: Vec<u64> = (1..=(clients * each) as u64).collect();
    assert_eq!(seqs, want, "seqs unique, gapless, oldest first");
    for c in 0..clients {
        let mine: Vec<String> = client_msg_ids(&pending)
            .into_iter()
            .filter(|id| id.starts_with(&format!("k{c}-")))
            .collect();
        let sent: Vec<String> = (0..each).map(|i| format!("k{c}-{i}")).collect();
        assert_eq!(mine, sent, "each client's prompts keep their order");
    }
}

#[test]
fn scenario_7_invalid_requests_are_rejected_and_store_nothing() {
    let srv = Server::start();
    let sid = unique_session();
    let bad = [
        json!({"prompt": "no session"}),
        json!({"session_id": sid}),
        json!({"session_id": sid, "prompt": 42}),
        json!({"session_id": 42, "prompt": "p"}),
        json!({"session_id": sid, "prompt": "p", "metadata": "not an object"}),
        json!({"session_id": sid, "prompt": "p", "ts": "yesterday"}),
    ];
    for body in &bad {
        let resp = srv.post_json("/prompt", body);
        assert_eq!(resp.status, 400, "{body}: {}", resp.text());
        assert!(resp.json()["error"].is_string(), "{body}");
    }
    assert_eq!(
        srv.get(&format!("/messages/{sid}")).status,
        404,
        "no session"
    );
    srv.prompt(&sid, "valid", Some("c"));
    let bad = [
        json!({"session_id": sid, "text": "no prompt id"}),
        json!({"session_id": sid, "client_msg_id": "c"}),
        json!({"session_id": sid, "client_msg_id": "c", "text": false}),
    ];
    for body in &bad {
        let resp = srv.post_json("/response", body);
        assert_eq!(resp.status, 400, "{body}: {}", resp.text());
    }
    assert_eq!(srv.messages(&sid, "")["total"], 1);
    assert_eq!(srv.pending(&sid).len(), 1);
}

#[test]
fn scenario_8_sessions_are_created_on_use_and_cleaned_up() {
    // One relay: its `sessions` counter is its own local copies.
    let srv = Server::start_single();
    let (by_prompt, by_ws, by_put) = (unique_session(), unique_session(), unique_session());
    srv.prompt(&by_prompt, "p", None);
    let mut ws = srv.ws(&format!("/ws/{by_ws}"));
    assert_eq!(
        srv.put(&format!("/sessions/{by_put}")).json()["created"],
        true
    );
    assert_eq!(srv.health()["sessions"], 3);
    for sid in [&by_prompt, &by_ws, &by_put] {
        assert_eq!(srv.get(&format!("/messages/{sid}")).status, 200, "{sid}");
    }
    let mut poll = srv.conn();
    poll.send("GET", &format!("/prompts/{by_ws}?timeout=60"), &[], None);
    srv.wait_health("parked_polls", 1);
    for sid in [&by_prompt, &by_ws, &by_put] {
        assert_eq!(srv.delete(&format!("/sessions/{sid}")).status, 200, "{sid}");
    }
    assert_eq!(ws.expect_close(), 1000);
    common::assert_error(&poll.read_response(), 404, "Session not found");
    assert_eq!(srv.health()["sessions"], 0);
}

#[test]
fn idle_sessions_are_garbage_collected() {
    let srv = Server::start_with(&[("RELAY_SESSION_TTL", "0.3")]);
    let sid = unique_session();
    srv.prompt(&sid, "p", None);
    srv.wait_health("sessions", 0);
    assert_eq!(srv.get(&format!("/messages/{sid}")).status, 404);
}

#[test]
fn flow_1_basic_prompt_response_cycle() {
    let srv = Server::start();
    let sid = "abc";
    let mut client = srv.ws(&format!("/ws/{sid}"));
    let ack = srv.prompt(sid, "Hello", Some("msg-123"));
    assert_eq!(ack, json!({"stored": true, "client_msg_id": "msg-123"}));
    let prompts = agent_fetch(&srv, sid);
    assert_eq!(prompts.len(), 1);
    let p = &prompts[0];
    assert_eq!(p["session_id"], sid);
    assert_eq!(p["client_msg_id"], "msg-123");
    assert_eq!(p["prompt"], "Hello");
    assert!(p["ts"].is_u64(), "{p}");
    let reply = srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": "msg-123", "text": "Hi there!"}),
    );
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["delivered"], true);
    let frame = client.recv_json_skip_pings();
    assert_eq!(frame["type"], "message");
    assert_eq!(frame["data"]["text"], "Hi there!");
    assert_eq!(frame["data"]["client_msg_id"], "msg-123");
}

#[test]
fn flow_2_multiple_clients() {
    let srv = Server::start();
    let sid = "session-xyz";
    let mut a = srv.ws(&format!("/ws/{sid}"));
    let mut b = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("subscribers", 2);
    let cmid = srv.prompt(sid, "from A", None)["client_msg_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(client_msg_ids(&agent_fetch(&srv, sid)), vec![cmid.clone()]);
    let reply = srv.respond(sid, &cmid, "to both");
    assert_eq!(reply["delivered"], true);
    let (got_a, got_b) = (next_message(&mut a), next_message(&mut b));
    assert_eq!(got_a["assistant_msg_id"], reply["assistant_msg_id"]);
    assert_eq!(got_a, got_b);
}

#[test]
fn flow_3_multiple_pending_prompts() {
    let srv = Server::start();
    let sid = unique_session();
    for i in 1..=5 {
        srv.prompt(&sid, &format!("p{i}"), Some(&format!("c{i}")));
    }
    let all = agent_fetch(&srv, &sid);
    assert_eq!(client_msg_ids(&all), ["c1", "c2", "c3", "c4", "c5"]);
    for (n, p) in all.iter().take(3).enumerate() {
        let cmid = p["client_msg_id"].as_str().unwrap();
        srv.respond(&sid, cmid, "done");
        let left = client_msg_ids(&srv.pending(&sid));
        assert!(!left.iter().any(|id| id == cmid), "{cmid} still pending");
        assert_eq!(left.len(), 4 - n);
    }
    assert_eq!(client_msg_ids(&agent_fetch(&srv, &sid)), ["c4", "c5"]);
}
