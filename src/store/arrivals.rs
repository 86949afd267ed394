//! The pending prompts of every session in the order they arrived, for
//! an agent that serves them all (`GET /prompts` with no session). Each
//! prompt that becomes pending gets the next arrival number; it leaves
//! when it stops being pending (answered, cancelled, its session deleted
//! or forgotten). So reading the oldest pending prompts across sessions
//! is a walk from a cursor in one ordered map, not a walk over sessions.
//!
//! Invariant: an entry exists exactly for each prompt pending in a
//! session the store holds, so the index holds no more entries than the
//! pending caps already bound (sessions × `max_pending`).

use std::collections::{BTreeMap, HashMap};

use super::types::{Seq, SessionId};

/// A pending prompt's place in the arrival order.
#[derive(Debug, Default)]
pub struct Arrivals {
    /// The number the next arrival gets.
    next: u64,
    /// Arrival number to the prompt.
    order: BTreeMap<u64, (SessionId, Seq)>,
    /// The prompt to its arrival number, to remove it when it is answered.
    by_prompt: HashMap<(SessionId, Seq), u64>,
}

impl Arrivals {
    /// Pending prompts indexed.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no prompt is pending anywhere.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The prompt `seq` of `sid` became pending: it arrives now. Called
    /// when a prompt is applied to the log, and for each pending prompt
    /// of a session put in place whole.
    pub fn arrived(&mut self, sid: &SessionId, seq: Seq) {
        let key = (sid.clone(), seq);
        if self.by_prompt.contains_key(&key) {
            return;
        }
        let n = self.next;
        self.next += 1;
        self.order.insert(n, (sid.clone(), seq));
        self.by_prompt.insert(key, n);
    }

    /// The prompt `seq` of `sid` is pending no more.
    pub fn left(&mut self, sid: &SessionId, seq: Seq) {
        if let Some(n) = self.by_prompt.remove(&(sid.clone(), seq)) {
            self.order.remove(&n);
        }
    }

    /// Every prompt of `sid` leaves (the session is deleted or its copy
    /// dropped). Walks the pending prompts, not the sessions: rare, and
    /// bounded by the pending caps.
    pub fn session_gone(&mut self, sid: &str) {
        if self.order.is_empty() {
            return;
        }
        let by_prompt = &mut self.by_prompt;
        self.order.retain(|_, (s, seq)| {
            let keep = &**s != sid;
            if !keep {
                by_prompt.remove(&(s.clone(), *seq));
            }
            keep
        });
    }

    /// Everything leaves (every copy dropped).
    pub fn clear(&mut self) {
        self.order.clear();
        self.by_prompt.clear();
    }

    /// The pending prompts that arrived after arrival `after` (all when
    /// `None`), oldest first, with their arrival numbers.
    pub fn after(&self, after: Option<u64>) -> impl Iterator<Item = (u64, &SessionId, Seq)> {
        let from = after.map_or(0, |a| a.saturating_add(1));
        self.order
            .range(from..)
            .map(|(n, (sid, seq))| (*n, sid, *seq))
    }

    /// Numbers the entries again in the order `key` gives (the restored
    /// prompts by their `ts`, across sessions); called once at start.
    pub fn reorder<K: Ord>(&mut self, mut key: impl FnMut(&SessionId, Seq) -> K) {
        let mut all: Vec<(SessionId, Seq)> =
            std::mem::take(&mut self.order).into_values().collect();
        all.sort_by_cached_key(|(sid, seq)| key(sid, *seq));
        self.by_prompt.clear();
        self.next = 0;
        for (sid, seq) in all {
            self.arrived(&sid, seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(s: &str) -> SessionId {
        SessionId::new(s).unwrap()
    }

    fn listed(a: &Arrivals, after: Option<u64>) -> Vec<(u64, String, u64)> {
        a.after(after)
            .map(|(n, s, q)| (n, s.to_string(), q.get()))
            .collect()
    }

    #[test]
    fn prompts_are_listed_by_arrival_and_leave_when_answered_or_gone() {
        let mut a = Arrivals::default();
        a.arrived(&sid("b"), Seq(1));
        a.arrived(&sid("a"), Seq(1));
        a.arrived(&sid("b"), Seq(2));
        a.arrived(&sid("b"), Seq(2)); // again: no second entry
        assert_eq!(
            listed(&a, None),
            [(0, "b".into(), 1), (1, "a".into(), 1), (2, "b".into(), 2)]
        );
        assert_eq!(
            listed(&a, Some(0)),
            [(1, "a".into(), 1), (2, "b".into(), 2)]
        );
        a.left(&sid("a"), Seq(1));
        a.left(&sid("a"), Seq(9)); // not pending: nothing
        assert_eq!(listed(&a, None), [(0, "b".into(), 1), (2, "b".into(), 2)]);
        a.arrived(&sid("c"), Seq(1));
        a.session_gone("b");
        assert_eq!(listed(&a, None), [(3, "c".into(), 1)]);
        assert_eq!(a.len(), 1);
        assert_eq!(a.by_prompt.len(), 1);
    }

    #[test]
    fn reorder_numbers_again_by_the_key() {
        let mut a = Arrivals::default();
        a.arrived(&sid("x"), Seq(1));
        a.arrived(&sid("y"), Seq(1));
        a.reorder(|s, _| if s.as_str() == "y" { 0 } else { 1 });
        assert_eq!(listed(&a, None), [(0, "y".into(), 1), (1, "x".into(), 1)]);
        a.left(&sid("x"), Seq(1));
        assert_eq!(listed(&a, None), [(0, "y".into(), 1)]);
    }
}
