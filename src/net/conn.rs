//! One connection: its socket, readiness flags, output queue, the deadline of
//! its one timer, and its stage as an enum whose transitions move the data.
//! Its socket is read only through [`read_once`].
//!
//! Invariants: a `Parked` connection has exactly one waiter entry in the
//! relay and its deadline is the poll's; a `WebSocket` connection is in its
//! session's subscriber list until it leaves that stage; `readable` and
//! `writable` are set by events and cleared only by `WouldBlock` (or a short
//! read, which proves the socket drained).

use std::net::IpAddr;
use std::rc::Rc;

use mio::Registry;
use mio::event::Event;

use super::buffer::{OutQueue, WriteStatus};
use super::read::{Got, read_once};
use super::stream::Stream;
use super::ws::{self, ReadOutcome, WsState};
use crate::http::parse::RequestReader;
use crate::http::{Method, RequestHead};
use crate::relay::{ConnId, Ticket};
use crate::store::SessionId;
use crate::time::Millis;

/// HTTP stage: the request reader and the times its deadlines count from.
#[derive(Debug)]
pub struct HttpState {
    pub reader: RequestReader,
    /// When the current, incomplete request became current: its first
    /// byte arrived, or the request before it was answered (pipelining).
    /// The request timeout counts from here, per request.
    pub request_started: Option<Millis>,
    /// When the connection last had nothing to do: accepted, or its last
    /// request answered. The idle timeout counts from here.
    pub idle_since: Millis,
    /// Requests answered: a connection that never sent a whole request is
    /// held only for the request timeout, not the keep-alive one.
    pub answered: u64,
}

impl HttpState {
    /// A fresh HTTP stage with a body cap, idle since `now`, boxed as
    /// the stages hold it. One copy of the code for its three callers.
    #[inline(never)]
    pub fn boxed(max_body: usize, now: Millis) -> Box<HttpState> {
        Box::new(HttpState::new(max_body, now))
    }

    /// A fresh HTTP stage with a body cap, idle since `now`.
    pub fn new(max_body: usize, now: Millis) -> HttpState {
        HttpState {
            reader: RequestReader::new(max_body),
            request_started: None,
            idle_since: now,
            answered: 0,
        }
    }

    /// A request was answered at `now`: the idle time counts from here.
    pub fn answered_at(&mut self, now: Millis) {
        self.idle_since = now;
        self.answered += 1;
    }
}

/// A parked `GET /prompts` or `GET /asks`: what is needed to answer it later.
#[derive(Debug)]
pub struct Parked {
    /// The session polled; `None`: every session the token opens.
    pub sid: Option<SessionId>,
    /// The request asked to keep the connection open.
    pub keep_alive: bool,
    pub http10: bool,
    /// The request's `Origin`, for the CORS headers of the answer.
    pub origin: Option<Rc<str>>,
    /// When it was parked, for the request log.
    pub since: Millis,
    /// A `GET /asks` waits on this ask; `None` for a `GET /prompts`.
    /// Boxed: parked prompt polls are the many, and each would carry room
    /// for an ask it does not have.
    pub ask: Option<Box<ParkedAsk>>,
}

/// What a parked `GET /asks` waits on.
#[derive(Debug)]
pub struct ParkedAsk {
    pub ask_id: Rc<str>,
    /// When the ask expires, on the loop's clock and on the wall clock.
    pub expires_at: Millis,
    pub expires_ts: u64,
}

/// A request waiting for the storage: what is needed to answer it then,
/// or to run it again.
#[derive(Debug)]
pub struct Committing {
    pub request: Held,
    pub since: Millis,
    /// The ticket its write's result comes back under: any other result
    /// is not this request's.
    pub ticket: Ticket,
}

/// What a request waiting for the storage keeps of itself. Its body is
/// not kept, so only a request that had none can run again.
#[derive(Debug)]
pub enum Held {
    /// Answered when the storage confirms it (a write), never run again.
    Answer(Box<RequestHead>),
    /// Run again once what it waited for is in the loop's copy.
    Rerun(Rerun),
}

