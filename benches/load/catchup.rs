//! Catch-up: one session holding M retained answers; N WebSocket subscribers
//! connect with `?after=0` and each must receive all M, in `seq` order. This
//! is the replay path (a reconnecting or late client reading history through
//! its cursor), where the live fan-out figure measures the broadcast path.
//!
//! The M prompt + answer pairs are posted first, on a few keep-alive
//! connections (each posts a prompt, then its answer, then the next pair);
//! the server needs `RELAY_HISTORY_LIMIT >= 2 * M` to keep them all. The
//! window runs from the first subscriber's connect until every subscriber has
//! its M-th answer; handshakes are started in batches, like the fan-out
//! figure's setup. relay only: nchan has no replay by cursor.

use std::time::{Duration, Instant};

use crate::net::{self, Net, WsEvent};
use crate::stats::{CpuWindow, Histogram, ResultLine};
use crate::target::{Target, text_with_marker};
use crate::{Common, Errors};

/// Subscribers whose handshakes may be in flight at once.
const SETUP_BATCH: usize = 256;
/// Longest time posting the answers or catching up may take.
const LIMIT: Duration = Duration::from_secs(120);
const MESSAGE: &[u8] = b"{\"type\":\"message\"";
const PING: &[u8] = b"{\"type\":\"ping\"";
const PRESENCE: &[u8] = b"{\"type\":\"presence\"";

struct Sub {
    connected_at: Instant,
    up: bool,
    open: bool,
    got: u64,
    last_seq: u64,
}

struct Run<'a> {
    c: &'a Common,
    net: Net,
    answers: u64,
    subs: Vec<Sub>,
    up: usize,
    /// Subscribers that received all answers, or closed.
    finished: usize,
    delivered: u64,
    out_of_order: u64,
    last_done: Option<Instant>,
    /// Each subscriber's time from its connect to its last answer (reported
    /// as sub_p50_ms, sub_p99_ms, sub_max_ms).
    hist: Histogram,
    errors: Errors,
}

/// Runs the catch-up figure and prints its result line.
pub fn run(c: &Common, subscribers: usize, answers: u64, publishers: usize) -> Result<(), String> {
    if c.target != Target::Relay {
        return Err("catchup: relay only (nchan has no replay by cursor)".into());
    }
    let sid = format!("cu{}", c.run_tag());
    fill(c, &sid, answers, publishers)?;
    let mut run = Run {
        c,
        net: Net::new(c.addr).map_err(|e| e.to_string())?,
        answers,
        subs: Vec::with_capacity(subscribers),
        up: 0,
        finished: 0,
        delivered: 0,
        out_of_order: 0,
        last_done: None,
        hist: Histogram::new(),
        errors: Errors::default(),
    };
    let handshake = net::ws_handshake(&c.host, &format!("{}?after=0", c.target.ws_path(&sid)));
    let mut ready = Vec::new();
    let cpu = CpuWindow::start(c.server_pid.as_deref());
    let start = Instant::now();
    // Stop at the first error: a failed subscriber would never finish, and
    // the result line reports what was missed.
    while run.finished < subscribers && run.errors.count == 0 && start.elapsed() < LIMIT {
        while run.subs.len() < subscribers && run.subs.len() - run.up < SETUP_BATCH {
            run.connect(&handshake)?;
        }
        run.step(&mut ready)?;
    }
    let used = cpu.stop();
    let window = start.elapsed().as_secs_f64();
    if run.finished < subscribers && run.errors.count == 0 {
        run.errors.add(format!("not caught up after {LIMIT:?}"));
    }
    run.report(subscribers, start, window, &used);
    run.net.close_all();
    Ok(())
}

