//! `relay agent --context N` against the real server: the command gets the
//! conversation in clear text in the file `RELAY_CONTEXT_FILE` names, read
//! with the agent token and opened with the agent's key, while the server
//! holds ciphertext; the file is gone once the command has ended.

use std::process::Output;

use crate::cli::{Agent, Scratch, relay, url};
use crate::common::{Server, unique_session};
use serde_json::Value;

/// `relay send` with the client token and `key`, to completion.
fn send(srv: &Server, sid: &str, key: &str, text: &str) -> Output {
    relay()
        .args([
            "send",
            "--url",
            &url(srv),
            "--session",
            sid,
            "--timeout",
            "20",
            text,
        ])
        .env("RELAY_CLIENT_TOKEN", "client-secret")
        .env("RELAY_E2E_KEY", key)
        .output()
        .expect("run relay send")
}

#[test]
fn a_model_gets_the_conversation_in_clear_text_from_a_file() {
    let srv = Server::start_with(&[
        ("RELAY_AGENT_TOKEN", "agent-secret"),
        ("RELAY_CLIENT_TOKEN", "client-secret"),
    ]);
    let sid = unique_session();
    let key = String::from_utf8(relay().arg("key").output().unwrap().stdout).unwrap();
    let key = key.trim();
    let dir = Scratch::new();
    // A stand-in model: keeps a copy of what it was given and where, and
    // answers with the number of lines of conversation.
    let model = format!(
        r#"cp "$RELAY_CONTEXT_FILE" {copy} && printf '%s' "$RELAY_CONTEXT_FILE" > {path} && echo "lines: $(wc -l < "$RELAY_CONTEXT_FILE")""#,
        copy = dir.path("context.jsonl"),
        path = dir.path("path"),
    );
    let _agent = Agent::start_with_flags(
        &srv,
        &sid,
        &[
            ("RELAY_AGENT_TOKEN", "agent-secret"),
            ("RELAY_E2E_KEY", key),
        ],
        &["--context", "20"],
        &["sh", "-c", &model],
    );
    srv.wait_health("parked_polls", 1);
    let first = send(&srv, &sid, key, "hello there");
    assert!(first.status.success(), "{first:?}");
    assert_eq!(String::from_utf8_lossy(&first.stdout), "lines: 1\n");
    let second = send(&srv, &sid, key, "what did I say?");
    assert!(second.status.success(), "{second:?}");
    assert_eq!(String::from_utf8_lossy(&second.stdout), "lines: 3\n");

    let copy = std::fs::read_to_string(dir.path("context.jsonl")).unwrap();
    let lines: Vec<Value> = copy
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let texts: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| {
            let text = if l["type"] == "prompt" {
                &l["data"]["prompt"]
            } else {
                &l["data"]["text"]
            };
            (l["type"].as_str().unwrap(), text.as_str().unwrap())
        })
        .collect();
    assert_eq!(
        texts,
        [
            ("prompt", "hello there"),
            ("assistant", "lines: 1"),
            ("prompt", "what did I say?")
        ],
        "{copy}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["data"]["session_id"] == sid.as_str()),
        "{copy}"
    );
    let stored = srv.request(
        "GET",
        &format!("/messages/{sid}"),
        &[("Authorization", "Bearer client-secret")],
        None,
    );
    assert_eq!(stored.status, 200, "{}", stored.text());
    assert!(
        !stored.text().contains("hello there"),
        "the server holds only ciphertext"
    );
    let path = std::fs::read_to_string(dir.path("path")).unwrap();
    assert!(
        !std::path::Path::new(&path).exists(),
        "{path} outlived its command"
    );
}
