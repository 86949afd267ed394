//! The storage thread's writer: each command of a group decided by the
//! memory engine's own rules ([`MemStore`](crate::store::mem::MemStore))
//! over the sessions it names, as the file holds them (the thread's
//! [`Cache`], which reads a session back when it does not hold it; a
//! sweep's sessions are only looked up), and its records written as rows (one
//! appended row per message); the group commits as one transaction. The
//! writer adds only what the file needs: where each retained message's row
//! is, and which rows history dropped (`rows.rs`). A transaction that rolls
//! back leaves nothing behind: not in the file, not in the loop (which
//! applies only what was committed), and not in the thread's cache, which
//! is dropped whole and read back from the file as sessions are needed.
//! Between transactions the cache is brought down to its share of the
//! memory budget; its bytes are published for the loop's count.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use log::{debug, error, warn};
use rusqlite::{CachedStatement, Connection, Transaction, TransactionBehavior, params};

mod load;
pub use load::reads_only;

use super::cache::{Cache, Share};
use super::generation::GenFile;
use super::rows::{TAIL_ROWS, Tail};
use super::schema;

use crate::error::ApiError;
use crate::store::log::SessionLog;
use crate::store::mem::{Applied, StoreLimits};
use crate::store::record::{Command, Done, Op, Outcome, Record};
use crate::time::Millis;

/// The thread's clock for its copy of the log: only the loop's copy
/// tracks activity (the loop picks idle sessions and sends their ids).
const NOW: Millis = Millis(0);

/// Garbage rows (messages history dropped) deleted together, in the
/// transaction that reaches this many: deleting each at once would dirty a
/// page of its own in every commit, where these were written close together
/// and share pages.
const GARBAGE_BATCH: usize = 256;

/// The storage thread's state: the connection, the limits, and the cache
/// of the sessions every write is decided on.
pub struct Writer {
    conn: Connection,
    limits: StoreLimits,
    /// `None` after reading the file back failed: read again before the
    /// next transaction.
    state: Option<Cache>,
    /// The budget the cache shares with the loop: what it may hold
    /// between transactions, and where it publishes what it holds.
    share: Arc<Share>,
    /// The generation of the last transaction committed (`generation.rs`).
    generation: u64,
    /// The side file the generation is recorded in after each commit.
    file: GenFile,
}

impl Writer {
    /// A writer over an opened, migrated database, with an empty cache
    /// held to `share` between transactions. Reads no session.
    pub fn new(conn: Connection, limits: StoreLimits, file: GenFile, share: Arc<Share>) -> Writer {
        let mut w = Writer {
            conn,
            limits,
            state: None,
            share,
            generation: 0,
            file,
        };
        w.rebuild();
        w
    }

    /// Starts the cache over, empty, from what the file says (its
    /// generation, how many sessions it holds, as its `generation` row
    /// says): at start, and after a transaction rolled back (its decisions
    /// are then in the cache and not in the file). Reads the log's tail
    /// (at most about [`TAIL_ROWS`] rows), no session.
    fn rebuild(&mut self) {
        let read =
            schema::counts(&self.conn).and_then(|counts| Ok((counts, schema::tail(&self.conn)?)));
        self.state = match read {
            Ok(((generation, sessions), tail)) => {
                self.generation = generation;
                Some(Cache::new(self.limits, sessions, tail))
            }
            Err(e) => {
                error!(error = e.to_string().as_str(); "cannot read the database back");
                None
            }
        };
        self.publish();
    }

    /// Publishes what the cache holds for the loop's count.
    fn publish(&self) {
        let bytes = self.state.as_ref().map_or(0, Cache::bytes);
        self.share.held.store(bytes as u64, Ordering::Relaxed);
    }

    /// The session `sid` as the file holds it: the cache's copy, or read
    /// back into the cache (marked as just used either way). `None` when
    /// the file has no such session, or cannot be read (logged). Between
    /// transactions, for whoever needs a session the cache may not hold.
    pub fn get_or_load(&mut self, sid: &str) -> Option<&SessionLog> {
        if self.state.is_none() {
            self.rebuild();
        }
        let cache = self.state.as_mut()?;
        if let Err(e) = cache.get_or_load(&self.conn, sid) {
            error!(session_id = sid, error = e.to_string().as_str(); "cannot read a session back");
            return None;
        }
        let bytes = cache.bytes();
        self.share.held.store(bytes as u64, Ordering::Relaxed);
        self.state.as_ref()?.log.get(sid)
    }

