//! The incremental parser fed the way a socket feeds it: whole, split at
//! every byte, pipelined, and over every cap.

use super::*;
use crate::http::{Framing, Method, RequestHead};

const MAX_BODY: usize = 1024;

fn reader() -> RequestReader {
    RequestReader::new(MAX_BODY)
}

/// A step with its request's body copied out, so steps can be collected.
#[derive(Debug)]
enum Got {
    NeedMore,
    SendContinue,
    Request(Box<RequestHead>, Vec<u8>),
}

/// The reader's next step, as a [`Got`].
fn step(r: &mut RequestReader) -> Result<Got, ApiError> {
    Ok(match r.next_step()? {
        Step::NeedMore => Got::NeedMore,
        Step::SendContinue => Got::SendContinue,
        Step::Request(head) => Got::Request(Box::new(head), r.body().to_vec()),
    })
}

/// Every step the reader yields from its buffer until it needs more bytes.
/// An error ends the list.
fn drain(r: &mut RequestReader) -> Vec<Result<Got, ApiError>> {
    let mut out = Vec::new();
    for _ in 0..100 {
        let step = step(r);
        let stop = matches!(step, Ok(Got::NeedMore) | Err(_));
        out.push(step);
        if stop {
            return out;
        }
    }
    panic!("reader never asked for more bytes: {out:?}");
}

/// The requests in `steps`, ignoring `SendContinue` and `NeedMore`;
/// panics on an error.
#[track_caller]
fn requests(steps: Vec<Result<Got, ApiError>>) -> Vec<(RequestHead, Vec<u8>)> {
    steps
        .into_iter()
        .filter_map(|s| match s {
            Ok(Got::Request(head, body)) => Some((*head, body)),
            Ok(_) => None,
            Err(e) => panic!("unexpected error {e:?}"),
        })
        .collect()
}

/// Pushes all of `bytes` at once and returns the one request they hold.
#[track_caller]
fn one(bytes: &[u8]) -> (RequestHead, Vec<u8>) {
    let mut r = reader();
    r.push(bytes);
    let mut got = requests(drain(&mut r));
    assert_eq!(got.len(), 1, "expected exactly one request");
    got.remove(0)
}

