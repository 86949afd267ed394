//! Client plumbing for the load generator: a non-blocking TCP connection with
//! an input buffer and an output queue, driven edge-triggered by one mio
//! `Poll`; a minimal HTTP/1.1 response parser (httparse for the head,
//! `Content-Length` or chunked bodies); and a minimal WebSocket client (the
//! handshake by hand, masked client frames, unmasked server frames).
//! With `--ca` every connection speaks TLS (rustls, the client settings in
//! [`TLS`]) under the same plaintext interface.
//!
//! Invariant: a connection is registered once for `READABLE | WRITABLE`;
//! readiness is drained to `WouldBlock` on every event, so no edge is lost.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rustls::{ClientConfig, ClientConnection};
use rustls_pki_types::ServerName;

/// The TLS client settings every connection uses, when set (`--ca`).
pub static TLS: OnceLock<Arc<ClientConfig>> = OnceLock::new();

/// Bytes read per `read` call, into the shared scratch buffer.
const SCRATCH_BYTES: usize = 64 * 1024;

/// One client connection.
pub struct Conn {
    sock: TcpStream,
    /// TLS over `sock`: plaintext goes in and out through it.
    tls: Option<Box<ClientConnection>>,
    /// Received bytes not yet consumed by the caller.
    pub inbuf: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    /// The TCP handshake finished.
    pub connected: bool,
    /// Why the connection ended (peer close or an I/O error); `None` while open.
    pub closed: Option<String>,
}

impl Conn {
    /// Queues bytes and writes as much as the socket takes now.
    pub fn send(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        if self.connected {
            self.flush();
        }
    }

    /// Drops `n` consumed bytes from the front of the input buffer.
    pub fn consume(&mut self, n: usize) {
        if n >= self.inbuf.len() {
            self.inbuf.clear();
        } else {
            self.inbuf.drain(..n);
        }
    }

    /// The negotiated TLS version and cipher suite, once known.
    pub fn tls_suite(&self) -> Option<String> {
        let tls = self.tls.as_ref()?;
        Some(format!(
            "{:?}/{:?}",
            tls.protocol_version()?,
            tls.negotiated_cipher_suite()?.suite()
        ))
    }

