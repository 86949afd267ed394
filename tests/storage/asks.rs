//! Asks and replies with a data directory: what the log knows of them
//! survives `kill -9` (an open ask, one answered, one open below history
//! whose row is kept as a pending prompt's is), and a database of schema
//! version 4, which held no asks, is migrated and takes them.

use crate::common::*;
use serde_json::{Value, json};

fn start(dir: &Dir, history: &str) -> Server {
    Server::start_with(&[
        ("RELAY_DATA_DIR", dir.path()),
        ("RELAY_HISTORY_LIMIT", history),
    ])
}

#[track_caller]
fn post(srv: &Server, path: &str, body: Value) -> Value {
    let resp = srv.post_json(path, &body);
    assert_eq!(resp.status, 200, "POST {path}: {}", resp.text());
    resp.json()
}

#[track_caller]
fn state(srv: &Server, sid: &str, ask: &str) -> Value {
    let resp = srv.get(&format!("/asks/{sid}/{ask}?wait=false"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    resp.json()
}

#[test]
fn asks_and_replies_survive_kill_9() {
    let dir = Dir::new("asks");
    let mut srv = start(&dir, "3");
    let sid = unique_session();
    srv.put(&format!("/sessions/{sid}"));
    let k1 = post(
        &srv,
        "/ask",
        json!({"session_id": sid, "ask_id": "k1", "text": "one?", "choices": ["a", "b"]}),
    );
    post(
        &srv,
        "/ask",
        json!({"session_id": sid, "ask_id": "k2", "text": "two?"}),
    );
    post(
        &srv,
        "/reply",
        json!({"session_id": sid, "ask_id": "k2", "text": "done"}),
    );
    // Three prompts push both asks out of a history of three: k1 is open
    // and kept, k2 is answered and forgotten.
    for n in 0..3 {
        srv.prompt(&sid, "p", Some(&format!("c{n}")));
    }
    let before = srv.messages(&sid, "?limit=100");
    srv.kill9();
    let srv = start(&dir, "3");
    assert_eq!(srv.messages(&sid, "?limit=100"), before);
    assert_eq!(
        state(&srv, &sid, "k1"),
        json!({"ask_id": "k1", "state": "open"})
    );
    assert_eq!(
        srv.get(&format!("/asks/{sid}/k2")).status,
        404,
        "answered, below history"
    );
    let again = post(
        &srv,
        "/ask",
        json!({"session_id": sid, "ask_id": "k1", "text": "one?", "choices": ["a", "b"]}),
    );
    assert_eq!(
        (again["duplicate"].clone(), again["seq"].clone()),
        (json!(true), k1["seq"].clone())
    );
    assert_eq!(again["expires_ts"], k1["expires_ts"]);
    let bad = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k1", "text": "c"}),
    );
    assert_eq!(bad.status, 400, "its choices were kept: {}", bad.text());
    let reply = post(
        &srv,
        "/reply",
        json!({"session_id": sid, "ask_id": "k1", "text": "b"}),
    );
    assert_eq!(reply["seq"], 7);
    // The reply stored after the restart survives the next one.
    let mut srv = srv;
    let ask3 = post(
        &srv,
        "/ask",
        json!({"session_id": sid, "ask_id": "k3", "text": "three?"}),
    );
    post(
        &srv,
        "/reply",
        json!({"session_id": sid, "ask_id": "k3", "text": "yes"}),
    );
    srv.kill9();
    let srv = start(&dir, "3");
    assert_eq!(
        state(&srv, &sid, "k3"),
        json!({"ask_id": "k3", "state": "answered", "text": "yes"})
    );
    let dup = srv.post_json(
        "/reply",
        &json!({"session_id": sid, "ask_id": "k3", "text": "yes"}),
    );
    assert_eq!(
        dup.json(),
        json!({"ok": true, "seq": ask3["seq"].as_u64().unwrap() + 1, "duplicate": true})
    );
}

#[test]
fn a_fourth_version_database_is_migrated_and_takes_asks() {
    let dir = Dir::new("v4");
    std::fs::create_dir_all(&dir.0).unwrap();
    let db = dir.0.join("relay.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE sessions (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE,
                epoch TEXT NOT NULL, next_seq INTEGER NOT NULL, last_assistant INTEGER NOT NULL,
                dropped_assistant INTEGER NOT NULL);
            CREATE TABLE messages (id INTEGER PRIMARY KEY, session INTEGER NOT NULL,
                seq INTEGER NOT NULL, kind INTEGER NOT NULL, client_msg_id TEXT NOT NULL,
                assistant_msg_id TEXT, ts INTEGER NOT NULL, data TEXT NOT NULL);
            CREATE TABLE generation (n INTEGER NOT NULL);
            INSERT INTO generation VALUES (0);
            INSERT INTO sessions VALUES (1, 'four', 'epoch-v4', 2, 0, 0);
            INSERT INTO messages VALUES (1, 1, 1, 0, 'p1', NULL, 5,
                '{\"session_id\":\"four\",\"client_msg_id\":\"p1\",\"prompt\":\"hi\",\"ts\":5,\"seq\":1}');
            PRAGMA user_version = 4;",
        )
        .unwrap();
    let srv = Server::start_with(&[("RELAY_DATA_DIR", dir.path())]);
    assert_eq!(srv.pending("four")[0]["prompt"], "hi");
    let ack = post(
        &srv,
        "/ask",
        json!({"session_id": "four", "client_msg_id": "p1", "text": "sure?"}),
    );
    assert_eq!(ack["seq"], 2);
    let version: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, 9);
    let kinds: Vec<i64> = rusqlite::Connection::open(&db)
        .unwrap()
        .prepare("SELECT kind FROM messages ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(kinds, [0, 3], "an ask is a row of its own kind");
}
