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

use super::closing;
use super::conn::{Conn, Next, Phase};
use super::ctx::Ctx;
use super::ws::{self, ReadOutcome};
use crate::keepalive::Action;
use crate::relay::ConnId;
use crate::store::{Live, Seq};

/// Reads a subscriber's frames (pongs, pings, closes, mistakes) and re-arms
/// its keep-alive deadline; called on its readable event. A subscriber
/// whose queue is over the cap (it sends without reading our replies) is
/// not read until the queue drains, unless it hung up.
pub fn drive(id: ConnId, conn: &mut Conn, cx: &mut Ctx) -> Next {
    if !conn.readable() {
        return Next::Stay;
    }
    if conn.queued() > cx.cfg().subscriber_buffer_bytes && !conn.read_closed() {
        conn.pause_reading(); // resumed by after_drained
        return Next::Stay;
    }
    let Some((outcome, deadline)) = conn.read_frames(cx.now()) else {
        return Next::Stay;
    };
    match outcome {
        ReadOutcome::Drained => {}
        ReadOutcome::More => cx.run_again(id),
        ReadOutcome::PeerClosed => {
            leave(id, conn, cx);
            // The peer is done: once the Close reply (if any) is written,
            // the server closes the TCP connection first, as RFC 6455 asks,
            // instead of lingering for an EOF.
            conn.mark_eof();
            closing::begin(id, conn, cx);
            return Next::Stay;
        }
        ReadOutcome::Violation(code, reason) => {
            debug!(code = code; "websocket protocol violation");
            close(id, conn, cx, code, reason);
            return Next::Stay;
        }
    }
    cx.set_deadline(id, conn, deadline);
    Next::Stay
}

/// A subscriber's deadline: a ping is due, or the client stayed silent for
/// two ping intervals and is closed.
pub fn on_deadline(id: ConnId, conn: &mut Conn, cx: &mut Ctx) {
    let now = cx.now();
    let unix_ms = cx.unix_ms();
    let Some((ws, out)) = conn.subscriber() else {
        return;
    };
    let action = ws.keepalive.on_timer(now);
    let next = ws.keepalive.deadline();
    match action {
        Action::Close => {
            debug!("subscriber silent for two ping intervals");
            close(id, conn, cx, 1000, "ping timeout");
        }
        Action::SendPing => {
            let ping = format!("{{\"type\":\"ping\",\"ts\":{unix_ms}}}");
            out.push_owned(ws::encode_text(&ping));
            out.push_owned(ws::encode_ping());
            ws.quiet = true;
            cx.set_deadline(id, conn, next);
            cx.queue_write(id, conn);
        }
        Action::Nothing => cx.set_deadline(id, conn, next),
    }
}

/// Unregisters a subscriber from its session and logs the disconnect.
pub fn leave(id: ConnId, conn: &mut Conn, cx: &mut Ctx) {
    let Phase::WebSocket(ws) = conn.phase() else {
        return;
    };
    cx.unsubscribe(id, &ws.sid);
    info!(session_id = &*ws.sid; "client disconnected");
}

/// Starts a WebSocket close: queue a Close frame with `code`, leave the
/// session, flush, then shut down.
pub fn close(id: ConnId, conn: &mut Conn, cx: &mut Ctx, code: u16, reason: &'static str) {
    if !matches!(conn.phase(), Phase::WebSocket(_)) {
        return;
    }
    leave(id, conn, cx);
    conn.out().push_owned(ws::encode_close(code, reason));
    closing::begin(id, conn, cx);
}

/// A new assistant message (seq `seq`, the one before it at `prev`) for
/// one subscriber of its session; the loop calls it for each of them with
/// the same shared bytes. Queued if it is the subscriber's next message and
/// its queue has room; otherwise the subscriber is left lagging and reads
/// it from the log when it drains.
pub fn deliver(id: ConnId, conn: &mut Conn, cx: &mut Ctx, seq: Seq, prev: Seq, frame: &Rc<[u8]>) {
    let cap = cx.cfg().subscriber_buffer_bytes;
    let Some((ws, out)) = conn.subscriber() else {
        return;
    };
    if ws.lagging {
        return;
    }
    match ws.cursor.live(seq, prev) {
        Live::Skip => return,
        Live::Next if out.is_empty() || out.queued() + frame.len() <= cap => {
            out.push_shared(frame.clone());
            ws.cursor.advance(seq);
            cx.count_frame();
        }
        Live::Next | Live::Behind => ws.lagging = true,
    }
    cx.queue_write(id, conn);
}

/// A live frame (a part, presence, a receipt) for one subscriber of its
/// session: queued if it is caught up with the log and has room. One that
/// is behind, or full, gets the live state when it catches up instead.
pub fn broadcast(id: ConnId, conn: &mut Conn, cx: &mut Ctx, frame: &Rc<[u8]>) {
    let cap = cx.cfg().subscriber_buffer_bytes;
    let Some((ws, out)) = conn.subscriber() else {
        return;
    };
    if ws.lagging {
        return;
    }
    if out.is_empty() || out.queued() + frame.len() <= cap {
        out.push_shared(frame.clone());
        cx.count_frame();
    } else {
        ws.lagging = true;
    }
    cx.queue_write(id, conn);
}

/// The log of the subscriber's session was read again whole: it reads it
/// from its cursor when its socket drains, after a `resync` frame first
/// when `resync` (the log starts again under a new epoch).
pub fn refill(id: ConnId, conn: &mut Conn, cx: &mut Ctx, resync: bool) {
    let Some((ws, _)) = conn.subscriber() else {
        return;
    };
    if resync {
        ws.cursor.owe_resync();
    }
    ws.lagging = true;
    cx.queue_write(id, conn);
}

/// Refills a lagging subscriber from the log once its queue is at or below
/// half the cap, up to the cap. Called before its output is written, so a
/// replay of any length is paced by the client's reading.
pub fn top_up(conn: &mut Conn, cx: &mut Ctx) {
    let cap = cx.cfg().subscriber_buffer_bytes;
    let Some((ws, out)) = conn.subscriber() else {
        return;
    };
    let queued = out.queued();
    if !ws.lagging || queued > cap / 2 {
        return;
    }
    let room = cap.saturating_sub(queued);
    ws.lagging = !cx.refill(&ws.sid, &mut ws.cursor, room, out);
}
