//! GET /prompts/{sid} long-polling over the real binary: parking, waking, timeouts, `wait`,
//! `after`, deletion and hang-ups. A poll is known to be parked when /healthz reports it in
//! `parked_polls` (a bounded readiness loop), never by sleeping.

use std::time::{Duration, Instant};

use crate::common::{Http, Server, assert_error, client_msg_ids, unique_session};
use serde_json::{Value, json};

/// Reads a poll's answer, asserting a 200 JSON array.
#[track_caller]
fn read_list(conn: &mut Http) -> Vec<Value> {
    let resp = conn.read_response();
    assert_eq!(resp.status, 200, "{}", resp.text());
    match resp.json() {
        Value::Array(items) => items,
        other => panic!("expected an array, got {other}"),
    }
}

#[track_caller]
fn created(srv: &Server) -> String {
    let sid = unique_session();
    assert_eq!(srv.put(&format!("/sessions/{sid}")).status, 200);
    sid
}

#[test]
fn parked_poll_is_woken_by_a_new_prompt() {
    let srv = Server::start();
    let sid = created(&srv);
    let mut poll = srv.start_poll(&sid, "?timeout=60");
    srv.wait_health("parked_polls", 1);
    srv.prompt(&sid, "wake up", Some("c1"));
    let items = read_list(&mut poll);
    assert_eq!(client_msg_ids(&items), ["c1"]);
    assert_eq!(items[0]["prompt"], "wake up");
    assert_eq!(items[0]["seq"], 1);
    srv.wait_health("parked_polls", 0);
}

#[test]
fn pending_prompt_is_returned_at_once_without_parking() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p1", Some("c1"));
    srv.prompt(&sid, "p2", Some("c2"));
    // timeout=60 would exceed the client's 10 s read timeout if the poll parked.
    let mut poll = srv.start_poll(&sid, "?timeout=60");
    assert_eq!(client_msg_ids(&read_list(&mut poll)), ["c1", "c2"]);
}

#[test]
fn one_prompt_wakes_every_parked_poll() {
    let srv = Server::start();
    let sid = created(&srv);
    let mut polls: Vec<Http> = (0..4)
        .map(|_| srv.start_poll(&sid, "?timeout=60"))
        .collect();
    srv.wait_health("parked_polls", 4);
    srv.prompt(&sid, "for everyone", Some("c1"));
    for poll in &mut polls {
        assert_eq!(client_msg_ids(&read_list(poll)), ["c1"]);
    }
    assert_eq!(srv.health()["parked_polls"], 0);
}

#[test]
fn prompt_in_another_session_does_not_wake_the_poll() {
    let srv = Server::start();
    let (sid, other) = (created(&srv), created(&srv));
    let mut poll = srv.start_poll(&sid, "?timeout=60");
    srv.wait_health("parked_polls", 1);
    srv.prompt(&other, "not yours", Some("x"));
    // Requests are handled in order, so this sees the effects of the prompt above.
    assert_eq!(srv.health()["parked_polls"], 1, "still parked");
    srv.prompt(&sid, "yours", Some("mine"));
    // Woken by the other session, the poll would have answered [] first.
    assert_eq!(client_msg_ids(&read_list(&mut poll)), ["mine"]);
}

#[test]
fn duplicate_prompt_wakes_nothing() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p1", Some("c1"));
    let mut poll = srv.start_poll(&sid, "?after=1&timeout=60");
    srv.wait_health("parked_polls", 1);
    assert_eq!(srv.prompt(&sid, "p1", Some("c1"))["duplicate"], true);
    assert_eq!(srv.health()["parked_polls"], 1, "still parked");
    srv.prompt(&sid, "p2", Some("c2"));
    // Woken by the duplicate, the poll would have answered [] (nothing after seq 1).
    assert_eq!(client_msg_ids(&read_list(&mut poll)), ["c2"]);
}

#[test]
fn poll_times_out_with_an_empty_list() {
    let srv = Server::start();
    let sid = created(&srv);
    let started = Instant::now();
    let mut poll = srv.start_poll(&sid, "?timeout=0.2");
    assert!(read_list(&mut poll).is_empty());
    // Never early; the upper bound is left to the 10 s read timeout.
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "answered after {:?}",
        started.elapsed()
    );
    srv.wait_health("parked_polls", 0);
}

