//! End-to-end encryption in the tools against the real server: `relay key`
//! makes a key; `relay send` and `relay agent` with it round trip a
//! conversation while the server holds only ciphertext (not in
//! `/messages`, not in its debug log); a prompt sent with another key, or
//! a ciphertext moved into another session, is answered with an error and
//! not run.

mod common;

use std::process::{Child, Command, Output, Stdio};

use common::*;
use serde_json::json;

/// The binary with the caller's `RELAY_*` settings removed (and the
/// harness's CA trusted with `TEST_WITH_TLS`).
fn relay() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relay"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RELAY_") || key == "PORT" {
            cmd.env_remove(key);
        }
    }
    if tls_mode() {
        cmd.env("RELAY_CA", &tls_files().ca);
    }
    cmd.stdin(Stdio::null());
    cmd
}

fn url(srv: &Server) -> String {
    let scheme = if tls_mode() { "https" } else { "http" };
    format!("{scheme}://{}", srv.addr())
}

#[track_caller]
fn new_key() -> String {
    let out = relay().arg("key").output().expect("run relay key");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A `relay agent` with `key` running `tr a-z A-Z`, killed on drop.
struct Agent(Child);

impl Agent {
    #[track_caller]
    fn start(srv: &Server, sid: &str, key: &str) -> Agent {
        let child = relay()
            .args(["agent", "--url", &url(srv), "--session", sid])
            .env("RELAY_E2E_KEY", key)
            .args(["--", "tr", "a-z", "A-Z"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn relay agent");
        srv.wait_health("parked_polls", 1);
        Agent(child)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
        ])
        .args(["--e2e-key", key, text])
        .output()
        .expect("run relay send")
}

#[test]
fn a_conversation_round_trips_while_the_server_holds_only_ciphertext() {
    let srv = Server::start_with(&[("RELAY_LOG", "debug")]);
    let sid = unique_session();
    let key = new_key();
    let _agent = Agent::start(&srv, &sid, &key);
    let out = send(&srv, &sid, &key, "attack at dawn");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ATTACK AT DAWN\n");

    let history = srv.messages(&sid, "");
    let text = history.to_string();
    for clear in ["attack at dawn", "ATTACK AT DAWN"] {
        assert!(!text.contains(clear), "{clear} in /messages: {text}");
        let logged = srv.logs().into_iter().find(|l| l.contains(clear));
        assert!(logged.is_none(), "{clear} in the server's log: {logged:?}");
    }
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{history}");
    for m in messages {
        let field = if m["type"] == "prompt" {
            "prompt"
        } else {
            "text"
        };
        let stored = m["data"][field].as_str().unwrap();
        assert!(stored.starts_with("e2e1:"), "{m}");
        assert_eq!(m["data"]["metadata"]["e2e"], 1, "{m}");
    }
}

#[test]
fn a_prompt_that_does_not_decrypt_gets_an_error_answer_and_is_not_run() {
    let srv = Server::start();
    let sid = unique_session();
    let key = new_key();
    let _agent = Agent::start(&srv, &sid, &key);
    // Another key: the sender cannot read the error answer either.
    let out = send(&srv, &sid, &new_key(), "hello");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cannot decrypt\n");
    // A ciphertext made for another session, moved here, and a clear prompt.
    let other = unique_session();
    let moved = relay::cli::e2e::Key::parse(&key)
        .unwrap()
        .seal(
            "moved",
            relay::cli::e2e::Message::Prompt {
                session: &other,
                client_msg_id: "m-moved",
            },
        )
        .unwrap();
    srv.prompt(&sid, &moved, Some("m-moved"));
    srv.prompt(&sid, "in clear", Some("m-clear"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let answers = loop {
        let history = srv.messages(&sid, "");
        let answers: Vec<_> = history["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == "assistant")
            .map(|m| m["data"].clone())
            .collect();
        if answers.len() == 3 || std::time::Instant::now() > deadline {
            break answers;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(answers.len(), 3, "{answers:?}");
    for a in &answers {
        assert_eq!(a["text"], "cannot decrypt", "{a}");
        assert!(
            a["metadata"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("cannot decrypt")),
            "{a}"
        );
    }
    assert!(
        !json!(answers).to_string().contains("MOVED"),
        "the command never ran"
    );
}

#[test]
fn relay_key_prints_a_fresh_key_each_time() {
    let (a, b) = (new_key(), new_key());
    assert_ne!(a, b);
    assert_eq!(a.len(), 43, "{a}");
}
