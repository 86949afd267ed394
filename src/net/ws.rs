//! The WebSocket stage. Client frames are parsed by our own reader
//! (`ws_read`), straight from the socket in small reads; an idle subscriber
//! holds no read buffer and no parser memory. Control replies (Pong, Close)
//! and error frames go into our capped output queue. Server frames
//! (encoded with tungstenite's frame codec) are unmasked, so a broadcast is
//! encoded once here and the same bytes are queued for every subscriber.

use std::borrow::Cow;
use std::io::Read;

use tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tungstenite::protocol::frame::{CloseFrame, Frame};

use super::buffer::OutQueue;
use super::read::{Got, READ_BUDGET, read_once};
use super::ws_read::{FrameReader, Message, Violation};
use crate::keepalive::Keepalive;
use crate::store::{Cursor, SessionId};
use crate::time::Millis;

/// The most read from the socket at a time, into a buffer on the stack: a
/// client's pong (`{"type":"pong","ts":…}`, about 40 bytes framed) fits in
/// one read, and a rare long message takes a few.
const READ_CHUNK: usize = 2048;
/// Messages read per turn before yielding to other connections (bytes are
/// budgeted too, by the turn's read budget).
const MAX_MESSAGES_PER_TURN: usize = 64;
/// Wire bytes one client message may take, frames and all: a message is at
/// most 64 KiB, and even in one-byte fragments (7 bytes each on the wire)
/// it stays below this.
pub const MAX_WIRE_PER_MESSAGE: usize = 1 << 20;

