//! A session's pending set: its unanswered prompts in `seq` order.
//!
//! A new prompt has the highest `seq` of its session, so it goes on the
//! back of a deque: one cache line touched, where a `BTreeMap` walks
//! several levels of nodes, each a cache miss once many sessions share the
//! cache, on every prompt stored. An answered prompt leaves a hole, found
//! by binary search; holes at either end are dropped at once, and the holes
//! inside are squeezed out when they outnumber the prompts, so the deque
//! holds at most twice the pending prompts (plus a few) and every operation
//! is `O(log n)` amortized, whatever order prompts are answered in.
//!
//! A deque that is full doubles, copying every slot into fresh memory
//! (fresh pages, each a fault). Sessions fed in step (a load posting round
//! robin to many) fill in step and would all double within a few turns, the
//! loop stalling meanwhile and every request waiting on it. So each
//! session's deques grow at a point of their own, between half and all of
//! their capacity ([`grow_early`], the history's too), as the dedupe maps
//! do (`idmap.rs`).
//!
//! Each slot also keeps the prompt's arrival number (its place in the
//! store's [`Arrivals`](super::arrivals::Arrivals)), so a prompt that
//! leaves hands back the number to remove it by: the index needs no map
//! from prompt to number.

use std::collections::VecDeque;
use std::rc::Rc;

use super::message::Message;
use super::types::Seq;
use crate::store::idmap::growth_point;

/// Holes tolerated inside the deque before it is squeezed, whatever the
/// number of prompts: a small set is not rewritten for every answer.
pub const MIN_HOLES: usize = 16;

/// The arrival number of a prompt not numbered yet: one in a log being
/// built for the store (restored), numbered when the store takes it.
const UNNUMBERED: u64 = u64::MAX;

#[derive(Debug, Default)]
pub struct Pending {
    /// Each slot keeps its `seq`, so a search reads no message, and its
    /// arrival number.
    slots: VecDeque<(Seq, u64, Option<Rc<Message>>)>,
    len: usize,
}

impl Pending {
    /// Unanswered prompts.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes of one slot of the deque.
    pub const SLOT_BYTES: usize = std::mem::size_of::<(Seq, u64, Option<Rc<Message>>)>();

    /// The slots' deque's room: what the memory budget weighs it by,
    /// with [`SLOT_BYTES`](Self::SLOT_BYTES) (the messages are the log's
    /// to weigh).
    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// The slots' deque's capacity after [`insert`](Self::insert)ing a
    /// new prompt (a `seq` above every one held), for a session whose
    /// growth point is `seed`.
    pub fn cap_after_insert(&self, seed: usize) -> usize {
        cap_after_push(self.slots.len(), self.slots.capacity(), seed)
    }

    /// The slots' deque's capacity after [`remove`](Self::remove)`(seq)`,
    /// by the same rules: the holes it leaves at either end go, the holes
    /// inside are squeezed out past their bound, and the deque shrinks to
    /// half under a quarter full.
    pub fn cap_after_remove(&self, seq: Seq) -> usize {
        let cap = self.slots.capacity();
        let at = self.position(seq);
        match self.slots.get(at) {
            Some((s, _, Some(_))) if *s == seq => {}
            _ => return cap,
        }
        let len = self.len - 1;
        let mut slots = self.slots.len();
        if len == 0 {
            slots = 0;
        } else if at == 0 {
            slots -= 1 + self
                .slots
                .iter()
                .skip(1)
                .take_while(|x| x.2.is_none())
                .count();
        } else if at + 1 == self.slots.len() {
            slots -= 1 + self
                .slots
                .iter()
                .rev()
                .skip(1)
                .take_while(|x| x.2.is_none())
                .count();
        }
        if slots - len > len.max(MIN_HOLES) {
            slots = len;
        }
        if cap > 64 && slots < cap / 4 {
            cap / 2
        } else {
            cap
        }
    }

