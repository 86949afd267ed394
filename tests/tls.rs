//! TLS on the server's port, in the tools and to Redis, over real sockets
//! with certificates the test makes (openssl): a CA, a server certificate
//! for localhost and 127.0.0.1, and others for reloads and wrong names. The
//! test's clients are rustls clients built with relay's own client
//! settings (`relay::tls::client_config`), trusting the test's CA.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Server, unique_session};
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};
use serde_json::{Value, json};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Certificates made for one test in a directory of their own, removed on
/// drop.
struct Certs {
    dir: PathBuf,
}

impl Certs {
    /// A CA named `ca` and a server certificate `server` it signed, for
    /// localhost and 127.0.0.1.
    fn new() -> Certs {
        let n = NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("relay-tls-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let certs = Certs { dir };
        certs.ca("ca");
        certs.leaf("server", "ca", "DNS:localhost,IP:127.0.0.1");
        certs
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    fn pem(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.pem"))
    }

    fn key(&self, name: &str) -> PathBuf {
        self.path(&format!("{name}.key"))
    }

    /// A self-signed CA certificate `name.pem` with its key `name.key`.
    fn ca(&self, name: &str) {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &self.key(name).to_string_lossy(),
            "-out",
            &self.pem(name).to_string_lossy(),
        ]);
    }

    /// A server certificate `name.pem` (key `name.key`) for the names in
    /// `san` (`DNS:…,IP:…`), signed by the CA `ca`.
    fn leaf(&self, name: &str, ca: &str, san: &str) {
        let csr = self.path(&format!("{name}.csr"));
        let ext = self.path(&format!("{name}.ext"));
        std::fs::write(
            &ext,
            format!(
                "subjectAltName={san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .unwrap();
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &self.key(name).to_string_lossy(),
            "-out",
            &csr.to_string_lossy(),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-days",
            "2",
            "-set_serial",
            "2",
            "-in",
            &csr.to_string_lossy(),
            "-CA",
            &self.pem(ca).to_string_lossy(),
            "-CAkey",
            &self.key(ca).to_string_lossy(),
            "-extfile",
            &ext.to_string_lossy(),
            "-out",
            &self.pem(name).to_string_lossy(),
        ]);
    }

    /// The server's environment for the certificate `name`.
    fn env(&self, name: &str) -> Vec<(String, String)> {
        vec![
            (
                "RELAY_TLS_CERT".into(),
                self.pem(name).to_string_lossy().into_owned(),
            ),
            (
                "RELAY_TLS_KEY".into(),
                self.key(name).to_string_lossy().into_owned(),
            ),
        ]
    }

    /// Starts a relay serving the certificate `name`, with `extra` settings.
    #[track_caller]
    fn server(&self, name: &str, extra: &[(&str, &str)]) -> Server {
        let env = self.env(name);
        let mut all: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        all.extend_from_slice(extra);
        Server::start_single_with(&all)
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

static NEXT_DIR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[track_caller]
fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A TLS connection to `addr` checked against the CA file `ca` for the
/// name `host`, its handshake done; the error is rustls's.
fn try_connect(addr: SocketAddr, ca: &Path, host: &str) -> Result<Tls, std::io::Error> {
    let config = relay::tls::client_config(Some(ca), None, Some(b"http/1.1")).unwrap();
    let name = ServerName::try_from(host.to_string()).unwrap();
    let conn = ClientConnection::new(config, name).unwrap();
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    sock.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut tls = StreamOwned::new(conn, sock);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

#[track_caller]
fn connect(srv: &Server, certs: &Certs) -> Tls {
    try_connect(srv.addr(), &certs.pem("ca"), "localhost").expect("TLS handshake")
}

/// One request on `tls`; the answer's status and body (framed by
/// `Content-Length`, which is all the server sends).
#[track_caller]
fn request(tls: &mut Tls, method: &str, path: &str, body: Option<&Value>) -> (u16, Vec<u8>) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).unwrap();
    tls.write_all(body.as_bytes()).unwrap();
    tls.flush().unwrap();
    read_response(tls)
}

#[track_caller]
fn read_response(tls: &mut Tls) -> (u16, Vec<u8>) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tls.read(&mut byte).expect("read the answer's head");
        assert_eq!(
            n,
            1,
            "closed before the head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let status: u16 = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_string())
        })
        .map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0u8; len];
    tls.read_exact(&mut body).expect("read the body");
    (status, body)
}