/// A request that may run again: a `GET` without a body, whose head is the
/// whole of it. Made only by [`Held::new`], so a request with a body, or
/// one that writes, is never run a second time without what it sent.
#[derive(Debug)]
pub struct Rerun(Box<RequestHead>);

impl Rerun {
    /// The request, all of it.
    pub fn head(&self) -> &RequestHead {
        &self.0
    }
}

impl Held {
    /// What a request whose body was `body_len` bytes keeps while it waits.
    pub fn new(head: &RequestHead, body_len: usize) -> Held {
        let head = Box::new(head.clone());
        // `DELETE /agent/{sid}` changes no stored state, only the agent's
        // presence here, and waits for a read of the session like a GET:
        // it runs again as one does. Every other `DELETE` is a write,
        // answered by its reply and never run twice.
        let reads = match head.method() {
            Method::Get => true,
            Method::Delete => head.path.starts_with("/agent/"),
            _ => false,
        };
        if reads && body_len == 0 {
            Held::Rerun(Rerun(head))
        } else {
            Held::Answer(head)
        }
    }

    /// Its head, to answer it.
    pub fn head(&self) -> &RequestHead {
        match self {
            Held::Answer(head) | Held::Rerun(Rerun(head)) => head,
        }
    }
}

/// The connection's stage. The HTTP state is boxed, and moves from stage to
/// stage as the box: the slab entry is sized by its largest stage, and an
/// idle subscriber, which has no HTTP state, would carry room for one.
#[derive(Debug)]
pub enum Phase {
    /// Reading and answering requests.
    Http(Box<HttpState>),
    /// A long-poll waits; later requests stay buffered, unparsed. The
    /// HTTP state is dropped while it holds nothing (as a new one), and
    /// made again for bytes that arrive or when the poll is answered:
    /// parked polls are the many, and wait for minutes.
    Parked(Option<Box<HttpState>>, Parked),
    /// A request waits for the storage thread to commit it; later
    /// requests stay buffered, unparsed.
    Committing(Box<HttpState>, Committing),
    /// An upgraded subscriber.
    WebSocket(Box<WsState>),
    /// Flushing the last bytes; then the write side is shut and input is
    /// discarded until the peer closes or the linger deadline passes.
    Closing(Closing),
}

/// The closing stage's progress.
#[derive(Debug, Default)]
pub struct Closing {
    /// The write side is shut.
    pub shut: bool,
    /// Input discarded so far: a peer that keeps sending is cut off at
    /// [`LINGER_BYTES`] rather than read for the whole linger time.
    pub drained: usize,
}

/// Input a closing connection discards before it is simply closed.
pub const LINGER_BYTES: usize = 1 << 20;

/// A connection owned by the loop's slab. Its fields are its own: stages
/// and the loop go through the methods below, named for what they do.
pub struct Conn {
    generation: u32,
    /// The socket, or TLS over it.
    sock: Stream,
    peer: IpAddr,
    readable: bool,
    writable: bool,
    /// The peer shut its write side or reset (EPOLLRDHUP/ERR): reads go on
    /// to EOF, short reads prove nothing.
    read_closed: bool,
    /// A read returned EOF: no more requests will come, but the ones
    /// already buffered are still answered (a client may half-close and
    /// wait for its answers).
    eof: bool,
    /// Already on the pending-write list this turn.
    write_listed: bool,
    /// Reading stopped because unsent output passed the high-water mark; it
    /// resumes when the output drains.
    out_paused: bool,
    out: OutQueue,
    phase: Phase,
    /// When this stage's timer is due (request/idle, poll, ping, linger);
    /// [`NONE`] when it has none. A deadline of "never" is none: no wheel
    /// entry ever fires for it.
    deadline: Millis,
    /// The earliest wheel entry scheduled for this connection, or [`NONE`].
    timer_at: Millis,
}

/// No deadline, or no wheel entry: an `Option` would double the bytes of
/// both in every connection.
const NONE: Millis = Millis(u64::MAX);

/// What a wheel entry of a connection found when it fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fired {
    /// Replaced by an earlier entry, or the deadline was lifted: nothing.
    Stale,
    /// The deadline moved later since the entry was made: schedule this.
    Later(Millis),
    /// The deadline passed: the stage acts on it.
    Due,
}

