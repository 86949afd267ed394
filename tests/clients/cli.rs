//! The command line tools against the real server: `relay agent`, `relay
//! send` and `relay health` run as the real binary, the server through the
//! harness. Waits are readiness checks: a log line of the agent, a counter
//! in `/healthz`, a marker file the command creates, a WebSocket frame,
//! what a tool printed so far.
//!
//! Streaming is shown without timing: the command prints a first word, then
//! waits for a file that the test creates only once it saw that word arrive
//! (as a `delta` frame, or on `relay send`'s stdout), so the word cannot
//! have come with the final answer.

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Server, unique_session};
use serde_json::{Value, json};

/// How long a tool may take to show what a test waits for.
pub(crate) const WAIT: Duration = Duration::from_secs(15);

/// The binary with the caller's `RELAY_*` settings removed; with
/// `TEST_WITH_TLS`, trusting the harness's CA (`RELAY_CA`), and for `relay
/// health` without `--url` told the server speaks TLS (`RELAY_TLS_CERT`).
pub(crate) fn relay() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relay"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RELAY_") || key == "PORT" {
            cmd.env_remove(key);
        }
    }
    if common::tls_mode() {
        let files = common::tls_files();
        cmd.env("RELAY_CA", &files.ca)
            .env("RELAY_TLS_CERT", &files.cert);
    }
    cmd.stdin(Stdio::null());
    cmd
}

pub(crate) fn url(srv: &Server) -> String {
    let scheme = if common::tls_mode() { "https" } else { "http" };
    format!("{scheme}://{}", srv.addr())
}

type Lines = Arc<(Mutex<(Vec<String>, bool)>, Condvar)>;

/// A running `relay agent` whose JSON log lines are collected; killed on drop.
pub(crate) struct Agent {
    pub(crate) child: Child,
    log: Lines,
}

impl Agent {
    #[track_caller]
    pub(crate) fn start(srv: &Server, sid: &str, env: &[(&str, &str)], command: &[&str]) -> Agent {
        Agent::start_with_flags(srv, sid, env, &[], command)
    }

    /// `start` with more flags for the agent (before the `--`).
    #[track_caller]
    pub(crate) fn start_with_flags(
        srv: &Server,
        sid: &str,
        env: &[(&str, &str)],
        flags: &[&str],
        command: &[&str],
    ) -> Agent {
        let mut args = vec!["--session", sid];
        args.extend_from_slice(flags);
        Agent::spawn(srv, env, &args, command)
    }

    /// `relay agent` with exactly these flags (no `--session` added).
    pub(crate) fn spawn(
        srv: &Server,
        env: &[(&str, &str)],
        flags: &[&str],
        command: &[&str],
    ) -> Agent {
        let mut cmd = relay();
        cmd.args(["agent", "--url", &url(srv)])
            .args(flags)
            .arg("--")
            .args(command)
            .env("RELAY_LOG_FORMAT", "json")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn relay agent");
        let stderr = child.stderr.take().expect("piped stderr");
        let log: Lines = Arc::default();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.0.lock().unwrap().0.push(line);
                sink.1.notify_all();
            }
            sink.0.lock().unwrap().1 = true;
            sink.1.notify_all();
        });
        Agent { child, log }
    }

    /// Log lines whose `event` is `event`.
    pub(crate) fn events(&self, event: &str) -> Vec<Value> {
        events(&self.log.0.lock().unwrap().0, event)
    }

    /// Waits until `done` holds for the log lines so far; returns them.
    #[track_caller]
    fn wait_for(&self, what: &str, done: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + WAIT;
        let mut state = self.log.0.lock().unwrap();
        loop {
            if done(&state.0) {
                return state.0.clone();
            }
            let now = Instant::now();
            if state.1 || now >= deadline {
                panic!(
                    "the agent never logged {what}; log:\n{}",
                    state.0.join("\n")
                );
            }
            state = self.log.1.wait_timeout(state, deadline - now).unwrap().0;
        }
    }

    /// Waits until `n` lines have the event `event`; returns them.
    #[track_caller]
    pub(crate) fn wait_events(&self, event: &str, n: usize) -> Vec<Value> {
        let lines = self.wait_for(&format!("{n} x {event:?}"), |l| events(l, event).len() >= n);
        events(&lines, event)
    }

    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    #[track_caller]
    pub(crate) fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "the agent did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- agent log ---\n{}",
                self.log.0.lock().unwrap().0.join("\n")
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON log lines whose `event` is `event`.
fn events(lines: &[String], event: &str) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

/// Runs `relay send` to completion.
fn send(srv: &Server, sid: &str, args: &[&str]) -> Output {
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
        .args(args)
        .output()
        .expect("run relay send")
}

/// A scratch directory for marker files, removed on drop.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new() -> Scratch {
        let dir = std::env::temp_dir().join(format!("relay-cli-{}", unique_session()));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits (bounded) until a command has created `path`.
