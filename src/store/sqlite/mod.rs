//! Persistence on one machine: every session in an SQLite database
//! `relay.db` in `RELAY_DATA_DIR`, owned by one storage thread.
//!
//! The loop keeps the committed state in memory (a [`MemStore`] restored at
//! start) and serves every read from it. A write becomes a [`Command`]; the
//! commands of a loop turn go to the storage thread as one batch, and the
//! thread takes every batch waiting for it into one transaction (group
//! commit), decides each command there with the memory engine's own rules
//! over its own copy of the log (dedupe, `seq`, caps, trimming), appends
//! one row per message, commits (`synchronous=FULL` for
//! `RELAY_SYNC=always`: one fsync per transaction), and sends back a
//! [`Done`] per command, with the committed changes, before waking the loop
//! through a `mio::Waker`. Only then does the loop apply the changes, wake
//! parked polls, send frames and answer: nothing it sends reveals a change
//! before it is durable, and the loop never waits for the disk (while one
//! transaction commits, it reads and batches the next). A failed
//! transaction rolls back whole: its commands are answered `503`.
//!
//! Not sans-IO: this is the shell's disk. `schema` holds the SQL and its
//! migrations, `decide` the per-command logic inside a transaction.

mod decide;
mod generation;
mod rows;
mod schema;

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use log::{error, info, warn};
use rusqlite::{Connection, OpenFlags};

use super::mem::{MemStore, StoreLimits};
use super::record::{Command, Done, Outcome, Record};
use super::seam::{NOBODY, StoreEvent, StoreStats};
use crate::error::ApiError;
use crate::time::Millis;

pub use decide::Writer;
use generation::GenFile;

/// How often the storage thread makes its data durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// Every commit is fsynced before anything it carries is answered.
    Always,
    /// Commits are answered at once; the log is fsynced at least this often.
    Every(Duration),
}