impl Conn {
    /// A new HTTP connection, accepted at `now`.
    pub fn new(generation: u32, sock: Stream, peer: IpAddr, max_body: usize, now: Millis) -> Conn {
        Conn {
            generation,
            sock,
            peer,
            readable: false,
            writable: false,
            read_closed: false,
            eof: false,
            write_listed: false,
            out_paused: false,
            out: OutQueue::default(),
            phase: Phase::Http(HttpState::boxed(max_body, now)),
            deadline: NONE,
            timer_at: NONE,
        }
    }

    /// Its id when it sits in slab slot `key`.
    pub fn id(&self, key: usize) -> ConnId {
        ConnId {
            key: key as u32,
            generation: self.generation,
        }
    }

    /// Whether it is the connection `id` names: a slot reused by a newer
    /// connection is not.
    pub fn is(&self, id: ConnId) -> bool {
        self.generation == id.generation
    }

    /// The peer's address.
    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    /// Records a readiness event: the flags it sets are cleared only by
    /// `WouldBlock` (or a short read).
    pub fn on_event(&mut self, ev: &Event) {
        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
            self.readable = true;
        }
        if ev.is_read_closed() || ev.is_error() {
            self.read_closed = true;
        }
        if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
            self.writable = true;
        }
    }

    /// The stage, to see which one it is.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The HTTP stage's state, if it is in that stage.
    pub fn http(&mut self) -> Option<&mut HttpState> {
        match &mut self.phase {
            Phase::Http(h) => Some(h),
            _ => None,
        }
    }

    /// The request reader of a stage that holds one (HTTP, parked,
    /// committing).
    fn requests(&mut self) -> Option<&mut HttpState> {
        match &mut self.phase {
            Phase::Http(h) | Phase::Parked(Some(h), _) | Phase::Committing(h, _) => Some(h),
            _ => None,
        }
    }

    /// Bytes the request reader takes next (0: none, or no reader).
    pub fn want(&mut self) -> usize {
        if let Phase::Parked(None, _) = self.phase {
            return RequestReader::FIRST_WANT;
        }
        self.requests().map_or(0, |h| h.reader.want())
    }

    /// A subscriber's state and its output queue, if it is one.
    pub fn subscriber(&mut self) -> Option<(&mut WsState, &mut OutQueue)> {
        match &mut self.phase {
            Phase::WebSocket(ws) => Some((ws, &mut self.out)),
            _ => None,
        }
    }

    /// The output queue, for an answer or a frame.
    pub fn out(&mut self) -> &mut OutQueue {
        &mut self.out
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.out.queued()
    }

    /// The socket may have bytes to read (an edge was seen and no
    /// `WouldBlock` since).
    pub fn readable(&self) -> bool {
        self.readable
    }

    /// The peer shut its write side or reset.
    pub fn read_closed(&self) -> bool {
        self.read_closed
    }

    /// The peer's last byte was read.
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// No more input comes: what is buffered is answered, then the
    /// connection closes.
    pub fn mark_eof(&mut self) {
        self.eof = true;
        self.readable = false;
    }

    /// Reads once into the stage's request reader (HTTP, parked,
    /// committing), through `buf`; a parked poll without one gets a
    /// reader refusing bodies over `max_body`.
    pub fn read_requests(&mut self, buf: &mut [u8], max_body: usize) -> Got {
        let got = read_once(&mut self.sock, buf, &mut self.readable, self.read_closed);
        if let Got::Bytes(n) = got {
            if let Phase::Parked(h @ None, _) = &mut self.phase {
                // Its idle time is set when the poll is answered.
                *h = Some(HttpState::boxed(max_body, Millis(0)));
            }
            if let Some(h) = self.requests() {
                h.reader.push(&buf[..n]);
            }
        }
        got
    }

    /// After a failed read: the bytes of a plain HTTP request sent where a
    /// TLS handshake was expected, once (see [`Stream::plain_http`]); the
    /// socket then speaks in clear for the one answer.
    pub fn plain_http(&mut self) -> Option<Vec<u8>> {
        self.sock.plain_http()
    }

    /// Reads once into `buf` and throws it away, counting it against the
    /// closing stage's linger allowance.
    pub fn discard(&mut self, buf: &mut [u8]) -> Got {
        let got = read_once(&mut self.sock, buf, &mut self.readable, self.read_closed);
        if let (Got::Bytes(n), Phase::Closing(c)) = (got, &mut self.phase) {
            c.drained += n;
        }
        got
    }

    /// Reads a subscriber's client frames (see [`ws::read_frames`]); its
    /// outcome and the keep-alive deadline after it.
    pub fn read_frames(&mut self, now: Millis) -> Option<(ReadOutcome, Millis)> {
        let Phase::WebSocket(ws) = &mut self.phase else {
            return None;
        };
        let outcome = ws::read_frames(
            ws,
            &mut self.sock,
            &mut self.readable,
            self.read_closed,
            &mut self.out,
            now,
        );
        Some((outcome, ws.keepalive.deadline()))
    }

    /// Stops reading requests until the output drains.
    pub fn pause_reading(&mut self) {
        self.out_paused = true;
    }

    /// Reading waited for the output to drain.
    pub fn reading_paused(&self) -> bool {
        self.out_paused
    }

    /// The output drained: reading may go on.
    pub fn resume_reading(&mut self) {
        self.out_paused = false;
    }

    /// Parks the HTTP stage for a long-poll. An HTTP state that holds
    /// nothing and an output queue already written give back their room:
    /// the poll may wait for minutes.
    pub fn park(&mut self, parked: Parked) {
        self.phase = match std::mem::replace(&mut self.phase, Phase::Closing(Closing::default())) {
            Phase::Http(h) => Phase::Parked((!h.reader.is_empty()).then_some(h), parked),
            other => other,
        };
        self.out.release();
    }

    /// Holds the HTTP stage until the storage commits its request.
    pub fn await_commit(&mut self, waiting: Committing) {
        self.phase = match std::mem::replace(&mut self.phase, Phase::Closing(Closing::default())) {
            Phase::Http(h) => Phase::Committing(h, waiting),
            other => other,
        };
    }

    /// Back from a parked poll to reading requests (the poll answered at
    /// `now`; a new reader refuses bodies over `max_body`); what it was
    /// parked with.
    pub fn unpark(&mut self, now: Millis, max_body: usize) -> Option<Parked> {
        let phase = std::mem::replace(&mut self.phase, Phase::Closing(Closing::default()));
        let Phase::Parked(h, parked) = phase else {
            self.phase = phase;
            return None;
        };
        let mut h = h.unwrap_or_else(|| HttpState::boxed(max_body, now));
        h.answered_at(now);
        self.phase = Phase::Http(h);
        Some(parked)
    }

    /// Back to the HTTP stage if the connection waits under `ticket`; what
    /// it waited with.
    pub fn resume_commit(&mut self, ticket: Ticket) -> Option<Committing> {
        if !matches!(&self.phase, Phase::Committing(_, w) if w.ticket == ticket) {
            return None;
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Closing(Closing::default()));
        let Phase::Committing(mut h, waiting) = phase else {
            self.phase = phase;
            return None;
        };
        h.request_started = None;
        self.phase = Phase::Http(h);
        Some(waiting)
    }

    /// Moves the HTTP stage to the WebSocket stage in place: `make` gets
    /// the bytes that followed the request head. Frames may already be
    /// buffered behind the head, so the socket counts as readable.
    pub fn upgrade(&mut self, make: impl FnOnce(Vec<u8>) -> WsState) {
        let leftover = match std::mem::replace(&mut self.phase, Phase::Closing(Closing::default()))
        {
            Phase::Http(mut h) => h.reader.take_rest(),
            _ => Vec::new(),
        };
        self.phase = Phase::WebSocket(Box::new(make(leftover)));
        self.readable = true;
    }

    /// Enters the closing stage (see `closing::begin`).
    pub fn begin_closing(&mut self) {
        self.phase = Phase::Closing(Closing::default());
    }

    /// Shuts the write side of a closing connection, once: its output is
    /// written.
    pub fn shut_write(&mut self) {
        if let Phase::Closing(c) = &mut self.phase {
            c.shut = true;
            let _ = self.sock.shutdown_write();
        }
    }

    /// Output waits to be written: queued bytes or TLS records.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty() || self.sock.has_records()
    }

    /// The socket takes writes (an edge was seen and no `WouldBlock` since).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// Writes the queued output, then any TLS records, within `budget`;
    /// `WouldBlock` clears `writable`.
    pub fn write_out(&mut self, budget: usize) -> WriteStatus {
        // TLS records still queued count as output not yet written.
        let status = match self.out.write_to(&mut self.sock, budget) {
            WriteStatus::Drained => self.sock.flush_records(),
            other => other,
        };
        if status == WriteStatus::WouldBlock {
            self.writable = false;
        }
        status
    }

    /// After a stage ran: TLS input may be left that no edge will announce;
    /// if so the socket counts as readable and true is returned.
    pub fn take_unfinished(&mut self) -> bool {
        let more = self.sock.take_unfinished();
        if more {
            self.readable = true;
        }
        more
    }

    /// Ends the connection's socket: a TLS `close_notify` as far as it
    /// goes, then out of the poll.
    pub fn release(&mut self, registry: &Registry) {
        self.sock.notify_close();
        let _ = registry.deregister(self.sock.tcp());
    }

    /// Puts it on the pending-write list: false if it already is.
    pub fn list_write(&mut self) -> bool {
        !std::mem::replace(&mut self.write_listed, true)
    }

    /// Taken off the pending-write list, to be written.
    pub fn unlist_write(&mut self) {
        self.write_listed = false;
    }

    /// Sets the stage's deadline; true when the wheel needs an entry for
    /// it (it is earlier than the one scheduled: lazy re-arming).
    pub fn schedule(&mut self, deadline: Millis) -> bool {
        self.deadline = deadline;
        if deadline < self.timer_at {
            self.timer_at = deadline;
            return true;
        }
        false
    }

    /// A wheel entry for this connection at `at` fired at `now`.
    pub fn fire(&mut self, at: Millis, now: Millis) -> Fired {
        if self.timer_at != at || at == NONE {
            return Fired::Stale; // an earlier entry replaced it
        }
        self.timer_at = NONE;
        match self.deadline {
            NONE => Fired::Stale,
            deadline if deadline > now => {
                // Moved later since this entry was scheduled: re-arm.
                self.timer_at = deadline;
                Fired::Later(deadline)
            }
            _ => {
                self.deadline = NONE;
                Fired::Due
            }
        }
    }
}

