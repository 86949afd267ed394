//! The database's schema, its versions and migrations, and the reading
//! back of one session.
//!
//! Schema version 9 (`PRAGMA user_version`):
//!
//! - `sessions(id, name, epoch, next_seq, last_assistant,
//!   dropped_assistant)`: one row per session; `name` is the session id.
//!   The counters are a floor, written when rows that set them are
//!   deleted; the rows that remain raise them when the session is read back. `id` is never
//!   reused (`AUTOINCREMENT`): rows of a deleted session may wait for the
//!   next garbage collection, and must not join a new one.
//! - `messages(id, session, seq, kind, client_msg_id, assistant_msg_id, ts,
//!   data)`: the log, one row per stored message in the order stored (`id`
//!   is SQLite's rowid, so a commit appends to the table's last pages);
//!   `kind` 0 is a prompt, 1 an answer, 2 a cancel (its `client_msg_id`
//!   the prompt it stopped), 3 an ask and 4 a reply (whose
//!   `client_msg_id` column holds the `ask_id`); `data` is the message's
//!   JSON object
//!   exactly as the API serves it. The table has no index of its own.
//! - `session_rows(session, id)`: the rows of each session, a table
//!   keyed by both (`WITHOUT ROWID`), so one session's entries sit
//!   together: the storage thread reads one session's rows back through
//!   it when it needs the session and does not hold it ([`load`], and
//!   the loop's copy through `decide/load.rs`). It lists the rows up to
//!   `generation.indexed`; the rows after it are the log's tail, at most
//!   about `rows::TAIL_ROWS`, which the storage thread keeps a list of
//!   (`rows.rs`, [`tail`]). The transaction that takes the tail past
//!   that many indexes it, sorted by session, in one statement: each
//!   session's page of the index is then written once for thousands of
//!   rows, where an index on `messages` wrote one page per session every
//!   commit touched. A session read back is its listed rows and its rows
//!   in the tail, each looked up by rowid. A row given a rowid at or
//!   below `indexed` (SQLite reuses the largest after it is deleted) is
//!   listed as it is written.
//! - `pending(session)`: the sessions whose log holds a pending prompt,
//!   one row each, kept by every transaction that changes that (a prompt
//!   stored, answered, cancelled or trimmed; the session deleted): the
//!   start reads these sessions whole without reading any message row of
//!   the others.
//! - `generation(n, sessions, indexed)`: one row, the number of the last
//!   transaction (each adds one), compared at start with the side file
//!   `relay.generation` to notice a lost write-ahead log
//!   (`generation.rs`), the sessions the file holds as that
//!   transaction left them (the session cap counts them; counting the
//!   rows at start would read every page of the `sessions` index), and
//!   the newest row `session_rows` lists.
//!
//! A session read back replays its rows oldest first through the same rules that built
//! them (a prompt is answered when an answer to it follows; history keeps
//! the newest `RELAY_HISTORY_LIMIT`), so nothing derived is stored. Rows
//! history dropped are deleted in batches.
//!
//! Version 1 had no `dropped_assistant` column; it is added with 0 (no
//! answer dropped yet is the safe reading: a subscriber far behind is then
//! resynced by the `first_seq` rule on connect). Version 2 kept the log
//! keyed by `(session, seq)` with unique indexes on the ids and per-row
//! `in_history` and `answered` flags: every write then touched pages all
//! over the file. Its rows are copied in `seq` order into the new table.
//! Version 3 had no `generation` table; it starts at 0. Versions 4 and 5
//! hold no asks or replies, and version 4 no cancels: version 6 adds those
//! kinds of rows and no table, and its number keeps an older relay, which
//! would read any kind but a prompt as an answer, from opening a database
//! that holds them. Version 6 had no index: version 7 adds it, and drops
//! the rows a deleted session left for a collection that had not come
//! (a deletion now removes every row of its session through the index).
//! Version 7 had no `pending` table and no `generation.sessions`:
//! version 8 fills the table with one pass over the log
//! ([`fill_pending`]), and counts the sessions. Version 8 had the index
//! `messages_by_session` on `messages (session)`, one entry written per
//! row on its session's page, every commit: version 9 fills
//! `session_rows` from the log, drops the index, and starts with no tail.

use std::collections::{HashMap, HashSet};

use rusqlite::Connection;
use rusqlite::types::ValueRef;

use super::Sync;
use super::generation::Recovery;
use super::rows::Tail;
use crate::store::image::replay_row;
use crate::store::log::SessionLog;

use crate::store::message::Kind;
use crate::store::types::Seq;
use crate::time::Millis;

/// The schema this build writes.
pub const VERSION: i64 = 9;

/// The `kind` of an ask's row, and of a reply's.
pub const KIND_ASK: i64 = 3;
pub const KIND_REPLY: i64 = 4;

