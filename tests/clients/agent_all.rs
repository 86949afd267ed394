//! `relay agent --all` against the real server: one long-poll for every
//! session; sessions answered side by side (up to `--jobs`), the prompts
//! of one session one after the other, in order; a cancel stops only its
//! own session's command; `--prefix` and a prefix token keep the agent
//! to their sessions, with `--context` read under that token; a clean stop
//! exits 0 and, for one session's agent as for `--all`, shows the agent
//! offline at once (`DELETE /agent`), not after the presence grace.
//!
//! The commands log `start ID` and `end ID` to a file per session, and
//! wait for a gate file the test creates, so "side by side" is seen as
//! both commands started before either may end, not as a timing.

use std::time::{Duration, Instant};

use crate::cli::{Agent, Scratch, WAIT, answers, wait_file};
use crate::common::{Server, unique_session};
use serde_json::json;

/// The script every test's agent runs: logs its start, waits for the gate
/// (when the prompt asks for it), logs its end, answers with the prompt.
const SCRIPT: &str = r#"in=$(cat)
echo "start $RELAY_CLIENT_MSG_ID" >> "$DIR/$RELAY_SESSION_ID.log"
touch "$DIR/$RELAY_CLIENT_MSG_ID.started"
case "$in" in gated*) while [ ! -e "$DIR/gate" ]; do sleep 0.02; done ;; esac
echo "end $RELAY_CLIENT_MSG_ID" >> "$DIR/$RELAY_SESSION_ID.log"
printf '%s' "$in""#;

fn start(srv: &Server, dir: &Scratch, flags: &[&str]) -> Agent {
    let dir_path = dir.path("");
    let agent = Agent::spawn(
        srv,
        &[("DIR", dir_path.as_str())],
        flags,
        &["sh", "-c", SCRIPT],
    );
    srv.wait_health("parked_polls", 1);
    agent
}

#[track_caller]
fn prompt(srv: &Server, sid: &str, id: &str, text: &str) {
    let body = json!({"session_id": sid, "client_msg_id": id, "prompt": text});
    let resp = srv.post_json("/prompt", &body);
    assert_eq!(resp.status, 200, "{}", resp.text());
}

