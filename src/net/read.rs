//! One read from a socket, and how much a connection may read per turn.
//! Below the connection and the WebSocket codec, which both read through
//! [`read_once`]: the codec reads a subscriber's frames without knowing
//! the connection that holds it.

use std::io::{self, Read};

/// Bytes read from one connection per turn before others get their turn:
/// no client, however fast or hostile, holds the loop (and the timers)
/// for more than one slice (the Redis model).
pub const READ_BUDGET: usize = 64 * 1024;

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
