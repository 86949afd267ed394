//! Test harness shared by every integration test: starts the real `relay` binary on an
//! ephemeral loopback port, and talks to it with a small raw HTTP/1.1 client and a blocking
//! tungstenite WebSocket client.
//!
//! Readiness is observed, never slept for: `start` returns once the server's JSON log on
//! stderr announces `"event":"listening"` with its address. Every socket has a 10 s read
//! timeout so a missing reply fails the test instead of hanging it.
//!
//! Two modes run the whole suite again: `TEST_WITH_DATA_DIR=1` gives every server a fresh
//! data directory; `TEST_WITH_REDIS=redis://HOST:PORT` makes every `Server` two relays on
//! that Redis (a key prefix of their own), and every connection the test opens goes to the
//! next of the two in turn (`addr()`, `conn()`, `ws()`, `get()`, ...), so each flow crosses
//! instances; `logs()` and `wait_for_log` read both. Signals, the pid and `/proc` figures are
//! the first relay's. A test of what one process owns by nature (its counters, caps, logs,
//! signals) starts one relay on that Redis (`Server::start_single_with`); one that cannot
//! run there at all returns early with `skip_with_redis("why")`. `TEST_WITH_TLS=1` gives
//! every server a test certificate and makes the harness's clients speak TLS (`tls.rs`);
//! a test that reads the raw socket returns early there with `skip_with_tls("why")`.
#![allow(dead_code)]

mod dir;
mod good;
mod http;
mod redis;
mod tls;
mod ws;

#[allow(unused_imports)] // used by the tests that keep a data directory
pub use dir::Dir;
#[allow(unused_imports)] // only the tests of clients under abuse use it
pub use good::Good;
pub use http::{Http, Response};
#[allow(unused_imports)] // used by the tests that start a Redis of their own
pub use redis::{Redis, free_port, subscribed_on_each};
#[allow(unused_imports)] // used by the tests that speak to the socket themselves
pub use tls::{Stream, files as tls_files, openssl, skip_with_tls, tls_mode};
pub use ws::Ws;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tungstenite::client::IntoClientRequest;
use tungstenite::http::HeaderValue;

/// How long any single socket read may block before the test fails.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `start`, `wait_for_log` and `wait_health` wait.
const LOG_TIMEOUT: Duration = Duration::from_secs(10);

/// Log lines collected from the server's stderr, with a condvar signalled on every new line
/// (or on EOF) so waiters wake without polling.
#[derive(Default)]
struct LogState {
    lines: Vec<String>,
    eof: bool,
}

type SharedLog = Arc<(Mutex<LogState>, Condvar)>;

/// A running `relay` process; killed (SIGKILL) on drop unless it already exited.
pub struct Server {
    child: Child,
    addr: SocketAddr,
    log: SharedLog,
    exited: Option<ExitStatus>,
    /// A data directory the harness made (see `TEST_WITH_DATA_DIR`),
    /// removed when the server is dropped.
    own_data_dir: Option<std::path::PathBuf>,
    /// The second relay on the same Redis (see `TEST_WITH_REDIS`).
    twin: Option<Box<Server>>,
    /// Connections opened so far: which of the two the next one goes to.
    turn: AtomicUsize,
}

