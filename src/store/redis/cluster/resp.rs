//! The RESP frames the router passes on, read without decoding them:
//! where a frame ends in a node's bytes (resumable across reads) and where
//! a command's first arguments lie, so commands and replies go through
//! whole and are routed by their name and key.

/// The next frame's boundary, resumable: `at` bytes are whole elements,
/// `need` elements are still to come.
#[derive(Clone, Copy, Default)]
pub(super) struct Scan {
    at: usize,
    need: u64,
}

/// Finds where the RESP frame at the start of `b` ends, resuming `s`:
/// `Ok(Some(len))`, `Ok(None)` (more bytes needed), or not RESP.
pub(super) fn scan(b: &[u8], s: &mut Scan) -> Result<Option<usize>, &'static str> {
    if s.need == 0 {
        *s = Scan { at: 0, need: 1 };
    }
    while s.need > 0 {
        let Some(&t) = b.get(s.at) else {
            return Ok(None);
        };
        let Some(nl) = b[s.at..].iter().position(|&c| c == b'\n') else {
            return Ok(None);
        };
        let eol = s.at + nl;
        if nl < 2 || b[eol - 1] != b'\r' {
            return Err("not RESP");
        }
        let line = &b[s.at + 1..eol - 1];
        let mut next = eol + 1;
        match t {
            b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => {}
            b'$' | b'=' | b'!' => {
                let n = int(line)?;
                if n >= 0 {
                    let end = next + n as usize;
                    if b.len() < end + 2 {
                        return Ok(None);
                    }
                    if &b[end..end + 2] != b"\r\n" {
                        return Err("not RESP");
                    }
                    next = end + 2;
                }
            }
            b'*' | b'~' | b'>' | b'%' => {
                let n = int(line)?.max(0) as u64 * if t == b'%' { 2 } else { 1 };
                if n > 1 << 24 {
                    return Err("array too long");
                }
                s.need += n;
            }
            _ => return Err("not RESP"),
        }
        s.need -= 1;
        s.at = next;
    }
    let len = s.at;
    *s = Scan::default();
    Ok(Some(len))
}

pub(super) fn int(line: &[u8]) -> Result<i64, &'static str> {
    let (neg, digits) = match line.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return Err("not a number");
    }
    let n = digits
        .iter()
        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    Ok(if neg { -n } else { n })
}

/// Where the first four arguments of a command lie in it.
pub(super) type Args = [(usize, usize); 4];

/// The first four arguments of a command (a RESP array of bulk strings) at
/// the start of `b`, as ranges, with its length and argument count.
pub(super) fn args(b: &[u8]) -> Option<(usize, usize, Args)> {
    let nl = b.iter().position(|&c| c == b'\n')?;
    if b.first() != Some(&b'*') || nl < 2 {
        return None;
    }
    let count = usize::try_from(int(&b[1..nl - 1]).ok()?).ok()?;
    let mut at = nl + 1;
    let mut out: Args = [(0, 0); 4];
    for i in 0..count {
        let nl = b[at..].iter().position(|&c| c == b'\n')? + at;
        if b.get(at) != Some(&b'$') || nl < at + 2 {
            return None;
        }
        let n = usize::try_from(int(&b[at + 1..nl - 1]).ok()?).ok()?;
        let start = nl + 1;
        if b.len() < start + n + 2 {
            return None;
        }
        if let Some(o) = out.get_mut(i) {
            *o = (start, start + n);
        }
        at = start + n + 2;
    }
    Some((at, count, out))
}

pub(super) fn find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// The first element of an array frame, when it is a bulk string.
pub(super) fn first_word(frame: &[u8]) -> Option<&[u8]> {
    let (_, count, a) = args_any(frame)?;
    (count > 0).then(|| &frame[a.0..a.1])
}

fn args_any(frame: &[u8]) -> Option<(usize, usize, (usize, usize))> {
    if frame.first() != Some(&b'*') && frame.first() != Some(&b'>') {
        return None;
    }
    let nl = frame.iter().position(|&c| c == b'\n')?;
    let count = usize::try_from(int(frame.get(1..nl.checked_sub(1)?)?).ok()?).ok()?;
    let at = nl + 1;
    let nl2 = frame[at..].iter().position(|&c| c == b'\n')? + at;
    if frame.get(at) != Some(&b'$') || nl2 < at + 2 {
        return None;
    }
    let n = usize::try_from(int(&frame[at + 1..nl2 - 1]).ok()?).ok()?;
    let start = nl2 + 1;
    (frame.len() >= start + n).then_some((0, count, (start, start + n)))
}