/// Posts `answers` prompt + answer pairs to session `sid`, `publishers`
/// connections at a time, each pair's answer after its prompt was stored.
fn fill(c: &Common, sid: &str, answers: u64, publishers: usize) -> Result<(), String> {
    let mut net = Net::new(c.addr).map_err(|e| e.to_string())?;
    // Per connection: the pair in flight and whether its prompt is stored.
    let mut busy: Vec<Option<(u64, bool)>> = vec![None; publishers];
    for _ in 0..publishers {
        net.open().map_err(|e| format!("connect: {e}"))?;
    }
    let (mut next, mut stored) = (0u64, 0u64);
    let mut ready = Vec::new();
    let deadline = Instant::now() + LIMIT;
    while stored < answers {
        for (index, slot) in busy.iter_mut().enumerate() {
            if slot.is_none() && next < answers {
                let req = c
                    .target
                    .post_prompt(&c.host, sid, &format!("m{next}"), "catch-up");
                net.conns[index].send(&req);
                *slot = Some((next, false));
                next += 1;
            }
        }
        net.wait(Duration::from_millis(20), &mut ready)
            .map_err(|e| e.to_string())?;
        for &index in &ready {
            stored += on_fill_reply(c, sid, &mut net, index, &mut busy[index])?;
        }
        if Instant::now() > deadline {
            return Err(format!("fill: {stored}/{answers} answers stored"));
        }
    }
    net.close_all();
    Ok(())
}

/// Handles the replies on one filling connection; returns the answers stored.
fn on_fill_reply(
    c: &Common,
    sid: &str,
    net: &mut Net,
    index: usize,
    slot: &mut Option<(u64, bool)>,
) -> Result<u64, String> {
    let mut stored = 0;
    let conn = &mut net.conns[index];
    while let Some((resp, n)) = net::parse_response(&conn.inbuf)? {
        conn.consume(n);
        let Some((k, answered)) = *slot else {
            return Err(format!("fill conn {index}: reply to no request"));
        };
        if !c.target.post_ok(resp.status) {
            return Err(format!("fill conn {index}: answered {}", resp.status));
        }
        if answered {
            *slot = None;
            stored += 1;
        } else {
            let text = text_with_marker(k, c.size);
            let req = c
                .target
                .post_response(&c.host, sid, &format!("m{k}"), &text, k);
            conn.send(&req);
            *slot = Some((k, true));
        }
    }
    if let Some(why) = conn.closed.take() {
        return Err(format!("fill conn {index}: {why}"));
    }
    Ok(stored)
}

