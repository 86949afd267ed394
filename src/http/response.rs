//! Encodes responses: status line, the headers every answer carries (content
//! type, JSON unless told otherwise; length, CORS, connection), optional
//! extra headers, body.
//! Returns bytes for the connection's output queue.

use crate::wire::push_decimal;

/// Per-request facts that shape the headers of its answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Meta<'a> {
    /// Whether the connection stays open after this answer.
    pub keep_alive: bool,
    /// The request was HTTP/1.0 (keep-alive must then be announced).
    pub http10: bool,
    /// `Access-Control-Allow-Origin` value, if any.
    pub allow_origin: Option<&'a str>,
    /// The value depends on the request's `Origin` (an allow-list echo).
    pub vary_origin: bool,
    /// `HEAD`: headers only.
    pub head_only: bool,
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// `Content-Type` of every API answer (the web page has its own).
pub const JSON: &str = "application/json";

/// A complete response with a JSON body.
pub fn encode(status: u16, extra: &[(&str, &str)], body: &[u8], meta: &Meta) -> Vec<u8> {
    encode_typed(status, JSON, extra, body, meta)
}

/// A complete response whose body is of `content_type`.
pub fn encode_typed(
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    meta: &Meta,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160 + body.len());
    head(&mut out, status, content_type, extra, body.len(), meta);
    if !meta.head_only {
        out.extend_from_slice(body);
    }
    out
}

/// The status line and headers of a response whose body of `body_len`
/// bytes is queued separately (a body shared between answers, or one that
/// is part of the binary).
pub fn encode_head(
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body_len: usize,
    meta: &Meta,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    head(&mut out, status, content_type, extra, body_len, meta);
    out
}

fn head(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body_len: usize,
    meta: &Meta,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, status as u64);
    out.push(b' ');
    out.extend_from_slice(reason(status).as_bytes());
    out.extend_from_slice(b"\r\n");
    if status != 204 {
        out.extend_from_slice(b"Content-Type: ");
        out.extend_from_slice(content_type.as_bytes());
        out.extend_from_slice(b"\r\nContent-Length: ");
        push_decimal(out, body_len as u64);
        out.extend_from_slice(b"\r\n");
    }
    common_headers(out, extra, meta);
    out.extend_from_slice(b"\r\n");
}

fn common_headers(out: &mut Vec<u8>, extra: &[(&str, &str)], meta: &Meta) {
    if let Some(origin) = meta.allow_origin {
        out.extend_from_slice(b"Access-Control-Allow-Origin: ");
        out.extend_from_slice(origin.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if meta.vary_origin {
        out.extend_from_slice(b"Vary: Origin\r\n");
    }
    for (k, v) in extra {
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !meta.keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if meta.http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
}

/// `HTTP/1.1 100 Continue`, sent when a client waits before its body.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The `101 Switching Protocols` answer to a valid WebSocket upgrade;
/// `relay_v1` names that subprotocol, when the client offered it.
pub fn switching_protocols(accept_key: &str, relay_v1: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ",
    );
    out.extend_from_slice(accept_key.as_bytes());
    if relay_v1 {
        out.extend_from_slice(b"\r\nSec-WebSocket-Protocol: relay.v1");
    }
    out.extend_from_slice(b"\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_length_cors_and_connection() {
        let meta = Meta {
            keep_alive: false,
            allow_origin: Some("*"),
            ..Meta::default()
        };
        let r = String::from_utf8(encode(404, &[], b"{}", &meta)).unwrap();
        assert!(r.starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert!(r.contains("Content-Length: 2\r\n"));
        assert!(r.contains("Access-Control-Allow-Origin: *\r\n"));
        assert!(r.contains("Connection: close\r\n"));
        assert!(r.ends_with("\r\n\r\n{}"));
    }

    #[test]
    fn another_content_type_replaces_json() {
        let r = encode_typed(
            200,
            "text/html; charset=utf-8",
            &[],
            b"<p>",
            &Meta::default(),
        );
        let r = String::from_utf8(r).unwrap();
        assert!(
            r.contains("Content-Type: text/html; charset=utf-8\r\n"),
            "{r}"
        );
        assert!(!r.contains("application/json"), "{r}");
        let r = String::from_utf8(encode(200, &[], b"{}", &Meta::default())).unwrap();
        assert!(r.contains("Content-Type: application/json\r\n"), "{r}");
    }

    #[test]
    fn head_answers_carry_no_body() {
        let meta = Meta {
            keep_alive: true,
            head_only: true,
            ..Meta::default()
        };
        let r = encode(200, &[], b"{\"ok\":true}", &meta);
        assert!(r.ends_with(b"Content-Length: 11\r\n\r\n"));
    }

    #[test]
    fn push_decimal_writes_digits() {
        for n in [0, 7, 10, 1_048_576, u64::MAX] {
            let mut out = b"x".to_vec();
            push_decimal(&mut out, n);
            assert_eq!(out, format!("x{n}").into_bytes());
        }
    }
}
