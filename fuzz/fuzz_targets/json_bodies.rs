//! JSON body validation and the relay core behind it.
//!
//! Every input is first given as-is to `NewPrompt::parse` and
//! `NewResponse::parse`. Then the same bytes are read as a program: byte 0
//! picks the core's limits, the rest is a list of operations (posts with
//! raw or built bodies, long-polls, subscriptions, history pages, session
//! puts and deletes, timeouts, idle sweeps) run against one `Relay`, with a
//! small model of the connections that respects the shell's invariants (a
//! connection is idle, parked once, or subscribed once).
//!
//! Asserts: no panic; every error is 400/404/409/503 with the contract's
//! text from `relay/error.rs`; every success body and effect body is JSON;
//! effects only target parked polls / subscribers; the core's counts of
//! parked polls and subscribers match the model; sessions stay under the cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use relay::error::SIZE_LIMIT;
use relay::store::model::{NewPrompt, NewResponse};
use relay::relay::{
    ApiError, ConnId, Effect, Fetch, Limits, MessagesQuery, PromptsQuery, Relay, Reply,
};
use relay::store::{Seq, SessionId};
use relay::time::Millis;

/// Session ids a routed request can carry (all valid), plus invalid ones
/// that only bodies can carry.
const SIDS: &[&str] = &["a", "b", "Zz0.-_~", "c"];
const BAD_SIDS: &[&str] = &["", "a b", "a/b", "é"];

/// One of `SIDS` as the id a route hands the relay.
fn session(sid: &str) -> SessionId {
    SessionId::new(sid).expect("SIDS are valid")
}
const IDS: &[&str] = &["m1", "m2", "m3", "m\"4", "\u{1F600}"];
/// Texts; inserted raw (unquoted) when the fuzzer says so, so the last two
/// are raw JSON literals: an escaped emoji and a lone surrogate escape.
const TEXTS: &[&str] = &[
    "",
    "hi",
    "h\"i\\\n",
    "\u{0}",
    "\u{1F600}",
    r#""\ud83d\ude00""#,
    r#""\ud800""#,
];
const METADATA: &[&str] = &[
    "null",
    "{}",
    "{\"k\":[1,{\"x\":null}]}",
    "[]",
    "5",
    "\"x\"",
    "true",
];
const TS: &[&str] = &[
    "null",
    "0",
    "1",
    "-1",
    "1.5",
    "1e3",
    "\"5\"",
    "18446744073709551615",
    "18446744073709551616",
];
const CONNS: usize = 6;

const STRING_FIELDS: &[&str] = &[
    "session_id",
    "prompt",
    "text",
    "client_msg_id",
    "assistant_msg_id",
];

/// Whether `e` is one of the contract's answers for these endpoints.
fn contract_error(e: &ApiError) -> bool {
    let s = &*e.error;
    match e.status {
        400 => {
            matches!(
                s,
                "Invalid JSON"
                    | "Request body must be a JSON object"
                    | "Invalid session_id"
                    | "Invalid metadata: must be an object"
                    | "Invalid metadata"
                    | "Invalid ts: must be a non-negative integer (milliseconds)"
            ) || s == SIZE_LIMIT
                || ["session_id", "prompt", "client_msg_id", "text"]
                    .iter()
                    .any(|f| s == format!("Missing required field: {f}"))
                || STRING_FIELDS
                    .iter()
                    .any(|f| s == format!("Invalid {f}: must be a string"))
                || ["client_msg_id", "assistant_msg_id"]
                    .iter()
                    .any(|f| s == format!("Invalid {f}: must be 1 to 256 bytes"))
        }
        404 => s == "Session not found" || s == "Prompt not found",
        409 => s == "Conflict",
        503 => s == "Service unavailable",
        _ => false,
    }
}

#[track_caller]
fn check_err(e: &ApiError) {
    assert!(contract_error(e), "error outside the contract: {e:?}");
    assert!(
        serde_json::from_slice::<serde_json::Value>(&e.body()).is_ok(),
        "error body is not JSON: {e:?}"
    );
}

/// Finding 1 in the fuzz notes: a text field holding a lone surrogate
/// escape (`"\ud800"`) is stored as its raw literal and echoed in replies
/// that serde_json refuses. While it stands, output that parses once every
/// surrogate escape is masked is let through, so the target can look for
/// other failures; set to `false` to reproduce it (fuzz/regressions/).
const TOLERATE_LONE_SURROGATES: bool = false;

#[track_caller]
fn check_json(bytes: &[u8]) -> serde_json::Value {
    match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(err) => {
            if TOLERATE_LONE_SURROGATES && let Some(v) = parse_masking_surrogates(bytes) {
                return v;
            }
            panic!("not JSON ({err}): {:?}", String::from_utf8_lossy(bytes))
        }
    }
}

