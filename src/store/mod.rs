//! The session store: the durable part of every session (its log). The relay
//! core keeps only local presence (parked polls, subscribers) and reads and
//! writes sessions through this module. Sans-IO like the relay core: no
//! sockets, no clock.
//!
//! - [`log`]: one session's log (history with `seq`, pending set, dedupe
//!   ids, epoch) and the cursor every consumer reads it by.
//! - [`message`]: a stored message, serialized once (an assistant message
//!   as its WebSocket frame).
//! - `pending`: a session's unanswered prompts in `seq` order.
//! - [`mem`]: the in-memory engine, which decides at once and applies
//!   committed records (its own, or the storage thread's); with
//!   persistence, the loop's copy of the committed state.
//! - [`record`]: the commands that cross to the storage thread, and the
//!   outcomes and committed changes every engine answers with.
//! - [`seam`]: the words the relay and every engine share (what a write
//!   became, what a read waits for, the events an engine gives back,
//!   [`seam::StoreEvent`]), below every engine, so no engine names
//!   another or the dispatcher.
//! - [`engine`]: the one type the relay stores through, which only
//!   dispatches to the engine it holds.
//! - [`redis`]: sessions shared by several instances.
//! - [`sqlite`]: persistence on one machine (the storage thread).
//! - [`types`]: the keys of the log ([`SessionId`], [`Seq`]).

pub mod engine;
pub mod idmap;
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
