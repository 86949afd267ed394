//! What waits on a relay while the Redis it shares with another restarts
//! empty: a parked agent poll stays parked and is answered by the next
//! prompt posted anywhere, and the agent stays online for every instance;
//! `relay agent` answers the new epoch's prompts at once, though their `seq`
//! starts over below its cursor.

use crate::common::*;
use serde_json::Value;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Polls `/readyz` on `srv` (bounded, 10 s) until it answers `status`.
#[track_caller]
pub fn wait_ready(srv: &Server, status: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.get("/readyz").status != status {
        assert!(Instant::now() < deadline, "/readyz never answered {status}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `GET /sessions/{sid}` on `srv` until it says the agent is `want`
/// (bounded, 5 s: well inside the agent's 50 s poll); the last body.
#[track_caller]
pub fn wait_agent(srv: &Server, sid: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = srv.get(&format!("/sessions/{sid}"));
        if got.status == 200 && got.json()["agent"] == want {
            return got.json();
        }
        assert!(
            Instant::now() < deadline,
            "the agent never {want}: {} {}",
            got.status,
            got.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_parked_agent_hears_the_first_prompt_after_redis_restarted_empty_and_stays_online() {
    let mut redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    a.put(&format!("/sessions/{sid}"));
    // The agent answered the session's first prompt and polls for what
    // follows it, as `relay agent` does (`after`: the last prompt's seq);
    // another poll asks for every pending prompt.
    a.prompt(&sid, "before the restart", Some("p0"));
    b.respond(&sid, "p0", "done");
    let mut polls = [
        b.start_poll(&sid, "?timeout=50&after=1"),
        b.start_poll(&sid, "?timeout=50"),
    ];
    b.wait_health("parked_polls", 2);
    wait_agent(&a, &sid, "online");

    redis.kill9();
    for srv in [&a, &b] {
        wait_ready(srv, 503);
    }
    redis.run();
    for srv in [&a, &b] {
        wait_ready(srv, 200);
    }
    assert_eq!(b.health()["parked_polls"], 2, "the polls stay parked");
    // B tells again that its agent is there: online for A, in the new
    // epoch (nothing stored in it yet).
    let info = wait_agent(&a, &sid, "online");
    assert_eq!(info["last_seq"], 0, "{info}");
    assert_eq!(b.health()["parked_polls"], 2, "the polls stay parked");

    // The first prompt after the restart, through A, answers both polls
    // at once, not when their 50 s run out: the cursor counted the old
    // epoch, and every prompt of the new one came after it.
    a.prompt(&sid, "after the restart", Some("p1"));
    for poll in &mut polls {
        poll.tcp()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let got = poll.read_response();
        assert_eq!(got.status, 200, "{}", got.text());
        assert_eq!(client_msg_ids(got.json().as_array().unwrap()), ["p1"]);
    }
}

/// `relay agent` for `sid` on `srv`, answering every prompt with `ok`, its
/// stderr piped; the caller kills it.
fn agent(srv: &Server, sid: &str) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relay"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RELAY_") {
            cmd.env_remove(key);
        }
    }
    let scheme = if tls_mode() { "https" } else { "http" };
    if tls_mode() {
        cmd.env("RELAY_CA", &tls_files().ca);
    }
    cmd.args(["agent", "--url", &format!("{scheme}://{}", srv.addr())])
        .args(["--session", sid, "--", "echo", "ok"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relay agent")
}

/// Waits (bounded, 10 s) until `sid`'s history on `srv` holds an answer to
/// `id`.
#[track_caller]
fn wait_answer(srv: &Server, sid: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = srv.get(&format!("/messages/{sid}"));
        let answered = got.status == 200
            && got.json()["messages"].as_array().is_some_and(|ms| {
                ms.iter()
                    .any(|m| m["type"] == "assistant" && m["data"]["client_msg_id"] == id)
            });
        if answered {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} never answered: {}",
            got.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn relay_agent_answers_the_new_epochs_first_prompt_without_a_retry() {
    let mut redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    a.put(&format!("/sessions/{sid}"));
    let mut agent = agent(&b, &sid);
    // Two prompts answered: the agent's cursor is at seq 2 of this epoch.
    a.prompt(&sid, "one", Some("p1"));
    a.prompt(&sid, "two", Some("p2"));
    wait_answer(&a, &sid, "p2");
    b.wait_health("parked_polls", 1);

    redis.kill9();
    for srv in [&a, &b] {
        wait_ready(srv, 503);
    }
    redis.run();
    for srv in [&a, &b] {
        wait_ready(srv, 200);
    }
    // The new epoch's first prompt has seq 1, below the agent's cursor.
    a.prompt(&sid, "after the restart", Some("p3"));
    wait_answer(&a, &sid, "p3");

    agent.kill().expect("kill relay agent");
    agent.wait().expect("reap relay agent");
    let mut stderr = String::new();
    agent
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        !stderr.contains("already handled"),
        "the agent took the new epoch's prompt for one it had handled:\n{stderr}"
    );
}
