//! The tools say why the server refused them, in the server's words: a
//! `401`/`403` is shown with its `details` ("token expired", "token is for
//! another session") as the server wrote them, by `relay send` on stderr
//! and by `relay agent` in the error it exits with.

use std::process::Output;

use crate::cli::{Agent, relay, url};
use crate::common::{Server, unique_session};

const SECRET: &str = "a secret of at least thirty-two bytes, for tokens";

/// `relay token` for one session.
#[track_caller]
fn token(role: &str, sid: &str) -> String {
    let out = relay()
        .args(["token", "--role", role, "--session", sid])
        .env("RELAY_TOKEN_SECRET", SECRET)
        .output()
        .expect("run relay token");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A token for `sid` that expired long ago (`relay token` makes none).
fn expired(role: relay::token::Role, sid: &str) -> String {
    let secret = relay::token::Secret::new(SECRET.as_bytes()).unwrap();
    secret.mint(role, sid, Some(1))
}

fn send(srv: &Server, sid: &str, token: &str) -> Output {
    relay()
        .args([
            "send",
            "--url",
            &url(srv),
            "--session",
            sid,
            "--timeout",
            "5",
            "hi",
        ])
        .env("RELAY_CLIENT_TOKEN", token)
        .output()
        .expect("run relay send")
}

/// The error `relay agent` exits 1 with, run with `token`.
#[track_caller]
fn agent_failure(srv: &Server, sid: &str, token: &str) -> String {
    let mut agent = Agent::start(srv, sid, &[("RELAY_AGENT_TOKEN", token)], &["cat"]);
    assert_eq!(agent.wait_exit().code(), Some(1));
    agent.wait_events("agent failed", 1)[0]["error"]
        .as_str()
        .unwrap()
        .to_string()
}

fn server() -> Server {
    Server::start_with(&[
        ("RELAY_TOKEN_SECRET", SECRET),
        ("RELAY_CLIENT_TOKEN", "client-secret"),
        ("RELAY_AGENT_TOKEN", "agent-secret"),
    ])
}

#[test]
fn send_shows_the_servers_reason_for_a_refused_token() {
    let srv = server();
    let sid = unique_session();
    let out = send(&srv, &sid, &token("client", "another"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("403 Forbidden: token is for another session"),
        "{stderr}"
    );
    let out = send(&srv, &sid, &expired(relay::token::Role::Client, &sid));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("401 Unauthorized: token expired"),
        "{stderr}"
    );
    let out = send(&srv, &sid, &token("agent", &sid));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("401 Unauthorized: client token required"),
        "{stderr}"
    );
}

#[test]
fn the_agent_exits_with_the_servers_reason_for_a_refused_token() {
    let srv = server();
    let sid = unique_session();
    let error = agent_failure(&srv, &sid, &token("agent", "another"));
    assert!(
        error.contains("403 Forbidden: token is for another session"),
        "{error}"
    );
    let error = agent_failure(&srv, &sid, &expired(relay::token::Role::Agent, &sid));
    assert!(error.contains("401 Unauthorized: token expired"), "{error}");
    assert!(error.contains("RELAY_AGENT_TOKEN"), "{error}");
}
