//! A stored message. Its `data` object is serialized once, when it is
//! stored; an assistant message keeps it inside its whole WebSocket frame
//! (`{"type":"message","data":…}`), and a cancel inside its own
//! (`{"type":"cancel","data":…}`), so a broadcast, a replay and a refill
//! queue the same shared bytes on every subscriber, and `/messages` copies
//! the `data` slice out of it.

use std::rc::Rc;

use super::types::Seq;
use crate::time::UnixMillis;
use crate::wire::{push_decimal_str, push_json_str, wsframe};

/// Which kind of message a history entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Prompt,
    Assistant,
    /// A prompt stopped by the person waiting (`POST /cancel`): a message
    /// of the log like an answer, sent to subscribers as its frame.
    Cancel,
    /// A question from the agent (`POST /ask`): framed like an answer, as
    /// `{"type":"ask","data":…}`; its `client_msg_id` field holds the
    /// `ask_id`.
    Ask,
    /// The person's reply to an ask (`POST /reply`), framed as
    /// `{"type":"reply","data":…}`; its `client_msg_id` field holds the
    /// `ask_id` it answers.
    Reply,
}

/// The payload of a frame before the `data` object.
const FRAME_PREFIX: &str = "{\"type\":\"message\",\"data\":";
/// The payload of a cancel's frame before the `data` object.
const CANCEL_PREFIX: &str = "{\"type\":\"cancel\",\"data\":";
/// The payload of an ask's frame before the `data` object.
const ASK_PREFIX: &str = "{\"type\":\"ask\",\"data\":";
/// The payload of a reply's frame before the `data` object.
const REPLY_PREFIX: &str = "{\"type\":\"reply\",\"data\":";
/// Room kept in front of a frame's payload for its header (at most 10 bytes).
const HEAD_ROOM: &str = "\0\0\0\0\0\0\0\0\0\0";
/// Where a [`Framed`] answer's `data` object starts.
const FRAMED_DATA_AT: usize = HEAD_ROOM.len() + FRAME_PREFIX.len();

/// An answer's `data` object, written where its WebSocket frame will hold
/// it: after room for the frame's header and its `{"type":"message","data":`
/// prefix, so framing it ([`Message::assistant_framed`]) writes the header
/// in place instead of copying the object once more. Plain owned text: a
/// committed record carries it from the storage thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Framed {
    buf: String,
}

impl Framed {
    fn with_capacity(data_len: usize) -> Framed {
        let mut buf = String::with_capacity(FRAMED_DATA_AT + data_len + 1);
        buf.push_str(HEAD_ROOM);
        buf.push_str(FRAME_PREFIX);
        Framed { buf }
    }

    /// The `data` object.
    pub fn data(&self) -> &str {
        &self.buf[FRAMED_DATA_AT..]
    }
}

impl From<&str> for Framed {
    /// An answer's `data` object as given (restored, or built in a test).
    fn from(data: &str) -> Framed {
        let mut f = Framed::with_capacity(data.len());
        f.buf.push_str(data);
        f
    }
}

/// A message's bytes: a prompt's `data` alone, an assistant message's whole
/// frame (shared with the subscribers' queues).
#[derive(Debug)]
enum Bytes {
    Data(Box<[u8]>),
    Frame(Rc<[u8]>),
}

/// One stored message: its keys and its serialized bytes.
#[derive(Debug)]
pub struct Message {
    pub seq: Seq,
    pub ts: UnixMillis,
    pub kind: Kind,
    /// For a prompt its own id; for an assistant message the prompt it answers.
    pub client_msg_id: Rc<str>,
    /// Only for assistant messages.
    pub assistant_msg_id: Option<Rc<str>>,
    bytes: Bytes,
    /// Where `data` starts in the bytes, and how long it is.
    data_at: u32,
    data_len: u32,
    /// Read back from the database damaged ([`Message::damaged`]).
    damaged: bool,
}

/// The parts of a new message's `data` object, as JSON literals already
/// valid (the validated body's raw values): assembled without decoding.
pub struct Parts<'a> {
    pub session_id: &'a str,
    /// `"client_msg_id"` for a prompt, `"assistant_msg_id"` for an answer.
    pub id_literal: &'a str,
    /// For an answer: the prompt it answers.
    pub prompt_id: Option<&'a str>,
    /// The `prompt` or `text` literal.
    pub text: &'a str,
    pub metadata: Option<&'a str>,
    pub ts: UnixMillis,
    pub seq: Seq,
}

