//! Streamed answers: one agent connection posts parts (`POST /response`
//! with `"partial": true`) back to back to a session with N WebSocket
//! subscribers, and every subscriber must receive every part as a `delta`
//! frame, in order, numbered from 1 within its draft.
//!
//! The agent pipelines its parts on one keep-alive connection, at most
//! `window` of them not yet acknowledged and delivered everywhere (the
//! fan-out figure's `max`), so no subscriber falls behind: one that did
//! would get a snapshot of the draft instead of the parts it missed, and a
//! snapshot counts as a loss. With N = 1,000 this is the parts per second
//! one agent can stream; with N = 1 and a window of 1 it is the part
//! latency, one part at a time like the round trip at S = 1. Latency runs
//! from the part's write to its `delta` frame at each subscriber.
//!
//! A draft takes [`parts_per_draft`] parts; then the agent streams the next
//! draft, to the next prompt, which a client connection posted while the
//! previous draft streamed (one `POST /prompt` per draft, counted in the
//! server's CPU). Drafts are left open: they end by the draft timeout,
//! after the run. relay only: nchan has no streamed answers.
//!
//! The module also holds what the part-cost figure (partcost.rs) shares:
//! the subscribers' setup and the reading of their frames.

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::net::{self, Conn, Net, WsEvent};
use crate::stats::{CpuWindow, Histogram, ResultLine};
use crate::target::{Target, parse_marker, relay_response, text_with_marker};
use crate::{Common, Errors};

/// Subscribers whose handshakes may be in flight at once.
const SETUP_BATCH: usize = 256;
/// Longest time the subscribers' setup may take.
const SETUP_LIMIT: Duration = Duration::from_secs(120);
/// How long after the last part its deliveries may still arrive.
const DRAIN: Duration = Duration::from_secs(5);
/// Parts per draft at most (fewer when they would not fit the draft's cap).
const MAX_PARTS_PER_DRAFT: u64 = 100;
/// The contract's cap on one draft's text.
const MAX_DRAFT_BYTES: u64 = 131_072;
const DELTA: &[u8] = b"{\"type\":\"delta\",";
const MESSAGE: &[u8] = b"{\"type\":\"message\",";

/// Parts a draft takes when each carries `size` bytes: up to 100, as
/// many as fit the draft's cap.
pub fn parts_per_draft(size: usize) -> u64 {
    (MAX_DRAFT_BYTES / size.max(1) as u64).clamp(1, MAX_PARTS_PER_DRAFT)
}

/// What a subscriber's text frame carries, for the streaming figures.
pub enum Got {
    /// A part as it was posted: the post's marker and the frame's `part`.
    Part { k: u64, part: u64 },
    /// A stored answer: its marker.
    Answer { k: u64 },
    /// A draft's whole text, sent instead of the parts a lagging
    /// subscriber missed: those parts are lost to the figure.
    Snapshot,
    /// Presence, receipts, pings, a draft's end: not counted.
    Other,
}

/// Classifies one text frame; a part or answer without a marker is an error.
fn classify(text: &[u8]) -> Result<Got, String> {
    let head = || String::from_utf8_lossy(&text[..text.len().min(80)]).into_owned();
    if text.starts_with(DELTA) {
        if net::find(text, b"\"snapshot\":true").is_some() {
            return Ok(Got::Snapshot);
        }
        let k = parse_marker(text).ok_or_else(|| format!("part without marker: {}", head()))?;
        let part =
            json_u64(text, "part").ok_or_else(|| format!("part without number: {}", head()))?;
        return Ok(Got::Part { k, part });
    }
    if text.starts_with(MESSAGE) {
        let k = parse_marker(text).ok_or_else(|| format!("answer without marker: {}", head()))?;
        return Ok(Got::Answer { k });
    }
    Ok(Got::Other)
}

