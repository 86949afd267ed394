//! The I/O shell: one mio `Poll` owning the listener, the signal pipe and
//! every connection in a slab. Each loop turn: handle events (reading,
//! parsing and answering), apply the relay's effects, re-run connections with
//! buffered input, fire due timers, then write everything pending before
//! sleeping until the next event or deadline. Nothing here blocks.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use log::{debug, info, warn};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use slab::Slab;

use super::buffer::WriteStatus;
use super::conn::{Conn, Phase};
use super::ws;
use crate::config::Config;
use crate::http::response::{self, Meta};
use crate::keepalive::Action;
use crate::ratelimit::RateLimiter;
use crate::relay::{ConnId, Effect, Limits, Relay};
use crate::time::{Clock, Millis};
use crate::timer::TimerWheel;

const LISTENER: Token = Token(usize::MAX - 1);
const SIGNALS: Token = Token(usize::MAX - 2);
/// Bytes written to one connection per turn before others get their turn.
const WRITE_BUDGET: usize = 256 * 1024;
/// Connections written per turn. A broadcast to 10,000 subscribers is
/// written in slices with a zero-timeout poll between them, so requests that
/// arrive meanwhile are answered within a slice instead of after the whole
/// pass, and frames they broadcast join the queues not yet written (one
/// `writev` then carries several frames).
const FLUSH_SLICE: usize = 256;
/// Unsent response bytes above which a connection's requests wait: a client
/// that pipelines without reading cannot grow our output.
pub const OUT_HIGH_WATER: usize = 256 * 1024;
/// How long a closing connection may take to flush and hear the peer close.
pub(super) const LINGER: Duration = Duration::from_secs(2);
/// Extra slots for connections refused at the cap while their 503 drains.
const REJECT_SLOTS: usize = 64;
/// Grace period for a shutdown to flush its last answers.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(1500);

/// The server: bound, not yet running.
pub struct Server {
    pub(super) cfg: Config,
    poll: Poll,
    listener: Option<TcpListener>,
    signals: Option<Signals>,
    pub(super) conns: Slab<Conn>,
    next_gen: u32,
    pub(super) relay: Relay,
    pub(super) limiter: RateLimiter,
    timers: TimerWheel<ConnId>,
    pub(super) pending_writes: VecDeque<ConnId>,
    pub(super) reprocess: Vec<ConnId>,
    effects: Vec<Effect>,
    scratch: Box<[u8]>,
    /// Frames of one refill, reused.
    pub(super) refill_scratch: Vec<Rc<[u8]>>,
    pub(super) clock: Clock,
    pub(super) shutdown_deadline: Option<Millis>,
    next_sweep: Millis,
    local_addr: SocketAddr,
    accept_retry: bool,
}

