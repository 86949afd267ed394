//! A subscriber is a cursor over the session's log (contract, "WebSocket"):
//! one that stops reading is never closed for it and gets everything, in
//! order, when it reads again; a replay of any length completes; a cursor
//! that history was trimmed past gets a `resync` and goes on; and stalled
//! subscribers neither slow the readers down nor grow the server past its
//! caps. The stalled clients shrink their receive buffer so the kernel holds
//! little for them and the server's own queue is what fills.

use crate::common::*;
use serde_json::{Value, json};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The subscriber buffer the tests run with.
const BUFFER: usize = 64 * 1024;
/// Answers of this size: one frame nearly fills the buffer.
const TEXT: usize = 60 * 1024;
/// A hundred buffers' worth of answers.
const ANSWERS: u64 = (100 * BUFFER / TEXT) as u64 + 1;
/// The stalled clients' receive buffer.
const SMALL_WINDOW: usize = 4096;

/// Posts prompt `c{n}` and a `TEXT`-byte answer to it for every n in `ns`,
/// on one kept connection.
#[track_caller]
fn post_answers(srv: &Server, sid: &str, ns: std::ops::RangeInclusive<u64>) {
    let mut agent = srv.conn();
    let text = "x".repeat(TEXT);
    for n in ns {
        let id = format!("c{n}");
        let p = json!({"session_id": sid, "prompt": "q", "client_msg_id": id});
        assert_eq!(agent.post_json("/prompt", &p).status, 200);
        let a = json!({"session_id": sid, "client_msg_id": id, "text": text});
        let r = agent.post_json("/response", &a);
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// Reads `message` frames until the one with `last` seq; returns every
/// frame's type and seq (`resync` frames as their `first_seq`). A close or
/// a read timeout fails the test.
#[track_caller]
fn read_until(ws: &mut Ws, last: u64) -> Vec<(String, u64)> {
    let mut seen = Vec::new();
    loop {
        let f = ws.recv_json_skip_pings();
        let kind = f["type"].as_str().expect("type").to_string();
        let seq = match kind.as_str() {
            "message" => f["data"]["seq"].as_u64().expect("seq"),
            "resync" => f["first_seq"].as_u64().expect("first_seq"),
            _ => panic!("unexpected frame {f}"),
        };
        seen.push((kind.clone(), seq));
        if kind == "message" && seq == last {
            return seen;
        }
    }
}

fn message_seqs(seen: &[(String, u64)]) -> Vec<u64> {
    seen.iter()
        .filter(|(k, _)| k == "message")
        .map(|(_, s)| *s)
        .collect()
}

/// Answers n get seq 2n on a fresh session.
fn answer_seqs(ns: std::ops::RangeInclusive<u64>) -> Vec<u64> {
    ns.map(|n| 2 * n).collect()
}

fn buffer_env() -> String {
    BUFFER.to_string()
}

#[test]
fn a_subscriber_that_stops_reading_gets_everything_in_order_when_it_reads_again() {
    let buffer = buffer_env();
    let srv = Server::start_with(&[("RELAY_SUBSCRIBER_BUFFER", &buffer)]);
    let sid = unique_session();
    let mut ws = srv.ws_small_window(&format!("/ws/{sid}"), SMALL_WINDOW);
    srv.wait_health("subscribers", 1);
    post_answers(&srv, &sid, 1..=ANSWERS);
    assert_eq!(srv.health()["subscribers"], 1, "still connected");
    let seen = read_until(&mut ws, 2 * ANSWERS);
    assert_eq!(message_seqs(&seen), answer_seqs(1..=ANSWERS));
    assert!(seen.iter().all(|(k, _)| k == "message"), "no resync");
    // And it is live again: the next answer comes straight through.
    post_answers(&srv, &sid, ANSWERS + 1..=ANSWERS + 1);
    assert_eq!(
        message_seqs(&read_until(&mut ws, 2 * ANSWERS + 2)),
        vec![2 * ANSWERS + 2]
    );
}

#[test]
fn a_replay_of_a_hundred_buffers_completes() {
    let buffer = buffer_env();
    let srv = Server::start_with(&[("RELAY_SUBSCRIBER_BUFFER", &buffer)]);
    let sid = unique_session();
    post_answers(&srv, &sid, 1..=ANSWERS);
    let mut ws = srv.ws_small_window(&format!("/ws/{sid}?after=0"), SMALL_WINDOW);
    let seen = read_until(&mut ws, 2 * ANSWERS);
    assert_eq!(message_seqs(&seen), answer_seqs(1..=ANSWERS));
    // A second one resumes from the middle, with the session's epoch.
    let epoch = srv.put(&format!("/sessions/{sid}")).json()["epoch"]
        .as_str()
        .expect("epoch")
        .to_string();
    let mid = ANSWERS;
    let mut again = srv.ws_small_window(
        &format!("/ws/{sid}?after={mid}&epoch={epoch}"),
        SMALL_WINDOW,
    );
    let seen = read_until(&mut again, 2 * ANSWERS);
    let want: Vec<u64> = answer_seqs(1..=ANSWERS)
        .into_iter()
        .filter(|s| *s > mid)
        .collect();
    assert_eq!(
        seen.first().map(|(k, _)| k.as_str()),
        Some("message"),
        "no resync"
    );
    assert_eq!(message_seqs(&seen), want);
}

#[test]
fn a_lagging_subscriber_whose_cursor_was_trimmed_gets_resync_and_continues() {
    let buffer = buffer_env();
    let srv = Server::start_with(&[
        ("RELAY_SUBSCRIBER_BUFFER", &buffer),
        ("RELAY_HISTORY_LIMIT", "20"),
    ]);
    let sid = unique_session();
    let mut ws = srv.ws_small_window(&format!("/ws/{sid}"), SMALL_WINDOW);
    srv.wait_health("subscribers", 1);
    post_answers(&srv, &sid, 1..=ANSWERS);
    let seen = read_until(&mut ws, 2 * ANSWERS);
    let resyncs: Vec<u64> = seen
        .iter()
        .filter(|(k, _)| k == "resync")
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(resyncs.len(), 1, "one resync: {seen:?}");
    let at = seen
        .iter()
        .position(|(k, _)| k == "resync")
        .expect("resync");
    let before = message_seqs(&seen[..at]);
    let after = message_seqs(&seen[at..]);
    assert!(
        before.windows(2).all(|w| w[1] == w[0] + 2),
        "in order before the resync: {before:?}"
    );
    // History keeps seqs 2*ANSWERS-19 ..= 2*ANSWERS at the end; the resync
    // points at the oldest retained message and the answers after it follow.
    assert!(
        after.iter().all(|s| *s >= resyncs[0]),
        "{after:?} from {}",
        resyncs[0]
    );
    assert!(after.windows(2).all(|w| w[1] == w[0] + 2), "{after:?}");
    assert_eq!(after.last(), Some(&(2 * ANSWERS)));
    assert_eq!(srv.health()["subscribers"], 1);
}

/// A subscriber that never reads after the 101, with a small receive buffer.
#[track_caller]
fn stalled_subscriber(addr: SocketAddr, sid: &str) -> TcpStream {
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.set_recv_buffer_size(SMALL_WINDOW).expect("SO_RCVBUF");
    sock.connect(&addr.into()).expect("connect");
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    raw_upgrade(&mut s, &format!("/ws/{sid}"));
    s
}

#[test]
fn nine_hundred_stalled_subscribers_neither_slow_the_readers_nor_grow_memory() {
    if skip_with_tls("plain sockets with a small receive window read byte by byte") {
        return;
    }
    const SUBS: usize = 1000;
    const READERS: usize = 100;
    const POSTS: u64 = 1000;
    const ANSWER: usize = 4096;
    const SUB_BUFFER: usize = 16 * 1024;
    let sub_buffer = SUB_BUFFER.to_string();
    let srv = Server::start_with(&[
        ("RELAY_SUBSCRIBER_BUFFER", &sub_buffer),
        ("RELAY_LOG", "info"),
    ]);
    let sid = unique_session();
    let warm_rss = srv.rss_kib();
    let stalled: Vec<TcpStream> = (0..SUBS - READERS)
        .map(|_| stalled_subscriber(srv.addr(), &sid))
        .collect();
    let readers: Vec<Ws> = (0..READERS)
        .map(|_| srv.ws(&format!("/ws/{sid}")))
        .collect();
    srv.wait_health("subscribers", SUBS as u64);
    let started = Instant::now();
    let handles: Vec<_> = readers
        .into_iter()
        .map(|mut ws| {
            std::thread::spawn(move || {
                let mut worst = Duration::ZERO;
                let mut seqs = Vec::new();
                loop {
                    let t = Instant::now();
                    let data = ws.recv_json_skip_pings();
                    worst = worst.max(t.elapsed());
                    let seq = data["data"]["seq"].as_u64().expect("seq");
                    seqs.push(seq);
                    if seq == 2 * POSTS {
                        return (seqs, worst, ws);
                    }
                }
            })
        })
        .collect();
    let mut agent = srv.conn();
    let text = "y".repeat(ANSWER);
    let mut peak = 0;
    for n in 1..=POSTS {
        let id = format!("c{n}");
        let p = json!({"session_id": sid, "prompt": "q", "client_msg_id": id});
        assert_eq!(agent.post_json("/prompt", &p).status, 200);
        let a = json!({"session_id": sid, "client_msg_id": id, "text": text});
        let r = agent.post_json("/response", &a);
        assert_eq!(r.status, 200, "{}", r.text());
        if n % 100 == 0 {
            peak = peak.max(srv.rss_kib());
        }
    }
    let mut worst = Duration::ZERO;
    let mut kept = Vec::new();
    for h in handles {
        let (seqs, w, ws) = h.join().expect("reader");
        assert_eq!(seqs, answer_seqs(1..=POSTS), "a reader missed or reordered");
        worst = worst.max(w);
        kept.push(ws);
    }
    peak = peak.max(srv.rss_kib());
    // History (1000 prompts and 1000 answers of 4 KiB, each kept once) and
    // 1000 subscriber queues at their cap plus one frame: the bound the
    // caps promise, with half again for the allocator.
    let history_kib = (POSTS as usize * (ANSWER + 512) * 2 / 1024) as u64;
    let queues_kib = (SUBS * (SUB_BUFFER + ANSWER + 1024) / 1024) as u64;
    let bound = (history_kib + queues_kib) * 3 / 2;
    eprintln!(
        "{POSTS} answers to {READERS} readers and {} stalled subscribers in {:?}; slowest wait for a frame {worst:?}; RSS {warm_rss} -> {peak} KiB (bound +{bound} KiB)",
        SUBS - READERS,
        started.elapsed()
    );
    assert!(
        peak <= warm_rss + bound,
        "RSS {peak} KiB, warm {warm_rss} KiB, bound +{bound} KiB"
    );
    assert_eq!(
        srv.health()["subscribers"],
        SUBS as u64,
        "nobody was closed"
    );
    drop(stalled);
    srv.wait_health("subscribers", READERS as u64);
}

#[test]
fn delivered_is_true_while_a_subscriber_is_connected_even_a_stalled_one() {
    if skip_with_tls("plain sockets with a small receive window read byte by byte") {
        return;
    }
    let srv = Server::start_with(&[("RELAY_SUBSCRIBER_BUFFER", "4096")]);
    let sid = unique_session();
    let _stalled = stalled_subscriber(srv.addr(), &sid);
    srv.wait_health("subscribers", 1);
    srv.prompt(&sid, "q", Some("c1"));
    let text = "z".repeat(8000);
    for i in 0..20 {
        let r = srv.post_json(
            "/response",
            &json!({"session_id": sid, "client_msg_id": "c1", "assistant_msg_id": format!("a{i}"), "text": text}),
        );
        assert_eq!(r.json()["delivered"], Value::Bool(true), "{}", r.text());
    }
}
