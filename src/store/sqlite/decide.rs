//! The storage thread's writer: each command of a group decided against the
//! mirror of the database ([`Mirror`]), with the same rules as the
//! in-memory engine (dedupe window, `seq`, caps, trimming), and written as
//! one appended row; the group commits as one transaction. A transaction
//! that rolls back leaves nothing behind: not in the file, not in the loop
//! (which applies only what was committed), and not in the mirror, which is
//! read back from the file.

use log::{debug, error, warn};
use rusqlite::types::ValueRef;
use rusqlite::{
    CachedStatement, Connection, OptionalExtension, Transaction, TransactionBehavior, params,
};

use super::generation::GenFile;
use super::mirror::{self, At, Mirror};
use super::schema;

use crate::error::ApiError;
use crate::store::log::prompt_text_of;
use crate::store::mem::{IdGen, StoreLimits};
use crate::store::message::Parts;
use crate::store::record::{Command, Done, Op, Outcome, Record};
use crate::store::types::{Seq, SessionId};
use crate::wire::{decode, push_json_str};

/// A command's refusal (an API error, nothing written) or a database
/// failure (the whole transaction rolls back).
enum Fail {
    Api(ApiError),
    Db(rusqlite::Error),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Fail {
        Fail::Db(e)
    }
}

impl From<ApiError> for Fail {
    fn from(e: ApiError) -> Fail {
        Fail::Api(e)
    }
}

type Decided = Result<(Outcome, Vec<Record>), Fail>;

/// Garbage rows (messages history dropped) deleted together, in the
/// transaction that reaches this many: deleting each at once would dirty a
/// page of its own in every commit, where these were written close together
/// and share pages.
const GARBAGE_BATCH: usize = 256;

/// The storage thread's state: the connection, the limits, the id
/// generator for epochs and message ids it assigns, and the mirror of what
/// the database holds, from which every write is decided.
pub struct Writer {
    conn: Connection,
    limits: StoreLimits,
    ids: IdGen,
    /// `None` after a rebuild failed: rebuilt before the next transaction.
    mirror: Option<Mirror>,
    /// The generation of the last transaction committed (`generation.rs`).
    generation: u64,
    /// The side file the generation is recorded in after each commit.
    file: GenFile,
}

impl Writer {
    /// A writer over an opened, migrated database; reads the whole log once
    /// to build its mirror.
    pub fn new(conn: Connection, limits: StoreLimits, file: GenFile) -> Writer {
        let mut w = Writer {
            conn,
            limits,
            ids: IdGen::new(),
            mirror: None,
            generation: 0,
            file,
        };
        w.rebuild();
        w
    }

    /// Builds the mirror again from the file: at start, and after a
    /// transaction rolled back (its decisions are then in the mirror and
    /// not in the file).
    fn rebuild(&mut self) {
        let read = schema::generation(&self.conn)
            .and_then(|g| Ok((g, schema::mirror(&self.conn, self.limits.history_limit)?)));
        self.mirror = match read {
            Ok((generation, m)) => {
                self.generation = generation;
                Some(m)
            }
            Err(e) => {
                error!(error = e.to_string().as_str(); "cannot read the database back");
                None
            }
        };
    }

