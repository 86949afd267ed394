//! The parked stage: a `GET /prompts` waiting for a prompt, or a
//! `GET /asks` waiting for a reply. It costs nothing
//! until its deadline or a wake; later pipelined requests stay buffered,
//! unparsed, and are answered in order once it is. It keeps reading (up to
//! the reader's cap) only to notice a hang-up, which cancels the wait.
//! Invariant: a `Parked` connection has exactly one waiter entry in the
//! relay.

use std::rc::Rc;

use super::closing;
use super::conn::{Committing, Conn, Held, Next, Phase};
use super::ctx::Ctx;
use super::http;
use super::read::{Got, READ_BUDGET};
use crate::api::{Answer, Body};
use log::debug;

use crate::relay::{Abandon, ApiError, ConnId, Ticket};
use crate::time::Millis;

/// Reads what a parked poll's client sent; a hang-up (EOF, reset) closes
/// the connection, which cancels the wait. A reader that is full reads no
/// more, so a hang-up is then told by the socket's read-closed state.
/// A request waiting for its commit is different: its client may have sent
/// everything and shut its write side (`printf … | nc`), and the answers it
/// waits for are owed, so an EOF there only marks the connection to close
/// once they are written.
pub fn read(id: ConnId, conn: &mut Conn, cx: &mut Ctx) -> Next {
    let max_body = cx.cfg().max_body_bytes;
    let mut read = 0;
    while conn.readable() {
        let committing = matches!(conn.phase(), Phase::Committing(..));
        if !matches!(conn.phase(), Phase::Parked(..) | Phase::Committing(..)) {
            return Next::Stay;
        }
        let want = conn.want().min(READ_BUDGET - read);
        if want == 0 {
            if read >= READ_BUDGET {
                cx.run_again(id);
                return Next::Stay;
            }
            return if conn.read_closed() && !committing {
                Next::Close
            } else {
                Next::Stay
            };
        }
        match conn.read_requests(cx.read_buf(want), max_body) {
            Got::Bytes(n) => read += n,
            Got::Blocked => break,
            Got::Eof if committing => conn.mark_eof(),
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
    let Some(parked) = conn.unpark(now, cx.cfg().max_body_bytes) else {
        return;
    };
    cx.cancel_parked(id, &parked);
    let mut meta = cx.meta(parked.origin.as_deref(), parked.keep_alive);
    meta.http10 = parked.http10;
    let keep_alive = meta.keep_alive;
    let answer = Answer {
        status,
        body: Body::Shared(body),
        ..Answer::ok(Vec::new())
    };
    let bytes = http::queue(conn, answer, &meta);
    let path = match (&parked.ask, &parked.sid) {
        (Some(ask), Some(sid)) => format!("/asks/{sid}/{}", ask.ask_id),
        (None, Some(sid)) => format!("/prompts/{sid}"),
        (_, None) => "/prompts".to_string(),
    };
    http::log_line("GET", &path, status, bytes, now.since(parked.since), None);
    cx.count_request(crate::http::Method::Get, &path, status);
    if keep_alive {
        http::rearm(id, conn, cx);
        cx.run_again(id);
        cx.queue_write(id, conn);
    } else {
        closing::begin(id, conn, cx);
    }
}

/// A parked poll's deadline passed. A `GET /asks` parked until its ask's
/// own expiry is told "expired" only once the wall clock, which decides
/// replies, has reached the ask's `expires_ts`: the loop's monotonic clock
/// may run a few milliseconds ahead of it, and a reply accepted after the
/// poll was told "expired" would contradict it. Until then its deadline
/// moves by the difference (at most a second at a time).
pub fn deadline(id: ConnId, conn: &mut Conn, cx: &mut Ctx) {
    if let Phase::Parked(_, p) = conn.phase()
        && let Some(ask) = &p.ask
        && cx.now() >= ask.expires_at
        && cx.unix_ms() < ask.expires_ts
    {
        let lag = (ask.expires_ts - cx.unix_ms()).min(1_000);
        let later = Millis(cx.now().0.saturating_add(lag));
        cx.set_deadline(id, conn, later);
        return;
    }
    timed_out(id, conn, cx);
}

/// A parked poll's deadline passed, or the server shuts down: a
/// `GET /prompts` is answered `[]`, a `GET /asks` with its ask's state
/// (open, or expired when the deadline was the ask's own).
pub fn timed_out(id: ConnId, conn: &mut Conn, cx: &mut Ctx) {
    let (status, body) = match conn.phase() {
        Phase::Parked(_, p) => cx.ask_deadline(p),
        _ => return,
    };
    answer(id, conn, cx, status, body);
}

/// Answers a request that waited for the storage, and returns the
/// connection to reading requests. A result for another ticket (its
/// request was already answered: a storage timeout, a shutdown) is not
/// this request's and is dropped.
pub fn committed(to: Ticket, conn: &mut Conn, cx: &mut Ctx, result: Result<Vec<u8>, ApiError>) {
    let id = to.conn;
    let Some(Committing { request, since, .. }) = conn.resume_commit(to) else {
        debug!(ticket = to.n; "a storage result after its request was answered");
        return;
    };
    let answer = match result {
        Ok(body) => Answer::ok(body),
        Err(e) => Answer::from(e),
    };
    http::respond(id, conn, cx, request.head(), answer, since);
    after_commit(id, conn, cx);
}

/// Runs a request that waited for the storage again (what it needed is in
/// the loop's copy now). Only a `Held::Rerun` runs again; a request that kept
/// only its head to be answered (a write, or one that had a body) is
/// answered `503` instead, since what it sent is gone.
pub fn retry(to: Ticket, conn: &mut Conn, cx: &mut Ctx) {
    let id = to.conn;
    let Some(Committing { request, since, .. }) = conn.resume_commit(to) else {
        return;
    };
    match request {
        Held::Rerun(rerun) => {
            let outcome = cx.rerun(id, conn.peer(), &rerun);
            // A rerun has no body: if it waits again it is kept as one.
            http::apply(id, conn, cx, rerun.head(), 0, outcome, since);
        }
        Held::Answer(head) => {
            debug!(ticket = to.n; "a request with a body cannot run again");
            let answer = Answer::from(ApiError::storage_unavailable());
            http::respond(id, conn, cx, &head, answer, since);
        }
    }
    after_commit(id, conn, cx);
}

/// The storage timeout of a request waiting for its write, or a shutdown
/// that will not wait longer: a write the storage has not taken is
/// cancelled and answered `503` (it will never be stored); one it holds is
/// waited for (`last_call` false: another timeout's worth), or at shutdown
/// answered `504`, saying it may be stored.
pub fn commit_timed_out(id: ConnId, conn: &mut Conn, cx: &mut Ctx, last_call: bool) {
    let Phase::Committing(_, waiting) = conn.phase() else {
        return;
    };
    let ticket = waiting.ticket;
    let result = match cx.abandon(ticket) {
        Abandon::Cancelled => ApiError::storage_unavailable(),
        Abandon::InFlight if last_call => {
            ApiError::storage_uncertain("the server shut down before the storage confirmed it")
        }
        Abandon::InFlight => {
            let timeout = cx.cfg().store_timeout;
            debug!(waited_s = timeout.as_secs(); "a write waits for the storage beyond its timeout");
            let deadline = cx.now().after(timeout);
            cx.set_deadline(id, conn, deadline);
            return;
        }
    };
    committed(ticket, conn, cx, Err(result));
}

/// After the answer: buffered pipelined requests run this turn.
fn after_commit(id: ConnId, conn: &mut Conn, cx: &mut Ctx) {
    if matches!(conn.phase(), Phase::Http(_)) {
        http::rearm(id, conn, cx);
        cx.run_again(id);
    }
    cx.queue_write(id, conn);
}
