//! The storage thread's row bookkeeping, beside its copy of the log: the
//! `sessions` row of each session, the row of each message the log still
//! retains (a prompt while pending or in history, an ask while
//! unanswered or in history, any other message while in history), and
//! the rows it no longer needs. Those are garbage: rows the
//! database still holds, deleted in bulk later ([`Garbage::take`]), because
//! a row deleted at once would dirty a page of its own in every commit.
//!
//! Held for the sessions the thread's cache holds (`cache.rs`): read from
//! the file with each session's log ([`Session::loaded`]), dropped with it,
//! and dropped whole after a transaction rolls back, so a failed commit
//! never leaves it ahead of the file.

use std::collections::{HashMap, VecDeque};

use crate::store::SessionLog;
use crate::store::types::{Seq, SessionId};

/// One session's rows.
pub struct Session {
    /// The `sessions` row.
    pub id: i64,
    /// Retained messages' `(seq, row)`, in `seq` order.
    by_seq: VecDeque<(u64, i64)>,
    /// History's oldest `seq` when rows were last trimmed: every row below
    /// it is a pending prompt.
    floor: u64,
    /// Rows of this session went to the garbage since its counters were
    /// last written (it is then in `Garbage::dirty`).
    dirty: bool,
    /// When the session was last used, in the cache's uses (`cache.rs`).
    pub used: u64,
}

impl Session {
    fn new(id: i64) -> Session {
        Session {
            id,
            by_seq: VecDeque::new(),
            floor: 0,
            dirty: false,
            used: 0,
        }
    }

    /// The rows of the messages the log retains, in `seq` order.
    pub fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.by_seq.iter().map(|&(_, row)| row)
    }

    /// The rows of a session read back (`schema::load`), in the order
    /// written, before [`trim`](Self::trim) sorts out those its log no
    /// longer retains.
    pub fn loaded(id: i64, mut rows: Vec<(u64, i64)>) -> Session {
        // Rows written by hand out of order still count.
        if !rows.is_sorted() {
            rows.sort_unstable();
        }
        Session {
            by_seq: rows.into(),
            ..Session::new(id)
        }
    }

    /// Rows followed.
    pub fn followed(&self) -> usize {
        self.by_seq.len()
    }

    /// Whether its counters wait to be written with the next garbage
    /// collection: its log must stay until then.
    pub fn dirty(&self) -> bool {
        self.dirty
    }

    /// A message's row, appended (messages come in `seq` order).
    pub fn appended(&mut self, seq: Seq, row: i64) {
        self.by_seq.push_back((seq.get(), row));
    }

    /// After a change to the log of `sid`: the rows it no longer retains
    /// become garbage. Those are the messages history dropped since the
    /// last trim, unless pending, and `answered`, a prompt this change
    /// answered, once it is below history. Each row is looked at when it
    /// leaves history, not again: below history only pending prompts are
    /// retained, however many.
    pub fn trim(
        &mut self,
        sid: &SessionId,
        log: &SessionLog,
        answered: Option<Seq>,
        garbage: &mut Garbage,
    ) {
        let first = log.first_seq().get();
        let before = garbage.rows.len();
        if first > self.floor {
            let mut i = self.by_seq.partition_point(|&(seq, _)| seq < self.floor);
            while let Some(&(seq, row)) = self.by_seq.get(i) {
                if seq >= first {
                    break;
                }
                if log.retains(Seq(seq)) {
                    i += 1;
                } else {
                    garbage.rows.push((self.id, row));
                    self.by_seq.remove(i);
                }
            }
            self.floor = first;
        }
        if let Some(seq) = answered.filter(|q| q.get() < first && !log.retains(*q))
            && let Ok(i) = self.by_seq.binary_search_by_key(&seq.get(), |&(s, _)| s)
            && let Some((_, row)) = self.by_seq.remove(i)
        {
            garbage.rows.push((self.id, row));
        }
        if garbage.rows.len() > before && !self.dirty {
            self.dirty = true;
            garbage.dirty.push(sid.clone());
        }
    }
}

impl Session {
    /// Rows of messages the log forgot below history (asks closed since
    /// they left it) go to the garbage.
    pub fn forget(&mut self, sid: &SessionId, seqs: &[Seq], garbage: &mut Garbage) {
        for seq in seqs {
            if let Ok(i) = self.by_seq.binary_search_by_key(&seq.get(), |&(s, _)| s)
                && let Some((_, row)) = self.by_seq.remove(i)
            {
                garbage.rows.push((self.id, row));
                if !self.dirty {
                    self.dirty = true;
                    garbage.dirty.push(sid.clone());
                }
            }
        }
    }
}