impl Parts<'_> {
    /// `{"session_id",<id>,("client_msg_id",)<text>,"metadata"?,"ts","seq"}`:
    /// the `data` object as a committed record carries it. Every part is
    /// text already, so it is assembled as text, without a UTF-8 check.
    pub fn data(&self) -> String {
        let mut out = String::with_capacity(self.len_hint());
        self.write(&mut out);
        out
    }

    /// The same object, written where an answer's frame holds it.
    pub fn framed(&self) -> Framed {
        let mut f = Framed::with_capacity(self.len_hint());
        self.write(&mut f.buf);
        f
    }

    fn write(&self, out: &mut String) {
        out.push_str("{\"session_id\":\"");
        out.push_str(self.session_id); // unreserved characters only
        match self.prompt_id {
            None => {
                out.push_str("\",\"client_msg_id\":");
                out.push_str(self.id_literal);
                out.push_str(",\"prompt\":");
            }
            Some(prompt_id) => {
                out.push_str("\",\"assistant_msg_id\":");
                out.push_str(self.id_literal);
                out.push_str(",\"client_msg_id\":");
                push_json_str(out, prompt_id);
                out.push_str(",\"text\":");
            }
        }
        out.push_str(self.text);
        if let Some(m) = self.metadata {
            out.push_str(",\"metadata\":");
            out.push_str(m);
        }
        out.push_str(",\"ts\":");
        push_decimal_str(out, self.ts);
        out.push_str(",\"seq\":");
        push_decimal_str(out, self.seq.get());
        out.push('}');
    }

    fn len_hint(&self) -> usize {
        110 + self.session_id.len()
            + self.id_literal.len()
            + self.prompt_id.map_or(0, str::len)
            + self.text.len()
            + self.metadata.map_or(0, str::len)
    }
}

/// A cancel's `data` object: `{"session_id","client_msg_id","reason"?,
/// "ts","seq"}`, `seq` last as in every message (the Redis engine stores
/// what precedes it). `reason` is the literal the client sent, valid JSON
/// already.
pub fn cancel_data(
    session_id: &str,
    client_msg_id: &str,
    reason: Option<&str>,
    ts: UnixMillis,
    seq: Seq,
) -> String {
    let mut out = String::with_capacity(
        80 + session_id.len() + client_msg_id.len() + reason.map_or(0, str::len),
    );
    out.push_str("{\"session_id\":\"");
    out.push_str(session_id); // unreserved characters only
    out.push_str("\",\"client_msg_id\":");
    push_json_str(&mut out, client_msg_id);
    if let Some(r) = reason {
        out.push_str(",\"reason\":");
        out.push_str(r);
    }
    out.push_str(",\"ts\":");
    push_decimal_str(&mut out, ts);
    out.push_str(",\"seq\":");
    push_decimal_str(&mut out, seq.get());
    out.push('}');
    out
}

impl Message {
    /// A prompt, its `data` assembled from `parts` (tests build logs so).
    #[cfg(test)]
    pub fn prompt(client_msg_id: Rc<str>, parts: &Parts) -> Message {
        Message::prompt_with(
            client_msg_id,
            parts.seq,
            parts.ts,
            parts.data().into_bytes(),
        )
    }

    /// A prompt whose `data` object is already serialized (restored, or
    /// committed).
    pub fn prompt_with(client_msg_id: Rc<str>, seq: Seq, ts: UnixMillis, data: Vec<u8>) -> Message {
        Message {
            seq,
            ts,
            kind: Kind::Prompt,
            client_msg_id,
            assistant_msg_id: None,
            data_at: 0,
            data_len: data.len() as u32,
            bytes: Bytes::Data(data.into_boxed_slice()),
            damaged: false,
        }
    }

    /// An assistant message whose `data` object is already serialized
    /// (restored, or committed), framed here: `data` is copied into the
    /// frame, whose bytes every subscriber then shares.
    pub fn assistant_with(
        client_msg_id: Rc<str>,
        assistant_msg_id: Rc<str>,
        seq: Seq,
        ts: UnixMillis,
        data: &[u8],
    ) -> Message {
        let frame = wsframe::text_frame(&[FRAME_PREFIX.as_bytes(), data, b"}"]);
        let data_at = frame.len() - 1 - data.len();
        Message {
            seq,
            ts,
            kind: Kind::Assistant,
            client_msg_id,
            assistant_msg_id: Some(assistant_msg_id),
            data_at: data_at as u32,
            data_len: data.len() as u32,
            bytes: Bytes::Frame(Rc::from(frame)),
            damaged: false,
        }
    }

