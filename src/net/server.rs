//! The I/O shell's loop: one mio `Poll` owning the listener, the signal pipe
//! and every connection in a slab. Each turn: read the clock once, handle
//! events (each connection's stage reads, parses and answers within its
//! budget), apply the relay's effects to other connections, re-run
//! connections with buffered input, fire due timers, then write everything
//! pending before sleeping until the next event or deadline. Nothing here
//! blocks. The stages (`http`, `parked`, `subscriber`, `closing`) see one
//! connection and the narrow [`Ctx`]; only the server (this file, and its
//! rooms `accept`, `shutdown` and `effects`) holds the slab.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use log::{debug, info, warn};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use slab::Slab;

use super::buffer::WriteStatus;
use super::closing;
use super::conn::{Conn, Next, Phase};
use super::ctx::Ctx;
use super::redis::{self, RedisLinks};
use super::stream::{Stream, TLS_READ_BUDGET};
use super::{http, parked, subscriber};
use crate::api::Answer;
use crate::config::Config;
use crate::relay::{ApiError, ConnId, Effect, Engine, Relay};
use crate::store::MemStore;
use crate::store::redis::RedisStore;
use crate::store::sqlite::{Durable, Opened};
use crate::time::{Clock, Millis};
use std::sync::Arc;

mod accept;
mod effects;
mod shutdown;

const LISTENER: Token = Token(usize::MAX - 1);
const SIGNALS: Token = Token(usize::MAX - 2);
/// The storage thread's wake-up: it committed something.
const STORE: Token = Token(usize::MAX - 3);
/// Bytes written to one connection per turn before others get their turn.
const WRITE_BUDGET: usize = 256 * 1024;
/// Connections written per turn. A broadcast to 10,000 subscribers is
/// written in slices with a zero-timeout poll between them, so requests that
/// arrive meanwhile are answered within a slice instead of after the whole
/// pass, and frames they broadcast join the queues not yet written (one
/// `writev` then carries several frames).
const FLUSH_SLICE: usize = 256;
/// A turn that woke the loop from sleep (its poll waited at least
/// [`SLEPT_US`]) with at most this many events writes each connection's
/// output as soon as the connection is handled, rather than at the end of
/// the turn. A loop that slept is not busy: a peer is waiting on it, and
/// waking a sleeping peer starts only with the turn's first write. A
/// prompt that arrives with the agent's next poll then has its `200` on
/// the way while the poll is read and answered. A busy loop, whose poll
/// returns at once, writes at the end of the turn: writing early there
/// would split what one `writev` per connection carries (its answers and
/// the frames queued on it this turn) into a system call each.
const EARLY_WRITES: usize = 2;
/// How long a poll must have waited for its turn to count as woken from
/// sleep: a poll that finds events ready returns in a few microseconds.
const SLEPT_US: u64 = 20;
/// Extra slots for connections refused at the cap while their 503 drains.
const REJECT_SLOTS: usize = 64;
/// The most connections the slab reserves room for at start (see
/// [`slab_room`]): address space, which a 32-bit board has little of.
const SLAB_RESERVE_MAX: usize = 1 << 17;
/// Grace period for a shutdown to flush its last answers.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(1500);

/// The connections the slab holds room for from the start: every one the
/// cap allows (and those refused while their 503 drains), up to
/// [`SLAB_RESERVE_MAX`]. A block this large comes from fresh pages of the
/// system, which become resident only as connections are written into
/// them, so room not used costs no memory. A slab grown as it fills would
/// copy itself at each doubling and leave every block it outgrew resident
/// (the allocator keeps what is freed for later use), which at 19,000 idle
/// connections came to more than the 200 bytes each holds in it.
fn slab_room(max_connections: usize) -> usize {
    max_connections
        .saturating_add(REJECT_SLOTS)
        .min(SLAB_RESERVE_MAX)
}

