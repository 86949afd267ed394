//! Sessions read for the loop's copy, on the storage thread: the loop
//! holds only the sessions in use, and asks for the others whole when a
//! request needs one (a read waits under its ticket, a write brings it
//! back with its answer), and at start for those with pending prompts.
//!
//! Every session the loop gets comes out of one function,
//! [`State::session_for_loop`]: its counters from the thread's copy, its
//! retained messages from their rows, by rowid, so what the loop gets is
//! what a restart would read. A group that only reads commits nothing:
//! no transaction, no generation, no fsync.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension};

use super::{State, Writer};
use crate::error::ApiError;
use crate::store::record::{Command, Done, Op, Outcome, SessionImage, StoredRow};
use crate::store::sqlite::schema::{json_object, kind_of};
use crate::store::types::{Seq, SessionId};

impl State {
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
            return Ok(None);
        };
        let mut st = conn.prepare_cached(
            "SELECT seq, kind, client_msg_id, assistant_msg_id, ts, data FROM messages WHERE id = ?1",
        )?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows.ids() {
            let found = st
                .query_row([row], |r| {
                    let data = match r.get_ref(5)? {
                        ValueRef::Text(b) | ValueRef::Blob(b) if json_object(b) => Some(b.to_vec()),
                        _ => None,
                    };
                    Ok(StoredRow {
                        seq: Seq(r.get::<_, i64>(0)? as u64),
                        kind: kind_of(r.get(1)?),
                        client_msg_id: r.get_ref(2)?.as_str()?.to_string(),
                        assistant_msg_id: r.get_ref(3)?.as_str_or_null()?.map(str::to_string),
                        ts: r.get::<_, i64>(4)? as u64,
                        data,
                    })
                })
                .optional()?;
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
    /// prompt whole into `images`; the others' ids.
    fn warm(
        &mut self,
        conn: &Connection,
        images: &mut Vec<SessionImage>,
    ) -> rusqlite::Result<Vec<SessionId>> {
        let pending = self.log.idle(|_, log| log.pending_len() > 0);
        for sid in &pending {
            images.extend(self.session_for_loop(conn, sid)?);
        }
        Ok(self.log.idle(|_, log| log.pending_len() == 0))
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
            Op::Warm => Ok(Some(Outcome::Warmed {
                dormant: self.warm(conn, images)?,
            })),
            Op::Write(w) if cmd.load => {
                images.extend(self.session_for_loop(conn, w.session())?);
                Ok(None)
            }
            Op::Write(_) | Op::Collect { .. } => Ok(None),
        }
    }
}

/// Whether a command only reads (a group of such commits nothing).
pub fn reads_only(cmd: &Command) -> bool {
    matches!(cmd.op, Op::Load { .. } | Op::Warm)
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
                        log::error!(error = e.to_string().as_str(); "cannot read a session back");
                        Done::only(cmd.ticket, Err(ApiError::storage_unavailable()))
                    }
                }
            })
            .collect()
    }
}
