//! Malformed WebSocket client traffic against the real binary, from a raw TCP
//! client that does the upgrade by hand and builds every frame itself: each
//! violation gets the RFC 6455 close code (read from the server's Close frame)
//! or at least a closed connection, and never disturbs another subscriber of
//! the same session or the server.

use crate::common::*;
use serde_json::{Value, json};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// RFC 6455's sample key and its accept value (section 1.3).
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
const ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";
const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

const FIN: u8 = 0x80;
const RSV1: u8 = 0x40;
const CONT: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;

/// One frame: `first` is the FIN/RSV/opcode byte; masked unless `masked` is false.
fn frame(first: u8, masked: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= 0xffff => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        out.extend_from_slice(&MASK);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

/// A hand-made WebSocket client: the raw socket and the bytes read but not parsed.
struct RawWs {
    stream: Stream,
    buf: Vec<u8>,
}

impl RawWs {
    /// Upgrades by hand and checks the 101 and its accept key.
    #[track_caller]
    fn connect(srv: &Server, sid: &str) -> RawWs {
        let stream = TcpStream::connect(srv.addr()).expect("connect");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut stream = Stream::over(stream);
        let req = format!(
            "GET /ws/{sid} HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {KEY}\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).expect("send upgrade");
        let mut ws = RawWs {
            stream,
            buf: Vec::new(),
        };
        let end = loop {
            if let Some(p) = ws.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            assert!(ws.fill(), "closed during the upgrade");
        };
        let head = String::from_utf8_lossy(&ws.buf[..end]).into_owned();
        ws.buf.drain(..end);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(
            head.lines()
                .any(|l| l
                    .split_once(':')
                    .is_some_and(|(k, v)| k.eq_ignore_ascii_case("sec-websocket-accept")
                        && v.trim() == ACCEPT)),
            "{head}"
        );
        ws
    }

    /// Writes bytes; a write error is ignored, since the server may already
    /// be closing, and the reads that follow decide the test.
    fn send(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes);
        let _ = self.stream.flush();
    }

    /// Reads more bytes; false on EOF or reset. Panics on timeout.
    #[track_caller]
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return true;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    panic!("the server sent nothing and kept the socket open for {IO_TIMEOUT:?}")
                }
                Err(_) => return false,
            }
        }
    }

    /// The next server frame as (FIN/RSV/opcode byte, payload); `None` when
    /// the stream ends first. Server frames must be unmasked.
    #[track_caller]
    fn read_frame(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if let Some((len, hdr)) = parse_header(&self.buf)
                && self.buf.len() >= hdr + len
            {
                let first = self.buf[0];
                let payload = self.buf[hdr..hdr + len].to_vec();
                self.buf.drain(..hdr + len);
                return Some((first, payload));
            }
            if !self.fill() {
                return None;
            }
        }
    }

    /// Reads until the server's Close frame and returns its code (1005 when
    /// it has none); `None` if the stream ends without one.
    #[track_caller]
    fn close_code(&mut self) -> Option<u16> {
        for _ in 0..10_000 {
            let (first, payload) = self.read_frame()?;
            if first & 0x0f == CLOSE {
                return Some(match payload.get(..2) {
                    Some(c) => u16::from_be_bytes([c[0], c[1]]),
                    None => 1005,
                });
            }
        }
        panic!("no Close frame among 10000 frames")
    }

    /// The next text frame as JSON, skipping protocol pings and JSON pings.
    #[track_caller]
    fn text(&mut self) -> Value {
        loop {
            let (first, payload) = self.read_frame().expect("stream ended before a text frame");
            match first & 0x0f {
                TEXT => {
                    let v: Value = serde_json::from_slice(&payload).expect("JSON text frame");
                    // Pings and the agent's presence are not what a test waits for.
                    if v["type"] != "ping" && v["type"] != "presence" {
                        return v;
                    }
                }
                PING | 0xA => {}
                op => panic!("expected a text frame, got opcode {op:#x}"),
            }
        }
    }

    /// Asserts the server ends the TCP stream (within the read timeout).
    #[track_caller]
    fn assert_ends(&mut self) {
        let deadline = Instant::now() + IO_TIMEOUT;
        while self.fill() {
            self.buf.clear();
            assert!(
                Instant::now() < deadline,
                "the server kept the connection open"
            );
        }
    }
}

/// Payload length and header length of the frame at the start of `buf`.
fn parse_header(buf: &[u8]) -> Option<(usize, usize)> {
    let b1 = *buf.get(1)?;
    assert_eq!(b1 & 0x80, 0, "server frames must not be masked");
    match b1 & 0x7f {
        126 => Some((u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]) as usize, 4)),
        127 => {
            let b: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
            Some((u64::from_be_bytes(b) as usize, 10))
        }
        n => Some((n as usize, 2)),
    }
}

/// A session with one well-behaved subscriber (`Ws`) and one raw client.
struct Setup {
    srv: Server,
    sid: String,
    watcher: Ws,
    raw: RawWs,
    exchanges: u32,
}

#[track_caller]
fn setup() -> Setup {
    let srv = Server::start();
    let sid = unique_session();
    let watcher = srv.ws(&format!("/ws/{sid}"));
    let raw = RawWs::connect(&srv, &sid);
    srv.wait_health("subscribers", 2);
    Setup {
        srv,
        sid,
        watcher,
        raw,
        exchanges: 0,
    }
}

impl Setup {
    /// Posts a prompt and its answer; returns the answer's text.
    #[track_caller]
    fn broadcast(&mut self) -> String {
        self.exchanges += 1;
        let id = format!("c{}", self.exchanges);
        let text = format!("answer {}", self.exchanges);
        self.srv.prompt(&self.sid, "q", Some(&id));
        self.srv.respond(&self.sid, &id, &text);
        text
    }

