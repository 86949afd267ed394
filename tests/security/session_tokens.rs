//! Tokens for one session (RELAY_TOKEN_SECRET) against the real binary:
//! minted by `relay token`, a token opens its role's endpoints in its
//! session only; another session gets 403, an expired token 401 saying so,
//! a forged, truncated or foreign one 401 naming the role; server-wide
//! tokens keep working beside them; the WebSocket takes the token as the
//! subprotocol `bearer.<token>` and answers `relay.v1`; `relay agent` and
//! `relay send` work with them; a short secret stops the server (exit 2).

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

pub(super) const SECRET: &str = "test-secret-0123456789-abcdefghij-KLMNOP";
const OTHER_SECRET: &str = "another-secret-0123456789-abcdefghijklm";
pub(super) const CLIENT: &str = "server-wide-client-Qx81";
pub(super) const AGENT: &str = "server-wide-agent-Vb27";

pub(super) fn with_secret() -> Server {
    Server::start_with(&[
        ("RELAY_TOKEN_SECRET", SECRET),
        ("RELAY_CLIENT_TOKEN", CLIENT),
        ("RELAY_AGENT_TOKEN", AGENT),
    ])
}

/// The binary with the caller's `RELAY_*` settings removed (and the
/// harness's CA trusted with `TEST_WITH_TLS`).
pub(super) fn relay() -> Command {
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

/// `relay token` with `secret`, asserting it succeeds; the token printed.
#[track_caller]
fn mint_with(secret: &str, role: &str, sid: &str, extra: &[&str]) -> String {
    let out = relay()
        .args(["token", "--role", role, "--session", sid])
        .args(extra)
        .env("RELAY_TOKEN_SECRET", secret)
        .output()
        .expect("run relay token");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8 token");
    assert!(
        text.ends_with('\n') && text.lines().count() == 1,
        "{text:?}"
    );
    text.trim_end().to_string()
}

#[track_caller]
fn mint(role: &str, sid: &str) -> String {
    mint_with(SECRET, role, sid, &[])
}

/// One request with `Authorization: Bearer token` and a JSON body if given.
#[track_caller]
fn call(srv: &Server, method: &str, path: &str, token: &str, body: Option<&Value>) -> Response {
    let auth = format!("Bearer {token}");
    let mut headers = vec![("Authorization", auth.as_str())];
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap());
    if bytes.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    srv.request(method, path, &headers, bytes.as_deref())
}

#[track_caller]
pub(super) fn expect(resp: &Response, status: u16, details: Option<&str>, what: &str) {
    assert_eq!(resp.status, status, "{what}: {}", resp.text());
    if let Some(d) = details {
        assert_eq!(resp.json()["details"], d, "{what}: {}", resp.text());
    }
}

pub(super) fn prompt(sid: &str, id: &str) -> Value {
    json!({"session_id": sid, "prompt": "q", "client_msg_id": id})
}

fn answer(sid: &str, id: &str) -> Value {
    json!({"session_id": sid, "client_msg_id": id, "text": "a"})
}

