//! Idle: N WebSocket subscribers, or N parked long-polls, each on its own
//! session, held open while nothing happens. Reports the server's RSS growth
//! per connection (VmRSS before the first connection and after the last one
//! is up) and its CPU while they idle.
//!
//! By default the sessions are created before the first RSS reading (relay
//! only; nchan makes a channel on its first subscriber), so the figure is
//! what a connection adds to a session that exists anyway: the connection,
//! and what the session keeps for it (its place in the session's lists, an
//! agent's live state). With [`Sessions::New`] each connection creates its
//! session and the figure holds the session's own cost too.

use std::time::{Duration, Instant};

use crate::net::{self, Net};
use crate::stats::{self, CpuWindow, ResultLine};
use crate::target::{Cursor, Target};
use crate::{Common, Errors};

/// Connections being set up at once.
const SETUP_BATCH: usize = 256;
/// Time for the last requests to reach the server and park.
const SETTLE: Duration = Duration::from_secs(1);

/// Sessions created per lane at a time while setting up.
const CREATE_LANES: usize = 32;

/// Whose cost the figure counts: a session's or only its connection's.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Sessions {
    /// Created before the first RSS reading.
    Existing,
    /// Created by each connection's setup, inside the measurement.
    New,
}

/// What each idle connection is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ws,
    Poll,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// WebSocket handshake sent, or (relay long-poll) session creation sent.
    Opening,
    /// Long-poll sent on a connection not yet known to be established:
    /// counted as setting up, so connections are opened a batch at a time
    /// (a burst of thousands overflows the server's listen backlog).
    Sent,
    /// Upgraded, or long-poll sent.
    Up,
}

/// Runs the idle figure and prints its result line.
pub fn run(
    c: &Common,
    connections: usize,
    kind: Kind,
    sessions: Sessions,
    hold: Duration,
) -> Result<(), String> {
    let pid = c.server_pid.as_deref().ok_or("idle needs --server-pid")?;
    let tag = c.run_tag();
    let mut net = Net::new(c.addr).map_err(|e| e.to_string())?;
    let existing =
        sessions == Sessions::Existing && c.target.create_session(&c.host, "s").is_some();
    if existing {
        create_sessions(c, &mut net, connections, &tag)?;
        net.close_all();
    }
    let mut states: Vec<State> = Vec::with_capacity(connections);
    let mut errors = Errors::default();
    let mut ready = Vec::new();
    let rss_before = stats::rss_bytes(pid).ok_or("cannot read server RSS")?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(180);
    let mut up = 0;
    while up < connections {
        while states.len() < connections && states.len() - up < SETUP_BATCH {
            let index = net.open().map_err(|e| format!("connect: {e}"))?;
            let sid = format!("idle{tag}-{index}");
            let (req, state) = first_request(c, kind, &sid, existing);
            net.conns[index].send(&req);
            states.push(state);
            up += usize::from(state == State::Up);
        }
        net.wait(Duration::from_millis(20), &mut ready)
            .map_err(|e| e.to_string())?;
        for &index in &ready {
            if let Err(e) = on_ready(c, kind, &mut net, index, &mut states[index], &mut up, &tag) {
                errors.add(format!("conn {index}: {e}"));
            }
        }
        if Instant::now() > deadline || errors.count > 0 {
            return Err(format!(
                "setup: {up}/{connections} up; {}",
                errors.summary()
            ));
        }
    }
    let setup_secs = started.elapsed().as_secs_f64();
    let settle_end = Instant::now() + SETTLE;
    pump(
        c,
        kind,
        &mut net,
        &mut states,
        &mut errors,
        settle_end,
        &tag,
    )?;
    let rss_after = stats::rss_bytes(pid).ok_or("cannot read server RSS")?;
    let cpu = CpuWindow::start(Some(pid));
    let hold_start = Instant::now();
    pump(
        c,
        kind,
        &mut net,
        &mut states,
        &mut errors,
        hold_start + hold,
        &tag,
    )?;
    let used = cpu.stop();
    let secs = hold_start.elapsed().as_secs_f64();
    let growth = rss_after.saturating_sub(rss_before) as f64;
    let figure = &c.figure;
    let mut line = ResultLine::new(figure, &c.name);
    line.num("connections", connections as f64)
        .num("connect_per_s", connections as f64 / setup_secs)
        .num("rss_before_mib", rss_before as f64 / 1048576.0)
        .num("rss_after_mib", rss_after as f64 / 1048576.0)
        .num("rss_bytes_per_conn", (growth / connections as f64).round())
        .cpu(&used, secs, 0.0)
        .num("errors", errors.count as f64);
    line.print();
    errors.report();
    if let Some(counters) = c.target.healthz(c.addr) {
        eprintln!("relay /healthz with the idle connections open: {counters}");
    }
    net.close_all();
    Ok(())
}

/// The sessions alone: N created and no connection held, the server's RSS
/// growth per session (relay only). What the figures with new sessions
/// hold besides their connections.
pub fn sessions_only(c: &Common, n: usize) -> Result<(), String> {
    let pid = c.server_pid.as_deref().ok_or("idle needs --server-pid")?;
    if c.target.create_session(&c.host, "s").is_none() {
        return Err("the sessions figure needs sessions to create (relay)".into());
    }
    let tag = c.run_tag();
    let mut net = Net::new(c.addr).map_err(|e| e.to_string())?;
    let rss_before = stats::rss_bytes(pid).ok_or("cannot read server RSS")?;
    create_sessions(c, &mut net, n, &tag)?;
    net.close_all();
    std::thread::sleep(SETTLE);
    let rss_after = stats::rss_bytes(pid).ok_or("cannot read server RSS")?;
    let growth = rss_after.saturating_sub(rss_before) as f64;
    let mut line = ResultLine::new(&c.figure, &c.name);
    line.num("sessions", n as f64)
        .num("rss_before_mib", rss_before as f64 / 1048576.0)
        .num("rss_after_mib", rss_after as f64 / 1048576.0)
        .num("rss_bytes_per_session", (growth / n as f64).round());
    line.print();
    Ok(())
}