    fn flush(&mut self) {
        if self.tls.is_some() {
            return self.flush_tls();
        }
        while self.closed.is_none() && self.out_pos < self.out.len() {
            match self.sock.write(&self.out[self.out_pos..]) {
                Ok(0) => self.closed = Some("write returned 0".into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.closed = Some(format!("write: {e}")),
            }
        }
        self.out.clear();
        self.out_pos = 0;
    }

    /// Hands the queued plaintext to rustls (its buffer has no limit here)
    /// and writes records until none is left or the socket blocks.
    fn flush_tls(&mut self) {
        let Some(tls) = self.tls.as_mut() else { return };
        if self.out_pos < self.out.len() {
            let _ = tls.writer().write_all(&self.out[self.out_pos..]);
            self.out.clear();
            self.out_pos = 0;
        }
        while self.closed.is_none() && tls.wants_write() {
            match tls.write_tls(&mut self.sock) {
                Ok(0) => self.closed = Some("write returned 0".into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.closed = Some(format!("write: {e}")),
            }
        }
    }

    /// Reads records until the socket blocks, decrypting into `inbuf`;
    /// then writes what the handshake needs sent.
    fn fill_tls(&mut self, scratch: &mut [u8]) {
        let Some(tls) = self.tls.as_mut() else { return };
        while self.closed.is_none() {
            let eof = match tls.read_tls(&mut self.sock) {
                Ok(n) => n == 0,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.closed = Some(format!("read: {e}"));
                    break;
                }
            };
            if let Err(e) = tls.process_new_packets() {
                self.closed = Some(format!("TLS: {e}"));
                break;
            }
            loop {
                match tls.reader().read(scratch) {
                    Ok(0) => {
                        self.closed = Some("closed by peer (close_notify)".into());
                        break;
                    }
                    Ok(n) => self.inbuf.extend_from_slice(&scratch[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        self.closed = Some("closed by peer".into());
                        break;
                    }
                }
            }
            if eof && self.closed.is_none() {
                self.closed = Some("closed by peer".into());
            }
        }
        self.flush_tls();
    }

    fn fill(&mut self, scratch: &mut [u8]) {
        if self.tls.is_some() {
            return self.fill_tls(scratch);
        }
        while self.closed.is_none() {
            match self.sock.read(scratch) {
                Ok(0) => self.closed = Some("closed by peer".into()),
                Ok(n) => self.inbuf.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => self.closed = Some(format!("read: {e}")),
            }
        }
    }

    /// After a readiness event on a connecting socket: did the handshake finish?
    fn check_connected(&mut self) {
        match self.sock.take_error() {
            Ok(Some(e)) | Err(e) => {
                self.closed = Some(format!("connect: {e}"));
                return;
            }
            Ok(None) => {}
        }
        if self.sock.peer_addr().is_ok() {
            self.connected = true;
            let _ = self.sock.set_nodelay(true);
        }
    }
}

/// The poll, its connections (token = index) and the shared read buffer.
pub struct Net {
    poll: Poll,
    events: Events,
    pub conns: Vec<Conn>,
    scratch: Vec<u8>,
    pub addr: SocketAddr,
}

impl Net {
    /// A poll with no connections yet, for a server at `addr`.
    pub fn new(addr: SocketAddr) -> io::Result<Net> {
        Ok(Net {
            poll: Poll::new()?,
            events: Events::with_capacity(4096),
            conns: Vec::new(),
            scratch: vec![0; SCRATCH_BYTES],
            addr,
        })
    }

    /// Starts a connection; returns its index. Bytes sent before the handshake
    /// finishes are queued.
    pub fn open(&mut self) -> io::Result<usize> {
        self.open_to(self.addr)
    }

    /// [`open`](Self::open) to another server (a second instance).
    pub fn open_to(&mut self, addr: SocketAddr) -> io::Result<usize> {
        let index = self.conns.len();
        let conn = self.connect(addr, index)?;
        self.conns.push(conn);
        Ok(index)
    }

    /// Closes the connection at `index` and opens a new one in its place
    /// (the handshake figure's next connection).
    pub fn reopen(&mut self, index: usize) -> io::Result<()> {
        let _ = self.poll.registry().deregister(&mut self.conns[index].sock);
        self.conns[index] = self.connect(self.addr, index)?;
        Ok(())
    }

    fn connect(&mut self, addr: SocketAddr, index: usize) -> io::Result<Conn> {
        let mut sock = TcpStream::connect(addr)?;
        self.poll.registry().register(
            &mut sock,
            Token(index),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let tls = match TLS.get() {
            Some(config) => {
                let name = ServerName::from(addr.ip());
                let mut tls = ClientConnection::new(config.clone(), name)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                tls.set_buffer_limit(None);
                Some(Box::new(tls))
            }
            None => None,
        };
        Ok(Conn {
            sock,
            tls,
            inbuf: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            connected: false,
            closed: None,
        })
    }

    /// Closes every connection (drops the sockets).
    pub fn close_all(&mut self) {
        for conn in &mut self.conns {
            let _ = self.poll.registry().deregister(&mut conn.sock);
        }
        self.conns.clear();
    }

    /// Waits for events up to `timeout`, does the I/O they allow, and lists the
    /// indexes of connections that may have new input or a new state in `ready`.
    pub fn wait(&mut self, timeout: Duration, ready: &mut Vec<usize>) -> io::Result<()> {
        ready.clear();
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        for event in self.events.iter() {
            let index = event.token().0;
            let Some(conn) = self.conns.get_mut(index) else {
                continue;
            };
            if conn.closed.is_some() {
                continue;
            }
            if !conn.connected {
                conn.check_connected();
                if !conn.connected && conn.closed.is_none() {
                    continue;
                }
            }
            conn.flush();
            conn.fill(&mut self.scratch);
            ready.push(index);
        }
        Ok(())
    }
}

/// A complete HTTP response.
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
}

/// Parses one response from the front of `buf`: `Ok(None)` while incomplete,
/// else the response and the bytes it took.
pub fn parse_response(buf: &[u8]) -> Result<Option<(Response, usize)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Response::new(&mut headers);
    let head_len = match head.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}")),
    };
    let status = head.code.unwrap_or(0);
    let mut response = Response {
        status,
        body: Vec::new(),
        etag: None,
        last_modified: None,
    };
    let mut content_length = None;
    let mut chunked = false;
    for h in head.headers.iter() {
        let value = String::from_utf8_lossy(h.value);
        if h.name.eq_ignore_ascii_case("content-length") {
            content_length = value.trim().parse::<usize>().ok();
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if h.name.eq_ignore_ascii_case("etag") {
            response.etag = Some(value.into_owned());
        } else if h.name.eq_ignore_ascii_case("last-modified") {
            response.last_modified = Some(value.into_owned());
        }
    }
    if status < 200 || status == 204 || status == 304 {
        return Ok(Some((response, head_len)));
    }
    if chunked {
        return Ok(parse_chunked(&buf[head_len..])?.map(|(body, n)| {
            response.body = body;
            (response, head_len + n)
        }));
    }
    let len = content_length.ok_or("response without Content-Length")?;
    if buf.len() < head_len + len {
        return Ok(None);
    }
    response.body = buf[head_len..head_len + len].to_vec();
    Ok(Some((response, head_len + len)))
}

