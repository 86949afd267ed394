//! The blocking HTTP/1.1 client shared by `relay agent`, `relay send` and
//! `relay health`: one keep-alive connection, plain or TLS (`https://`,
//! the certificate always verified), `Content-Length` and chunked bodies, a
//! read timeout on every read, errors as values.
//!
//! Every request the tools send is idempotent (ids are chosen by the
//! client), so a reused keep-alive connection that turns out to be closed is
//! retried once on a fresh one. A request can also be cancelled: reads
//! wait in short slices and check the caller's flag between them, which is
//! how an idle long-poll notices SIGTERM without a busy loop.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::http::parse::ChunkedDecoder;
use crate::http::upgrade::{accept_key, base64};

/// Largest response head accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest response body accepted (a long-poll answer holds at most 4 MiB
/// of prompts, plus metadata).
const MAX_BODY_BYTES: usize = 16 << 20;
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a cancellable read looks at its flag.
const CANCEL_SLICE: Duration = Duration::from_millis(200);

/// A parsed `http[s]://host[:port][/prefix]` base address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `https://`: TLS, the certificate checked against `host`.
    tls: bool,
    /// `host:port` as sent in `Host` (IPv6 literals keep their brackets).
    authority: String,
    /// The host to resolve, without brackets.
    host: String,
    port: u16,
    /// A path prefix without a trailing slash (`""` for none).
    prefix: String,
}

impl Url {
    /// Parses the `--url` value: `http://` or `https://` (no scheme means
    /// `http://`).
    pub fn parse(s: &str) -> Result<Url, String> {
        let (rest, tls) = match s.split_once("://") {
            Some(("http", rest)) => (rest, false),
            Some(("https", rest)) => (rest, true),
            Some((scheme, _)) => {
                return Err(format!(
                    "'{s}': only http:// and https:// URLs are supported, not {scheme}://"
                ));
            }
            None => (s, false),
        };
        let (hostport, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if path.contains(['?', '#']) || hostport.contains('@') {
            return Err(format!(
                "'{s}': expected http[s]://host[:port][/prefix] (no query, fragment or user)"
            ));
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) =
            split_host_port(hostport, default_port).ok_or_else(|| format!("'{s}': bad host"))?;
        Ok(Url {
            tls,
            authority: hostport.to_string(),
            host,
            port,
            prefix: path.trim_end_matches('/').to_string(),
        })
    }

    /// The request target for an endpoint path (`/healthz`).
    pub fn target(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    /// Whether it is an `https://` address.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The `http[s]://` address of an endpoint path, for messages.
    pub fn http(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}{path}", self.authority, self.prefix)
    }

    /// The `ws[s]://` address of an endpoint path.
    pub fn ws(&self, path: &str) -> String {
        let scheme = if self.tls { "wss" } else { "ws" };
        format!("{scheme}://{}{}{path}", self.authority, self.prefix)
    }

    /// Opens a TCP connection to the first address that answers.
    pub fn connect(&self, timeout: Duration) -> io::Result<TcpStream> {
        let mut last = io::Error::new(ErrorKind::NotFound, "host has no address");
        for addr in (self.host.as_str(), self.port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `default_port` when absent.
fn split_host_port(s: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() || host.contains([' ', '[', ']']) {
        return None;
    }
    let port = match port {
        Some(p) => p.parse().ok().filter(|p| *p != 0)?,
        None => default_port,
    };
    Some((host.to_string(), port))
}

/// Why a request got no HTTP answer.
#[derive(Debug)]
pub enum Error {
    /// No connection (refused, unreachable, name not resolved).
    Connect(io::Error),
    /// The connection failed or closed mid-exchange.
    Io(io::Error),
    /// No complete answer before the deadline.
    TimedOut,
    /// The caller's cancel flag was raised while waiting.
    Cancelled,
    /// The peer did not speak HTTP/1.1 as expected.
    Protocol(String),
    /// The TLS handshake failed: an untrusted certificate, one for another
    /// name. Retrying cannot help.
    Tls(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Connect(e) => write!(f, "cannot connect: {e}"),
            Error::Io(e) => write!(f, "connection failed: {e}"),
            Error::TimedOut => write!(f, "timed out"),
            Error::Cancelled => write!(f, "cancelled"),
            Error::Protocol(why) => write!(f, "bad answer: {why}"),
            Error::Tls(why) => write!(f, "{why}"),
        }
    }
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    /// `Retry-After` in seconds, when given as a number.
    pub retry_after: Option<u64>,
}

impl Response {
    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// `status error: details` for messages: the contract's `error` and
    /// `details` fields as the server wrote them (`403 Forbidden: token is
    /// for another session`), else the status alone. The server knows why
    /// it refused; the tools pass its words on rather than guess.
    pub fn describe(&self) -> String {
        let json = self.json();
        let field = |name: &str| json.as_ref().and_then(|v| v[name].as_str());
        match (field("error"), field("details")) {
            (Some(e), Some(d)) => format!("{} {e}: {d}", self.status),
            (Some(e), None) => format!("{} {e}", self.status),
            _ => format!("HTTP {}", self.status),
        }
    }
}

/// The outcome of a WebSocket upgrade: the open connection with any bytes
/// the server sent after its `101`, or the other answer it gave.
pub enum Upgraded {
    Open(Stream, Vec<u8>),
    Refused(Response),
}

/// How long a request may take and what may cancel it.
#[derive(Clone, Copy)]
pub struct Limit<'a> {
    pub timeout: Duration,
    pub cancel: Option<&'a AtomicBool>,
}

impl Limit<'_> {
    /// A plain request: a deadline, no cancellation.
    pub fn within(timeout: Duration) -> Limit<'static> {
        Limit {
            timeout,
            cancel: None,
        }
    }
}

