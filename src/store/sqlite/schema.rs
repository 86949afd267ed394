//! The database's schema, its versions and migrations, and the restore of
//! every session at start.
//!
//! Schema version 2 (`PRAGMA user_version`):
//!
//! - `sessions(id, name, epoch, next_seq, first_seq, last_assistant,
//!   dropped_assistant, pending)`: one row per session; `name` is the
//!   session id, `next_seq` the next `seq` to assign, history holds
//!   `first_seq .. next_seq`, `pending` counts unanswered prompts.
//! - `messages(session, seq, kind, client_msg_id, assistant_msg_id, ts,
//!   in_history, answered, data)`, keyed by `(session, seq)`: every message
//!   in history, and the pending prompts history has dropped
//!   (`in_history = 0`); `kind` 0 is a prompt, 1 an answer; `data` is the
//!   message's JSON object exactly as the API serves it. Unique indexes on
//!   the prompt ids and answer ids of a session are the dedupe.
//!
//! Version 1 had no `dropped_assistant` column; it is added with 0 (no
//! answer dropped yet is the safe reading: a subscriber far behind is then
//! resynced by the `first_seq` rule on connect).

use std::collections::HashMap;
use std::rc::Rc;

use rusqlite::Connection;

use super::Sync;
use crate::store::log::SessionLog;
use crate::store::mem::{MemStore, StoreLimits};
use crate::store::message::Message;
use crate::time::Millis;

/// The schema this build writes.
pub const VERSION: i64 = 2;

const CREATE: &str = "
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    epoch TEXT NOT NULL,
    next_seq INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    last_assistant INTEGER NOT NULL,
    dropped_assistant INTEGER NOT NULL,
    pending INTEGER NOT NULL
);
CREATE TABLE messages (
    session INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    client_msg_id TEXT NOT NULL,
    assistant_msg_id TEXT,
    ts INTEGER NOT NULL,
    in_history INTEGER NOT NULL,
    answered INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX prompt_ids ON messages (session, client_msg_id) WHERE kind = 0;
CREATE UNIQUE INDEX answer_ids ON messages (session, assistant_msg_id) WHERE kind = 1;
";

const V1_TO_V2: &str =
    "ALTER TABLE sessions ADD COLUMN dropped_assistant INTEGER NOT NULL DEFAULT 0;";

/// Reads the schema version without writing anything: a file that is not
/// a database, or one a newer relay wrote, is refused here, untouched.
pub fn check(conn: &Connection) -> Result<i64, String> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| format!("not a relay database ({e})"))?;
    // Reading the schema reads the file's first page: a damaged file fails.
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|e| format!("not a relay database ({e})"))?;
    if version > VERSION {
        return Err(format!(
            "written by a newer relay (schema version {version}; this one reads up to {VERSION})"
        ));
    }
    if version == 0 && tables > 0 {
        return Err(
            "an SQLite database, but not a relay one (it has tables and no relay schema version)"
                .into(),
        );
    }
    Ok(version)
}

/// Sets the journal and sync modes and migrates the schema forward.
pub fn prepare(conn: &Connection, sync: Sync, version: i64) -> rusqlite::Result<()> {
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.execute_batch(match sync {
        // In WAL mode FULL syncs the log at every commit; NORMAL only at
        // checkpoints, which the storage thread runs on its interval.
        Sync::Always => "PRAGMA synchronous = FULL;",
        Sync::Every(_) => "PRAGMA synchronous = NORMAL;",
    })?;
    conn.execute_batch("PRAGMA foreign_keys = OFF; PRAGMA wal_autocheckpoint = 4096;")?;
    match version {
        0 => conn.execute_batch(&format!(
            "BEGIN; {CREATE} PRAGMA user_version = {VERSION}; COMMIT;"
        )),
        1 => conn.execute_batch(&format!(
            "BEGIN; {V1_TO_V2} PRAGMA user_version = {VERSION}; COMMIT;"
        )),
        _ => Ok(()),
    }
}

/// Every session and message, into the loop's in-memory copy.
pub fn restore(conn: &Connection, limits: StoreLimits, now: Millis) -> rusqlite::Result<MemStore> {
    let mut logs: HashMap<i64, (String, SessionLog)> = HashMap::new();
    let mut st = conn.prepare(
        "SELECT id, name, epoch, next_seq, last_assistant, dropped_assistant FROM sessions",
    )?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        let name: String = r.get(1)?;
        let epoch: String = r.get(2)?;
        let log = SessionLog::restored(
            now,
            Rc::from(epoch.as_str()),
            r.get::<_, i64>(3)? as u64,
            r.get::<_, i64>(4)? as u64,
            r.get::<_, i64>(5)? as u64,
        );
        logs.insert(id, (name, log));
    }
    let mut st = conn.prepare(
        "SELECT session, seq, kind, client_msg_id, assistant_msg_id, ts, in_history, answered, data
         FROM messages ORDER BY session, seq",
    )?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let Some((_, log)) = logs.get_mut(&r.get::<_, i64>(0)?) else {
            continue;
        };
        let seq = r.get::<_, i64>(1)? as u64;
        let kind: i64 = r.get(2)?;
        let cid: Rc<str> = Rc::from(r.get_ref(3)?.as_str()?);
        let ts = r.get::<_, i64>(5)? as u64;
        let in_history = r.get::<_, i64>(6)? != 0;
        let answered = r.get::<_, i64>(7)? != 0;
        let data = r.get_ref(8)?.as_bytes()?;
        let msg = if kind == 0 {
            Message::prompt_with(cid, seq, ts, data.to_vec())
        } else {
            let aid: Rc<str> = Rc::from(r.get_ref(4)?.as_str_or_null()?.unwrap_or(""));
            Message::assistant_with(cid, aid, seq, ts, data)
        };
        log.restore(msg, answered, in_history);
    }
    let mut store = MemStore::new(limits);
    for (_, (name, log)) in logs {
        store.insert(&name, log);
    }
    Ok(store)
}
