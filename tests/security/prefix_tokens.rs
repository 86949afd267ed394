//! Tokens for a group of sessions (`relay token --prefix P`) and
//! `GET /whoami`, against the real binary: a prefix token opens its
//! role's endpoints in every session whose id starts with P (a client
//! creates new ones under it), another session is `403` saying which
//! prefix the token is for; an agent's all-sessions poll lists only the
//! sessions under its prefix; `/whoami` says what a token opens.

use super::auth::call;
use super::session_tokens::{AGENT, CLIENT, SECRET, expect, prompt, relay, with_secret};
use crate::common::*;
use serde_json::{Value, json};

/// `relay token` with the test secret; the token printed.
#[track_caller]
fn mint(args: &[&str]) -> String {
    let out = relay()
        .arg("token")
        .args(args)
        .env("RELAY_TOKEN_SECRET", SECRET)
        .output()
        .expect("run relay token");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .to_string()
}

#[test]
fn a_prefix_token_opens_every_session_under_its_prefix_and_no_other() {
    let srv = with_secret();
    let prefix = format!("{}-", unique_session());
    let (mine, also, other) = (format!("{prefix}a"), format!("{prefix}b"), unique_session());
    let client = mint(&["--role", "client", "--prefix", &prefix]);
    let agent = mint(&["--role", "agent", "--prefix", &prefix]);
    let forbidden = format!("token is for sessions starting with {prefix}");
    // A client creates sessions under it, by prompt and by PUT.
    let p = Some(&client[..]);
    expect(
        &call(&srv, "POST", "/prompt", p, Some(&prompt(&mine, "c1"))),
        200,
        None,
        "prompt",
    );
    expect(
        &call(&srv, "PUT", &format!("/sessions/{also}"), p, None),
        200,
        None,
        "PUT",
    );
    expect(
        &call(&srv, "GET", &format!("/messages/{mine}"), p, None),
        200,
        None,
        "messages",
    );
    let _ws = srv.ws(&format!("/ws/{also}?token={client}"));
    // Another session: 403 naming the prefix, for every route.
    let other_prompt = prompt(&other, "c2");
    expect(
        &call(&srv, "POST", "/prompt", p, Some(&other_prompt)),
        403,
        Some(&forbidden),
        "prompt elsewhere",
    );
    expect(
        &call(&srv, "PUT", &format!("/sessions/{other}"), p, None),
        403,
        Some(&forbidden),
        "PUT elsewhere",
    );
    expect(
        &call(&srv, "GET", &format!("/messages/{other}"), p, None),
        403,
        Some(&forbidden),
        "messages elsewhere",
    );
    // The prefix itself names a session under it; a shorter id does not.
    let short = &prefix[..prefix.len() - 1];
    expect(
        &call(&srv, "PUT", &format!("/sessions/{short}"), p, None),
        403,
        Some(&forbidden),
        "shorter id",
    );
    // The agent answers there, not elsewhere; it is not a client token.
    let a = Some(&agent[..]);
    let pending = call(&srv, "GET", &format!("/prompts/{mine}?wait=false"), a, None);
    expect(&pending, 200, None, "poll");
    assert_eq!(pending.json()[0]["client_msg_id"], "c1");
    let answer = json!({"session_id": mine, "client_msg_id": "c1", "text": "a"});
    expect(
        &call(&srv, "POST", "/response", a, Some(&answer)),
        200,
        None,
        "answer",
    );
    expect(
        &call(
            &srv,
            "GET",
            &format!("/prompts/{other}?wait=false"),
            a,
            None,
        ),
        403,
        Some(&forbidden),
        "poll elsewhere",
    );
    expect(
        &call(&srv, "POST", "/prompt", a, Some(&prompt(&mine, "c3"))),
        401,
        Some("client token required"),
        "agent as client",
    );
}

