//! Stopping a prompt from the command line tools, against the real server:
//! `relay agent` stops the command of a cancelled prompt (its whole process
//! group, SIGKILL after `--kill-grace` for one that ignores SIGTERM), posts
//! nothing for it, skips a cancelled prompt it has not started, and goes on
//! with the next, and keeps watching across a server restart; `relay send`
//! cancels its prompt on Ctrl-C, and stops waiting when it is cancelled
//! elsewhere.
//!
//! The command writes its process group id (its shell's pid: the agent
//! makes it a group leader) to a file once its children are started; the
//! tests count the group's live processes in `/proc`.

use crate::cli::{Agent, Scratch, WAIT, answers, relay, url, wait_file};
use crate::common::{Server, unique_session};

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long a cancelled command may take to be gone: the contract says a
/// second; this leaves room for a loaded machine.
const STOPPED_WITHIN: Duration = Duration::from_secs(3);

/// Cancels prompt `id` of `sid`, asserting the server took it.
#[track_caller]
fn cancel(srv: &Server, sid: &str, id: &str) {
    let resp = srv.post_json("/cancel", &json!({"session_id": sid, "client_msg_id": id}));
    assert_eq!(resp.status, 200, "POST /cancel: {}", resp.text());
}

/// Live (not zombie) processes whose process group is `pgid`.
fn group_members(pgid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| {
            // "pid (comm) state ppid pgrp ...": comm may hold spaces.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.len() > 3 && fields[0] != "Z" && fields[2] == pgid.to_string()
        })
        .count()
}

