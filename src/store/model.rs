//! The writes, as a client sends them and as the engines take them: each
//! request body validated into its type ([`NewPrompt`], [`NewResponse`],
//! [`NewCancel`]),
//! and the [`Write`] the relay hands its engine. A new write is declared
//! here once; its body's validation lives in `validate.rs`.
//!
//! A write borrows its texts from the request body on the loop's path (no
//! copy between the socket's bytes and the stored message) and owns them
//! where it crosses to the storage thread ([`Write::into_owned`]): one type,
//! so the rules decide the same write wherever they run.

use std::borrow::Cow;

use crate::store::SessionId;
pub use crate::store::types::{MAX_SESSION_ID, valid_session_id};
use crate::time::UnixMillis;

mod metadata_check;
mod scan;
mod validate;
pub use metadata_check::MAX_METADATA_DEPTH;

pub use crate::store::types::MAX_TEXT_BYTES;
/// Largest `client_msg_id` or `assistant_msg_id`, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// A message id as the client sent it: decoded, and its JSON literal
/// spelled as sent (quotes and escapes included), both borrowed from the
/// body when they can be.
pub type GivenId<'a> = (Cow<'a, str>, Cow<'a, str>);

/// A validated `POST /prompt` body. Text fields stay raw JSON literals
/// borrowed from the body: they are valid JSON already, so the stored
/// message is assembled from them without decoding and re-escaping.
#[derive(Debug, Clone)]
pub struct NewPrompt<'a> {
    pub session_id: SessionId,
    /// The `prompt` string literal, quotes and escapes included.
    pub prompt: Cow<'a, str>,
    pub client_msg_id: Option<GivenId<'a>>,
    /// The `metadata` object literal.
    pub metadata: Option<Cow<'a, str>>,
    pub ts: Option<UnixMillis>,
}

/// A validated `POST /response` body, raw like [`NewPrompt`].
#[derive(Debug, Clone)]
pub struct NewResponse<'a> {
    pub session_id: SessionId,
    /// The prompt it answers, decoded.
    pub client_msg_id: Cow<'a, str>,
    /// The `text` string literal, quotes and escapes included.
    pub text: Cow<'a, str>,
    pub assistant_msg_id: Option<GivenId<'a>>,
    pub metadata: Option<Cow<'a, str>>,
    pub ts: Option<UnixMillis>,
    /// `"partial": true`: a part of a streamed answer, appended to its
    /// draft (the `assistant_msg_id` is then present).
    pub partial: bool,
}

/// Longest `reason` of a cancel, in bytes once decoded.
pub const MAX_REASON_BYTES: usize = 256;

/// A validated `POST /cancel` body: the prompt to stop, and why.
#[derive(Debug, Clone)]
pub struct NewCancel<'a> {
    pub session_id: SessionId,
    /// The prompt it stops, decoded.
    pub client_msg_id: Cow<'a, str>,
    /// The `reason` string literal, quotes and escapes included.
    pub reason: Option<Cow<'a, str>>,
    /// The body has no `ts`: set when the write crosses to the storage
    /// thread ([`Write::into_owned`]), else the cancel's time is the
    /// decision's.
    pub ts: Option<UnixMillis>,
}

/// Most choices an ask offers, and the longest one, in bytes.
pub const MAX_CHOICES: usize = 8;
pub const MAX_CHOICE_BYTES: usize = 256;
/// An ask's `timeout`, in seconds: its default and its bounds.
pub const ASK_TIMEOUT_S: (u64, u64, u64) = (300, 1, 86_400);

/// A validated `POST /ask` body: a question from the agent. `text`,
/// `default` and `metadata` stay the literals sent; the ids and choices are
/// decoded (compared, and written back as literals of their own).
#[derive(Debug, Clone)]
pub struct NewAsk<'a> {
    pub session_id: SessionId,
    pub ask_id: Option<GivenId<'a>>,
    /// The prompt it is about, decoded.
    pub client_msg_id: Option<Cow<'a, str>>,
    /// The `text` string literal.
    pub text: Cow<'a, str>,
    /// Decoded, distinct, in the order sent.
    pub choices: Option<Vec<Cow<'a, str>>>,
    /// The `default` string literal (with choices, one of them).
    pub default: Option<Cow<'a, str>>,
    /// How long the ask stays open, from when it is stored.
    pub timeout_ms: u64,
    pub metadata: Option<Cow<'a, str>>,
}

/// A validated `POST /reply` body: the person's answer to an ask.
#[derive(Debug, Clone)]
pub struct NewReply<'a> {
    pub session_id: SessionId,
    /// The ask it answers, decoded.
    pub ask_id: Cow<'a, str>,
    /// The `text` string literal.
    pub text: Cow<'a, str>,
}

