//! relay: a tiny, fast relay between web clients and an AI agent.
//!
//! Clients post prompts (`POST /prompt`) and listen on a WebSocket
//! (`/ws/{session}`); the agent long-polls for prompts (`GET /prompts/{session}`)
//! and posts responses (`POST /response`), which are pushed to every
//! subscriber of the session.
//!
//! Architecture: three sans-IO cores and one I/O shell.
//! - [`relay`]: sessions, history, pending prompts, waiters and subscribers,
//!   the semantics of every endpoint; takes `now`, returns replies and
//!   [`relay::Effect`]s for other connections.
//! - [`http`]: the incremental request parser, routing, response encoding,
//!   the WebSocket upgrade check.
//! - [`timer`] and [`keepalive`]: the timer wheel and the ping schedule.
//! - [`web`]: the chat page served at `/`, with its security headers.
//! - [`net`]: one mio loop that owns every socket in a slab, drives the
//!   cores, applies effects, and writes before it sleeps.
//!
//! - [`cli`]: `relay agent`, `relay send` and `relay health`, blocking
//!   clients of the server in the same binary.
//!
//! The three data paths: a prompt wakes every parked poll of its session in
//! the same loop turn; a parked poll costs nothing until its deadline or a
//! wake; a response is framed once and the same bytes are queued for every
//! subscriber.

pub mod api;
pub mod cli;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod histogram;
pub mod http;
pub mod keepalive;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod ratelimit;
pub mod relay;
pub mod store;
pub mod time;
pub mod timer;
pub mod tls;
pub mod token;
pub mod web;
pub mod wire;
