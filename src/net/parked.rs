//! The parked stage: a `GET /prompts` waiting for a prompt. It costs nothing
//! until its deadline or a wake; later pipelined requests stay buffered,
//! unparsed, and are answered in order once it is. It keeps reading (up to
//! the reader's cap) only to notice a hang-up, which cancels the wait.
//! Invariant: a `Parked` connection has exactly one waiter entry in the
//! relay.

use std::rc::Rc;

use super::closing;
use super::conn::{Closing, Conn, Got, Next, Phase, read_once};
use super::ctx::{Ctx, READ_BUDGET};
use super::http;
use crate::api::{Answer, Body};
use crate::relay::ConnId;

/// Reads what a parked poll's client sent; a hang-up (EOF, reset) closes
/// the connection, which cancels the wait. A reader that is full reads no
/// more, so a hang-up is then told by the socket's read-closed state.
pub fn read(id: ConnId, conn: &mut Conn, cx: &mut Ctx) -> Next {
    let mut read = 0;
    while conn.readable {
        let Phase::Parked(h, _) = &mut conn.phase else {
            return Next::Stay;
        };
        let want = h.reader.want().min(READ_BUDGET - read);
        if want == 0 {
            if read >= READ_BUDGET {
                cx.reprocess.push(id);
                return Next::Stay;
            }
            return if conn.read_closed {
                Next::Close
            } else {
                Next::Stay
            };
        }
        let buf = &mut cx.scratch[..want];
        match read_once(&mut conn.sock, buf, &mut conn.readable, conn.read_closed) {
            Got::Bytes(n) => {
                h.reader.push(&buf[..n]);
                read += n;
            }
            Got::Blocked => break,
            Got::Eof | Got::Failed => return Next::Close,
        }
    }
    Next::Stay
}

/// Answers a parked poll and returns it to reading requests; its buffered
/// pipelined requests are handled in this same turn. Called for a wake, a
/// deadline, a deleted session or a shutdown. Its headers come from the one
/// place every answer's do (`Ctx::meta`).
pub fn answer(id: ConnId, conn: &mut Conn, cx: &mut Ctx, status: u16, body: Rc<[u8]>) {
    let now = cx.now();
    let phase = std::mem::replace(&mut conn.phase, Phase::Closing(Closing::default()));
    let Phase::Parked(mut h, parked) = phase else {
        conn.phase = phase;
        return;
    };
    cx.relay.cancel_wait(id, &parked.sid, now);
    http::resume(&mut h, now);
    conn.phase = Phase::Http(h);
    let mut meta = cx.meta(parked.origin.as_deref(), parked.keep_alive);
    meta.http10 = parked.http10;
    let keep_alive = meta.keep_alive;
    let answer = Answer {
        status,
        body: Body::Shared(body),
        ..Answer::ok(Vec::new())
    };
    let bytes = http::queue(conn, answer, &meta);
    let path = format!("/prompts/{}", parked.sid);
    http::log_line("GET", &path, status, bytes, now.since(parked.since), None);
    cx.metrics.request(crate::http::Method::Get, &path, status);
    if keep_alive {
        http::rearm(id, conn, cx);
        cx.reprocess.push(id);
        cx.mark_write(id, conn);
    } else {
        closing::begin(id, conn, cx);
    }
}
