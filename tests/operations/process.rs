//! Process-level behaviour of the real binary: graceful shutdown on SIGTERM
//! and SIGINT, surviving a burst of malformed traffic, and the command line
//! (`--help`, `--version`, invalid settings, flags over environment,
//! `RELAY_PORT=0`).

use crate::common::*;
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_relay");

/// A bare `relay` process for the command-line tests, killed on drop. The
/// environment is cleared so a developer's `RELAY_*` cannot leak in.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
}

impl Proc {
    fn spawn(env: &[(&str, &str)], args: &[&str]) -> Proc {
        let mut cmd = Command::new(BIN);
        cmd.env_clear().env("RELAY_HOST", "127.0.0.1");
        cmd.envs(env.iter().copied()).args(args);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn relay");
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines,
            stderr: Vec::new(),
        }
    }

    /// Waits (10 s at most) for the process to end; returns its status,
    /// stdout and stderr.
    #[track_caller]
    fn finish(mut self) -> (ExitStatus, String, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "relay kept running; stderr: {:?}",
                self.stderr
            );
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(20)) {
                self.stderr.push(line);
            }
        };
        let mut stdout = String::new();
        std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
        // The reader thread ends at EOF, which follows the exit.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.stderr.push(line);
        }
        (status, stdout, self.stderr.join("\n"))
    }

    /// The address in the first stderr line that announces listening.
    #[track_caller]
    fn listening_addr(&mut self) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no listening line: {:?}", self.stderr));
            self.stderr.push(line.clone());
            if line.to_ascii_lowercase().contains("listening") {
                let at = line
                    .find("127.0.0.1:")
                    .unwrap_or_else(|| panic!("no address in {line:?}"));
                let port: String = line[at + 10..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                return format!("127.0.0.1:{port}").parse().expect("address");
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /healthz` on a fresh connection; the status code.
#[track_caller]
fn healthz_status(addr: SocketAddr) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut head = String::new();
    BufReader::new(s).read_line(&mut head).expect("status line");
    head.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {head:?}"))
}

#[track_caller]
fn shuts_down_gracefully(signal: fn(&Server)) {
    // One relay: the signal goes to it alone.
    let mut srv = Server::start_single();
    let addr = srv.addr();
    assert_eq!(srv.get("/readyz").status, 200);
    let sid = unique_session();
    assert_eq!(srv.put(&format!("/sessions/{sid}")).status, 200);
    let mut poll = srv.conn();
    poll.send("GET", &format!("/prompts/{sid}?timeout=60"), &[], None);
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("parked_polls", 1);
    srv.wait_health("subscribers", 1);
    signal(&srv);
    let r = poll.read_response();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!([]),
        "a parked poll is answered with an empty list"
    );
    assert_eq!(ws.expect_close(), 1001);
    let status = srv
        .wait_exit(Duration::from_secs(5))
        .expect("still running 5 s after the signal");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        srv.logs().iter().any(|l| l.contains("shutting down")),
        "no shutdown log"
    );
    assert!(
        TcpStream::connect(addr).is_err(),
        "the listener still accepts"
    );
}

#[test]
fn sigterm_answers_polls_closes_subscribers_1001_and_exits_0() {
    shuts_down_gracefully(Server::sigterm);
}

#[test]
fn sigint_answers_polls_closes_subscribers_1001_and_exits_0() {
    shuts_down_gracefully(Server::sigint);
}

/// Small deterministic generator for junk bytes.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn junk(seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let len = 1 + (xorshift(&mut s) % 4000) as usize;
    (0..len).map(|_| xorshift(&mut s) as u8).collect()
}

/// The payloads of the burst: malformed, partial and abusive requests.
fn garbage(i: u64) -> Vec<u8> {
    let upgrade = "GET /ws/burst HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                   Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    match i % 10 {
        0 => junk(i),
        1 => b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Half: ".to_vec(),
        2 => format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(40_000)).into_bytes(),
        3 => b"POST /prompt HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
        4 => b"POST /prompt HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n".to_vec(),
        5 => [upgrade.as_bytes(), &junk(i)].concat(),
        // an unmasked client frame claiming a 2^63-byte payload
        6 => [upgrade.as_bytes(), &[0x81, 0x7f, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]].concat(),
        7 => b"POST /response HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n{\"a\":".to_vec(),
        8 => "GET /prompts/\u{1F600}?timeout=NaN&after=-1 HTTP/1.1\r\n\r\n".as_bytes().to_vec(),
        _ => [b"GET /healthz HTTP/1.1\r\n\r\n".repeat(50).as_slice(), &junk(i)].concat(),
    }
}

#[test]
fn burst_of_garbage_from_many_connections_does_not_stop_the_server() {
    let mut srv = Server::start_with(&[("RELAY_REQUEST_TIMEOUT", "1")]);
    let addr = srv.addr();
    let workers: Vec<_> = (0..8u64)
        .map(|w| {
            std::thread::spawn(move || {
                for i in (w * 25)..(w * 25 + 25) {
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
                    let _ = s.write_all(&garbage(i));
                    // Sometimes read a little, sometimes hang up at once.
                    if i % 3 == 0 {
                        let _ = std::io::Read::read(&mut s, &mut [0u8; 512]);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    assert!(srv.wait_exit(Duration::ZERO).is_none(), "the server exited");
    assert_eq!(srv.get("/healthz").status, 200);
    let sid = unique_session();
    let r = srv.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "still fine?", "client_msg_id": "ok"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = srv.get(&format!("/prompts/{sid}?wait=false"));
    assert_eq!(r.json()[0]["prompt"], "still fine?");
}

#[test]
fn help_prints_usage_and_exits_0() {
    for flag in ["--help", "-h"] {
        let (status, stdout, stderr) = Proc::spawn(&[], &[flag]).finish();
        assert!(status.success(), "{flag}: {status:?} {stderr}");
        assert!(
            stdout.contains("--port") && stdout.contains("RELAY_PORT"),
            "{flag}: {stdout}"
        );
        assert!(stdout.contains("--ping-interval"), "{stdout}");
    }
}

#[test]
fn version_prints_the_version_and_exits_0() {
    for flag in ["--version", "-V"] {
        let (status, stdout, stderr) = Proc::spawn(&[], &[flag]).finish();
        assert!(status.success(), "{flag}: {status:?} {stderr}");
        assert!(
            stdout.contains(env!("CARGO_PKG_VERSION")),
            "{flag}: {stdout}"
        );
    }
}

#[test]
fn invalid_setting_exits_nonzero_naming_the_setting() {
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a str);
    let cases: [Case; 5] = [
        (&[("RELAY_PORT", "abc")], &[], "RELAY_PORT"),
        (
            &[("RELAY_PORT", "0"), ("RELAY_PING_INTERVAL", "-1")],
            &[],
            "RELAY_PING_INTERVAL",
        ),
        (&[("RELAY_PORT", "0")], &["--max-body=x"], "max-body"),
        (&[("RELAY_PORT", "0")], &["--max-body", "x"], "max-body"),
        (
            &[("RELAY_PORT", "0")],
            &["--no-such-flag"],
            "--no-such-flag",
        ),
    ];
    for (env, args, named) in cases {
        let (status, _, stderr) = Proc::spawn(env, args).finish();
        assert!(!status.success(), "{env:?} {args:?} was accepted");
        let lower = stderr.to_ascii_lowercase();
        assert!(
            lower.contains(&named.to_ascii_lowercase()),
            "{env:?} {args:?}: stderr does not name {named}: {stderr}"
        );
    }
}

#[test]
fn port_flag_wins_over_the_environment() {
    // The port named in the environment is taken: only the flag lets it start.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let env_port = taken.local_addr().unwrap().port().to_string();
    let mut proc = Proc::spawn(
        &[("RELAY_PORT", &env_port), ("RELAY_LOG_FORMAT", "json")],
        &["--port", "0"],
    );
    let addr = proc.listening_addr();
    assert_ne!(addr.port(), taken.local_addr().unwrap().port());
    assert_eq!(healthz_status(addr), 200);
}

#[test]
fn port_zero_logs_the_real_port_in_both_log_formats() {
    for format in ["text", "json"] {
        let mut proc = Proc::spawn(&[("RELAY_PORT", "0"), ("RELAY_LOG_FORMAT", format)], &[]);
        let addr = proc.listening_addr();
        assert_ne!(addr.port(), 0, "{format}");
        assert_eq!(
            healthz_status(addr),
            200,
            "{format}: the logged port serves"
        );
    }
}
