//! The keys of the log: [`SessionId`], which session, and [`Seq`], a
//! message's place in its session's history; the validated bodies of the
//! writes and the queries of the reads; the [`Ticket`] a write carries
//! back to the request that asked.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::time::UnixMillis;
use crate::wire::Raw;

/// A session id that passed the contract's rule (1 to 128 characters from
/// `A-Z a-z 0-9 . _ ~ -`, see [`valid_session_id`]): the one way the server
/// holds a session id. Built only by [`SessionId::new`], where a route's
/// path or a body's `session_id` is checked, so every map key, record,
/// effect and connection holding one holds a valid id.
///
/// Inside is an `Arc<str>`. The same id is the key of the log and of local
/// presence, travels in effects, parked polls and subscribers, and crosses
/// to the storage thread in commands and records: a clone must not
/// allocate (`Box<str>` or `String` would copy the text each time) and the
/// value must be `Send` for the storage thread (which rules out `Rc`). An
/// uncontended atomic increment per clone is the price. It borrows as `str`
/// (hashing and comparing as its text), so maps keyed by it are looked up by
/// `&str`, and it derefs to `str` wherever text is wanted.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// The id, if `sid` is a valid one.
    pub fn new(sid: &str) -> Option<SessionId> {
        valid_session_id(sid).then(|| SessionId(Arc::from(sid)))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for SessionId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for SessionId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SessionId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// A message's place in its session's history: 1, 2, 3, … in the order the
/// session's messages were stored, never reused. `Seq(0)` stands before the
/// first message: it is "nothing yet" for a cursor, an `after`, or the
/// previous assistant message of the first one.
///
/// Numbers come in and go out as plain `u64` only at the edges: query
/// strings, JSON, SQL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

impl Seq {
    /// The first message of a session.
    pub const FIRST: Seq = Seq(1);

    /// The number, for the edges (JSON, SQL, logs).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The place after this one. Saturates: an `after` from a query string
    /// may be `u64::MAX`, past anything stored.
    pub fn next(self) -> Seq {
        Seq(self.0.saturating_add(1))
    }

    /// The place before this one (`Seq(0)` stays put): where a cursor stands
    /// to read from `self` on.
    pub fn before(self) -> Seq {
        Seq(self.0.saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_session_id_is_built_only_from_a_valid_id() {
        assert_eq!(SessionId::new("Ab0.-_~").as_deref(), Some("Ab0.-_~"));
        for bad in ["", "a b", "a/b", "é", &"a".repeat(129)] {
            assert!(SessionId::new(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_map_keyed_by_session_id_is_looked_up_by_str() {
        let sid = SessionId::new("s").unwrap();
        let mut m = HashMap::new();
        m.insert(sid.clone(), 1);
        assert_eq!(m.get("s"), Some(&1));
        assert_eq!(format!("{sid} {sid:?}"), "s \"s\"");
    }
}

/// Largest `prompt` or `text`, in bytes (and largest draft of a streamed
/// answer).
pub const MAX_TEXT_BYTES: usize = 128 * 1024;

/// Longest `session_id`.
pub const MAX_SESSION_ID: usize = 128;

/// Whether `sid` is 1 to 128 URL-unreserved characters.
pub fn valid_session_id(sid: &str) -> bool {
    !sid.is_empty()
        && sid.len() <= MAX_SESSION_ID
        && sid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'))
}

/// A validated `POST /prompt` body. Text fields stay raw JSON literals
/// borrowed from the body: they are valid JSON already, so the stored
/// message is assembled from them without decoding and re-escaping.
#[derive(Debug)]
pub struct NewPrompt<'a> {
    pub session_id: SessionId,
    /// The `prompt` string literal, quotes and escapes included.
    pub prompt: Raw<'a>,
    pub client_msg_id: Option<(String, Raw<'a>)>,
    pub metadata: Option<Raw<'a>>,
    pub ts: Option<UnixMillis>,
}

/// A validated `POST /response` body, raw like [`NewPrompt`].
#[derive(Debug)]
pub struct NewResponse<'a> {
    pub session_id: SessionId,
    pub client_msg_id: String,
    /// The `text` string literal, quotes and escapes included.
    pub text: Raw<'a>,
    pub assistant_msg_id: Option<(String, Raw<'a>)>,
    pub metadata: Option<Raw<'a>>,
    pub ts: Option<UnixMillis>,
    /// `"partial": true`: a part of a streamed answer, appended to its
    /// draft (the `assistant_msg_id` is then present).
    pub partial: bool,
}

/// A validated write, as the relay hands it to its engine (see
/// [`Engine::submit`](super::engine::Engine::submit)).
pub enum Write<'a> {
    Prompt(NewPrompt<'a>),
    Response(NewResponse<'a>),
    /// A part of a streamed answer: decided by the loop's copy of the log
    /// unless sessions are shared (drafts are never persisted).
    Part(NewResponse<'a>),
    /// `PUT /sessions` (`put`), or a WebSocket connect to a session this
    /// copy does not hold.
    Create {
        sid: &'a SessionId,
        put: bool,
    },
    Delete {
        sid: &'a str,
    },
}

impl<'a> Write<'a> {
    /// The session the write names.
    pub fn session(&self) -> &str {
        match self {
            Write::Prompt(p) => &p.session_id,
            Write::Response(r) | Write::Part(r) => &r.session_id,
            Write::Create { sid, .. } => sid,
            Write::Delete { sid } => sid,
        }
    }

    /// `POST /response`: a part of a streamed answer, or an answer.
    pub fn answer(r: NewResponse<'a>) -> Write<'a> {
        if r.partial {
            Write::Part(r)
        } else {
            Write::Response(r)
        }
    }
}

/// A [`Write`] as it crosses to the storage thread: its texts owned, its
/// time fixed. [`write`](Self::write) gives the rules the same [`Write`]
/// back, borrowed from it, so the thread decides it as the loop would.
#[derive(Debug)]
pub enum OwnedWrite {
    Prompt {
        sid: SessionId,
        /// The client's id and its literal, if it gave one.
        id: Option<(String, String)>,
        prompt: String,
        metadata: Option<String>,
        ts: UnixMillis,
    },
    Response {
        sid: SessionId,
        client_msg_id: String,
        id: Option<(String, String)>,
        text: String,
        metadata: Option<String>,
        ts: UnixMillis,
        partial: bool,
    },
    Create {
        sid: SessionId,
        put: bool,
    },
    Delete {
        sid: String,
    },
}

impl OwnedWrite {
    /// `w`, owned; a write without its time gets `unix_ms`.
    pub fn of(w: &Write, unix_ms: UnixMillis) -> OwnedWrite {
        let owned = |(id, raw): &(String, Raw)| (id.clone(), raw.get().to_string());
        let text = |raw: &Option<Raw>| raw.as_ref().map(|m| m.get().to_string());
        match w {
            Write::Prompt(p) => OwnedWrite::Prompt {
                sid: p.session_id.clone(),
                id: p.client_msg_id.as_ref().map(owned),
                prompt: p.prompt.get().to_string(),
                metadata: text(&p.metadata),
                ts: p.ts.unwrap_or(unix_ms),
            },
            Write::Response(r) | Write::Part(r) => OwnedWrite::Response {
                sid: r.session_id.clone(),
                client_msg_id: r.client_msg_id.clone(),
                id: r.assistant_msg_id.as_ref().map(owned),
                text: r.text.get().to_string(),
                metadata: text(&r.metadata),
                ts: r.ts.unwrap_or(unix_ms),
                partial: r.partial,
            },
            Write::Create { sid, put } => OwnedWrite::Create {
                sid: (*sid).clone(),
                put: *put,
            },
            Write::Delete { sid } => OwnedWrite::Delete {
                sid: sid.to_string(),
            },
        }
    }

    /// The write, borrowed from this one (a response's id moves out).
    pub fn write(&mut self) -> Write<'_> {
        fn borrowed((id, lit): &(String, String)) -> (String, Raw<'_>) {
            (id.clone(), Raw::new(lit))
        }
        match self {
            OwnedWrite::Prompt {
                sid,
                id,
                prompt,
                metadata,
                ts,
            } => Write::Prompt(NewPrompt {
                session_id: sid.clone(),
                prompt: Raw::new(prompt),
                client_msg_id: id.as_ref().map(borrowed),
                metadata: metadata.as_deref().map(Raw::new),
                ts: Some(*ts),
            }),
            OwnedWrite::Response {
                sid,
                client_msg_id,
                id,
                text,
                metadata,
                ts,
                partial,
            } => Write::answer(NewResponse {
                session_id: sid.clone(),
                client_msg_id: std::mem::take(client_msg_id),
                text: Raw::new(text),
                assistant_msg_id: id.as_ref().map(borrowed),
                metadata: metadata.as_deref().map(Raw::new),
                ts: Some(*ts),
                partial: *partial,
            }),
            OwnedWrite::Create { sid, put } => Write::Create { sid, put: *put },
            OwnedWrite::Delete { sid } => Write::Delete { sid },
        }
    }
}

/// A connection's identity: slab key plus a generation, so a stale reference
/// to a reused slot never reaches the next connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub key: u32,
    pub generation: u32,
}

/// One request's claim on the result of its write: the connection it came
/// on and a number no other request shares. A result reaches the
/// connection only while it still waits under the same number, so a result
/// that comes after its request was answered (a storage timeout, a
/// shutdown) never becomes the answer to the next request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub conn: ConnId,
    pub n: u64,
}

/// `GET /prompts` parameters, already validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptsQuery {
    pub timeout_ms: u64,
    pub wait: bool,
    pub after: Option<Seq>,
}

/// `GET /messages` parameters, already validated and clamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessagesQuery {
    pub limit: usize,
    pub offset: usize,
    pub since: Option<u64>,
    pub after: Option<Seq>,
}
