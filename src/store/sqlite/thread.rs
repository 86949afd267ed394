//! The storage thread's loop: it takes the loop's batches until the loop
//! hangs up, every batch waiting into one transaction (group commit, at
//! most [`MAX_GROUP`] commands), decides and commits them through the
//! [`Writer`], sends back one [`Committed`] per transaction and wakes the
//! loop. Beside the commits it runs the upkeep (the interval sync of
//! `RELAY_SYNC=<seconds>`, a probe while writes fail, the copy the
//! checkpointer asks for), and keeps its [`Health`] where the loop reads
//! it for `/readyz` without waiting.
//!
//! Invariants: a write whose requester was answered before the thread took
//! it (see [`Frontier`]) is never committed, and one it took is the disk's
//! (only its commit answers it); a transaction's generation is recorded
//! before anything it carries is answered. The shell's disk, not a core:
//! it reads the clock (commit times, a disk operation overdue) and wakes
//! the loop through its `mio::Waker`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use log::{error, info};

use super::Sync;
use super::checkpoint::Checkpointer;
use super::decide::{Writer, reads_only};
use crate::error::ApiError;
use crate::store::record::{Command, Done};
use crate::store::seam::NOBODY;

/// Where the loop and the storage thread meet over a write whose requester
/// stopped waiting (see [`Durable::cancel`](super::Durable::cancel)).
/// Tickets are numbered in the order the loop submits them, and the thread
/// takes them in that order (the start's reading, ticket 0 and for
/// nobody, goes between them), so two numbers say everything.
#[derive(Debug, Default)]
pub struct Frontier {
    /// The highest ticket the thread has taken into a transaction: its
    /// fate is the disk's now.
    pub(super) taken: u64,
    /// Tickets up to this one that the thread has not taken yet are never
    /// to be taken: their requesters were answered `503`.
    pub(super) cancelled: u64,
}

/// Takes the commands of a group into the transaction, except those whose
/// requesters were answered meanwhile: those come back apart, answered
/// `503` (nobody waits on that answer; it keeps the count of commands in
/// flight right).
pub(super) fn take_group(
    frontier: &Mutex<Frontier>,
    group: Vec<Command>,
) -> (Vec<Command>, Vec<Done>) {
    let mut f = frontier.lock().unwrap_or_else(PoisonError::into_inner);
    let cancelled = f.cancelled;
    // The highest ticket, which need not be the last one's: the start's
    // reading and its lists are ticket 0 (for nobody) and go out with
    // whatever the loop sends.
    if let Some(n) = group.iter().map(|c| c.ticket.n).max() {
        f.taken = f.taken.max(n);
    }
    drop(f);
    if group.first().is_none_or(|c| c.ticket.n > cancelled) {
        return (group, Vec::new());
    }
    // A command for nobody (the sweep's, the start's reading) has no
    // requester to stop waiting: it is never cancelled.
    let (dropped, kept): (Vec<_>, Vec<_>) = group
        .into_iter()
        .partition(|c| c.ticket.n <= cancelled && c.ticket.conn != NOBODY);
    let dropped = dropped
        .into_iter()
        .map(|c| Done::only(c.ticket, Err(ApiError::storage_unavailable())))
        .collect();
    (kept, dropped)
}

/// How often the storage thread tries a small write while writes fail, so
/// that readiness comes back by itself once the disk works again.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long one disk operation (a commit, a sync, a probe) may take before
/// `/readyz` reports the storage as failing: a disk that stopped answering.
const OVERDUE: Duration = Duration::from_secs(3);

/// The storage thread's health, shared with the loop, which reads it for
/// `/readyz` without waiting for the thread.
pub(super) struct Health {
    /// The last commit, sync or probe succeeded.
    ok: AtomicBool,
    /// When the current disk operation began, in milliseconds since `base`
    /// plus one; 0 while none runs.
    busy_since: AtomicU64,
    base: Instant,
}

