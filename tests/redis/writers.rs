//! The writers of the Redis fault tests: threads that post every kind of
//! write to several instances while a fault is injected, each attempt
//! under a tag of its own, and tally what was acknowledged and what was
//! refused, for the tests to check against what every instance and
//! subscriber shows.

use crate::common::{self, IO_TIMEOUT, Server};

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Waits (bounded, 10 s) until `cond` holds.
#[track_caller]
pub(crate) fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether this pass is another than the plain one (the test then
/// returns at once, saying why): for tests that start their own Redis
/// processes whatever the mode.
pub(crate) fn skip_unless_plain() -> bool {
    for mode in ["TEST_WITH_REDIS", "TEST_WITH_DATA_DIR", "TEST_WITH_TLS"] {
        if std::env::var_os(mode).is_some() {
            eprintln!("skipped with {mode}: starts its own Redis processes, run in the plain pass");
            return true;
        }
    }
    false
}

/// Reads a subscriber until it has seen every answer in `want`: only
/// answers, `seq` rising, none refused; a `resync` only if `rolled_back`
/// (a relay's copy held a write that the promoted replica lacked, and the
/// session took a new epoch), and then, given `old_epoch`, only to
/// another epoch; after it the log starts over. Returns how many it saw.
#[track_caller]
pub(crate) fn read_answers(
    ws: &mut common::Ws,
    want: &BTreeSet<String>,
    refused: &BTreeSet<String>,
    rolled_back: bool,
    old_epoch: Option<&Value>,
) -> usize {
    let mut seen = BTreeSet::new();
    let mut last = 0;
    while !want.is_subset(&seen) {
        let frame = ws.recv_json_skip_pings();
        if rolled_back && frame["type"] == "resync" {
            if let Some(old) = old_epoch {
                assert_ne!(&frame["epoch"], old, "a resync to the same epoch: {frame}");
            }
            last = 0;
            continue;
        }
        assert_eq!(frame["type"], "message", "{frame}");
        let aid = frame["data"]["assistant_msg_id"].as_str().unwrap_or("");
        assert!(!refused.contains(aid), "a refused answer was sent: {frame}");
        let seq = frame["data"]["seq"].as_u64().unwrap_or(0);
        assert!(seq > last, "{seq} after {last}");
        last = seq;
        seen.insert(aid.to_string());
    }
    seen.len()
}

/// One `POST` on a new connection (`Connection: close`): the status and
/// the JSON body, or `None` when the connection fails first.
pub(crate) fn post(addr: SocketAddr, path: &str, body: &Value) -> Option<(u16, Value)> {
    let conn = TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    // Over TLS too, in the suite's TLS run.
    let mut conn = common::Stream::try_over(conn).ok()?;
    let body = serde_json::to_vec(body).ok()?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).ok()?;
    conn.write_all(&body).ok()?;
    let mut out = Vec::new();
    conn.read_to_end(&mut out).ok()?;
    let text = String::from_utf8_lossy(&out);
    let status = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some((status, serde_json::from_str(body).ok()?))
}

/// A kind of write the writers make. Every attempt carries a tag of its
/// own in one field of the message it stores (an id, or for a cancel its
/// `reason` and for a reply its `text`), so a refused attempt stays told
/// apart from the one after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Prompt,
    Answer,
    Cancel,
    Ask,
    Reply,
}

impl Kind {
    pub(crate) const ALL: [Kind; 5] = [
        Kind::Prompt,
        Kind::Answer,
        Kind::Cancel,
        Kind::Ask,
        Kind::Reply,
    ];

