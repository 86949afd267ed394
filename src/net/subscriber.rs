//! The WebSocket stage in the loop: reading client frames, handing a stored
//! answer to the subscribers that are caught up, refilling the ones that are
//! behind from the session's log as their sockets drain, and every way a
//! subscriber leaves (peer close, protocol violation, session deleted,
//! shutdown). Nobody is closed for being slow: a subscriber's queue holds at
//! most `RELAY_SUBSCRIBER_BUFFER` bytes (plus one frame when it was empty),
//! and what does not fit waits in the log. Invariant: a connection is in its
//! session's subscriber list exactly while its phase is `WebSocket`.

use std::rc::Rc;

use log::{debug, info};

use super::conn::Phase;
use super::server::{Server, lookup};
use super::ws::{self, ReadOutcome};
use crate::relay::ConnId;
use crate::store::Live;
use crate::time::Millis;

impl Server {
    /// Reads a subscriber's frames (pongs, pings, closes, mistakes) and
    /// re-arms its keep-alive deadline; called on its readable event. A
    /// subscriber whose queue is over the cap (it sends without reading
    /// our replies) is not read until the queue drains.
    pub(super) fn drive_ws(&mut self, id: ConnId, now: Millis) {
        let cap = self.cfg.subscriber_buffer_bytes;
        let Some(conn) = self.conn(id) else { return };
        if !conn.readable {
            return;
        }
        // A peer that hung up is read all the same, so its close is seen.
        if conn.out.queued() > cap && !conn.read_closed {
            conn.out_paused = true; // resumed by after_drained
            return;
        }
        let Phase::WebSocket(ws_state) = &mut conn.phase else {
            return;
        };
        let outcome = ws::read_frames(
            ws_state,
            &mut conn.sock,
            conn.read_closed,
            &mut conn.out,
            now,
        );
        let deadline = ws_state.keepalive.deadline();
        match outcome {
            ReadOutcome::Drained => conn.readable = false,
            ReadOutcome::More => self.reprocess.push(id),
            ReadOutcome::PeerClosed => {
                self.leave_ws(id, now);
                if let Some(conn) = self.conn(id) {
                    // The peer is done: once the Close reply (if any) is
                    // written, the server closes the TCP connection first,
                    // as RFC 6455 asks, instead of lingering for an EOF.
                    conn.eof = true;
                }
                self.begin_closing(id, now);
                return;
            }
            ReadOutcome::Violation(code, reason) => {
                debug!(code = code; "websocket protocol violation");
                self.close_ws(id, code, reason, now);
                return;
            }
        }
        self.set_deadline(id, deadline);
    }

    /// Unregisters a subscriber from its session and logs the disconnect.
    pub(super) fn leave_ws(&mut self, id: ConnId, now: Millis) {
        let Some(conn) = self.conn(id) else { return };
        let Phase::WebSocket(ws) = &conn.phase else {
            return;
        };
        let sid = ws.sid.clone();
        self.relay.unsubscribe(id, &sid, now);
        info!(session_id = &*sid; "client disconnected");
    }

    /// Starts a WebSocket close: queue a Close frame with `code`, leave the
    /// session, flush, then shut down.
    pub(super) fn close_ws(&mut self, id: ConnId, code: u16, reason: &'static str, now: Millis) {
        self.leave_ws(id, now);
        let Some(conn) = self.conn(id) else { return };
        if !matches!(conn.phase, Phase::WebSocket(_)) {
            return;
        }
        conn.out.push_owned(ws::encode_close(code, reason));
        self.begin_closing(id, now);
    }

    /// A new assistant message of `sid` (seq `seq`, the one before it at
    /// `prev`): queued, as the same shared bytes, on every subscriber for
    /// which it is the next message and whose queue has room. Any other
    /// subscriber is left lagging and reads it from the log when it drains.
    pub(super) fn deliver(&mut self, sid: &str, seq: u64, prev: u64, frame: Rc<[u8]>) {
        let cap = self.cfg.subscriber_buffer_bytes;
        for &sub in self.relay.subscribers(sid) {
            let Some(conn) = lookup(&mut self.conns, sub) else {
                continue;
            };
            let Phase::WebSocket(ws) = &mut conn.phase else {
                continue;
            };
            if ws.lagging {
                continue;
            }
            match ws.cursor.live(seq, prev) {
                Live::Skip => continue,
                Live::Next if conn.out.is_empty() || conn.out.queued() + frame.len() <= cap => {
                    conn.out.push_shared(frame.clone());
                    ws.cursor.advance(seq);
                }
                Live::Next | Live::Behind => ws.lagging = true,
            }
            if !conn.write_listed {
                conn.write_listed = true;
                self.pending_writes.push_back(sub);
            }
        }
    }

    /// Refills a lagging subscriber from the log once its queue is at or
    /// below half the cap, up to the cap. Called before its output is
    /// written, so a replay of any length is paced by the client's reading.
    pub(super) fn top_up(&mut self, id: ConnId) {
        let cap = self.cfg.subscriber_buffer_bytes;
        let Some(conn) = lookup(&mut self.conns, id) else {
            return;
        };
        let Phase::WebSocket(ws) = &mut conn.phase else {
            return;
        };
        let queued = conn.out.queued();
        if !ws.lagging || queued > cap / 2 {
            return;
        }
        let mut frames = std::mem::take(&mut self.refill_scratch);
        let caught_up = self.relay.refill(
            &ws.sid,
            &mut ws.cursor,
            cap.saturating_sub(queued),
            queued == 0,
            &mut frames,
        );
        ws.lagging = !caught_up;
        for frame in frames.drain(..) {
            conn.out.push_shared(frame);
        }
        self.refill_scratch = frames;
    }
}
