//! The HTTP request parser and body framing, fed the way the loop feeds it:
//! bytes arrive in fuzzer-chosen pieces, never more than `want()` at a time,
//! and `next_step` runs until it needs more or fails. Every parsed head also
//! goes through routing, the query parsers and the upgrade check.
//!
//! Input layout: byte 0 picks `max_body`, bytes 1..3 pick how the rest is
//! split into reads, the rest is the connection's byte stream.
//!
//! Asserts: no panic; every error is one of the parser's contract errors
//! (400 / 413 / 431 with their texts); the buffer stays within the head cap +
//! `max_body` + the chunk window; a body is never above `max_body`; a reader
//! that needs more bytes always wants some (else the connection would stall).
#![no_main]

use libfuzzer_sys::fuzz_target;
use relay::config::Origins;
use relay::http::parse::{MAX_HEAD_BYTES, RequestReader, Step};
use relay::http::route::{
    MAX_LIMIT, MAX_POLL_MS, Route, messages_query, prompts_query, query_param, route,
};
use relay::http::{RequestHead, upgrade};
use relay::relay::ApiError;
use relay::error::SIZE_LIMIT;
use relay::store::model::valid_session_id;

/// The reader's chunked-body window (private in parse.rs).
const CHUNK_WINDOW: usize = 64 * 1024;

const PARSER_400: &[&str] = &[
    "Malformed request head",
    "Invalid framing header",
    "Invalid Content-Length",
    "Conflicting Content-Length",
    "Both Transfer-Encoding and Content-Length",
    "Unsupported Transfer-Encoding",
    "Malformed chunked body",
    "Missing or repeated Host header",
];

const QUERY_400: &[&str] = &[
    "Invalid timeout",
    "Invalid wait",
    "Invalid after",
    "Invalid limit",
    "Invalid offset",
    "Invalid since",
    "Invalid token",
];

const UPGRADE_400: &[&str] = &[
    "WebSocket upgrade required",
    "Unsupported WebSocket version",
    "Invalid Sec-WebSocket-Key",
];

fn assert_json_body(e: &ApiError) {
    let body = e.body();
    assert!(
        serde_json::from_slice::<serde_json::Value>(&body).is_ok(),
        "error body is not JSON: {e:?}"
    );
}

fn check_parser_error(e: &ApiError) {
    let ok = match e.status {
        400 => PARSER_400.contains(&&*e.error),
        413 => e.error == SIZE_LIMIT,
        431 => e.error == "Request header fields too large",
        _ => false,
    };
    assert!(ok, "parser error outside the contract: {e:?}");
    assert_json_body(e);
}

fn check_query_error(e: &ApiError) {
    assert!(
        e.status == 400 && QUERY_400.contains(&&*e.error),
        "query error outside the contract: {e:?}"
    );
    assert_json_body(e);
}

/// Routing, query parsing and the upgrade check on a parsed head.
fn check_head(head: &RequestHead) {
    match route(head.method(), &head.path) {
        Ok(
            Route::GetPrompts(sid)
            | Route::WebSocket(sid)
            | Route::Messages(sid)
            | Route::PutSession(sid)
            | Route::DeleteSession(sid),
        ) => assert!(
            valid_session_id(&sid),
            "routed an invalid session id {sid:?}"
        ),
        Ok(_) => {}
        Err(e) => {
            assert!(
                e.status == 400 && e.error == "Invalid session_id",
                "route error outside the contract: {e:?}"
            );
            assert_json_body(&e);
        }
    }
    let query = head.query.as_deref();
    match prompts_query(query) {
        Ok(q) => assert!(q.timeout_ms <= MAX_POLL_MS, "timeout not clamped: {q:?}"),
        Err(e) => check_query_error(&e),
    }
    match messages_query(query) {
        Ok(q) => assert!(q.limit <= MAX_LIMIT, "limit not clamped: {q:?}"),
        Err(e) => check_query_error(&e),
    }
    if let Err(e) = query_param(query, "token") {
        check_query_error(&e);
    }
    let origins = Origins::List(vec!["https://ok.example".into()]);
    if let Err(e) = upgrade::check(head, &origins) {
        let ok = match e.status {
            400 => UPGRADE_400.contains(&&*e.error),
            403 => e.error == "Origin not allowed",
            _ => false,
        };
        assert!(ok, "upgrade error outside the contract: {e:?}");
        assert_json_body(&e);
    }
}

/// Read sizes: everything at once, a byte at a time, or pseudo-random
/// pieces of up to 1..=256 bytes from a seed.
struct Splitter {
    mode: u8,
    state: u32,
}

impl Splitter {
    fn next(&mut self) -> usize {
        match self.mode % 4 {
            0 => usize::MAX,
            1 => 1,
            _ => {
                // xorshift32; the seed is never 0.
                self.state ^= self.state << 13;
                self.state ^= self.state >> 17;
                self.state ^= self.state << 5;
                let cap = if self.mode % 4 == 2 { 16 } else { 256 };
                1 + (self.state as usize % cap)
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let max_body = match data[0] % 4 {
        0 => 0,
        1 => 16,
        2 => 1024,
        _ => 1 << 20,
    };
    let mut split = Splitter {
        mode: data[1],
        state: u32::from(data[1]) << 8 | u32::from(data[2]) | 1,
    };
    let input = &data[3..];
    let bound = MAX_HEAD_BYTES + max_body + CHUNK_WINDOW;

    let mut reader = RequestReader::new(max_body);
    let mut pos = 0;
    let mut continues = 0usize;
    loop {
        match reader.next_step() {
            Ok(Step::Request(head)) => {
                let body = reader.body();
                assert!(
                    body.len() <= max_body,
                    "body of {} bytes above max_body {max_body}",
                    body.len()
                );
                check_head(&head);
                continues = 0;
            }
            Ok(Step::SendContinue) => {
                // At most one 100 Continue per request.
                continues += 1;
                assert!(continues <= 1, "100 Continue twice for one request");
            }
            Ok(Step::NeedMore) => {
                if pos == input.len() {
                    break;
                }
                let want = reader.want();
                assert!(want > 0, "reader needs more bytes but wants none: stall");
                let n = split.next().min(want).min(input.len() - pos);
                reader.push(&input[pos..pos + n]);
                pos += n;
                assert!(
                    reader.buffered().len() <= bound,
                    "buffered {} bytes, bound {bound}",
                    reader.buffered().len()
                );
            }
            Err(e) => {
                check_parser_error(&e);
                break;
            }
        }
    }
});
