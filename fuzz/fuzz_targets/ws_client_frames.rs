//! Client bytes into the server's WebSocket stage (our frame reader under its
//! read policy), through `relay::fuzzing::ws_client_bytes`, which drives it
//! as the loop's `drive_ws` does over an in-memory socket.
//!
//! Input layout: byte 0 holds flags (bit 0: the stream ends after the last
//! chunk; bit 1: build frames from descriptions instead of taking raw bytes;
//! bits 2-3: how the stream is cut into reads), byte 1 how many bytes came
//! with the upgrade request (leftover), byte 2 a seed for the cuts.
//!
//! Asserts: no panic; the output queue after one read turn stays bounded by
//! the per-turn message budget; the server's bytes are well-formed unmasked
//! frames (error texts, pongs, at most one Close, nothing after it); a Close
//! the server decides on carries 1002, 1007 or 1009, and a reply to the
//! client's Close carries no code, 1000/1002, or echoes a code a peer may send.
#![no_main]

use libfuzzer_sys::fuzz_target;
use relay::fuzzing::ws_client_bytes;

/// `MAX_MESSAGES_PER_TURN` in `net/ws.rs`.
const MESSAGES_PER_TURN: usize = 64;
/// Largest reply to one client message: an error frame (short fixed texts
/// and serde's messages) or a Pong echoing at most 125 bytes.
const MAX_REPLY: usize = 512;
/// Every reply of a turn, and a Close (with room to spare).
const MAX_QUEUED_PER_TURN: usize = MESSAGES_PER_TURN * MAX_REPLY + 2 * 256;

/// Payloads that reach the JSON handling and close-frame parsing quickly.
const CANNED: &[&[u8]] = &[
    br#"{"type":"pong","ts":1}"#,
    br#"{"type":"pong","ts":-1}"#,
    br#"{"type":"pong"}"#,
    br#"{"type":"ping"}"#,
    br#"{"type":1}"#,
    b"not json",
    b"\xff\xfe",
    b"\x03\xe8",     // close 1000
    b"\x0f\xa0bye",  // close 4000
    b"\x03\xe7",     // close 999 (not allowed)
    b"\x03\xed",     // close 1005 (not allowed on the wire)
    b"\x03\xe8\xff", // close 1000, invalid UTF-8 reason
    b"\x03",         // one-byte close payload
];

/// Reads fuzz bytes; zeros once they run out.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.data.split_at(n.min(self.data.len()));
        self.data = b;
        a
    }
}

/// Client frames from descriptions: per frame a header byte (FIN, RSV,
/// opcode), a control byte (mask or not, length encoding, canned payload or
/// not), a payload length, then mask key and payload bytes.
fn build_frames(inp: &mut Input) -> Vec<u8> {
    let mut out = Vec::new();
    while !inp.data.is_empty() && out.len() < 64 * 1024 {
        let hdr = inp.byte();
        let ctl = inp.byte();
        let payload: Vec<u8> = if ctl & 0x10 != 0 {
            CANNED[inp.byte() as usize % CANNED.len()].to_vec()
        } else if ctl & 0x20 != 0 {
            // A long payload near the 64 KiB message cap.
            let n = 65_530 + usize::from(inp.byte() % 12);
            vec![b'a'; n]
        } else {
            let n = inp.byte() as usize;
            inp.take(n).to_vec()
        };
        out.push(hdr);
        let mask_bit = if ctl & 1 == 0 { 0x80 } else { 0 };
        let n = payload.len();
        match (ctl >> 1) & 3 {
            _ if n > 0xffff => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
            0 | 1 if n < 126 => out.push(mask_bit | n as u8),
            2 => {
                out.push(mask_bit | 127); // non-minimal 64-bit length
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
            _ => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        let key = [inp.byte(), inp.byte(), inp.byte(), inp.byte()];
        if mask_bit != 0 {
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        } else {
            out.extend_from_slice(&payload);
        }
    }
    out
}

/// Cuts `stream` into reads: one piece, single bytes, or seeded pieces.
fn cut(stream: &[u8], mode: u8, seed: u8) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x100;
    let mut pieces = Vec::new();
    let mut rest = stream;
    while !rest.is_empty() {
        let n = match mode {
            0 => rest.len(),
            1 => 1,
            _ => {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                1 + state as usize % if mode == 2 { 8 } else { 700 }
            }
        };
        let (a, b) = rest.split_at(n.min(rest.len()));
        pieces.push(a);
        rest = b;
    }
    pieces
}

/// Close codes a peer may send, which the server echoes in its reply.
fn sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1013 | 3000..=4999)
}

/// Walks the server's output frame by frame.
fn check_output(out: &[u8], peer_closed: bool, server_close: Option<u16>) {
    let mut rest = out;
    let mut closes = 0;
    while !rest.is_empty() {
        assert_eq!(closes, 0, "bytes after the Close frame");
        assert!(rest.len() >= 2, "truncated frame header");
        let (b0, b1) = (rest[0], rest[1]);
        assert_eq!(b0 & 0xf0, 0x80, "FIN unset or RSV set: {b0:#x}");
        assert_eq!(b1 & 0x80, 0, "server frame is masked");
        let hl = match b1 & 0x7f {
            126 => 4,
            127 => 10,
            _ => 2,
        };
        assert!(rest.len() >= hl, "truncated frame length");
        let len = match b1 & 0x7f {
            126 => u16::from_be_bytes([rest[2], rest[3]]) as usize,
            127 => u64::from_be_bytes(rest[2..10].try_into().unwrap()) as usize,
            n => n as usize,
        };
        assert!(rest.len() >= hl + len, "truncated frame payload");
        let payload = &rest[hl..hl + len];
        match b0 & 0x0f {
            0x1 => {
                let v: serde_json::Value = serde_json::from_slice(payload)
                    .unwrap_or_else(|e| panic!("text frame is not JSON: {e}"));
                assert_eq!(v["type"], "error", "unexpected text frame {v}");
                assert!(v["error"].is_string());
            }
            0xa => assert!(len <= 125, "pong payload above 125"),
            0x8 => {
                closes += 1;
                assert!(len != 1, "one-byte close payload");
                if len >= 2 {
                    let code = u16::from_be_bytes([payload[0], payload[1]]);
                    let ok = match server_close {
                        Some(c) => code == c && matches!(c, 1002 | 1007 | 1009),
                        None => peer_closed && (code == 1000 || code == 1002 || sendable(code)),
                    };
                    assert!(ok, "close code {code} (server_close {server_close:?})");
                    assert!(std::str::from_utf8(&payload[2..]).is_ok());
                }
            }
            op => panic!("unexpected server opcode {op:#x}"),
        }
        rest = &rest[hl + len..];
    }
    if let Some(c) = server_close {
        assert_eq!(closes, 1, "server close {c} not in the output");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input { data };
    let flags = inp.byte();
    let leftover_len = inp.byte() as usize;
    let seed = inp.byte();
    let stream: Vec<u8> = if flags & 2 != 0 {
        build_frames(&mut inp)
    } else {
        inp.data.to_vec()
    };
    let (leftover, rest) = stream.split_at(leftover_len.min(stream.len()));
    let chunks = cut(rest, (flags >> 2) & 3, seed);
    let run = ws_client_bytes(leftover, &chunks, flags & 1 != 0);
    assert!(
        run.max_queued <= MAX_QUEUED_PER_TURN,
        "{} bytes queued in one turn",
        run.max_queued
    );
    if let Some(code) = run.close {
        assert!(
            matches!(code, 1002 | 1007 | 1009),
            "server closed with {code}"
        );
    }
    check_output(&run.output, run.peer_closed, run.close);
});
