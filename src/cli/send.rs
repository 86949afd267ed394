//! `relay send`: posts one prompt and prints the answers to it, as they
//! stream.
//!
//! The WebSocket is connected before the prompt is posted, so no answer can
//! arrive unseen; answers to other prompts of the session are skipped. The
//! parts of an answer (`delta` frames) are printed as they come, and its
//! final `message` completes the line; `presence` frames say whether an
//! agent is there to take the prompt.
//!
//! Ctrl-C while waiting stops the prompt (`POST /cancel`): the agent then
//! stops its command. A second Ctrl-C exits at once.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::protocol::{Role, WebSocketConfig};
use tungstenite::{Message, WebSocket};

use super::client::{Client, Limit, Response, Stream, Upgraded};
use super::stream::Draft;
use super::{Parsed, Spec, e2e};
use crate::store::model::MAX_TEXT_BYTES;

/// How long connecting and posting may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for answers by default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest WebSocket message accepted (an answer is at most 128 KiB of
/// text plus its metadata).
const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// How long a read waits before the Ctrl-C flag is checked again.
const READ_SLICE: Duration = Duration::from_millis(200);
/// The exit code after Ctrl-C, as shells report a SIGINT.
const INTERRUPTED: u8 = 130;
/// Drafts of answers to the prompt followed at once; parts of others are
/// not shown (their final answers are).
const MAX_DRAFTS: usize = 16;

const HELP: &str =
    "usage: relay send --session ID [--url URL] [--token-file FILE] [--ca FILE] [--e2e-key-file FILE] [--all] [--timeout S] [--verbose] TEXT...

Posts TEXT (the words joined by spaces; - reads it from stdin) as a prompt
of the session and prints each answer's text on its own line as it arrives,
its streamed parts as they come. The WebSocket is connected first, so no
answer is missed. A notice is printed to stderr when no agent is online
in the session (the prompt then waits
until one fetches it). An error answer (its metadata has \"error\": the
agent's command failed) has its error printed to stderr, and its text, if
any, to stdout. Ctrl-C while waiting cancels the prompt (POST /cancel: the
agent stops its command), says so on stderr and exits 130; a second Ctrl-C
exits at once.

  --session ID     the session (required; created if missing)
  --url URL        the server (default RELAY_URL, else http://127.0.0.1:8000)
  --token-file FILE
                   read the client token from FILE (a trailing newline is
                   dropped); default RELAY_CLIENT_TOKEN. Prefer one of
                   these two to --token
  --token T        the client token itself: shown by ps to every user of
                   the machine
  --ca FILE        for an https:// URL, trust only the CA or self-signed
                   certificate in this PEM file (default RELAY_CA, else the
                   system's trust store, else built-in Mozilla roots)
  --e2e-key-file FILE
                   read the key from FILE (a trailing newline is dropped);
                   default RELAY_E2E_KEY. Prefer one of these two to
                   --e2e-key, which ps shows
  --e2e-key KEY    encrypt the prompt and decrypt the answers with this key
                   (relay key makes one): the server sees only ciphertext. An answer that does not decrypt is
                   printed as \"cannot decrypt\" (so is an encrypted one
                   when no key is given)
  --all            keep printing answers (an agent may answer in several
                   messages) until the timeout, instead of exiting after
                   the first answer
  --timeout S      seconds to wait for answers (default 120)
  --verbose        print the generated client_msg_id to stderr

exit codes: 0 an answer printed, 1 no answer before the timeout or the prompt
could not be posted, 2 bad usage, 3 an error answer (with --all: any of the
answers printed was one), 130 the prompt cancelled (by Ctrl-C here, or by a
Stop elsewhere)
";

const SPEC: Spec = Spec {
    valued: &[
        "--url",
        "--session",
        "--token",
        "--token-file",
        "--ca",
        "--timeout",
        "--e2e-key",
        "--e2e-key-file",
    ],
    switches: &["--all", "--verbose"],
    interleaved: true,
};

struct Options {
    client: Client,
    session: String,
    text: String,
    all: bool,
    /// Print the generated `client_msg_id` to stderr.
    verbose: bool,
    timeout: Duration,
    /// End-to-end encryption, when a key is given.
    key: Option<e2e::Key>,
}

fn options(parsed: &Parsed, env: &[(String, String)]) -> Result<Options, String> {
    let client = super::client_of(parsed, env, "RELAY_CLIENT_TOKEN")?;
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
        client,
        session,
        text,
        all: parsed.switch("--all"),
        verbose: parsed.switch("--verbose"),
        timeout,
        key,
    })
}

