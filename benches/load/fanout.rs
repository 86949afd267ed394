//! Fan-out: N WebSocket subscribers on one session; responses of a fixed size
//! are published on a few keep-alive connections and every subscriber must
//! receive every one, in order.
//!
//! `max`: publish whenever fewer than `window` messages are still missing at
//! some subscriber (as fast as all subscribers keep up). A fixed rate: message
//! k is due at start + k/rate and its latency counts from that due time, so a
//! publisher that falls behind shows up in the percentiles (no coordinated
//! omission).

use std::time::{Duration, Instant};

use crate::net::{self, Net, WsEvent};
use crate::stats::{CpuWindow, Histogram, ResultLine};
use crate::target::{Target, parse_marker, text_with_marker};
use crate::{Common, Errors};

/// Subscribers whose handshakes may be in flight at once.
const SETUP_BATCH: usize = 256;
/// How long after the last publish deliveries may still arrive.
const DRAIN: Duration = Duration::from_secs(5);
const PROMPT_ID: &str = "fan";

/// How fast to publish.
#[derive(Clone, Copy)]
pub enum Rate {
    /// Keep at most `window` messages not yet delivered everywhere.
    Max { window: u64 },
    /// Messages per second.
    Fixed(f64),
}

struct Sub {
    up: bool,
    next: u64,
    open: bool,
}

struct Run<'a> {
    c: &'a Common,
    net: Net,
    sid: String,
    subs: Vec<Sub>,
    /// Index of the first publisher connection; the others follow.
    first_pub: usize,
    pub_busy: Vec<bool>,
    /// When each message was published (max) or due (fixed rate).
    sent_at: Vec<Instant>,
    /// Subscribers that received each message.
    received: Vec<u32>,
    /// Messages received by every open subscriber.
    complete: u64,
    open_subs: u32,
    delivered: u64,
    out_of_order: u64,
    last_delivery: Option<Instant>,
    hist: Histogram,
    errors: Errors,
}

/// Runs the fan-out figure and prints its result line.
pub fn run(c: &Common, subscribers: usize, rate: Rate, publishers: usize) -> Result<(), String> {
    let sid = format!("fan{}", c.run_tag());
    let mut run = Run {
        c,
        net: Net::new(c.addr).map_err(|e| e.to_string())?,
        sid,
        subs: Vec::with_capacity(subscribers),
        first_pub: subscribers,
        pub_busy: vec![false; publishers],
        sent_at: Vec::new(),
        received: Vec::new(),
        complete: 0,
        open_subs: 0,
        delivered: 0,
        out_of_order: 0,
        last_delivery: None,
        hist: Histogram::new(),
        errors: Errors::default(),
    };
    run.setup(subscribers)?;
    let mut ready = Vec::new();
    let cpu = CpuWindow::start(c.server_pid.as_deref());
    let start = Instant::now();
    let end = start + c.duration;
    while Instant::now() < end {
        run.publish(rate, start, end);
        let timeout = match rate {
            Rate::Fixed(r) if run.pub_busy.contains(&false) => run
                .next_due(start, r)
                .saturating_duration_since(Instant::now()),
            _ => Duration::from_millis(20),
        };
        run.step(timeout.min(Duration::from_millis(20)), &mut ready)?;
    }
    let published = run.sent_at.len() as u64;
    let drain_end = Instant::now() + DRAIN;
    while run.complete < published && Instant::now() < drain_end && run.subs.iter().any(|s| s.open)
    {
        run.step(Duration::from_millis(20), &mut ready)?;
    }
    let used = cpu.stop();
    let last = run.last_delivery.unwrap_or(start);
    let secs = last.duration_since(start).as_secs_f64().max(1e-3);
    let expected = published * subscribers as u64;
    let mut line = ResultLine::new(&c.figure, &c.name);
    line.num("subscribers", subscribers as f64)
        .num("published", published as f64)
        .num(
            "offered_msgs_per_s",
            published as f64 / c.duration.as_secs_f64(),
        )
        .num("deliveries", run.delivered as f64)
        .num("deliveries_per_s", run.delivered as f64 / secs)
        .latency(&run.hist)
        .cpu(&used, start.elapsed().as_secs_f64(), run.delivered as f64)
        .num("missing", expected.saturating_sub(run.delivered) as f64)
        .num("out_of_order", run.out_of_order as f64)
        .num(
            "closed_subs",
            run.subs.iter().filter(|s| !s.open).count() as f64,
        )
        .num("errors", run.errors.count as f64);
    line.print();
    run.errors.report();
    run.net.close_all();
    Ok(())
}

