//! The storage thread's writer: each command decided inside the group's
//! transaction, with the same rules as the in-memory engine (dedupe window,
//! `seq`, caps, trimming), so a transaction that rolls back leaves nothing
//! behind, in the database or in the loop (which applies only what was
//! committed).

use log::{error, warn};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::relay::ApiError;
use crate::relay::model::{decode, push_json_str};
use crate::store::mem::{IdGen, StoreLimits};
use crate::store::message::Parts;
use crate::store::record::{Command, Done, Op, Outcome, Record};

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

/// A session's row.
struct Session {
    id: i64,
    epoch: String,
    next_seq: i64,
    first_seq: i64,
    pending: i64,
}

/// The storage thread's state: the connection, the limits, and the id
/// generator for epochs and message ids it assigns.
pub struct Writer {
    conn: Connection,
    limits: StoreLimits,
    ids: IdGen,
    /// Sessions in the database (the session cap), recounted after a
    /// rollback.
    sessions: usize,
}

impl Writer {
    /// A writer over an opened, migrated database.
    pub fn new(conn: Connection, limits: StoreLimits) -> Writer {
        let sessions = count_sessions(&conn);
        Writer {
            conn,
            limits,
            ids: IdGen::new(),
            sessions,
        }
    }

    /// Decides every command in one transaction and commits it. Refusals
    /// (404, 409, caps) are answers; a database failure rolls the whole
    /// transaction back and every command in it gets `503`.
    pub fn commit(&mut self, cmds: Vec<Command>) -> Vec<Done> {
        let Writer {
            conn,
            limits,
            ids,
            sessions,
        } = self;
        let before = *sessions;
        let mut out = Vec::with_capacity(cmds.len());
        let failure = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Err(e) => Some(e),
            Ok(tx) => {
                let mut ctx = Ctx {
                    tx: &tx,
                    limits: *limits,
                    ids,
                    sessions,
                };
                let mut failed = None;
                for cmd in &cmds {
                    match ctx.decide(&cmd.op) {
                        Ok((outcome, records)) => out.push(Done {
                            conn: cmd.conn,
                            result: Ok(outcome),
                            records,
                        }),
                        Err(Fail::Api(e)) => out.push(Done {
                            conn: cmd.conn,
                            result: Err(e),
                            records: Vec::new(),
                        }),
                        Err(Fail::Db(e)) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                match failed {
                    Some(e) => Some(e), // dropping `tx` rolls back
                    None => tx.commit().err(),
                }
            }
        };
        let Some(e) = failure else {
            return out;
        };
        error!(error = e.to_string().as_str(), commands = cmds.len(); "storage write failed");
        *sessions = before;
        cmds.iter()
            .map(|c| Done {
                conn: c.conn,
                result: Err(ApiError::storage_unavailable()),
                records: Vec::new(),
            })
            .collect()
    }

    /// Copies the log into the database file and syncs it: the interval
    /// flush of `RELAY_SYNC=<seconds>`, and the last act before exit.
    pub fn checkpoint(&mut self) {
        if let Err(e) = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);") {
            warn!(error = e.to_string().as_str(); "checkpoint failed");
        }
    }
}

fn count_sessions(conn: &Connection) -> usize {
    conn.query_row("SELECT count(*) FROM sessions", [], |r| r.get::<_, i64>(0))
        .map_or(0, |n| n as usize)
}

/// One transaction's view of the writer.
struct Ctx<'a> {
    tx: &'a Transaction<'a>,
    limits: StoreLimits,
    ids: &'a mut IdGen,
    sessions: &'a mut usize,
}

