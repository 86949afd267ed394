//! Steady traffic over many sessions through several relays, for the
//! cluster's fault tests: writer threads post a prompt through one relay
//! and its answer through the next, session after session, each attempt
//! under a tag of its own, and note when each write was sent and
//! acknowledged, so a test can tell what was acknowledged before a master
//! was killed, and how long before. Then the checks of what every relay
//! shows against what the writers saw.

use super::harness::wait_for;
use crate::writers::post;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::Server;

/// How long any phase of traffic may take before the test fails.
pub const PHASE: Duration = Duration::from_secs(30);

/// How long one write may go unacknowledged (`503`, `504`, sent again)
/// before its writer gives up and fails the test.
const WRITE_LIMIT: Duration = Duration::from_secs(30);

/// An acknowledged write.
#[derive(Clone, Debug)]
pub struct Ack {
    pub sid: String,
    pub tag: String,
    /// When its last attempt was sent, and when that was answered `200`.
    pub sent: Instant,
    pub acked: Instant,
}

/// What the writers saw.
#[derive(Default, Debug)]
pub struct Tally {
    pub prompts: Vec<Ack>,
    pub answers: Vec<Ack>,
    /// Answered `503`: never to be stored.
    pub refused: BTreeSet<String>,
    /// Answered `504`, then sent again under the same tag until answered.
    pub uncertain: u64,
    /// Prompts whose answer found them gone (`404`): lost with a master.
    pub orphans: BTreeSet<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.prompts.extend(other.prompts);
        self.answers.extend(other.answers);
        self.refused.extend(other.refused);
        self.uncertain += other.uncertain;
        self.orphans.extend(other.orphans);
    }

    /// The acknowledged writes of session `sid`.
    pub fn of<'a>(&'a self, sid: &'a str) -> impl Iterator<Item = (&'static str, &'a Ack)> + 'a {
        let prompts = self.prompts.iter().map(|a| ("prompt", a));
        let answers = self.answers.iter().map(|a| ("answer", a));
        prompts.chain(answers).filter(move |(_, a)| a.sid == sid)
    }
}

/// Traffic runs started so far in this process.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// Writer threads under way; stopped when dropped (a test failing).
pub struct Traffic {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    /// The last acknowledgement of each session.
    last_ack: Arc<Mutex<BTreeMap<String, Instant>>>,
    writers: Vec<JoinHandle<Tally>>,
}

impl Traffic {
    /// `writers` threads over `sessions` (dealt out in turn), through the
    /// relays at `addrs` in turn; with `answer`, each prompt is answered
    /// by the same writer through the next relay.
    pub fn start(
        addrs: &[SocketAddr],
        sessions: &[String],
        writers: usize,
        answer: bool,
    ) -> Traffic {
        // Tags unique across runs: a tag sent again would be a duplicate.
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let last_ack = Arc::new(Mutex::new(BTreeMap::new()));
        let writers = (0..writers)
            .map(|w| {
                let mine: Vec<String> = sessions.iter().skip(w).step_by(writers).cloned().collect();
                let writer = Writer {
                    addrs: addrs.to_vec(),
                    name: format!("r{run}w{w}"),
                    turn: w,
                    stop: stop.clone(),
                    last_ack: last_ack.clone(),
                    tally: Tally::default(),
                };
                let rounds = rounds.clone();
                std::thread::spawn(move || writer.run(&mine, answer, &rounds))
            })
            .collect();
        Traffic {
            stop,
            rounds,
            last_ack,
            writers,
        }
    }

    /// Rounds (a prompt, and its answer if any) completed so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    /// Waits (bounded by `limit`) until `more` rounds have completed.
    #[track_caller]
    pub fn wait_rounds(&self, more: u64, limit: Duration) {
        let want = self.rounds() + more;
        wait_for(&format!("{more} more rounds of traffic"), limit, || {
            self.writers_alive()?;
            let now = self.rounds();
            (now >= want)
                .then_some(())
                .ok_or(format!("{now} of {want}"))
        });
    }

