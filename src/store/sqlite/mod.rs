//! Persistence on one machine: every session in an SQLite database
//! `relay.db` in `RELAY_DATA_DIR`, owned by one storage thread.
//!
//! The loop keeps the committed state of the sessions in use in memory (a
//! [`MemStore`](super::MemStore), empty at start) and serves every read
//! from it; a session it does not hold is read back whole first, under a
//! ticket ([`Op::Load`](super::record::Op::Load), or with a write's
//! answer), and the loop drops the least recently used ones nothing holds
//! to keep the memory budget (`relay/resident.rs`). At start the thread's
//! first work sends the sessions with pending prompts, and the others'
//! ids ([`Op::Warm`](super::record::Op::Warm)). A write becomes a
//! [`Command`](super::record::Command); the
//! commands of a loop turn go to the storage thread as one batch, and the
//! thread takes every batch waiting for it into one transaction (group
//! commit), decides each command there with the memory engine's own rules
//! over the sessions it names (dedupe, `seq`, caps, trimming), as its cache
//! holds them or reads them back from the file, appends
//! one row per message, commits (`synchronous=FULL` for
//! `RELAY_SYNC=always`: one fsync per transaction), and sends back a
//! [`Done`](super::record::Done) per command, with the committed changes,
//! before waking the loop through its poll's waker. Only then does the loop
//! apply the changes, wake parked polls, send frames and answer: nothing
//! it sends reveals a change before it is durable, and the loop never
//! waits for the disk (while one transaction commits, it reads and batches
//! the next). A failed transaction rolls back whole: its commands are
//! answered `503`.
//!
//! The rooms:
//!
//! - `open`: the database opened at start, its lock taken, its schema
//!   checked ([`open()`], [`Opened`]);
//! - `handle`: the loop's side, [`Durable`]: batches sent, commits taken
//!   back as events, cancellation, readiness, shutdown;
//! - `thread`: the storage thread's loop: group commit, the upkeep
//!   between commits, its health;
//! - `checkpoint`: the thread that copies the write-ahead log into the
//!   database with `RELAY_SYNC=always`;
//! - `decide`: the writer, each command decided and written as rows
//!   inside a transaction; `decide/load` the sessions read for the loop
//!   (one function, `Cache::session_for_loop`);
//! - `cache`: the sessions the writer holds, read back on demand, the
//!   least recently used dropped past the cache's share of the budget;
//! - `rows`: where each retained message's row is, and the rows history
//!   dropped;
//! - `schema`: the SQL, its migrations and the restore at start;
//! - `generation`: the side file that tells a lost write-ahead log.
//!
//! The shell's disk, not a core. Only `thread` and `handle` read the
//! clock or hold the loop's waker, and `scripts/check-pure.sh` leaves out
//! those two alone: the other rooms are checked like the cores, so a clock
//! read or a socket added there fails CI (the checkpointer sleeps between
//! copies, but reads no clock).

mod cache;
mod checkpoint;
mod decide;
mod generation;
mod handle;
mod open;
mod rows;
mod schema;
#[cfg(test)]
mod tests;
mod thread;

use std::time::Duration;

pub use decide::Writer;
pub use generation::{Recovery, recover};
pub use handle::{Detached, Durable, MAX_INFLIGHT, STOP_BOUND};
pub use open::{OpenError, Opened, open};
pub use thread::{Committed, Frontier};

/// How often the storage thread makes its data durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// Every commit is fsynced before anything it carries is answered.
    Always,
    /// Commits are answered at once; the log is fsynced at least this often.
    Every(Duration),
}