/// Polls `/healthz` over TLS (bounded) until `parked_polls` is `n`.
#[track_caller]
fn wait_parked(srv: &Server, certs: &Certs, n: u64) {
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut tls = connect(srv, certs);
    loop {
        let (status, body) = request(&mut tls, "GET", "/healthz", None);
        assert_eq!(status, 200);
        if json_of(&body)["parked_polls"] == n {
            return;
        }
        assert!(Instant::now() < deadline, "parked_polls never became {n}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
}

/// Whether the peer closes `sock` (EOF or reset) within `within`; bytes it
/// sends first are skipped.
fn closed_within(sock: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        sock.set_read_timeout(Some(left)).unwrap();
        match sock.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn prompt_long_poll_and_answer_travel_over_tls_and_wss() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let sid = unique_session();

    // A subscriber over wss://, upgraded on a TLS connection.
    let tls = connect(&srv, &certs);
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"http/1.1"[..]), "ALPN");
    let (mut ws, _) = tungstenite::client(format!("wss://localhost/ws/{sid}"), tls)
        .expect("WebSocket upgrade over TLS");

    // The agent's long-poll parks on its TLS connection.
    let mut agent = connect(&srv, &certs);
    let poll = format!("GET /prompts/{sid}?timeout=20 HTTP/1.1\r\nHost: localhost\r\n\r\n");
    agent.write_all(poll.as_bytes()).unwrap();
    agent.flush().unwrap();
    wait_parked(&srv, &certs, 1);

    // A prompt large enough to take several TLS records wakes it.
    let text = "x".repeat(100_000);
    let mut client = connect(&srv, &certs);
    let (status, body) = request(
        &mut client,
        "POST",
        "/prompt",
        Some(&json!({"session_id": sid, "client_msg_id": "m1", "prompt": text})),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, body) = read_response(&mut agent);
    assert_eq!(status, 200);
    let prompts = json_of(&body);
    assert_eq!(prompts[0]["client_msg_id"], "m1");
    assert_eq!(prompts[0]["prompt"].as_str().map(str::len), Some(100_000));

    // The answer, posted on the agent's kept-alive connection, reaches
    // the subscriber.
    let (status, _) = request(
        &mut agent,
        "POST",
        "/response",
        Some(&json!({"session_id": sid, "client_msg_id": "m1", "text": "done"})),
    );
    assert_eq!(status, 200);
    loop {
        let msg = ws.read().expect("read from wss");
        if let tungstenite::Message::Text(t) = msg {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            if v["type"] == "message" {
                assert_eq!(v["data"]["text"], "done");
                break;
            }
        }
    }
    let _ = ws.close(None);
}

#[test]
fn pipelined_requests_buffered_inside_tls_are_all_answered() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let mut tls = connect(&srv, &certs);
    // 300 requests in one write: more than one turn answers, and most of
    // them wait as plaintext inside rustls, announced by no socket edge.
    let one = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";
    tls.write_all(one.repeat(300).as_bytes()).unwrap();
    tls.flush().unwrap();
    for _ in 0..300 {
        assert_eq!(read_response(&mut tls).0, 200);
    }
}

#[test]
fn plain_http_on_the_tls_port_is_closed_at_once() {
    let certs = Certs::new();
    let srv = certs.server("server", &[("RELAY_REQUEST_TIMEOUT", "30")]);
    let mut sock = TcpStream::connect(srv.addr()).unwrap();
    sock.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let started = Instant::now();
    assert!(
        closed_within(&mut sock, Duration::from_secs(5)),
        "still open"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_stalled_handshake_is_closed_by_the_request_timeout_while_others_are_served() {
    let certs = Certs::new();
    let srv = certs.server("server", &[("RELAY_REQUEST_TIMEOUT", "1")]);
    // The first bytes of a ClientHello record, then nothing.
    let mut stalled = TcpStream::connect(srv.addr()).unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .unwrap();
    let mut silent = TcpStream::connect(srv.addr()).unwrap();
    let started = Instant::now();
    // Meanwhile others get answers.
    for _ in 0..3 {
        let mut tls = connect(&srv, &certs);
        let (status, _) = request(&mut tls, "GET", "/healthz", None);
        assert_eq!(status, 200);
    }
    assert!(
        closed_within(&mut stalled, Duration::from_secs(5)),
        "stalled handshake kept open"
    );
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)),
        "silent socket kept open"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn garbage_after_the_handshake_closes_the_connection() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let tls = connect(&srv, &certs);
    let (_, mut sock) = tls.into_parts();
    // Not a TLS record: a plaintext request where records are expected.
    sock.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert!(closed_within(&mut sock, Duration::from_secs(5)));
    // A record header announcing more than TLS allows.
    let tls = connect(&srv, &certs);
    let (_, mut sock) = tls.into_parts();
    sock.write_all(&[0x17, 0x03, 0x03, 0xff, 0xff]).unwrap();
    sock.write_all(&[0u8; 4096]).unwrap();
    assert!(closed_within(&mut sock, Duration::from_secs(5)));
    // The server is fine.
    let mut tls = connect(&srv, &certs);
    assert_eq!(request(&mut tls, "GET", "/healthz", None).0, 200);
}