/// Waits until `sid` has `n` answers; returns their texts, oldest first.
#[track_caller]
fn wait_answers(srv: &Server, sid: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = answers(srv, sid);
        if got.len() >= n {
            return got
                .iter()
                .map(|a| a["text"].as_str().unwrap().to_string())
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "{sid} has {} answers of {n}",
            got.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sessions_run_side_by_side_and_each_in_order() {
    let srv = Server::start();
    let dir = Scratch::new();
    let _agent = start(&srv, &dir, &["--all", "--jobs", "2"]);
    let (a, b) = (unique_session(), unique_session());
    prompt(&srv, &a, "a1", "gated a1");
    prompt(&srv, &a, "a2", "a2");
    prompt(&srv, &b, "b1", "gated b1");
    // Both gated commands run at once: neither may end before the gate.
    wait_file(&dir.path("a1.started"));
    wait_file(&dir.path("b1.started"));
    assert!(
        !std::path::Path::new(&dir.path("a2.started")).exists(),
        "a2 started beside a1"
    );
    std::fs::write(dir.path("gate"), "").unwrap();
    assert_eq!(wait_answers(&srv, &a, 2), ["gated a1", "a2"]);
    assert_eq!(wait_answers(&srv, &b, 1), ["gated b1"]);
    let log = std::fs::read_to_string(dir.path(&format!("{a}.log"))).unwrap();
    assert_eq!(log, "start a1\nend a1\nstart a2\nend a2\n");
}

#[test]
fn two_sessions_are_answered_in_less_than_twice_the_time_of_one() {
    let srv = Server::start();
    let sleep = Duration::from_secs(1);
    let script = format!("sleep {}; cat", sleep.as_secs());
    let _agent = Agent::spawn(&srv, &[], &["--all"], &["sh", "-c", &script]);
    srv.wait_health("parked_polls", 1);
    let (a, b) = (unique_session(), unique_session());
    let started = Instant::now();
    prompt(&srv, &a, "a1", "one");
    prompt(&srv, &b, "b1", "two");
    assert_eq!(wait_answers(&srv, &a, 1), ["one"]);
    assert_eq!(wait_answers(&srv, &b, 1), ["two"]);
    let took = started.elapsed();
    assert!(
        took < sleep * 2,
        "two sessions took {took:?}, one takes {sleep:?}"
    );
}

#[test]
fn a_cancel_stops_only_its_own_sessions_command() {
    let srv = Server::start();
    let dir = Scratch::new();
    let agent = start(&srv, &dir, &["--all"]);
    let (a, b) = (unique_session(), unique_session());
    prompt(&srv, &a, "a1", "gated a1");
    prompt(&srv, &b, "b1", "gated b1");
    wait_file(&dir.path("a1.started"));
    wait_file(&dir.path("b1.started"));
    let resp = srv.post_json("/cancel", &json!({"session_id": a, "client_msg_id": "a1"}));
    assert_eq!(resp.status, 200, "{}", resp.text());
    agent.wait_events("prompt cancelled: nothing posted", 1);
    std::fs::write(dir.path("gate"), "").unwrap();
    assert_eq!(wait_answers(&srv, &b, 1), ["gated b1"]);
    assert!(
        answers(&srv, &a).is_empty(),
        "the cancelled prompt was answered"
    );
    let log = std::fs::read_to_string(dir.path(&format!("{a}.log"))).unwrap();
    assert_eq!(log, "start a1\n", "a1's command ran on after its cancel");
}

#[test]
fn prefix_serves_only_its_sessions_and_a_clean_stop_exits_zero() {
    let srv = Server::start();
    let dir = Scratch::new();
    let mine = format!("team-{}", unique_session());
    let other = unique_session();
    let mut agent = start(&srv, &dir, &["--prefix", "team-"]);
    prompt(&srv, &other, "o1", "not mine");
    prompt(&srv, &mine, "m1", "mine");
    assert_eq!(wait_answers(&srv, &mine, 1), ["mine"]);
    assert!(answers(&srv, &other).is_empty());
    agent.signal("TERM");
    assert_eq!(agent.wait_exit().code(), Some(0));
    agent.wait_events("agent stopped", 1);
}

#[test]
fn an_agent_with_a_prefix_token_serves_its_sessions_with_their_context() {
    const SECRET: &str = "a secret of at least thirty-two bytes, for tokens";
    let srv = Server::start_with(&[
        ("RELAY_TOKEN_SECRET", SECRET),
        ("RELAY_CLIENT_TOKEN", "client-secret"),
    ]);
    let out = crate::cli::relay()
        .args(["token", "--role", "agent", "--prefix", "team-"])
        .env("RELAY_TOKEN_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).unwrap();
    let dir = Scratch::new();
    let dir_path = dir.path("");
    // Each run leaves its session and the lines of context it got.
    let script = r#"echo "$RELAY_SESSION_ID $(wc -l < "$RELAY_CONTEXT_FILE")" > "$DIR/$RELAY_CLIENT_MSG_ID""#;
    let agent = Agent::spawn(
        &srv,
        &[
            ("RELAY_AGENT_TOKEN", token.trim()),
            ("DIR", dir_path.as_str()),
        ],
        &["--all", "--context", "10"],
        &["sh", "-c", script],
    );
    srv.wait_health("parked_polls", 1);
    let post = |sid: &str, id: &str| {
        let body = json!({"session_id": sid, "client_msg_id": id, "prompt": id});
        let resp = srv.request(
            "POST",
            "/prompt",
            &[
                ("Authorization", "Bearer client-secret"),
                ("Content-Type", "application/json"),
            ],
            Some(body.to_string().as_bytes()),
        );
        assert_eq!(resp.status, 200, "{}", resp.text());
    };
    let mine = format!("team-{}", unique_session());
    let other = unique_session();
    post(&other, "o1");
    post(&mine, "m1");
    agent.wait_events("prompt answered", 1);
    post(&mine, "m2");
    agent.wait_events("prompt answered", 2);
    let read = |id: &str| std::fs::read_to_string(dir.path(id)).unwrap();
    assert_eq!(read("m1"), format!("{mine} 1\n"));
    assert_eq!(read("m2"), format!("{mine} 3\n"));
    assert!(
        !std::path::Path::new(&dir.path("o1")).exists(),
        "another session's prompt ran"
    );
}

/// `agent` of `GET /sessions/{sid}`: "online" or "offline".
#[track_caller]
fn presence(srv: &Server, sid: &str) -> String {
    let resp = srv.get(&format!("/sessions/{sid}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    resp.json()["agent"].as_str().unwrap().to_string()
}

/// Starts an agent with `flags` for `sid`, sees it online, stops it
/// cleanly, and expects it offline at once.
#[track_caller]
fn stop_and_see_offline(srv: &Server, sid: &str, flags: &[&str]) {
    let mut agent = Agent::spawn(srv, &[], flags, &["cat"]);
    srv.wait_health("parked_polls", 1);
    assert_eq!(presence(srv, sid), "online", "{flags:?}");
    agent.signal("TERM");
    assert_eq!(agent.wait_exit().code(), Some(0), "{flags:?}");
    assert_eq!(presence(srv, sid), "offline", "{flags:?}");
}

#[test]
fn a_clean_stop_shows_the_agent_offline_at_once() {
    // The grace would keep a silent agent online for a minute.
    let srv = Server::start_with(&[("RELAY_AGENT_GRACE", "60")]);
    let sid = unique_session();
    stop_and_see_offline(&srv, &sid, &["--session", &sid]);
    stop_and_see_offline(&srv, &sid, &["--all"]);
}

#[test]
fn encrypted_conversations_of_two_sessions_round_trip() {
    let srv = Server::start();
    let key = String::from_utf8(crate::cli::relay().arg("key").output().unwrap().stdout).unwrap();
    let key = key.trim();
    let _agent = Agent::spawn(
        &srv,
        &[("RELAY_E2E_KEY", key)],
        &["--all"],
        &["tr", "a-z", "A-Z"],
    );
    srv.wait_health("parked_polls", 1);
    for (sid, text) in [(unique_session(), "first"), (unique_session(), "second")] {
        let out = crate::cli::relay()
            .args([
                "send",
                "--url",
                &crate::cli::url(&srv),
                "--session",
                &sid,
                "--timeout",
                "20",
                text,
            ])
            .env("RELAY_E2E_KEY", key)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{}\n", text.to_uppercase())
        );
        let stored = answers(&srv, &sid);
        assert!(
            stored[0]["text"].as_str().unwrap().starts_with("e2e1:"),
            "{stored:?}"
        );
    }
}
