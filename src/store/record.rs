//! What crosses between the loop and the storage thread: owned, plain data
//! (no `Rc`). The loop turns a validated request into a [`Command`]; the
//! storage thread decides it inside its transaction and answers with a
//! [`Done`]: the outcome for the requester and the committed changes
//! ([`Record`]s) for the loop's copy of the log, applied in order. The
//! in-memory engine decides in the same terms ([`Outcome`] and records), so
//! every engine's changes reach the log and the waiting connections on one
//! path. A [`SessionId`] is `Send` (its text is shared by an `Arc`), so the
//! same id the loop holds crosses without a copy.

use serde::Serialize;

use super::message::{Framed, Kind};
use super::types::{Seq, SessionId};
use crate::error::ApiError;
use crate::store::model::Write;
use crate::store::types::Ticket;
use crate::wire::{push_json_str, to_json};

/// A write for the storage thread, for the request holding `ticket`.
#[derive(Debug)]
pub struct Command {
    pub ticket: Ticket,
    pub op: Op,
    /// The loop's wall clock when the write was asked (the thread reads
    /// none): what an ask's expiry is measured against.
    pub unix_ms: u64,
    /// The loop's copy does not hold the write's session: the session as
    /// it stood before the write comes back with its answer
    /// ([`Done::images`]), so the records apply to a session the copy
    /// holds.
    pub load: bool,
}

/// What the storage thread is sent.
#[derive(Debug)]
pub enum Op {
    /// A client's write, owned ([`Write::into_owned`]).
    Write(Write<'static>),
    /// Sessions the loop found idle past the TTL.
    Collect { sids: Vec<SessionId> },
    /// A read of `sid`, which the loop's copy does not hold, waits: the
    /// session whole, if it exists ([`Outcome::Loaded`]).
    Load { sid: SessionId },
    /// At start, while the loop's copy holds no session: every session
    /// with a pending prompt whole (the all-sessions poll lists them from
    /// the loop's copy); the ids follow ([`Outcome::Warmed`], then
    /// [`Op::Dormant`]).
    Warm,
    /// The start's reading, on: the next ids of the sessions the file
    /// holds, after the `sessions` row `after` ([`Outcome::Warmed`]).
    Dormant { after: i64 },
}

/// The outcome of one write, for its requester. A prompt or an answer
/// names its session and its `seq` (`Seq(0)` for a resend: its place is
/// not looked up), so that what was stored is counted and logged from the
/// outcome, whichever engine decided it.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Prompt {
        sid: SessionId,
        id: String,
        seq: Seq,
        duplicate: bool,
    },
    Response {
        sid: SessionId,
        id: String,
        seq: Seq,
        duplicate: bool,
    },
    /// A part of a streamed answer, appended to its draft.
    Part {
        id: String,
    },
    /// A prompt cancelled: `seq` is the cancel's (the stored one's for a
    /// resend).
    Cancel {
        sid: SessionId,
        id: String,
        seq: Seq,
        duplicate: bool,
    },
    /// An ask stored (`seq` its own), or one stored already under its
    /// `ask_id` with the same text and choices (`seq` the stored one's).
    Ask {
        sid: SessionId,
        id: String,
        seq: Seq,
        expires_ts: u64,
        duplicate: bool,
    },
    /// A reply stored, or the same reply again (`seq` the stored one's).
    Reply {
        sid: SessionId,
        ask_id: String,
        seq: Seq,
        duplicate: bool,
    },
    Session {
        sid: SessionId,
        epoch: String,
        created: bool,
        put: bool,
    },
    Deleted {
        sid: SessionId,
    },
    Collected,
    /// A session read for the loop ([`Op::Load`]); it is in the images.
    Loaded,
    /// The start's reading ([`Op::Warm`], [`Op::Dormant`]): sessions
    /// known by id, and the `sessions` row to list more after, while
    /// there are more.
    Warmed {
        dormant: Vec<SessionId>,
        next: Option<i64>,
    },
}