/// A connection to the server: the socket, or TLS over it.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// The socket, for its timeouts.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(t) => t.flush(),
        }
    }
}

/// A keep-alive HTTP/1.1 client for one server. Created once per command.
pub struct Client {
    url: Url,
    token: Option<String>,
    /// What an `https://` server's certificate is checked against.
    tls: Option<Arc<ClientConfig>>,
    /// The name the certificate must be valid for, when not the URL's host.
    tls_name: Option<String>,
    conn: Option<Stream>,
    buf: Vec<u8>,
}

impl Client {
    /// A client that sends `Authorization: Bearer token` when given one;
    /// `tls` (what the tools' `--ca` and the system trust) is required for
    /// an `https://` URL.
    pub fn new(url: Url, token: Option<String>, tls: Option<Arc<ClientConfig>>) -> Client {
        Client {
            url,
            token,
            tls,
            tls_name: None,
            conn: None,
            buf: Vec::new(),
        }
    }

    /// Another client with the same server, token and trust, and no
    /// connection yet: for a thread of its own.
    pub fn fresh(&self) -> Client {
        Client {
            url: self.url.clone(),
            token: self.token.clone(),
            tls: self.tls.clone(),
            tls_name: self.tls_name.clone(),
            conn: None,
            buf: Vec::new(),
        }
    }

    /// Checks the certificate against `name` rather than the URL's host:
    /// `relay health` reaches its own server over loopback and checks the
    /// name the server's certificate is for.
    pub fn verify_as(mut self, name: String) -> Client {
        self.tls_name = Some(name);
        self
    }

