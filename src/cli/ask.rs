//! `relay ask`: asks the person a question (`POST /ask`) and waits for the
//! reply (`GET /asks/{sid}/{ask_id}` long-polls), for a script or an
//! agent's approval hook run by `relay agent`, which hands its command the
//! server, session, prompt, token and key in the environment.
//!
//! The `ask_id` is chosen here, once, and every retry (of the ask or of a
//! wait) uses it, so a retry is a duplicate and never a second question.
//! With a key the ask's texts are sealed once, deterministically (see
//! [`e2e::Key::seal_fixed`]), so a retried `POST /ask` carries the very
//! bytes of the first and the choices are the bytes a reply must repeat.

use std::io::Read;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::client::{self, Client, Limit, Response};
use super::{Parsed, Spec, e2e};
use crate::store::model::{ASK_TIMEOUT_S, MAX_CHOICE_BYTES, MAX_CHOICES, MAX_TEXT_BYTES};

/// How long a request other than a wait may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one wait may be parked: below common proxies' read timeouts.
const POLL_SECONDS: u64 = 50;
/// How much longer than its `timeout` a wait may take to be answered.
const POLL_MARGIN: Duration = Duration::from_secs(15);
/// The first retry delay; it doubles on each failure in a row up to the
/// second, and a `Retry-After` may stretch it up to the third.
const BACKOFF: (Duration, Duration, Duration) = (
    Duration::from_millis(100),
    Duration::from_secs(5),
    Duration::from_secs(60),
);
/// How long past the ask's own expiry the tool still tries to learn how it
/// ended before it gives up (the server may have been unreachable).
const EXPIRY_GRACE: Duration = Duration::from_secs(60);
/// The exit code of an ask that expired unanswered.
pub const EXIT_EXPIRED: u8 = 4;

const HELP: &str = "usage: relay ask [--choice C]... [--default C] [--timeout S] [--session ID] [--prompt ID] [--url URL] [--token-file FILE] [--ca FILE] [--e2e-key-file FILE] TEXT...

Asks the person in the session TEXT (the words joined by spaces; - reads it
from stdin) and waits for the reply, which it prints on stdout. With
--choice, the reply is one of the choices (the page shows them as
buttons); without, any line of text. Run by a command under relay agent,
it needs no flags: the agent gives its command RELAY_URL,
RELAY_SESSION_ID, RELAY_CLIENT_MSG_ID (the prompt the question is about),
RELAY_AGENT_TOKEN and RELAY_E2E_KEY:

  relay ask --choice yes --choice no --default no \"Run make deploy?\"

