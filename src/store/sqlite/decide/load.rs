//! Sessions read for the loop's copy, on the storage thread: the loop
//! holds only the sessions in use, and asks for the others whole when a
//! request needs one (a read waits under its ticket, a write brings it
//! back with its answer), and at start for those with pending prompts.
//!
//! Every session the loop gets comes out of one function,
//! [`Cache::session_for_loop`], as plain data (the thread's logs hold
//! `Rc`s and stay on the thread): a session the thread's cache holds is
//! sent with the cache's counters and its retained messages read from
//! their rows by rowid; one it does not hold is read from the file
//! through `session_rows` and the log's tail (`schema.rs`), every row
//! of it with the
//! `sessions` row's counters, as a restart reads it. Either way what the
//! loop gets is what a restart would read, and the cache is left as it
//! was (a read does not fill it). The start reads no session whole but
//! those with pending prompts, which the `pending` table names (no
//! message row is read to find them); the others go to the loop by id,
//! a few thousand per command, so writes are answered while they come. A
//! group that only reads commits nothing: no transaction, no generation,
//! no fsync.

use log::error;
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension};

use super::Writer;
use crate::error::ApiError;
use crate::store::record::{Command, Done, Op, Outcome, SessionImage, StoredRow};
use crate::store::sqlite::cache::Cache;
use crate::store::sqlite::rows::Tail;
use crate::store::sqlite::schema::{json_object, kind_of, session_rows};
use crate::store::types::{Seq, SessionId};

/// The columns [`stored_row`] reads, in its order.
/// (`messages` named as `m`).
const COLUMNS: &str = "m.seq, m.kind, m.client_msg_id, m.assistant_msg_id, m.ts, m.data, m.id";

/// One message row ([`COLUMNS`]) as plain data; a damaged `data` is
/// logged (naming the session) and read as `None`.
fn stored_row(sid: &str, r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredRow> {
    let seq = Seq(r.get::<_, i64>(0)? as u64);
    let data = match r.get_ref(5)? {
        ValueRef::Text(b) | ValueRef::Blob(b) if json_object(b) => Some(b.to_vec()),
        _ => {
            error!(session_id = sid, seq = seq.get(), row = r.get::<_, i64>(6)?;
                "stored message damaged (not UTF-8 or not a JSON object): kept, never sent; pages that would carry it answer 500");
            None
        }
    };
    Ok(StoredRow {
        seq,
        kind: kind_of(r.get(1)?),
        client_msg_id: r.get_ref(2)?.as_str()?.to_string(),
        assistant_msg_id: r.get_ref(3)?.as_str_or_null()?.map(str::to_string),
        ts: r.get::<_, i64>(4)? as u64,
        data,
    })
}

/// The session named `sid` read from the file alone, or `None` when the
/// file has no such session: its `sessions` row's counters and every row
/// of it, in the order written, through `session_rows` and `tail`.
fn image_from_file(
    conn: &Connection,
    sid: &str,
    tail: &Tail,
) -> rusqlite::Result<Option<SessionImage>> {
    let Some(key) = SessionId::new(sid) else {
        return Ok(None);
    };
    let found = conn
        .prepare_cached(
            "SELECT id, epoch, next_seq, last_assistant, dropped_assistant FROM sessions WHERE name = ?1",
        )?
        .query_row([sid], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get_ref(1)?.as_str()?.to_string(),
                (
                    Seq(r.get::<_, i64>(2)? as u64),
                    Seq(r.get::<_, i64>(3)? as u64),
                    Seq(r.get::<_, i64>(4)? as u64),
                ),
            ))
        })
        .optional()?;
    let Some((id, epoch, counters)) = found else {
        return Ok(None);
    };
    let mut rows = Vec::new();
    session_rows(conn, id, tail, COLUMNS, &mut |r| {
        rows.push(stored_row(sid, r)?);
        Ok(())
    })?;
    Ok(Some(SessionImage {
        sid: key,
        epoch,
        counters,
        rows,
    }))
}

/// The names of the sessions with a pending prompt (those the loop must
/// hold from the start, for the all-sessions poll), as the `pending`
/// table keeps them: no message row is read.
fn pending(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    // `pending` first: the planner, without statistics, would walk every
    // session and look each up in it.
    let mut st =
        conn.prepare("SELECT s.name FROM pending p CROSS JOIN sessions s ON s.id = p.session")?;
    let names = st.query_map([], |r| r.get::<_, String>(0))?;
    names.collect()
}

/// Sessions listed by one [`Op::Dormant`]: the loop takes their ids
/// between requests, a few milliseconds at a time, and writes are
/// answered while the rest wait.
const LISTED: usize = 1024;