#[test]
fn connection_is_reusable_after_a_timed_out_poll() {
    let srv = Server::start();
    let sid = created(&srv);
    let mut conn = srv.start_poll(&sid, "?timeout=0.2");
    assert!(read_list(&mut conn).is_empty());
    srv.prompt(&sid, "p", Some("c"));
    let resp = conn.request("GET", &format!("/prompts/{sid}?wait=false"), &[], None);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()[0]["client_msg_id"], "c");
}

#[test]
fn wait_false_or_zero_answers_at_once() {
    let srv = Server::start();
    let sid = created(&srv);
    for wait in ["false", "0"] {
        let resp = srv.get(&format!("/prompts/{sid}?wait={wait}&timeout=60"));
        assert_eq!(resp.status, 200, "wait={wait}");
        assert_eq!(resp.json(), json!([]), "wait={wait}");
    }
    srv.prompt(&sid, "p", Some("c"));
    let resp = srv.get(&format!("/prompts/{sid}?wait=0"));
    assert_eq!(resp.json()[0]["client_msg_id"], "c");
}

#[test]
fn wait_true_or_one_parks() {
    let srv = Server::start();
    let sid = created(&srv);
    let mut a = srv.start_poll(&sid, "?wait=true&timeout=60");
    let mut b = srv.start_poll(&sid, "?wait=1&timeout=60");
    srv.wait_health("parked_polls", 2);
    srv.prompt(&sid, "p", Some("c"));
    assert_eq!(client_msg_ids(&read_list(&mut a)), ["c"]);
    assert_eq!(client_msg_ids(&read_list(&mut b)), ["c"]);
}

#[test]
fn bad_timeout_or_wait_is_400() {
    let srv = Server::start();
    let sid = created(&srv);
    for query in [
        "?timeout=-1",
        "?timeout=abc",
        "?timeout=",
        "?wait=maybe",
        "?wait=yes",
        "?wait=",
    ] {
        let resp = srv.get(&format!("/prompts/{sid}{query}"));
        assert_eq!(resp.status, 400, "{query}: {}", resp.text());
        assert!(resp.json()["error"].is_string(), "{query}");
    }
    assert_eq!(srv.health()["parked_polls"], 0);
}

#[test]
fn timeout_above_300_is_clamped_not_rejected() {
    let srv = Server::start();
    let sid = created(&srv);
    let mut poll = srv.start_poll(&sid, "?timeout=100000");
    srv.wait_health("parked_polls", 1);
    srv.prompt(&sid, "p", Some("c"));
    assert_eq!(client_msg_ids(&read_list(&mut poll)), ["c"]);
}

#[test]
fn fractional_timeout_is_accepted() {
    let srv = Server::start();
    let sid = created(&srv);
    let mut poll = srv.start_poll(&sid, "?timeout=0.05");
    assert!(read_list(&mut poll).is_empty());
}

#[test]
fn after_filters_pending_prompts_by_seq() {
    let srv = Server::start();
    let sid = unique_session();
    for i in 1..=3 {
        srv.prompt(&sid, &format!("p{i}"), Some(&format!("c{i}")));
    }
    let resp = srv.get(&format!("/prompts/{sid}?wait=false&after=1"));
    assert_eq!(resp.status, 200);
    let items: Vec<Value> = resp.json().as_array().unwrap().clone();
    assert_eq!(client_msg_ids(&items), ["c2", "c3"]);
}

#[test]
fn poll_with_after_parks_despite_older_pending_prompts() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p1", Some("c1"));
    srv.prompt(&sid, "p2", Some("c2"));
    let mut poll = srv.start_poll(&sid, "?after=2&timeout=60");
    srv.wait_health("parked_polls", 1);
    srv.prompt(&sid, "p3", Some("c3"));
    assert_eq!(client_msg_ids(&read_list(&mut poll)), ["c3"]);
}

#[test]
fn poll_on_unknown_session_is_404_at_once() {
    let srv = Server::start();
    let resp = srv.get(&format!("/prompts/{}?timeout=60", unique_session()));
    assert_error(&resp, 404, "Session not found");
}

