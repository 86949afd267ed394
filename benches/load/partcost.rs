//! What a streamed part costs the server, against a final answer and a
//! small `POST /prompt`: the server's CPU per post (from /proc) over the
//! same count of posts of each kind, parts and answers delivered to N
//! WebSocket subscribers of one session.
//!
//! - part: `POST /response` with `"partial": true`, K parts per draft, one
//!   open draft per prompt (drafts are left open);
//! - answer: `POST /response` with its own `assistant_msg_id`, K answers
//!   per prompt;
//! - prompt: `POST /prompt` with the same text, to 1,000 sessions in turn
//!   (the ingest figure's request), which no subscriber gets.
//!
//! P publisher connections post on keep-alive, one request in flight
//! each, and at most W parts or answers are not yet received by every
//! subscriber (the fan-out figure's window), so no subscriber falls behind
//! (one that did would get a snapshot instead of the parts it missed: a
//! loss, and the run fails). A block ends when every post is acknowledged
//! and delivered everywhere. Its parts or answers go to one prompt after
//! another, K each, spread over the publishers (a draft's parts may arrive
//! in any order: the server numbers them as they come); each prompt is
//! posted while the previous one is being answered, so the CPU of both
//! kinds includes one small `POST /prompt` per K posts.
//!
//! The kinds take turns in [`ROUNDS`] rounds, each round starting with the
//! next kind, and each kind's CPU is summed over its own blocks, so a drift
//! of the machine's speed falls on all three alike. relay only: nchan has
//! no streamed answers.

use std::time::{Duration, Instant};

use crate::net::{self, Net};
use crate::stats::{CpuUse, CpuWindow, ResultLine};
use crate::stream::{self, Got};
use crate::target::{Target, relay_response, text_with_marker};
use crate::{Common, Errors};

/// Blocks of each kind, taking turns.
const ROUNDS: u64 = 3;
/// Sessions the prompt kind posts to, in turn (as the ingest figure does).
const PROMPT_SESSIONS: u64 = 1000;
/// Server CPU seconds a kind must have used for a ratio to it.
const MIN_CPU_S: f64 = 0.1;
/// A block that makes no progress for this long has lost something.
const STALL: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Part,
    Answer,
    Prompt,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Part, Kind::Answer, Kind::Prompt];

    fn name(self) -> &'static str {
        match self {
            Kind::Part => "part",
            Kind::Answer => "answer",
            Kind::Prompt => "prompt",
        }
    }
}

/// What a publisher has in flight (one request at most).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flight {
    Idle,
    /// The prompt of the block's next K parts or answers.
    UnitPrompt,
    /// A post of the block's kind.
    Post,
}

/// What one kind's blocks took, summed.
#[derive(Default)]
struct Tally {
    posts: u64,
    secs: f64,
    server_s: Option<f64>,
    server_sys_s: Option<f64>,
    generator_s: f64,
}

impl Tally {
    fn add(&mut self, posts: u64, secs: f64, used: &CpuUse) {
        let sum = |a: Option<f64>, b: Option<f64>| b.map(|b| a.unwrap_or(0.0) + b);
        self.posts += posts;
        self.secs += secs;
        self.server_s = sum(self.server_s, used.server_s);
        self.server_sys_s = sum(self.server_sys_s, used.server_sys_s);
        self.generator_s += used.generator_s;
    }

    /// Server CPU microseconds per post.
    fn us_per_post(&self) -> Option<f64> {
        self.server_s.map(|s| 1e6 * s / self.posts.max(1) as f64)
    }
}

struct Run<'a> {
    c: &'a Common,
    net: Net,
    sid: String,
    subscribers: u32,
    per_draft: u64,
    window: u64,
    /// Index of the first publisher connection; the subscribers are
    /// 0..first_pub.
    first_pub: usize,
    pubs: Vec<Flight>,
    /// The current block: its kind, how many posts it makes and has
    /// made, its first prompt's number (parts, answers), and how many of
    /// its prompts were posted and stored.
    kind: Kind,
    posts_total: u64,
    posts_sent: u64,
    first_unit: u64,
    units_posted: u64,
    units_stored: u64,
    /// Numbers for the next block's first prompt, and the prompt kind's
    /// next post.
    next_unit: u64,
    next_prompt: u64,
    /// Subscribers that received each part or answer, by its marker.
    received: Vec<u32>,
    /// Parts or answers posted and not yet received by every subscriber.
    undelivered: u64,
    delivered: u64,
    snapshots: u64,
    progress_at: Instant,
    errors: Errors,
    got: Vec<Got>,
}