/// The value of `"key":<digits>` in a JSON text.
fn json_u64(text: &[u8], key: &str) -> Option<u64> {
    let pat = format!("\"{key}\":");
    let start = net::find(text, pat.as_bytes())? + pat.len();
    let digits = &text[start..];
    let end = digits.iter().position(|b| !b.is_ascii_digit())?;
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// Reads the complete frames in a subscriber's input (answering pings),
/// appends what each carries to `got`, and drops the bytes read at once
/// (dropping each frame would move the rest each time).
pub fn read_frames(conn: &mut Conn, got: &mut Vec<Got>) -> Result<(), String> {
    let mut pos = 0;
    let result = walk_frames(conn, &mut pos, got);
    conn.consume(pos);
    result
}

fn walk_frames(conn: &mut Conn, pos: &mut usize, got: &mut Vec<Got>) -> Result<(), String> {
    loop {
        let Some((mut frame, n)) = net::parse_frame(&conn.inbuf[*pos..])? else {
            return Ok(());
        };
        frame.payload = frame.payload.start + *pos..frame.payload.end + *pos;
        match net::ws_event(conn, &frame)? {
            WsEvent::Text(range) => got.push(classify(&conn.inbuf[range])?),
            WsEvent::Close(code) => return Err(format!("closed by server, code {code}")),
            WsEvent::Control => {}
        }
        *pos += n;
    }
}

/// Connects `n` WebSocket subscribers to `sid` as connections 0..n of an
/// empty `net`, handshakes in batches, and returns once every one is up.
/// Frames that arrived with the upgrade stay in their input buffers.
pub fn subscribe(net: &mut Net, c: &Common, sid: &str, n: usize) -> Result<(), String> {
    debug_assert!(net.conns.is_empty());
    let handshake = net::ws_handshake(&c.host, &c.target.ws_path(sid));
    let mut up = vec![false; n];
    let mut up_count = 0;
    let mut ready = Vec::new();
    let deadline = Instant::now() + SETUP_LIMIT;
    while up_count < n {
        while net.conns.len() < n && net.conns.len() - up_count < SETUP_BATCH {
            let index = net.open().map_err(|e| format!("connect: {e}"))?;
            net.conns[index].send(&handshake);
        }
        net.wait(Duration::from_millis(20), &mut ready)
            .map_err(|e| e.to_string())?;
        for &index in &ready {
            let conn = &mut net.conns[index];
            if let Some(why) = conn.closed.take() {
                return Err(format!("setup: subscriber {index}: {why}"));
            }
            if up[index] {
                continue;
            }
            let Some((resp, used)) = net::parse_response(&conn.inbuf)? else {
                continue;
            };
            conn.consume(used);
            if resp.status != 101 {
                return Err(format!("setup: upgrade answered {}", resp.status));
            }
            up[index] = true;
            up_count += 1;
        }
        if Instant::now() > deadline {
            return Err(format!("setup: {up_count}/{n} subscribers up"));
        }
    }
    Ok(())
}

/// The prompt draft `d` answers, and the draft's own id.
fn draft_ids(d: u64) -> (String, String) {
    (format!("p{d}"), format!("d{d}"))
}

struct Run<'a> {
    c: &'a Common,
    net: Net,
    sid: String,
    subscribers: u32,
    window: u64,
    per_draft: u64,
    /// The agent's connection (the parts) and the client's (the prompts);
    /// the subscribers are 0..subscribers.
    agent: usize,
    client: usize,
    prompts_sent: u64,
    prompts_stored: u64,
    /// When each part was written.
    sent_at: Vec<Instant>,
    /// Subscribers that received each part.
    received: Vec<u32>,
    /// Parts the agent's connection acknowledged (in order: one connection).
    acked: u64,
    /// Parts acknowledged and received by every subscriber.
    complete: u64,
    /// The part each subscriber expects next.
    next: Vec<u64>,
    /// The parts whose latency is recorded: those written in the window.
    timed: Range<u64>,
    delivered: u64,
    out_of_order: u64,
    snapshots: u64,
    hist: Histogram,
    errors: Errors,
    got: Vec<Got>,
}