#[test]
fn an_offered_protocol_other_than_http11_is_refused() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let mut config =
        (*relay::tls::client_config(Some(&certs.pem("ca")), None, None).unwrap()).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let conn = ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
        .unwrap();
    let sock = TcpStream::connect(srv.addr()).unwrap();
    sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let mut tls = StreamOwned::new(conn, sock);
    let mut failed = false;
    while tls.conn.is_handshaking() {
        if tls.conn.complete_io(&mut tls.sock).is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "a handshake offering only h2 succeeded");
}

#[test]
fn sighup_reloads_the_certificate_for_new_connections_only() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let mut open = connect(&srv, &certs);
    assert_eq!(request(&mut open, "GET", "/healthz", None).0, 200);

    // A new pair from another CA, written over the files in use.
    certs.ca("ca2");
    certs.leaf("server2", "ca2", "DNS:localhost,IP:127.0.0.1");
    std::fs::copy(certs.pem("server2"), certs.pem("server")).unwrap();
    std::fs::copy(certs.key("server2"), certs.key("server")).unwrap();
    signal(&srv, "HUP");
    srv.wait_for_log("TLS certificate reloaded");

    let new = try_connect(srv.addr(), &certs.pem("ca2"), "localhost");
    assert!(
        new.is_ok(),
        "the new certificate is not served: {:?}",
        new.err()
    );
    let old = try_connect(srv.addr(), &certs.pem("ca"), "localhost");
    assert!(old.is_err(), "the old certificate is still served");
    // The connection opened before the reload goes on.
    assert_eq!(request(&mut open, "GET", "/healthz", None).0, 200);

    // A broken pair is refused and the working one kept.
    std::fs::write(certs.key("server"), "not a key").unwrap();
    signal(&srv, "HUP");
    let line = srv.wait_for_log("TLS certificate reload failed");
    assert!(line.contains("server.key"), "{line}");
    let mut again = try_connect(srv.addr(), &certs.pem("ca2"), "localhost").expect("kept pair");
    assert_eq!(request(&mut again, "GET", "/healthz", None).0, 200);
}