impl Outcome {
    /// The requester's answer: `delivered` says whether an answer reached
    /// a subscriber connected here. A sweep has no requester: its body is
    /// empty and never sent.
    pub fn ack(&self, delivered: bool) -> Vec<u8> {
        match self {
            Outcome::Prompt { id, duplicate, .. } => prompt_ack(id, *duplicate),
            Outcome::Response {
                id,
                duplicate: true,
                ..
            } => duplicate_ack(id),
            Outcome::Response { id, .. } => response_ack(id, delivered),
            Outcome::Part { id } => partial_ack(id, delivered),
            Outcome::Cancel { seq, duplicate, .. } => cancel_ack(*seq, *duplicate),
            Outcome::Ask {
                id,
                seq,
                expires_ts,
                duplicate,
                ..
            } => ask_ack(id, *seq, *expires_ts, *duplicate),
            Outcome::Reply { seq, duplicate, .. } => reply_ack(*seq, *duplicate),
            Outcome::Session {
                sid,
                epoch,
                created,
                ..
            } => put_ack(sid, epoch, *created),
            Outcome::Deleted { .. } => b"{\"deleted\":true}".to_vec(),
            Outcome::Collected | Outcome::Loaded | Outcome::Warmed { .. } => Vec::new(),
        }
    }
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
    /// A prompt cancelled: `client_msg_id` is the prompt's, `data` the
    /// cancel's `data` object.
    Cancel {
        sid: SessionId,
        seq: Seq,
        ts: u64,
        client_msg_id: String,
        data: String,
    },
    /// An ask stored: `data` is its `data` object (with its `expires_ts`).
    Ask {
        sid: SessionId,
        seq: Seq,
        ts: u64,
        ask_id: String,
        data: String,
    },
    /// A reply to the ask `ask_id` stored: `data` is its `data` object.
    Reply {
        sid: SessionId,
        seq: Seq,
        ts: u64,
        ask_id: String,
        data: String,
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
    /// Sessions read whole for the loop's copy, taken before the records
    /// (a [`Command::load`] write's session as it stood before it, a
    /// load's, the start's): the copy takes each it does not hold.
    pub images: Vec<SessionImage>,
}

impl Done {
    /// A command answered with `result` and nothing else.
    pub fn only(ticket: Ticket, result: Result<Outcome, ApiError>) -> Done {
        Done {
            ticket,
            result,
            records: Vec::new(),
            images: Vec::new(),
        }
    }
}

/// `{"ok":true,"assistant_msg_id":…,"delivered":…}`, the answer to a stored
/// `POST /response`.
fn response_ack(assistant_msg_id: &str, delivered: bool) -> Vec<u8> {
    ack_with(assistant_msg_id, delivered, "")
}

/// The answer to a resent `POST /response`.
fn duplicate_ack(assistant_msg_id: &str) -> Vec<u8> {
    ack_with(assistant_msg_id, false, ",\"duplicate\":true")
}

/// The answer to a part of a streamed answer.
pub fn partial_ack(assistant_msg_id: &str, delivered: bool) -> Vec<u8> {
    ack_with(assistant_msg_id, delivered, ",\"partial\":true")
}

/// A `POST /response` answer with `more` fields after `delivered`.
fn ack_with(assistant_msg_id: &str, delivered: bool, more: &str) -> Vec<u8> {
    let mut ack = String::with_capacity(64 + assistant_msg_id.len() + more.len());
    ack.push_str("{\"ok\":true,\"assistant_msg_id\":");
    push_json_str(&mut ack, assistant_msg_id);
    ack.push_str(if delivered {
        ",\"delivered\":true"
    } else {
        ",\"delivered\":false"
    });
    ack.push_str(more);
    ack.push('}');
    ack.into_bytes()
}

/// `{"ok":true,"cancelled":true,"seq":…}`, plus `"duplicate":true` for a
/// prompt cancelled already (`seq` is then the stored cancel's).
fn cancel_ack(seq: Seq, duplicate: bool) -> Vec<u8> {
    let mut ack = String::with_capacity(64);
    ack.push_str("{\"ok\":true,\"cancelled\":true,\"seq\":");
    crate::wire::push_decimal_str(&mut ack, seq.get());
    ack.push_str(if duplicate {
        ",\"duplicate\":true}"
    } else {
        "}"
    });
    ack.into_bytes()
}

/// `{"ok":true,"ask_id":…,"seq":…,"expires_ts":…}`, plus
/// `"duplicate":true` for an ask stored already.
fn ask_ack(ask_id: &str, seq: Seq, expires_ts: u64, duplicate: bool) -> Vec<u8> {
    let mut ack = String::with_capacity(80 + ask_id.len());
    ack.push_str("{\"ok\":true,\"ask_id\":");
    push_json_str(&mut ack, ask_id);
    ack.push_str(",\"seq\":");
    crate::wire::push_decimal_str(&mut ack, seq.get());
    ack.push_str(",\"expires_ts\":");
    crate::wire::push_decimal_str(&mut ack, expires_ts);
    ack.push_str(if duplicate {
        ",\"duplicate\":true}"
    } else {
        "}"
    });
    ack.into_bytes()
}

/// `{"ok":true,"seq":…}`, plus `"duplicate":true` for the same reply again.
fn reply_ack(seq: Seq, duplicate: bool) -> Vec<u8> {
    let mut ack = String::with_capacity(48);
    ack.push_str("{\"ok\":true,\"seq\":");
    crate::wire::push_decimal_str(&mut ack, seq.get());
    ack.push_str(if duplicate {
        ",\"duplicate\":true}"
    } else {
        "}"
    });
    ack.into_bytes()
}

/// `{"session_id":…,"epoch":…,"created":…}`, the answer to `PUT /sessions`.
fn put_ack(sid: &str, epoch: &str, created: bool) -> Vec<u8> {
    #[derive(Serialize)]
    struct Put<'a> {
        session_id: &'a str,
        epoch: &'a str,
        created: bool,
    }
    to_json(&Put {
        session_id: sid,
        epoch,
        created,
    })
}

