//! The session store: the durable part of every session (its log). The relay
//! core keeps only local presence (parked polls, subscribers) and reads and
//! writes sessions through this module. Sans-IO like the relay core: no
//! sockets, no clock.
//!
//! - [`log`]: one session's log (history with `seq`, pending set, dedupe
//!   ids, epoch) and the cursor every consumer reads it by.
//! - [`message`]: a stored message, serialized once (an assistant message
//!   as its WebSocket frame).
//! - [`mem`]: the in-memory engine, which decides and commits at once.

pub mod log;
pub mod mem;
pub mod message;

pub use log::{Cursor, Live, MAX_PAGE_BYTES, Refill, SessionLog};
pub use mem::{MemStore, PromptStored, ResponseStored, StoreLimits};
pub use message::{Kind, Message};