    pub(crate) fn path(self) -> &'static str {
        match self {
            Kind::Prompt => "/prompt",
            Kind::Answer => "/response",
            Kind::Cancel => "/cancel",
            Kind::Ask => "/ask",
            Kind::Reply => "/reply",
        }
    }

    /// The message's `type` in history.
    pub(crate) fn stored_as(self) -> &'static str {
        match self {
            Kind::Prompt => "prompt",
            Kind::Answer => "assistant",
            Kind::Cancel => "cancel",
            Kind::Ask => "ask",
            Kind::Reply => "reply",
        }
    }

    /// The frame's `type` for subscribers (a prompt is not framed).
    pub(crate) fn framed_as(self) -> Option<&'static str> {
        match self {
            Kind::Prompt => None,
            Kind::Answer => Some("message"),
            other => Some(other.stored_as()),
        }
    }

    /// The field of the message's `data` that holds the attempt's tag.
    pub(crate) fn tag_field(self) -> &'static str {
        match self {
            Kind::Prompt => "client_msg_id",
            Kind::Answer => "assistant_msg_id",
            Kind::Cancel => "reason",
            Kind::Ask => "ask_id",
            Kind::Reply => "text",
        }
    }

    pub(crate) fn of_frame(frame: &Value) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.framed_as().is_some_and(|t| frame["type"] == t))
    }
}

/// What the writers saw, by kind and tag: what was acknowledged (`200`,
/// with the `seq` it named, if it named one), what of it was sent after
/// the store was lost (`Progress::lost`), what was refused (`503`) and,
/// after a store was lost, answers, cancels, asks and replies whose prompt,
/// ask or session it took with it (`404`).
#[derive(Default, Debug)]
pub(crate) struct Tally {
    acked: BTreeMap<Kind, BTreeMap<String, Option<u64>>>,
    after: BTreeMap<Kind, BTreeSet<String>>,
    refused: BTreeMap<Kind, BTreeSet<String>>,
    /// Acknowledged cancels: reason -> the prompt cancelled.
    pub(crate) cancelled: BTreeMap<String, String>,
    /// Acknowledged replies: text -> the ask answered.
    pub(crate) replied: BTreeMap<String, String>,
    pub(crate) orphans: u64,
}

impl Tally {
    pub(crate) fn merge(&mut self, other: Tally) {
        for (kind, acked) in other.acked {
            self.acked.entry(kind).or_default().extend(acked);
        }
        for (kind, after) in other.after {
            self.after.entry(kind).or_default().extend(after);
        }
        for (kind, refused) in other.refused {
            self.refused.entry(kind).or_default().extend(refused);
        }
        self.cancelled.extend(other.cancelled);
        self.replied.extend(other.replied);
        self.orphans += other.orphans;
    }

    pub(crate) fn acked(&self, kind: Kind) -> BTreeMap<String, Option<u64>> {
        self.acked.get(&kind).cloned().unwrap_or_default()
    }

    pub(crate) fn refused(&self, kind: Kind) -> BTreeSet<String> {
        self.refused.get(&kind).cloned().unwrap_or_default()
    }

    pub(crate) fn after(&self, kind: Kind) -> BTreeSet<String> {
        self.after.get(&kind).cloned().unwrap_or_default()
    }

    /// `acked/refused` per kind, for a test's log line.
    pub(crate) fn counts(&self) -> String {
        Kind::ALL
            .map(|k| format!("{k:?} {}/{}", self.acked(k).len(), self.refused(k).len()))
            .join(", ")
    }
}

/// Counters the main thread watches while writers run.
#[derive(Default)]
pub(crate) struct Progress {
    answered: AtomicU64,
    refused: AtomicU64,
    /// Set once the store was flushed: what is sent afterwards must be
    /// in the new one.
    pub(crate) lost: AtomicBool,
}

/// How one attempt was answered.
#[derive(PartialEq)]
pub(crate) enum Answered {
    Acked,
    Refused,
    /// `404`: what it names went with a lost store.
    Orphan,
}

/// One writer's connection to the instances and its tally.
pub(crate) struct Writer {
    addrs: Vec<SocketAddr>,
    turn: usize,
    sid: String,
    name: String,
    lossy: bool,
    attempt: u64,
    progress: Arc<Progress>,
    tally: Tally,
}

