//! Wake: one agent woken by prompts spread over S sessions, relay only.
//! C lanes of clients each post one prompt at a time, every prompt to the
//! next session in turn (so consecutive prompts land in different sessions
//! and all S are used); the agent answers each. A round is the prompt's
//! write to its answer's acknowledgement.
//!
//! Two agents doing the same work per prompt (a wake, a page of one
//! prompt, an answer), so their server CPU per round compares the two
//! polls:
//! - `own`: one keep-alive connection per session parked on
//!   `GET /prompts/{sid}`, answering on that connection and parking again;
//! - `every`: one connection parked on `GET /prompts` with no session and
//!   `after=<cursor>`, answering what a page lists on that connection and
//!   parking again after the last answer's acknowledgement.
//!
//! Both agents answer on the connection their poll came on, so the server
//! handles the same connections per round; with several lanes the
//! all-sessions poll may list several prompts in one page.
//!
//! Every session is created (`PUT /sessions/{sid}`) before the window in
//! both, so the server holds the same sessions.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::net::{self, Net};
use crate::stats::{CpuWindow, Histogram, ResultLine};
use crate::target::{Cursor, relay_response, text_with_marker};
use crate::{Common, Errors};

/// How long rounds still in flight at the end may take to finish.
const DRAIN: Duration = Duration::from_secs(3);

/// Which agent answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    Own,
    Every,
}

impl Agent {
    pub fn parse(s: &str) -> Option<Agent> {
        match s {
            "own" => Some(Agent::Own),
            "every" => Some(Agent::Every),
            _ => None,
        }
    }
}

#[derive(Default)]
struct Lane {
    round: u64,
    started: Option<Instant>,
    acked: bool,
    answered: bool,
}

struct Run<'a> {
    c: &'a Common,
    agent: Agent,
    net: Net,
    tag: String,
    sessions: usize,
    lanes: Vec<Lane>,
    /// The session the next prompt goes to.
    next_session: usize,
    /// `every`: the cursor of the last prompt listed.
    after: Option<String>,
    /// `every`: answers posted and not acknowledged yet.
    every_acks: usize,
    hist: Histogram,
    errors: Errors,
    measuring: bool,
    posting: bool,
    done_in_window: u64,
    in_flight: usize,
    /// Pages the agent received, and the prompts they listed.
    pages: u64,
    listed: u64,
}

/// Runs the wake figure and prints its result line.
pub fn run(c: &Common, sessions: usize, lanes: usize, agent: Agent) -> Result<(), String> {
    let mut run = Run {
        c,
        agent,
        net: Net::new(c.addr).map_err(|e| e.to_string())?,
        tag: c.run_tag(),
        sessions,
        lanes: (0..lanes).map(|_| Lane::default()).collect(),
        next_session: 0,
        after: None,
        every_acks: 0,
        hist: Histogram::new(),
        errors: Errors::default(),
        measuring: false,
        posting: false,
        done_in_window: 0,
        in_flight: 0,
        pages: 0,
        listed: 0,
    };
    // Lanes first (indexes 0..C), then the agent's connections.
    for _ in 0..lanes {
        run.net.open().map_err(|e| format!("connect: {e}"))?;
    }
    run.create_sessions()?;
    let agents = match agent {
        Agent::Own => sessions,
        Agent::Every => 1,
    };
    for _ in 0..agents {
        run.net.open().map_err(|e| format!("connect: {e}"))?;
    }
    match agent {
        Agent::Own => {
            for s in 0..sessions {
                let req = run.own_poll(s);
                run.net.conns[lanes + s].send(&req);
            }
        }
        Agent::Every => {
            let req = run.every_poll();
            run.net.conns[lanes].send(&req);
        }
    }
    let mut ready = Vec::new();
    // Let every long-poll reach the server and park.
    let settle = Instant::now() + Duration::from_millis(500);
    while Instant::now() < settle {
        run.step(&mut ready)?;
    }
    run.posting = true;
    for l in 0..lanes {
        run.start_round(l);
    }
    let warm_end = Instant::now() + c.warmup;
    while Instant::now() < warm_end {
        run.step(&mut ready)?;
    }
    run.measuring = true;
    let (pages0, listed0) = (run.pages, run.listed);
    let cpu = CpuWindow::start(c.server_pid.as_deref());
    let start = Instant::now();
    let end = start + c.duration;
    while Instant::now() < end {
        run.step(&mut ready)?;
    }
    let used = cpu.stop();
    let secs = start.elapsed().as_secs_f64();
    let (pages, listed) = (run.pages - pages0, run.listed - listed0);
    run.measuring = false;
    run.posting = false;
    let drain_end = Instant::now() + DRAIN;
    while run.in_flight > 0 && Instant::now() < drain_end {
        run.step(&mut ready)?;
    }
    let ops = run.done_in_window as f64;
    let mut line = ResultLine::new(&c.figure, &c.name);
    line.num("sessions", sessions as f64)
        .num("lanes", lanes as f64)
        .window(secs, ops, &run.hist, &used)
        .num("prompts_per_page", listed as f64 / (pages as f64).max(1.0))
        .num("stalled", run.in_flight as f64)
        .num("errors", run.errors.count as f64);
    line.print();
    run.errors.report();
    run.net.close_all();
    Ok(())
}