    /// Connects to the server within `timeout`; over TLS the handshake is
    /// done here, so a certificate problem is an [`Error::Tls`] before any
    /// request is sent.
    fn open(&self, timeout: Duration) -> Result<Stream, Error> {
        let deadline = Instant::now() + timeout;
        let sock = self
            .url
            .connect(timeout.min(CONNECT_TIMEOUT))
            .map_err(Error::Connect)?;
        if !self.url.tls {
            return Ok(Stream::Plain(sock));
        }
        let Some(config) = &self.tls else {
            return Err(Error::Tls("no TLS settings for an https:// URL".into()));
        };
        let host = self.tls_name.as_ref().unwrap_or(&self.url.host);
        let name = ServerName::try_from(host.clone())
            .map_err(|_| Error::Tls(format!("'{host}' is not a name TLS can check")))?;
        let conn = ClientConnection::new(Arc::clone(config), name)
            .map_err(|e| Error::Tls(crate::tls::describe(&e, host)))?;
        let mut tls = StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            let left = remaining(deadline)?;
            tls.sock.set_read_timeout(Some(left)).map_err(Error::Io)?;
            tls.sock.set_write_timeout(Some(left)).map_err(Error::Io)?;
            match tls.conn.complete_io(&mut tls.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(Error::TimedOut);
                }
                Err(e) => {
                    return Err(match crate::tls::describe_io(&e, host) {
                        Some(why) => Error::Tls(why),
                        None => Error::Io(e),
                    });
                }
            }
        }
        Ok(Stream::Tls(Box::new(tls)))
    }

    /// The server's base address.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The bearer token, for a connection made outside this client.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Opens a WebSocket on `path` over a connection of its own (RFC 6455
    /// section 4.1): the upgrade request, with the token, and the `101`
    /// checked against the key it sent. Any other answer is read whole and
    /// returned.
    pub fn upgrade(&self, path: &str, timeout: Duration) -> Result<Upgraded, Error> {
        let deadline = Instant::now() + timeout;
        let left = remaining(deadline)?;
        let mut stream = self.open(left)?;
        let key = base64(uuid::Uuid::new_v4().as_bytes());
        let mut head = self.head("GET", path, None);
        // The upgrade's headers go before the blank line that ends the head.
        head.truncate(head.len() - 2);
        head.push_str(&format!(
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
        ));
        stream
            .tcp()
            .set_write_timeout(Some(remaining(deadline)?))
            .map_err(Error::Io)?;
        stream.write_all(head.as_bytes()).map_err(Error::Io)?;
        stream.flush().map_err(Error::Io)?;
        let mut buf = Vec::new();
        let mut reader = Reader {
            stream: &mut stream,
            buf: &mut buf,
            deadline,
            cancel: None,
        };
        let answer = read_head(&mut reader)?;
        if answer.status != 101 {
            let (resp, _) = read_response(&mut reader, false)?;
            return Ok(Upgraded::Refused(resp));
        }
        if answer.accept.as_deref() != Some(accept_key(key.as_bytes()).as_str()) {
            return Err(Error::Protocol(
                "Sec-WebSocket-Accept does not match the key sent".into(),
            ));
        }
        buf.drain(..answer.len);
        Ok(Upgraded::Open(stream, buf))
    }

    /// Sends one request (`body` is JSON) and reads its answer. A reused
    /// connection the server had closed is replaced once, transparently.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        limit: Limit<'_>,
    ) -> Result<Response, Error> {
        let deadline = Instant::now() + limit.timeout;
        let reused = self.conn.is_some();
        match self.exchange(method, path, body, deadline, limit.cancel) {
            Err(Error::Io(_)) if reused && self.buf.is_empty() => {
                self.conn = None;
                self.exchange(method, path, body, deadline, limit.cancel)
            }
            other => other,
        }
    }

    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        deadline: Instant,
        cancel: Option<&AtomicBool>,
    ) -> Result<Response, Error> {
        self.buf.clear();
        if self.conn.is_none() {
            let left = remaining(deadline)?;
            self.conn = Some(self.open(left)?);
        }
        let head = self.head(method, path, body);
        let result = self.send_and_read(&head, body, method == "HEAD", deadline, cancel);
        if !matches!(result, Ok((_, true))) {
            self.conn = None;
        }
        result.map(|(resp, _)| resp)
    }

    fn head(&self, method: &str, path: &str, body: Option<&[u8]>) -> String {
        let mut head = format!(
            "{method} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: relay/{}\r\nAccept: application/json\r\n",
            self.url.target(path),
            self.url.authority,
            env!("CARGO_PKG_VERSION")
        );
        if let Some(token) = &self.token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        match body {
            Some(b) => head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            )),
            None if method == "POST" || method == "PUT" => head.push_str("Content-Length: 0\r\n"),
            None => {}
        }
        head.push_str("\r\n");
        head
    }

    /// Writes the request and reads the answer; the flag says whether the
    /// connection may be reused.
    fn send_and_read(
        &mut self,
        head: &str,
        body: Option<&[u8]>,
        is_head: bool,
        deadline: Instant,
        cancel: Option<&AtomicBool>,
    ) -> Result<(Response, bool), Error> {
        let Some(stream) = self.conn.as_mut() else {
            return Err(Error::Protocol("no connection".into()));
        };
        stream
            .tcp()
            .set_write_timeout(Some(remaining(deadline)?))
            .map_err(Error::Io)?;
        let mut out = Vec::with_capacity(head.len() + body.map_or(0, <[u8]>::len));
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(body.unwrap_or_default());
        stream.write_all(&out).map_err(Error::Io)?;
        stream.flush().map_err(Error::Io)?;
        let mut reader = Reader {
            stream,
            buf: &mut self.buf,
            deadline,
            cancel,
        };
        read_response(&mut reader, is_head)
    }
}

