//! A connection's byte stream: the TCP socket itself, or TLS over it. The
//! stages read and write through [`Stream`] and never know which it is.
//!
//! TLS is a layer with no socket of its own: rustls's unbuffered API
//! processes the records read from the socket, decrypting application data
//! in place, and encodes the records to send, while every buffer is this
//! module's: ciphertext read and not yet processed (a record cut by the
//! socket), plaintext not yet read by the stage, records not yet written.
//! Each is released when it empties, so an idle connection holds only
//! rustls's own state (its keys), not a read buffer of several KiB. Under
//! the loop's edge-triggered rules that layer keeps three promises:
//!
//! - A read returns fewer bytes than asked only when no plaintext is left
//!   and the socket said `WouldBlock` (or ended): the stages' "a short read
//!   proves the socket drained" then stays true, and plaintext left here
//!   keeps `readable` set, as bytes left in the kernel do.
//! - The ciphertext read per drive is bounded ([`TLS_READ_BUDGET`]); a read
//!   stopped by it, or an end of stream found behind plaintext, is reported
//!   by [`Stream::take_unfinished`], and the loop re-runs the connection
//!   (no edge will come for bytes already in the socket).
//! - Records produced (handshake flights, alerts, encrypted output) count
//!   as output: [`Stream::flush_records`] writes them, and the output queue
//!   is not "drained" while any is left.
//!
//! On the server side the first bytes are looked at before rustls gets
//! any ([`crate::http::plain`]): a plain HTTP request sent to the TLS port
//! fails the read, and from then on the stream is the socket in clear, so
//! the HTTP stage can answer it once (see [`Stream::plain_http`]).

use std::cell::RefCell;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;

use mio::net::TcpStream;
use rustls::client::UnbufferedClientConnection;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, EncryptError, InsufficientSizeError,
    UnbufferedStatus,
};

use super::buffer::WriteStatus;
use crate::http::plain::{self, FirstBytes};

/// Ciphertext read from one TLS connection per drive before others get
/// their turn: the plaintext budget plus what records add to it.
pub const TLS_READ_BUDGET: usize = 96 * 1024;

/// Records that may wait unwritten for one connection: a plaintext write is
/// encrypted at most this far ahead of the socket. Output above it waits
/// in the connection's own queue, which the stages already bound.
pub const TLS_WRITE_LIMIT: usize = 64 * 1024;

/// Ciphertext read from the socket at a time: one whole record and more.
const READ_CHUNK: usize = 18 * 1024;

/// Ciphertext held waiting for the rest of a record or handshake message:
/// a handshake message may take 64 KiB over several records; more than
/// this is no peer's honest need.
const MAX_INCOMING: usize = 100 * 1024;

/// Room for the record overhead of encrypting `n` bytes (headers, tags and
/// padding of each 16 KiB record); more is asked for if it falls short.
fn sealed_room(n: usize) -> usize {
    n + (n / (16 * 1024) + 1) * 64
}

thread_local! {
    /// The socket is read into this, and what a read brings is appended
    /// to a connection's own buffer only while a record is incomplete.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; READ_CHUNK]);
}

/// See the module doc.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<Tls>),
}

/// A TLS connection, server or client side (the Redis link).
pub enum Side {
    Server(UnbufferedServerConnection),
    Client(UnbufferedClientConnection),
}

impl From<UnbufferedServerConnection> for Side {
    fn from(c: UnbufferedServerConnection) -> Side {
        Side::Server(c)
    }
}

impl From<UnbufferedClientConnection> for Side {
    fn from(c: UnbufferedClientConnection) -> Side {
        Side::Client(c)
    }
}

/// TLS over a socket; see the module doc.
pub struct Tls {
    side: Side,
    sock: TcpStream,
    /// Ciphertext read and not yet processed.
    incoming: Vec<u8>,
    /// Plaintext decrypted and not yet read, from `plain_at` on.
    plain: Vec<u8>,
    plain_at: usize,
    /// Records to write, from `sent` on.
    out: Vec<u8>,
    sent: usize,
    /// Ciphertext read since the last [`Stream::take_unfinished`].
    raw_read: usize,
    /// Most ciphertext read between two [`Stream::take_unfinished`].
    budget: usize,
    /// A read stopped at the budget, the socket not known to be drained.
    budget_hit: bool,
    /// The end of the stream was found behind plaintext returned first.
    end_behind: bool,
    /// The stream ended: `close_notify` came, or TCP ended without it.
    ended: bool,
    /// `close_notify` was asked for.
    notified: bool,
    /// rustls failed (and its alert went out): nothing is processed again.
    failed: bool,
    /// Whether rustls has the bytes yet, or the peer spoke plain HTTP.
    start: Start,
}

