//! One agent for many sessions, over the real binary: `GET /prompts` with
//! no session lists the pending prompts of every session oldest arrival
//! first, each with its `session_id` and `cursor`; `after=<cursor>` lists
//! only later arrivals; `limit` pages; a parked one is woken by a prompt
//! of any session; an answered or cancelled prompt leaves the list. With
//! several instances (`TEST_WITH_REDIS`) each request goes to the next
//! relay in turn, so the list, the wake-up and the agent's presence are
//! seen across instances.

use crate::common::{Http, Server, assert_error, cluster_mode, unique_session};
use serde_json::{Value, json};

#[track_caller]
fn list(srv: &Server, query: &str) -> Vec<Value> {
    let resp = srv.get(&format!("/prompts{query}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    match resp.json() {
        Value::Array(items) => items,
        other => panic!("expected an array, got {other}"),
    }
}

#[track_caller]
fn read_list(conn: &mut Http) -> Vec<Value> {
    let resp = conn.read_response();
    assert_eq!(resp.status, 200, "{}", resp.text());
    match resp.json() {
        Value::Array(items) => items,
        other => panic!("expected an array, got {other}"),
    }
}

fn ids(items: &[Value]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|p| {
            (
                p["session_id"].as_str().unwrap_or("?").to_string(),
                p["client_msg_id"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect()
}

fn pair(sid: &str, id: &str) -> (String, String) {
    (sid.to_string(), id.to_string())
}

#[test]
fn every_sessions_pending_prompts_are_listed_oldest_arrival_first() {
    let srv = Server::start();
    let (a, b) = (unique_session(), unique_session());
    srv.prompt(&a, "a1", Some("a1"));
    srv.prompt(&b, "b1", Some("b1"));
    srv.prompt(&a, "a2", Some("a2"));
    let items = list(&srv, "?wait=false");
    let want = [pair(&a, "a1"), pair(&b, "b1"), pair(&a, "a2")];
    if cluster_mode() {
        // Sessions of different buckets are ordered by their buckets'
        // counters; a session's own prompts by arrival.
        let (mut got, mut want) = (ids(&items), want.to_vec());
        assert!(got.iter().position(|p| p.1 == "a1") < got.iter().position(|p| p.1 == "a2"));
        got.sort();
        want.sort();
        assert_eq!(got, want);
    } else {
        assert_eq!(ids(&items), want);
    }
    let b1 = items.iter().find(|p| p["prompt"] == "b1").unwrap();
    assert_eq!(b1["seq"], 1);
    let cursors: Vec<&str> = items
        .iter()
        .map(|p| p["cursor"].as_str().unwrap())
        .collect();
    // Each listed once, and later arrivals after `after`.
    let later = list(&srv, &format!("?wait=false&after={}", cursors[0]));
    assert_eq!(ids(&later), ids(&items[1..]));
    let none = list(&srv, &format!("?wait=false&after={}", cursors[2]));
    assert!(none.is_empty(), "{none:?}");
    // The session's own poll sees its prompts alike.
    assert_eq!(srv.pending(&a).len(), 2);
}

#[test]
fn answered_and_cancelled_prompts_leave_the_list() {
    let srv = Server::start();
    let (a, b) = (unique_session(), unique_session());
    srv.prompt(&a, "a1", Some("a1"));
    srv.prompt(&b, "b1", Some("b1"));
    srv.prompt(&b, "b2", Some("b2"));
    srv.respond(&a, "a1", "done");
    let cancel = json!({"session_id": b, "client_msg_id": "b1"});
    assert_eq!(srv.post_json("/cancel", &cancel).status, 200);
    assert_eq!(ids(&list(&srv, "?wait=false")), [pair(&b, "b2")]);
    assert_eq!(srv.delete(&format!("/sessions/{b}")).status, 200);
    assert!(list(&srv, "?wait=false").is_empty());
}

#[test]
fn limit_pages_and_is_validated_as_for_messages() {
    let srv = Server::start();
    let sids: Vec<String> = (0..5).map(|_| unique_session()).collect();
    for (i, sid) in sids.iter().enumerate() {
        srv.prompt(sid, "p", Some(&format!("c{i}")));
    }
    let first = list(&srv, "?wait=false&limit=2");
    let cursor = first[1]["cursor"].as_str().unwrap();
    let rest = list(&srv, &format!("?wait=false&limit=2&after={cursor}"));
    let all = list(&srv, "?wait=false&limit=5000");
    assert_eq!(all.len(), 5);
    if cluster_mode() {
        // Sessions of different buckets are ordered by their buckets'
        // counters, not by when they arrived: the pages still take each
        // prompt once, in the order of the whole list.
        assert_eq!(ids(&first), ids(&all[..2]));
        assert_eq!(ids(&rest), ids(&all[2..4]));
    } else {
        assert_eq!(ids(&first), [pair(&sids[0], "c0"), pair(&sids[1], "c1")]);
        assert_eq!(ids(&rest), [pair(&sids[2], "c2"), pair(&sids[3], "c3")]);
    }
    for bad in ["limit=-1", "limit=x", "after=x", "timeout=-1", "wait=maybe"] {
        let resp = srv.get(&format!("/prompts?{bad}"));
        assert_eq!(resp.status, 400, "{bad}: {}", resp.text());
    }
}

#[test]
fn a_prompt_in_any_session_wakes_a_parked_poll() {
    let srv = Server::start();
    let (a, b) = (unique_session(), unique_session());
    srv.prompt(&a, "old", Some("a1"));
    let cursor = list(&srv, "?wait=false")[0]["cursor"]
        .as_str()
        .unwrap()
        .to_string();
    let mut poll = srv.conn();
    poll.send(
        "GET",
        &format!("/prompts?timeout=60&after={cursor}"),
        &[],
        None,
    );
    let mut plain = srv.conn();
    plain.send("GET", "/prompts?timeout=60&after=0&limit=1", &[], None);
    srv.wait_health("parked_polls", 1);
    // `after=0` is below every cursor of this run: answered at once.
    assert_eq!(ids(&read_list(&mut plain)), [pair(&a, "a1")]);
    srv.prompt(&b, "new", Some("b1"));
    let items = read_list(&mut poll);
    assert_eq!(ids(&items), [pair(&b, "b1")]);
    assert!(items[0]["cursor"].as_str().unwrap() > cursor.as_str());
    srv.wait_health("parked_polls", 0);
}

#[test]
fn a_parked_poll_times_out_empty_and_a_hang_up_frees_it() {
    let srv = Server::start();
    let mut poll = srv.conn();
    poll.send("GET", "/prompts?timeout=0.2", &[], None);
    assert!(read_list(&mut poll).is_empty());
    let poll = {
        let mut c = srv.conn();
        c.send("GET", "/prompts?timeout=60", &[], None);
        c
    };
    srv.wait_health("parked_polls", 1);
    drop(poll);
    srv.wait_health("parked_polls", 0);
    // Nothing left behind: a prompt now wakes nobody, and is listed.
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c1"));
    assert_eq!(ids(&list(&srv, "?wait=false")), [pair(&sid, "c1")]);
}

#[test]
fn a_subscriber_gets_a_receipt_when_the_all_sessions_poll_lists_its_prompt() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("subscribers", 1);
    srv.prompt(&sid, "p", Some("c1"));
    assert_eq!(list(&srv, "?wait=false").len(), 1);
    let receipt = loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] == "receipt" {
            break v;
        }
    };
    assert_eq!(receipt["data"]["client_msg_id"], "c1");
    assert_eq!(receipt["data"]["state"], "fetched");
}

/// The next `presence` frame of `ws`, skipping the others.
#[track_caller]
fn next_presence(ws: &mut crate::common::Ws) -> String {
    loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] == "presence" {
            return v["data"]["agent"].as_str().unwrap_or("?").to_string();
        }
    }
}

