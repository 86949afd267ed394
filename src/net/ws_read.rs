//! Client frames of a WebSocket, parsed on the server's side (RFC 6455) as
//! bytes arrive, in whatever pieces the socket gives them. Sans-IO: the
//! caller reads, hands the bytes over (they are unmasked in place) and acts
//! on the messages that come back.
//!
//! An idle reader holds no heap memory: its state is the header bytes read
//! so far (at most 14, inline), the current frame's length, mask and
//! opcode, and a box of buffers that exists only while a fragmented text
//! message or a control frame split across reads is in progress, freed
//! when it completes. A frame that arrives whole is handed over from the
//! caller's bytes without a copy; a binary message is counted, not kept
//! (the server refuses it without reading it).

use std::borrow::Cow;

/// Largest client message or frame; client traffic is pongs and the odd
/// control frame, so anything big is abuse (close 1009).
pub const MAX_CLIENT_MESSAGE: usize = 64 * 1024;
/// Largest control frame payload (RFC 6455, section 5.5).
const MAX_CONTROL: usize = 125;
/// Longest frame header: 2 bytes, a 64-bit length, a mask.
const MAX_HEADER: usize = 14;

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// A broken rule: the close code the connection ends with, and its reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Violation(pub u16, pub &'static str);

const PROTOCOL: Violation = Violation(1002, "protocol error");
const TOO_BIG: Violation = Violation(1009, "message too big");
const NOT_UTF8: Violation = Violation(1007, "invalid UTF-8");

