//! Incremental request parsing. The end of the head is found by scanning only
//! the bytes that arrived since the last look (no quadratic re-parse); only
//! then does httparse run, and its borrowed result is turned into an owned
//! [`RequestHead`] at once. Body framing follows RFC 9112 section 6.3; chunked
//! bodies are decoded by a resumable state machine (`chunked.rs`), so a body
//! dribbled in byte by byte costs linear time.

use std::borrow::Cow;

use super::{Framing, Method, RequestHead};
use crate::error::ApiError;

mod chunked;
mod start;
pub use chunked::{ChunkedDecoder, FRAMING_ALLOWANCE, MAX_CHUNK_LINE};
use start::LineCheck;

/// Largest request head; beyond it the answer is 431.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most header lines httparse is given room for; beyond it the answer is 431.
pub const MAX_HEADERS: usize = 64;

/// Finds the end of the head (`\r\n\r\n`, or `\n\n` which RFC 9112 lets a
/// server accept) in `buf`, starting near `*scanned` and remembering how far
/// it looked. Returns the head length.
pub fn find_head_end(buf: &[u8], scanned: &mut usize) -> Option<usize> {
    let start = scanned.saturating_sub(3);
    let mut i = start;
    while let Some(off) = buf[i..].iter().position(|&b| b == b'\n') {
        let nl = i + off;
        if nl >= 1 && buf[nl - 1] == b'\n' {
            return Some(nl + 1);
        }
        if nl >= 2 && buf[nl - 1] == b'\r' && buf[nl - 2] == b'\n' {
            return Some(nl + 1);
        }
        i = nl + 1;
    }
    *scanned = buf.len();
    None
}

/// How far the current request's head has been looked at, kept between
/// reads so each byte is scanned once.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeadScan {
    /// Bytes after the leading empty lines searched for the end of the head.
    scanned: usize,
    /// The early check of the request line.
    line: LineCheck,
    /// Whether httparse was tried on the whole buffer at the first look.
    tried_whole: bool,
}

/// Parses a request head from the start of `buf`. `Ok(None)` means more
/// bytes are needed. Leading empty lines are skipped (RFC 9112 section 2.2).
/// Bytes that cannot begin an HTTP/1.x request are refused before the end
/// of the head arrives (see `start.rs`).
pub fn parse_head(
    buf: &[u8],
    scan: &mut HeadScan,
) -> Result<Option<(RequestHead, usize)>, ApiError> {
    // A head that arrived whole (the usual case) is parsed at once: what
    // httparse accepts passes the early check and ends where the scan for
    // its end would. Anything else (a partial head, an error) goes the
    // long way, once, which also words the errors.
    if !scan.tried_whole && !buf.is_empty() {
        scan.tried_whole = true;
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(end)) = req.parse(buf) {
            if end > MAX_HEAD_BYTES {
                return Err(ApiError::head_too_large());
            }
            return Ok(Some((own_head(&req)?, end)));
        }
    }
    scan.line
        .advance(buf)
        .map_err(|why| ApiError::bad_request("Malformed request head").with_details(why))?;
    let head_end = scan
        .line
        .line_start()
        .and_then(|lead| find_head_end(&buf[lead..], &mut scan.scanned).map(|end| lead + end));
    let Some(end) = head_end else {
        if buf.len() > MAX_HEAD_BYTES {
            return Err(ApiError::head_too_large());
        }
        return Ok(None);
    };
    if end > MAX_HEAD_BYTES {
        return Err(ApiError::head_too_large());
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(&buf[..end]) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(ApiError::bad_request("Malformed request head"));
        }
        Err(httparse::Error::TooManyHeaders) => return Err(ApiError::head_too_large()),
        Err(e) => {
            return Err(ApiError::bad_request("Malformed request head").with_details(e.to_string()));
        }
    }
    let head = own_head(&req)?;
    Ok(Some((head, end)))
}

/// Whether the comma-separated list `value` holds `token` (any case).
pub fn has_token(value: &str, token: &str) -> bool {
    value
        .split(',')
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The paths the API serves without an id in them, kept as static strings
/// so that the common requests own no path.
fn static_path(path: &str) -> Option<&'static str> {
    [
        "/prompt",
        "/response",
        "/cancel",
        "/healthz",
        "/readyz",
        "/metrics",
        "/",
    ]
    .into_iter()
    .find(|known| *known == path)
}