    /// Adds a prompt, not numbered yet (see [`number`](Self::number));
    /// one already pending under its `seq` is replaced and keeps its
    /// number. Returns whether the prompt is newly pending. `seed` is the
    /// session's growth point (see [`grow_early`]).
    pub fn insert(&mut self, msg: Rc<Message>, seed: usize) -> bool {
        grow_early(&mut self.slots, seed);
        let seq = msg.seq;
        match self.slots.back() {
            None => {}
            Some((last, _, _)) if *last < seq => {}
            // Out of order (never the case for a new prompt): into place.
            Some(_) => {
                let at = self.position(seq);
                match self.slots.get_mut(at) {
                    Some((s, n, slot)) if *s == seq => {
                        let fresh = slot.replace(msg).is_none();
                        if fresh {
                            *n = UNNUMBERED;
                            self.len += 1;
                        }
                        return fresh;
                    }
                    _ => {
                        self.slots.insert(at, (seq, UNNUMBERED, Some(msg)));
                        self.len += 1;
                        return true;
                    }
                }
            }
        }
        self.slots.push_back((seq, UNNUMBERED, Some(msg)));
        self.len += 1;
        true
    }

    /// Gives the pending prompt at `seq` its arrival number. Called
    /// right after [`insert`](Self::insert), so the newest slot is
    /// looked at first.
    pub fn number(&mut self, seq: Seq, arrival: u64) {
        let at = match self.slots.back() {
            Some((last, _, _)) if *last == seq => self.slots.len() - 1,
            _ => self.position(seq),
        };
        if let Some((s, n, Some(_))) = self.slots.get_mut(at)
            && *s == seq
        {
            *n = arrival;
        }
    }

    /// Gives every pending prompt, oldest first, the number `arrival`
    /// returns for its `seq`.
    pub fn number_all(&mut self, mut arrival: impl FnMut(Seq) -> u64) {
        for (seq, n, _) in self.slots.iter_mut().filter(|(_, _, m)| m.is_some()) {
            *n = arrival(*seq);
        }
    }

    /// The arrival numbers of the pending prompts that have one.
    pub fn arrivals(&self) -> impl Iterator<Item = u64> {
        self.slots
            .iter()
            .filter(|(_, n, m)| m.is_some() && *n != UNNUMBERED)
            .map(|(_, n, _)| *n)
    }

    /// Removes the prompt at `seq`, if it is pending; returns its arrival
    /// number if it had one.
    pub fn remove(&mut self, seq: Seq) -> Option<u64> {
        let at = self.position(seq);
        let (s, n, slot) = self.slots.get_mut(at)?;
        if *s != seq {
            return None;
        }
        slot.take()?;
        let arrival = Some(*n).filter(|n| *n != UNNUMBERED);
        self.len -= 1;
        while self.slots.front().is_some_and(|(_, _, m)| m.is_none()) {
            self.slots.pop_front();
        }
        while self.slots.back().is_some_and(|(_, _, m)| m.is_none()) {
            self.slots.pop_back();
        }
        if self.slots.len() - self.len > self.len.max(MIN_HOLES) {
            self.slots.retain(|(_, _, m)| m.is_some());
        }
        // Memory follows the set down, as a B-tree's freed nodes did: a
        // burst of prompts answered does not leave its peak behind.
        let cap = self.slots.capacity();
        if cap > 64 && self.slots.len() < cap / 4 {
            self.slots.shrink_to(cap / 2);
        }
        arrival
    }

    /// The pending prompts with `seq >= from`, oldest first.
    pub fn from(&self, from: Seq) -> impl Iterator<Item = &Rc<Message>> {
        self.slots
            .range(self.position(from)..)
            .filter_map(|(_, _, m)| m.as_ref())
    }

    /// The first slot whose `seq` is not below `seq`.
    fn position(&self, seq: Seq) -> usize {
        self.slots.partition_point(|(s, _, _)| *s < seq)
    }
}

/// The capacity a deque of `len` slots in `cap` has after one more push:
/// doubled at a length between half and all of its capacity, picked by
/// `seed` (fixed per session), so that deques filled in step do not all
/// copy themselves in the same turn; else doubled when full (at least 4).
/// The one rule of a session's deques: [`grow_early`] follows it, and the
/// memory budget reads it to weigh a write before it is applied.
pub fn cap_after_push(len: usize, cap: usize, seed: usize) -> usize {
    if len >= cap || (cap >= 16 && len >= growth_point(cap, seed)) {
        (2 * cap).max(4)
    } else {
        cap
    }
}

