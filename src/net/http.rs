//! The HTTP stage of a connection: pull requests out of its reader one at a
//! time, hand each to the API rules, and queue the answers in order; park
//! the connection for a long-poll or move it to the WebSocket stage when
//! the API says so. Called by the loop whenever the connection has input or
//! was re-listed. Reads are budgeted per turn in bytes and in requests.

use std::rc::Rc;

use log::{debug, info};

use super::closing;
use super::conn::{Committing, Conn, Held, Next, Parked, ParkedAsk, Phase};
use super::ctx::Ctx;
use super::read::{Got, READ_BUDGET};
use super::ws::WsState;
use crate::api::{Answer, Body, Outcome};
use crate::http::parse::Step;
use crate::http::response::{self, CONTINUE, Meta};
use crate::http::{RequestHead, plain};
use crate::keepalive::Keepalive;
use crate::metrics;
use crate::relay::{ApiError, ConnId};
use crate::store::Seq;
use crate::time::Millis;

/// Requests answered on one connection per turn before others get a turn.
const REQUESTS_PER_TURN: usize = 64;
/// Unsent response bytes above which a connection's requests wait: a client
/// that pipelines without reading cannot grow our output.
pub const OUT_HIGH_WATER: usize = 256 * 1024;
/// Bodies up to this size are copied into the answer rather than queued apart.
const SHARE_ABOVE: usize = 4096;

/// Reads, parses and answers requests until the connection has no complete
/// request left, parks, upgrades, or used its turn's budget.
pub fn drive(id: ConnId, conn: &mut Conn, cx: &mut Ctx) -> Next {
    let peer = conn.peer();
    let max_body = cx.cfg().max_body_bytes;
    let mut handled = 0;
    let mut read = 0;
    loop {
        if conn.queued() > OUT_HIGH_WATER {
            conn.pause_reading(); // resumes once the output drains
            break;
        }
        if cx.store_saturated() {
            cx.stall(id); // resumes once the storage thread answers
            break;
        }
        let Some(h) = conn.http() else {
            return Next::Stay;
        };
        match h.reader.next_step() {
            Ok(Step::NeedMore) => {
                let want = h.reader.want().min(READ_BUDGET - read);
                if conn.eof() {
                    // The peer sent its last byte and everything complete
                    // is answered: flush, then close.
                    closing::begin(id, conn, cx);
                    return Next::Stay;
                }
                if !conn.readable() || want == 0 {
                    if conn.readable() {
                        cx.run_again(id); // the budget ran out
                    }
                    break;
                }
                match conn.read_requests(cx.read_buf(want), max_body) {
                    Got::Bytes(n) => read += n,
                    Got::Blocked => {}
                    // Answer what is buffered first, then close.
                    Got::Eof => conn.mark_eof(),
                    Got::Failed => {
                        if let Some(request) = conn.plain_http() {
                            refuse_plain_http(id, conn, cx, &request);
                            return Next::Stay;
                        }
                        return Next::Close;
                    }
                }
            }
            Ok(Step::SendContinue) => conn.out().push_owned(CONTINUE.to_vec()),
            Ok(Step::Request(head)) => {
                let started = h.request_started.take().unwrap_or(cx.now());
                let facts = cx.facts();
                let outcome = cx.handle(id, peer, &head, h.reader.body(), facts);
                let body_len = h.reader.body().len();
                h.reader.finish();
                apply(id, conn, cx, &head, body_len, outcome, started);
                handled += 1;
                if !matches!(conn.phase(), Phase::Http(_)) {
                    return Next::Stay; // parked, upgraded or closing
                }
                if handled >= REQUESTS_PER_TURN {
                    cx.run_again(id);
                    break;
                }
            }
            Err(e) => {
                debug!(status = e.status, reason = &*e.error; "bad request framing");
                closing::reply_error(id, conn, cx, &e);
                return Next::Stay;
            }
        }
    }
    rearm(id, conn, cx);
    Next::Stay
}

/// Answers a plain HTTP request sent to the TLS port, whose first bytes
/// were `request`, with a 400 in clear saying to use `https://` (as nginx
/// does; a TLS alert would reach the client as garbage), then closes: no
/// more of it is parsed. The closing stage drains what follows, so the
/// answer is not lost to a reset.
fn refuse_plain_http(id: ConnId, conn: &mut Conn, cx: &mut Ctx, request: &[u8]) {
    debug!(peer = conn.peer().to_string().as_str(); "plain HTTP on the TLS port");
    let err = ApiError::https_required(plain::host(request));
    closing::reply_error(id, conn, cx, &err);
}

/// Sets the HTTP stage's deadline: the request timeout for a request in
/// progress (counted per request, so a pipelining client is never timed as
/// a whole); otherwise the idle timeout from when it last had nothing to
/// do, which is the request timeout until a first request was answered
/// (a socket that never sends a byte does not hold a slot for long).
pub fn rearm(id: ConnId, conn: &mut Conn, cx: &mut Ctx) {
    let now = cx.now();
    let cfg = cx.cfg();
    let Some(h) = conn.http() else {
        return;
    };
    let deadline = if h.reader.mid_request() {
        h.request_started
            .get_or_insert(now)
            .after(cfg.request_timeout)
    } else if h.answered == 0 {
        h.idle_since.after(cfg.request_timeout)
    } else {
        h.idle_since.after(cfg.keepalive_timeout)
    };
    cx.set_deadline(id, conn, deadline);
}

