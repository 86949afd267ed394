//! Entry points for the fuzz targets under `fuzz/`, not part of the API. The
//! WebSocket stage is private to the I/O shell; this drives it the way the
//! loop's `drive_ws` does, over an in-memory stream instead of a socket, so a
//! fuzzer can feed it client bytes without a server.

use std::collections::VecDeque;
use std::io::{self, Read};

use crate::keepalive::Keepalive;
use crate::net::buffer::OutQueue;
use crate::net::ws::{self, ReadOutcome, WsState};
use crate::store::{Cursor, Seq, SessionId};
use crate::time::Millis;

/// The server's default unsent-output cap for a subscriber
/// (`subscriber_buffer_bytes`); above it the loop closes with 1008.
const SUBSCRIBER_BUFFER_BYTES: usize = 1 << 20;
/// Turns after which a run stops even if the stage keeps asking for more.
const MAX_TURNS: usize = 1 << 16;

/// What the WebSocket stage did with one client's bytes.
#[derive(Debug, Default)]
pub struct WsRun {
    /// Every byte the server queued for the client, in order.
    pub output: Vec<u8>,
    /// The most bytes queued at the end of one read turn (before the
    /// simulated flush that empties the queue, as the loop's write pass does).
    pub max_queued: usize,
    /// Read turns taken.
    pub turns: usize,
    /// The close code the loop would send after a violation or a slow client.
    pub close: Option<u16>,
    /// The stage reported that the peer closed.
    pub peer_closed: bool,
}

/// A socket that hands out `chunks` one per turn: each chunk's bytes, then
/// `WouldBlock`; after the last chunk, end of stream if `eof`, else
/// `WouldBlock` for ever.
struct Chunks<'a> {
    chunks: VecDeque<&'a [u8]>,
    eof: bool,
}

impl Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(front) = self.chunks.front_mut() else {
            return if self.eof {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        };
        if front.is_empty() {
            // This turn's bytes are used up; the next chunk is the next turn's.
            self.chunks.pop_front();
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(front.len());
        buf[..n].copy_from_slice(&front[..n]);
        *front = &front[n..];
        Ok(n)
    }
}

/// Runs the server's WebSocket stage over a client's bytes: `leftover` is
/// what followed the upgrade request in the same read, `chunks` arrive one
/// per turn. Mirrors `drive_ws`: read frames, then on a violation queue a
/// Close with its code, on a peer close stop, on unsent output above the cap
/// close with 1008. Called only by the fuzz targets.
pub fn ws_client_bytes(leftover: &[u8], chunks: &[&[u8]], eof: bool) -> WsRun {
    let keepalive = Keepalive::new(Millis(0), 30_000);
    let mut state = WsState::new(
        leftover.to_vec(),
        SessionId::new("fuzz").expect("a valid session id"),
        keepalive,
        Cursor::at(Seq(0)),
    );
    let mut sock = Chunks {
        chunks: chunks.iter().copied().collect(),
        eof,
    };
    let mut out = OutQueue::default();
    let mut run = WsRun::default();
    while run.turns < MAX_TURNS {
        run.turns += 1;
        let now = Millis(run.turns as u64);
        // The peer's FIN (mio's read-closed) is seen with the last chunk.
        let read_closed = sock.eof && sock.chunks.len() <= 1;
        let mut readable = true;
        let outcome = ws::read_frames(
            &mut state,
            &mut sock,
            &mut readable,
            read_closed,
            &mut out,
            now,
        );
        run.max_queued = run.max_queued.max(out.queued());
        let close = match outcome {
            ReadOutcome::Violation(code, reason) => Some((code, reason)),
            _ if out.queued() > SUBSCRIBER_BUFFER_BYTES => {
                out.drop_unstarted();
                Some((1008, "subscriber too slow"))
            }
            _ => None,
        };
        if let Some((code, reason)) = close {
            out.push_owned(ws::encode_close(code, reason));
            run.close = Some(code);
        }
        // The loop's write pass: the client reads everything queued.
        let _ = out.write_to(&mut run.output, usize::MAX);
        match outcome {
            _ if close.is_some() => break,
            ReadOutcome::PeerClosed => {
                run.peer_closed = true;
                break;
            }
            ReadOutcome::Drained if sock.chunks.is_empty() && !sock.eof => break,
            ReadOutcome::Drained | ReadOutcome::More => {}
            ReadOutcome::Violation(..) => break,
        }
    }
    run
}
