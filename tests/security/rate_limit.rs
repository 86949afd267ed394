//! RELAY_RATE_LIMIT and RELAY_TRUSTED_PROXY against the real binary: one token
//! bucket per client shared by the POST endpoints, 429 with Retry-After, GETs
//! unmetered, X-Forwarded-For trusted only from a listed proxy (rightmost
//! entry), rejected requests storing nothing, and recovery after a pause.
//!
//! Bursts are pipelined in one write, so the server reads and meters them in
//! one loop turn at one instant: no refill can slip in between on a slow box.

use crate::common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The bytes of one POST with a JSON body and an optional X-Forwarded-For.
fn post(path: &str, body: &Value, xff: Option<&str>) -> Vec<u8> {
    let body = body.to_string();
    let xff = xff.map_or(String::new(), |v| format!("X-Forwarded-For: {v}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{xff}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn prompt(sid: &str, id: &str, xff: Option<&str>) -> Vec<u8> {
    post(
        "/prompt",
        &json!({"session_id": sid, "prompt": "q", "client_msg_id": id}),
        xff,
    )
}

fn response(sid: &str, id: &str) -> Vec<u8> {
    post(
        "/response",
        &json!({"session_id": sid, "client_msg_id": id, "text": "a"}),
        None,
    )
}

/// Sends every request in one write on one connection and reads the answers.
#[track_caller]
fn pipeline(srv: &Server, requests: &[Vec<u8>]) -> Vec<u16> {
    let mut http = srv.conn();
    http.send_raw(&requests.concat());
    (0..requests.len())
        .map(|_| http.read_response())
        .map(|r| {
            if r.status == 429 {
                assert_429(&r);
            }
            r.status
        })
        .collect()
}

#[track_caller]
fn assert_429(r: &Response) {
    assert_eq!(r.status, 429, "{}", r.text());
    let retry = r.header("Retry-After").expect("429 carries Retry-After");
    let secs: u64 = retry
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After {retry:?} is not integer seconds"));
    assert!(secs >= 1, "Retry-After {secs}");
    assert!(r.json()["error"].is_string(), "{}", r.text());
}

#[track_caller]
fn pending_ids(srv: &Server, sid: &str) -> Vec<String> {
    client_msg_ids(&srv.pending(sid))
}

#[test]
fn burst_passes_then_the_next_post_gets_429_and_stores_nothing() {
    let srv = Server::start_with(&[("RELAY_RATE_LIMIT", "5")]);
    let sid = unique_session();
    let burst: Vec<Vec<u8>> = (1..=6)
        .map(|i| prompt(&sid, &format!("c{i}"), None))
        .collect();
    assert_eq!(pipeline(&srv, &burst), [200, 200, 200, 200, 200, 429]);
    assert_eq!(pending_ids(&srv, &sid), ["c1", "c2", "c3", "c4", "c5"]);
    assert_eq!(srv.messages(&sid, "")["total"], 5, "the 429 stored nothing");
}

#[test]
fn gets_and_other_methods_are_not_rate_limited() {
    let srv = Server::start_with(&[("RELAY_RATE_LIMIT", "5")]);
    let sid = unique_session();
    let burst: Vec<Vec<u8>> = (1..=6)
        .map(|i| prompt(&sid, &format!("c{i}"), None))
        .collect();
    assert_eq!(pipeline(&srv, &burst)[5], 429);
    let mut reads = Vec::new();
    for _ in 0..10 {
        for path in [
            format!("/prompts/{sid}?wait=false"),
            format!("/messages/{sid}"),
            "/healthz".to_string(),
        ] {
            reads.push(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes());
        }
    }
    reads.push(format!("PUT /sessions/{sid} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes());
    let statuses = pipeline(&srv, &reads);
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(
        pipeline(&srv, &[prompt(&sid, "c7", None)]),
        [429],
        "still limited"
    );
}

#[test]
fn prompt_and_response_share_one_bucket() {
    let srv = Server::start_with(&[("RELAY_RATE_LIMIT", "5")]);
    let sid = unique_session();
    let requests = [
        prompt(&sid, "c1", None),
        prompt(&sid, "c2", None),
        prompt(&sid, "c3", None),
        response(&sid, "c1"),
        response(&sid, "c2"),
        response(&sid, "c3"),
        prompt(&sid, "c4", None),
    ];
    assert_eq!(
        pipeline(&srv, &requests),
        [200, 200, 200, 200, 200, 429, 429]
    );
    assert_eq!(
        pending_ids(&srv, &sid),
        ["c3"],
        "the rejected response left c3 pending"
    );
    assert_eq!(srv.messages(&sid, "")["total"], 5);
}

#[test]
fn without_a_trusted_proxy_x_forwarded_for_is_ignored() {
    let srv = Server::start_with(&[("RELAY_RATE_LIMIT", "5")]);
    let sid = unique_session();
    let burst: Vec<Vec<u8>> = (1..=6)
        .map(|i| prompt(&sid, &format!("c{i}"), Some(&format!("10.0.0.{i}"))))
        .collect();
    assert_eq!(pipeline(&srv, &burst), [200, 200, 200, 200, 200, 429]);
}

#[test]
fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_bucket() {
    let srv = Server::start_with(&[
        ("RELAY_RATE_LIMIT", "5"),
        ("RELAY_TRUSTED_PROXY", "127.0.0.1"),
    ]);
    let sid = unique_session();
    let mut requests = Vec::new();
    let mut want = Vec::new();
    for (k, client) in [Some("1.2.3.4"), Some("5.6.7.8"), None]
        .into_iter()
        .enumerate()
    {
        for i in 1..=6 {
            requests.push(prompt(&sid, &format!("c{k}-{i}"), client));
            want.push(if i <= 5 { 200 } else { 429 });
        }
    }
    assert_eq!(pipeline(&srv, &requests), want);
    assert_eq!(srv.messages(&sid, "")["total"], 15);
}

#[test]
fn forged_left_x_forwarded_for_entry_counts_against_the_rightmost() {
    let srv = Server::start_with(&[
        ("RELAY_RATE_LIMIT", "5"),
        ("RELAY_TRUSTED_PROXY", "127.0.0.1"),
    ]);
    let sid = unique_session();
    let mut requests: Vec<Vec<u8>> = (1..=5)
        .map(|i| {
            let xff = format!("9.9.9.{i}, 1.2.3.4");
            prompt(&sid, &format!("c{i}"), Some(&xff))
        })
        .collect();
    requests.push(prompt(&sid, "c6", Some("1.2.3.4")));
    requests.push(prompt(&sid, "c7", Some("9.9.9.9, 1.2.3.4")));
    requests.push(prompt(&sid, "c8", Some("1.2.3.4, 9.9.9.9")));
    // A client-sent header line and the one the proxy appended are one list.
    let two_lines = "8.8.8.8\r\nX-Forwarded-For: 1.2.3.4";
    requests.push(prompt(&sid, "c9", Some(two_lines)));
    assert_eq!(
        pipeline(&srv, &requests),
        [200, 200, 200, 200, 200, 429, 429, 200, 429]
    );
    assert_eq!(
        pending_ids(&srv, &sid),
        ["c1", "c2", "c3", "c4", "c5", "c8"]
    );
}

#[test]
fn limited_client_passes_again_after_a_pause() {
    // One relay whatever the mode: each relay meters its own clients, and
    // 21 connections spread over two would never reach the limit.
    let srv = Server::start_single_with(&[("RELAY_RATE_LIMIT", "20")]);
    let sid = unique_session();
    // The burst goes out on 21 connections at once rather than pipelined
    // on one: a pipelined request is read only once the one before it is
    // answered, and with a data directory each answer waits for its commit,
    // so a pipelined burst is spread over 21 commits and the bucket refills
    // under it. On separate connections every request is metered on arrival.
    let mut conns: Vec<_> = (0..21).map(|_| srv.conn()).collect();
    for (i, conn) in conns.iter_mut().enumerate() {
        conn.send_raw(&prompt(&sid, &format!("c{i}"), None));
    }
    let mut statuses: Vec<u16> = conns
        .iter_mut()
        .map(|c| {
            let r = c.read_response();
            if r.status == 429 {
                assert_429(&r);
            }
            r.status
        })
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses[..20], [200; 20], "{statuses:?}");
    assert_eq!(statuses[20], 429, "{statuses:?}");
    // Refill is time-based, so this waits on the clock, but polls instead of
    // sleeping a guessed time. Every attempt takes a token, so poll well
    // below the rate (10/s against 20/s refill): the balance still climbs.
    let started = Instant::now();
    let mut attempt = 0;
    let mut conn = srv.conn();
    loop {
        attempt += 1;
        let body =
            json!({"session_id": sid, "prompt": "q", "client_msg_id": format!("r{attempt}")});
        let r = conn.post_json("/prompt", &body);
        if r.status == 200 {
            break;
        }
        assert_429(&r);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "still limited after {attempt} attempts over {:?}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ids = pending_ids(&srv, &sid);
    assert_eq!(ids.len(), 21, "20 from the burst and the one that passed");
    assert_eq!(
        ids.last().map(String::as_str),
        Some(&*format!("r{attempt}"))
    );
}
