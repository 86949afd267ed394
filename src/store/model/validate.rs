//! Each body's validation: a request body read into borrowed raw JSON
//! values first, then each field checked by hand, so every error names its
//! field with the contract's text. The one-pass scan ([`scan::fields`])
//! reads the common body; serde reads the rest and words its errors.
//! Accepted texts stay the literals the client sent, borrowed from the body.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    ASK_TIMEOUT_S, GivenId, MAX_CHOICE_BYTES, MAX_CHOICES, MAX_ID_BYTES, MAX_REASON_BYTES,
    MAX_TEXT_BYTES, NewAsk, NewCancel, NewPrompt, NewReply, NewResponse, metadata_check, scan,
};
use crate::error::ApiError;
use crate::store::SessionId;
use crate::time::UnixMillis;
use crate::wire::Raw;

#[derive(Deserialize)]
struct RawPrompt<'a> {
    #[serde(borrow)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow)]
    client_msg_id: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    ts: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawResponse<'a> {
    #[serde(borrow)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow)]
    client_msg_id: Option<&'a RawValue>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    assistant_msg_id: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    ts: Option<&'a RawValue>,
    #[serde(borrow)]
    partial: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawCancel<'a> {
    #[serde(borrow)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow)]
    client_msg_id: Option<&'a RawValue>,
    #[serde(borrow)]
    reason: Option<&'a RawValue>,
}

/// The fields of `keys` found by the one-pass scan ([`scan::fields`]) in
/// the body's `text` (`None` if it is not UTF-8), or `None` for a body it
/// leaves to serde (which then decides and words any error).
fn scanned<'a, const N: usize>(
    text: Option<&'a str>,
    keys: &[&str; N],
    scan_first: bool,
) -> Option<[Option<Raw<'a>>; N]> {
    scan::fields(text.filter(|_| scan_first)?, keys)
}

/// A serde field as a [`Raw`] (serde reads `null` as absent).
fn raw_of(v: Option<&RawValue>) -> Option<Raw<'_>> {
    v.map(|r| Raw {
        lit: r.get(),
        plain: false,
    })
}

/// Reads a body that must be a JSON object into `T`; `text` is the body
/// as UTF-8, if it is (checked once by the caller, for the scan too).
fn parse_object<'a, T: Deserialize<'a>>(
    body: &'a [u8],
    text: Option<&'a str>,
) -> Result<T, ApiError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        // Serde would accept an array as a struct: tell malformed from non-object.
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Err(e) => ApiError::invalid_json(e.to_string()),
                Ok(_) => ApiError::bad_request("Request body must be a JSON object"),
            },
        );
    }
    // Checked as UTF-8 once, the body's strings and raw values are not
    // checked again one by one. A body that is not UTF-8 gets serde's own
    // error, which says where.
    let Some(text) = text else {
        let e = serde_json::from_slice::<serde::de::IgnoredAny>(body).err();
        return Err(ApiError::invalid_json(
            e.map_or_else(|| "invalid UTF-8".to_string(), |e| e.to_string()),
        ));
    };
    serde_json::from_str::<T>(text).map_err(|e| ApiError::invalid_json(e.to_string()))
}

/// A required field: absent or `null` is missing.
fn required<'a>(v: Option<Raw<'a>>, name: &str) -> Result<Raw<'a>, ApiError> {
    match v {
        Some(raw) if raw.get() != "null" => Ok(raw),
        _ => Err(ApiError::missing_field(name)),
    }
}

/// A string, decoded: borrowed from the body when it holds no escapes.
fn string<'a>(raw: Raw<'a>, name: &str) -> Result<Cow<'a, str>, ApiError> {
    // A string literal without escapes (serde has checked its syntax) is
    // its text in quotes: no decoding needed.
    if let Some(text) = plain_string(raw) {
        return Ok(Cow::Borrowed(text));
    }
    serde_json::from_str::<String>(raw.get())
        .map(Cow::Owned)
        .map_err(|_| ApiError::bad_request(format!("Invalid {name}: must be a string")))
}