/// A complete client message.
#[derive(Debug, PartialEq, Eq)]
pub enum Message<'a> {
    Text(Cow<'a, str>),
    /// A binary message (its bytes are not kept).
    Binary,
    /// A Ping and its payload, for the Pong.
    Ping(Cow<'a, [u8]>),
    Pong,
    /// The peer's Close, and what the reply carries: nothing when the
    /// peer's had no code, its code and reason echoed, or 1002 for a code
    /// that may not be sent on the wire.
    Close(Option<(u16, Cow<'a, str>)>),
}

/// Where a completed frame's payload is.
enum Payload {
    /// In the caller's bytes, at this range.
    Input(usize, usize),
    /// Gathered across reads.
    Owned(Vec<u8>),
}

/// A data message in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Text,
    Binary,
}

/// The reader's state between reads.
#[derive(Debug, Default)]
pub struct FrameReader {
    /// Header bytes read so far; `head_len` of them.
    head: [u8; MAX_HEADER],
    head_len: u8,
    /// The header is complete: the payload is being read.
    in_payload: bool,
    /// The current frame's FIN/RSV/opcode byte and mask.
    first: u8,
    mask: [u8; 4],
    /// Payload bytes of the current frame read so far, and still to come.
    done: u32,
    remaining: u32,
    /// The data message in progress, and its length so far.
    message: Option<Kind>,
    message_len: u32,
    /// Bytes gathered across reads; none unless a message or a control
    /// frame is partly read.
    gathered: Option<Box<Gathered>>,
}

/// A partly read text message and control frame.
#[derive(Debug, Default)]
struct Gathered {
    /// The text message's bytes, across frames and reads.
    text: Vec<u8>,
    /// A control frame's payload split across reads.
    control: Vec<u8>,
}

impl FrameReader {
    /// No frame is partly read and no message is in progress.
    #[cfg(test)]
    fn is_idle(&self) -> bool {
        self.head_len == 0 && !self.in_payload && self.message.is_none()
    }

    /// Parses `input` (unmasking it in place) until a message completes or
    /// the input runs out: the bytes consumed, and the message or the rule
    /// the peer broke. `Ok(None)` means every byte was consumed.
    pub fn advance<'a>(
        &mut self,
        input: &'a mut [u8],
    ) -> (usize, Result<Option<Message<'a>>, Violation>) {
        let (used, step) = self.step(input);
        let input: &'a [u8] = input;
        let message = match step {
            Ok(Some((op, payload))) => finish(op, payload, input),
            Ok(None) => Ok(None),
            Err(v) => Err(v),
        };
        (used, message)
    }

    /// Consumes bytes up to the end of a frame that completes a message or
    /// is a control frame: its opcode (the message's, for a continuation)
    /// and where its payload is.
    fn step(&mut self, input: &mut [u8]) -> (usize, Result<Option<(u8, Payload)>, Violation>) {
        let mut pos = 0;
        loop {
            if !self.in_payload {
                let (used, header) = self.read_header(input.get(pos..).unwrap_or_default());
                pos += used;
                match header {
                    Err(v) => return (pos, Err(v)),
                    Ok(false) => return (pos, Ok(None)),
                    Ok(true) => {}
                }
            }
            let rest = input.get_mut(pos..).unwrap_or_default();
            let take = rest.len().min(self.remaining as usize);
            let start = pos;
            let (chunk, _) = rest.split_at_mut(take);
            let offset = self.done as usize;
            for (i, b) in chunk.iter_mut().enumerate() {
                *b ^= self.mask[(offset + i) & 3];
            }
            let whole = offset == 0 && take == self.remaining as usize;
            let op = self.first & 0x0f;
            let fin = self.first & 0x80 != 0;
            let control = op >= OP_CLOSE;
            // A whole frame that is a whole message (or a control frame)
            // is handed over in place; anything else is gathered.
            let direct = whole && (control || (op != OP_CONTINUATION && fin));
            if !direct && !chunk.is_empty() {
                if control {
                    self.gathered().control.extend_from_slice(chunk);
                } else if self.message == Some(Kind::Text) {
                    self.gathered().text.extend_from_slice(chunk);
                }
            }
            pos += take;
            self.done += take as u32;
            self.remaining -= take as u32;
            if self.remaining > 0 {
                return (pos, Ok(None));
            }
            self.in_payload = false;
            let payload = if direct {
                Payload::Input(start, pos)
            } else if control {
                Payload::Owned(self.take_gathered(true))
            } else if fin && self.message == Some(Kind::Text) {
                Payload::Owned(self.take_gathered(false))
            } else {
                Payload::Owned(Vec::new())
            };
            if control {
                return (pos, Ok(Some((op, payload))));
            }
            if fin {
                let op = match self.message.take() {
                    Some(Kind::Text) => OP_TEXT,
                    _ => OP_BINARY,
                };
                self.message_len = 0;
                return (pos, Ok(Some((op, payload))));
            }
            if pos >= input.len() {
                return (pos, Ok(None));
            }
        }
    }

    fn gathered(&mut self) -> &mut Gathered {
        self.gathered.get_or_insert_with(Box::default)
    }

    /// The gathered control payload (or text), and the room freed when
    /// nothing else is gathered.
    fn take_gathered(&mut self, control: bool) -> Vec<u8> {
        let Some(g) = self.gathered.as_mut() else {
            return Vec::new();
        };
        let bytes = std::mem::take(if control { &mut g.control } else { &mut g.text });
        if g.text.capacity() == 0 && g.control.capacity() == 0 {
            self.gathered = None;
        }
        bytes
    }

    /// Reads header bytes from `input`: the bytes consumed, and whether the
    /// header is complete (then the frame's payload comes next).
    fn read_header(&mut self, input: &[u8]) -> (usize, Result<bool, Violation>) {
        let mut pos = 0;
        loop {
            let have = usize::from(self.head_len);
            let need = if have < 2 { 2 } else { self.header_len() };
            let take = (need - have).min(input.len() - pos);
            if let (Some(dst), Some(src)) = (
                self.head.get_mut(have..have + take),
                input.get(pos..pos + take),
            ) {
                dst.copy_from_slice(src);
            }
            pos += take;
            let have = have + take;
            self.head_len = have as u8;
            if have < need {
                return (pos, Ok(false));
            }
            if need == 2 {
                if let Err(v) = self.check_start() {
                    return (pos, Err(v));
                }
                continue;
            }
            return (pos, self.begin_payload().map(|()| true));
        }
    }

    /// The header's length, known from its first two bytes (client frames
    /// are always masked).
    fn header_len(&self) -> usize {
        let length = match self.head[1] & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        2 + length + 4
    }

    /// Checks the first two header bytes.
    fn check_start(&self) -> Result<(), Violation> {
        let (b0, b1) = (self.head[0], self.head[1]);
        if b0 & 0x70 != 0 || b1 & 0x80 == 0 {
            // Reserved bits without an extension; an unmasked client frame.
            return Err(PROTOCOL);
        }
        let fin = b0 & 0x80 != 0;
        match b0 & 0x0f {
            OP_CONTINUATION if self.message.is_some() => Ok(()),
            OP_TEXT | OP_BINARY if self.message.is_none() => Ok(()),
            OP_CLOSE | OP_PING | OP_PONG if fin && usize::from(b1 & 0x7f) <= MAX_CONTROL => Ok(()),
            _ => Err(PROTOCOL),
        }
    }

    /// The header is complete: checks the length and starts the payload.
    fn begin_payload(&mut self) -> Result<(), Violation> {
        let h = self.head;
        let (length, mask) = match h[1] & 0x7f {
            126 => (
                u64::from(u16::from_be_bytes([h[2], h[3]])),
                [h[4], h[5], h[6], h[7]],
            ),
            127 => (
                u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]),
                [h[10], h[11], h[12], h[13]],
            ),
            n => (u64::from(n), [h[2], h[3], h[4], h[5]]),
        };
        if length >> 63 != 0 {
            return Err(PROTOCOL);
        }
        if length > MAX_CLIENT_MESSAGE as u64 {
            return Err(TOO_BIG);
        }
        let length = length as u32;
        let op = h[0] & 0x0f;
        if op < OP_CLOSE {
            let total = u64::from(self.message_len) + u64::from(length);
            if total > MAX_CLIENT_MESSAGE as u64 {
                return Err(TOO_BIG);
            }
            self.message_len = total as u32;
            match op {
                OP_TEXT => self.message = Some(Kind::Text),
                OP_BINARY => self.message = Some(Kind::Binary),
                _ => {}
            }
        }
        self.first = h[0];
        self.mask = mask;
        self.done = 0;
        self.remaining = length;
        self.head_len = 0;
        self.in_payload = true;
        Ok(())
    }
}