/// A header value the server reads, as text. A value that is not UTF-8 is
/// skipped like an absent header, except for the framing headers, where it
/// is an error.
fn text_value<'a>(name: &str, value: &'a [u8]) -> Result<Option<&'a str>, ApiError> {
    match std::str::from_utf8(value) {
        Ok(v) => Ok(Some(v.trim())),
        Err(_)
            if name.eq_ignore_ascii_case("content-length")
                || name.eq_ignore_ascii_case("transfer-encoding") =>
        {
            Err(ApiError::bad_request("Invalid framing header"))
        }
        Err(_) => Ok(None),
    }
}

/// Whether a `Content-Type` is `application/json`, parameters allowed.
pub fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
}

/// Copies what the server needs out of httparse's borrowed parse, and
/// decides the body framing. Only the values of the headers it uses are
/// decoded, and the paths it knows are not copied.
fn own_head(req: &httparse::Request) -> Result<RequestHead, ApiError> {
    let bad = |msg: &'static str| ApiError::bad_request(msg);
    let target = req.path.ok_or_else(|| bad("Malformed request head"))?;
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (target, None),
    };
    let http10 = req.version == Some(0);
    let mut head = RequestHead {
        method: Some(Method::parse(req.method.unwrap_or(""))),
        path: match static_path(path) {
            Some(known) => Cow::Borrowed(known),
            None => Cow::Owned(path.to_string()),
        },
        query,
        http10,
        ..RequestHead::default()
    };
    let mut content_length: Option<usize> = None;
    let mut transfer_encoding: Option<String> = None;
    let mut conn_close = false;
    let mut conn_keep_alive = false;
    let mut conn_upgrade = false;
    let mut upgrade_ws = false;
    let mut hosts = 0;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("host") {
            // A Host that is not text counts as absent.
            hosts += usize::from(h.value.is_ascii() || std::str::from_utf8(h.value).is_ok());
            continue;
        }
        let Some(value) = text_value(name, h.value)? else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-length") {
            // Digits only: no sign, no spaces (RFC 9110 section 8.6). A list of
            // identical values is allowed; differing ones are an error.
            for part in value.split(',') {
                let part = part.trim();
                if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("Invalid Content-Length"));
                }
                let n: usize = part.parse().map_err(|_| bad("Invalid Content-Length"))?;
                if content_length.is_some_and(|c| c != n) {
                    return Err(bad("Conflicting Content-Length"));
                }
                content_length = Some(n);
            }
        } else if name.eq_ignore_ascii_case("content-type") {
            head.json = is_json(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            match &mut transfer_encoding {
                Some(te) => {
                    te.push(',');
                    te.push_str(value);
                }
                None => transfer_encoding = Some(value.to_string()),
            }
        } else if name.eq_ignore_ascii_case("connection") {
            conn_close |= has_token(value, "close");
            conn_keep_alive |= has_token(value, "keep-alive");
            conn_upgrade |= has_token(value, "upgrade");
        } else if name.eq_ignore_ascii_case("upgrade") {
            upgrade_ws |= has_token(value, "websocket");
        } else if name.eq_ignore_ascii_case("expect") {
            // An HTTP/1.0 client cannot read a 1xx: ignore it (RFC 9110 section 10.1.1).
            head.expect_continue = !http10 && value.eq_ignore_ascii_case("100-continue");
        } else if name.eq_ignore_ascii_case("sec-websocket-key") {
            head.ws_key = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("sec-websocket-version") {
            head.ws_version_13 = value == "13";
        } else if name.eq_ignore_ascii_case("sec-websocket-protocol") {
            // A list, possibly over several lines (RFC 6455 section 11.3.4).
            match &mut head.ws_protocols {
                Some(list) => {
                    list.push(',');
                    list.push_str(value);
                }
                None => head.ws_protocols = Some(value.to_string()),
            }
        } else if name.eq_ignore_ascii_case("origin") {
            head.origin = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("authorization") {
            head.authorization = Some(value.to_string());
        } else if name.eq_ignore_ascii_case("x-forwarded-for") {
            match &mut head.forwarded_for {
                Some(xff) => {
                    xff.push(',');
                    xff.push_str(value);
                }
                None => head.forwarded_for = Some(value.to_string()),
            }
        }
    }
    // RFC 9112 section 3.2: exactly one Host in HTTP/1.1, at most one in 1.0.
    if hosts > 1 || (hosts == 0 && !http10) {
        return Err(bad("Missing or repeated Host header"));
    }
    // Only a WebSocket upgrade's origin is checked: only it looks again.
    if upgrade_ws && let Some(origin) = &head.origin {
        let host = req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("host"));
        head.same_origin = host.is_some_and(|h| same_origin(origin, h.value));
    }
    // RFC 9112 section 6.3: Transfer-Encoding overrides Content-Length, but a
    // request with both is a smuggling attempt more often than not: refuse it.
    // A request whose final coding is not chunked has no determinable length.
    head.framing = Some(match (transfer_encoding, content_length) {
        (Some(_), Some(_)) => return Err(bad("Both Transfer-Encoding and Content-Length")),
        (Some(te), None) => {
            let last = te.rsplit(',').next().unwrap_or("").trim();
            if !last.eq_ignore_ascii_case("chunked") || http10 {
                return Err(bad("Unsupported Transfer-Encoding"));
            }
            Framing::Chunked
        }
        (None, Some(0)) | (None, None) => Framing::Empty,
        (None, Some(n)) => Framing::Length(n),
    });
    head.keep_alive = if http10 {
        conn_keep_alive && !conn_close
    } else {
        !conn_close
    };
    head.websocket = conn_upgrade && upgrade_ws;
    Ok(head)
}