    /// The raw client was dropped as a subscriber, while the other one still
    /// gets broadcasts and the server stays healthy.
    #[track_caller]
    fn assert_others_unaffected(&mut self) {
        self.srv.wait_health("subscribers", 1);
        let text = self.broadcast();
        let f = self.watcher.recv_json_skip_pings();
        assert_eq!(f["type"], "message", "{f}");
        assert_eq!(f["data"]["text"], text.as_str(), "{f}");
        assert_eq!(self.srv.get("/healthz").status, 200);
        let other = RawWs::connect(&self.srv, &self.sid);
        self.srv.wait_health("subscribers", 2);
        drop(other);
    }

    /// The raw client gets a Close frame with `want` and is disconnected.
    #[track_caller]
    fn assert_closed_with(&mut self, want: u16) {
        assert_eq!(self.raw.close_code(), Some(want), "close code");
        self.raw.assert_ends();
        self.assert_others_unaffected();
    }

    /// The raw client gets a Close frame with `want`, or is at least
    /// disconnected: for input so broken that dropping it is also fine.
    #[track_caller]
    fn assert_closed_with_or_dropped(&mut self, want: u16) {
        let code = self.raw.close_code();
        assert!(
            code.is_none() || code == Some(want),
            "close code {code:?}, want {want}"
        );
        self.raw.assert_ends();
        self.assert_others_unaffected();
    }
}

#[test]
fn unmasked_client_frame_is_closed_with_1002() {
    let mut s = setup();
    s.raw
        .send(&frame(FIN | TEXT, false, br#"{"type":"pong","ts":1}"#));
    s.assert_closed_with(1002);
}

#[test]
fn frame_above_64_kib_is_closed_with_1009() {
    let mut s = setup();
    s.raw
        .send(&frame(FIN | TEXT, true, &vec![b'x'; 64 * 1024 + 1]));
    s.assert_closed_with(1009);
}

#[test]
fn fragmented_message_above_64_kib_is_closed_with_1009() {
    let mut s = setup();
    let part = vec![b'x'; 16 * 1024];
    s.raw.send(&frame(TEXT, true, &part));
    for _ in 0..4 {
        s.raw.send(&frame(CONT, true, &part));
    }
    s.raw.send(&frame(FIN | CONT, true, b"!"));
    s.assert_closed_with(1009);
}

#[test]
fn text_frame_with_invalid_utf8_is_closed_with_1007() {
    let mut s = setup();
    s.raw
        .send(&frame(FIN | TEXT, true, b"{\"type\":\"\xff\xfe\"}"));
    s.assert_closed_with(1007);
}

#[test]
fn binary_frame_gets_an_error_frame_and_the_connection_stays_open() {
    let mut s = setup();
    s.raw.send(&frame(FIN | BINARY, true, &[0, 1, 2, 3]));
    let err = s.raw.text();
    assert_eq!(err["type"], "error", "{err}");
    assert!(err["error"].is_string(), "{err}");
    let text = s.broadcast();
    for f in [s.raw.text(), s.watcher.recv_json_skip_pings()] {
        assert_eq!(f["type"], "message", "{f}");
        assert_eq!(f["data"]["text"], text.as_str(), "{f}");
    }
    assert_eq!(s.srv.health()["subscribers"], 2);
    let pong = json!({"type": "pong", "ts": now_ms()}).to_string();
    s.raw.send(&frame(FIN | TEXT, true, pong.as_bytes()));
    s.raw
        .send(&frame(FIN | CLOSE, true, &1000u16.to_be_bytes()));
    assert_eq!(
        s.raw.close_code(),
        Some(1000),
        "a pong drew no error and the close is echoed"
    );
}

#[test]
fn fragmented_ping_is_closed_with_1002() {
    let mut s = setup();
    s.raw.send(&frame(PING, true, b"hi"));
    s.assert_closed_with(1002);
}

#[test]
fn close_inside_a_fragmented_message_is_answered_and_ends_the_connection() {
    let mut s = setup();
    s.raw.send(&frame(TEXT, true, b"{\"type\":"));
    s.raw
        .send(&frame(FIN | CLOSE, true, &1000u16.to_be_bytes()));
    let code = s.raw.close_code();
    assert!(
        matches!(code, Some(1000 | 1002)),
        "the server must answer the Close frame: {code:?}"
    );
    s.raw.assert_ends();
    s.assert_others_unaffected();
}

#[test]
fn reserved_bits_without_an_extension_are_closed_with_1002() {
    let mut s = setup();
    s.raw.send(&frame(FIN | RSV1 | TEXT, true, b"{}"));
    s.assert_closed_with(1002);
}

#[test]
fn continuation_without_a_first_fragment_is_closed_with_1002() {
    let mut s = setup();
    s.raw.send(&frame(FIN | CONT, true, b"{}"));
    s.assert_closed_with(1002);
}

#[test]
fn reserved_opcode_is_closed_with_1002() {
    let mut s = setup();
    s.raw.send(&frame(FIN | 0x3, true, b"{}"));
    s.assert_closed_with(1002);
}

#[test]
fn garbage_bytes_close_the_connection() {
    let mut s = setup();
    // 'G' is 0x47: RSV1 set, reserved opcode 7 -> a protocol error.
    s.raw.send(b"GET / HTTP/1.1\r\n\r\n\xff\x00\x13garbage");
    s.assert_closed_with_or_dropped(1002);
}