/// Parses `bytes` with every `\uD800`-`\uDFFF` escape replaced by `\u0000`.
fn parse_masking_surrogates(bytes: &[u8]) -> Option<serde_json::Value> {
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i + 6 <= out.len() {
        let esc = &out[i..i + 6];
        if esc[0] == b'\\'
            && esc[1] == b'u'
            && matches!(esc[2], b'd' | b'D')
            && matches!(esc[3], b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F')
            && esc[4].is_ascii_hexdigit()
            && esc[5].is_ascii_hexdigit()
        {
            out[i + 2..i + 6].copy_from_slice(b"0000");
            i += 6;
        } else {
            i += 1;
        }
    }
    serde_json::from_slice(&out).ok()
}

/// A little-endian byte reader that yields zeros when the input runs out.
struct Input<'a> {
    data: &'a [u8],
    /// 128 KiB texts still allowed in this input (each costs ~1 ms).
    big_texts: u32,
}

impl Input<'_> {
    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    fn pick<'t>(&mut self, from: &[&'t str]) -> &'t str {
        from[self.byte() as usize % from.len()]
    }
    fn bytes(&mut self) -> Vec<u8> {
        let n = (self.byte() as usize).min(self.data.len());
        let (b, rest) = self.data.split_at(n);
        self.data = rest;
        b.to_vec()
    }
    fn small(&mut self) -> u64 {
        u64::from(self.byte() % 16)
    }
}

/// `"name":value` for a field the flags say to include; `raw` values are
/// inserted as they are, others as JSON strings.
fn field(out: &mut Vec<String>, name: &str, value: &str, raw: bool) {
    let v = if raw {
        value.to_string()
    } else {
        serde_json::to_string(value).unwrap()
    };
    out.push(format!("{}:{v}", serde_json::to_string(name).unwrap()));
}

/// A body built from pools of good and bad values, sometimes mangled.
fn built_body(inp: &mut Input, response: bool) -> Vec<u8> {
    let flags = inp.byte();
    let mut fields = Vec::new();
    if flags & 1 != 0 {
        let sid = if flags & 0x80 != 0 {
            inp.pick(BAD_SIDS)
        } else {
            inp.pick(SIDS)
        };
        field(&mut fields, "session_id", sid, false);
    }
    let text_name = if response { "text" } else { "prompt" };
    if flags & 2 != 0 {
        let sel = inp.byte();
        let text = match sel % 32 {
            // At and just above the text cap (rarely: they are slow).
            30 if inp.big_texts > 0 => {
                inp.big_texts -= 1;
                "x".repeat(128 * 1024)
            }
            31 if inp.big_texts > 0 => {
                inp.big_texts -= 1;
                "x".repeat(128 * 1024 + 1)
            }
            _ => inp.pick(TEXTS).to_string(),
        };
        if sel & 0x80 != 0 {
            field(&mut fields, text_name, &text, true); // unquoted: a number, bad JSON…
        } else {
            field(&mut fields, text_name, &text, false);
        }
    }
    if flags & 4 != 0 {
        let sel = inp.byte();
        match sel % 4 {
            0 => field(&mut fields, "client_msg_id", "", false),
            1 => field(&mut fields, "client_msg_id", &"i".repeat(257), false),
            _ => field(&mut fields, "client_msg_id", inp.pick(IDS), false),
        }
    }
    if response && flags & 8 != 0 {
        field(&mut fields, "assistant_msg_id", inp.pick(IDS), false);
    }
    if flags & 0x10 != 0 {
        field(&mut fields, "metadata", inp.pick(METADATA), true);
    }
    if flags & 0x20 != 0 {
        field(&mut fields, "ts", inp.pick(TS), true);
    }
    let mut body = format!("{{{}}}", fields.join(",")).into_bytes();
    if flags & 0x40 != 0 && !body.is_empty() {
        // Mangle: overwrite one byte.
        let at = inp.byte() as usize % body.len();
        body[at] = inp.byte();
    }
    body
}