    /// Decides every command in one transaction and commits it. Refusals
    /// (404, 409, caps) are answers; a database failure rolls the whole
    /// transaction back and every command in it gets `503`.
    pub fn commit(&mut self, mut cmds: Vec<Command>) -> Vec<Done> {
        if self.state.is_none() {
            self.rebuild();
        }
        if cmds.iter().all(load::reads_only) {
            // What the loop read back grows its share: the cache gives
            // back what that leaves it no room for.
            let out = self.read_only(cmds);
            if let Some(state) = &mut self.state {
                state.evict_to(self.share.room());
            }
            self.publish();
            return out;
        }
        // Without a copy (the file could not be read back) nothing can be
        // decided; `rebuild` logged why.
        if let Some(state) = &mut self.state {
            match transaction(&mut self.conn, state, self.generation + 1, &mut cmds) {
                Ok(out) => {
                    self.generation += 1;
                    state.evict_to(self.share.room());
                    self.publish();
                    return out;
                }
                Err(e) => {
                    error!(error = e.to_string().as_str(), commands = cmds.len(); "storage write failed");
                    self.rebuild();
                }
            }
        }
        cmds.iter()
            .map(|c| Done::only(c.ticket, Err(ApiError::storage_unavailable())))
            .collect()
    }

    /// A small write, committed like any transaction (the schema version
    /// written again, which rewrites the database's first page): whether
    /// writes succeed again after a failure. Changes nothing a client sees.
    pub fn probe(&mut self) -> bool {
        let sql = format!(
            "BEGIN IMMEDIATE; PRAGMA user_version = {}; COMMIT;",
            schema::VERSION
        );
        match self.conn.execute_batch(&sql) {
            Ok(()) => true,
            Err(e) => {
                debug!(error = e.to_string().as_str(); "storage probe failed");
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK;");
                }
                false
            }
        }
    }

    /// Writes the generation of the last commit into the side file; false
    /// (logged) when it cannot. Called after a commit, before anything it
    /// carries is answered. The commit stands, since it is durable: only a
    /// lost log could then go unnoticed, and the storage counts as failing.
    pub fn record_generation(&mut self) -> bool {
        match self.file.record(self.generation) {
            Ok(()) => true,
            Err(e) => {
                error!(error = e.to_string().as_str(); "cannot write relay.generation");
                false
            }
        }
    }

    /// Makes the recorded generation durable; called with the checkpoints.
    pub fn sync_generation(&mut self) {
        self.file.sync();
    }

    /// The database file.
    pub fn db_path(&self) -> std::path::PathBuf {
        self.conn.path().unwrap_or_default().into()
    }

    /// Off: checkpoints are left to the checkpointer thread, and no commit
    /// copies the log into the database. On: a commit does once the log
    /// holds [`schema::AUTOCHECKPOINT_PAGES`] (SQLite's own way).
    pub fn automatic_checkpoints(&mut self, on: bool) {
        let pages = if on { schema::AUTOCHECKPOINT_PAGES } else { 0 };
        let sql = format!("PRAGMA wal_autocheckpoint = {pages};");
        if let Err(e) = self.conn.execute_batch(&sql) {
            warn!(error = e.to_string().as_str(); "cannot set automatic checkpoints");
        }
    }

    /// Copies what the checkpointer has not copied yet into the database,
    /// between two transactions, so that the next one starts the log over.
    /// False when the copy did not reach the end of the log (the
    /// checkpointer held the checkpoint at that moment, or it failed): the
    /// caller tries again before the next transaction, or the log would
    /// grow by everything written until the checkpointer's next round.
    pub fn catch_up(&mut self) -> bool {
        self.wal_checkpoint("PRAGMA wal_checkpoint(PASSIVE)")
    }

    /// Copies the log into the database file and syncs it: the interval
    /// flush of `RELAY_SYNC=<seconds>`, and the last act before exit.
    /// True when the whole log was copied and synced.
    pub fn checkpoint(&mut self) -> bool {
        self.wal_checkpoint("PRAGMA wal_checkpoint(TRUNCATE)")
    }

    /// Runs one `wal_checkpoint` pragma; true when it copied the whole log
    /// (nothing held it busy).
    fn wal_checkpoint(&mut self, pragma: &str) -> bool {
        // (busy, frames in the log, frames copied)
        let copied = self.conn.query_row(pragma, [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        });
        match copied {
            Ok((busy, log, done)) => busy == 0 && done >= log,
            Err(e) => {
                warn!(error = e.to_string().as_str(); "checkpoint failed");
                false
            }
        }
    }
}

