//! The cost of the relay's hot paths without sockets: parse a request, route
//! it, run the relay core, encode the answer (and the broadcast frame). A
//! fixed request mix, so under `valgrind --tool=callgrind` the instruction
//! count per operation is repeatable on a noisy machine
//! (`benches/callgrind.sh`); run plainly it prints ns per operation.
//!
//! `cargo bench --bench core -- [ingest|prompt|cancel|ask|reply|roundtrip|part|answer|token|wake|wakeall|wakeprefix] [ops]`

use std::hint::black_box;
use std::time::Instant;

use relay::http::parse::{RequestReader, Step};
use relay::http::response::{self, Meta};
use relay::http::route::{self, Route};
use relay::relay::{ConnId, Effect, Fetch, Limits, PromptsQuery, Relay, Reply, Scope};
use relay::store::model::{NewAsk, NewCancel, NewReply, Write};
use relay::store::types::EveryQuery;
use relay::time::Millis;
use relay::token::{Role, Secret};

const SESSIONS: usize = 1000;
/// The sessions the wake workloads spread their prompts over, unless
/// `WAKE_SESSIONS` says otherwise (to show the cost does not grow with
/// them).
fn wake_sessions() -> usize {
    std::env::var("WAKE_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn limits() -> Limits {
    Limits {
        history_limit: 10_000,
        max_sessions: 100_000,
        max_pending: 1000,
        max_waiters: 100,
        max_subscribers: 1000,
        session_ttl_ms: 86_400_000,
        draft_timeout_ms: 60_000,
        agent_grace_ms: 30_000,
        max_memory: 256 << 20,
    }
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Parses one request out of `bytes` and routes it; its body is then
/// `reader.body()`, as in the server.
fn parse(reader: &mut RequestReader, bytes: &[u8]) -> Route {
    reader.push(bytes);
    match reader.next_step() {
        Ok(Step::Request(head)) => {
            route::route(head.method(), &head.path).unwrap_or(Route::NotFound)
        }
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

/// The client's connection.
const CLIENT: ConnId = ConnId {
    key: 3,
    generation: 1,
};

/// An in-memory reply's body (empty for an error).
fn now_body(r: Result<Reply, relay::relay::ApiError>) -> Vec<u8> {
    match r {
        Ok(Reply::Now(body)) => body,
        _ => Vec::new(),
    }
}

/// Request bytes built before measuring, so only the server's work counts.
struct Inputs {
    prompts: Vec<Vec<u8>>,
    responses: Vec<Vec<u8>>,
    polls: Vec<Vec<u8>>,
    /// Parts of one draft per session, and as many final answers.
    parts: Vec<Vec<u8>>,
    answers: Vec<Vec<u8>>,
    sids: Vec<String>,
    /// A client token for one session per op (`SESSIONS` distinct ones).
    tokens: Vec<String>,
    /// A cancel of prompt `m<n>`, an ask `k<n>` and a reply to it, per op.
    cancels: Vec<Vec<u8>>,
    asks: Vec<Vec<u8>>,
    replies: Vec<Vec<u8>>,
}

fn inputs(ops: usize, text_len: usize) -> Inputs {
    let text = "t".repeat(text_len);
    let mut i = Inputs {
        prompts: Vec::with_capacity(ops),
        responses: Vec::with_capacity(ops),
        polls: Vec::with_capacity(ops),
        parts: Vec::with_capacity(ops),
        answers: Vec::with_capacity(ops),
        sids: Vec::with_capacity(ops),
        tokens: Vec::with_capacity(ops),
        cancels: Vec::with_capacity(ops),
        asks: Vec::with_capacity(ops),
        replies: Vec::with_capacity(ops),
    };
    let secret = token_secret();
    for n in 0..ops {
        let sid = format!("s{}", n % SESSIONS);
        let p = format!(r#"{{"session_id":"{sid}","client_msg_id":"m{n}","prompt":"{text}"}}"#);
        i.prompts.push(post("/prompt", &p));
        let r = format!(r#"{{"session_id":"{sid}","client_msg_id":"m{n}","text":"{text}"}}"#);
        i.responses.push(post("/response", &r));
        i.polls.push(
            format!("GET /prompts/{sid}?timeout=30 HTTP/1.1\r\nHost: bench\r\n\r\n").into_bytes(),
        );
        let s = n % SESSIONS;
        let d = format!(
            r#"{{"session_id":"{sid}","client_msg_id":"p{s}","assistant_msg_id":"d{s}","text":"{text}","partial":true}}"#
        );
        i.parts.push(post("/response", &d));
        let a = format!(
            r#"{{"session_id":"{sid}","client_msg_id":"p{s}","assistant_msg_id":"f{n}","text":"{text}"}}"#
        );
        i.answers.push(post("/response", &a));
        i.tokens
            .push(secret.mint(Role::Client, &sid, Some(2_000_000_000)));
        let c = format!(r#"{{"session_id":"{sid}","client_msg_id":"m{n}"}}"#);
        i.cancels.push(post("/cancel", &c));
        let k = format!(r#"{{"session_id":"{sid}","ask_id":"k{n}","text":"{text}"}}"#);
        i.asks.push(post("/ask", &k));
        i.replies.push(post("/reply", &k));
        i.sids.push(sid);
    }
    i
}

fn token_secret() -> Secret {
    Secret::new(b"a bench secret of at least 32 bytes").expect("long enough")
}

/// What a token for one session adds to a request: verify its HMAC-SHA256
/// tag (constant time), read its role and expiry, compare its session with
/// the request's; over 1000 sessions' tokens. The budget is 1 us per
/// request.
#[inline(never)]
fn measure_token(inp: &Inputs) -> usize {
    check_tokens(&token_secret(), &inp.tokens, &inp.sids)
}

/// The check of `measure_token` over `tokens`, each against its session.
fn check_tokens(secret: &Secret, tokens: &[String], sids: &[String]) -> usize {
    let now_s = 1_900_000_000;
    let mut ok = 0;
    for (token, sid) in tokens.iter().zip(sids) {
        let Ok(claims) = secret.open(black_box(token)) else {
            continue;
        };
        ok += usize::from(
            !claims.expired(now_s) && claims.role == Role::Client && claims.session() == sid,
        );
    }
    assert_eq!(ok, tokens.len(), "every bench token verifies");
    ok
}

/// The token check's fastest ns per op over batches of 1000: on a machine
/// shared with other work (two cores, builds running) the whole run's
/// average counts the time other processes held the core; the best batch
/// is what the check itself costs.
fn token_best_batch(inp: &Inputs) -> f64 {
    let secret = token_secret();
    let batch = 1000.min(inp.tokens.len()).max(1);
    inp.tokens
        .chunks(batch)
        .zip(inp.sids.chunks(batch))
        .map(|(tokens, sids)| {
            let t = Instant::now();
            black_box(check_tokens(&secret, black_box(tokens), sids));
            t.elapsed().as_nanos() as f64 / tokens.len() as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// `POST /prompt` with a 256-byte prompt over 1000 sessions, each answered
/// right after (so the pending cap never fills): parse, route, store, ack.
#[inline(never)]
fn measure_ingest(inp: &Inputs) -> usize {
    let mut relay = Relay::in_memory(limits());
    let mut reader = RequestReader::new(1 << 20);
    let mut out = 0;
    for (n, (p, r)) in inp.prompts.iter().zip(&inp.responses).enumerate() {
        let route = parse(&mut reader, p);
        assert_eq!(route, Route::PostPrompt);
        let ack = relay.post_prompt(Millis(n as u64), 1_700_000_000_000, CLIENT, reader.body());
        out += response::encode(200, &[], &now_body(ack), &meta()).len();
        parse(&mut reader, r);
        let _ = relay.post_response(Millis(n as u64), 1_700_000_000_000, CLIENT, reader.body());
    }
    out
}

/// `POST /prompt` alone, the prompt half of `ingest`: a 256-byte prompt
/// to one of 1000 sessions that exist already, left pending. What a
/// cancel, an ask and a reply are compared with.
#[inline(never)]
fn measure_prompt(relay: &mut Relay, inp: &Inputs) -> usize {
    posts(relay, &inp.prompts, Route::PostPrompt)
}

/// `POST /cancel` alone: the cancel of a pending prompt (set up before,
/// one per op, over 1000 sessions with no subscriber), stored as a
/// message with its `seq`.
#[inline(never)]
fn measure_cancel(relay: &mut Relay, inp: &Inputs) -> usize {
    posts(relay, &inp.cancels, Route::PostCancel)
}

/// `POST /ask` alone: an ask with its own `ask_id` and a 256-byte text
/// to one of 1000 sessions that exist already.
#[inline(never)]
fn measure_ask(relay: &mut Relay, inp: &Inputs) -> usize {
    posts(relay, &inp.asks, Route::PostAsk)
}

/// `POST /reply` alone: a 256-byte reply to an open ask (set up before,
/// one per op) without choices.
#[inline(never)]
fn measure_reply(relay: &mut Relay, inp: &Inputs) -> usize {
    posts(relay, &inp.replies, Route::PostReply)
}

/// Parses, routes and writes each of `requests` (each must route to
/// `want`), and encodes its ack; every one must be a 200.
fn posts(relay: &mut Relay, requests: &[Vec<u8>], want: Route) -> usize {
    let mut reader = RequestReader::new(1 << 20);
    let mut out = 0;
    for (n, req) in requests.iter().enumerate() {
        let route = parse(&mut reader, req);
        assert!(route == want, "routed to {route:?}");
        let body = reader.body();
        let w = match route {
            Route::PostPrompt => {
                relay.post_prompt(Millis(n as u64), 1_700_000_000_000, CLIENT, body)
            }
            Route::PostCancel => NewCancel::parse(body)
                .map(Write::Cancel)
                .and_then(|w| relay.write(Millis(n as u64), 1_700_000_000_000, CLIENT, w)),
            Route::PostAsk => NewAsk::parse(body)
                .map(Write::Ask)
                .and_then(|w| relay.write(Millis(n as u64), 1_700_000_000_000, CLIENT, w)),
            Route::PostReply => NewReply::parse(body)
                .map(Write::Reply)
                .and_then(|w| relay.write(Millis(n as u64), 1_700_000_000_000, CLIENT, w)),
            other => panic!("no bench for {other:?}"),
        };
        let ack = now_body(w);
        assert!(!ack.is_empty(), "request {n} refused");
        out += response::encode(200, &[], &ack, &meta()).len();
    }
    out
}

/// A workload that starts from a [`prepared`] relay.
type Prepared = fn(&mut Relay, &Inputs) -> usize;
/// What [`prepared`] writes beyond the sessions: requests and their route.
type Setup<'a> = Option<(&'a [Vec<u8>], Route)>;

/// A relay with the 1000 sessions, and (`with`) each of `requests`
/// written: the state a measured workload starts from, built outside it
/// so that only the measured op is counted. Kept after the measurement,
/// too: its drop is no part of the op.
fn prepared(inp: &Inputs, with: Setup) -> Relay {
    let mut relay = Relay::in_memory(limits());
    let sessions: Vec<Vec<u8>> = (0..SESSIONS)
        .map(|s| {
            post(
                "/prompt",
                &format!(r#"{{"session_id":"s{s}","client_msg_id":"setup{s}","prompt":"q"}}"#),
            )
        })
        .collect();
    posts(&mut relay, &sessions, Route::PostPrompt);
    if let Some((requests, route)) = with {
        posts(&mut relay, requests, route);
    }
    black_box(inp);
    relay
}

/// One round trip: a parked poll, the prompt that wakes it (and its
/// answer), the agent's response stored as its frame and handed to the
/// session's subscriber. Each session gets its subscriber on first use (the
/// first `SESSIONS` ops, the same in every run, so the callgrind difference
/// of two op counts cancels it).
#[inline(never)]
fn measure_roundtrip(inp: &Inputs) -> usize {
    let mut relay = Relay::in_memory(limits());
    let mut reader = RequestReader::new(1 << 20);
    let agent = ConnId {
        key: 1,
        generation: 1,
    };
    let subscriber = ConnId {
        key: 2,
        generation: 1,
    };
    let mut effects = Vec::new();
    let mut out = 0;
    for n in 0..inp.prompts.len() {
        let now = Millis(n as u64);
        let route = parse(&mut reader, &inp.polls[n]);
        let Route::GetPrompts(sid) = route else {
            panic!("setup failed")
        };
        let q = PromptsQuery {
            timeout_ms: 30_000,
            wait: true,
            after: None,
        };
        let _ = relay.put_session(now, agent, &sid);
        if n < SESSIONS {
            let _ = relay.subscribe(now, subscriber, &sid, None, None);
        }
        assert!(matches!(
            relay.get_prompts(now, agent, &sid, q),
            Ok(Fetch::Park { .. })
        ));
        parse(&mut reader, &inp.prompts[n]);
        let ack = relay.post_prompt(now, 1_700_000_000_000, CLIENT, reader.body());
        out += response::encode(200, &[], &now_body(ack), &meta()).len();
        relay.take_effects(&mut effects);
        for e in effects.drain(..) {
            if let Effect::Respond { body, .. } = e {
                out += response::encode(200, &[], &body, &meta()).len();
            }
        }
        parse(&mut reader, &inp.responses[n]);
        let ack = relay.post_response(now, 1_700_000_000_000, agent, reader.body());
        out += response::encode(200, &[], &now_body(ack), &meta()).len();
        relay.take_effects(&mut effects);
        for e in effects.drain(..) {
            if let Effect::Deliver { frame, .. } = e {
                out += frame.len();
            }
        }
    }
    out
}

/// A part of a streamed answer with 256 bytes of text, to a session with
/// one subscriber: parse, route, append to the draft, the `delta` frame
/// for the subscriber, the ack. One open draft per session, 1000 sessions.
#[inline(never)]
fn measure_part(inp: &Inputs) -> usize {
    answer_or_part(&inp.parts)
}

/// The same as [`measure_part`] with final answers (a new id each, several
/// per prompt): what a part is compared with.
#[inline(never)]
fn measure_answer(inp: &Inputs) -> usize {
    answer_or_part(&inp.answers)
}

/// Posts `bodies` to 1000 sessions that each have a prompt `p<n>` and a
/// subscriber (set up first, the same in every run, so the callgrind
/// difference of two op counts cancels it).
fn answer_or_part(bodies: &[Vec<u8>]) -> usize {
    let mut relay = Relay::in_memory(limits());
    let mut reader = RequestReader::new(1 << 20);
    let subscriber = ConnId {
        key: 2,
        generation: 1,
    };
    for s in 0..SESSIONS {
        let p = format!(r#"{{"session_id":"s{s}","client_msg_id":"p{s}","prompt":"q"}}"#);
        parse(&mut reader, &post("/prompt", &p));
        let _ = relay.post_prompt(Millis(0), 1_700_000_000_000, CLIENT, reader.body());
        let sid = relay::store::SessionId::new(&format!("s{s}")).expect("a valid id");
        let _ = relay.subscribe(Millis(0), subscriber, &sid, None, None);
    }
    let mut effects = Vec::new();
    let mut out = 0;
    for (n, body) in bodies.iter().enumerate() {
        parse(&mut reader, body);
        let ack = relay.post_response(Millis(n as u64), 1_700_000_000_000, CLIENT, reader.body());
        out += response::encode(200, &[], &now_body(ack), &meta()).len();
        relay.take_effects(&mut effects);
        for e in effects.drain(..) {
            match e {
                Effect::Deliver { frame, .. } | Effect::Broadcast { frame, .. } => {
                    out += frame.len()
                }
                _ => {}
            }
        }
    }
    out
}

/// The agent of the wake workloads.
const AGENT: ConnId = ConnId {
    key: 1,
    generation: 1,
};

/// A relay holding `WAKE_SESSIONS` sessions, each with one prompt
/// answered (so nothing is pending), and the prompt and answer requests of
/// the wake workloads: op `n` goes to session `n % WAKE_SESSIONS`.
fn wake_setup(ops: usize, others: usize) -> (Relay, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let sessions = wake_sessions();
    let mut l = limits();
    l.max_sessions = 2 * sessions + others;
    let mut relay = Relay::in_memory(l);
    let mut reader = RequestReader::new(1 << 20);
    for s in 0..sessions {
        let p = format!(r#"{{"session_id":"w{s}","client_msg_id":"setup","prompt":"q"}}"#);
        parse(&mut reader, &post("/prompt", &p));
        let _ = relay.post_prompt(Millis(0), 1_700_000_000_000, CLIENT, reader.body());
        let r = format!(r#"{{"session_id":"w{s}","client_msg_id":"setup","text":"a"}}"#);
        parse(&mut reader, &post("/response", &r));
        let _ = relay.post_response(Millis(0), 1_700_000_000_000, AGENT, reader.body());
    }
    // Prompts left pending in sessions outside the prefix `w`.
    for s in 0..others {
        let p = format!(r#"{{"session_id":"x{s}","client_msg_id":"left","prompt":"q"}}"#);
        parse(&mut reader, &post("/prompt", &p));
        let _ = relay.post_prompt(Millis(0), 1_700_000_000_000, CLIENT, reader.body());
    }
    let text = "t".repeat(256);
    let (mut prompts, mut answers) = (Vec::with_capacity(ops), Vec::with_capacity(ops));
    for n in 0..ops {
        let sid = format!("w{}", n % sessions);
        let p = format!(r#"{{"session_id":"{sid}","client_msg_id":"m{n}","prompt":"{text}"}}"#);
        prompts.push(post("/prompt", &p));
        let r = format!(r#"{{"session_id":"{sid}","client_msg_id":"m{n}","text":"{text}"}}"#);
        answers.push(post("/response", &r));
    }
    (relay, prompts, answers)
}

/// An agent parked on one session's `GET /prompts`, woken by a 256-byte
/// prompt there, answering it: per op the park, the prompt with its ack,
/// the woken poll's page and the answer, over 10,000 sessions. What
/// `wakeall` is compared with.
#[inline(never)]
fn measure_wake(relay: &mut Relay, prompts: &[Vec<u8>], answers: &[Vec<u8>]) -> usize {
    wake(relay, prompts, answers, None)
}

/// The same as [`measure_wake`] with the agent parked on `GET /prompts`
/// with no session (every session), each prompt going to the next of
/// 10,000 sessions: waking it must cost what waking one session's poll
/// costs.
#[inline(never)]
fn measure_wakeall(relay: &mut Relay, prompts: &[Vec<u8>], answers: &[Vec<u8>]) -> usize {
    wake(relay, prompts, answers, Some(Scope::Every))
}

/// The same as [`measure_wakeall`] with a token for the prefix `w` (the
/// sessions prompted), while 10,000 prompts of other sessions wait
/// unanswered: what they cost a poll of the prefix.
#[inline(never)]
fn measure_wakeprefix(relay: &mut Relay, prompts: &[Vec<u8>], answers: &[Vec<u8>]) -> usize {
    wake(relay, prompts, answers, Some(Scope::Prefix("w".into())))
}

/// `scope`: the agent's all-sessions poll, or (`None`) the session's own.
fn wake(
    relay: &mut Relay,
    prompts: &[Vec<u8>],
    answers: &[Vec<u8>],
    scope: Option<Scope>,
) -> usize {
    let sessions = wake_sessions();
    let mut reader = RequestReader::new(1 << 20);
    let mut effects = Vec::new();
    let mut out = 0;
    for (n, (p, a)) in prompts.iter().zip(answers).enumerate() {
        let now = Millis(n as u64);
        let parked = if let Some(scope) = &scope {
            let q = EveryQuery {
                timeout_ms: 30_000,
                wait: true,
                after: None,
                limit: 100,
            };
            relay.get_every_prompts(now, AGENT, scope.clone(), q)
        } else {
            let sid =
                relay::store::SessionId::new(&format!("w{}", n % sessions)).expect("a valid id");
            let q = PromptsQuery {
                timeout_ms: 30_000,
                wait: true,
                after: None,
            };
            relay.get_prompts(now, AGENT, &sid, q)
        };
        assert!(
            matches!(parked, Ok(Fetch::Park { .. })),
            "op {n} did not park"
        );
        parse(&mut reader, p);
        let ack = relay.post_prompt(now, 1_700_000_000_000, CLIENT, reader.body());
        out += response::encode(200, &[], &now_body(ack), &meta()).len();
        relay.take_effects(&mut effects);
        let mut woken = 0;
        for e in effects.drain(..) {
            if let Effect::Respond { body, .. } = e {
                out += response::encode(200, &[], &body, &meta()).len();
                woken += 1;
            }
        }
        assert_eq!(woken, 1, "op {n}: the prompt wakes the poll");
        parse(&mut reader, a);
        let ack = relay.post_response(now, 1_700_000_000_000, AGENT, reader.body());
        out += response::encode(200, &[], &now_body(ack), &meta()).len();
        relay.take_effects(&mut effects);
        effects.clear();
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ops: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(20_000);
    let only = args
        .iter()
        .find(|a| a.parse::<usize>().is_err() && !a.starts_with('-'));
    let inp = inputs(ops, 256);
    let workloads = [
        ("ingest", measure_ingest as fn(&Inputs) -> usize),
        ("roundtrip", measure_roundtrip),
        ("part", measure_part),
        ("answer", measure_answer),
        ("token", measure_token),
    ];
    // Each of these starts from a relay prepared outside the measured
    // function: the sessions, and the prompts to cancel or the asks to
    // reply to.
    let alone: [(&str, Prepared, Setup); 4] = [
        ("prompt", measure_prompt, None),
        (
            "cancel",
            measure_cancel,
            Some((&inp.prompts, Route::PostPrompt)),
        ),
        ("ask", measure_ask, None),
        ("reply", measure_reply, Some((&inp.asks, Route::PostAsk))),
    ];
    for (name, f, with) in alone {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let mut relay = prepared(&inp, with);
        let t = Instant::now();
        black_box(f(&mut relay, black_box(&inp)));
        let ns = t.elapsed().as_nanos() as f64 / ops as f64;
        println!("{name:<10} {ops} ops  {ns:>8.0} ns/op");
    }
    for (name, f) in [
        (
            "wake",
            measure_wake as fn(&mut Relay, &[Vec<u8>], &[Vec<u8>]) -> usize,
        ),
        ("wakeall", measure_wakeall),
        ("wakeprefix", measure_wakeprefix),
    ] {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let others = if name == "wakeprefix" { 10_000 } else { 0 };
        let (mut relay, prompts, answers) = wake_setup(ops, others);
        let t = Instant::now();
        black_box(f(&mut relay, black_box(&prompts), black_box(&answers)));
        let ns = t.elapsed().as_nanos() as f64 / ops as f64;
        println!("{name:<10} {ops} ops  {ns:>8.0} ns/op");
    }
    for (name, f) in workloads {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        let t = Instant::now();
        black_box(f(black_box(&inp)));
        let ns = t.elapsed().as_nanos() as f64 / ops as f64;
        println!("{name:<10} {ops} ops  {ns:>8.0} ns/op");
        if name == "token" {
            let best = token_best_batch(&inp);
            println!("{name:<10} best batch of 1000  {best:>8.0} ns/op");
        }
    }
}
