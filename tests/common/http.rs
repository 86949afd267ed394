//! Raw HTTP/1.1 client over a socket (TLS over it with `TEST_WITH_TLS`): one `Response`
//! type, and `Http`, a keep-alive connection with its own read buffer for pipelining tests.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::IO_TIMEOUT;
use super::tls::Stream;

/// One HTTP response as read off the wire.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// First header with this name, case-insensitive.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON; panics with the body text if it is not JSON.
    #[track_caller]
    pub fn json(&self) -> Value {
        match serde_json::from_slice(&self.body) {
            Ok(v) => v,
            Err(e) => panic!(
                "response body is not JSON ({e}); status {}: {:?}",
                self.status,
                self.text()
            ),
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A raw HTTP/1.1 connection with its own read buffer, for keep-alive and pipelining tests.
pub struct Http {
    stream: Stream,
    buf: Vec<u8>,
    /// Methods of requests sent with `send` whose responses are not read yet, so a response
    /// to `HEAD` is read without a body.
    in_flight: VecDeque<String>,
    host: String,
}

impl Http {
    #[track_caller]
    pub(super) fn connect(addr: SocketAddr) -> Http {
        let stream = TcpStream::connect(addr).expect("connect to relay");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Http {
            stream: Stream::over(stream),
            buf: Vec::new(),
            in_flight: VecDeque::new(),
            host: addr.to_string(),
        }
    }

    /// Writes bytes exactly as given.
    #[track_caller]
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to relay");
        self.stream.flush().expect("write to relay");
    }

    /// Writes one request; adds `Host` and `Content-Length` unless given.
    #[track_caller]
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) {
        let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        let mut out = format!("{method} {path} HTTP/1.1\r\n");
        if !has("host") {
            out.push_str(&format!("Host: {}\r\n", self.host));
        }
        for (k, v) in headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(body) = body
            && !has("content-length")
            && !has("transfer-encoding")
        {
            out.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if let Some(body) = body {
            bytes.extend_from_slice(body);
        }
        self.send_raw(&bytes);
        self.in_flight.push_back(method.to_ascii_uppercase());
    }

    /// Reads one response (a 1xx is returned as its own response). The body is framed by
    /// `Content-Length` only (the server never sends chunked); none for HEAD, 1xx, 204, 304.
    #[track_caller]
    pub fn read_response(&mut self) -> Response {
        let head_end = loop {
            if let Some(pos) = find(&self.buf, b"\r\n\r\n") {
                break pos + 4;
            }
            if self.fill() == 0 {
                panic!(
                    "connection closed before a complete response head; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end - 4]).into_owned();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        assert!(
            version.starts_with("HTTP/1."),
            "bad status line {status_line:?}"
        );
        let status: u16 = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        self.buf.drain(..head_end);
        if (100..200).contains(&status) {
            return Response {
                status,
                headers,
                body: Vec::new(),
            };
        }
        let method = self.in_flight.pop_front();
        let no_body = method.as_deref() == Some("HEAD") || status == 204 || status == 304;
        let len = if no_body {
            0
        } else {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| {
                    v.parse::<usize>()
                        .unwrap_or_else(|_| panic!("bad Content-Length {v:?}"))
                })
                .unwrap_or(0)
        };
        while self.buf.len() < len {
            if self.fill() == 0 {
                panic!(
                    "connection closed after {} of {len} body bytes",
                    self.buf.len()
                );
            }
        }
        let body = self.buf.drain(..len).collect();
        Response {
            status,
            headers,
            body,
        }
    }

    /// Sends a request and reads its final response (skipping any 1xx).
    #[track_caller]
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Response {
        self.send(method, path, headers, body);
        loop {
            let resp = self.read_response();
            if resp.status >= 200 {
                return resp;
            }
        }
    }

    /// POST with `Content-Type: application/json`.
    #[track_caller]
    pub fn post_json(&mut self, path: &str, body: &Value) -> Response {
        let bytes = serde_json::to_vec(body).unwrap();
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            Some(&bytes),
        )
    }

    /// True if the peer closes (EOF or reset) within 10 s; any bytes that arrive first are
    /// kept in the read buffer.
    pub fn is_closed_by_peer(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        let deadline = Instant::now() + IO_TIMEOUT;
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return false;
                }
                Err(_) => return true,
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }

    /// The connection's byte stream (the socket, or TLS over it).
    pub fn stream(&mut self) -> &mut Stream {
        &mut self.stream
    }

    /// The socket under the connection, for its timeouts and options.
    pub fn tcp(&self) -> &TcpStream {
        self.stream.tcp()
    }

    /// True if nothing arrives within `wait`; bytes that do arrive are kept in the read
    /// buffer for `read_response`.
    pub fn is_silent_for(&mut self, wait: Duration) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        self.tcp().set_read_timeout(Some(wait)).unwrap();
        let mut chunk = [0u8; 4096];
        let silent = match self.stream.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                false
            }
            Err(e) => matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        };
        self.tcp().set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        silent
    }

    /// Half-closes the write side (the server sees EOF). Extra, not in notes/harness.md.
    pub fn shutdown_write(&mut self) {
        self.stream.shutdown_write();
    }

    /// Reads more bytes into the buffer; 0 on EOF or reset. Panics on timeout.
    #[track_caller]
    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16384];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return n;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    panic!(
                        "no response from relay within {IO_TIMEOUT:?}; buffered: {:?}",
                        String::from_utf8_lossy(&self.buf)
                    )
                }
                Err(_) => return 0,
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
