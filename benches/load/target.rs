//! The two protocols under test and how each spells the relay's data paths.
//!
//! relay (and `base`, a second relay binary measured beside it): `POST /prompt`, `GET /prompts/{sid}` (long-poll), `POST /response`,
//! WebSocket `GET /ws/{sid}`.
//! nchan (benches/load/nchan/nginx.conf): `POST /pub/p/{sid}` with the prompt
//! JSON, long-poll `GET /sub/p/{sid}` walking the queue with
//! If-Modified-Since / If-None-Match, `POST /pub/r/{sid}` with the frame the
//! relay would send (verbatim), WebSocket `GET /ws/r/{sid}`.

use std::fmt::Write as _;

/// Which protocol the generator speaks to the server under test.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Relay,
    Nchan,
}

/// Where an nchan long-poll subscriber is in its channel's queue.
#[derive(Default, Clone)]
pub struct Cursor {
    last_modified: Option<String>,
    etag: Option<String>,
}

impl Cursor {
    /// Moves the cursor past a received message.
    pub fn advance(&mut self, last_modified: Option<String>, etag: Option<String>) {
        if last_modified.is_some() {
            self.last_modified = last_modified;
            self.etag = etag;
        }
    }
}

/// Fixed-size filler text of `len` bytes that starts with `#<marker>#`.
pub fn text_with_marker(marker: u64, len: usize) -> String {
    let mut s = format!("#{marker}#");
    while s.len() < len {
        s.push('x');
    }
    s
}

/// The number in a `#<marker>#` written by `text_with_marker`.
pub fn parse_marker(text: &[u8]) -> Option<u64> {
    let start = text.iter().position(|&b| b == b'#')? + 1;
    let mut n: u64 = 0;
    let mut digits = 0;
    for &b in &text[start..] {
        if !b.is_ascii_digit() {
            break;
        }
        n = n * 10 + u64::from(b - b'0');
        digits += 1;
    }
    (digits > 0).then_some(n)
}

impl Target {
    /// The protocol of a `--target` name: `base` is another relay binary
    /// (a before/after comparison), so it speaks relay's; so does the static
    /// nginx, which answers its prompts.
    pub fn parse(s: &str) -> Option<Target> {
        match s {
            "relay" | "base" | "nginx-static" => Some(Target::Relay),
            "nchan" => Some(Target::Nchan),
            _ => None,
        }
    }

    /// The WebSocket path for the answers of `sid`.
    pub fn ws_path(self, sid: &str) -> String {
        match self {
            Target::Relay => format!("/ws/{sid}"),
            Target::Nchan => format!("/ws/r/{sid}"),
        }
    }

    /// Did a publish (prompt or response) succeed?
    pub fn post_ok(self, status: u16) -> bool {
        match self {
            Target::Relay => status == 200,
            Target::Nchan => status == 201 || status == 202,
        }
    }

    /// The client's prompt.
    pub fn post_prompt(self, host: &str, sid: &str, msg_id: &str, prompt: &str) -> Vec<u8> {
        let body =
            format!(r#"{{"session_id":"{sid}","client_msg_id":"{msg_id}","prompt":"{prompt}"}}"#);
        match self {
            Target::Relay => post(host, "/prompt", &body),
            Target::Nchan => post(host, &format!("/pub/p/{sid}"), &body),
        }
    }

    /// The agent's answer to `msg_id`. For nchan the body is the frame the
    /// relay would push, with an id, `ts` and `seq` of the same lengths.
    pub fn post_response(self, host: &str, sid: &str, msg_id: &str, text: &str, n: u64) -> Vec<u8> {
        match self {
            Target::Relay => {
                let body = format!(
                    r#"{{"session_id":"{sid}","client_msg_id":"{msg_id}","text":"{text}"}}"#
                );
                post(host, "/response", &body)
            }
            Target::Nchan => {
                let body = format!(
                    r#"{{"type":"message","data":{{"session_id":"{sid}","assistant_msg_id":"00000000-0000-4000-8000-{n:012}","client_msg_id":"{msg_id}","text":"{text}","ts":1700000000000,"seq":{}}}}}"#,
                    2 * n + 2
                );
                post(host, &format!("/pub/r/{sid}"), &body)
            }
        }
    }

    /// The agent's long-poll for prompts of `sid`.
    pub fn get_prompts(self, host: &str, sid: &str, cursor: &Cursor, timeout_s: u32) -> Vec<u8> {
        let mut req = match self {
            Target::Relay => {
                format!("GET /prompts/{sid}?timeout={timeout_s} HTTP/1.1\r\nHost: {host}\r\n")
            }
            Target::Nchan => format!("GET /sub/p/{sid} HTTP/1.1\r\nHost: {host}\r\n"),
        };
        if let Some(lm) = &cursor.last_modified {
            let _ = write!(req, "If-Modified-Since: {lm}\r\n");
        }
        if let Some(etag) = &cursor.etag {
            let _ = write!(req, "If-None-Match: {etag}\r\n");
        }
        req.push_str("\r\n");
        req.into_bytes()
    }

    /// Creates a session so a long-poll does not get 404 (relay only; nchan
    /// channels need no creation).
    pub fn create_session(self, host: &str, sid: &str) -> Option<Vec<u8>> {
        match self {
            Target::Relay => Some(
                format!(
                    "PUT /sessions/{sid} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n"
                )
                .into_bytes(),
            ),
            Target::Nchan => None,
        }
    }
}

/// relay's `POST /response` with the caller's `assistant_msg_id`: a part
/// appended to that answer's draft (`partial`), or the final answer.
/// relay only: nchan has no streamed answers.
pub fn relay_response(
    host: &str,
    sid: &str,
    msg_id: &str,
    assistant_msg_id: &str,
    text: &str,
    partial: bool,
) -> Vec<u8> {
    let tail = if partial { r#","partial":true}"# } else { "}" };
    let body = format!(
        r#"{{"session_id":"{sid}","client_msg_id":"{msg_id}","assistant_msg_id":"{assistant_msg_id}","text":"{text}"{tail}"#
    );
    post(host, "/response", &body)
}

fn post(host: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