/// `relay send ARGS`: returns the exit code.
pub fn main(args: &[String], env: &[(String, String)]) -> u8 {
    let mut opts = match super::tool_options("send", args, env, &SPEC, HELP, options) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let interrupted = match interrupt_on_ctrl_c() {
        Ok(flag) => flag,
        Err(e) => {
            eprintln!("relay send: cannot handle Ctrl-C: {e}");
            return 1;
        }
    };
    match run(&mut opts, &interrupted) {
        Ok(Ended::Interrupted | Ended::CancelledElsewhere) => INTERRUPTED,
        Ok(Ended::Printed(Tally { answers: 0, .. })) => {
            eprintln!(
                "relay send: no answer within {} s",
                opts.timeout.as_secs_f64()
            );
            1
        }
        Ok(Ended::Printed(Tally { errors: 0, .. })) => 0,
        Ok(Ended::Printed(_)) => 3,
        Err(e) => {
            eprintln!("relay send: {e}");
            1
        }
    }
}

/// A flag raised by the first Ctrl-C; a second one exits at once (130).
fn interrupt_on_ctrl_c() -> io::Result<Arc<AtomicBool>> {
    use signal_hook::consts::SIGINT;
    let flag = Arc::new(AtomicBool::new(false));
    // Registered first, so it sees the flag as the earlier signal left it.
    signal_hook::flag::register_conditional_shutdown(
        SIGINT,
        i32::from(INTERRUPTED),
        Arc::clone(&flag),
    )?;
    signal_hook::flag::register(SIGINT, Arc::clone(&flag))?;
    Ok(flag)
}

/// How `run` ended without a failure.
#[derive(Debug)]
enum Ended {
    Printed(Tally),
    /// Ctrl-C: the prompt was cancelled, or never posted.
    Interrupted,
    /// The prompt was cancelled by someone else (the page's Stop): no
    /// answer will come, so waiting on would only run into the timeout.
    CancelledElsewhere,
}

/// How many answers were printed, and how many of them were error answers.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    answers: usize,
    errors: usize,
}

/// Subscribes, posts, prints answers; returns what was printed, unless
/// `interrupted` was raised first (then the prompt is cancelled, if it was
/// posted).
fn run(opts: &mut Options, interrupted: &AtomicBool) -> Result<Ended, String> {
    let deadline = Instant::now() + opts.timeout;
    let mut ws = subscribe(opts)?;
    let client_msg_id = uuid::Uuid::new_v4().to_string();
    if opts.verbose {
        eprintln!("relay send: client_msg_id {client_msg_id}");
    }
    if interrupted.load(Ordering::SeqCst) {
        eprintln!("relay send: interrupted: nothing sent");
        return Ok(Ended::Interrupted);
    }
    post(opts, &client_msg_id)?;
    let mut watch = Watch::new(&opts.session, &client_msg_id, opts.key.as_ref());
    let (mut out, mut err) = (io::stdout().lock(), io::stderr());
    let mut printed = Tally::default();
    let result = loop {
        match next_frame(&mut ws, deadline, interrupted) {
            Ok(Next::Frame(frame)) => match watch.frame(&frame, &mut out, &mut err) {
                Ok(Some(answer)) => {
                    printed.answers += 1;
                    printed.errors += usize::from(answer.error.is_some());
                    if !opts.all {
                        break Ok(Ended::Printed(printed));
                    }
                }
                Ok(None) if watch.cancelled => {
                    eprintln!("relay send: {client_msg_id} was cancelled elsewhere");
                    break Ok(Ended::CancelledElsewhere);
                }
                Ok(None) => {}
                Err(e) => break Err(format!("cannot print the answer: {e}")),
            },
            Ok(Next::Deadline) => break Ok(Ended::Printed(printed)),
            Ok(Next::Interrupted) => break Ok(Ended::Interrupted),
            Err(e) if printed.answers > 0 => {
                eprintln!("relay send: {e}");
                break Ok(Ended::Printed(printed));
            }
            Err(e) => break Err(e),
        }
    };
    // Parts printed without their answer: end their line.
    let _ = watch.close(&mut out);
    let _ = ws.close(None);
    let _ = ws.flush();
    if matches!(result, Ok(Ended::Interrupted)) {
        cancel(opts, &client_msg_id);
    }
    result
}

