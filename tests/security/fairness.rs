//! Fair and bounded under hostile clients: each attack runs against the real
//! binary while a well-behaved client completes full round trips (prompt,
//! long-poll, answer, WebSocket frame); the round trips must complete, and
//! their slowest time is printed (a figure for the README, not an
//! assertion: this machine is shared and noisy). Also the timeouts per
//! request and per idle socket, hang-ups of parked polls, and the memory a
//! connection can hold with answers it never reads.

use crate::common::*;
use serde_json::json;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    s
}

/// A raw WebSocket client past its 101.
fn raw_ws(addr: SocketAddr, sid: &str) -> TcpStream {
    let mut s = raw(addr);
    raw_upgrade(&mut s, &format!("/ws/{sid}"));
    s
}

/// Writes `chunk` again and again until `stop` or the server stops taking
/// bytes; returns how many bytes went out.
fn flood(mut s: TcpStream, chunk: Vec<u8>, stop: Arc<AtomicBool>) -> usize {
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break, // closed by the server, or stalled for 2 s
        }
    }
    sent
}

#[test]
fn endless_continuation_frames_neither_starve_others_nor_last() {
    if skip_with_tls("plain sockets written and read byte by byte; TLS under abuse is tests/tls") {
        return;
    }
    let srv = Server::start();
    let mut good = Good::new(&srv);
    good.round_trip();
    let stop = Arc::new(AtomicBool::new(false));
    // A text frame with fin=0 and one masked byte, then empty masked
    // continuation frames (6 bytes each) for ever.
    let first = [0x01, 0x81, 1, 2, 3, 4, b'x' ^ 1];
    let cont: Vec<u8> = [0x00u8, 0x80, 0, 0, 0, 0].repeat(10_000);
    let attackers: Vec<_> = (0..2)
        .map(|_| {
            let mut s = raw_ws(srv.addr(), &unique_session());
            s.write_all(&first).unwrap();
            let (stop, cont) = (stop.clone(), cont.clone());
            std::thread::spawn(move || flood(s, cont, stop))
        })
        .collect();
    good.keep_going(Duration::from_secs(2), 10);
    // The wire cap per message closes them while they still flood: only
    // the good subscriber is left.
    srv.wait_health("subscribers", 1);
    stop.store(true, Ordering::Relaxed);
    let sent: Vec<usize> = attackers.into_iter().map(|a| a.join().unwrap()).collect();
    eprintln!(
        "continuation floods ({sent:?} bytes): {} round trips, slowest {:?}",
        good.rounds, good.slowest
    );
}

#[test]
fn endless_chunk_extensions_neither_starve_others_nor_last() {
    if skip_with_tls("plain sockets written and read byte by byte; TLS under abuse is tests/tls") {
        return;
    }
    let srv = Server::start_with(&[("RELAY_REQUEST_TIMEOUT", "2")]);
    let mut good = Good::new(&srv);
    good.round_trip();
    let stop = Arc::new(AtomicBool::new(false));
    let chunk = format!("1;{}\r\nx\r\n", "e".repeat(200))
        .repeat(1000)
        .into_bytes();
    let attackers: Vec<_> = (0..3)
        .map(|_| {
            let mut s = raw(srv.addr());
            s.write_all(b"POST /prompt HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap();
            let reader = s.try_clone().unwrap();
            let (stop, chunk) = (stop.clone(), chunk.clone());
            (std::thread::spawn(move || flood(s, chunk, stop)), reader)
        })
        .collect();
    good.keep_going(Duration::from_secs(2), 10);
    stop.store(true, Ordering::Relaxed);
    for (i, (t, mut reader)) in attackers.into_iter().enumerate() {
        let sent = t.join().unwrap();
        let mut got = Vec::new();
        let _ = reader.read_to_end(&mut got);
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 413") || text.starts_with("HTTP/1.1 408"),
            "attacker {i} after {sent} bytes: {text}"
        );
    }
    eprintln!(
        "chunk-extension floods: {} round trips, slowest {:?}",
        good.rounds, good.slowest
    );
}

#[test]
fn a_pipelining_client_is_timed_per_request_not_as_a_whole() {
    if skip_with_tls("plain sockets written and read byte by byte; TLS under abuse is tests/tls") {
        return;
    }
    let srv = Server::start_with(&[("RELAY_REQUEST_TIMEOUT", "1")]);
    let mut s = raw(srv.addr());
    let reader = s.try_clone().unwrap();
    let counter = std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(reader);
        let mut statuses = Vec::new();
        let mut line = String::new();
        let mut body = 0usize;
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return statuses;
            }
            if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
                statuses.push(rest[..3].to_string());
            } else if let Some(n) = line.to_ascii_lowercase().strip_prefix("content-length: ") {
                body = n.trim().parse().unwrap();
            } else if line == "\r\n" {
                let mut skip = vec![0u8; body];
                r.read_exact(&mut skip).unwrap();
                if statuses.last().is_some_and(|s| s != "200") {
                    return statuses;
                }
            }
        }
    });
    // Whole requests back to back for 2.5 s, more than twice the request
    // timeout: the buffer is rarely empty at the end of a turn, but every
    // request arrives within milliseconds.
    let req = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n".repeat(50);
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        s.write_all(&req).unwrap();
    }
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let statuses = counter.join().unwrap();
    assert!(statuses.len() > 100, "{} answers", statuses.len());
    assert!(
        statuses.iter().all(|s| s == "200"),
        "a non-200 after {} answers: {:?}",
        statuses.len(),
        statuses.iter().find(|s| *s != "200")
    );
}

