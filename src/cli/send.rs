//! `relay send`: posts one prompt and prints the answers to it.
//!
//! The WebSocket is connected before the prompt is posted, so no answer can
//! arrive unseen; answers to other prompts of the session are skipped.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::protocol::{Role, WebSocketConfig};
use tungstenite::{Message, WebSocket};

use super::client::{Client, Limit, Stream, Upgraded};
use super::{Parsed, Spec, e2e};
use crate::relay::model::MAX_TEXT_BYTES;

/// How long connecting and posting may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for answers by default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest WebSocket message accepted (an answer is at most 128 KiB of
/// text plus its metadata).
const MAX_MESSAGE_BYTES: usize = 16 << 20;

const HELP: &str =
    "usage: relay send --session ID [--url URL] [--token T] [--ca FILE] [--e2e-key KEY] [--all] [--timeout S] TEXT...

Posts TEXT (the words joined by spaces; - reads it from stdin) as a prompt
of the session and prints each answer's text on its own line as it arrives.
The WebSocket is connected first, so no answer is missed. The generated
client_msg_id is printed to stderr. An error answer (its metadata has
\"error\": the agent's command failed) has its error printed to stderr, and
its text, if any, to stdout.

  --session ID     the session (required; created if missing)
  --url URL        the server (default RELAY_URL, else http://127.0.0.1:8000)
  --token T        client token (default RELAY_CLIENT_TOKEN)
  --ca FILE        for an https:// URL, trust only the CA or self-signed
                   certificate in this PEM file (default RELAY_CA, else the
                   system's trust store, else built-in Mozilla roots)
  --e2e-key KEY    encrypt the prompt and decrypt the answers with this key
                   (relay key makes one; default RELAY_E2E_KEY): the server
                   sees only ciphertext. An answer that does not decrypt is
                   printed as \"cannot decrypt\" (so is an encrypted one
                   when no key is given)
  --all            keep printing answer parts until the timeout, instead of
                   exiting after the first answer
  --timeout S      seconds to wait for answers (default 120)

exit codes: 0 an answer printed, 1 no answer before the timeout or the prompt
could not be posted, 2 bad usage, 3 an error answer (with --all: any of the
answers printed was one)
";

const SPEC: Spec = Spec {
    valued: &[
        "--url",
        "--session",
        "--token",
        "--ca",
        "--timeout",
        "--e2e-key",
    ],
    switches: &["--all"],
    interleaved: true,
};

struct Options {
    client: Client,
    session: String,
    text: String,
    all: bool,
    timeout: Duration,
    /// End-to-end encryption, when a key is given.
    key: Option<e2e::Key>,
}

fn options(parsed: &Parsed, env: &[(String, String)]) -> Result<Options, String> {
    let url = super::url_of(parsed, env)?;
    let tls = super::tls_of(parsed, env, &url)?;
    let token = super::token_of(parsed, env, "RELAY_CLIENT_TOKEN")?;
    let session = super::session_of(parsed)?;
    let timeout = super::seconds_of(parsed, "--timeout", DEFAULT_TIMEOUT)?;
    let key = super::e2e_key_of(parsed, env)?;
    let text = match parsed.rest.as_slice() {
        [] => return Err("TEXT is required".into()),
        [dash] if dash == "-" => {
            let mut text = String::new();
            std::io::stdin()
                .take(MAX_TEXT_BYTES as u64 + 1)
                .read_to_string(&mut text)
                .map_err(|e| format!("cannot read the prompt from stdin: {e}"))?;
            text
        }
        words => words.join(" "),
    };
    let max = if key.is_some() {
        e2e::MAX_CLEAR_BYTES
    } else {
        MAX_TEXT_BYTES
    };
    if text.len() > max {
        return Err(format!("the prompt exceeds {max} bytes"));
    }
    Ok(Options {
        client: Client::new(url, token, tls),
        session,
        text,
        all: parsed.switch("--all"),
        timeout,
        key,
    })
}

/// `relay send ARGS`: returns the exit code.
pub fn main(args: &[String], env: &[(String, String)]) -> u8 {
    let parsed = match super::parse_flags(args, &SPEC) {
        Ok(p) if p.help => {
            print!("{HELP}");
            return 0;
        }
        Ok(p) => p,
        Err(e) => return super::usage_error("send", &e),
    };
    let mut opts = match options(&parsed, env) {
        Ok(o) => o,
        Err(e) => return super::usage_error("send", &e),
    };
    match run(&mut opts) {
        Ok(Tally { answers: 0, .. }) => {
            eprintln!(
                "relay send: no answer within {} s",
                opts.timeout.as_secs_f64()
            );
            1
        }
        Ok(Tally { errors: 0, .. }) => 0,
        Ok(_) => 3,
        Err(e) => {
            eprintln!("relay send: {e}");
            1
        }
    }
}

/// How many answers were printed, and how many of them were error answers.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    answers: usize,
    errors: usize,
}

/// Subscribes, posts, prints answers; returns what was printed.
fn run(opts: &mut Options) -> Result<Tally, String> {
    let deadline = Instant::now() + opts.timeout;
    let mut ws = subscribe(opts)?;
    let client_msg_id = uuid::Uuid::new_v4().to_string();
    eprintln!("relay send: client_msg_id {client_msg_id}");
    post(opts, &client_msg_id)?;
    let mut printed = Tally::default();
    let result = loop {
        match next_answer(
            &mut ws,
            &opts.session,
            &client_msg_id,
            opts.key.as_ref(),
            deadline,
        ) {
            Ok(Some(answer)) => {
                print_answer(&answer)?;
                printed.answers += 1;
                printed.errors += usize::from(answer.error.is_some());
                if !opts.all {
                    break Ok(printed);
                }
            }
            Ok(None) => break Ok(printed),
            Err(e) if printed.answers > 0 => {
                eprintln!("relay send: {e}");
                break Ok(printed);
            }
            Err(e) => break Err(e),
        }
    };
    let _ = ws.close(None);
    let _ = ws.flush();
    result
}

/// Opens `/ws/{session}`. The token travels in the `Authorization` header
/// (the server accepts it on upgrades too), which keeps it out of proxies'
/// access logs where `?token=` would land.
fn subscribe(opts: &Options) -> Result<WebSocket<Stream>, String> {
    let path = format!("/ws/{}", opts.session);
    let address = opts.client.url().ws(&path);
    let (stream, read) = match opts.client.upgrade(&path, REQUEST_TIMEOUT) {
        Ok(Upgraded::Open(stream, read)) => (stream, read),
        Ok(Upgraded::Refused(resp)) => {
            return Err(format!(
                "{address}: refused: {}{}",
                resp.describe(),
                token_hint(resp.status)
            ));
        }
        Err(e) => return Err(format!("{address}: {e}")),
    };
    let tcp = stream.tcp();
    tcp.set_read_timeout(Some(REQUEST_TIMEOUT))
        .and_then(|()| tcp.set_write_timeout(Some(REQUEST_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    Ok(WebSocket::from_partially_read(
        stream,
        read,
        Role::Client,
        Some(config),
    ))
}

fn post(opts: &mut Options, client_msg_id: &str) -> Result<(), String> {
    let mut body = json!({
        "session_id": opts.session,
        "client_msg_id": client_msg_id,
        "prompt": opts.text,
    });
    if let Some(key) = &opts.key {
        let message = e2e::Message::Prompt {
            session: &opts.session,
            client_msg_id,
        };
        body["prompt"] = key.seal(&opts.text, message)?.into();
        body["metadata"] = json!({"e2e": 1});
    }
    let resp = opts
        .client
        .request(
            "POST",
            "/prompt",
            Some(body.to_string().as_bytes()),
            Limit::within(REQUEST_TIMEOUT),
        )
        .map_err(|e| format!("POST /prompt: {e}"))?;
    if resp.status == 200 {
        Ok(())
    } else {
        Err(format!(
            "POST /prompt: {}{}",
            resp.describe(),
            token_hint(resp.status)
        ))
    }
}

/// Prints an answer: its text on stdout (an error answer's only when it
/// has one: an empty line says nothing), its error on stderr.
fn print_answer(answer: &Answer) -> Result<(), String> {
    if let Some(error) = &answer.error {
        eprintln!("relay send: the agent answered with an error: {error}");
        if answer.text.is_empty() {
            return Ok(());
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", answer.text)
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot print the answer: {e}"))
}

/// What to do about a refused token.
fn token_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (check --token or RELAY_CLIENT_TOKEN: the client token is needed)",
        _ => "",
    }
}

/// An answer to our prompt, as printed.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    /// The clear text ("cannot decrypt" when it does not open).
    text: String,
    /// For an error answer: `metadata.error`, with the exit code when the
    /// metadata has one.
    error: Option<String>,
}

/// The next answer to `client_msg_id`, `None` at the deadline.
fn next_answer(
    ws: &mut WebSocket<Stream>,
    session: &str,
    client_msg_id: &str,
    key: Option<&e2e::Key>,
    deadline: Instant,
) -> Result<Option<Answer>, String> {
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Ok(None);
        };
        if left.is_zero() {
            return Ok(None);
        }
        ws.get_ref()
            .tcp()
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        match ws.read() {
            Ok(Message::Text(frame)) => {
                if let Some(answer) = answer_of(frame.as_str(), session, client_msg_id, key) {
                    return Ok(Some(answer));
                }
            }
            Ok(Message::Close(_)) | Err(tungstenite::Error::ConnectionClosed) => {
                return Err("the server closed the connection".into());
            }
            Ok(_) => {}
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(format!("connection lost: {e}")),
        }
    }
}

/// The answer a `{"type":"message"}` frame carries for `client_msg_id`.
fn answer_of(
    frame: &str,
    session: &str,
    client_msg_id: &str,
    key: Option<&e2e::Key>,
) -> Option<Answer> {
    let v: Value = serde_json::from_str(frame).ok()?;
    let data = &v["data"];
    if v["type"] != "message" || data["client_msg_id"] != client_msg_id {
        return None;
    }
    let text = answer_text(data, session, client_msg_id, key)?;
    Some(Answer {
        text,
        error: error_of(&data["metadata"]),
    })
}

/// An error answer's error: `metadata.error` (a string as it is, anything
/// else as JSON), with `metadata.exit_code` when it is a number.
fn error_of(metadata: &Value) -> Option<String> {
    let error = match metadata.get("error")? {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some(match metadata["exit_code"].as_i64() {
        Some(code) => format!("{error} (exit code {code})"),
        None => error,
    })
}

/// An answer's text, decrypted with `key` when there is one ("cannot
/// decrypt" when it does not open, or is encrypted and there is no key:
/// never the ciphertext).
fn answer_text(
    data: &Value,
    session: &str,
    client_msg_id: &str,
    key: Option<&e2e::Key>,
) -> Option<String> {
    let text = data["text"].as_str()?;
    let Some(key) = key else {
        if text.starts_with(e2e::PREFIX) {
            return Some("cannot decrypt".to_string());
        }
        return Some(text.to_string());
    };
    let message = e2e::Message::Answer {
        session,
        client_msg_id,
        assistant_msg_id: data["assistant_msg_id"].as_str().unwrap_or(""),
    };
    Some(
        key.open(text, message)
            .unwrap_or_else(|| "cannot decrypt".to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_to_our_prompt_are_printed() {
        let frame = |cid: &str| {
            json!({"type":"message","data":{"client_msg_id":cid,"text":"hi","seq":2}}).to_string()
        };
        let text = |f: &str, cid: &str| answer_of(f, "s", cid, None).map(|a| a.text);
        assert_eq!(text(&frame("m1"), "m1").as_deref(), Some("hi"));
        assert_eq!(text(&frame("m2"), "m1"), None);
        assert_eq!(text(r#"{"type":"ping","ts":1}"#, "m1"), None);
        assert_eq!(text("not json", "m1"), None);
    }

    #[test]
    fn encrypted_answers_are_decrypted_or_said_to_fail() {
        let key = e2e::Key::parse(&e2e::new_key().unwrap()).unwrap();
        let answer = |sid| e2e::Message::Answer {
            session: sid,
            client_msg_id: "m1",
            assistant_msg_id: "a1",
        };
        let sealed = key.seal("secret answer", answer("s")).unwrap();
        let frame = json!({"type":"message","data":{"client_msg_id":"m1","assistant_msg_id":"a1","text":sealed}})
            .to_string();
        let open = |sid, key| answer_of(&frame, sid, "m1", key).map(|a| a.text);
        assert_eq!(open("s", Some(&key)).as_deref(), Some("secret answer"));
        assert_eq!(open("other", Some(&key)).as_deref(), Some("cannot decrypt"));
        assert_eq!(open("s", None).as_deref(), Some("cannot decrypt"), "no key");
    }

    #[test]
    fn error_answers_carry_their_error_and_exit_code() {
        let frame = |metadata: Value| {
            json!({"type":"message","data":{"client_msg_id":"m1","text":"","metadata":metadata}})
                .to_string()
        };
        let error = |metadata| answer_of(&frame(metadata), "s", "m1", None).and_then(|a| a.error);
        assert_eq!(error(json!({})), None);
        assert_eq!(error(json!({"exit_code": 0})), None);
        assert_eq!(
            error(json!({"error": "no model", "exit_code": 3})).as_deref(),
            Some("no model (exit code 3)")
        );
        assert_eq!(
            error(json!({"error": "cannot start", "exit_code": null})).as_deref(),
            Some("cannot start")
        );
        assert_eq!(
            error(json!({"error": {"k": 1}})).as_deref(),
            Some(r#"{"k":1}"#)
        );
    }
}