impl Run<'_> {
    fn setup(&mut self, subscribers: usize) -> Result<(), String> {
        let path = self.c.target.ws_path(&self.sid);
        let handshake = net::ws_handshake(&self.c.host, &path);
        let mut ready = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut up = 0;
        while up < subscribers {
            while self.subs.len() < subscribers && self.subs.len() - up < SETUP_BATCH {
                let index = match self.c.addr2 {
                    Some(a) if self.subs.len() % 2 == 1 => self.net.open_to(a),
                    _ => self.net.open(),
                }
                .map_err(|e| format!("connect: {e}"))?;
                self.net.conns[index].send(&handshake);
                self.subs.push(Sub {
                    up: false,
                    next: 0,
                    open: true,
                });
                self.open_subs += 1;
            }
            self.step(Duration::from_millis(20), &mut ready)?;
            up = self.subs.iter().filter(|s| s.up).count();
            if Instant::now() > deadline || self.errors.count > 0 {
                return Err(format!(
                    "setup: {up}/{subscribers} subscribers up; {}",
                    self.errors.summary()
                ));
            }
        }
        for _ in 0..self.pub_busy.len() {
            self.net.open().map_err(|e| format!("connect: {e}"))?;
        }
        if self.c.target == Target::Relay {
            // Responses need a prompt to answer; every one answers this one.
            let req = self
                .c
                .target
                .post_prompt(&self.c.host, &self.sid, PROMPT_ID, "fan-out");
            self.net.conns[self.first_pub].send(&req);
            self.pub_busy[0] = true;
            while self.pub_busy[0] {
                self.step(Duration::from_millis(20), &mut ready)?;
                if Instant::now() > deadline || self.errors.count > 0 {
                    return Err(format!("setup prompt: {}", self.errors.summary()));
                }
            }
        }
        Ok(())
    }

    fn next_due(&self, start: Instant, rate: f64) -> Instant {
        start + Duration::from_secs_f64(self.sent_at.len() as f64 / rate)
    }

    fn publish(&mut self, rate: Rate, start: Instant, end: Instant) {
        while let Some(p) = self.pub_busy.iter().position(|b| !b) {
            let now = Instant::now();
            let stamp = match rate {
                Rate::Max { window } if (self.sent_at.len() as u64) < self.complete + window => now,
                Rate::Fixed(r)
                    if self.next_due(start, r) <= now && self.next_due(start, r) < end =>
                {
                    self.next_due(start, r)
                }
                _ => return,
            };
            let k = self.sent_at.len() as u64;
            let text = text_with_marker(k, self.c.size);
            let req = self
                .c
                .target
                .post_response(&self.c.host, &self.sid, PROMPT_ID, &text, k);
            self.sent_at.push(stamp);
            self.received.push(0);
            self.pub_busy[p] = true;
            self.net.conns[self.first_pub + p].send(&req);
        }
    }

    fn step(&mut self, timeout: Duration, ready: &mut Vec<usize>) -> Result<(), String> {
        self.net.wait(timeout, ready).map_err(|e| e.to_string())?;
        for &index in ready.iter() {
            let result = if index < self.first_pub {
                self.on_sub(index)
            } else {
                self.on_pub(index)
            };
            if let Err(e) = result {
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
        if let Some(sub) = self.subs.get_mut(index).filter(|s| s.open) {
            sub.open = false;
            self.open_subs -= 1;
            self.advance_complete();
        }
    }

    fn on_pub(&mut self, index: usize) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[index];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            self.pub_busy[index - self.first_pub] = false;
            if !self.c.target.post_ok(resp.status) {
                return Err(format!("publish answered {}", resp.status));
            }
        }
    }

    fn on_sub(&mut self, index: usize) -> Result<(), String> {
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
        }
        let now = Instant::now();
        loop {
            let conn = &mut self.net.conns[index];
            let Some((frame, n)) = net::parse_frame(&conn.inbuf)? else {
                return Ok(());
            };
            let marker = match net::ws_event(conn, &frame)? {
                WsEvent::Text(range) => {
                    let text = &conn.inbuf[range];
                    if net::find(text, b"\"type\":\"message\"").is_some() {
                        parse_marker(text)
                    } else {
                        None
                    }
                }
                WsEvent::Close(code) => return Err(format!("closed by server, code {code}")),
                WsEvent::Control => None,
            };
            conn.consume(n);
            if let Some(k) = marker {
                self.deliver(index, k, now);
            }
        }
    }

    fn deliver(&mut self, index: usize, k: u64, now: Instant) {
        let Some(&sent) = self.sent_at.get(k as usize) else {
            self.errors
                .add(format!("conn {index}: message {k} never published"));
            return;
        };
        self.hist.record(now.duration_since(sent));
        self.delivered += 1;
        self.last_delivery = Some(now);
        let sub = &mut self.subs[index];
        if k != sub.next {
            self.out_of_order += 1;
        }
        sub.next = k + 1;
        self.received[k as usize] += 1;
        self.advance_complete();
    }

    fn advance_complete(&mut self) {
        while (self.complete as usize) < self.received.len()
            && self.received[self.complete as usize] >= self.open_subs
        {
            self.complete += 1;
        }
    }
}