Network errors and 5xx are retried with backoff under the same ask id, so
a retry is never a second question.

  --choice C          a possible reply (1 to 8, distinct); repeat the flag
  --default C         what an unanswered ask ends with (one of the
                      choices, when there are some); printed on expiry
  --timeout S         seconds the person has to reply, 1 to 86400
                      (default 300)
  --session ID        the session (default RELAY_SESSION_ID)
  --prompt ID         the client_msg_id of the prompt it is about (default
                      RELAY_CLIENT_MSG_ID)
  --url URL           the server (default RELAY_URL, else http://127.0.0.1:8000)
  --token-file FILE   read the agent token from FILE; default
                      RELAY_AGENT_TOKEN. Prefer one of these two to --token
  --token T           the agent token itself: shown by ps to every user
  --ca FILE           for an https:// URL, trust only this PEM file's CA
                      (default RELAY_CA)
  --e2e-key-file FILE read the key from FILE; default RELAY_E2E_KEY
  --e2e-key KEY       encrypt the question and choices, decrypt the reply:
                      the server sees only ciphertext. Encrypted, a choice
                      holds at most 160 bytes

exit codes: 0 answered (the reply printed), 1 an error (refused, the session
is unknown, the server unreachable past the ask's expiry, a reply that does
not decrypt), 2 bad usage, 4 expired unanswered (its default printed, if any)
";

const SPEC: Spec = Spec {
    valued: &[
        "--url",
        "--session",
        "--prompt",
        "--token",
        "--token-file",
        "--ca",
        "--e2e-key",
        "--e2e-key-file",
        "--choice",
        "--default",
        "--timeout",
    ],
    switches: &[],
    interleaved: true,
};

/// What `relay ask` was asked to do, in clear.
struct Options {
    client: Client,
    session: String,
    /// The prompt the question is about.
    prompt: Option<String>,
    text: String,
    choices: Vec<String>,
    default: Option<String>,
    timeout_s: f64,
    key: Option<e2e::Key>,
}

fn options(parsed: &Parsed, env: &[(String, String)]) -> Result<Options, String> {
    let client = super::client_of(parsed, env, "RELAY_AGENT_TOKEN")?;
    let session = super::session_or_env(parsed, env)?;
    let prompt = match parsed
        .value("--prompt")
        .or_else(|| super::env_value(env, "RELAY_CLIENT_MSG_ID"))
    {
        Some(id) if id.len() > 256 => return Err("--prompt: at most 256 bytes".into()),
        id => id.map(str::to_string),
    };
    let key = super::e2e_key_of(parsed, env)?;
    let choices: Vec<String> = parsed.values("--choice").map(str::to_string).collect();
    check_choices(&choices, key.is_some())?;
    let default = parsed.value("--default").map(str::to_string);
    if let Some(d) = &default
        && !choices.is_empty()
        && !choices.contains(d)
    {
        return Err(format!("--default '{d}' is not one of the choices"));
    }
    let (default_s, min_s, max_s) = ASK_TIMEOUT_S;
    let timeout_s = match parsed.value("--timeout") {
        None => default_s as f64,
        Some(v) => match v.parse::<f64>() {
            Ok(s) if (min_s as f64..=max_s as f64).contains(&s) => s,
            _ => {
                return Err(format!(
                    "invalid --timeout '{v}': expected seconds from {min_s} to {max_s}"
                ));
            }
        },
    };
    let text = text_of(&parsed.rest)?;
    let max = if key.is_some() {
        e2e::MAX_CLEAR_BYTES
    } else {
        MAX_TEXT_BYTES
    };
    if text.len() > max {
        return Err(format!("the question exceeds {max} bytes"));
    }
    Ok(Options {
        client,
        session,
        prompt,
        text,
        choices,
        default,
        timeout_s,
        key,
    })
}

/// What `relay agent` adds to its command's environment, besides the
/// prompt's identity, so that `relay ask` in it needs no flags: the
/// agent's token and key, and the CA it trusts, when it was given them by
/// flag (from its own environment they are inherited as they are).
pub(super) fn handoff(
    parsed: &Parsed,
    token: Option<&str>,
    key: Option<&e2e::Key>,
) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if let Some(token) = token {
        env.push(("RELAY_AGENT_TOKEN", token.to_string()));
    }
    if let Some(key) = key {
        env.push(("RELAY_E2E_KEY", key.text().to_string()));
    }
    if let Some(ca) = parsed.value("--ca") {
        env.push(("RELAY_CA", ca.to_string()));
    }
    env
}

/// The server's rules for choices, said before anything is sent; sealed,
/// a choice must still fit the server's limit.
fn check_choices(choices: &[String], sealed: bool) -> Result<(), String> {
    let max_bytes = if sealed {
        e2e::max_clear_within(MAX_CHOICE_BYTES)
    } else {
        MAX_CHOICE_BYTES
    };
    if choices.len() > MAX_CHOICES {
        return Err(format!("at most {MAX_CHOICES} --choice"));
    }
    for (i, c) in choices.iter().enumerate() {
        if c.is_empty() {
            return Err("a --choice may not be empty".into());
        }
        if c.len() > max_bytes {
            let how = if sealed { ", encrypted" } else { "" };
            return Err(format!("--choice '{c}': at most {max_bytes} bytes{how}"));
        }
        if choices[..i].contains(c) {
            return Err(format!("--choice '{c}' is given twice"));
        }
    }
    Ok(())
}

/// The question: the words joined by spaces, or stdin for `-`.
fn text_of(rest: &[String]) -> Result<String, String> {
    match rest {
        [] => Err("TEXT is required".into()),
        [dash] if dash == "-" => {
            let mut text = String::new();
            std::io::stdin()
                .take(MAX_TEXT_BYTES as u64 + 1)
                .read_to_string(&mut text)
                .map_err(|e| format!("cannot read the question from stdin: {e}"))?;
            Ok(text)
        }
        words => Ok(words.join(" ")),
    }
}