#[test]
fn deleting_the_session_answers_parked_polls_404() {
    let srv = Server::start();
    let sid = created(&srv);
    let mut polls: Vec<Http> = (0..2)
        .map(|_| srv.start_poll(&sid, "?timeout=60"))
        .collect();
    srv.wait_health("parked_polls", 2);
    assert_eq!(srv.delete(&format!("/sessions/{sid}")).status, 200);
    for poll in &mut polls {
        assert_error(&poll.read_response(), 404, "Session not found");
    }
    assert_eq!(srv.health()["parked_polls"], 0);
}

#[test]
fn hanging_up_frees_the_parked_poll() {
    let srv = Server::start();
    let sid = created(&srv);
    let poll = srv.start_poll(&sid, "?timeout=60");
    let _other = srv.start_poll(&sid, "?timeout=60");
    srv.wait_health("parked_polls", 2);
    drop(poll);
    srv.wait_health("parked_polls", 1);
}

#[test]
fn waiter_beyond_the_cap_is_503() {
    // One relay: the cap counts its own parked polls.
    let srv = Server::start_single_with(&[("RELAY_MAX_WAITERS", "2")]);
    let sid = created(&srv);
    let mut a = srv.start_poll(&sid, "?timeout=60");
    let mut b = srv.start_poll(&sid, "?timeout=60");
    srv.wait_health("parked_polls", 2);
    let over = srv.get(&format!("/prompts/{sid}?timeout=60"));
    assert_eq!(over.status, 503, "{}", over.text());
    assert!(over.json()["error"].is_string());
    // Another session has its own waiter budget.
    let other = created(&srv);
    let mut c = srv.start_poll(&other, "?timeout=60");
    srv.wait_health("parked_polls", 3);
    srv.prompt(&sid, "p", Some("s1"));
    srv.prompt(&other, "p", Some("o1"));
    assert_eq!(client_msg_ids(&read_list(&mut a)), ["s1"]);
    assert_eq!(client_msg_ids(&read_list(&mut b)), ["s1"]);
    assert_eq!(client_msg_ids(&read_list(&mut c)), ["o1"]);
}

#[test]
fn prompt_stays_pending_until_its_first_response() {
    let srv = Server::start();
    let sid = unique_session();
    srv.prompt(&sid, "p1", Some("c1"));
    srv.prompt(&sid, "p2", Some("c2"));
    for _ in 0..2 {
        assert_eq!(
            client_msg_ids(&srv.pending(&sid)),
            ["c1", "c2"],
            "fetching does not consume"
        );
    }
    srv.respond(&sid, "c1", "part 1");
    assert_eq!(client_msg_ids(&srv.pending(&sid)), ["c2"]);
    srv.respond(&sid, "c1", "part 2");
    assert_eq!(client_msg_ids(&srv.pending(&sid)), ["c2"]);
    srv.respond(&sid, "c2", "done");
    assert!(srv.pending(&sid).is_empty());
    let mut poll = srv.start_poll(&sid, "?timeout=0.2");
    assert!(
        read_list(&mut poll).is_empty(),
        "answered prompts never return"
    );
}

#[test]
fn woken_poll_returns_the_whole_pending_set_oldest_first() {
    let srv = Server::start();
    let sid = created(&srv);
    let mut poll = srv.start_poll(&sid, "?timeout=60");
    srv.wait_health("parked_polls", 1);
    srv.prompt(&sid, "p1", Some("c1"));
    assert_eq!(client_msg_ids(&read_list(&mut poll)), ["c1"]);
    let mut again = srv.start_poll(&sid, "?timeout=60");
    assert_eq!(
        client_msg_ids(&read_list(&mut again)),
        ["c1"],
        "still pending"
    );
    srv.respond(&sid, "c1", "ok");
    let mut third = srv.start_poll(&sid, "?timeout=60");
    srv.wait_health("parked_polls", 1);
    srv.prompt(&sid, "p2", Some("c2"));
    let items = read_list(&mut third);
    assert_eq!(client_msg_ids(&items), ["c2"]);
    assert_eq!(items[0]["seq"], 3);
}
