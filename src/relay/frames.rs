//! The bytes of the live frames: `delta` (one part, or a draft's
//! snapshot), `delta_end`, `presence` and `receipt`. Each is one
//! WebSocket text frame, built once and shared (`Rc<[u8]>`) by every
//! subscriber it goes to: server frames are unmasked, so the same bytes
//! serve them all. A draft's text is written as it arrived (a part's
//! JSON literal, a draft's escaped text), never decoded and encoded again.

use std::rc::Rc;

use super::drafts::Draft;
use crate::time::UnixMillis;
use crate::wire::{push_decimal_str, push_json_str, wsframe};

pub(super) fn frame(json: &str) -> Rc<[u8]> {
    Rc::from(wsframe::text_frame(&[json.as_bytes()]))
}

/// The draft's ids as the head of a `delta` or `delta_end` object.
pub(super) fn head(out: &mut String, kind: &str, sid: &str, d: &Draft) {
    out.push_str("{\"type\":\"");
    out.push_str(kind);
    out.push_str("\",\"data\":{\"session_id\":");
    push_json_str(out, sid);
    out.push_str(",\"client_msg_id\":");
    push_json_str(out, &d.client_msg_id);
    out.push_str(",\"assistant_msg_id\":");
    push_json_str(out, &d.assistant_msg_id);
}

/// A `delta` frame: the part just appended (`part`, its literal), or the
/// whole draft as a snapshot.
pub(super) fn delta_frame(sid: &str, d: &Draft, part: Option<&str>, snapshot: bool) -> Rc<[u8]> {
    let mut out = String::with_capacity(160 + d.escaped.len());
    head(&mut out, "delta", sid, d);
    out.push_str(",\"part\":");
    push_decimal_str(&mut out, u64::from(d.parts));
    out.push_str(",\"text\":");
    match part {
        Some(lit) => out.push_str(lit),
        None => {
            out.push('"');
            out.push_str(&d.escaped);
            out.push('"');
        }
    }
    if snapshot {
        out.push_str(",\"snapshot\":true");
    }
    out.push_str("}}");
    frame(&out)
}

/// Why a draft ended without its final answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EndReason {
    /// No part came for the draft timeout.
    Timeout,
    /// Its prompt was cancelled.
    Cancelled,
}

pub(super) fn delta_end_frame(sid: &str, d: &Draft, why: EndReason) -> Rc<[u8]> {
    let mut out = String::with_capacity(160);
    head(&mut out, "delta_end", sid, d);
    out.push_str(match why {
        EndReason::Timeout => ",\"reason\":\"timeout\"}}",
        EndReason::Cancelled => ",\"reason\":\"cancelled\"}}",
    });
    frame(&out)
}

pub(super) fn presence_frame(sid: &str, online: bool, since: UnixMillis) -> Rc<[u8]> {
    let mut out = String::with_capacity(96);
    out.push_str("{\"type\":\"presence\",\"data\":{\"session_id\":");
    push_json_str(&mut out, sid);
    out.push_str(if online {
        ",\"agent\":\"online\",\"since\":"
    } else {
        ",\"agent\":\"offline\",\"since\":"
    });
    push_decimal_str(&mut out, since);
    out.push_str("}}");
    frame(&out)
}

pub(super) fn receipt_frame(sid: &str, client_msg_id: &str, ts: UnixMillis) -> Rc<[u8]> {
    let mut out = String::with_capacity(128);
    out.push_str("{\"type\":\"receipt\",\"data\":{\"session_id\":");
    push_json_str(&mut out, sid);
    out.push_str(",\"client_msg_id\":");
    push_json_str(&mut out, client_msg_id);
    out.push_str(",\"state\":\"fetched\",\"ts\":");
    push_decimal_str(&mut out, ts);
    out.push_str("}}");
    frame(&out)
}