#[test]
fn a_session_token_opens_its_roles_endpoints_in_its_session() {
    let srv = with_secret();
    let sid = unique_session();
    let (client, agent) = (mint("client", &sid), mint("agent", &sid));
    expect(
        &call(&srv, "PUT", &format!("/sessions/{sid}"), &agent, None),
        200,
        None,
        "PUT, agent",
    );
    expect(
        &call(&srv, "PUT", &format!("/sessions/{sid}"), &client, None),
        200,
        None,
        "PUT, client",
    );
    let _ws = srv.ws(&format!("/ws/{sid}?token={client}"));
    srv.wait_health("subscribers", 1);
    expect(
        &call(&srv, "POST", "/prompt", &client, Some(&prompt(&sid, "c1"))),
        200,
        None,
        "prompt",
    );
    let poll = format!("/prompts/{sid}?wait=false");
    let r = call(&srv, "GET", &poll, &agent, None);
    expect(&r, 200, None, "poll");
    assert_eq!(client_msg_ids(r.json().as_array().unwrap()), ["c1"]);
    let r = call(&srv, "POST", "/response", &agent, Some(&answer(&sid, "c1")));
    expect(&r, 200, None, "response");
    assert_eq!(r.json()["delivered"], true, "{}", r.text());
    let r = call(&srv, "GET", &format!("/messages/{sid}"), &client, None);
    expect(&r, 200, None, "messages");
    assert_eq!(r.json()["total"], 2);

    // Each token is refused on the other role's endpoints, saying which
    // token they need.
    let need_agent = Some("agent token required");
    let need_client = Some("client token required");
    expect(
        &call(&srv, "GET", &poll, &client, None),
        401,
        need_agent,
        "poll, client",
    );
    let r = call(
        &srv,
        "POST",
        "/response",
        &client,
        Some(&answer(&sid, "c1")),
    );
    expect(&r, 401, need_agent, "response, client");
    let r = call(&srv, "POST", "/prompt", &agent, Some(&prompt(&sid, "c2")));
    expect(&r, 401, need_client, "prompt, agent");
    let cancel = json!({"session_id": sid, "client_msg_id": "c1"});
    let r = call(&srv, "POST", "/cancel", &agent, Some(&cancel));
    expect(&r, 401, need_client, "cancel, agent");
    let r = call(&srv, "DELETE", &format!("/sessions/{sid}"), &agent, None);
    expect(&r, 401, need_client, "delete, agent");
    // The agent watches for cancels and reads the conversation it answers:
    // its token for the session opens `/ws` and `GET /messages` too.
    let r = call(&srv, "GET", &format!("/messages/{sid}"), &agent, None);
    expect(&r, 200, None, "messages, agent");
    let auth = format!("Bearer {agent}");
    let r = srv.upgrade(&format!("/ws/{sid}"), &[("Authorization", &auth)]);
    assert_eq!(r.status, 101, "upgrade, agent: {}", r.text());
    let r = call(&srv, "GET", "/metrics", &client, None);
    assert_eq!(
        r.status, 200,
        "metrics stays open without RELAY_METRICS_TOKEN"
    );

    expect(
        &call(&srv, "DELETE", &format!("/sessions/{sid}"), &client, None),
        200,
        None,
        "delete",
    );
}

#[test]
fn another_session_gets_403_and_nothing_changes() {
    let srv = with_secret();
    let (mine, other) = (unique_session(), unique_session());
    let (client, agent) = (mint("client", &mine), mint("agent", &mine));
    let forbidden = |r: &Response, what: &str| {
        assert_eq!(r.status, 403, "{what}: {}", r.text());
        assert_eq!(
            r.json(),
            json!({"error": "Forbidden", "details": "token is for another session"}),
            "{what}"
        );
    };
    forbidden(
        &call(
            &srv,
            "POST",
            "/prompt",
            &client,
            Some(&prompt(&other, "c1")),
        ),
        "prompt",
    );
    forbidden(
        &call(&srv, "GET", &format!("/messages/{other}"), &client, None),
        "messages",
    );
    forbidden(
        &call(&srv, "PUT", &format!("/sessions/{other}"), &client, None),
        "PUT",
    );
    forbidden(
        &call(&srv, "DELETE", &format!("/sessions/{other}"), &client, None),
        "DELETE",
    );
    forbidden(
        &call(&srv, "GET", &format!("/prompts/{other}"), &agent, None),
        "poll",
    );
    let r = call(
        &srv,
        "POST",
        "/response",
        &agent,
        Some(&answer(&other, "c1")),
    );
    forbidden(&r, "response");
    let auth = format!("Bearer {client}");
    forbidden(
        &srv.upgrade(&format!("/ws/{other}"), &[("Authorization", &auth)]),
        "upgrade",
    );
    let offer = format!("relay.v1, bearer.{client}");
    let r = srv.upgrade(
        &format!("/ws/{other}"),
        &[("Sec-WebSocket-Protocol", &offer)],
    );
    forbidden(&r, "upgrade with the subprotocol");
    // Nothing was created or stored: the server-wide token sees no session.
    let r = call(&srv, "GET", &format!("/messages/{other}"), CLIENT, None);
    assert_eq!(r.status, 404, "{}", r.text());
    // Server-wide tokens keep working in every session.
    expect(
        &call(&srv, "POST", "/prompt", CLIENT, Some(&prompt(&other, "c1"))),
        200,
        None,
        "wide",
    );
    let r = call(
        &srv,
        "GET",
        &format!("/prompts/{other}?wait=false"),
        AGENT,
        None,
    );
    expect(&r, 200, None, "wide poll");
    assert_eq!(client_msg_ids(r.json().as_array().unwrap()), ["c1"]);
}

