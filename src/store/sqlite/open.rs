//! Opening the database, once at start and before the server listens: the
//! data directory checked (a directory, writable), `relay.db` created if
//! missing and `flock`ed for as long as the server runs, the schema
//! checked and migrated, a lost write-ahead log noticed against the side
//! file (`generation`). No session is read here: the loop starts with
//! none, and the storage thread reads what it needs (see `handle`).
//!
//! Invariants: a file that is not a relay database, or that a newer relay
//! wrote, is refused and left untouched; a second server on the directory
//! is refused before it touches the file. Time is a parameter (`now`):
//! nothing here reads the clock or starts a thread.

use std::fs::File;
use std::path::{Path, PathBuf};

use log::{info, warn};
use rusqlite::{Connection, OpenFlags};

use super::generation::{self, GenFile};
use super::{Sync, schema};
use crate::store::mem::IdGen;

/// A database opened and checked, before the loop starts.
pub struct Opened {
    pub conn: Connection,
    /// `relay.db` itself, flocked while the server runs: a second server on
    /// the directory fails to take it. Closed only after every SQLite
    /// connection (closing any descriptor of the file would drop SQLite's
    /// own POSIX locks on it).
    pub lock: File,
    pub path: PathBuf,
    /// The side file of the last acknowledged generation (`generation`).
    pub generation: GenFile,
}

/// Why the database could not be used (the server exits 1 with this).
#[derive(Debug)]
pub struct OpenError(pub String);

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Opens `relay.db` in `dir` (created if missing), takes its lock, checks
/// and migrates the schema. Called once at start, before listening. A directory the server cannot
/// write in is reported as such; a file that is not a database, or one
/// from a newer version, is refused and left untouched.
pub fn open(dir: &Path, sync: Sync) -> Result<Opened, OpenError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| OpenError(format!("{what}: {e}"));
    if dir.exists() && !dir.is_dir() {
        return Err(OpenError(format!(
            "RELAY_DATA_DIR {} is a file, not a directory: name a directory (it is created if missing)",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| fail(&format!("cannot create {}", dir.display()), &e))?;
    let path = dir.join("relay.db");
    let lock = writable(dir, &path)?;
    if lock.try_lock().is_err() {
        return Err(OpenError(format!(
            "another relay is using the data directory {}",
            dir.display()
        )));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&path, flags)
        .map_err(|e| fail(&format!("cannot open {}", path.display()), &e))?;
    let version =
        schema::check(&conn).map_err(|e| OpenError(format!("{}: {e}", path.display())))?;
    schema::prepare(&conn, sync, version)
        .map_err(|e| fail(&format!("cannot prepare {}", path.display()), &e))?;
    let acknowledged = generation::acknowledged(dir);
    let read = |e: &dyn std::fmt::Display| fail(&format!("cannot read {}", path.display()), e);
    let stored = schema::generation(&conn).map_err(|e| read(&e))?;
    let sessions = || schema::session_ids(&conn);
    let recovery = generation::recover(acknowledged, stored, sessions, &mut IdGen::new())
        .map_err(|e| read(&e))?;
    if let Some(r) = recovery {
        schema::new_epochs(&conn, &r)
            .map_err(|e| fail(&format!("cannot write {}", path.display()), &e))?;
        warn!(path = path.display().to_string().as_str(), sessions = r.epochs.len(), acknowledged = r.generation, stored = stored;
            "the database is behind what was acknowledged (its write-ahead log relay.db-wal was lost): every session gets a new epoch");
    }
    let generation = GenFile::open(dir).map_err(|e| {
        fail(
            &format!("cannot write {}", dir.join(generation::NAME).display()),
            &e,
        )
    })?;
    info!(path = path.display().to_string().as_str(), schema = version; "database opened");
    Ok(Opened {
        conn,
        lock,
        path,
        generation,
    })
}

/// Checks that the server can write in `dir` and its database (SQLite
/// creates its log and index beside the file, and would otherwise fail
/// later with a misleading error), and returns `relay.db` opened (created
/// empty if missing), to be locked. A directory that is only readable is
/// reported as not writable, naming it.
fn writable(dir: &Path, db: &Path) -> Result<File, OpenError> {
    let refuse = |e: std::io::Error| {
        use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem};
        OpenError(match e.kind() {
            PermissionDenied | ReadOnlyFilesystem => {
                format!("the data directory {} is not writable: {e}", dir.display())
            }
            _ => format!("cannot write in the data directory {}: {e}", dir.display()),
        })
    };
    let probe = dir.join("relay.probe");
    File::create(&probe).map_err(refuse)?;
    match std::fs::remove_file(&probe) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(refuse(e)),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(db)
        .map_err(refuse)
}
