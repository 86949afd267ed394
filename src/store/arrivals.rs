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
//! A poll for a part of the sessions (a token for a prefix, or for one
//! session) would walk past every other session's pending prompts to find
//! its own. So the index also keeps, for the few scopes such polls asked
//! for lately ([`MAX_KEPT`], the least recently used dropped), the numbers
//! of the prompts each covers: built by one walk when a scope is first
//! asked for, then kept as prompts arrive and leave (a prefix check per
//! kept scope on arrival). A scope not kept is read by the walk, slower
//! but alike.
//!
//! Invariant: an entry exists exactly for each prompt pending in a
//! session the store holds, and that prompt's pending slot holds the
//! entry's number; so the index holds no more entries than the pending
//! caps already bound (sessions × `max_pending`). A kept scope holds
//! exactly the numbers of the entries it covers.

use std::collections::{BTreeMap, BTreeSet};

use super::types::{Scope, Seq, SessionId};

/// How many scopes of part of the sessions are kept at most.
pub const MAX_KEPT: usize = 16;

/// The arrivals a scope covers.
#[derive(Debug)]
struct Kept {
    scope: Scope,
    numbers: BTreeSet<u64>,
    /// When it was last asked for (a count of asks).
    used: u64,
}

/// A pending prompt's place in the arrival order.
#[derive(Debug, Default)]
pub struct Arrivals {
    /// The number the next arrival gets.
    next: u64,
    /// Arrival number to the prompt.
    order: BTreeMap<u64, (SessionId, Seq)>,
    /// Scopes of part of the sessions, kept for their polls.
    kept: Vec<Kept>,
    /// Asks for kept scopes so far (their `used` clock).
    asks: u64,
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
        for k in &mut self.kept {
            if k.scope.covers(sid) {
                k.numbers.insert(n);
            }
        }
        n
    }

    /// The prompt that arrived as `n` is pending no more (answered,
    /// cancelled, or its session dropped). A number not held is ignored.
    pub fn left(&mut self, n: u64) {
        self.order.remove(&n);
        for k in &mut self.kept {
            k.numbers.remove(&n);
        }
    }

    /// Everything leaves (every copy dropped); numbering goes on, so a
    /// cursor handed out before never names a later prompt.
    pub fn clear(&mut self) {
        self.order.clear();
        for k in &mut self.kept {
            k.numbers.clear();
        }
    }

    /// How many kept scopes cover `sid`: each holds an entry for every
    /// pending prompt of it (for the memory count).
    pub fn kept_covering(&self, sid: &str) -> usize {
        self.kept.iter().filter(|k| k.scope.covers(sid)).count()
    }

    /// Entries of the kept scopes, all together (for the memory count).
    pub fn kept_entries(&self) -> usize {
        self.kept.iter().map(|k| k.numbers.len()).sum()
    }

    /// Keeps the arrivals `scope` covers from now on, if it is a part of
    /// the sessions: built now by one walk when not kept yet, the least
    /// recently asked for dropped past [`MAX_KEPT`]. Called for each poll
    /// of that scope, which then reads [`after_in`](Self::after_in).
    pub fn keep(&mut self, scope: &Scope) {
        if *scope == Scope::Every {
            return;
        }
        self.asks += 1;
        if let Some(k) = self.kept.iter_mut().find(|k| k.scope == *scope) {
            k.used = self.asks;
            return;
        }
        if self.kept.len() >= MAX_KEPT
            && let Some(i) = (0..self.kept.len()).min_by_key(|&i| self.kept[i].used)
        {
            self.kept.swap_remove(i);
        }
        let numbers = self
            .order
            .iter()
            .filter(|(_, (sid, _))| scope.covers(sid))
            .map(|(n, _)| *n)
            .collect();
        self.kept.push(Kept {
            scope: scope.clone(),
            numbers,
            used: self.asks,
        });
    }

    /// The pending prompts that arrived after arrival `after` (all when
    /// `None`), oldest first, with their arrival numbers.
    pub fn after(&self, after: Option<u64>) -> impl Iterator<Item = (u64, &SessionId, Seq)> {
        let from = after.map_or(0, |a| a.saturating_add(1));
        self.order
            .range(from..)
            .map(|(n, (sid, seq))| (*n, sid, *seq))
    }

    /// As [`after`](Self::after), for the sessions `scope` covers only:
    /// from its kept numbers when it is kept (no walk past other
    /// sessions' prompts), else by a walk over every arrival after the
    /// cursor.
    pub fn after_in<'a>(
        &'a self,
        scope: &'a Scope,
        after: Option<u64>,
    ) -> Box<dyn Iterator<Item = (u64, &'a SessionId, Seq)> + 'a> {
        let from = after.map_or(0, |a| a.saturating_add(1));
        match self.kept.iter().find(|k| k.scope == *scope) {
            Some(k) => Box::new(k.numbers.range(from..).filter_map(|n| {
                let (sid, seq) = self.order.get(n)?;
                Some((*n, sid, *seq))
            })),
            None => Box::new(self.after(after).filter(|(_, sid, _)| scope.covers(sid))),
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

    fn listed_in(a: &Arrivals, scope: &Scope, after: Option<u64>) -> Vec<(u64, String)> {
        a.after_in(scope, after)
            .map(|(n, s, _)| (n, s.to_string()))
            .collect()
    }

    #[test]
    fn a_kept_scope_lists_what_the_walk_lists() {
        let mut a = Arrivals::default();
        let team = Scope::Prefix("team-".into());
        let one = Scope::Session(sid("team-b"));
        a.arrived(&sid("team-a"), Seq(1));
        a.arrived(&sid("other"), Seq(1));
        let walked = listed_in(&a, &team, None);
        a.keep(&team);
        a.keep(&one);
        assert_eq!(listed_in(&a, &team, None), walked);
        let b = a.arrived(&sid("team-b"), Seq(1));
        a.arrived(&sid("other"), Seq(2));
        let a2 = a.arrived(&sid("team-a"), Seq(2));
        assert_eq!(
            listed_in(&a, &team, None),
            [
                (0, "team-a".into()),
                (b, "team-b".into()),
                (a2, "team-a".into())
            ]
        );
        assert_eq!(listed_in(&a, &team, Some(b)), [(a2, "team-a".into())]);
        assert_eq!(listed_in(&a, &one, None), [(b, "team-b".into())]);
        assert_eq!(a.kept_entries(), 4);
        a.left(b);
        assert_eq!(listed_in(&a, &one, None), []);
        assert_eq!(a.kept_entries(), 2);
        a.clear();
        assert_eq!(a.kept_entries(), 0);
        // Every is never kept: it is the order itself.
        a.keep(&Scope::Every);
        assert_eq!(a.kept.len(), 2);
    }

    #[test]
    fn the_least_recently_asked_scope_goes_past_the_cap() {
        let mut a = Arrivals::default();
        a.arrived(&sid("p0-x"), Seq(1));
        for i in 0..MAX_KEPT {
            a.keep(&Scope::Prefix(format!("p{i}-").into()));
        }
        a.keep(&Scope::Prefix("p0-".into())); // asked again: kept
        a.keep(&Scope::Prefix("new-".into())); // p1- goes
        assert_eq!(a.kept.len(), MAX_KEPT);
        assert!(
            a.kept
                .iter()
                .any(|k| k.scope == Scope::Prefix("p0-".into()))
        );
        assert!(
            !a.kept
                .iter()
                .any(|k| k.scope == Scope::Prefix("p1-".into()))
        );
        // A dropped scope still lists by the walk.
        let p1 = Scope::Prefix("p1-".into());
        a.arrived(&sid("p1-y"), Seq(1));
        assert_eq!(listed_in(&a, &p1, None), [(1, "p1-y".into())]);
    }
}
