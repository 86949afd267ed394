//! The I/O shell: the mio loop, connections, buffers, and one module per
//! connection stage (`http`, `parked`, `subscriber` with its WebSocket
//! codec `ws`, `closing`), each working on one connection and the narrow
//! context `ctx`; `stream`, the socket or TLS over it, under every stage
//! and the Redis links. The only code that touches sockets or reads the
//! clock (through `Clock`, once per loop turn).
//!
//! Imports point down (`scripts/check-layers.sh` checks it): `buffer` and
//! `read` (one socket read, the turn's read budget) at the bottom, then
//! `stream`, then the codec `ws` and the Redis links, the connection
//! `conn` above its codec, `ctx` above the connection, the stages above
//! both, and the loop `server` on top.

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

pub use server::Server;