/// One group commit: decides each command and writes its records, deletes
/// the garbage when there is enough of it, writes the transaction's
/// `generation`, and commits. An error rolls everything back (dropping the
/// transaction does) and leaves the copy ahead of the file (the caller
/// reads it back). A command's records go back to the loop, which applies
/// them to its own copy as the thread did to this one.
fn transaction(
    conn: &mut Connection,
    state: &mut Cache,
    generation: u64,
    cmds: &mut [Command],
) -> rusqlite::Result<Vec<Done>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut w = RowWriter {
        tx: &tx,
        insert: None,
    };
    let mut out = Vec::with_capacity(cmds.len());
    for cmd in cmds {
        let mut records = Vec::new();
        let mut images = Vec::new();
        let read = state.read_for_loop(&tx, cmd, &mut images)?;
        // Decided once: the write moves into its decision.
        let op = std::mem::replace(&mut cmd.op, Op::Collect { sids: Vec::new() });
        let result = match read {
            Some(outcome) => Ok(outcome),
            None => decide(state, &tx, op, cmd.unix_ms, &mut records)?,
        };
        for record in &records {
            let (sid, seq) = match record {
                Record::Prompt { sid, seq, .. }
                | Record::Response { sid, seq, .. }
                | Record::Cancel { sid, seq, .. }
                | Record::Ask { sid, seq, .. }
                | Record::Reply { sid, seq, .. } => (sid, *seq),
                Record::Created { .. } | Record::Deleted { .. } => {
                    w.write(state, record)?;
                    state.log.apply(NOW, record.clone());
                    continue;
                }
            };
            // A message: its row appended, the record applied to the copy,
            // then the rows the copy no longer retains go to the garbage
            // (with the prompt an answer answered or a cancel stopped, if
            // the log knew it).
            let Some(s) = state.rows.sessions.get_mut(&**sid) else {
                return Err(rusqlite::Error::QueryReturnedNoRows);
            };
            let before = s.followed();
            let was_pending = state.log.get(sid).is_some_and(|l| l.pending_len() > 0);
            let row = w.insert(s.id, record)?;
            if row > state.tail.upto {
                state.tail.push(s.id, row);
            } else {
                // A rowid given again (the largest was deleted): listed now.
                w.list(s.id, row)?;
            }
            s.appended(seq, row);
            let mut answered = match record {
                Record::Response { client_msg_id, .. } | Record::Cancel { client_msg_id, .. } => {
                    state.log.get(sid).and_then(|l| l.prompt_seq(client_msg_id))
                }
                _ => None,
            };
            // Asks the log forgot (closed, below history): their rows go.
            match state.log.apply(NOW, record.clone()) {
                Applied::Ask { forgotten, .. } => {
                    s.forget(sid, &forgotten, &mut state.rows.garbage)
                }
                Applied::Reply { forgotten, .. } => answered = forgotten,
                _ => {}
            }
            if let Some(log) = state.log.get(sid) {
                s.trim(sid, log, answered, &mut state.rows.garbage);
            }
            state.followed = state.followed + s.followed() - before;
            let pending = state.log.get(sid).is_some_and(|l| l.pending_len() > 0);
            if pending != was_pending {
                w.pending(s.id, pending)?;
            }
        }
        out.push(Done {
            ticket: cmd.ticket,
            result,
            records,
            images,
        });
    }
    if state.rows.garbage.len() >= GARBAGE_BATCH {
        w.collect_garbage(state)?;
    }
    if state.tail.len() >= TAIL_ROWS {
        w.index_tail(&mut state.tail)?;
    }
    drop(w);
    tx.prepare_cached("UPDATE generation SET n = ?1, sessions = ?2, indexed = ?3")?
        .execute([
            generation as i64,
            state.log.stored() as i64,
            state.tail.upto,
        ])?;
    tx.commit()?;
    Ok(out)
}