const SESSIONS: &str = "
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL UNIQUE,
    epoch TEXT NOT NULL,
    next_seq INTEGER NOT NULL,
    last_assistant INTEGER NOT NULL,
    dropped_assistant INTEGER NOT NULL
);
";

const MESSAGES: &str = "
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    session INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    client_msg_id TEXT NOT NULL,
    assistant_msg_id TEXT,
    ts INTEGER NOT NULL,
    data TEXT NOT NULL
);
";

/// Versions before 9: a session's rows found through an index on
/// `messages` (kept by the migrations from before 7, whose deletion of
/// stray rows reads it; version 9 drops it).
const BY_SESSION: &str = "CREATE INDEX messages_by_session ON messages (session);";

/// Versions 1 to 8 to 9 (and a new file, after the tables of 8): every
/// row listed in `session_rows`, sorted by session, the old index
/// dropped, no tail.
const V8_TO_V9: &str = "
CREATE TABLE session_rows (
    session INTEGER NOT NULL,
    id INTEGER NOT NULL,
    PRIMARY KEY (session, id)
) WITHOUT ROWID;
INSERT INTO session_rows (session, id) SELECT session, id FROM messages ORDER BY session, id;
DROP INDEX IF EXISTS messages_by_session;
ALTER TABLE generation ADD COLUMN indexed INTEGER NOT NULL DEFAULT 0;
UPDATE generation SET indexed = coalesce((SELECT max(id) FROM messages), 0);
";

/// Version 6 to 7, after [`BY_SESSION`]: the rows of sessions deleted
/// before it dropped (from then on they go with their session).
const V6_TO_V7: &str = "DELETE FROM messages WHERE session NOT IN (SELECT id FROM sessions);";

/// The sessions with a pending prompt (see the module doc).
const PENDING: &str = "CREATE TABLE pending (session INTEGER PRIMARY KEY);";

/// One row: the generation of the last transaction (see `generation.rs`).
const GENERATION: &str = "
CREATE TABLE generation (n INTEGER NOT NULL, sessions INTEGER NOT NULL);
INSERT INTO generation VALUES (0, 0);
";

/// Versions 3 to 7 to 8: the count of sessions beside the generation.
const V7_GENERATION: &str =
    "ALTER TABLE generation ADD COLUMN sessions INTEGER NOT NULL DEFAULT 0;";

/// Versions before 8 to 8, once `generation.sessions` exists.
const COUNTED: &str = "UPDATE generation SET sessions = (SELECT count(*) FROM sessions);";

const V1_TO_V2: &str =
    "ALTER TABLE sessions ADD COLUMN dropped_assistant INTEGER NOT NULL DEFAULT 0;";

/// Version 2 to 3: both tables rebuilt (the log in `seq` order, so each
/// session's rows come in the order they were stored).
fn v2_to_v3() -> String {
    format!(
        "ALTER TABLE messages RENAME TO messages_v2;
        {MESSAGES}
        INSERT INTO messages (session, seq, kind, client_msg_id, assistant_msg_id, ts, data)
            SELECT session, seq, kind, client_msg_id, assistant_msg_id, ts, data
            FROM messages_v2 ORDER BY seq, session;
        DROP TABLE messages_v2;
        ALTER TABLE sessions RENAME TO sessions_v2;
        {SESSIONS}
        INSERT INTO sessions (id, name, epoch, next_seq, last_assistant, dropped_assistant)
            SELECT id, name, epoch, next_seq, last_assistant, dropped_assistant FROM sessions_v2;
        DROP TABLE sessions_v2;"
    )
}

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

/// Pages in the log at which a commit checkpoints, where the writer does
/// (`RELAY_SYNC=<seconds>`, or without the checkpointer thread).
pub const AUTOCHECKPOINT_PAGES: u32 = 4096;

/// Sets the journal and sync modes and migrates the schema forward.
pub fn prepare(conn: &Connection, sync: Sync, version: i64) -> rusqlite::Result<()> {
    let _: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.execute_batch(match sync {
        // In WAL mode FULL syncs the log at every commit; NORMAL only at
        // checkpoints, which the storage thread runs on its interval.
        Sync::Always => "PRAGMA synchronous = FULL;",
        Sync::Every(_) => "PRAGMA synchronous = NORMAL;",
    })?;
    conn.execute_batch(&format!(
        "PRAGMA foreign_keys = OFF; PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES};"
    ))?;
    let steps = match version {
        0 => format!("{SESSIONS} {MESSAGES} {PENDING} {GENERATION} {V8_TO_V9}"),
        1 => format!(
            "{V1_TO_V2} {} {GENERATION} {BY_SESSION} {V6_TO_V7} {PENDING} {V8_TO_V9}",
            v2_to_v3()
        ),
        2 => format!(
            "{} {GENERATION} {BY_SESSION} {V6_TO_V7} {PENDING} {V8_TO_V9}",
            v2_to_v3()
        ),
        3 => format!("{GENERATION} {BY_SESSION} {V6_TO_V7} {PENDING} {V8_TO_V9}"),
        // Cancels, asks and replies are rows of kinds of their own: no
        // table changes.
        4..=6 => format!("{V7_GENERATION} {BY_SESSION} {V6_TO_V7} {PENDING} {V8_TO_V9}"),
        7 => format!("{V7_GENERATION} {PENDING} {V8_TO_V9}"),
        8 => V8_TO_V9.to_string(),
        _ => return Ok(()),
    };
    let tx = conn.unchecked_transaction()?;
    tx.execute_batch(&steps)?;
    if (1..8).contains(&version) {
        tx.execute_batch(COUNTED)?;
        fill_pending(&tx)?;
    }
    tx.execute_batch(&format!("PRAGMA user_version = {VERSION};"))?;
    tx.commit()
}

