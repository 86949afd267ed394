//! The WebSocket upgrade check (RFC 6455 section 4.2.1), done by hand so the
//! bytes that follow the request head stay ours: GET over HTTP/1.1,
//! `Upgrade: websocket`, `Connection: upgrade`, version 13, a 16-byte key, and
//! an allowed `Origin`. The 101 uses tungstenite's `derive_accept_key`.

use super::RequestHead;
use super::response::switching_protocols;
use crate::config::Origins;
use crate::relay::ApiError;

/// Checks an upgrade request; `Ok` carries the 101 answer to send.
pub fn check(head: &RequestHead, origins: &Origins) -> Result<Vec<u8>, ApiError> {
    if head.http10 || !head.websocket {
        return Err(ApiError::bad_request("WebSocket upgrade required")
            .with_details("send Upgrade: websocket and Connection: Upgrade over HTTP/1.1"));
    }
    if head.ws_version.as_deref() != Some("13") {
        return Err(ApiError::bad_request("Unsupported WebSocket version")
            .with_details("Sec-WebSocket-Version must be 13"));
    }
    let key = head.ws_key.as_deref().unwrap_or("");
    if !valid_key(key) {
        return Err(ApiError::bad_request("Invalid Sec-WebSocket-Key"));
    }
    // A client without `Origin` is not a browser; the check protects browsers.
    if let Some(origin) = &head.origin
        && !origins.allows(origin)
    {
        return Err(ApiError::forbidden_origin());
    }
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    Ok(switching_protocols(&accept))
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
            ws_version: Some("13".into()),
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
    fn refuses_bad_upgrades() {
        let mut h = head();
        h.ws_version = Some("8".into());
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