/// The ids of up to [`LISTED`] sessions after the `sessions` row
/// `after`, in the order of their rows, and the row to go on after
/// when there may be more.
fn listed(conn: &Connection, after: i64) -> rusqlite::Result<(Vec<SessionId>, Option<i64>)> {
    let mut st =
        conn.prepare_cached("SELECT id, name FROM sessions WHERE id > ?1 ORDER BY id LIMIT ?2")?;
    let mut q = st.query(rusqlite::params![after, LISTED as i64])?;
    let (mut sids, mut last, mut n) = (Vec::new(), after, 0);
    while let Some(r) = q.next()? {
        last = r.get(0)?;
        n += 1;
        sids.extend(SessionId::new(r.get_ref(1)?.as_str()?));
    }
    Ok((sids, (n == LISTED).then_some(last)))
}

impl Cache {
    /// The session `sid` whole, as the loop is to hold it, or `None` when
    /// there is no such session. Called inside the transaction that
    /// decides the command asking for it, before that command: it sees
    /// every command before it and none after.
    pub(super) fn session_for_loop(
        &mut self,
        conn: &Connection,
        sid: &str,
    ) -> rusqlite::Result<Option<SessionImage>> {
        let (Some((key, log)), Some(rows)) =
            (self.log.key_and_log(sid), self.rows.sessions.get(sid))
        else {
            // Not in the cache: the file's counters are the session's
            // (those waiting for a garbage collection keep it cached).
            return image_from_file(conn, sid, &self.tail);
        };
        let mut st =
            conn.prepare_cached(&format!("SELECT {COLUMNS} FROM messages m WHERE m.id = ?1"))?;
        let mut out = Vec::with_capacity(rows.followed());
        for row in rows.ids() {
            let found = st.query_row([row], |r| stored_row(sid, r)).optional()?;
            out.extend(found);
        }
        Ok(Some(SessionImage {
            sid: key.clone(),
            epoch: log.epoch().to_string(),
            counters: log.counters(),
            rows: out,
        }))
    }

    /// The start's reading ([`Op::Warm`]): every session with a pending
    /// prompt whole into `images`; the sessions' ids follow, listed from
    /// the first `sessions` row on.
    fn warm(
        &mut self,
        conn: &Connection,
        images: &mut Vec<SessionImage>,
    ) -> rusqlite::Result<Outcome> {
        for sid in pending(conn)? {
            images.extend(self.session_for_loop(conn, &sid)?);
        }
        Ok(Outcome::Warmed {
            dormant: Vec::new(),
            next: Some(0),
        })
    }

    /// What a command reads for the loop before it is decided: the
    /// session of a write the loop's copy lacks (into `images`); and for a
    /// command that only reads, its whole answer.
    pub(super) fn read_for_loop(
        &mut self,
        conn: &Connection,
        cmd: &Command,
        images: &mut Vec<SessionImage>,
    ) -> rusqlite::Result<Option<Outcome>> {
        match &cmd.op {
            Op::Load { sid } => {
                images.extend(self.session_for_loop(conn, sid)?);
                Ok(Some(Outcome::Loaded))
            }
            Op::Warm => Ok(Some(self.warm(conn, images)?)),
            Op::Dormant { after } => {
                let (dormant, next) = listed(conn, *after)?;
                Ok(Some(Outcome::Warmed { dormant, next }))
            }
            Op::Write(w) if cmd.load => {
                // The write reads its session into the cache to decide it:
                // read it there first, and send the cache's.
                self.get_or_load(conn, w.session())?;
                images.extend(self.session_for_loop(conn, w.session())?);
                Ok(None)
            }
            Op::Write(_) | Op::Collect { .. } => Ok(None),
        }
    }
}

/// Whether a command only reads (a group of such commits nothing).
pub fn reads_only(cmd: &Command) -> bool {
    matches!(cmd.op, Op::Load { .. } | Op::Warm | Op::Dormant { .. })
}

impl Writer {
    /// A group that only reads, answered without a transaction: nothing
    /// is written, so nothing needs a commit or an fsync.
    pub(super) fn read_only(&mut self, cmds: Vec<Command>) -> Vec<Done> {
        let Some(state) = &mut self.state else {
            return cmds
                .iter()
                .map(|c| Done::only(c.ticket, Err(ApiError::storage_unavailable())))
                .collect();
        };
        cmds.iter()
            .map(|cmd| {
                let mut images = Vec::new();
                match state.read_for_loop(&self.conn, cmd, &mut images) {
                    Ok(outcome) => Done {
                        ticket: cmd.ticket,
                        result: Ok(outcome.unwrap_or(Outcome::Loaded)),
                        records: Vec::new(),
                        images,
                    },
                    Err(e) => {
                        error!(error = e.to_string().as_str(); "cannot read a session back");
                        Done::only(cmd.ticket, Err(ApiError::storage_unavailable()))
                    }
                }
            })
            .collect()
    }
}
