//! The storage thread's cache of its own database: the sessions a write
//! needs, each read back from the file when a command for it arrives and
//! the cache does not hold it ([`Cache::get_or_load`], by the same replay
//! that gives the loop a session read back, so a decision on a session
//! read back is the decision on one never dropped), and the least recently
//! used ones dropped once the cache holds more than its share of the
//! memory budget ([`Share`], [`Cache::evict_to`]).
//!
//! Invariants: the cache's log ([`MemStore`]) and its rows ([`Rows`]) hold
//! the same sessions, each once in the use order; the log counts the
//! sessions it does not hold for the session cap (read at start with
//! `count(*)`, kept as sessions are dropped and read back); a session
//! whose counters wait for the next garbage collection (`rows.rs`) stays
//! until then, since its counters are read from its log. Nothing here
//! reads the clock: the use order is a counter.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::Connection;

use super::rows::{Rows, Session, TAIL_ROW, Tail};
use super::schema;
use crate::store::log::SessionLog;
use crate::store::mem::{MemStore, StoreLimits};
use crate::store::types::SessionId;

/// What one followed row weighs: its `(seq, row)` in its session's deque,
/// with the deque's slack.
const ROW: usize = 24;

/// What one cached session weighs besides its log: its rows' entry in
/// their map under its id, and its place in the use order.
const SESSION: usize = 160;

/// The memory budget (`RELAY_MAX_MEMORY`) as the storage thread's cache
/// and the loop share it: one budget, counted in one figure
/// (`relay_memory_bytes`, the loop's count plus [`held`](Self::held)).
/// The cache may hold what the loop leaves of the budget, and a quarter
/// of it whatever the loop holds: a cache smaller than the sessions
/// written in turn reads a session back for nearly every write.
#[derive(Debug, Default)]
pub struct Share {
    budget: usize,
    /// The bytes the cache holds (the storage thread publishes them).
    pub held: AtomicU64,
    /// The bytes the loop holds (it publishes them every turn).
    pub others: AtomicU64,
}

impl Share {
    /// The split of a budget of `budget` bytes, nothing held yet.
    pub fn new(budget: usize) -> Share {
        Share {
            budget,
            ..Share::default()
        }
    }

    /// What the cache may hold now.
    pub fn room(&self) -> usize {
        let others = self.others.load(Ordering::Relaxed) as usize;
        (self.budget / 4).max(self.budget.saturating_sub(others))
    }
}

/// The sessions the storage thread holds, and where their rows are.
pub struct Cache {
    /// The sessions' logs, decided on by the memory engine's rules.
    pub(super) log: MemStore,
    /// Where each cached session's rows are, and the garbage.
    pub(super) rows: Rows,
    /// The rows `session_rows` does not list yet, as the file holds them
    /// (`schema.rs`).
    pub(super) tail: Tail,
    /// Rows followed, over every cached session.
    pub(super) followed: usize,
    /// The cached sessions by their last use, oldest first.
    by_use: BTreeMap<u64, SessionId>,
    /// Uses so far.
    uses: u64,
}

impl Cache {
    /// An empty cache over a file that holds `sessions` sessions and
    /// whose log ends with `tail`.
    pub fn new(limits: StoreLimits, sessions: usize, tail: Tail) -> Cache {
        let mut log = MemStore::new(limits);
        log.set_absent(sessions);
        Cache {
            log,
            rows: Rows::default(),
            tail,
            followed: 0,
            by_use: BTreeMap::new(),
            uses: 0,
        }
    }

    /// The bytes the cache holds, as the memory budget counts them: the
    /// logs (`store/log/weight.rs`), the rows beside them and the tail's
    /// list. No walk.
    pub fn bytes(&self) -> usize {
        self.log.logs_memory()
            + self.followed * ROW
            + self.rows.sessions.len() * SESSION
            + self.tail.len() * TAIL_ROW
    }

    /// The session `sid`, marked as just used: the cache's, or read back
    /// from `conn` (its `sessions` row and its rows, through
    /// `session_rows` and the tail)
    /// when the cache does not hold it. `None` when the file has no such
    /// session either. Called for every session a command names, before
    /// it is decided.
    pub fn get_or_load(
        &mut self,
        conn: &Connection,
        sid: &str,
    ) -> rusqlite::Result<Option<&SessionLog>> {
        let key = match self.log.key(sid) {
            Some(key) => key.clone(),
            None => {
                let Some(key) = SessionId::new(sid) else {
                    return Ok(None);
                };
                let limit = self.log.limits().history_limit;
                let Some(loaded) = schema::load(conn, sid, limit, &self.tail)? else {
                    return Ok(None);
                };
                let mut rows = Session::loaded(loaded.id, loaded.rows);
                // Rows history dropped before the session left (or before
                // a restart) and not collected yet are garbage again.
                rows.trim(&key, &loaded.log, None, &mut self.rows.garbage);
                self.followed += rows.followed();
                self.rows.sessions.insert(key.clone(), rows);
                self.log.reload(key.clone(), loaded.log);
                key
            }
        };
        self.touch(&key);
        Ok(self.log.get(sid))
    }

    /// A session created by a committed record, with its `sessions` row.
    pub fn created(&mut self, sid: &SessionId, id: i64) {
        self.rows.created(sid.clone(), id);
        self.touch(sid);
    }

    /// Whether the session `sid` exists: the cache holds it, or the file
    /// does (looked up, not read back).
    pub fn stored(&self, conn: &Connection, sid: &str) -> rusqlite::Result<bool> {
        Ok(self.log.contains(sid) || schema::session_row(conn, sid)?.is_some())
    }

    /// A session deleted: its rows no longer followed, or, one the cache
    /// did not hold, no longer counted for the session cap. Returns its
    /// `sessions` row (none if the file has no such session).
    pub fn deleted(&mut self, conn: &Connection, sid: &str) -> rusqlite::Result<Option<i64>> {
        if let Some(s) = self.rows.removed(sid) {
            self.by_use.remove(&s.used);
            self.followed -= s.followed();
            return Ok(Some(s.id));
        }
        let id = schema::session_row(conn, sid)?;
        if id.is_some() {
            self.log.absent_deleted();
        }
        Ok(id)
    }

    /// Marks a cached session as just used.
    fn touch(&mut self, sid: &SessionId) {
        let Some(s) = self.rows.sessions.get_mut(&**sid) else {
            return;
        };
        self.by_use.remove(&s.used);
        self.uses += 1;
        s.used = self.uses;
        self.by_use.insert(self.uses, sid.clone());
    }

    /// Drops the least recently used sessions until the cache holds at
    /// most `share` bytes, except those whose counters wait for the next
    /// garbage collection. Called between transactions (a transaction
    /// holds every session it names until it commits). Returns how many
    /// it dropped.
    pub fn evict_to(&mut self, share: usize) -> usize {
        let mut kept = Vec::new();
        let mut dropped = 0;
        while self.bytes() > share {
            let Some((used, sid)) = self.by_use.pop_first() else {
                break;
            };
            if self.rows.sessions.get(&*sid).is_some_and(Session::dirty) {
                kept.push((used, sid));
                continue;
            }
            if let Some(s) = self.rows.removed(&sid) {
                self.followed -= s.followed();
            }
            self.log.evict(&sid);
            dropped += 1;
        }
        self.by_use.extend(kept);
        dropped
    }
}