/// A database opened, checked and restored, before the loop starts.
pub struct Opened {
    pub conn: Connection,
    pub view: MemStore,
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
/// and migrates the schema, and restores every session into memory.
/// Called once at start, before listening. A directory the server cannot
/// write in is reported as such; a file that is not a database, or one
/// from a newer version, is refused and left untouched.
pub fn open(dir: &Path, limits: StoreLimits, sync: Sync, now: Millis) -> Result<Opened, OpenError> {
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
    let stored = schema::generation(&conn)
        .map_err(|e| fail(&format!("cannot read {}", path.display()), &e))?;
    if let Some(acked) = acknowledged.filter(|a| *a > stored) {
        let n = schema::new_epochs(&conn, acked)
            .map_err(|e| fail(&format!("cannot write {}", path.display()), &e))?;
        warn!(path = path.display().to_string().as_str(), sessions = n, acknowledged = acked, stored = stored;
            "the database is behind what was acknowledged (its write-ahead log relay.db-wal was lost): every session gets a new epoch");
    }
    let generation = GenFile::open(dir).map_err(|e| {
        fail(
            &format!("cannot write {}", dir.join(generation::NAME).display()),
            &e,
        )
    })?;
    let view = schema::restore(&conn, limits, now, true)
        .map_err(|e| fail(&format!("cannot read {}", path.display()), &e))?;
    info!(path = path.display().to_string().as_str(), sessions = view.len(), schema = version; "database opened");
    Ok(Opened {
        conn,
        view,
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

/// Where the loop and the storage thread meet over a write whose requester
/// stopped waiting (see [`Durable::cancel`]). Tickets are numbered in the
/// order the loop submits them, and the thread takes them in that order,
/// so two numbers say everything.
#[derive(Debug, Default)]
pub struct Frontier {
    /// The highest ticket the thread has taken into a transaction: its
    /// fate is the disk's now.
    taken: u64,
    /// Tickets up to this one that the thread has not taken yet are never
    /// to be taken: their requesters were answered `503`.
    cancelled: u64,
}

/// Takes the commands of a group into the transaction, except those whose
/// requesters were answered meanwhile: those come back apart, answered
/// `503` (nobody waits on that answer; it keeps the count of commands in
/// flight right).
fn take_group(frontier: &Mutex<Frontier>, group: Vec<Command>) -> (Vec<Command>, Vec<Done>) {
    let mut f = frontier.lock().unwrap_or_else(PoisonError::into_inner);
    let cancelled = f.cancelled;
    if let Some(last) = group.last() {
        f.taken = f.taken.max(last.ticket.n);
    }
    drop(f);
    if group.first().is_none_or(|c| c.ticket.n > cancelled) {
        return (group, Vec::new());
    }
    let (dropped, kept): (Vec<_>, Vec<_>) =
        group.into_iter().partition(|c| c.ticket.n <= cancelled);
    let dropped = dropped
        .into_iter()
        .map(|c| Done {
            ticket: c.ticket,
            result: Err(ApiError::storage_unavailable()),
            records: Vec::new(),
        })
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
struct Health {
    /// The last commit, sync or probe succeeded.
    ok: AtomicBool,
    /// When the current disk operation began, in milliseconds since `base`
    /// plus one; 0 while none runs.
    busy_since: AtomicU64,
    base: Instant,
}

impl Health {
    fn new() -> Health {
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
    fn healthy(&self) -> bool {
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
fn run(
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
            // No commit waits for a checkpoint's copy (it was the p99).
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
        let commands = group.len();
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

/// How often the checkpointer copies the log into the database with
/// `RELAY_SYNC=always`: small copies, each of the pages written since the
/// last, and a log that stays short and is reused from its start.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

/// A thread with a second connection that checkpoints (`PASSIVE`: it never
/// blocks the writer, and the writer never waits for it) while the writer
/// goes on committing. SQLite's NORMAL mode fsyncs the log before each
/// checkpoint and the database after it, so a checkpoint never puts
/// anything in the database that the log does not hold durably. Stops
/// when dropped. (Flags rather than channels: a channel of a new type
/// costs the static binary about 20 KB.)
struct Checkpointer {
    shared: Arc<Flags>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the checkpointer and the writer tell each other.
#[derive(Default)]
struct Flags {
    /// The writer should copy what came during the last checkpoint.
    catch_up: AtomicBool,
    /// The checkpointer could not open the database and has ended.
    gone: AtomicBool,
    /// The writer is done: the checkpointer ends.
    stop: AtomicBool,
}

impl Checkpointer {
    fn start(db: PathBuf) -> Checkpointer {
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

/// The loop's handle on the storage thread.
pub struct Durable {
    batches: Option<Sender<Vec<Command>>>,
    done: Receiver<Committed>,
    /// Totals for `/metrics`.
    pub stats: StoreStats,
    /// This turn's commands, sent at the end of the turn.
    batch: Vec<Command>,
    /// Commands sent and not answered yet.
    inflight: usize,
    /// What was committed, as the relay takes it (see `next_event`).
    ready: VecDeque<StoreEvent>,
    /// The storage thread is gone (it could not start, or ended).
    gone: bool,
    health: Arc<Health>,
    frontier: Arc<Mutex<Frontier>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _lock: File,
}

/// One committed command as the relay takes it: its records, then its
/// requester's answer (a connect whose session was created runs again; a
/// sweep has no requester).
fn events_of(done: Done, out: &mut VecDeque<StoreEvent>) {
    for record in &done.records {
        if let Record::Deleted { sid } = record {
            info!(session_id = sid.as_str(); "session deleted");
        }
    }
    let to = done.ticket;
    let answered = to.conn != NOBODY && !matches!(done.result, Ok(Outcome::Collected));
    match done.result {
        Ok(Outcome::Session { put: false, .. }) => {
            out.push_back(StoreEvent::Records(done.records));
            out.push_back(StoreEvent::Retry(to));
        }
        result if answered => out.push_back(StoreEvent::Answer {
            to,
            records: done.records,
            result,
            delivered: false,
        }),
        _ => out.push_back(StoreEvent::Records(done.records)),
    }
}

/// Commands in flight above which the loop takes no new request until some
/// are answered: the queue to the storage thread stays bounded.
pub const MAX_INFLIGHT: usize = 16_384;

impl Durable {
    /// Starts the storage thread on an opened database; returns the
    /// restored state for the loop, and the handle.
    pub fn start(
        opened: Opened,
        limits: StoreLimits,
        sync: Sync,
        waker: Arc<mio::Waker>,
    ) -> (MemStore, Durable) {
        let (batch_tx, batch_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let (conn, generation) = (opened.conn, opened.generation);
        let frontier = Arc::new(Mutex::new(Frontier::default()));
        let theirs = frontier.clone();
        let health = Arc::new(Health::new());
        let shared = health.clone();
        // The writer reads its copy of the log in the thread, while the
        // loop starts serving what it restored.
        let thread = std::thread::Builder::new()
            .name("relay-storage".into())
            .spawn(move || {
                let writer = Writer::new(conn, limits, generation);
                run(writer, batch_rx, done_tx, waker, sync, theirs, shared)
            })
            .ok();
        let durable = Durable {
            batches: Some(batch_tx),
            done: done_rx,
            stats: StoreStats::default(),
            batch: Vec::new(),
            inflight: 0,
            ready: VecDeque::new(),
            gone: thread.is_none(),
            health,
            frontier,
            thread,
            _lock: opened.lock,
        };
        (opened.view, durable)
    }

    /// Adds a command to this turn's batch.
    pub fn submit(&mut self, cmd: Command) {
        self.batch.push(cmd);
    }

    /// Whether the queue to the storage thread is full.
    pub fn saturated(&self) -> bool {
        self.inflight + self.batch.len() >= MAX_INFLIGHT
    }

    /// Sends this turn's batch; called once at the end of every loop turn.
    pub fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        self.inflight += batch.len();
        if let Some(tx) = &self.batches
            && tx.send(batch).is_err()
        {
            error!("the storage thread is gone");
            self.gone = true;
        }
    }

    /// The next of what the storage thread committed, for the relay:
    /// each command's records, then its requester's answer.
    pub fn next_event(&mut self) -> Option<StoreEvent> {
        if self.ready.is_empty() {
            while let Ok(c) = self.done.try_recv() {
                self.inflight = self.inflight.saturating_sub(c.done.len());
                self.stats.commits += 1;
                self.stats.commands += c.commands as u64;
                self.stats.errors += u64::from(!c.ok);
                self.stats.commit_time.observe_us(c.micros);
                for done in c.done {
                    events_of(done, &mut self.ready);
                }
            }
        }
        self.ready.pop_front()
    }

    /// Whether writes succeed and none is overdue (`/readyz`): follows
    /// the storage thread's commits, syncs and probes, and turns false
    /// while one disk operation has taken longer than [`OVERDUE`].
    pub fn healthy(&self) -> bool {
        !self.gone && self.health.healthy()
    }

    /// Cancels the write of ticket `n` (and of every earlier ticket) if the
    /// storage thread has not taken it yet; returns whether it did. Called
    /// when a request stops waiting: a cancelled write is never committed,
    /// so its `503` is the truth; one already taken is the disk's, and only
    /// the thread's answer tells whether it is stored. Earlier tickets
    /// stopped waiting no later than this one (every request waits as
    /// long), so cancelling them too takes nothing anyone still waits on.
    pub fn cancel(&mut self, n: u64) -> bool {
        if let Some(i) = self.batch.iter().position(|c| c.ticket.n == n) {
            // Not sent yet (a shutdown in the turn it was asked for).
            self.batch.remove(i);
            return true;
        }
        let mut f = self.frontier.lock().unwrap_or_else(PoisonError::into_inner);
        if f.taken >= n {
            return false;
        }
        f.cancelled = f.cancelled.max(n);
        true
    }

    /// Stops the storage thread after it committed what it was sent,
    /// waiting for it at most `bound`: a disk that stalls does not hold the
    /// process (what it had not confirmed was answered as such, and SQLite
    /// recovers a transaction cut short at the next start).
    pub fn stop(&mut self, bound: Duration) {
        self.batches = None;
        let Some(t) = self.thread.take() else {
            return;
        };
        let until = std::time::Instant::now() + bound;
        loop {
            // Results still coming are not applied any more: the loop has
            // answered every request that waited.
            match self
                .done
                .recv_timeout(until.saturating_duration_since(std::time::Instant::now()))
            {
                Ok(_) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    let _ = t.join();
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {
                    warn!("the storage thread did not finish in time; exiting without it");
                    return;
                }
            }
        }
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        self.stop(STOP_BOUND);
    }
}

/// How long a shutdown waits for the storage thread to finish.
pub const STOP_BOUND: Duration = Duration::from_millis(500);
