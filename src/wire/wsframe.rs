//! Server-to-client WebSocket text frames (RFC 6455 section 5.2), built by
//! hand: a server frame is unmasked, so one encoding serves every subscriber
//! and a stored message can keep its frame ready to queue.

/// The frame header for an unmasked, final text frame of `len` payload bytes.
pub fn text_header(len: usize, out: &mut Vec<u8>) {
    out.push(0x81); // FIN + opcode 1 (text)
    if len < 126 {
        out.push(len as u8);
    } else if len <= u16::MAX as usize {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// The length of [`text_header`]'s header for `len` payload bytes.
pub fn header_len(len: usize) -> usize {
    if len < 126 {
        2
    } else if len <= u16::MAX as usize {
        4
    } else {
        10
    }
}

/// One text frame whose payload is `parts` concatenated.
pub fn text_frame(parts: &[&[u8]]) -> Vec<u8> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(len + 10);
    text_header(len, &mut out);
    for p in parts {
        out.extend_from_slice(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(frame: &[u8]) -> (u8, usize, &[u8]) {
        let (len, at) = match frame[1] {
            126 => (u16::from_be_bytes([frame[2], frame[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(frame[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        (frame[0], len, &frame[at..])
    }

    #[test]
    fn every_length_form_round_trips() {
        for len in [0, 1, 125, 126, 127, 65_535, 65_536, 200_000] {
            let payload = vec![b'x'; len];
            let frame = text_frame(&[&payload[..len / 2], &payload[len / 2..]]);
            let (b0, n, rest) = decode(&frame);
            assert_eq!((b0, n, rest.len()), (0x81, len, len), "length {len}");
        }
    }
}
