//! A connection's byte stream: the TCP socket itself, or TLS over it. The
//! stages read and write through [`Stream`] and never know which it is.
//!
//! TLS is a layer with no socket of its own: rustls takes the bytes read
//! from the socket (`read_tls`), hands back plaintext (`reader`), and queues
//! the records to send (`write_tls`). Under the loop's edge-triggered rules
//! that layer keeps three promises:
//!
//! - A read returns fewer bytes than asked only when rustls holds no more
//!   plaintext and the socket said `WouldBlock` (or ended): the stages'
//!   "a short read proves the socket drained" then stays true, and plaintext
//!   left inside rustls keeps `readable` set, as bytes left in the kernel do.
//! - The ciphertext read per drive is bounded ([`TLS_READ_BUDGET`]); a read
//!   stopped by it, or an end of stream found behind plaintext, is reported
//!   by [`Stream::take_unfinished`], and the loop re-runs the connection
//!   (no edge will come for bytes already in the socket).
//! - Records rustls produced (handshake flights, alerts, encrypted output)
//!   count as output: [`Stream::flush_records`] writes them, and the output
//!   queue is not "drained" while any is left.

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;

use mio::net::TcpStream;
use rustls::Connection;

use super::buffer::WriteStatus;

/// Ciphertext read from one TLS connection per drive before others get
/// their turn: the plaintext budget plus what records add to it.
pub const TLS_READ_BUDGET: usize = 96 * 1024;

/// Records rustls may hold for one connection: a plaintext write is
/// encrypted at most this far ahead of the socket. Output above it waits
/// in the connection's own queue, which the stages already bound.
pub const TLS_WRITE_LIMIT: usize = 64 * 1024;

/// See the module doc.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<Tls>),
}

/// TLS over a socket; see the module doc.
pub struct Tls {
    tls: Connection,
    sock: TcpStream,
    /// Ciphertext read since the last [`Stream::take_unfinished`].
    raw_read: usize,
    /// Most ciphertext read between two [`Stream::take_unfinished`].
    budget: usize,
    /// A read stopped at the budget, the socket not known to be drained.
    budget_hit: bool,
    /// The end of the stream was found behind plaintext returned first.
    end_behind: bool,
    /// `close_notify` was queued.
    notified: bool,
}

impl Stream {
    /// TLS over `sock` with a fresh rustls connection (server or client
    /// side) that may read at most `budget` ciphertext bytes per drive.
    pub fn tls(sock: TcpStream, mut tls: Connection, budget: usize) -> Stream {
        tls.set_buffer_limit(Some(TLS_WRITE_LIMIT));
        Stream::Tls(Box::new(Tls {
            tls,
            sock,
            raw_read: 0,
            budget,
            budget_hit: false,
            end_behind: false,
            notified: false,
        }))
    }

    /// The socket, for registering and deregistering with the poll.
    pub fn tcp(&mut self) -> &mut TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &mut t.sock,
        }
    }

    /// Whether TLS records wait to be written (a handshake flight, an
    /// alert, encrypted output the socket did not take yet).
    pub fn has_records(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(t) => t.tls.wants_write(),
        }
    }

    /// Writes the TLS records that wait: `Drained` when none is left.
    pub fn flush_records(&mut self) -> WriteStatus {
        match self {
            Stream::Plain(_) => WriteStatus::Drained,
            Stream::Tls(t) => match t.push_records() {
                Ok(()) => WriteStatus::Drained,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => WriteStatus::WouldBlock,
                Err(_) => WriteStatus::Failed,
            },
        }
    }

    /// Called by the loop after each stage run: whether a read stopped with
    /// input possibly left (the ciphertext budget, or an end of stream not
    /// yet returned), so the connection must run again without waiting
    /// for an edge. Starts the next drive's budget.
    pub fn take_unfinished(&mut self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(t) => {
                t.raw_read = 0;
                let more = t.budget_hit || t.end_behind;
                t.budget_hit = false;
                t.end_behind = false;
                more
            }
        }
    }

    /// Shuts the write side; over TLS a `close_notify` goes first (see
    /// [`Stream::notify_close`]).
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        self.notify_close();
        self.tcp().shutdown(Shutdown::Write)
    }

    /// Over TLS, sends `close_notify` once, as far as the socket takes it
    /// now: a connection the server ends (idle, timed out, done) then ends
    /// cleanly for the peer's TLS library instead of looking truncated. The
    /// answers before it are complete on their own, so a peer that misses
    /// it loses nothing. Called before the shutdown and before a close.
    pub fn notify_close(&mut self) {
        if let Stream::Tls(t) = self
            && !t.notified
        {
            t.notified = true;
            t.tls.send_close_notify();
            let _ = t.push_records();
        }
    }
}

impl Tls {
    /// Writes queued records until none is left or the socket blocks.
    fn push_records(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Plaintext into `buf`, reading and decrypting records as needed; see
    /// the module doc for when it returns short.
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        loop {
            match self.tls.reader().read(&mut buf[n..]) {
                // `close_notify` received, or `buf` is full.
                Ok(0) => {
                    self.end_behind = n > 0 && n < buf.len();
                    return Ok(n);
                }
                Ok(k) => {
                    n += k;
                    if n == buf.len() {
                        return Ok(n);
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The peer closed TCP without `close_notify`: an end of
                // stream like any other (every answer is framed on its own).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    self.end_behind = n > 0;
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
            if self.raw_read >= self.budget {
                self.budget_hit = true;
                return if n > 0 {
                    Ok(n)
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                };
            }
            match self.tls.read_tls(&mut self.sock) {
                // End of stream: the reader says how (clean or not) above.
                Ok(0) => {}
                Ok(k) => self.raw_read = self.raw_read.saturating_add(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && n > 0 => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if let Err(e) = self.tls.process_new_packets() {
                // The alert rustls queued for the peer, if the socket takes it.
                let _ = self.push_records();
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
            // Handshake flights and key-update answers go out at once; a
            // full socket keeps them queued for the writable edge.
            match self.push_records() {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Encrypts what fits under [`TLS_WRITE_LIMIT`] once the records
    /// before it are written, and writes what the socket takes.
    fn write_plain(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.push_records()?;
        let n = self.tls.writer().write_vectored(bufs)?;
        match self.push_records() {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
            // Before the handshake ends rustls holds plaintext back, up to
            // its limit: wait for the handshake.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(_) if buf.is_empty() => Ok(0),
            Stream::Tls(t) => t.read_plain(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write_plain(&[IoSlice::new(buf)]),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write_vectored(bufs),
            Stream::Tls(t) => t.write_plain(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(t) => t.push_records(),
        }
    }
}
