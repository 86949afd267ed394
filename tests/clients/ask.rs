//! Questions from the agent in the command line tools, against the real
//! server: `relay ask` waits for the person's reply and prints it (exit 0),
//! or ends with its default when the ask expires (exit 4); a command run by
//! `relay agent` calls it with no flags at all (the agent hands over the
//! server, session, prompt, token and key); with an end-to-end key the
//! server holds only ciphertext and still checks a reply against the
//! choices; `relay reply` answers from a terminal.
//!
//! Each test learns the generated `ask_id` from the `ask` frame on the
//! session's WebSocket, subscribed before anything is asked.

use crate::cli::{Agent, WAIT, relay, url};
use crate::common::{Server, Ws, unique_session};

use std::io::Read;
use std::process::{Child, Output, Stdio};
use std::time::Instant;

use serde_json::{Value, json};

/// The binary, for scripts run by the agent.
const RELAY: &str = env!("CARGO_BIN_EXE_relay");

/// Starts `relay ask` on `sid` with `args`; its output is read by `finish`.
fn ask(srv: &Server, sid: &str, args: &[&str]) -> Child {
    relay()
        .args(["ask", "--url", &url(srv), "--session", sid])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relay ask")
}

/// Waits (bounded) for a tool started with piped output to exit.
#[track_caller]
fn finish(mut child: Child) -> Output {
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("the tool did not exit within {WAIT:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Runs `relay reply` to completion.
fn reply(srv: &Server, sid: &str, ask_id: &str, args: &[&str]) -> Output {
    relay()
        .args([
            "reply",
            "--url",
            &url(srv),
            "--session",
            sid,
            "--ask",
            ask_id,
        ])
        .args(args)
        .output()
        .expect("run relay reply")
}

/// The next frame of type `kind`, skipping the others.
#[track_caller]
fn next(ws: &mut Ws, kind: &str) -> Value {
    loop {
        let frame = ws.recv_any_skip_pings();
        if frame["type"] == kind {
            return frame["data"].clone();
        }
    }
}

/// Posts the person's reply, asserting the server took it.
#[track_caller]
fn post_reply(srv: &Server, sid: &str, ask_id: &str, text: &str) {
    let body = json!({"session_id": sid, "ask_id": ask_id, "text": text});
    let resp = srv.post_json("/reply", &body);
    assert_eq!(resp.status, 200, "POST /reply: {}", resp.text());
}

/// A session to ask in (an ask creates none) and its subscriber.
fn session(srv: &Server) -> (String, Ws) {
    let sid = unique_session();
    assert_eq!(srv.put(&format!("/sessions/{sid}")).status, 200);
    let ws = srv.ws(&format!("/ws/{sid}"));
    (sid, ws)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn ask_prints_the_reply_it_waited_for() {
    let srv = Server::start();
    let (sid, mut ws) = session(&srv);
    let asking = ask(
        &srv,
        &sid,
        &["--choice", "yes", "--choice", "no", "Run", "make deploy?"],
    );
    let asked = next(&mut ws, "ask");
    assert_eq!(asked["text"], "Run make deploy?");
    assert_eq!(asked["choices"], json!(["yes", "no"]));
    post_reply(&srv, &sid, asked["ask_id"].as_str().unwrap(), "yes");
    let out = finish(asking);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out), "yes\n");
}

#[test]
fn an_unanswered_ask_expires_with_its_default() {
    let srv = Server::start();
    let (sid, mut ws) = session(&srv);
    let args = ["--timeout", "1", "--choice", "yes", "--choice", "no"];
    let with_default = ask(
        &srv,
        &sid,
        &[&args[..], &["--default", "no", "Deploy?"]].concat(),
    );
    let without = ask(&srv, &sid, &["--timeout", "1", "Which branch?"]);
    let first = next(&mut ws, "ask");
    let second = next(&mut ws, "ask");
    for asked in [&first, &second] {
        let default = asked.get("default").cloned().unwrap_or(Value::Null);
        assert!(
            default == "no" || asked["text"] == "Which branch?",
            "{asked}"
        );
    }
    let out = finish(with_default);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(stdout(&out), "no\n");
    let out = finish(without);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_eq!(stdout(&out), "", "no default, nothing printed");
}

#[test]
fn usage_errors_exit_two_before_any_request() {
    let cases: [&[&str]; 5] = [
        &["--session", "s", "--choice", "a", "--default", "b", "Q?"],
        &["--session", "s", "--choice", "a", "--choice", "a", "Q?"],
        &["--session", "s", "--timeout", "0", "Q?"],
        &["--session", "s"],
        &["Q?"],
    ];
    for args in cases {
        // Port 9 (discard): nothing listens, and no request is made anyway.
        let out = relay()
            .args(["ask", "--url", "http://127.0.0.1:9"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).starts_with("relay ask: "),
            "{out:?}"
        );
    }
}

/// The stand-in agent's approval hook: ask before acting, act only on a
/// "yes" (exit 0 means answered, whatever the answer; 4 expired).
const HOOK: &str = r#"answer=$("$RELAY" ask --choice yes --choice no --default no "Run make deploy?") && [ "$answer" = yes ] && echo approved || echo refused"#;

#[test]
fn a_command_under_the_agent_asks_with_no_flags() {
    // The agent's token is needed to ask: the agent hands its own over.
    let srv = Server::start_with(&[("RELAY_AGENT_TOKEN", "agent-secret")]);
    let (sid, mut ws) = session(&srv);
    let _agent = Agent::start_with_flags(
        &srv,
        &sid,
        &[("RELAY_AGENT_TOKEN", "agent-secret"), ("RELAY", RELAY)],
        &[],
        &["sh", "-c", HOOK],
    );
    for (id, choice, outcome) in [("m1", "yes", "approved"), ("m2", "no", "refused")] {
        srv.prompt(&sid, "deploy, please", Some(id));
        let asked = next(&mut ws, "ask");
        assert_eq!(asked["client_msg_id"], id, "{asked}");
        assert_eq!(asked["text"], "Run make deploy?");
        post_reply(&srv, &sid, asked["ask_id"].as_str().unwrap(), choice);
        let answer = next(&mut ws, "message");
        assert_eq!(
            (answer["client_msg_id"].as_str(), answer["text"].as_str()),
            (Some(id), Some(outcome))
        );
    }
}

#[test]
fn an_encrypted_ask_leaves_only_ciphertext_and_still_checks_the_choice() {
    let srv = Server::start();
    let (sid, mut ws) = session(&srv);
    let key = relay().arg("key").output().unwrap();
    let key = String::from_utf8(key.stdout).unwrap().trim().to_string();
    let _agent = Agent::start_with_flags(
        &srv,
        &sid,
        &[("RELAY_E2E_KEY", &key), ("RELAY", RELAY)],
        &[],
        &["sh", "-c", HOOK],
    );
    let sending = relay()
        .args(["send", "--url", &url(&srv), "--session", &sid])
        .args(["--e2e-key", &key, "--timeout", "20", "deploy, please"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let asked = next(&mut ws, "ask");
    let ask_id = asked["ask_id"].as_str().unwrap();
    let choices: Vec<&str> = asked["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(choices.iter().all(|c| c.starts_with("e2e1:")), "{asked}");
    assert_eq!(
        asked["default"], choices[1],
        "the default is a choice's bytes"
    );
    // Without the key, or with a text that is no choice: refused.
    let out = reply(&srv, &sid, ask_id, &["yes"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not one of the choices"),
        "{out:?}"
    );
    let out = reply(&srv, &sid, ask_id, &["--e2e-key", &key, "maybe"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("yes, no"),
        "{out:?}"
    );
    let out = reply(&srv, &sid, ask_id, &["--e2e-key", &key, "yes"]);
    assert!(out.status.success(), "{out:?}");
    let sent = finish(sending);
    assert!(sent.status.success(), "{sent:?}");
    assert_eq!(stdout(&sent), "approved\n");
    // The reply is the first choice's own bytes; nothing is in clear.
    let history = srv.messages(&sid, "?limit=1000");
    let replied = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["type"] == "reply")
        .expect("a reply in history");
    assert_eq!(replied["data"]["text"], choices[0]);
    let stored = history.to_string();
    for clear in ["deploy", "\"yes\"", "\"no\"", "approved"] {
        assert!(!stored.contains(clear), "{clear} in {stored}");
    }
}

#[test]
fn reply_answers_from_a_terminal() {
    let srv = Server::start();
    let (sid, mut ws) = session(&srv);
    let asking = ask(&srv, &sid, &["--choice", "yes", "--choice", "no", "Go?"]);
    let ask_id = next(&mut ws, "ask")["ask_id"].as_str().unwrap().to_string();
    let out = reply(&srv, &sid, &ask_id, &["Yes"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let out = reply(&srv, &sid, &ask_id, &["yes"]);
    assert!(out.status.success(), "{out:?}");
    let out = finish(asking);
    assert_eq!((out.status.code(), stdout(&out)), (Some(0), "yes\n".into()));
    // The first reply wins: the same again is fine, another is refused.
    assert!(reply(&srv, &sid, &ask_id, &["yes"]).status.success());
    let out = reply(&srv, &sid, &ask_id, &["no"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ask already answered"),
        "{out:?}"
    );
    // A free reply, encrypted both ways, sealed the same on a retry.
    let key = relay().arg("key").output().unwrap();
    let key = String::from_utf8(key.stdout).unwrap().trim().to_string();
    let asking = ask(&srv, &sid, &["--e2e-key", &key, "Which branch?"]);
    let ask_id = next(&mut ws, "ask")["ask_id"].as_str().unwrap().to_string();
    let words = ["--e2e-key", &key, "release", "forty-two"];
    assert!(reply(&srv, &sid, &ask_id, &words).status.success());
    let out = finish(asking);
    assert_eq!(
        (out.status.code(), stdout(&out)),
        (Some(0), "release forty-two\n".into())
    );
    let again = reply(&srv, &sid, &ask_id, &words);
    assert!(
        again.status.success(),
        "a repeated reply is a duplicate: {again:?}"
    );
    let stored = srv.messages(&sid, "?limit=1000").to_string();
    assert!(
        !stored.contains("forty-two") && !stored.contains("branch"),
        "{stored}"
    );
}