/// A connection's input: reads with the deadline and cancel flag applied.
struct Reader<'a> {
    stream: &'a mut Stream,
    buf: &'a mut Vec<u8>,
    deadline: Instant,
    cancel: Option<&'a AtomicBool>,
}

impl Reader<'_> {
    /// Appends at least one byte to the buffer; `Ok(false)` at end of stream.
    fn fill(&mut self) -> Result<bool, Error> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if self.cancel.is_some_and(|c| c.load(Ordering::SeqCst)) {
                return Err(Error::Cancelled);
            }
            let mut wait = remaining(self.deadline)?;
            if self.cancel.is_some() {
                wait = wait.min(CANCEL_SLICE);
            }
            self.stream
                .tcp()
                .set_read_timeout(Some(wait))
                .map_err(Error::Io)?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(Error::Io(e)),
            }
        }
    }

    /// Reads until `need` bytes are buffered; end of stream is an error.
    fn fill_to(&mut self, need: usize) -> Result<(), Error> {
        while self.buf.len() < need {
            if !self.fill()? {
                return Err(Error::Io(ErrorKind::UnexpectedEof.into()));
            }
        }
        Ok(())
    }
}

/// What the response head says about the body and the connection.
struct Head {
    status: u16,
    len: usize,
    content_length: Option<usize>,
    chunked: bool,
    keep_alive: bool,
    retry_after: Option<u64>,
    /// `Sec-WebSocket-Accept`, in a `101`.
    accept: Option<String>,
}

fn read_response(r: &mut Reader<'_>, is_head: bool) -> Result<(Response, bool), Error> {
    let head = loop {
        let head = read_head(r)?;
        r.buf.drain(..head.len);
        // An interim answer (100 Continue) precedes the real one.
        if !(100..200).contains(&head.status) {
            break head;
        }
    };
    let no_body = is_head || head.status == 204 || head.status == 304;
    let (body, reusable) = if no_body {
        (Vec::new(), head.keep_alive)
    } else if head.chunked {
        (read_chunked(r)?, head.keep_alive)
    } else if let Some(len) = head.content_length {
        if len > MAX_BODY_BYTES {
            return Err(Error::Protocol(format!("body of {len} bytes is too large")));
        }
        r.fill_to(len)?;
        (r.buf.drain(..len).collect(), head.keep_alive)
    } else {
        (read_to_end(r)?, false)
    };
    // Bytes after the answer were never asked for: do not reuse.
    let reusable = reusable && r.buf.is_empty();
    let resp = Response {
        status: head.status,
        body,
        retry_after: head.retry_after,
    };
    Ok((resp, reusable))
}

fn read_head(r: &mut Reader<'_>) -> Result<Head, Error> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(r.buf) {
            Ok(httparse::Status::Complete(len)) => return Ok(head_of(&resp, len)),
            Ok(httparse::Status::Partial) if r.buf.len() > MAX_HEAD_BYTES => {
                return Err(Error::Protocol("response head too large".into()));
            }
            Ok(httparse::Status::Partial) => {}
            // A TLS record (an alert, a handshake) where HTTP was expected.
            Err(_) if r.buf.first().is_some_and(|b| (0x14..=0x17).contains(b)) => {
                return Err(Error::Protocol(
                    "the server speaks TLS: use an https:// URL".into(),
                ));
            }
            Err(e) => return Err(Error::Protocol(e.to_string())),
        }
        if !r.fill()? {
            return Err(Error::Io(ErrorKind::UnexpectedEof.into()));
        }
    }
}

