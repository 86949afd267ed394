//! The API's rules without sockets: tokens per role, CORS headers, the
//! Content-Type check, the rate limit and the health bodies.

use serde_json::{Value, json};

use super::*;

fn cfg(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

fn relay() -> Relay {
    Relay::in_memory(Config::default().relay_limits())
}

fn head(method: &str, path: &str, headers: &[(&str, &str)]) -> RequestHead {
    let (path, query) = match path.split_once('?') {
        Some((p, q)) => (p.to_string(), Some(q.to_string())),
        None => (path.to_string(), None),
    };
    let mut h = RequestHead {
        method: Some(match method {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        }),
        path: path.into(),
        query,
        keep_alive: true,
        ..RequestHead::default()
    };
    for (k, v) in headers {
        match k.to_ascii_lowercase().as_str() {
            "authorization" => h.authorization = Some(v.to_string()),
            "content-type" => h.json = crate::http::parse::is_json(v),
            "origin" => h.origin = Some(v.to_string()),
            "x-forwarded-for" => h.forwarded_for = Some(v.to_string()),
            "sec-websocket-protocol" => h.ws_protocols = Some(v.to_string()),
            other => panic!("test header {other} not wired"),
        }
    }
    h
}

const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
const CONN: ConnId = ConnId {
    key: 1,
    generation: 1,
};

fn call(api: &mut Api, relay: &mut Relay, h: &RequestHead, body: &str) -> Outcome {
    let turn = Turn {
        now: Millis(0),
        unix_ms: 1_700_000_000_000,
    };
    api.handle(
        relay,
        turn,
        CONN,
        PEER,
        h,
        body.as_bytes(),
        Facts::default(),
    )
}

#[track_caller]
fn answer(o: Outcome) -> (u16, Value) {
    match o {
        Outcome::Answer(a) => {
            let body = if a.body.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(a.body.bytes()).expect("JSON body")
            };
            (a.status, body)
        }
        other => panic!("expected an answer, got {other:?}"),
    }
}

const JSON_CT: (&str, &str) = ("Content-Type", "application/json; charset=utf-8");

#[test]
fn without_tokens_every_role_is_open() {
    let mut api = Api::new(&Config::default());
    let mut r = relay();
    let p = head("POST", "/prompt", &[JSON_CT]);
    let (status, _) = answer(call(
        &mut api,
        &mut r,
        &p,
        r#"{"session_id":"s","prompt":"x"}"#,
    ));
    assert_eq!(status, 200);
}

#[test]
fn each_role_needs_its_own_token_and_put_takes_either() {
    let mut api = Api::new(&cfg(|c| {
        c.client_token = Some("client".into());
        c.agent_token = Some("agent".into());
    }));
    let mut r = relay();
    let prompt = r#"{"session_id":"s","prompt":"x"}"#;
    for (token, want) in [(None, 401), (Some("agent"), 401), (Some("client"), 200)] {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut hs = vec![JSON_CT];
        if let Some(b) = &bearer {
            hs.push(("Authorization", b.as_str()));
        }
        let (status, _) = answer(call(
            &mut api,
            &mut r,
            &head("POST", "/prompt", &hs),
            prompt,
        ));
        assert_eq!(status, want, "POST /prompt with {token:?}");
    }
    for token in ["client", "agent"] {
        let auth = format!("Bearer {token}");
        let h = head("PUT", "/sessions/s", &[("Authorization", &auth)]);
        assert_eq!(answer(call(&mut api, &mut r, &h, "")).0, 200, "{token}");
    }
    let h = head(
        "GET",
        "/prompts/s?wait=false",
        &[("Authorization", "Bearer client")],
    );
    assert_eq!(answer(call(&mut api, &mut r, &h, "")).0, 401);
    let h = head("GET", "/healthz", &[]);
    assert_eq!(
        answer(call(&mut api, &mut r, &h, "")).0,
        200,
        "healthz is open"
    );
}

#[test]
fn a_websocket_may_pass_its_token_in_the_query_but_a_header_wins() {
    let api = Api::new(&cfg(|c| c.client_token = Some("secret".into())));
    let route = Route::WebSocket(SessionId::new("s").unwrap());
    let ok = head("GET", "/ws/s?token=secret", &[]);
    assert!(api.authorize(&route, &ok, 0).is_ok());
    let wrong_header = head(
        "GET",
        "/ws/s?token=secret",
        &[("Authorization", "Bearer nope")],
    );
    assert_eq!(
        api.authorize(&route, &wrong_header, 0).unwrap_err().status,
        401
    );
    let not_ws = head("GET", "/messages/s?token=secret", &[]);
    let route = Route::Messages(SessionId::new("s").unwrap());
    assert_eq!(api.authorize(&route, &not_ws, 0).unwrap_err().status, 401);
}

