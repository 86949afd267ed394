//! The server as an operator runs it, against the real binary: what it
//! says at start (startup), signals, the command line and surviving bad
//! traffic (process), `GET /metrics` (metrics), the debug request log
//! (request_log) and the settings a new user gets wrong (settings).

#[path = "../common/mod.rs"]
mod common;

mod budget;
mod metrics;
mod process;
mod request_log;
mod settings;
mod startup;
