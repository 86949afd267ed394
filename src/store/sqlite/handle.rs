//! The loop's handle on the storage thread, [`Durable`]: the commands of a
//! loop turn sent as one batch at its end, what the thread committed
//! turned into the [`StoreEvent`]s every engine gives the relay, a write
//! cancelled while the thread has not taken it, readiness read without
//! waiting for the thread, and the thread stopped at shutdown.
//!
//! Invariants: at most [`MAX_INFLIGHT`] commands are in flight (the loop
//! takes no new request past that); a command's records reach the relay
//! before its requester's answer; a shutdown waits for the thread at most
//! [`STOP_BOUND`]. The shell's disk, not a core: it hands the thread the
//! loop's `mio::Waker` and reads the clock to bound the shutdown.

use std::collections::VecDeque;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use log::{error, info, warn};

use super::Sync;
use super::cache::Share;
use super::decide::Writer;
use super::open::Opened;
use super::thread::{Committed, Frontier, Health, run};
use crate::store::mem::{MemStore, StoreLimits};
use crate::store::record::{Command, Done, Op, Outcome, Record};
use crate::store::seam::{NOBODY, StoreEvent, StoreStats};
use crate::store::types::Ticket;
use crate::time::Millis;

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
    /// The budget the storage thread's cache shares with the loop.
    share: Arc<Share>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The data directory's lock (none for a [`Durable::detached`] one).
    _lock: Option<File>,
    /// Messages of history a session keeps (a session read back is
    /// replayed with it).
    history_limit: usize,
    /// The all-sessions reads waiting for the start's reading, while it
    /// is under way (`None` once the copy holds every pending prompt).
    warming: Option<Vec<Ticket>>,
    /// While the file's sessions are still being listed for the loop
    /// (its copy knows them by id, [`Op::Dormant`]): the `sessions` row
    /// the next list starts after.
    listing: Option<i64>,
    /// The start's reading, or its last list, failed (its group rolled
    /// back, or the database could not be read): it is asked again before
    /// the next command.
    rewarm: bool,
}

/// The storage side of a handle with no storage thread
/// ([`Durable::detached`]): the batches the loop sends, and where the
/// commits go back, for a storage the caller plays. The simulation
/// (`tests/sim`) plays it: it decides each command with the memory
/// engine's rules, as the thread's writer does, and chooses when a
/// transaction commits and whether it rolls back.
#[doc(hidden)]
pub struct Detached {
    pub batches: Receiver<Vec<Command>>,
    pub done: Sender<Committed>,
    frontier: Arc<Mutex<Frontier>>,
}

impl Detached {
    /// Takes a group of commands into a transaction as the storage thread
    /// does: the commands whose requesters were answered meanwhile come
    /// back apart, answered `503`, and are never to be committed.
    pub fn take(&self, group: Vec<Command>) -> (Vec<Command>, Vec<Done>) {
        super::thread::take_group(&self.frontier, group)
    }
}

/// One committed command as the relay takes it: the sessions it read
/// whole, its records, then its requester's answer (a connect whose
/// session was created, and a read that waited for its session, run
/// again; a sweep has no requester). The start's reading ends with the
/// ids of sessions, as each list that follows it (`first` says which).
fn events_of(done: Done, limit: usize, first: bool, out: &mut VecDeque<StoreEvent>) {
    for record in &done.records {
        if let Record::Deleted { sid } = record {
            info!(session_id = sid.as_str(); "session deleted");
        }
    }
    for image in done.images {
        let sid = image.sid.clone();
        // Its activity is set when the copy takes it.
        let log = Box::new(image.into_log(Millis(0), limit));
        out.push_back(StoreEvent::Loaded { sid, log });
    }
    let to = done.ticket;
    let answered = to.conn != NOBODY && !matches!(done.result, Ok(Outcome::Collected));
    match done.result {
        Ok(Outcome::Session { put: false, .. }) | Ok(Outcome::Loaded) => {
            out.push_back(StoreEvent::Records(done.records));
            out.push_back(StoreEvent::Retry(to));
        }
        Ok(Outcome::Warmed { dormant, .. }) => out.push_back(StoreEvent::Dormant {
            sids: dormant,
            first,
        }),
        result if answered => out.push_back(StoreEvent::Answer {
            to,
            records: done.records,
            result,
            delivered: false,
        }),
        _ => out.push_back(StoreEvent::Records(done.records)),
    }
}

/// The start's reading: the sessions with pending prompts whole and the
/// first sessions' ids (`after` is `None`), or the next ids, after the
/// `sessions` row `after` (ticket 0, for nobody, either way).
fn warm(after: Option<i64>) -> Command {
    Command {
        ticket: Ticket { conn: NOBODY, n: 0 },
        op: after.map_or(Op::Warm, |after| Op::Dormant { after }),
        unix_ms: 0,
        load: false,
    }
}