impl Writer {
    /// A tag no attempt of this writer used before.
    pub(crate) fn tag(&mut self, what: &str) -> String {
        self.attempt += 1;
        format!("{}-{what}{}", self.name, self.attempt)
    }

    /// Posts one attempt of `kind` tagged `tag` (the body's other fields
    /// in `body`) to the next instance, and counts its answer, which must
    /// be its own: `200`, `503 Storage unavailable`, or when `lossy` a
    /// `404` for what a lost store took.
    pub(crate) fn post(&mut self, kind: Kind, tag: &str, mut body: Value) -> Answered {
        body["session_id"] = json!(self.sid);
        body[kind.tag_field()] = json!(tag);
        self.turn += 1;
        let addr = self.addrs[self.turn % self.addrs.len()];
        let after = self.progress.lost.load(Ordering::SeqCst);
        let path = kind.path();
        let (status, resp) =
            post(addr, path, &body).unwrap_or_else(|| panic!("{path} {body}: no answer"));
        match status {
            200 => {
                let own = match kind {
                    Kind::Prompt | Kind::Answer => resp[kind.tag_field()] == tag,
                    Kind::Ask => resp["ask_id"] == tag,
                    Kind::Cancel | Kind::Reply => resp["ok"] == true,
                };
                assert!(own && resp["duplicate"].is_null(), "{path} {body}: {resp}");
                if after {
                    self.tally
                        .after
                        .entry(kind)
                        .or_default()
                        .insert(tag.to_string());
                }
                let acked = self.tally.acked.entry(kind).or_default();
                acked.insert(tag.to_string(), resp["seq"].as_u64());
                if kind == Kind::Answer {
                    self.progress.answered.fetch_add(1, Ordering::Relaxed);
                }
                Answered::Acked
            }
            503 => {
                assert_eq!(resp["error"], "Storage unavailable", "{resp}");
                self.tally
                    .refused
                    .entry(kind)
                    .or_default()
                    .insert(tag.to_string());
                self.progress.refused.fetch_add(1, Ordering::Relaxed);
                Answered::Refused
            }
            404 if self.lossy && kind != Kind::Prompt => {
                let error = resp["error"].as_str().unwrap_or("");
                let gone = ["Prompt not found", "Session not found", "Ask not found"];
                assert!(gone.contains(&error), "{path}: {resp}");
                self.tally.orphans += 1;
                Answered::Orphan
            }
            other => panic!("{path}: {other} {resp}"),
        }
    }

    /// Follows up the oldest of `queue` with `kind` (answering, cancelling
    /// or replying to it) when `due`; it leaves the queue unless refused.
    pub(crate) fn follow_up(&mut self, kind: Kind, queue: &mut VecDeque<String>, due: bool) {
        let Some(of) = queue.front().filter(|_| due).cloned() else {
            return;
        };
        let tag = self.tag(&kind.stored_as()[..1]);
        let body = match kind {
            Kind::Answer => json!({"client_msg_id": of, "text": "done"}),
            Kind::Cancel => json!({"client_msg_id": of}),
            _ => json!({"ask_id": of}),
        };
        match self.post(kind, &tag, body) {
            Answered::Refused => {}
            answered => {
                if answered == Answered::Acked && kind == Kind::Cancel {
                    self.tally.cancelled.insert(tag, of);
                } else if answered == Answered::Acked && kind == Kind::Reply {
                    self.tally.replied.insert(tag, of);
                }
                queue.pop_front();
            }
        }
    }
}