#[test]
fn expired_forged_truncated_and_foreign_tokens_get_401() {
    let srv = with_secret();
    let sid = unique_session();
    let path = format!("/messages/{sid}");
    // A token whose expiry has passed: minted by the library, since `relay
    // token` only mints ones that expire in the future.
    let secret = relay::token::Secret::new(SECRET.as_bytes()).unwrap();
    let past = now_ms() / 1000 - 1;
    let expired = secret.mint(relay::token::Role::Client, &sid, Some(past));
    let r = call(&srv, "GET", &path, &expired, None);
    expect(&r, 401, Some("token expired"), "expired");
    assert!(
        r.header("WWW-Authenticate")
            .is_some_and(|c| c.starts_with("Bearer"))
    );
    // One that expires later works (404: the session does not exist yet).
    let later = mint_with(SECRET, "client", &sid, &["--expires", "3600"]);
    expect(
        &call(&srv, "GET", &path, &later, None),
        404,
        None,
        "not yet expired",
    );

    let good = mint("client", &sid);
    let mut forged = good.clone().into_bytes();
    let mid = forged.len() / 2;
    forged[mid] = if forged[mid] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    let foreign = mint_with(OTHER_SECRET, "client", &sid, &[]);
    for (bad, what) in [
        (&forged[..], "forged"),
        (&good[..good.len() - 1], "truncated by one"),
        (&good[..good.len() / 2], "truncated by half"),
        (&format!("{good}A")[..], "extended"),
        (&foreign[..], "signed with another secret"),
    ] {
        let r = call(&srv, "GET", &path, bad, None);
        expect(&r, 401, Some("client or agent token required"), what);
        let r = srv.upgrade(&format!("/ws/{sid}?token={bad}"), &[]);
        expect(&r, 401, Some("client or agent token required"), what);
    }
    let r = call(&srv, "GET", &format!("/messages/{sid}"), CLIENT, None);
    assert_eq!(r.status, 404, "no refused request created the session");
}

#[test]
fn with_a_secret_alone_no_role_is_open() {
    let srv = Server::start_with(&[("RELAY_TOKEN_SECRET", SECRET)]);
    let sid = unique_session();
    for (method, path, body, details) in [
        (
            "POST",
            "/prompt".to_string(),
            Some(prompt(&sid, "c1")),
            "client token required",
        ),
        (
            "GET",
            format!("/prompts/{sid}?wait=false"),
            None,
            "agent token required",
        ),
        (
            "GET",
            format!("/messages/{sid}"),
            None,
            "client or agent token required",
        ),
        (
            "PUT",
            format!("/sessions/{sid}"),
            None,
            "client or agent token required",
        ),
    ] {
        let bytes = body.map(|b| serde_json::to_vec(&b).unwrap());
        let headers: &[(&str, &str)] = match bytes {
            Some(_) => &[("Content-Type", "application/json")],
            None => &[],
        };
        let r = srv.request(method, &path, headers, bytes.as_deref());
        expect(&r, 401, Some(details), &format!("{method} {path}"));
    }
    assert_eq!(srv.get("/healthz").status, 200);
    let warned = srv.logs().iter().any(|l| l.contains("endpoints are open"));
    assert!(!warned, "no role is open, so no open-role warning");
    // `relay token`'s tokens are what opens it.
    let client = mint("client", &sid);
    let r = call(&srv, "POST", "/prompt", &client, Some(&prompt(&sid, "c1")));
    expect(&r, 200, None, "minted client token");
}