/// A command, decided by the memory engine's rules over the session it
/// names (read back into the cache if the cache lacks it); its records
/// pushed onto `out` (none when refused). The outer error is the file's.
fn decide(
    state: &mut Cache,
    tx: &Transaction<'_>,
    op: Op,
    unix_ms: u64,
    out: &mut Vec<Record>,
) -> rusqlite::Result<Result<Outcome, ApiError>> {
    Ok(match op {
        // The write carries its time, and the loop's clock comes with it:
        // the thread's clock is not asked.
        Op::Write(w) => {
            state.get_or_load(tx, w.session())?;
            state.log.decide(NOW, unix_ms, w, out)
        }
        // A sweep's sessions go whole: one the cache lacks is looked up,
        // not read back.
        Op::Collect { sids } => {
            for sid in sids {
                if state.stored(tx, &sid)? {
                    out.push(Record::Deleted { sid });
                }
            }
            Ok(Outcome::Collected)
        }
        // Answered before the decision (`Cache::read_for_loop`).
        Op::Load { .. } | Op::Warm | Op::Dormant { .. } => Ok(Outcome::Loaded),
    })
}

/// One transaction's row writes.
struct RowWriter<'a> {
    tx: &'a Transaction<'a>,
    /// The row insert, taken from the statement cache once per transaction
    /// rather than once per row (each take hashes the SQL text).
    insert: Option<CachedStatement<'a>>,
}