/// Runs the streaming figure and prints its result line; fails when any
/// subscriber missed a part, got one out of order, or an error occurred.
pub fn run(c: &Common, subscribers: usize, window: u64) -> Result<(), String> {
    if c.target != Target::Relay {
        return Err("stream: relay only (nchan has no streamed answers)".into());
    }
    if subscribers == 0 || window == 0 {
        return Err("--subscribers and --window must be positive".into());
    }
    let mut run = Run {
        c,
        net: Net::new(c.addr).map_err(|e| e.to_string())?,
        sid: format!("st{}", c.run_tag()),
        subscribers: subscribers as u32,
        window,
        per_draft: parts_per_draft(c.size),
        agent: subscribers,
        client: subscribers + 1,
        prompts_sent: 0,
        prompts_stored: 0,
        sent_at: Vec::new(),
        received: Vec::new(),
        acked: 0,
        complete: 0,
        next: vec![0; subscribers],
        timed: 0..u64::MAX,
        delivered: 0,
        out_of_order: 0,
        snapshots: 0,
        hist: Histogram::new(),
        errors: Errors::default(),
        got: Vec::new(),
    };
    run.setup(subscribers)?;
    let mut ready = Vec::new();
    let start = Instant::now();
    let warm_end = start + c.warmup;
    let end = warm_end + c.duration;
    let mut cpu = None;
    let (mut measured_from, mut complete0, mut delivered0) = (warm_end, 0, 0);
    while Instant::now() < end && run.errors.count + run.snapshots == 0 {
        if cpu.is_none() && Instant::now() >= warm_end {
            measured_from = Instant::now();
            cpu = Some(CpuWindow::start(c.server_pid.as_deref()));
            (complete0, delivered0) = (run.complete, run.delivered);
            run.timed.start = run.sent_at.len() as u64;
        }
        run.publish();
        run.step(&mut ready)?;
    }
    let used = cpu
        .map(|w| w.stop())
        .ok_or("the run ended before it began")?;
    let secs = measured_from.elapsed().as_secs_f64();
    let (parts, deliveries) = (run.complete - complete0, run.delivered - delivered0);
    let sent = run.sent_at.len() as u64;
    run.timed.end = sent;
    let drain_end = Instant::now() + DRAIN;
    while run.complete < sent && Instant::now() < drain_end && run.errors.count + run.snapshots == 0
    {
        run.step(&mut ready)?;
    }
    let missing = (sent * u64::from(run.subscribers)).saturating_sub(run.delivered);
    let mut line = ResultLine::new(&c.figure, &c.name);
    line.num("subscribers", subscribers as f64)
        .num("window", window as f64)
        .num("parts_per_draft", run.per_draft as f64)
        .window(secs, parts as f64, &run.hist, &used)
        .num("deliveries_per_s", deliveries as f64 / secs)
        .num("missing", missing as f64)
        .num("snapshots", run.snapshots as f64)
        .num("out_of_order", run.out_of_order as f64)
        .num("errors", run.errors.count as f64);
    line.print();
    run.errors.report();
    run.net.close_all();
    if missing + run.snapshots + run.out_of_order + run.errors.count > 0 {
        return Err(format!(
            "{missing} deliveries missing, {} snapshots, {} out of order, {} errors: \
             not every subscriber received every part",
            run.snapshots, run.out_of_order, run.errors.count
        ));
    }
    Ok(())
}