/// The server: bound, not yet running.
pub struct Server {
    poll: Poll,
    listener: Option<TcpListener>,
    signals: Option<Signals>,
    conns: Slab<Conn>,
    cx: Ctx,
    next_gen: u32,
    effects: Vec<Effect>,
    /// The subscribers an effect goes to, reused.
    targets: Vec<ConnId>,
    clock: Clock,
    next_sweep: Millis,
    /// When the queued-bytes gauge is summed next.
    next_gauge: Millis,
    local_addr: SocketAddr,
    accept_retry: bool,
    /// Connections this turn may still write ([`FLUSH_SLICE`] per turn,
    /// early writes included).
    slice_left: usize,
    /// The sockets to Redis, when sessions are shared.
    redis: Option<RedisLinks>,
    /// TLS settings every new connection starts with (`RELAY_TLS_CERT`);
    /// replaced on SIGHUP, while open connections keep the ones they began
    /// with.
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl Server {
    /// Binds the listener (and, if asked, the SIGINT/SIGTERM handler), and
    /// starts the storage thread on a database opened and restored before
    /// (`None`: state in memory). Logs `listening` with the real address,
    /// which tells `RELAY_PORT=0` users which port was picked.
    pub fn bind(cfg: Config, handle_signals: bool, opened: Option<Opened>) -> io::Result<Server> {
        let poll = Poll::new()?;
        let addr = SocketAddr::new(cfg.host, cfg.port);
        let mut listener = accept::listen(addr)?;
        let local_addr = listener.local_addr()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let signals = if handle_signals {
            let mut s = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
            poll.registry()
                .register(&mut s, SIGNALS, Interest::READABLE)?;
            Some(s)
        } else {
            None
        };
        let tls = match &cfg.tls {
            Some(files) => Some(
                crate::tls::server_config(files)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
            ),
            None => None,
        };
        let clock = Clock::new();
        let turn = clock.turn();
        let limits = cfg.relay_limits();
        let mut redis = None;
        let relay = match opened {
            None if cfg.redis.is_some() => {
                let url = cfg.redis.clone().unwrap_or_else(|| unreachable!());
                let addrs = url.resolve().map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot resolve {}: {e}", url.display()))
                })?;
                info!(url = url.display().as_str(), prefix = cfg.redis_prefix.as_str(); "sessions shared through Redis");
                let mut links = RedisLinks::new(addrs, &url, cfg.redis_ca.as_deref())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                if links.follows_sentinels() {
                    // A host name a sentinel names is looked up off the loop.
                    links.set_waker(Arc::new(mio::Waker::new(poll.registry(), redis::RESOLVED)?));
                }
                links.tick(poll.registry(), turn.now);
                redis = Some(links);
                let store = MemStore::new(limits.store());
                let mut engine = RedisStore::new(url, &cfg.redis_prefix, limits.store());
                engine.set_replicas(cfg.redis_replicas, cfg.store_timeout);
                Relay::new(limits, store, Engine::Shared(engine))
            }
            None => Relay::in_memory(limits),
            Some(opened) => {
                let waker = Arc::new(mio::Waker::new(poll.registry(), STORE)?);
                let budget = limits.max_memory;
                let (view, durable) =
                    Durable::start(opened, limits.store(), cfg.sync, waker, budget);
                Relay::new(limits, view, Engine::Durable(durable))
            }
        };
        info!(addr = local_addr.to_string().as_str(), tls = tls.is_some(); "listening");
        let conns = Slab::with_capacity(slab_room(cfg.max_connections));
        Ok(Server {
            next_sweep: turn.now.after(sweep_interval(&cfg)),
            next_gauge: turn.now,
            cx: Ctx::new(cfg, relay, turn),
            poll,
            listener: Some(listener),
            signals,
            conns,
            next_gen: 0,
            effects: Vec::new(),
            targets: Vec::new(),
            clock,
            local_addr,
            accept_retry: false,
            slice_left: FLUSH_SLICE,
            redis,
            tls,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Runs until a shutdown completes.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            let slept_from = self.clock.micros();
            let timeout = self.poll_timeout(Millis(slept_from / 1000));
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let woke_us = self.clock.micros();
            self.cx.start_turn(self.clock.turn());
            self.slice_left = FLUSH_SLICE;
            // Woken from sleep with little to do: write as each is handled.
            let early = woke_us.saturating_sub(slept_from) >= SLEPT_US
                && events.iter().nth(EARLY_WRITES).is_none();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    redis::COMMAND | redis::EVENTS | redis::SENTINEL | redis::RESOLVED => {
                        self.on_redis(ev)
                    }
                    t if redis::is_cluster(t) => self.on_redis(ev),
                    SIGNALS => self.on_signal(),
                    STORE => {
                        self.cx.storage_done();
                        self.apply_effects();
                    }
                    Token(key) => {
                        let Some(conn) = self.conns.get_mut(key) else {
                            continue;
                        };
                        conn.on_event(ev);
                        let id = conn.id(key);
                        self.drive(id);
                        if early {
                            self.flush_pending();
                        }
                    }
                }
            }
            self.turn_end();
            let took = self.clock.micros().saturating_sub(woke_us);
            self.cx.observe_turn(took);
            let now = self.cx.now();
            if let Some(deadline) = self.cx.shutdown_at()
                && (self.conns.is_empty() || now >= deadline)
            {
                self.answer_waiting_writes();
                self.cx.stop_store();
                info!(open = self.conns.len(); "shutdown complete");
                return Ok(());
            }
        }
    }

    /// The work that closes every turn: re-run connections with buffered
    /// input, fire timers, sweep idle sessions, and write before sleeping.
    fn turn_end(&mut self) {
        let now = self.cx.now();
        if self.accept_retry {
            self.accept_retry = false;
            self.accept();
        }
        for _ in 0..4 {
            let reprocess = self.cx.take_reprocess();
            if reprocess.is_empty() {
                break;
            }
            for id in reprocess {
                self.drive(id);
            }
        }
        self.expire_timers();
        if self.cx.tick_if_due() {
            self.apply_effects();
        }
        if now >= self.next_sweep {
            self.cx.sweep();
            self.next_sweep = now.after(sweep_interval(self.cx.cfg()));
        }
        if now >= self.next_gauge {
            // The queued-bytes gauge of /metrics, sampled once a second.
            let queued = self.conns.iter().map(|(_, c)| c.queued()).sum();
            self.cx.set_bytes_queued(queued);
            self.next_gauge = now.after(Duration::from_secs(1));
        }
        self.flush_pending();
        // After every request that waited for a session read back ran
        // again (their retries are applied as the storage's news comes).
        self.cx.evict();
        self.cx.flush_store();
        let engine = self.cx.engine();
        engine.tick(now);
        if let Some(links) = &mut self.redis {
            links.tick(self.poll.registry(), now);
            links.flush(engine, self.poll.registry(), now);
        }
    }

    /// Bytes from Redis: replies and published changes are applied, and
    /// the requests that waited for them answered.
    fn on_redis(&mut self, ev: &mio::event::Event) {
        let now = self.cx.now();
        if let Some(links) = &mut self.redis {
            let (engine, buf) = self.cx.engine_and_buf();
            links.on_event(ev.token(), ev, engine, self.poll.registry(), now, buf);
        }
        self.cx.storage_done();
        self.apply_effects();
    }

    fn poll_timeout(&mut self, now: Millis) -> Option<Duration> {
        if self.cx.has_work() || self.accept_retry || self.redis.as_ref().is_some_and(|r| r.busy())
        {
            return Some(Duration::ZERO);
        }
        let mut next = self.next_sweep;
        if let Some(d) = self.redis.as_ref().and_then(|r| r.next_deadline()) {
            next = next.min(d);
        }
        if let Some(d) = self.cx.next_deadline() {
            next = next.min(d);
        }
        Some(Duration::from_millis(next.since(now)))
    }

    fn expire_timers(&mut self) {
        let mut fired = Vec::new();
        self.cx.expire(&mut fired);
        for entry in fired {
            let id = entry.key;
            let Some(conn) = lookup(&mut self.conns, id) else {
                continue;
            };
            if self.cx.deadline_passed(id, conn, &entry) {
                self.on_deadline(id);
            }
        }
    }

    /// A stage's deadline passed.
    fn on_deadline(&mut self, id: ConnId) {
        let Some(conn) = lookup(&mut self.conns, id) else {
            return;
        };
        let cx = &mut self.cx;
        match conn.phase() {
            Phase::Http(h) if h.reader.mid_request() => {
                debug!(peer = conn.peer().to_string().as_str(); "request timeout");
                closing::reply_error(id, conn, cx, &ApiError::timeout());
            }
            // Idle past its timeout, or done lingering.
            Phase::Http(_) | Phase::Closing(_) => self.close(id),
            Phase::Parked(..) => parked::deadline(id, conn, cx),
            Phase::Committing(..) => parked::commit_timed_out(id, conn, cx, false),
            Phase::WebSocket(_) => subscriber::on_deadline(id, conn, cx),
        }
    }

    /// Runs a connection's stage on whatever it has; applies the effects it
    /// caused; its own output is written at the end of the turn (or right
    /// after, in a turn that writes early: [`EARLY_WRITES`]), behind what it
    /// queued for other connections (the parked agent or the subscribers
    /// are the critical path, the requester's own answer is not).
    fn drive(&mut self, id: ConnId) {
        let Some(conn) = lookup(&mut self.conns, id) else {
            return;
        };
        let cx = &mut self.cx;
        let next = match conn.phase() {
            Phase::Http(_) => http::drive(id, conn, cx),
            Phase::Parked(..) | Phase::Committing(..) => parked::read(id, conn, cx),
            Phase::WebSocket(_) => subscriber::drive(id, conn, cx),
            Phase::Closing(_) => closing::drain(id, conn, cx),
        };
        if next == Next::Close {
            self.close(id);
            self.apply_effects();
            return;
        }
        // The effects first: the subscribers and parked polls they list
        // are written before the requester's own answer.
        self.apply_effects();
        if let Some(conn) = lookup(&mut self.conns, id) {
            if conn.take_unfinished() {
                // TLS input may be left that no edge will announce.
                self.cx.run_again(id);
            }
            self.cx.queue_write(id, conn);
        }
    }

    /// Writes what the connection has queued, within the turn's budget; a
    /// lagging subscriber is refilled from the log first.
    fn flush(&mut self, id: ConnId) {
        let Some(conn) = lookup(&mut self.conns, id) else {
            return;
        };
        subscriber::top_up(conn, &mut self.cx);
        if !conn.has_output() {
            self.after_drained(id);
            return;
        }
        if !conn.writable() {
            return;
        }
        match conn.write_out(WRITE_BUDGET) {
            WriteStatus::Drained => self.after_drained(id),
            WriteStatus::WouldBlock => {}
            WriteStatus::Budget => self.cx.queue_write(id, conn),
            WriteStatus::Failed => self.close(id),
        }
    }

    /// Output is empty: a closing connection shuts its write side; a
    /// connection whose reading waited for its output reads again; a
    /// lagging subscriber is refilled and written in the next slice.
    fn after_drained(&mut self, id: ConnId) {
        let Some(conn) = lookup(&mut self.conns, id) else {
            return;
        };
        let cx = &mut self.cx;
        match conn.phase() {
            Phase::Closing(_) if conn.eof() => {
                self.close(id);
            }
            Phase::Closing(c) if !c.shut => {
                conn.shut_write();
                if conn.readable() {
                    cx.run_again(id);
                }
            }
            // Only a connection whose requests waited for its output to
            // drain has anything to resume; one waiting for more bytes gets
            // its readable edge (re-listing it would spin the loop).
            Phase::Http(_) if conn.reading_paused() => {
                conn.resume_reading();
                cx.run_again(id);
            }
            // A parked poll's earlier answers are written: it waits with
            // no room kept for output.
            Phase::Parked(..) => conn.out().release(),
            Phase::WebSocket(_) => {
                let Some((ws, out)) = conn.subscriber() else {
                    return;
                };
                let lagging = ws.lagging;
                if !lagging && std::mem::take(&mut ws.quiet) {
                    out.release();
                }
                if conn.reading_paused() {
                    conn.resume_reading();
                    cx.run_again(id);
                }
                if lagging {
                    // More is waiting in the log: refill and write again in
                    // the next slice, after the others had their turn.
                    cx.queue_write(id, conn);
                }
            }
            _ => {}
        }
    }

    /// Writes the listed connections, within what is left of the turn's
    /// slice.
    fn flush_pending(&mut self) {
        // Only those listed before this pass: one re-listed while it is
        // written (a subscriber refilled from the log) waits for the next.
        let n = self.slice_left.min(self.cx.writes_pending());
        self.slice_left -= n;
        for _ in 0..n {
            let Some(id) = self.cx.next_write() else {
                break;
            };
            if let Some(conn) = lookup(&mut self.conns, id) {
                conn.unlist_write();
            }
            self.flush(id);
        }
    }

    /// Drops a connection now, unregistering it from the relay.
    fn close(&mut self, id: ConnId) {
        let Some(conn) = lookup(&mut self.conns, id) else {
            return;
        };
        let cx = &mut self.cx;
        match conn.phase() {
            Phase::Parked(_, p) => cx.cancel_parked(id, p),
            Phase::WebSocket(_) => subscriber::leave(id, conn, cx),
            _ => {}
        }
        let mut conn = self.conns.remove(id.key as usize);
        conn.release(self.poll.registry());
        self.cx.closed(self.conns.len());
    }
}

/// The connection `id` names, checked by generation: a slot reused by a
/// newer connection is not it.
fn lookup(conns: &mut Slab<Conn>, id: ConnId) -> Option<&mut Conn> {
    conns.get_mut(id.key as usize).filter(|c| c.is(id))
}

/// How often idle sessions are swept: a quarter of the TTL, between 100 ms
/// and a minute.
fn sweep_interval(cfg: &Config) -> Duration {
    cfg.session_ttl.map_or(Duration::from_secs(60), |ttl| {
        (ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(60))
    })
}
