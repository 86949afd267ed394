//! The pending prompts of every session in the order they arrived, for
//! an agent that serves them all (`GET /prompts` with no session). Each
//! prompt that becomes pending gets the next arrival number; it leaves
//! when it stops being pending (answered, cancelled, its session deleted
//! or forgotten). So reading the oldest pending prompts across sessions
//! is a walk from a cursor in one ordered map, not a walk over sessions.
//!
//! The map is keyed by the number alone: the session's pending set keeps
//! each prompt's number beside it ([`Pending`](super::pending::Pending)),
//! so a prompt leaves by its number and no map back from prompt to number
//! is kept (one more entry, hashed and with its own copy of the session
//! id, on every prompt stored).
//!
//! Invariant: an entry exists exactly for each prompt pending in a
//! session the store holds, and that prompt's pending slot holds the
//! entry's number; so the index holds no more entries than the pending
//! caps already bound (sessions × `max_pending`).

use std::collections::BTreeMap;

use super::types::{Seq, SessionId};

/// A pending prompt's place in the arrival order.
#[derive(Debug, Default)]
pub struct Arrivals {
    /// The number the next arrival gets.
    next: u64,
    /// Arrival number to the prompt.
    order: BTreeMap<u64, (SessionId, Seq)>,
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

    /// The prompt `seq` of `sid` became pending: it arrives now. Returns
    /// its arrival number, for its pending slot to keep. Called when a
    /// prompt newly pending is applied to the log, and for each pending
    /// prompt of a session put in place whole.
    pub fn arrived(&mut self, sid: &SessionId, seq: Seq) -> u64 {
        let n = self.next;
        self.next += 1;
        self.order.insert(n, (sid.clone(), seq));
        n
    }

    /// The prompt that arrived as `n` is pending no more (answered,
    /// cancelled, or its session dropped). A number not held is ignored.
    pub fn left(&mut self, n: u64) {
        self.order.remove(&n);
    }

    /// Everything leaves (every copy dropped); numbering goes on, so a
    /// cursor handed out before never names a later prompt.
    pub fn clear(&mut self) {
        self.order.clear();
    }

    /// The pending prompts that arrived after arrival `after` (all when
    /// `None`), oldest first, with their arrival numbers.
    pub fn after(&self, after: Option<u64>) -> impl Iterator<Item = (u64, &SessionId, Seq)> {
        let from = after.map_or(0, |a| a.saturating_add(1));
        self.order
            .range(from..)
            .map(|(n, (sid, seq))| (*n, sid, *seq))
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
    fn prompts_are_listed_by_arrival_and_leave_by_their_number() {
        let mut a = Arrivals::default();
        let b1 = a.arrived(&sid("b"), Seq(1));
        let a1 = a.arrived(&sid("a"), Seq(1));
        let b2 = a.arrived(&sid("b"), Seq(2));
        assert_eq!((b1, a1, b2), (0, 1, 2));
        assert_eq!(
            listed(&a, None),
            [(0, "b".into(), 1), (1, "a".into(), 1), (2, "b".into(), 2)]
        );
        assert_eq!(
            listed(&a, Some(0)),
            [(1, "a".into(), 1), (2, "b".into(), 2)]
        );
        a.left(a1);
        a.left(a1); // gone already: nothing
        a.left(99); // never held: nothing
        assert_eq!(listed(&a, None), [(0, "b".into(), 1), (2, "b".into(), 2)]);
        a.clear();
        assert!(a.is_empty());
        assert_eq!(
            a.arrived(&sid("c"), Seq(1)),
            3,
            "numbers go on after a clear"
        );
        assert_eq!(listed(&a, Some(2)), [(3, "c".into(), 1)]);
        assert_eq!(a.len(), 1);
    }
}
