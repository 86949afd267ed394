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
//! A write handed to a storage carries a [`Ticket`]; its result comes back
//! later as the storage's answer for that ticket, and a requester that
//! stops waiting [`abandon`](Engine::abandon)s it.

use super::redis::RedisStore;
use super::sqlite::{Durable, STOP_BOUND, StoreStats};
use super::types::{SessionId, Ticket};

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
