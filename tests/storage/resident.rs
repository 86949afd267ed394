//! With a data directory, memory holds only the sessions in use: under a
//! budget far smaller than what is written, the least recently used
//! sessions leave memory and are read back on their next use, with every
//! acknowledged message, `seq` and epoch as they were; a subscriber that
//! resumes gets no `resync`; a parked poll keeps its session; and after a
//! restart, which reads no session, the first request is answered and
//! everything is there.

use crate::common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A budget far below what the test writes (about 2.4 MB of messages).
const BUDGET: &str = "1M";
const SESSIONS: usize = 60;
const PAIRS: usize = 10;

fn start(dir: &Dir) -> Server {
    Server::start_single_with(&[("RELAY_DATA_DIR", dir.path()), ("RELAY_MAX_MEMORY", BUDGET)])
}

/// Every message of a session, asserting `seq` runs from 1 with no hole.
#[track_caller]
fn all_messages(srv: &Server, sid: &str) -> Vec<Value> {
    let page = srv.messages(sid, "?limit=1000");
    let msgs = page["messages"].as_array().expect("messages").clone();
    let seqs: Vec<u64> = msgs
        .iter()
        .map(|m| m["data"]["seq"].as_u64().unwrap())
        .collect();
    let want: Vec<u64> = (1..=msgs.len() as u64).collect();
    assert_eq!(seqs, want, "{sid}: seq has holes or repeats");
    msgs
}

/// What a session holds, as (kind, client_msg_id, text) in order.
fn contents(msgs: &[Value]) -> Vec<(String, String, String)> {
    msgs.iter()
        .map(|m| {
            let d = &m["data"];
            let text = d["prompt"].as_str().or(d["text"].as_str()).unwrap_or("");
            (
                m["type"].as_str().unwrap().to_string(),
                d["client_msg_id"].as_str().unwrap().to_string(),
                text.to_string(),
            )
        })
        .collect()
}

#[test]
fn sessions_leave_memory_under_the_budget_and_come_back_whole() {
    if skip_with_redis("a data directory of its own") {
        return;
    }
    let dir = Dir::new("resident");
    let mut srv = start(&dir);
    let big = "m".repeat(4000);
    let sid = |i: usize| format!("res-{i}");
    // A session someone waits on: its poll parks first, before anything
    // is written, and must stay parked (its session in memory) however
    // much is written meanwhile.
    srv.put("/sessions/res-parked");
    let mut poll = srv.start_poll("res-parked", "?timeout=60");
    srv.wait_health("parked_polls", 1);
    let mut acked: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    let mut epochs = BTreeMap::new();
    for round in 0..PAIRS {
        for i in 0..SESSIONS {
            let s = sid(i);
            let cid = format!("p{round}");
            let text = format!("{round}{big}");
            srv.prompt(&s, &text, Some(&cid));
            srv.respond(&s, &cid, &format!("a{round}"));
            let log = acked.entry(s.clone()).or_default();
            log.push(("prompt".into(), cid.clone(), text));
            log.push(("assistant".into(), cid, format!("a{round}")));
        }
        if round == 0 {
            for i in 0..SESSIONS {
                let info = srv.get(&format!("/sessions/{}", sid(i))).json();
                epochs.insert(sid(i), info["epoch"].as_str().unwrap().to_string());
            }
        }
    }
    let resident = srv.metric("relay_sessions_resident");
    assert!(
        resident < SESSIONS as u64 / 2,
        "{resident} of {SESSIONS} sessions held in memory under a 1 MiB budget"
    );
    assert!(srv.metric("relay_memory_bytes") <= 1024 * 1024 + 64 * 1024);
    assert!(srv.metric("relay_session_evictions_total") > 0);
    assert_eq!(srv.metric("relay_sessions"), SESSIONS as u64 + 1);

    // The parked poll is still parked, and its session answers it.
    assert!(poll.is_silent_for(std::time::Duration::from_millis(100)));
    srv.prompt("res-parked", "wake", Some("w1"));
    let woke = poll.read_response();
    assert_eq!(woke.status, 200, "{}", woke.text());
    assert_eq!(woke.json()[0]["client_msg_id"], "w1");
    srv.respond("res-parked", "w1", "done");

    // A subscriber that saw seq 2 of session 0 resumes with its cursor
    // and epoch: the rest of the answers, no resync.
    let s0 = sid(0);
    let loads = srv.metric("relay_session_loads_total");
    let mut ws = srv.ws(&format!("/ws/{s0}?after=2&epoch={}", epochs[&s0]));
    let f = ws.recv_json_skip_pings();
    assert_eq!(f["type"], "message", "no resync: {f}");
    assert_eq!(f["data"]["seq"], 4);
    drop(ws);
    assert!(srv.metric("relay_session_loads_total") > loads);

    // Every session read back: all that was acknowledged, in order.
    for i in 0..SESSIONS {
        let s = sid(i);
        let msgs = all_messages(&srv, &s);
        assert_eq!(contents(&msgs), acked[&s], "{s}");
        let info = srv.get(&format!("/sessions/{s}")).json();
        assert_eq!(info["epoch"], epochs[&s], "{s}: the same epoch");
    }
    assert!(srv.metric("relay_session_loads_total") >= SESSIONS as u64 / 2);
    assert!(srv.metric("relay_sessions_resident") < SESSIONS as u64 / 2);
    // A resend is still a duplicate, and seq goes on.
    let s5 = sid(5);
    assert_eq!(
        srv.prompt(&s5, &format!("0{big}"), Some("p0"))["duplicate"],
        true
    );
    srv.prompt(&s5, "after", Some("later"));
    let last = srv.messages(&s5, &format!("?after={}", 2 * PAIRS));
    assert_eq!(last["messages"][0]["data"]["seq"], 2 * PAIRS as u64 + 1);
    acked
        .get_mut(&s5)
        .unwrap()
        .push(("prompt".into(), "later".into(), "after".into()));

    // A restart reads no session before it answers, and then only the
    // one with a pending prompt: the first request is answered, then
    // everything is there.
    srv.kill9();
    let srv = start(&dir);
    let health = srv.get("/healthz");
    assert_eq!(health.status, 200);
    // Only the session with a pending prompt is read at start.
    assert!(srv.metric("relay_sessions_resident") <= 1);
    for i in 0..SESSIONS {
        let s = sid(i);
        assert_eq!(contents(&all_messages(&srv, &s)), acked[&s], "{s}");
    }
    assert_eq!(srv.pending(&s5).len(), 1, "the prompt left pending");
    let every = srv.get("/prompts?wait=false");
    assert_eq!(every.status, 200, "{}", every.text());
    assert_eq!(every.json().as_array().map(Vec::len), Some(1));
    let gone = srv.get("/messages/res-nobody");
    assert_eq!(gone.status, 404);
}

