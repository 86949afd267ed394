//! The narrow context every stage works with: the cores (API rules, relay),
//! the timer wheel, the lists of connections to write or re-run, the turn's
//! clock, and the settings. A stage gets one connection and this; it never
//! sees another connection (what it does to others is an effect, applied by
//! the loop) nor the poll or the slab.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::rc::Rc;

use super::buffer::OutQueue;
use super::conn::{Conn, Fired, Parked, Rerun};
use super::read::READ_BUDGET;
use crate::api::{Api, Facts, Outcome};
use crate::config::Config;
use crate::http::response::Meta;
use crate::http::{Method, RequestHead};
use crate::metrics::{self, Metrics, Snapshot};
use crate::relay::{Abandon, ConnId, Effect, Engine, Relay, Ticket};
use crate::store::Cursor;
use crate::time::{Millis, Turn, UnixMillis};
use crate::timer::{Entry, TimerWheel};

/// See the module doc. The fields are private: stages and the loop use
/// the methods below, grouped by who calls them.
pub struct Ctx {
    cfg: Config,
    api: Api,
    relay: Relay,
    timers: TimerWheel<ConnId>,
    /// Connections with output to write before the loop sleeps.
    pending_writes: VecDeque<ConnId>,
    /// Connections to drive again this turn (buffered input, a budget
    /// that ran out, a parked poll answered).
    reprocess: Vec<ConnId>,
    /// The clock, read once at the start of the turn.
    turn: Turn,
    /// Connections that stopped taking requests while the queue to the
    /// storage thread was full; re-run when it answers.
    stalled: Vec<ConnId>,
    /// Set when a shutdown began: the loop exits by then.
    shutdown: Option<Millis>,
    /// Open connections, for `/healthz`, `/readyz` and the cap.
    connections: usize,
    /// A read buffer shared by every connection, grown to the largest read
    /// asked of it (at most [`READ_BUDGET`]): a server that only ever reads
    /// request heads keeps a 16 KiB buffer, not a 64 KiB one it zeroed.
    scratch: Vec<u8>,
    /// Frames of one refill, reused.
    frames: Vec<Rc<[u8]>>,
    /// What the shell counts for `/metrics`.
    metrics: Metrics,
    /// Bytes queued for every connection, summed by the loop for a scrape.
    bytes_queued: usize,
}

/// For the stages: the turn, the settings, the cores, and the lists the
/// loop works through.
impl Ctx {
    /// The context of a server with these settings, at `turn`.
    pub fn new(cfg: Config, mut relay: Relay, turn: Turn) -> Ctx {
        relay.set_clock(turn.now, turn.unix_ms);
        Ctx {
            api: Api::new(&cfg),
            cfg,
            relay,
            timers: TimerWheel::new(turn.now),
            pending_writes: VecDeque::new(),
            reprocess: Vec::new(),
            stalled: Vec::new(),
            turn,
            shutdown: None,
            connections: 0,
            scratch: Vec::new(),
            frames: Vec::new(),
            metrics: Metrics::default(),
            bytes_queued: 0,
        }
    }

    /// The current time.
    pub fn now(&self) -> Millis {
        self.turn.now
    }

    /// The wall clock of the turn, for a ping's `ts`.
    pub fn unix_ms(&self) -> UnixMillis {
        self.turn.unix_ms
    }

    /// Where a connection's output queue counts its bytes (the memory
    /// budget's meter).
    pub fn memory_meter(&self) -> &crate::store::log::weight::Meter {
        self.relay.memory_meter()
    }

    /// The settings.
    pub fn cfg(&self) -> &Config {
        &self.cfg
    }

    /// The facts answers report (`/healthz`, `/readyz`, keep-alive).
    pub fn facts(&self) -> Facts {
        Facts {
            connections: self.connections,
            shutting_down: self.shutdown.is_some(),
            synced: false,
        }
    }

    /// The `/metrics` text: a snapshot of the shell's and the relay's
    /// counters.
    pub fn render_metrics(&self) -> Vec<u8> {
        metrics::render(&Snapshot {
            shell: &self.metrics,
            store: self.relay.store_stats(),
            stats: self.relay.stats(),
            counts: self.relay.counts(),
            connections: self.connections,
            bytes_queued: self.bytes_queued,
            memory_recount: self.relay.memory_recount(),
        })
    }

    /// Response headers for a request from `origin`.
    pub fn meta<'a>(&'a self, origin: Option<&'a str>, keep_alive: bool) -> Meta<'a> {
        self.api.meta(origin, keep_alive, self.facts())
    }

    /// Hands a parsed request from connection `id` to the API rules, with
    /// no ticket left over from a request before it.
    pub fn handle(
        &mut self,
        id: ConnId,
        peer: IpAddr,
        head: &RequestHead,
        body: &[u8],
        facts: Facts,
    ) -> Outcome {
        let _ = self.relay.take_ticket();
        self.api
            .handle(&mut self.relay, self.turn, id, peer, head, body, facts)
    }