impl Run<'_> {
    /// The subscribers, then the agent and client connections and the
    /// first draft's prompt.
    fn setup(&mut self, subscribers: usize) -> Result<(), String> {
        subscribe(&mut self.net, self.c, &self.sid, subscribers)?;
        for _ in 0..2 {
            self.net.open().map_err(|e| format!("connect: {e}"))?;
        }
        self.post_prompt(0);
        let mut ready = Vec::new();
        let deadline = Instant::now() + SETUP_LIMIT;
        while self.prompts_stored == 0 {
            self.step(&mut ready)?;
            if Instant::now() > deadline || self.errors.count > 0 {
                return Err(format!("setup prompt: {}", self.errors.summary()));
            }
        }
        Ok(())
    }

    fn post_prompt(&mut self, d: u64) {
        let (prompt_id, _) = draft_ids(d);
        let req = self
            .c
            .target
            .post_prompt(&self.c.host, &self.sid, &prompt_id, "stream");
        self.prompts_sent += 1;
        self.net.conns[self.client].send(&req);
    }

    /// Writes parts while fewer than `window` are outstanding and their
    /// draft's prompt is stored; the first part of a draft has the client
    /// post the next draft's prompt.
    fn publish(&mut self) {
        loop {
            let k = self.sent_at.len() as u64;
            let (d, part) = (k / self.per_draft, k % self.per_draft);
            if k >= self.complete + self.window || d >= self.prompts_stored {
                return;
            }
            if part == 0 && self.prompts_sent == d + 1 {
                self.post_prompt(d + 1);
            }
            let (prompt_id, draft_id) = draft_ids(d);
            let text = text_with_marker(k, self.c.size);
            let req = relay_response(&self.c.host, &self.sid, &prompt_id, &draft_id, &text, true);
            self.sent_at.push(Instant::now());
            self.received.push(0);
            self.net.conns[self.agent].send(&req);
        }
    }

    fn step(&mut self, ready: &mut Vec<usize>) -> Result<(), String> {
        self.net
            .wait(Duration::from_millis(20), ready)
            .map_err(|e| e.to_string())?;
        let now = Instant::now();
        for &index in ready.iter() {
            let result = if index == self.agent {
                self.on_agent()
            } else if index == self.client {
                self.on_client()
            } else {
                self.on_sub(index, now)
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

    fn on_agent(&mut self) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[self.agent];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            if resp.status != 200 || net::find(&resp.body, b"\"partial\":true").is_none() {
                let body = String::from_utf8_lossy(&resp.body).into_owned();
                return Err(format!("part answered {}: {body}", resp.status));
            }
            self.acked += 1;
            self.advance_complete();
        }
    }

    fn on_client(&mut self) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[self.client];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            if resp.status != 200 {
                return Err(format!("prompt answered {}", resp.status));
            }
            self.prompts_stored += 1;
        }
    }

    fn on_sub(&mut self, index: usize, now: Instant) -> Result<(), String> {
        let mut got = std::mem::take(&mut self.got);
        let result = read_frames(&mut self.net.conns[index], &mut got);
        for g in got.drain(..) {
            match g {
                Got::Part { k, part } => self.deliver(index, k, part, now)?,
                Got::Snapshot => self.snapshots += 1,
                Got::Answer { k } => return Err(format!("an answer ({k}) where only parts go")),
                Got::Other => {}
            }
        }
        self.got = got;
        result
    }

    fn deliver(&mut self, index: usize, k: u64, part: u64, now: Instant) -> Result<(), String> {
        let Some(&sent) = self.sent_at.get(k as usize) else {
            return Err(format!("part {k} never posted"));
        };
        if part != k % self.per_draft + 1 {
            return Err(format!(
                "part {k} numbered {part}, not {}",
                k % self.per_draft + 1
            ));
        }
        if k != self.next[index] {
            self.out_of_order += 1;
        }
        self.next[index] = k + 1;
        if self.timed.contains(&k) {
            self.hist.record(now.duration_since(sent));
        }
        self.delivered += 1;
        self.received[k as usize] += 1;
        self.advance_complete();
        Ok(())
    }

    fn advance_complete(&mut self) {
        while self.complete < self.acked
            && self.received[self.complete as usize] >= self.subscribers
        {
            self.complete += 1;
        }
    }
}