/// Versions before 8 to 8, after [`PENDING`] is created: the table filled
/// from the log by the rule the start applied before, in one pass over
/// the messages' small columns in the order written (a prompt row that no
/// later answer or cancel row of its session with its `client_msg_id`
/// follows). A session named here whose log replays with no prompt
/// pending is harmless: it is read whole at start, and the next
/// transaction that leaves it without one removes its row.
fn fill_pending(conn: &Connection) -> rusqlite::Result<()> {
    let mut open: HashMap<i64, HashSet<String>> = HashMap::new();
    let mut st = conn
        .prepare("SELECT session, kind, client_msg_id FROM messages WHERE kind <= 2 ORDER BY id")?;
    let mut q = st.query([])?;
    while let Some(r) = q.next()? {
        let session: i64 = r.get(0)?;
        let cid = r.get_ref(2)?.as_str()?;
        if r.get::<_, i64>(1)? == 0 {
            open.entry(session).or_default().insert(cid.to_string());
        } else if let Some(ids) = open.get_mut(&session) {
            ids.remove(cid);
        }
    }
    let mut st =
        conn.prepare("INSERT INTO pending (session) SELECT id FROM sessions WHERE id = ?1")?;
    for (session, ids) in open {
        if !ids.is_empty() {
            st.execute([session])?;
        }
    }
    Ok(())
}

/// The generation of the last transaction the database holds.
pub fn generation(conn: &Connection) -> rusqlite::Result<u64> {
    Ok(counts(conn)?.0)
}