#[test]
fn constant_time_eq_compares_whole_values() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abcd"));
    assert!(constant_time_eq(b"", b""));
}

#[test]
fn posts_must_be_json() {
    for (ct, ok) in [
        ("application/json", true),
        ("Application/JSON ; charset=utf-8", true),
        ("text/plain", false),
        ("application/jsonx", false),
    ] {
        assert_eq!(crate::http::parse::is_json(ct), ok, "{ct}");
        assert_eq!(head("POST", "/prompt", &[("Content-Type", ct)]).json, ok);
    }
    assert!(!head("POST", "/prompt", &[]).json);
    let mut api = Api::new(&Config::default());
    let mut r = relay();
    let h = head("POST", "/prompt", &[("Content-Type", "text/plain")]);
    let (status, body) = answer(call(
        &mut api,
        &mut r,
        &h,
        r#"{"session_id":"s","prompt":"x"}"#,
    ));
    assert_eq!(status, 415);
    assert_eq!(
        body,
        json!({"error": "Content-Type must be application/json"})
    );
    assert!(!r.has_session("s"), "nothing stored");
}

#[test]
fn cors_echoes_a_listed_origin_with_vary_and_star_otherwise() {
    let any = Api::new(&Config::default());
    let m = any.meta(Some("https://x.example"), true, Facts::default());
    assert_eq!((m.allow_origin, m.vary_origin), (Some("*"), false));
    let listed = Api::new(&cfg(|c| {
        c.cors_origins = Origins::List(vec!["https://a.example".into()]);
    }));
    let m = listed.meta(Some("https://a.example"), true, Facts::default());
    assert_eq!(
        (m.allow_origin, m.vary_origin),
        (Some("https://a.example"), true)
    );
    let m = listed.meta(Some("https://evil.example"), true, Facts::default());
    assert_eq!((m.allow_origin, m.vary_origin), (None, true));
    let closing = Facts {
        shutting_down: true,
        ..Facts::default()
    };
    assert!(!listed.meta(None, true, closing).keep_alive);
}

#[test]
fn the_rate_limit_answers_429_with_retry_after_once_the_burst_is_spent() {
    let mut api = Api::new(&cfg(|c| c.rate_limit = 2));
    let mut r = relay();
    let h = head("POST", "/prompt", &[JSON_CT]);
    let body = r#"{"session_id":"s","prompt":"x"}"#;
    assert_eq!(answer(call(&mut api, &mut r, &h, body)).0, 200);
    assert_eq!(answer(call(&mut api, &mut r, &h, body)).0, 200);
    match call(&mut api, &mut r, &h, body) {
        Outcome::Answer(a) => {
            assert_eq!(a.status, 429);
            assert!(a.extra.iter().any(|(k, _)| *k == "Retry-After"));
        }
        other => panic!("{other:?}"),
    }
    let get = head("GET", "/healthz", &[]);
    assert_eq!(
        answer(call(&mut api, &mut r, &get, "")).0,
        200,
        "GETs are not limited"
    );
}

#[test]
fn readyz_says_why_it_is_not_ready() {
    let api = Api::new(&cfg(|c| c.max_connections = 10));
    let r = relay();
    let a = api.readyz(&r, Facts::default());
    assert_eq!((a.status, a.body.bytes()), (200, &b"{\"ready\":true}"[..]));
    for (facts, reason) in [
        (
            Facts {
                connections: 10,
                shutting_down: false,
                synced: false,
            },
            "connection limit reached",
        ),
        (
            Facts {
                connections: 0,
                shutting_down: true,
                synced: false,
            },
            "shutting down",
        ),
    ] {
        let a = api.readyz(&r, facts);
        let body: Value = serde_json::from_slice(a.body.bytes()).unwrap();
        assert_eq!(
            (a.status, body),
            (503, json!({"ready": false, "reason": reason}))
        );
    }
}

