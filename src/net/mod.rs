//! The I/O shell of the server: the only code of it that touches a socket
//! or asks for the time (through `Clock`, once per loop turn). It runs the
//! sans-IO cores over the sockets and applies what they return.
//!
//! Its files, from the bottom up (imports point down, and
//! `scripts/check-layers.sh` checks it):
//!
//! - `buffer`: a connection's capped output queue of owned or shared
//!   chunks, written with `writev`; `read`: one socket read and the turn's
//!   read budget; `ws_read`: the sans-IO parser of client WebSocket frames.
//! - `stream`: the socket, or TLS over it, under every stage and the
//!   Redis links.
//! - `ws`: the WebSocket codec over a connection's output queue; `redis`:
//!   the two sockets to Redis, which the loop drives for the engine.
//! - `conn`: one connection, its socket, readiness flags, output and
//!   stage; `ctx`: the narrow context a stage may touch besides its
//!   connection (the cores, the timer wheel, the write and re-run lists).
//! - The stages, each working on one connection and `ctx`: `closing`,
//!   then `http` (reading and answering requests) and `subscriber` (a
//!   WebSocket subscriber), then `parked` (a poll or a write that waits,
//!   answered through `http`).
//! - `server`: the loop, which owns the `Poll` and the slab, with
//!   `accept`, `effects` (the relay's effects applied to other
//!   connections) and `shutdown` (signals and the bounded drain).

pub(crate) mod buffer;
mod closing;
mod conn;
mod ctx;
mod http;
mod parked;
mod read;
mod redis;
mod server;
mod stream;
mod subscriber;
pub(crate) mod ws;
mod ws_read;

pub use server::Server;