/// Runs the part-cost figure and prints its result line; fails when a
/// subscriber missed a part or an answer, or any error occurred.
pub fn run(
    c: &Common,
    subscribers: usize,
    posts: u64,
    publishers: usize,
    window: u64,
) -> Result<(), String> {
    if c.target != Target::Relay {
        return Err("partcost: relay only (nchan has no streamed answers)".into());
    }
    if subscribers == 0 || posts == 0 || publishers == 0 || window == 0 {
        return Err("--subscribers, --posts, --publishers and --window must be positive".into());
    }
    let per_draft = stream::parts_per_draft(c.size);
    let units = posts.div_ceil(per_draft * ROUNDS);
    let mut run = Run {
        c,
        net: Net::new(c.addr).map_err(|e| e.to_string())?,
        sid: format!("pc{}", c.run_tag()),
        subscribers: subscribers as u32,
        per_draft,
        window,
        first_pub: subscribers,
        pubs: vec![Flight::Idle; publishers],
        kind: Kind::Part,
        posts_total: 0,
        posts_sent: 0,
        first_unit: 0,
        units_posted: 0,
        units_stored: 0,
        next_unit: 0,
        next_prompt: 0,
        received: Vec::new(),
        undelivered: 0,
        delivered: 0,
        snapshots: 0,
        progress_at: Instant::now(),
        errors: Errors::default(),
        got: Vec::new(),
    };
    run.setup(subscribers)?;
    // One unmeasured block of each kind first: the first answer brings the
    // agent's presence to every subscriber, and the first of each kind
    // grows the server's tables.
    for kind in Kind::ALL {
        run.block(kind, 1, &mut Tally::default())?;
    }
    let mut tallies: [Tally; 3] = Default::default();
    for round in 0..ROUNDS as usize {
        for turn in 0..Kind::ALL.len() {
            let at = (round + turn) % Kind::ALL.len();
            run.block(Kind::ALL[at], units, &mut tallies[at])?;
        }
    }
    run.report(&tallies, publishers);
    run.net.close_all();
    Ok(())
}