/// Pending prompts hold their sessions in memory (every session's pending
/// prompts are listed from it). When they alone fill the budget, new
/// writes are refused, but the answers and cancels that end those
/// prompts are taken: they are what lets the sessions leave memory, and
/// then new writes are taken again.
#[test]
fn answers_to_pending_prompts_are_taken_when_pending_prompts_fill_the_budget() {
    if skip_with_redis("a data directory of its own") {
        return;
    }
    let dir = Dir::new("resident-pending");
    let srv = start(&dir);
    let text = "h".repeat(8_000);
    let prompt = |sid: &str| {
        srv.post_json(
            "/prompt",
            &json!({"session_id": sid, "client_msg_id": "p", "prompt": text}),
        )
    };
    let mut held = Vec::new();
    let refused = loop {
        assert!(
            held.len() < 1_000,
            "8 MB of pending prompts never reached the budget"
        );
        let sid = format!("held-{}", held.len());
        let resp = prompt(&sid);
        match resp.status {
            200 => held.push(sid),
            503 => break resp,
            s => panic!("unexpected {s}: {}", resp.text()),
        }
    };
    assert_eq!(
        refused.json(),
        json!({"error": "Service Unavailable", "details": "memory budget reached"})
    );
    // Every pending prompt is answered or cancelled, though the budget is
    // passed.
    for (i, sid) in held.iter().enumerate() {
        let resp = if i % 2 == 0 {
            srv.post_json(
                "/response",
                &json!({"session_id": sid, "client_msg_id": "p", "text": "done"}),
            )
        } else {
            srv.post_json("/cancel", &json!({"session_id": sid, "client_msg_id": "p"}))
        };
        assert_eq!(resp.status, 200, "{sid}: {}", resp.text());
    }
    // Their sessions leave memory, and a new write is taken again (once
    // the next eviction pass runs).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let resp = prompt("after-the-answers");
        if resp.status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "writes still refused after every pending prompt ended: {}",
            resp.text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(srv.metric("relay_session_evictions_total") > 0);
    let msgs = all_messages(&srv, &held[0]);
    assert_eq!(msgs.len(), 2, "{}: the prompt and its answer", held[0]);
}