#[test]
fn a_socket_that_never_sends_a_byte_is_closed_at_the_request_timeout() {
    if skip_with_tls("plain sockets written and read byte by byte; TLS under abuse is tests/tls") {
        return;
    }
    let srv = Server::start_with(&[
        ("RELAY_REQUEST_TIMEOUT", "0.5"),
        ("RELAY_KEEPALIVE_TIMEOUT", "60"),
    ]);
    let mut idle = raw(srv.addr());
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = idle.read(&mut buf).expect("closed, not timed out");
    assert_eq!(n, 0, "closed quietly, no answer");
    eprintln!("idle socket closed after {:?}", t.elapsed());
    // One that was answered is kept for the keep-alive timeout instead.
    let mut kept = srv.conn();
    assert_eq!(kept.request("GET", "/healthz", &[], None).status, 200);
    let mut other = raw(srv.addr());
    assert_eq!(
        other.read(&mut buf).unwrap(),
        0,
        "the next idle one closes too"
    );
    assert_eq!(
        kept.request("GET", "/healthz", &[], None).status,
        200,
        "still open well past the request timeout"
    );
}

#[test]
fn hung_up_parked_polls_with_full_buffers_free_their_waiters() {
    if skip_with_tls("plain sockets written and read byte by byte; TLS under abuse is tests/tls") {
        return;
    }
    // One relay: the cap counts its own parked polls.
    let srv = Server::start_single_with(&[("RELAY_MAX_WAITERS", "3")]);
    let sid = unique_session();
    srv.put(&format!("/sessions/{sid}"));
    let polls: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = raw(srv.addr());
            let head = format!("GET /prompts/{sid}?timeout=300 HTTP/1.1\r\nHost: t\r\n\r\n");
            s.write_all(head.as_bytes()).unwrap();
            s
        })
        .collect();
    srv.wait_health("parked_polls", 3);
    for mut s in polls {
        // 20 KB of an unfinished request behind the parked one: more than
        // the reader takes while parked, so the rest stays in the kernel.
        let mut pad = b"POST /prompt HTTP/1.1\r\nHost: t\r\nX-Pad: ".to_vec();
        pad.resize(20_000, b'p');
        s.write_all(&pad).unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s); // a reset
    }
    srv.wait_health("parked_polls", 0);
    let mut agent = srv.conn();
    agent.send("GET", &format!("/prompts/{sid}?timeout=5"), &[], None);
    srv.wait_health("parked_polls", 1);
    srv.prompt(&sid, "after the hang-ups", None);
    assert_eq!(agent.read_response().status, 200);
}

/// A client that asks and never reads: `GET /prompts?wait=false`,
/// `/messages` and a WebSocket replay from `after=0`, pipelined, with a
/// small receive buffer so the server's own queue is what fills.
fn greedy(addr: SocketAddr, sid: &str) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&addr.into()).unwrap();
    let mut s: TcpStream = sock.into();
    let mut reqs = String::new();
    for _ in 0..10 {
        reqs.push_str(&format!(
            "GET /prompts/{sid}?wait=false HTTP/1.1\r\nHost: t\r\n\r\n"
        ));
        reqs.push_str(&format!(
            "GET /messages/{sid}?limit=1000 HTTP/1.1\r\nHost: t\r\n\r\n"
        ));
    }
    s.write_all(reqs.as_bytes()).unwrap();
    s
}

#[test]
fn twenty_connections_that_never_read_hold_bounded_memory() {
    if skip_with_tls("plain sockets written and read byte by byte; TLS under abuse is tests/tls") {
        return;
    }
    const PROMPTS: usize = 200;
    const TEXT: usize = 120 * 1024;
    // One relay: every connection on the process whose memory is measured.
    let srv = Server::start_single_with(&[("RELAY_MAX_PENDING", "1000"), ("RELAY_LOG", "info")]);
    let sid = unique_session();
    let mut c = srv.conn();
    let text = "p".repeat(TEXT);
    for i in 0..PROMPTS {
        let p = json!({"session_id": sid, "prompt": text, "client_msg_id": format!("p{i}")});
        assert_eq!(c.post_json("/prompt", &p).status, 200);
    }
    let warm = srv.rss_kib();
    let greedy: Vec<TcpStream> = (0..20).map(|_| greedy(srv.addr(), &sid)).collect();
    let replays: Vec<TcpStream> = (0..20)
        .map(|_| {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            sock.connect(&srv.addr().into()).unwrap();
            let mut s: TcpStream = sock.into();
            s.write_all(ws_upgrade_request(&format!("/ws/{sid}?after=0")).as_bytes())
                .unwrap();
            s
        })
        .collect();
    // Everything asked is answered or queued once the server is idle again.
    let mut probe = srv.conn();
    let mut peak = 0;
    for _ in 0..50 {
        assert_eq!(probe.request("GET", "/healthz", &[], None).status, 200);
        peak = peak.max(srv.rss_kib());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Per connection: one /prompts answer is shared by all (4 MiB), one
    // /messages page (4 MiB) plus the 256 KiB of queued answers after which
    // its pipelined requests wait; per subscriber its 1 MiB buffer.
    let mib = 1024;
    let bound = 4 * mib + 20 * (4 * mib + 256) + 20 * mib;
    eprintln!("RSS {warm} -> {peak} KiB with 40 connections that never read (bound +{bound} KiB)");
    assert!(
        peak <= warm + bound + bound / 2,
        "RSS {peak} KiB, warm {warm}, bound +{bound}"
    );
    drop(greedy);
    drop(replays);
}
