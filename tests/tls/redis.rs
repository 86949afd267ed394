//! `rediss://`: relays sharing sessions through a `redis-server` that
//! speaks only TLS, and a certificate from an unknown CA refused.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::certs::{Certs, IO_TIMEOUT, try_connect};
use crate::common::{Server, unique_session};

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
            "{bin} is missing: run scripts/test, which installs it"
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
    let line = srv.wait_for_log("TLS failed");
    assert!(line.contains("UnknownIssuer"), "{line}");
    assert!(!srv.logs().iter().any(|l| l.contains("connected to Redis")));
}
