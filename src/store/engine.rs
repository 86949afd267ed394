//! The engine a relay stores through: one of three, behind one type, so the
//! relay holds one engine and asks it, not which one it is.
//!
//! - [`Engine::Memory`]: the relay's own log decides every write at once
//!   (it has no state of its own here: the log is the relay's).
//! - [`Engine::Durable`]: SQLite on the storage thread, which decides with
//!   the memory engine's rules on its own copy and answers when the write
//!   is durable.
//! - [`Engine::Shared`]: Redis, shared by several instances, whose script
//!   decides; the relay's log is this instance's copy of the sessions it
//!   serves.
//!
//! The seam, in the relay's terms:
//! - [`submit`](Engine::submit) a write: decided on the copy now
//!   ([`Submit::Decide`]), or taken under a [`Ticket`] ([`Submit::Wait`]),
//!   whose request is parked until its answer;
//! - [`before_read`](Engine::before_read): whether a read must wait until
//!   the copy holds what was acknowledged before it began (a ticket too);
//! - [`next_event`](Engine::next_event): what the engine has for the
//!   relay, one [`StoreEvent`] at a time, each read against the copy as
//!   the events before it left it: committed records, a session read
//!   whole, the answer to a ticket, other instances' live state;
//! - [`collect`](Engine::collect) for the idle sweep, and the deadlines
//!   of the Redis engine's own timers (`next_deadline`, `tick`).
//!
//! A requester that stops waiting [`abandon`](Engine::abandon)s its
//! ticket.

use super::SessionLog;
use super::mem::MemStore;
use super::model::Write;
use super::record::{Command, Op, Outcome, Record};
use super::redis::{AgentState, DraftState, RedisStore};
use super::sqlite::{Durable, STOP_BOUND, StoreStats};
use super::types::{ConnId, PromptsQuery, SessionId, Ticket};
use crate::error::ApiError;

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
}

/// What a read is, for [`Engine::before_read`].
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
    /// on it here reads it again (after a `resync` frame when true).
    Replaced {
        sid: SessionId,
        log: Box<SessionLog>,
        refill: Option<bool>,
    },
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
    /// are read again ([`Engine::reread`]).
    Lost,
    /// A part of a streamed answer appended on another instance.
    Part {
        sid: SessionId,
        assistant_msg_id: String,
        client_msg_id: String,
        part: u32,
        lit: String,
    },
    /// An instance's agent state in a session.
    Agent { sid: SessionId, state: AgentState },
    /// Prompts an agent fetched through another instance.
    Receipts {
        sid: SessionId,
        instance: String,
        ts: u64,
        ids: Vec<String>,
    },
    /// A session's open drafts and agent states, read with it.
    LiveRead {
        sid: SessionId,
        drafts: Vec<DraftState>,
        agents: Vec<AgentState>,
    },
}

// One per process: its size costs nothing, and a box would add an
// indirection to every write.
#[allow(clippy::large_enum_variant)]
pub enum Engine {
    Memory,
    Durable(Durable),
    Shared(RedisStore),
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

impl Engine {
    /// Redis, when sessions are shared.
    pub fn redis(&mut self) -> Option<&mut RedisStore> {
        match self {
            Engine::Shared(r) => Some(r),
            _ => None,
        }
    }

    /// Hands a write to the engine; `ticket` issues the ticket it waits
    /// under, called only once the write is taken. A storage that cannot
    /// take writes refuses with `503` (and no ticket).
    pub fn submit(
        &mut self,
        copy: &MemStore,
        ticket: impl FnOnce() -> Ticket,
        w: &Write,
        unix_ms: u64,
    ) -> Result<Submit, ApiError> {
        match self {
            Engine::Memory => Ok(Submit::Decide),
            Engine::Durable(_) if matches!(w, Write::Part(_)) => Ok(Submit::Decide),
            // A session the loop's copy holds exists on disk: creating
            // it changes nothing.
            Engine::Durable(_) if matches!(w, Write::Create { sid, .. } if copy.contains(sid)) => {
                Ok(Submit::Decide)
            }
            // Only a session the copy holds is on disk.
            Engine::Durable(_) if matches!(w, Write::Delete { sid } if !copy.contains(sid)) => {
                Err(ApiError::session_not_found())
            }
            Engine::Durable(d) => {
                d.submit(Command {
                    ticket: ticket(),
                    op: Op::Write(w.clone().into_owned(unix_ms)),
                });
                Ok(Submit::Wait)
            }
            Engine::Shared(r) => {
                r.submit(copy, ticket, w, unix_ms)?;
                Ok(Submit::Wait)
            }
        }
    }

    /// Before a read of `sid`: true when the read must wait (under the
    /// ticket `ticket` issues) until the copy holds what any instance
    /// acknowledged before now; it runs again then. Alone, the copy
    /// always does.
    pub fn before_read(
        &mut self,
        copy: &MemStore,
        ticket: impl FnOnce() -> Ticket,
        sid: &SessionId,
        read: Read,
        waited: &dyn Waited,
    ) -> Result<bool, ApiError> {
        match self {
            Engine::Shared(r) => r.before_read(copy, ticket, sid, read, waited),
            _ => Ok(false),
        }
    }

    /// The next thing the engine has for the relay, read against the copy
    /// as the events before it left it; `None` when there is nothing more.
    pub fn next_event(&mut self, copy: &MemStore, waited: &dyn Waited) -> Option<StoreEvent> {
        match self {
            Engine::Memory => None,
            Engine::Durable(d) => d.next_event(),
            Engine::Shared(r) => r.next_event(copy, waited),
        }
    }

    /// Someone waits on `sid` here: changes made elsewhere must reach
    /// this instance.
    pub fn listen(&mut self, sid: &SessionId, waited: &dyn Waited) {
        if let Engine::Shared(r) = self {
            r.listen_bounded(sid, waited);
        }
    }

