//! The writer's cache against no cache: the same commands, decided by a
//! writer that drops every session it can after each transaction (so
//! nearly every command reads its session back from the file) and by one
//! that never drops anything, give the same outcomes, the same records
//! and the same rows; and a session read for the loop is the same whether
//! it comes from the cache or from the file alone.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::cache::Share;
use super::decide::Writer;
use super::{Sync, open};
use crate::error::ApiError;
use crate::store::Rng;
use crate::store::mem::StoreLimits;
use crate::store::model::{NewAsk, NewCancel, NewPrompt, NewReply, NewResponse, Write};
use crate::store::record::{Command, Op, Outcome, Record};
use crate::store::seam::NOBODY;
use crate::store::types::{SessionId, Ticket};
use crate::time::Millis;

const LIMITS: StoreLimits = StoreLimits {
    history_limit: 4,
    max_sessions: 5,
    max_pending: 3,
    draft_timeout_ms: 60_000,
};

/// A data directory of its own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("relay-cache-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A writer with a budget of `budget` bytes (the loop holding nothing).
fn writer(dir: &Dir, budget: usize) -> (Writer, Arc<Share>, std::fs::File) {
    let opened = open(&dir.0, Sync::Always).expect("a database");
    let share = Arc::new(Share::new(budget));
    let w = Writer::new(opened.conn, LIMITS, opened.generation, share.clone());
    (w, share, opened.lock)
}

