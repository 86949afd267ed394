//! Settings that change API behaviour, each on its own server: RELAY_CORS_ORIGINS,
//! RELAY_HISTORY_LIMIT, RELAY_MAX_PENDING, RELAY_MAX_SESSIONS and RELAY_SESSION_TTL.

use crate::common;

use crate::common::{Server, skip_in_cluster, unique_session};
use serde_json::json;

#[track_caller]
fn assert_503(resp: &common::Response) {
    assert_eq!(resp.status, 503, "body: {}", resp.text());
    assert!(resp.json()["error"].is_string(), "{}", resp.text());
}

// ---- RELAY_CORS_ORIGINS ----

#[test]
fn configured_origin_is_echoed_in_allow_origin() {
    let srv = Server::start_with(&[("RELAY_CORS_ORIGINS", "https://a.example,https://b.example")]);
    for path in ["/healthz", "/nope"] {
        let resp = srv.request("GET", path, &[("Origin", "https://b.example")], None);
        assert_eq!(
            resp.header("access-control-allow-origin"),
            Some("https://b.example"),
            "{path}"
        );
    }
    let pre = srv.request(
        "OPTIONS",
        "/prompt",
        &[
            ("Origin", "https://a.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        None,
    );
    assert_eq!(pre.status, 204);
    assert_eq!(
        pre.header("access-control-allow-origin"),
        Some("https://a.example")
    );
}

#[test]
fn a_woken_long_poll_carries_the_same_cors_headers_as_any_answer() {
    let srv = Server::start_with(&[("RELAY_CORS_ORIGINS", "https://a.example")]);
    let sid = unique_session();
    srv.put(&format!("/sessions/{sid}"));
    let mut agent = srv.conn();
    agent.send(
        "GET",
        &format!("/prompts/{sid}?timeout=20"),
        &[("Origin", "https://a.example")],
        None,
    );
    srv.wait_health("parked_polls", 1);
    srv.prompt(&sid, "wake up", Some("c1"));
    let woken = agent.read_response();
    assert_eq!(woken.status, 200, "{}", woken.text());
    assert_eq!(
        woken.header("access-control-allow-origin"),
        Some("https://a.example")
    );
    assert_eq!(woken.header("vary"), Some("Origin"));
}

#[test]
fn origin_outside_the_allow_list_is_not_allowed() {
    let srv = Server::start_with(&[("RELAY_CORS_ORIGINS", "https://a.example")]);
    let evil = [("Origin", "https://evil.example")];
    let resp = srv.request("GET", "/healthz", &evil, None);
    let allow = resp.header("access-control-allow-origin");
    assert!(
        matches!(allow, None | Some("https://a.example")),
        "allow-origin {allow:?} lets evil.example in"
    );
    let pre = srv.request(
        "OPTIONS",
        "/prompt",
        &[
            ("Origin", "https://evil.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        None,
    );
    let allow = pre.header("access-control-allow-origin");
    assert!(
        matches!(allow, None | Some("https://a.example")),
        "preflight allow-origin {allow:?} lets evil.example in"
    );
    let sid = unique_session();
    match srv.ws_with(&format!("/ws/{sid}"), &evil) {
        Ok(_) => panic!("WebSocket upgrade from a foreign origin succeeded"),
        Err(resp) => assert_eq!(resp.status, 403),
    }
    assert!(
        srv.ws_with(&format!("/ws/{sid}"), &[("Origin", "https://a.example")])
            .is_ok()
    );
}

// ---- RELAY_HISTORY_LIMIT ----

#[test]
fn history_limit_drops_the_oldest_messages() {
    let srv = Server::start_with(&[("RELAY_HISTORY_LIMIT", "3")]);
    let sid = unique_session();
    for i in 1..=5 {
        srv.prompt(&sid, &format!("p{i}"), Some(&format!("c{i}")));
    }
    let body = srv.messages(&sid, "");
    assert_eq!(body["total"], 3, "{body}");
    let seqs: Vec<u64> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["data"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 4, 5], "seq is never reused");
    srv.respond(&sid, "c5", "answer");
    let body = srv.messages(&sid, "");
    assert_eq!(body["total"], 3);
    assert_eq!(body["messages"][2]["type"], "assistant");
    assert_eq!(body["messages"][2]["data"]["seq"], 6);
}

// ---- RELAY_MAX_PENDING ----

#[test]
fn prompt_beyond_the_pending_cap_is_503_until_one_is_answered() {
    let srv = Server::start_with(&[("RELAY_MAX_PENDING", "2")]);
    let sid = unique_session();
    srv.prompt(&sid, "p1", Some("c1"));
    srv.prompt(&sid, "p2", Some("c2"));
    let over = srv.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "p3", "client_msg_id": "c3"}),
    );
    assert_503(&over);
    assert_eq!(srv.pending(&sid).len(), 2);
    srv.prompt(&unique_session(), "elsewhere", None);
    srv.respond(&sid, "c1", "done");
    srv.prompt(&sid, "p3", Some("c3"));
    assert_eq!(srv.pending(&sid).len(), 2);
}