/// `POST /cancel` for our prompt, saying on stderr how it went.
fn cancel(opts: &mut Options, client_msg_id: &str) {
    let body = json!({"session_id": opts.session, "client_msg_id": client_msg_id});
    let resp = opts.client.request(
        "POST",
        "/cancel",
        Some(body.to_string().as_bytes()),
        Limit::within(REQUEST_TIMEOUT),
    );
    match resp {
        Ok(resp) if resp.status == 200 => eprintln!("relay send: cancelled {client_msg_id}"),
        Ok(resp) if resp.status == 409 => {
            eprintln!("relay send: not cancelled, {client_msg_id} was answered already");
        }
        Ok(resp) => eprintln!(
            "relay send: cannot cancel {client_msg_id}: {}{}",
            resp.describe(),
            hint(&resp)
        ),
        Err(e) => eprintln!("relay send: cannot cancel {client_msg_id}: POST /cancel: {e}"),
    }
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
                hint(&resp)
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
        Err(format!("POST /prompt: {}{}", resp.describe(), hint(&resp)))
    }
}

/// What a refusal means and what to do about it: where a refused token came
/// from, or a `503`, whose bare "Service Unavailable" or "Storage
/// unavailable" says neither whether the prompt was kept nor where to look.
fn hint(resp: &Response) -> &'static str {
    let error = resp
        .json()
        .and_then(|v| v["error"].as_str().map(str::to_string));
    match resp.status {
        // The server's reason is in `describe`; only where the token came
        // from is added, never a guess at what is wrong with it.
        401 | 403 => " (the client token: --token, --token-file or RELAY_CLIENT_TOKEN)",
        503 if error.as_deref() == Some("Storage unavailable") => {
            " (the server cannot reach its storage, its Redis or its data directory, so \
             nothing was stored; check the server's GET /readyz and its log, then send again)"
        }
        503 => {
            " (the server is at one of its limits or shutting down, so nothing was stored; \
             GET /readyz says which; send again later)"
        }
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

/// What waiting for a frame gave.
enum Next {
    Frame(String),
    Deadline,
    Interrupted,
}

/// The next text frame, read in slices so that Ctrl-C (`interrupted`) is
/// seen within one: signal handlers restart an interrupted read.
fn next_frame(
    ws: &mut WebSocket<Stream>,
    deadline: Instant,
    interrupted: &AtomicBool,
) -> Result<Next, String> {
    loop {
        if interrupted.load(Ordering::SeqCst) {
            return Ok(Next::Interrupted);
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Ok(Next::Deadline);
        };
        if left.is_zero() {
            return Ok(Next::Deadline);
        }
        ws.get_ref()
            .tcp()
            .set_read_timeout(Some(left.min(READ_SLICE)))
            .map_err(|e| e.to_string())?;
        match ws.read() {
            Ok(Message::Text(frame)) => return Ok(Next::Frame(frame.as_str().to_string())),
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

/// What `relay send` makes of the frames of its session: the answers to
/// its prompt, printed as they stream, and notices about the agent. Fed
/// every text frame by `run`; writes to the `out` and `err` it is given.
struct Watch<'a> {
    session: &'a str,
    client_msg_id: &'a str,
    key: Option<&'a e2e::Key>,
    /// Drafts of answers to our prompt, by `assistant_msg_id`.
    drafts: HashMap<String, Draft>,
    /// The answer being printed as it streams: its `assistant_msg_id` and
    /// what of it is on stdout.
    live: Option<(String, String)>,
    /// Whether an agent has taken the prompt (a receipt or a part came).
    fetched: bool,
    /// Whether the no-agent notice was printed, and then the online one.
    said_offline: bool,
    said_online: bool,
    /// Our prompt was cancelled (a Stop on the page, another client): no
    /// answer will come.
    cancelled: bool,
}

impl<'a> Watch<'a> {
    fn new(session: &'a str, client_msg_id: &'a str, key: Option<&'a e2e::Key>) -> Self {
        Watch {
            session,
            client_msg_id,
            key,
            drafts: HashMap::new(),
            live: None,
            fetched: false,
            said_offline: false,
            said_online: false,
            cancelled: false,
        }
    }

    /// Handles one text frame; returns the answer a final `message` to our
    /// prompt carried, once it is printed. Frames of other prompts and
    /// unknown types are skipped.
    fn frame(
        &mut self,
        frame: &str,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> io::Result<Option<Answer>> {
        let Ok(v) = serde_json::from_str::<Value>(frame) else {
            return Ok(None);
        };
        let data = &v["data"];
        let ours = data["client_msg_id"] == self.client_msg_id;
        match v["type"].as_str() {
            Some("message") if ours => self.answer(data, out, err),
            Some("delta") if ours => self.delta(data, out).map(|()| None),
            Some("delta_end") if ours => {
                if let Some(id) = data["assistant_msg_id"].as_str() {
                    self.drafts.remove(id);
                }
                Ok(None)
            }
            Some("receipt") if ours => {
                self.fetched = true;
                Ok(None)
            }
            Some("cancel") if ours => {
                self.cancelled = true;
                Ok(None)
            }
            Some("presence") => self.presence(data, err).map(|()| None),
            _ => Ok(None),
        }
    }

    /// A part or a snapshot of an answer to our prompt: kept, and printed
    /// when it is the answer being printed.
    fn delta(&mut self, data: &Value, out: &mut dyn Write) -> io::Result<()> {
        self.fetched = true;
        let Some(id) = data["assistant_msg_id"].as_str() else {
            return Ok(());
        };
        if !self.drafts.contains_key(id) && self.drafts.len() >= MAX_DRAFTS {
            return Ok(());
        }
        let text = data["text"].as_str().and_then(|text| {
            let message = e2e::Message::Answer {
                session: self.session,
                client_msg_id: self.client_msg_id,
                assistant_msg_id: id,
            };
            match self.key {
                Some(key) => e2e::open_parts(key, text, message),
                // Encrypted and no key: nothing to show until the answer
                // says "cannot decrypt".
                None if text.starts_with(e2e::PREFIX) => None,
                None => Some(text.to_string()),
            }
        });
        let snapshot = data["snapshot"] == true;
        let draft = self.drafts.entry(id.to_string()).or_default();
        if !draft.apply(data["part"].as_u64(), snapshot, text.as_deref()) {
            return Ok(());
        }
        let text = draft.text();
        let live = self
            .live
            .get_or_insert_with(|| (id.to_string(), String::new()));
        // Only one answer is printed as it streams; a copy that no longer
        // extends what is printed waits for the final answer.
        if live.0 != id || !text.starts_with(live.1.as_str()) || text.len() == live.1.len() {
            return Ok(());
        }
        out.write_all(&text.as_bytes()[live.1.len()..])?;
        out.flush()?;
        live.1 = text.to_string();
        Ok(())
    }

    /// A final answer to our prompt: what of it is not printed yet, then
    /// its error on stderr for an error answer.
    fn answer(
        &mut self,
        data: &Value,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> io::Result<Option<Answer>> {
        let Some(text) = answer_text(data, self.session, self.client_msg_id, self.key) else {
            return Ok(None);
        };
        let answer = Answer {
            text,
            error: error_of(&data["metadata"]),
        };
        let id = data["assistant_msg_id"].as_str().unwrap_or_default();
        self.drafts.remove(id);
        let printed = match self.live.take() {
            Some((live, printed)) if live == id => printed,
            Some((other, printed)) => {
                // Another answer was streaming: end its line and follow it
                // no more (its next part finds no draft and waits), so
                // that its final answer is printed whole, once.
                if !printed.is_empty() {
                    writeln!(out)?;
                }
                self.drafts.remove(&other);
                String::new()
            }
            None => String::new(),
        };
        if printed.is_empty() {
            // An error answer without text: an empty line says nothing.
            if answer.error.is_none() || !answer.text.is_empty() {
                writeln!(out, "{}", answer.text)?;
            }
        } else if let Some(rest) = answer.text.strip_prefix(printed.as_str()) {
            writeln!(out, "{rest}")?;
        } else {
            writeln!(out)?;
            writeln!(out, "{}", answer.text)?;
        }
        out.flush()?;
        if let Some(error) = &answer.error {
            writeln!(err, "relay send: the agent answered with an error: {error}")?;
        }
        Ok(Some(answer))
    }

    /// Says when no agent is online to take the prompt, and when one comes
    /// online after that: each once.
    fn presence(&mut self, data: &Value, err: &mut dyn Write) -> io::Result<()> {
        if data["session_id"]
            .as_str()
            .is_some_and(|s| s != self.session)
        {
            return Ok(());
        }
        match data["agent"].as_str() {
            Some("offline") if !self.fetched && !self.said_offline => {
                self.said_offline = true;
                writeln!(
                    err,
                    "relay send: no agent is online in session {}; the prompt waits until one fetches it",
                    self.session
                )
            }
            Some("online") if self.said_offline && !self.said_online => {
                self.said_online = true;
                writeln!(
                    err,
                    "relay send: an agent is online in session {} now",
                    self.session
                )
            }
            _ => Ok(()),
        }
    }

    /// Ends the line of an answer whose parts were printed but whose final
    /// answer never came. Called once, at the end.
    fn close(&mut self, out: &mut dyn Write) -> io::Result<()> {
        if self
            .live
            .take()
            .is_some_and(|(_, printed)| !printed.is_empty())
        {
            writeln!(out)?;
            out.flush()?;
        }
        Ok(())
    }
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

    /// The answer one frame carries for `client_msg_id`, as a fresh `Watch`
    /// sees it.
    fn answer_of(
        frame: &str,
        session: &str,
        client_msg_id: &str,
        key: Option<&e2e::Key>,
    ) -> Option<Answer> {
        let mut watch = Watch::new(session, client_msg_id, key);
        watch
            .frame(frame, &mut Vec::new(), &mut Vec::new())
            .unwrap()
    }

    /// Frames fed to one `Watch` of prompt `m1` in session `s`; what it
    /// printed on stdout and stderr, and the answers' texts.
    fn watch(frames: &[Value], key: Option<&e2e::Key>) -> (String, String, Vec<String>) {
        let mut watch = Watch::new("s", "m1", key);
        let (mut out, mut err, mut answers) = (Vec::new(), Vec::new(), Vec::new());
        for frame in frames {
            let answer = watch.frame(&frame.to_string(), &mut out, &mut err).unwrap();
            answers.extend(answer.map(|a| a.text));
        }
        watch.close(&mut out).unwrap();
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (text(out), text(err), answers)
    }

    fn delta(aid: &str, part: u64, text: &str) -> Value {
        json!({"type":"delta","data":{"session_id":"s","client_msg_id":"m1","assistant_msg_id":aid,"part":part,"text":text}})
    }

    fn snapshot(aid: &str, part: u64, text: &str) -> Value {
        let mut frame = delta(aid, part, text);
        frame["data"]["snapshot"] = true.into();
        frame
    }

    fn message(aid: &str, text: &str) -> Value {
        json!({"type":"message","data":{"session_id":"s","client_msg_id":"m1","assistant_msg_id":aid,"text":text,"seq":2}})
    }

    #[test]
    fn parts_are_printed_as_they_come_and_the_answer_completes_them() {
        let frames = [
            delta("a1", 1, "Hel"),
            json!({"type":"delta","data":{"client_msg_id":"other","assistant_msg_id":"x","part":1,"text":"NO"}}),
            delta("a1", 2, "lo"),
            delta("a1", 4, " skipped"),
            snapshot("a1", 4, "Hello, wor"),
            delta("a1", 5, "ld"),
            json!({"type":"receipt","data":{"session_id":"s","client_msg_id":"m1","state":"fetched","ts":1}}),
            json!({"type":"something-new","data":{}}),
            message("a1", "Hello, world!"),
        ];
        let (out, err, answers) = watch(&frames, None);
        assert_eq!(out, "Hello, world!\n");
        assert_eq!(err, "");
        assert_eq!(answers, ["Hello, world!"]);
    }

    #[test]
    fn an_answer_that_differs_from_its_parts_is_printed_whole() {
        let frames = [delta("a1", 1, "draft"), message("a1", "final")];
        assert_eq!(watch(&frames, None).0, "draft\nfinal\n");
        // A draft dropped and streamed again from the start: nothing is
        // printed twice, the new copy goes on once it passes the old one.
        let frames = [
            delta("a1", 1, "Hello"),
            json!({"type":"delta_end","data":{"session_id":"s","client_msg_id":"m1","assistant_msg_id":"a1","reason":"timeout"}}),
            delta("a1", 1, "He"),
            delta("a1", 2, "llo, w"),
            message("a1", "Hello, world"),
        ];
        assert_eq!(watch(&frames, None).0, "Hello, world\n");
        // An error answer: its text completed on stdout, then its error.
        let mut failed = message("a1", "Hello");
        failed["data"]["metadata"] = json!({"error": "oom", "exit_code": 137});
        let (out, err, _) = watch(&[delta("a1", 1, "Hel"), failed], None);
        assert_eq!(out, "Hello\n");
        assert_eq!(
            err,
            "relay send: the agent answered with an error: oom (exit code 137)\n"
        );
        // Two answers streaming at once (--all): the second one's final
        // answer ends the first one's line, which is then printed whole.
        let frames = [
            delta("a1", 1, "first"),
            delta("a2", 1, "sec"),
            message("a2", "second"),
            delta("a1", 2, " answer"),
            message("a1", "first answer"),
        ];
        let (out, _, answers) = watch(&frames, None);
        assert_eq!(out, "first\nsecond\nfirst answer\n");
        assert_eq!(answers, ["second", "first answer"]);
        // Parts with no answer before the end: the line is ended.
        assert_eq!(watch(&[delta("a1", 1, "Hel")], None).0, "Hel\n");
    }

    #[test]
    fn encrypted_parts_are_opened_one_by_one() {
        let key = e2e::Key::parse(&e2e::new_key().unwrap()).unwrap();
        let message_of = |aid| e2e::Message::Answer {
            session: "s",
            client_msg_id: "m1",
            assistant_msg_id: aid,
        };
        let seal = |text, aid| key.seal(text, message_of(aid)).unwrap();
        let two = format!("{}{}", seal("Hel", "a1"), seal("lo", "a1"));
        let frames = [
            delta("a1", 1, &seal("Hel", "a1")),
            delta("a1", 2, &seal("lo", "a2")),
            delta("a1", 3, &seal("!", "a1")),
            snapshot("a1", 2, &two),
            delta("a1", 3, &seal(", you", "a1")),
            message("a1", &seal("Hello, you", "a1")),
        ];
        let (out, _, answers) = watch(&frames, Some(&key));
        assert_eq!(out, "Hello, you\n");
        assert_eq!(answers, ["Hello, you"]);
        // Without the key: no ciphertext on the screen.
        let (out, _, _) = watch(&frames, None);
        assert_eq!(out, "cannot decrypt\n");
    }

    #[test]
    fn no_agent_online_is_said_once_and_so_is_its_arrival() {
        let presence = |agent: &str| json!({"type":"presence","data":{"session_id":"s","agent":agent,"since":1}});
        let (_, err, _) = watch(&[presence("online"), message("a1", "hi")], None);
        assert_eq!(err, "", "an agent is there");
        let frames = [
            presence("offline"),
            presence("offline"),
            presence("online"),
            presence("offline"),
            presence("online"),
        ];
        let (_, err, _) = watch(&frames, None);
        assert_eq!(
            err,
            "relay send: no agent is online in session s; the prompt waits until one fetches it\n\
             relay send: an agent is online in session s now\n"
        );
        // Once the prompt is fetched, an agent that goes away is no news.
        let fetched = json!({"type":"receipt","data":{"session_id":"s","client_msg_id":"m1","state":"fetched","ts":1}});
        let (_, err, _) = watch(&[fetched, presence("offline")], None);
        assert_eq!(err, "");
    }

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
