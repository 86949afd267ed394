//! How far acknowledged commits went, kept outside the write-ahead log, so
//! that a start notices when `relay.db-wal` was lost (deleted after a
//! crash, say) and the database is behind what clients were told.
//!
//! A commit is durable once it is in the log; `relay.db` catches up only
//! when a checkpoint copies the log into it. Losing the log loses the
//! commits since the last copy, and nothing inside `relay.db` can tell: it
//! is the part that survived. So every transaction writes its generation
//! (one more than the last) into the `generation` table, and once it has
//! committed, before anything it carries is answered, the storage thread
//! writes the same number into a side file, `relay.generation`. At start,
//! a side file ahead of the database means acknowledged commits are gone:
//! their `seq`s would be given again to other messages, so every session
//! gets a new epoch and a client resuming with `after` and `epoch` gets a
//! `resync`. Which sessions the lost commits touched is not known (that was
//! in the lost file), so every session is treated as touched.
//!
//! The side file is written at every commit (one small `pwrite`, into the
//! page cache, which survives a crash of the process) and synced with the
//! checkpoints (about every 200 ms with traffic), not at every commit: a
//! second fsync per commit would double the cost of durability. Another
//! program that opens the database after a crash copies the whole log in
//! and removes it; the database then holds the newest generation, and
//! nothing is reported lost.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::store::mem::IdGen;

/// The side file in the data directory.
pub const NAME: &str = "relay.generation";

/// The last generation acknowledged, as the side file in `dir` holds it
/// (none when there is no file or it holds no number).
pub fn acknowledged(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(NAME)).ok()?;
    text.trim().parse().ok()
}

/// What a start does about a database behind its side file: one
/// transaction gives each session its new epoch and raises the
/// database's generation.
#[derive(Debug, PartialEq, Eq)]
pub struct Recovery<K> {
    /// The generation the database is raised to: the side file's.
    pub generation: u64,
    /// Every session (by the key `sessions` gave it) and its new epoch.
    pub epochs: Vec<(K, String)>,
}

/// The start's decision, from the side file's generation (`acknowledged`,
/// none without a file) and the database's (`stored`): nothing while the
/// database holds every commit acknowledged; past that, the `seq`s of
/// the lost commits would be given again to other messages, so every
/// session `sessions` lists (asked only then) gets a new epoch from
/// `ids`, and the generation is raised to the side file's. The start
/// (`open`) applies it to `relay.db`; `tests/sim` to the copy of its
/// simulated storage, so the one decision is tested under both.
pub fn recover<K, E>(
    acknowledged: Option<u64>,
    stored: u64,
    sessions: impl FnOnce() -> Result<Vec<K>, E>,
    ids: &mut IdGen,
) -> Result<Option<Recovery<K>>, E> {
    let Some(generation) = acknowledged.filter(|a| *a > stored) else {
        return Ok(None);
    };
    let epochs = sessions()?.into_iter().map(|k| (k, ids.uuid())).collect();
    Ok(Some(Recovery { generation, epochs }))
}

/// The side file, open for the storage thread.
pub struct GenFile {
    file: File,
    /// Written since the last sync.
    unsynced: bool,
}

impl GenFile {
    /// Opens (creates) the side file in `dir`.
    pub fn open(dir: &Path) -> io::Result<GenFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(NAME))?;
        Ok(GenFile {
            file,
            unsynced: false,
        })
    }

    /// Records that generation `n` committed; called before anything it
    /// carries is answered. Fixed width, so a shorter number never leaves
    /// digits of a longer one behind.
    pub fn record(&mut self, n: u64) -> io::Result<()> {
        self.file.write_all_at(format!("{n:020}\n").as_bytes(), 0)?;
        self.unsynced = true;
        Ok(())
    }

    /// Makes the recorded generation durable; called with the checkpoints.
    pub fn sync(&mut self) {
        if self.unsynced && self.file.sync_data().is_ok() {
            self.unsynced = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions() -> Result<Vec<&'static str>, ()> {
        Ok(vec!["a", "b"])
    }

    #[test]
    fn a_database_behind_its_side_file_gives_every_session_a_new_epoch() {
        let mut ids = IdGen::new();
        assert_eq!(recover(None, 3, sessions, &mut ids), Ok(None));
        assert_eq!(recover(Some(3), 3, sessions, &mut ids), Ok(None));
        // Behind the database: a kill between the commit and the file.
        assert_eq!(recover(Some(2), 3, sessions, &mut ids), Ok(None));
        let r = recover(Some(5), 3, sessions, &mut ids).unwrap().unwrap();
        assert_eq!(r.generation, 5);
        let keys: Vec<&str> = r.epochs.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_ne!(r.epochs[0].1, r.epochs[1].1);
        // Sessions are read only when the database is behind.
        let unread = || -> Result<Vec<&str>, ()> { Err(()) };
        assert_eq!(recover(Some(3), 3, unread, &mut ids), Ok(None));
        assert_eq!(recover(Some(4), 3, unread, &mut ids), Err(()));
    }
}
