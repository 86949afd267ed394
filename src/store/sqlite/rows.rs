//! The storage thread's row bookkeeping, beside its copy of the log: the
//! `sessions` row of each session, the row of each message the log still
//! retains (a prompt while pending or in history, an answer while in
//! history), and the rows it no longer needs. Those are garbage: rows the
//! database still holds, deleted in bulk later ([`Rows::take_garbage`]),
//! because a row deleted at once would dirty a page of its own in every
//! commit.
//!
//! Read from the file with the log ([`Rows::read`]), and read again after
//! a transaction rolls back, so a failed commit never leaves it ahead of
//! the file.

use std::collections::{BTreeMap, HashMap, HashSet};

use rusqlite::Connection;

use crate::store::mem::MemStore;
use crate::store::types::{Seq, SessionId};
use crate::store::SessionLog;

/// One session's rows.
struct Session {
    /// The `sessions` row.
    id: i64,
    /// Retained messages' rows, by `seq`.
    by_seq: BTreeMap<u64, i64>,
    /// Rows of this session went to the garbage since its counters were
    /// last written (it is then in `Rows::dirty`).
    dirty: bool,
}

#[derive(Default)]
pub struct Rows {
    sessions: HashMap<SessionId, Session>,
    garbage: Vec<i64>,
    /// Sessions whose counters (`next_seq`, the newest answer, the newest
    /// answer dropped) are written when their garbage is deleted: restore
    /// takes them as its floor, since the rows that set them are gone.
    dirty: Vec<SessionId>,
}

impl Rows {
    /// The rows of the file, for `log` as restored from the same file:
    /// what the log does not retain (trimmed at restore, or left by a
    /// deleted session before a restart) is garbage from the start.
    pub fn read(conn: &Connection, log: &MemStore) -> rusqlite::Result<Rows> {
        let mut rows = Rows::default();
        let mut names: HashMap<i64, SessionId> = HashMap::new();
        let mut known: HashSet<i64> = HashSet::new();
        let mut st = conn.prepare("SELECT id, name FROM sessions")?;
        let mut q = st.query([])?;
        while let Some(r) = q.next()? {
            let id: i64 = r.get(0)?;
            known.insert(id);
            // A session restore skipped (an invalid id) keeps its rows.
            if let Some(sid) = SessionId::new(r.get_ref(1)?.as_str()?) {
                names.insert(id, sid);
            }
        }
        for (&id, sid) in &names {
            rows.created(sid.clone(), id);
        }
        let mut st = conn.prepare("SELECT id, session, seq FROM messages")?;
        let mut q = st.query([])?;
        while let Some(r) = q.next()? {
            let (row, session, seq): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            match names.get(&session) {
                Some(sid) => rows.appended(sid, Seq(seq as u64), row),
                None if !known.contains(&session) => rows.garbage.push(row),
                None => {}
            }
        }
        for sid in names.values() {
            if let Some(l) = log.get(sid) {
                rows.trim(sid, l);
            }
        }
        Ok(rows)
    }

    /// The `sessions` row of `sid`.
    pub fn session(&self, sid: &str) -> Option<i64> {
        self.sessions.get(sid).map(|s| s.id)
    }

    pub fn created(&mut self, sid: SessionId, id: i64) {
        let s = Session {
            id,
            by_seq: BTreeMap::new(),
            dirty: false,
        };
        self.sessions.insert(sid, s);
    }

    pub fn appended(&mut self, sid: &str, seq: Seq, row: i64) {
        if let Some(s) = self.sessions.get_mut(sid) {
            s.by_seq.insert(seq.get(), row);
        }
    }

    /// A deleted session's `sessions` row and every message row it still
    /// needs (its garbage goes with the next collection).
    pub fn deleted(&mut self, sid: &str) -> Option<(i64, Vec<i64>)> {
        let s = self.sessions.remove(sid)?;
        Some((s.id, s.by_seq.into_values().collect()))
    }

    /// After a change to the log of `sid`: the rows it no longer retains
    /// become garbage. Below the oldest `seq` history holds, only pending
    /// prompts are retained.
    pub fn trim(&mut self, sid: &SessionId, log: &SessionLog) {
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        let dropped: Vec<u64> = s
            .by_seq
            .range(..log.first_seq().get())
            .map(|(&seq, _)| seq)
            .filter(|&seq| !log.is_pending(Seq(seq)))
            .collect();
        if dropped.is_empty() {
            return;
        }
        for seq in dropped {
            if let Some(row) = s.by_seq.remove(&seq) {
                self.garbage.push(row);
            }
        }
        if !s.dirty {
            s.dirty = true;
            self.dirty.push(sid.clone());
        }
    }

    /// Garbage rows waiting.
    pub fn garbage(&self) -> usize {
        self.garbage.len()
    }

    /// The garbage rows to delete, and the sessions (still here, with
    /// their `sessions` row) whose counters to write with them.
    pub fn take_garbage(&mut self) -> (Vec<i64>, Vec<(SessionId, i64)>) {
        let mut dirty = Vec::with_capacity(self.dirty.len());
        for sid in self.dirty.drain(..) {
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.dirty = false;
                dirty.push((sid, s.id));
            }
        }
        (std::mem::take(&mut self.garbage), dirty)
    }
}
