//! The server as an operator runs it, against the real binary: what it
//! says at start (startup), signals, the command line and surviving bad
//! traffic (process), `GET /metrics` (metrics) and the debug request log
//! (request_log).

#[path = "../common/mod.rs"]
mod common;

mod metrics;
mod process;
mod request_log;
mod startup;