fn head_of(resp: &httparse::Response<'_, '_>, len: usize) -> Head {
    let value = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    let connection = value("connection").unwrap_or("").to_ascii_lowercase();
    let keep_alive = if resp.version == Some(0) {
        connection.contains("keep-alive")
    } else {
        !connection.contains("close")
    };
    Head {
        status: resp.code.unwrap_or(0),
        len,
        content_length: value("content-length").and_then(|v| v.parse().ok()),
        chunked: value("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked")),
        keep_alive,
        retry_after: value("retry-after").and_then(|v| v.parse().ok()),
        accept: value("sec-websocket-accept").map(str::to_string),
    }
}

/// A chunked body (a proxy in front of the server may send one), decoded
/// by the server's own decoder with the CLI's caps: the body's, and the
/// head's for the trailers. The end of the stream before the last chunk is
/// an I/O error, as for a short `Content-Length` body.
fn read_chunked(r: &mut Reader<'_>) -> Result<Vec<u8>, Error> {
    let mut decoder = ChunkedDecoder::new(MAX_BODY_BYTES).with_trailer_cap(MAX_HEAD_BYTES);
    loop {
        let used = decoder.feed(r.buf).map_err(|e| match e.status {
            413 => Error::Protocol("chunked body too large".into()),
            431 => Error::Protocol("trailers too large".into()),
            _ => Error::Protocol(format!(
                "bad chunked body: {}",
                e.details.as_deref().unwrap_or(&e.error)
            )),
        })?;
        r.buf.drain(..used);
        if decoder.is_done() {
            return Ok(decoder.take_body());
        }
        r.fill_to(r.buf.len() + 1)?;
    }
}

/// A body delimited by the end of the connection.
fn read_to_end(r: &mut Reader<'_>) -> Result<Vec<u8>, Error> {
    while r.fill()? {
        if r.buf.len() > MAX_BODY_BYTES {
            return Err(Error::Protocol("body too large".into()));
        }
    }
    Ok(std::mem::take(r.buf))
}