/// A completed frame `op` with `payload` as a message.
fn finish(op: u8, payload: Payload, input: &[u8]) -> Result<Option<Message<'_>>, Violation> {
    let bytes = match payload {
        Payload::Input(a, b) => Cow::Borrowed(input.get(a..b).unwrap_or_default()),
        Payload::Owned(v) => Cow::Owned(v),
    };
    Ok(Some(match op {
        OP_TEXT => Message::Text(utf8(bytes)?),
        OP_BINARY => Message::Binary,
        OP_PING => Message::Ping(bytes),
        OP_PONG => Message::Pong,
        _ => Message::Close(close_reply(bytes)?),
    }))
}

fn utf8(bytes: Cow<'_, [u8]>) -> Result<Cow<'_, str>, Violation> {
    match bytes {
        Cow::Borrowed(b) => std::str::from_utf8(b).map(Cow::Borrowed),
        Cow::Owned(v) => String::from_utf8(v)
            .map(Cow::Owned)
            .map_err(|e| e.utf8_error()),
    }
    .map_err(|_| NOT_UTF8)
}

/// The reply to a Close with `payload`: none for an empty one, the code and
/// reason echoed, or 1002 for a code that may not be sent.
fn close_reply(payload: Cow<'_, [u8]>) -> Result<Option<(u16, Cow<'_, str>)>, Violation> {
    let code = match payload.get(..2) {
        None if payload.is_empty() => return Ok(None),
        None => return Err(PROTOCOL),
        Some(c) => u16::from_be_bytes([c[0], c[1]]),
    };
    let reason = match payload {
        Cow::Borrowed(b) => utf8(Cow::Borrowed(b.get(2..).unwrap_or_default()))?,
        Cow::Owned(v) => utf8(Cow::Owned(v.get(2..).unwrap_or_default().to_vec()))?,
    };
    if sendable(code) {
        Ok(Some((code, reason)))
    } else {
        Ok(Some((1002, Cow::Borrowed("Protocol violation"))))
    }
}

/// Close codes a peer may send on the wire (RFC 6455, section 7.4).
fn sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1013 | 3000..=4999)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    /// A masked client frame; `first` is the FIN/RSV/opcode byte.
    fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![first];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n if n <= 0xffff => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&MASK);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
        out
    }

    /// What a message came to, owned.
    #[derive(Debug, PartialEq, Eq)]
    enum Got {
        Text(String),
        Binary,
        Ping(Vec<u8>),
        Pong,
        Close(Option<(u16, String)>),
        Broke(u16),
    }

    /// Feeds `bytes` in pieces of `piece` bytes; every message and the
    /// violation, if any (parsing stops there).
    fn feed(r: &mut FrameReader, bytes: &[u8], piece: usize) -> Vec<Got> {
        let mut got = Vec::new();
        for chunk in bytes.chunks(piece.max(1)) {
            let mut chunk = chunk.to_vec();
            let mut pos = 0;
            while pos < chunk.len() {
                let (used, m) = r.advance(&mut chunk[pos..]);
                assert!(used > 0, "no progress");
                pos += used;
                match m {
                    Ok(None) => assert_eq!(pos, chunk.len()),
                    Ok(Some(m)) => got.push(match m {
                        Message::Text(t) => Got::Text(t.into_owned()),
                        Message::Binary => Got::Binary,
                        Message::Ping(p) => Got::Ping(p.into_owned()),
                        Message::Pong => Got::Pong,
                        Message::Close(c) => Got::Close(c.map(|(c, r)| (c, r.into_owned()))),
                    }),
                    Err(Violation(code, _)) => {
                        got.push(Got::Broke(code));
                        return got;
                    }
                }
            }
        }
        got
    }

    fn all_pieces(bytes: &[u8], want: &[Got]) {
        for piece in 1..=bytes.len() {
            let mut r = FrameReader::default();
            assert_eq!(feed(&mut r, bytes, piece), want, "pieces of {piece}");
        }
    }

    fn broke(bytes: &[u8], code: u16) {
        let got = feed(&mut FrameReader::default(), bytes, usize::MAX);
        assert_eq!(got.last(), Some(&Got::Broke(code)), "{got:?}");
    }

    #[test]
    fn a_text_frame_split_at_every_byte() {
        let bytes = frame(0x81, br#"{"type":"pong","ts":1}"#);
        all_pieces(&bytes, &[Got::Text(r#"{"type":"pong","ts":1}"#.into())]);
    }

    #[test]
    fn headers_of_every_length_split_at_every_byte() {
        for n in [0, 1, 125, 126, 300, 65_535, 65_536] {
            let payload: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            let bytes = frame(0x81, &payload);
            let want = [Got::Text(String::from_utf8(payload).unwrap())];
            for piece in [1, 2, 3, 5, 7, 13, 14, 15, 1000, usize::MAX] {
                let mut r = FrameReader::default();
                assert_eq!(
                    feed(&mut r, &bytes, piece),
                    want,
                    "{n} in pieces of {piece}"
                );
                assert!(r.is_idle());
                assert!(r.gathered.is_none());
            }
        }
    }

    #[test]
    fn a_64_bit_length_for_a_short_frame_is_accepted() {
        let mut bytes = vec![0x81, 0x80 | 127];
        bytes.extend_from_slice(&3u64.to_be_bytes());
        bytes.extend_from_slice(&MASK);
        bytes.extend(b"abc".iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
        all_pieces(&bytes, &[Got::Text("abc".into())]);
    }

    #[test]
    fn fragments_with_control_frames_between_them() {
        let mut bytes = frame(0x01, b"{\"type\":");
        bytes.extend(frame(0x89, b"hi"));
        bytes.extend(frame(0x00, b"\"pong\""));
        bytes.extend(frame(0x8A, b""));
        bytes.extend(frame(0x00, b""));
        bytes.extend(frame(0x80, b"}"));
        bytes.extend(frame(0x82, &[0, 1, 2]));
        bytes.extend(frame(0x02, &[0; 10]));
        bytes.extend(frame(0x80, &[0; 10]));
        bytes.extend(frame(0x88, &[0x03, 0xe8, b'o', b'k']));
        all_pieces(
            &bytes,
            &[
                Got::Ping(b"hi".to_vec()),
                Got::Pong,
                Got::Text(r#"{"type":"pong"}"#.into()),
                Got::Binary,
                Got::Binary,
                Got::Close(Some((1000, "ok".into()))),
            ],
        );
    }

    #[test]
    fn buffers_are_freed_once_a_message_completes() {
        let mut r = FrameReader::default();
        let mut bytes = frame(0x01, b"ab");
        bytes.extend(frame(0x89, b"split ping"));
        feed(&mut r, &bytes[..bytes.len() - 3], usize::MAX);
        assert!(!r.is_idle());
        let g = r.gathered.as_ref().expect("gathered bytes");
        assert!(g.text.capacity() > 0 && g.control.capacity() > 0);
        let mut rest = bytes[bytes.len() - 3..].to_vec();
        rest.extend(frame(0x80, b"c"));
        let got = feed(&mut r, &rest, usize::MAX);
        assert_eq!(
            got,
            [Got::Ping(b"split ping".to_vec()), Got::Text("abc".into())]
        );
        assert!(r.is_idle());
        assert!(r.gathered.is_none());
    }

    #[test]
    fn close_replies() {
        let close = |p: &[u8]| feed(&mut FrameReader::default(), &frame(0x88, p), usize::MAX);
        assert_eq!(close(b""), [Got::Close(None)]);
        assert_eq!(
            close(&[0x0f, 0xa0]),
            [Got::Close(Some((4000, String::new())))]
        );
        for code in [0u16, 999, 1004, 1005, 1006, 1014, 1015, 2999, 5000] {
            let got = close(&code.to_be_bytes());
            let want = [Got::Close(Some((1002, "Protocol violation".into())))];
            assert_eq!(got, want, "{code}");
        }
        assert_eq!(close(&[0x03]), [Got::Broke(1002)]);
        assert_eq!(close(&[0x03, 0xe8, 0xff]), [Got::Broke(1007)]);
    }

    #[test]
    fn violations_and_their_codes() {
        let unmasked = [0x81, 0x02, b'{', b'}'];
        broke(&unmasked, 1002);
        broke(&frame(0x81 | 0x40, b"{}"), 1002);
        broke(&frame(0x81 | 0x20, b"{}"), 1002);
        broke(&frame(0x81 | 0x10, b"{}"), 1002);
        for op in [0x3, 0x7, 0xB, 0xF] {
            broke(&frame(0x80 | op, b"{}"), 1002);
        }
        broke(&frame(0x09, b"hi"), 1002); // fragmented control
        broke(&frame(0x89, &[0; 126]), 1002); // control above 125
        broke(&frame(0x80, b"{}"), 1002); // continuation first
        let mut two_starts = frame(0x01, b"a");
        two_starts.extend(frame(0x81, b"b"));
        broke(&two_starts, 1002);
        broke(&frame(0x81, b"\xff\xfe"), 1007);
        let mut split_utf8 = frame(0x01, &[0xc3]);
        split_utf8.extend(frame(0x80, &[0xa9]));
        all_pieces(&split_utf8, &[Got::Text("é".into())]);
        let mut bad_utf8 = frame(0x01, &[0xc3]);
        bad_utf8.extend(frame(0x80, &[0x41]));
        broke(&bad_utf8, 1007);
    }

    #[test]
    fn limits_are_checked_on_the_announced_length() {
        broke(
            &frame(0x81, &vec![b'x'; MAX_CLIENT_MESSAGE + 1])[..14],
            1009,
        );
        broke(&frame(0x82, &vec![0; MAX_CLIENT_MESSAGE + 1])[..14], 1009);
        let mut top_bit = vec![0x81, 0x80 | 127];
        top_bit.extend_from_slice(&(1u64 << 63 | 5).to_be_bytes());
        top_bit.extend_from_slice(&MASK);
        broke(&top_bit, 1002);
        let mut huge = vec![0x81, 0x80 | 127];
        huge.extend_from_slice(&u64::MAX.wrapping_shr(1).to_be_bytes());
        huge.extend_from_slice(&MASK);
        broke(&huge, 1009);
        // Exactly the limit is accepted, one byte more over fragments is not.
        let whole = frame(0x82, &vec![0; MAX_CLIENT_MESSAGE]);
        assert_eq!(
            feed(&mut FrameReader::default(), &whole, 4096),
            [Got::Binary]
        );
        let mut fragments = frame(0x01, &vec![b'x'; MAX_CLIENT_MESSAGE]);
        fragments.extend(&frame(0x80, b"y")[..6]);
        broke(&fragments, 1009);
    }

    /// Random streams (frames with random headers, and random bytes) give
    /// the same messages and the same violation however they are cut.
    #[test]
    fn any_cut_of_any_stream_reads_the_same() {
        let mut state = 0x2545_f491_u32;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        for _ in 0..2000 {
            let mut bytes = Vec::new();
            for _ in 0..1 + next() % 6 {
                let r = next();
                let first =
                    [0x81, 0x01, 0x80, 0x00, 0x82, 0x89, 0x8A, 0x88, r as u8][r as usize % 9];
                let len = [0, 1, 2, 5, 125, 126, 300][(r >> 8) as usize % 7];
                let payload: Vec<u8> = (0..len).map(|_| b' ' + (next() % 90) as u8).collect();
                bytes.extend(frame(first, &payload));
                if r >> 20 & 15 == 0 {
                    bytes.extend((0..next() % 20).map(|_| next() as u8));
                }
            }
            let whole = feed(&mut FrameReader::default(), &bytes, usize::MAX);
            let piece = 1 + next() as usize % 40;
            let cut = feed(&mut FrameReader::default(), &bytes, piece);
            assert_eq!(whole, cut, "pieces of {piece}: {bytes:?}");
        }
    }
}