    /// Decides every command in one transaction and commits it. Refusals
    /// (404, 409, caps) are answers; a database failure rolls the whole
    /// transaction back and every command in it gets `503`.
    pub fn commit(&mut self, mut cmds: Vec<Command>) -> Vec<Done> {
        if self.mirror.is_none() {
            self.rebuild();
        }
        let Writer {
            conn,
            limits,
            ids,
            mirror,
            generation,
            ..
        } = self;
        // Without a mirror (the file could not be read back) nothing can
        // be decided; `rebuild` logged why.
        if let Some(mirror) = mirror {
            match transaction(conn, *limits, ids, mirror, *generation + 1, &mut cmds) {
                Ok(out) => {
                    *generation += 1;
                    return out;
                }
                Err(e) => {
                    error!(error = e.to_string().as_str(), commands = cmds.len(); "storage write failed");
                    self.rebuild();
                }
            }
        }
        cmds.iter()
            .map(|c| Done {
                ticket: c.ticket,
                result: Err(ApiError::storage_unavailable()),
                records: Vec::new(),
            })
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

/// One group commit: decides each command, deletes the garbage when there
/// is enough of it, writes the transaction's `generation`, and commits. An error rolls everything back (dropping
/// the transaction does) and leaves the mirror ahead of the file. The
/// commands' texts are moved out into what they become (their rows, records
/// and outcomes): a command is decided once, and whatever happens its
/// requester is answered from `conn` alone.
fn transaction(
    conn: &mut Connection,
    limits: StoreLimits,
    ids: &mut IdGen,
    mirror: &mut Mirror,
    generation: u64,
    cmds: &mut [Command],
) -> rusqlite::Result<Vec<Done>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut ctx = Ctx {
        tx: &tx,
        limits,
        ids,
        mirror,
        insert: None,
    };
    let mut out = Vec::with_capacity(cmds.len());
    for cmd in cmds {
        let (result, records) = match ctx.decide(&mut cmd.op) {
            Ok((outcome, records)) => (Ok(outcome), records),
            Err(Fail::Api(e)) => (Err(e), Vec::new()),
            Err(Fail::Db(e)) => return Err(e),
        };
        out.push(Done {
            ticket: cmd.ticket,
            result,
            records,
        });
    }
    if ctx.mirror.garbage() >= GARBAGE_BATCH {
        ctx.collect_garbage()?;
    }
    drop(ctx);
    tx.prepare_cached("UPDATE generation SET n = ?1")?
        .execute([generation as i64])?;
    tx.commit()?;
    Ok(out)
}

/// One transaction's view of the writer.
struct Ctx<'a> {
    tx: &'a Transaction<'a>,
    limits: StoreLimits,
    ids: &'a mut IdGen,
    mirror: &'a mut Mirror,
    /// The row insert, taken from the statement cache once per transaction
    /// rather than once per row (each take hashes the SQL text).
    insert: Option<CachedStatement<'a>>,
}

