//! One pass over the body every `POST /prompt` and `POST /response` sends:
//! a flat JSON object of known keys whose values are strings, integers,
//! `true`, `false` or `null` (`"partial": true` on every part of a
//! streamed answer). It finds each field's raw literal, the slice serde_json's
//! `RawValue` would borrow, without serde's second look at every string
//! (its syntax check, then its UTF-8 check).
//!
//! It accepts only what serde_json accepts, and yields the same slices:
//! anything else (an unknown, escaped or repeated key, a `\u` escape, a
//! control character, a nested value, a float, a number with a leading
//! zero, trailing bytes, a truncated body) makes it give
//! up, and the caller parses the body with serde, which decides and words
//! the error. The body is UTF-8 already (the caller checked it), so the
//! scan only looks for quotes, backslashes and control characters, eight
//! bytes at a time.

use crate::wire::Raw;

/// The raw literal of each key of `keys` in the object `text`, by the
/// key's index (`None` for a key absent or `null`), or `None` to leave the
/// body to serde.
pub fn fields<'a, const N: usize>(text: &'a str, keys: &[&str; N]) -> Option<[Option<Raw<'a>>; N]> {
    let mut out = [None; N];
    scan_object(text, keys, &mut out)?;
    Some(out)
}

/// [`fields`] for any number of keys (one copy of the code, rather than
/// one per number of keys `fields` is called with): `None` to leave the
/// body to serde.
#[inline(never)]
fn scan_object<'a>(text: &'a str, keys: &[&str], out: &mut [Option<Raw<'a>>]) -> Option<()> {
    let b = text.as_bytes();
    // Which keys were seen: a bit each (at most 64 keys).
    let mut seen = 0u64;
    let mut i = ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return (ws(b, i + 1) == b.len()).then_some(());
    }
    loop {
        // A key: a string without escapes, one of `keys`, not seen before.
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let end = special(b, i + 1)?;
        if b.get(end) != Some(&b'"') {
            return None;
        }
        let key = text.get(i + 1..end)?;
        let k = keys.iter().position(|known| *known == key)?;
        if k >= 64 || seen & (1 << k) != 0 {
            return None;
        }
        seen |= 1 << k;
        i = ws(b, end + 1);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = ws(b, i + 1);
        let (value, next) = value(text, i)?;
        *out.get_mut(k)? = value;
        i = ws(b, next);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b'}') => return (ws(b, i + 1) == b.len()).then_some(()),
            _ => return None,
        }
    }
}

/// The value at `i` (`None` for `null`) and where it ends.
fn value(text: &str, i: usize) -> Option<(Option<Raw<'_>>, usize)> {
    let b = text.as_bytes();
    match *b.get(i)? {
        b'"' => {
            let (end, plain) = string_end(b, i)?;
            let lit = text.get(i..=end)?;
            Some((Some(Raw { lit, plain }), end + 1))
        }
        b'n' if b.get(i..i + 4) == Some(b"null") => Some((None, i + 4)),
        b't' if b.get(i..i + 4) == Some(b"true") => Some((
            Some(Raw {
                lit: text.get(i..i + 4)?,
                plain: true,
            }),
            i + 4,
        )),
        b'f' if b.get(i..i + 5) == Some(b"false") => Some((
            Some(Raw {
                lit: text.get(i..i + 5)?,
                plain: true,
            }),
            i + 5,
        )),
        b'0'..=b'9' => {
            let mut end = i;
            while b.get(end).is_some_and(u8::is_ascii_digit) {
                end += 1;
            }
            // A leading zero before more digits is not JSON; a fraction or
            // an exponent is serde's to read.
            if (b[i] == b'0' && end - i > 1) || matches!(b.get(end), Some(b'.' | b'e' | b'E')) {
                return None;
            }
            let lit = text.get(i..end)?;
            Some((Some(Raw { lit, plain: true }), end))
        }
        _ => None,
    }
}

/// The index of the quote that closes the string opened at `i`, if its
/// escapes are all of one character (`\u` is left to serde), and whether
/// it held no escape at all.
fn string_end(b: &[u8], open: usize) -> Option<(usize, bool)> {
    let mut i = open + 1;
    let mut plain = true;
    loop {
        let at = special(b, i)?;
        match b[at] {
            b'"' => return Some((at, plain)),
            b'\\' => match b.get(at + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                    plain = false;
                    i = at + 2;
                }
                _ => return None,
            },
            // A control character, which a JSON string may not hold.
            _ => return None,
        }
    }
}

