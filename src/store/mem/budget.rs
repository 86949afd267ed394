//! The memory budget over the store: what its sessions hold, counted as
//! they change ([`SessionLog::bytes`], summed on one [`Meter`]), and what
//! a write's records would add, so a write that would pass the budget is
//! refused before anything changes. What each thing weighs is
//! `store/log/weight.rs`.

use std::mem::size_of;

use super::MemStore;
use crate::store::log::SessionLog;
use crate::store::log::weight::{ARRIVAL, KEPT_ARRIVAL, alloc, rc_bytes};
use crate::store::message::Message;
use crate::store::record::Record;

/// Bytes a WebSocket frame adds around an answer's `data`: its header
/// and the `{"type":"message","data":…}` around it.
const FRAME_AROUND: usize = 10 + 26 + 1;

/// What one more message adds besides its bytes and ids: its `Rc` block,
/// its history slot, and (a prompt) its pending slot and dedupe entry.
const MESSAGE: usize = alloc(16 + size_of::<Message>()) + 8;
const ENTRY: usize = 48;
const PENDING: usize = 32 + ENTRY + ARRIVAL;

impl MemStore {
    /// Bytes held for the sessions, as counted (`relay_memory_bytes`): the
    /// logs' kept counts, the arrival order, and what is held beside
    /// (drafts, output queues). No walk.
    pub fn memory(&self) -> usize {
        self.logs_memory() + self.beside.get()
    }

    /// The logs' part of [`memory`](Self::memory): their kept counts and
    /// the arrival order.
    pub fn logs_memory(&self) -> usize {
        self.meter.get() + self.arrivals_memory()
    }

    /// The arrival order's part: its entries and those of its kept scopes.
    fn arrivals_memory(&self) -> usize {
        self.arrivals.len() * ARRIVAL + self.arrivals.kept_entries() * KEPT_ARRIVAL
    }

    /// The logs' part counted from scratch by walking every session: for
    /// the tests, which compare it with [`logs_memory`](Self::logs_memory).
    pub fn recount(&self) -> usize {
        self.sessions
            .values()
            .map(|log| log.recount())
            .sum::<usize>()
            + self.arrivals_memory()
    }

    /// The bytes the session `sid` holds, if the store holds it.
    pub fn session_bytes(&self, sid: &str) -> Option<usize> {
        self.sessions.get(sid).map(|log| log.bytes())
    }

    /// What applying `records` would add to [`memory`](Self::memory),
    /// before anything trimming frees (a deletion adds nothing): an
    /// estimate by the same weights, read off the records without
    /// applying them or looking anything up.
    pub fn gross(&self, records: &[Record]) -> usize {
        records
            .iter()
            .map(|r| match r {
                Record::Created { sid, epoch } => {
                    SessionLog::created_weight(sid.len(), epoch) + 4 * ENTRY
                }
                Record::Prompt {
                    client_msg_id,
                    data,
                    ..
                } => MESSAGE + PENDING + alloc(data.len()) + rc_bytes(client_msg_id.len()),
                Record::Response {
                    assistant_msg_id,
                    data,
                    ..
                } => {
                    MESSAGE
                        + ENTRY
                        + rc_bytes(data.data().len() + FRAME_AROUND)
                        + rc_bytes(assistant_msg_id.len())
                }
                Record::Cancel { data, .. } => MESSAGE + rc_bytes(data.len() + FRAME_AROUND),
                // The ask's entry keeps its text decoded besides.
                Record::Ask { ask_id, data, .. } | Record::Reply { ask_id, data, .. } => {
                    MESSAGE
                        + ENTRY
                        + 2 * rc_bytes(data.len() + FRAME_AROUND)
                        + rc_bytes(ask_id.len())
                }
                Record::Deleted { .. } => 0,
            })
            .sum()
    }

