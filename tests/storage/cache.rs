//! The storage thread holds only the sessions it needs: with a small
//! `RELAY_MAX_MEMORY` its cache (what the loop's copy leaves of it, at
//! least a quarter) holds a few of many sessions, and a write for one it dropped is decided as before (the
//! session read back from the file): resends are duplicates with the
//! stored `seq`, `seq` goes on, the session cap counts every session;
//! the same after a restart.

use crate::common::*;
use serde_json::{Value, json};

const SESSIONS: usize = 60;
const PROMPTS: usize = 5;

fn start(dir: &Dir) -> Server {
    Server::start_single_with(&[
        ("RELAY_DATA_DIR", dir.path()),
        ("RELAY_MAX_MEMORY", "1M"),
        ("RELAY_MAX_SESSIONS", "61"),
    ])
}

/// 60 sessions of 2 KiB prompts: over 600 KiB, more than twice the
/// thread's share of a 1 MiB budget.
fn prompt_text(p: usize) -> String {
    format!("text {p} {}", "c".repeat(2048))
}

#[track_caller]
fn assert_at_cap(resp: &Response) {
    assert_error(resp, 503, "Service unavailable");
    assert_eq!(resp.json()["details"], "session limit reached");
}

#[track_caller]
fn post(srv: &Server, path: &str, body: &Value) -> Value {
    let resp = srv.post_json(path, body);
    assert_eq!(resp.status, 200, "POST {path}: {}", resp.text());
    resp.json()
}

/// Every session as written: prompts `p0..`, the first answered (`a0`),
/// the second cancelled, the others answered after (so nothing holds a
/// session in the loop's copy, which drops them too), so `seq` runs
/// 1..=2 * PROMPTS.
#[track_caller]
fn check_sessions(srv: &Server, sids: &[String]) {
    for sid in sids {
        let page = srv.messages(sid, "?limit=100");
        assert_eq!(page["total"], 2 * PROMPTS, "{sid}: {page}");
        let seqs: Vec<u64> = page["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["data"]["seq"].as_u64().expect("seq"))
            .collect();
        assert_eq!(
            seqs,
            (1..=(2 * PROMPTS) as u64).collect::<Vec<_>>(),
            "{sid}"
        );
        assert!(srv.pending(sid).is_empty(), "{sid}");
    }
}

/// Resends to the first session, long dropped from the thread's cache by
/// the writes to the others: each a duplicate (the cancel with its stored
/// `seq`), nothing stored; a new prompt takes the next `seq`.
#[track_caller]
fn resend_to_the_first(srv: &Server, sid: &str, next_seq: u64, cancel_seq: u64) {
    let prompt = json!({"session_id": sid, "client_msg_id": "p3", "prompt": prompt_text(3)});
    assert_eq!(post(srv, "/prompt", &prompt)["duplicate"], true);
    let answer = json!({"session_id": sid, "client_msg_id": "p0",
        "assistant_msg_id": "a0", "text": "answer"});
    assert_eq!(post(srv, "/response", &answer)["duplicate"], true);
    let cancel = json!({"session_id": sid, "client_msg_id": "p1"});
    let again = post(srv, "/cancel", &cancel);
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["seq"], cancel_seq);
    let other = json!({"session_id": sid, "client_msg_id": "p3", "prompt": "another"});
    assert_eq!(srv.post_json("/prompt", &other).status, 409);
    let new = json!({"session_id": sid, "client_msg_id": format!("n{next_seq}"), "prompt": "new"});
    post(srv, "/prompt", &new);
    let page = srv.messages(sid, &format!("?after={}", next_seq - 1));
    assert_eq!(page["messages"][0]["data"]["seq"], next_seq, "{page}");
    assert_eq!(page["messages"].as_array().map(Vec::len), Some(1));
}

#[test]
fn sessions_the_storage_thread_dropped_are_decided_as_before_and_survive_a_restart() {
    let dir = Dir::new("cache");
    let srv = start(&dir);
    let tag = unique_session();
    let sids: Vec<String> = (0..SESSIONS).map(|i| format!("{tag}-{i}")).collect();
    let mut cancel_seq = 0;
    for sid in &sids {
        for p in 0..PROMPTS {
            let body = json!({"session_id": sid, "client_msg_id": format!("p{p}"),
                "prompt": prompt_text(p)});
            post(&srv, "/prompt", &body);
        }
        let answer = json!({"session_id": sid, "client_msg_id": "p0",
            "assistant_msg_id": "a0", "text": "answer"});
        post(&srv, "/response", &answer);
        let cancel = json!({"session_id": sid, "client_msg_id": "p1"});
        cancel_seq = post(&srv, "/cancel", &cancel)["seq"].as_u64().expect("seq");
        for p in 2..PROMPTS {
            let answer = json!({"session_id": sid, "client_msg_id": format!("p{p}"),
                "assistant_msg_id": format!("a{p}"), "text": "answer"});
            post(&srv, "/response", &answer);
        }
    }
    assert_eq!(cancel_seq, PROMPTS as u64 + 2);
    check_sessions(&srv, &sids);
    // The cap counts every session in the file: 61 allowed, 60 there.
    post(
        &srv,
        "/prompt",
        &json!({"session_id": format!("{tag}-extra"), "prompt": "x"}),
    );
    let over = srv.post_json(
        "/prompt",
        &json!({"session_id": format!("{tag}-over"), "prompt": "x"}),
    );
    assert_at_cap(&over);
    resend_to_the_first(&srv, &sids[0], 2 * PROMPTS as u64 + 1, cancel_seq);
    drop(srv);

    let srv = start(&dir);
    check_sessions(&srv, &sids[1..]);
    resend_to_the_first(&srv, &sids[1], 2 * PROMPTS as u64 + 1, cancel_seq);
    resend_to_the_first(&srv, &sids[0], 2 * PROMPTS as u64 + 2, cancel_seq);
    let over = srv.post_json(
        "/prompt",
        &json!({"session_id": format!("{tag}-over"), "prompt": "x"}),
    );
    assert_at_cap(&over);
    // A deleted session leaves room, and takes its rows with it.
    assert_eq!(srv.delete(&format!("/sessions/{}", sids[2])).status, 200);
    post(
        &srv,
        "/prompt",
        &json!({"session_id": format!("{tag}-over"), "prompt": "x"}),
    );
    let db = rusqlite::Connection::open(dir.0.join("relay.db")).expect("db");
    let orphans: i64 = db
        .query_row(
            "SELECT count(*) FROM messages WHERE session NOT IN (SELECT id FROM sessions)",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(orphans, 0);
}
