//! The order in which sessions leave memory where the engine reads them
//! back (a data directory, Redis): a clock, or second chance. Each
//! session the store takes joins the back of a ring with its last
//! activity; the hand takes entries from the front. One used since the
//! hand last passed it (its last activity moved) goes to the back with
//! its new activity, and so does one something holds; the first one
//! neither used nor held is the one to drop. So the sessions reached
//! are those used least recently, as a list kept in order of use would
//! have them, without touching the ring on every use; and dropping does
//! work for what it drops and for what the hand passes over, each use
//! paying for one pass at most, never a walk or a sort of every session.
//! A pass is bounded in its steps besides, and the next goes on from
//! where it stopped.
//!
//! Entries leave lazily: a session deleted or dropped leaves its entry,
//! skipped when the hand reaches it (its log is gone, or is a later one
//! under the same id: each log taken gets the next number). The ring is
//! squeezed when stale entries outnumber the sessions, so it holds at
//! most about twice as many entries as there are sessions, each counted
//! on the memory budget.

use std::collections::VecDeque;

use super::MemStore;
use crate::store::log::SessionLog;
use crate::store::log::weight::alloc;
use crate::store::types::SessionId;
use crate::time::Millis;

/// Stale entries tolerated whatever the number of sessions.
const MIN_STALE: usize = 64;

/// One session's place in the ring.
#[derive(Debug)]
struct Entry {
    sid: SessionId,
    /// The log's number ([`SessionLog::entered`]).
    entered: u64,
    /// Its last activity when the hand last passed it (or it entered).
    seen: Millis,
}

/// The ring, when it is kept ([`MemStore::keep_order`]).
#[derive(Debug, Default)]
pub(super) struct Clock {
    on: bool,
    ring: VecDeque<Entry>,
    /// The number the next log taken gets.
    next: u64,
    /// Entries passed over because something held them, since the hand
    /// last found one to drop.
    passed: usize,
}

impl Clock {
    /// The bytes the ring holds, as the memory budget counts them.
    pub(super) fn bytes(&self) -> usize {
        alloc(self.ring.capacity() * std::mem::size_of::<Entry>())
    }
}

impl MemStore {
    /// Keeps the order in which sessions leave memory from now on: where
    /// the engine reads sessions back. Called once, at start: the sessions
    /// held already (those the start read) join in the order of their ids.
    pub fn keep_order(&mut self) {
        if self.clock.on {
            return;
        }
        self.clock.on = true;
        let mut held: Vec<SessionId> = self.sessions.keys().cloned().collect();
        held.sort_unstable();
        for sid in held {
            if let Some(mut log) = self.sessions.remove(&*sid) {
                self.enter(&sid, &mut log);
                self.sessions.insert(sid, log);
            }
        }
    }

    /// The store takes `log` under `sid`: it joins the ring's back.
    pub(super) fn enter(&mut self, sid: &SessionId, log: &mut SessionLog) {
        let clock = &mut self.clock;
        if !clock.on {
            return;
        }
        clock.next += 1;
        log.entered = clock.next;
        clock.ring.push_back(Entry {
            sid: sid.clone(),
            entered: clock.next,
            seen: log.last_active,
        });
        if clock.ring.len() > 2 * self.sessions.len() + MIN_STALE {
            let sessions = &self.sessions;
            clock.ring.retain(|e| {
                sessions
                    .get(&*e.sid)
                    .is_some_and(|l| l.entered == e.entered)
            });
            clock.ring.shrink_to(2 * clock.ring.len() + MIN_STALE);
        }
    }