/// Commands in flight above which the loop takes no new request until some
/// are answered: the queue to the storage thread stays bounded.
pub const MAX_INFLIGHT: usize = 16_384;

impl Durable {
    /// Starts the storage thread on an opened database, its cache sharing
    /// the memory budget of `budget` bytes with the loop ([`Share`]);
    /// returns the loop's copy, which holds no session yet (the thread's
    /// first work reads those with pending prompts into it), and the
    /// handle.
    pub fn start(
        opened: Opened,
        limits: StoreLimits,
        sync: Sync,
        waker: Arc<mio::Waker>,
        budget: usize,
    ) -> (MemStore, Durable) {
        let (batch_tx, batch_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let (conn, generation) = (opened.conn, opened.generation);
        let frontier = Arc::new(Mutex::new(Frontier::default()));
        let theirs = frontier.clone();
        let health = Arc::new(Health::new());
        let shared = health.clone();
        let share = Arc::new(Share::new(budget));
        let theirs_share = share.clone();
        let thread = std::thread::Builder::new()
            .name("relay-storage".into())
            .spawn(move || {
                let writer = Writer::new(conn, limits, generation, theirs_share);
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
            share,
            thread,
            _lock: Some(opened.lock),
            history_limit: limits.history_limit,
            warming: Some(Vec::new()),
            listing: Some(0),
            rewarm: false,
        };
        let mut durable = durable;
        durable.submit(warm(None));
        // Sent now, not with the first loop turn's batch: a server nobody
        // talks to yet reads its pending sessions (and reports damaged
        // rows among them) all the same.
        durable.flush();
        (MemStore::new(limits), durable)
    }

    /// A handle with no storage thread and no database: the caller plays
    /// the storage through the [`Detached`] side (see there).
    #[doc(hidden)]
    pub fn detached(limits: StoreLimits) -> (Durable, Detached) {
        let (batch_tx, batch_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let frontier = Arc::new(Mutex::new(Frontier::default()));
        let durable = Durable {
            batches: Some(batch_tx),
            done: done_rx,
            stats: StoreStats::default(),
            batch: Vec::new(),
            inflight: 0,
            ready: VecDeque::new(),
            gone: false,
            health: Arc::new(Health::new()),
            frontier: frontier.clone(),
            share: Arc::default(),
            thread: None,
            _lock: None,
            history_limit: limits.history_limit,
            warming: None,
            listing: None,
            rewarm: false,
        };
        let detached = Detached {
            batches: batch_rx,
            done: done_tx,
            frontier,
        };
        (durable, detached)
    }

    /// [`detached`](Self::detached), as [`start`](Self::start) leaves the
    /// handle: the start's reading (`Op::Warm`) is its first command, and
    /// reads of every session wait for it.
    #[doc(hidden)]
    pub fn detached_starting(limits: StoreLimits) -> (Durable, Detached) {
        let (mut durable, detached) = Durable::detached(limits);
        durable.warming = Some(Vec::new());
        durable.listing = Some(0);
        durable.submit(warm(None));
        (durable, detached)
    }

    /// Adds a command to this turn's batch (after the start's reading,
    /// when it is to be asked again).
    pub fn submit(&mut self, cmd: Command) {
        if std::mem::take(&mut self.rewarm) {
            self.batch.push(self.reading());
        }
        self.batch.push(cmd);
    }

    /// The start's reading as it stands: the first, or the next list.
    fn reading(&self) -> Command {
        let after = self.warming.is_none().then_some(self.listing).flatten();
        warm(after)
    }

    /// Before an all-sessions read: true (its ticket taken) while the
    /// start's reading is under way; the read runs again once the copy
    /// holds every pending prompt.
    pub fn before_every_read(&mut self, ticket: impl FnOnce() -> Ticket) -> bool {
        match &mut self.warming {
            Some(waiting) => {
                waiting.push(ticket());
                true
            }
            None => false,
        }
    }

    /// Whether the start's reading is under way: the sessions with
    /// pending prompts not read yet, or the others not all listed.
    pub fn warming(&self) -> bool {
        self.warming.is_some() || self.listing.is_some()
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
                // A group of reads alone is no commit.
                if c.commands > 0 {
                    self.stats.commits += 1;
                    self.stats.commands += c.commands as u64;
                    self.stats.errors += u64::from(!c.ok);
                    self.stats.commit_time.observe_us(c.micros);
                }
                for done in c.done {
                    // The start's reading is ticket 0, and each list after
                    // it. Until it is done the loop's copy cannot tell a
                    // session on disk from none: when it fails, the reads
                    // waiting on it wait on (to their storage timeout),
                    // and it is asked again with the next command.
                    let warmed = done.ticket.conn == NOBODY && done.ticket.n == 0;
                    if warmed && done.result.is_err() {
                        warn!("the start's reading of the sessions failed; it will be tried again");
                        self.rewarm = true;
                        continue;
                    }
                    let first = warmed && self.warming.is_some();
                    if let Ok(Outcome::Warmed { next, .. }) = &done.result {
                        // The next list goes with this turn's batch.
                        self.listing = *next;
                        if next.is_some() {
                            self.batch.push(warm(*next));
                        }
                    }
                    events_of(done, self.history_limit, first, &mut self.ready);
                    if first {
                        for to in self.warming.take().unwrap_or_default() {
                            self.ready.push_back(StoreEvent::Retry(to));
                        }
                    }
                }
            }
        }
        self.ready.pop_front()
    }

    /// The bytes the storage thread's cache holds, as it last published
    /// them (counted in `relay_memory_bytes`).
    pub fn cache_bytes(&self) -> usize {
        self.share.held.load(Ordering::Relaxed) as usize
    }

    /// The bytes the loop's log holds now: the cache takes what they
    /// leave of the budget. Called every loop turn.
    pub fn loop_holds(&self, bytes: usize) {
        self.share.others.store(bytes as u64, Ordering::Relaxed);
    }

    /// Whether writes succeed and none is overdue (`/readyz`): follows
    /// the storage thread's commits, syncs and probes, and turns false
    /// while one disk operation has taken longer than `OVERDUE` (`thread.rs`).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;
    use crate::store::types::{ConnId, SessionId};

    fn limits() -> StoreLimits {
        StoreLimits {
            history_limit: 10,
            max_sessions: 10,
            max_pending: 10,
            draft_timeout_ms: 60_000,
        }
    }

    fn answer(side: &Detached, done: Vec<Done>) {
        let commands = done.len();
        let committed = Committed {
            done,
            commands,
            micros: 0,
            ok: false,
        };
        side.done.send(committed).unwrap();
    }

    /// A start whose reading failed does not count as done: the
    /// all-sessions read keeps waiting, and the reading is sent again,
    /// first, with the next command; once it succeeds the read runs.
    #[test]
    fn a_failed_start_reading_is_asked_again_before_the_next_command() {
        let (mut d, side) = Durable::detached_starting(limits());
        let conn = ConnId {
            key: 1,
            generation: 1,
        };
        let every = Ticket { conn, n: 1 };
        assert!(d.before_every_read(|| every));
        d.flush();
        let first = side.batches.try_recv().unwrap();
        assert!(matches!(first[0].op, Op::Warm));
        answer(
            &side,
            vec![Done::only(
                first[0].ticket,
                Err(ApiError::storage_unavailable()),
            )],
        );
        assert!(d.next_event().is_none(), "nothing for the loop yet");
        assert!(d.warming(), "the start's reading is not done");

        let sid = SessionId::new("s").unwrap();
        let load = Ticket { conn, n: 2 };
        d.submit(Command {
            ticket: load,
            op: Op::Load { sid },
            unix_ms: 0,
            load: false,
        });
        d.flush();
        let next = side.batches.try_recv().unwrap();
        assert!(matches!(next[0].op, Op::Warm), "the reading goes first");
        assert_eq!(next[1].ticket, load);
        let warmed = Outcome::Warmed {
            dormant: Vec::new(),
            next: None,
        };
        answer(&side, vec![Done::only(next[0].ticket, Ok(warmed))]);
        assert!(matches!(
            d.next_event(),
            Some(StoreEvent::Dormant { first: true, .. })
        ));
        assert!(matches!(d.next_event(), Some(StoreEvent::Retry(t)) if t == every));
        assert!(!d.warming());
    }

    /// The ids come in lists after the start's reading: each answer
    /// asks for the next list, after its last row, with the next batch;
    /// the reading counts as under way until a list says there is no
    /// more, and only the first orders the restored prompts.
    #[test]
    fn the_start_lists_the_sessions_until_the_last_list() {
        let (mut d, side) = Durable::detached_starting(limits());
        d.flush();
        let first = side.batches.try_recv().unwrap();
        let listed = |next| Outcome::Warmed {
            dormant: vec![SessionId::new("s").unwrap()],
            next,
        };
        answer(
            &side,
            vec![Done::only(first[0].ticket, Ok(listed(Some(7))))],
        );
        assert!(matches!(
            d.next_event(),
            Some(StoreEvent::Dormant { first: true, .. })
        ));
        assert!(d.warming(), "more ids to come");
        d.flush();
        let next = side.batches.try_recv().unwrap();
        assert!(matches!(next[0].op, Op::Dormant { after: 7 }));
        answer(&side, vec![Done::only(next[0].ticket, Ok(listed(None)))]);
        assert!(matches!(
            d.next_event(),
            Some(StoreEvent::Dormant { first: false, .. })
        ));
        assert!(!d.warming());
        d.flush();
        assert!(side.batches.try_recv().is_err(), "no list after the last");
    }
}
