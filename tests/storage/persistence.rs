//! Persistence on one machine (`RELAY_DATA_DIR`), against the real binary
//! and real files: what was acknowledged survives `kill -9` (counted, with
//! several clients writing prompts, answers, cancels, asks and replies
//! while the server is killed at random moments), a resuming client gets
//! no resync, a second server and a damaged or newer database are
//! refused, a first-version database is migrated (and one from before
//! cancels), a cancel is kept like any message, and a disk that fails
//! answers 503 without showing what failed.

use crate::common;

use crate::common::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn start(dir: &Dir) -> Server {
    Server::start_with(&[("RELAY_DATA_DIR", dir.path())])
}

#[track_caller]
fn epoch(srv: &Server, sid: &str) -> String {
    srv.put(&format!("/sessions/{sid}")).json()["epoch"]
        .as_str()
        .expect("epoch")
        .to_string()
}

/// `relay.db` in a fresh `dir`, written by `sql` (a database as an older
/// or newer relay left it); returns its path.
fn database(dir: &Dir, sql: &str) -> PathBuf {
    std::fs::create_dir_all(&dir.0).unwrap();
    let db = dir.0.join("relay.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
    db
}

fn user_version(db: &Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// The tables of schema version 1, as the first persistent relay wrote
/// them (version 2 added `sessions.dropped_assistant`).
const V1_TABLES: &str = "
    CREATE TABLE sessions (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE,
        epoch TEXT NOT NULL, next_seq INTEGER NOT NULL, first_seq INTEGER NOT NULL,
        last_assistant INTEGER NOT NULL, pending INTEGER NOT NULL);
    CREATE TABLE messages (session INTEGER NOT NULL, seq INTEGER NOT NULL,
        kind INTEGER NOT NULL, client_msg_id TEXT NOT NULL, assistant_msg_id TEXT,
        ts INTEGER NOT NULL, in_history INTEGER NOT NULL, answered INTEGER NOT NULL,
        data TEXT NOT NULL, PRIMARY KEY (session, seq)) WITHOUT ROWID;
    CREATE UNIQUE INDEX prompt_ids ON messages (session, client_msg_id) WHERE kind = 0;
    CREATE UNIQUE INDEX answer_ids ON messages (session, assistant_msg_id) WHERE kind = 1;";

#[test]
fn everything_acknowledged_survives_kill_9_with_its_epoch_and_seq() {
    let dir = Dir::new("restart");
    let mut srv = start(&dir);
    let sid = unique_session();
    for i in 0..5 {
        srv.prompt(&sid, &format!("q{i}"), Some(&format!("c{i}")));
    }
    for i in 0..3 {
        srv.respond(&sid, &format!("c{i}"), &format!("a{i}"));
    }
    let before = srv.messages(&sid, "?limit=1000");
    let epoch_before = epoch(&srv, &sid);
    srv.kill9();
    let srv = start(&dir);
    assert_eq!(
        srv.messages(&sid, "?limit=1000"),
        before,
        "/messages is identical"
    );
    assert_eq!(epoch(&srv, &sid), epoch_before, "same epoch");
    let pending: Vec<String> = srv
        .pending(&sid)
        .iter()
        .map(|p| p["client_msg_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pending, ["c3", "c4"], "pending prompts are still pending");
    assert_eq!(srv.prompt(&sid, "q1", Some("c1"))["duplicate"], true);
    let next = srv.prompt(&sid, "next", Some("c9"));
    assert_eq!(next["stored"], true);
    let last = srv.messages(&sid, "?after=8");
    assert_eq!(
        last["messages"][0]["data"]["seq"], 9,
        "seq continues: {last}"
    );
    // A subscriber resuming with after and epoch gets no resync.
    let mut ws = srv.ws(&format!("/ws/{sid}?after=6&epoch={epoch_before}"));
    let f = ws.recv_json_skip_pings();
    assert_eq!(f["type"], "message", "{f}");
    assert_eq!(f["data"]["seq"], 7, "the answers after seq 6: 7 and 8");
}

/// What the writers were told: every acknowledged prompt, answer and
/// cancel, and every cancel refused.
#[derive(Default)]
struct Acked {
    prompts: BTreeSet<String>,
    answers: BTreeMap<String, String>, // assistant id -> prompt id
    /// Acknowledged prompts no answer or cancel was ever posted for:
    /// pending for good, however far history moves past them.
    unanswered: BTreeSet<String>,
    /// Acknowledged cancels: prompt id -> the cancel's `seq`.
    cancels: BTreeMap<String, u64>,
    /// Cancels answered with an error: never stored.
    refused_cancels: BTreeSet<String>,
    /// Cancels the kill cut off before their answer: stored or not.
    unknown_cancels: BTreeSet<String>,
    /// Acknowledged asks and replies: ask id -> `seq`.
    asks: BTreeMap<String, u64>,
    replies: BTreeMap<String, u64>,
    /// Acknowledged asks no reply was ever posted to: open for good.
    open_asks: BTreeSet<String>,
    /// Asks and replies (by ask id) answered with an error: never stored.
    refused_asks: BTreeSet<String>,
    refused_replies: BTreeSet<String>,
}

impl Acked {
    fn merge(&mut self, other: Acked) {
        self.prompts.extend(other.prompts);
        self.answers.extend(other.answers);
        self.unanswered.extend(other.unanswered);
        self.cancels.extend(other.cancels);
        self.refused_cancels.extend(other.refused_cancels);
        self.unknown_cancels.extend(other.unknown_cancels);
        self.asks.extend(other.asks);
        self.replies.extend(other.replies);
        self.open_asks.extend(other.open_asks);
        self.refused_asks.extend(other.refused_asks);
        self.refused_replies.extend(other.refused_replies);
    }
}

/// One `POST` on a fresh connection; the status, or `None` when the
/// server is gone (killed) before answering.
fn try_post(addr: std::net::SocketAddr, path: &str, body: &Value) -> Option<u16> {
    try_request(addr, path, body).map(|(status, _)| status)
}

/// [`try_post`] with the answer's JSON body (`Null` when it has none).
fn try_request(addr: std::net::SocketAddr, path: &str, body: &Value) -> Option<(u16, Value)> {
    use std::io::{Read, Write};
    let s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut s = common::Stream::try_over(s).ok()?;
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut got = Vec::new();
    s.read_to_end(&mut got).ok()?;
    let text = String::from_utf8_lossy(&got);
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    Some((status, body))
}

/// A client that posts prompts to `sid` until `stop`, and answers every
/// second one and cancels every fourth; of the others, every second gets
/// an ask from the agent, and every second ask a reply. Counts only what
/// got a 200; failures (the server was killed) are expected.
fn writer(addr: std::net::SocketAddr, sid: String, tag: usize, stop: Arc<AtomicBool>) -> Acked {
    let mut acked = Acked::default();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let cid = format!("w{tag}-{n}");
        let p = json!({"session_id": sid, "prompt": "q", "client_msg_id": cid});
        if try_post(addr, "/prompt", &p) != Some(200) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        acked.prompts.insert(cid.clone());
        if n % 4 == 1 {
            let c = json!({"session_id": sid, "client_msg_id": cid});
            match try_request(addr, "/cancel", &c) {
                Some((200, ack)) => {
                    assert_eq!(ack["duplicate"], Value::Null, "a first cancel: {ack}");
                    let seq = ack["seq"].as_u64().expect("a cancel's seq");
                    acked.cancels.insert(cid, seq);
                }
                Some(_) => {
                    acked.refused_cancels.insert(cid);
                }
                None => {
                    acked.unknown_cancels.insert(cid);
                }
            }
        } else if n % 2 == 1 {
            acked.unanswered.insert(cid.clone());
            if n % 8 == 3 {
                ask_and_reply(addr, &sid, &cid, n % 16 == 3, &mut acked);
            }
        } else {
            let aid = format!("a-{cid}");
            let a = json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": aid, "text": "t"});
            if try_post(addr, "/response", &a) == Some(200) {
                acked.answers.insert(aid, cid);
            }
        }
    }
    acked
}

/// The agent asks about prompt `cid` (ask id `k-<cid>`) and, when
/// `reply`, the person replies `yes`; what was acknowledged or refused
/// goes into `acked`.
fn ask_and_reply(addr: std::net::SocketAddr, sid: &str, cid: &str, reply: bool, acked: &mut Acked) {
    let kid = format!("k-{cid}");
    let ask = json!({"session_id": sid, "ask_id": kid, "client_msg_id": cid, "text": "go?"});
    match try_request(addr, "/ask", &ask) {
        Some((200, ack)) => {
            acked
                .asks
                .insert(kid.clone(), ack["seq"].as_u64().expect("an ask's seq"));
            if !reply {
                acked.open_asks.insert(kid.clone());
            }
        }
        Some(_) => {
            acked.refused_asks.insert(kid);
            return;
        }
        None => return,
    }
    if !reply {
        return;
    }
    let r = json!({"session_id": sid, "ask_id": kid, "text": "yes"});
    match try_request(addr, "/reply", &r) {
        Some((200, ack)) => {
            acked
                .replies
                .insert(kid, ack["seq"].as_u64().expect("a reply's seq"));
        }
        Some(_) => {
            acked.refused_replies.insert(kid);
        }
        None => {}
    }
}

/// Every acknowledged ask and reply still in history is there with its
/// `seq` (`limit`: history is trimmed; else every one must be), no refused
/// one is, an ask never replied to is open (below history too), and one
/// replied to is answered with its reply while it is in history, and
/// refuses another.
#[track_caller]
fn check_asks(srv: &Server, sid: &str, msgs: &[Value], acked: &Acked, limit: Option<usize>) {
    let first = msgs
        .first()
        .map_or(1, |m| m["data"]["seq"].as_u64().unwrap());
    for (kind, acks, refused) in [
        ("ask", &acked.asks, &acked.refused_asks),
        ("reply", &acked.replies, &acked.refused_replies),
    ] {
        let stored: BTreeMap<String, u64> = msgs
            .iter()
            .filter(|m| m["type"] == kind)
            .map(|m| {
                let d = &m["data"];
                (
                    d["ask_id"].as_str().unwrap().to_string(),
                    d["seq"].as_u64().unwrap(),
                )
            })
            .collect();
        for (k, seq) in acks {
            match stored.get(k) {
                Some(got) => assert_eq!(got, seq, "the {kind} {k} moved"),
                None => assert!(
                    limit.is_some() && *seq < first,
                    "acknowledged {kind} {k} (seq {seq}) lost"
                ),
            }
        }
        for k in refused {
            assert!(!stored.contains_key(k), "refused {kind} {k} stored");
        }
    }
    let state = |k: &str| srv.get(&format!("/asks/{sid}/{k}?wait=false"));
    for k in &acked.open_asks {
        let got = state(k);
        assert_eq!(got.status, 200, "open ask {k}: {}", got.text());
        assert_eq!(got.json()["state"], "open", "ask {k}");
    }
    for k in acked.replies.keys() {
        if acked.asks.get(k).is_some_and(|seq| *seq < first) {
            continue; // answered and below history: forgotten
        }
        let got = state(k).json();
        assert_eq!(
            (&got["state"], &got["text"]),
            (&json!("answered"), &json!("yes")),
            "{k}"
        );
        let other = json!({"session_id": sid, "ask_id": k, "text": "no"});
        let r = srv.post_json("/reply", &other);
        assert_eq!(r.status, 409, "a second reply to {k}: {}", r.text());
        assert_eq!(r.json()["details"], "ask already answered");
    }
}

/// Every message of a session, page by page.
fn all_messages(srv: &Server, sid: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let page = srv.messages(sid, &format!("?limit=1000&offset={}", out.len()));
        let msgs = page["messages"].as_array().expect("messages").clone();
        if msgs.is_empty() {
            return out;
        }
        out.extend(msgs);
    }
}

/// The `seq` of every message, asserting they run without a hole or a
/// repeat.
#[track_caller]
fn contiguous_seqs(msgs: &[Value]) -> Vec<u64> {
    let seqs: Vec<u64> = msgs
        .iter()
        .map(|m| m["data"]["seq"].as_u64().unwrap())
        .collect();
    let first = seqs.first().copied().unwrap_or(1);
    let want: Vec<u64> = (first..first + seqs.len() as u64).collect();
    assert_eq!(seqs, want, "seq has holes or repeats");
    seqs
}

/// The `field` of every message of type `kind`.
fn field_of(msgs: &[Value], kind: &str, field: &str) -> BTreeSet<String> {
    msgs.iter()
        .filter(|m| m["type"] == kind)
        .map(|m| m["data"][field].as_str().unwrap().to_string())
        .collect()
}

/// The ids of the session's pending prompts.
#[track_caller]
fn pending_set(srv: &Server, sid: &str) -> BTreeSet<String> {
    client_msg_ids(&srv.pending(sid)).into_iter().collect()
}

/// The epoch is the one from before, and `resend` (an acknowledged prompt
/// still in the dedupe window) is a duplicate.
#[track_caller]
fn check_epoch_and_resend(srv: &Server, sid: &str, epoch_before: &str, resend: Option<&String>) {
    assert_eq!(epoch(srv, sid), epoch_before, "epoch changed");
    if let Some(p) = resend {
        let again = srv.prompt(sid, "q", Some(p));
        assert_eq!(again["duplicate"], true, "resent {p} is not a duplicate");
    }
}

/// Checks a session after a restart against what was acknowledged.
#[track_caller]
fn check(srv: &Server, sid: &str, acked: &Acked, epoch_before: &str) {
    let msgs = all_messages(srv, sid);
    contiguous_seqs(&msgs);
    let prompts = field_of(&msgs, "prompt", "client_msg_id");
    let answers = field_of(&msgs, "assistant", "assistant_msg_id");
    for p in &acked.prompts {
        assert!(prompts.contains(p), "acknowledged prompt {p} lost");
    }
    for a in acked.answers.keys() {
        assert!(answers.contains(a), "acknowledged answer {a} lost");
    }
    let answered = field_of(&msgs, "assistant", "client_msg_id");
    let cancelled = field_of(&msgs, "cancel", "client_msg_id");
    let want_pending: BTreeSet<String> = prompts
        .difference(&answered)
        .filter(|p| !cancelled.contains(*p))
        .cloned()
        .collect();
    assert_eq!(pending_set(srv, sid), want_pending, "pending set");
    check_cancels(srv, sid, &msgs, acked, None);
    check_asks(srv, sid, &msgs, acked, None);
    check_epoch_and_resend(srv, sid, epoch_before, acked.prompts.iter().next());
}

/// Every acknowledged cancel still in history is there with its `seq`
/// (`limit`: history is trimmed, so one may have left it; else every one
/// must be there), its prompt is not pending, and an answer to it is
/// refused: `409 prompt cancelled` while the prompt is in history, `404`
/// once both have left it. No cancel that was refused is stored.
#[track_caller]
fn check_cancels(srv: &Server, sid: &str, msgs: &[Value], acked: &Acked, limit: Option<usize>) {
    let stored: BTreeMap<String, u64> = msgs
        .iter()
        .filter(|m| m["type"] == "cancel")
        .map(|m| {
            let d = &m["data"];
            (
                d["client_msg_id"].as_str().unwrap().to_string(),
                d["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    let first = msgs
        .first()
        .map_or(1, |m| m["data"]["seq"].as_u64().unwrap());
    let in_history = field_of(msgs, "prompt", "client_msg_id");
    let pending = pending_set(srv, sid);
    for (p, seq) in &acked.cancels {
        match stored.get(p) {
            Some(got) => assert_eq!(got, seq, "the cancel of {p} moved"),
            None => assert!(
                limit.is_some() && *seq < first,
                "acknowledged cancel of {p} (seq {seq}) lost"
            ),
        }
        assert!(!pending.contains(p), "cancelled prompt {p} is pending");
        let late = json!({"session_id": sid, "client_msg_id": p,
                          "assistant_msg_id": format!("late-{p}"), "text": "late"});
        let r = srv.post_json("/response", &late);
        if in_history.contains(p) {
            assert_eq!(r.status, 409, "an answer to cancelled {p}: {}", r.text());
            assert_eq!(r.json()["details"], "prompt cancelled");
        } else {
            assert_eq!(r.status, 404, "an answer to cancelled {p}: {}", r.text());
        }
    }
    for p in &acked.refused_cancels {
        assert!(!stored.contains_key(p), "refused cancel of {p} stored");
    }
}

/// The crash test's server settings.
fn crash_env<'a>(
    dir: &'a Dir,
    history: Option<&'a str>,
    port: Option<&'a str>,
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("RELAY_DATA_DIR", dir.path())];
    if let Some(limit) = history {
        env.push(("RELAY_HISTORY_LIMIT", limit));
    }
    if let Some(port) = port {
        env.push(("RELAY_PORT", port));
    }
    env
}

/// Checks a session whose history is limited after a restart: history is
/// the newest `limit` messages with no hole in `seq`, every acknowledged
/// message took a `seq` of its own, every acknowledged prompt never
/// answered is still pending (history drops no pending prompt) and still a
/// duplicate, no prompt with an acknowledged answer is, and the epoch holds.
#[track_caller]
fn check_trimmed(srv: &Server, sid: &str, acked: &Acked, epoch_before: &str, limit: &str) {
    let limit: usize = limit.parse().unwrap();
    let seqs = contiguous_seqs(&all_messages(srv, sid));
    let first = seqs.first().copied().unwrap_or(1);
    let last = seqs.last().copied().unwrap_or(0);
    assert!(
        seqs.len() == limit || (first == 1 && seqs.len() < limit),
        "history holds {} messages from seq {first}, limit {limit}",
        seqs.len()
    );
    let stored = acked.prompts.len()
        + acked.answers.len()
        + acked.cancels.len()
        + acked.asks.len()
        + acked.replies.len();
    assert!(
        last >= stored as u64,
        "{stored} acknowledged, last seq {last}"
    );
    let msgs = all_messages(srv, sid);
    check_cancels(srv, sid, &msgs, acked, Some(limit));
    check_asks(srv, sid, &msgs, acked, Some(limit));
    let pending = pending_set(srv, sid);
    for p in &acked.unanswered {
        assert!(pending.contains(p), "acknowledged pending prompt {p} lost");
    }
    for p in acked.answers.values() {
        assert!(!pending.contains(p), "answered prompt {p} is pending");
    }
    check_epoch_and_resend(srv, sid, epoch_before, acked.unanswered.iter().next());
}

/// Several clients write while the server is killed (SIGKILL) at random
/// moments and restarted on the same directory, `rounds` times; with a
/// `history` limit, history moves on and dropped rows are collected while
/// the kills land.
fn crash_rounds(rounds: usize, history: Option<&str>) {
    let dir = Dir::new(&format!("crash{rounds}-{}", history.unwrap_or("all")));
    let mut srv = Server::start_with(&crash_env(&dir, history, None));
    let port_env = srv.addr().port().to_string();
    let sid = unique_session();
    let epoch_before = epoch(&srv, &sid);
    let mut all = Acked::default();
    let mut rng = 0x9e37_79b9_u64 ^ std::process::id() as u64;
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (sid, stop) = (sid.clone(), stop.clone());
                let addr = srv.addr();
                std::thread::spawn(move || writer(addr, sid, round * 10 + w, stop))
            })
            .collect();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let kill_after = Duration::from_millis(50 + rng % 300);
        let t = Instant::now();
        while t.elapsed() < kill_after {
            std::thread::sleep(Duration::from_millis(5));
        }
        srv.kill9();
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            all.merge(w.join().expect("writer"));
        }
        srv = Server::start_with(&crash_env(&dir, history, Some(&port_env)));
        match history {
            None => check(&srv, &sid, &all, &epoch_before),
            Some(limit) => check_trimmed(&srv, &sid, &all, &epoch_before, limit),
        }
    }
    assert!(
        all.prompts.len() > rounds && !all.cancels.is_empty() && !all.replies.is_empty(),
        "too little was written: {} prompts, {} cancels, {} replies",
        all.prompts.len(),
        all.cancels.len(),
        all.replies.len()
    );
    let kept = match history {
        None => "all present".to_string(),
        Some(limit) => format!(
            "history of {limit}, the {} never answered all pending",
            all.unanswered.len()
        ),
    };
    eprintln!(
        "{rounds} kills: {} prompts, {} answers, {} cancels, {} asks ({} left open) and \
         {} replies acknowledged ({} cancels, {} asks, {} replies refused; {} cancels \
         cut off by a kill), {kept}",
        all.prompts.len(),
        all.answers.len(),
        all.cancels.len(),
        all.asks.len(),
        all.open_asks.len(),
        all.replies.len(),
        all.refused_cancels.len(),
        all.refused_asks.len(),
        all.refused_replies.len(),
        all.unknown_cancels.len()
    );
}