/// The text of a string literal that holds no escapes.
fn plain_string(raw: Raw<'_>) -> Option<&str> {
    raw.get()
        .strip_prefix('"')
        .and_then(|l| l.strip_suffix('"'))
        .filter(|text| raw.plain || !text.contains('\\'))
}

fn session_id(raw: Option<Raw>) -> Result<SessionId, ApiError> {
    let raw = required(raw, "session_id")?;
    // A literal without escapes is its text in quotes: the id is built from
    // it with no decoded copy first (a valid id never needs escapes).
    let sid = match plain_string(raw) {
        Some(text) => SessionId::new(text),
        None => SessionId::new(&string(raw, "session_id")?),
    };
    sid.ok_or_else(ApiError::invalid_session_id)
}

/// A string of at most 128 KiB once decoded, kept as its raw literal.
fn text<'a>(raw: Raw<'a>, name: &str) -> Result<Cow<'a, str>, ApiError> {
    let lit = raw.get();
    if !lit.starts_with('"') {
        return Err(ApiError::bad_request(format!(
            "Invalid {name}: must be a string"
        )));
    }
    // serde_json checks a raw literal's syntax but not that its `\u`
    // escapes pair up into characters: a lone surrogate would be stored and
    // echoed as JSON that strict parsers refuse. Decode those literals.
    if !raw.plain && lit.contains("\\u") {
        let decoded = serde_json::from_str::<String>(lit)
            .map_err(|e| ApiError::invalid_json(e.to_string()))?;
        if decoded.len() > MAX_TEXT_BYTES {
            return Err(ApiError::too_large_field());
        }
        return Ok(Cow::Borrowed(lit));
    }
    // Other escapes only shrink a string when decoded: a short literal is
    // in bounds without decoding.
    if lit.len() - 2 > MAX_TEXT_BYTES && string(raw, name)?.len() > MAX_TEXT_BYTES {
        return Err(ApiError::too_large_field());
    }
    Ok(Cow::Borrowed(lit))
}

fn message_id<'a>(raw: Option<Raw<'a>>, name: &str) -> Result<Option<GivenId<'a>>, ApiError> {
    let Some(raw) = raw.filter(|r| r.get() != "null") else {
        return Ok(None);
    };
    let s = string(raw, name)?;
    if s.is_empty() || s.len() > MAX_ID_BYTES {
        return Err(ApiError::bad_request(format!(
            "Invalid {name}: must be 1 to {MAX_ID_BYTES} bytes"
        )));
    }
    Ok(Some((s, Cow::Borrowed(raw.get()))))
}

fn metadata(raw: Option<Raw<'_>>) -> Result<Option<Cow<'_, str>>, ApiError> {
    match raw {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) if r.get().starts_with('{') => {
            // Depth and numbers first, by a byte scan: no value tree is built
            // for a deep literal, and the common request allocates nothing.
            metadata_check::check(r.get().as_bytes()).map_err(ApiError::invalid_metadata)?;
            // As for texts: `\u` escapes must form characters (see `text`).
            if r.get().contains("\\u") {
                serde_json::from_str::<serde_json::Value>(r.get())
                    .map_err(|e| ApiError::invalid_json(e.to_string()))?;
            }
            Ok(Some(Cow::Borrowed(r.get())))
        }
        Some(_) => Err(ApiError::bad_request("Invalid metadata: must be an object")),
    }
}

