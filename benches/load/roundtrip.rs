//! Round trip: S sessions, each a WebSocket client, an HTTP connection for its
//! prompts, and an agent parked in the long-poll on its own keep-alive
//! connection (which it also posts its answers on). Each session runs one
//! round at a time: the client posts a prompt, the agent receives it and posts
//! a response, the client receives it on the WebSocket. Latency is from the
//! prompt's write to the frame's arrival.
//!
//! With `--agent external` (relay only) the generator runs no agent: a
//! separate one (`relay agent --all --jobs N`) answers, and its throughput
//! and latency are the figure. Each session's agent connection is then
//! opened and left idle, so the connection layout stays the same.

use std::time::{Duration, Instant};

use crate::net::{self, Net, WsEvent};
use crate::stats::{CpuWindow, Histogram, ResultLine};
use crate::target::{Cursor, text_with_marker};
use crate::{Common, Errors};

/// Sessions whose connections are being set up at once.
const SETUP_BATCH: usize = 100;
const ROLES: usize = 3;
const WS: usize = 0;
const CLIENT: usize = 1;
const AGENT: usize = 2;
/// How long rounds still in flight at the end may take to finish.
const DRAIN: Duration = Duration::from_secs(3);

#[derive(Default)]
struct Session {
    id: String,
    ws_up: bool,
    cursor: Cursor,
    /// The round in flight: its number, start, and which halves arrived.
    round: u64,
    started: Option<Instant>,
    acked: bool,
    delivered: bool,
}

struct Run<'a> {
    c: &'a Common,
    net: Net,
    sessions: Vec<Session>,
    hist: Histogram,
    errors: Errors,
    measuring: bool,
    posting: bool,
    done_in_window: u64,
    in_flight: usize,
    responses: u64,
    /// Whether the generator's own agents answer (not `--agent external`).
    own_agents: bool,
}

/// Runs the round-trip figure and prints its result line.
pub fn run(c: &Common, sessions: usize, own_agents: bool) -> Result<(), String> {
    let mut run = Run {
        c,
        net: Net::new(c.addr).map_err(|e| e.to_string())?,
        sessions: Vec::with_capacity(sessions),
        hist: Histogram::new(),
        errors: Errors::default(),
        measuring: false,
        posting: false,
        done_in_window: 0,
        in_flight: 0,
        responses: 0,
        own_agents,
    };
    let tag = c.run_tag();
    let mut ready = Vec::new();
    let setup_deadline = Instant::now() + Duration::from_secs(60);
    let mut up = 0;
    while up < sessions {
        while run.sessions.len() < sessions && run.sessions.len() - up < SETUP_BATCH {
            run.open_session(format!("rt{tag}-{}", run.sessions.len()))?;
        }
        run.step(&mut ready)?;
        up = run.sessions.iter().filter(|s| s.ws_up).count();
        if Instant::now() > setup_deadline || run.errors.count > 0 {
            return Err(format!(
                "setup: {up}/{sessions} sessions up; {}",
                run.errors.summary()
            ));
        }
    }
    // Let every agent's long-poll reach the server and park.
    let settle = Instant::now() + Duration::from_millis(300);
    while Instant::now() < settle {
        run.step(&mut ready)?;
    }
    run.posting = true;
    for s in 0..sessions {
        run.start_round(s);
    }
    let warm_end = Instant::now() + c.warmup;
    while Instant::now() < warm_end {
        run.step(&mut ready)?;
    }
    run.measuring = true;
    let cpu = CpuWindow::start(c.server_pid.as_deref());
    let start = Instant::now();
    let end = start + c.duration;
    while Instant::now() < end {
        run.step(&mut ready)?;
    }
    let used = cpu.stop();
    let secs = start.elapsed().as_secs_f64();
    run.measuring = false;
    run.posting = false;
    let drain_end = Instant::now() + DRAIN;
    while run.in_flight > 0 && Instant::now() < drain_end {
        run.step(&mut ready)?;
    }
    let ops = run.done_in_window as f64;
    let mut line = ResultLine::new(&c.figure, &c.name);
    line.num("sessions", sessions as f64)
        .window(secs, ops, &run.hist, &used)
        .num("stalled", run.in_flight as f64)
        .num("errors", run.errors.count as f64);
    line.print();
    run.errors.report();
    run.net.close_all();
    Ok(())
}