/// Where the current request is.
#[derive(Debug)]
enum Progress {
    /// Waiting for a complete head, looked at as far as `scan` says.
    Head { scan: HeadScan },
    /// Head parsed, waiting for a `Content-Length` body of `len` bytes.
    Body { head: Box<RequestHead>, len: usize },
    /// Head parsed, decoding a chunked body. The decoder is boxed: it is
    /// rare, and every connection's reader would carry room for it.
    Chunked {
        head: Box<RequestHead>,
        decoder: Box<ChunkedDecoder>,
    },
}

/// What the reader has for the connection.
#[derive(Debug)]
pub enum Step {
    /// A request is incomplete: read more bytes (at most [`RequestReader::want`]).
    NeedMore,
    /// The client waits for `100 Continue` before sending its body.
    SendContinue,
    /// A complete request; its body is [`RequestReader::body`] until
    /// [`RequestReader::finish`] or the next step.
    Request(RequestHead),
}

/// The body of the request last handed out.
#[derive(Debug, Default)]
enum Handed {
    #[default]
    Nothing,
    /// `len` bytes of the buffer from `at`, already consumed: they stay
    /// until the reader is next used.
    Buffered { at: usize, len: usize },
    /// A decoded chunked body.
    Decoded(Vec<u8>),
}

/// Turns a connection's byte stream into requests, one at a time: the
/// caller asks for the next request only after answering the previous one
/// (h11 pauses the same way), so pipelined requests are answered in order
/// and a parked request holds the rest back. Bytes are consumed by moving a
/// start offset; a request's body is lent from the buffer, not copied. The
/// buffer compacts when drained and is freed when empty, so an idle
/// connection holds no input memory.
#[derive(Debug)]
pub struct RequestReader {
    buf: Vec<u8>,
    start: usize,
    progress: Progress,
    handed: Handed,
    continue_sent: bool,
    max_body: usize,
}

/// Input kept buffered while a chunked body is decoded.
const CHUNK_WINDOW: usize = 64 * 1024;

impl RequestReader {
    /// A reader that refuses bodies above `max_body` bytes with 413.
    pub fn new(max_body: usize) -> RequestReader {
        RequestReader {
            buf: Vec::new(),
            start: 0,
            progress: Progress::Head {
                scan: HeadScan::default(),
            },
            handed: Handed::Nothing,
            continue_sent: false,
            max_body,
        }
    }

    /// What [`Self::want`] says of a reader that holds nothing: a head,
    /// up to its cap and one byte more (to tell a head over the cap).
    pub const FIRST_WANT: usize = MAX_HEAD_BYTES + 1;

    /// Whether it holds nothing: no bytes, no request in progress. Such a
    /// reader is the same as a new one.
    pub fn is_empty(&self) -> bool {
        self.start == self.buf.len()
            && self.buf.capacity() == 0
            && matches!(self.handed, Handed::Nothing)
            && matches!(self.progress, Progress::Head { .. })
    }

    /// Unprocessed bytes.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Whether a request is partly received (a timeout then means 408).
    pub fn mid_request(&self) -> bool {
        self.start < self.buf.len() || !matches!(self.progress, Progress::Head { .. })
    }