/// What [`Garbage::take`] hands over: the rows to delete (`(session,
/// row)`), and the sessions whose counters to write, with their
/// `sessions` row.
pub type Taken = (Vec<(i64, i64)>, Vec<(SessionId, i64)>);

/// Rows waiting to be deleted, and the sessions whose counters (`next_seq`,
/// the newest answer, the newest answer dropped) are written with them:
/// restore takes those as its floor, since the rows that set them are gone.
#[derive(Default)]
pub struct Garbage {
    /// `(session, row)`: the `sessions` row with each message's row.
    rows: Vec<(i64, i64)>,
    dirty: Vec<SessionId>,
}

impl Garbage {
    /// Garbage rows waiting.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// The rows to delete (`(session, row)`), and the sessions (still in
    /// `sessions`, with their `sessions` row) whose counters to write with
    /// them.
    pub fn take(&mut self, sessions: &mut HashMap<SessionId, Session>) -> Taken {
        let mut dirty = Vec::with_capacity(self.dirty.len());
        for sid in self.dirty.drain(..) {
            if let Some(s) = sessions.get_mut(&sid) {
                s.dirty = false;
                dirty.push((sid, s.id));
            }
        }
        (std::mem::take(&mut self.rows), dirty)
    }
}

#[derive(Default)]
pub struct Rows {
    pub sessions: HashMap<SessionId, Session>,
    pub garbage: Garbage,
}

impl Rows {
    pub fn created(&mut self, sid: SessionId, id: i64) {
        self.sessions.insert(sid, Session::new(id));
    }

    /// A session's rows no longer followed: it was deleted, or its log
    /// left the cache.
    pub fn removed(&mut self, sid: &str) -> Option<Session> {
        self.sessions.remove(sid)
    }

    /// The garbage rows to delete, and the sessions whose counters to write.
    pub fn take_garbage(&mut self) -> Taken {
        self.garbage.take(&mut self.sessions)
    }
}

/// The log's unindexed tail (see `schema.rs`): the rows after `upto`,
/// which `session_rows` does not list yet, with their `sessions` row, in
/// the order written. Read from the file when the cache starts over
/// (a range of at most a few [`TAIL_ROWS`] rowids), kept as rows are
/// appended and deleted, and emptied when a transaction lists them.
#[derive(Default)]
pub struct Tail {
    /// The newest row `session_rows` lists (`generation.indexed`).
    pub upto: i64,
    /// `(session, row)`, in the order written.
    rows: Vec<(i64, i64)>,
}

/// Rows in the tail at which a transaction lists them: the index then
/// takes a few rows per session at once, on one page per session, where
/// indexing each commit's rows would write a page per session it
/// touched. Reading a session back looks its tail rows up by rowid.
pub const TAIL_ROWS: usize = 4096;

/// What one tail row weighs in the cache's count, with the vector's
/// slack.
pub const TAIL_ROW: usize = 24;

impl Tail {
    /// The tail after `upto`, holding `rows` (`(session, row)`, in the
    /// order written).
    pub fn new(upto: i64, rows: Vec<(i64, i64)>) -> Tail {
        Tail { upto, rows }
    }

    /// Rows in the tail.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// A row appended after `upto`.
    pub fn push(&mut self, session: i64, row: i64) {
        self.rows.push((session, row));
    }

    /// The tail's rows of `session`, in the order written: a pass over
    /// at most a few thousand pairs, once per session read back.
    pub fn rows(&self, session: i64) -> impl Iterator<Item = i64> + '_ {
        self.rows
            .iter()
            .filter(move |&&(s, _)| s == session)
            .map(|&(_, row)| row)
    }

    /// Rows deleted (`(session, row)`, sorted).
    pub fn remove(&mut self, gone: &[(i64, i64)]) {
        if !gone.is_empty() {
            self.rows.retain(|e| gone.binary_search(e).is_err());
        }
    }

    /// A session's rows deleted.
    pub fn remove_session(&mut self, session: i64) {
        self.rows.retain(|&(s, _)| s != session);
    }

    /// Every row up to `upto` listed: the tail is empty.
    pub fn indexed(&mut self, upto: i64) {
        self.upto = upto;
        self.rows = Vec::new();
    }
}