/// How a server-side connection began (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// Too few bytes read to tell TLS from plain HTTP: rustls gets none
    /// yet. Bounded by the bytes [`plain::classify`] looks at, and in time
    /// by the handshake's deadline, like a handshake that stalls.
    Sniffing,
    /// TLS, or bytes rustls will refuse: rustls has them all.
    Tls,
    /// A plain HTTP request: reads and writes go to the socket in clear.
    Clear,
}

/// What to encrypt when the handshake is done: application data (as much
/// as `limit` allows), and `close_notify`.
struct Sealing<'a, 'b> {
    data: &'a [IoSlice<'b>],
    limit: usize,
    close: bool,
    /// Plaintext bytes encrypted.
    sealed: usize,
}

impl Sealing<'_, '_> {
    fn nothing() -> Sealing<'static, 'static> {
        Sealing {
            data: &[],
            limit: 0,
            close: false,
            sealed: 0,
        }
    }
}

/// What rustls needs next, after one state was handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Call it again.
    More,
    /// The records read are processed: more ciphertext is needed to go on
    /// (the handshake, or the next record).
    Input,
    /// Both sides sent `close_notify`.
    Closed,
}

/// Handles one state of the connection: decrypts application data into
/// `plain`, encodes records into `out`, encrypts what `sealing` holds once
/// the handshake is done. Returns the ciphertext to discard from the front
/// of the input, with what comes next (or rustls's error).
fn handle<Data>(
    status: UnbufferedStatus<'_, '_, Data>,
    plain: &mut Vec<u8>,
    out: &mut Vec<u8>,
    sent: usize,
    sealing: &mut Sealing,
    peer_closed: &mut bool,
) -> (usize, Result<Next, rustls::Error>) {
    let UnbufferedStatus { mut discard, state } = status;
    let state = match state {
        Ok(state) => state,
        Err(e) => return (discard, Err(e)),
    };
    let next = match state {
        ConnectionState::ReadTraffic(mut traffic) => {
            while let Some(record) = traffic.next_record() {
                match record {
                    Ok(r) => {
                        discard += r.discard;
                        plain.extend_from_slice(r.payload);
                    }
                    Err(e) => return (discard, Err(e)),
                }
            }
            Next::More
        }
        ConnectionState::EncodeTlsData(mut encode) => {
            encode_record(&mut encode, out);
            Next::More
        }
        // The records are in `out`, written before anything after them.
        ConnectionState::TransmitTlsData(transmit) => {
            transmit.done();
            Next::More
        }
        ConnectionState::BlockedHandshake => Next::Input,
        ConnectionState::PeerClosed => {
            *peer_closed = true;
            Next::More
        }
        ConnectionState::Closed => Next::Closed,
        ConnectionState::WriteTraffic(mut traffic) => {
            let room = |out: &Vec<u8>| sealing.limit.saturating_sub(out.len() - sent);
            for buf in sealing.data {
                let free = room(out);
                if free == 0 {
                    break;
                }
                let part = &buf[..buf.len().min(free)];
                if part.is_empty() {
                    continue;
                }
                if let Err(e) = seal(out, part.len(), |dst| traffic.encrypt(part, dst)) {
                    return (discard, Err(e));
                }
                sealing.sealed += part.len();
                if part.len() < buf.len() {
                    break;
                }
            }
            sealing.data = &[];
            if std::mem::take(&mut sealing.close)
                && let Err(e) = seal(out, 0, |dst| traffic.queue_close_notify(dst))
            {
                return (discard, Err(e));
            }
            Next::Input
        }
        // Early data (0-RTT), which the server's configuration never
        // accepts, and states of later rustls versions.
        _ => {
            return (
                discard,
                Err(rustls::Error::General("unexpected TLS state".into())),
            );
        }
    };
    (discard, Ok(next))
}

/// A record rustls queued (an alert after an error), appended to `out`;
/// false when it queued none.
fn take_queued<Data>(status: UnbufferedStatus<'_, '_, Data>, out: &mut Vec<u8>) -> bool {
    match status.state {
        Ok(ConnectionState::EncodeTlsData(mut encode)) => encode_record(&mut encode, out),
        _ => false,
    }
}