fn remaining(deadline: Instant) -> Result<Duration, Error> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(Error::TimedOut),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_defaults_and_prefixes() {
        let u = Url::parse("http://127.0.0.1:9000").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.prefix.as_str()),
            ("127.0.0.1", 9000, "")
        );
        assert_eq!(u.target("/healthz"), "/healthz");
        let u = Url::parse("http://example.com/relay/").unwrap();
        assert_eq!((u.authority.as_str(), u.port), ("example.com", 80));
        assert_eq!(u.target("/prompt"), "/relay/prompt");
        assert_eq!(u.ws("/ws/s"), "ws://example.com/relay/ws/s");
        let u = Url::parse("http://h:09000").unwrap();
        assert_eq!((u.authority.as_str(), u.port), ("h:09000", 9000));
        let u = Url::parse("[::1]:8000").unwrap();
        assert_eq!(
            (u.host.as_str(), u.authority.as_str()),
            ("::1", "[::1]:8000")
        );
    }

    #[test]
    fn urls_that_cannot_be_served_are_refused() {
        let u = Url::parse("https://relay.example.com/r").unwrap();
        assert_eq!((u.port, u.is_tls()), (443, true));
        assert_eq!(u.ws("/ws/s"), "wss://relay.example.com/r/ws/s");
        assert_eq!(u.http("/healthz"), "https://relay.example.com/r/healthz");
        for bad in [
            "ftp://example.com",
            "http://",
            "http://host:0",
            "http://host:x",
            "http://host/?q",
            "http://user@host",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    /// Runs `upgrade` against a one-shot server that answers `reply(key)`
    /// to the request's `Sec-WebSocket-Key`.
    fn upgrade_against(
        reply: impl FnOnce(&str) -> Vec<u8> + Send + 'static,
    ) -> Result<Upgraded, Error> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let server = std::thread::spawn(move || {
            let (mut peer, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut chunk = [0u8; 1024];
            while !got.ends_with(b"\r\n\r\n") {
                let n = peer.read(&mut chunk).unwrap();
                got.extend_from_slice(&chunk[..n]);
            }
            let head = String::from_utf8(got).unwrap();
            let key = head
                .lines()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                .unwrap()
                .to_string();
            assert!(head.starts_with("GET /ws/s HTTP/1.1\r\n"), "{head}");
            assert!(head.contains("Authorization: Bearer t\r\n"), "{head}");
            peer.write_all(&reply(&key)).unwrap();
        });
        let client = Client::new(url, Some("t".into()), None);
        let out = client.upgrade("/ws/s", Duration::from_secs(5));
        server.join().unwrap();
        out
    }

    #[test]
    fn an_upgrade_checks_the_accept_key_and_keeps_what_follows_the_101() {
        let out = upgrade_against(|key| {
            let accept = accept_key(key.as_bytes());
            format!("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n\u{81}\u{2}hi").into_bytes()
        });
        let Ok(Upgraded::Open(_, read)) = out else {
            panic!("not upgraded");
        };
        assert_eq!(read, "\u{81}\u{2}hi".as_bytes());
        let out = upgrade_against(|_| {
            b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n".to_vec()
        });
        assert!(
            matches!(out, Err(Error::Protocol(_))),
            "a wrong key is refused"
        );
        let out = upgrade_against(|_| {
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 24\r\n\r\n{\"error\":\"Unauthorized\"}"
                .to_vec()
        });
        let Ok(Upgraded::Refused(resp)) = out else {
            panic!("not refused");
        };
        assert_eq!(resp.describe(), "401 Unauthorized");
        let with_details = |body: &[u8]| Response {
            status: 403,
            body: body.to_vec(),
            retry_after: None,
        };
        let refused =
            with_details(br#"{"error":"Forbidden","details":"token is for another session"}"#);
        assert_eq!(
            refused.describe(),
            "403 Forbidden: token is for another session"
        );
        assert_eq!(with_details(b"<html>").describe(), "HTTP 403");
    }

    /// A reader over bytes already received (the stream is never read).
    fn decode(bytes: &[u8], is_head: bool) -> Result<(Response, bool), Error> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut stream = Stream::Plain(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        let (_peer, _) = listener.accept().unwrap();
        let mut buf = bytes.to_vec();
        let mut r = Reader {
            stream: &mut stream,
            buf: &mut buf,
            deadline: Instant::now() + Duration::from_millis(100),
            cancel: None,
        };
        read_response(&mut r, is_head)
    }

    #[test]
    fn bodies_are_framed_by_length_or_chunks() {
        let (r, reuse) = decode(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false).unwrap();
        assert_eq!(
            (r.status, r.body.as_slice(), reuse),
            (200, &b"ok"[..], true)
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1;x=y\r\nc\r\n0\r\nT: v\r\n\r\n";
        let (r, reuse) = decode(chunked, false).unwrap();
        assert_eq!((r.body.as_slice(), reuse), (&b"abc"[..], true));
        let interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 429 Too Many\r\nRetry-After: 3\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        let (r, reuse) = decode(interim, false).unwrap();
        assert_eq!((r.status, r.retry_after, reuse), (429, Some(3), false));
        let (r, _) = decode(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true).unwrap();
        assert!(r.body.is_empty());
    }

    #[test]
    fn a_garbled_chunked_body_is_an_error() {
        let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let bad_size = [&head[..], b"zz\r\nab\r\n0\r\n\r\n"].concat();
        assert!(matches!(decode(&bad_size, false), Err(Error::Protocol(_))));
        let no_crlf = [&head[..], b"2\r\nabX\r\n0\r\n\r\n"].concat();
        assert!(matches!(decode(&no_crlf, false), Err(Error::Protocol(_))));
        let mut trailers = [&head[..], b"0\r\n"].concat();
        trailers
            .extend(std::iter::repeat_n(b"T: v\r\n".as_slice(), MAX_HEAD_BYTES / 6 + 1).flatten());
        match decode(&trailers, false) {
            Err(Error::Protocol(why)) => assert_eq!(why, "trailers too large"),
            other => panic!(
                "trailers above the head cap: {:?}",
                other.map(|(r, _)| r.status)
            ),
        }
    }

    #[test]
    fn a_short_or_garbled_answer_is_an_error() {
        assert!(matches!(
            decode(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", false),
            Err(Error::TimedOut)
        ));
        assert!(matches!(
            decode(b"\x16\x03\x01 not http\r\n\r\n", false),
            Err(Error::Protocol(_))
        ));
    }
}