/// The first index at or after `i` holding a quote, a backslash or a byte
/// below 0x20, if any. Eight bytes at a time: in each word, a byte equal
/// to the quote or the backslash becomes zero once XORed with it, and
/// `(x - 0x01..) & !x & 0x80..` flags the bytes of `x` below 1 (below
/// 0x20 with `0x20..`). A flag can be wrong only above a right one in the
/// same word (a borrow carries upwards), so the lowest flag is a match.
fn special(b: &[u8], i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let rest = b.get(i..)?;
    let (words, tail) = rest.as_chunks::<8>();
    for (n, bytes) in words.iter().enumerate() {
        let w = u64::from_le_bytes(*bytes);
        let quote = w ^ (ONES * u64::from(b'"'));
        let slash = w ^ (ONES * u64::from(b'\\'));
        let found = ((quote.wrapping_sub(ONES) & !quote)
            | (slash.wrapping_sub(ONES) & !slash)
            | (w.wrapping_sub(ONES * 0x20) & !w))
            & HIGH;
        if found != 0 {
            return Some(i + n * 8 + (found.trailing_zeros() / 8) as usize);
        }
    }
    let done = i + words.len() * 8;
    tail.iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|p| done + p)
}

/// Past the JSON whitespace at `i`.
fn ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: [&str; 3] = ["a", "b", "c"];

    /// The literals found, without how.
    fn lits<'a>(text: &'a str, keys: &[&str; 3]) -> Option<[Option<&'a str>; 3]> {
        fields(text, keys).map(|f| f.map(|v| v.map(|r| r.get())))
    }

    #[test]
    fn finds_the_literals_of_a_flat_object() {
        let f = lits(r#" { "a" : "x\"y\\z\n" , "c":12,"b":null } "#, &KEYS);
        assert_eq!(f, Some([Some(r#""x\"y\\z\n""#), None, Some("12")]));
        assert_eq!(lits("{}", &KEYS), Some([None, None, None]));
        assert_eq!(
            lits(r#"{"a":"é ☃"}"#, &KEYS),
            Some([Some(r#""é ☃""#), None, None])
        );
        assert_eq!(lits(r#"{"a":0}"#, &KEYS), Some([Some("0"), None, None]));
        // Whether a string held an escape is known.
        let plain = fields(r#"{"a":"x","b":"y\n"}"#, &KEYS).map(|f| f.map(|v| v.map(|r| r.plain)));
        assert_eq!(plain, Some([Some(true), Some(false), None]));
    }

    #[test]
    fn leaves_everything_else_to_serde() {
        for body in [
            "",
            "[]",
            "{",
            r#"{"a":"x"} x"#,
            r#"{"a":"x",}"#,
            r#"{"a":"x""b":"y"}"#,
            r#"{"d":"x"}"#,
            r#"{"\u0061":"x"}"#,
            r#"{"a":"x","a":"y"}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":"\x"}"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":"x"#,
            r#"{"a":01}"#,
            r#"{"a":1.5}"#,
            r#"{"a":1e3}"#,
            r#"{"a":-1}"#,
            r#"{"a":tru}"#,
            r#"{"a":truex}"#,
            r#"{"a":fals}"#,
            r#"{"a":{}}"#,
            r#"{"a":nul}"#,
            r#"{"a":nullx}"#,
        ] {
            assert!(fields(body, &KEYS).is_none(), "{body}");
        }
    }

    #[test]
    fn finds_specials_at_every_offset() {
        for len in 0..40 {
            for at in 0..len {
                for c in [b'"', b'\\', 0x00, 0x1f] {
                    let mut b = vec![b'x'; len];
                    b[at] = c;
                    assert_eq!(special(&b, 0), Some(at), "{len} {at} {c}");
                    // Bytes above 0x7f and 0x20 itself are not special.
                    b[at] = if c == 0x1f { 0x20 } else { 0xc3 };
                    assert_eq!(special(&b, 0), None);
                }
            }
        }
    }
}