/// Appends the record rustls has to send (a handshake message, an alert)
/// to `out`; false if there was none.
fn encode_record<Data>(encode: &mut EncodeTlsData<'_, Data>, out: &mut Vec<u8>) -> bool {
    let at = out.len();
    let mut room = 512;
    loop {
        out.resize(at + room, 0);
        match encode.encode(&mut out[at..]) {
            Ok(n) => {
                out.truncate(at + n);
                return true;
            }
            Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size }))
                if required_size > room =>
            {
                room = required_size;
            }
            Err(_) => {
                out.truncate(at);
                return false;
            }
        }
    }
}

/// Appends what `write` encrypts to `out`, with room for `n` plaintext
/// bytes (more if rustls asks for it).
fn seal(
    out: &mut Vec<u8>,
    n: usize,
    mut write: impl FnMut(&mut [u8]) -> Result<usize, EncryptError>,
) -> Result<(), rustls::Error> {
    let at = out.len();
    let mut room = sealed_room(n);
    loop {
        out.resize(at + room, 0);
        match write(&mut out[at..]) {
            Ok(k) => {
                out.truncate(at + k);
                return Ok(());
            }
            Err(EncryptError::InsufficientSize(InsufficientSizeError { required_size }))
                if required_size > room =>
            {
                room = required_size;
            }
            Err(e) => {
                out.truncate(at);
                return Err(rustls::Error::General(e.to_string()));
            }
        }
    }
}

impl Stream {
    /// TLS over `sock` with a fresh rustls connection (server or client
    /// side) that may read at most `budget` ciphertext bytes per drive.
    pub fn tls(sock: TcpStream, side: Side, budget: usize) -> Stream {
        let start = match side {
            Side::Server(_) => Start::Sniffing,
            Side::Client(_) => Start::Tls,
        };
        Stream::Tls(Box::new(Tls {
            side,
            sock,
            incoming: Vec::new(),
            plain: Vec::new(),
            plain_at: 0,
            out: Vec::new(),
            sent: 0,
            raw_read: 0,
            budget,
            budget_hit: false,
            end_behind: false,
            ended: false,
            notified: false,
            failed: false,
            start,
        }))
    }

    /// After a read failed: when it failed because the peer sent a plain
    /// HTTP request instead of a TLS handshake, the bytes it had sent (to
    /// find its `Host` in), once. From then on reads and writes go to the
    /// socket in clear, so the answer saying to use `https://` is readable
    /// and the closing stage can drain what follows it.
    pub fn plain_http(&mut self) -> Option<Vec<u8>> {
        match self {
            Stream::Tls(t) if t.start == Start::Clear => Some(std::mem::take(&mut t.incoming)),
            _ => None,
        }
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
            Stream::Tls(t) => t.out.len() > t.sent,
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
            && t.start != Start::Clear
        {
            t.notified = true;
            let mut sealing = Sealing {
                close: true,
                ..Sealing::nothing()
            };
            if t.process(&mut sealing).is_ok() {
                let _ = t.push_records();
            }
        }
    }
}

