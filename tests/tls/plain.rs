//! Plain HTTP sent to the TLS port: a `400` in clear saying the port
//! speaks HTTPS, then the connection ends; bytes that are neither HTTP nor
//! TLS are just closed, and TLS clients on the same port are served as
//! ever.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::certs::{Certs, IO_TIMEOUT, closed_within, connect, json_of, request};

/// Writes `parts` on a plain socket to the server, one write each, and
/// reads everything until the server closes; fails if it does not close
/// within the I/O timeout.
#[track_caller]
fn send_plain(addr: std::net::SocketAddr, parts: &[&[u8]]) -> Vec<u8> {
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_nodelay(true).unwrap();
    sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    for part in parts {
        sock.write_all(part).unwrap();
    }
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match sock.read(&mut chunk) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!(
                "no end of stream ({e}) after {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

/// The status, the head and the JSON body of a whole plain answer.
#[track_caller]
fn parse_answer(raw: &[u8]) -> (u16, String, serde_json::Value) {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP/1.1 status line: {head:?}"));
    (status, head.to_string(), json_of(body.as_bytes()))
}

#[test]
fn a_plain_get_gets_a_400_naming_https_then_the_end_of_the_stream() {
    let certs = Certs::new();
    let srv = certs.server("server", &[("RELAY_REQUEST_TIMEOUT", "30")]);
    let host = format!("127.0.0.1:{}", srv.addr().port());
    let started = Instant::now();
    let req = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n");
    let raw = send_plain(srv.addr(), &[req.as_bytes()]);
    // Closed at once after the answer, not by the request timeout.
    assert!(started.elapsed() < Duration::from_secs(5));
    let (status, head, body) = parse_answer(&raw);
    assert_eq!(status, 400, "{head}");
    assert!(head.contains("\r\nConnection: close"), "{head}");
    assert_eq!(body["error"], "Bad Request");
    assert_eq!(
        body["details"],
        format!("this port speaks HTTPS: use https://{host}/")
    );

    // The port still speaks TLS.
    let mut tls = connect(&srv, &certs);
    assert_eq!(request(&mut tls, "GET", "/healthz", None).0, 200);
}

#[test]
fn a_plain_post_cut_inside_its_method_gets_the_same_400() {
    let certs = Certs::new();
    let srv = certs.server("server", &[("RELAY_REQUEST_TIMEOUT", "30")]);
    let body = r#"{"session_id":"s","client_msg_id":"m","prompt":"hi"}"#;
    let rest = format!(
        "ST /prompt HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // The first bytes may arrive alone: too few to tell, so the server
    // waits for more before deciding.
    let raw = send_plain(srv.addr(), &[b"PO", rest.as_bytes()]);
    let (status, head, body) = parse_answer(&raw);
    assert_eq!(status, 400, "{head}");
    assert_eq!(body["error"], "Bad Request");
    // No Host: the answer still names HTTPS.
    assert_eq!(
        body["details"],
        "this port speaks HTTPS: use an https:// URL"
    );

    let mut tls = connect(&srv, &certs);
    assert_eq!(request(&mut tls, "GET", "/healthz", None).0, 200);
}

#[test]
fn curl_with_an_http_url_shows_the_answer_instead_of_http_0_9() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let host = format!("127.0.0.1:{}", srv.addr().port());
    let out = match Command::new("curl")
        .args(["-sS", "--max-time", "10", &format!("http://{host}/healthz")])
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            eprintln!("skipped: no curl");
            return;
        }
        Err(e) => panic!("curl: {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "curl failed: {stderr}");
    assert!(!stderr.contains("HTTP/0.9"), "{stderr}");
    assert!(
        stdout.contains(&format!("this port speaks HTTPS: use https://{host}/")),
        "{stdout}"
    );
}

#[test]
fn bytes_neither_http_nor_tls_are_just_closed() {
    let certs = Certs::new();
    let srv = certs.server("server", &[("RELAY_REQUEST_TIMEOUT", "30")]);
    for junk in [
        &b"\x00\x01\x02garbage\xff\xfe\r\n\r\n"[..],
        // Lowercase is no method token.
        b"get /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n",
    ] {
        let mut sock = TcpStream::connect(srv.addr()).unwrap();
        sock.write_all(junk).unwrap();
        let mut first = [0u8; 5];
        sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let n = sock.read(&mut first).unwrap_or(0);
        assert!(
            !first[..n].starts_with(b"HTTP/"),
            "{junk:?} got an HTTP answer"
        );
        assert!(
            closed_within(&mut sock, Duration::from_secs(5)),
            "{junk:?}: still open"
        );
    }
    let mut tls = connect(&srv, &certs);
    assert_eq!(request(&mut tls, "GET", "/healthz", None).0, 200);
}