#[test]
fn a_websocket_token_offered_as_a_subprotocol_is_answered_with_relay_v1() {
    let srv = with_secret();
    let sid = unique_session();
    let client = mint("client", &sid);
    let offer = format!("relay.v1, bearer.{client}");
    // A real client, which checks the answer names an offered subprotocol,
    // gets the session's answers through it.
    let mut ws = match srv.ws_with(&format!("/ws/{sid}"), &[("Sec-WebSocket-Protocol", &offer)]) {
        Ok(ws) => ws,
        Err(r) => panic!("upgrade with the subprotocol: {} {}", r.status, r.text()),
    };
    srv.wait_health("subscribers", 1);
    expect(
        &call(&srv, "POST", "/prompt", CLIENT, Some(&prompt(&sid, "c1"))),
        200,
        None,
        "prompt",
    );
    let agent = mint("agent", &sid);
    expect(
        &call(&srv, "POST", "/response", &agent, Some(&answer(&sid, "c1"))),
        200,
        None,
        "ans",
    );
    let frame = ws.recv_json_skip_pings();
    assert_eq!(
        (&frame["type"], &frame["data"]["client_msg_id"]),
        (&json!("message"), &json!("c1"))
    );
    // The answer's header, read raw: relay.v1 alone, never the token.
    let r = srv.upgrade(&format!("/ws/{sid}"), &[("Sec-WebSocket-Protocol", &offer)]);
    assert_eq!(r.status, 101, "{}", r.text());
    assert_eq!(r.header("Sec-WebSocket-Protocol"), Some("relay.v1"));
    // Server-wide tokens work there too; a bad one is refused before the upgrade.
    let offer = format!("relay.v1, bearer.{CLIENT}");
    let r = srv.upgrade(&format!("/ws/{sid}"), &[("Sec-WebSocket-Protocol", &offer)]);
    assert_eq!(r.status, 101, "{}", r.text());
    let r = srv.upgrade(
        &format!("/ws/{sid}"),
        &[("Sec-WebSocket-Protocol", "relay.v1, bearer.x")],
    );
    expect(
        &r,
        401,
        Some("client or agent token required"),
        "a bad subprotocol token",
    );
    // Without relay.v1 offered, none is named in the answer.
    let offer = format!("bearer.{client}");
    let r = srv.upgrade(&format!("/ws/{sid}"), &[("Sec-WebSocket-Protocol", &offer)]);
    assert_eq!(r.status, 101, "{}", r.text());
    assert_eq!(r.header("Sec-WebSocket-Protocol"), None);
}

#[test]
fn relay_agent_and_send_work_with_session_tokens() {
    let srv = Server::start_with(&[("RELAY_TOKEN_SECRET", SECRET)]);
    let sid = unique_session();
    let scheme = if tls_mode() { "https" } else { "http" };
    let url = format!("{scheme}://{}", srv.addr());
    let agent_token = mint("agent", &sid);
    let mut agent = Killed(
        relay()
            .args([
                "agent",
                "--url",
                &url,
                "--session",
                &sid,
                "--token",
                &agent_token,
            ])
            .args(["--", "tr", "a-z", "A-Z"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn relay agent"),
    );
    srv.wait_health("parked_polls", 1);
    let url = format!("{scheme}://{}", srv.addr());
    let client_token = mint("client", &sid);
    let out = relay()
        .args(["send", "--url", &url, "--session", &sid, "--timeout", "20"])
        .env("RELAY_CLIENT_TOKEN", &client_token)
        .arg("hello")
        .output()
        .expect("run relay send");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO\n");
    // The agent's token does not let `relay send` in.
    let out = relay()
        .args(["send", "--url", &url, "--session", &sid, "--timeout", "5"])
        .args(["--token", &agent_token, "again"])
        .output()
        .expect("run relay send");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401"),
        "{out:?}"
    );
    assert!(
        agent.0.try_wait().expect("try_wait").is_none(),
        "the agent still runs"
    );
}

/// A child process killed when the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_short_secret_stops_the_server_with_exit_2() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_relay"))
        .env_clear()
        .env("RELAY_PORT", "0")
        .env("RELAY_TOKEN_SECRET", "only-31-bytes-long-secret-value")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relay");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("relay kept running with a short secret");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("RELAY_TOKEN_SECRET") && stderr.contains("32 bytes"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("only-31-bytes"),
        "the secret is not echoed: {stderr}"
    );
}