    /// A cancel whose `data` object is already serialized (restored, or
    /// committed), framed here as `{"type":"cancel","data":…}`: the stored
    /// form is the frame, as an answer's is. `client_msg_id` is the prompt
    /// it stopped.
    pub fn cancel_with(client_msg_id: Rc<str>, seq: Seq, ts: UnixMillis, data: &[u8]) -> Message {
        let frame = wsframe::text_frame(&[CANCEL_PREFIX.as_bytes(), data, b"}"]);
        let data_at = frame.len() - 1 - data.len();
        Message {
            seq,
            ts,
            kind: Kind::Cancel,
            client_msg_id,
            assistant_msg_id: None,
            data_at: data_at as u32,
            data_len: data.len() as u32,
            bytes: Bytes::Frame(Rc::from(frame)),
            damaged: false,
        }
    }

    /// An assistant message from its `data` object written in frame
    /// layout: the header goes into the room left for it, and the frame is
    /// copied once, into the bytes every subscriber then shares.
    pub fn assistant_framed(
        client_msg_id: Rc<str>,
        assistant_msg_id: Rc<str>,
        seq: Seq,
        ts: UnixMillis,
        data: Framed,
    ) -> Message {
        let data_len = data.buf.len() - FRAMED_DATA_AT;
        let mut buf = data.buf.into_bytes();
        buf.push(b'}');
        let mut head = Vec::with_capacity(HEAD_ROOM.len());
        wsframe::text_header(buf.len() - HEAD_ROOM.len(), &mut head);
        let start = HEAD_ROOM.len() - head.len();
        buf[start..HEAD_ROOM.len()].copy_from_slice(&head);
        Message {
            seq,
            ts,
            kind: Kind::Assistant,
            client_msg_id,
            assistant_msg_id: Some(assistant_msg_id),
            data_at: (FRAMED_DATA_AT - start) as u32,
            data_len: data_len as u32,
            bytes: Bytes::Frame(Rc::from(&buf[start..])),
            damaged: false,
        }
    }

    /// An assistant message, its `data` assembled from `parts` (tests build
    /// logs so).
    #[cfg(test)]
    pub fn assistant(client_msg_id: Rc<str>, assistant_msg_id: Rc<str>, parts: &Parts) -> Message {
        let data = parts.data();
        Message::assistant_with(
            client_msg_id,
            assistant_msg_id,
            parts.seq,
            parts.ts,
            data.as_bytes(),
        )
    }

    /// A message whose stored `data` was read back damaged (not UTF-8, or
    /// not a JSON object): its keys hold (its `seq`, ids and kind come from
    /// columns of their own), its bytes are never sent. A page that would
    /// carry it answers `500`; a subscriber gets, in its place, an `error`
    /// frame naming its `seq`.
    pub fn damaged(
        kind: Kind,
        client_msg_id: Rc<str>,
        assistant_msg_id: Option<Rc<str>>,
        seq: Seq,
        ts: UnixMillis,
    ) -> Message {
        let mut text = String::from(
            "{\"type\":\"error\",\"error\":\"Stored message damaged\",\"details\":\"seq ",
        );
        push_decimal_str(&mut text, seq.get());
        text.push_str("\"}");
        Message {
            seq,
            ts,
            kind,
            client_msg_id,
            assistant_msg_id,
            data_at: 0,
            data_len: 0,
            bytes: match kind {
                Kind::Prompt => Bytes::Data(Box::default()),
                Kind::Assistant | Kind::Cancel | Kind::Ask | Kind::Reply => {
                    Bytes::Frame(Rc::from(wsframe::text_frame(&[text.as_bytes()])))
                }
            },
            damaged: true,
        }
    }

    /// Whether this message was read back damaged ([`Message::damaged`]).
    pub fn is_damaged(&self) -> bool {
        self.damaged
    }

    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Data(b) => b,
            Bytes::Frame(f) => f,
        }
    }

    /// The length of the stored frame of a message of `kind` (not a
    /// prompt) whose `data` object is `data_len` bytes: its header, the
    /// kind's prefix, the object and the closing brace.
    pub fn frame_len(kind: Kind, data_len: usize) -> usize {
        let prefix = match kind {
            Kind::Prompt | Kind::Assistant => FRAME_PREFIX,
            Kind::Cancel => CANCEL_PREFIX,
            Kind::Ask => ASK_PREFIX,
            Kind::Reply => REPLY_PREFIX,
        };
        let payload = prefix.len() + data_len + 1;
        wsframe::header_len(payload) + payload
    }

    /// The length of the serialized bytes, and whether they are shared
    /// (an `Rc`, with its counts): what the memory budget weighs.
    pub fn stored_len(&self) -> (usize, bool) {
        match &self.bytes {
            Bytes::Data(b) => (b.len(), false),
            Bytes::Frame(f) => (f.len(), true),
        }
    }

    /// The serialized `data` object.
    pub fn data(&self) -> &[u8] {
        let at = self.data_at as usize;
        &self.bytes()[at..at + self.data_len as usize]
    }

    /// The WebSocket frame of an assistant message or a cancel, shared.
    pub fn frame(&self) -> Option<&Rc<[u8]>> {
        match &self.bytes {
            Bytes::Frame(f) => Some(f),
            Bytes::Data(_) => None,
        }
    }

    /// `{"type":"prompt"|"assistant"|"cancel","data":…}`, as `/messages`
    /// lists it.
    pub fn write_history_entry(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(match self.kind {
            Kind::Prompt => b"{\"type\":\"prompt\",\"data\":",
            Kind::Assistant => b"{\"type\":\"assistant\",\"data\":",
            Kind::Cancel => CANCEL_PREFIX.as_bytes(),
            Kind::Ask => ASK_PREFIX.as_bytes(),
            Kind::Reply => REPLY_PREFIX.as_bytes(),
        });
        out.extend_from_slice(self.data());
        out.push(b'}');
    }
}

