//! The connection layer against the real binary: HTTP/1.x framing,
//! keep-alive, pipelining and the size and time limits (conformance), the
//! WebSocket endpoint and its frames (websocket), malformed WebSocket client
//! traffic (ws_malformed), and subscribers as cursors over the session's log
//! that are never closed for reading slowly (subscriber_log).

#[path = "../common/mod.rs"]
mod common;

mod conformance;
mod subscriber_log;
mod websocket;
mod ws_malformed;
