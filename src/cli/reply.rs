//! `relay reply`: the person answers a question from the agent from a
//! terminal (`POST /reply`). With a key, a reply to an ask with choices must
//! be the chosen choice's own ciphertext for the server to accept it, so the
//! ask is read from `/messages` and its choices opened to find it; a free
//! reply is sealed as one.

use std::time::Duration;

use serde_json::{Value, json};

use super::client::{Client, Limit};
use super::{Parsed, Spec, e2e};
use crate::store::model::MAX_TEXT_BYTES;

/// How long each request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages read per page while looking for the ask (the server's cap).
const PAGE: usize = 1000;

const HELP: &str = "usage: relay reply --session ID --ask ASK_ID [--url URL] [--token-file FILE] [--ca FILE] [--e2e-key-file FILE] TEXT...

Answers the question ASK_ID of the session (what relay ask, or an agent,
asked) with TEXT, the words joined by spaces. When the question has
choices, TEXT must be one of them. The first reply wins.

  --session ID        the session (required)
  --ask ASK_ID        the question's ask_id, as the page or GET /messages shows it
  --url URL           the server (default RELAY_URL, else http://127.0.0.1:8000)
  --token-file FILE   read the client token from FILE; default
                      RELAY_CLIENT_TOKEN. Prefer one of these two to --token
  --token T           the client token itself: shown by ps to every user
  --ca FILE           for an https:// URL, trust only this PEM file's CA
                      (default RELAY_CA)
  --e2e-key-file FILE read the key from FILE; default RELAY_E2E_KEY
  --e2e-key KEY       the conversation's key: the question is read and the
                      reply sent encrypted

exit codes: 0 the reply is stored (or was already), 1 refused (already
answered otherwise, expired, not one of the choices, unknown) or the server
unreachable, 2 bad usage
";

const SPEC: Spec = Spec {
    valued: &[
        "--url",
        "--session",
        "--ask",
        "--token",
        "--token-file",
        "--ca",
        "--e2e-key",
        "--e2e-key-file",
    ],
    switches: &[],
    interleaved: true,
};

struct Options {
    client: Client,
    session: String,
    ask_id: String,
    text: String,
    key: Option<e2e::Key>,
}

fn options(parsed: &Parsed, env: &[(String, String)]) -> Result<Options, String> {
    let client = super::client_of(parsed, env, "RELAY_CLIENT_TOKEN")?;
    let session = super::session_of(parsed)?;
    let ask_id = match parsed.value("--ask") {
        Some(id) if !id.is_empty() && id.len() <= 256 => id.to_string(),
        Some(_) => return Err("--ask: 1 to 256 bytes".into()),
        None => return Err("--ask ASK_ID is required".into()),
    };
    let key = super::e2e_key_of(parsed, env)?;
    if parsed.rest.is_empty() {
        return Err("TEXT is required".into());
    }
    let text = parsed.rest.join(" ");
    if text.len() > MAX_TEXT_BYTES {
        return Err(format!("the reply exceeds {MAX_TEXT_BYTES} bytes"));
    }
    Ok(Options {
        client,
        session,
        ask_id,
        text,
        key,
    })
}

/// `relay reply ARGS`: returns the exit code.
pub fn main(args: &[String], env: &[(String, String)]) -> u8 {
    let mut opts = match super::tool_options("reply", args, env, &SPEC, HELP, options) {
        Ok(o) => o,
        Err(code) => return code,
    };
    match run(&mut opts) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("relay reply: {e}");
            1
        }
    }
}