fn first_request(c: &Common, kind: Kind, sid: &str, existing: bool) -> (Vec<u8>, State) {
    let create = c.target.create_session(&c.host, sid).filter(|_| !existing);
    match (kind, create) {
        (Kind::Ws, _) => (
            net::ws_handshake(&c.host, &c.target.ws_path(sid)),
            State::Opening,
        ),
        (Kind::Poll, Some(create)) => (create, State::Opening),
        (Kind::Poll, None) => (poll_request(c, sid), State::Sent),
    }
}

/// Creates the sessions `idle{tag}-0` to `idle{tag}-{n-1}`, one request in
/// flight per lane, and waits for every answer.
fn create_sessions(c: &Common, net: &mut Net, n: usize, tag: &str) -> Result<(), String> {
    let lanes = CREATE_LANES.min(n);
    for _ in 0..lanes {
        net.open().map_err(|e| format!("connect: {e}"))?;
    }
    let mut busy = vec![false; lanes];
    let (mut next, mut done) = (0, 0);
    let mut ready = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    while done < n {
        for (lane, busy) in busy.iter_mut().enumerate() {
            if !*busy && next < n {
                let sid = format!("idle{tag}-{next}");
                if let Some(req) = c.target.create_session(&c.host, &sid) {
                    net.conns[lane].send(&req);
                }
                *busy = true;
                next += 1;
            }
        }
        net.wait(Duration::from_millis(20), &mut ready)
            .map_err(|e| e.to_string())?;
        for &lane in &ready {
            let conn = &mut net.conns[lane];
            if let Some(why) = conn.closed.take() {
                return Err(format!("creating sessions: {why}"));
            }
            while let Some((resp, used)) = net::parse_response(&conn.inbuf)? {
                conn.consume(used);
                if resp.status != 200 && resp.status != 201 {
                    return Err(format!("PUT /sessions answered {}", resp.status));
                }
                busy[lane] = false;
                done += 1;
            }
        }
        if Instant::now() > deadline {
            return Err(format!("setup: {done}/{n} sessions created"));
        }
    }
    Ok(())
}

fn poll_request(c: &Common, sid: &str) -> Vec<u8> {
    c.target.get_prompts(&c.host, sid, &Cursor::default(), 300)
}

/// Keeps answering pings and watching for closes until `until`.
fn pump(
    c: &Common,
    kind: Kind,
    net: &mut Net,
    states: &mut [State],
    errors: &mut Errors,
    until: Instant,
    tag: &str,
) -> Result<(), String> {
    let mut ready = Vec::new();
    let mut up = 0;
    while Instant::now() < until {
        net.wait(Duration::from_millis(50), &mut ready)
            .map_err(|e| e.to_string())?;
        for &index in &ready {
            if let Err(e) = on_ready(c, kind, net, index, &mut states[index], &mut up, tag) {
                errors.add(format!("conn {index}: {e}"));
            }
        }
    }
    Ok(())
}

fn on_ready(
    c: &Common,
    kind: Kind,
    net: &mut Net,
    index: usize,
    state: &mut State,
    up: &mut usize,
    tag: &str,
) -> Result<(), String> {
    let conn = &mut net.conns[index];
    if let Some(why) = conn.closed.take() {
        return Err(why);
    }
    if *state == State::Sent {
        // Ready: the connection is established and its request written.
        *state = State::Up;
        *up += 1;
    }
    if *state == State::Opening {
        let Some((resp, n)) = net::parse_response(&conn.inbuf)? else {
            return Ok(());
        };
        conn.consume(n);
        match (kind, resp.status) {
            (Kind::Ws, 101) => {}
            (Kind::Poll, 200) => conn.send(&poll_request(c, &format!("idle{tag}-{index}"))),
            (_, status) => return Err(format!("setup answered {status}")),
        }
        *state = State::Up;
        *up += 1;
    }
    match kind {
        Kind::Ws => loop {
            let Some((frame, n)) = net::parse_frame(&conn.inbuf)? else {
                return Ok(());
            };
            if let net::WsEvent::Close(code) = net::ws_event(conn, &frame)? {
                return Err(format!("closed by server, code {code}"));
            }
            conn.consume(n);
        },
        // A parked poll answers only at its timeout (300 s, beyond any run).
        Kind::Poll if !conn.inbuf.is_empty() => {
            let status = net::parse_response(&conn.inbuf)?.map(|(r, _)| r.status);
            Err(format!("long-poll answered early: {status:?}"))
        }
        Kind::Poll => Ok(()),
    }
}

impl Sessions {
    pub fn parse(s: &str) -> Option<Sessions> {
        match s {
            "existing" => Some(Sessions::Existing),
            "new" => Some(Sessions::New),
            _ => None,
        }
    }
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "ws" => Some(Kind::Ws),
            "poll" => Some(Kind::Poll),
            _ => None,
        }
    }
}

impl Target {
    /// The counters of a relay's /healthz, for checking an idle run (relay only).
    pub fn healthz(self, addr: std::net::SocketAddr) -> Option<String> {
        use std::io::{Read, Write};
        if self != Target::Relay {
            return None;
        }
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out.split("\r\n\r\n").nth(1)?.to_owned())
    }
}