    /// What applying `records` frees by trimming history on the way: for
    /// each message appended to a session at its history limit, the
    /// oldest one, and for an answer or cancel its prompt when only the
    /// pending set held it ([`SessionLog::freed_by_next`]).
    pub fn freed(&self, records: &[Record]) -> usize {
        let limit = self.limits.history_limit;
        let freed = |sid: &str, answers: Option<&str>| {
            self.sessions
                .get(sid)
                .map_or(0, |log| log.freed_by_next(limit, answers))
        };
        records
            .iter()
            .map(|r| match r {
                Record::Prompt { sid, .. }
                | Record::Ask { sid, .. }
                | Record::Reply { sid, .. } => freed(sid, None),
                Record::Response {
                    sid, client_msg_id, ..
                }
                | Record::Cancel {
                    sid, client_msg_id, ..
                } => freed(sid, Some(client_msg_id)),
                Record::Created { .. } | Record::Deleted { .. } => 0,
            })
            .sum()
    }

    /// Whether applying `records` keeps the count within `budget` bytes.
    /// Far from the budget that is the sum of their sizes; near it, a
    /// write that frees as much as it adds is always taken, so trimming
    /// history makes room at the budget.
    pub fn admits(&self, records: &[Record], budget: usize) -> bool {
        let used = self.memory();
        let gross = self.gross(records);
        if used.saturating_add(gross) <= budget {
            return true;
        }
        let freed = self.freed(records);
        gross <= freed || used.saturating_add(gross - freed) <= budget
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::super::StoreLimits;
    use super::*;
    use crate::store::Rng;
    use crate::store::model::{NewAsk, NewCancel, NewPrompt, NewReply, NewResponse, Write};
    use crate::store::types::{Seq, SessionId};
    use crate::time::Millis;

    fn run(m: &mut MemStore, unix_ms: u64, w: Write) -> Vec<Record> {
        let mut out = Vec::new();
        let _ = m.decide(Millis(unix_ms), unix_ms, w, &mut out);
        out
    }

    /// Random writes of every kind over a few sessions, with deletions,
    /// the idle sweep, forgetting, and pages of pending prompts read: the
    /// kept count matches a recount after every step, each session's
    /// share matches its own, and an empty store counts nothing.
    #[test]
    fn the_kept_count_matches_a_recount_after_random_workloads() {
        for seed in 1..=12u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut m = MemStore::new(StoreLimits {
                history_limit: 1 + rng.below(12) as usize,
                max_sessions: 6,
                max_pending: 1 + rng.below(8) as usize,
                draft_timeout_ms: 60_000,
            });
            assert_eq!(m.memory(), 0);
            for step in 0..3000u64 {
                let unix_ms = step * 10;
                let s = format!("s{}", rng.below(5));
                let p = format!("p{}", rng.below(40));
                let text = "x".repeat(rng.below(300) as usize);
                let body = match rng.below(12) {
                    0..=3 => {
                        format!(r#"{{"session_id":"{s}","client_msg_id":"{p}","prompt":"{text}"}}"#)
                    }
                    4..=6 => format!(
                        r#"{{"session_id":"{s}","client_msg_id":"{p}","assistant_msg_id":"a{}","text":"{text}"}}"#,
                        rng.below(40)
                    ),
                    7 => format!(r#"{{"session_id":"{s}","client_msg_id":"{p}"}}"#),
                    8 => format!(
                        r#"{{"session_id":"{s}","ask_id":"k{}","text":"{text}","choices":["a","b"],"timeout":{}}}"#,
                        rng.below(6),
                        1 + rng.below(30)
                    ),
                    9 => format!(
                        r#"{{"session_id":"{s}","ask_id":"k{}","text":"a"}}"#,
                        rng.below(6)
                    ),
                    _ => String::new(),
                };
                let b = body.as_bytes();
                let records = match rng.below(12) {
                    0..=3 => NewPrompt::parse(b).map(|w| run(&mut m, unix_ms, Write::Prompt(w))),
                    4..=6 => NewResponse::parse(b).map(|w| run(&mut m, unix_ms, Write::answer(w))),
                    7 => NewCancel::parse(b).map(|w| run(&mut m, unix_ms, Write::Cancel(w))),
                    8 => NewAsk::parse(b).map(|w| run(&mut m, unix_ms, Write::Ask(w))),
                    9 => NewReply::parse(b).map(|w| run(&mut m, unix_ms, Write::Reply(w))),
                    10 => {
                        let sid = Cow::Borrowed(s.as_str());
                        let w = match rng.below(3) {
                            0 => Write::Delete { sid },
                            _ => Write::Create {
                                sid: Cow::Owned(SessionId::new(&s).unwrap()),
                                put: true,
                            },
                        };
                        Ok(run(&mut m, unix_ms, w))
                    }
                    _ => {
                        match rng.below(4) {
                            0 => m.forget(&s),
                            1 => {
                                let mut out = Vec::new();
                                m.collect(|_, _| rng.below(4) == 0, &mut out);
                                for r in out {
                                    m.apply(Millis(unix_ms), r);
                                }
                            }
                            _ => {
                                if let Some(log) = m.get_mut(&s) {
                                    let _ = log.pending_page(None);
                                }
                            }
                        }
                        Ok(Vec::new())
                    }
                };
                for r in records.unwrap_or_default() {
                    m.apply(Millis(unix_ms), r);
                }
                let kept = m.memory();
                assert_eq!(kept, m.recount(), "seed {seed} step {step}");
                let shares: usize = (0..5)
                    .filter_map(|i| m.session_bytes(&format!("s{i}")))
                    .sum();
                assert_eq!(shares, m.meter.get(), "seed {seed} step {step}");
            }
            m.forget_all();
            assert_eq!(m.memory(), 0, "seed {seed}: nothing held, nothing counted");
        }
    }

    /// A log built outside the store (restored from a database, read
    /// from Redis) counts nowhere until the store takes it, then counts
    /// all it holds, and leaves the count when it is forgotten or replaced.
    #[test]
    fn a_log_taken_whole_counts_from_then_on() {
        use crate::store::message::{Message, Parts};
        use std::rc::Rc;
        let mut m = MemStore::new(StoreLimits {
            history_limit: 3,
            max_sessions: 10,
            max_pending: 10,
            draft_timeout_ms: 60_000,
        });
        let build = || {
            let mut log = SessionLog::restored(Millis(0), "e", Seq(1), Seq(0), Seq(0));
            for n in 1..=5u64 {
                let text = format!("\"{}\"", "r".repeat(100 * n as usize));
                let parts = Parts {
                    session_id: "s",
                    id_literal: "\"id\"",
                    prompt_id: None,
                    text: &text,
                    metadata: None,
                    ts: 0,
                    seq: Seq(n),
                };
                log.append_prompt(Message::prompt(Rc::from(format!("p{n}")), &parts), 3);
            }
            log
        };
        let sid = SessionId::new("s").unwrap();
        let log = build();
        assert!(log.bytes() > 0);
        assert_eq!(m.memory(), 0, "not the store's yet");
        m.insert(sid.clone(), log);
        assert_eq!(m.logs_memory(), m.recount());
        let one = m.memory();
        assert_eq!(m.session_bytes("s").unwrap() + 5 * ARRIVAL, one);
        // Its deques and tables grow at points of their own, so the same
        // messages may weigh a little differently in another log.
        m.insert(sid.clone(), build());
        let two = m.session_bytes("s").unwrap() + 5 * ARRIVAL;
        assert_eq!(m.memory(), two, "the replaced log left the count");
        assert_eq!(m.logs_memory(), m.recount());
        assert!(one.abs_diff(two) < one / 4);
        m.forget("s");
        assert_eq!(m.memory(), 0);
    }

    /// A write's estimated growth is close to what applying it adds, so
    /// the budget refuses near where the count would pass it.
    #[test]
    fn the_estimate_of_a_write_follows_what_it_adds() {
        let mut m = MemStore::new(StoreLimits {
            history_limit: 1000,
            max_sessions: 100,
            max_pending: 1000,
            draft_timeout_ms: 60_000,
        });
        let text = "y".repeat(256);
        let (mut guessed, mut added) = (0isize, 0isize);
        for i in 0..200 {
            let body = format!(
                r#"{{"session_id":"s{}","client_msg_id":"c{i}","prompt":"{text}"}}"#,
                i % 7
            );
            let records = run(
                &mut m,
                i,
                Write::Prompt(NewPrompt::parse(body.as_bytes()).unwrap()),
            );
            let guess = m.gross(&records) as isize - m.freed(&records) as isize;
            let before = m.memory();
            for r in records {
                m.apply(Millis(i), r);
            }
            guessed += guess;
            added += (m.memory() - before) as isize;
        }
        // Tables and deques grow in steps; over many writes the two meet.
        assert!(
            (guessed - added).abs() * 5 < added,
            "guessed {guessed}, added {added}"
        );
    }
}
