//! Which sessions the loop's log holds, where the engine reads a session
//! back on its next use (a data directory, Redis): only those in use. When the
//! counted bytes pass the budget, the least recently used sessions that
//! nothing here holds are dropped from the log ([`Relay::evict`]); a
//! request that needs one again waits for it under a ticket, and the
//! engine hands it over whole ([`StoreEvent::Loaded`](crate::store::seam::StoreEvent::Loaded)).
//!
//! What holds a session (it is never dropped while any does): a parked
//! poll or `GET /asks`, a subscriber, an open draft, a write in flight,
//! and with a data directory a pending prompt: the all-sessions poll
//! lists every session's pending prompts from the log's arrival order,
//! which must hold them all (with Redis it reads them from Redis). With a
//! data directory the agent's presence and receipts are live state beside
//! the log (`live.rs`): they stay when the log goes.
//!
//! With a data directory, the sessions dropped, and those the engine holds
//! that were never read since start, are known by id with their last
//! activity ([`Resident`]): the idle sweep collects them past the TTL as
//! it does the others. Their entries count on the budget. Redis keeps
//! and collects its sessions itself, so a copy dropped there is forgotten
//! as the idle sweep forgets one (with the other instances' state in it,
//! which comes back with the session).
//!
//! Invariant: a session is in the log or in `dormant`, never both; the
//! eviction runs at the end of a loop turn, never between a session read
//! back and the request that waited for it running again.

use std::collections::{HashMap, HashSet};

use log::debug;

use super::Relay;
use crate::store::log::weight::alloc;
use crate::store::{SessionId, SessionLog};
use crate::time::Millis;

/// How long a pass that went round every session without bringing the
/// count under the budget keeps the next one off.
const STUCK_RETRY_MS: u64 = 100;

/// The most sessions one eviction pass looks at: what it drops and what
/// it passes over (used since, or held). Bounds the pass's time in the
/// loop's turn whatever the number of sessions held; a pass cut short
/// goes on at the next turn.
pub const EVICT_STEPS: usize = 4096;

/// An entry of `dormant`, besides its id's bytes: the map's slot (key,
/// value, control byte, load factor) and the id's shared block.
const DORMANT_ENTRY: usize = 48 + 16;

/// The sessions known by id only, and what eviction did.
#[derive(Debug, Default)]
pub(super) struct Resident {
    /// Sessions the engine holds and the log does not, with their last
    /// activity.
    dormant: HashMap<SessionId, Millis>,
    /// What `dormant` weighs, as counted.
    dormant_bytes: usize,
    /// Sessions read back into the log.
    pub(super) loads: u64,
    /// Sessions dropped from the log.
    pub(super) evictions: u64,
    /// When the last pass found too little to drop, while the budget is
    /// still passed.
    stuck_at: Option<Millis>,
}

impl Resident {
    fn weight(sid: &SessionId) -> usize {
        DORMANT_ENTRY + alloc(sid.len())
    }

    fn add(&mut self, sid: SessionId, last_active: Millis) {
        let w = Resident::weight(&sid);
        if self.dormant.insert(sid, last_active).is_none() {
            self.dormant_bytes += w;
        }
    }

    /// [`add`](Self::add) for a session listed at start: one dropped
    /// from the log meanwhile keeps its last activity.
    fn listed(&mut self, sid: SessionId, now: Millis) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.dormant.entry(sid) {
            self.dormant_bytes += Resident::weight(e.key());
            e.insert(now);
        }
    }

    /// `sid` is in the log now, or gone: no longer known by id only.
    pub(super) fn remove(&mut self, sid: &str) {
        if let Some((sid, _)) = self.dormant.remove_entry(sid) {
            self.dormant_bytes -= Resident::weight(&sid);
        }
    }

    /// Sessions known by id only.
    pub(super) fn len(&self) -> usize {
        self.dormant.len()
    }

    /// What they weigh on the budget.
    pub(super) fn bytes(&self) -> usize {
        self.dormant_bytes
    }

    /// What they weigh, counted again from scratch (debug checks).
    pub(super) fn recount(&self) -> usize {
        self.dormant.keys().map(Resident::weight).sum()
    }

    /// The sessions known by id only that nobody used for `after` ms and
    /// that no write in flight names: the idle sweep's, in the order of
    /// their ids (the map's own order changes from one process to the
    /// next, and the collection's command would with it).
    pub(super) fn idle(&self, now: Millis, after: u64, writing: &HashSet<&str>) -> Vec<SessionId> {
        let mut idle: Vec<SessionId> = self
            .dormant
            .iter()
            .filter(|(sid, t)| now.since(**t) >= after && !writing.contains(sid.as_str()))
            .map(|(sid, _)| sid.clone())
            .collect();
        idle.sort_unstable();
        idle
    }

    /// Whether the last eviction pass could not bring the count under
    /// the budget.
    pub(super) fn stuck(&self) -> bool {
        self.stuck_at.is_some()
    }
}

