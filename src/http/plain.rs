//! Plain HTTP sent to a TLS port: telling it from a TLS handshake by its
//! first bytes, and the `Host` it named, so the answer can say which URL
//! to use instead. nginx answers such a request with a 400 rather than a
//! TLS alert that a client shows as garbage (`Received HTTP/0.9`).
//!
//! A TLS connection opens with a handshake record, whose first byte is
//! 0x16; an HTTP request opens with its method token, ASCII letters, then
//! a space. The two never look alike, so a TLS client is never delayed:
//! its first byte decides.

/// Longest method token waited for: the standard methods have at most 7
/// letters (`OPTIONS`, `CONNECT`), WebDAV's `PROPPATCH` has 9. Past this
/// many letters without a space the bytes are not taken for HTTP, so a
/// peer cannot keep the decision open by sending letters.
pub const MAX_METHOD_LEN: usize = 16;

/// What the first bytes of a connection to a TLS port are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstBytes {
    /// Too few to tell: uppercase letters so far (or nothing).
    NeedMore,
    /// An HTTP method token and a space: a plain HTTP request.
    PlainHttp,
    /// Anything else: TLS, or bytes TLS will refuse.
    Other,
}

/// Classifies the first bytes read from a connection to a TLS port; at most
/// [`MAX_METHOD_LEN`] + 1 bytes are looked at. Called by the TLS layer
/// before it hands any byte to rustls.
pub fn classify(first: &[u8]) -> FirstBytes {
    for (i, &b) in first.iter().take(MAX_METHOD_LEN + 1).enumerate() {
        match b {
            b'A'..=b'Z' => {}
            b' ' if i > 0 => return FirstBytes::PlainHttp,
            _ => return FirstBytes::Other,
        }
    }
    if first.len() > MAX_METHOD_LEN {
        FirstBytes::Other
    } else {
        FirstBytes::NeedMore
    }
}

/// The `Host` header among the complete header lines of `request` (the
/// bytes read so far; a line cut by the read is not looked at), if it is a
/// plausible `host[:port]`: it is written back into the answer, so
/// anything else is left out rather than echoed.
pub fn host(request: &[u8]) -> Option<&str> {
    let end = request.iter().rposition(|&b| b == b'\n')?;
    let mut lines = request[..end].split(|&b| b == b'\n');
    lines.next(); // the request line
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break; // the end of the head
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if !line[..colon].eq_ignore_ascii_case(b"host") {
            continue;
        }
        let value = line[colon + 1..].trim_ascii();
        let plausible = !value.is_empty()
            && value.len() <= 255
            && value
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b".-_:[]".contains(&b));
        return plausible.then(|| std::str::from_utf8(value).ok()).flatten();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_and_a_space_is_plain_http() {
        for first in [
            &b"GET /healthz HTTP/1.1\r\n"[..],
            b"POST ",
            b"PUT ",
            b"HEAD ",
            b"DELETE /x",
            b"OPTIONS *",
            b"PATCH ",
            b"PROPPATCH ",
        ] {
            assert_eq!(classify(first), FirstBytes::PlainHttp, "{first:?}");
        }
    }

    #[test]
    fn a_tls_record_is_decided_by_its_first_byte() {
        assert_eq!(classify(&[0x16]), FirstBytes::Other);
        assert_eq!(classify(&[0x16, 0x03, 0x01, 0x02, 0x00]), FirstBytes::Other);
    }

    #[test]
    fn letters_without_a_space_yet_wait_but_not_forever() {
        assert_eq!(classify(b""), FirstBytes::NeedMore);
        assert_eq!(classify(b"G"), FirstBytes::NeedMore);
        assert_eq!(classify(b"OPTIONS"), FirstBytes::NeedMore);
        let letters = [b'A'; MAX_METHOD_LEN];
        assert_eq!(classify(&letters), FirstBytes::NeedMore);
        let too_many = [b'A'; MAX_METHOD_LEN + 1];
        assert_eq!(classify(&too_many), FirstBytes::Other);
    }

    #[test]
    fn anything_else_is_left_to_tls() {
        for first in [
            &b" GET"[..],
            b"get / HTTP/1.1",
            b"GET/",
            b"\x00\x01\x02\x03",
            b"SSH-2.0-OpenSSH",
            b"\r\n",
        ] {
            assert_eq!(classify(first), FirstBytes::Other, "{first:?}");
        }
    }

    #[test]
    fn the_host_header_is_found_in_complete_lines_only() {
        let req = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhost:  127.0.0.1:8443 \r\n\r\n";
        assert_eq!(host(req), Some("127.0.0.1:8443"));
        assert_eq!(
            host(b"GET / HTTP/1.1\nHost: [::1]:443\n\n"),
            Some("[::1]:443")
        );
        // Cut by the read: not trusted.
        assert_eq!(host(b"GET / HTTP/1.1\r\nHost: relay.exa"), None);
        // After the head: a body, not a header.
        assert_eq!(host(b"POST / HTTP/1.1\r\n\r\nHost: x\r\n"), None);
        assert_eq!(host(b"GET / HTTP/1.1\r\n\r\n"), None);
    }

    #[test]
    fn a_host_that_is_not_a_plain_name_is_left_out() {
        assert_eq!(host(b"GET / HTTP/1.1\r\nHost: <script>\r\n\r\n"), None);
        assert_eq!(host(b"GET / HTTP/1.1\r\nHost: a\"b\r\n\r\n"), None);
        assert_eq!(host(b"GET / HTTP/1.1\r\nHost:\r\n\r\n"), None);
        let long = format!("GET / HTTP/1.1\r\nHost: {}\r\n\r\n", "a".repeat(256));
        assert_eq!(host(long.as_bytes()), None);
    }
}