impl Run<'_> {
    fn sid(&self, s: usize) -> String {
        format!("wk{}-{s}", self.tag)
    }

    /// Creates every session, one request in flight per lane.
    fn create_sessions(&mut self) -> Result<(), String> {
        let lanes = self.lanes.len();
        let mut next = 0;
        let mut waiting = vec![false; lanes];
        let mut done = 0;
        let mut ready = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while done < self.sessions {
            for (l, busy) in waiting.iter_mut().enumerate() {
                if !*busy && next < self.sessions {
                    let req = format!(
                        "PUT /sessions/{} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\n\r\n",
                        self.sid(next),
                        self.c.host
                    );
                    self.net.conns[l].send(req.as_bytes());
                    *busy = true;
                    next += 1;
                }
            }
            self.net
                .wait(Duration::from_millis(20), &mut ready)
                .map_err(|e| e.to_string())?;
            for &l in ready.iter() {
                let conn = &mut self.net.conns[l];
                while let Some((resp, n)) = net::parse_response(&conn.inbuf)? {
                    conn.consume(n);
                    if resp.status != 200 && resp.status != 201 {
                        return Err(format!("PUT /sessions answered {}", resp.status));
                    }
                    waiting[l] = false;
                    done += 1;
                }
            }
            if Instant::now() > deadline {
                return Err(format!("setup: {done}/{} sessions created", self.sessions));
            }
        }
        Ok(())
    }

    fn own_poll(&self, s: usize) -> Vec<u8> {
        self.c
            .target
            .get_prompts(&self.c.host, &self.sid(s), &Cursor::default(), 60)
    }

    fn every_poll(&self) -> Vec<u8> {
        let after = match &self.after {
            Some(a) => format!("&after={a}"),
            None => String::new(),
        };
        format!(
            "GET /prompts?timeout=60&limit=1000{after} HTTP/1.1\r\nHost: {}\r\n\r\n",
            self.c.host
        )
        .into_bytes()
    }

    fn step(&mut self, ready: &mut Vec<usize>) -> Result<(), String> {
        self.net
            .wait(Duration::from_millis(20), ready)
            .map_err(|e| e.to_string())?;
        let lanes = self.lanes.len();
        for &index in ready.iter() {
            let result = if index < lanes {
                self.on_lane(index)
            } else {
                match self.agent {
                    Agent::Own => self.on_own(index - lanes, index),
                    Agent::Every => self.on_every(index),
                }
            };
            if let Err(e) = result {
                self.errors.add(format!("connection {index}: {e}"));
            }
            if let Some(why) = self.net.conns[index].closed.take() {
                self.errors.add(format!("connection {index}: {why}"));
            }
        }
        Ok(())
    }

    /// A prompt's acknowledgement.
    fn on_lane(&mut self, l: usize) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[l];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            if resp.status != 200 {
                return Err(format!("prompt answered {}", resp.status));
            }
            self.lanes[l].acked = true;
            self.maybe_finish(l);
        }
    }

    /// `own`: a page of the session's prompts (answer each on this
    /// connection), or an answer's acknowledgement (finish its round and
    /// park again).
    fn on_own(&mut self, s: usize, index: usize) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[index];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            if resp.status != 200 {
                return Err(format!("agent got {}", resp.status));
            }
            let body: Value = serde_json::from_slice(&resp.body).map_err(|e| e.to_string())?;
            match body {
                Value::Array(items) => {
                    if items.is_empty() {
                        let req = self.own_poll(s);
                        self.net.conns[index].send(&req);
                        continue;
                    }
                    self.pages += 1;
                    self.listed += items.len() as u64;
                    // Answers go out pipelined; the poll follows the last ack.
                    for item in &items {
                        let (sid, id) = ids(item)?;
                        let req = self.answer(sid, id);
                        self.net.conns[index].send(&req);
                    }
                }
                ack => {
                    let assistant = ack["assistant_msg_id"].as_str().unwrap_or("");
                    let l = lane_of(assistant.strip_prefix("a-").unwrap_or(assistant))?;
                    self.lanes[l].answered = true;
                    self.maybe_finish(l);
                    let req = self.own_poll(s);
                    self.net.conns[index].send(&req);
                }
            }
        }
    }

    /// `every`: a page of prompts of any session (answered on this
    /// connection), or an answer's acknowledgement (finish its round; after
    /// the page's last, park again).
    fn on_every(&mut self, index: usize) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[index];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            if resp.status != 200 {
                return Err(format!("agent got {}", resp.status));
            }
            let body: Value = serde_json::from_slice(&resp.body).map_err(|e| e.to_string())?;
            if self.every_acks > 0 {
                let assistant = body["assistant_msg_id"].as_str().unwrap_or("");
                let l = lane_of(assistant.strip_prefix("a-").unwrap_or(assistant))?;
                self.lanes[l].answered = true;
                self.maybe_finish(l);
                self.every_acks -= 1;
                if self.every_acks == 0 {
                    let req = self.every_poll();
                    self.net.conns[index].send(&req);
                }
                continue;
            }
            let Value::Array(items) = body else {
                return Err("the poll's answer is not a list".into());
            };
            let Some(last) = items.last() else {
                let req = self.every_poll();
                self.net.conns[index].send(&req);
                continue;
            };
            self.after = last["cursor"].as_str().map(str::to_owned);
            self.pages += 1;
            self.listed += items.len() as u64;
            self.every_acks = items.len();
            for item in &items {
                let (sid, id) = ids(item)?;
                let req = self.answer(sid, id);
                self.net.conns[index].send(&req);
            }
        }
    }

    fn answer(&self, sid: &str, id: &str) -> Vec<u8> {
        let text = text_with_marker(0, self.c.size);
        let assistant = format!("a-{id}");
        relay_response(&self.c.host, sid, id, &assistant, &text, false)
    }

    fn start_round(&mut self, l: usize) {
        let s = self.next_session;
        self.next_session = (s + 1) % self.sessions;
        let lane = &mut self.lanes[l];
        lane.round += 1;
        lane.acked = false;
        lane.answered = false;
        let msg_id = format!("l{l}r{}", lane.round);
        let prompt = text_with_marker(lane.round, self.c.size);
        let req = self
            .c
            .target
            .post_prompt(&self.c.host, &self.sid(s), &msg_id, &prompt);
        self.lanes[l].started = Some(Instant::now());
        self.in_flight += 1;
        self.net.conns[l].send(&req);
    }

    fn maybe_finish(&mut self, l: usize) {
        let lane = &mut self.lanes[l];
        if !(lane.acked && lane.answered) {
            return;
        }
        let Some(started) = lane.started.take() else {
            return;
        };
        self.in_flight -= 1;
        if self.measuring {
            self.hist.record(started.elapsed());
            self.done_in_window += 1;
        }
        if self.posting {
            self.start_round(l);
        }
    }
}

/// A listed prompt's session and id.
fn ids(item: &Value) -> Result<(&str, &str), String> {
    match (item["session_id"].as_str(), item["client_msg_id"].as_str()) {
        (Some(sid), Some(id)) => Ok((sid, id)),
        _ => Err(format!("a listed prompt without its ids: {item}")),
    }
}

/// The lane of a prompt id `l<lane>r<round>`.
fn lane_of(id: &str) -> Result<usize, String> {
    id.strip_prefix('l')
        .and_then(|rest| rest.split('r').next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("not a bench prompt id: {id}"))
}