/// `partial`: a boolean when present (`null` means absent).
fn partial(raw: Option<Raw>) -> Result<bool, ApiError> {
    match raw.map(|r| r.get()) {
        None | Some("null" | "false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(ApiError::bad_request("Invalid partial: must be a boolean")),
    }
}

/// A cancel's `reason`: a string of at most [`MAX_REASON_BYTES`] once
/// decoded (`null` means absent), kept as its raw literal. Decoded once
/// whatever its escapes, so a lone surrogate is refused as in `text`.
fn reason(raw: Option<Raw<'_>>) -> Result<Option<Cow<'_, str>>, ApiError> {
    let Some(raw) = raw.filter(|r| r.get() != "null") else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::bad_request(format!(
            "Invalid reason: must be a string of at most {MAX_REASON_BYTES} bytes"
        ))
    };
    if !raw.get().starts_with('"') {
        return Err(invalid());
    }
    if string(raw, "reason").map_err(|_| invalid())?.len() > MAX_REASON_BYTES {
        return Err(invalid());
    }
    Ok(Some(Cow::Borrowed(raw.get())))
}

fn ts(raw: Option<Raw>) -> Result<Option<UnixMillis>, ApiError> {
    match raw {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) => serde_json::from_str::<u64>(r.get()).map(Some).map_err(|_| {
            ApiError::bad_request("Invalid ts: must be a non-negative integer (milliseconds)")
        }),
    }
}