fn run(opts: &mut Options) -> Result<(), String> {
    let text = match &opts.key {
        None => opts.text.clone(),
        Some(_) => {
            let ask = find_ask(opts)?;
            sealed_reply(opts, &ask)?
        }
    };
    let body = json!({"session_id": opts.session, "ask_id": opts.ask_id, "text": text});
    let resp = opts
        .client
        .request(
            "POST",
            "/reply",
            Some(body.to_string().as_bytes()),
            Limit::within(REQUEST_TIMEOUT),
        )
        .map_err(|e| format!("POST /reply: {e}"))?;
    if resp.status == 200 {
        return Ok(());
    }
    let details = resp
        .json()
        .and_then(|v| v["details"].as_str().map(|d| format!(": {d}")))
        .unwrap_or_default();
    let hint = match resp.status {
        401 | 403 => {
            " (check --token, --token-file or RELAY_CLIENT_TOKEN: the client token is needed)"
        }
        400 if opts.key.is_none() => " (if the question is end-to-end encrypted, give its key)",
        _ => "",
    };
    Err(format!("POST /reply: {}{details}{hint}", resp.describe()))
}

/// The ask's `data`, read from the session's history page by page.
fn find_ask(opts: &mut Options) -> Result<Value, String> {
    let mut after = 0;
    loop {
        let path = format!("/messages/{}?after={after}&limit={PAGE}", opts.session);
        let resp = opts
            .client
            .request("GET", &path, None, Limit::within(REQUEST_TIMEOUT))
            .map_err(|e| format!("GET /messages: {e}"))?;
        if resp.status != 200 {
            return Err(format!("GET /messages: {}", resp.describe()));
        }
        let body = resp.json().unwrap_or_default();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let found = messages
            .iter()
            .find(|m| m["type"] == "ask" && m["data"]["ask_id"] == opts.ask_id.as_str());
        if let Some(ask) = found {
            return Ok(ask["data"].clone());
        }
        match messages.last().and_then(|m| m["data"]["seq"].as_u64()) {
            Some(seq) if seq > after => after = seq,
            _ => {
                return Err(format!(
                    "no question {} in session {}",
                    opts.ask_id, opts.session
                ));
            }
        }
    }
}

/// The reply's text on the wire: the chosen choice's own ciphertext, or
/// for an ask without choices the text sealed as a reply.
fn sealed_reply(opts: &Options, ask: &Value) -> Result<String, String> {
    let Some(key) = &opts.key else {
        return Ok(opts.text.clone());
    };
    let (session, ask_id) = (opts.session.as_str(), opts.ask_id.as_str());
    let Some(choices) = ask["choices"].as_array() else {
        return key.seal_fixed(&opts.text, e2e::Message::Reply { session, ask_id });
    };
    let role = e2e::Message::Choice { session, ask_id };
    let mut offered = Vec::new();
    for sealed in choices.iter().filter_map(Value::as_str) {
        match key.open(sealed, role) {
            Some(clear) if clear == opts.text => return Ok(sealed.to_string()),
            Some(clear) => offered.push(clear),
            None => offered.push("(cannot decrypt)".into()),
        }
    }
    Err(format!(
        "'{}' is not one of the choices: {}",
        opts.text,
        offered.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::client::Url;

    #[test]
    fn a_choice_is_sent_as_the_asks_own_bytes() {
        let key = e2e::Key::parse(&e2e::new_key().unwrap()).unwrap();
        let role = e2e::Message::Choice {
            session: "s",
            ask_id: "k1",
        };
        // Sealed with random nonces (another implementation may): the
        // reply still repeats the ask's bytes.
        let choices = ["yes", "no"].map(|c| key.seal(c, role).unwrap());
        let ask = json!({"ask_id": "k1", "choices": choices});
        let mut opts = Options {
            client: Client::new(Url::parse("http://x").unwrap(), None, None),
            session: "s".into(),
            ask_id: "k1".into(),
            text: "no".into(),
            key: Some(key),
        };
        assert_eq!(sealed_reply(&opts, &ask).unwrap(), choices[1]);
        opts.text = "maybe".into();
        let e = sealed_reply(&opts, &ask).unwrap_err();
        assert!(e.contains("yes, no"), "{e}");
        let free = sealed_reply(&opts, &json!({"ask_id": "k1"})).unwrap();
        let reply = e2e::Message::Reply {
            session: "s",
            ask_id: "k1",
        };
        let key = opts.key.as_ref().unwrap();
        assert_eq!(key.open(&free, reply).as_deref(), Some("maybe"));
    }
}
