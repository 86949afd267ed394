//! One connection: its socket, readiness flags, output queue, the deadline of
//! its one timer, and its stage as an enum whose transitions move the data.
//!
//! Invariants: a `Parked` connection has exactly one waiter entry in the
//! relay and its deadline is the poll's; a `WebSocket` connection is in its
//! session's subscriber list until it leaves that stage; `readable` and
//! `writable` are set by events and cleared only by `WouldBlock`.

use std::net::IpAddr;
use std::rc::Rc;

use mio::net::TcpStream;

use super::buffer::OutQueue;
use super::ws::WsState;
use crate::http::parse::RequestReader;
use crate::time::Millis;

/// HTTP stage: the request reader and when the current request began.
#[derive(Debug)]
pub struct HttpState {
    pub reader: RequestReader,
    /// When the first byte of the current, incomplete request arrived.
    pub request_started: Option<Millis>,
}

impl HttpState {
    /// A fresh HTTP stage with a body cap.
    pub fn new(max_body: usize) -> HttpState {
        HttpState {
            reader: RequestReader::new(max_body),
            request_started: None,
        }
    }
}

/// A parked `GET /prompts`: what is needed to answer it later.
#[derive(Debug)]
pub struct Parked {
    pub sid: Rc<str>,
    /// The request asked to keep the connection open.
    pub keep_alive: bool,
    pub http10: bool,
    /// The request's `Origin`, for the CORS headers of the answer.
    pub origin: Option<Rc<str>>,
}

/// The connection's stage.
#[derive(Debug)]
pub enum Phase {
    /// Reading and answering requests.
    Http(HttpState),
    /// A long-poll waits; later requests stay buffered, unparsed.
    Parked(HttpState, Parked),
    /// An upgraded subscriber.
    WebSocket(Box<WsState>),
    /// Flushing the last bytes; then the write side is shut and input is
    /// discarded until the peer closes or the linger deadline passes.
    Closing { shut: bool },
}

/// A connection owned by the loop's slab.
pub struct Conn {
    pub generation: u32,
    pub sock: TcpStream,
    pub peer: IpAddr,
    pub readable: bool,
    pub writable: bool,
    /// The peer shut its write side (EPOLLRDHUP): reads go on to EOF.
    pub read_closed: bool,
    /// A read returned EOF: no more requests will come, but the ones
    /// already buffered are still answered (a client may half-close and
    /// wait for its answers).
    pub eof: bool,
    /// Already on the pending-write list this turn.
    pub write_listed: bool,
    /// Request handling stopped because unsent output passed the high-water
    /// mark; it resumes when the output drains.
    pub out_paused: bool,
    pub out: OutQueue,
    pub phase: Phase,
    /// When this stage's timer is due (request/idle, poll, ping, linger).
    pub deadline: Option<Millis>,
    /// The earliest wheel entry scheduled for this connection.
    pub timer_at: Option<Millis>,
}

impl Conn {
    /// A new HTTP connection.
    pub fn new(generation: u32, sock: TcpStream, peer: IpAddr, max_body: usize) -> Conn {
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
            phase: Phase::Http(HttpState::new(max_body)),
            deadline: None,
            timer_at: None,
        }
    }
}