impl RowWriter<'_> {
    /// Writes what a session record changes: a `sessions` row, or a
    /// session's rows deleted.
    /// Messages are [`insert`](Self::insert)ed.
    fn write(&mut self, cache: &mut Cache, record: &Record) -> rusqlite::Result<()> {
        match record {
            Record::Created { sid, epoch } => {
                self.tx
                    .prepare_cached(
                        "INSERT INTO sessions (name, epoch, next_seq, last_assistant, dropped_assistant)
                         VALUES (?1, ?2, 1, 0, 0)",
                    )?
                    .execute(params![sid.as_str(), epoch])?;
                cache.created(sid, self.tx.last_insert_rowid());
            }
            Record::Deleted { sid } => {
                // Every row of the session, those its log retains and
                // those waiting in the garbage: the listed ones through
                // `session_rows`, the tail's by rowid.
                if let Some(session) = cache.deleted(self.tx, sid)? {
                    self.tx
                        .prepare_cached(
                            "DELETE FROM messages
                             WHERE id IN (SELECT id FROM session_rows WHERE session = ?1)",
                        )?
                        .execute([session])?;
                    self.tx
                        .prepare_cached("DELETE FROM session_rows WHERE session = ?1")?
                        .execute([session])?;
                    let mut st = self
                        .tx
                        .prepare_cached("DELETE FROM messages WHERE id = ?1 AND session = ?2")?;
                    for row in cache.tail.rows(session) {
                        st.execute([row, session])?;
                    }
                    cache.tail.remove_session(session);
                    self.tx
                        .prepare_cached("DELETE FROM sessions WHERE id = ?1")?
                        .execute([session])?;
                    self.pending(session, false)?;
                }
            }
            Record::Prompt { .. }
            | Record::Response { .. }
            | Record::Cancel { .. }
            | Record::Ask { .. }
            | Record::Reply { .. } => {}
        }
        Ok(())
    }

    /// Records whether the session of `sessions` row `session` has a
    /// pending prompt now (the start reads those whole, `decide/load.rs`).
    /// A row already there stays: a database migrated from version 7 may
    /// name a session whose log holds none.
    fn pending(&mut self, session: i64, pending: bool) -> rusqlite::Result<()> {
        let sql = if pending {
            "INSERT OR IGNORE INTO pending (session) VALUES (?1)"
        } else {
            "DELETE FROM pending WHERE session = ?1"
        };
        self.tx.prepare_cached(sql)?.execute([session])?;
        Ok(())
    }

    /// Appends a message's row (`session` is its `sessions` row); returns
    /// its rowid.
    fn insert(&mut self, session: i64, record: &Record) -> rusqlite::Result<i64> {
        let (seq, kind, client_msg_id, assistant_msg_id, ts, data) = match record {
            Record::Prompt {
                seq,
                ts,
                client_msg_id,
                data,
                ..
            } => (seq, 0, client_msg_id, None, ts, data.as_str()),
            Record::Response {
                seq,
                ts,
                client_msg_id,
                assistant_msg_id,
                data,
                ..
            } => (
                seq,
                1,
                client_msg_id,
                Some(assistant_msg_id),
                ts,
                data.data(),
            ),
            Record::Cancel {
                seq,
                ts,
                client_msg_id,
                data,
                ..
            } => (seq, 2, client_msg_id, None, ts, data.as_str()),
            // An ask's and a reply's `client_msg_id` column holds the
            // `ask_id` (see `schema.rs`).
            Record::Ask {
                seq,
                ts,
                ask_id,
                data,
                ..
            } => (seq, schema::KIND_ASK, ask_id, None, ts, data.as_str()),
            Record::Reply {
                seq,
                ts,
                ask_id,
                data,
                ..
            } => (seq, schema::KIND_REPLY, ask_id, None, ts, data.as_str()),
            Record::Created { .. } | Record::Deleted { .. } => {
                return Err(rusqlite::Error::InvalidQuery);
            }
        };
        let st = match &mut self.insert {
            Some(st) => st,
            slot => slot.insert(self.tx.prepare_cached(
                "INSERT INTO messages (session, seq, kind, client_msg_id, assistant_msg_id, ts, data)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?),
        };
        st.execute(params![
            session,
            seq.get() as i64,
            kind,
            client_msg_id,
            assistant_msg_id,
            *ts as i64,
            data
        ])?;
        Ok(self.tx.last_insert_rowid())
    }

    /// Deletes the rows history dropped, and writes the counters of their
    /// sessions, which restore takes as its floor (`next_seq`, the newest
    /// answer, the newest answer dropped) since the rows that set them are
    /// gone.
    fn collect_garbage(&mut self, state: &mut Cache) -> rusqlite::Result<()> {
        let (garbage, dirty) = state.rows.take_garbage();
        let mut st = self.tx.prepare_cached(
            "UPDATE sessions SET next_seq = ?2, last_assistant = ?3, dropped_assistant = ?4
             WHERE id = ?1",
        )?;
        for (sid, id) in dirty {
            let Some(log) = state.log.get(&sid) else {
                continue;
            };
            let (next, last, dropped) = log.counters();
            st.execute(params![
                id,
                next.get() as i64,
                last.get() as i64,
                dropped.get() as i64
            ])?;
        }
        let mut st = self
            .tx
            .prepare_cached("DELETE FROM messages WHERE id = ?1")?;
        let mut unlist = self
            .tx
            .prepare_cached("DELETE FROM session_rows WHERE session = ?1 AND id = ?2")?;
        let mut garbage = garbage;
        // Each session's entries together, on its page of the index.
        garbage.sort_unstable();
        for &(session, row) in &garbage {
            st.execute([row])?;
            if row <= state.tail.upto {
                unlist.execute([session, row])?;
            }
        }
        state.tail.remove(&garbage);
        Ok(())
    }

    /// Lists a row in `session_rows` as it is written: one given a rowid
    /// at or below the tail's start.
    fn list(&mut self, session: i64, row: i64) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached("INSERT OR IGNORE INTO session_rows (session, id) VALUES (?1, ?2)")?
            .execute([session, row])?;
        Ok(())
    }

    /// Indexes the log's tail: its rows listed in `session_rows` in one
    /// statement, sorted by session, so each session's page of the index
    /// is written once for all of its rows; the tail then starts after
    /// the newest row. In the transaction of the commit it rides on: a
    /// crash leaves both or neither.
    fn index_tail(&mut self, tail: &mut Tail) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached(
                "INSERT OR IGNORE INTO session_rows (session, id)
                 SELECT session, id FROM messages WHERE id > ?1 ORDER BY session, id",
            )?
            .execute([tail.upto])?;
        let upto: i64 = self.tx.query_row(
            "SELECT coalesce(max(id), ?1) FROM messages",
            [tail.upto],
            |r| r.get(0),
        )?;
        tail.indexed(upto.max(tail.upto));
        Ok(())
    }
}