/// One write of a mix over seven sessions (more than the cap of five):
/// prompts (ids reused, sometimes with another text), answers (ids
/// reused), cancels, asks and replies, creations, deletions, sweeps.
fn command(rng: &mut Rng, n: u64) -> Command {
    let sid = format!("s{}", rng.below(7));
    let p = rng.below(12);
    let a = rng.below(9);
    let text = ["one", "two"][rng.below(2) as usize];
    let unix_ms = 1_000 + n;
    let owned = |w: Write<'_>| Op::Write(w.into_owned(unix_ms));
    let op = match rng.below(16) {
        0..=5 => {
            let pad = "x".repeat(rng.below(300) as usize);
            let body = format!(
                r#"{{"session_id":"{sid}","client_msg_id":"p{p}","prompt":"{text} {pad}"}}"#
            );
            owned(Write::Prompt(NewPrompt::parse(body.as_bytes()).unwrap()))
        }
        6..=9 => {
            let body = format!(
                r#"{{"session_id":"{sid}","client_msg_id":"p{p}","assistant_msg_id":"a{a}","text":"{text}"}}"#
            );
            owned(Write::answer(NewResponse::parse(body.as_bytes()).unwrap()))
        }
        10 => {
            let body =
                format!(r#"{{"session_id":"{sid}","client_msg_id":"p{p}","reason":"stop"}}"#);
            owned(Write::Cancel(NewCancel::parse(body.as_bytes()).unwrap()))
        }
        11 => {
            let body = format!(r#"{{"session_id":"{sid}","ask_id":"k{a}","text":"sure?"}}"#);
            owned(Write::Ask(NewAsk::parse(body.as_bytes()).unwrap()))
        }
        12 => {
            let body = format!(r#"{{"session_id":"{sid}","ask_id":"k{a}","text":"{text}"}}"#);
            owned(Write::Reply(NewReply::parse(body.as_bytes()).unwrap()))
        }
        13 => owned(Write::Create {
            sid: Cow::Owned(SessionId::new(&sid).unwrap()),
            put: true,
        }),
        14 => owned(Write::Delete {
            sid: Cow::Owned(sid.clone()),
        }),
        _ => Op::Collect {
            sids: vec![SessionId::new(&sid).unwrap()],
        },
    };
    Command {
        ticket: Ticket { conn: NOBODY, n },
        op,
        unix_ms,
        load: false,
    }
}

/// What a command came to, with the epochs (random) left out.
fn seen(result: Result<Outcome, ApiError>, records: Vec<Record>) -> String {
    let result = match result {
        Ok(Outcome::Session {
            sid, created, put, ..
        }) => format!("session {sid:?} {created} {put}"),
        other => format!("{other:?}"),
    };
    let records: Vec<String> = records
        .into_iter()
        .map(|r| match r {
            Record::Created { sid, .. } => format!("created {sid:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    format!("{result} {records:?}")
}

/// Every row of the file, in order, and every session's counters.
fn rows(dir: &Dir) -> (Vec<String>, Vec<String>) {
    let conn = rusqlite::Connection::open(dir.0.join("relay.db")).unwrap();
    let read = |sql: &str| -> Vec<String> {
        let mut st = conn.prepare(sql).unwrap();
        let n = st.column_count();
        st.query_map([], |r| {
            Ok((0..n)
                .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                .collect::<Vec<_>>()
                .join(" "))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    };
    (
        read(
            "SELECT id, session, seq, kind, client_msg_id, assistant_msg_id, ts, data FROM messages ORDER BY id",
        ),
        read(
            "SELECT id, name, next_seq, last_assistant, dropped_assistant FROM sessions ORDER BY id",
        ),
    )
}

#[test]
fn a_session_read_back_decides_as_one_never_dropped() {
    let (whole_dir, cached_dir) = (Dir::new("whole"), Dir::new("cached"));
    let (mut whole, _, _lock1) = writer(&whole_dir, usize::MAX);
    let (mut cached, held, _lock2) = writer(&cached_dir, 0);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut n = 0;
    let mut outcomes = [0usize; 2];
    for _ in 0..1_500 {
        // Groups of one to four commands per transaction.
        let group: Vec<(Command, Command)> = (0..1 + rng.below(4))
            .map(|_| {
                n += 1;
                let seed = rng.0;
                let a = command(&mut rng, n);
                let mut again = Rng(seed);
                (a, command(&mut again, n))
            })
            .collect();
        let (a, b): (Vec<_>, Vec<_>) = group.into_iter().unzip();
        let (a, b) = (whole.commit(a), cached.commit(b));
        assert_eq!(a.len(), b.len());
        for (a, b) in a.into_iter().zip(b) {
            outcomes[usize::from(a.result.is_ok())] += 1;
            let (a, b) = (seen(a.result, a.records), seen(b.result, b.records));
            assert_eq!(a, b, "command {n}");
        }
        // Everything but the sessions whose counters wait for the next
        // garbage collection was dropped.
        assert!(held.held.load(Ordering::Relaxed) < 64 << 10);
    }
    assert!(outcomes[0] > 100 && outcomes[1] > 100, "{outcomes:?}");
    drop((whole, cached));
    let (a, b) = (rows(&whole_dir), rows(&cached_dir));
    assert!(a.0.len() > 10, "rows kept: {}", a.0.len());
    assert_eq!(a, b);
}

#[test]
fn the_session_cap_counts_the_sessions_the_cache_dropped() {
    let dir = Dir::new("cap");
    let (mut w, _, _lock) = writer(&dir, 0);
    let prompt = |sid: &str, n: u64| {
        let body = format!(r#"{{"session_id":"{sid}","client_msg_id":"p","prompt":"hi"}}"#);
        let w = Write::Prompt(NewPrompt::parse(body.as_bytes()).unwrap());
        Command {
            ticket: Ticket { conn: NOBODY, n },
            op: Op::Write(w.into_owned(1)),
            unix_ms: 1,
            load: false,
        }
    };
    for i in 0..5 {
        let done = w.commit(vec![prompt(&format!("s{i}"), i)]);
        assert!(done[0].result.is_ok());
    }
    // None of the five is held now, and a sixth is still one too many.
    let done = w.commit(vec![prompt("s5", 5)]);
    assert_eq!(done[0].result.as_ref().unwrap_err().status, 503);
    // A resend to a dropped session is read back, and is a duplicate.
    let done = w.commit(vec![prompt("s0", 6)]);
    assert!(matches!(
        done[0].result,
        Ok(Outcome::Prompt {
            duplicate: true,
            ..
        })
    ));
    assert!(w.get_or_load("s3").is_some_and(|l| l.has_prompt("p")));
    assert!(w.get_or_load("s5").is_none());
}

/// A session as the loop would hold it after reading it back from `w`,
/// with the epoch (random) left out; `None` when there is no such session.
fn for_the_loop(w: &mut Writer, sid: &str, n: u64) -> Option<String> {
    let load = Command {
        ticket: Ticket { conn: NOBODY, n },
        op: Op::Load {
            sid: SessionId::new(sid).unwrap(),
        },
        unix_ms: 0,
        load: false,
    };
    let mut done = w.commit(vec![load]);
    assert_eq!(done.len(), 1);
    let done = done.pop().unwrap();
    assert!(done.result.is_ok(), "{:?}", done.result);
    let image = done.images.into_iter().next()?;
    let log = image.into_log(Millis(0), LIMITS.history_limit);
    Some(format!(
        "{:?} {:?} {:?}",
        log.counters(),
        log.history().collect::<Vec<_>>(),
        log.page_all_pending().map(|m| m.seq).collect::<Vec<_>>()
    ))
}

#[test]
fn the_loop_reads_a_session_alike_from_the_cache_and_from_the_file() {
    let (whole_dir, cached_dir) = (Dir::new("loop-whole"), Dir::new("loop-cached"));
    let (mut whole, _, _lock1) = writer(&whole_dir, usize::MAX);
    let (mut cached, _, _lock2) = writer(&cached_dir, 0);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut n = 0;
    let mut read = 0;
    for round in 0..1_000 {
        n += 1;
        let seed = rng.0;
        let a = command(&mut rng, n);
        let b = command(&mut Rng(seed), n);
        whole.commit(vec![a]);
        cached.commit(vec![b]);
        if round % 10 == 0 {
            // The writer that keeps everything sends its cache's copy;
            // the one that keeps nothing reads the file alone.
            for s in 0..7 {
                let sid = format!("s{s}");
                n += 1;
                let (a, b) = (
                    for_the_loop(&mut whole, &sid, n),
                    for_the_loop(&mut cached, &sid, n),
                );
                assert_eq!(a, b, "{sid} after command {n}");
                read += usize::from(a.is_some());
            }
        }
    }
    assert!(read > 100, "sessions read: {read}");
}

/// A group that ends with a command numbered below the others (the
/// start's reading, asked again after its transaction rolled back, is
/// ticket 0) counts every command in it as taken: a write in it whose
/// requester's timeout passes waits for the commit, and is not answered
/// `503` while the transaction stores it.
#[test]
fn a_group_ending_with_the_starts_reading_counts_its_writes_taken() {
    let frontier = std::sync::Mutex::new(super::Frontier::default());
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut group: Vec<Command> = (5..=6).map(|n| command(&mut rng, n)).collect();
    group.push(Command {
        ticket: Ticket { conn: NOBODY, n: 0 },
        op: Op::Warm,
        unix_ms: 0,
        load: false,
    });
    let (kept, dropped) = super::thread::take_group(&frontier, group);
    assert_eq!((kept.len(), dropped.len()), (3, 0));
    assert_eq!(frontier.lock().unwrap().taken, 6);
}

/// The sessions the `pending` table names, the count of sessions the
/// `generation` row keeps, and the count of `sessions` rows.
fn kept(dir: &Dir) -> (Vec<String>, i64, i64) {
    let conn = rusqlite::Connection::open(dir.0.join("relay.db")).unwrap();
    let mut st = conn
        .prepare("SELECT s.name FROM pending p JOIN sessions s ON s.id = p.session ORDER BY s.name")
        .unwrap();
    let names = st
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let stored = conn
        .query_row("SELECT sessions FROM generation", [], |r| r.get(0))
        .unwrap();
    let rows = conn
        .query_row("SELECT count(*) FROM sessions", [], |r| r.get(0))
        .unwrap();
    (names, stored, rows)
}

/// What the start reads without a scan is what reading each session
/// back says: the `pending` table names exactly the sessions whose log,
/// replayed from the file, holds a pending prompt, and the `generation`
/// row counts the `sessions` rows, whichever writes and sweeps came.
#[test]
fn the_pending_table_and_the_session_count_follow_every_transaction() {
    let dir = Dir::new("pending");
    let (mut w, _, _lock) = writer(&dir, 0);
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let mut seen = [0usize; 2];
    for n in 1..=1_500 {
        let group = (0..1 + rng.below(3))
            .map(|i| command(&mut rng, n * 4 + i))
            .collect();
        w.commit(group);
        if n % 5 != 0 {
            continue;
        }
        let (names, stored, rows) = kept(&dir);
        assert_eq!(stored, rows, "after group {n}");
        // Every session is read back from the file (the cache holds none).
        let pending: Vec<String> = (0..7)
            .map(|s| format!("s{s}"))
            .filter(|sid| w.get_or_load(sid).is_some_and(|l| l.pending_len() > 0))
            .collect();
        assert_eq!(names, pending, "after group {n}");
        seen[0] += pending.len();
        seen[1] += 7 - pending.len();
    }
    // Sessions were seen with pending prompts and without.
    assert!(seen[0] > 100 && seen[1] > 100, "{seen:?}");
}