    /// The first subscriber of `sid` here came (`on`), or the last one
    /// left: other instances' answers then say `delivered`.
    pub fn watching(&mut self, sid: &str, on: bool, ttl_ms: u64) {
        if let Engine::Shared(r) = self {
            r.watching(sid, on, ttl_ms);
        }
    }

    /// The copies are gone ([`StoreEvent::Lost`]): the sessions waited on
    /// here are read again, and created again if missing.
    pub fn reread(&mut self, waited: &dyn Waited) {
        if let Engine::Shared(r) = self {
            r.reread_waited(waited);
        }
    }

    /// The copy of `sid` missed a change made elsewhere (a part out of
    /// order): it is read again.
    pub fn resync(&mut self, copy: &MemStore, sid: &SessionId) {
        if let Engine::Shared(r) = self {
            r.resync(copy, sid);
        }
    }

    /// How long a session nobody here is connected to stays in the copy
    /// unused: the TTL, or with Redis at most a minute (Redis keeps it).
    pub fn idle_after(&self, ttl_ms: u64) -> u64 {
        match self {
            Engine::Shared(_) => ttl_ms.min(60_000),
            _ => ttl_ms,
        }
    }

    /// The idle sweep: `idle` are the sessions nobody here used for
    /// [`idle_after`](Self::idle_after); `ticket` issues the ticket of a
    /// collection sent to the storage.
    pub fn collect(
        &mut self,
        copy: &MemStore,
        idle: Vec<SessionId>,
        ticket: impl FnOnce() -> Ticket,
        waited: &dyn Waited,
        ttl_ms: u64,
    ) -> Collect {
        match self {
            Engine::Memory => Collect::Delete(idle),
            Engine::Durable(d) => {
                if !idle.is_empty() {
                    d.submit(Command {
                        ticket: ticket(),
                        op: Op::Collect { sids: idle },
                    });
                }
                Collect::Sent
            }
            Engine::Shared(r) => {
                r.keep_alive(copy, waited, ttl_ms);
                Collect::Forget(idle)
            }
        }
    }

    /// The turn's wall clock (unix ms), for the activity a Redis write
    /// records.
    pub fn set_clock(&mut self, unix_ms: u64) {
        if let Engine::Shared(r) = self {
            r.set_clock(unix_ms);
        }
    }

    /// Whether other instances share the sessions (and their changes,
    /// parts, agent states and receipts come as published events).
    pub fn shared(&self) -> bool {
        matches!(self, Engine::Shared(_))
    }

    /// Tells the other instances this one's agent state in `sid`: online
    /// until `until` (unix ms; 0: offline), last seen at `seen`. Alone,
    /// there is nobody to tell.
    pub fn announce_agent(&mut self, sid: &SessionId, until: u64, seen: u64) {
        if let Engine::Shared(r) = self {
            r.agent(sid, until, seen);
        }
    }

    /// Tells the other instances' subscribers that an agent fetched these
    /// prompts of `sid` here, at `ts`.
    pub fn publish_receipts(&mut self, sid: &SessionId, ts: u64, ids: &[&str]) {
        if let Engine::Shared(r) = self {
            r.receipts(sid, ts, ids);
        }
    }

    /// Whether a published change named `instance` came from this one.
    pub fn is_own(&self, instance: &str) -> bool {
        matches!(self, Engine::Shared(r) if r.instance() == instance)
    }

    /// Whether the records the relay applies are its own writes, counted
    /// and logged as they are applied. With Redis, records also come from
    /// other instances: a write is counted when Redis answers it.
    pub fn applies_own_writes(&self) -> bool {
        !matches!(self, Engine::Shared(_))
    }

    /// The requester of `ticket` stops waiting (its storage timeout, or a
    /// shutdown): a write the storage has not taken is cancelled; one it
    /// holds is left to finish.
    pub fn abandon(&mut self, ticket: Ticket) -> Abandon {
        match self {
            Engine::Durable(d) => {
                if d.cancel(ticket.n) {
                    Abandon::Cancelled
                } else {
                    Abandon::InFlight
                }
            }
            // A write is sent in the turn it is asked for, so the script
            // is already Redis's to run (or the connection was lost and
            // the write was answered then).
            Engine::Shared(_) => Abandon::InFlight,
            Engine::Memory => Abandon::Cancelled,
        }
    }

    /// Sends this turn's writes to the storage thread; called at the end of
    /// every loop turn.
    pub fn flush(&mut self) {
        if let Engine::Durable(d) = self {
            d.flush();
        }
    }

    /// Whether the storage's queue is full: the shell takes no new request
    /// until it drains.
    pub fn saturated(&self) -> bool {
        match self {
            Engine::Memory => false,
            Engine::Durable(d) => d.saturated(),
            Engine::Shared(r) => r.saturated(),
        }
    }

    /// Whether writes succeed (`/readyz` answers `503 storage` otherwise).
    pub fn healthy(&self) -> bool {
        match self {
            Engine::Memory => true,
            Engine::Durable(d) => d.healthy(),
            Engine::Shared(r) => r.healthy(),
        }
    }

    /// The storage's totals, for `/metrics`.
    pub fn stats(&self) -> Option<&StoreStats> {
        match self {
            Engine::Memory => None,
            Engine::Durable(d) => Some(&d.stats),
            Engine::Shared(r) => Some(&r.stats),
        }
    }

    /// Stops the storage thread once it committed everything it was sent
    /// (at most [`STOP_BOUND`] more).
    pub fn stop(&mut self) {
        if let Engine::Durable(d) = self {
            d.flush();
            d.stop(STOP_BOUND);
        }
    }
}