/// Asks and replies: messages the person and the agent exchange beside
/// prompts and answers, stored as the frames subscribers get (framed
/// once, as answers are).
impl Message {
    /// An ask (`ask_id`, its `data` already serialized: restored, or
    /// committed), framed as `{"type":"ask","data":…}`.
    pub fn ask_with(ask_id: Rc<str>, seq: Seq, ts: UnixMillis, data: &[u8]) -> Message {
        Message::kind_framed(Kind::Ask, ASK_PREFIX, ask_id, seq, ts, data)
    }

    /// A reply to the ask `ask_id`, framed as `{"type":"reply","data":…}`.
    pub fn reply_with(ask_id: Rc<str>, seq: Seq, ts: UnixMillis, data: &[u8]) -> Message {
        Message::kind_framed(Kind::Reply, REPLY_PREFIX, ask_id, seq, ts, data)
    }

    fn kind_framed(
        kind: Kind,
        prefix: &str,
        id: Rc<str>,
        seq: Seq,
        ts: UnixMillis,
        data: &[u8],
    ) -> Message {
        let frame = wsframe::text_frame(&[prefix.as_bytes(), data, b"}"]);
        let data_at = frame.len() - 1 - data.len();
        Message {
            seq,
            ts,
            kind,
            client_msg_id: id,
            assistant_msg_id: None,
            data_at: data_at as u32,
            data_len: data.len() as u32,
            bytes: Bytes::Frame(Rc::from(frame)),
            damaged: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(text: &str, prompt_id: Option<&'static str>) -> Parts<'static> {
        Parts {
            session_id: "s",
            id_literal: "\"id\"",
            prompt_id,
            text: Box::leak(text.to_string().into_boxed_str()),
            metadata: Some("{\"k\":1}"),
            ts: 7,
            seq: Seq(3),
        }
    }

    #[test]
    fn an_assistant_message_is_its_frame_and_data_is_a_slice_of_it() {
        for len in [10, 300, 70_000] {
            let text = format!("\"{}\"", "y".repeat(len));
            let m =
                Message::assistant(Rc::from("c\"1"), Rc::from("a"), &parts(&text, Some("c\"1")));
            let data: serde_json::Value = serde_json::from_slice(m.data()).unwrap();
            assert_eq!(data["client_msg_id"], "c\"1");
            assert_eq!(data["text"].as_str().map(str::len), Some(len));
            assert_eq!(
                (data["ts"].as_u64(), data["seq"].as_u64()),
                (Some(7), Some(3))
            );
            let frame = m.frame().expect("assistant messages are framed");
            let at = match frame[1] {
                126 => 4,
                127 => 10,
                _ => 2,
            };
            assert_eq!(frame[0], 0x81);
            let v: serde_json::Value = serde_json::from_slice(&frame[at..]).unwrap();
            assert_eq!(v["type"], "message");
            assert_eq!(v["data"], data);
        }
    }

    #[test]
    fn data_writes_every_digit_of_ts_and_seq() {
        for n in [0, 9, 10, 1_700_000_000_000, u64::MAX] {
            let p = Parts {
                ts: n,
                seq: Seq(n),
                ..parts("\"x\"", None)
            };
            let v: serde_json::Value = serde_json::from_str(&p.data()).unwrap();
            assert_eq!((v["ts"].as_u64(), v["seq"].as_u64()), (Some(n), Some(n)));
        }
    }

    #[test]
    fn a_prompt_has_no_frame() {
        let m = Message::prompt(Rc::from("c"), &parts("\"hi\"", None));
        assert!(m.frame().is_none());
        let mut out = Vec::new();
        m.write_history_entry(&mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["type"], "prompt");
        assert_eq!(
            v["data"],
            serde_json::json!({"session_id": "s", "client_msg_id": "id", "prompt": "hi", "metadata": {"k": 1}, "ts": 7, "seq": 3})
        );
    }
}