fn signal(srv: &Server, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), srv.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Runs the server binary with `env` expecting it to refuse to start.
fn refused_start(env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relay"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RELAY_") || key == "PORT" {
            cmd.env_remove(key);
        }
    }
    cmd.env("RELAY_PORT", "0")
        .env("RELAY_HOST", "127.0.0.1")
        .envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_certificate_settings_exit_2_naming_the_file() {
    let certs = Certs::new();
    let cert = certs.pem("server");
    let key = certs.key("server");
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());

    let (code, err) = refused_start(&[("RELAY_TLS_CERT", cert)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("RELAY_TLS_KEY"), "{err}");

    let missing = certs.path("missing.pem");
    let missing = missing.to_str().unwrap();
    let (code, err) = refused_start(&[("RELAY_TLS_CERT", missing), ("RELAY_TLS_KEY", key)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing.pem"), "{err}");

    // The CA's key does not fit the server's certificate.
    let other_key = certs.key("ca");
    let (code, err) = refused_start(&[
        ("RELAY_TLS_CERT", cert),
        ("RELAY_TLS_KEY", other_key.to_str().unwrap()),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("ca.key") && err.contains("server.pem"),
        "{err}"
    );
}

/// A `redis-server` speaking only TLS (`--port 0 --tls-port`) with the
/// test's certificate; shut down and its directory removed on drop.
struct TlsRedis {
    child: std::process::Child,
    port: u16,
}

impl TlsRedis {
    #[track_caller]
    fn start(certs: &Certs) -> TlsRedis {
        let bin = "/usr/bin/redis-server";
        assert!(
            Path::new(bin).exists(),
            "{bin} is missing: run scripts/install-test-deps.sh"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = certs.path("redis");
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new(bin)
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--tls-cert-file")
            .arg(certs.pem("server"))
            .arg("--tls-key-file")
            .arg(certs.key("server"))
            .arg("--tls-ca-cert-file")
            .arg(certs.pem("ca"))
            .args([
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let redis = TlsRedis { child, port };
        // Ready once it accepts a TLS handshake.
        let deadline = Instant::now() + IO_TIMEOUT;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        loop {
            if TcpStream::connect(addr).is_ok()
                && try_connect(addr, &certs.pem("ca"), "localhost").is_ok()
            {
                return redis;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start with TLS"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn sessions_are_shared_through_redis_over_tls() {
    let certs = Certs::new();
    let redis = TlsRedis::start(&certs);
    let url = format!("rediss://localhost:{}", redis.port);
    let ca = certs.pem("ca");
    let env = [
        ("RELAY_REDIS_URL", url.as_str()),
        ("RELAY_REDIS_CA", ca.to_str().unwrap()),
        ("RELAY_REDIS_PREFIX", "tls:"),
    ];
    let one = Server::start_single_with(&env);
    one.wait_for_log("connected to Redis");
    let two = Server::start_single_with(&env);
    two.wait_for_log("connected to Redis");
    let sid = unique_session();
    one.prompt(&sid, "over rediss", Some("m1"));
    let pending = two.pending(&sid);
    assert_eq!(pending[0]["prompt"], "over rediss");
}

#[test]
fn a_redis_certificate_from_an_unknown_ca_is_refused_and_said() {
    let certs = Certs::new();
    let redis = TlsRedis::start(&certs);
    certs.ca("other");
    let url = format!("rediss://localhost:{}", redis.port);
    let other = certs.pem("other");
    let srv = Server::start_single_with(&[
        ("RELAY_REDIS_URL", url.as_str()),
        ("RELAY_REDIS_CA", other.to_str().unwrap()),
    ]);
    let line = srv.wait_for_log("TLS with Redis failed");
    assert!(line.contains("UnknownIssuer"), "{line}");
    assert!(!srv.logs().iter().any(|l| l.contains("connected to Redis")));
}

/// The binary with the caller's `RELAY_*` settings removed.
fn relay_tool() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relay"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RELAY_") || key == "PORT" {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(std::process::Stdio::null());
    cmd
}

/// Kills the child on drop.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn relay_agent_and_relay_send_round_trip_over_https_with_ca() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let url = format!("https://localhost:{}", srv.addr().port());
    let ca = certs.pem("ca");
    let sid = unique_session();
    let _agent = Running(
        relay_tool()
            .args(["agent", "--url", &url, "--session", &sid, "--ca"])
            .arg(&ca)
            .args(["--", "cat"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn relay agent"),
    );
    let out = relay_tool()
        .args([
            "send",
            "--url",
            &url,
            "--session",
            &sid,
            "--timeout",
            "20",
            "--ca",
        ])
        .arg(&ca)
        .arg("hello over tls")
        .output()
        .expect("run relay send");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "relay send failed: {stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello over tls",
        "{stderr}"
    );
    // RELAY_CA is the same as --ca; relay health speaks https:// too.
    let out = relay_tool()
        .args(["health", "--url", &url])
        .env("RELAY_CA", &ca)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_tools_refuse_an_untrusted_certificate_and_a_wrong_name() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let url = format!("https://localhost:{}", srv.addr().port());
    let sid = unique_session();

    // Not signed by anything the system trusts.
    let out = relay_tool()
        .args(["send", "--url", &url, "--session", &sid, "hi"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not trusted") && stderr.contains("--ca"),
        "{stderr}"
    );
    let out = relay_tool()
        .args(["agent", "--url", &url, "--session", &sid, "--", "cat"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not trusted"), "{stderr}");

    // Trusted, but made for another name.
    certs.leaf("other", "ca", "DNS:other.example");
    let other = certs.server("other", &[]);
    let url = format!("https://127.0.0.1:{}", other.addr().port());
    let out = relay_tool()
        .args(["send", "--url", &url, "--session", &sid, "--ca"])
        .arg(certs.pem("ca"))
        .arg("hi")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not valid for the name 127.0.0.1"),
        "{stderr}"
    );
    // Nothing was posted on either.
    let mut tls = connect(&srv, &certs);
    let (_, body) = request(&mut tls, "GET", &format!("/prompts/{sid}?wait=false"), None);
    assert!(!String::from_utf8_lossy(&body).contains("\"hi\""));
}