    /// Runs a request again that waited for the storage: the copy holds
    /// what it waited for now, so it does not wait for that again. A
    /// [`Rerun`] is a request without a body, so none is given.
    pub fn rerun(&mut self, id: ConnId, peer: IpAddr, rerun: &Rerun) -> Outcome {
        let facts = Facts {
            synced: true,
            ..self.facts()
        };
        self.handle(id, peer, rerun.head(), &[], facts)
    }

    /// The ticket the request just handled waits under, if it waits.
    pub fn take_ticket(&mut self) -> Option<Ticket> {
        self.relay.take_ticket()
    }

    /// The storage takes no more writes for now: requests wait.
    pub fn store_saturated(&self) -> bool {
        self.relay.store_saturated()
    }

    /// Gives up waiting for `ticket`'s write.
    pub fn abandon(&mut self, ticket: Ticket) -> Abandon {
        self.relay.abandon(ticket)
    }

    /// A parked poll (of prompts or of an ask) is answered or gone: its
    /// waiter leaves.
    pub fn cancel_parked(&mut self, id: ConnId, parked: &Parked) {
        match (&parked.ask, &parked.sid) {
            (Some(_), Some(sid)) => self.relay.cancel_ask_wait(id, sid, self.turn.now),
            (None, Some(sid)) => self.relay.cancel_wait(id, sid, self.turn.now),
            (_, None) => self.relay.cancel_every_wait(id, self.turn.now),
        }
    }

    /// The answer of a parked `GET /asks` at its deadline: the ask's state
    /// then. At the ask's own expiry the wall clock is taken as no earlier
    /// than its `expires_ts` (the two clocks may disagree by a tick).
    pub fn ask_deadline(&mut self, parked: &Parked) -> (u16, Rc<[u8]>) {
        let (Some(ask), Some(sid)) = (&parked.ask, &parked.sid) else {
            return (200, Rc::from(&b"[]"[..]));
        };
        let (now, mut unix_ms) = (self.turn.now, self.turn.unix_ms);
        if now >= ask.expires_at {
            unix_ms = unix_ms.max(ask.expires_ts);
        }
        self.relay.ask_deadline(now, unix_ms, sid, &ask.ask_id)
    }

    /// A subscriber of `sid` leaves.
    pub fn unsubscribe(&mut self, id: ConnId, sid: &str) {
        self.relay.unsubscribe(id, sid, self.turn.now);
    }

    /// Queues on `out` the frames of `sid`'s log after `cursor`, up to
    /// `room` bytes (at least one frame when `out` is empty); true when the
    /// subscriber is caught up.
    pub fn refill(
        &mut self,
        sid: &str,
        cursor: &mut Cursor,
        room: usize,
        out: &mut OutQueue,
    ) -> bool {
        let mut frames = std::mem::take(&mut self.frames);
        let caught_up = self
            .relay
            .refill(sid, cursor, room, out.is_empty(), &mut frames);
        self.metrics.frames_sent += frames.len() as u64;
        for frame in frames.drain(..) {
            out.push_shared(frame);
        }
        self.frames = frames;
        caught_up
    }

    /// Counts a live frame queued on a subscriber.
    pub fn count_frame(&mut self) {
        self.metrics.frames_sent += 1;
    }

    /// Counts an answered request.
    pub fn count_request(&mut self, method: Method, path: &str, status: u16) {
        self.metrics.request(method, path, status);
    }

    /// The shared read buffer, `len` bytes of it (at most [`READ_BUDGET`]).
    pub fn read_buf(&mut self, len: usize) -> &mut [u8] {
        let len = len.min(READ_BUDGET);
        if self.scratch.len() < len {
            self.scratch.resize(len, 0);
        }
        &mut self.scratch[..len]
    }

    /// Sets the connection's deadline; the wheel gets an entry only when
    /// the new deadline is earlier than the one already scheduled (lazy
    /// re-arming: a later one is re-armed when the earlier entry fires).
    pub fn set_deadline(&mut self, id: ConnId, conn: &mut Conn, deadline: Millis) {
        if conn.schedule(deadline) {
            self.timers.insert(deadline, id);
        }
    }

    /// Puts a connection on the pending-write list: bytes entered its queue
    /// outside its own writable event, so no edge will come by itself.
    pub fn queue_write(&mut self, id: ConnId, conn: &mut Conn) {
        if conn.list_write() {
            self.pending_writes.push_back(id);
        }
    }

    /// Drives the connection again this turn (buffered input, a budget
    /// that ran out, a parked poll answered).
    pub fn run_again(&mut self, id: ConnId) {
        self.reprocess.push(id);
    }

    /// The connection waits for the storage thread to take writes again.
    pub fn stall(&mut self, id: ConnId) {
        self.stalled.push(id);
    }
}

