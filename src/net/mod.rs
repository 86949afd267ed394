//! The I/O shell: the mio loop, connections, buffers, the WebSocket stage.
//! The only code that touches sockets or reads the clock (through `Clock`).

pub(crate) mod buffer;
mod conn;
mod handler;
mod parked;
mod server;
mod subscriber;
pub(crate) mod ws;

pub use server::Server;