#[test]
fn healthz_reports_the_counters() {
    let mut api = Api::new(&Config::default());
    let mut r = relay();
    r.put_session(Millis(0), CONN, &SessionId::new("s").unwrap())
        .unwrap();
    let facts = Facts {
        connections: 3,
        shutting_down: false,
        synced: false,
    };
    let turn = Turn {
        now: Millis(0),
        unix_ms: 42,
    };
    let out = api.handle(
        &mut r,
        turn,
        CONN,
        PEER,
        &head("GET", "/healthz", &[]),
        &[],
        facts,
    );
    let (status, body) = answer(out);
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"ok": true, "timestamp": 42, "sessions": 1, "connections": 3, "subscribers": 0, "parked_polls": 0})
    );
}

#[test]
fn the_page_is_served_unless_turned_off() {
    let mut on = Api::new(&Config::default());
    let mut r = relay();
    match call(&mut on, &mut r, &head("GET", "/", &[]), "") {
        Outcome::Answer(a) => {
            assert_eq!((a.status, a.content_type), (200, web::CONTENT_TYPE));
            assert!(matches!(a.body, Body::Static(_)));
        }
        other => panic!("{other:?}"),
    }
    let mut off = Api::new(&cfg(|c| c.web = false));
    assert_eq!(
        answer(call(&mut off, &mut r, &head("GET", "/", &[]), "")).0,
        404
    );
}

#[test]
fn an_error_answer_keeps_its_reason_for_the_log() {
    let a = Answer::from(ApiError::invalid_session_id());
    assert_eq!(a.status, 400);
    assert!(
        a.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("Invalid session_id"))
    );
}

const SECRET: &[u8] = b"a secret of 32 bytes, no less!!!";
/// The turn's clock in `call`, in Unix seconds.
const NOW_S: u64 = 1_700_000_000;

fn secret() -> token::Secret {
    token::Secret::new(SECRET).unwrap()
}

fn scoped(role: token::Role, sid: &str) -> String {
    secret().mint(role, sid, None)
}

/// `(status, details)` of `method path` with `Authorization: Bearer t`.
fn try_token(api: &mut Api, method: &str, path: &str, t: &str, body: &str) -> (u16, Value) {
    let auth = format!("Bearer {t}");
    let h = head(method, path, &[JSON_CT, ("Authorization", &auth)]);
    let (status, body) = answer(call(api, &mut relay(), &h, body));
    (status, body["details"].clone())
}