/// A subscriber's WebSocket state.
pub struct WsState {
    /// The client frames' parser.
    pub reader: FrameReader,
    /// Bytes read but not parsed yet: what followed the upgrade request,
    /// or what a turn that hit its message cap left. Empty, with no
    /// capacity, otherwise.
    pub unread: Box<[u8]>,
    pub sid: SessionId,
    pub keepalive: Keepalive,
    /// Its position in the session's log.
    pub cursor: Cursor,
    /// Not caught up: live messages are not queued on it; it is refilled
    /// from the log when its queue drains.
    pub lagging: bool,
    /// Bytes read since the client's last complete message (at most
    /// [`MAX_WIRE_PER_MESSAGE`] and one read).
    pub wire_since_message: u32,
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
        WsState {
            reader: FrameReader::default(),
            unread: leftover.into_boxed_slice(),
            sid,
            keepalive,
            cursor,
            lagging: true,
            wire_since_message: 0,
            quiet: true,
        }
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

/// The reply to a client's Close: empty, or with the code and reason.
fn encode_close_reply(reply: Option<(u16, Cow<'_, str>)>) -> Vec<u8> {
    encode(Frame::close(reply.map(|(code, reason)| CloseFrame {
        code: CloseCode::from(code),
        reason: reason.into_owned().into(),
    })))
}

/// A Pong echoing a Ping's payload.
fn encode_pong(payload: &[u8]) -> Vec<u8> {
    encode(Frame::pong(payload.to_vec()))
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
/// turn's byte budget or message cap runs out, or the connection must
/// close. Control replies and error frames land in `out`. A client whose
/// message takes more than [`MAX_WIRE_PER_MESSAGE`] bytes on the wire
/// (endless continuation frames, which never complete a message) is closed
/// with 1009.
pub fn read_frames<S: Read>(
    ws: &mut WsState,
    sock: &mut S,
    readable: &mut bool,
    read_closed: bool,
    out: &mut OutQueue,
    now: Millis,
) -> ReadOutcome {
    let mut pass = Pass {
        messages: 0,
        out,
        now,
    };
    let outcome = pass.run(ws, sock, readable, read_closed);
    if !ws.unread.is_empty() && outcome == ReadOutcome::More {
        // Bytes wait in the state: the next pass must run even if the
        // socket has nothing more.
        *readable = true;
    }
    if ws.wire_since_message > 0 && matches!(outcome, ReadOutcome::Drained | ReadOutcome::More) {
        // Part of a message arrived: the peer is alive.
        ws.keepalive.on_receive(now);
    }
    outcome
}

/// One read pass over a subscriber.
struct Pass<'a> {
    /// Messages handled in this pass.
    messages: usize,
    out: &'a mut OutQueue,
    now: Millis,
}

impl Pass<'_> {
    fn run<S: Read>(
        &mut self,
        ws: &mut WsState,
        sock: &mut S,
        readable: &mut bool,
        read_closed: bool,
    ) -> ReadOutcome {
        if !ws.unread.is_empty() {
            let mut unread = std::mem::take(&mut ws.unread);
            let (used, stop) = self.parse(ws, &mut unread);
            if let Some(outcome) = stop {
                if outcome == ReadOutcome::More {
                    ws.unread = unread.get(used..).unwrap_or_default().into();
                }
                return outcome;
            }
        }
        let mut buf = [0u8; READ_CHUNK];
        let mut read = 0;
        loop {
            if !*readable {
                return ReadOutcome::Drained;
            }
            if read >= READ_BUDGET || self.messages >= MAX_MESSAGES_PER_TURN {
                return ReadOutcome::More;
            }
            let max = READ_CHUNK.min(READ_BUDGET - read);
            let n = match read_once(sock, &mut buf[..max], readable, read_closed) {
                Got::Bytes(n) => n,
                Got::Blocked => return ReadOutcome::Drained,
                Got::Eof | Got::Failed => return ReadOutcome::PeerClosed,
            };
            read += n;
            let bytes = &mut buf[..n];
            let (used, stop) = self.parse(ws, bytes);
            if let Some(outcome) = stop {
                if outcome == ReadOutcome::More {
                    ws.unread = bytes.get(used..).unwrap_or_default().into();
                }
                return outcome;
            }
        }
    }

    /// Parses `input` and handles its messages: the bytes consumed, and
    /// why it stopped before the end, if it did.
    fn parse(&mut self, ws: &mut WsState, input: &mut [u8]) -> (usize, Option<ReadOutcome>) {
        let mut pos = 0;
        while pos < input.len() {
            if self.messages >= MAX_MESSAGES_PER_TURN {
                return (pos, Some(ReadOutcome::More));
            }
            let (used, got) = ws.reader.advance(input.get_mut(pos..).unwrap_or_default());
            pos += used;
            ws.wire_since_message = ws.wire_since_message.saturating_add(used as u32);
            match got {
                Err(Violation(code, reason)) => {
                    return (pos, Some(ReadOutcome::Violation(code, reason)));
                }
                Ok(None) => {}
                Ok(Some(message)) => {
                    self.messages += 1;
                    ws.wire_since_message = 0;
                    ws.keepalive.on_receive(self.now);
                    match message {
                        Message::Text(t) => on_text(&t, self.out),
                        Message::Binary => self.out.push_owned(error_frame(
                            "Unsupported message",
                            "binary frames are not accepted",
                        )),
                        Message::Ping(payload) => self.out.push_owned(encode_pong(&payload)),
                        Message::Pong => {}
                        Message::Close(reply) => {
                            self.out.push_owned(encode_close_reply(reply));
                            return (pos, Some(ReadOutcome::PeerClosed));
                        }
                    }
                }
            }
            if ws.wire_since_message as usize > MAX_WIRE_PER_MESSAGE {
                return (pos, Some(ReadOutcome::Violation(1009, "message too big")));
            }
            if used == 0 {
                break;
            }
        }
        (pos, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subscriber holds its state for its whole life, idle or not.
    #[test]
    fn a_websocket_state_stays_small() {
        let size = std::mem::size_of::<WsState>();
        eprintln!(
            "WSSIZE {size} reader {}",
            std::mem::size_of::<FrameReader>()
        );
        assert!(size <= 128, "a WebSocket state is {size} bytes");
    }
}
