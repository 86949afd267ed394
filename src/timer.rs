//! A hashed timer wheel: 10 ms ticks, one vector of entries per slot. Entries
//! are never removed early: cancellation is lazy (the shell drops an entry
//! that no longer matches its connection when it fires), an entry never fires
//! before its deadline, and `next_deadline` lets an idle server sleep in
//! `poll` until the next one. Sans-IO: time is a parameter.

use crate::time::Millis;

/// Milliseconds per tick.
pub const TICK_MS: u64 = 10;
const SLOTS: usize = 1024;

/// One scheduled deadline for key `K`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<K> {
    pub deadline: Millis,
    pub key: K,
}

/// The wheel. `cursor` is the tick whose slot was visited last.
pub struct TimerWheel<K> {
    slots: Vec<Vec<Entry<K>>>,
    cursor: u64,
    len: usize,
    /// The earliest deadline, while known: kept by `insert`, dropped by
    /// `expire` once it passes. Saves a scan on every loop turn, which
    /// matters when thousands of far deadlines sit in the wheel.
    earliest: Option<Millis>,
}

impl<K: Copy> TimerWheel<K> {
    /// An empty wheel positioned at `now`.
    pub fn new(now: Millis) -> TimerWheel<K> {
        TimerWheel {
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            cursor: now.0 / TICK_MS,
            len: 0,
            earliest: None,
        }
    }

    /// Entries scheduled, stale ones included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Schedules `key` at `deadline`. A deadline in the past fires on the
    /// next `expire`.
    pub fn insert(&mut self, deadline: Millis, key: K) {
        // Ticks round up, so the slot's time is never before the deadline.
        let tick = deadline.0.div_ceil(TICK_MS).max(self.cursor + 1);
        self.slots[(tick % SLOTS as u64) as usize].push(Entry { deadline, key });
        if self.len == 0 {
            self.earliest = Some(deadline);
        } else if let Some(e) = self.earliest {
            self.earliest = Some(e.min(deadline));
        }
        self.len += 1;
    }

    /// Moves every entry due at `now` into `fired`. Called once per loop turn.
    pub fn expire(&mut self, now: Millis, fired: &mut Vec<Entry<K>>) {
        let target = now.0 / TICK_MS;
        if target <= self.cursor {
            return;
        }
        if self.earliest.is_some_and(|e| e <= now) {
            self.earliest = None; // it fires now; the next one is recomputed
        }
        // Past one full turn every slot is visited once.
        let steps = (target - self.cursor).min(SLOTS as u64);
        for i in 1..=steps {
            let idx = ((self.cursor + i) % SLOTS as u64) as usize;
            let slot = &mut self.slots[idx];
            if slot.is_empty() {
                continue;
            }
            let before = slot.len();
            slot.retain(|e| {
                if e.deadline <= now {
                    fired.push(*e);
                    false
                } else {
                    true
                }
            });
            self.len -= before - slot.len();
        }
        self.cursor = target;
    }

    /// When `expire` must next run: the earliest deadline, rounded up to its
    /// tick (an entry fires when its tick is reached). Scans forward from the
    /// cursor; on a busy wheel the first non-empty slot is close.
    pub fn next_deadline(&mut self) -> Option<Millis> {
        if self.len == 0 {
            return None;
        }
        if self.earliest.is_none() {
            self.earliest = self.scan_earliest();
        }
        self.earliest
            .map(|d| Millis(d.0.div_ceil(TICK_MS).max(self.cursor + 1) * TICK_MS))
    }

    fn scan_earliest(&self) -> Option<Millis> {
        if self.len == 0 {
            return None;
        }
        let mut best: Option<Millis> = None;
        for i in 1..=SLOTS as u64 {
            let tick = self.cursor + i;
            let slot = &self.slots[(tick % SLOTS as u64) as usize];
            for e in slot {
                if best.is_none_or(|b| e.deadline < b) {
                    best = Some(e.deadline);
                }
            }
            // Anything found within this turn beats every later slot's
            // entries of this turn; entries of later turns are later still.
            if let Some(b) = best
                && b.0.div_ceil(TICK_MS) <= tick
            {
                return best;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fire(w: &mut TimerWheel<u32>, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        w.expire(Millis(now), &mut out);
        let mut keys: Vec<u32> = out.iter().map(|e| e.key).collect();
        keys.sort();
        keys
    }

    #[test]
    fn never_fires_early_and_fires_at_the_deadline() {
        let mut w = TimerWheel::new(Millis(0));
        w.insert(Millis(25), 1);
        assert_eq!(fire(&mut w, 24), Vec::<u32>::new());
        assert_eq!(fire(&mut w, 29), Vec::<u32>::new());
        assert_eq!(fire(&mut w, 30), vec![1]);
        assert!(w.is_empty());
    }

    #[test]
    fn deadlines_beyond_one_turn_wait_their_turn() {
        let mut w = TimerWheel::new(Millis(0));
        let far = SLOTS as u64 * TICK_MS * 3 + 5;
        w.insert(Millis(far), 7);
        w.insert(Millis(50), 8);
        assert_eq!(w.next_deadline(), Some(Millis(50)));
        assert_eq!(fire(&mut w, 100), vec![8]);
        assert_eq!(
            w.next_deadline(),
            Some(Millis(far.div_ceil(TICK_MS) * TICK_MS))
        );
        for t in (100..far).step_by(3000) {
            assert!(fire(&mut w, t).is_empty(), "fired early at {t}");
        }
        assert_eq!(fire(&mut w, far + TICK_MS), vec![7]);
    }

    #[test]
    fn a_long_pause_fires_everything_due() {
        let mut w = TimerWheel::new(Millis(0));
        for k in 0..100u32 {
            w.insert(Millis(k as u64 * 97), k);
        }
        assert_eq!(fire(&mut w, 1_000_000).len(), 100);
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn past_deadlines_fire_on_the_next_expire() {
        let mut w = TimerWheel::new(Millis(1000));
        w.insert(Millis(10), 1);
        assert_eq!(fire(&mut w, 1010), vec![1]);
    }

    #[test]
    fn next_deadline_is_the_minimum() {
        let mut w = TimerWheel::new(Millis(0));
        w.insert(Millis(500), 1);
        w.insert(Millis(120), 2);
        w.insert(Millis(121), 3);
        assert_eq!(w.next_deadline(), Some(Millis(120)));
        let mut w = TimerWheel::new(Millis(0));
        w.insert(Millis(125), 1);
        // Rounded up to the tick at which it fires.
        assert_eq!(w.next_deadline(), Some(Millis(130)));
        assert_eq!(fire(&mut w, 130), vec![1]);
    }

    #[test]
    fn the_cached_earliest_follows_inserts_and_expiry() {
        let mut w = TimerWheel::new(Millis(0));
        w.insert(Millis(40_000), 1);
        w.insert(Millis(30_000), 2);
        assert_eq!(w.next_deadline(), Some(Millis(30_000)));
        w.insert(Millis(500), 3);
        assert_eq!(w.next_deadline(), Some(Millis(500)));
        assert_eq!(fire(&mut w, 500), vec![3]);
        assert_eq!(w.next_deadline(), Some(Millis(30_000)));
        assert_eq!(fire(&mut w, 30_000), vec![2]);
        assert_eq!(w.next_deadline(), Some(Millis(40_000)));
        assert_eq!(fire(&mut w, 40_000), vec![1]);
        assert_eq!(w.next_deadline(), None);
    }
}