#[test]
fn resent_prompt_is_a_duplicate_even_when_the_pending_cap_is_full() {
    let srv = Server::start_with(&[("RELAY_MAX_PENDING", "1")]);
    let sid = unique_session();
    srv.prompt(&sid, "p1", Some("c1"));
    let again = srv.prompt(&sid, "p1", Some("c1"));
    assert_eq!(again["duplicate"], true, "{again}");
}

// ---- RELAY_MAX_SESSIONS ----

#[test]
fn new_session_beyond_the_session_cap_is_503() {
    if skip_in_cluster("each bucket checks its own share of the cap: it is approximate") {
        return;
    }
    // One relay: the cap counts its own sessions.
    let srv = Server::start_single_with(&[("RELAY_MAX_SESSIONS", "2")]);
    let (a, b, c) = (unique_session(), unique_session(), unique_session());
    srv.prompt(&a, "p", None);
    assert_eq!(srv.put(&format!("/sessions/{b}")).status, 200);
    assert_503(&srv.post_json("/prompt", &json!({"session_id": c, "prompt": "p"})));
    assert_503(&srv.put(&format!("/sessions/{c}")));
    match srv.ws_with(&format!("/ws/{c}"), &[]) {
        Ok(_) => panic!("a WebSocket connect created a session beyond the cap"),
        Err(resp) => assert_503(&resp),
    }
    assert_eq!(srv.get(&format!("/prompts/{c}?wait=false")).status, 404);
    srv.prompt(&a, "existing sessions still work", None);
    assert_eq!(srv.health()["sessions"], 2);
    assert_eq!(srv.delete(&format!("/sessions/{a}")).status, 200);
    srv.prompt(&c, "room again", None);
}

#[test]
fn readyz_is_503_while_the_session_cap_is_full() {
    // One relay: the cap counts its own sessions.
    let srv = Server::start_single_with(&[("RELAY_MAX_SESSIONS", "1")]);
    let sid = unique_session();
    assert_eq!(srv.get("/readyz").status, 200);
    srv.prompt(&sid, "p", None);
    let resp = srv.get("/readyz");
    assert_eq!(resp.status, 503, "{}", resp.text());
    let body = resp.json();
    assert_eq!(body["ready"], false);
    assert!(body["reason"].is_string(), "{body}");
    assert_eq!(srv.delete(&format!("/sessions/{sid}")).status, 200);
    assert_eq!(srv.get("/readyz").status, 200);
}

// ---- RELAY_SESSION_TTL ----

#[test]
fn idle_session_is_collected_after_the_ttl() {
    let srv = Server::start_with(&[("RELAY_SESSION_TTL", "0.3")]);
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    srv.wait_health("sessions", 0);
    let resp = srv.get(&format!("/prompts/{sid}?wait=false"));
    common::assert_error(&resp, 404, "Session not found");
    assert_eq!(srv.get(&format!("/messages/{sid}")).status, 404);
}

#[test]
fn session_with_a_subscriber_is_not_collected() {
    let srv = Server::start_with(&[("RELAY_SESSION_TTL", "0.3")]);
    let (idle, watched) = (unique_session(), unique_session());
    let mut ws = srv.ws(&format!("/ws/{watched}"));
    srv.prompt(&watched, "q", Some("c"));
    srv.prompt(&idle, "p", None);
    // The idle session, last touched after the watched one, going away proves the
    // watched one has been idle past the TTL too.
    srv.wait_health("sessions", 1);
    assert_eq!(srv.get(&format!("/prompts/{idle}?wait=false")).status, 404);
    assert_eq!(srv.pending(&watched).len(), 1);
    assert_eq!(srv.respond(&watched, "c", "still here")["delivered"], true);
    assert_eq!(ws.recv_json_skip_pings()["data"]["text"], "still here");
}

#[test]
fn a_session_ttl_of_0_is_accepted_and_means_never() {
    // The sweep runs once a minute then; that it collects nothing is the
    // core's (config.rs: a TTL of 0 is `NEVER`), that the server starts
    // with it and keeps the session is shown here.
    let srv = Server::start_with(&[("RELAY_SESSION_TTL", "0")]);
    let sid = unique_session();
    srv.prompt(&sid, "p", Some("c"));
    assert_eq!(srv.health()["sessions"], 1);
    assert_eq!(srv.pending(&sid).len(), 1);
}