/// Pushes all of `bytes` and returns the error the reader answers with.
#[track_caller]
fn error(bytes: &[u8]) -> ApiError {
    let mut r = reader();
    r.push(bytes);
    match drain(&mut r).pop() {
        Some(Err(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[track_caller]
fn status(bytes: &[u8]) -> u16 {
    error(bytes).status
}

// ---- heads ----

#[test]
fn head_fed_byte_by_byte_needs_more_until_complete_then_yields_one_request() {
    let raw = b"GET /prompts/s1?wait=false&after=3 HTTP/1.1\r\nHost: x\r\nOrigin: http://o\r\n\r\n";
    let mut r = reader();
    for (i, b) in raw.iter().enumerate() {
        r.push(std::slice::from_ref(b));
        let step = step(&mut r).unwrap();
        if i + 1 < raw.len() {
            assert!(
                matches!(step, Got::NeedMore),
                "byte {i}: expected NeedMore, got {step:?}"
            );
            continue;
        }
        let Got::Request(head, body) = step else {
            panic!("expected the request after the last byte, got {step:?}");
        };
        assert_eq!(head.method(), Method::Get);
        assert_eq!(head.path, "/prompts/s1");
        assert_eq!(head.query.as_deref(), Some("wait=false&after=3"));
        assert_eq!(head.origin.as_deref(), Some("http://o"));
        assert_eq!(head.framing(), Framing::Empty);
        assert!(head.keep_alive && !head.http10);
        assert!(body.is_empty());
    }
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    assert!(r.buffered().is_empty());
}

#[test]
fn find_head_end_resumes_across_a_terminator_split_between_calls() {
    let full = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    for cut in 1..full.len() {
        let mut scanned = 0;
        assert_eq!(find_head_end(&full[..cut], &mut scanned), None, "cut {cut}");
        assert_eq!(scanned, cut);
        assert_eq!(
            find_head_end(full, &mut scanned),
            Some(full.len()),
            "cut {cut}"
        );
    }
}

#[test]
fn parse_head_reports_how_many_bytes_the_head_used() {
    let buf = b"POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";
    let (head, used) = parse_head(buf, &mut HeadScan::default()).unwrap().unwrap();
    assert_eq!(used, buf.len() - 2);
    assert_eq!(head.method(), Method::Post);
    assert_eq!(head.framing(), Framing::Length(2));
}

#[test]
fn bare_lf_head_is_accepted() {
    let (head, body) = one(b"POST /prompt HTTP/1.1\nHost: x\nContent-Length: 2\n\nhi");
    assert_eq!(head.path, "/prompt");
    assert_eq!(body, b"hi");
}

#[test]
fn a_leading_empty_line_before_the_request_line_is_ignored() {
    // RFC 9112 section 2.2: a server SHOULD ignore at least one empty line
    // received before the request-line.
    let (head, _) = one(b"\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(head.path, "/healthz");
}

#[test]
fn header_fields_are_copied_out_and_x_forwarded_for_lines_are_joined() {
    let (head, _) = one(
        b"GET /ws/s HTTP/1.1\r\nHost: x\r\nconnection: keep-alive, Upgrade\r\nUPGRADE: WebSocket\r\n\
          Sec-WebSocket-Key: k==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer t\r\n\
          Content-Type: application/json\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\n\
          Sec-WebSocket-Protocol: relay.v1\r\nsec-websocket-protocol: bearer.t\r\n\r\n",
    );
    assert_eq!(head.ws_protocols.as_deref(), Some("relay.v1,bearer.t"));
    assert!(head.websocket);
    assert_eq!(head.ws_key.as_deref(), Some("k=="));
    assert!(head.ws_version_13);
    assert_eq!(head.authorization.as_deref(), Some("Bearer t"));
    assert!(head.json);
    assert_eq!(head.forwarded_for.as_deref(), Some("1.1.1.1,2.2.2.2"));
}

#[test]
fn unknown_method_parses_as_other() {
    let (head, _) = one(b"PATCH /prompt HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(head.method(), Method::Other);
}

// ---- keep-alive ----

#[test]
fn http10_is_not_keep_alive_by_default() {
    let (head, _) = one(b"GET / HTTP/1.0\r\n\r\n");
    assert!(head.http10);
    assert!(!head.keep_alive);
}

#[test]
fn http10_with_connection_keep_alive_is_keep_alive() {
    let (head, _) = one(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    assert!(head.http10);
    assert!(head.keep_alive);
}

#[test]
fn http11_is_keep_alive_unless_connection_close() {
    assert!(one(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").0.keep_alive);
    assert!(
        !one(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, close\r\n\r\n")
            .0
            .keep_alive
    );
}

// ---- bodies ----

#[test]
fn pipelined_batch_of_three_requests_yields_three_requests_in_order() {
    let batch = b"POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst\
                  POST /response HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nsecond\r\n0\r\n\r\n\
                  PUT /sessions/s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nthird";
    let mut r = reader();
    r.push(batch);
    let got = requests(drain(&mut r));
    let summary: Vec<(Method, &str, &[u8])> = got
        .iter()
        .map(|(h, b)| (h.method(), &*h.path, b.as_slice()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (Method::Post, "/prompt", &b"first"[..]),
            (Method::Post, "/response", &b"second"[..]),
            (Method::Put, "/sessions/s", &b"third"[..]),
        ]
    );
    assert!(r.buffered().is_empty());
}

#[test]
fn pipelined_requests_come_one_per_next_step() {
    let mut r = reader();
    r.push(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n");
    let Got::Request(a, _) = step(&mut r).unwrap() else {
        panic!("expected /a");
    };
    assert_eq!(a.path, "/a");
    assert_eq!(r.buffered(), b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
    let Got::Request(b, _) = step(&mut r).unwrap() else {
        panic!("expected /b");
    };
    assert_eq!(b.path, "/b");
}

#[test]
fn content_length_body_split_across_pushes() {
    let mut r = reader();
    r.push(b"POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhel");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    assert_eq!(r.want(), 8);
    r.push(b"lo w");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    assert_eq!(r.want(), 4);
    r.push(b"orldGET");
    let got = requests(drain(&mut r));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, b"hello world");
    assert_eq!(
        r.buffered(),
        b"GET",
        "the next request's bytes stay buffered"
    );
}

#[test]
fn content_length_list_of_identical_values_is_accepted() {
    let (head, body) =
        one(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\nContent-Length: 3\r\n\r\nabc");
    assert_eq!(head.framing(), Framing::Length(3));
    assert_eq!(body, b"abc");
}

#[test]
fn content_length_zero_is_an_empty_body() {
    let (head, body) = one(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(head.framing(), Framing::Empty);
    assert!(body.is_empty());
}

const CHUNKED: &[u8] = b"POST /response HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
    5;name=value\r\nhello\r\n7 ; a ; b=\"q\"\r\n, world\r\nA\r\n!!!!!!!!!!\r\n0;last\r\n\
    X-Trailer: 1\r\nY: two\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n";
const CHUNKED_BODY: &[u8] = b"hello, world!!!!!!!!!!";

#[test]
fn chunked_body_with_extensions_and_trailers_decodes_whole() {
    let mut r = reader();
    r.push(CHUNKED);
    let got = requests(drain(&mut r));
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0.framing(), Framing::Chunked);
    assert_eq!(got[0].1, CHUNKED_BODY);
    assert_eq!(got[1].0.path, "/next");
    assert!(r.buffered().is_empty());
}

#[test]
fn chunked_body_split_at_every_byte_position_decodes_the_same() {
    for cut in 0..=CHUNKED.len() {
        let mut r = reader();
        r.push(&CHUNKED[..cut]);
        let mut got = requests(drain(&mut r));
        r.push(&CHUNKED[cut..]);
        got.extend(requests(drain(&mut r)));
        assert_eq!(got.len(), 2, "cut at {cut}");
        assert_eq!(got[0].1, CHUNKED_BODY, "cut at {cut}");
        assert_eq!(got[1].0.path, "/next", "cut at {cut}");
        assert!(r.buffered().is_empty(), "cut at {cut}");
    }
}

#[test]
fn chunked_body_fed_byte_by_byte_decodes() {
    let mut r = reader();
    let mut got = Vec::new();
    for b in CHUNKED {
        r.push(std::slice::from_ref(b));
        got.extend(requests(drain(&mut r)));
    }
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1, CHUNKED_BODY);
}

#[test]
fn chunked_decoder_reports_consumed_bytes_and_stops_after_the_last_chunk() {
    let mut d = ChunkedDecoder::new(100);
    let input = b"3\r\nabc\r\n0\r\n\r\nREST";
    let used = d.feed(input).unwrap();
    assert!(d.is_done());
    assert_eq!(&input[used..], b"REST");
    assert_eq!(d.take_body(), b"abc");
}

#[test]
fn chunked_with_a_bad_size_line_is_400() {
    let head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(status(&[&head[..], b"zz\r\nhi\r\n0\r\n\r\n"].concat()), 400);
    assert_eq!(status(&[&head[..], b"-1\r\n"].concat()), 400);
}

#[test]
fn chunked_without_crlf_after_chunk_data_is_400() {
    let head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(status(&[&head[..], b"2\r\nhiXX0\r\n\r\n"].concat()), 400);
}

#[test]
fn chunked_with_an_empty_size_line_is_400() {
    // RFC 9112 section 7.1: chunk-size = 1*HEXDIG; an empty line is not a
    // last-chunk, and reading it as one lets a body end where a peer that
    // parses strictly does not (request smuggling).
    let head = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(status(&[&head[..], b"2\r\nhi\r\n\r\n\r\n"].concat()), 400);
}

// ---- Expect: 100-continue ----

#[test]
fn expect_100_continue_yields_send_continue_once_before_the_body() {
    let mut r = reader();
    r.push(
        b"POST /prompt HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
    );
    assert!(matches!(step(&mut r).unwrap(), Got::SendContinue));
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    r.push(b"bo");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    r.push(b"dy");
    let Got::Request(head, body) = step(&mut r).unwrap() else {
        panic!("expected the request");
    };
    assert!(head.expect_continue);
    assert_eq!(body, b"body");
}

#[test]
fn expect_100_continue_on_a_chunked_body_yields_send_continue_once() {
    let mut r = reader();
    r.push(
        b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    assert!(matches!(step(&mut r).unwrap(), Got::SendContinue));
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    r.push(b"2\r\nok\r\n");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    r.push(b"0\r\n\r\n");
    let got = requests(drain(&mut r));
    assert_eq!(got[0].1, b"ok");
}

#[test]
fn expect_100_continue_is_skipped_when_the_body_already_arrived() {
    let mut r = reader();
    r.push(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi");
    assert!(matches!(step(&mut r).unwrap(), Got::Request(..)));
}

#[test]
fn send_continue_is_offered_again_for_the_next_request() {
    let mut r = reader();
    let req = b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n";
    for _ in 0..2 {
        r.push(req);
        assert!(matches!(step(&mut r).unwrap(), Got::SendContinue));
        r.push(b"x");
        assert!(matches!(step(&mut r).unwrap(), Got::Request(..)));
    }
}

#[test]
fn expect_100_continue_from_http10_is_ignored() {
    let mut r = reader();
    r.push(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
}

// ---- errors and caps ----

#[test]
fn head_over_16_kib_without_an_end_is_431() {
    let mut raw = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    raw.resize(MAX_HEAD_BYTES, b'a');
    let mut r = reader();
    r.push(&raw);
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    r.push(b"a");
    let e = step(&mut r).unwrap_err();
    assert_eq!(e.status, 431);
}

#[test]
fn complete_head_over_16_kib_is_431() {
    let mut raw = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    raw.resize(MAX_HEAD_BYTES, b'a');
    raw.extend_from_slice(b"\r\n\r\n");
    assert_eq!(status(&raw), 431);
}

#[test]
fn head_of_exactly_16_kib_is_accepted() {
    let mut raw = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    raw.resize(MAX_HEAD_BYTES - 4, b'a');
    raw.extend_from_slice(b"\r\n\r\n");
    assert_eq!(raw.len(), MAX_HEAD_BYTES);
    one(&raw);
}

#[test]
fn too_many_headers_is_431() {
    let mut raw = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..=MAX_HEADERS {
        raw.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    assert_eq!(status(&raw), 431);
}

#[test]
fn exactly_max_headers_is_accepted() {
    let mut raw = b"GET / HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 1..MAX_HEADERS {
        raw.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    one(&raw);
}

#[test]
fn content_length_above_max_body_is_413_before_the_body_arrives() {
    let e = error(
        format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        )
        .as_bytes(),
    );
    assert_eq!(e.status, 413);
    assert_eq!(e.error, "Message exceeds size limit");
}

#[test]
fn content_length_of_exactly_max_body_is_accepted() {
    let mut raw =
        format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY}\r\n\r\n").into_bytes();
    raw.resize(raw.len() + MAX_BODY, b'b');
    assert_eq!(one(&raw).1.len(), MAX_BODY);
}

fn chunked_of(sizes: &[usize]) -> Vec<u8> {
    let mut raw = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for &n in sizes {
        raw.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        raw.resize(raw.len() + n, b'c');
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    raw
}

#[test]
fn chunked_body_above_max_body_is_413() {
    let e = error(&chunked_of(&[MAX_BODY / 2, MAX_BODY / 2 + 1]));
    assert_eq!(e.status, 413);
    assert_eq!(e.error, "Message exceeds size limit");
    assert_eq!(status(&chunked_of(&[MAX_BODY + 1])), 413);
}

#[test]
fn chunked_trailers_over_16_kib_are_431() {
    let mut raw = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n".to_vec();
    for i in 0..(MAX_HEAD_BYTES / 16 + 1) {
        raw.extend_from_slice(format!("X-T{i:05}: vvvvv\r\n").as_bytes());
    }
    raw.extend_from_slice(b"\r\n");
    assert_eq!(status(&raw), 431);
}

#[test]
fn chunked_body_of_exactly_max_body_is_accepted() {
    let (_, body) = one(&chunked_of(&[MAX_BODY / 2, MAX_BODY / 2]));
    assert_eq!(body.len(), MAX_BODY);
}

const CHUNKED_HEAD: &[u8] = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";

/// A one-byte chunk whose size line, CRLF included, is `line_len` bytes.
fn chunk_with_extension(line_len: usize) -> Vec<u8> {
    let mut chunk = b"1;e=".to_vec();
    chunk.resize(line_len - 2, b'x');
    chunk.extend_from_slice(b"\r\nX\r\n");
    chunk
}

#[test]
fn chunk_size_line_of_256_bytes_is_accepted_and_257_is_400() {
    let mut raw = CHUNKED_HEAD.to_vec();
    raw.extend_from_slice(&chunk_with_extension(MAX_CHUNK_LINE));
    raw.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(one(&raw).1, b"X");
    let mut raw = CHUNKED_HEAD.to_vec();
    raw.extend_from_slice(&chunk_with_extension(MAX_CHUNK_LINE + 1));
    let e = error(&raw);
    assert_eq!((e.status, &*e.error), (400, "Malformed chunked body"));
    // Refused before its line ends, too: no newline among 256 bytes.
    let mut r = reader();
    r.push(CHUNKED_HEAD);
    r.push(&[b'1'; MAX_CHUNK_LINE - 1]);
    assert!(matches!(drain(&mut r).pop(), Some(Ok(Got::NeedMore))));
    r.push(b";");
    assert_eq!(step(&mut r).unwrap_err().status, 400);
}

#[test]
fn framing_far_above_the_body_is_413_long_before_the_body_cap() {
    // 200-byte extensions on one-byte chunks: about 200 bytes of framing
    // per body byte. Refused once the framing passes the body cap plus the
    // allowance, while the body is still a fraction of its cap.
    let mut r = reader();
    r.push(CHUNKED_HEAD);
    let chunk = chunk_with_extension(200);
    let mut sent = 0;
    let e = loop {
        r.push(&chunk);
        sent += 1;
        match step(&mut r) {
            Ok(Got::NeedMore) => assert!(sent < 1000, "never refused"),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => break e,
        }
    };
    assert_eq!((e.status, &*e.error), (413, "Message exceeds size limit"));
    // Each chunk is 202 bytes of framing (the line and the data's CRLF).
    assert_eq!(sent, (MAX_BODY + FRAMING_ALLOWANCE) / 202 + 1);
    assert!(sent < MAX_BODY, "body reached its cap first: {sent}");
}

#[test]
fn a_body_of_one_byte_chunks_up_to_the_cap_is_accepted() {
    // The smallest chunks a writer can make cost 5 bytes of framing each:
    // far inside the allowance.
    let (_, body) = one(&chunked_of(&[1; MAX_BODY]));
    assert_eq!(body.len(), MAX_BODY);
}

#[test]
fn conflicting_content_length_is_400() {
    assert_eq!(
        status(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"
        ),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\nhello!"),
        400
    );
}

#[test]
fn transfer_encoding_with_content_length_is_400() {
    assert_eq!(
        status(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ),
        400
    );
    assert_eq!(
        status(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n"
        ),
        400
    );
}

#[test]
fn non_chunked_transfer_encoding_is_400() {
    for te in ["gzip", "chunked, gzip", "identity"] {
        let raw = format!("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}\r\n\r\n");
        assert_eq!(status(raw.as_bytes()), 400, "Transfer-Encoding: {te}");
    }
}

#[test]
fn chunked_on_http10_is_400() {
    assert_eq!(
        status(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        400
    );
}

#[test]
fn negative_or_garbage_content_length_is_400() {
    for cl in [
        "-1",
        "abc",
        "+5",
        "5 5",
        "0x10",
        "1.5",
        "",
        "99999999999999999999",
    ] {
        let raw = format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {cl}\r\n\r\n");
        assert_eq!(status(raw.as_bytes()), 400, "Content-Length: {cl:?}");
    }
}

#[test]
fn garbage_request_line_is_400() {
    for raw in [
        &b"HELLO\r\n\r\n"[..],
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET  HTTP/1.1\r\n\r\n",
        b"G\x01T / HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n",
    ] {
        let e = error(raw);
        assert_eq!(e.status, 400, "{:?}", String::from_utf8_lossy(raw));
    }
}

#[test]
fn bytes_that_cannot_begin_a_request_are_400_before_the_head_ends() {
    // No end of head in any of these: today's bytes alone decide.
    for raw in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..],
        b"\x8f\x11\xc4\x00\x7f",
        b"GE\tT / HTTP/1.1",
        b"G{T / HTTP/1.1\r\n",
        b"GET /\x7f HTTP/1.1",
        b"PRI * HTTP/2.0\r\n",
        b"\r\n\r\nSSH-2.0-OpenSSH_9.6\r\n",
    ] {
        let mut r = reader();
        r.push(raw);
        let e = step(&mut r).unwrap_err();
        assert_eq!(
            (e.status, &*e.error),
            (400, "Malformed request head"),
            "{raw:?}"
        );
        assert!(e.details.is_some(), "{raw:?}");
    }
    let tls = error(b"\x16\x03\x01\x02\x00");
    assert!(tls.details.unwrap().contains("TLS"));
}

#[test]
fn the_start_of_a_sound_request_line_waits_for_more() {
    let mut r = reader();
    for piece in [&b"\r\n"[..], b"PO", b"ST /pr", b"ompt HTT", b"P/1.1\r\nHo"] {
        r.push(piece);
        assert!(matches!(step(&mut r).unwrap(), Got::NeedMore), "{piece:?}");
    }
    r.push(b"st: x\r\n\r\n");
    assert!(matches!(step(&mut r).unwrap(), Got::Request(..)));
}

#[test]
fn several_leading_empty_lines_are_ignored() {
    let (head, _) = one(b"\r\n\r\n\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(head.path, "/healthz");
    // Split between the empty lines and the request line.
    let mut r = reader();
    r.push(b"\r\n\r\n");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    r.push(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    let got = requests(drain(&mut r));
    assert_eq!(got[0].0.path, "/readyz");
    // Endless empty lines count against the head cap.
    assert_eq!(status(&b"\r\n".repeat(MAX_HEAD_BYTES)), 431);
}

#[test]
fn header_without_a_colon_is_400() {
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost x\r\n\r\n"), 400);
}

#[test]
fn http11_request_without_host_or_with_two_is_400() {
    assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
}

// ---- buffering ----

#[test]
fn want_is_bounded_by_the_head_cap_the_announced_body_and_the_chunk_window() {
    let mut r = RequestReader::new(10 * 1024 * 1024);
    // Head: room for one byte past the cap, so an endless head is seen as 431.
    assert_eq!(r.want(), MAX_HEAD_BYTES + 1);
    r.push(b"POST / HTTP/1.1\r\nHost: x\r\n");
    assert_eq!(r.want(), MAX_HEAD_BYTES + 1 - 26);
    // Content-Length body: exactly what is still missing, even when huge.
    r.push(b"Content-Length: 5000000\r\n\r\n12345");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    assert_eq!(r.want(), 5_000_000 - 5);
    // Chunked body: never more than the 64 KiB window, even for a large chunk.
    let mut r = RequestReader::new(10 * 1024 * 1024);
    r.push(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n100000\r\n");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    assert!(r.want() <= 64 * 1024, "want {}", r.want());
    assert!(r.want() > 0);
}

#[test]
fn want_is_zero_once_an_unfinished_head_fills_the_cap() {
    let mut r = reader();
    let mut raw = b"GET / HTTP/1.1\r\nHost: x\r\nX: ".to_vec();
    raw.resize(MAX_HEAD_BYTES, b'a');
    r.push(&raw);
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    assert_eq!(r.want(), 1);
    r.push(b"a");
    assert_eq!(r.want(), 0);
}

#[test]
fn take_rest_returns_the_bytes_after_the_request() {
    let mut r = reader();
    r.push(b"GET /ws/s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x85frame");
    let Got::Request(head, _) = step(&mut r).unwrap() else {
        panic!("expected the upgrade request");
    };
    assert!(head.websocket);
    assert_eq!(r.take_rest(), b"\x81\x85frame");
    assert!(r.buffered().is_empty());
    assert_eq!(r.take_rest(), b"");
}

#[test]
fn the_reader_frees_its_buffer_when_drained() {
    let mut r = reader();
    r.push(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(requests(drain(&mut r)).len(), 2);
    assert!(r.buffered().is_empty());
    assert_eq!(r.buf.capacity(), 0, "drained input still holds memory");
    assert!(!r.mid_request());
}

#[test]
fn the_reader_frees_its_buffer_after_a_chunked_body() {
    let mut r = reader();
    r.push(&chunked_of(&[100, 200]));
    assert_eq!(requests(drain(&mut r)).len(), 1);
    assert!(r.buffered().is_empty());
    assert_eq!(r.buf.capacity(), 0);
}

#[test]
fn mid_request_is_true_while_a_head_or_body_is_partial() {
    let mut r = reader();
    assert!(!r.mid_request());
    r.push(b"POST / HTTP/1.1\r\nHost: x\r\n");
    assert!(r.mid_request());
    r.push(b"Content-Length: 2\r\n\r\n");
    assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
    assert!(r.mid_request(), "head consumed, body missing");
    r.push(b"ok");
    assert!(matches!(step(&mut r).unwrap(), Got::Request(..)));
    assert!(!r.mid_request());
}

#[test]
fn a_never_drained_buffer_compacts_instead_of_growing() {
    // A busy keep-alive connection whose next request always starts in the
    // same read: the consumed prefix must be dropped, not kept forever.
    let req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut chunk = req[1..].to_vec();
    chunk.push(req[0]);
    let mut r = reader();
    r.push(&req[..1]);
    for _ in 0..5000 {
        r.push(&chunk);
        assert!(matches!(step(&mut r).unwrap(), Got::Request(..)));
        assert!(matches!(step(&mut r).unwrap(), Got::NeedMore));
        assert_eq!(r.buffered(), b"G");
    }
    assert!(r.buf.capacity() <= 4 * 4096, "{}", r.buf.capacity());
}

#[test]
fn a_whole_head_parses_as_the_same_head_dribbled_in() {
    for raw in [
        &b"POST /prompt HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"[..],
        b"\r\n\nGET /prompts/s?wait=false HTTP/1.0\nHost: x\nOrigin: o\n\n",
        b"GET /ws/s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\n\r\n",
    ] {
        let whole = one(raw);
        let mut r = reader();
        let mut dribbled = Vec::new();
        for b in raw {
            r.push(std::slice::from_ref(b));
            dribbled.extend(requests(drain(&mut r)));
        }
        assert_eq!(dribbled, vec![whole], "{raw:?}");
    }
}

#[test]
fn a_whole_head_with_a_bad_request_line_gets_the_early_checks_words() {
    for (raw, why) in [
        (
            &b"G{T / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            "the method is not a token",
        ),
        (b"GET /\x7f HTTP/1.1\r\nHost: x\r\n\r\n", "invalid byte"),
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", "not an HTTP/1.x"),
    ] {
        let e = error(raw);
        assert_eq!((e.status, &*e.error), (400, "Malformed request head"));
        assert!(e.details.is_some_and(|d| d.starts_with(why)), "{raw:?}");
    }
}
