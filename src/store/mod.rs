//! The session store: each session's log, the writes and reads over it,
//! and the engines that decide and keep them. The relay reads and writes
//! sessions only through this module, and keeps beside it only what no
//! engine stores (who waits here, and the live state of an agent at
//! work). Sans-IO like the relay core: no sockets, no clock; only the
//! storage thread in [`sqlite`] touches a disk, as a shell.
//!
//! From the bottom up (`scripts/check-layers.sh` keeps the order):
//!
//! - [`types`]: the keys of the log ([`SessionId`], [`Seq`]), the reads'
//!   queries, and the ticket a waiting request holds; [`idmap`]: a map
//!   from client-chosen ids that keeps each key's hash.
//! - [`message`]: a stored message, serialized once (an assistant message
//!   as its WebSocket frame); [`model`]: the writes, each request body
//!   validated into its type, and the [`model::Write`] the relay hands
//!   its engine.
//! - `pending`: a session's unanswered prompts in `seq` order;
//!   [`arrivals`]: every session's, in arrival order; [`asks`]:
//!   its asks, open until replied to or expired;
//!   [`record`]: what a write became (its [`record::Outcome`], which
//!   renders the requester's answer) and the [`record::Record`]s that
//!   change the log, and what crosses to the storage thread.
//! - [`log`]: one session's log (history with `seq`, pending set, dedupe
//!   ids, epoch) and the cursor every consumer reads it by; [`seam`]: the
//!   words the relay and every engine share (what a write became, what a
//!   read waits for, the events an engine gives back,
//!   [`seam::StoreEvent`]), below every engine, so no engine names
//!   another or the dispatcher.
//! - [`mem`]: the rules every engine decides with ([`MemStore::decide`]),
//!   and the in-memory engine, which applies committed records (its own,
//!   or another engine's) to the loop's log.
//! - [`redis`]: sessions shared by several instances; [`sqlite`]:
//!   persistence on one machine (the storage thread). Neither names the
//!   other.
//! - [`engine`]: the one type the relay stores through, which only
//!   dispatches to the engine it holds.

pub mod arrivals;
pub mod asks;
pub mod engine;
pub mod idmap;
pub mod image;
pub mod log;
pub mod mem;
pub mod message;
pub mod model;
mod pending;
pub mod record;
pub mod redis;
pub mod seam;
pub mod sqlite;
pub mod types;

pub use log::{Cursor, Live, MAX_PAGE_BYTES, Refill, SessionLog};
pub use mem::{Applied, IdGen, MemStore, StoreLimits};
pub use message::{Kind, Message};
pub use types::{Seq, SessionId};

/// A small deterministic generator (xorshift) for the store's randomized
/// unit tests, so a failure repeats.
#[cfg(test)]
pub(crate) struct Rng(pub(crate) u64);

#[cfg(test)]
impl Rng {
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