impl Run<'_> {
    fn open_session(&mut self, id: String) -> Result<(), String> {
        let host = &self.c.host;
        let ws = self.net.open().map_err(|e| format!("connect: {e}"))?;
        self.net.conns[ws].send(&net::ws_handshake(host, &self.c.target.ws_path(&id)));
        self.net.open().map_err(|e| format!("connect: {e}"))?;
        self.net.open().map_err(|e| format!("connect: {e}"))?;
        self.sessions.push(Session {
            id,
            ..Session::default()
        });
        Ok(())
    }

    fn step(&mut self, ready: &mut Vec<usize>) -> Result<(), String> {
        self.net
            .wait(Duration::from_millis(20), ready)
            .map_err(|e| e.to_string())?;
        for &index in ready.iter() {
            let (s, role) = (index / ROLES, index % ROLES);
            let result = match role {
                WS => self.on_ws(s, index),
                CLIENT => self.on_client(s, index),
                _ => self.on_agent(s, index),
            };
            if let Err(e) = result {
                self.errors.add(format!("session {s} role {role}: {e}"));
            }
            if let Some(why) = self.net.conns[index].closed.take() {
                self.errors.add(format!("session {s} role {role}: {why}"));
            }
        }
        Ok(())
    }

    fn on_ws(&mut self, s: usize, index: usize) -> Result<(), String> {
        let conn = &mut self.net.conns[index];
        if !self.sessions[s].ws_up {
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            if resp.status != 101 {
                return Err(format!("upgrade answered {}", resp.status));
            }
            self.sessions[s].ws_up = true;
            if self.own_agents {
                let session = &self.sessions[s];
                let req = self
                    .c
                    .target
                    .get_prompts(&self.c.host, &session.id, &session.cursor, 60);
                self.net.conns[s * ROLES + AGENT].send(&req);
            }
        }
        loop {
            let conn = &mut self.net.conns[index];
            let Some((frame, n)) = net::parse_frame(&conn.inbuf)? else {
                return Ok(());
            };
            let event = net::ws_event(conn, &frame)?;
            let is_answer = match event {
                WsEvent::Text(range) => {
                    net::find(&conn.inbuf[range], b"\"type\":\"message\"").is_some()
                }
                WsEvent::Close(code) => return Err(format!("closed by server, code {code}")),
                WsEvent::Control => false,
            };
            conn.consume(n);
            if is_answer {
                let session = &mut self.sessions[s];
                if session.started.is_none() || session.delivered {
                    return Err("unexpected answer".into());
                }
                session.delivered = true;
                self.maybe_finish(s);
            }
        }
    }

    fn on_client(&mut self, s: usize, index: usize) -> Result<(), String> {
        loop {
            let conn = &mut self.net.conns[index];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            if !self.c.target.post_ok(resp.status) {
                return Err(format!("prompt answered {}", resp.status));
            }
            self.sessions[s].acked = true;
            self.maybe_finish(s);
        }
    }

    fn on_agent(&mut self, s: usize, index: usize) -> Result<(), String> {
        let target = self.c.target;
        loop {
            let conn = &mut self.net.conns[index];
            let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
                return Ok(());
            };
            conn.consume(n);
            let session = &mut self.sessions[s];
            let msg_id = net::json_str(&resp.body, "client_msg_id")
                .map(|v| String::from_utf8_lossy(v).into_owned());
            let req = match (resp.status, msg_id) {
                // A prompt: answer it on the same connection.
                (200, Some(msg_id)) if net::find(&resp.body, b"\"prompt\"").is_some() => {
                    session.cursor.advance(resp.last_modified, resp.etag);
                    self.responses += 1;
                    let text = text_with_marker(session.round, self.c.size);
                    target.post_response(&self.c.host, &session.id, &msg_id, &text, self.responses)
                }
                // Our answer was stored, or the poll timed out (relay `[]`,
                // nchan 304/408): poll again.
                (status, _)
                    if target.post_ok(status)
                        || status == 200
                        || status == 304
                        || status == 408 =>
                {
                    target.get_prompts(&self.c.host, &session.id, &session.cursor, 60)
                }
                (status, _) => return Err(format!("agent got {status}")),
            };
            conn.send(&req);
        }
    }

    fn start_round(&mut self, s: usize) {
        let session = &mut self.sessions[s];
        session.round += 1;
        session.acked = false;
        session.delivered = false;
        let msg_id = format!("m{}", session.round);
        let prompt = text_with_marker(session.round, self.c.size);
        let req = self
            .c
            .target
            .post_prompt(&self.c.host, &session.id, &msg_id, &prompt);
        session.started = Some(Instant::now());
        self.in_flight += 1;
        self.net.conns[s * ROLES + CLIENT].send(&req);
    }

    fn maybe_finish(&mut self, s: usize) {
        let session = &mut self.sessions[s];
        if !(session.acked && session.delivered) {
            return;
        }
        let Some(started) = session.started.take() else {
            return;
        };
        self.in_flight -= 1;
        if self.measuring {
            self.hist.record(started.elapsed());
            self.done_in_window += 1;
        }
        if self.posting {
            self.start_round(s);
        }
    }
}