impl Relay {
    /// Whether the log holds every session the engine holds (but those
    /// whose creation is in flight): nothing was dropped from it, or
    /// everything dropped is gone since, and the start's reading is done.
    /// A session it lacks then does not exist, and no read waits to find
    /// that out. Never with Redis: other instances create sessions this
    /// copy has not heard of.
    pub(super) fn holds_every_session(&self) -> bool {
        self.engine.holds_every_prompt() && self.resident.len() == 0 && !self.engine.warming()
    }

    /// Whether `sid` is known by id only: dropped from the log, or not
    /// read since start. For checks from outside the relay (the
    /// simulation's, `tests/sim`).
    #[doc(hidden)]
    pub fn dormant(&self, sid: &str) -> bool {
        self.resident.dormant.contains_key(sid)
    }

    /// Whether `sid` has an open draft (a streamed answer not final yet),
    /// which holds it in the log. For checks from outside the relay.
    #[doc(hidden)]
    pub fn drafting(&self, sid: &str) -> bool {
        self.live.get(sid).is_some_and(|l| !l.drafts.is_empty())
    }

    /// A session read back whole: the log takes it unless it holds it
    /// already (read back or created meanwhile, and followed since).
    pub(super) fn loaded(&mut self, now: Millis, sid: SessionId, mut log: Box<SessionLog>) {
        if self.store.contains(&sid) {
            return;
        }
        self.resident.remove(&sid);
        log.last_active = now;
        self.store.insert(sid, log);
        self.resident.loads += 1;
    }

    /// Sessions listed at start: those the log does not hold are known
    /// by id from now on, idle since now. With the `first` list the
    /// sessions the start read (those with pending prompts) are in the
    /// log, and their prompts are ordered by arrival across sessions as
    /// before the restart (once: the order is the all-sessions poll's
    /// cursor).
    pub(super) fn dormant_known(&mut self, now: Millis, sids: Vec<SessionId>, first: bool) {
        if first {
            self.store.order_restored();
        }
        for sid in sids {
            if !self.store.contains(&sid) {
                self.resident.listed(sid, now);
            }
        }
    }

    /// Drops the least recently used sessions nothing holds until what the
    /// loop claims of the budget ([`claimed_bytes`](Relay::claimed_bytes))
    /// is an eighth under it (so a pass is not needed again at the next
    /// write), when it is past the budget and the engine reads
    /// sessions back. Called by the shell at the end of every loop turn;
    /// returns how many were dropped. The sessions come in the store's
    /// eviction order ([`MemStore::least_used`](crate::store::MemStore::least_used)):
    /// a pass looks at no more than [`EVICT_STEPS`] of them, and the next
    /// turn's goes on from there.
    pub fn evict(&mut self, now: Millis) -> usize {
        let budget = self.budget_bytes();
        if !self.engine.reads_back() || self.claimed_bytes() <= budget {
            self.resident.stuck_at = None;
            self.store.clock_restart();
            return 0;
        }
        match self.resident.stuck_at {
            Some(at) if now.since(at) < STUCK_RETRY_MS => return 0,
            Some(_) => self.store.clock_restart(),
            None => {}
        }
        let writing: HashSet<&str> = self.writing.values().map(SessionId::as_str).collect();
        let (presence, live) = (&self.presence, &self.live);
        let every_from_log = self.engine.holds_every_prompt();
        let mut held = |sid: &str, log: &SessionLog| {
            presence.contains_key(sid)
                || live.get(sid).is_some_and(|l| !l.drafts.is_empty())
                || writing.contains(sid)
                || (every_from_log && log.pending_len() > 0)
        };
        let target = budget - budget / 8;
        let mut steps = EVICT_STEPS;
        let mut dropped = 0;
        let mut forgotten = Vec::new();
        while self.claimed_bytes() > target {
            let Some((sid, last_active)) = self.store.least_used(&mut steps, &mut held) else {
                break;
            };
            self.store.forget(&sid);
            if self.engine.collects_itself() {
                forgotten.push(sid);
            } else {
                self.resident.add(sid, last_active);
            }
            dropped += 1;
        }
        // As the idle sweep forgets a copy: Redis keeps the session, and
        // its other instances' state here goes too.
        for sid in forgotten {
            self.live.remove(&sid);
        }
        self.resident.evictions += dropped as u64;
        // Stuck only when the hand went round every session: a pass cut
        // short by its steps goes on at the next turn.
        let stuck = self.claimed_bytes() > budget && self.store.clock_turned();
        self.resident.stuck_at = stuck.then_some(now);
        if dropped > 0 {
            debug!(count = dropped, resident = self.store.len(); "sessions dropped from memory");
        }
        dropped
    }
}
