//! The `metadata` checks that keep a session readable. `metadata` is stored
//! as the raw JSON literal the client sent and echoed verbatim in every
//! fetch, so whatever a common parser cannot read back must be refused at
//! the door: nesting deeper than [`MAX_METADATA_DEPTH`] (serde_json stops at
//! 128 levels of the whole answer, Python at its recursion limit) and
//! numbers that are not finite 64-bit floats (`1e400`: serde_json refuses
//! it, Python reads `inf` and writes back `Infinity`, which is not JSON).

/// Deepest `metadata` accepted; the object itself is level 1.
pub const MAX_METADATA_DEPTH: usize = 32;

/// Why a `metadata` literal is refused, as the `details` text.
pub const TOO_DEEP: &str = "nested deeper than 32 levels (the object itself is level 1)";
pub const NOT_FINITE: &str = "a number does not fit a finite 64-bit float";

/// Checks a `metadata` literal that serde_json has already read as valid
/// JSON (a `RawValue`), without building a value tree: the common request
/// pays one pass over its bytes and no allocation.
///
/// The scan walks the bytes once. Inside a string it only looks for the
/// closing quote, skipping the byte after each backslash (so `\"` and `\\`
/// do not end or open anything). Outside strings, `{` and `[` open a level
/// and `}` and `]` close one; the depth is checked as it grows. A `-` or a
/// digit outside a string starts a number token, read to its end; since the
/// literal is valid JSON (no leading zeros), an integer part of at most 308
/// digits with no exponent is below 1e308 and therefore finite, so only
/// tokens with an exponent or a longer integer part are parsed as `f64` to
/// see whether they overflow to infinity. Letters outside strings (`true`,
/// `false`, `null`) are skipped.
pub fn check(lit: &[u8]) -> Result<(), &'static str> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < lit.len() {
        match lit[i] {
            b'"' => i = string_end(lit, i + 1),
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_METADATA_DEPTH {
                    return Err(TOO_DEEP);
                }
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let end = number_end(lit, i);
                if !finite(&lit[i..end]) {
                    return Err(NOT_FINITE);
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// The index after the closing quote of a string whose body starts at `i`.
fn string_end(lit: &[u8], mut i: usize) -> usize {
    while i < lit.len() {
        match lit[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    lit.len()
}

/// The index after a number token starting at `i`.
fn number_end(lit: &[u8], i: usize) -> usize {
    lit[i..]
        .iter()
        .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        .map_or(lit.len(), |n| i + n)
}

/// Whether a JSON number token is a finite `f64` (underflow to 0 is fine).
fn finite(token: &[u8]) -> bool {
    let digits = token.strip_prefix(b"-").unwrap_or(token);
    let int_digits = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    let has_exponent = digits.iter().any(|b| matches!(b, b'e' | b'E'));
    if !has_exponent && int_digits <= 308 {
        return true;
    }
    std::str::from_utf8(token)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .is_some_and(f64::is_finite)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `depth` nested objects, the innermost holding `inner`.
    fn nested(depth: usize, inner: &str) -> String {
        let mut s = String::new();
        for _ in 0..depth - 1 {
            s.push_str("{\"k\":");
        }
        s.push('{');
        s.push_str(inner);
        s.push('}');
        s.push_str(&"}".repeat(depth - 1));
        s
    }

    #[test]
    fn depth_is_counted_from_the_object_and_arrays_count() {
        assert_eq!(check(nested(32, "").as_bytes()), Ok(()));
        assert_eq!(check(nested(33, "").as_bytes()), Err(TOO_DEEP));
        // 31 objects and one array make 32; a nested array inside makes 33.
        assert_eq!(check(nested(31, "\"a\":[1]").as_bytes()), Ok(()));
        assert_eq!(check(nested(31, "\"a\":[[1]]").as_bytes()), Err(TOO_DEEP));
        // Siblings do not add up: depth falls when a level closes.
        let wide = format!("{{{}}}", vec![r#""a":[[[1]]]"#; 100].join(","));
        assert_eq!(check(wide.as_bytes()), Ok(()));
    }

    #[test]
    fn brackets_and_quotes_inside_strings_do_not_count() {
        let lit = format!(r#"{{"k":"{}","q":"\"[{{\\","n":1}}"#, "[{".repeat(100));
        assert_eq!(check(lit.as_bytes()), Ok(()));
        assert_eq!(check(br#"{"1e400":"1e400 [[[["}"#), Ok(()));
    }

    #[test]
    fn numbers_that_overflow_f64_are_refused() {
        for bad in ["1e400", "-1e400", "1E309", "2e+308", "1.5e308999"] {
            let lit = format!(r#"{{"a":[0,{bad}]}}"#);
            assert_eq!(check(lit.as_bytes()), Err(NOT_FINITE), "{bad}");
        }
        let huge_int = format!(r#"{{"a":{}}}"#, "9".repeat(400));
        assert_eq!(check(huge_int.as_bytes()), Err(NOT_FINITE));
        for ok in [
            "1e308",
            "-1.7e308",
            "1e-400",
            "0.5",
            "-0",
            "12345678901234567890123",
        ] {
            let lit = format!(r#"{{"a":{ok}}}"#);
            assert_eq!(check(lit.as_bytes()), Ok(()), "{ok}");
        }
        // 308 integer digits are below 1e308: finite without parsing.
        let big_int = format!(r#"{{"a":{}.5}}"#, "9".repeat(308));
        assert_eq!(check(big_int.as_bytes()), Ok(()));
    }
}
