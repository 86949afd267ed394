//! Bytes on the wire, shared by every layer and importing nothing of ours:
//! JSON string literals and decimal numbers written by hand (the hot paths
//! assemble messages without `fmt` or serde), raw JSON literals borrowed
//! from a request body, and server-to-client WebSocket frames.

use serde::Serialize;

pub mod wsframe;

/// A field's raw JSON literal, borrowed from the body: valid JSON already,
/// as serde_json's `RawValue` would hold it (or the request scan found it).
#[derive(Clone, Copy)]
pub struct Raw<'a> {
    pub(crate) lit: &'a str,
    /// Known to hold no backslash (the scan saw every byte), so no escape
    /// needs looking for; false when unknown.
    pub(crate) plain: bool,
}

impl<'a> Raw<'a> {
    /// A literal known to be valid JSON (one this server validated
    /// before), with nothing known about its escapes.
    pub fn new(lit: &'a str) -> Raw<'a> {
        Raw { lit, plain: false }
    }

    pub fn get(&self) -> &'a str {
        self.lit
    }
}

/// The literal alone: how it was found does not show.
impl std::fmt::Debug for Raw<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Raw").field(&self.lit).finish()
    }
}

/// Appends `s` as a JSON string literal.
pub fn push_json_str(out: &mut String, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).unwrap_or_default());
    }
}

/// Appends a decimal integer.
pub fn push_u64(out: &mut String, n: u64) {
    use std::fmt::Write;
    let _ = write!(out, "{n}");
}

/// Serializes a value that cannot fail to serialize (no maps with non-string keys).
pub fn to_json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// Decodes a raw string literal (the rare paths: conflict checks).
pub fn decode(raw: &str) -> String {
    serde_json::from_str::<String>(raw).unwrap_or_default()
}

/// The decimal digits of `n`, in `buf`, without `fmt` or an allocation.
pub fn digits(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Appends the decimal digits of `n`.
pub fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(digits(n, &mut [0; 20]));
}

/// Appends the decimal digits of `n` to text.
pub fn push_decimal_str(out: &mut String, n: u64) {
    // ASCII digits: always UTF-8.
    if let Ok(d) = std::str::from_utf8(digits(n, &mut [0; 20])) {
        out.push_str(d);
    }
}

/// The decoded length of a valid JSON string literal (quotes included),
/// decoding only when it holds an escape.
pub fn decoded_len(lit: &str) -> usize {
    let inner = &lit[1..lit.len() - 1];
    if inner.contains('\\') {
        decode(lit).len()
    } else {
        inner.len()
    }
}
