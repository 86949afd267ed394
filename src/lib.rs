//! relay: a tiny, fast relay between web clients and an AI agent.
//!
//! Clients post prompts (`POST /prompt`) and listen on a WebSocket
//! (`/ws/{session}`); the agent long-polls for prompts (`GET /prompts/{session}`)
//! and posts responses (`POST /response`), which are pushed to every
//! subscriber of the session.
//!
//! # Architecture
//!
//! Sans-IO cores, the shells that do their I/O, and leaves under both.
//! The cores take time and bytes as parameters and return values and
//! effects: they never touch a socket or read the clock
//! (`scripts/check-pure.sh` checks it), so their tests run on a virtual
//! clock. The modules form layers and an import points only down
//! (`scripts/check-layers.sh` checks it); from the bottom:
//!
//! - Leaves, which import nothing of ours: [`time`] (the clock types, and
//!   the one place the clock is read), [`wire`] (bytes on the wire: JSON
//!   and decimal writers, raw literals, WebSocket frames), [`error`] (the
//!   API's errors and their statuses), [`histogram`], [`token`] (signed
//!   session tokens), [`tls`] (certificates and trust).
//! - [`timer`], [`keepalive`], [`ratelimit`] (cores): the timer wheel, the
//!   ping schedule, the token buckets.
//! - [`store`] (core): each session's log (history with `seq`, pending
//!   set, dedupe ids, epoch, and the cursor every consumer reads it by),
//!   the writes and their validation, the rules every engine decides
//!   with, and the engines: memory, SQLite and Redis behind one
//!   [`store::engine::Engine`]. The SQLite engine's storage thread, which
//!   owns the database file, is a shell.
//! - [`relay`] (core): the semantics of every endpoint over the store,
//!   who waits here (parked polls, subscribers), and what the person
//!   waiting sees of the agent at work (drafts, its presence, receipts);
//!   returns replies and [`relay::Effect`]s for other connections.
//! - [`config`] (core): the settings, from the environment and flags,
//!   read once at start.
//! - [`http`] (core): the incremental request parser, routing, response
//!   encoding, the WebSocket upgrade check; [`logging`]: the log format.
//! - [`metrics`]: the `/metrics` exposition; [`web`] (core): the chat page
//!   served at `/`, with its security headers.
//! - [`api`] (core): access (tokens, roles, the rate limit), CORS, the
//!   `Content-Type` rule, the health bodies, and the dispatch of a parsed
//!   request to the relay.
//! - The shells: [`net`], one mio loop that owns every socket (the
//!   clients' in a slab, and the links to Redis), reads the clock once per
//!   turn, drives the cores, applies effects, and writes before it
//!   sleeps; [`cli`], `relay agent`, `relay send`, `relay health` and
//!   `relay token`, blocking tools in the same binary.
//! - `fuzzing`: entry points for the fuzz targets.
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