#[test]
fn a_token_for_one_session_opens_its_role_in_its_session_only() {
    let mut api = Api::new(&cfg(|c| c.token_secret = Some(secret())));
    let client = scoped(token::Role::Client, "s");
    let agent = scoped(token::Role::Agent, "s");
    let prompt = |sid: &str| format!(r#"{{"session_id":"{sid}","prompt":"x"}}"#);
    assert_eq!(
        try_token(&mut api, "POST", "/prompt", &client, &prompt("s")).0,
        200
    );
    assert_eq!(
        try_token(&mut api, "POST", "/prompt", &client, &prompt("t")),
        (403, json!("token is for another session"))
    );
    assert_eq!(
        try_token(&mut api, "POST", "/prompt", &agent, &prompt("s")),
        (401, json!("client token required"))
    );
    assert_eq!(
        try_token(&mut api, "GET", "/messages/s", &client, "").0,
        404
    );
    assert_eq!(
        try_token(&mut api, "GET", "/messages/t", &client, ""),
        (403, json!("token is for another session"))
    );
    assert_eq!(
        try_token(&mut api, "GET", "/prompts/s?wait=false", &client, ""),
        (401, json!("agent token required"))
    );
    assert_eq!(
        try_token(&mut api, "GET", "/prompts/s?wait=false", &agent, "").0,
        404
    );
    for t in [&client, &agent] {
        assert_eq!(try_token(&mut api, "PUT", "/sessions/s", t, "").0, 200);
        assert_eq!(try_token(&mut api, "PUT", "/sessions/t", t, "").0, 403);
    }
    assert_eq!(
        try_token(&mut api, "DELETE", "/sessions/s", &agent, "").0,
        401
    );
    let response = r#"{"session_id":"t","client_msg_id":"c","text":"a"}"#;
    assert_eq!(
        try_token(&mut api, "POST", "/response", &agent, response).0,
        403
    );
}

#[test]
fn a_token_for_one_session_opens_asks_in_its_session_only() {
    let mut api = Api::new(&cfg(|c| c.token_secret = Some(secret())));
    let client = scoped(token::Role::Client, "s");
    let agent = scoped(token::Role::Agent, "s");
    let other = r#"{"session_id":"t","text":"x"}"#;
    assert_eq!(
        try_token(&mut api, "POST", "/ask", &agent, other),
        (403, json!("token is for another session"))
    );
    let mine = r#"{"session_id":"s","text":"x"}"#;
    assert_eq!(
        try_token(&mut api, "POST", "/ask", &client, mine),
        (401, json!("agent token required"))
    );
    // The path names the session: checked before anything is read.
    assert_eq!(
        try_token(&mut api, "GET", "/asks/t/k?wait=false", &agent, ""),
        (403, json!("token is for another session"))
    );
    assert_eq!(
        try_token(&mut api, "GET", "/asks/s/k?wait=false", &client, ""),
        (401, json!("agent token required"))
    );
    assert_eq!(
        try_token(&mut api, "GET", "/asks/s/k?wait=false", &agent, "").0,
        404
    );
    let reply = r#"{"session_id":"t","ask_id":"k","text":"x"}"#;
    assert_eq!(
        try_token(&mut api, "POST", "/reply", &client, reply),
        (403, json!("token is for another session"))
    );
    let reply = r#"{"session_id":"s","ask_id":"k","text":"x"}"#;
    assert_eq!(
        try_token(&mut api, "POST", "/reply", &agent, reply),
        (401, json!("client token required"))
    );
}

#[test]
fn with_a_secret_no_role_is_open_and_server_wide_tokens_still_work() {
    let mut api = Api::new(&cfg(|c| {
        c.token_secret = Some(secret());
        c.client_token = Some("server-wide".into());
    }));
    let mut r = relay();
    let h = head("GET", "/prompts/s?wait=false", &[]);
    let (status, body) = answer(call(&mut api, &mut r, &h, ""));
    assert_eq!(
        (status, &body["details"]),
        (401, &json!("agent token required"))
    );
    let body = r#"{"session_id":"anything","prompt":"x"}"#;
    assert_eq!(
        try_token(&mut api, "POST", "/prompt", "server-wide", body).0,
        200
    );
    let h = head("GET", "/metrics", &[]);
    assert!(
        matches!(call(&mut api, &mut r, &h, ""), Outcome::Metrics),
        "metrics keeps its own rule"
    );
}

#[test]
fn expired_forged_and_foreign_tokens_get_401() {
    let mut api = Api::new(&cfg(|c| c.token_secret = Some(secret())));
    let path = "/messages/s";
    let expired = secret().mint(token::Role::Client, "s", Some(NOW_S));
    assert_eq!(
        try_token(&mut api, "GET", path, &expired, ""),
        (401, json!("token expired"))
    );
    let later = secret().mint(token::Role::Client, "s", Some(NOW_S + 1));
    assert_eq!(try_token(&mut api, "GET", path, &later, "").0, 404);
    let good = scoped(token::Role::Client, "s");
    let foreign = token::Secret::new(b"another secret of 32 bytes, too!")
        .unwrap()
        .mint(token::Role::Client, "s", None);
    let mut forged = good.clone().into_bytes();
    forged[3] ^= 1;
    for bad in [
        &good[..good.len() - 1],
        &good[..20],
        std::str::from_utf8(&forged).unwrap(),
        &foreign,
        "",
    ] {
        assert_eq!(
            try_token(&mut api, "GET", path, bad, ""),
            (401, json!("client or agent token required")),
            "{bad}"
        );
    }
}

#[test]
fn a_websocket_may_offer_its_token_as_a_subprotocol() {
    let api = Api::new(&cfg(|c| c.token_secret = Some(secret())));
    let route = Route::WebSocket(SessionId::new("s").unwrap());
    let offer = format!("relay.v1, bearer.{}", scoped(token::Role::Client, "s"));
    let h = head("GET", "/ws/s", &[("Sec-WebSocket-Protocol", &offer)]);
    assert!(api.authorize(&route, &h, NOW_S).is_ok());
    let other = Route::WebSocket(SessionId::new("t").unwrap());
    assert_eq!(api.authorize(&other, &h, NOW_S).unwrap_err().status, 403);
    let h = head(
        "GET",
        "/ws/s",
        &[("Sec-WebSocket-Protocol", "relay.v1, bearer.nope")],
    );
    assert_eq!(api.authorize(&route, &h, NOW_S).unwrap_err().status, 401);
    let q = format!("/ws/s?token={}", scoped(token::Role::Client, "s"));
    assert!(api.authorize(&route, &head("GET", &q, &[]), NOW_S).is_ok());
}
