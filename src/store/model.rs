//! The writes, as a client sends them and as the engines take them: each
//! request body validated into its type ([`NewPrompt`], [`NewResponse`]),
//! the [`Write`] the relay hands its engine, and the [`OwnedWrite`] that
//! crosses to the storage thread. A new write is declared here once; its
//! body's validation lives in `validate.rs`.
//!
//! Stored messages keep their serialized `data` object, so replays, fetches
//! and history concatenate bytes instead of serializing again.

use crate::store::SessionId;
pub use crate::store::types::{MAX_SESSION_ID, valid_session_id};
use crate::time::UnixMillis;
use crate::wire::Raw;

mod metadata_check;
mod scan;
mod validate;
pub use metadata_check::MAX_METADATA_DEPTH;

pub use crate::store::types::MAX_TEXT_BYTES;
/// Largest `client_msg_id` or `assistant_msg_id`, in bytes.
pub const MAX_ID_BYTES: usize = 256;

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
/// [`Engine::submit`](crate::store::engine::Engine::submit)).
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
