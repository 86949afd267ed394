//! The seam's vocabulary: what the relay and every engine say to each
//! other, below every engine, so that no engine names another or the
//! dispatcher (`engine.rs`), and the relay names no engine to use them.
//!
//! - a write handed over is decided now or waited for ([`Submit`]); a
//!   read may have to wait first ([`Read`]); the idle sweep's sessions are
//!   deleted, forgotten or sent ([`Collect`]); a requester that stops
//!   waiting learns what became of its write ([`Abandon`]);
//! - what the engine has for the relay, in order ([`StoreEvent`]), with
//!   the live state other instances share ([`AgentState`],
//!   [`DraftState`]);
//! - what the engine asks of the relay: the sessions waited on here
//!   ([`Waited`]);
//! - this instance's agent in a session, as the engine tells the other
//!   instances of it ([`AgentHere`], [`Announced`]);
//! - the storage's totals for `/metrics` ([`StoreStats`]).

use super::SessionLog;
use super::record::{Outcome, Record};
pub use super::types::Scope;
use super::types::{ConnId, PromptsQuery, Seq, SessionId, Ticket};
use crate::error::ApiError;
use crate::histogram::Histogram;

/// The connection a write for nobody (the idle sweep) is from.
pub const NOBODY: ConnId = ConnId {
    key: u32::MAX,
    generation: 0,
};

/// What the engine did with a write.
#[derive(Debug, PartialEq, Eq)]
pub enum Submit {
    /// Decide it on the copy now (the copy is the engine's state, or
    /// already holds what the write needs, or it is a part of a streamed
    /// answer decided in memory).
    Decide,
    /// Taken under the ticket: its answer comes as an event.
    Wait,
    /// Decided on the copy, but not yet: the copy does not hold the
    /// write's session, which is read first under the ticket; the write
    /// is decided when [`StoreEvent::Retry`] says it is there.
    Load,
}

/// What a read is, for [`Engine::before_read`](super::engine::Engine::before_read).
pub enum Read<'q> {
    Plain,
    /// `GET /prompts`: a poll that would park needs no wait where the
    /// copy follows the session's changes as they are published.
    Poll(&'q PromptsQuery),
    /// A WebSocket upgrade: the session's changes are heard from the
    /// read on, not from the subscription after it.
    Subscribe,
}

/// What the idle sweep does with the sessions nobody here used lately.
pub enum Collect {
    /// Deleted now (the copy is the whole state).
    Delete(Vec<SessionId>),
    /// Forgotten here; the engine keeps them (and deletes them past the
    /// TTL itself).
    Forget(Vec<SessionId>),
    /// Sent to the engine, whose committed deletions come as events.
    Sent,
}

/// The sessions someone waits on here (parked polls, subscribers), as the
/// engine asks about them.
pub trait Waited {
    fn waits_on(&self, sid: &str) -> bool;
    /// How many sessions are waited on.
    fn count(&self) -> usize;
    /// Each session waited on, and whether it has subscribers here.
    fn each(&self, f: &mut dyn FnMut(&SessionId, bool));
}