/// For the loop: the turn, the relay's clock and storage, timers, the
/// lists, the counts.
impl Ctx {
    /// A new turn: the clock read once, for the relay and the Redis engine
    /// too.
    pub fn start_turn(&mut self, turn: Turn) {
        self.turn = turn;
        self.relay.set_clock(turn.now, turn.unix_ms);
    }

    /// The storage answered (the storage thread's waker fired, or Redis's
    /// bytes were read): apply what it committed and heard, and re-run
    /// the connections that stalled on it.
    pub fn storage_done(&mut self) {
        self.relay.storage_done(self.turn.now);
        self.reprocess.append(&mut self.stalled);
    }

    /// The engine, for the loop that drives its sockets and timers.
    pub fn engine(&mut self) -> &mut Engine {
        self.relay.engine()
    }

    /// The engine with the shared read buffer, for its sockets.
    pub fn engine_and_buf(&mut self) -> (&mut Engine, &mut [u8]) {
        if self.scratch.len() < READ_BUDGET {
            self.scratch.resize(READ_BUDGET, 0);
        }
        (self.relay.engine(), &mut self.scratch)
    }

    /// Moves the relay's effects for other connections into `out`.
    pub fn take_effects(&mut self, out: &mut Vec<Effect>) {
        self.relay.take_effects(out);
    }

    /// The subscribers of `sid`, in the order effects reach them.
    pub fn subscribers(&self, sid: &str) -> &[ConnId] {
        self.relay.subscribers(sid)
    }

    /// Runs the relay's tick (stopped drafts, agents past their grace) if
    /// it is due; true if it ran.
    pub fn tick_if_due(&mut self) -> bool {
        let now = self.turn.now;
        if self.relay.next_tick().is_some_and(|t| now >= t) {
            self.relay.tick(now);
            return true;
        }
        false
    }

    /// Drops idle sessions and rate-limit buckets.
    pub fn sweep(&mut self) {
        self.relay.collect_idle(self.turn.now);
        self.api.sweep(self.turn.now);
    }

    /// Drops the least recently used sessions nothing holds while the
    /// memory budget is passed (where the storage reads them back).
    pub fn evict(&mut self) {
        self.relay.evict(self.turn.now);
    }

    /// Hands the turn's writes to the storage thread.
    pub fn flush_store(&mut self) {
        self.relay.flush_store();
    }

    /// Stops the storage thread, after its last commit.
    pub fn stop_store(&mut self) {
        self.relay.stop_store();
    }

    /// The connections to drive again, taken.
    pub fn take_reprocess(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.reprocess)
    }

    /// Work is listed for this turn: the loop must not sleep.
    pub fn has_work(&self) -> bool {
        !self.reprocess.is_empty() || !self.pending_writes.is_empty()
    }

    /// Connections on the pending-write list.
    pub fn writes_pending(&self) -> usize {
        self.pending_writes.len()
    }

    /// The next connection to write, off the list.
    pub fn next_write(&mut self) -> Option<ConnId> {
        self.pending_writes.pop_front()
    }

    /// The earliest deadline of the timers, the relay's tick, the
    /// engine's own work and a shutdown.
    pub fn next_deadline(&mut self) -> Option<Millis> {
        [
            self.relay.engine().next_deadline(),
            self.timers.next_deadline(),
            self.relay.next_tick(),
            self.shutdown,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Moves the wheel's entries due by now into `fired`.
    pub fn expire(&mut self, fired: &mut Vec<Entry<ConnId>>) {
        self.timers.expire(self.turn.now, fired);
    }

    /// A wheel entry of connection `id` fired: true if its deadline
    /// passed; a stale entry does nothing, and a deadline moved later is
    /// scheduled again.
    pub fn deadline_passed(&mut self, id: ConnId, conn: &mut Conn, entry: &Entry<ConnId>) -> bool {
        match conn.fire(entry.deadline, self.turn.now) {
            Fired::Stale => false,
            Fired::Later(deadline) => {
                self.timers.insert(deadline, id);
                false
            }
            Fired::Due => true,
        }
    }

    /// When the shutdown ends, if one began.
    pub fn shutdown_at(&self) -> Option<Millis> {
        self.shutdown
    }

    /// Begins a shutdown that ends by `deadline`, or moves its end.
    pub fn shut_down_by(&mut self, deadline: Millis) {
        self.shutdown = Some(deadline);
    }

    /// A connection was accepted; `open` are open now.
    pub fn accepted(&mut self, open: usize) {
        self.connections = open;
        self.metrics.accepted += 1;
    }

    /// A connection was closed; `open` are open now.
    pub fn closed(&mut self, open: usize) {
        self.connections = open;
    }

    /// Records how long a turn took.
    pub fn observe_turn(&mut self, micros: u64) {
        self.metrics.turns.observe_us(micros);
    }

    /// The queued-bytes gauge of `/metrics`, as the loop summed it.
    pub fn set_bytes_queued(&mut self, bytes: usize) {
        self.bytes_queued = bytes;
    }
}