/// Grows `deque` to what [`cap_after_push`] says it holds after the next
/// push. Called before every push, which then never grows it itself.
pub fn grow_early<T>(deque: &mut VecDeque<T>, seed: usize) {
    let (len, cap) = (deque.len(), deque.capacity());
    let next = cap_after_push(len, cap, seed);
    if next > cap {
        deque.reserve_exact(next - len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(seq: u64) -> Rc<Message> {
        let data = format!("{{\"seq\":{seq}}}").into_bytes();
        Rc::new(Message::prompt_with(
            Rc::from(format!("m{seq}")),
            Seq(seq),
            0,
            data,
        ))
    }

    fn seqs(p: &Pending, from: u64) -> Vec<u64> {
        p.from(Seq(from)).map(|m| m.seq.get()).collect()
    }

    #[test]
    fn keeps_seq_order_whatever_order_prompts_come_and_go_in() {
        let mut p = Pending::default();
        let mut model = std::collections::BTreeSet::new();
        // A fixed pseudo-random walk of inserts (mostly at the back) and
        // removals (anywhere), checked against a model after every step.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = 1;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if !x.is_multiple_of(3) || model.is_empty() {
                // Now and then an old seq comes back (out of order).
                let seq = if x.is_multiple_of(17) {
                    x % next + 1
                } else {
                    next
                };
                next = next.max(seq + 1);
                p.insert(prompt(seq), x as usize);
                model.insert(seq);
            } else {
                let seq = x % next + 1;
                p.remove(Seq(seq));
                model.remove(&seq);
            }
            assert_eq!(p.len(), model.len());
            assert!(
                p.slots.len() <= 2 * p.len() + MIN_HOLES + 1,
                "holes bounded"
            );
        }
        assert_eq!(seqs(&p, 0), model.iter().copied().collect::<Vec<_>>());
        let mid = next / 2;
        assert_eq!(
            seqs(&p, mid),
            model.range(mid..).copied().collect::<Vec<_>>()
        );
    }

    #[test]
    fn deques_grow_at_points_of_their_own_between_half_and_full() {
        let mut at = std::collections::BTreeSet::new();
        for seed in [0, 1, 7, 1000, usize::MAX / 3] {
            let mut d = VecDeque::new();
            let mut grew = Vec::new();
            for i in 0..5000usize {
                let cap = d.capacity();
                grow_early(&mut d, seed);
                d.push_back(i);
                if d.capacity() != cap && cap >= 16 {
                    assert!(i >= cap / 2 && i <= cap, "grew at {i} of {cap}");
                    assert!(d.capacity() >= 2 * cap, "doubled");
                    grew.push(i);
                }
            }
            assert!(d.iter().copied().eq(0..5000));
            at.insert(grew);
        }
        assert!(at.len() > 1, "every deque grew at the same lengths: {at:?}");
    }

    #[test]
    fn a_prompt_leaves_with_the_number_it_was_given() {
        let mut p = Pending::default();
        assert!(p.insert(prompt(1), 7));
        p.number(Seq(1), 40);
        assert!(p.insert(prompt(3), 7));
        p.number(Seq(3), 41);
        assert!(p.insert(prompt(2), 7), "out of order, still new");
        p.number(Seq(2), 42);
        assert!(!p.insert(prompt(3), 7), "a replaced prompt is not new");
        assert_eq!(p.arrivals().collect::<Vec<_>>(), [40, 42, 41]);
        assert_eq!(p.remove(Seq(3)), Some(41), "kept its number");
        assert_eq!(p.remove(Seq(3)), None);
        p.number_all(|seq| 100 + seq.get());
        assert_eq!(p.arrivals().collect::<Vec<_>>(), [101, 102]);
        assert!(p.insert(prompt(4), 7));
        assert_eq!(p.arrivals().count(), 2, "not numbered yet: not listed");
        assert_eq!(p.remove(Seq(4)), None);
        assert_eq!(p.remove(Seq(1)), Some(101));
    }

    #[test]
    fn answering_in_any_order_leaves_nothing_behind() {
        let mut p = Pending::default();
        for seq in 1..=100 {
            p.insert(prompt(seq), 7);
        }
        for seq in (2..=100).step_by(2).chain((1..=99).step_by(2)) {
            p.remove(Seq(seq));
        }
        assert_eq!(p.len(), 0);
        assert!(p.slots.is_empty());
        for seq in 1..=10_000 {
            p.insert(prompt(seq), 7);
        }
        for seq in 1..=10_000 {
            p.remove(Seq(seq));
        }
        assert!(
            p.slots.capacity() <= 128,
            "{} slots kept",
            p.slots.capacity()
        );
        p.remove(Seq(7));
        assert_eq!(p.len(), 0, "removing what is gone changes nothing");
    }
}
