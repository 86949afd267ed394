//! The checkpointer of `RELAY_SYNC=always`: a second thread, with a
//! connection of its own, that copies the write-ahead log into `relay.db`
//! every [`CHECKPOINT_EVERY`], so that no commit waits for a copy and the
//! log stays short.
//!
//! Invariants: it never blocks the writer, and the writer never waits for
//! it (`PASSIVE` checkpoints); it never puts anything in the database that
//! the log does not hold durably; after copying a log that was not empty it
//! asks the writer to copy what came meanwhile, between two transactions,
//! so that the log starts over from its beginning; it stops when dropped.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use log::{error, warn};
use rusqlite::{Connection, OpenFlags};

/// How often the checkpointer copies the log into the database with
/// `RELAY_SYNC=always`: small copies, each of the pages written since the
/// last, and a log that stays short and is reused from its start.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

/// A thread with a second connection that checkpoints (`PASSIVE`: it never
/// blocks the writer, and the writer never waits for it) while the writer
/// goes on committing. SQLite's NORMAL mode fsyncs the log before each
/// checkpoint and the database after it, so a checkpoint never puts
/// anything in the database that the log does not hold durably. Stops
/// when dropped. (Flags rather than channels: each is a state, read when
/// the other side looks, between two transactions or two copies, and
/// meaning the same however many times it was set.)
pub(super) struct Checkpointer {
    pub(super) shared: Arc<Flags>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the checkpointer and the writer tell each other.
#[derive(Default)]
pub(super) struct Flags {
    /// The writer should copy what came during the last checkpoint.
    pub(super) catch_up: AtomicBool,
    /// The checkpointer could not open the database and has ended.
    pub(super) gone: AtomicBool,
    /// The writer is done: the checkpointer ends.
    stop: AtomicBool,
}

impl Checkpointer {
    pub(super) fn start(db: PathBuf) -> Checkpointer {
        let shared = Arc::new(Flags::default());
        let flags = shared.clone();
        let thread = std::thread::Builder::new()
            .name("relay-checkpoint".into())
            .spawn(move || {
                let open = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
                let conn = Connection::open_with_flags(&db, open).and_then(|c| {
                    c.execute_batch("PRAGMA synchronous = NORMAL;")?;
                    Ok(c)
                });
                let conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        error!(error = e.to_string().as_str(); "cannot open the database to checkpoint it");
                        flags.gone.store(true, Ordering::Release);
                        return;
                    }
                };
                loop {
                    // Woken early only to stop (or spuriously: one more
                    // checkpoint, which is harmless).
                    std::thread::park_timeout(CHECKPOINT_EVERY);
                    if flags.stop.load(Ordering::Acquire) {
                        break;
                    }
                    match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(1)) {
                        // The writer appended while this copied, and the
                        // log starts over only once a checkpoint has caught
                        // up with it: the writer does that between two
                        // transactions (a short copy, of what came
                        // meanwhile), and its next transaction starts the
                        // log from the beginning.
                        Ok(log) if log > 0 => flags.catch_up.store(true, Ordering::Release),
                        Ok(_) => {}
                        Err(e) => warn!(error = e.to_string().as_str(); "checkpoint failed"),
                    }
                }
            });
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                error!(error = e.to_string().as_str(); "cannot start the checkpointer");
                shared.gone.store(true, Ordering::Release);
                None
            }
        };
        Checkpointer { shared, thread }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
