//! The WebSocket upgrade check (RFC 6455 section 4.2.1), done by hand so the
//! bytes that follow the request head stay ours: GET over HTTP/1.1,
//! `Upgrade: websocket`, `Connection: upgrade`, version 13, a 16-byte key, and
//! an allowed `Origin`. The 101's accept key is computed here too (SHA-1
//! and base64), and `relay send` checks a server's with the same function.

use super::RequestHead;
use super::parse::has_token;
use super::response::switching_protocols;
use crate::config::Origins;
use crate::error::ApiError;

/// Checks an upgrade request; `Ok` carries the 101 answer to send.
pub fn check(head: &RequestHead, origins: &Origins) -> Result<Vec<u8>, ApiError> {
    if head.http10 || !head.websocket {
        return Err(ApiError::bad_request("WebSocket upgrade required")
            .with_details("send Upgrade: websocket and Connection: Upgrade over HTTP/1.1"));
    }
    if !head.ws_version_13 {
        return Err(ApiError::bad_request("Unsupported WebSocket version")
            .with_details("Sec-WebSocket-Version must be 13"));
    }
    let key = head.ws_key.as_deref().unwrap_or("");
    if !valid_key(key) {
        return Err(ApiError::bad_request("Invalid Sec-WebSocket-Key"));
    }
    // A client without `Origin` is not a browser; the check protects
    // browsers. The server's own page is always allowed.
    if let Some(origin) = &head.origin
        && !head.same_origin
        && !origins.allows(origin)
    {
        return Err(ApiError::forbidden_origin());
    }
    let accept = accept_key(key.as_bytes());
    let relay_v1 = head
        .ws_protocols
        .as_deref()
        .is_some_and(|p| has_token(p, RELAY_V1));
    Ok(switching_protocols(&accept, relay_v1))
}

/// The subprotocol a client offers beside `bearer.<token>`, and the one
/// the server answers with: a browser fails an upgrade whose answer names
/// none of the offered ones, and the token must never be echoed.
pub const RELAY_V1: &str = "relay.v1";

/// The token offered as the subprotocol `bearer.<token>`, if any: how a
/// browser passes a token without putting it in the URL.
pub fn subprotocol_token(head: &RequestHead) -> Option<&str> {
    head.ws_protocols
        .as_deref()?
        .split(',')
        .find_map(|p| p.trim().strip_prefix("bearer."))
}

/// The `Sec-WebSocket-Accept` value for a `Sec-WebSocket-Key` (RFC 6455
/// section 4.2.2): base64 of the SHA-1 of the key followed by the
/// protocol's GUID.
pub fn accept_key(key: &[u8]) -> String {
    use sha1::{Digest, Sha1};
    let mut hash = Sha1::new();
    hash.update(key);
    hash.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64(&hash.finalize())
}

/// Standard base64 with padding (RFC 4648 section 4): WebSocket keys and
/// the page's CSP hashes.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A base64 encoding of 16 bytes: 22 base64 characters and `==`.
fn valid_key(key: &str) -> bool {
    key.len() == 24
        && key.ends_with("==")
        && key[..22]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> RequestHead {
        RequestHead {
            websocket: true,
            ws_version_13: true,
            ws_key: Some("dGhlIHNhbXBsZSBub25jZQ==".into()),
            ..RequestHead::default()
        }
    }

    #[test]
    fn accepts_the_rfc_example_key() {
        let out = String::from_utf8(check(&head(), &Origins::Any).unwrap()).unwrap();
        assert!(out.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
    }

    #[test]
    fn answers_relay_v1_when_offered_and_never_echoes_the_token() {
        let mut h = head();
        let plain = String::from_utf8(check(&h, &Origins::Any).unwrap()).unwrap();
        assert!(!plain.contains("Sec-WebSocket-Protocol"), "{plain}");
        h.ws_protocols = Some("relay.v1, bearer.abc-_9".into());
        let out = String::from_utf8(check(&h, &Origins::Any).unwrap()).unwrap();
        assert!(
            out.contains("\r\nSec-WebSocket-Protocol: relay.v1\r\n"),
            "{out}"
        );
        assert!(out.ends_with("\r\n\r\n") && !out.contains("abc"), "{out}");
        assert_eq!(subprotocol_token(&h), Some("abc-_9"));
        h.ws_protocols = Some("bearer.t1,relay.v1".into());
        assert_eq!(subprotocol_token(&h), Some("t1"));
        h.ws_protocols = Some("chat".into());
        assert_eq!(subprotocol_token(&h), None);
        let out = String::from_utf8(check(&h, &Origins::Any).unwrap()).unwrap();
        assert!(!out.contains("Sec-WebSocket-Protocol"), "{out}");
    }

    #[test]
    fn refuses_bad_upgrades() {
        let mut h = head();
        h.ws_version_13 = false;
        assert_eq!(check(&h, &Origins::Any).unwrap_err().status, 400);
        let mut h = head();
        h.ws_key = Some("short".into());
        assert_eq!(check(&h, &Origins::Any).unwrap_err().status, 400);
        let mut h = head();
        h.websocket = false;
        assert_eq!(check(&h, &Origins::Any).unwrap_err().status, 400);
        let mut h = head();
        h.origin = Some("https://evil.example".into());
        let only = Origins::List(vec!["https://ok.example".into()]);
        assert_eq!(check(&h, &only).unwrap_err().status, 403);
        h.origin = Some("https://ok.example".into());
        assert!(check(&h, &only).is_ok());
    }
}
