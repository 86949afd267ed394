//! What crosses between the loop and the storage thread: owned, plain data
//! (no `Rc`). The loop turns a validated request into a [`Command`]; the
//! storage thread decides it inside its transaction and answers with a
//! [`Done`]: the outcome for the requester and the committed changes
//! ([`Record`]s) for the loop's copy of the log, applied in order. The
//! in-memory engine decides in the same terms ([`Outcome`] and records), so
//! every engine's changes reach the log and the waiting connections on one
//! path. A [`SessionId`] is `Send` (its text is shared by an `Arc`), so the
//! same id the loop holds crosses without a copy.

use super::message::Framed;
use super::types::{Seq, SessionId};
use crate::error::ApiError;
use crate::store::types::Ticket;

/// A write for the storage thread, for the request holding `ticket`.
#[derive(Debug)]
pub struct Command {
    pub ticket: Ticket,
    pub op: Op,
}

/// The writes. Text fields are the validated JSON literals, as sent.
#[derive(Debug)]
pub enum Op {
    Prompt {
        sid: SessionId,
        /// The client's id and its literal, if it gave one.
        id: Option<(String, String)>,
        prompt: String,
        metadata: Option<String>,
        ts: u64,
    },
    Response {
        sid: SessionId,
        client_msg_id: String,
        id: Option<(String, String)>,
        text: String,
        metadata: Option<String>,
        ts: u64,
    },
    /// `PUT /sessions` (`put`), or a WebSocket connect to a session that
    /// does not exist yet.
    Create {
        sid: SessionId,
        put: bool,
    },
    Delete {
        sid: SessionId,
    },
    /// Sessions the loop found idle past the TTL.
    Collect {
        sids: Vec<SessionId>,
    },
}

/// The outcome of one write, for its requester.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Prompt {
        id: String,
        duplicate: bool,
    },
    Response {
        id: String,
        duplicate: bool,
    },
    /// A part of a streamed answer, appended to its draft.
    Part {
        id: String,
    },
    Session {
        sid: SessionId,
        epoch: String,
        created: bool,
        put: bool,
    },
    Deleted,
    Collected,
}

/// A committed change, to apply to the loop's copy of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Created {
        sid: SessionId,
        epoch: String,
    },
    Prompt {
        sid: SessionId,
        seq: Seq,
        ts: u64,
        client_msg_id: String,
        data: String,
    },
    Response {
        sid: SessionId,
        seq: Seq,
        ts: u64,
        client_msg_id: String,
        assistant_msg_id: String,
        /// Written in frame layout, so the loop frames it without a copy.
        data: Framed,
    },
    Deleted {
        sid: SessionId,
    },
}

/// What the storage thread did with one command: committed (or refused
/// with an API error, changing nothing), or lost with its transaction.
#[derive(Debug)]
pub struct Done {
    pub ticket: Ticket,
    pub result: Result<Outcome, ApiError>,
    pub records: Vec<Record>,
}