/// The process group the command wrote to `path`.
#[track_caller]
fn group_of(path: &str) -> u32 {
    wait_file(path);
    let deadline = Instant::now() + WAIT;
    loop {
        // The file may be seen before the shell has written it.
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Ok(pgid) = text.trim().parse() {
            return pgid;
        }
        assert!(Instant::now() < deadline, "{path} holds no pid: {text:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the group has no live process; returns how long that took.
#[track_caller]
fn wait_group_gone(pgid: u32, limit: Duration) -> Duration {
    let started = Instant::now();
    while group_members(pgid) > 0 {
        assert!(
            started.elapsed() < limit,
            "{} processes of group {pgid} still run after {limit:?}",
            group_members(pgid)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    started.elapsed()
}

/// The `client_msg_id`s of the session's answers, oldest first.
fn answered(srv: &Server, sid: &str) -> Vec<Value> {
    answers(srv, sid)
        .iter()
        .map(|a| a["client_msg_id"].clone())
        .collect()
}

#[test]
fn a_cancel_stops_the_command_and_its_children_and_the_agent_goes_on() {
    let srv = Server::start();
    let sid = unique_session();
    let scratch = Scratch::new();
    let pidfile = scratch.path("pgid");
    // "long" prints a first part, starts two children that hold its
    // stdout, then waits for them; anything else is echoed.
    let script = r#"p=$(cat); if [ "$p" = long ]; then printf partial; sleep 300 & sleep 300 & echo $$ > "$PIDFILE"; wait; else printf %s "$p"; fi"#;
    let agent = Agent::start_with_flags(
        &srv,
        &sid,
        &[("PIDFILE", pidfile.as_str())],
        &[],
        &["sh", "-c", script],
    );
    srv.prompt(&sid, "long", Some("m1"));
    let pgid = group_of(&pidfile);
    assert_eq!(group_members(pgid), 3, "the shell and its two sleeps");
    cancel(&srv, &sid, "m1");
    let took = wait_group_gone(pgid, STOPPED_WITHIN);
    eprintln!("the group was gone {took:?} after the cancel");
    let stopped = agent.wait_events("prompt cancelled: nothing posted", 1);
    assert_eq!(stopped[0]["client_msg_id"], "m1");
    srv.prompt(&sid, "next", Some("m2"));
    agent.wait_events("prompt answered", 1);
    assert_eq!(answered(&srv, &sid), [json!("m2")], "nothing for m1");
    assert_eq!(answers(&srv, &sid)[0]["text"], "next");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let srv = Server::start();
    let sid = unique_session();
    let scratch = Scratch::new();
    let pidfile = scratch.path("pgid");
    // The ignored SIGTERM is inherited by the sleeps too.
    let script = r#"trap '' TERM; echo $$ > "$PIDFILE"; while :; do sleep 0.05; done"#;
    let agent = Agent::start_with_flags(
        &srv,
        &sid,
        &[("PIDFILE", pidfile.as_str())],
        &["--kill-grace", "1"],
        &["sh", "-c", script],
    );
    srv.prompt(&sid, "stubborn", Some("m1"));
    let pgid = group_of(&pidfile);
    cancel(&srv, &sid, "m1");
    let took = wait_group_gone(pgid, Duration::from_secs(1) + STOPPED_WITHIN);
    assert!(
        took >= Duration::from_secs(1),
        "killed before its grace: {took:?}"
    );
    agent.wait_events("prompt cancelled: nothing posted", 1);
    assert!(answered(&srv, &sid).is_empty());
}

#[test]
fn a_cancelled_prompt_fetched_but_not_started_is_skipped() {
    let srv = Server::start();
    let sid = unique_session();
    let scratch = Scratch::new();
    let go = scratch.path("go");
    let ran = scratch.path("ran");
    // Each run leaves a marker; "first" waits for the test's go.
    let script = r#"p=$(cat); touch "$RAN-$p"; if [ "$p" = first ]; then while [ ! -e "$GO" ]; do sleep 0.01; done; fi; printf %s "$p""#;
    // Three prompts before the agent starts: one poll fetches them all.
    for (id, text) in [("m1", "first"), ("m2", "second"), ("m3", "third")] {
        srv.prompt(&sid, text, Some(id));
    }
    let agent = Agent::start_with_flags(
        &srv,
        &sid,
        &[
            ("GO", go.as_str()),
            ("RAN", ran.as_str()),
            ("RELAY_LOG", "debug"),
        ],
        &[],
        &["sh", "-c", script],
    );
    wait_file(&format!("{ran}-first"));
    cancel(&srv, &sid, "m2");
    // The agent has the cancel before the first command ends.
    let seen = agent.wait_events("cancel seen", 1);
    assert_eq!(seen[0]["client_msg_id"], "m2");
    std::fs::write(&go, b"").expect("release the first command");
    agent.wait_events("prompt answered", 2);
    let skipped = agent.events("prompt cancelled before it started: skipped");
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0]["client_msg_id"], "m2");
    assert!(
        !std::path::Path::new(&format!("{ran}-second")).exists(),
        "the cancelled prompt's command ran"
    );
    assert_eq!(answered(&srv, &sid), [json!("m1"), json!("m3")]);
}

/// Starts `relay send` with no agent and returns it with its prompt's
/// `client_msg_id`, once the prompt is stored (pending: nobody answers).
#[track_caller]
fn send_waiting(srv: &Server, sid: &str) -> (std::process::Child, String) {
    let send = relay()
        .args(["send", "--url", &url(srv), "--session", sid, "stop me"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relay send");
    let deadline = Instant::now() + WAIT;
    let id = loop {
        let resp = srv.get(&format!("/messages/{sid}"));
        let prompt = (resp.status == 200)
            .then(|| resp.json()["messages"][0].clone())
            .filter(|m| m["type"] == "prompt");
        if let Some(prompt) = prompt {
            break prompt["data"]["client_msg_id"]
                .as_str()
                .unwrap()
                .to_string();
        }
        assert!(Instant::now() < deadline, "the prompt was never stored");
        std::thread::sleep(Duration::from_millis(10));
    };
    (send, id)
}

/// Waits for `relay send` to exit; its status and stderr.
#[track_caller]
fn exited(mut send: std::process::Child) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = send.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "relay send did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    send.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status, stderr)
}

/// The cancels stored in `sid`'s history.
fn cancels(srv: &Server, sid: &str) -> Vec<Value> {
    let history = srv.messages(sid, "");
    history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "cancel")
        .cloned()
        .collect()
}

#[test]
fn ctrl_c_in_send_cancels_its_prompt_and_exits_130() {
    let srv = Server::start();
    let sid = unique_session();
    let (send, id) = send_waiting(&srv, &sid);
    let status = Command::new("kill")
        .args(["-INT", &send.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let (status, stderr) = exited(send);
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!("relay send: cancelled {id}")),
        "{stderr}"
    );
    let cancels = cancels(&srv, &sid);
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["data"]["client_msg_id"], id.as_str());
}

#[test]
fn a_stop_elsewhere_ends_send_s_wait_with_130() {
    let srv = Server::start();
    let sid = unique_session();
    let (send, id) = send_waiting(&srv, &sid);
    // The page's Stop: another client cancels the prompt.
    cancel(&srv, &sid, &id);
    let (status, stderr) = exited(send);
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!("relay send: {id} was cancelled elsewhere")),
        "{stderr}"
    );
    // relay send cancelled nothing itself: the one cancel is the other's.
    assert_eq!(cancels(&srv, &sid).len(), 1);
}

#[test]
fn the_watch_reconnects_after_the_server_restarts() {
    // One relay, restarted on its port: its sockets drop.
    let mut first = Server::start_single();
    let port = first.addr().port().to_string();
    let sid = unique_session();
    let scratch = Scratch::new();
    let pidfile = scratch.path("pgid");
    let script = r#"echo $$ > "$PIDFILE"; sleep 300"#;
    let agent = Agent::start_with_flags(
        &first,
        &sid,
        &[("PIDFILE", pidfile.as_str())],
        &[],
        &["sh", "-c", script],
    );
    first.wait_health("parked_polls", 1);
    first.sigterm();
    assert!(first.wait_exit(WAIT).is_some_and(|s| s.success()));
    let second = Server::start_single_with(&[("RELAY_PORT", port.as_str())]);
    agent.wait_events("watching for cancels again", 1);
    second.prompt(&sid, "long", Some("m1"));
    let pgid = group_of(&pidfile);
    cancel(&second, &sid, "m1");
    wait_group_gone(pgid, STOPPED_WITHIN);
    agent.wait_events("prompt cancelled: nothing posted", 1);
}