#[track_caller]
pub(crate) fn wait_file(path: &str) {
    let deadline = Instant::now() + WAIT;
    while !Path::new(path).exists() {
        assert!(Instant::now() < deadline, "{path} was never created");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The assistant messages of a session, oldest first.
pub(crate) fn answers(srv: &Server, sid: &str) -> Vec<Value> {
    let body = srv.messages(sid, "?limit=1000");
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["type"] == "assistant")
        .map(|m| m["data"].clone())
        .collect()
}

/// Posts a prompt with metadata.
#[track_caller]
fn prompt_with(srv: &Server, sid: &str, id: &str, text: &str, metadata: Value) {
    let body =
        json!({"session_id": sid, "client_msg_id": id, "prompt": text, "metadata": metadata});
    let resp = srv.post_json("/prompt", &body);
    assert_eq!(resp.status, 200, "{}", resp.text());
}

#[test]
fn send_prints_the_answer_an_agent_computes() {
    let srv = Server::start();
    let sid = unique_session();
    let _agent = Agent::start(&srv, &sid, &[], &["tr", "a-z", "A-Z"]);
    srv.wait_health("parked_polls", 1);
    let out = send(&srv, &sid, &["hello"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO\n");
    // The generated id is printed only when asked for.
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("client_msg_id"),
        "{out:?}"
    );
    let out = send(&srv, &sid, &["--verbose", "again"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "AGAIN\n");
    let id = answers(&srv, &sid)[1]["client_msg_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("relay send: client_msg_id {id}")),
        "{out:?}"
    );
}

#[test]
fn tokens_come_from_flags_or_the_environment() {
    let srv = Server::start_with(&[
        ("RELAY_AGENT_TOKEN", "agent-secret"),
        ("RELAY_CLIENT_TOKEN", "client-secret"),
    ]);
    let sid = unique_session();
    let mut refused = Agent::start(&srv, &sid, &[("RELAY_AGENT_TOKEN", "wrong")], &["cat"]);
    assert_eq!(refused.wait_exit().code(), Some(1));
    // The process may be gone before its last line is read.
    refused.wait_for("agent failed", |l| !events(l, "agent failed").is_empty());
    let failure = &refused.events("agent failed")[0];
    assert!(
        failure["error"].as_str().unwrap().contains("401"),
        "{failure}"
    );
    let _agent = Agent::start(
        &srv,
        &sid,
        &[("RELAY_AGENT_TOKEN", "agent-secret")],
        &["cat"],
    );
    let out = send(&srv, &sid, &["--token", "client-secret", "with a token"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "with a token\n");
    let out = relay()
        .args(["send", "--url", &url(&srv), "--session", &sid, "hi"])
        .env("RELAY_CLIENT_TOKEN", "wrong")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("401"), "{out:?}");
    assert!(
        stderr.contains("401 Unauthorized: client or agent token required (the client token: --token, --token-file or RELAY_CLIENT_TOKEN)"),
        "{stderr}"
    );
}

#[test]
fn the_command_gets_the_prompts_identity_and_the_agents_token_only() {
    let srv = Server::start_with(&[("RELAY_AGENT_TOKEN", "agent-secret")]);
    let sid = unique_session();
    // The agent's token is handed on (for `relay ask`); the person's is not.
    let script = r#"printf '%s|%s|%s|%s|%s' "$RELAY_SESSION_ID" "$RELAY_CLIENT_MSG_ID" "$RELAY_METADATA" "${RELAY_AGENT_TOKEN-none}" "${RELAY_CLIENT_TOKEN-none}""#;
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    prompt_with(&srv, &sid, "m1", "x", json!({"k": [1, "é"]}));
    srv.prompt(&sid, "y", Some("m2"));
    let _agent = Agent::start(
        &srv,
        &sid,
        &[
            ("RELAY_AGENT_TOKEN", "agent-secret"),
            ("RELAY_CLIENT_TOKEN", "client-secret"),
        ],
        &["sh", "-c", script],
    );
    let first = ws.recv_json_skip_pings();
    let second = ws.recv_json_skip_pings();
    assert_eq!(
        first["data"]["text"],
        format!(r#"{sid}|m1|{{"k":[1,"é"]}}|agent-secret|none"#)
    );
    assert_eq!(
        second["data"]["text"],
        format!("{sid}|m2|{{}}|agent-secret|none")
    );
}

#[test]
fn prompts_waiting_before_the_agent_starts_are_answered_in_order_once() {
    let srv = Server::start();
    let sid = unique_session();
    for i in 1..=3 {
        srv.prompt(&sid, &format!("p{i}"), Some(&format!("m{i}")));
    }
    let agent = Agent::start(&srv, &sid, &[], &["tr", "a-z", "A-Z"]);
    agent.wait_events("prompt answered", 3);
    // A later prompt is answered after them; nothing earlier comes again.
    srv.prompt(&sid, "p4", Some("m4"));
    agent.wait_events("prompt answered", 4);
    let got: Vec<(String, String)> = answers(&srv, &sid)
        .iter()
        .map(|a| {
            (
                a["client_msg_id"].as_str().unwrap().to_string(),
                a["text"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = (1..=4)
        .map(|i| (format!("m{i}"), format!("P{i}")))
        .collect();
    assert_eq!(got, want);
    assert!(srv.pending(&sid).is_empty());
}

#[test]
fn an_agent_killed_mid_prompt_answers_it_once_after_a_restart() {
    let srv = Server::start();
    let sid = unique_session();
    let scratch = Scratch::new();
    let marker = scratch.path("started");
    // The first run hangs (and is killed with its agent); the rerun answers.
    let script = r#"if [ -e "$MARKER" ]; then cat; else touch "$MARKER"; sleep 5; cat; fi"#;
    let env = [("MARKER", marker.as_str())];
    let mut first = Agent::start(&srv, &sid, &env, &["sh", "-c", script]);
    srv.prompt(&sid, "once", Some("m1"));
    wait_file(&marker);
    first.child.kill().expect("SIGKILL the agent");
    first.wait_exit();
    let second = Agent::start(&srv, &sid, &env, &["sh", "-c", script]);
    second.wait_events("prompt answered", 1);
    srv.prompt(&sid, "next", Some("m2"));
    second.wait_events("prompt answered", 2);
    let ids: Vec<Value> = answers(&srv, &sid)
        .iter()
        .map(|a| a["client_msg_id"].clone())
        .collect();
    assert_eq!(ids, [json!("m1"), json!("m2")]);
}

#[test]
fn two_agents_woken_by_one_prompt_store_one_answer() {
    let srv = Server::start();
    let sid = unique_session();
    // The same text from both (a duplicate), then a different one (a conflict).
    let script = r#"read -r p; printf %s "$p"; [ "$p" != differ ] || printf ' %s' "$WHO""#;
    let a = Agent::start(&srv, &sid, &[("WHO", "a")], &["sh", "-c", script]);
    let b = Agent::start(&srv, &sid, &[("WHO", "b")], &["sh", "-c", script]);
    srv.wait_health("parked_polls", 2);
    srv.prompt(&sid, "same", Some("m1"));
    a.wait_events("prompt answered", 1);
    b.wait_events("prompt answered", 1);
    let duplicates = [&a, &b]
        .iter()
        .filter(|x| x.events("prompt answered")[0]["duplicate"] == "true")
        .count();
    assert_eq!(duplicates, 1);
    srv.wait_health("parked_polls", 2);
    srv.prompt(&sid, "differ", Some("m2"));
    const CONFLICT: &str = "prompt already answered with a different text";
    let conflicts = [&a, &b].map(|x| {
        let lines = x.wait_for("an outcome for m2", |l| {
            events(l, "prompt answered").len() + events(l, CONFLICT).len() == 2
        });
        events(&lines, CONFLICT).len()
    });
    assert_eq!(conflicts.iter().sum::<usize>(), 1);
    let ids: Vec<Value> = answers(&srv, &sid)
        .iter()
        .map(|a| a["client_msg_id"].clone())
        .collect();
    assert_eq!(ids, [json!("m1"), json!("m2")]);
}

#[test]
fn a_failing_command_answers_with_its_exit_code() {
    let srv = Server::start();
    let sid = unique_session();
    let script = r#"read -r p; [ "$p" != kill ] || kill -9 $$; echo oops; exit 3"#;
    let _agent = Agent::start(&srv, &sid, &[], &["sh", "-c", script]);
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.prompt(&sid, "fail", Some("m1"));
    let answer = ws.recv_json_skip_pings();
    assert_eq!(answer["data"]["text"], "oops");
    assert_eq!(
        answer["data"]["metadata"],
        json!({"error": "the command exited with code 3", "exit_code": 3})
    );
    srv.prompt(&sid, "kill", Some("m2"));
    let answer = ws.recv_json_skip_pings();
    assert_eq!(answer["data"]["text"], "");
    assert_eq!(
        answer["data"]["metadata"],
        json!({"error": "the command was killed by signal 9", "exit_code": 137, "signal": 9})
    );
}

#[test]
fn a_failure_is_an_error_answer_with_stderr_and_send_exits_three() {
    let srv = Server::start();
    let sid = unique_session();
    // A model runner that cannot load its model: a reason on stderr, exit 3.
    let script =
        r#"cat > /dev/null; echo 'loading...' >&2; echo 'model not found: tiny' >&2; exit 3"#;
    let agent = Agent::start(&srv, &sid, &[], &["sh", "-c", script]);
    srv.wait_health("parked_polls", 1);
    let out = send(&srv, &sid, &["hello"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(out.stdout.is_empty(), "no empty line: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("loading...\nmodel not found: tiny (exit code 3)"),
        "{stderr}"
    );
    let stored = &answers(&srv, &sid)[0];
    assert_eq!(stored["text"], "");
    assert_eq!(
        stored["metadata"],
        json!({"error": "loading...\nmodel not found: tiny", "exit_code": 3})
    );
    let logged = &agent.wait_events("prompt answered", 1)[0];
    assert_eq!(logged["error"], "true", "{logged}");
}

#[test]
fn a_command_that_cannot_start_is_an_error_answer_with_a_null_exit_code() {
    let srv = Server::start();
    let sid = unique_session();
    // Found and executable at start, but its interpreter is missing: exec fails.
    let scratch = Scratch::new();
    let broken = scratch.path("broken");
    std::fs::write(&broken, "#!/nonexistent/interpreter\n").unwrap();
    let chmod = Command::new("chmod")
        .args(["+x", &broken])
        .status()
        .unwrap();
    assert!(chmod.success());
    let agent = Agent::start(&srv, &sid, &[], &[&broken]);
    srv.prompt(&sid, "one", Some("m1"));
    srv.prompt(&sid, "two", Some("m2"));
    agent.wait_events("prompt answered", 2);
    let stored = answers(&srv, &sid);
    assert_eq!(stored.len(), 2, "the agent goes on to the next prompt");
    let meta = &stored[0]["metadata"];
    assert_eq!(meta["exit_code"], Value::Null, "{meta}");
    assert!(
        meta.as_object().unwrap().contains_key("exit_code"),
        "{meta}"
    );
    let error = meta["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!("cannot start {broken}: ")),
        "{error}"
    );
    assert_eq!(stored[0]["text"], "");
}

#[test]
fn a_missing_command_exits_two_before_any_request() {
    // A closed port: had the agent polled, it would retry, not exit.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let scratch = Scratch::new();
    let plain = scratch.path("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    for (command, why) in [
        ("no-such-model-runner", "command not found"),
        ("/nonexistent/runner", "/nonexistent/runner"),
        (plain.as_str(), "not executable"),
    ] {
        let out = relay()
            .args([
                "agent",
                "--url",
                &format!("http://{addr}"),
                "--session",
                "s",
            ])
            .args(["--", command, "--flag"])
            .output()
            .expect("run relay agent");
        assert_eq!(out.status.code(), Some(2), "{command}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cannot run the command") && stderr.contains(why),
            "{stderr}"
        );
    }
}

#[test]
fn the_agent_logs_its_url_and_says_when_it_cannot_reach_it() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let url = format!("http://{addr}");
    let mut cmd = relay();
    cmd.args(["agent", "--url", &url, "--session", "s", "--", "cat"])
        .env("RELAY_LOG_FORMAT", "json")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn relay agent");
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut next = || -> Value {
        let line = lines.next().expect("a log line").expect("UTF-8 log");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let started = next();
    let unreachable = next();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(started["event"], "agent started", "{started}");
    assert_eq!(started["url"], url, "{started}");
    assert_eq!(
        unreachable["event"], "cannot reach the server",
        "{unreachable}"
    );
    assert_eq!(unreachable["url"], url, "{unreachable}");
    assert!(
        unreachable["error"]
            .as_str()
            .unwrap()
            .contains("cannot connect")
    );
}

#[test]
fn sigterm_lets_the_prompt_in_hand_finish_then_exits_zero() {
    let srv = Server::start();
    let sid = unique_session();
    let scratch = Scratch::new();
    let (marker, go) = (scratch.path("started"), scratch.path("go"));
    let script = r#"touch "$MARKER"; while [ ! -e "$GO" ]; do sleep 0.01; done; cat"#;
    let env = [("MARKER", marker.as_str()), ("GO", go.as_str())];
    let mut agent = Agent::start(&srv, &sid, &env, &["sh", "-c", script]);
    srv.prompt(&sid, "finish me", Some("m1"));
    wait_file(&marker);
    agent.signal("TERM");
    std::fs::write(&go, b"").expect("release the command");
    let status = agent.wait_exit();
    assert_eq!(status.code(), Some(0));
    let texts: Vec<Value> = answers(&srv, &sid)
        .iter()
        .map(|a| a["text"].clone())
        .collect();
    assert_eq!(texts, [json!("finish me")]);
}

#[test]
fn an_idle_agent_exits_promptly_on_sigint() {
    let srv = Server::start();
    let sid = unique_session();
    let mut agent = Agent::start(&srv, &sid, &[], &["cat"]);
    srv.wait_health("parked_polls", 1);
    let started = Instant::now();
    agent.signal("INT");
    assert_eq!(agent.wait_exit().code(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    agent.wait_events("agent stopped", 1);
}

#[test]
fn the_agent_survives_a_server_restart() {
    // One relay, restarted: a process's own life (with `TEST_WITH_REDIS`
    // each start has a fresh key prefix, so fresh state as in memory).
    let mut first = Server::start_single();
    let port = first.addr().port().to_string();
    let sid = unique_session();
    let agent = Agent::start(&first, &sid, &[], &["tr", "a-z", "A-Z"]);
    first.prompt(&sid, "before", Some("m1"));
    agent.wait_events("prompt answered", 1);
    first.sigterm();
    assert!(first.wait_exit(WAIT).is_some_and(|s| s.success()));
    let second = Server::start_single_with(&[("RELAY_PORT", port.as_str())]);
    // The new server's session restarts at seq 1, below the agent's cursor:
    // the agent must notice the new epoch and read from the start.
    let mut ws = second.ws(&format!("/ws/{sid}"));
    second.prompt(&sid, "after", Some("m2"));
    let answer = ws.recv_json_skip_pings();
    assert_eq!(answer["data"]["client_msg_id"], "m2");
    assert_eq!(answer["data"]["text"], "AFTER");
    let failures =
        agent.events("request failed").len() + agent.events("cannot reach the server").len();
    assert!(failures > 0, "the restart was noticed");
}

#[test]
fn send_with_all_prints_every_part_until_its_timeout() {
    let srv = Server::start();
    let sid = unique_session();
    let sender = {
        let url = url(&srv);
        let sid = sid.clone();
        std::thread::spawn(move || {
            relay()
                .args([
                    "send",
                    "--url",
                    &url,
                    "--session",
                    &sid,
                    "--all",
                    "--timeout",
                    "3",
                ])
                .args(["two", "parts"])
                .output()
                .expect("run relay send")
        })
    };
    // The prompt is posted once send is subscribed; answer it in two parts,
    // with an answer to another prompt in between.
    let deadline = Instant::now() + WAIT;
    let pending = loop {
        // 404 until send's WebSocket creates the session.
        let resp = srv.get(&format!("/prompts/{sid}?wait=false"));
        if resp.status == 200 && resp.json() != json!([]) {
            break resp.json();
        }
        assert!(Instant::now() < deadline, "send never posted its prompt");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(pending[0]["prompt"], "two parts");
    let id = pending[0]["client_msg_id"].as_str().unwrap();
    srv.prompt(&sid, "other", Some("other"));
    for (cid, part) in [(id, "one"), ("other", "not mine"), (id, "two")] {
        let body = json!({"session_id": sid, "client_msg_id": cid, "text": part, "assistant_msg_id": format!("{cid}-{part}")});
        assert_eq!(srv.post_json("/response", &body).status, 200);
    }
    let out = sender.join().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\ntwo\n");
}

#[test]
fn send_without_an_answer_exits_one_after_its_timeout() {
    let srv = Server::start();
    let sid = unique_session();
    let out = relay()
        .args([
            "send",
            "--url",
            &url(&srv),
            "--session",
            &sid,
            "--timeout",
            "0.3",
            "hello",
        ])
        .output()
        .expect("run relay send");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty());
    assert_eq!(srv.pending(&sid).len(), 1, "the prompt was posted");
}

#[test]
fn health_exits_zero_for_a_live_server_and_one_for_a_closed_port() {
    let srv = Server::start();
    let out = relay()
        .args(["health", "--url", &url(&srv)])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(r#""ok":true"#));
    // Without --url: the server's own RELAY_HOST and RELAY_PORT.
    let port = srv.addr().port().to_string();
    let out = relay()
        .args(["health"])
        .env("RELAY_PORT", &port)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // RELAY_URL, as the other tools read it.
    let out = relay()
        .args(["health"])
        .env("RELAY_URL", url(&srv))
        .env("RELAY_PORT", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let out = relay()
        .args(["health", "--url", &format!("http://{addr}")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}

#[test]
fn help_lists_the_commands_and_bad_usage_exits_two() {
    let out = relay().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for command in ["relay agent", "relay send", "relay health", "--port"] {
        assert!(help.contains(command), "{command} missing from:\n{help}");
    }
    for command in ["agent", "send", "health"] {
        let out = relay().args([command, "--help"]).output().unwrap();
        assert!(out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with(&format!("usage: relay {command}"))
        );
    }
    let out = relay().args(["agent", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--no-stream"));
    for args in [
        &["agent", "--session", "s"][..],
        &["agent", "--session", "bad/id", "--", "cat"],
        &["send", "--session", "s", "--nope", "x"],
        &["agent", "--session", "s", "--no-stream=yes", "--", "cat"],
        &["send", "hello"],
    ] {
        let out = relay().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
}

#[test]
fn the_agent_loses_nothing_when_a_persistent_server_crashes_under_it() {
    let dir = std::env::temp_dir().join(format!("relay-cli-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.to_str().expect("UTF-8 temp path").to_string();
    let mut first = Server::start_with(&[("RELAY_DATA_DIR", data.as_str())]);
    let port = first.addr().port().to_string();
    let sid = unique_session();
    let epoch = first.put(&format!("/sessions/{sid}")).json()["epoch"].clone();
    let scratch = Scratch::new();
    let marker = scratch.path("started");
    // The command is in hand when the server is killed; its answer is
    // posted to the restarted server.
    let script = r#"touch "$MARKER"; while [ ! -e "$MARKER.go" ]; do sleep 0.05; done; tr a-z A-Z"#;
    let agent = Agent::start(
        &first,
        &sid,
        &[("MARKER", marker.as_str())],
        &["sh", "-c", script],
    );
    first.prompt(&sid, "before", Some("m1"));
    wait_file(&marker);
    first.kill9();
    let second = Server::start_with(&[
        ("RELAY_DATA_DIR", data.as_str()),
        ("RELAY_PORT", port.as_str()),
    ]);
    std::fs::write(format!("{marker}.go"), b"").expect("release the command");
    agent.wait_events("prompt answered", 1);
    second.prompt(&sid, "after", Some("m2"));
    agent.wait_events("prompt answered", 2);
    let got: Vec<(Value, Value)> = answers(&second, &sid)
        .iter()
        .map(|a| (a["client_msg_id"].clone(), a["text"].clone()))
        .collect();
    assert_eq!(
        got,
        [
            (json!("m1"), json!("BEFORE")),
            (json!("m2"), json!("AFTER"))
        ]
    );
    assert_eq!(
        second.put(&format!("/sessions/{sid}")).json()["epoch"],
        epoch
    );
    drop(second);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A command that prints [`FIRST`], creates `$MARKER`, waits until `$GO`
/// exists, then prints [`REST`]: what it printed first can only be seen
/// before it exits if it was streamed. It gives up when the marker is
/// removed with the test's scratch directory (a failed test).
const GATED: &str = r#"printf '%s' "$FIRST"; touch "$MARKER"; while [ ! -e "$GO" ]; do [ -e "$MARKER" ] || exit 1; sleep 0.01; done; printf '%s\n\n' "$REST""#;
const FIRST: &str = "Streamed-One ";
const REST: &str = "and the rest";

/// The files of a [`GATED`] command.
struct Gate {
    _scratch: Scratch,
    marker: String,
    go: String,
}

impl Gate {
    fn new() -> Gate {
        let scratch = Scratch::new();
        let (marker, go) = (scratch.path("printed"), scratch.path("go"));
        Gate {
            _scratch: scratch,
            marker,
            go,
        }
    }

    /// The command's environment.
    fn env(&self) -> [(&str, &str); 4] {
        [
            ("MARKER", self.marker.as_str()),
            ("GO", self.go.as_str()),
            ("FIRST", FIRST),
            ("REST", REST),
        ]
    }

    /// Lets the command print the rest and exit.
    fn open(&self) {
        std::fs::write(&self.go, b"").expect("create the go file");
    }
}

/// The whole answer of a [`GATED`] command.
fn whole() -> String {
    format!("{FIRST}{REST}")
}

/// The next text frame of any type but `ping`, the live ones included.
#[track_caller]
fn next_frame(ws: &mut common::Ws) -> Value {
    loop {
        let frame = ws.recv_any();
        if frame["type"] != "ping" {
            return frame;
        }
    }
}

/// Frames of a session's subscriber up to the first `message`: the `delta`
/// frames seen before it, and the message's data.
#[track_caller]
fn deltas_then_message(ws: &mut common::Ws) -> (Vec<Value>, Value) {
    let mut deltas = Vec::new();
    loop {
        let frame = next_frame(ws);
        match frame["type"].as_str() {
            Some("delta") => deltas.push(frame["data"].clone()),
            Some("message") => return (deltas, frame["data"].clone()),
            _ => {}
        }
    }
}

/// Reads `delta` frames until their texts make `want`; returns them. Other
/// frames are skipped.
#[track_caller]
fn deltas_until(ws: &mut common::Ws, want: &str) -> Vec<Value> {
    let mut deltas: Vec<Value> = Vec::new();
    loop {
        let frame = next_frame(ws);
        match frame["type"].as_str() {
            Some("delta") => deltas.push(frame["data"].clone()),
            Some("message") => panic!("the answer came before its parts: {frame}"),
            _ => continue,
        }
        let text: String = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
        if text == want {
            return deltas;
        }
        assert!(
            want.starts_with(&text),
            "{text:?} is not a prefix of {want:?}"
        );
    }
}

/// A `relay send` still running, its stdout read as it comes.
struct Sending {
    child: Child,
    stdout: Receiver<Vec<u8>>,
    printed: Vec<u8>,
}

impl Sending {
    #[track_caller]
    fn start(srv: &Server, sid: &str, args: &[&str]) -> Sending {
        let mut child = relay()
            .args(["send", "--url", &url(srv), "--session", sid])
            .args(["--timeout", "20"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn relay send");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || forward(stdout, &tx));
        Sending {
            child,
            stdout: rx,
            printed: Vec::new(),
        }
    }

    /// Waits until stdout holds `want` so far.
    #[track_caller]
    fn wait_printed(&mut self, want: &str) {
        let deadline = Instant::now() + WAIT;
        while !String::from_utf8_lossy(&self.printed).contains(want) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(bytes) => self.printed.extend_from_slice(&bytes),
                Err(_) => panic!(
                    "relay send never printed {want:?}; stdout so far: {:?}",
                    String::from_utf8_lossy(&self.printed)
                ),
            }
        }
    }

    /// Waits for the exit; returns the status, all of stdout and stderr.
    #[track_caller]
    fn finish(mut self) -> (ExitStatus, String, String) {
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .expect("piped stderr")
            .read_to_string(&mut stderr)
            .expect("read stderr");
        let status = self.child.wait().expect("wait for relay send");
        self.printed.extend(self.stdout.iter().flatten());
        let stdout = String::from_utf8(self.printed).expect("UTF-8 stdout");
        (status, stdout, stderr)
    }
}

/// Copies what a child prints to `tx` as it comes.
fn forward(mut stdout: ChildStdout, tx: &mpsc::Sender<Vec<u8>>) {
    let mut chunk = [0u8; 4096];
    while let Ok(n) = stdout.read(&mut chunk) {
        if n == 0 || tx.send(chunk[..n].to_vec()).is_err() {
            break;
        }
    }
}

#[test]
fn the_agent_streams_the_commands_output_before_it_exits() {
    let srv = Server::start();
    let sid = unique_session();
    let gate = Gate::new();
    let _agent = Agent::start(&srv, &sid, &gate.env(), &["sh", "-c", GATED]);
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("parked_polls", 1);
    srv.prompt(&sid, "go on", Some("m1"));
    // The command waits for the go file: these parts came while it ran.
    let first = deltas_until(&mut ws, FIRST);
    gate.open();
    let (rest, message) = deltas_then_message(&mut ws);
    assert_eq!(message["text"], whole(), "trailing newlines dropped");
    let parts: Vec<&Value> = first.iter().chain(&rest).collect();
    let streamed: String = parts.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert!(whole().starts_with(&streamed), "{streamed:?}");
    for (n, part) in parts.iter().enumerate() {
        assert_eq!(part["part"], n + 1, "{part}");
        assert_eq!(part["session_id"], sid.as_str());
        assert_eq!(part["client_msg_id"], "m1");
        assert_eq!(part["assistant_msg_id"], message["assistant_msg_id"]);
    }
    assert_eq!(answers(&srv, &sid).len(), 1, "the parts are not stored");
}

#[test]
fn no_stream_posts_only_the_whole_answer() {
    let srv = Server::start();
    let (quiet, control) = (unique_session(), unique_session());
    let (gate, control_gate) = (Gate::new(), Gate::new());
    let command = ["sh", "-c", GATED];
    let _quiet = Agent::start_with_flags(&srv, &quiet, &gate.env(), &["--no-stream"], &command);
    let _control = Agent::start(&srv, &control, &control_gate.env(), &command);
    let mut ws = srv.ws(&format!("/ws/{quiet}"));
    let mut control_ws = srv.ws(&format!("/ws/{control}"));
    srv.wait_health("parked_polls", 2);
    srv.prompt(&quiet, "go on", Some("m1"));
    wait_file(&gate.marker);
    // A streaming agent whose command printed later has posted its first
    // part: a streaming agent would have posted this one's by now too.
    srv.prompt(&control, "go on", Some("m1"));
    deltas_until(&mut control_ws, FIRST);
    gate.open();
    let (deltas, message) = deltas_then_message(&mut ws);
    assert_eq!(deltas, Vec::<Value>::new());
    assert_eq!(message["text"], whole());
    control_gate.open();
}

#[test]
fn send_prints_the_first_words_before_the_agent_finished() {
    let srv = Server::start();
    let sid = unique_session();
    let gate = Gate::new();
    let _agent = Agent::start(&srv, &sid, &gate.env(), &["sh", "-c", GATED]);
    srv.wait_health("parked_polls", 1);
    let mut sending = Sending::start(&srv, &sid, &["hello"]);
    sending.wait_printed(FIRST);
    gate.open();
    let (status, stdout, stderr) = sending.finish();
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, format!("{}\n", whole()));
    assert!(!stderr.contains("no agent"), "{stderr}");
}

#[test]
fn send_says_when_no_agent_is_online() {
    let srv = Server::start();
    let sid = unique_session();
    let out = send(&srv, &sid, &["--timeout", "0.5", "anyone?"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let notice = format!(
        "relay send: no agent is online in session {sid}; the prompt waits until one fetches it"
    );
    assert!(stderr.contains(&notice), "{stderr}");
    // With an agent parked on the session, nothing is said.
    let _agent = Agent::start(&srv, &sid, &[], &["tr", "a-z", "A-Z"]);
    srv.wait_health("parked_polls", 1);
    let out = send(&srv, &sid, &["hello"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO\n");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("no agent"),
        "{out:?}"
    );
}

#[test]
fn encrypted_parts_stream_to_send_and_stay_sealed_on_the_wire() {
    let srv = Server::start();
    let sid = unique_session();
    let gate = Gate::new();
    let key = relay().arg("key").output().expect("run relay key");
    let key = String::from_utf8(key.stdout).unwrap().trim().to_string();
    let mut env = gate.env().to_vec();
    env.push(("RELAY_E2E_KEY", key.as_str()));
    let _agent = Agent::start(&srv, &sid, &env, &["sh", "-c", GATED]);
    let mut observer = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("parked_polls", 1);
    let mut sending = Sending::start(&srv, &sid, &["--e2e-key", &key, "hello"]);
    sending.wait_printed(FIRST);
    gate.open();
    let (status, stdout, stderr) = sending.finish();
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, format!("{}\n", whole()));
    let (deltas, message) = deltas_then_message(&mut observer);
    assert!(!deltas.is_empty(), "the answer was streamed");
    for text in deltas.iter().map(|d| &d["text"]).chain([&message["text"]]) {
        let text = text.as_str().unwrap();
        assert!(text.starts_with("e2e1:"), "{text}");
        assert!(
            !text.contains("Streamed") && !text.contains("rest"),
            "{text}"
        );
    }
}

#[test]
fn secrets_come_from_files_and_an_unreadable_one_exits_two() {
    let srv = Server::start_with(&[
        ("RELAY_AGENT_TOKEN", "agent-secret"),
        ("RELAY_CLIENT_TOKEN", "client-secret"),
    ]);
    let sid = unique_session();
    let scratch = Scratch::new();
    let key = relay().arg("key").output().unwrap();
    assert!(key.status.success(), "{key:?}");
    // As `relay key > file` and `echo token > file` leave them: a newline.
    let key_file = scratch.path("key");
    std::fs::write(&key_file, &key.stdout).unwrap();
    let agent_token = scratch.path("agent-token");
    std::fs::write(&agent_token, "agent-secret\n").unwrap();
    let client_token = scratch.path("client-token");
    std::fs::write(&client_token, "client-secret\n").unwrap();
    let flags = ["--token-file", &agent_token, "--e2e-key-file", &key_file];
    let _agent = Agent::start_with_flags(&srv, &sid, &[], &flags, &["tr", "a-z", "A-Z"]);
    srv.wait_health("parked_polls", 1);
    let out = send(
        &srv,
        &sid,
        &[
            "--token-file",
            &client_token,
            "--e2e-key-file",
            &key_file,
            "sealed",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SEALED\n");
    // The server saw only ciphertext.
    let auth = [("Authorization", "Bearer client-secret")];
    let messages = srv.request("GET", &format!("/messages/{sid}"), &auth, None);
    let text = messages.json()["messages"][1]["data"]["text"].clone();
    assert!(text.as_str().unwrap().starts_with("e2e1:"), "{text}");
    // A file that is not there: bad usage, naming it, before any request.
    let missing = scratch.path("no-such-token");
    for tool in ["send", "agent"] {
        let mut cmd = relay();
        cmd.args([
            tool,
            "--url",
            &url(&srv),
            "--session",
            &sid,
            "--token-file",
            &missing,
        ]);
        if tool == "agent" {
            cmd.args(["--", "cat"]);
        } else {
            cmd.arg("hi");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{tool}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("cannot read --token-file {missing}")),
            "{tool}: {stderr}"
        );
    }
    let help = relay().args(["send", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("Prefer one of"), "{help}");
}

#[test]
fn send_says_what_a_503_from_unreachable_storage_means() {
    // A Redis that is not there: the server starts and answers 503.
    let url = format!("redis://127.0.0.1:{}", common::free_port());
    let srv = Server::start_single_with(&[("RELAY_REDIS_URL", &url)]);
    let out = send(&srv, &unique_session(), &["hello"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("503 Storage unavailable"), "{stderr}");
    assert!(
        stderr.contains("the server cannot reach its storage"),
        "{stderr}"
    );
    assert!(stderr.contains("GET /readyz"), "{stderr}");
}

#[test]
fn the_command_gets_the_servers_url_to_read_the_conversation() {
    let srv = Server::start();
    let sid = unique_session();
    let script = r#"curl -s ${RELAY_CA:+--cacert "$RELAY_CA"} "$RELAY_URL/messages/$RELAY_SESSION_ID" >/dev/null && printf '%s' "$RELAY_URL""#;
    let _agent = Agent::start(
        &srv,
        &sid,
        &[("RELAY_URL", "http://wrong.invalid")],
        &["sh", "-c", script],
    );
    srv.wait_health("parked_polls", 1);
    let out = send(&srv, &sid, &["where are you?"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", url(&srv))
    );
}