fn parse_chunked(mut buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, String> {
    let mut body = Vec::new();
    let mut used = 0;
    loop {
        let (start, size) = match httparse::parse_chunk_size(buf) {
            Ok(httparse::Status::Complete(v)) => v,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err("bad chunk size".into()),
        };
        let size = usize::try_from(size).map_err(|_| "chunk too large")?;
        // chunk data, then CRLF (for the last chunk: no trailers, just CRLF)
        if buf.len() < start + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[start..start + size]);
        used += start + size + 2;
        buf = &buf[start + size + 2..];
        if size == 0 {
            return Ok(Some((body, used)));
        }
    }
}

/// The handshake request of a WebSocket client.
pub fn ws_handshake(host: &str, path: &str) -> Vec<u8> {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .into_bytes()
}

pub const OP_TEXT: u8 = 1;
pub const OP_CLOSE: u8 = 8;
pub const OP_PING: u8 = 9;
pub const OP_PONG: u8 = 10;

/// One server frame: its opcode and where its payload lies in the buffer.
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    pub payload: Range<usize>,
}

/// Parses one unmasked server frame from the front of `buf`: `Ok(None)` while
/// incomplete, else the frame and the bytes it took.
pub fn parse_frame(buf: &[u8]) -> Result<Option<(Frame, usize)>, String> {
    if buf.len() < 2 {
        return Ok(None);
    }
    if buf[1] & 0x80 != 0 {
        return Err("masked server frame".into());
    }
    let (len, start) = match buf[1] & 0x7f {
        126 if buf.len() < 4 => return Ok(None),
        126 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
        127 if buf.len() < 10 => return Ok(None),
        127 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            (
                usize::try_from(u64::from_be_bytes(b)).map_err(|_| "frame too large")?,
                10,
            )
        }
        n => (n as usize, 2),
    };
    if buf.len() < start + len {
        return Ok(None);
    }
    let frame = Frame {
        fin: buf[0] & 0x80 != 0,
        opcode: buf[0] & 0x0f,
        payload: start..start + len,
    };
    Ok(Some((frame, start + len)))
}

/// Appends a masked client frame (FIN set) to `out`.
pub fn encode_client_frame(opcode: u8, payload: &[u8], mask: [u8; 4], out: &mut Vec<u8>) {
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xffff => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

/// What a WebSocket client does with one server frame it does not consume itself.
pub enum WsEvent {
    /// A complete text message; its payload range in `inbuf`.
    Text(Range<usize>),
    /// The server closed (close frame); its code if any.
    Close(u16),
    /// Handled here (ping answered, pong ignored).
    Control,
}

/// Answers pings and classifies one frame. Fragmented messages are not used by
/// either server under test; one is reported as an error.
pub fn ws_event(conn: &mut Conn, frame: &Frame) -> Result<WsEvent, String> {
    if !frame.fin {
        return Err("fragmented frame".into());
    }
    match frame.opcode {
        OP_TEXT => Ok(WsEvent::Text(frame.payload.clone())),
        OP_PING => {
            let payload = conn.inbuf[frame.payload.clone()].to_vec();
            let mut out = Vec::with_capacity(payload.len() + 6);
            encode_client_frame(OP_PONG, &payload, [0x5a, 0x13, 0xc7, 0x2e], &mut out);
            conn.send(&out);
            Ok(WsEvent::Control)
        }
        OP_PONG => Ok(WsEvent::Control),
        OP_CLOSE => {
            let p = &conn.inbuf[frame.payload.clone()];
            Ok(WsEvent::Close(if p.len() >= 2 {
                u16::from_be_bytes([p[0], p[1]])
            } else {
                1005
            }))
        }
        op => Err(format!("unexpected opcode {op}")),
    }
}

/// The value of `"key":"…"` in a JSON text, found by substring (no escapes
/// in the values this generator uses).
pub fn json_str<'a>(text: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let pat = format!("\"{key}\":\"");
    let start = find(text, pat.as_bytes())? + pat.len();
    let len = text[start..].iter().position(|&b| b == b'"')?;
    Some(&text[start..start + len])
}

/// The first position of `needle` in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The client settings of `--ca FILE`: trust the certificates in FILE
/// only, offer TLS 1.3 with AES-128-GCM alone (so every server under test
/// negotiates the same suite, whatever its own order), and never resume a
/// session, so every connection is a full handshake.
pub fn tls_config(ca: &std::path::Path) -> Result<Arc<ClientConfig>, String> {
    use rustls::crypto::ring;
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
    let (added, _) = roots.add_parsable_certificates(certs.filter_map(Result::ok));
    if added == 0 {
        return Err(format!("{}: no certificate in it", ca.display()));
    }
    let provider = rustls::crypto::CryptoProvider {
        cipher_suites: vec![ring::cipher_suite::TLS13_AES_128_GCM_SHA256],
        ..ring::default_provider()
    };
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