impl Tls {
    /// Runs rustls over the ciphertext read until it needs more (or the
    /// connection closed), handling every state on the way (see
    /// [`handle`]). A TLS error is answered with rustls's alert, as far as
    /// the socket takes it, and is an `InvalidData` error.
    fn process(&mut self, sealing: &mut Sealing) -> io::Result<Next> {
        if self.failed {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "TLS failed"));
        }
        let mut peer_closed = false;
        let result = loop {
            let (discard, next) = match &mut self.side {
                Side::Server(c) => handle(
                    c.process_tls_records(&mut self.incoming),
                    &mut self.plain,
                    &mut self.out,
                    self.sent,
                    sealing,
                    &mut peer_closed,
                ),
                Side::Client(c) => handle(
                    c.process_tls_records(&mut self.incoming),
                    &mut self.plain,
                    &mut self.out,
                    self.sent,
                    sealing,
                    &mut peer_closed,
                ),
            };
            self.incoming.drain(..discard.min(self.incoming.len()));
            match next {
                Ok(Next::More) => continue,
                other => break other,
            }
        };
        if peer_closed {
            self.ended = true;
        }
        if self.incoming.is_empty() {
            // Nothing waits for the rest of a record: no buffer is kept.
            self.incoming = Vec::new();
        }
        match result {
            Ok(next) => Ok(next),
            Err(e) => {
                self.failed = true;
                self.incoming = Vec::new();
                self.encode_alert();
                let _ = self.push_records();
                Err(io::Error::new(io::ErrorKind::InvalidData, e))
            }
        }
    }

    /// After an error, the alert rustls queued for the peer, encoded. Only
    /// what it queued: the input that failed is never processed again.
    fn encode_alert(&mut self) {
        for _ in 0..4 {
            let encoded = match &mut self.side {
                Side::Server(c) => take_queued(c.process_tls_records(&mut []), &mut self.out),
                Side::Client(c) => take_queued(c.process_tls_records(&mut []), &mut self.out),
            };
            if !encoded {
                break;
            }
        }
    }

    /// Writes queued records until none is left or the socket blocks; the
    /// buffer goes once it is written.
    fn push_records(&mut self) -> io::Result<()> {
        while self.sent < self.out.len() {
            match self.sock.write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => self.sent += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out = Vec::new();
        self.sent = 0;
        Ok(())
    }

    /// [`push_records`](Self::push_records), a full socket being no error:
    /// the records wait for the writable edge.
    fn push_records_now(&mut self) -> io::Result<()> {
        match self.push_records() {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(()),
        }
    }

    /// Moves decrypted plaintext into `buf`; the buffer goes once it is read.
    fn take_plain(&mut self, buf: &mut [u8]) -> usize {
        let left = &self.plain[self.plain_at..];
        let n = left.len().min(buf.len());
        buf[..n].copy_from_slice(&left[..n]);
        self.plain_at += n;
        if self.plain_at == self.plain.len() {
            self.plain = Vec::new();
            self.plain_at = 0;
        }
        n
    }

    /// Reads ciphertext from the socket and appends it to the input.
    fn read_tls(&mut self) -> io::Result<usize> {
        if self.incoming.len() >= MAX_INCOMING {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS record or handshake message too large",
            ));
        }
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let k = self.sock.read(&mut scratch[..])?;
            self.incoming.extend_from_slice(&scratch[..k]);
            Ok(k)
        })
    }

    /// Plaintext into `buf`, reading and decrypting records as needed; see
    /// the module doc for when it returns short.
    fn read_plain(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        loop {
            n += self.take_plain(&mut buf[n..]);
            if n == buf.len() {
                return Ok(n);
            }
            if self.ended {
                // `close_notify` received, or TCP ended without it: an end
                // of stream like any other (every answer is framed on its
                // own). Returned on its own after the plaintext before it.
                self.end_behind = n > 0;
                return Ok(n);
            }
            if self.start == Start::Sniffing {
                self.sniff()?;
            }
            if self.start == Start::Tls {
                // Records already read first; handshake flights and
                // key-update answers go out at once (a full socket keeps
                // them queued for the writable edge).
                let next = self.process(&mut Sealing::nothing())?;
                self.push_records_now()?;
                if self.plain_at < self.plain.len() {
                    continue;
                }
                if next == Next::Closed {
                    self.ended = true;
                    continue;
                }
                if self.ended {
                    continue;
                }
            }
            if self.raw_read >= self.budget {
                self.budget_hit = true;
                return if n > 0 {
                    Ok(n)
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                };
            }
            match self.read_tls() {
                Ok(0) => self.ended = true,
                Ok(k) => self.raw_read = self.raw_read.saturating_add(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && n > 0 => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Decides from the first bytes read whether rustls gets them (see
    /// [`Start`]); a plain HTTP request is an `InvalidData` error, and
    /// [`Stream::plain_http`] tells it from others.
    fn sniff(&mut self) -> io::Result<()> {
        match plain::classify(&self.incoming) {
            FirstBytes::NeedMore => Ok(()),
            FirstBytes::Other => {
                self.start = Start::Tls;
                Ok(())
            }
            FirstBytes::PlainHttp => {
                self.start = Start::Clear;
                Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "plain HTTP on a TLS port",
                ))
            }
        }
    }

    /// Encrypts what fits under [`TLS_WRITE_LIMIT`] once the records
    /// before it are written, and writes what the socket takes.
    fn write_plain(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.push_records()?;
        let mut sealing = Sealing {
            data: bufs,
            limit: TLS_WRITE_LIMIT,
            close: false,
            sealed: 0,
        };
        self.process(&mut sealing)?;
        self.push_records_now()?;
        if sealing.sealed == 0 && bufs.iter().any(|b| !b.is_empty()) {
            // Before the handshake ends nothing is encrypted: wait for it.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(sealing.sealed)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(_) if buf.is_empty() => Ok(0),
            Stream::Tls(t) if t.start == Start::Clear => t.sock.read(buf),
            Stream::Tls(t) => t.read_plain(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) if t.start == Start::Clear => t.sock.write(buf),
            Stream::Tls(t) => t.write_plain(&[IoSlice::new(buf)]),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write_vectored(bufs),
            Stream::Tls(t) if t.start == Start::Clear => t.sock.write_vectored(bufs),
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
