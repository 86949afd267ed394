//! The closing stage: the last answer is flushed, then the write side shut;
//! input is discarded until the peer closes or the linger deadline passes.

use std::time::Duration;

use super::conn::{Conn, LINGER_BYTES, Next, Phase};
use super::ctx::Ctx;
use super::read::{Got, READ_BUDGET};
use crate::api::Answer;
use crate::relay::{ApiError, ConnId};

/// How long a closing connection may take to flush and hear the peer close.
pub const LINGER: Duration = Duration::from_secs(2);

/// Moves a connection to the closing stage: its queued output is written,
/// then the write side shut, and the linger deadline bounds how long that
/// may take. Every path into the closing stage goes through here.
pub fn begin(id: ConnId, conn: &mut Conn, cx: &mut Ctx) {
    conn.begin_closing();
    let deadline = cx.now().after(LINGER);
    cx.set_deadline(id, conn, deadline);
    cx.queue_write(id, conn);
}

/// Sends an error answer and closes the connection after it (bad framing:
/// the next request's start can no longer be trusted).
pub fn reply_error(id: ConnId, conn: &mut Conn, cx: &mut Ctx, err: &ApiError) {
    if !matches!(conn.phase(), Phase::Http(_)) {
        return;
    }
    let meta = cx.meta(None, false);
    let answer = Answer::from(err.clone());
    let bytes = crate::http::response::encode(answer.status, &[], answer.body.bytes(), &meta);
    conn.out().push_owned(bytes);
    begin(id, conn, cx);
}

/// Discards input until the peer closes, within the turn's read budget and
/// at most [`LINGER_BYTES`] in all (an answer is not worth reading a flood
/// for the whole linger time: past that the connection just closes).
pub fn drain(id: ConnId, conn: &mut Conn, cx: &mut Ctx) -> Next {
    let mut read = 0;
    while conn.readable() {
        let Phase::Closing(closing) = conn.phase() else {
            return Next::Stay;
        };
        let shut = closing.shut;
        if closing.drained >= LINGER_BYTES {
            return Next::Close;
        }
        if read >= READ_BUDGET {
            cx.run_again(id);
            return Next::Stay;
        }
        match conn.discard(cx.read_buf(READ_BUDGET)) {
            Got::Bytes(n) => read += n,
            Got::Blocked => break,
            Got::Eof if shut => return Next::Close,
            // The peer is done sending; finish writing, then close
            // (after_drained sees `eof`).
            Got::Eof => conn.mark_eof(),
            Got::Failed => return Next::Close,
        }
    }
    Next::Stay
}