/// The generation of the last transaction the database holds, and the
/// sessions it left (read, not counted).
pub fn counts(conn: &Connection) -> rusqlite::Result<(u64, usize)> {
    let (n, sessions): (Option<i64>, Option<i64>) =
        conn.query_row("SELECT max(n), max(sessions) FROM generation", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok((
        n.unwrap_or(0).max(0) as u64,
        sessions.unwrap_or(0).max(0) as usize,
    ))
}

/// The log's unindexed tail as the file holds it: the rows after
/// `generation.indexed`, read in one range of rowids (see the module doc).
pub fn tail(conn: &Connection) -> rusqlite::Result<Tail> {
    let upto: i64 = conn.query_row(
        "SELECT coalesce(max(indexed), 0) FROM generation",
        [],
        |r| r.get(0),
    )?;
    let mut st = conn.prepare("SELECT session, id FROM messages WHERE id > ?1 ORDER BY id")?;
    let rows = st
        .query_map([upto], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<Vec<(i64, i64)>>>()?;
    Ok(Tail::new(upto, rows))
}

/// The id of every session, for [`recover`](super::generation::recover).
pub fn session_ids(conn: &Connection) -> rusqlite::Result<Vec<i64>> {
    conn.prepare("SELECT id FROM sessions")?
        .query_map([], |r| r.get(0))?
        .collect()
}

/// Gives each session its new epoch and raises the generation, in one
/// transaction, as `recovery` decided: the log that held the newest
/// acknowledged commits was lost, so `seq`s after what the database holds
/// will be given again, to other messages (see `generation.rs`).
pub fn new_epochs(conn: &Connection, recovery: &Recovery<i64>) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    {
        let mut st = tx.prepare("UPDATE sessions SET epoch = ?2 WHERE id = ?1")?;
        for (id, epoch) in &recovery.epochs {
            st.execute(rusqlite::params![id, epoch])?;
        }
    }
    tx.execute("UPDATE generation SET n = ?1", [recovery.generation as i64])?;
    tx.commit()
}

/// The message kind a row's `kind` column names (see the module doc).
pub fn kind_of(kind: i64) -> Kind {
    match kind {
        0 => Kind::Prompt,
        2 => Kind::Cancel,
        KIND_ASK => Kind::Ask,
        KIND_REPLY => Kind::Reply,
        _ => Kind::Assistant,
    }
}

/// The columns [`replay`] reads, in its order: the session's row, then
/// the message's.
const ROW: &str =
    "m.session, m.seq, m.kind, m.client_msg_id, m.assistant_msg_id, m.ts, m.data, m.id";

/// Appends one stored row ([`ROW`]'s columns) to its session's log by the
/// rules that stored it. False when its `data` is damaged: the message is
/// kept for what its columns hold, and never sent.
fn replay(log: &mut SessionLog, r: &rusqlite::Row<'_>, limit: usize) -> rusqlite::Result<bool> {
    let seq = Seq(r.get::<_, i64>(1)? as u64);
    let kind = kind_of(r.get(2)?);
    let cid = r.get_ref(3)?.as_str()?;
    let aid = r.get_ref(4)?.as_str_or_null()?;
    let ts = r.get::<_, i64>(5)? as u64;
    let data = match r.get_ref(6)? {
        ValueRef::Text(b) | ValueRef::Blob(b) if json_object(b) => Some(b),
        _ => None,
    };
    replay_row(log, seq, kind, cid, aid, ts, data, limit);
    Ok(data.is_some())
}

/// One session read back from the file: its `sessions` row, its log as
/// its rows replayed build it, and its rows' `(seq, row)` in the order written.
pub struct Loaded {
    pub id: i64,
    pub log: SessionLog,
    pub rows: Vec<(u64, i64)>,
}

/// The rows of the session of `sessions` row `session`, in the order
/// written, each passed to `each`: those `session_rows` lists, then
/// those in the log's tail (`tail`), each looked up by rowid (a row the
/// file no longer holds, or holds for another session, is skipped).
/// `columns` are read from `messages`, named as `m`.
pub fn session_rows(
    conn: &Connection,
    session: i64,
    tail: &Tail,
    columns: &str,
    each: &mut dyn FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    // `session_rows` first, in its key's order (the rows' order within a
    // session), each row then found by its rowid: no sort, no list.
    let mut st = conn.prepare_cached(&format!(
        "SELECT {columns} FROM session_rows r CROSS JOIN messages m ON m.id = r.id
         WHERE r.session = ?1 ORDER BY r.id"
    ))?;
    let mut q = st.query([session])?;
    while let Some(r) = q.next()? {
        each(r)?;
    }
    let rows: Vec<i64> = tail.rows(session).collect();
    if rows.is_empty() {
        return Ok(());
    }
    let mut st = conn.prepare_cached(&format!(
        "SELECT {columns} FROM messages m WHERE m.id = ?1 AND m.session = ?2"
    ))?;
    for row in rows {
        let mut q = st.query([row, session])?;
        if let Some(r) = q.next()? {
            each(r)?;
        }
    }
    Ok(())
}

/// Reads the session named `sid` back, through `session_rows` and the
/// log's tail ([`session_rows`]), by the rules that stored its rows
/// (`store/image.rs`, as the loop's copy replays a session read back); `None` when the file holds no such session.
pub fn load(
    conn: &Connection,
    sid: &str,
    history_limit: usize,
    tail: &Tail,
) -> rusqlite::Result<Option<Loaded>> {
    let mut st = conn.prepare_cached(
        "SELECT id, epoch, next_seq, last_assistant, dropped_assistant FROM sessions WHERE name = ?1",
    )?;
    let mut q = st.query([sid])?;
    let Some(r) = q.next()? else {
        return Ok(None);
    };
    let id: i64 = r.get(0)?;
    let mut log = SessionLog::restored(
        Millis(0),
        r.get_ref(1)?.as_str()?,
        Seq(r.get::<_, i64>(2)? as u64),
        Seq(r.get::<_, i64>(3)? as u64),
        Seq(r.get::<_, i64>(4)? as u64),
    );
    drop(q);
    let mut rows = Vec::new();
    session_rows(conn, id, tail, ROW, &mut |r| {
        replay(&mut log, r, history_limit)?;
        rows.push((r.get::<_, i64>(1)? as u64, r.get::<_, i64>(7)?));
        Ok(())
    })?;
    Ok(Some(Loaded { id, log, rows }))
}

/// The `sessions` row of the session named `sid`, if the file has it.
pub fn session_row(conn: &Connection, sid: &str) -> rusqlite::Result<Option<i64>> {
    let mut st = conn.prepare_cached("SELECT id FROM sessions WHERE name = ?1")?;
    let mut q = st.query([sid])?;
    q.next()?.map(|r| r.get(0)).transpose()
}

/// Whether a stored `data` is what the server wrote: UTF-8 text holding one
/// JSON object. Checked on every row read back, since the file may have
/// been damaged where SQLite's own structure is intact.
pub fn json_object(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    text.trim_start().starts_with('{')
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}
