//! The early check of a request line, run on the bytes already buffered
//! before the end of the head has arrived. Bytes that cannot begin an
//! HTTP/1.x request (a TLS ClientHello, binary garbage, a method with
//! characters outside RFC 9110's `tchar`, an HTTP/2 preface) are refused as
//! soon as they are seen, instead of waiting for a `\r\n\r\n` that never
//! comes and answering `408` after the request timeout.
//!
//! Such a peer gets `400` and a close, like any malformed head, rather than
//! a silent close, TLS ClientHellos included: a TLS client that reads
//! `HTTP/1.1 400` where it expected a ServerHello reports a record-format
//! error ("wrong version number" in OpenSSL), which is the usual hint that
//! `https://` was used on a plain HTTP port, and a person probing the port
//! with `openssl s_client` sees an HTTP answer. The cost is one short write.
//!
//! The check is resumable: it remembers where it stopped, so a request line
//! dribbled in byte by byte is looked at once in total. It stops at the end
//! of the version; headers are left to httparse.

/// Where the check of the request line is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Before the request line: empty lines (CR, LF) are skipped (RFC 9112
    /// section 2.2).
    #[default]
    Lead,
    /// In the method token.
    Method,
    /// In the request target.
    Target,
    /// `n` bytes of `HTTP/1.` matched so far.
    Version(u8),
    /// The request line's start is sound; nothing more to check.
    Done,
}

/// A resumable check of the start of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineCheck {
    state: State,
    /// Bytes of the buffer looked at so far.
    pos: usize,
    /// Where the request line starts (after leading empty lines).
    lead: usize,
}

/// `tchar` of RFC 9110 section 5.6.2: the characters a method may hold.
const fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

/// [`is_tchar`] as a table, for the run of a method.
static TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = is_tchar(b as u8);
        b += 1;
    }
    table
};

/// What a request target may hold: visible ASCII, and bytes above 0x7F,
/// which httparse lets through as well.
fn is_target_byte(b: u8) -> bool {
    b > 0x20 && b != 0x7f
}

const VERSION: &[u8] = b"HTTP/1.";

impl LineCheck {
    /// Checks the bytes of `buf` (the current request's bytes, from its
    /// start) not looked at yet. `Err` holds the reason, for `details`.
    pub fn advance(&mut self, buf: &[u8]) -> Result<(), &'static str> {
        while self.pos < buf.len() && self.state != State::Done {
            // Runs of method and target bytes are skipped in a tight loop;
            // the byte that ends a run goes through the state machine.
            let rest = &buf[self.pos..];
            let run = match self.state {
                State::Method => rest.iter().take_while(|&&b| TCHAR[usize::from(b)]).count(),
                State::Target => rest.iter().take_while(|&&b| is_target_byte(b)).count(),
                _ => 0,
            };
            if run > 0 {
                self.pos += run;
                continue;
            }
            let b = buf[self.pos];
            self.state = match self.state {
                State::Lead if b == b'\r' || b == b'\n' => State::Lead,
                State::Lead if TCHAR[usize::from(b)] => {
                    self.lead = self.pos;
                    State::Method
                }
                State::Lead if b == 0x16 && self.pos == 0 => {
                    return Err("a TLS handshake: this port speaks plain HTTP");
                }
                State::Lead => return Err("not an HTTP request"),
                State::Method if b == b' ' => State::Target,
                State::Method => return Err("the method is not a token"),
                State::Target if b == b' ' => State::Version(0),
                State::Target => return Err("invalid byte in the request target"),
                State::Version(n) if usize::from(n) < VERSION.len() => {
                    if b != VERSION[usize::from(n)] {
                        return Err("not an HTTP/1.x request");
                    }
                    State::Version(n + 1)
                }
                State::Version(_) if b == b'0' || b == b'1' => State::Done,
                State::Version(_) => return Err("not an HTTP/1.x request"),
                State::Done => State::Done,
            };
            self.pos += 1;
        }
        Ok(())
    }

    /// Where the request line starts, once it has; `None` while only empty
    /// lines have arrived.
    pub fn line_start(&self) -> Option<usize> {
        (self.state != State::Lead).then_some(self.lead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check fed `bytes` one at a time, as a slow client sends them.
    fn dribbled(bytes: &[u8]) -> Result<LineCheck, &'static str> {
        let mut c = LineCheck::default();
        for end in 1..=bytes.len() {
            c.advance(&bytes[..end])?;
        }
        Ok(c)
    }

    #[test]
    fn request_lines_pass_whole_and_dribbled() {
        for line in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"POST /prompt?x=%20 HTTP/1.0\r\n",
            b"M-SEARCH * HTTP/1.1\r\n",
            b"OPTIONS http://h/p?q=\xc3\xa9 HTTP/1.1\n",
            b"GET / HTTP/1.",
            b"GE",
        ] {
            let mut whole = LineCheck::default();
            assert_eq!(whole.advance(line), Ok(()), "{line:?}");
            assert_eq!(dribbled(line).map(|c| c.state), Ok(whole.state), "{line:?}");
        }
    }

    #[test]
    fn leading_empty_lines_are_skipped_and_remembered() {
        let mut c = LineCheck::default();
        c.advance(b"\r\n\n\r\n").unwrap();
        assert_eq!(c.line_start(), None);
        c.advance(b"\r\n\n\r\nGET / HTTP/1.1\r\n").unwrap();
        assert_eq!(c.line_start(), Some(5));
        assert_eq!(c.state, State::Done);
    }

    #[test]
    fn what_cannot_begin_a_request_is_refused_at_its_first_bad_byte() {
        let cases: [(&[u8], &str); 8] = [
            (b"\x16\x03\x01\x02\x00\x01", "a TLS handshake"),
            (b"\x00\x01\x02", "not an HTTP request"),
            (b"\r\n\x16\x03", "not an HTTP request"),
            (b"G\xffT / HTTP/1.1", "the method is not a token"),
            (b"GET(x) / HTTP/1.1", "the method is not a token"),
            (b"GET /a\x00b HTTP/1.1", "invalid byte"),
            (b"GET /\r\n", "invalid byte"),
            (b"PRI * HTTP/2.0\r\n", "not an HTTP/1.x"),
        ];
        for (bytes, why) in cases {
            let mut c = LineCheck::default();
            let err = c.advance(bytes).unwrap_err();
            assert!(err.starts_with(why), "{bytes:?}: {err}");
            assert_eq!(dribbled(bytes).unwrap_err(), err, "{bytes:?}");
        }
        assert!(LineCheck::default().advance(b"GET / HTTP/1.2").is_err());
        assert!(LineCheck::default().advance(b" GET / HTTP/1.1").is_err());
    }
}