/// What an engine has for the relay, in order.
#[derive(Debug)]
pub enum StoreEvent {
    /// Committed changes (this instance's writes, or other instances'),
    /// applied to the copy and what waits on it here, in order.
    Records(Vec<Record>),
    /// A session read whole replaces its copy; with `refill`, what waits
    /// on it here reads it again (when true, a new epoch: subscribers
    /// after a `resync` frame, parked polls from its first prompt).
    Replaced {
        sid: SessionId,
        log: Box<SessionLog>,
        refill: Option<bool>,
    },
    /// A session read back whole: the copy takes it if it does not hold
    /// it (one it holds has followed every change since, and is as new).
    Loaded {
        sid: SessionId,
        log: Box<SessionLog>,
    },
    /// Sessions the engine holds that were not read into the copy at
    /// start (the copy knows them by id, for their idle time): `first`
    /// once the copy holds what it needs at start (every pending prompt),
    /// then the rest of them, a list at a time.
    Dormant { sids: Vec<SessionId>, first: bool },
    /// The answer to a ticket: its `records` are applied first. It was
    /// `delivered` to a subscriber if an answer among them went to one
    /// here, or if the engine says one elsewhere has it.
    Answer {
        to: Ticket,
        records: Vec<Record>,
        result: Result<Outcome, ApiError>,
        delivered: bool,
    },
    /// Run the request again: what it waited for (its session, a read's
    /// barrier) is in the copy now.
    Retry(Ticket),
    /// The engine lost every session (Redis restarted empty or was
    /// flushed): the copies are dropped, and the sessions waited on here
    /// are read again ([`Engine::reread`](super::engine::Engine::reread)).
    Lost,
    /// A part of a streamed answer appended on another instance.
    Part {
        sid: SessionId,
        assistant_msg_id: String,
        client_msg_id: String,
        part: u32,
        lit: String,
    },
    /// Another instance's agent state in a session (an engine hands over
    /// no echo of this instance's own).
    Agent { sid: SessionId, state: AgentState },
    /// Prompts an agent fetched through another instance.
    Receipts {
        sid: SessionId,
        ts: u64,
        ids: Vec<String>,
    },
    /// The answer to an all-sessions read (`to` is the read's ticket):
    /// the pending prompts it lists, oldest arrival first.
    EveryPage {
        to: Ticket,
        result: Result<EveryRead, ApiError>,
    },
    /// A prompt of `sid` became pending, on any instance: the
    /// all-sessions polls parked here that cover it read again.
    Arrived { sid: SessionId },
    /// Arrivals are heard from now on (again): every all-sessions poll
    /// parked here reads again, for what arrived while they were not.
    EveryAgain,
    /// Another instance's agent of every session a scope covers.
    EveryAgent(EveryAgentState),
    /// Every other instance's agents of every session, read whole: they
    /// replace those held.
    EveryAgents(Vec<EveryAgentState>),
    /// An agent stopped in every session `scope` covers, through
    /// another instance (`DELETE /agent`).
    AgentStopped(Scope),
    /// A session's open drafts and the other instances' agent states,
    /// read with it.
    LiveRead {
        sid: SessionId,
        drafts: Vec<DraftState>,
        agents: Vec<AgentState>,
    },
}

/// What became of a write whose requester stopped waiting for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abandon {
    /// The storage had not taken it yet, and now never will: answering
    /// `503` is the truth.
    Cancelled,
    /// The storage holds it (a transaction being committed, a script sent
    /// to Redis): only the storage can say whether it is stored.
    InFlight,
}

/// What the storage did since start, for `/metrics`: calls sent (or
/// commands committed), errors, and with a data directory its commits and
/// how long they took.
#[derive(Clone, Debug, Default)]
pub struct StoreStats {
    pub commits: u64,
    pub commands: u64,
    pub errors: u64,
    pub commit_time: Histogram,
}

/// An open draft as another instance holds it, read with its session.
#[derive(Debug, PartialEq, Eq)]
pub struct DraftState {
    pub assistant_msg_id: String,
    pub client_msg_id: String,
    pub parts: u32,
    pub bytes: usize,
    /// Unix ms.
    pub deadline: u64,
    /// The text as the inside of a JSON string literal.
    pub escaped: String,
}

/// One instance's agent state in a session.
#[derive(Debug, PartialEq, Eq)]
pub struct AgentState {
    pub instance: String,
    /// Online until then (unix ms).
    pub until: u64,
    pub seen: u64,
}

/// What an all-sessions read found.
#[derive(Debug, Default)]
pub struct EveryRead {
    pub listed: Vec<Listed>,
    /// The read looked at as many prompts as one read may without
    /// finding one it covers: the arrival number to read on after.
    pub resume: Option<u64>,
}

/// A pending prompt an all-sessions read lists.
#[derive(Debug)]
pub struct Listed {
    /// Its arrival number (the cursor).
    pub n: u64,
    pub sid: SessionId,
    pub seq: Seq,
    pub client_msg_id: String,
    /// The prompt's message.
    pub data: String,
}

/// Another instance's agent of every session `scope` covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EveryAgentState {
    pub instance: String,
    pub scope: Scope,
    /// Online until then (unix ms); 0: offline.
    pub until: u64,
    pub seen: u64,
    /// A poll of it is parked there (not only in its grace).
    pub parked: bool,
}

/// This instance's agent in a session, for the engine to tell the other
/// instances that serve it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentHere {
    /// A poll of it is parked here: online for as long as it stays.
    Parked,
    /// Online until then (unix ms): the grace after its last request.
    Until(u64),
    /// Not online here.
    Away,
}

/// What the other instances were last told of this instance's agent in a
/// session. The relay keeps it with the session's live state (and drops
/// it with the session); only the engine reads or changes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Announced {
    /// Online until then (unix ms); 0: offline, or nothing told.
    pub until: u64,
}
