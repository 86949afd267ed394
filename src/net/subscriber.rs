//! The WebSocket stage in the loop: reading client frames, fanning a
//! broadcast out to a session's subscribers, and every way a subscriber
//! leaves (peer close, protocol violation, too slow, session deleted,
//! shutdown). Invariant: a connection is in its session's subscriber list
//! exactly while its phase is `WebSocket`.

use std::rc::Rc;

use log::{debug, info};

use super::conn::Phase;
use super::server::{Server, lookup};
use super::ws::{self, ReadOutcome};
use crate::relay::ConnId;
use crate::time::Millis;

impl Server {
    /// Reads a subscriber's frames (pongs, pings, closes, mistakes) and
    /// re-arms its keep-alive deadline; called on its readable event.
    pub(super) fn drive_ws(&mut self, id: ConnId, now: Millis) {
        let cap = self.cfg.subscriber_buffer_bytes;
        let Some(conn) = self.conn(id) else { return };
        if !conn.readable {
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
        let queued = conn.out.queued();
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
        if queued > cap {
            self.close_slow(id, now);
            return;
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

    /// A subscriber whose unsent output passed the cap: drop what it has not
    /// started receiving and close it with 1008.
    pub(super) fn close_slow(&mut self, id: ConnId, now: Millis) {
        let Some(conn) = self.conn(id) else { return };
        conn.out.drop_unstarted();
        if let Phase::WebSocket(ws) = &conn.phase {
            info!(session_id = &*ws.sid; "slow subscriber closed");
        }
        self.close_ws(id, 1008, "subscriber too slow", now);
    }

    /// Queues `frame` for every subscriber of `sid`; a subscriber whose
    /// unsent output would pass the cap is closed with 1008 instead.
    /// Returns how many subscribers got it.
    pub(super) fn broadcast(&mut self, sid: &str, frame: Rc<[u8]>, now: Millis) -> usize {
        let cap = self.cfg.subscriber_buffer_bytes;
        let mut delivered = 0;
        let mut slow = Vec::new();
        for &sub in self.relay.subscribers(sid) {
            let Some(conn) = lookup(&mut self.conns, sub) else {
                continue;
            };
            if !matches!(conn.phase, Phase::WebSocket(_)) {
                continue;
            }
            // Behind: something is still unsent and this frame would pass
            // the cap. A subscriber that is keeping up (nothing queued)
            // always takes the frame, even one larger than the cap.
            if !conn.out.is_empty() && conn.out.queued() + frame.len() > cap {
                slow.push(sub);
                continue;
            }
            conn.out.push_shared(frame.clone());
            delivered += 1;
            if !conn.write_listed {
                conn.write_listed = true;
                self.pending_writes.push_back(sub);
            }
        }
        for sub in slow {
            self.close_slow(sub, now);
        }
        delivered
    }
}