impl<'a> NewPrompt<'a> {
    /// Validates a `POST /prompt` body; the first failing field decides the error.
    pub fn parse(body: &'a [u8]) -> Result<NewPrompt<'a>, ApiError> {
        Self::parse_by(body, true)
    }

    /// [`NewPrompt::parse`], with the one-pass scan tried first or not
    /// (the tests compare the two).
    fn parse_by(body: &'a [u8], scan_first: bool) -> Result<NewPrompt<'a>, ApiError> {
        const KEYS: [&str; 5] = ["session_id", "prompt", "client_msg_id", "metadata", "ts"];
        let utf8 = std::str::from_utf8(body).ok();
        let [sid, prompt, cid, meta, at] = match scanned(utf8, &KEYS, scan_first) {
            Some(fields) => fields,
            None => {
                let raw: RawPrompt = parse_object(body, utf8)?;
                [
                    raw.session_id,
                    raw.prompt,
                    raw.client_msg_id,
                    raw.metadata,
                    raw.ts,
                ]
                .map(raw_of)
            }
        };
        Ok(NewPrompt {
            session_id: session_id(sid)?,
            prompt: text(required(prompt, "prompt")?, "prompt")?,
            client_msg_id: message_id(cid, "client_msg_id")?,
            metadata: metadata(meta)?,
            ts: ts(at)?,
        })
    }
}

impl<'a> NewResponse<'a> {
    /// Validates a `POST /response` body; the first failing field decides the error.
    pub fn parse(body: &'a [u8]) -> Result<NewResponse<'a>, ApiError> {
        Self::parse_by(body, true)
    }

    /// [`NewResponse::parse`], with the one-pass scan tried first or not.
    fn parse_by(body: &'a [u8], scan_first: bool) -> Result<NewResponse<'a>, ApiError> {
        const KEYS: [&str; 7] = [
            "session_id",
            "client_msg_id",
            "text",
            "assistant_msg_id",
            "metadata",
            "ts",
            "partial",
        ];
        let utf8 = std::str::from_utf8(body).ok();
        let [sid, cid, body_text, aid, meta, at, part] = match scanned(utf8, &KEYS, scan_first) {
            Some(fields) => fields,
            None => {
                let raw: RawResponse = parse_object(body, utf8)?;
                [
                    raw.session_id,
                    raw.client_msg_id,
                    raw.text,
                    raw.assistant_msg_id,
                    raw.metadata,
                    raw.ts,
                    raw.partial,
                ]
                .map(raw_of)
            }
        };
        let session_id = session_id(sid)?;
        let client_msg_id = message_id(Some(required(cid, "client_msg_id")?), "client_msg_id")?
            .map(|(id, _)| id)
            .unwrap_or_default();
        let text = text(required(body_text, "text")?, "text")?;
        let assistant_msg_id = message_id(aid, "assistant_msg_id")?;
        let partial = partial(part)?;
        if partial && assistant_msg_id.is_none() {
            return Err(ApiError::missing_field("assistant_msg_id"));
        }
        Ok(NewResponse {
            session_id,
            client_msg_id,
            text,
            assistant_msg_id,
            metadata: metadata(meta)?,
            ts: ts(at)?,
            partial,
        })
    }
}

impl<'a> NewCancel<'a> {
    /// Validates a `POST /cancel` body; the first failing field decides
    /// the error. A cancel is rare: serde reads it, without the scan.
    pub fn parse(body: &'a [u8]) -> Result<NewCancel<'a>, ApiError> {
        let utf8 = std::str::from_utf8(body).ok();
        let raw: RawCancel = parse_object(body, utf8)?;
        let [sid, cid, why] = [raw.session_id, raw.client_msg_id, raw.reason].map(raw_of);
        let session_id = session_id(sid)?;
        let client_msg_id = message_id(Some(required(cid, "client_msg_id")?), "client_msg_id")?
            .map(|(id, _)| id)
            .unwrap_or_default();
        Ok(NewCancel {
            session_id,
            client_msg_id,
            reason: reason(why)?,
            ts: None,
        })
    }
}

#[derive(Deserialize)]
struct RawAsk<'a> {
    #[serde(borrow)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    ask_id: Option<&'a RawValue>,
    #[serde(borrow)]
    client_msg_id: Option<&'a RawValue>,
    #[serde(borrow)]
    choices: Option<&'a RawValue>,
    #[serde(borrow)]
    default: Option<&'a RawValue>,
    #[serde(borrow)]
    timeout: Option<&'a RawValue>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawReply<'a> {
    #[serde(borrow)]
    session_id: Option<&'a RawValue>,
    #[serde(borrow)]
    ask_id: Option<&'a RawValue>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
}

/// `choices`: 1 to 8 distinct non-empty strings of at most 256 bytes,
/// decoded (`null` means absent).
fn choices(raw: Option<Raw<'_>>) -> Result<Option<Vec<Cow<'_, str>>>, ApiError> {
    let Some(raw) = raw.filter(|r| r.get() != "null") else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::bad_request("Invalid choices").with_details(format!(
            "1 to {MAX_CHOICES} distinct non-empty strings of at most {MAX_CHOICE_BYTES} bytes"
        ))
    };
    let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|_| invalid())?;
    if items.is_empty() || items.len() > MAX_CHOICES {
        return Err(invalid());
    }
    let mut out: Vec<Cow<'_, str>> = Vec::with_capacity(items.len());
    for item in items {
        let c = string(Raw::new(item.get()), "choices").map_err(|_| invalid())?;
        if c.is_empty() || c.len() > MAX_CHOICE_BYTES || out.contains(&c) {
            return Err(invalid());
        }
        out.push(c);
    }
    Ok(Some(out))
}

/// `timeout`: seconds, 1 to 86400 (fractions allowed), in ms; 300 s when
/// absent.
fn ask_timeout(raw: Option<Raw>) -> Result<u64, ApiError> {
    let (default_s, min_s, max_s) = ASK_TIMEOUT_S;
    let Some(raw) = raw.filter(|r| r.get() != "null") else {
        return Ok(default_s * 1000);
    };
    match serde_json::from_str::<f64>(raw.get()) {
        Ok(s) if s >= min_s as f64 && s <= max_s as f64 => Ok((s * 1000.0).ceil() as u64),
        _ => Err(ApiError::bad_request(format!(
            "Invalid timeout: must be a number of seconds from {min_s} to {max_s}"
        ))),
    }
}

impl<'a> NewAsk<'a> {
    /// Validates a `POST /ask` body; the first failing field decides the
    /// error, and names it.
    pub fn parse(body: &'a [u8]) -> Result<NewAsk<'a>, ApiError> {
        let utf8 = std::str::from_utf8(body).ok();
        let raw: RawAsk = parse_object(body, utf8)?;
        let session_id = session_id(raw_of(raw.session_id))?;
        let question = text(required(raw_of(raw.text), "text")?, "text")?;
        let ask_id = message_id(raw_of(raw.ask_id), "ask_id")?;
        let client_msg_id =
            message_id(raw_of(raw.client_msg_id), "client_msg_id")?.map(|(id, _)| id);
        let choices = choices(raw_of(raw.choices))?;
        let default = match raw_of(raw.default).filter(|r| r.get() != "null") {
            None => None,
            Some(r) => Some(text(r, "default")?),
        };
        if let (Some(choices), Some(d)) = (&choices, &default)
            && !choices.iter().any(|c| **c == *decode(d))
        {
            return Err(
                ApiError::bad_request("Invalid default").with_details("not one of the choices")
            );
        }
        Ok(NewAsk {
            session_id,
            ask_id,
            client_msg_id,
            text: question,
            choices,
            default,
            timeout_ms: ask_timeout(raw_of(raw.timeout))?,
            metadata: metadata(raw_of(raw.metadata))?,
        })
    }
}

impl<'a> NewReply<'a> {
    /// Validates a `POST /reply` body.
    pub fn parse(body: &'a [u8]) -> Result<NewReply<'a>, ApiError> {
        let utf8 = std::str::from_utf8(body).ok();
        let raw: RawReply = parse_object(body, utf8)?;
        let session_id = session_id(raw_of(raw.session_id))?;
        let ask_id = message_id(Some(required(raw_of(raw.ask_id), "ask_id")?), "ask_id")?
            .map(|(id, _)| id)
            .unwrap_or_default();
        let answer = text(required(raw_of(raw.text), "text")?, "text")?;
        Ok(NewReply {
            session_id,
            ask_id,
            text: answer,
        })
    }
}

/// A string literal decoded (borrowed when it holds no escape).
fn decode(lit: &str) -> Cow<'_, str> {
    match lit.strip_prefix('"').and_then(|l| l.strip_suffix('"')) {
        Some(inner) if !inner.contains('\\') => Cow::Borrowed(inner),
        _ => Cow::Owned(crate::wire::decode(lit)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::model::valid_session_id;

    /// The one-pass scan and serde read every body alike: the same fields,
    /// or the same error. Bodies are built from keys and values known,
    /// unknown and malformed, then sometimes cut short or given a wrong
    /// byte.
    #[test]
    fn the_scan_and_serde_read_every_body_alike() {
        const KEYS: [&str; 12] = [
            "session_id",
            "prompt",
            "text",
            "client_msg_id",
            "assistant_msg_id",
            "metadata",
            "ts",
            "x",
            r"prom\u0070t",
            "",
            "session_id ",
            "Prompt",
        ];
        const VALUES: [&str; 33] = [
            r#""s-1""#,
            r#""a.b_c~""#,
            r#""bad id""#,
            r#""""#,
            r#""hello""#,
            r#""line\nbreak""#,
            r#""q\"uote""#,
            r#""back\\slash""#,
            r#""sl\/ash\b\f\r\t""#,
            r#""\u0041""#,
            r#""\ud800""#,
            r#""bad\x""#,
            "\"a\u{1}b\"",
            "\"a\u{7f}b\"",
            r#""é☃""#,
            "0",
            "7",
            "1700000000000",
            "01",
            "-1",
            "1.5",
            "1e3",
            "99999999999999999999999",
            "null",
            "true",
            "false",
            "{}",
            r#"{"k":"v"}"#,
            "[1]",
            r#""unterminated"#,
            "nul",
            r#""x" "y""#,
            r#""a long prompt of some length, longer than a word or two""#,
        ];
        const WS: [&str; 5] = ["", " ", "\n", "\t ", "\r\n"];
        const TAIL: [&str; 4] = ["", " \n", "x", "{}"];
        const PROMPT_KEYS: [&str; 5] = ["session_id", "prompt", "client_msg_id", "metadata", "ts"];
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        let (mut scanned_ok, mut accepted) = (0, 0);
        for _ in 0..40_000 {
            let mut body = String::from(WS[next(5)]);
            body.push('{');
            // Half the bodies are the usual shape: a session, a text and
            // the ids (any key order), their values any string or number.
            let usual = next(2) == 0;
            let fields = if usual { 3 + next(3) } else { next(7) };
            let first = next(7);
            for f in 0..fields {
                if f > 0 && next(40) != 0 {
                    body.push(',');
                }
                let (key, value) = if usual {
                    let key = KEYS[(first + f) % 7];
                    let value = match key {
                        "session_id" => VALUES[next(2)],
                        "ts" => VALUES[15 + next(9)],
                        "metadata" => VALUES[23 + next(5)],
                        _ => VALUES[3 + next(12)],
                    };
                    (key, value)
                } else {
                    (KEYS[next(KEYS.len())], VALUES[next(VALUES.len())])
                };
                body.push_str(WS[next(5)]);
                body.push('"');
                body.push_str(key);
                body.push('"');
                body.push_str(WS[next(5)]);
                body.push(':');
                body.push_str(WS[next(5)]);
                body.push_str(value);
                body.push_str(WS[next(5)]);
            }
            if next(40) == 0 {
                body.push(',');
            }
            body.push('}');
            body.push_str(TAIL[if next(10) == 0 { next(4) } else { 0 }]);
            let mut bytes = body.into_bytes();
            if next(20) == 0 {
                let cut = next(bytes.len() + 1);
                bytes.truncate(cut);
            }
            if next(30) == 0 && !bytes.is_empty() {
                let at = next(bytes.len());
                bytes[at] = next(256) as u8;
            }
            let shown = String::from_utf8_lossy(&bytes).into_owned();
            let scan = NewPrompt::parse_by(&bytes, true);
            let serde = NewPrompt::parse_by(&bytes, false);
            accepted += usize::from(serde.is_ok());
            assert_eq!(
                format!("{scan:?}"),
                format!("{serde:?}"),
                "prompt body {shown}"
            );
            let scan = format!("{:?}", NewResponse::parse_by(&bytes, true));
            let serde = format!("{:?}", NewResponse::parse_by(&bytes, false));
            assert_eq!(scan, serde, "response body {shown}");
            let text = std::str::from_utf8(&bytes).ok();
            scanned_ok += usize::from(scanned(text, &PROMPT_KEYS, true).is_some());
        }
        // Both paths were taken, and both outcomes seen, many times.
        assert!(scanned_ok > 2_000, "scanned {scanned_ok}");
        assert!(accepted > 1_000, "accepted {accepted}");
    }

    fn prompt_err(body: &str) -> ApiError {
        NewPrompt::parse(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn prompt_errors_name_the_field() {
        assert_eq!(prompt_err("{").error, "Invalid JSON");
        assert_eq!(prompt_err("[1]").status, 400);
        assert_eq!(
            prompt_err(r#"{"prompt":"x"}"#).error,
            "Missing required field: session_id"
        );
        assert_eq!(
            prompt_err(r#"{"session_id":"a"}"#).error,
            "Missing required field: prompt"
        );
        assert_eq!(
            prompt_err(r#"{"session_id":"a b","prompt":"x"}"#).error,
            "Invalid session_id"
        );
        assert!(
            prompt_err(r#"{"session_id":"a","prompt":5}"#)
                .error
                .contains("prompt")
        );
        assert!(
            prompt_err(r#"{"session_id":"a","prompt":"x","metadata":[]}"#)
                .error
                .contains("metadata")
        );
        assert!(
            prompt_err(r#"{"session_id":"a","prompt":"x","ts":-1}"#)
                .error
                .contains("ts")
        );
        assert!(
            prompt_err(r#"{"session_id":"a","prompt":"x","client_msg_id":""}"#)
                .error
                .contains("client_msg_id")
        );
    }

    #[test]
    fn text_above_128_kib_is_rejected_with_the_size_text() {
        let big = "x".repeat(MAX_TEXT_BYTES + 1);
        let body = format!(r#"{{"session_id":"a","prompt":"{big}"}}"#);
        assert_eq!(prompt_err(&body).error, "Message exceeds size limit");
        let ok = "é".repeat(MAX_TEXT_BYTES / 2);
        let body = format!(r#"{{"session_id":"a","prompt":"{ok}"}}"#);
        assert!(NewPrompt::parse(body.as_bytes()).is_ok());
    }

    #[test]
    fn unknown_fields_and_null_optionals_are_ignored() {
        let p = NewPrompt::parse(
            br#"{"session_id":"a","prompt":"hi","extra":1,"metadata":null,"ts":null,"client_msg_id":null}"#,
        )
        .unwrap();
        assert!(p.metadata.is_none() && p.ts.is_none() && p.client_msg_id.is_none());
    }

    #[test]
    fn lone_surrogate_escapes_are_refused_and_pairs_kept() {
        assert_eq!(
            prompt_err(r#"{"session_id":"a","prompt":"\ud800"}"#).error,
            "Invalid JSON"
        );
        assert_eq!(
            prompt_err(r#"{"session_id":"a","prompt":"x","metadata":{"k":"\udc00"}}"#).error,
            "Invalid JSON"
        );
        let p = NewPrompt::parse(
            br#"{"session_id":"a","prompt":"\ud83d\ude00 \u00e9","metadata":{"k":"\u00e9"}}"#,
        )
        .unwrap();
        assert_eq!(p.prompt, r#""\ud83d\ude00 \u00e9""#);
    }

    #[test]
    fn poison_metadata_is_refused_on_both_bodies() {
        let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
        for meta in [format!(r#"{{"a":{deep}}}"#), r#"{"n":-1e400}"#.to_string()] {
            let e = prompt_err(&format!(
                r#"{{"session_id":"a","prompt":"x","metadata":{meta}}}"#
            ));
            assert_eq!((e.status, &*e.error), (400, "Invalid metadata"), "{meta}");
            let body =
                format!(r#"{{"session_id":"a","client_msg_id":"c","text":"x","metadata":{meta}}}"#);
            let e = NewResponse::parse(body.as_bytes()).unwrap_err();
            assert_eq!((e.status, &*e.error), (400, "Invalid metadata"), "{meta}");
        }
        // A deep literal with a `\u` escape is refused by the scan, before
        // any value tree is built for it.
        let e = prompt_err(&format!(
            r#"{{"session_id":"a","prompt":"x","metadata":{{"\u00e9":{deep}}}}}"#
        ));
        assert_eq!(e.error, "Invalid metadata");
    }

    #[test]
    fn ts_out_of_range_is_refused() {
        for ts in ["1e400", "-1e400", "18446744073709551616", "1.5"] {
            let e = prompt_err(&format!(r#"{{"session_id":"a","prompt":"x","ts":{ts}}}"#));
            assert_eq!(e.status, 400, "{ts}");
            assert!(e.error.contains("ts"), "{ts}: {e:?}");
        }
    }

    #[test]
    fn invalid_session_id_details_give_the_rule() {
        let e = prompt_err(r#"{"session_id":"a/b","prompt":"x"}"#);
        assert_eq!(e.error, "Invalid session_id");
        assert_eq!(
            e.details.as_deref(),
            Some("1 to 128 characters from A-Z a-z 0-9 . _ ~ -")
        );
    }

    #[test]
    fn a_session_id_is_checked_as_decoded_whether_escaped_or_not() {
        let p = NewPrompt::parse(br#"{"session_id":"a\u0062","prompt":"x"}"#).unwrap();
        assert_eq!(p.session_id.as_str(), "ab");
        let p = NewPrompt::parse(br#"{"session_id":"Ab0.-_~","prompt":"x"}"#).unwrap();
        assert_eq!(p.session_id.as_str(), "Ab0.-_~");
        for bad in [r#""a\u0020b""#, r#""a b""#, r#""""#, "5"] {
            let e = prompt_err(&format!(r#"{{"session_id":{bad},"prompt":"x"}}"#));
            assert_eq!(e.status, 400, "{bad}");
            assert!(e.error.contains("session_id"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn session_ids_are_url_unreserved() {
        assert!(valid_session_id("Ab0.-_~"));
        assert!(!valid_session_id(""));
        assert!(!valid_session_id("a/b"));
        assert!(!valid_session_id(&"a".repeat(129)));
    }
}