#[test]
fn an_all_sessions_poll_under_a_prefix_lists_only_its_sessions() {
    let srv = with_secret();
    let prefix = format!("{}-", unique_session());
    let (mine, other) = (format!("{prefix}x"), unique_session());
    let c = Some(CLIENT);
    expect(
        &call(&srv, "POST", "/prompt", c, Some(&prompt(&other, "o1"))),
        200,
        None,
        "other",
    );
    expect(
        &call(&srv, "POST", "/prompt", c, Some(&prompt(&mine, "m1"))),
        200,
        None,
        "mine",
    );
    let agent = mint(&["--role", "agent", "--prefix", &prefix]);
    let resp = call(&srv, "GET", "/prompts?wait=false", Some(&agent), None);
    expect(&resp, 200, None, "all under prefix");
    let listed: Vec<Value> = resp.json().as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["session_id"], mine.as_str());
    // The server-wide agent token sees both; a one-session token its own.
    let all = call(&srv, "GET", "/prompts?wait=false", Some(AGENT), None);
    assert_eq!(all.json().as_array().unwrap().len(), 2);
    let one = mint(&["--role", "agent", "--session", &other]);
    let resp = call(&srv, "GET", "/prompts?wait=false", Some(&one), None);
    assert_eq!(resp.json()[0]["session_id"], other.as_str());
    assert_eq!(resp.json().as_array().unwrap().len(), 1);
    // Asked for once, a part of the sessions is kept indexed by the
    // server: later arrivals and answers change its list alike.
    let mine2 = format!("{prefix}y");
    for (sid, id) in [
        (&other, "o2"),
        (&mine2, "m2"),
        (&other, "o3"),
        (&mine, "m3"),
    ] {
        expect(
            &call(&srv, "POST", "/prompt", c, Some(&prompt(sid, id))),
            200,
            None,
            id,
        );
    }
    let answer = json!({"session_id": mine, "client_msg_id": "m1", "text": "done"});
    expect(
        &call(&srv, "POST", "/response", Some(AGENT), Some(&answer)),
        200,
        None,
        "answer m1",
    );
    let ids = |resp: &Response| -> Vec<(String, String)> {
        resp.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let field = |k: &str| p[k].as_str().unwrap_or("?").to_string();
                (field("session_id"), field("client_msg_id"))
            })
            .collect()
    };
    let resp = call(&srv, "GET", "/prompts?wait=false", Some(&agent), None);
    let mut listed = ids(&resp);
    if cluster_mode() {
        // Sessions of different buckets are ordered by their buckets'
        // counters, not by when they arrived.
        listed.sort_unstable_by_key(|p| p.1.clone());
    }
    assert_eq!(
        listed,
        [(mine2.clone(), "m2".into()), (mine.clone(), "m3".into())]
    );
    let first = resp.json()[0]["cursor"].as_str().unwrap().to_string();
    let later = call(
        &srv,
        "GET",
        &format!("/prompts?wait=false&after={first}"),
        Some(&agent),
        None,
    );
    assert_eq!(ids(&later), ids(&resp)[1..]);
    let resp = call(&srv, "GET", "/prompts?wait=false", Some(&one), None);
    assert_eq!(
        ids(&resp),
        [
            (other.clone(), "o1".into()),
            (other.clone(), "o2".into()),
            (other.clone(), "o3".into())
        ]
    );
    // A client token polls nothing.
    let client = mint(&["--role", "client", "--prefix", &prefix]);
    expect(
        &call(&srv, "GET", "/prompts?wait=false", Some(&client), None),
        401,
        Some("agent token required"),
        "client polls",
    );
}

#[test]
fn whoami_says_what_a_token_opens() {
    let srv = with_secret();
    let who = |token: Option<&str>| call(&srv, "GET", "/whoami", token, None);
    assert_eq!(who(Some(CLIENT)).json(), json!({"role": "client"}));
    assert_eq!(who(Some(AGENT)).json(), json!({"role": "agent"}));
    let sid = unique_session();
    let t = mint(&["--role", "client", "--session", &sid]);
    assert_eq!(
        who(Some(&t)).json(),
        json!({"role": "client", "session": sid})
    );
    let t = mint(&["--role", "agent", "--prefix", "team-", "--expires", "3600"]);
    let v = who(Some(&t)).json();
    assert_eq!(
        (&v["role"], &v["prefix"]),
        (&json!("agent"), &json!("team-"))
    );
    let expires = v["expires_ts"].as_u64().expect("expires_ts");
    let now = now_ms();
    assert!(
        expires > now + 3_500_000 && expires <= now + 3_601_000,
        "{v}"
    );
    expect(&who(None), 401, None, "no token");
    expect(&who(Some("nope")), 401, None, "a wrong token");
    // An open server: both roles, to anyone.
    let open = Server::start();
    let resp = open.get("/whoami");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json(), json!({"role": "both"}));
    // One token for both roles.
    let same = Server::start_with(&[
        ("RELAY_CLIENT_TOKEN", CLIENT),
        ("RELAY_AGENT_TOKEN", CLIENT),
    ]);
    let resp = call(&same, "GET", "/whoami", Some(CLIENT), None);
    assert_eq!(resp.json(), json!({"role": "both"}));
}