impl Run<'_> {
    /// The subscribers, the publishers, and the prompt kind's sessions
    /// (created here, so no block pays for creating them).
    fn setup(&mut self, subscribers: usize) -> Result<(), String> {
        stream::subscribe(&mut self.net, self.c, &self.sid, subscribers)?;
        for _ in 0..self.pubs.len() {
            self.net.open().map_err(|e| format!("connect: {e}"))?;
        }
        let mut waiting = vec![0usize; self.pubs.len()];
        for n in 0..PROMPT_SESSIONS as usize {
            let p = n % self.pubs.len();
            let sid = format!("{}-{n}", self.sid);
            if let Some(req) = self.c.target.create_session(&self.c.host, &sid) {
                self.net.conns[self.first_pub + p].send(&req);
                waiting[p] += 1;
            }
        }
        let mut ready = Vec::new();
        let deadline = Instant::now() + STALL;
        while waiting.iter().any(|&w| w > 0) {
            self.net
                .wait(Duration::from_millis(20), &mut ready)
                .map_err(|e| e.to_string())?;
            for &index in ready.iter().filter(|&&i| i >= self.first_pub) {
                let conn = &mut self.net.conns[index];
                while let Some((resp, n)) = net::parse_response(&conn.inbuf)? {
                    conn.consume(n);
                    if resp.status != 200 {
                        return Err(format!("setup: PUT /sessions answered {}", resp.status));
                    }
                    waiting[index - self.first_pub] -= 1;
                }
            }
            if Instant::now() > deadline {
                return Err("setup: sessions not created".into());
            }
        }
        Ok(())
    }

    /// Posts one block of `kind`: `units` prompts each answered or drafted
    /// K times, or `units * K` prompts; adds its CPU to `tally`.
    fn block(&mut self, kind: Kind, units: u64, tally: &mut Tally) -> Result<(), String> {
        self.kind = kind;
        self.posts_total = units * self.per_draft;
        self.posts_sent = 0;
        self.first_unit = self.next_unit;
        (self.units_posted, self.units_stored) = (0, 0);
        if kind != Kind::Prompt {
            self.next_unit += units;
        }
        let mut ready = Vec::new();
        let cpu = CpuWindow::start(self.c.server_pid.as_deref());
        let start = Instant::now();
        self.progress_at = start;
        loop {
            self.dispatch();
            let idle = self.pubs.iter().all(|&f| f == Flight::Idle);
            if self.posts_sent == self.posts_total && self.undelivered == 0 && idle {
                break;
            }
            self.step(&mut ready)?;
            if self.errors.count > 0 {
                return Err(format!("{} block: {}", kind.name(), self.errors.summary()));
            }
            if self.progress_at.elapsed() > STALL {
                return Err(format!(
                    "{} block: no progress for {STALL:?}: a post or a delivery was lost",
                    kind.name()
                ));
            }
        }
        tally.add(self.posts_total, start.elapsed().as_secs_f64(), &cpu.stop());
        Ok(())
    }

    /// Gives every idle publisher the block's next request, if any.
    fn dispatch(&mut self) {
        for p in 0..self.pubs.len() {
            if self.pubs[p] != Flight::Idle {
                continue;
            }
            let Some((req, flight)) = self.next_request() else {
                return;
            };
            self.pubs[p] = flight;
            self.net.conns[self.first_pub + p].send(&req);
        }
    }

    /// The block's next request: a prompt of the prompt kind; else the
    /// prompt of the next K parts or answers, posted once the previous
    /// one is stored and no more than one ahead of the posts; else the
    /// next part or answer, once its prompt is stored and the window
    /// allows.
    fn next_request(&mut self) -> Option<(Vec<u8>, Flight)> {
        let (host, sid, size) = (&self.c.host, &self.sid, self.c.size);
        if self.kind == Kind::Prompt {
            if self.posts_sent == self.posts_total {
                return None;
            }
            let n = self.next_prompt;
            self.next_prompt += 1;
            self.posts_sent += 1;
            let to = format!("{sid}-{}", n % PROMPT_SESSIONS);
            let text = text_with_marker(n, size);
            let req = (self.c.target).post_prompt(host, &to, &format!("m{n}"), &text);
            return Some((req, Flight::Post));
        }
        let at = self.posts_sent / self.per_draft;
        let units = self.posts_total / self.per_draft;
        if self.units_posted < units
            && self.units_posted == self.units_stored
            && self.units_posted <= at + 1
        {
            let u = self.first_unit + self.units_posted;
            self.units_posted += 1;
            let req = (self.c.target).post_prompt(host, sid, &format!("u{u}"), "cost");
            return Some((req, Flight::UnitPrompt));
        }
        if self.posts_sent == self.posts_total
            || at >= self.units_stored
            || self.undelivered >= self.window
        {
            return None;
        }
        let u = self.first_unit + at;
        let k = self.received.len() as u64;
        self.received.push(0);
        self.undelivered += 1;
        self.posts_sent += 1;
        let (prompt_id, text) = (format!("u{u}"), text_with_marker(k, size));
        let req = match self.kind {
            Kind::Part => relay_response(host, sid, &prompt_id, &format!("d{u}"), &text, true),
            _ => relay_response(host, sid, &prompt_id, &format!("a{k}"), &text, false),
        };
        Some((req, Flight::Post))
    }

    fn step(&mut self, ready: &mut Vec<usize>) -> Result<(), String> {
        self.net
            .wait(Duration::from_millis(20), ready)
            .map_err(|e| e.to_string())?;
        for &index in ready.iter() {
            let result = if index < self.first_pub {
                self.on_sub(index)
            } else {
                self.on_pub(index - self.first_pub)
            };
            if let Err(e) = result {
                self.errors.add(format!("conn {index}: {e}"));
            }
            if let Some(why) = self.net.conns[index].closed.take() {
                self.errors.add(format!("conn {index}: {why}"));
            }
        }
        Ok(())
    }

    fn on_pub(&mut self, p: usize) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[self.first_pub + p];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            match std::mem::replace(&mut self.pubs[p], Flight::Idle) {
                Flight::Idle => return Err("an answer to no request".into()),
                Flight::UnitPrompt => self.units_stored += 1,
                Flight::Post => {}
            }
            if !self.c.target.post_ok(resp.status) {
                let body = String::from_utf8_lossy(&resp.body).into_owned();
                return Err(format!(
                    "{} answered {}: {body}",
                    self.kind.name(),
                    resp.status
                ));
            }
            self.progress_at = Instant::now();
        }
    }

    fn on_sub(&mut self, index: usize) -> Result<(), String> {
        let mut got = std::mem::take(&mut self.got);
        let result = stream::read_frames(&mut self.net.conns[index], &mut got);
        for g in got.drain(..) {
            let k = match (g, self.kind) {
                (Got::Part { k, .. }, Kind::Part) | (Got::Answer { k }, Kind::Answer) => k,
                (Got::Other, _) => continue,
                (Got::Snapshot, _) => {
                    self.snapshots += 1;
                    self.errors
                        .add(format!("conn {index}: a snapshot: parts were lost"));
                    continue;
                }
                (Got::Part { k, .. } | Got::Answer { k }, kind) => {
                    self.errors.add(format!(
                        "conn {index}: frame {k} in a {} block",
                        kind.name()
                    ));
                    continue;
                }
            };
            self.deliver(index, k);
        }
        self.got = got;
        result
    }

    fn deliver(&mut self, index: usize, k: u64) {
        let Some(count) = self.received.get_mut(k as usize) else {
            self.errors
                .add(format!("conn {index}: post {k} never made"));
            return;
        };
        *count += 1;
        self.delivered += 1;
        self.progress_at = Instant::now();
        if *count > self.subscribers {
            self.errors
                .add(format!("conn {index}: post {k} received twice"));
        } else if *count == self.subscribers {
            self.undelivered -= 1;
        }
    }

    fn report(&self, tallies: &[Tally; 3], publishers: usize) {
        let [part, answer, prompt] = tallies;
        let mut line = ResultLine::new(&self.c.figure, &self.c.name);
        line.num("subscribers", f64::from(self.subscribers))
            .num("posts", part.posts as f64)
            .num("per_draft", self.per_draft as f64)
            .num("publishers", publishers as f64)
            .num("window", self.window as f64);
        for (kind, t) in Kind::ALL.iter().zip(tallies) {
            let name = kind.name();
            if let (Some(us), Some(server), Some(sys)) =
                (t.us_per_post(), t.server_s, t.server_sys_s)
            {
                line.num(&format!("{name}_us_per_post"), us)
                    .num(
                        &format!("{name}_kernel_us_per_post"),
                        1e6 * sys / t.posts.max(1) as f64,
                    )
                    .num(&format!("{name}_server_cpu_pct"), 100.0 * server / t.secs);
            }
            line.num(&format!("{name}s_per_s"), t.posts as f64 / t.secs);
        }
        // /proc counts CPU in clock ticks (10 ms at 100 Hz): a ratio to a
        // kind that used only a few of them (prompts, beside parts
        // delivered to many) would be noise.
        let ratio = |of: &Tally, to: &Tally| -> Option<f64> {
            let enough = |t: &Tally| t.server_s.is_some_and(|s| s >= MIN_CPU_S);
            if !(enough(of) && enough(to)) {
                return None;
            }
            Some(of.us_per_post()? / to.us_per_post()?)
        };
        if let Some(r) = ratio(part, answer) {
            line.num("part_over_answer", r);
        }
        if let Some(r) = ratio(part, prompt) {
            line.num("part_over_prompt", r);
        }
        let secs: f64 = tallies.iter().map(|t| t.secs).sum();
        let generator: f64 = tallies.iter().map(|t| t.generator_s).sum();
        line.num("gen_cpu_pct", 100.0 * generator / secs)
            .num("deliveries", self.delivered as f64)
            .num("snapshots", self.snapshots as f64)
            .num("errors", self.errors.count as f64);
        line.print();
    }
}