impl Server {
    /// Binds the listener (and, if asked, the SIGINT/SIGTERM handler).
    /// Logs `listening` with the real address, which tells `RELAY_PORT=0`
    /// users which port was picked.
    pub fn bind(cfg: Config, handle_signals: bool) -> io::Result<Server> {
        let poll = Poll::new()?;
        let addr = SocketAddr::new(cfg.host, cfg.port);
        let mut listener = listen(addr)?;
        let local_addr = listener.local_addr()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let signals = if handle_signals {
            let mut s = Signals::new([SIGINT, SIGTERM])?;
            poll.registry()
                .register(&mut s, SIGNALS, Interest::READABLE)?;
            Some(s)
        } else {
            None
        };
        let clock = Clock::new();
        let now = clock.now();
        let relay = Relay::new(Limits::from_config(&cfg));
        info!(addr = local_addr.to_string().as_str(); "listening");
        Ok(Server {
            limiter: RateLimiter::new(cfg.rate_limit),
            timers: TimerWheel::new(now),
            next_sweep: now.after(sweep_interval(&cfg)),
            cfg,
            poll,
            listener: Some(listener),
            signals,
            conns: Slab::new(),
            next_gen: 0,
            relay,
            pending_writes: VecDeque::new(),
            reprocess: Vec::new(),
            effects: Vec::new(),
            scratch: vec![0u8; 64 * 1024].into_boxed_slice(),
            refill_scratch: Vec::new(),
            clock,
            shutdown_deadline: None,
            local_addr,
            accept_retry: false,
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
            let timeout = self.poll_timeout(self.clock.now());
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let now = self.clock.now();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(now),
                    SIGNALS => self.on_signal(now),
                    Token(key) => {
                        let Some(conn) = self.conns.get_mut(key) else {
                            continue;
                        };
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            conn.readable = true;
                        }
                        if ev.is_read_closed() || ev.is_error() {
                            conn.read_closed = true;
                        }
                        if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                            conn.writable = true;
                        }
                        let id = ConnId {
                            key: key as u32,
                            generation: conn.generation,
                        };
                        self.drive(id, now);
                    }
                }
            }
            self.turn_end(now);
            if let Some(deadline) = self.shutdown_deadline
                && (self.conns.is_empty() || now >= deadline)
            {
                info!(open = self.conns.len(); "shutdown complete");
                return Ok(());
            }
        }
    }

    /// The work that closes every turn: re-run connections with buffered
    /// input, fire timers, sweep idle sessions, and write before sleeping.
    fn turn_end(&mut self, now: Millis) {
        if self.accept_retry {
            self.accept_retry = false;
            self.accept(now);
        }
        for _ in 0..4 {
            if self.reprocess.is_empty() {
                break;
            }
            for id in std::mem::take(&mut self.reprocess) {
                self.drive(id, now);
            }
        }
        self.expire_timers(now);
        if now >= self.next_sweep {
            self.relay.collect_idle(now);
            self.limiter.sweep(now);
            self.next_sweep = now.after(sweep_interval(&self.cfg));
        }
        self.flush_pending(now);
    }

    fn poll_timeout(&mut self, now: Millis) -> Option<Duration> {
        if !self.reprocess.is_empty() || !self.pending_writes.is_empty() || self.accept_retry {
            return Some(Duration::ZERO);
        }
        let mut next = self.next_sweep;
        if let Some(d) = self.timers.next_deadline() {
            next = next.min(d);
        }
        if let Some(d) = self.shutdown_deadline {
            next = next.min(d);
        }
        Some(Duration::from_millis(next.since(now)))
    }

    /// Accepts every waiting connection; over the cap each gets a 503.
    fn accept(&mut self, now: Millis) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            let (mut sock, addr) = match listener.accept() {
                Ok(pair) => pair,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors or memory: try again next turn.
                    warn!(error = e.to_string().as_str(); "accept failed");
                    self.accept_retry = true;
                    return;
                }
            };
            let full = self.conns.len() >= self.cfg.max_connections;
            if full && self.conns.len() >= self.cfg.max_connections + REJECT_SLOTS {
                continue; // dropped: the cap and the reject slots are full
            }
            let refusal = full.then(|| {
                let err = crate::relay::ApiError::unavailable("connection limit reached");
                response::encode(
                    503,
                    &[("Retry-After", "1")],
                    &err.body(),
                    &self.meta(None, false),
                )
            });
            let _ = sock.set_nodelay(true);
            let entry = self.conns.vacant_entry();
            let key = entry.key();
            if self
                .poll
                .registry()
                .register(
                    &mut sock,
                    Token(key),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .is_err()
            {
                continue;
            }
            self.next_gen = self.next_gen.wrapping_add(1);
            let generation = self.next_gen;
            let mut conn = Conn::new(generation, sock, addr.ip(), self.cfg.max_body_bytes);
            let id = ConnId {
                key: key as u32,
                generation,
            };
            let deadline = if let Some(refusal) = refusal {
                conn.out.push_owned(refusal);
                conn.phase = Phase::Closing { shut: false };
                now.after(LINGER)
            } else {
                now.after(self.cfg.request_timeout)
            };
            entry.insert(conn);
            self.set_deadline(id, deadline);
            if full {
                self.mark_write(id);
            }
        }
    }

    fn on_signal(&mut self, now: Millis) {
        let Some(signals) = &mut self.signals else {
            return;
        };
        let got = signals.pending().next().is_some();
        if got {
            self.begin_shutdown(now);
        }
    }

    /// Stops accepting, answers parked polls `[]`, closes subscribers with
    /// 1001 and idle connections at once, and lets in-flight requests finish
    /// with `Connection: close`. The loop exits when every connection is
    /// gone or the grace period ends.
    pub fn begin_shutdown(&mut self, now: Millis) {
        if self.shutdown_deadline.is_some() {
            // A second signal: stop now.
            self.shutdown_deadline = Some(now);
            return;
        }
        info!("shutting down");
        self.shutdown_deadline = Some(now.after(SHUTDOWN_GRACE));
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .map(|(k, c)| ConnId {
                key: k as u32,
                generation: c.generation,
            })
            .collect();
        for id in ids {
            let Some(conn) = self.conn(id) else { continue };
            match &conn.phase {
                Phase::Parked(..) => self.answer_parked(id, 200, Rc::from(&b"[]"[..]), now),
                Phase::WebSocket(_) => self.close_ws(id, 1001, "server shutting down", now),
                Phase::Http(h) if !h.reader.mid_request() => {
                    if conn.out.is_empty() {
                        self.close_now(id);
                    } else {
                        // An answer is still going out: finish it, then close.
                        self.begin_closing(id, now);
                    }
                }
                _ => {}
            }
        }
    }

    /// The live connection `id` names, if it is still the same one.
    pub(super) fn conn(&mut self, id: ConnId) -> Option<&mut Conn> {
        lookup(&mut self.conns, id)
    }

    /// Sets the stage's deadline; the wheel gets an entry only when the new
    /// deadline is earlier than the one already scheduled (lazy re-arming).
    pub(super) fn set_deadline(&mut self, id: ConnId, deadline: Millis) {
        let Some(conn) = lookup(&mut self.conns, id) else {
            return;
        };
        conn.deadline = Some(deadline);
        if conn.timer_at.is_none_or(|t| deadline < t) {
            conn.timer_at = Some(deadline);
            self.timers.insert(deadline, id);
        }
    }

    /// Puts a connection on the pending-write list: bytes entered its queue
    /// outside its own writable event, so no edge will come by itself.
    pub(super) fn mark_write(&mut self, id: ConnId) {
        if let Some(conn) = lookup(&mut self.conns, id)
            && !conn.write_listed
        {
            conn.write_listed = true;
            self.pending_writes.push_back(id);
        }
    }

    fn expire_timers(&mut self, now: Millis) {
        let mut fired = Vec::new();
        self.timers.expire(now, &mut fired);
        for entry in fired {
            let id = entry.key;
            let Some(conn) = self.conn(id) else { continue };
            if conn.timer_at != Some(entry.deadline) {
                continue; // stale: an earlier entry replaced it
            }
            conn.timer_at = None;
            let Some(deadline) = conn.deadline else {
                continue;
            };
            if deadline > now {
                // Moved later since this entry was scheduled: re-arm.
                conn.timer_at = Some(deadline);
                self.timers.insert(deadline, id);
                continue;
            }
            conn.deadline = None;
            self.on_deadline(id, now);
        }
    }

    /// A stage's deadline passed.
    fn on_deadline(&mut self, id: ConnId, now: Millis) {
        let unix_ms = self.clock.unix_now();
        let Some(conn) = self.conn(id) else { return };
        match &mut conn.phase {
            Phase::Http(h) => {
                if h.reader.mid_request() {
                    debug!(peer = conn.peer.to_string().as_str(); "request timeout");
                    let err = crate::relay::ApiError::timeout();
                    self.reply_error_and_close(id, &err, None);
                } else {
                    self.close_now(id);
                }
            }
            Phase::Parked(..) => self.answer_parked(id, 200, Rc::from(&b"[]"[..]), now),
            Phase::WebSocket(ws) => {
                let action = ws.keepalive.on_timer(now);
                let next = ws.keepalive.deadline();
                match action {
                    Action::Close => {
                        debug!("subscriber silent for two ping intervals");
                        self.close_ws(id, 1000, "ping timeout", now);
                    }
                    Action::SendPing => {
                        let ping = format!("{{\"type\":\"ping\",\"ts\":{unix_ms}}}");
                        conn.out.push_owned(ws::encode_text(&ping));
                        conn.out.push_owned(ws::encode_ping());
                        self.set_deadline(id, next);
                        self.mark_write(id);
                    }
                    Action::Nothing => self.set_deadline(id, next),
                }
            }
            Phase::Closing { .. } => self.close_now(id),
        }
    }

    /// Reads and handles whatever a connection has; its output is written at
    /// the end of the turn.
    pub(super) fn drive(&mut self, id: ConnId, now: Millis) {
        let Some(conn) = self.conn(id) else { return };
        match conn.phase {
            Phase::Http(_) => self.drive_http(id, now),
            Phase::Parked(..) => self.read_parked(id),
            Phase::WebSocket(_) => self.drive_ws(id, now),
            Phase::Closing { .. } => self.drain_closing(id),
        }
        self.apply_effects(now);
        // Written at the end of the turn, behind what this request queued
        // for other connections: the parked agent or the subscribers are
        // the critical path, the requester's own answer is not.
        self.mark_write(id);
    }

    /// Reads into a connection's request buffer, at most `want` bytes.
    /// Returns false when the peer is gone (the connection is then closed).
    pub(super) fn fill(&mut self, id: ConnId, want: usize) -> bool {
        let Some(conn) = lookup(&mut self.conns, id) else {
            return false;
        };
        let max = want.min(self.scratch.len());
        if !conn.readable || max == 0 {
            return true;
        }
        let n = loop {
            match conn.sock.read(&mut self.scratch[..max]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    conn.readable = false;
                    return true;
                }
                Err(_) => break 0,
            }
        };
        if n == 0 {
            if matches!(conn.phase, Phase::Http(_)) {
                // Answer what is buffered first; drive_http closes after.
                conn.eof = true;
                conn.readable = false;
                return true;
            }
            self.close_now(id);
            return false;
        }
        if n < max && !conn.read_closed {
            // A short read drained the socket: the next arrival raises a
            // new edge, so skip the read that would only say EAGAIN (as
            // nginx does). Not after the peer's FIN: no edge follows it.
            conn.readable = false;
        }
        match &mut conn.phase {
            Phase::Http(h) | Phase::Parked(h, _) => h.reader.push(&self.scratch[..n]),
            _ => {}
        }
        true
    }

    /// A closing connection discards input until the peer closes.
    fn drain_closing(&mut self, id: ConnId) {
        let Some(conn) = lookup(&mut self.conns, id) else {
            return;
        };
        if !conn.readable {
            return;
        }
        for _ in 0..16 {
            match conn.sock.read(&mut self.scratch) {
                Ok(0) => {
                    if matches!(conn.phase, Phase::Closing { shut: true }) {
                        self.close_now(id);
                    } else {
                        // The peer is done sending; finish writing, then
                        // close (after_drained sees `eof`).
                        conn.eof = true;
                        conn.readable = false;
                    }
                    return;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    conn.readable = false;
                    return;
                }
                Err(_) => {
                    self.close_now(id);
                    return;
                }
            }
        }
        self.reprocess.push(id);
    }

    /// Writes what the connection has queued, within the turn's budget; a
    /// lagging subscriber is refilled from the log first.
    pub(super) fn flush(&mut self, id: ConnId) {
        self.top_up(id);
        let Some(conn) = self.conn(id) else { return };
        if conn.out.is_empty() {
            self.after_drained(id);
            return;
        }
        if !conn.writable {
            return;
        }
        match conn.out.write_to(&mut conn.sock, WRITE_BUDGET) {
            WriteStatus::Drained => self.after_drained(id),
            WriteStatus::WouldBlock => conn.writable = false,
            WriteStatus::Budget => self.mark_write(id),
            WriteStatus::Failed => self.close_now(id),
        }
    }

    /// Output is empty: a closing connection shuts its write side; an HTTP
    /// connection held back by unsent output may read requests again.
    fn after_drained(&mut self, id: ConnId) {
        let Some(conn) = self.conn(id) else { return };
        match &mut conn.phase {
            Phase::Closing { .. } if conn.eof => self.close_now(id),
            Phase::Closing { shut } if !*shut => {
                *shut = true;
                let _ = conn.sock.shutdown(Shutdown::Write);
                if !conn.readable {
                    return;
                }
                self.reprocess.push(id);
            }
            // Only a connection whose requests waited for its output to
            // drain has anything to resume; one waiting for more bytes gets
            // its readable edge (re-listing it would spin the loop).
            Phase::Http(_) if conn.out_paused => {
                conn.out_paused = false;
                self.reprocess.push(id);
            }
            Phase::WebSocket(ws) => {
                let lagging = ws.lagging;
                if conn.out_paused {
                    conn.out_paused = false;
                    self.reprocess.push(id);
                }
                if lagging {
                    // More is waiting in the log: refill and write again in
                    // the next slice, after the others had their turn.
                    self.mark_write(id);
                }
            }
            _ => {}
        }
    }

    fn flush_pending(&mut self, _now: Millis) {
        // Only those listed before this pass: one re-listed while it is
        // written (a subscriber refilled from the log) waits for the next.
        for _ in 0..FLUSH_SLICE.min(self.pending_writes.len()) {
            let Some(id) = self.pending_writes.pop_front() else {
                break;
            };
            if let Some(conn) = self.conn(id) {
                conn.write_listed = false;
            }
            self.flush(id);
        }
    }

    /// Drops a connection now, unregistering it from the relay.
    pub(super) fn close_now(&mut self, id: ConnId) {
        let now = self.clock.now();
        let Some(conn) = self.conn(id) else { return };
        match &conn.phase {
            Phase::Parked(_, p) => {
                let sid = p.sid.clone();
                self.relay.cancel_wait(id, &sid, now);
            }
            Phase::WebSocket(_) => self.leave_ws(id, now),
            _ => {}
        }
        let mut conn = self.conns.remove(id.key as usize);
        let _ = self.poll.registry().deregister(&mut conn.sock);
    }

    /// Applies the relay's queued effects to other connections.
    pub(super) fn apply_effects(&mut self, now: Millis) {
        if self.effects.is_empty() {
            self.relay.take_effects(&mut self.effects);
        }
        while !self.effects.is_empty() {
            for effect in std::mem::take(&mut self.effects) {
                match effect {
                    Effect::Respond { to, status, body } => {
                        self.answer_parked(to, status, body, now)
                    }
                    Effect::Deliver {
                        sid,
                        seq,
                        prev,
                        frame,
                    } => self.deliver(&sid, seq, prev, frame),
                    Effect::CloseSubscriber { to, code } => {
                        self.close_ws(to, code, "session deleted", now)
                    }
                }
            }
            self.relay.take_effects(&mut self.effects);
        }
    }

    /// Sends an error answer and closes the connection after it.
    pub(super) fn reply_error_and_close(
        &mut self,
        id: ConnId,
        err: &crate::relay::ApiError,
        origin: Option<&str>,
    ) {
        let now = self.clock.now();
        let bytes = response::encode(err.status, &[], &err.body(), &self.meta(origin, false));
        let Some(conn) = self.conn(id) else { return };
        if matches!(conn.phase, Phase::WebSocket(_) | Phase::Parked(..)) {
            return;
        }
        conn.out.push_owned(bytes);
        self.begin_closing(id, now);
    }

    /// Moves a connection to the closing stage: its queued output is
    /// written, then the write side shut, and the linger deadline bounds
    /// how long that may take.
    pub(super) fn begin_closing(&mut self, id: ConnId, now: Millis) {
        let Some(conn) = self.conn(id) else { return };
        conn.phase = Phase::Closing { shut: false };
        self.set_deadline(id, now.after(LINGER));
        self.mark_write(id);
    }

    /// Response headers for a request from `origin`.
    pub(super) fn meta<'a>(&'a self, origin: Option<&'a str>, keep_alive: bool) -> Meta<'a> {
        use crate::config::Origins;
        let (allow_origin, vary_origin) = match &self.cfg.cors_origins {
            Origins::Any => (Some("*"), false),
            Origins::List(_) => (origin.filter(|o| self.cfg.cors_origins.allows(o)), true),
        };
        Meta {
            keep_alive: keep_alive && self.shutdown_deadline.is_none(),
            http10: false,
            allow_origin,
            vary_origin,
            head_only: false,
        }
    }
}

/// The connection `id` names, checked by generation: a slot reused by a
/// newer connection is not it. A free function so callers can borrow other
/// fields of the server at the same time.
pub(super) fn lookup(conns: &mut Slab<Conn>, id: ConnId) -> Option<&mut Conn> {
    conns
        .get_mut(id.key as usize)
        .filter(|c| c.generation == id.generation)
}

/// Pending connections the kernel queues before `accept`. mio (like std)
/// uses 128, which drops SYNs when a few hundred clients connect at once and
/// costs each of them a one-second retry; the kernel caps this at
/// `net.core.somaxconn` (4096 on current Linux).
const LISTEN_BACKLOG: i32 = 4096;

/// Binds a non-blocking listener with `SO_REUSEADDR` and a deep backlog.
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// How often idle sessions are swept: a quarter of the TTL, between 100 ms
/// and a minute.
fn sweep_interval(cfg: &Config) -> Duration {
    (cfg.session_ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(60))
}