impl Run<'_> {
    fn connect(&mut self, handshake: &[u8]) -> Result<(), String> {
        let index = self.net.open().map_err(|e| format!("connect: {e}"))?;
        self.net.conns[index].send(handshake);
        self.subs.push(Sub {
            connected_at: Instant::now(),
            up: false,
            open: true,
            got: 0,
            last_seq: 0,
        });
        Ok(())
    }

    fn step(&mut self, ready: &mut Vec<usize>) -> Result<(), String> {
        self.net
            .wait(Duration::from_millis(20), ready)
            .map_err(|e| e.to_string())?;
        let now = Instant::now();
        for &index in ready.iter() {
            if let Err(e) = self.on_sub(index, now) {
                self.errors.add(format!("conn {index}: {e}"));
                self.close_sub(index);
            }
            if let Some(why) = self.net.conns[index].closed.take() {
                self.errors.add(format!("conn {index}: {why}"));
                self.close_sub(index);
            }
        }
        Ok(())
    }

    fn close_sub(&mut self, index: usize) {
        let answers = self.answers;
        if let Some(sub) = self.subs.get_mut(index).filter(|s| s.open) {
            sub.open = false;
            if sub.got < answers {
                self.finished += 1;
            }
        }
    }

    fn on_sub(&mut self, index: usize, now: Instant) -> Result<(), String> {
        if !self.subs[index].up {
            let conn = &mut self.net.conns[index];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            if resp.status != 101 {
                return Err(format!("upgrade answered {}", resp.status));
            }
            self.subs[index].up = true;
            self.up += 1;
        }
        // A replay arrives as many frames per read: walk them, then drop the
        // consumed bytes once (dropping each frame would move the rest each time).
        let mut pos = 0;
        let result = self.read_frames(index, now, &mut pos);
        self.net.conns[index].consume(pos);
        result
    }

    fn read_frames(&mut self, index: usize, now: Instant, pos: &mut usize) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[index];
            let Some((mut frame, n)) = net::parse_frame(&conn.inbuf[*pos..])? else {
                return Ok(());
            };
            frame.payload = frame.payload.start + *pos..frame.payload.end + *pos;
            let seq = match net::ws_event(conn, &frame)? {
                WsEvent::Text(range) => answer_seq(&conn.inbuf[range])?,
                WsEvent::Close(code) => return Err(format!("closed by server, code {code}")),
                WsEvent::Control => None,
            };
            *pos += n;
            if let Some(seq) = seq {
                self.deliver(index, seq, now);
            }
        }
    }

    fn deliver(&mut self, index: usize, seq: u64, now: Instant) {
        let sub = &mut self.subs[index];
        if seq <= sub.last_seq {
            self.out_of_order += 1;
        }
        sub.last_seq = seq;
        sub.got += 1;
        self.delivered += 1;
        if sub.got == self.answers {
            let took = now.duration_since(sub.connected_at);
            self.finished += 1;
            self.hist.record(took);
            self.last_done = Some(now);
        } else if sub.got == self.answers + 1 {
            self.errors
                .add(format!("conn {index}: more than {} answers", self.answers));
        }
    }

    fn report(&self, subscribers: usize, start: Instant, window: f64, used: &crate::stats::CpuUse) {
        let secs = self
            .last_done
            .map_or(window, |t| t.duration_since(start).as_secs_f64())
            .max(1e-3);
        let missing: u64 = self
            .subs
            .iter()
            .map(|s| self.answers - s.got.min(self.answers))
            .sum::<u64>()
            + (subscribers - self.subs.len()) as u64 * self.answers;
        let mut line = ResultLine::new(&self.c.figure, &self.c.name);
        line.num("subscribers", subscribers as f64)
            .num("answers", self.answers as f64)
            .num("catchup_ms", (secs * 1000.0).round())
            .num("deliveries", self.delivered as f64)
            .num("deliveries_per_s", (self.delivered as f64 / secs).round())
            .num("sub_p50_ms", self.hist.quantile_us(0.5) / 1000.0)
            .num("sub_p99_ms", self.hist.quantile_us(0.99) / 1000.0)
            .num("sub_max_ms", self.hist.max_us() / 1000.0)
            .cpu(used, window, self.delivered as f64)
            .num("missing", missing as f64)
            .num("out_of_order", self.out_of_order as f64)
            .num(
                "closed_subs",
                self.subs.iter().filter(|s| !s.open).count() as f64,
            )
            .num("errors", self.errors.count as f64);
        line.print();
        self.errors.report();
    }
}

/// The `seq` of an answer frame; `None` for a ping or the agent's
/// presence; an error for anything else (a `resync` means history was
/// trimmed: RELAY_HISTORY_LIMIT too low).
fn answer_seq(text: &[u8]) -> Result<Option<u64>, String> {
    if text.starts_with(PING) || text.starts_with(PRESENCE) {
        return Ok(None);
    }
    let head = || String::from_utf8_lossy(&text[..text.len().min(60)]).into_owned();
    if !text.starts_with(MESSAGE) {
        return Err(format!("unexpected frame {}", head()));
    }
    // `seq` is the last field of the answer (src/store/message.rs): search
    // from the end rather than across the text.
    const KEY: &[u8] = b"\"seq\":";
    let at = text
        .windows(KEY.len())
        .rposition(|w| w == KEY)
        .ok_or_else(|| format!("answer without seq: {}", head()))?;
    let digits = &text[at + KEY.len()..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end])
        .ok()
        .and_then(|d| d.parse().ok())
        .map(Some)
        .ok_or_else(|| format!("bad seq in {}", head()))
}