/// A validated write, as the relay hands it to its engine (see
/// [`Engine::submit`](crate::store::engine::Engine::submit)) and as
/// [`MemStore::decide`](crate::store::MemStore::decide) decides it.
#[derive(Debug, Clone)]
pub enum Write<'a> {
    Prompt(NewPrompt<'a>),
    Response(NewResponse<'a>),
    /// A part of a streamed answer: decided by the log's rules like any
    /// write (it changes no log), then appended to its draft, which no
    /// engine but Redis keeps.
    Part(NewResponse<'a>),
    /// `POST /cancel`: a prompt stopped, a message of the log.
    Cancel(NewCancel<'a>),
    /// `POST /ask`: a question from the agent, a message of the log and
    /// open until replied to or past its `expires_ts`.
    Ask(NewAsk<'a>),
    /// `POST /reply`: the first reply to an ask closes it.
    Reply(NewReply<'a>),
    /// `PUT /sessions` (`put`), or a WebSocket connect to a session this
    /// copy does not hold.
    Create {
        sid: Cow<'a, SessionId>,
        put: bool,
    },
    Delete {
        sid: Cow<'a, str>,
    },
}

impl<'a> Write<'a> {
    /// The session the write names.
    pub fn session(&self) -> &str {
        match self {
            Write::Prompt(p) => &p.session_id,
            Write::Response(r) | Write::Part(r) => &r.session_id,
            Write::Cancel(c) => &c.session_id,
            Write::Ask(a) => &a.session_id,
            Write::Reply(r) => &r.session_id,
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

    /// The write as it crosses to the storage thread: every text owned,
    /// and its time fixed (`unix_ms` for a message that came without a
    /// `ts`), since the thread reads no clock.
    pub fn into_owned(self, unix_ms: UnixMillis) -> Write<'static> {
        match self {
            Write::Prompt(p) => Write::Prompt(NewPrompt {
                session_id: p.session_id,
                prompt: owned(p.prompt),
                client_msg_id: p.client_msg_id.map(owned_id),
                metadata: p.metadata.map(owned),
                ts: Some(p.ts.unwrap_or(unix_ms)),
            }),
            Write::Response(r) => Write::Response(r.into_owned(unix_ms)),
            Write::Part(r) => Write::Part(r.into_owned(unix_ms)),
            Write::Cancel(c) => Write::Cancel(NewCancel {
                session_id: c.session_id,
                client_msg_id: owned(c.client_msg_id),
                reason: c.reason.map(owned),
                ts: Some(c.ts.unwrap_or(unix_ms)),
            }),
            Write::Ask(a) => Write::Ask(NewAsk {
                session_id: a.session_id,
                ask_id: a.ask_id.map(owned_id),
                client_msg_id: a.client_msg_id.map(owned),
                text: owned(a.text),
                choices: a.choices.map(|c| c.into_iter().map(owned).collect()),
                default: a.default.map(owned),
                timeout_ms: a.timeout_ms,
                metadata: a.metadata.map(owned),
            }),
            Write::Reply(r) => Write::Reply(NewReply {
                session_id: r.session_id,
                ask_id: owned(r.ask_id),
                text: owned(r.text),
            }),
            Write::Create { sid, put } => Write::Create {
                sid: Cow::Owned(sid.into_owned()),
                put,
            },
            Write::Delete { sid } => Write::Delete { sid: owned(sid) },
        }
    }
}

impl NewResponse<'_> {
    /// This body, borrowed: what the rules read of a part while the relay
    /// keeps the part for its draft.
    pub fn view(&self) -> NewResponse<'_> {
        NewResponse {
            session_id: self.session_id.clone(),
            client_msg_id: Cow::Borrowed(&self.client_msg_id),
            text: Cow::Borrowed(&self.text),
            assistant_msg_id: self
                .assistant_msg_id
                .as_ref()
                .map(|(id, lit)| (Cow::Borrowed(&**id), Cow::Borrowed(&**lit))),
            metadata: self.metadata.as_deref().map(Cow::Borrowed),
            ts: self.ts,
            partial: self.partial,
        }
    }

    fn into_owned(self, unix_ms: UnixMillis) -> NewResponse<'static> {
        NewResponse {
            session_id: self.session_id,
            client_msg_id: owned(self.client_msg_id),
            text: owned(self.text),
            assistant_msg_id: self.assistant_msg_id.map(owned_id),
            metadata: self.metadata.map(owned),
            ts: Some(self.ts.unwrap_or(unix_ms)),
            partial: self.partial,
        }
    }
}

fn owned(text: Cow<'_, str>) -> Cow<'static, str> {
    Cow::Owned(text.into_owned())
}

fn owned_id((id, lit): GivenId<'_>) -> GivenId<'static> {
    (owned(id), owned(lit))
}
