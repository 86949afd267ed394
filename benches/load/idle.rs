//! Idle: N WebSocket subscribers, or N parked long-polls, each on its own
//! session, held open while nothing happens. Reports the server's RSS growth
//! per connection (VmRSS before the first connection and after the last one
//! is up) and its CPU while they idle.

use std::time::{Duration, Instant};

use crate::net::{self, Net};
use crate::stats::{self, CpuWindow, ResultLine};
use crate::target::{Cursor, Target};
use crate::{Common, Errors};

/// Connections being set up at once.
const SETUP_BATCH: usize = 256;
/// Time for the last requests to reach the server and park.
const SETTLE: Duration = Duration::from_secs(1);

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
    /// Upgraded, or long-poll sent.
    Up,
}

/// Runs the idle figure and prints its result line.
pub fn run(c: &Common, connections: usize, kind: Kind, hold: Duration) -> Result<(), String> {
    let pid = c.server_pid.as_deref().ok_or("idle needs --server-pid")?;
    let tag = c.run_tag();
    let mut net = Net::new(c.addr).map_err(|e| e.to_string())?;
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
            let (req, state) = first_request(c, kind, &sid);
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

fn first_request(c: &Common, kind: Kind, sid: &str) -> (Vec<u8>, State) {
    match (kind, c.target.create_session(&c.host, sid)) {
        (Kind::Ws, _) => (
            net::ws_handshake(&c.host, &c.target.ws_path(sid)),
            State::Opening,
        ),
        (Kind::Poll, Some(create)) => (create, State::Opening),
        (Kind::Poll, None) => (poll_request(c, sid), State::Up),
    }
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