/// What the loop does with a connection after a stage ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Next {
    /// Keep it.
    Stay,
    /// Drop it now (the peer is gone, or it is done).
    Close,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: Method) -> RequestHead {
        RequestHead {
            method: Some(method),
            path: "/messages/s".into(),
            ..RequestHead::default()
        }
    }

    #[test]
    fn the_slab_entry_stays_small() {
        // Every connection takes this much in the slab, idle subscribers
        // and parked polls included (docs/src/benchmarks.md, idle
        // connections): a stage that grows it should go in a box.
        let size = std::mem::size_of::<Conn>();
        assert!(size <= 200, "a connection is {size} bytes");
    }

    #[test]
    fn only_reads_without_a_body_are_kept_to_run_again() {
        assert!(matches!(Held::new(&head(Method::Get), 0), Held::Rerun(_)));
        assert!(matches!(Held::new(&head(Method::Get), 3), Held::Answer(_)));
        assert!(matches!(Held::new(&head(Method::Post), 0), Held::Answer(_)));
        assert!(matches!(
            Held::new(&head(Method::Delete), 0),
            Held::Answer(_)
        ));
        let stop = RequestHead {
            method: Some(Method::Delete),
            path: "/agent/s".into(),
            ..RequestHead::default()
        };
        assert!(matches!(Held::new(&stop, 0), Held::Rerun(_)));
    }
}