/// What the shell knows about one connection.
#[derive(Clone, Debug, PartialEq)]
enum ConnState {
    Idle,
    Parked(&'static str),
    Subscribed(&'static str),
}

struct World {
    relay: Relay,
    conns: Vec<ConnState>,
    now: u64,
    max_sessions: usize,
}

fn conn_id(i: usize) -> ConnId {
    ConnId {
        key: i as u32,
        generation: 1,
    }
}

impl World {
    /// Applies the core's effects the way `net::server` does, checking each
    /// one targets a connection in the right stage.
    fn apply_effects(&mut self) {
        let mut effects = Vec::new();
        self.relay.take_effects(&mut effects);
        for e in effects {
            match e {
                Effect::Respond { to, status, body } => {
                    let i = to.key as usize;
                    assert!(
                        matches!(self.conns[i], ConnState::Parked(_)),
                        "Respond to a connection that is not parked: {:?}",
                        self.conns[i]
                    );
                    assert!(status == 200 || status == 404, "Respond status {status}");
                    check_json(&body);
                    self.conns[i] = ConnState::Idle;
                }
                Effect::CloseSubscriber { to, code } => {
                    let i = to.key as usize;
                    let ConnState::Subscribed(sid) = self.conns[i] else {
                        panic!("CloseSubscriber to {:?}", self.conns[i]);
                    };
                    assert_eq!(code, 1000);
                    self.relay.unsubscribe(to, sid, Millis(self.now));
                    self.conns[i] = ConnState::Idle;
                }
                Effect::Deliver { sid, frame, .. } => {
                    // The shell hands the frame to the subscribers: the
                    // subscriber list must match the model.
                    check_json(payload(&frame));
                    let subs = self.relay.subscribers(&sid).len();
                    let model = self
                        .conns
                        .iter()
                        .filter(|s| **s == ConnState::Subscribed(model_sid(&sid)))
                        .count();
                    assert_eq!(subs, model, "subscriber list vs model");
                }
                Effect::Broadcast { frame, .. } => {
                    // A live frame (a part, presence, a receipt): JSON too.
                    check_json(payload(&frame));
                }
                Effect::Reply { .. } | Effect::Retry { .. } => {
                    panic!("the in-memory engine never defers a reply")
                }
                Effect::Refill { .. } => {
                    panic!("the in-memory engine never reads a log again")
                }
            }
        }
    }

    fn check_counts(&self) {
        let c = self.relay.counts();
        let parked = self
            .conns
            .iter()
            .filter(|s| matches!(s, ConnState::Parked(_)))
            .count();
        let subs = self
            .conns
            .iter()
            .filter(|s| matches!(s, ConnState::Subscribed(_)))
            .count();
        assert_eq!(c.parked_polls, parked, "parked polls: core vs model");
        assert_eq!(c.subscribers, subs, "subscribers: core vs model");
        assert!(c.sessions <= self.max_sessions, "sessions above the cap");
    }

    fn step(&mut self, inp: &mut Input) {
        let op = inp.byte();
        let now = Millis(self.now);
        let unix_ms = 1_700_000_000_000;
        let kind = op % 12;
        match kind {
            0 | 1 => {
                let body = if kind == 0 {
                    inp.bytes()
                } else {
                    built_body(inp, false)
                };
                match self.relay.post_prompt(now, unix_ms, conn_id(0), &body) {
                    Ok(Reply::Now(ack)) => {
                        let v = check_json(&ack);
                        assert_eq!(v["stored"], true);
                    }
                    Ok(Reply::Wait) => panic!("the in-memory engine answers at once"),
                    Err(e) => check_err(&e),
                }
            }
            2 | 3 => {
                let body = if kind == 2 {
                    inp.bytes()
                } else {
                    built_body(inp, true)
                };
                match self.relay.post_response(now, unix_ms, conn_id(0), &body) {
                    Ok(Reply::Now(ack)) => {
                        check_json(&ack);
                    }
                    Ok(Reply::Wait) => panic!("the in-memory engine answers at once"),
                    Err(e) => check_err(&e),
                }
            }
            4 => {
                let i = inp.byte() as usize % CONNS;
                let sid = inp.pick(SIDS);
                let flags = inp.byte();
                let q = PromptsQuery {
                    timeout_ms: if flags & 1 != 0 { 0 } else { 30_000 },
                    wait: flags & 2 == 0,
                    after: (flags & 4 != 0).then(|| Seq(inp.small())),
                };
                if self.conns[i] != ConnState::Idle {
                    return;
                }
                match self.relay.get_prompts(now, conn_id(i), sid, q) {
                    Ok(Fetch::Ready(body)) => {
                        assert!(check_json(&body).is_array());
                    }
                    Ok(Fetch::Park { deadline, .. }) => {
                        assert!(deadline > now);
                        self.conns[i] = ConnState::Parked(sid);
                    }
                    Err(e) => check_err(&e),
                }
            }
            5 => {
                // A parked poll times out or hangs up.
                let i = inp.byte() as usize % CONNS;
                if let ConnState::Parked(sid) = self.conns[i] {
                    self.relay.cancel_wait(conn_id(i), sid, now);
                    self.conns[i] = ConnState::Idle;
                }
            }
            6 => {
                let i = inp.byte() as usize % CONNS;
                let sid = inp.pick(SIDS);
                let flags = inp.byte();
                let after = (flags & 1 != 0).then(|| Seq(inp.small()));
                let epoch = (flags & 2 != 0).then_some("not-the-epoch");
                if self.conns[i] != ConnState::Idle {
                    return;
                }
                match self
                    .relay
                    .subscribe(now, conn_id(i), &session(sid), after, epoch)
                {
                    Ok(Some(mut cursor)) => {
                        // The replay, as the shell pulls it: in slices of
                        // room, every frame valid JSON.
                        let mut frames = Vec::new();
                        for _ in 0..64 {
                            let done = self.relay.refill(sid, &mut cursor, 4096, true, &mut frames);
                            for f in frames.drain(..) {
                                check_json(payload(&f));
                            }
                            if done {
                                break;
                            }
                        }
                        self.conns[i] = ConnState::Subscribed(sid);
                    }
                    Ok(None) => panic!("the in-memory engine subscribes at once"),
                    Err(e) => check_err(&e),
                }
            }
            7 => {
                let i = inp.byte() as usize % CONNS;
                if let ConnState::Subscribed(sid) = self.conns[i] {
                    self.relay.unsubscribe(conn_id(i), sid, now);
                    self.conns[i] = ConnState::Idle;
                }
            }
            8 => {
                let sid = inp.pick(SIDS);
                let flags = inp.byte();
                let q = MessagesQuery {
                    limit: inp.small() as usize,
                    offset: inp.small() as usize,
                    since: (flags & 1 != 0).then(|| 1_700_000_000_000 + inp.small() - 8),
                    after: (flags & 2 != 0).then(|| Seq(inp.small())),
                };
                match self.relay.messages(now, sid, q) {
                    Ok(body) => {
                        let v = check_json(&body);
                        let n = v["messages"].as_array().map_or(usize::MAX, Vec::len);
                        assert!(n <= q.limit, "page of {n} above limit {}", q.limit);
                    }
                    Err(e) => check_err(&e),
                }
            }
            9 => {
                let sid = inp.pick(SIDS);
                match self.relay.put_session(now, conn_id(0), &session(sid)) {
                    Ok(Reply::Now(body)) => {
                        check_json(&body);
                    }
                    Ok(Reply::Wait) => panic!("the in-memory engine answers at once"),
                    Err(e) => check_err(&e),
                }
            }
            10 => {
                let sid = inp.pick(SIDS);
                match self.relay.delete_session(now, conn_id(0), sid) {
                    Ok(Reply::Now(body)) => {
                        check_json(&body);
                    }
                    Ok(Reply::Wait) => panic!("the in-memory engine answers at once"),
                    Err(e) => check_err(&e),
                }
            }
            _ => {
                // Time passes; the periodic sweep runs.
                self.now += u64::from(inp.byte()) * 10;
                self.relay.collect_idle(Millis(self.now));
            }
        }
    }
}

/// The JSON payload of a server text frame.
fn payload(frame: &[u8]) -> &[u8] {
    let at = match frame.get(1) {
        Some(126) => 4,
        Some(127) => 10,
        _ => 2,
    };
    &frame[at.min(frame.len())..]
}

/// The `&'static str` in `SIDS` equal to `sid`, for comparing with the model.
fn model_sid(sid: &str) -> &'static str {
    SIDS.iter().copied().find(|s| *s == sid).unwrap_or("")
}

fuzz_target!(|data: &[u8]| {
    if let Err(e) = NewPrompt::parse(data) {
        check_err(&e);
    }
    if let Err(e) = NewResponse::parse(data) {
        check_err(&e);
    }

    let mut inp = Input { data, big_texts: 1 };
    let l = inp.byte();
    let limits = Limits {
        history_limit: 1 + usize::from(l & 3),
        max_sessions: 1 + usize::from((l >> 2) & 3),
        max_pending: 1 + usize::from((l >> 4) & 3),
        max_waiters: 1 + usize::from((l >> 6) & 1),
        max_subscribers: 1 + usize::from(l >> 7),
        session_ttl_ms: 1000,
        draft_timeout_ms: 1000,
        agent_grace_ms: 1000,
        // The model knows nothing of the memory budget: none here.
        max_memory: usize::MAX,
    };
    let mut world = World {
        relay: Relay::in_memory(limits.clone()),
        conns: vec![ConnState::Idle; CONNS],
        now: 0,
        max_sessions: limits.max_sessions,
    };
    let mut ops = 0;
    while !inp.is_empty() && ops < 256 {
        world.step(&mut inp);
        world.apply_effects();
        world.check_counts();
        ops += 1;
    }
});