impl Ctx<'_> {
    fn decide(&mut self, op: &mut Op) -> Decided {
        match op {
            Op::Prompt {
                sid,
                id,
                prompt,
                metadata,
                ts,
            } => self.prompt(sid, id.take(), prompt, metadata.as_deref(), *ts),
            Op::Response {
                sid,
                client_msg_id,
                id,
                text,
                metadata,
                ts,
            } => self.response(
                sid,
                client_msg_id,
                id.take(),
                text,
                metadata.as_deref(),
                *ts,
            ),
            Op::Create { sid, put } => {
                let (at, created) = self.session_or_create(sid)?;
                let epoch = self
                    .mirror
                    .at(at)
                    .map_or_else(String::new, |s| s.epoch.clone());
                let outcome = Outcome::Session {
                    sid: sid.clone(),
                    epoch,
                    created: created.is_some(),
                    put: *put,
                };
                Ok((outcome, created.into_iter().collect()))
            }
            Op::Delete { sid } => {
                if !self.delete(sid)? {
                    return Err(ApiError::session_not_found().into());
                }
                Ok((Outcome::Deleted, vec![Record::Deleted { sid: sid.clone() }]))
            }
            Op::Collect { sids } => {
                let mut records = Vec::new();
                for sid in sids {
                    if self.delete(sid)? {
                        records.push(Record::Deleted { sid: sid.clone() });
                    }
                }
                Ok((Outcome::Collected, records))
            }
        }
    }

    /// Where the session is, created with a new epoch if needed (503 at
    /// the cap), and the record of its creation if it was.
    fn session_or_create(&mut self, name: &SessionId) -> Result<(At, Option<Record>), Fail> {
        if let Some(at) = self.mirror.find(name) {
            return Ok((at, None));
        }
        if self.mirror.len() >= self.limits.max_sessions {
            return Err(ApiError::unavailable("session limit reached").into());
        }
        let epoch = self.ids.uuid();
        self.tx
            .prepare_cached(
                "INSERT INTO sessions (name, epoch, next_seq, last_assistant, dropped_assistant)
                 VALUES (?1, ?2, 1, 0, 0)",
            )?
            .execute(params![&**name, epoch])?;
        let id = self.tx.last_insert_rowid();
        let record = Record::Created {
            sid: name.clone(),
            epoch: epoch.clone(),
        };
        self.mirror
            .insert(mirror::Session::new(name, id, epoch, 1, 0, 0));
        let at = self
            .mirror
            .find(name)
            .ok_or_else(ApiError::session_not_found)?;
        Ok((at, Some(record)))
    }

    /// Deletes a session and every row it still needs; false if there is
    /// none. Its garbage rows go with the next collection.
    fn delete(&mut self, name: &str) -> rusqlite::Result<bool> {
        let Some(s) = self.mirror.get(name) else {
            return Ok(false);
        };
        let mut st = self
            .tx
            .prepare_cached("DELETE FROM messages WHERE id = ?1")?;
        for row in s.rows() {
            st.execute([row])?;
        }
        self.tx
            .prepare_cached("DELETE FROM sessions WHERE id = ?1")?
            .execute([s.id])?;
        self.mirror.remove(name);
        Ok(true)
    }

    /// Deletes the rows history dropped, and writes the counters of their
    /// sessions, which restore takes as its floor (`next_seq`, the newest
    /// answer, the newest answer dropped) since the rows that set them are
    /// gone.
    fn collect_garbage(&mut self) -> rusqlite::Result<()> {
        let (rows, dirty) = self.mirror.take_garbage();
        let mut st = self.tx.prepare_cached(
            "UPDATE sessions SET next_seq = ?2, last_assistant = ?3, dropped_assistant = ?4
             WHERE id = ?1",
        )?;
        for s in dirty {
            st.execute(params![
                s.id,
                s.next_seq as i64,
                s.last_assistant as i64,
                s.dropped_assistant as i64
            ])?;
        }
        let mut st = self
            .tx
            .prepare_cached("DELETE FROM messages WHERE id = ?1")?;
        for row in rows {
            st.execute([row])?;
        }
        Ok(())
    }

    /// Appends a message's row; returns its rowid.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        session: i64,
        seq: u64,
        kind: i64,
        client_msg_id: &str,
        assistant_msg_id: Option<&str>,
        ts: u64,
        data: &str,
    ) -> rusqlite::Result<i64> {
        let st = match &mut self.insert {
            Some(st) => st,
            slot => slot.insert(self.tx.prepare_cached(
                "INSERT INTO messages (session, seq, kind, client_msg_id, assistant_msg_id, ts, data)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?),
        };
        st.execute(params![
            session,
            seq as i64,
            kind,
            client_msg_id,
            assistant_msg_id,
            ts as i64,
            data
        ])?;
        Ok(self.tx.last_insert_rowid())
    }

    fn prompt(
        &mut self,
        sid: &SessionId,
        id: Option<(String, String)>,
        prompt: &str,
        metadata: Option<&str>,
        ts: u64,
    ) -> Decided {
        let (at, created) = self.session_or_create(sid)?;
        let (id, literal) = self.id_and_literal(id);
        let Some(s) = self.mirror.at(at) else {
            return Err(ApiError::session_not_found().into());
        };
        // Hashed once for the lookup and the insert.
        let hash = s.prompt_hash(&id);
        if let Some(p) = s.prompt_hashed(hash, &id) {
            // A resend repeats the text (compared decoded); another text
            // under the same id is refused. Once only the id is
            // remembered, a resend is all it can be.
            if let Some(row) = p.row() {
                let stored = stored_row(self.tx, row)?;
                let text = stored.and_then(|(data, _)| prompt_text_of(&data));
                if text.is_some_and(|t| t != decode(prompt)) {
                    return Err(ApiError::prompt_conflict().into());
                }
            }
            return Ok((
                Outcome::Prompt {
                    id,
                    duplicate: true,
                },
                // No allocation unless the session is new.
                created.into_iter().collect(),
            ));
        }
        if s.pending() >= self.limits.max_pending {
            return Err(
                ApiError::unavailable("pending prompt limit reached for this session").into(),
            );
        }
        let (session, seq) = (s.id, s.next_seq);
        let data = data(&Parts {
            session_id: sid,
            id_literal: &literal,
            prompt_id: None,
            text: prompt,
            metadata,
            ts,
            seq: Seq(seq),
        });
        let row = self.insert(session, seq, 0, &id, None, ts, &data)?;
        self.mirror.append_prompt(at, seq, row, &id, hash);
        let record = Record::Prompt {
            sid: sid.clone(),
            seq: Seq(seq),
            ts,
            client_msg_id: id.clone(),
            data,
        };
        // Allocated at its size: a pushed-to empty list grows through
        // the allocator's slower path.
        let records = match created {
            Some(c) => vec![c, record],
            None => vec![record],
        };
        Ok((
            Outcome::Prompt {
                id,
                duplicate: false,
            },
            records,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn response(
        &mut self,
        sid: &SessionId,
        client_msg_id: &str,
        id: Option<(String, String)>,
        text: &str,
        metadata: Option<&str>,
        ts: u64,
    ) -> Decided {
        let given = id.is_some();
        let (id, literal) = self.id_and_literal(id);
        let at = self
            .mirror
            .find(sid)
            .ok_or_else(ApiError::session_not_found)?;
        let s = self.mirror.at(at).ok_or_else(ApiError::session_not_found)?;
        if given && let Some(prev) = s.answer(&id) {
            // A resend repeats the prompt and the text (compared decoded,
            // so another escaping of the same text is the same).
            if *prev.client_msg_id == *client_msg_id {
                // Read back as bytes and checked: a damaged row refuses
                // this command alone, not the whole transaction.
                let (stored, seq) =
                    stored_row(self.tx, prev.row)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
                if !schema::json_object(&stored) {
                    error!(session_id = sid.as_str(), seq = seq; "stored message damaged; its resend answered 500");
                    return Err(ApiError::stored_message_damaged(seq as u64).into());
                }
                if stored_text(&String::from_utf8_lossy(&stored)) == decode(text) {
                    return Ok((
                        Outcome::Response {
                            id,
                            duplicate: true,
                        },
                        Vec::new(),
                    ));
                }
            }
            return Err(ApiError::conflict().into());
        }
        if s.prompt(client_msg_id).is_none() {
            return Err(ApiError::prompt_not_found().into());
        }
        let (session, seq) = (s.id, s.next_seq);
        let data = Parts {
            session_id: sid,
            id_literal: &literal,
            prompt_id: Some(client_msg_id),
            text,
            metadata,
            ts,
            seq: Seq(seq),
        }
        .framed();
        let row = self.insert(session, seq, 1, client_msg_id, Some(&id), ts, data.data())?;
        self.mirror.append_answer(at, seq, row, client_msg_id, &id);
        let record = Record::Response {
            sid: sid.clone(),
            seq: Seq(seq),
            ts,
            client_msg_id: client_msg_id.to_string(),
            assistant_msg_id: id.clone(),
            data,
        };
        Ok((
            Outcome::Response {
                id,
                duplicate: false,
            },
            vec![record],
        ))
    }

    /// The client's id and its literal, or a new UUID and its literal.
    fn id_and_literal(&mut self, given: Option<(String, String)>) -> (String, String) {
        match given {
            Some(pair) => pair,
            None => {
                let uuid = self.ids.uuid();
                let mut lit = String::with_capacity(uuid.len() + 2);
                push_json_str(&mut lit, &uuid);
                (uuid, lit)
            }
        }
    }
}

/// A message's `data` object as text.
fn data(parts: &Parts) -> String {
    parts.data()
}

/// The decoded `text` of a stored answer's `data`.
fn stored_text(data: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Text {
        text: String,
    }
    serde_json::from_str::<Text>(data).map_or_else(|_| String::new(), |t| t.text)
}

/// A stored message's `data` (as bytes, however the row holds it) and its
/// `seq`, by row id; `None` when the row is gone. Read back only on the
/// resend paths, where a stored text is compared with the one sent.
fn stored_row(tx: &Transaction, row: i64) -> rusqlite::Result<Option<(Vec<u8>, i64)>> {
    tx.prepare_cached("SELECT data, seq FROM messages WHERE id = ?1")?
        .query_row([row], |r| {
            let data = match r.get_ref(0)? {
                ValueRef::Text(b) | ValueRef::Blob(b) => b.to_vec(),
                _ => Vec::new(),
            };
            Ok((data, r.get(1)?))
        })
        .optional()
}