/// `{"stored":true,"client_msg_id":…}`, plus `"duplicate":true` for a resend.
/// Written by hand, as serde writes it: it is every prompt's answer.
fn prompt_ack(id: &str, duplicate: bool) -> Vec<u8> {
    let mut ack = String::with_capacity(56 + id.len());
    ack.push_str("{\"stored\":true,\"client_msg_id\":");
    push_json_str(&mut ack, id);
    ack.push_str(if duplicate {
        ",\"duplicate\":true}"
    } else {
        "}"
    });
    ack.into_bytes()
}

/// One stored message, as its row holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRow {
    pub seq: Seq,
    pub kind: Kind,
    /// The prompt's id (an answer's and a cancel's prompt; an ask's and a
    /// reply's `ask_id`).
    pub client_msg_id: String,
    /// An answer's own id.
    pub assistant_msg_id: Option<String>,
    pub ts: u64,
    /// The `data` object as stored, or `None` when it was read back
    /// damaged (kept for its columns, never sent).
    pub data: Option<Vec<u8>>,
}

/// A session read whole, as the storage thread sends it to the loop's
/// copy: its counters and every message the log retains (history, and
/// below it pending prompts and unanswered asks), in `seq` order.
/// Replayed with the same history limit
/// ([`into_log`](SessionImage::into_log), in `image.rs`) they give the
/// same history, pending set, dedupe window and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionImage {
    pub sid: SessionId,
    pub epoch: String,
    /// The next `seq`, the newest framed message's, the newest answer
    /// trimmed: the floor the rows raise, as at a restore.
    pub counters: (Seq, Seq, Seq),
    pub rows: Vec<StoredRow>,
}