impl Server {
    /// Starts the server with default settings.
    #[track_caller]
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Starts the server with extra `RELAY_*` environment variables (they override the
    /// harness defaults).
    #[track_caller]
    pub fn start_with(env: &[(&str, &str)]) -> Server {
        Server::start_via(&[], env)
    }

    /// Starts the server through a wrapper command (`wrapper` then the
    /// binary's path as its last argument), e.g. `prlimit` or a shell that
    /// sets a signal disposition before `exec`.
    #[track_caller]
    pub fn start_via(wrapper: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_relays(wrapper, env, 2)
    }

    /// `start`, but one relay whatever the mode (see `start_single_with`).
    #[track_caller]
    pub fn start_single() -> Server {
        Server::start_single_with(&[])
    }

    /// `start_with`, but one relay whatever the mode (with `TEST_WITH_REDIS`
    /// still on that Redis): for a test of what one process owns by nature,
    /// its counters, caps, signals and logs.
    #[track_caller]
    pub fn start_single_with(env: &[(&str, &str)]) -> Server {
        Server::start_relays(&[], env, 1)
    }

    /// `start_via`, one relay whatever the mode (see `start_single_with`).
    #[track_caller]
    pub fn start_single_via(wrapper: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_relays(wrapper, env, 1)
    }

    /// Starts `relays` (1 or 2) relays on the Redis of `TEST_WITH_REDIS`
    /// with a key prefix of their own, unless the mode is off or the test
    /// brings its own storage: then one relay as `env` says.
    #[track_caller]
    fn start_relays(wrapper: &[&str], env: &[(&str, &str)], relays: usize) -> Server {
        let Some(url) = std::env::var("TEST_WITH_REDIS").ok().filter(|_| {
            !env.iter()
                .any(|(k, _)| matches!(*k, "RELAY_REDIS_URL" | "RELAY_DATA_DIR"))
        }) else {
            return Server::spawn(wrapper, env);
        };
        let n = SESSION_COUNTER.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("t{}-{n}:", std::process::id());
        let mut shared: Vec<(&str, &str)> = env.to_vec();
        shared.push(("RELAY_REDIS_URL", &url));
        shared.push(("RELAY_REDIS_PREFIX", &prefix));
        let mut first = Server::spawn(wrapper, &shared);
        if relays > 1 {
            first.twin = Some(Box::new(Server::spawn(wrapper, &shared)));
        }
        // Both reached Redis before the test's first request: `listening`
        // comes before the link is up, `connected to Redis` once it is (a
        // log line rather than `/readyz`, which would show in the request
        // log, the metrics and the rate limits).
        for srv in std::iter::once(&first).chain(first.twin.as_deref()) {
            if srv
                .find_log_line(|l| l.contains("connected to Redis"), LOG_TIMEOUT)
                .is_none()
            {
                panic!(
                    "relay never reached {url}; stderr:\n{}",
                    srv.logs().join("\n")
                );
            }
        }
        first
    }

    /// This relay alone from now on (the second one, if any, is killed): for
    /// a test whose server comes from a helper shared with tests that
    /// alternate (see `start_single_with`).
    pub fn single(mut self) -> Server {
        self.twin = None;
        self
    }

    #[track_caller]
    fn spawn(wrapper: &[&str], env: &[(&str, &str)]) -> Server {
        let bin = env!("CARGO_BIN_EXE_relay");
        let mut cmd = match wrapper.split_first() {
            None => Command::new(bin),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
        };
        for (key, _) in std::env::vars() {
            if key.starts_with("RELAY_") || key == "PORT" {
                cmd.env_remove(key);
            }
        }
        cmd.env("RELAY_PORT", "0")
            .env("RELAY_HOST", "127.0.0.1")
            .env("RELAY_LOG_FORMAT", "json")
            .env("RELAY_LOG", "debug");
        for (k, v) in env {
            cmd.env(k, v);
        }
        // `TEST_WITH_TLS=1 cargo test`: every server speaks TLS.
        if tls::tls_mode() && !env.iter().any(|(k, _)| k.starts_with("RELAY_TLS_")) {
            let files = tls::files();
            cmd.env("RELAY_TLS_CERT", &files.cert)
                .env("RELAY_TLS_KEY", &files.key);
        }
        // `TEST_WITH_DATA_DIR=1 cargo test` runs every test once more with
        // persistence: each server gets a fresh data directory.
        let own_data_dir = (std::env::var_os("TEST_WITH_DATA_DIR").is_some()
            && !env
                .iter()
                .any(|(k, _)| matches!(*k, "RELAY_DATA_DIR" | "RELAY_REDIS_URL")))
        .then(|| {
            let n = SESSION_COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("relay-test-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            cmd.env("RELAY_DATA_DIR", &dir);
            dir
        });
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn relay binary");
        let stderr = child.stderr.take().expect("piped stderr");
        let log: SharedLog = Arc::new((Mutex::new(LogState::default()), Condvar::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let reader = BufReader::new(stderr);
            for line in reader.lines() {
                let Ok(line) = line else { break };
                let (lock, cvar) = &*sink;
                lock.lock().unwrap().lines.push(line);
                cvar.notify_all();
            }
            let (lock, cvar) = &*sink;
            lock.lock().unwrap().eof = true;
            cvar.notify_all();
        });
        let mut server = Server {
            child,
            addr: "127.0.0.1:0".parse().unwrap(),
            log,
            exited: None,
            own_data_dir,
            twin: None,
            turn: AtomicUsize::new(0),
        };
        let line = match server.find_log_line(is_listening_line, LOG_TIMEOUT) {
            Some(line) => line,
            None => {
                let status = server.wait_exit(Duration::from_millis(200));
                panic!(
                    "relay did not log a listening line within {LOG_TIMEOUT:?} (exit: {status:?}); stderr:\n{}",
                    server.logs().join("\n")
                );
            }
        };
        let v: Value = serde_json::from_str(&line).expect("listening line is JSON");
        let addr = v["addr"]
            .as_str()
            .unwrap_or_else(|| panic!("listening line has no addr: {line}"));
        server.addr = addr
            .parse()
            .unwrap_or_else(|e| panic!("bad listening addr {addr:?}: {e}"));
        server
    }

    /// The address of the relay the next connection goes to (with
    /// `TEST_WITH_REDIS`, each call the other of the two).
    pub fn addr(&self) -> SocketAddr {
        match &self.twin {
            Some(twin) if self.turn.fetch_add(1, Ordering::Relaxed) % 2 == 1 => twin.addr,
            _ => self.addr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every stderr line seen so far.
    pub fn logs(&self) -> Vec<String> {
        let mut lines = self.log.0.lock().unwrap().lines.clone();
        if let Some(twin) = &self.twin {
            lines.extend(twin.logs());
        }
        lines
    }

    /// Blocks (max 10 s) until a log line contains `needle`; returns that line.
    #[track_caller]
    pub fn wait_for_log(&self, needle: &str) -> String {
        match self.find_log_line(|l| l.contains(needle), LOG_TIMEOUT) {
            Some(line) => line,
            None => panic!(
                "no log line containing {needle:?} within {LOG_TIMEOUT:?}; stderr:\n{}",
                self.logs().join("\n")
            ),
        }
    }

    fn find_log_line(&self, pred: impl Fn(&str) -> bool, max: Duration) -> Option<String> {
        let deadline = Instant::now() + max;
        let (lock, cvar) = &*self.log;
        let mut state = lock.lock().unwrap();
        loop {
            if let Some(line) = state.lines.iter().find(|l| pred(l)) {
                return Some(line.clone());
            }
            if let Some(twin) = &self.twin
                && let Some(line) = twin.log.0.lock().unwrap().lines.iter().find(|l| pred(l))
            {
                return Some(line.clone());
            }
            let now = Instant::now();
            if (state.eof && self.twin.is_none()) || now >= deadline {
                return None;
            }
            // With a twin, its lines are looked at again every 10 ms.
            let wait = match self.twin {
                Some(_) => (deadline - now).min(Duration::from_millis(10)),
                None => deadline - now,
            };
            state = cvar.wait_timeout(state, wait).unwrap().0;
        }
    }

    /// Kills the process (SIGKILL) and waits for it: a crash.
    pub fn kill9(&mut self) {
        self.signal("KILL");
        self.wait_exit(LOG_TIMEOUT);
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// Sends SIGINT.
    pub fn sigint(&self) {
        self.signal("INT");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }

    /// Waits up to `max` for the process to exit; `None` if it is still running.
    pub fn wait_exit(&mut self, max: Duration) -> Option<ExitStatus> {
        if self.exited.is_some() {
            return self.exited;
        }
        let deadline = Instant::now() + max;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                self.exited = Some(status);
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's CPU time so far (user + system), in clock ticks
    /// (1/100 s on Linux).
    #[track_caller]
    pub fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .expect("read /proc/PID/stat");
        // Fields after the command name (which may hold spaces): utime is
        // the 14th field of the line, stime the 15th.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).expect("stat line");
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = fields[11].parse().expect("utime");
        let stime: u64 = fields[12].parse().expect("stime");
        utime + stime
    }

    /// The server's resident memory in KiB (VmRSS).
    #[track_caller]
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// One request on a fresh connection; reads exactly one (final) response.
    #[track_caller]
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Response {
        self.conn().request(method, path, headers, body)
    }

    #[track_caller]
    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[], None)
    }

    /// POST with `Content-Type: application/json`.
    #[track_caller]
    pub fn post_json(&self, path: &str, body: &Value) -> Response {
        self.conn().post_json(path, body)
    }

    #[track_caller]
    pub fn put(&self, path: &str) -> Response {
        self.request("PUT", path, &[], None)
    }

    #[track_caller]
    pub fn delete(&self, path: &str) -> Response {
        self.request("DELETE", path, &[], None)
    }

    /// A raw keep-alive connection.
    #[track_caller]
    pub fn conn(&self) -> Http {
        Http::connect(self.addr())
    }

    /// A raw WebSocket upgrade request for `path` (a fresh key); its
    /// answer (101, or a refusal with its whole body). `extra` headers
    /// override the standard ones, and empty ones remove them.
    #[track_caller]
    pub fn upgrade(&self, path: &str, extra: &[(&str, &str)]) -> Response {
        let key = tungstenite::handshake::client::generate_key();
        let mut headers = vec![
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", key.as_str()),
        ];
        headers.retain(|(k, _)| !extra.iter().any(|(e, _)| e.eq_ignore_ascii_case(k)));
        headers.extend_from_slice(extra);
        headers.retain(|(_, v)| !v.is_empty());
        let mut http = self.conn();
        http.send("GET", path, &headers, None);
        http.read_response()
    }

    /// A WebSocket client; panics if the upgrade does not succeed.
    #[track_caller]
    pub fn ws(&self, path: &str) -> Ws {
        match self.ws_with(path, &[]) {
            Ok(ws) => ws,
            Err(resp) => panic!(
                "WebSocket upgrade to {path} failed: {} {}",
                resp.status,
                resp.text()
            ),
        }
    }

    /// A WebSocket client whose socket receive buffer is `rcvbuf` bytes, set
    /// before connecting: the kernel then holds little for it, so a client
    /// that stops reading makes the server's own queue fill up.
    #[track_caller]
    pub fn ws_small_window(&self, path: &str, rcvbuf: usize) -> Ws {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        sock.set_recv_buffer_size(rcvbuf).expect("SO_RCVBUF");
        sock.connect(&self.addr().into()).expect("connect to relay");
        match self.ws_over(sock.into(), path, &[]) {
            Ok(ws) => ws,
            Err(resp) => panic!("WebSocket upgrade to {path} failed: {}", resp.status),
        }
    }

    /// A WebSocket client with extra request headers; `Err` carries a non-101 answer.
    #[track_caller]
    pub fn ws_with(&self, path: &str, headers: &[(&str, &str)]) -> Result<Ws, Response> {
        let addr = self.addr();
        let stream = TcpStream::connect(addr).expect("connect to relay");
        self.ws_over(stream, path, headers)
    }

    #[track_caller]
    fn ws_over(
        &self,
        stream: TcpStream,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Ws, Response> {
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        let addr = stream.peer_addr().expect("peer address");
        let stream = Stream::over(stream);
        let mut req = format!("ws://{}{}", addr, path)
            .into_client_request()
            .expect("valid ws request");
        for (name, value) in headers {
            let name: tungstenite::http::HeaderName = name.parse().expect("header name");
            req.headers_mut()
                .insert(name, HeaderValue::from_str(value).expect("header value"));
        }
        match tungstenite::client(req, stream) {
            Ok((socket, _)) => Ok(Ws { socket }),
            Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
                let headers = resp
                    .headers()
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_string(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect();
                Err(Response {
                    status: resp.status().as_u16(),
                    headers,
                    body: resp.body().clone().unwrap_or_default(),
                })
            }
            Err(e) => panic!("WebSocket handshake to {path} failed: {e}"),
        }
    }

    // ---- extra helpers (not in notes/harness.md) used by api*.rs, long_poll.rs, flows.rs ----

    /// `GET /healthz` parsed, asserting 200. With two relays (`TEST_WITH_REDIS`):
    /// the first one's body, with `subscribers` and `parked_polls` summed over
    /// both, so that "every subscriber is registered" reads the same whichever
    /// relay each one reached; the other counters stay the first relay's own.
    #[track_caller]
    pub fn health(&self) -> Value {
        let Some(twin) = &self.twin else {
            return health_at(self.addr);
        };
        let mut h = health_at(self.addr);
        let other = health_at(twin.addr);
        for field in ["subscribers", "parked_polls"] {
            let sum = h[field].as_u64().unwrap_or(0) + other[field].as_u64().unwrap_or(0);
            h[field] = Value::from(sum);
        }
        h
    }

    /// A sample of the `/metrics` exposition, by its exact name.
    #[track_caller]
    pub fn metric(&self, name: &str) -> u64 {
        let text = self.get("/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
            .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
    }

    /// Polls `/healthz` (bounded, 10 s) until `field` equals `want`: a readiness check, not a
    /// sleep. Returns the last body.
    #[track_caller]
    pub fn wait_health(&self, field: &str, want: u64) -> Value {
        let deadline = Instant::now() + LOG_TIMEOUT;
        loop {
            let h = self.health();
            if h[field].as_u64() == Some(want) {
                return h;
            }
            if Instant::now() >= deadline {
                panic!("/healthz {field} never became {want}; last: {h}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `POST /prompt` asserting 200; returns the ack body.
    #[track_caller]
    pub fn prompt(&self, sid: &str, text: &str, client_msg_id: Option<&str>) -> Value {
        let mut body = serde_json::json!({ "session_id": sid, "prompt": text });
        if let Some(id) = client_msg_id {
            body["client_msg_id"] = Value::from(id);
        }
        let resp = self.post_json("/prompt", &body);
        assert_eq!(resp.status, 200, "POST /prompt: {}", resp.text());
        resp.json()
    }

    /// `POST /response` asserting 200; returns the ack body.
    #[track_caller]
    pub fn respond(&self, sid: &str, client_msg_id: &str, text: &str) -> Value {
        let body =
            serde_json::json!({ "session_id": sid, "client_msg_id": client_msg_id, "text": text });
        let resp = self.post_json("/response", &body);
        assert_eq!(resp.status, 200, "POST /response: {}", resp.text());
        resp.json()
    }

    /// Starts a long-poll on a fresh connection without reading the answer.
    #[track_caller]
    pub fn start_poll(&self, sid: &str, query: &str) -> Http {
        let mut conn = self.conn();
        conn.send("GET", &format!("/prompts/{sid}{query}"), &[], None);
        conn
    }

    /// `GET /prompts/{sid}?wait=false` asserting 200; returns the array.
    #[track_caller]
    pub fn pending(&self, sid: &str) -> Vec<Value> {
        let resp = self.get(&format!("/prompts/{sid}?wait=false"));
        assert_eq!(resp.status, 200, "GET /prompts: {}", resp.text());
        match resp.json() {
            Value::Array(items) => items,
            other => panic!("GET /prompts body is not an array: {other}"),
        }
    }

    /// `GET /messages/{sid}{query}` asserting 200; returns the body.
    #[track_caller]
    pub fn messages(&self, sid: &str, query: &str) -> Value {
        let resp = self.get(&format!("/messages/{sid}{query}"));
        assert_eq!(resp.status, 200, "GET /messages: {}", resp.text());
        resp.json()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The second relay prints its own stderr and is killed after this one.
        let twin = self.twin.take();
        if std::thread::panicking() {
            eprintln!("--- relay stderr ---\n{}", self.logs().join("\n"));
        }
        drop(twin);
        if self.exited.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        if let Some(dir) = &self.own_data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `GET /healthz` of the relay at `addr`, parsed, asserting 200.
#[track_caller]
fn health_at(addr: SocketAddr) -> Value {
    let resp = Http::connect(addr).request("GET", "/healthz", &[], None);
    assert_eq!(resp.status, 200, "/healthz: {}", resp.text());
    resp.json()
}

fn is_listening_line(line: &str) -> bool {
    serde_json::from_str::<Value>(line)
        .map(|v| v["event"] == "listening" && v["addr"].is_string())
        .unwrap_or(false)
}

static SESSION_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// True when the suite runs against two relays on one Redis (`TEST_WITH_REDIS`).
pub fn redis_mode() -> bool {
    std::env::var_os("TEST_WITH_REDIS").is_some()
}

/// In `TEST_WITH_REDIS` mode, prints why the test does not run there and
/// returns true (the test then returns at once); otherwise false.
pub fn skip_with_redis(reason: &str) -> bool {
    let skip = redis_mode();
    if skip {
        eprintln!("skipped with TEST_WITH_REDIS: {reason}");
    }
    skip
}

/// True when `TEST_WITH_REDIS` names a Redis Cluster (`redis-cluster://`):
/// the relays lay keys out in buckets, whose counters order arrivals and
/// whose shares of the session cap are checked apart.
pub fn cluster_mode() -> bool {
    std::env::var("TEST_WITH_REDIS").is_ok_and(|u| u.starts_with("redis-cluster://"))
}

/// In cluster mode, prints why the test does not run there and returns
/// true (the test then returns at once); otherwise false.
pub fn skip_in_cluster(reason: &str) -> bool {
    let skip = cluster_mode();
    if skip {
        eprintln!("skipped with a redis-cluster:// TEST_WITH_REDIS: {reason}");
    }
    skip
}

/// A session id unique within this test run: `t-<counter>-<pid>`.
pub fn unique_session() -> String {
    let n = SESSION_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("t-{n}-{}", std::process::id())
}

/// True for a UUID v4 string (`xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx`). Extra helper.
pub fn is_uuid_v4(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
        && b[14] == b'4'
        && matches!(b[19].to_ascii_lowercase(), b'8' | b'9' | b'a' | b'b')
}

/// Asserts a JSON error answer: status and exact `error` text. Extra helper.
#[track_caller]
pub fn assert_error(resp: &Response, status: u16, error: &str) {
    assert_eq!(resp.status, status, "body: {}", resp.text());
    let body = resp.json();
    assert_eq!(body["error"], error, "body: {body}");
}

/// Milliseconds since the Unix epoch, from the test's clock. Extra helper.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The `client_msg_id`s of a list of prompt objects, in order.
#[track_caller]
pub fn client_msg_ids(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|p| {
            p["client_msg_id"]
                .as_str()
                .expect("client_msg_id")
                .to_string()
        })
        .collect()
}

/// The upgrade request of a raw WebSocket client for `path`, for tests that
/// drive the socket themselves (a subscriber that never reads, or one with
/// a tiny receive window).
pub fn ws_upgrade_request(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
}

/// Sends the upgrade for `path` on `s` and reads the `101`'s head, byte by
/// byte so that nothing after it is consumed.
#[track_caller]
pub fn raw_upgrade<S: Read + Write>(s: &mut S, path: &str) {
    s.write_all(ws_upgrade_request(path).as_bytes())
        .expect("send upgrade");
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).expect("read 101"), 1, "closed before 101");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
}
