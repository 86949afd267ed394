//! Blocking WebSocket client (tungstenite) with a 10 s read timeout.

use std::io::ErrorKind;
use std::time::Instant;

use serde_json::Value;
use tungstenite::{Message, WebSocket};

use super::IO_TIMEOUT;
use super::tls::Stream;

/// A blocking WebSocket client with a 10 s read timeout.
pub struct Ws {
    pub(super) socket: WebSocket<Stream>,
}

impl Ws {
    /// Next message of any kind (protocol Pings are answered by tungstenite).
    #[track_caller]
    pub fn recv(&mut self) -> Message {
        loop {
            match self.socket.read() {
                Ok(m) => return m,
                // A read with a timeout is not restarted after the test
                // process is stopped and continued (signal(7)); tungstenite
                // keeps what it had read, so reading again is safe.
                Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => panic!("WebSocket read failed: {e}"),
            }
        }
    }

    /// Next Text frame as JSON; skips protocol Ping/Pong frames and the
    /// live frames (`presence`, `receipt`, `delta`, `delta_end`), as a
    /// client that does not know them does: [`recv_any`](Self::recv_any)
    /// returns those too.
    #[track_caller]
    pub fn recv_json(&mut self) -> Value {
        loop {
            let v = self.recv_any();
            if !matches!(
                v["type"].as_str(),
                Some("presence" | "receipt" | "delta" | "delta_end")
            ) {
                return v;
            }
        }
    }

    /// Next Text frame as JSON, whatever its type; skips protocol
    /// Ping/Pong frames.
    #[track_caller]
    pub fn recv_any(&mut self) -> Value {
        loop {
            match self.recv() {
                Message::Text(t) => {
                    return serde_json::from_str(t.as_str())
                        .unwrap_or_else(|e| panic!("text frame is not JSON ({e}): {t}"));
                }
                Message::Ping(_) | Message::Pong(_) => {}
                other => panic!("expected a text frame, got {other:?}"),
            }
        }
    }

    /// Next Text frame as JSON, whatever its type but `{"type":"ping"}`.
    #[track_caller]
    pub fn recv_any_skip_pings(&mut self) -> Value {
        loop {
            let v = self.recv_any();
            if v["type"] != "ping" {
                return v;
            }
        }
    }

    /// Next Text frame as JSON, also skipping `{"type":"ping"}` frames.
    #[track_caller]
    pub fn recv_json_skip_pings(&mut self) -> Value {
        loop {
            let v = self.recv_json();
            if v["type"] != "ping" {
                return v;
            }
        }
    }

    #[track_caller]
    pub fn send_text(&mut self, s: &str) {
        self.socket
            .send(Message::text(s))
            .expect("WebSocket send failed");
    }

    /// Reads until a Close frame and returns its code (1005 when it has none, 1006 when the
    /// connection ends without one). Panics on timeout.
    #[track_caller]
    pub fn expect_close(&mut self) -> u16 {
        loop {
            match self.socket.read() {
                Ok(Message::Close(frame)) => {
                    return frame.map(|f| u16::from(f.code)).unwrap_or(1005);
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    panic!("no Close frame within {IO_TIMEOUT:?}")
                }
                Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return 1006,
            }
        }
    }

    /// Starts a normal close and waits (bounded) for the server's Close reply.
    pub fn close(&mut self) {
        let _ = self.socket.close(None);
        let deadline = Instant::now() + IO_TIMEOUT;
        while Instant::now() < deadline {
            if self.socket.read().is_err() {
                break;
            }
        }
    }

    pub fn inner(&mut self) -> &mut WebSocket<Stream> {
        &mut self.socket
    }
}