/// Does what the API decided for one request, whose body was `body_len`
/// bytes (a request that waits for the storage may run again only if it
/// had none: see [`Held`]).
pub fn apply(
    id: ConnId,
    conn: &mut Conn,
    cx: &mut Ctx,
    head: &RequestHead,
    body_len: usize,
    outcome: Outcome,
    started: Millis,
) {
    match outcome {
        Outcome::Wait => {
            let Some(ticket) = cx.take_ticket() else {
                // Every write that waits was issued a ticket.
                let e = crate::relay::ApiError::storage_unavailable();
                respond(id, conn, cx, head, Answer::from(e), started);
                return;
            };
            let waiting = Committing {
                request: Held::new(head, body_len),
                since: started,
                ticket,
            };
            conn.await_commit(waiting);
            let deadline = cx.now().after(cx.cfg().store_timeout);
            cx.set_deadline(id, conn, deadline);
        }
        Outcome::Answer(answer) => respond(id, conn, cx, head, answer, started),
        Outcome::Metrics => {
            let answer = Answer {
                content_type: metrics::CONTENT_TYPE,
                ..Answer::ok(cx.render_metrics())
            };
            respond(id, conn, cx, head, answer, started);
        }
        Outcome::Park { sid, deadline } => {
            let parked = Parked {
                sid,
                keep_alive: head.keep_alive,
                http10: head.http10,
                origin: head.origin.as_deref().map(Rc::from),
                since: started,
                ask: None,
            };
            conn.park(parked);
            cx.set_deadline(id, conn, deadline);
        }
        Outcome::ParkAsk {
            sid,
            ask_id,
            deadline,
            expires_at,
            expires_ts,
        } => {
            let parked = Parked {
                sid: Some(sid),
                keep_alive: head.keep_alive,
                http10: head.http10,
                origin: head.origin.as_deref().map(Rc::from),
                since: started,
                ask: Some(Box::new(ParkedAsk {
                    ask_id: Rc::from(ask_id),
                    expires_at,
                    expires_ts,
                })),
            };
            conn.park(parked);
            cx.set_deadline(id, conn, deadline);
        }
        Outcome::Upgrade {
            accept,
            sid,
            cursor,
            after,
        } => {
            conn.out().push_owned(accept);
            let ping_ms = cx.cfg().ping_interval.as_millis() as u64;
            let keepalive = Keepalive::new(cx.now(), ping_ms);
            let deadline = keepalive.deadline();
            info!(session_id = &*sid, after = after.map_or(0, Seq::get), resume = after.is_some(); "client connected");
            log_request(head, 101, 0, cx.now().since(started), None);
            cx.count_request(head.method(), &head.path, 101);
            conn.upgrade(|leftover| WsState::new(leftover, sid, keepalive, cursor));
            // Frames may already be buffered behind the head: read them now.
            // The replay is the first refill, done when its output is written.
            cx.set_deadline(id, conn, deadline);
            cx.queue_write(id, conn);
            cx.run_again(id);
        }
    }
}

/// Queues an answer to `head`; a connection that does not stay open starts
/// closing.
pub fn respond(
    id: ConnId,
    conn: &mut Conn,
    cx: &mut Ctx,
    head: &RequestHead,
    mut answer: Answer,
    started: Millis,
) {
    let now = cx.now();
    let mut meta = cx.meta(head.origin.as_deref(), head.keep_alive);
    meta.http10 = head.http10;
    meta.head_only = head.method() == crate::http::Method::Head;
    let keep_alive = meta.keep_alive;
    let (status, reason) = (answer.status, answer.reason.take());
    let bytes = queue(conn, answer, &meta);
    log_request(head, status, bytes, now.since(started), reason.as_deref());
    cx.count_request(head.method(), &head.path, status);
    if let Some(h) = conn.http() {
        h.answered_at(now);
    }
    if !keep_alive {
        closing::begin(id, conn, cx);
    }
}

/// Encodes an answer into the connection's queue. A body queued apart
/// (shared, static, or large) follows its head as a chunk of its own; a
/// small one is copied into the answer (one chunk, one write). Returns the
/// bytes queued.
pub fn queue(conn: &mut Conn, answer: Answer, meta: &Meta) -> usize {
    let (status, ct) = (answer.status, answer.content_type);
    let extra: Vec<(&str, &str)> = answer.extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let body_len = answer.body.len();
    let apart = body_len > SHARE_ABOVE && !meta.head_only;
    let head = if apart {
        response::encode_head(status, ct, &extra, body_len, meta)
    } else {
        response::encode_typed(status, ct, &extra, answer.body.bytes(), meta)
    };
    let total = head.len() + if apart { body_len } else { 0 };
    let out = conn.out();
    out.push_owned(head);
    if apart {
        match answer.body {
            Body::Shared(b) => out.push_shared(b),
            Body::Static(b) => out.push_static(b),
            Body::Owned(b) => out.push_owned(b),
        }
    }
    total
}

/// The debug request log: method, path (never the query: tokens live
/// there), status, bytes, duration, and why for an error.
pub fn log_request(head: &RequestHead, status: u16, bytes: usize, ms: u64, reason: Option<&str>) {
    log_line(
        head.method().as_str(),
        &head.path,
        status,
        bytes,
        ms,
        reason,
    );
}

/// [`log_request`] from its parts (a parked poll keeps no head).
pub fn log_line(
    method: &str,
    path: &str,
    status: u16,
    bytes: usize,
    ms: u64,
    reason: Option<&str>,
) {
    match reason {
        Some(reason) => {
            debug!(method = method, path = path, status = status, bytes = bytes, duration_ms = ms, reason = reason; "request")
        }
        None => {
            debug!(method = method, path = path, status = status, bytes = bytes, duration_ms = ms; "request")
        }
    }
}
