//! The WebSocket stage. tungstenite's `WebSocketContext` parses client frames
//! read straight from the socket (its read buffer sized small) and writes its
//! own control replies (Pong, Close) through an adapter into our capped
//! output queue. Server frames are unmasked, so a broadcast is encoded once
//! here and the same bytes are queued for every subscriber.

use std::io::{self, Read, Write};

use tungstenite::Message;
use tungstenite::error::{Error as WsError, ProtocolError};
use tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tungstenite::protocol::frame::{CloseFrame, Frame};
use tungstenite::protocol::{Role, WebSocketConfig, WebSocketContext};

use super::buffer::OutQueue;
use super::read::{Got, READ_BUDGET, read_once};
use crate::keepalive::Keepalive;
use crate::store::{Cursor, SessionId};
use crate::time::Millis;

/// Largest client message or frame; client traffic is pongs and the odd
/// control frame, so anything big is abuse (close 1009).
pub const MAX_CLIENT_MESSAGE: usize = 64 * 1024;
/// The context's read buffer, and the most it reads at a time: a client's
/// pong (`{"type":"pong","ts":…}`, about 40 bytes framed) fits in one read,
/// and anything longer takes a few more reads of a rare message. It stays
/// allocated for the life of the subscriber, and idle subscribers are the
/// many, so it is kept this small.
const READ_BUFFER: usize = 64;
/// Messages read per turn before yielding to other connections (bytes are
/// budgeted too, by the turn's read budget).
const MAX_MESSAGES_PER_TURN: usize = 64;
/// Wire bytes one client message may take, frames and all: a message is at
/// most 64 KiB, and even in one-byte fragments (7 bytes each on the wire)
/// it stays below this.
pub const MAX_WIRE_PER_MESSAGE: usize = 1 << 20;

/// A subscriber's WebSocket state.
pub struct WsState {
    pub ctx: WebSocketContext,
    pub sid: SessionId,
    pub keepalive: Keepalive,
    /// Its position in the session's log.
    pub cursor: Cursor,
    /// Not caught up: live messages are not queued on it; it is refilled
    /// from the log when its queue drains.
    pub lagging: bool,
    /// Bytes read since the client's last complete message.
    pub wire_since_message: usize,
    /// What is queued is the first replay or a keep-alive ping, not live
    /// traffic: once it is written, the output queue's room goes, so a
    /// quiet subscriber holds none between pings. A busy one gives it
    /// back at most once a ping interval.
    pub quiet: bool,
}

impl std::fmt::Debug for WsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsState").field("sid", &self.sid).finish()
    }
}

impl WsState {
    /// The state right after the 101, with bytes that followed the request
    /// head already in `leftover`.
    /// It starts lagging: the first refill sends its replay.
    pub fn new(leftover: Vec<u8>, sid: SessionId, keepalive: Keepalive, cursor: Cursor) -> WsState {
        let config = WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER)
            .write_buffer_size(0)
            .max_write_buffer_size(MAX_CLIENT_MESSAGE)
            .max_message_size(Some(MAX_CLIENT_MESSAGE))
            .max_frame_size(Some(MAX_CLIENT_MESSAGE));
        WsState {
            ctx: WebSocketContext::from_partially_read(leftover, Role::Server, Some(config)),
            sid,
            keepalive,
            cursor,
            lagging: true,
            wire_since_message: 0,
            quiet: true,
        }
    }
}

/// Reads from the socket within the turn's byte budget, writes into the
/// output queue (never blocks).
struct Io<'a, S> {
    sock: &'a mut S,
    out: &'a mut OutQueue,
    readable: bool,
    /// The peer sent FIN: read on to EOF, short reads prove nothing.
    read_closed: bool,
    /// Bytes read in this pass.
    read: usize,
    /// The pass stopped because the budget ran out, not the socket.
    budget_hit: bool,
    /// Bytes read since the last complete message.
    since_message: usize,
}

impl<S: Read> Read for Io<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.readable {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if self.read >= READ_BUDGET {
            self.budget_hit = true;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let max = buf.len().min(READ_BUDGET - self.read);
        match read_once(
            self.sock,
            &mut buf[..max],
            &mut self.readable,
            self.read_closed,
        ) {
            Got::Bytes(n) => {
                self.read += n;
                self.since_message += n;
                Ok(n)
            }
            Got::Blocked => Err(io::ErrorKind::WouldBlock.into()),
            Got::Eof => Ok(0),
            Got::Failed => Err(io::ErrorKind::ConnectionReset.into()),
        }
    }
}

impl<S> Write for Io<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.push_owned(buf.to_vec());
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How a read pass ended.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The socket has no more bytes for now.
    Drained,
    /// The per-turn budget ran out; read again next turn.
    More,
    /// The peer closed (its Close was answered, or the stream ended).
    PeerClosed,
    /// The peer broke the protocol: close with this code.
    Violation(u16, &'static str),
}

