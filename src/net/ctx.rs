//! The narrow context every stage works with: the cores (API rules, relay),
//! the timer wheel, the lists of connections to write or re-run, the turn's
//! clock, and the settings. A stage gets one connection and this; it never
//! sees another connection (what it does to others is an effect, applied by
//! the loop) nor the poll or the slab.

use std::collections::VecDeque;
use std::rc::Rc;

use super::conn::Conn;
use crate::api::{Api, Facts};
use crate::config::Config;
use crate::http::response::Meta;
use crate::metrics::{self, Metrics, Snapshot};
use crate::relay::{ConnId, Relay};
use crate::time::{Millis, Turn};
use crate::timer::TimerWheel;

/// Bytes read from one connection per turn before others get their turn:
/// no client, however fast or hostile, holds the loop (and the timers)
/// for more than one slice (the Redis model).
pub const READ_BUDGET: usize = 64 * 1024;

/// See the module doc.
pub struct Ctx {
    pub cfg: Config,
    pub api: Api,
    pub relay: Relay,
    pub timers: TimerWheel<ConnId>,
    /// Connections with output to write before the loop sleeps.
    pub pending_writes: VecDeque<ConnId>,
    /// Connections to drive again this turn (buffered input, a budget
    /// that ran out, a parked poll answered).
    pub reprocess: Vec<ConnId>,
    /// The clock, read once at the start of the turn.
    pub turn: Turn,
    /// Connections that stopped taking requests while the queue to the
    /// storage thread was full; re-run when it answers.
    pub stalled: Vec<ConnId>,
    /// Set when a shutdown began: the loop exits by then.
    pub shutdown: Option<Millis>,
    /// Open connections, for `/healthz`, `/readyz` and the cap.
    pub connections: usize,
    /// A read buffer shared by every connection.
    pub scratch: Box<[u8]>,
    /// Frames of one refill, reused.
    pub frames: Vec<Rc<[u8]>>,
    /// What the shell counts for `/metrics`.
    pub metrics: Metrics,
    /// Bytes queued for every connection, summed by the loop for a scrape.
    pub bytes_queued: usize,
}

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
            scratch: vec![0u8; READ_BUDGET].into_boxed_slice(),
            frames: Vec::new(),
            metrics: Metrics::default(),
            bytes_queued: 0,
        }
    }

    /// The current time.
    pub fn now(&self) -> Millis {
        self.turn.now
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
        })
    }

    /// Response headers for a request from `origin`.
    pub fn meta<'a>(&'a self, origin: Option<&'a str>, keep_alive: bool) -> Meta<'a> {
        self.api.meta(origin, keep_alive, self.facts())
    }

    /// Sets the connection's deadline; the wheel gets an entry only when
    /// the new deadline is earlier than the one already scheduled (lazy
    /// re-arming: a later one is re-armed when the earlier entry fires).
    pub fn set_deadline(&mut self, id: ConnId, conn: &mut Conn, deadline: Millis) {
        conn.deadline = Some(deadline);
        if conn.timer_at.is_none_or(|t| deadline < t) {
            conn.timer_at = Some(deadline);
            self.timers.insert(deadline, id);
        }
    }

    /// Puts a connection on the pending-write list: bytes entered its queue
    /// outside its own writable event, so no edge will come by itself.
    pub fn mark_write(&mut self, id: ConnId, conn: &mut Conn) {
        if !conn.write_listed {
            conn.write_listed = true;
            self.pending_writes.push_back(id);
        }
    }
}