impl Ctx<'_> {
    fn decide(&mut self, op: &Op) -> Decided {
        match op {
            Op::Prompt {
                sid,
                id,
                prompt,
                metadata,
                ts,
            } => self.prompt(sid, id.as_ref(), prompt, metadata.as_deref(), *ts),
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
                id.as_ref(),
                text,
                metadata.as_deref(),
                *ts,
            ),
            Op::Create { sid, put } => {
                let (s, created) = self.session_or_create(sid)?;
                let records = created_record(sid, &s, created);
                let outcome = Outcome::Session {
                    sid: sid.clone(),
                    epoch: s.epoch,
                    created,
                    put: *put,
                };
                Ok((outcome, records))
            }
            Op::Delete { sid } => {
                let s = self.session(sid)?.ok_or_else(ApiError::session_not_found)?;
                self.delete(s.id)?;
                Ok((Outcome::Deleted, vec![Record::Deleted { sid: sid.clone() }]))
            }
            Op::Collect { sids } => {
                let mut records = Vec::new();
                for sid in sids {
                    if let Some(s) = self.session(sid)? {
                        self.delete(s.id)?;
                        records.push(Record::Deleted { sid: sid.clone() });
                    }
                }
                Ok((Outcome::Collected, records))
            }
        }
    }

    fn session(&self, name: &str) -> rusqlite::Result<Option<Session>> {
        let mut st = self.tx.prepare_cached(
            "SELECT id, epoch, next_seq, first_seq, pending FROM sessions WHERE name = ?1",
        )?;
        st.query_row([name], |r| {
            Ok(Session {
                id: r.get(0)?,
                epoch: r.get(1)?,
                next_seq: r.get(2)?,
                first_seq: r.get(3)?,
                pending: r.get(4)?,
            })
        })
        .optional()
    }

    /// The session, created with a new epoch if needed (503 at the cap).
    fn session_or_create(&mut self, name: &str) -> Result<(Session, bool), Fail> {
        if let Some(s) = self.session(name)? {
            return Ok((s, false));
        }
        if *self.sessions >= self.limits.max_sessions {
            return Err(ApiError::unavailable("session limit reached").into());
        }
        let epoch = self.ids.uuid();
        let mut st = self.tx.prepare_cached(
            "INSERT INTO sessions (name, epoch, next_seq, first_seq, last_assistant, dropped_assistant, pending)
             VALUES (?1, ?2, 1, 1, 0, 0, 0)",
        )?;
        st.execute(params![name, epoch])?;
        *self.sessions += 1;
        let s = Session {
            id: self.tx.last_insert_rowid(),
            epoch,
            next_seq: 1,
            first_seq: 1,
            pending: 0,
        };
        Ok((s, true))
    }

    fn delete(&mut self, id: i64) -> rusqlite::Result<()> {
        self.tx
            .prepare_cached("DELETE FROM messages WHERE session = ?1")?
            .execute([id])?;
        self.tx
            .prepare_cached("DELETE FROM sessions WHERE id = ?1")?
            .execute([id])?;
        *self.sessions = self.sessions.saturating_sub(1);
        Ok(())
    }

    fn prompt(
        &mut self,
        sid: &str,
        id: Option<&(String, String)>,
        prompt: &str,
        metadata: Option<&str>,
        ts: u64,
    ) -> Decided {
        let (s, created) = self.session_or_create(sid)?;
        let mut records = created_record(sid, &s, created);
        let (id, literal) = self.id_and_literal(id);
        let exists: Option<i64> = self
            .tx
            .prepare_cached(
                "SELECT seq FROM messages WHERE session = ?1 AND kind = 0 AND client_msg_id = ?2",
            )?
            .query_row(params![s.id, id], |r| r.get(0))
            .optional()?;
        if exists.is_some() {
            return Ok((
                Outcome::Prompt {
                    id,
                    duplicate: true,
                },
                records,
            ));
        }
        if s.pending as usize >= self.limits.max_pending {
            return Err(
                ApiError::unavailable("pending prompt limit reached for this session").into(),
            );
        }
        let seq = s.next_seq as u64;
        let data = data(&Parts {
            session_id: sid,
            id_literal: &literal,
            prompt_id: None,
            text: prompt,
            metadata,
            ts,
            seq,
        });
        self.tx
            .prepare_cached(
                "INSERT INTO messages (session, seq, kind, client_msg_id, assistant_msg_id, ts, in_history, answered, data)
                 VALUES (?1, ?2, 0, ?3, NULL, ?4, 1, 0, ?5)",
            )?
            .execute(params![s.id, seq as i64, id, ts as i64, data])?;
        self.tx
            .prepare_cached(
                "UPDATE sessions SET next_seq = ?2, pending = pending + 1 WHERE id = ?1",
            )?
            .execute(params![s.id, seq as i64 + 1])?;
        self.trim(&s, seq as i64 + 1)?;
        records.push(Record::Prompt {
            sid: sid.to_string(),
            seq,
            ts,
            client_msg_id: id.clone(),
            data,
        });
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
        sid: &str,
        client_msg_id: &str,
        id: Option<&(String, String)>,
        text: &str,
        metadata: Option<&str>,
        ts: u64,
    ) -> Decided {
        let s = self.session(sid)?.ok_or_else(ApiError::session_not_found)?;
        let given = id.is_some();
        let (id, literal) = self.id_and_literal(id);
        if given {
            let prev: Option<(String, String)> = self
                .tx
                .prepare_cached(
                    "SELECT client_msg_id, data FROM messages
                     WHERE session = ?1 AND kind = 1 AND assistant_msg_id = ?2",
                )?
                .query_row(params![s.id, id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if let Some((prev_prompt, prev_data)) = prev {
                // A resend repeats the prompt and the text (compared
                // decoded, so another escaping of the same text is the same).
                if prev_prompt == client_msg_id && stored_text(&prev_data) == decode(text) {
                    return Ok((
                        Outcome::Response {
                            id,
                            duplicate: true,
                        },
                        Vec::new(),
                    ));
                }
                return Err(ApiError::conflict().into());
            }
        }
        let prompt: Option<(i64, bool, bool)> = self
            .tx
            .prepare_cached(
                "SELECT seq, answered, in_history FROM messages
                 WHERE session = ?1 AND kind = 0 AND client_msg_id = ?2",
            )?
            .query_row(params![s.id, client_msg_id], |r| {
                Ok((
                    r.get(0)?,
                    r.get::<_, i64>(1)? != 0,
                    r.get::<_, i64>(2)? != 0,
                ))
            })
            .optional()?;
        let (prompt_seq, answered, in_history) = prompt.ok_or_else(ApiError::prompt_not_found)?;
        let seq = s.next_seq as u64;
        let data = data(&Parts {
            session_id: sid,
            id_literal: &literal,
            prompt_id: Some(client_msg_id),
            text,
            metadata,
            ts,
            seq,
        });
        self.tx
            .prepare_cached(
                "INSERT INTO messages (session, seq, kind, client_msg_id, assistant_msg_id, ts, in_history, answered, data)
                 VALUES (?1, ?2, 1, ?3, ?4, ?5, 1, 1, ?6)",
            )?
            .execute(params![s.id, seq as i64, client_msg_id, id, ts as i64, data])?;
        let pending = if answered {
            s.pending
        } else if in_history {
            self.tx
                .prepare_cached("UPDATE messages SET answered = 1 WHERE session = ?1 AND seq = ?2")?
                .execute(params![s.id, prompt_seq])?;
            s.pending - 1
        } else {
            // Answered and out of history: its dedupe entry goes too.
            self.tx
                .prepare_cached("DELETE FROM messages WHERE session = ?1 AND seq = ?2")?
                .execute(params![s.id, prompt_seq])?;
            s.pending - 1
        };
        self.tx
            .prepare_cached(
                "UPDATE sessions SET next_seq = ?2, last_assistant = ?3, pending = ?4 WHERE id = ?1",
            )?
            .execute(params![s.id, seq as i64 + 1, seq as i64, pending])?;
        self.trim(&s, seq as i64 + 1)?;
        let record = Record::Response {
            sid: sid.to_string(),
            seq,
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

    /// Drops the oldest messages past the history limit, as the in-memory
    /// log does: an answer, or an answered prompt, leaves the database; a
    /// pending prompt stays, out of history, until it is answered.
    fn trim(&mut self, s: &Session, next_seq: i64) -> rusqlite::Result<()> {
        let limit = self.limits.history_limit as i64;
        if next_seq - s.first_seq <= limit {
            return Ok(());
        }
        let first = next_seq - limit;
        let dropped: Option<i64> = self
            .tx
            .prepare_cached(
                "SELECT max(seq) FROM messages
                 WHERE session = ?1 AND seq < ?2 AND kind = 1 AND in_history = 1",
            )?
            .query_row(params![s.id, first], |r| r.get(0))?;
        self.tx
            .prepare_cached(
                "DELETE FROM messages WHERE session = ?1 AND seq < ?2 AND in_history = 1
                 AND (kind = 1 OR answered = 1)",
            )?
            .execute(params![s.id, first])?;
        self.tx
            .prepare_cached(
                "UPDATE messages SET in_history = 0 WHERE session = ?1 AND seq < ?2 AND in_history = 1",
            )?
            .execute(params![s.id, first])?;
        self.tx
            .prepare_cached(
                "UPDATE sessions SET first_seq = ?2,
                 dropped_assistant = max(dropped_assistant, coalesce(?3, 0)) WHERE id = ?1",
            )?
            .execute(params![s.id, first, dropped])?;
        Ok(())
    }

    /// The client's id and its literal, or a new UUID and its literal.
    fn id_and_literal(&mut self, given: Option<&(String, String)>) -> (String, String) {
        match given {
            Some((id, lit)) => (id.clone(), lit.clone()),
            None => {
                let uuid = self.ids.uuid();
                let mut lit = String::with_capacity(uuid.len() + 2);
                push_json_str(&mut lit, &uuid);
                (uuid, lit)
            }
        }
    }
}

fn created_record(sid: &str, s: &Session, created: bool) -> Vec<Record> {
    if created {
        vec![Record::Created {
            sid: sid.to_string(),
            epoch: s.epoch.clone(),
        }]
    } else {
        Vec::new()
    }
}

/// A message's `data` object as text.
fn data(parts: &Parts) -> String {
    let mut out = Vec::with_capacity(256);
    parts.write(&mut out);
    // The parts are valid JSON literals and ASCII framing: UTF-8 in, UTF-8 out.
    String::from_utf8(out).unwrap_or_default()
}

/// The decoded `text` of a stored answer's `data`.
fn stored_text(data: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Text {
        text: String,
    }
    serde_json::from_str::<Text>(data).map_or_else(|_| String::new(), |t| t.text)
}
