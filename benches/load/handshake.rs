//! Handshakes: C connections at a time, each a new TCP connection with a
//! full TLS handshake (the client never resumes a session) and one
//! `GET /healthz` with `Connection: close`; each answered connection is
//! replaced by a new one. The request makes the server finish its side of
//! the handshake before the client counts it. Reports connections per
//! second and the server's CPU per connection: 1e6 / server_us_per_op is
//! how many one core of the server completes per second.

use std::time::{Duration, Instant};

use crate::net::{self, Net};
use crate::stats::{CpuWindow, Histogram, ResultLine};
use crate::{Common, Errors};

/// Runs the handshake figure and prints its result line.
pub fn run(c: &Common, connections: usize) -> Result<(), String> {
    if net::TLS.get().is_none() {
        return Err("handshake needs --ca (it measures TLS handshakes)".into());
    }
    let mut net = Net::new(c.addr).map_err(|e| e.to_string())?;
    let request = format!(
        "GET /healthz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        c.host
    );
    let mut started = Vec::with_capacity(connections);
    for _ in 0..connections {
        let index = net.open().map_err(|e| format!("connect: {e}"))?;
        net.conns[index].send(request.as_bytes());
        started.push(Instant::now());
    }
    let mut hist = Histogram::new();
    let mut errors = Errors::default();
    let mut ready = Vec::new();
    let mut suite = None;
    let warm_end = Instant::now() + c.warmup;
    let mut window: Option<(Instant, CpuWindow)> = None;
    let mut done = 0u64;
    loop {
        let now = Instant::now();
        if window.is_none() && now >= warm_end {
            window = Some((now, CpuWindow::start(c.server_pid.as_deref())));
        }
        if let Some((start, _)) = &window
            && now >= *start + c.duration
        {
            break;
        }
        net.wait(Duration::from_millis(20), &mut ready)
            .map_err(|e| e.to_string())?;
        for &index in &ready {
            let conn = &mut net.conns[index];
            let answered = match net::parse_response(&conn.inbuf) {
                Ok(Some((resp, _))) if resp.status == 200 => true,
                Ok(Some((resp, _))) => {
                    errors.add(format!("GET /healthz answered {}", resp.status));
                    true
                }
                Ok(None) => false,
                Err(e) => {
                    errors.add(e);
                    true
                }
            };
            if !answered {
                if let Some(why) = conn.closed.take() {
                    errors.add(format!("before the answer: {why}"));
                } else {
                    continue;
                }
            }
            if suite.is_none() {
                suite = conn.tls_suite();
            }
            if window.is_some() {
                hist.record(started[index].elapsed());
                done += 1;
            }
            net.reopen(index).map_err(|e| format!("connect: {e}"))?;
            net.conns[index].send(request.as_bytes());
            started[index] = Instant::now();
        }
        if errors.count > 100 {
            return Err(errors.summary());
        }
    }
    let Some((start, cpu)) = window else {
        return Err("no measuring window".into());
    };
    let used = cpu.stop();
    let secs = start.elapsed().as_secs_f64();
    let mut line = ResultLine::new(&c.figure, &c.name);
    line.num("connections", connections as f64)
        .window(secs, done as f64, &hist, &used)
        .num("errors", errors.count as f64);
    line.print();
    errors.report();
    if let Some(suite) = suite {
        eprintln!("negotiated {suite}");
    }
    net.close_all();
    Ok(())
}
