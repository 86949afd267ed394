//! Redis, simulated: the relays of a shared-store run each hold the real
//! Redis engine (`RedisStore`, sans-IO), and this side plays the Redis
//! server at the RESP level. It reads the commands each relay wrote on
//! its two links (the script calls on the command link, `SUBSCRIBE`,
//! `UNSUBSCRIBE` and `PING` on the events link), runs them a few at a
//! time at the `Storage` steps, and answers them as `relay.lua` answers:
//! each write decided with the memory engine's rules on one shared
//! [`MemStore`] (the script mirrors those rules, and a differential test
//! holds the two together), each message kept as the record the relay
//! sent, the reply carrying what the caller's copy lacks, every change
//! published on its session's channel to the relays listening then.
//!
//! What Redis leaves open, the simulation varies: when a command runs
//! (each link's commands in order, the links and relays interleaved at
//! random), and when each relay reads what was sent to it (each link in
//! order, its two links apart, so a published change and the reply to
//! the write that made it come in either order). A fault cuts one link
//! of one relay (what was sent on it and not read is lost; the relay
//! connects again at the next `Storage` step) or turns Redis's memory
//! limit on or off (out of memory, every call of the script's write
//! function is refused, as Redis refuses it before it runs).
//!
//! The model follows what the shared store decided, record by record.
//! Each relay's copy must then hold nothing the model lacks, and each
//! write waiting on a ticket must be answered its own decision (or `503`
//! or `504` when the link it went on was lost).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;
use relay::store::StoreLimits;
use relay::store::model::{NewAsk, NewCancel, NewPrompt, NewReply, NewResponse, Write};
use relay::store::record::{Outcome as Decided, Record};
use relay::store::redis::{Link, RedisStore, RedisUrl, SCRIPT};

use super::storage::Expect;
use super::*;
use crate::ops::Rng;

/// Relays sharing the store.
pub(super) const NODES: usize = 2;
/// The key prefix every relay of the run uses.
const PREFIX: &str = "sim:";
pub(super) const LINKS: [Link; 2] = [Link::Command, Link::Events];

/// One connection of one relay, as Redis holds it.
#[derive(Default)]
pub(super) struct Conn {
    pub(super) up: bool,
    /// Bytes the relay wrote that hold no whole command yet.
    pub(super) input: Vec<u8>,
    /// Commands read and not run yet, in order.
    pub(super) commands: VecDeque<Vec<Vec<u8>>>,
    /// Frames sent to the relay and not read by it yet, in order.
    pub(super) output: VecDeque<Vec<u8>>,
    /// The channels it listens to (the events link).
    pub(super) channels: HashSet<Vec<u8>>,
}

/// A reply, before it is encoded.
enum R {
    Bulk(Vec<u8>),
    Int(i64),
    Array(Vec<R>),
    Error(String),
}

fn b(s: impl AsRef<[u8]>) -> R {
    R::Bulk(s.as_ref().to_vec())
}

fn encode(r: &R, out: &mut Vec<u8>) {
    match r {
        R::Bulk(v) => {
            out.extend_from_slice(format!("${}\r\n", v.len()).as_bytes());
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        R::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
        R::Error(e) => out.extend_from_slice(format!("-{e}\r\n").as_bytes()),
        R::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for i in items {
                encode(i, out);
            }
        }
    }
}

/// What one script call decided: records for the model, and whether
/// they are the sweep's collection.
pub(super) type Decisions = Vec<(Record, bool)>;

pub(super) struct Shared {
    store: MemStore,
    limits: StoreLimits,
    /// Each session's messages as the records the relays sent, by `seq`.
    records: HashMap<String, BTreeMap<u64, String>>,
    /// Each session's last activity (unix ms): the TTL's clock.
    activity: BTreeMap<String, u64>,
    /// Per session, until when each relay has subscribers of it.
    watch: HashMap<String, HashMap<String, u64>>,
    /// Parts published per streamed answer.
    parts: HashMap<(String, String), u32>,
    arrived: u64,
    pub(super) links: Vec<[Conn; 2]>,
    pub(super) rng: Rng,
    sha: String,
    /// Out of memory: the script's writes are refused.
    pub(super) oom: bool,
    /// Per relay, the decisions of its writes whose answers are on their
    /// way, by what names the write (see [`key_of_call`]).
    pub(super) expected: Vec<HashMap<String, VecDeque<Expect>>>,
}