    /// Waits (bounded by `limit`) until every session of `sessions` has
    /// had a write acknowledged after `since`.
    #[track_caller]
    pub fn wait_each_acked_since(&self, sessions: &[String], since: Instant, limit: Duration) {
        wait_for(
            "every session has a write acknowledged after the fault",
            limit,
            || {
                self.writers_alive()?;
                let last = self.last_ack.lock().unwrap();
                let behind: Vec<&String> = sessions
                    .iter()
                    .filter(|s| last.get(*s).is_none_or(|t| *t < since))
                    .collect();
                match behind.is_empty() {
                    true => Ok(()),
                    false => Err(format!("none since for {behind:?}")),
                }
            },
        );
    }

    fn writers_alive(&self) -> Result<(), String> {
        match self.writers.iter().any(JoinHandle::is_finished) {
            true if !self.stop.load(Ordering::Relaxed) => {
                panic!("a writer stopped early: its message is above")
            }
            _ => Ok(()),
        }
    }

    /// Stops the writers (each finishes the write in hand) and merges
    /// what they saw.
    #[track_caller]
    pub fn stop(mut self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Tally::default();
        for w in std::mem::take(&mut self.writers) {
            let seen = w
                .join()
                .unwrap_or_else(|_| panic!("a writer failed: its message is above"));
            all.merge(seen);
        }
        all
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Writer {
    addrs: Vec<SocketAddr>,
    name: String,
    turn: usize,
    stop: Arc<AtomicBool>,
    last_ack: Arc<Mutex<BTreeMap<String, Instant>>>,
    tally: Tally,
}

impl Writer {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn run(mut self, sessions: &[String], answer: bool, rounds: &AtomicU64) -> Tally {
        let mut n = 0;
        while !self.stop.load(Ordering::Relaxed) {
            for sid in sessions {
                n += 1;
                let stem = format!("{}-p{n}", self.name);
                let prompt =
                    |tag: &str| json!({"session_id": sid, "prompt": "q", "client_msg_id": tag});
                let Some(cid) = self.send(sid, "/prompt", "client_msg_id", &prompt, &stem) else {
                    assert!(
                        self.stopped(),
                        "{sid}: a prompt answered 404 (Session not found)"
                    );
                    break;
                };
                self.tally.prompts.push(cid.clone());
                if answer {
                    let reply = |tag: &str| {
                        json!({"session_id": sid, "client_msg_id": cid.tag,
                               "assistant_msg_id": tag, "text": "a"})
                    };
                    let stem = format!("{}-a{n}", self.name);
                    match self.send(sid, "/response", "assistant_msg_id", &reply, &stem) {
                        Some(ack) => self.tally.answers.push(ack),
                        None => {
                            self.tally.orphans.insert(cid.tag.clone());
                        }
                    }
                }
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.tally
    }

    /// Posts until `200` (the acknowledgement) or `404` (`None`). A `503`
    /// is sent again under a new tag (it was not stored); once a `504`
    /// said it may be stored, under the same tag until answered, a `503`
    /// then speaking for that attempt only.
    fn send(
        &mut self,
        sid: &str,
        path: &str,
        field: &str,
        make: &dyn Fn(&str) -> Value,
        stem: &str,
    ) -> Option<Ack> {
        let started = Instant::now();
        let mut attempt = 0;
        let mut tag = format!("{stem}.0");
        let mut uncertain = false;
        loop {
            assert!(
                started.elapsed() < WRITE_LIMIT,
                "{path} to {sid} not acknowledged within {WRITE_LIMIT:?} ({attempt} refused)"
            );
            self.turn += 1;
            let addr = self.addrs[self.turn % self.addrs.len()];
            let body = make(&tag);
            let sent = Instant::now();
            let Some((status, resp)) = post(addr, path, &body) else {
                // Dropped, the relays killed: the test has failed already.
                assert!(
                    self.stopped(),
                    "{path} {body} through {addr}: no HTTP answer"
                );
                return None;
            };
            match status {
                200 => {
                    assert_eq!(resp[field], tag, "{path}: {resp}");
                    let acked = Instant::now();
                    self.last_ack.lock().unwrap().insert(sid.to_string(), acked);
                    return Some(Ack {
                        sid: sid.to_string(),
                        tag,
                        sent,
                        acked,
                    });
                }
                503 if uncertain => {}
                503 => {
                    assert_eq!(
                        resp["error"], "Storage unavailable",
                        "{path} {body}: {resp}"
                    );
                    self.tally.refused.insert(tag.clone());
                    attempt += 1;
                    tag = format!("{stem}.{attempt}");
                }
                504 => {
                    self.tally.uncertain += 1;
                    uncertain = true;
                }
                404 => return None,
                other => panic!("{path} {body} through {addr}: {other} {resp}"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What one relay shows of a session.
pub struct Shown {
    pub epoch: Value,
    /// Stored prompt and answer tags.
    pub tags: BTreeSet<String>,
    pub answers: BTreeSet<String>,
}

/// Reads session `sid`'s history through `srv` and checks it against the
/// writers' `tally`: `seq` rising, no prompt answered twice, nothing
/// refused stored, and every acknowledged write stored unless
/// `may_lose` allows its loss (it is then reported).
#[track_caller]
pub fn check_history(
    srv: &Server,
    sid: &str,
    tally: &Tally,
    may_lose: &dyn Fn(&Ack) -> Result<(), String>,
) -> Shown {
    // Pages of 1,000 (the contract's clamp), each after the last `seq`.
    let mut history = srv.messages(sid, "?limit=1000");
    let mut msgs = Vec::new();
    loop {
        let page = history["messages"].as_array().cloned().unwrap_or_default();
        let full = page.len() >= 1000;
        msgs.extend(page);
        if !full {
            break;
        }
        let after = msgs
            .last()
            .and_then(|m| m["data"]["seq"].as_u64())
            .unwrap_or(0);
        history = srv.messages(sid, &format!("?limit=1000&after={after}"));
    }
    let (mut tags, mut answered, mut answers) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let mut last = 0;
    for m in &msgs {
        let d = &m["data"];
        let seq = d["seq"].as_u64().unwrap_or(0);
        assert!(seq > last, "{sid}: seq {seq} after {last}");
        last = seq;
        let cid = d["client_msg_id"].as_str().unwrap_or("").to_string();
        if m["type"] == "prompt" {
            tags.insert(cid);
        } else if m["type"] == "assistant" {
            assert!(answered.insert(cid.clone()), "{sid}: {cid} answered twice");
            let aid = d["assistant_msg_id"].as_str().unwrap_or("").to_string();
            answers.insert(aid.clone());
            tags.insert(aid);
        }
    }
    for (kind, ack) in tally.of(sid) {
        if !tags.contains(&ack.tag)
            && let Err(why) = may_lose(ack)
        {
            panic!("{sid}: acknowledged {kind} {} lost: {why}", ack.tag);
        }
    }
    let shown: Vec<_> = tally.refused.iter().filter(|t| tags.contains(*t)).collect();
    assert!(shown.is_empty(), "{sid}: refused writes stored: {shown:?}");
    Shown {
        epoch: history["epoch"].clone(),
        tags,
        answers,
    }
}

/// One `GET` on a new connection (`Connection: close`): the status and
/// the JSON body, or `None` when the connection fails first.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, Value)> {
    use std::io::{Read, Write};
    let conn = std::net::TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(crate::common::IO_TIMEOUT))
        .ok()?;
    let mut conn = crate::common::Stream::try_over(conn).ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    conn.write_all(head.as_bytes()).ok()?;
    let mut out = Vec::new();
    conn.read_to_end(&mut out).ok()?;
    let text = String::from_utf8_lossy(&out);
    let status = text.get(9..12)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some((status, serde_json::from_str(body).ok()?))
}

/// `s` with every byte but an unreserved one percent-encoded.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One agent for every session: `GET /prompts?after=<cursor>` (no session
/// in the path) through the relays in turn, parked a second at most, the
/// cursor of the last prompt listed carried to the next call; `503` and
/// `504` (a failover) are asked again.
pub struct Agent {
    stop: Arc<AtomicBool>,
    polls: Arc<AtomicU64>,
    /// Every prompt listed, in order: `client_msg_id` and `session_id`.
    got: Arc<Mutex<Vec<(String, String)>>>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Agent {
    pub fn start(addrs: &[SocketAddr]) -> Agent {
        let stop = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (addrs, st, pl, gt) = (addrs.to_vec(), stop.clone(), polls.clone(), got.clone());
        let handle = std::thread::spawn(move || {
            let mut cursor: Option<String> = None;
            let mut turn = 0;
            while !st.load(Ordering::Relaxed) {
                turn += 1;
                let addr = addrs[turn % addrs.len()];
                let after = cursor
                    .as_deref()
                    .map_or(String::new(), |c| format!("&after={}", escape(c)));
                let path = format!("/prompts?timeout=1&limit=1000{after}");
                let Some((status, body)) = get(addr, &path) else {
                    // Dropped, the relays killed: the test has failed already.
                    assert!(
                        st.load(Ordering::Relaxed),
                        "GET {path} through {addr}: no HTTP answer"
                    );
                    return;
                };
                pl.fetch_add(1, Ordering::Relaxed);
                match status {
                    200 => {}
                    503 | 504 => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    other => panic!("GET {path} through {addr}: {other} {body}"),
                }
                let listed = body
                    .as_array()
                    .unwrap_or_else(|| panic!("not a list: {body}"));
                let mut got = gt.lock().unwrap();
                for p in listed {
                    let field =
                        |name: &str| p[name].as_str().unwrap_or_else(|| panic!("no {name}: {p}"));
                    got.push((
                        field("client_msg_id").to_string(),
                        field("session_id").to_string(),
                    ));
                    cursor = Some(field("cursor").to_string());
                }
            }
        });
        Agent {
            stop,
            polls,
            got,
            handle: Some(handle),
        }
    }

    fn finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// The prompts listed so far.
    pub fn got(&self) -> Vec<(String, String)> {
        self.got.lock().unwrap().clone()
    }

    /// Waits (bounded by `limit`) until every `client_msg_id` of `want`
    /// has been listed.
    #[track_caller]
    pub fn wait_for_all(&self, want: &BTreeSet<String>, limit: Duration) {
        wait_for("the agent lists every acknowledged prompt", limit, || {
            if self.finished() {
                panic!("the agent stopped early: its message is above");
            }
            let got: BTreeSet<String> = self.got().into_iter().map(|(c, _)| c).collect();
            let missing: Vec<_> = want.difference(&got).collect();
            match missing.is_empty() {
                true => Ok(()),
                false => Err(format!(
                    "{} missing, e.g. {:?}",
                    missing.len(),
                    &missing[..missing.len().min(5)]
                )),
            }
        });
    }

    /// Lets the agent ask twice more (anything listed late, twice
    /// perhaps, shows up), then stops it; every prompt it was given.
    #[track_caller]
    pub fn stop(mut self) -> Vec<(String, String)> {
        let want = self.polls.load(Ordering::Relaxed) + 2;
        wait_for("the agent asks twice more", Duration::from_secs(15), || {
            let polls = self.polls.load(Ordering::Relaxed);
            (polls >= want || self.finished())
                .then_some(())
                .ok_or(format!("{polls}"))
        });
        self.stop.store(true, Ordering::Relaxed);
        let handle = self.handle.take().expect("running");
        handle
            .join()
            .unwrap_or_else(|_| panic!("the agent failed: its message is above"));
        self.got.lock().unwrap().clone()
    }
}