/// Five rounds in `cargo test`; `scripts/crash-test.sh` runs twenty
/// (`CRASH_ROUNDS`).
#[test]
fn kill_9_in_the_middle_of_traffic_loses_nothing_acknowledged() {
    let rounds = std::env::var("CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    crash_rounds(rounds, None);
}

/// The same with a history of 50 messages: the kills land while history
/// is trimmed and dropped rows are deleted in batches.
#[test]
fn kill_9_with_a_short_history_loses_no_pending_prompt_and_no_seq() {
    let rounds = std::env::var("CRASH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    crash_rounds(rounds, Some("50"));
}

#[test]
fn a_second_server_on_the_same_directory_refuses_to_start() {
    let dir = Dir::new("second");
    let _first = start(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .env("RELAY_DATA_DIR", dir.path())
        .env("RELAY_PORT", "0")
        .env("RELAY_HOST", "127.0.0.1")
        .output()
        .expect("run relay");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(dir.path()),
        "the message names the directory: {err}"
    );
}

/// Runs the binary on `dir` expecting it to stop at start; returns stderr.
fn refused(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .env("RELAY_DATA_DIR", dir)
        .env("RELAY_PORT", "0")
        .env("RELAY_HOST", "127.0.0.1")
        .output()
        .expect("run relay");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_data_dir_that_is_a_file_says_so() {
    let dir = Dir::new("file");
    std::fs::write(&dir.0, b"not a directory").unwrap();
    let err = refused(&dir.0);
    assert!(err.contains("is a file, not a directory"), "{err}");
    assert_eq!(std::fs::read(&dir.0).unwrap(), b"not a directory");
    std::fs::remove_file(&dir.0).unwrap();
}

#[test]
fn a_damaged_database_stops_the_server_and_is_left_untouched() {
    let dir = Dir::new("corrupt");
    std::fs::create_dir_all(&dir.0).unwrap();
    let db = dir.0.join("relay.db");
    let junk: Vec<u8> = (0..10_000u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&db, &junk).unwrap();
    let err = refused(&dir.0);
    assert!(err.contains("relay.db"), "{err}");
    assert_eq!(std::fs::read(&db).unwrap(), junk, "the file was changed");
}

#[test]
fn a_database_from_a_newer_relay_is_refused() {
    let dir = Dir::new("newer");
    let db = database(
        &dir,
        "CREATE TABLE sessions (id INTEGER); PRAGMA user_version = 99;",
    );
    let before = std::fs::read(&db).unwrap();
    let err = refused(&dir.0);
    assert!(err.contains("newer"), "{err}");
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn a_first_version_database_is_migrated() {
    let dir = Dir::new("v1");
    let db = database(
        &dir,
        &format!(
            "{V1_TABLES}
            INSERT INTO sessions VALUES (1, 'old', 'epoch-v1', 2, 1, 0, 1);
            INSERT INTO messages VALUES (1, 1, 0, 'p1', NULL, 5, 1, 0,
                '{{\"session_id\":\"old\",\"client_msg_id\":\"p1\",\"prompt\":\"hi\",\"ts\":5,\"seq\":1}}');
            PRAGMA user_version = 1;"
        ),
    );
    let srv = start(&dir);
    assert_eq!(epoch(&srv, "old"), "epoch-v1");
    assert_eq!(srv.pending("old")[0]["prompt"], "hi");
    srv.respond("old", "p1", "answered after the migration");
    assert_eq!(user_version(&db), 9);
}

#[test]
fn a_second_version_database_is_migrated_to_the_same_log() {
    let dir = Dir::new("v2");
    let data = |seq: u32, body: &str| {
        format!("'{{\"session_id\":\"two\",{body},\"ts\":5,\"seq\":{seq}}}'")
    };
    // Schema version 2 with a history limit of 3: p1 is pending and out of
    // history, the answer at seq 2 (to a prompt answered and gone) was
    // trimmed, p3 is answered by a3, p5 is pending.
    let db = database(
        &dir,
        &format!(
            "{V1_TABLES}
            ALTER TABLE sessions ADD COLUMN dropped_assistant INTEGER NOT NULL DEFAULT 0;
            INSERT INTO sessions VALUES (1, 'two', 'epoch-v2', 6, 3, 4, 2, 2);
            INSERT INTO messages VALUES (1, 1, 0, 'p1', NULL, 5, 0, 0, {});
            INSERT INTO messages VALUES (1, 3, 0, 'p3', NULL, 5, 1, 1, {});
            INSERT INTO messages VALUES (1, 4, 1, 'p3', 'a3', 5, 1, 1, {});
            INSERT INTO messages VALUES (1, 5, 0, 'p5', NULL, 5, 1, 0, {});
            PRAGMA user_version = 2;",
            data(1, r#""client_msg_id":"p1","prompt":"one""#),
            data(3, r#""client_msg_id":"p3","prompt":"three""#),
            data(
                4,
                r#""assistant_msg_id":"a3","client_msg_id":"p3","text":"four""#
            ),
            data(5, r#""client_msg_id":"p5","prompt":"five""#),
        ),
    );
    let srv = Server::start_with(&[("RELAY_DATA_DIR", dir.path()), ("RELAY_HISTORY_LIMIT", "3")]);
    assert_eq!(epoch(&srv, "two"), "epoch-v2");
    let seqs: Vec<u64> = srv.messages("two", "?limit=100")["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 4, 5], "history as version 2 held it");
    assert_eq!(client_msg_ids(&srv.pending("two")), ["p1", "p5"]);
    // Known ids are still duplicates; the answer's resend too.
    assert_eq!(srv.prompt("two", "three", Some("p3"))["duplicate"], true);
    let resend = json!({"session_id": "two", "client_msg_id": "p3", "text": "four", "assistant_msg_id": "a3"});
    assert_eq!(
        srv.post_json("/response", &resend).json()["duplicate"],
        true
    );
    // seq goes on where it stopped; p1 can still be answered.
    srv.prompt("two", "six", Some("p6"));
    srv.respond("two", "p1", "late");
    let last = srv.messages("two", "?limit=100")["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"]["seq"].as_u64().unwrap())
        .collect::<Vec<_>>();
    assert_eq!(last, [5, 6, 7]);
    assert_eq!(user_version(&db), 9);
}

/// The tables of schema version 4, the last before cancels: the same
/// as today's, without a row of kind 2.
const V4_TABLES: &str = "
    CREATE TABLE sessions (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE,
        epoch TEXT NOT NULL, next_seq INTEGER NOT NULL, last_assistant INTEGER NOT NULL,
        dropped_assistant INTEGER NOT NULL);
    CREATE TABLE messages (id INTEGER PRIMARY KEY, session INTEGER NOT NULL,
        seq INTEGER NOT NULL, kind INTEGER NOT NULL, client_msg_id TEXT NOT NULL,
        assistant_msg_id TEXT, ts INTEGER NOT NULL, data TEXT NOT NULL);
    CREATE TABLE generation (n INTEGER NOT NULL);
    INSERT INTO generation VALUES (0);
";

#[test]
fn a_database_from_before_cancels_is_migrated_and_keeps_them() {
    let dir = Dir::new("v4");
    let db = database(
        &dir,
        &format!(
            "{V4_TABLES}
            INSERT INTO sessions VALUES (1, 'four', 'epoch-v4', 2, 0, 0);
            INSERT INTO messages VALUES (1, 1, 1, 0, 'p1', NULL, 5,
                '{{\"session_id\":\"four\",\"client_msg_id\":\"p1\",\"prompt\":\"hi\",\"ts\":5,\"seq\":1}}');
            PRAGMA user_version = 4;"
        ),
    );
    let mut srv = start(&dir);
    assert_eq!(epoch(&srv, "four"), "epoch-v4");
    assert_eq!(user_version(&db), 9);
    let cancel = json!({"session_id": "four", "client_msg_id": "p1", "reason": "late"});
    let r = srv.post_json("/cancel", &cancel);
    assert_eq!(r.json(), json!({"ok": true, "cancelled": true, "seq": 2}));
    let before = srv.messages("four", "");
    srv.kill9();
    let srv = start(&dir);
    assert_eq!(srv.messages("four", ""), before, "the cancel is kept");
    assert_eq!(before["messages"][1]["type"], "cancel", "{before}");
    assert_eq!(before["messages"][1]["data"]["reason"], "late");
    assert!(srv.pending("four").is_empty());
    let r = srv.post_json("/cancel", &cancel);
    assert_eq!(r.json()["duplicate"], true, "{}", r.text());
    assert_eq!(r.json()["seq"], 2, "{}", r.text());
    let answer = json!({"session_id": "four", "client_msg_id": "p1", "text": "t"});
    let r = srv.post_json("/response", &answer);
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.json()["details"], "prompt cancelled");
}

/// The tables of schema version 8, the last with an index on
/// `messages (session)`.
const V8_TABLES: &str = "
    CREATE TABLE sessions (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL UNIQUE,
        epoch TEXT NOT NULL, next_seq INTEGER NOT NULL, last_assistant INTEGER NOT NULL,
        dropped_assistant INTEGER NOT NULL);
    CREATE TABLE messages (id INTEGER PRIMARY KEY, session INTEGER NOT NULL,
        seq INTEGER NOT NULL, kind INTEGER NOT NULL, client_msg_id TEXT NOT NULL,
        assistant_msg_id TEXT, ts INTEGER NOT NULL, data TEXT NOT NULL);
    CREATE INDEX messages_by_session ON messages (session);
    CREATE TABLE pending (session INTEGER PRIMARY KEY);
    CREATE TABLE generation (n INTEGER NOT NULL, sessions INTEGER NOT NULL);
    INSERT INTO generation VALUES (7, 3);
";

#[test]
fn a_database_of_version_8_is_migrated_with_every_message() {
    let dir = Dir::new("v8");
    // Three sessions written in turn, eight messages each: prompts
    // answered, and c's last prompt pending.
    let names = ["a", "b", "c"];
    let mut sql = V8_TABLES.to_string();
    let mut want: BTreeMap<&str, Vec<(String, String)>> = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        sql += &format!(
            "INSERT INTO sessions VALUES ({}, '{name}', 'epoch-{name}', 1, 0, 0);",
            i + 1
        );
    }
    for seq in 1..=8u64 {
        for (i, &name) in names.iter().enumerate() {
            let cid = format!("p{}", seq.div_ceil(2));
            let (kind, aid, body) = if seq % 2 == 1 {
                (0, "NULL".to_string(), format!(r#""prompt":"{name}{seq}""#))
            } else if name == "c" && seq == 8 {
                continue;
            } else {
                let aid = format!("x{seq}");
                let body = format!(r#""assistant_msg_id":"{aid}","text":"{name}{seq}""#);
                (1, format!("'{aid}'"), body)
            };
            sql += &format!(
                "INSERT INTO messages (session, seq, kind, client_msg_id, assistant_msg_id, ts, data)
                 VALUES ({}, {seq}, {kind}, '{cid}', {aid}, 5,
                 '{{\"session_id\":\"{name}\",\"client_msg_id\":\"{cid}\",{body},\"ts\":5,\"seq\":{seq}}}');",
                i + 1
            );
            want.entry(name)
                .or_default()
                .push((cid, format!("{name}{seq}")));
        }
    }
    sql += "INSERT INTO pending VALUES (3); PRAGMA user_version = 8;";
    let db = database(&dir, &sql);
    // Every session's `(client_msg_id, text)` in order, `seq` without a hole.
    let texts = |srv: &Server, name: &str| -> Vec<(String, String)> {
        let msgs = all_messages(srv, name);
        contiguous_seqs(&msgs);
        msgs.iter()
            .map(|m| {
                let d = &m["data"];
                let text = d["prompt"].as_str().or(d["text"].as_str()).unwrap();
                (
                    d["client_msg_id"].as_str().unwrap().to_string(),
                    text.to_string(),
                )
            })
            .collect()
    };
    let mut srv = start(&dir);
    for name in names {
        assert_eq!(texts(&srv, name), want[name], "{name}");
    }
    assert_eq!(client_msg_ids(&srv.pending("c")), ["p4"]);
    assert_eq!(user_version(&db), 9);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT count(*) FROM session_rows"),
        23,
        "every row listed"
    );
    assert_eq!(
        count("SELECT count(*) FROM sqlite_schema WHERE name = 'messages_by_session'"),
        0,
        "the old index dropped"
    );
    // Written on after the migration, and read again after kill -9.
    srv.respond("c", "p4", "c8");
    want.get_mut("c").unwrap().push(("p4".into(), "c8".into()));
    srv.kill9();
    let srv = start(&dir);
    for name in names {
        assert_eq!(texts(&srv, name), want[name], "{name}");
    }
    assert!(srv.pending("c").is_empty());
}

#[test]
fn a_cancel_survives_kill_9_and_is_replayed() {
    let dir = Dir::new("cancel");
    let env = [("RELAY_DATA_DIR", dir.path()), ("RELAY_HISTORY_LIMIT", "4")];
    let mut srv = Server::start_with(&env);
    let sid = unique_session();
    srv.prompt(&sid, "one", Some("p1"));
    srv.prompt(&sid, "two", Some("p2"));
    let r = srv.post_json(
        "/cancel",
        &json!({"session_id": sid, "client_msg_id": "p1"}),
    );
    assert_eq!(r.json()["seq"], 3, "{}", r.text());
    let before = srv.messages(&sid, "");
    srv.kill9();
    let mut srv = Server::start_with(&env);
    assert_eq!(srv.messages(&sid, ""), before);
    assert_eq!(client_msg_ids(&srv.pending(&sid)), ["p2"]);
    let mut ws = srv.ws(&format!("/ws/{sid}?after=0"));
    let f = ws.recv_json_skip_pings();
    assert_eq!(
        (&f["type"], &f["data"]["seq"]),
        (&json!("cancel"), &json!(3))
    );
    drop(ws);
    // History moves past the cancel and its prompt: their rows go, and
    // what stays restores the same log.
    for i in 3..8 {
        srv.prompt(&sid, &format!("q{i}"), Some(&format!("p{i}")));
    }
    let later = srv.messages(&sid, "");
    srv.kill9();
    let srv = Server::start_with(&env);
    assert_eq!(srv.messages(&sid, ""), later);
    assert_eq!(client_msg_ids(&srv.pending(&sid))[0], "p2");
}

/// Rows in the file's log.
fn rows(dir: &Dir) -> i64 {
    rusqlite::Connection::open(dir.0.join("relay.db"))
        .unwrap()
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn rows_history_dropped_leave_the_file_and_a_restart_restores_the_same_log() {
    let dir = Dir::new("trim");
    let env = [("RELAY_DATA_DIR", dir.path()), ("RELAY_HISTORY_LIMIT", "6")];
    let mut srv = Server::start_with(&env);
    let sid = unique_session();
    let gone = unique_session();
    // A prompt that stays pending while history moves far past it, and a
    // session deleted while its dropped rows still wait for collection.
    srv.prompt(&sid, "early", Some("early"));
    for i in 0..400 {
        srv.prompt(&sid, &format!("q{i}"), Some(&format!("c{i}")));
        srv.respond(&sid, &format!("c{i}"), &format!("a{i}"));
        if (380..390).contains(&i) {
            srv.prompt(&gone, "x", Some(&format!("g{i}")));
            srv.respond(&gone, &format!("g{i}"), "y");
        }
        if i == 395 {
            assert_eq!(srv.delete(&format!("/sessions/{gone}")).status, 200);
        }
    }
    let before = srv.messages(&sid, "?limit=1000");
    let epoch_before = epoch(&srv, &sid);
    srv.kill9();
    // 801 messages were stored: the file keeps history, the pending prompt
    // and at most one batch of rows waiting for collection.
    let kept = rows(&dir);
    assert!(kept <= 6 + 1 + 256 + 2, "{kept} rows in the file");
    // Deleting dropped rows wrote the counters they had set.
    let (next_seq, dropped): (i64, i64) = rusqlite::Connection::open(dir.0.join("relay.db"))
        .unwrap()
        .query_row(
            "SELECT next_seq, dropped_assistant FROM sessions WHERE name = ?1",
            [&sid],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        next_seq > 1 && dropped > 0,
        "counters {next_seq}, {dropped}"
    );
    let srv = Server::start_with(&env);
    assert_eq!(
        srv.messages(&sid, "?limit=1000"),
        before,
        "/messages is identical"
    );
    assert_eq!(epoch(&srv, &sid), epoch_before);
    assert_eq!(client_msg_ids(&srv.pending(&sid)), ["early"]);
    assert_eq!(srv.get(&format!("/messages/{gone}")).status, 404);
    assert_eq!(srv.prompt(&sid, "q399", Some("c399"))["duplicate"], true);
    let resend = json!({"session_id": sid, "client_msg_id": "c399", "text": "a399"});
    assert_eq!(srv.post_json("/response", &resend).status, 200);
    let last = srv.messages(&sid, "?limit=1000")["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["data"]["seq"]
        .as_u64()
        .unwrap();
    assert_eq!(last, 802, "seq goes on after the 801 stored before");
    // The deleted session's rows were not restored into anything.
    srv.respond(&sid, "early", "at last");
    assert!(srv.pending(&sid).is_empty());
}

#[test]
fn a_disk_that_fails_answers_503_shows_nothing_of_it_and_recovers() {
    let dir = Dir::new("full");
    std::fs::create_dir_all(&dir.0).unwrap();
    // File writes past 2 MB fail (EFBIG, with SIGXFSZ ignored), as a full
    // disk would.
    let srv = Server::start_via(
        &[
            "sh",
            "-c",
            "trap '' XFSZ; exec prlimit --fsize=2000000:unlimited \"$0\"",
        ],
        &[("RELAY_DATA_DIR", dir.path())],
    );
    let sid = unique_session();
    srv.prompt(&sid, "before the fault", Some("ok-1"));
    let text = "x".repeat(100_000);
    let mut failed_id = None;
    for i in 0..100 {
        let id = format!("big-{i}");
        let p = json!({"session_id": sid, "prompt": text, "client_msg_id": id});
        let r = srv.post_json("/prompt", &p);
        if r.status == 503 {
            assert_eq!(r.json()["error"], "Storage unavailable");
            failed_id = Some(id);
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let failed_id = failed_id.expect("the size limit was never reached");
    let ready = srv.get("/readyz");
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["reason"], "storage");
    let msgs = srv.messages(&sid, "?limit=1000");
    let ids: Vec<&str> = msgs["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"]["client_msg_id"].as_str().unwrap())
        .collect();
    assert!(
        !ids.contains(&failed_id.as_str()),
        "a failed write is visible"
    );
    assert_eq!(ids[0], "ok-1", "reads still work");
    // The disk has room again.
    let status = Command::new("prlimit")
        .args(["--pid", &srv.pid().to_string(), "--fsize=unlimited"])
        .status()
        .expect("prlimit");
    assert!(status.success());
    let again = srv.prompt(&sid, &text, Some(&failed_id));
    assert_eq!(again["stored"], true);
    assert_eq!(again.get("duplicate"), None, "it was never stored before");
    assert_eq!(srv.get("/readyz").status, 200);
    let _: Value = srv.health();
}

/// The size of a file in the data directory (0 while it does not exist).
fn file_len(dir: &Dir, name: &str) -> u64 {
    std::fs::metadata(dir.0.join(name)).map_or(0, |m| m.len())
}

/// How many times the log started over from its beginning: SQLite adds one
/// to the checkpoint sequence number in its header (bytes 12..16,
/// big-endian) each time it does.
fn wal_restarts(dir: &Dir) -> u32 {
    let head = std::fs::read(dir.0.join("relay.db-wal")).unwrap_or_default();
    head.get(12..16)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Whether every frame of the log has been copied into the database, read
/// from the wal-index (`relay.db-shm`, sqlite.org/walformat.html, in the
/// machine's byte order): the last valid frame (`mxFrame`, offset 16)
/// against the frames copied (`nBackfill`, offset 96).
fn wal_copied(dir: &Dir) -> bool {
    let index = std::fs::read(dir.0.join("relay.db-shm")).unwrap_or_default();
    let word = |at: usize| {
        index
            .get(at..at + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    matches!((word(16), word(96)), (Some(last), Some(copied)) if copied == last)
}

#[test]
fn the_log_is_copied_into_the_database_and_reused_while_traffic_goes_on() {
    let dir = Dir::new("wal");
    let srv = start(&dir);
    let addr = srv.addr();
    let text = "x".repeat(2000);
    const ROUNDS: u64 = 16;
    const ROUND_BYTES: u64 = 4 * 64 * 2000;
    // Each round, four clients post 512 KB of prompts; then the
    // checkpointer must copy all of the log into the database in the
    // background before the next round, whose first commit starts the log
    // over.
    for round in 1..=ROUNDS {
        let clients: Vec<_> = (0..4)
            .map(|c| {
                let (sid, text) = (format!("wal{c}-{}", unique_session()), text.clone());
                std::thread::spawn(move || {
                    for i in 0..64 {
                        let cid = format!("r{round}-{i}");
                        let p = json!({"session_id": sid, "prompt": text, "client_msg_id": cid});
                        assert_eq!(try_post(addr, "/prompt", &p), Some(200));
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !wal_copied(&dir) {
            assert!(
                Instant::now() < deadline,
                "round {round}: the log was not copied into the database"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            file_len(&dir, "relay.db") >= round * ROUND_BYTES,
            "round {round}: relay.db is {} B",
            file_len(&dir, "relay.db")
        );
    }
    // The log started over every round while 8 MB of prompts went through
    // it (SQLite's frames for them are several times that: each commit
    // rewrites whole pages), so it holds about what one round wrote: a log
    // that was never reused would be well over 8 MB.
    let restarts = wal_restarts(&dir);
    assert!(
        restarts >= ROUNDS as u32 - 1,
        "the log started over {restarts} times"
    );
    let wal = file_len(&dir, "relay.db-wal");
    assert!(wal < ROUNDS * ROUND_BYTES / 2, "relay.db-wal is {wal} B");
}

#[test]
fn a_client_that_half_closes_while_its_prompts_commit_gets_its_answers() {
    // `printf … | nc`: two prompts and a health check, then the FIN, while
    // the prompts wait for their commits. The FIN must not cost the client
    // the answers it is owed. When the FIN is read is a race, so it runs
    // often.
    let dir = Dir::new("halfclose");
    let srv = Server::start_with(&[("RELAY_DATA_DIR", dir.path()), ("RELAY_SYNC", "always")]);
    let sid = unique_session();
    let prompt = |id: &str| {
        let body = json!({"session_id": sid, "prompt": "q", "client_msg_id": id}).to_string();
        format!(
            "POST /prompt HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    for i in 0..100 {
        let (a, b) = (format!("a{i}"), format!("b{i}"));
        let batch = prompt(&a) + &prompt(&b) + "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";
        let mut http = srv.conn();
        http.send_raw(batch.as_bytes());
        http.shutdown_write();
        for id in [a, b] {
            let r = http.read_response();
            assert_eq!(r.status, 200, "round {i}: {}", r.text());
            assert_eq!(r.json()["client_msg_id"], id);
        }
        assert_eq!(http.read_response().json()["ok"], true, "round {i}");
        assert!(http.is_closed_by_peer(), "round {i}");
    }
    assert_eq!(all_messages(&srv, &sid).len(), 200);
}

#[test]
fn pending_prompts_of_every_session_come_back_in_arrival_order_after_a_restart() {
    let dir = Dir::new("arrivals");
    let mut srv = start(&dir);
    let n = unique_session();
    let (z, a) = (format!("z{n}"), format!("a{n}"));
    // Posted z, a, z (the `ts` order too); sessions restore in creation
    // order, so only the `ts` puts a's prompt between z's two.
    for (sid, id, ts) in [(&z, "z1", 1000), (&a, "a1", 2000), (&z, "z2", 3000)] {
        let body = json!({"session_id": sid, "client_msg_id": id, "prompt": "p", "ts": ts});
        assert_eq!(srv.post_json("/prompt", &body).status, 200);
    }
    let listed = |srv: &Server, query: &str| -> Vec<Value> {
        let resp = srv.get(&format!("/prompts?wait=false{query}"));
        assert_eq!(resp.status, 200, "{}", resp.text());
        resp.json().as_array().unwrap().clone()
    };
    let ids = |items: &[Value]| -> Vec<String> {
        items
            .iter()
            .map(|p| p["client_msg_id"].as_str().unwrap().to_string())
            .collect()
    };
    let before = listed(&srv, "");
    assert_eq!(ids(&before), ["z1", "a1", "z2"]);
    let last = before[2]["cursor"].as_str().unwrap().to_string();
    srv.kill9();
    let srv = start(&dir);
    // The same order; a cursor of the earlier run lists them all again
    // (an agent dedupes by client_msg_id) rather than skipping any.
    assert_eq!(ids(&listed(&srv, "")), ["z1", "a1", "z2"]);
    let again = listed(&srv, &format!("&after={last}"));
    assert_eq!(ids(&again), ["z1", "a1", "z2"]);
    assert!(again[0]["cursor"].as_str().unwrap().parse::<u64>().unwrap() > last.parse().unwrap());
}