/// Waits (bounded, 5 s: far below the agent's 60 s grace) until `GET
/// /sessions/{sid}` says the agent is `want`: with several instances
/// (`TEST_WITH_REDIS`), another relay hears of the agent as soon as its
/// own relay tells Redis, not in the same instant.
#[track_caller]
fn agent_state(srv: &Server, sid: &str, want: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let info = srv.get(&format!("/sessions/{sid}")).json();
        if info["agent"] == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never {want} in {sid}: {info}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn an_all_sessions_poll_is_an_agent_in_every_session_until_it_stops() {
    let srv = Server::start_with(&[("RELAY_AGENT_GRACE", "60")]);
    let (watched, quiet) = (unique_session(), unique_session());
    assert_eq!(srv.put(&format!("/sessions/{quiet}")).status, 200);
    let mut ws = srv.ws(&format!("/ws/{watched}"));
    assert_eq!(next_presence(&mut ws), "offline");
    agent_state(&srv, &quiet, "offline");
    // Parked: online in both, the watcher told at once.
    let mut poll = srv.conn();
    poll.send("GET", "/prompts?timeout=0.3", &[], None);
    assert_eq!(next_presence(&mut ws), "online");
    agent_state(&srv, &quiet, "online");
    // Answered `[]`: still online, for the grace.
    assert!(read_list(&mut poll).is_empty());
    srv.wait_health("parked_polls", 0);
    agent_state(&srv, &quiet, "online");
    agent_state(&srv, &watched, "online");
    // The agent stops: offline at once, everywhere.
    let resp = srv.delete("/agent");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json(), json!({"ok": true}));
    assert_eq!(next_presence(&mut ws), "offline");
    agent_state(&srv, &quiet, "offline");
    // Its next request counts again.
    assert!(list(&srv, "?wait=false").is_empty());
    assert_eq!(next_presence(&mut ws), "online");
    agent_state(&srv, &quiet, "online");
}

#[test]
fn delete_agent_of_one_session_ends_its_graces_there() {
    let srv = Server::start_single_with(&[("RELAY_AGENT_GRACE", "60")]);
    let sid = unique_session();
    assert_eq!(srv.put(&format!("/sessions/{sid}")).status, 200);
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    assert_eq!(next_presence(&mut ws), "offline");
    assert!(srv.pending(&sid).is_empty());
    assert_eq!(next_presence(&mut ws), "online");
    let resp = srv.delete(&format!("/agent/{sid}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json(), json!({"ok": true}));
    assert_eq!(next_presence(&mut ws), "offline");
    agent_state(&srv, &sid, "offline");
    // A poll still parked keeps it online.
    let mut poll = srv.start_poll(&sid, "?timeout=60");
    assert_eq!(next_presence(&mut ws), "online");
    assert_eq!(srv.delete(&format!("/agent/{sid}")).status, 200);
    agent_state(&srv, &sid, "online");
    srv.prompt(&sid, "p", Some("c1"));
    assert_eq!(read_list(&mut poll).len(), 1);
    // Unknown session: 404; a wrong method: 405.
    let resp = srv.delete(&format!("/agent/{}", unique_session()));
    assert_error(&resp, 404, "Session not found");
    assert_eq!(srv.get(&format!("/agent/{sid}")).status, 405);
}