/// `relay ask ARGS`: returns the exit code.
pub fn main(args: &[String], env: &[(String, String)]) -> u8 {
    let mut opts = match super::tool_options("ask", args, env, &SPEC, HELP, options) {
        Ok(o) => o,
        Err(code) => return code,
    };
    match run(&mut opts) {
        Ok(Ending::Answered(text)) => {
            println!("{text}");
            0
        }
        Ok(Ending::Expired) => {
            if let Some(default) = &opts.default {
                println!("{default}");
            }
            EXIT_EXPIRED
        }
        Err(e) => {
            eprintln!("relay ask: {e}");
            1
        }
    }
}

/// How an ask ended.
#[derive(Debug, PartialEq, Eq)]
enum Ending {
    /// The person's reply, in clear.
    Answered(String),
    /// Nobody replied in time.
    Expired,
}

/// The `POST /ask` body: the texts sealed with the ask's own associated
/// data when there is a key.
fn ask_body(opts: &Options, ask_id: &str) -> Result<Value, String> {
    let mut body = json!({
        "session_id": opts.session,
        "ask_id": ask_id,
        "text": opts.text,
        "timeout": opts.timeout_s,
    });
    if let Some(id) = &opts.prompt {
        body["client_msg_id"] = id.as_str().into();
    }
    if !opts.choices.is_empty() {
        body["choices"] = opts.choices.clone().into();
    }
    if let Some(d) = &opts.default {
        body["default"] = d.as_str().into();
    }
    let Some(key) = &opts.key else {
        return Ok(body);
    };
    let (session, ask_id) = (opts.session.as_str(), ask_id);
    let choice = e2e::Message::Choice { session, ask_id };
    body["text"] = key
        .seal_fixed(&opts.text, e2e::Message::Ask { session, ask_id })?
        .into();
    if !opts.choices.is_empty() {
        let sealed: Result<Vec<String>, String> = opts
            .choices
            .iter()
            .map(|c| key.seal_fixed(c, choice))
            .collect();
        body["choices"] = sealed?.into();
    }
    if let Some(d) = &opts.default {
        // With choices, the default is one of them: the same bytes.
        let role = if opts.choices.is_empty() {
            e2e::Message::Default { session, ask_id }
        } else {
            choice
        };
        body["default"] = key.seal_fixed(d, role)?.into();
    }
    body["metadata"] = json!({"e2e": 1});
    Ok(body)
}

/// The clear text of a reply as the server stored it.
fn open_reply(opts: &Options, ask_id: &str, stored: &str) -> Result<String, String> {
    let Some(key) = &opts.key else {
        if stored.starts_with(e2e::PREFIX) {
            return Err("the reply is end-to-end encrypted: give the key (--e2e-key-file, --e2e-key or RELAY_E2E_KEY)".into());
        }
        return Ok(stored.to_string());
    };
    let session = opts.session.as_str();
    let role = if opts.choices.is_empty() {
        e2e::Message::Reply { session, ask_id }
    } else {
        e2e::Message::Choice { session, ask_id }
    };
    match key.open(stored, role) {
        Some(clear) if opts.choices.is_empty() || opts.choices.contains(&clear) => Ok(clear),
        _ => Err("cannot decrypt the reply: it was not made with this key for this ask".into()),
    }
}

/// What one answer from the server means for the ask.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The ask is stored (or was already): wait for it.
    Posted,
    /// Still open: wait again.
    Open,
    Ended(Ending),
    /// The server does not know the ask (it lost it, restarting without
    /// storage): ask again, under the same id.
    Lost,
    /// Try the same request again after the delay (at least `Retry-After`).
    Retry(Option<Duration>),
    Fail(String),
}