impl Health {
    pub(super) fn new() -> Health {
        Health {
            ok: AtomicBool::new(true),
            busy_since: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    fn millis(&self) -> u64 {
        self.base.elapsed().as_millis() as u64 + 1
    }

    /// Runs one disk operation, marked as running while it does.
    fn busy<T>(&self, op: impl FnOnce() -> T) -> T {
        self.busy_since.store(self.millis(), Ordering::Release);
        let out = op();
        self.busy_since.store(0, Ordering::Release);
        out
    }

    /// Writes succeed, and none has been running for longer than
    /// [`OVERDUE`].
    pub(super) fn healthy(&self) -> bool {
        let since = self.busy_since.load(Ordering::Acquire);
        let overdue =
            since != 0 && self.millis().saturating_sub(since) > OVERDUE.as_millis() as u64;
        self.ok.load(Ordering::Acquire) && !overdue
    }
}

/// The storage thread's side of the channels: takes batches until the loop
/// hangs up, commits every batch waiting in one transaction, answers, and
/// wakes the loop. With `Sync::Always`, a checkpointer thread copies the
/// log into the database beside it; with `Sync::Every`, the writer
/// checkpoints (which syncs) no later than that interval after a commit,
/// however busy it is. While writes fail it tries a small one every
/// [`PROBE_EVERY`]; `health` follows every disk operation.
pub(super) fn run(
    mut writer: Writer,
    batches: Receiver<Vec<Command>>,
    done: Sender<Committed>,
    waker: Arc<mio::Waker>,
    sync: Sync,
    frontier: Arc<Mutex<Frontier>>,
    health: Arc<Health>,
) {
    let (interval, mut checkpointer) = match sync {
        Sync::Always => {
            // No commit waits for a checkpoint's copy: SQLite's own
            // checkpoint runs inside the commit that fills the log to
            // its threshold, and every request that commit carries would
            // wait for a copy of the whole log.
            writer.automatic_checkpoints(false);
            let checkpointer = Checkpointer::start(writer.db_path());
            (None, Some(checkpointer))
        }
        Sync::Every(d) => (Some(d), None),
    };
    let mut upkeep = Upkeep::new(interval);
    loop {
        let first = match batches.recv_timeout(upkeep.wait(&health)) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => {
                if upkeep.run(&mut writer, &health) {
                    writer.sync_generation();
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let mut group = first;
        // Group commit: everything that arrived while the last transaction
        // committed goes into this one.
        while group.len() < MAX_GROUP {
            match batches.try_recv() {
                Ok(more) => group.extend(more),
                Err(_) => break,
            }
        }
        if let Some(c) = &checkpointer {
            if c.shared.gone.load(Ordering::Acquire) {
                // The checkpointer could not start (it logged why): SQLite
                // checkpoints in the writer's commits again.
                writer.automatic_checkpoints(true);
                checkpointer = None;
            } else if c.shared.catch_up.swap(false, Ordering::AcqRel) {
                if !health.busy(|| writer.catch_up()) {
                    c.shared.catch_up.store(true, Ordering::Release);
                }
                writer.sync_generation();
            }
        }
        let (group, mut cancelled) = take_group(&frontier, group);
        // Reads for the loop are no commands of a commit: a group of
        // them alone commits nothing.
        let commands = group.iter().filter(|c| !reads_only(c)).count();
        let started = Instant::now();
        let mut results = if group.is_empty() {
            Vec::new()
        } else {
            health.busy(|| writer.commit(group))
        };
        let ok = !results
            .iter()
            .any(|d| d.result.as_ref().err() == Some(&ApiError::storage_unavailable()));
        results.append(&mut cancelled);
        let committed = Committed {
            commands,
            micros: started.elapsed().as_micros() as u64,
            ok,
            done: results,
        };
        if commands > 0 {
            // Recorded before anything the commit carries is answered.
            let recorded = !committed.ok || writer.record_generation();
            health.ok.store(committed.ok && recorded, Ordering::Release);
            upkeep.committed(committed.ok, started);
        }
        if done.send(committed).is_err() {
            break;
        }
        if let Err(e) = waker.wake() {
            error!(error = e.to_string().as_str(); "cannot wake the loop");
        }
        if upkeep.run(&mut writer, &health) {
            writer.sync_generation();
        }
    }
    drop(checkpointer);
    writer.checkpoint();
    writer.sync_generation();
}

/// The storage thread's work besides commits: the interval sync of
/// `Sync::Every`, and the probe while writes fail.
struct Upkeep {
    /// `Sync::Every`'s interval.
    interval: Option<Duration>,
    /// With an interval: when the first commit not synced yet began.
    unsynced: Option<Instant>,
    next_probe: Instant,
}

impl Upkeep {
    fn new(interval: Option<Duration>) -> Upkeep {
        Upkeep {
            interval,
            unsynced: None,
            next_probe: Instant::now(),
        }
    }

    /// How long the thread may wait for a batch before some upkeep is due.
    fn wait(&self, health: &Health) -> Duration {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(3600);
        if let (Some(d), Some(t)) = (self.interval, self.unsynced) {
            wake = wake.min(t + d);
        }
        if !health.ok.load(Ordering::Acquire) {
            wake = wake.min(self.next_probe);
        }
        wake.saturating_duration_since(now)
    }

    /// A commit that began at `started` succeeded (or not: the first probe
    /// then comes a [`PROBE_EVERY`] later, so that the failure is what
    /// readiness reports meanwhile).
    fn committed(&mut self, ok: bool, started: Instant) {
        if !ok {
            self.next_probe = Instant::now() + PROBE_EVERY;
        } else if self.unsynced.is_none() {
            self.unsynced = Some(started);
        }
    }

    /// Runs what is due: the interval sync (copying the log syncs it, then
    /// the database; a failure is tried again an interval later), and the
    /// probe while writes fail. True when it synced the database.
    fn run(&mut self, writer: &mut Writer, health: &Health) -> bool {
        let mut synced = false;
        let now = Instant::now();
        if let (Some(d), Some(t)) = (self.interval, self.unsynced)
            && now >= t + d
        {
            synced = health.busy(|| writer.checkpoint());
            self.unsynced = if synced { None } else { Some(now) };
            if !synced {
                self.next_probe = now + PROBE_EVERY;
            }
            health.ok.store(synced, Ordering::Release);
        }
        if !health.ok.load(Ordering::Acquire) && now >= self.next_probe {
            self.next_probe = now + PROBE_EVERY;
            let every = self.interval.is_some();
            let ok = health.busy(|| writer.probe() && (!every || writer.checkpoint()));
            if ok {
                info!("storage writes succeed again");
                if every {
                    self.unsynced = None;
                    synced = true;
                }
            }
            health.ok.store(ok, Ordering::Release);
        }
        synced
    }
}

/// One transaction's outcome, as the storage thread sends it back.
pub struct Committed {
    pub done: Vec<Done>,
    /// Commands it carried (the group commit's batch size).
    pub commands: usize,
    /// How long deciding and committing took, fsync included.
    pub micros: u64,
    /// It committed (else it rolled back and every command got 503).
    pub ok: bool,
}

/// Commands taken into one transaction at most.
const MAX_GROUP: usize = 8192;
