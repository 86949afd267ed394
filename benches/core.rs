//! The cost of the relay's hot paths without sockets: parse a request, route
//! it, run the relay core, encode the answer (and the broadcast frame). A
//! fixed request mix, so under `valgrind --tool=callgrind` the instruction
//! count per operation is repeatable on a noisy machine
//! (`benches/callgrind.sh`); run plainly it prints ns per operation.
//!
//! `cargo bench --bench core -- [ingest|roundtrip] [ops]`

use std::hint::black_box;
use std::rc::Rc;
use std::time::Instant;

use relay::http::parse::{RequestReader, Step};
use relay::http::response::{self, Meta};
use relay::http::route::{self, Route};
use relay::relay::{ConnId, Fetch, Limits, Posted, PromptsQuery, Relay, response_ack};
use relay::time::Millis;

const SESSIONS: usize = 1000;

fn limits() -> Limits {
    Limits {
        history_limit: 10_000,
        max_sessions: 100_000,
        max_pending: 1000,
        max_waiters: 100,
        max_subscribers: 1000,
        session_ttl_ms: 86_400_000,
    }
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Parses one request out of `bytes` and routes it.
fn parse(reader: &mut RequestReader, bytes: &[u8]) -> (Route, Vec<u8>) {
    reader.push(bytes);
    match reader.next_step() {
        Ok(Step::Request(head, body)) => (
            route::route(head.method(), &head.path).unwrap_or(Route::NotFound),
            body,
        ),
        other => panic!("bench request did not parse: {other:?}"),
    }
}

fn meta() -> Meta<'static> {
    Meta {
        keep_alive: true,
        allow_origin: Some("*"),
        ..Meta::default()
    }
}

/// `POST /prompt` with a 256-byte prompt over 1000 sessions.
fn ingest(ops: usize) -> usize {
    let mut relay = Relay::new(limits());
    let mut reader = RequestReader::new(1 << 20);
    let text = "p".repeat(256);
    let mut out = 0;
    for i in 0..ops {
        let body = format!(
            r#"{{"session_id":"s{}","client_msg_id":"m{i}","prompt":"{text}"}}"#,
            i % SESSIONS
        );
        let (route, body) = parse(&mut reader, &post("/prompt", &body));
        assert_eq!(route, Route::PostPrompt);
        let ack = relay
            .post_prompt(Millis(i as u64), 1_700_000_000_000, &body)
            .unwrap_or_default();
        out += response::encode(200, &[], &ack, &meta()).len();
        // Answer it so the pending cap never fills.
        let body = format!(
            r#"{{"session_id":"s{}","client_msg_id":"m{i}","text":"ok"}}"#,
            i % SESSIONS
        );
        let _ = relay.post_response(Millis(i as u64), 1_700_000_000_000, body.as_bytes());
    }
    out
}

/// One round trip: the prompt wakes a parked poll, the agent answers, the
/// answer is framed once for the subscribers.
fn roundtrip(ops: usize) -> usize {
    let mut relay = Relay::new(limits());
    let mut reader = RequestReader::new(1 << 20);
    let agent = ConnId {
        key: 1,
        generation: 1,
    };
    let mut effects = Vec::new();
    let mut out = 0;
    let text = "r".repeat(256);
    for i in 0..ops {
        let sid = format!("s{}", i % SESSIONS);
        let q = PromptsQuery {
            timeout_ms: 30_000,
            wait: true,
            after: None,
        };
        let get = format!("GET /prompts/{sid}?timeout=30 HTTP/1.1\r\nHost: bench\r\n\r\n");
        let (route, _) = parse(&mut reader, get.as_bytes());
        if relay.put_session(Millis(0), &sid).is_err() || !matches!(route, Route::GetPrompts(_)) {
            panic!("setup failed");
        }
        assert!(matches!(
            relay.get_prompts(Millis(i as u64), agent, &sid, q),
            Ok(Fetch::Park { .. })
        ));
        let body = format!(r#"{{"session_id":"{sid}","client_msg_id":"m{i}","prompt":"hello"}}"#);
        let (_, body) = parse(&mut reader, &post("/prompt", &body));
        let ack = relay
            .post_prompt(Millis(i as u64), 1_700_000_000_000, &body)
            .unwrap_or_default();
        out += response::encode(200, &[], &ack, &meta()).len();
        relay.take_effects(&mut effects);
        for e in effects.drain(..) {
            if let relay::relay::Effect::Respond { body, .. } = e {
                out += response::encode(200, &[], &body, &meta()).len();
            }
        }
        let body = format!(r#"{{"session_id":"{sid}","client_msg_id":"m{i}","text":"{text}"}}"#);
        let (_, body) = parse(&mut reader, &post("/response", &body));
        if let Ok(Posted::Stored {
            assistant_msg_id,
            payload,
            ..
        }) = relay.post_response(Millis(i as u64), 1_700_000_000_000, &body)
        {
            let frame: Rc<[u8]> = relay_frame(&payload);
            out += frame.len();
            out +=
                response::encode(200, &[], &response_ack(&assistant_msg_id, true), &meta()).len();
        }
    }
    out
}

fn relay_frame(payload: &str) -> Rc<[u8]> {
    // The same framing the server uses: one unmasked text frame.
    let mut out = Vec::with_capacity(payload.len() + 10);
    out.push(0x81);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n < 65_536 => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload.as_bytes());
    out.into()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ops: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(20_000);
    let only = args
        .iter()
        .find(|a| a.parse::<usize>().is_err() && !a.starts_with('-'));
    let workloads = [
        ("ingest", ingest as fn(usize) -> usize),
        ("roundtrip", roundtrip),
    ];
    for (name, f) in workloads {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let t = Instant::now();
        black_box(f(black_box(ops)));
        let ns = t.elapsed().as_nanos() as f64 / ops as f64;
        println!("{name:<10} {ops} ops  {ns:>8.0} ns/op");
    }
}