/// Reads an answer to `POST /ask` (`posting`) or to a wait.
fn step(resp: &Response, posting: bool) -> Step {
    let error = resp
        .json()
        .and_then(|v| v["error"].as_str().map(str::to_string));
    match resp.status {
        200 if posting => Step::Posted,
        200 => {
            let body = resp.json().unwrap_or_default();
            match (body["state"].as_str(), body["text"].as_str()) {
                (Some("open"), _) => Step::Open,
                (Some("answered"), Some(text)) => Step::Ended(Ending::Answered(text.to_string())),
                (Some("expired"), _) => Step::Ended(Ending::Expired),
                _ => Step::Fail(format!("unexpected answer: {body}")),
            }
        }
        404 if !posting && error.as_deref() != Some("Session not found") => Step::Lost,
        408 | 429 | 500..=599 => Step::Retry(resp.retry_after.map(Duration::from_secs)),
        401 | 403 => Step::Fail(format!(
            "{} (check --token, --token-file or RELAY_AGENT_TOKEN: the agent token is needed)",
            resp.describe()
        )),
        _ => {
            let details = resp
                .json()
                .and_then(|v| v["details"].as_str().map(|d| format!(": {d}")))
                .unwrap_or_default();
            Step::Fail(format!("{}{details}", resp.describe()))
        }
    }
}