/// A relay of a shared-store run: its engine is Redis, reached through
/// links this side plays, connected at once.
pub(super) fn relay(limits: relay::relay::Limits) -> Relay {
    let url = RedisUrl::parse("redis://sim:6379").unwrap_or_else(|e| panic!("{e}"));
    let engine = RedisStore::new(url, PREFIX, limits.store());
    let view = MemStore::new(limits.store());
    let mut relay = Relay::new(limits, view, Engine::Shared(engine));
    if let Some(r) = relay.engine().redis() {
        r.connected(Link::Command);
        r.connected(Link::Events);
    }
    relay
}

impl Shared {
    pub(super) fn new(limits: StoreLimits, seed: u64) -> Shared {
        use sha1::{Digest, Sha1};
        let sha = Sha1::digest(SCRIPT.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut links = Vec::new();
        for _ in 0..NODES {
            links.push([
                Conn {
                    up: true,
                    ..Conn::default()
                },
                Conn {
                    up: true,
                    ..Conn::default()
                },
            ]);
        }
        Shared {
            store: MemStore::new(limits),
            limits,
            records: HashMap::new(),
            activity: BTreeMap::new(),
            watch: HashMap::new(),
            parts: HashMap::new(),
            arrived: 0,
            links,
            rng: Rng::new(seed ^ 0x05ee_d0f7_ed15),
            sha,
            oom: false,
            expected: (0..NODES).map(|_| HashMap::new()).collect(),
        }
    }

    /// Bytes relay `n` wrote on link `l`: whole commands are queued.
    pub(super) fn written(&mut self, n: usize, l: usize, bytes: Vec<u8>) {
        let c = &mut self.links[n][l];
        if !c.up {
            return;
        }
        c.input.extend_from_slice(&bytes);
        let mut at = 0;
        while let Ok(Some((frame, used))) = decode(&c.input[at..]) {
            at += used;
            if let OwnedFrame::Array(parts) = frame {
                let args = parts
                    .into_iter()
                    .map(|p| match p {
                        OwnedFrame::BulkString(v) | OwnedFrame::SimpleString(v) => v,
                        _ => Vec::new(),
                    })
                    .collect();
                c.commands.push_back(args);
            }
        }
        c.input.drain(..at);
    }

    fn send(&mut self, n: usize, l: usize, r: R) {
        let c = &mut self.links[n][l];
        if c.up {
            let mut out = Vec::new();
            encode(&r, &mut out);
            c.output.push_back(out);
        }
    }

    fn publish(&mut self, channel: &[u8], message: &[u8]) -> i64 {
        let mut heard = 0;
        for n in 0..NODES {
            let ev = &self.links[n][1];
            crate::strace!(
                "publish {} to {n}: up {} listening {}",
                String::from_utf8_lossy(channel),
                ev.up,
                ev.channels.contains(channel)
            );
            if ev.up && ev.channels.contains(channel) {
                heard += 1;
                self.send(n, 1, R::Array(vec![b("message"), b(channel), b(message)]));
            }
        }
        heard
    }

    /// Runs the next command relay `n` sent on link `l`.
    pub(super) fn run(&mut self, n: usize, l: usize, out: &mut Decisions) {
        let Some(cmd) = self.links[n][l].commands.pop_front() else {
            return;
        };
        let name = cmd
            .first()
            .map(|c| c.to_ascii_uppercase())
            .unwrap_or_default();
        let arg = |i: usize| cmd.get(i).cloned().unwrap_or_default();
        let reply = match (l, name.as_slice()) {
            (1, b"SUBSCRIBE") => {
                let c = &mut self.links[n][1];
                c.channels.insert(arg(1));
                R::Array(vec![
                    b("subscribe"),
                    b(arg(1)),
                    R::Int(c.channels.len() as i64),
                ])
            }
            (1, b"UNSUBSCRIBE") => {
                let c = &mut self.links[n][1];
                c.channels.remove(&arg(1));
                R::Array(vec![
                    b("unsubscribe"),
                    b(arg(1)),
                    R::Int(c.channels.len() as i64),
                ])
            }
            (1, b"PING") => R::Array(vec![b("pong"), b("")]),
            (0, b"SCRIPT") => b(&self.sha),
            // As Redis 6.2 answers: calls go by EVALSHA.
            (0, b"FUNCTION") => R::Error("ERR unknown command 'FUNCTION'".to_string()),
            (0, b"PUBLISH") => R::Int(self.publish(&arg(1), &arg(2))),
            (0, b"HGETALL") => R::Array(Vec::new()),
            (0, b"EVALSHA") | (0, b"FCALL") => self.script(n, &cmd, out),
            _ => R::Error(format!(
                "ERR unknown command {}",
                String::from_utf8_lossy(&name)
            )),
        };
        if crate::tracing() {
            let mut o = Vec::new();
            encode(&reply, &mut o);
            let c: Vec<String> = cmd
                .iter()
                .skip(if l == 0 { 3 } else { 0 })
                .take(16)
                .map(|a| String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned())
                .collect();
            crate::strace!(
                "redis run {n}/{l}: {c:?} -> {:?}",
                String::from_utf8_lossy(&o[..o.len().min(300)])
            );
        }
        self.send(n, l, reply);
    }

    /// The script: its keys and arguments, run as `relay.lua` runs them.
    fn script(&mut self, n: usize, cmd: &[Vec<u8>], out: &mut Decisions) -> R {
        let keys: usize = text(cmd.get(2)).parse().unwrap_or(0);
        let a: Vec<String> = cmd
            .iter()
            .skip(3 + keys)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        // `A[i]` of the script.
        let arg = |i: usize| a.get(i - 1).map_or("", String::as_str);
        let op = arg(1);
        let reads = matches!(op, "sync" | "delete" | "collect" | "every");
        if self.oom && !reads {
            if let Some(k) = key_of_call(op, arg(2), arg(12)) {
                self.expect(n, k, Expect::Refused(503));
            }
            if op == "prompts" {
                for i in 0..(keys.saturating_sub(3)) {
                    let at = 12 + 6 * i;
                    self.expect(
                        n,
                        format!("prompt {} {}", arg(at), arg(at + 4)),
                        Expect::Refused(503),
                    );
                }
            }
            return R::Error("OOM command not allowed when used memory > 'maxmemory'.".to_string());
        }
        let now: u64 = arg(3).parse().unwrap_or(0);
        let call = Call {
            sid: arg(2).to_string(),
            known_epoch: arg(4).to_string(),
            known_next: arg(5).to_string(),
            now,
        };
        match op {
            "prompt" => self.prompt(n, &call, arg(12), arg(13), out),
            "prompts" => {
                let mut answers = Vec::new();
                let mut held: HashMap<String, (String, String)> = HashMap::new();
                for i in 0..(keys.saturating_sub(3)) {
                    let at = 12 + 6 * i;
                    let sid = arg(at).to_string();
                    let (known_epoch, known_next) = held
                        .get(&sid)
                        .cloned()
                        .unwrap_or((arg(at + 1).to_string(), arg(at + 2).to_string()));
                    let c = Call {
                        sid: sid.clone(),
                        known_epoch,
                        known_next,
                        now,
                    };
                    let r = self.prompt(n, &c, arg(at + 4), arg(at + 5), out);
                    if let Some(log) = self.store.get(&sid) {
                        held.insert(
                            sid,
                            (log.epoch().to_string(), log.next_seq().get().to_string()),
                        );
                    }
                    answers.push(r);
                }
                R::Array(answers)
            }
            "response" => {
                let (ts, _) = record_ts(arg(16));
                let w = Write::Response(NewResponse {
                    session_id: sid(&call.sid),
                    client_msg_id: Cow::Owned(arg(12).to_string()),
                    text: Cow::Owned(arg(15).to_string()),
                    assistant_msg_id: Some(given(arg(13))),
                    metadata: None,
                    ts: Some(ts),
                    partial: false,
                });
                let k = format!("response {} {}", call.sid, arg(12));
                self.write(n, &call, k, w, Some(arg(16)), out)
            }
            "part" => {
                let w = Write::Part(NewResponse {
                    session_id: sid(&call.sid),
                    client_msg_id: Cow::Owned(arg(12).to_string()),
                    text: Cow::Owned(arg(14).to_string()),
                    assistant_msg_id: Some(given(arg(13))),
                    metadata: None,
                    ts: Some(now),
                    partial: true,
                });
                let k = format!("part {} {}", call.sid, arg(12));
                let r = self.write(n, &call, k, w, None, out);
                if let R::Array(parts) = &r
                    && matches!(parts.first(), Some(R::Bulk(s)) if s == b"ok")
                    && let Some(log) = self.store.get(&call.sid)
                {
                    let count = self
                        .parts
                        .entry((call.sid.clone(), arg(13).to_string()))
                        .or_default();
                    *count += 1;
                    let msg = format!(
                        "P\n{}\n{}\n{}\n{}\n{count}\n{}",
                        call.sid,
                        log.epoch(),
                        arg(13),
                        arg(12),
                        arg(14)
                    );
                    self.publish(format!("{PREFIX}e:{}", call.sid).as_bytes(), msg.as_bytes());
                }
                r
            }
            "cancel" => {
                let (ts, _) = record_ts(arg(13));
                let w = Write::Cancel(NewCancel {
                    session_id: sid(&call.sid),
                    client_msg_id: Cow::Owned(arg(12).to_string()),
                    reason: None,
                    ts: Some(ts),
                });
                let k = format!("cancel {} {}", call.sid, arg(12));
                self.write(n, &call, k, w, Some(arg(13)), out)
            }
            "ask" => {
                let (ts, expires) = record_ts(arg(16));
                let choices = serde_json::from_str::<Vec<String>>(arg(15))
                    .ok()
                    .map(|c| c.into_iter().map(Cow::Owned).collect());
                let cid = (!arg(13).is_empty()).then(|| Cow::Owned(arg(13).to_string()));
                let w = Write::Ask(NewAsk {
                    session_id: sid(&call.sid),
                    ask_id: Some(given(arg(12))),
                    client_msg_id: cid,
                    text: Cow::Owned(arg(14).to_string()),
                    choices,
                    default: None,
                    timeout_ms: expires.saturating_sub(ts),
                    metadata: None,
                });
                let k = format!("ask {} {}", call.sid, arg(12));
                let call = Call { now: ts, ..call };
                self.write(n, &call, k, w, Some(arg(16)), out)
            }
            "reply" => {
                let w = Write::Reply(NewReply {
                    session_id: sid(&call.sid),
                    ask_id: Cow::Owned(arg(12).to_string()),
                    text: Cow::Owned(arg(13).to_string()),
                });
                let k = format!("reply {} {}", call.sid, arg(12));
                self.write(n, &call, k, w, Some(arg(14)), out)
            }
            "create" => {
                let w = Write::Create {
                    sid: Cow::Owned(sid(&call.sid)),
                    put: true,
                };
                self.activity
                    .entry(call.sid.clone())
                    .and_modify(|t| *t = now);
                self.write(n, &call, String::new(), w, None, out)
            }
            "delete" => {
                let w = Write::Delete {
                    sid: Cow::Owned(call.sid.clone()),
                };
                let k = format!("delete {}", call.sid);
                match self.write(n, &call, k, w, None, out) {
                    R::Array(mut parts)
                        if !parts.is_empty() && self.store.get(&call.sid).is_none() =>
                    {
                        // Deleted or missing: the session is gone.
                        let status = parts.swap_remove(0);
                        self.gone(status)
                    }
                    r => r,
                }
            }
            "sync" => self.answer(b("ok"), &call, "sync"),
            "collect" => {
                let ttl: u64 = arg(12).parse().unwrap_or(u64::MAX);
                let idle: Vec<String> = self
                    .activity
                    .iter()
                    .filter(|(_, t)| now.saturating_sub(**t) >= ttl)
                    .map(|(s, _)| s.clone())
                    .take(256)
                    .collect();
                let count = idle.len();
                for s in idle {
                    let c = Call {
                        sid: s.clone(),
                        ..call.clone()
                    };
                    let mut decided = Vec::new();
                    let w = Write::Delete {
                        sid: Cow::Owned(s.clone()),
                    };
                    let _ = self.decide(&c, w, None, &mut decided);
                    out.extend(decided.into_iter().map(|(r, _)| (r, true)));
                }
                R::Array(vec![b("ok"), b(count.to_string())])
            }
            "watch" => {
                let w = self.watch.entry(call.sid.clone()).or_default();
                if arg(13) == "0" {
                    w.remove(arg(12));
                } else if self.store.contains(&call.sid) {
                    w.insert(arg(12).to_string(), arg(13).parse().unwrap_or(0));
                }
                R::Array(vec![b("ok"), b("")])
            }
            "touch" => {
                for s in a.iter().skip(11) {
                    self.activity.entry(s.clone()).and_modify(|t| *t = now);
                }
                R::Array(vec![b("ok"), b("")])
            }
            "probe" => R::Array(vec![b("ok"), b("g")]),
            "every" => R::Array(vec![b("ok"), b("")]),
            "agent" | "everyagent" => R::Array(vec![b("ok"), b("")]),
            other => R::Error(format!("ERR relay: unknown op {other}")),
        }
    }

    fn expect(&mut self, n: usize, key: String, e: Expect) {
        if !key.is_empty() {
            self.expected[n].entry(key).or_default().push_back(e);
        }
    }

    /// One prompt of a `prompt` or `prompts` call.
    fn prompt(&mut self, n: usize, call: &Call, cid: &str, record: &str, out: &mut Decisions) -> R {
        let (ts, _) = record_ts(record);
        let head = record.splitn(5, '\n').nth(4).unwrap_or("");
        let v: Value = serde_json::from_str(&format!("{head}0}}")).unwrap_or(Value::Null);
        let w = Write::Prompt(NewPrompt {
            session_id: sid(&call.sid),
            prompt: Cow::Owned(v["prompt"].to_string()),
            client_msg_id: Some(given(cid)),
            metadata: v.get("metadata").map(|m| Cow::Owned(m.to_string())),
            ts: Some(ts),
        });
        let k = format!("prompt {} {cid}", call.sid);
        self.write(n, call, k, w, Some(record), out)
    }

    /// A write decided and answered as the script answers it (`status`,
    /// `extra`, then the session as the caller's copy lacks it), its
    /// decision expected by the relay's requester.
    fn write(
        &mut self,
        n: usize,
        call: &Call,
        key: String,
        w: Write,
        record: Option<&str>,
        out: &mut Decisions,
    ) -> R {
        let existed = self.store.contains(&call.sid);
        let result = self.decide(call, w, record, out);
        let expect = match &result {
            Ok(o) => Expect::Ok(seq_of(o)),
            Err(e) => Expect::Refused(e.status),
        };
        self.expect(n, key, expect);
        let (status, extra) = match &result {
            Ok(o) => {
                let dup = matches!(
                    o,
                    Decided::Prompt {
                        duplicate: true,
                        ..
                    } | Decided::Response {
                        duplicate: true,
                        ..
                    } | Decided::Cancel {
                        duplicate: true,
                        ..
                    } | Decided::Ask {
                        duplicate: true,
                        ..
                    } | Decided::Reply {
                        duplicate: true,
                        ..
                    }
                );
                let extra = match o {
                    Decided::Prompt { .. } => created(existed, &self.store, &call.sid),
                    Decided::Session { created, .. } => {
                        if *created { "1" } else { "0" }.to_string()
                    }
                    Decided::Cancel { seq, .. } if dup => seq.get().to_string(),
                    Decided::Ask {
                        seq, expires_ts, ..
                    } if dup => format!("{}\n{expires_ts}", seq.get()),
                    Decided::Reply { seq, .. } if dup => seq.get().to_string(),
                    Decided::Response { .. } | Decided::Part { .. } | Decided::Cancel { .. } => {
                        self.watched(&call.sid, call.now)
                    }
                    _ => String::new(),
                };
                (if dup { "dup" } else { "ok" }, extra)
            }
            Err(e) => {
                let extra = if record.is_some_and(|r| r.starts_with('P')) {
                    created(existed, &self.store, &call.sid)
                } else {
                    String::new()
                };
                (code_of(e), extra)
            }
        };
        if self.store.get(&call.sid).is_none() {
            return self.gone(b(status));
        }
        self.answer(b(status), call, &extra)
    }

    /// Decides `w` on the shared store and publishes what it changed;
    /// the records go to `out` for the model.
    fn decide(
        &mut self,
        call: &Call,
        w: Write,
        record: Option<&str>,
        out: &mut Decisions,
    ) -> Result<Decided, ApiError> {
        let mut records = Vec::new();
        let result = self.store.decide(Millis(0), call.now, w, &mut records);
        let channel = format!("{PREFIX}e:{}", call.sid);
        for r in records {
            let epoch = self
                .store
                .get(&call.sid)
                .map(|l| l.epoch().to_string())
                .unwrap_or_default();
            let message = match &r {
                Record::Created { epoch, .. } => {
                    self.records.insert(call.sid.clone(), BTreeMap::new());
                    self.activity.insert(call.sid.clone(), call.now);
                    format!("C\n{}\n{epoch}", call.sid)
                }
                Record::Deleted { .. } => {
                    self.records.remove(&call.sid);
                    self.activity.remove(&call.sid);
                    self.watch.remove(&call.sid);
                    format!("D\n{}\n{epoch}", call.sid)
                }
                Record::Prompt { seq, .. }
                | Record::Response { seq, .. }
                | Record::Cancel { seq, .. }
                | Record::Ask { seq, .. }
                | Record::Reply { seq, .. } => {
                    let rec = record.unwrap_or("").to_string();
                    self.records
                        .entry(call.sid.clone())
                        .or_default()
                        .insert(seq.get(), rec.clone());
                    self.activity.insert(call.sid.clone(), call.now);
                    if matches!(r, Record::Prompt { .. }) {
                        self.arrived += 1;
                        let a = format!("{}\n{}", call.sid, self.arrived);
                        self.publish(format!("{PREFIX}arrivals").as_bytes(), a.as_bytes());
                    }
                    format!("M\n{}\n{epoch}\n{}\n{rec}", call.sid, seq.get())
                }
            };
            self.store.apply(Millis(0), r.clone());
            self.publish(channel.as_bytes(), message.as_bytes());
            out.push((r, false));
        }
        result
    }

    /// `1` when a relay has subscribers of `sid` (an answer's
    /// `delivered`).
    fn watched(&self, sid: &str, now: u64) -> String {
        let on = self
            .watch
            .get(sid)
            .is_some_and(|w| w.values().any(|&until| until > now));
        if on { "1" } else { "0" }.to_string()
    }

    fn gone(&self, status: R) -> R {
        R::Array(vec![
            status,
            b(""),
            b(""),
            b(""),
            b(""),
            b(""),
            b(""),
            b("g"),
        ])
    }

    /// The script's `answer`: the session after the call, as the records
    /// the caller lacks, or whole when it holds another epoch or too
    /// little.
    fn answer(&self, status: R, call: &Call, extra: &str) -> R {
        let Some(log) = self.store.get(&call.sid) else {
            return self.gone(status);
        };
        let (next, la, da) = log.counters();
        let n = next.get();
        let mut out = vec![
            status,
            b(extra),
            b(log.epoch().as_bytes()),
            b(n.to_string()),
            b(la.get().to_string()),
            b(da.get().to_string()),
            b("0"),
            b(""),
        ];
        let empty = BTreeMap::new();
        let recs = self.records.get(&call.sid).unwrap_or(&empty);
        let known: Option<u64> = call.known_next.parse().ok();
        let limit = self.limits.history_limit as u64;
        match known {
            Some(k) if *call.known_epoch == *log.epoch() && k + limit >= n && k <= n => {
                for (q, r) in recs.range(k..n) {
                    out.push(b(q.to_string()));
                    out.push(b(r));
                }
            }
            _ => {
                out[6] = b("1");
                out[7] = b("g");
                let first = log.first_seq().get();
                for (q, r) in recs {
                    if *q >= first || log.retains(Seq(*q)) {
                        out.push(b(q.to_string()));
                        out.push(b(r));
                    }
                }
            }
        }
        R::Array(out)
    }
}

/// What a script call names, as the simulated requests name it too.
#[derive(Clone)]
struct Call {
    sid: String,
    known_epoch: String,
    known_next: String,
    now: u64,
}

/// The name under which a write's decision waits for its answer: its
/// operation, session and id, as [`key_of_op`] names the request.
fn key_of_call(op: &str, sid: &str, id: &str) -> Option<String> {
    match op {
        "prompt" | "response" | "part" | "cancel" | "ask" | "reply" => {
            Some(format!("{op} {sid} {id}"))
        }
        "delete" => Some(format!("delete {sid}")),
        _ => None,
    }
}

/// The name of a write request's decision (see [`key_of_call`]).
pub(super) fn key_of_op(op: &Op) -> Option<String> {
    Some(match *op {
        Op::Prompt { s, id, .. } => format!("prompt s{s} c{id}"),
        Op::Answer { s, prompt, .. } => format!("response s{s} c{prompt}"),
        Op::Part { s, prompt, .. } => format!("part s{s} c{prompt}"),
        Op::Cancel { s, prompt } => format!("cancel s{s} c{prompt}"),
        Op::Ask { s, id, .. } => format!("ask s{s} k{id}"),
        Op::Reply { s, ask, .. } => format!("reply s{s} k{ask}"),
        Op::Delete { s } => format!("delete s{s}"),
        _ => return None,
    })
}

fn text(v: Option<&Vec<u8>>) -> String {
    v.map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap_or_else(|| panic!("a script call for session {s:?}"))
}

fn given(id: &str) -> (Cow<'static, str>, Cow<'static, str>) {
    (
        Cow::Owned(id.to_string()),
        Cow::Owned(serde_json::to_string(id).unwrap_or_default()),
    )
}

/// A record's `ts`, and its third field as a number (an ask's
/// `expires_ts`).
fn record_ts(record: &str) -> (u64, u64) {
    let mut it = record.splitn(5, '\n');
    let third = it.nth(2).and_then(|f| f.parse().ok()).unwrap_or(0);
    let ts = it.next().and_then(|f| f.parse().ok()).unwrap_or(0);
    (ts, third)
}

/// `1` when the prompt's call created its session.
fn created(existed: bool, store: &MemStore, sid: &str) -> String {
    if !existed && store.contains(sid) {
        "1"
    } else {
        "0"
    }
    .to_string()
}

/// The `seq` an outcome's answer carries.
fn seq_of(o: &Decided) -> Option<u64> {
    match o {
        Decided::Cancel { seq, .. } | Decided::Ask { seq, .. } | Decided::Reply { seq, .. } => {
            Some(seq.get())
        }
        _ => None,
    }
}

/// The script's status for a refusal (the codes `calls.rs` reads back).
fn code_of(e: &ApiError) -> &'static str {
    let table = [
        ("e404k", ApiError::ask_not_found()),
        ("e409k", ApiError::ask_conflict()),
        ("e409r", ApiError::ask_answered()),
        ("e409e", ApiError::ask_expired()),
        ("e400r", ApiError::invalid_reply()),
        (
            "e503k",
            ApiError::unavailable("pending limit reached for this session (prompts and asks)"),
        ),
        ("e404s", ApiError::session_not_found()),
        ("e404p", ApiError::prompt_not_found()),
        ("e409", ApiError::conflict()),
        ("e409c", ApiError::prompt_conflict()),
        ("e409a", ApiError::prompt_answered()),
        ("e409x", ApiError::prompt_cancelled()),
        ("e503s", ApiError::unavailable("session limit reached")),
        (
            "e503p",
            ApiError::unavailable("pending prompt limit reached for this session"),
        ),
        (
            "e503d",
            ApiError::unavailable("draft limit reached for this session"),
        ),
        ("e400t", ApiError::too_large_field()),
    ];
    table
        .iter()
        .find(|(_, t)| t == e)
        .map_or("eunknown", |(c, _)| c)
}
