//! TLS on the server's port, in the tools and to Redis, over real sockets
//! with certificates the test makes (openssl): a CA, a server certificate
//! for localhost and 127.0.0.1, and others for reloads and wrong names. The
//! test's clients are rustls clients built with relay's own client
//! settings (`relay::tls::client_config`), trusting the test's CA.

#[path = "../common/mod.rs"]
mod common;

mod certs;
mod plain;
mod redis;
mod tools;

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use certs::{
    Certs, IO_TIMEOUT, closed_within, connect, json_of, read_response, request, try_connect,
    wait_parked,
};
use common::{Server, unique_session};
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, StreamOwned};
use serde_json::{Value, json};

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
fn a_stalled_handshake_is_closed_by_the_request_timeout_while_others_are_served() {
    let certs = Certs::new();
    let srv = certs.server("server", &[("RELAY_REQUEST_TIMEOUT", "1")]);
    // The first bytes of a ClientHello record, then nothing.
    let mut stalled = TcpStream::connect(srv.addr()).unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .unwrap();
    // A method's letters without the space that would tell it is HTTP.
    let mut undecided = TcpStream::connect(srv.addr()).unwrap();
    undecided.write_all(b"GET").unwrap();
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
        closed_within(&mut undecided, Duration::from_secs(5)),
        "undecided first bytes kept open"
    );
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)),
        "silent socket kept open"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_flood_of_client_hellos_is_closed_by_the_request_timeout_while_others_are_served() {
    let certs = Certs::new();
    let srv = certs.server("server", &[("RELAY_REQUEST_TIMEOUT", "1")]);
    // A real ClientHello, sent on 100 connections that never go further.
    let config = relay::tls::client_config(Some(&certs.pem("ca")), None, None).unwrap();
    let mut hello = Vec::new();
    ClientConnection::new(config, ServerName::try_from("localhost").unwrap())
        .unwrap()
        .write_tls(&mut hello)
        .unwrap();
    let started = Instant::now();
    let mut flood: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(srv.addr()).unwrap();
            s.write_all(&hello).unwrap();
            s
        })
        .collect();
    let mut tls = connect(&srv, &certs);
    assert_eq!(request(&mut tls, "GET", "/healthz", None).0, 200);
    for s in &mut flood {
        assert!(
            closed_within(s, Duration::from_secs(5)),
            "a stalled handshake kept open"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(request(&mut tls, "GET", "/healthz", None).0, 200);
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