/// Asks, then waits until the ask ends; retries what can be retried
/// until the ask's expiry and [`EXPIRY_GRACE`] have passed.
fn run(opts: &mut Options) -> Result<Ending, String> {
    let ask_id = uuid::Uuid::new_v4().to_string();
    let body = ask_body(opts, &ask_id)?.to_string();
    let give_up = Instant::now() + Duration::from_secs_f64(opts.timeout_s) + EXPIRY_GRACE;
    let wait = format!("/asks/{}/{ask_id}?timeout={POLL_SECONDS}", opts.session);
    let mut posted = false;
    let mut delay = BACKOFF.0;
    let mut failing = false;
    loop {
        let (method, path, body, timeout) = if posted {
            let poll = Duration::from_secs(POLL_SECONDS) + POLL_MARGIN;
            ("GET", wait.as_str(), None, poll)
        } else {
            ("POST", "/ask", Some(body.as_bytes()), REQUEST_TIMEOUT)
        };
        let result = opts
            .client
            .request(method, path, body, Limit::within(timeout));
        let retry_after = match result {
            Ok(resp) => match step(&resp, !posted) {
                Step::Posted => {
                    posted = true;
                    None
                }
                Step::Open => None,
                Step::Ended(Ending::Answered(text)) => {
                    return open_reply(opts, &ask_id, &text).map(Ending::Answered);
                }
                Step::Ended(ending) => return Ok(ending),
                Step::Lost => {
                    posted = false;
                    Some(None)
                }
                Step::Retry(after) => Some(after),
                Step::Fail(why) => return Err(format!("{method} {path}: {why}")),
            },
            Err(client::Error::Tls(why)) => return Err(why),
            Err(e) => {
                if !failing {
                    eprintln!(
                        "relay ask: cannot reach the server {}: {e}; retrying",
                        opts.client.url().http("")
                    );
                }
                Some(None)
            }
        };
        let Some(after) = retry_after else {
            delay = BACKOFF.0;
            failing = false;
            continue;
        };
        failing = true;
        let pause = delay.max(after.unwrap_or_default().min(BACKOFF.2));
        if Instant::now() + pause > give_up {
            return Err(format!(
                "gave up: the server did not say how the ask ended ({method} {path} kept failing)"
            ));
        }
        std::thread::sleep(pause);
        delay = (delay * 2).min(BACKOFF.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(choices: &[&str], key: Option<e2e::Key>) -> Options {
        Options {
            client: Client::new(client::Url::parse("http://x").unwrap(), None, None),
            session: "s".into(),
            prompt: Some("m1".into()),
            text: "Run make deploy?".into(),
            choices: choices.iter().map(|c| c.to_string()).collect(),
            default: choices.last().map(|c| c.to_string()),
            timeout_s: 60.0,
            key,
        }
    }

    fn key() -> e2e::Key {
        e2e::Key::parse(&e2e::new_key().unwrap()).unwrap()
    }

    fn resp(status: u16, body: &str) -> Response {
        Response {
            status,
            body: body.as_bytes().to_vec(),
            retry_after: None,
        }
    }

    #[test]
    fn a_clear_ask_is_sent_as_given() {
        let body = ask_body(&opts(&["yes", "no"], None), "k1").unwrap();
        assert_eq!(
            body,
            json!({"session_id": "s", "ask_id": "k1", "text": "Run make deploy?",
                   "timeout": 60.0, "client_msg_id": "m1", "choices": ["yes", "no"],
                   "default": "no"})
        );
    }

    #[test]
    fn a_sealed_ask_repeats_its_bytes_and_its_default_is_a_choice() {
        let opts = opts(&["yes", "no"], Some(key()));
        let body = ask_body(&opts, "k1").unwrap();
        assert_eq!(
            body,
            ask_body(&opts, "k1").unwrap(),
            "a retry is a duplicate"
        );
        assert_eq!(body["default"], body["choices"][1]);
        assert_eq!(body["metadata"], json!({"e2e": 1}));
        let text = body.to_string();
        assert!(
            !text.contains("deploy") && !text.contains("\"yes\""),
            "{text}"
        );
        // The person's reply is the choice's bytes, and opens as the choice.
        let reply = body["choices"][0].as_str().unwrap();
        assert_eq!(open_reply(&opts, "k1", reply).unwrap(), "yes");
        assert!(open_reply(&opts, "k2", reply).is_err(), "another ask's");
        assert!(open_reply(&opts, "k1", "yes").is_err(), "in clear");
    }

    #[test]
    fn a_free_reply_opens_as_a_reply_only() {
        let key = key();
        let sealed = key
            .seal_fixed(
                "ship it",
                e2e::Message::Reply {
                    session: "s",
                    ask_id: "k1",
                },
            )
            .unwrap();
        let question = key
            .seal_fixed(
                "ship it",
                e2e::Message::Ask {
                    session: "s",
                    ask_id: "k1",
                },
            )
            .unwrap();
        let opts = opts(&[], Some(key));
        assert_eq!(open_reply(&opts, "k1", &sealed).unwrap(), "ship it");
        assert!(
            open_reply(&opts, "k1", &question).is_err(),
            "the question is no reply"
        );
        let clear = self::opts(&[], None);
        assert_eq!(open_reply(&clear, "k1", "ok").unwrap(), "ok");
        assert!(open_reply(&clear, "k1", &sealed).is_err(), "no key");
    }

    #[test]
    fn answers_become_steps() {
        let answered = r#"{"ask_id":"k","state":"answered","text":"yes"}"#;
        assert_eq!(
            step(&resp(200, answered), false),
            Step::Ended(Ending::Answered("yes".into()))
        );
        let expired = r#"{"ask_id":"k","state":"expired","text":"no"}"#;
        assert_eq!(
            step(&resp(200, expired), false),
            Step::Ended(Ending::Expired)
        );
        assert_eq!(step(&resp(200, r#"{"state":"open"}"#), false), Step::Open);
        assert_eq!(step(&resp(200, r#"{"ok":true}"#), true), Step::Posted);
        assert_eq!(
            step(&resp(404, r#"{"error":"Ask not found"}"#), false),
            Step::Lost
        );
        assert!(matches!(
            step(&resp(404, r#"{"error":"Session not found"}"#), false),
            Step::Fail(_)
        ));
        assert!(matches!(
            step(&resp(404, r#"{"error":"Session not found"}"#), true),
            Step::Fail(_)
        ));
        assert_eq!(step(&resp(503, "{}"), true), Step::Retry(None));
        let Step::Fail(why) = step(
            &resp(
                409,
                r#"{"error":"Conflict","details":"ask_id already used"}"#,
            ),
            true,
        ) else {
            panic!()
        };
        assert!(why.contains("ask_id already used"), "{why}");
        let Step::Fail(why) = step(&resp(401, r#"{"error":"Unauthorized"}"#), false) else {
            panic!()
        };
        assert!(why.contains("RELAY_AGENT_TOKEN"), "{why}");
    }

    #[test]
    fn choices_follow_the_servers_rules() {
        let c = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_choices(&c(&["yes", "no"]), true).is_ok());
        assert!(check_choices(&c(&[]), false).is_ok());
        assert!(check_choices(&c(&["a", "a"]), false).is_err());
        assert!(check_choices(&c(&[""]), false).is_err());
        assert!(check_choices(&c(&["1", "2", "3", "4", "5", "6", "7", "8", "9"]), false).is_err());
        let long = "x".repeat(200);
        assert!(check_choices(&c(&[&long]), false).is_ok());
        assert!(
            check_choices(&c(&[&long]), true).is_err(),
            "too long once sealed"
        );
    }
}
