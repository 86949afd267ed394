//! The memory budget over the store: what its sessions hold, counted as
//! they change ([`SessionLog::bytes`], summed on one [`Meter`]), and what
//! a write's records change it by, worked out exactly before anything
//! changes, so a write that would pass the budget is refused and the
//! count never passes it. What each thing weighs is
//! `store/log/weight.rs`.

use std::mem::size_of;
use std::rc::Rc;

use super::{MemStore, StoreLimits};
use crate::store::arrivals::MAX_KEPT;
use crate::store::idmap::IdMap;
use crate::store::log::weight::{self, ARRIVAL, KEPT_ARRIVAL, alloc};
use crate::store::log::{Next, PromptEntry, PromptState, ResponseEntry, SessionLog};
use crate::store::message::{Kind, Message};
use crate::store::pending::{MIN_HOLES, Pending};
use crate::store::record::Record;
use crate::time::Millis;

/// The most one message appended to a log kept within `limits` makes its
/// tables and the arrival order grow by, all growing at once: each table
/// doubles at most from a room of about twice what it can hold (it grows
/// at half full at the earliest), so it weighs at most that of four times
/// as many entries afterwards.
pub(super) fn most_growth(limits: &StoreLimits) -> usize {
    let (history, pending) = (limits.history_limit, limits.max_pending);
    let deque = |n: usize, slot: usize| alloc((4 * (n + 1)).max(32) * slot);
    let map = |n: usize, slot: usize| weight::table(4 * (n + 2), slot);
    deque(history, size_of::<Rc<Message>>())
        + deque(2 * pending + MIN_HOLES + 1, Pending::SLOT_BYTES)
        + map(history + pending, IdMap::<PromptEntry>::SLOT_BYTES)
        + map(history, IdMap::<ResponseEntry>::SLOT_BYTES)
        + ARRIVAL
        + KEPT_ARRIVAL * MAX_KEPT
}

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

    /// The arrival order's part, its entries and those of its kept
    /// scopes, and the eviction order's ring.
    fn arrivals_memory(&self) -> usize {
        self.arrivals.len() * ARRIVAL
            + self.arrivals.kept_entries() * KEPT_ARRIVAL
            + self.clock.bytes()
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

    /// What one pending prompt of `sid` weighs in the arrival order.
    fn arrival(&self, sid: &str) -> usize {
        ARRIVAL + KEPT_ARRIVAL * self.arrivals.kept_covering(sid)
    }

    /// What applying the records of one write (a decision's: at most one
    /// message per session, after its creation if it is new) adds to
    /// [`memory`](Self::memory) and what it frees, exactly: the count
    /// after applying them is the count before, plus the first, less the
    /// second. Read off the records and the logs they go to, growth of
    /// every table they touch included, without changing anything.
    pub fn change(&self, records: &[Record]) -> (usize, usize) {
        let limit = self.limits.history_limit;
        // The log a `Created` record makes, empty: where the write's
        // message goes if it creates its session.
        let mut created: Option<(&str, SessionLog)> = None;
        let (mut added, mut freed) = (0, 0);
        for r in records {
            let (sid, next) = match r {
                Record::Created { sid, epoch } => {
                    if self.sessions.contains_key(&**sid) {
                        freed += self.dropped(sid);
                    }
                    added += SessionLog::created_weight(sid.len(), epoch);
                    created = Some((sid, SessionLog::new(Millis(0), "")));
                    continue;
                }
                Record::Deleted { sid } => {
                    freed += self.dropped(sid);
                    continue;
                }
                Record::Prompt {
                    sid,
                    client_msg_id,
                    data,
                    ..
                } => {
                    let stored = (data.len(), false);
                    let w = weight::message_of(Some(client_msg_id.len()), None, stored);
                    (sid, Next::Prompt { weight: w })
                }
                Record::Response {
                    sid,
                    client_msg_id,
                    assistant_msg_id,
                    data,
                    ..
                } => {
                    let stored = (Message::frame_len(Kind::Assistant, data.data().len()), true);
                    let w = weight::message_of(None, Some(assistant_msg_id.len()), stored);
                    let next = Next::Answer {
                        prompt: client_msg_id,
                        answer_id: true,
                        weight: w,
                    };
                    (sid, next)
                }
                Record::Cancel {
                    sid,
                    client_msg_id,
                    data,
                    ..
                } => {
                    let stored = (Message::frame_len(Kind::Cancel, data.len()), true);
                    let next = Next::Answer {
                        prompt: client_msg_id,
                        answer_id: false,
                        weight: weight::message_of(None, None, stored),
                    };
                    (sid, next)
                }
                Record::Ask {
                    sid,
                    seq,
                    ts,
                    ask_id,
                    data,
                } => {
                    let stored = (Message::frame_len(Kind::Ask, data.len()), true);
                    let next = Next::Ask {
                        ask_id,
                        seq: *seq,
                        ts: *ts,
                        data: data.as_bytes(),
                        weight: weight::message_of(Some(ask_id.len()), None, stored),
                    };
                    (sid, next)
                }
                Record::Reply {
                    sid,
                    seq,
                    ask_id,
                    data,
                    ..
                } => {
                    let stored = (Message::frame_len(Kind::Reply, data.len()), true);
                    let next = Next::Reply {
                        ask_id,
                        seq: *seq,
                        data: data.as_bytes(),
                        weight: weight::message_of(Some(ask_id.len()), None, stored),
                    };
                    (sid, next)
                }
            };
            let log = match &created {
                Some((c, log)) if *c == sid.as_str() => log,
                _ => match self.sessions.get(&**sid) {
                    Some(log) => log,
                    // Applying it changes nothing.
                    None => continue,
                },
            };
            let (was, now) = (log.bytes(), log.bytes_after(&next, limit));
            added += now.saturating_sub(was);
            freed += was.saturating_sub(now);
            // The arrival order: a new prompt joins it, the prompt an
            // answer or a cancel ends leaves it.
            match next {
                Next::Prompt { .. } => added += self.arrival(sid),
                Next::Answer { prompt, .. } if log.prompt_state(prompt) == PromptState::Pending => {
                    freed += self.arrival(sid)
                }
                _ => {}
            }
        }
        (added, freed)
    }

    /// What dropping the session `sid` frees: its log and its pending
    /// prompts' places in the arrival order.
    fn dropped(&self, sid: &str) -> usize {
        self.sessions
            .get(sid)
            .map_or(0, |log| log.bytes() + log.pending_len() * self.arrival(sid))
    }

    /// Whether applying `records` keeps the count within `budget` bytes
    /// ([`change`](Self::change)). A write that frees as much as it adds
    /// is always taken, so trimming history makes room at the budget
    /// (and a deletion always goes through). Far from the budget a bound
    /// read off the records alone ([`most_added`](Self::most_added))
    /// settles it, so a write pays for the exact reckoning (a lookup of
    /// its session and its prompt) only near the budget.
    pub fn admits(&self, records: &[Record], budget: usize) -> bool {
        let used = self.memory();
        if self
            .most_added(records)
            .is_some_and(|most| used.saturating_add(most) <= budget)
        {
            return true;
        }
        let (added, freed) = self.change(records);
        added <= freed || (used + added - freed) <= budget
    }

    /// At least what applying `records` adds, read off the records and the
    /// store's limits without a lookup: each message's own weight, and the
    /// most every table of its log and the arrival order can grow by in
    /// one append ([`most_growth`]). `None` for an ask or a reply, whose
    /// asks table is reckoned only exactly.
    fn most_added(&self, records: &[Record]) -> Option<usize> {
        let mut most = 0;
        for r in records {
            most += match r {
                Record::Created { sid, epoch } => SessionLog::created_weight(sid.len(), epoch),
                Record::Deleted { .. } => 0,
                Record::Prompt {
                    client_msg_id,
                    data,
                    ..
                } => {
                    let w =
                        weight::message_of(Some(client_msg_id.len()), None, (data.len(), false));
                    w + self.most_growth
                }
                Record::Response {
                    assistant_msg_id,
                    data,
                    ..
                } => {
                    let stored = (Message::frame_len(Kind::Assistant, data.data().len()), true);
                    weight::message_of(None, Some(assistant_msg_id.len()), stored)
                        + self.most_growth
                }
                Record::Cancel { data, .. } => {
                    let stored = (Message::frame_len(Kind::Cancel, data.len()), true);
                    weight::message_of(None, None, stored) + self.most_growth
                }
                Record::Ask { .. } | Record::Reply { .. } => return None,
            };
        }
        Some(most)
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
            // Every third seed keeps long histories and many pending
            // prompts, so its tables grow through several sizes.
            let long = seed % 3 == 0;
            let mut m = MemStore::new(StoreLimits {
                history_limit: if long {
                    200
                } else {
                    1 + rng.below(12) as usize
                },
                max_sessions: 6,
                max_pending: if long { 150 } else { 1 + rng.below(8) as usize },
                draft_timeout_ms: 60_000,
            });
            let ids = if long { 600 } else { 40 };
            assert_eq!(m.memory(), 0);
            for step in 0..3000u64 {
                let unix_ms = step * 10;
                let s = format!("s{}", rng.below(5));
                let p = format!("p{}", rng.below(ids));
                let len = match rng.below(50) {
                    0 => 66_000,
                    _ => rng.below(300),
                };
                let text = "x".repeat(len as usize);
                let body = match rng.below(12) {
                    0..=3 => {
                        format!(r#"{{"session_id":"{s}","client_msg_id":"{p}","prompt":"{text}"}}"#)
                    }
                    4..=6 => format!(
                        r#"{{"session_id":"{s}","client_msg_id":"{p}","assistant_msg_id":"a{}","text":"{text}"}}"#,
                        rng.below(ids)
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
                let records = records.unwrap_or_default();
                let (added, freed) = m.change(&records);
                if let Some(most) = m.most_added(&records) {
                    assert!(
                        most >= added,
                        "seed {seed} step {step}: bound {most} < {added}"
                    );
                }
                let foretold = m.memory() + added - freed;
                for r in records {
                    m.apply(Millis(unix_ms), r);
                }
                let kept = m.memory();
                assert_eq!(kept, foretold, "seed {seed} step {step}: foretold");
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
}