/// Rows the log holds before a transaction lists them in `session_rows`
/// (`TAIL_ROWS` in `src/store/sqlite/rows.rs`); the test writes past it.
const TAIL_ROWS: usize = 4096;

/// Prompts to `sids` in turn, each answered, sent pipelined a batch at a
/// time on one connection; every answer must be a 200.
fn pipelined_pairs(srv: &Server, sids: &[String], pairs: usize, text: &str, tag: &str) {
    let mut http = srv.conn();
    let request = |path: &str, body: Value| {
        let body = body.to_string();
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    for start in (0..pairs).step_by(100) {
        let end = (start + 100).min(pairs);
        let mut batch = String::new();
        for j in start..end {
            let (sid, cid) = (&sids[j % sids.len()], format!("{tag}{j}"));
            batch += &request(
                "/prompt",
                json!({"session_id": sid, "client_msg_id": cid, "prompt": text}),
            );
            batch += &request(
                "/response",
                json!({"session_id": sid, "client_msg_id": cid, "text": "a"}),
            );
        }
        http.send_raw(batch.as_bytes());
        for _ in start..end {
            for _ in 0..2 {
                let r = http.read_response();
                assert_eq!(r.status, 200, "{}", r.text());
            }
        }
    }
}

/// The file's rowids of a session's rows, and the newest row its index
/// lists (`generation.indexed`), read beside the running server.
fn straddle(dir: &Dir, sid: &str) -> (Vec<i64>, i64) {
    let conn = rusqlite::Connection::open(dir.0.join("relay.db")).unwrap();
    let rows = conn
        .prepare(
            "SELECT m.id FROM messages m JOIN sessions s ON s.id = m.session
             WHERE s.name = ?1 ORDER BY m.id",
        )
        .unwrap()
        .query_map([sid], |r| r.get(0))
        .unwrap()
        .collect::<Result<Vec<i64>, _>>()
        .unwrap();
    let indexed = conn
        .query_row("SELECT indexed FROM generation", [], |r| r.get(0))
        .unwrap();
    (rows, indexed)
}

#[test]
fn a_session_whose_rows_straddle_the_index_and_the_tail_is_read_back_whole() {
    if skip_with_redis("a data directory of its own") {
        return;
    }
    let dir = Dir::new("resident-tail");
    let mut srv = start(&dir);
    let sid = "straddle";
    let mut acked = Vec::new();
    let pair = |srv: &Server, i: usize, acked: &mut Vec<(String, String, String)>| {
        let (cid, text) = (format!("s{i}"), format!("question {i}"));
        srv.prompt(sid, &text, Some(&cid));
        srv.respond(sid, &cid, &format!("answer {i}"));
        acked.push(("prompt".into(), cid.clone(), text));
        acked.push(("assistant".into(), cid, format!("answer {i}")));
    };
    for i in 0..3 {
        pair(&srv, i, &mut acked);
    }
    // More rows than the tail holds, in other sessions: a transaction
    // lists the session's first rows in the index.
    let fillers: Vec<String> = (0..60).map(|i| format!("filler-{i}")).collect();
    let text = "f".repeat(400);
    pipelined_pairs(&srv, &fillers, TAIL_ROWS / 2 + 50, &text, "f");
    for i in 3..6 {
        pair(&srv, i, &mut acked);
    }
    let (rows, indexed) = straddle(&dir, sid);
    assert_eq!(rows.len(), 12);
    assert!(
        rows[0] <= indexed && indexed < rows[11],
        "rows {rows:?}, indexed up to {indexed}: not both sides"
    );
    // Other sessions written after it push it out of memory.
    pipelined_pairs(&srv, &fillers, 600, &text, "g");
    let loads = srv.metric("relay_session_loads_total");
    let msgs = all_messages(&srv, sid);
    assert_eq!(contents(&msgs), acked, "read back whole and in order");
    assert!(
        srv.metric("relay_session_loads_total") > loads,
        "the session was still in memory"
    );
    // The storage thread reads it back too: a resend is a duplicate, seq
    // goes on.
    assert_eq!(srv.prompt(sid, "question 5", Some("s5"))["duplicate"], true);
    pair(&srv, 6, &mut acked);
    assert_eq!(
        srv.messages(sid, "?after=12")["messages"][0]["data"]["seq"],
        13
    );
    // A restart reads the tail from the file.
    srv.kill9();
    let srv = start(&dir);
    assert_eq!(contents(&all_messages(&srv, sid)), acked, "after a restart");
}