/// A writer, alternating instances until `stop`: each round posts a new
/// prompt, and every second round an ask; then it answers the oldest
/// acknowledged prompt it has not answered yet, cancels the oldest of
/// every third prompt instead, and replies to the oldest open ask, each
/// once a newer one waits behind it (so one is always left when Redis
/// starts refusing) and each attempt under a new tag. So while Redis
/// refuses writes, every kind is refused. Once stopped, it answers,
/// cancels and replies to what is left.
pub(crate) fn writer(
    addrs: Vec<SocketAddr>,
    sid: String,
    name: String,
    lossy: bool,
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
) -> JoinHandle<Tally> {
    std::thread::spawn(move || {
        let mut w = Writer {
            addrs,
            turn: 0,
            sid,
            name,
            lossy,
            attempt: 0,
            progress,
            tally: Tally::default(),
        };
        let (mut to_answer, mut to_cancel, mut to_reply) =
            (VecDeque::new(), VecDeque::new(), VecDeque::new());
        let mut n = 0;
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            if stopping && to_answer.is_empty() && to_cancel.is_empty() && to_reply.is_empty() {
                break;
            }
            let mut refused = false;
            if !stopping {
                n += 1;
                let cid = format!("{}-p{n}", w.name);
                match w.post(Kind::Prompt, &cid, json!({"prompt": "work"})) {
                    Answered::Acked if n % 3 == 0 => to_cancel.push_back(cid),
                    Answered::Acked => to_answer.push_back(cid),
                    _ => refused = true,
                }
                let kid = format!("{}-k{n}", w.name);
                if n % 2 == 1 && w.post(Kind::Ask, &kid, json!({"text": "go?"})) == Answered::Acked
                {
                    to_reply.push_back(kid);
                }
            }
            let due = |q: &VecDeque<String>| stopping || refused || q.len() > 1;
            let (a, c, r) = (due(&to_answer), due(&to_cancel), due(&to_reply));
            w.follow_up(Kind::Answer, &mut to_answer, a);
            w.follow_up(Kind::Cancel, &mut to_cancel, c);
            w.follow_up(Kind::Reply, &mut to_reply, r);
        }
        w.tally
    })
}

/// Starts `n` writers; `stop_and_join` ends them.
pub(crate) struct Writers {
    stop: Arc<AtomicBool>,
    pub(crate) progress: Arc<Progress>,
    handles: Vec<JoinHandle<Tally>>,
}

impl Writers {
    pub(crate) fn start(servers: &[Server], sid: &str, n: usize, lossy: bool) -> Writers {
        let addrs: Vec<_> = servers.iter().map(|s| s.addr()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Progress::default());
        let handles = (0..n)
            .map(|i| {
                writer(
                    addrs.clone(),
                    sid.to_string(),
                    format!("w{i}"),
                    lossy,
                    Arc::clone(&stop),
                    Arc::clone(&progress),
                )
            })
            .collect();
        Writers {
            stop,
            progress,
            handles,
        }
    }

    /// Waits (bounded) until `more` answers past now were acknowledged.
    #[track_caller]
    pub(crate) fn wait_answers(&self, more: u64) {
        let want = self.progress.answered.load(Ordering::Relaxed) + more;
        wait_until("writers make progress", || {
            self.progress.answered.load(Ordering::Relaxed) >= want
        });
    }

    #[track_caller]
    pub(crate) fn wait_refusals(&self, more: u64) {
        let want = self.progress.refused.load(Ordering::Relaxed) + more;
        wait_until("writes refused", || {
            self.progress.refused.load(Ordering::Relaxed) >= want
        });
    }

    pub(crate) fn stop_and_join(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut tally = Tally::default();
        for h in self.handles {
            tally.merge(h.join().expect("writer"));
        }
        tally
    }
}

/// The messages of `kind` in a `/messages` body: tag -> seq.
pub(crate) fn tags(history: &Value, kind: Kind) -> BTreeMap<String, u64> {
    let msgs = history["messages"].as_array().cloned().unwrap_or_default();
    msgs.iter()
        .filter(|m| m["type"] == kind.stored_as())
        .map(|m| {
            let d = &m["data"];
            let tag = d[kind.tag_field()].as_str().unwrap_or("").to_string();
            (tag, d["seq"].as_u64().unwrap_or(0))
        })
        .collect()
}

pub(crate) fn seqs(history: &Value) -> Vec<u64> {
    history["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["data"]["seq"].as_u64()).collect())
        .unwrap_or_default()
}