/// A text frame, encoded once.
pub fn encode_text(payload: &str) -> Vec<u8> {
    encode(Frame::message(
        payload.as_bytes().to_vec(),
        OpCode::Data(Data::Text),
        true,
    ))
}

/// A protocol-level Ping with an empty payload.
pub fn encode_ping() -> Vec<u8> {
    encode(Frame::ping(Vec::new()))
}

/// A Close frame with `code` and a short reason.
pub fn encode_close(code: u16, reason: &'static str) -> Vec<u8> {
    encode(Frame::close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: reason.into(),
    })))
}

fn encode(frame: Frame) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame.len());
    // Formatting into a Vec cannot fail.
    let _ = frame.format(&mut out);
    out
}

/// `{"type":"error",…}` for a client frame the server does not accept.
fn error_frame(error: &str, details: &str) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct ErrorFrame<'a> {
        r#type: &'static str,
        error: &'a str,
        details: &'a str,
    }
    let json = serde_json::to_string(&ErrorFrame {
        r#type: "error",
        error,
        details,
    })
    .unwrap_or_default();
    encode_text(&json)
}

/// Handles one text message from a client: pongs are accepted silently,
/// anything else gets an error frame and the connection stays open.
fn on_text(text: &str, out: &mut OutQueue) {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: Option<std::borrow::Cow<'a, str>>,
        ts: Option<serde_json::Value>,
    }
    match serde_json::from_str::<Typed>(text) {
        Ok(Typed { kind: Some(k), ts }) if k == "pong" => {
            if ts.is_some_and(|t| !t.is_u64()) {
                out.push_owned(error_frame(
                    "Invalid pong",
                    "ts must be milliseconds (a non-negative integer)",
                ));
            }
        }
        Ok(_) => out.push_owned(error_frame(
            "Unsupported message",
            "clients may send only {\"type\":\"pong\",\"ts\":<ms>}",
        )),
        Err(e) => out.push_owned(error_frame("Invalid JSON", &e.to_string())),
    }
}

/// Reads and handles client frames until the socket would block, the
/// turn's byte budget runs out, or the connection must close. Control
/// replies and error frames land in `out`. A client whose message takes more
/// than [`MAX_WIRE_PER_MESSAGE`] bytes on the wire (endless continuation
/// frames, which never complete a message) is closed with 1009.
pub fn read_frames<S: Read>(
    ws: &mut WsState,
    sock: &mut S,
    readable: &mut bool,
    read_closed: bool,
    out: &mut OutQueue,
    now: Millis,
) -> ReadOutcome {
    let mut io = Io {
        sock,
        out,
        readable: *readable,
        read_closed,
        read: 0,
        budget_hit: false,
        since_message: ws.wire_since_message,
    };
    let mut outcome = ReadOutcome::More;
    for _ in 0..MAX_MESSAGES_PER_TURN {
        match ws.ctx.read(&mut io) {
            Ok(msg) => {
                io.since_message = 0;
                ws.keepalive.on_receive(now);
                match msg {
                    Message::Text(t) => on_text(t.as_str(), io.out),
                    Message::Binary(_) => io.out.push_owned(error_frame(
                        "Unsupported message",
                        "binary frames are not accepted",
                    )),
                    Message::Close(_) => {
                        outcome = ReadOutcome::PeerClosed;
                        break;
                    }
                    Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                }
            }
            Err(WsError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                if io.since_message > 0 {
                    // Part of a message arrived: the peer is alive.
                    ws.keepalive.on_receive(now);
                }
                outcome = if io.budget_hit {
                    ReadOutcome::More
                } else {
                    ReadOutcome::Drained
                };
                break;
            }
            Err(e) => {
                outcome = classify(e);
                break;
            }
        }
        if io.since_message > MAX_WIRE_PER_MESSAGE {
            outcome = ReadOutcome::Violation(1009, "message too big");
            break;
        }
    }
    if io.since_message > MAX_WIRE_PER_MESSAGE {
        outcome = ReadOutcome::Violation(1009, "message too big");
    }
    *readable = io.readable;
    ws.wire_since_message = io.since_message;
    // Queue replies tungstenite holds (a Pong, the answer to a Close).
    match ws.ctx.flush(&mut io) {
        Ok(()) => outcome,
        Err(WsError::ConnectionClosed) | Err(WsError::AlreadyClosed) => ReadOutcome::PeerClosed,
        Err(WsError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => outcome,
        Err(e) if outcome == ReadOutcome::Drained || outcome == ReadOutcome::More => classify(e),
        Err(_) => outcome,
    }
}

fn classify(e: WsError) -> ReadOutcome {
    match e {
        WsError::ConnectionClosed | WsError::AlreadyClosed => ReadOutcome::PeerClosed,
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => ReadOutcome::PeerClosed,
        WsError::Io(_) => ReadOutcome::PeerClosed,
        WsError::Capacity(_) => ReadOutcome::Violation(1009, "message too big"),
        WsError::Utf8(_) => ReadOutcome::Violation(1007, "invalid UTF-8"),
        _ => ReadOutcome::Violation(1002, "protocol error"),
    }
}