    /// How many more bytes the reader will buffer now; 0 means stop reading.
    /// Bounded by the head cap, the announced body, or a chunk window.
    pub fn want(&self) -> usize {
        let have = self.buf.len() - self.start;
        let need = match &self.progress {
            Progress::Head { .. } => Self::FIRST_WANT,
            Progress::Body { len, .. } => *len,
            Progress::Chunked { .. } => CHUNK_WINDOW,
        };
        need.saturating_sub(have)
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.finish();
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 4096 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Takes the bytes after the last request (the start of a WebSocket
    /// stream after an upgrade).
    pub fn take_rest(&mut self) -> Vec<u8> {
        self.handed = Handed::Nothing;
        let rest = self.buf.split_off(self.start);
        self.buf = Vec::new();
        self.start = 0;
        rest
    }

    /// The body of the request the last step returned.
    pub fn body(&self) -> &[u8] {
        match &self.handed {
            Handed::Nothing => &[],
            Handed::Buffered { at, len } => self.buf.get(*at..at + len).unwrap_or_default(),
            Handed::Decoded(body) => body,
        }
    }

    /// Done with the last request's body: its memory may go, and an
    /// emptied buffer is freed (an idle or parked connection holds none).
    pub fn finish(&mut self) {
        self.handed = Handed::Nothing;
        if self.start == self.buf.len() && self.buf.capacity() > 0 {
            self.buf = Vec::new();
            self.start = 0;
        }
    }

    /// Moves past `n` bytes; a drained buffer is freed by [`Self::finish`].
    fn consume(&mut self, n: usize) {
        self.start += n;
    }

    /// Advances the parse as far as the buffered bytes allow. An error is
    /// the answer to send before closing the connection.
    pub fn next_step(&mut self) -> Result<Step, ApiError> {
        self.finish();
        loop {
            match &mut self.progress {
                Progress::Head { scan } => {
                    let Some((head, len)) = parse_head(&self.buf[self.start..], scan)? else {
                        return Ok(Step::NeedMore);
                    };
                    self.progress = Progress::Head {
                        scan: HeadScan::default(),
                    };
                    self.consume(len);
                    self.continue_sent = false;
                    match head.framing() {
                        super::Framing::Empty => return Ok(Step::Request(head)),
                        super::Framing::Length(n) if n > self.max_body => {
                            return Err(ApiError::body_too_large());
                        }
                        super::Framing::Length(n) if self.buf.len() - self.start >= n => {
                            // The body came with the head: no need to wait.
                            return Ok(self.hand_buffered(head, n));
                        }
                        super::Framing::Length(n) => {
                            self.progress = Progress::Body {
                                head: Box::new(head),
                                len: n,
                            };
                        }
                        super::Framing::Chunked => {
                            self.progress = Progress::Chunked {
                                head: Box::new(head),
                                decoder: Box::new(ChunkedDecoder::new(self.max_body)),
                            };
                        }
                    }
                }
                Progress::Body { head, len } => {
                    let have = self.buf.len() - self.start;
                    if have < *len {
                        if head.expect_continue && !self.continue_sent {
                            self.continue_sent = true;
                            return Ok(Step::SendContinue);
                        }
                        return Ok(Step::NeedMore);
                    }
                    let len = *len;
                    let head = std::mem::take(&mut **head);
                    self.progress = Progress::Head {
                        scan: HeadScan::default(),
                    };
                    return Ok(self.hand_buffered(head, len));
                }
                Progress::Chunked { head, decoder } => {
                    let used = decoder.feed(&self.buf[self.start..])?;
                    let done = decoder.is_done();
                    if !done && head.expect_continue && !self.continue_sent {
                        self.continue_sent = true;
                        self.consume(used);
                        return Ok(Step::SendContinue);
                    }
                    if !done {
                        self.consume(used);
                        return Ok(Step::NeedMore);
                    }
                    self.handed = Handed::Decoded(decoder.take_body());
                    let head = std::mem::take(&mut **head);
                    self.progress = Progress::Head {
                        scan: HeadScan::default(),
                    };
                    self.consume(used);
                    return Ok(Step::Request(head));
                }
            }
        }
    }

    /// Lends the `len` bytes at the start as the body of `head`.
    fn hand_buffered(&mut self, head: RequestHead, len: usize) -> Step {
        self.handed = Handed::Buffered {
            at: self.start,
            len,
        };
        self.consume(len);
        Step::Request(head)
    }
}

#[cfg(test)]
mod tests;

/// Whether `origin` (`scheme://host[:port]`) names the host and port of
/// the request's `Host` value: a page this server served.
fn same_origin(origin: &str, host: &[u8]) -> bool {
    let Some((scheme, rest)) = origin.split_once("://") else {
        return false;
    };
    matches!(scheme, "http" | "https") && rest.as_bytes().eq_ignore_ascii_case(host)
}
