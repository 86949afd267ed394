//! One connection: its socket, readiness flags, output queue, the deadline of
//! its one timer, and its stage as an enum whose transitions move the data.
//! The one place the loop reads a socket is [`read_once`].
//!
//! Invariants: a `Parked` connection has exactly one waiter entry in the
//! relay and its deadline is the poll's; a `WebSocket` connection is in its
//! session's subscriber list until it leaves that stage; `readable` and
//! `writable` are set by events and cleared only by `WouldBlock` (or a short
//! read, which proves the socket drained).

use std::io::{self, Read};
use std::net::IpAddr;
use std::rc::Rc;

use super::buffer::OutQueue;
use super::stream::Stream;
use super::ws::WsState;
use crate::http::parse::RequestReader;
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
    /// A fresh HTTP stage with a body cap, idle since `now`.
    pub fn new(max_body: usize, now: Millis) -> HttpState {
        HttpState {
            reader: RequestReader::new(max_body),
            request_started: None,
            idle_since: now,
            answered: 0,
        }
    }
}

/// A parked `GET /prompts`: what is needed to answer it later.
#[derive(Debug)]
pub struct Parked {
    pub sid: SessionId,
    /// The request asked to keep the connection open.
    pub keep_alive: bool,
    pub http10: bool,
    /// The request's `Origin`, for the CORS headers of the answer.
    pub origin: Option<Rc<str>>,
    /// When it was parked, for the request log.
    pub since: Millis,
}

/// A request waiting for its commit: what is needed to answer it then, or
/// to run it again.
#[derive(Debug)]
pub struct Committing {
    pub head: Box<crate::http::RequestHead>,
    pub since: Millis,
    /// The ticket its write's result comes back under: any other result
    /// is not this request's.
    pub ticket: crate::relay::Ticket,
}

/// The connection's stage.
#[derive(Debug)]
pub enum Phase {
    /// Reading and answering requests.
    Http(HttpState),
    /// A long-poll waits; later requests stay buffered, unparsed.
    Parked(HttpState, Parked),
    /// A request waits for the storage thread to commit it; later
    /// requests stay buffered, unparsed.
    Committing(HttpState, Committing),
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

/// A connection owned by the loop's slab.
pub struct Conn {
    pub generation: u32,
    /// The socket, or TLS over it.
    pub sock: Stream,
    pub peer: IpAddr,
    pub readable: bool,
    pub writable: bool,
    /// The peer shut its write side or reset (EPOLLRDHUP/ERR): reads go on
    /// to EOF, short reads prove nothing.
    pub read_closed: bool,
    /// A read returned EOF: no more requests will come, but the ones
    /// already buffered are still answered (a client may half-close and
    /// wait for its answers).
    pub eof: bool,
    /// Already on the pending-write list this turn.
    pub write_listed: bool,
    /// Reading stopped because unsent output passed the high-water mark; it
    /// resumes when the output drains.
    pub out_paused: bool,
    pub out: OutQueue,
    pub phase: Phase,
    /// When this stage's timer is due (request/idle, poll, ping, linger).
    pub deadline: Option<Millis>,
    /// The earliest wheel entry scheduled for this connection.
    pub timer_at: Option<Millis>,
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
            phase: Phase::Http(HttpState::new(max_body, now)),
            deadline: None,
            timer_at: None,
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

/// What one read from a socket gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Got {
    /// This many bytes.
    Bytes(usize),
    /// Nothing now: the socket is drained (`readable` was cleared).
    Blocked,
    /// The peer closed its side.
    Eof,
    /// The connection failed (reset, or another error).
    Failed,
}

/// Reads once into `buf`, retrying `Interrupted`. `WouldBlock` clears
/// `readable`; so does a short read, which proves the socket drained (the
/// next arrival raises a new edge, so the read that would only say EAGAIN
/// is skipped, as nginx does), except after the peer's FIN, when no edge
/// follows and only EOF ends the stream.
pub fn read_once<S: Read>(
    sock: &mut S,
    buf: &mut [u8],
    readable: &mut bool,
    read_closed: bool,
) -> Got {
    loop {
        return match sock.read(buf) {
            Ok(0) if !buf.is_empty() => Got::Eof,
            Ok(n) => {
                if n < buf.len() && !read_closed {
                    *readable = false;
                }
                Got::Bytes(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                *readable = false;
                Got::Blocked
            }
            Err(_) => Got::Failed,
        };
    }
}
