//! Ingest at a fixed rate: prompts posted on C keep-alive connections at R
//! per second in all, open loop, to 1,000 sessions in turn (as
//! `ingest.lua` does with wrk, which posts as fast as the answers come).
//!
//! wrk's ingest saturates the generator's core as much as the server's, so
//! its latency is partly the generator's own queueing. Here the rate is
//! set below what either side can take, and each prompt's latency runs
//! from the moment it was due, not from when it was sent: a prompt that
//! had to wait for a free connection counts its wait (no coordinated
//! omission). The generator polls without sleeping (its core is its own)
//! so that prompts leave on time to the microsecond.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::net::{self, Net};
use crate::stats::{CpuWindow, Histogram, ResultLine};
use crate::target::text_with_marker;
use crate::{Common, Errors};

/// Sessions the prompts go to, in turn.
const SESSIONS: u64 = 1000;
/// How long prompts still in flight at the end may take to be answered.
const DRAIN: Duration = Duration::from_secs(3);

struct Run<'a> {
    c: &'a Common,
    net: Net,
    tag: String,
    /// Connections with no prompt in flight.
    idle: Vec<usize>,
    /// When the prompt in flight on each connection was due.
    due_at: Vec<Option<Instant>>,
    /// Prompts due with no connection free yet: when each was due.
    backlog: VecDeque<Instant>,
    sent: u64,
    hist: Histogram,
    errors: Errors,
    measuring: bool,
    done_in_window: u64,
    in_flight: usize,
}

/// Runs the fixed-rate ingest figure and prints its result line.
pub fn run(c: &Common, rate: f64, connections: usize) -> Result<(), String> {
    if rate.is_nan() || rate <= 0.0 || connections == 0 {
        return Err("--rate and --connections must be positive".into());
    }
    let mut run = Run {
        c,
        net: Net::new(c.addr).map_err(|e| e.to_string())?,
        tag: c.run_tag(),
        idle: Vec::with_capacity(connections),
        due_at: vec![None; connections],
        backlog: VecDeque::new(),
        sent: 0,
        hist: Histogram::new(),
        errors: Errors::default(),
        measuring: false,
        done_in_window: 0,
        in_flight: 0,
    };
    for _ in 0..connections {
        run.net.open().map_err(|e| format!("connect: {e}"))?;
    }
    let mut ready = Vec::new();
    let setup_deadline = Instant::now() + Duration::from_secs(30);
    while run.net.conns.iter().any(|conn| !conn.connected) {
        run.net
            .wait(Duration::from_millis(20), &mut ready)
            .map_err(|e| e.to_string())?;
        if let Some(why) = run.net.conns.iter().find_map(|conn| conn.closed.clone()) {
            return Err(format!("setup: {why}"));
        }
        if Instant::now() > setup_deadline {
            return Err("setup: connections not up in 30 s".into());
        }
    }
    run.idle.extend((0..connections).rev());
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = Instant::now();
    let warm_end = start + c.warmup;
    let end = warm_end + c.duration;
    let mut next_due = start;
    let mut cpu = None;
    let mut measured_from = warm_end;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if cpu.is_none() && now >= warm_end {
            run.measuring = true;
            measured_from = now;
            cpu = Some(CpuWindow::start(c.server_pid.as_deref()));
        }
        while next_due <= now {
            run.backlog.push_back(next_due);
            next_due += interval;
        }
        run.send_backlog();
        run.step(&mut ready)?;
    }
    let used = cpu
        .map(|w| w.stop())
        .ok_or("the run ended before it began")?;
    let secs = measured_from.elapsed().as_secs_f64();
    run.measuring = false;
    let behind = run.backlog.len();
    run.backlog.clear();
    let drain_end = Instant::now() + DRAIN;
    while run.in_flight > 0 && Instant::now() < drain_end {
        run.step(&mut ready)?;
    }
    let ops = run.done_in_window as f64;
    let mut line = ResultLine::new(&c.figure, &c.name);
    line.num("rate", rate)
        .num("connections", connections as f64)
        .window(secs, ops, &run.hist, &used)
        .num("behind", behind as f64)
        .num("stalled", run.in_flight as f64)
        .num("errors", run.errors.count as f64);
    line.print();
    run.errors.report();
    run.net.close_all();
    Ok(())
}

impl Run<'_> {
    /// Sends the prompts that are due on the connections that are free.
    fn send_backlog(&mut self) {
        while !self.backlog.is_empty() {
            let Some(index) = self.idle.pop() else {
                return;
            };
            let Some(due) = self.backlog.pop_front() else {
                return;
            };
            self.sent += 1;
            let sid = format!("ir{}-{}", self.tag, self.sent % SESSIONS);
            let msg_id = format!("m{}", self.sent);
            let prompt = text_with_marker(self.sent, self.c.size);
            let req = self
                .c
                .target
                .post_prompt(&self.c.host, &sid, &msg_id, &prompt);
            self.due_at[index] = Some(due);
            self.in_flight += 1;
            self.net.conns[index].send(&req);
        }
    }

    /// One look at the sockets, without sleeping; answers counted.
    fn step(&mut self, ready: &mut Vec<usize>) -> Result<(), String> {
        self.net
            .wait(Duration::ZERO, ready)
            .map_err(|e| e.to_string())?;
        for &index in ready.iter() {
            if let Err(e) = self.on_answer(index) {
                self.errors.add(format!("connection {index}: {e}"));
            }
            if let Some(why) = self.net.conns[index].closed.take() {
                self.errors.add(format!("connection {index}: {why}"));
            }
        }
        Ok(())
    }

    fn on_answer(&mut self, index: usize) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[index];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            let due = self.due_at[index]
                .take()
                .ok_or("an answer with no prompt in flight")?;
            self.in_flight -= 1;
            self.idle.push(index);
            if !self.c.target.post_ok(resp.status) {
                return Err(format!("prompt answered {}", resp.status));
            }
            if self.measuring {
                self.hist.record(due.elapsed());
                self.done_in_window += 1;
            }
        }
    }
}
