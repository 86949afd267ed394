//! Bearer-token auth (RELAY_CLIENT_TOKEN, RELAY_AGENT_TOKEN) against the real
//! binary: each endpoint's role, the 401 answer, the open endpoints, the
//! WebSocket `?token=`, one token for both roles, one role left open (and the
//! start-up warning naming it), tokens kept out of the logs, and a rejected
//! request changing nothing.

use crate::common::*;
use serde_json::{Value, json};

const CLIENT: &str = "client-tok-7Qz1fK";
const AGENT: &str = "agent-tok-Lm93xP";
const WRONG: &str = "wrong-tok-Hb5vR0";

fn both_tokens() -> Server {
    Server::start_with(&[("RELAY_CLIENT_TOKEN", CLIENT), ("RELAY_AGENT_TOKEN", AGENT)])
}

/// One request on a fresh connection, with `Authorization: Bearer <token>`
/// when a token is given and a JSON body when one is given.
#[track_caller]
pub(super) fn call(
    srv: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Response {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = Vec::new();
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let bytes = body.map(|b| serde_json::to_vec(b).unwrap());
    if bytes.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    srv.request(method, path, &headers, bytes.as_deref())
}

#[track_caller]
fn assert_401(resp: &Response, what: &str) {
    assert_eq!(resp.status, 401, "{what}: {}", resp.text());
    let challenge = resp.header("WWW-Authenticate").unwrap_or_default();
    assert!(
        challenge.starts_with("Bearer"),
        "{what}: WWW-Authenticate is {challenge:?}"
    );
    let body = resp.json();
    assert!(body["error"].is_string(), "{what}: body {body}");
    // Every response carries it, so a browser can read the 401.
    assert!(
        resp.header("Access-Control-Allow-Origin").is_some(),
        "{what}: no Access-Control-Allow-Origin"
    );
}

#[track_caller]
fn assert_ok(resp: &Response, what: &str) {
    assert_eq!(resp.status, 200, "{what}: {}", resp.text());
}

/// `call`, asserting 200.
#[track_caller]
fn ok(
    srv: &Server,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Response {
    let r = call(srv, method, path, token, body);
    assert_ok(&r, &format!("{method} {path} with {token:?}"));
    r
}

/// `call`, asserting 401.
#[track_caller]
fn denied(srv: &Server, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) {
    let r = call(srv, method, path, token, body);
    assert_401(&r, &format!("{method} {path} with {token:?}"));
}

fn prompt_body(sid: &str, id: &str) -> Value {
    json!({"session_id": sid, "prompt": "q", "client_msg_id": id})
}

fn response_body(sid: &str, id: &str) -> Value {
    json!({"session_id": sid, "client_msg_id": id, "text": "a"})
}

/// Every token that is not `good` (none, the other role's, a wrong one, a
/// prefix of the right one) gets 401 for `method path`.
#[track_caller]
fn assert_only(
    srv: &Server,
    good: &str,
    other: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) {
    let prefix = &good[..good.len() - 1];
    for token in [None, Some(other), Some(WRONG), Some(prefix)] {
        denied(srv, method, path, token, body);
    }
}

#[test]
fn agent_endpoints_need_the_agent_token() {
    let srv = both_tokens();
    let sid = unique_session();
    ok(
        &srv,
        "POST",
        "/prompt",
        Some(CLIENT),
        Some(&prompt_body(&sid, "c1")),
    );
    let poll = format!("/prompts/{sid}?wait=false");
    assert_only(&srv, AGENT, CLIENT, "GET", &poll, None);
    let r = call(&srv, "GET", &poll, Some(AGENT), None);
    assert_ok(&r, "GET /prompts with the agent token");
    assert_eq!(r.json().as_array().map(Vec::len), Some(1), "{}", r.text());
    let answer = response_body(&sid, "c1");
    assert_only(&srv, AGENT, CLIENT, "POST", "/response", Some(&answer));
    ok(&srv, "POST", "/response", Some(AGENT), Some(&answer));
}

#[test]
fn client_endpoints_need_the_client_token() {
    let srv = both_tokens();
    let sid = unique_session();
    let body = prompt_body(&sid, "c1");
    assert_only(&srv, CLIENT, AGENT, "POST", "/prompt", Some(&body));
    ok(&srv, "POST", "/prompt", Some(CLIENT), Some(&body));
    let session = format!("/sessions/{sid}");
    assert_only(&srv, CLIENT, AGENT, "DELETE", &session, None);
    ok(&srv, "DELETE", &session, Some(CLIENT), None);
}

#[test]
fn either_token_opens_the_websocket_and_the_history() {
    let srv = both_tokens();
    let sid = unique_session();
    ok(
        &srv,
        "POST",
        "/prompt",
        Some(CLIENT),
        Some(&prompt_body(&sid, "c1")),
    );
    let history = format!("/messages/{sid}");
    let prefix = &CLIENT[..CLIENT.len() - 1];
    for token in [None, Some(WRONG), Some(prefix)] {
        denied(&srv, "GET", &history, token, None);
    }
    for token in [CLIENT, AGENT] {
        let r = call(&srv, "GET", &history, Some(token), None);
        assert_ok(&r, "GET /messages");
        assert_eq!(r.json()["total"], 1, "{}", r.text());
    }
    let ws = format!("/ws/{sid}");
    let auth = format!("Bearer {WRONG}");
    assert_401(&srv.upgrade(&ws, &[("Authorization", &auth)]), "upgrade");
    assert_401(&srv.upgrade(&ws, &[]), "upgrade without a token");
    for token in [CLIENT, AGENT] {
        let auth = format!("Bearer {token}");
        assert_eq!(srv.upgrade(&ws, &[("Authorization", &auth)]).status, 101);
    }
}

#[test]
fn the_cancel_endpoint_needs_the_client_token() {
    let srv = both_tokens();
    let sid = unique_session();
    let body = prompt_body(&sid, "c1");
    ok(&srv, "POST", "/prompt", Some(CLIENT), Some(&body));
    let cancel = json!({"session_id": sid, "client_msg_id": "c1"});
    assert_only(&srv, CLIENT, AGENT, "POST", "/cancel", Some(&cancel));
    let r = ok(&srv, "POST", "/cancel", Some(CLIENT), Some(&cancel));
    assert_eq!(r.json()["cancelled"], true, "{}", r.text());
}

#[test]
fn put_sessions_accepts_either_token() {
    // One relay: `sessions` counts its own local copies.
    let srv = both_tokens().single();
    let (a, b) = (unique_session(), unique_session());
    for token in [None, Some(WRONG)] {
        denied(&srv, "PUT", &format!("/sessions/{a}"), token, None);
    }
    let r = call(&srv, "PUT", &format!("/sessions/{a}"), Some(CLIENT), None);
    assert_ok(&r, "PUT with the client token");
    assert_eq!(r.json()["created"], true);
    let r = call(&srv, "PUT", &format!("/sessions/{b}"), Some(AGENT), None);
    assert_ok(&r, "PUT with the agent token");
    assert_eq!(r.json()["created"], true);
    assert_eq!(srv.health()["sessions"], 2);
}

#[test]
fn malformed_authorization_headers_get_401() {
    let srv = both_tokens();
    let sid = unique_session();
    let body = serde_json::to_vec(&prompt_body(&sid, "c1")).unwrap();
    let values = [
        format!("Basic {CLIENT}"),
        CLIENT.to_string(),
        "Bearer".to_string(),
        "Bearer ".to_string(),
        format!("Bearer {CLIENT}{CLIENT}"),
        format!("Bearer {CLIENT} extra"),
    ];
    for v in &values {
        let headers = [
            ("Authorization", v.as_str()),
            ("Content-Type", "application/json"),
        ];
        assert_401(&srv.request("POST", "/prompt", &headers, Some(&body)), v);
    }
    assert_eq!(
        srv.health()["sessions"],
        0,
        "no rejected prompt created a session"
    );
}

#[test]
fn healthz_and_readyz_need_no_token() {
    let srv = both_tokens();
    assert_eq!(srv.get("/healthz").json()["ok"], true);
    assert_eq!(srv.request("HEAD", "/healthz", &[], None).status, 200);
    let r = srv.get("/readyz");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["ready"], true);
    let wrong = format!("Bearer {WRONG}");
    let r = srv.request("GET", "/healthz", &[("Authorization", &wrong)], None);
    assert_eq!(
        r.status, 200,
        "a wrong token on an open endpoint is ignored"
    );
}

#[test]
fn cors_preflight_needs_no_token() {
    let srv = both_tokens();
    let sid = unique_session();
    for path in [
        "/prompt".to_string(),
        "/response".into(),
        format!("/prompts/{sid}"),
        format!("/sessions/{sid}"),
    ] {
        let r = srv.request(
            "OPTIONS",
            &path,
            &[
                ("Origin", "https://app.example"),
                ("Access-Control-Request-Method", "POST"),
                (
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
            ],
            None,
        );
        assert_eq!(r.status, 204, "{path}: {}", r.text());
        let allowed = r.header("Access-Control-Allow-Headers").unwrap_or_default();
        assert!(
            allowed.to_ascii_lowercase().contains("authorization"),
            "{path}: {allowed:?}"
        );
    }
}

#[test]
fn websocket_query_token_is_accepted_and_receives_broadcasts() {
    let srv = both_tokens();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}?token={CLIENT}"));
    srv.wait_health("subscribers", 1);
    ok(
        &srv,
        "POST",
        "/prompt",
        Some(CLIENT),
        Some(&prompt_body(&sid, "c1")),
    );
    let ack = call(
        &srv,
        "POST",
        "/response",
        Some(AGENT),
        Some(&response_body(&sid, "c1")),
    );
    assert_eq!(ack.json()["delivered"], true, "{}", ack.text());
    let frame = ws.recv_json_skip_pings();
    assert_eq!(frame["type"], "message", "{frame}");
    assert_eq!(frame["data"]["client_msg_id"], "c1");
}

#[test]
fn websocket_query_token_is_percent_decoded() {
    const ODD: &str = "tok/with+plus=eq&amp%pct";
    let srv = Server::start_with(&[("RELAY_CLIENT_TOKEN", ODD), ("RELAY_AGENT_TOKEN", AGENT)]);
    let sid = unique_session();
    let encoded = "tok%2Fwith%2Bplus%3Deq%26amp%25pct";
    let _ws = srv.ws(&format!("/ws/{sid}?token={encoded}"));
    srv.wait_health("subscribers", 1);
    let r = srv.upgrade(&format!("/ws/{sid}?token=tok%2Fwith"), &[]);
    assert_401(&r, "a truncated token");
}

#[test]
fn wrong_query_token_gets_401_before_the_upgrade() {
    let srv = both_tokens();
    let sid = unique_session();
    for token in [WRONG, ""] {
        let r = srv.upgrade(&format!("/ws/{sid}?token={token}"), &[]);
        assert_401(&r, &format!("?token={token}"));
        assert!(
            r.header("Sec-WebSocket-Accept").is_none(),
            "no upgrade on a 401"
        );
        match srv.ws_with(&format!("/ws/{sid}?token={token}"), &[]) {
            Ok(_) => panic!("the upgrade with ?token={token} succeeded"),
            Err(resp) => assert_401(&resp, "tungstenite client"),
        }
    }
    let h = srv.health();
    assert_eq!(h["subscribers"], 0, "{h}");
    assert_eq!(
        h["sessions"], 0,
        "a refused upgrade creates no session: {h}"
    );
}

#[test]
fn one_token_can_serve_both_roles() {
    const BOTH: &str = "shared-tok-Pp41aZ";
    let srv = Server::start_with(&[("RELAY_CLIENT_TOKEN", BOTH), ("RELAY_AGENT_TOKEN", BOTH)]);
    let sid = unique_session();
    let calls: [(&str, String, Option<Value>); 5] = [
        ("PUT", format!("/sessions/{sid}"), None),
        ("POST", "/prompt".into(), Some(prompt_body(&sid, "c1"))),
        ("GET", format!("/prompts/{sid}?wait=false"), None),
        ("POST", "/response".into(), Some(response_body(&sid, "c1"))),
        ("GET", format!("/messages/{sid}"), None),
    ];
    for (method, path, body) in &calls {
        denied(&srv, method, path, None, body.as_ref());
        ok(&srv, method, path, Some(BOTH), body.as_ref());
    }
    let _ws = srv.ws(&format!("/ws/{sid}?token={BOTH}"));
    srv.wait_health("subscribers", 1);
    ok(
        &srv,
        "DELETE",
        &format!("/sessions/{sid}"),
        Some(BOTH),
        None,
    );
    let warned = srv
        .logs()
        .into_iter()
        .any(|l| l.contains("\"level\":\"warn\""));
    assert!(
        !warned,
        "both roles are protected: no open-role warning expected"
    );
}

/// The start-up warning: a `warn` line naming `role` as the open one.
#[track_caller]
fn assert_open_role_warning(srv: &Server, role: &str) {
    let line = srv.wait_for_log("\"level\":\"warn\"");
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let names_role = v["open_role"] == role
        || v["event"]
            .as_str()
            .is_some_and(|e| e.contains(&format!("{role} endpoints are open")));
    assert!(
        names_role,
        "the warning does not name the open {role} role: {line}"
    );
}

#[test]
fn only_a_client_token_leaves_the_agent_role_open_and_warns() {
    let srv = Server::start_with(&[("RELAY_CLIENT_TOKEN", CLIENT)]);
    assert_open_role_warning(&srv, "agent");
    let sid = unique_session();
    ok(&srv, "PUT", &format!("/sessions/{sid}"), None, None);
    let body = prompt_body(&sid, "c1");
    denied(&srv, "POST", "/prompt", None, Some(&body));
    ok(&srv, "POST", "/prompt", Some(CLIENT), Some(&body));
    let poll = format!("/prompts/{sid}?wait=false");
    assert_eq!(
        call(&srv, "GET", &poll, None, None)
            .json()
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    ok(
        &srv,
        "POST",
        "/response",
        None,
        Some(&response_body(&sid, "c1")),
    );
    assert_401(&srv.upgrade(&format!("/ws/{sid}"), &[]), "upgrade");
    denied(&srv, "GET", &format!("/messages/{sid}"), None, None);
    denied(&srv, "DELETE", &format!("/sessions/{sid}"), None, None);
}

#[test]
fn only_an_agent_token_leaves_the_client_role_open_and_warns() {
    let srv = Server::start_with(&[("RELAY_AGENT_TOKEN", AGENT)]);
    assert_open_role_warning(&srv, "client");
    let sid = unique_session();
    ok(&srv, "PUT", &format!("/sessions/{sid}"), None, None);
    ok(
        &srv,
        "POST",
        "/prompt",
        None,
        Some(&prompt_body(&sid, "c1")),
    );
    let _ws = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("subscribers", 1);
    let poll = format!("/prompts/{sid}?wait=false");
    denied(&srv, "GET", &poll, None, None);
    ok(&srv, "GET", &poll, Some(AGENT), None);
    let answer = response_body(&sid, "c1");
    denied(&srv, "POST", "/response", None, Some(&answer));
    ok(&srv, "POST", "/response", Some(AGENT), Some(&answer));
    assert_eq!(
        call(&srv, "GET", &format!("/messages/{sid}"), None, None).json()["total"],
        2
    );
    ok(&srv, "DELETE", &format!("/sessions/{sid}"), None, None);
}

#[test]
fn tokens_never_appear_in_the_logs() {
    let srv = Server::start_with(&[
        ("RELAY_CLIENT_TOKEN", CLIENT),
        ("RELAY_AGENT_TOKEN", AGENT),
        ("RELAY_LOG", "debug"),
    ]);
    let sid = unique_session();
    // Authenticated traffic over every route.
    ok(
        &srv,
        "POST",
        "/prompt",
        Some(CLIENT),
        Some(&prompt_body(&sid, "c1")),
    );
    ok(
        &srv,
        "GET",
        &format!("/prompts/{sid}?wait=false"),
        Some(AGENT),
        None,
    );
    let mut ws = srv.ws(&format!("/ws/{sid}?token={CLIENT}"));
    srv.wait_health("subscribers", 1);
    ok(
        &srv,
        "POST",
        "/response",
        Some(AGENT),
        Some(&response_body(&sid, "c1")),
    );
    assert_eq!(ws.recv_json_skip_pings()["type"], "message");
    ws.close();
    // Failed attempts, with the real tokens in the wrong place and wrong ones.
    denied(
        &srv,
        "POST",
        "/prompt",
        Some(AGENT),
        Some(&prompt_body(&sid, "c2")),
    );
    denied(&srv, "GET", &format!("/messages/{sid}"), Some(WRONG), None);
    assert_401(&srv.upgrade(&format!("/ws/{sid}?token={WRONG}"), &[]), "x");
    let r = srv.upgrade(&format!("/ws/{sid}?token={}", &AGENT[1..]), &[]);
    assert_401(&r, "x");
    // A malformed request carrying a token (bad JSON, then bad framing).
    let auth = format!("Bearer {CLIENT}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    assert_eq!(
        srv.request("POST", "/prompt", &headers, Some(b"{\"x"))
            .status,
        400
    );
    let mut raw = srv.conn();
    raw.send_raw(format!("GET /healthz?token={CLIENT} HTTP/1.1\r\nAuthorization: {auth}\r\nContent-Length: x\r\n\r\n").as_bytes());
    assert_eq!(raw.read_response().status, 400);
    // The log is written in order: once the deletion is logged, so is everything before it.
    ok(
        &srv,
        "DELETE",
        &format!("/sessions/{sid}"),
        Some(CLIENT),
        None,
    );
    srv.wait_for_log("session deleted");
    // Debug logging is on. With two relays (TEST_WITH_REDIS) the prompt may
    // have been stored by the other one, whose lines are read on their own.
    srv.wait_for_log("prompt stored");
    let logs = srv.logs();
    for secret in [CLIENT, AGENT, WRONG] {
        if let Some(line) = logs.iter().find(|l| l.contains(secret)) {
            panic!("token {secret:?} appears in the log: {line}");
        }
    }
}

#[test]
fn rejected_requests_change_nothing() {
    let srv = both_tokens();
    let sid = unique_session();
    let fresh = unique_session();
    denied(
        &srv,
        "POST",
        "/prompt",
        Some(WRONG),
        Some(&prompt_body(&fresh, "c0")),
    );
    assert_eq!(
        srv.health()["sessions"],
        0,
        "a rejected prompt created a session"
    );
    ok(
        &srv,
        "POST",
        "/prompt",
        Some(CLIENT),
        Some(&prompt_body(&sid, "c1")),
    );
    denied(
        &srv,
        "POST",
        "/prompt",
        Some(AGENT),
        Some(&prompt_body(&sid, "c2")),
    );
    denied(
        &srv,
        "POST",
        "/response",
        Some(CLIENT),
        Some(&response_body(&sid, "c1")),
    );
    denied(
        &srv,
        "DELETE",
        &format!("/sessions/{sid}"),
        Some(AGENT),
        None,
    );
    let pending = call(
        &srv,
        "GET",
        &format!("/prompts/{sid}?wait=false"),
        Some(AGENT),
        None,
    )
    .json();
    let ids: Vec<&str> = pending
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["client_msg_id"].as_str())
        .collect();
    assert_eq!(ids, ["c1"], "c1 is still pending, c2 was never stored");
    assert_eq!(
        call(&srv, "GET", &format!("/messages/{sid}"), Some(CLIENT), None).json()["total"],
        1
    );
    // The rejected c2 was not remembered for dedupe either.
    let again = call(
        &srv,
        "POST",
        "/prompt",
        Some(CLIENT),
        Some(&prompt_body(&sid, "c2")),
    );
    assert_ok(&again, "c2 for real");
    assert!(
        again.json().get("duplicate").is_none_or(|d| d == false),
        "{}",
        again.text()
    );
}