    /// The session least recently used that `held` does not keep, taken
    /// off the ring (the caller drops it), with its last activity; `None`
    /// when `steps` entries were looked at first, or the hand went round
    /// the whole ring since it last found one ([`clock_turned`](Self::clock_turned)).
    /// Each entry looked at takes one of `steps`.
    pub fn least_used(
        &mut self,
        steps: &mut usize,
        mut held: impl FnMut(&str, &SessionLog) -> bool,
    ) -> Option<(SessionId, Millis)> {
        while *steps > 0 && !self.clock_turned() {
            *steps -= 1;
            let mut e = self.clock.ring.pop_front()?;
            let Some(log) = self
                .sessions
                .get(&*e.sid)
                .filter(|l| l.entered == e.entered)
            else {
                continue;
            };
            if log.last_active != e.seen {
                // Used since: a candidate when the hand comes round again.
                e.seen = log.last_active;
            } else if held(&e.sid, log) {
                self.clock.passed += 1;
            } else {
                self.clock.passed = 0;
                return Some((e.sid, e.seen));
            }
            self.clock.ring.push_back(e);
        }
        None
    }

    /// Whether the hand went round the whole ring since it last found a
    /// session to drop (or since [`clock_restart`](Self::clock_restart))
    /// and found every session held.
    pub fn clock_turned(&self) -> bool {
        self.clock.passed >= self.clock.ring.len()
    }

    /// The hand goes round once more before it says the ring turned:
    /// when the count comes back under the budget, and when a pass that
    /// found the ring turned is tried again (what held the sessions may
    /// have let go).
    pub fn clock_restart(&mut self) {
        self.clock.passed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::super::StoreLimits;
    use super::*;

    fn store(sessions: usize) -> MemStore {
        let mut m = MemStore::new(StoreLimits {
            history_limit: 10,
            max_sessions: 10_000,
            max_pending: 10,
            draft_timeout_ms: 60_000,
        });
        m.keep_order();
        for i in 0..sessions {
            let sid = SessionId::new(&format!("s{i}")).expect("an id");
            m.insert(sid, SessionLog::new(Millis(i as u64), "e"));
        }
        m
    }

    fn drop_next(m: &mut MemStore, steps: &mut usize, held: &[&str]) -> Option<String> {
        let (sid, _) = m.least_used(steps, |sid, _| held.contains(&sid))?;
        m.forget(&sid);
        Some(sid.to_string())
    }

    /// Sessions come least recently used first: one used since it
    /// entered goes after those that were not, one held is passed over
    /// and stays, and a session deleted leaves nothing behind.
    #[test]
    fn sessions_come_least_recently_used_first_and_held_ones_stay() {
        let mut m = store(6);
        m.existing(Millis(100), "s0").expect("s0");
        m.forget("s3");
        let mut steps = 100;
        let order: Vec<String> =
            std::iter::from_fn(|| drop_next(&mut m, &mut steps, &["s2"])).collect();
        assert_eq!(order, ["s1", "s4", "s5", "s0"]);
        assert!(m.contains("s2"), "held: kept");
        assert!(m.clock_turned(), "only a held session is left");
        assert_eq!(m.len(), 1);
    }

    /// A pass looks at no more than its steps, and the next goes on from
    /// where it stopped; the ring holds at most about twice the sessions
    /// however many come and go.
    #[test]
    fn a_pass_is_bounded_and_the_ring_stays_small() {
        let mut m = store(100);
        let held: Vec<String> = (0..50).map(|i| format!("s{i}")).collect();
        let held: Vec<&str> = held.iter().map(String::as_str).collect();
        let mut steps = 10;
        assert_eq!(drop_next(&mut m, &mut steps, &held), None, "ten held first");
        assert_eq!(steps, 0);
        assert!(!m.clock_turned());
        let mut steps = 41;
        assert_eq!(drop_next(&mut m, &mut steps, &held).as_deref(), Some("s50"));
        assert_eq!(steps, 0, "40 more held, then s50");
        for round in 0..50 {
            for i in 0..100 {
                let sid = format!("t{round}-{i}");
                m.insert(
                    SessionId::new(&sid).expect("an id"),
                    SessionLog::new(Millis(0), "e"),
                );
                m.forget(&sid);
            }
        }
        assert!(
            m.clock.ring.len() <= 2 * m.len() + MIN_STALE + 1,
            "{}",
            m.clock.ring.len()
        );
    }
}
