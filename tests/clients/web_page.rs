//! The chat page at `GET /`: how it is served, that it can be turned off,
//! and, in headless Chromium driven by tests/clients/web/page_test.py, that it
//! works: prompts out, answers in live, a relay restart survived (with a
//! resync notice in memory, without one with a data directory), every
//! answer shown once, the client token asked for, a token for one session
//! taken from the URL fragment and sent as the WebSocket subprotocol, and
//! an end-to-end encrypted conversation with a real `relay agent` and
//! `relay send` holding the key given in the fragment, the key asked for
//! when a conversation is encrypted and the page has none, answers rendered as
//! Markdown elements (tables too, scrolling in their bubble on a phone)
//! with hostile HTML and links left as text, error
//! answers shown as errors, streamed answers drawn as they arrive (across a
//! reload, encrypted too) and replaced in place by the final answer, the
//! agent's presence, the "fetched" mark, drafts the relay dropped, a
//! status row that keeps its place as its labels change, Stop (a prompt
//! stopped from one page shows stopped on every page), and questions from
//! the agent as cards answered by a tap or a line of text (end-to-end
//! encrypted too). The page as an app: its manifest, service worker and
//! icons served with their types and policies, Chromium's installability
//! check passed, the conversations kept on the device in a list, "New"
//! under a prefix token answered by one `relay agent --prefix`, a token
//! for one session explained, and notifications and a count in the title
//! for what arrives while the page is hidden.
//!
//! The browser tests need `/usr/bin/chromium` and Python Playwright
//! (`scripts/install-test-deps.sh`); without them they fail and say so.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::cli::Scratch;
use crate::common::{Dir, Server, assert_error, skip_with_tls, unique_session};
use serde_json::{Value, json};

const PAGE: &[u8] = include_bytes!("../../src/web/index.html");
const CHROMIUM: &str = "/usr/bin/chromium";
const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/web/page_test.py"
);
/// How long the browser script may take between two lines it prints.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pings every half second, so the page's pongs are seen within the test.
const PING: (&str, &str) = ("RELAY_PING_INTERVAL", "0.5");

/// One browser at a time: two cores are shared with the rest of the suite.
static BROWSER: Mutex<()> = Mutex::new(());

#[test]
fn page_is_served_without_a_token_with_strict_headers() {
    let s = Server::start_with(&[("RELAY_CLIENT_TOKEN", "c1"), ("RELAY_AGENT_TOKEN", "a1")]);
    let r = s.get("/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body, PAGE, "GET / serves src/web/index.html as is");
    assert_eq!(r.header("Content-Type"), Some("text/html; charset=utf-8"));
    assert_eq!(r.header("Cache-Control"), Some("no-cache"));
    assert_eq!(r.header("X-Content-Type-Options"), Some("nosniff"));
    let csp = r.header("Content-Security-Policy").expect("a CSP header");
    for part in [
        "default-src 'none'",
        "script-src 'sha256-",
        "style-src 'sha256-",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "CSP lacks {part}: {csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");

    let head = s.request("HEAD", "/", &[], None);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(
        head.header("Content-Length"),
        Some(PAGE.len().to_string().as_str())
    );
    assert_eq!(head.header("Content-Security-Policy"), Some(csp));

    // The API behind it still needs the token; other methods on / get 405.
    assert_error(
        &s.get(&format!("/messages/{}", unique_session())),
        401,
        "Unauthorized",
    );
    let post = s.request(
        "POST",
        "/",
        &[("Content-Type", "application/json")],
        Some(b"{}"),
    );
    assert_error(&post, 405, "Method not allowed");
    assert_eq!(post.header("Allow"), Some("GET, HEAD, OPTIONS"));
}

#[test]
fn page_off_answers_404_and_leaves_the_api_alone() {
    let s = Server::start_with(&[("RELAY_WEB", "false")]);
    assert_error(&s.get("/"), 404, "Not found");
    assert_eq!(s.request("HEAD", "/", &[], None).status, 404);
    assert_error(&s.request("POST", "/", &[], None), 404, "Not found");
    assert_eq!(s.health()["ok"], true);
    let sid = unique_session();
    s.prompt(&sid, "still works", Some("m1"));
    assert_eq!(s.pending(&sid).len(), 1);
}

/// The files that make the page an app: each with its type, `nosniff` and
/// a policy that lets nothing run but what must; the page's policy allows
/// exactly the manifest, the worker and the icons from its own origin. All
/// of them go with `RELAY_WEB=false`.
#[test]
fn app_files_are_served_with_their_types_and_policies() {
    let s = Server::start_with(&[("RELAY_CLIENT_TOKEN", "c1")]);
    let csp = s
        .get("/")
        .header("Content-Security-Policy")
        .map(str::to_string);
    let csp = csp.expect("a CSP");
    for part in ["manifest-src 'self'", "worker-src 'self'", "img-src 'self'"] {
        assert!(csp.contains(part), "CSP lacks {part}: {csp}");
    }
    let files = [
        (
            "/manifest.webmanifest",
            "application/manifest+json",
            "default-src 'none'",
        ),
        (
            "/sw.js",
            "text/javascript; charset=utf-8",
            "default-src 'none'; connect-src 'self'",
        ),
        ("/icon.svg", "image/svg+xml", "default-src 'none'"),
        ("/icon.png", "image/png", "default-src 'none'"),
    ];
    for (path, kind, policy) in files {
        let r = s.get(path);
        assert_eq!(r.status, 200, "{path} needs no token: {}", r.text());
        assert_eq!(r.header("Content-Type"), Some(kind), "{path}");
        assert_eq!(r.header("Content-Security-Policy"), Some(policy), "{path}");
        assert_eq!(
            r.header("X-Content-Type-Options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(r.header("Cache-Control"), Some("no-cache"), "{path}");
        let head = s.request("HEAD", path, &[], None);
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("Content-Length"),
            Some(r.body.len().to_string().as_str())
        );
        let post = s.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            Some(b"{}"),
        );
        assert_error(&post, 405, "Method not allowed");
    }
    assert!(s.get("/icon.png").body.starts_with(b"\x89PNG\r\n\x1a\n"));
    let manifest = |query: &str| s.get(&format!("/manifest.webmanifest{query}")).json();
    let m = manifest("?session=team-7");
    assert_eq!(m["start_url"], "./#team-7", "{m}");
    assert_eq!(m["id"], "./");
    assert_eq!(m["display"], "standalone");
    assert_eq!(m["theme_color"], "#1d4ed8");
    assert!(m["icons"].as_array().is_some_and(|i| i.len() == 2), "{m}");
    // A session id that is none leaves the start URL plain.
    for bad in ["?session=a%22b", "?session=", "", "?session=%zz"] {
        assert_eq!(manifest(bad)["start_url"], "./", "{bad}");
    }

    let off = Server::start_with(&[("RELAY_WEB", "false")]);
    for (path, _, _) in files {
        assert_error(&off.get(path), 404, "Not found");
        assert_error(&off.request("POST", path, &[], None), 404, "Not found");
    }
}

#[test]
fn invalid_web_setting_stops_the_server() {
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["--web", "maybe"])
        .env("RELAY_PORT", "0")
        .output()
        .expect("run relay");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RELAY_WEB"), "{err}");
}

#[test]
fn browser_chat_survives_a_relay_restart() {
    let Some(_one) = browser_turn() else {
        return;
    };
    restart_scenario(None);
}

/// With a data directory the restarted relay keeps the session: the page
/// resumes with no resync, and still shows every answer once.
#[test]
fn browser_chat_survives_a_restart_of_a_persistent_relay_without_a_resync() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let dir = Dir::new("page");
    restart_scenario(Some(dir.path()));
}

/// The restart scenario; `data_dir` gives both relays the same data
/// directory.
fn restart_scenario(data_dir: Option<&str>) {
    let mut env = vec![PING];
    if let Some(dir) = data_dir {
        env.push(("RELAY_DATA_DIR", dir));
    }
    // One relay, restarted: a process's own life (with `TEST_WITH_REDIS`
    // each start has a fresh key prefix, so fresh state as in memory).
    let first = Server::start_single_with(&env);
    let port = first.addr().port().to_string();
    let sid = unique_session();
    let url = format!("http://{}/", first.addr());
    let mut args = vec!["--scenario", "restart", "--url", &url, "--session", &sid];
    if data_dir.is_some() {
        args.push("--persistent");
    }
    let mut browser = Browser::start(&args);

    // The agent long-polls before the page has even loaded: it parks until
    // the prompt typed in the page arrives.
    first.put(&format!("/sessions/{sid}"));
    let prompt = long_poll(&first, &sid);
    let cmid = browser.expect("PROMPTED ");
    assert_eq!(prompt["client_msg_id"], cmid.as_str());
    assert_eq!(prompt["prompt"], "What is 6 times 7?");
    answer(&first, &sid, &cmid, "a-1", "42, as always.");

    browser.expect("RESTART");
    let mut first = first;
    first.sigterm();
    assert!(
        first.wait_exit(Duration::from_secs(5)).is_some(),
        "relay did not stop"
    );
    browser.send("STOPPED");
    // The page keeps a prompt typed while the relay is down...
    let queued = browser.expect("QUEUED ");
    // ...the relay comes back on the same port (SO_REUSEADDR) with fresh
    // memory, so a new epoch for the session...
    let mut env2 = env.clone();
    env2.push(("RELAY_PORT", &port));
    let second = Server::start_single_with(&env2);
    assert_eq!(second.addr().port().to_string(), port);
    second.put(&format!("/sessions/{sid}"));
    browser.send("RESTARTED");
    // ...and the page reconnects and sends it by itself.
    let prompt = long_poll(&second, &sid);
    assert_eq!(prompt["client_msg_id"], queued.as_str());
    assert_eq!(prompt["prompt"], "Sent while the relay was down");
    answer(&second, &sid, &queued, "a-2", "Got it once.");

    let prompt = long_poll(&second, &sid);
    let cmid3 = browser.expect("PROMPTED ");
    assert_ne!(cmid, cmid3);
    assert_eq!(prompt["client_msg_id"], cmid3.as_str());
    assert_eq!(prompt["prompt"], "And the answer\nover two lines?");
    answer(&second, &sid, &cmid3, "a-3", "Still 42.\n<b>not bold</b>");
    for shot in [browser.expect("SCREENSHOT "), browser.expect("SCREENSHOT ")] {
        let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("screenshot {shot}: {e}"));
        assert!(png.starts_with(b"\x89PNG"), "{shot} is not a PNG");
        println!("screenshot: {shot}");
    }
    browser.finish();
}

#[test]
fn browser_asks_for_the_client_token() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING, ("RELAY_CLIENT_TOKEN", "page-secret")]);
    let sid = unique_session();
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&[
        "--scenario",
        "token",
        "--url",
        &url,
        "--session",
        &sid,
        "--token",
        "page-secret",
    ]);
    let cmid = browser.expect("PROMPTED ");
    let prompt = long_poll(&s, &sid);
    assert_eq!(prompt["client_msg_id"], cmid.as_str());
    answer(&s, &sid, &cmid, "a-t", "Token accepted");
    browser.finish();
}

#[test]
fn browser_takes_a_session_token_from_the_fragment() {
    let Some(_one) = browser_turn() else {
        return;
    };
    const SECRET: &str = "page-token-secret-0123456789abcdefghij";
    let s = Server::start_with(&[
        PING,
        ("RELAY_TOKEN_SECRET", SECRET),
        ("RELAY_AGENT_TOKEN", "page-agent"),
    ]);
    let sid = unique_session();
    let minted = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["token", "--role", "client", "--session", &sid])
        .env("RELAY_TOKEN_SECRET", SECRET)
        .output()
        .expect("run relay token");
    assert!(minted.status.success(), "{minted:?}");
    let token = String::from_utf8(minted.stdout).expect("UTF-8 token");
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&[
        "--scenario",
        "fragment",
        "--url",
        &url,
        "--session",
        &sid,
        &format!("--token={}", token.trim()),
    ]);
    let cmid = browser.expect("PROMPTED ");
    let agent = [("Authorization", "Bearer page-agent")];
    let prompt = long_poll_as(&s, &sid, &agent);
    assert_eq!(prompt["client_msg_id"], cmid.as_str());
    answer_as(&s, &sid, &cmid, "a-f", "Fragment token accepted", &agent);
    browser.finish();
    // The token never reached the server in a URL.
    let logged = s.logs().into_iter().find(|l| l.contains(token.trim()));
    assert!(
        logged.is_none(),
        "the token is in the server's log: {logged:?}"
    );
}

/// The page with `#key=` talks to a real `relay agent --e2e-key` and reads
/// what `relay send --e2e-key` sent: the three speak one format. Pages with
/// another key or none show "cannot decrypt", and the agent answers the
/// prompt it cannot read with an error answer.
#[test]
fn browser_encrypts_end_to_end_with_the_key_in_the_fragment() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let (key, other) = (relay_key(), relay_key());
    let _agent = E2eAgent::start(&s, &sid, &key);
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&[
        "--scenario",
        "e2e",
        "--url",
        &url,
        "--session",
        &sid,
        &format!("--key={key}"),
        &format!("--other-key={other}"),
    ]);
    let cmid = browser.expect("PROMPTED ");
    browser.expect("READY");
    let sent = relay()
        .args(["send", "--url", &format!("http://{}", s.addr())])
        .args(["--session", &sid, "--timeout", "20", "--e2e-key", &key])
        .arg("from the command line")
        .output()
        .expect("run relay send");
    assert!(sent.status.success(), "{sent:?}");
    assert_eq!(
        String::from_utf8_lossy(&sent.stdout),
        "FROM THE COMMAND LINE\n"
    );
    browser.send("SENT");
    let wrong = browser.expect("WRONG ");
    browser.finish();

    // What the page stored opens with the key in the tools' own code.
    let key = relay::cli::e2e::Key::parse(&key).expect("a key");
    let history = s.messages(&sid, "");
    let stored = |kind: &str, cid: &str| -> Value {
        history["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .find(|m| m["type"] == kind && m["data"]["client_msg_id"] == cid)
            .unwrap_or_else(|| panic!("no {kind} for {cid}: {history}"))["data"]
            .clone()
    };
    let prompt = stored("prompt", &cmid);
    assert_eq!(prompt["metadata"]["e2e"], 1, "{prompt}");
    let message = relay::cli::e2e::Message::Prompt {
        session: &sid,
        client_msg_id: &cmid,
    };
    let text = prompt["prompt"].as_str().expect("a prompt text");
    assert_eq!(key.open(text, message).as_deref(), Some("attack at dawn"));
    let refused = stored("assistant", &wrong);
    assert!(
        refused["metadata"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot decrypt")),
        "the agent answers a prompt it cannot read with an error: {refused}"
    );
    for clear in ["attack at dawn", "ATTACK AT DAWN", "with the wrong key"] {
        assert!(!history.to_string().contains(clear), "{clear}: {history}");
        let logged = s.logs().into_iter().find(|l| l.contains(clear));
        assert!(logged.is_none(), "{clear} in the server's log: {logged:?}");
    }
}

/// A conversation encrypted elsewhere, opened without a key: the page asks
/// for the key as it asks for a token and sends nothing in clear
/// meanwhile; a wrong key is said to be wrong and asked for again; the
/// right one decrypts what is shown, and the next prompt goes encrypted.
#[test]
fn browser_asks_for_the_end_to_end_key() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let (key_text, other) = (relay_key(), relay_key());
    let key = relay::cli::e2e::Key::parse(&key_text).expect("a key");
    let url = format!("http://{}/", s.addr());
    s.put(&format!("/sessions/{sid}"));
    let mut browser = Browser::start(&[
        "--scenario",
        "ask-key",
        "--url",
        &url,
        "--session",
        &sid,
        &format!("--key={key_text}"),
        &format!("--other-key={other}"),
    ]);
    browser.expect("OPEN");
    // A prompt and its answer, sent with the key while the page watches.
    let seal = |text: &str, message| key.seal(text, message).expect("sealed");
    let prompt = |cmid| relay::cli::e2e::Message::Prompt {
        session: &sid,
        client_msg_id: cmid,
    };
    let reply = |cmid, amid| relay::cli::e2e::Message::Answer {
        session: &sid,
        client_msg_id: cmid,
        assistant_msg_id: amid,
    };
    let body = json!({"session_id": sid, "client_msg_id": "m-1",
        "prompt": seal("the plan", prompt("m-1")), "metadata": {"e2e": 1}});
    assert_eq!(s.post_json("/prompt", &body).status, 200);
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], "m-1");
    answer(
        &s,
        &sid,
        "m-1",
        "a-1",
        &seal("THE PLAN", reply("m-1", "a-1")),
    );
    println!("screenshot: {}", browser.expect("SCREENSHOT "));

    // The key entered, the page's prompt is stored encrypted.
    let cmid = browser.expect("PROMPTED ");
    let sent = long_poll(&s, &sid);
    assert_eq!(sent["client_msg_id"], cmid.as_str());
    assert_eq!(sent["metadata"]["e2e"], 1, "{sent}");
    let history = s.messages(&sid, "");
    let stored = history["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["data"]["client_msg_id"] == cmid.as_str())
        .unwrap_or_else(|| panic!("{cmid} is not stored: {history}"))["data"]["prompt"]
        .as_str()
        .expect("a prompt text")
        .to_string();
    assert!(stored.starts_with("e2e1:"), "stored in clear: {stored}");
    assert_eq!(
        key.open(&stored, prompt(&cmid)).as_deref(),
        Some("typed before the key")
    );
    let secret = seal("TYPED BEFORE THE KEY", reply(&cmid, "a-2"));
    answer(&s, &sid, &cmid, "a-2", &secret);
    browser.finish();
    for clear in ["the plan", "typed before the key", "TYPED BEFORE"] {
        let all = s.messages(&sid, "").to_string();
        assert!(!all.contains(clear), "{clear} stored in clear: {all}");
    }
}

/// An answer in Markdown shows as elements, hostile parts of it as text;
/// an error answer shows as an error.
#[test]
fn browser_renders_markdown_safely_and_error_answers_as_errors() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&["--scenario", "markdown", "--url", &url, "--session", &sid]);
    let cmid = browser.expect("PROMPTED ");
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], cmid.as_str());
    let text = r#"# Plan

Some *emphasis*, **strong** and `code <i>`; snake_case_name stays.

- one with [a link](https://example.com/docs)
- two, and https://example.com/a_b.
  - nested

3. first
4. second

```sh
echo "<b>hi</b>"
echo *not emphasis*
```

<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script>
[bad](javascript:alert(1)) [bad2](javascript:void)"#;
    answer(&s, &sid, &cmid, "a-md", text);
    let failing = browser.expect("PROMPTED ");
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], failing.as_str());
    let metadata = json!({"error": "loading
model not found: tiny", "exit_code": 3});
    answer_with(&s, &sid, &failing, "a-err", "", metadata);
    let shot = browser.expect("SCREENSHOT ");
    println!("screenshot: {shot}");
    browser.finish();
}

/// GitHub-style tables in an answer show as tables: cells with inline
/// Markdown, columns aligned as the delimiter row says, and a table too
/// wide for a phone scrolls in its bubble while the page does not.
#[test]
fn browser_renders_markdown_tables() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&["--scenario", "tables", "--url", &url, "--session", &sid]);
    let cmid = browser.expect("PROMPTED ");
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], cmid.as_str());
    let text = r#"Stock:
| Fruit | Count | Note |
|:------|------:|:----:|
| **apple** | 3 | `red \| green` |
| pear | 10 | [site](https://example.com/pear) |
| plum |

after the table

| Identifier | Description | Environment | Default | Unit | Minimum | Maximum | Since |
|---|---|---|---|---|---|---|---|
| RELAY_MAX_MEMORY | memory budget for sessions | RELAY_MAX_MEMORY | 256M | bytes | 1M | unlimited | 0.4.0 |

| not | a table |
|---|"#;
    answer(&s, &sid, &cmid, "a-tab", text);
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.finish();
}

/// Parts of an answer appear in one bubble as they are posted, survive a
/// reload (the relay's snapshot), and the final answer replaces the draft;
/// the prompt is marked fetched once the agent took it.
#[test]
fn browser_streams_an_answer_into_one_bubble() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&["--scenario", "stream", "--url", &url, "--session", &sid]);
    let cmid = browser.expect("PROMPTED ");
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], cmid.as_str());
    browser.expect("FETCHED");
    part(&s, &sid, &cmid, "a-s", "Hello");
    browser.expect("PART 1");
    part(&s, &sid, &cmid, "a-s", ", **world**");
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.expect("RELOADED");
    let hostile = r#" And <script>window.pwned=1</script> <img src=x onerror="window.pwned=2"> [x](javascript:alert(3)) [y](javascript:void)"#;
    part(&s, &sid, &cmid, "a-s", hostile);
    browser.expect("PART 3");
    answer(&s, &sid, &cmid, "a-s", "Hello, **world**. Done.");

    let failing = browser.expect("PROMPTED ");
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], failing.as_str());
    part(&s, &sid, &failing, "a-sf", "partial output");
    browser.expect("PART 1");
    let metadata = json!({"error": "it broke", "exit_code": 1});
    answer_with(&s, &sid, &failing, "a-sf", "partial output", metadata);
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.finish();
}

/// The header follows the agent: offline, online while a poll is parked,
/// offline again after the poll and the grace; a draft the relay drops
/// shows as interrupted until a new part or the final answer.
#[test]
fn browser_shows_presence_and_interrupted_drafts() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[
        PING,
        ("RELAY_AGENT_GRACE", "0.5"),
        ("RELAY_DRAFT_TIMEOUT", "1"),
    ]);
    let sid = unique_session();
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&["--scenario", "presence", "--url", &url, "--session", &sid]);
    browser.expect("OFFLINE");
    std::thread::scope(|scope| {
        let poll = scope.spawn(|| s.get(&format!("/prompts/{sid}?timeout=3")));
        browser.expect("ONLINE");
        let r = poll.join().expect("the poll");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json(), json!([]));
    });
    browser.expect("GONE");

    let cmid = browser.expect("PROMPTED ");
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], cmid.as_str());
    part(&s, &sid, &cmid, "a-p", "Half an answer");
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.expect("INTERRUPTED");
    part(&s, &sid, &cmid, "a-p", "Resumed");
    browser.expect("RESUMED");
    answer(&s, &sid, &cmid, "a-p", "The whole answer");
    browser.finish();
}

/// With `key=`, each part is sealed on its own: the page opens the parts,
/// the snapshot (their concatenation) after a reload, and says "cannot
/// decrypt" for a part sealed for another message.
#[test]
fn browser_decrypts_streamed_parts_end_to_end() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let key_text = relay_key();
    let key = relay::cli::e2e::Key::parse(&key_text).expect("a key");
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&[
        "--scenario",
        "e2e-stream",
        "--url",
        &url,
        "--session",
        &sid,
        &format!("--key={key_text}"),
    ]);
    let cmid = browser.expect("PROMPTED ");
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], cmid.as_str());
    let seal = |amid: &str, text: &str| {
        let message = relay::cli::e2e::Message::Answer {
            session: &sid,
            client_msg_id: &cmid,
            assistant_msg_id: amid,
        };
        key.seal(text, message).expect("sealed")
    };
    part(&s, &sid, &cmid, "a-e", &seal("a-e", "Top"));
    browser.expect("PART 1");
    part(&s, &sid, &cmid, "a-e", &seal("a-e", " **secret**"));
    browser.expect("RELOADED");
    part(&s, &sid, &cmid, "a-e", &seal("another", ", moved here"));
    browser.expect("PART 3");
    answer(
        &s,
        &sid,
        &cmid,
        "a-e",
        &seal("a-e", "Top **secret**, all of it."),
    );
    browser.finish();
}

/// The page's side of the part numbering, with frames the relay would not
/// send on cue added to its socket by the browser script: parts out of
/// order, snapshots, a draft the relay forgot across a reconnect, a part
/// after the final answer.
#[test]
fn browser_follows_the_part_numbering_rules() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let url = format!("http://{}/", s.addr());
    Browser::start(&["--scenario", "frames", "--url", &url, "--session", &sid]).finish();
}

/// The status row keeps its box, and the page around it keeps its place,
/// while its labels change: connected, disconnected and retrying,
/// reconnected, the agent online and offline, a prompt waiting, a long
/// server error, with the end-to-end mark on a phone-sized screen.
#[test]
fn browser_status_row_keeps_its_place() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let url = format!("http://{}/", s.addr());
    let key = relay_key();
    let mut browser = Browser::start(&[
        "--scenario",
        "status",
        "--url",
        &url,
        "--session",
        &sid,
        &format!("--key={key}"),
    ]);
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.finish();
}

/// Stop, on a phone-sized page, while a draft streams: the cancel is
/// stored, the draft ends, and a second page shows the prompt stopped from
/// the relay's frames alone.
#[test]
fn browser_stops_a_prompt_on_every_device() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&["--scenario", "stop", "--url", &url, "--session", &sid]);
    let cmid = browser.expect("PROMPTED ");
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], cmid.as_str());
    part(&s, &sid, &cmid, "a-stop", "Working on it");
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.expect("STOPPED");

    let history = s.messages(&sid, "");
    let cancels: Vec<&Value> = history["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["type"] == "cancel")
        .collect();
    assert_eq!(cancels.len(), 1, "one cancel stored: {history}");
    assert_eq!(cancels[0]["data"]["client_msg_id"], cmid.as_str());
    assert!(
        s.pending(&sid).is_empty(),
        "a stopped prompt is not pending"
    );
    let more = json!({"session_id": sid, "client_msg_id": cmid, "assistant_msg_id": "a-stop",
        "text": " and more", "partial": true});
    let refused = s.post_json("/response", &more);
    assert_error(&refused, 409, "Conflict");
    assert_eq!(refused.json()["details"], "prompt cancelled");
    browser.send("CHECKED");
    browser.finish();
}

/// Questions from the agent, on phone-sized pages: a card per ask, a tap
/// on a choice stored as the reply and shown on every page (a page that
/// taps too late gets `409` and shows the answer given elsewhere), an ask
/// past its time shown expired with its default, and a free-text ask
/// answered in its field.
#[test]
fn browser_answers_questions_from_the_agent() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    s.put(&format!("/sessions/{sid}"));
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&["--scenario", "ask", "--url", &url, "--session", &sid]);
    browser.expect("OPEN");
    post_ask(
        &s,
        json!({"session_id": sid, "ask_id": "k-deploy", "text": "Run **make deploy**?",
            "choices": ["yes", "no"], "default": "no", "timeout": 600}),
    );
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.expect("ANSWERED");
    assert_eq!(
        replies(&s, &sid),
        [("k-deploy".to_string(), "yes".to_string())]
    );
    let state = s.get(&format!("/asks/{sid}/k-deploy?wait=false")).json();
    assert_eq!(
        state,
        json!({"ask_id": "k-deploy", "state": "answered", "text": "yes"})
    );

    post_ask(
        &s,
        json!({"session_id": sid, "ask_id": "k-late", "text": "Still there?",
            "choices": ["continue", "stop"], "default": "stop", "timeout": 1}),
    );
    browser.expect("EXPIRED");
    let state = s.get(&format!("/asks/{sid}/k-late?wait=false")).json();
    assert_eq!(state["state"], "expired", "{state}");

    post_ask(
        &s,
        json!({"session_id": sid, "ask_id": "k-branch", "text": "Which *branch*?", "timeout": 600}),
    );
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.expect("REPLIED");
    assert_eq!(replies(&s, &sid).len(), 2);
    assert_eq!(replies(&s, &sid)[1], ("k-branch".into(), "main".into()));
    browser.finish();
}

/// With `key=`, a question sealed as `relay ask` seals it shows decrypted;
/// a tap replies with the choice's own ciphertext, which passes the
/// relay's byte-for-byte check; a typed reply is sealed as the tools seal
/// it, to the same bytes.
#[test]
fn browser_answers_an_encrypted_question() {
    use relay::cli::e2e::{Key, Message};
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    s.put(&format!("/sessions/{sid}"));
    let key_text = relay_key();
    let key = Key::parse(&key_text).expect("a key");
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&[
        "--scenario",
        "ask-e2e",
        "--url",
        &url,
        "--session",
        &sid,
        &format!("--key={key_text}"),
    ]);
    browser.expect("OPEN");
    let seal = |text: &str, message| key.seal_fixed(text, message).expect("sealed");
    let choice = Message::Choice {
        session: &sid,
        ask_id: "k-e",
    };
    let question = Message::Ask {
        session: &sid,
        ask_id: "k-e",
    };
    let choices = [seal("deploy", choice), seal("wait", choice)];
    post_ask(
        &s,
        json!({"session_id": sid, "ask_id": "k-e", "text": seal("Ship **it**?", question),
            "choices": choices, "default": choices[1], "timeout": 600, "metadata": {"e2e": 1}}),
    );
    browser.expect("ANSWERED");
    let stored = replies(&s, &sid);
    assert_eq!(
        stored[0].1, choices[0],
        "the reply is the choice's own bytes"
    );
    assert_eq!(key.open(&stored[0].1, choice).as_deref(), Some("deploy"));

    let (question, free) = (
        Message::Ask {
            session: &sid,
            ask_id: "k-f",
        },
        Message::Reply {
            session: &sid,
            ask_id: "k-f",
        },
    );
    let default = Message::Default {
        session: &sid,
        ask_id: "k-f",
    };
    post_ask(
        &s,
        json!({"session_id": sid, "ask_id": "k-f", "text": seal("Which branch?", question),
            "default": seal("main", default), "timeout": 600}),
    );
    browser.expect("REPLIED");
    let stored = replies(&s, &sid);
    assert_eq!(key.open(&stored[1].1, free).as_deref(), Some("feature/x"));
    assert_eq!(
        stored[1].1,
        seal("feature/x", free),
        "sealed as the tools seal it"
    );
    browser.finish();
    let all = s.messages(&sid, "").to_string();
    for clear in ["deploy", "feature/x", "Ship", "branch"] {
        assert!(!all.contains(clear), "{clear} stored in clear: {all}");
    }
}

const SECRET: &str = "page-token-secret-0123456789abcdefghij";

/// `relay token` with `args`, signed with [`SECRET`].
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
        .expect("UTF-8 token")
        .trim()
        .to_string()
}

/// The page opened with a client token for a prefix starts its first
/// conversation under the prefix and a second with "New"; one `relay agent
/// --prefix` with an agent token for the prefix answers both, at once
/// (its command waits until it runs for both, so one at a time would
/// answer "1 AT ONCE" after its wait).
#[test]
fn browser_new_conversations_under_a_prefix_token_one_agent_answers_both() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let prefix = format!("pg{}-", &unique_session()[..6]);
    let s = Server::start_with(&[PING, ("RELAY_TOKEN_SECRET", SECRET)]);
    let client = mint(&["--role", "client", "--prefix", &prefix]);
    let agent_token = mint(&["--role", "agent", "--prefix", &prefix]);
    let scratch = Scratch::new();
    let (running, token_file) = (scratch.path("running"), scratch.path("token"));
    std::fs::create_dir_all(&running).expect("mkdir");
    std::fs::write(&token_file, &agent_token).expect("write token");
    let script = r#"p=$(cat); touch "$RUNNING/$RELAY_SESSION_ID"; i=0
while [ "$(ls "$RUNNING" | wc -l)" -lt 2 ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
printf '%s (%s at once)' "$p" "$(ls "$RUNNING" | wc -l)" | tr a-z A-Z"#;
    let mut agent = relay()
        .args(["agent", "--url", &format!("http://{}", s.addr())])
        .args([
            "--prefix",
            &prefix,
            "--jobs",
            "4",
            "--token-file",
            &token_file,
        ])
        .args(["--", "sh", "-c", script])
        .env("RUNNING", &running)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn relay agent");
    let agent_guard = KillOnDrop(&mut agent);
    s.wait_health("parked_polls", 1);
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&[
        "--scenario",
        "new-prefix",
        "--url",
        &url,
        "--session",
        "unused",
        &format!("--token={client}"),
        &format!("--prefix={prefix}"),
    ]);
    let sessions = browser.expect("SESSIONS ");
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.finish();
    drop(agent_guard);
    let sessions: Vec<&str> = sessions.split(' ').collect();
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    let agent_auth = format!("Bearer {agent_token}");
    for (sid, text) in sessions.iter().zip(["FIRST", "SECOND"]) {
        assert!(sid.starts_with(&prefix), "{sid} is not under {prefix}");
        let r = s.request(
            "GET",
            &format!("/messages/{sid}"),
            &[("Authorization", &agent_auth)],
            None,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let history = r.json();
        let answers: Vec<&str> = history["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter(|m| m["type"] == "assistant")
            .filter_map(|m| m["data"]["text"].as_str())
            .collect();
        assert_eq!(answers, [format!("{text} (2 AT ONCE)")], "{sid}: {history}");
    }
}

/// Kills a child process when dropped.
struct KillOnDrop<'a>(&'a mut Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client token for one session: no "New", and the list says why;
/// another session is refused with the relay's reason and not retried;
/// an expired token is explained as expired.
#[test]
fn browser_explains_a_token_for_one_session() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING, ("RELAY_TOKEN_SECRET", SECRET)]);
    let sid = unique_session();
    let token = mint(&["--role", "client", "--session", &sid]);
    let expired = mint(&["--role", "client", "--session", &sid, "--expires", "1"]);
    let soon = mint(&["--role", "client", "--session", &sid, "--expires", "8"]);
    wait_expired(&s, &expired);
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&[
        "--scenario",
        "one-session",
        "--url",
        &url,
        "--session",
        &sid,
        &format!("--token={token}"),
        &format!("--other-token={expired}"),
        &format!("--soon-token={soon}"),
    ]);
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.expect("CONNECTED");
    wait_expired(&s, &soon);
    // Deleting the session closes the page's socket; the page reconnects.
    let bearer = format!("Bearer {token}");
    let r = s.request(
        "DELETE",
        &format!("/sessions/{sid}"),
        &[("Authorization", &bearer)],
        None,
    );
    assert_eq!(r.status, 200, "DELETE /sessions: {}", r.text());
    browser.send("EXPIRED");
    browser.finish();
}

/// Waits until the relay itself says `token` is expired.
#[track_caller]
fn wait_expired(s: &Server, token: &str) {
    let deadline = Instant::now() + LINE_TIMEOUT;
    let bearer = format!("Bearer {token}");
    while s
        .request("GET", "/whoami", &[("Authorization", &bearer)], None)
        .status
        != 401
    {
        assert!(Instant::now() < deadline, "the token never expired");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The page as an app: installable by Chromium's own check, the shell
/// kept by the service worker (and no API answer), notifications asked for
/// by a button only, and, while hidden, an answer and a question counted
/// in the title and notified (a prompt from elsewhere is not); a click
/// brings the conversation forward; nothing while visible.
#[test]
fn browser_page_installs_and_notifies_while_hidden() {
    let Some(_one) = browser_turn() else {
        return;
    };
    let s = Server::start_with(&[PING]);
    let sid = unique_session();
    s.put(&format!("/sessions/{sid}"));
    let url = format!("http://{}/", s.addr());
    let mut browser = Browser::start(&["--scenario", "app", "--url", &url, "--session", &sid]);
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.expect("HIDDEN");
    // A prompt sent from elsewhere, then the agent's answer.
    s.prompt(&sid, "build it", Some("p-hidden"));
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], "p-hidden");
    answer(&s, &sid, "p-hidden", "a-hidden", "Built, all green.");
    println!("notification: {}", browser.expect("NOTIFIED "));
    post_ask(
        &s,
        json!({"session_id": sid, "ask_id": "k-hidden", "text": "Deploy now?",
            "choices": ["yes", "no"], "timeout": 600}),
    );
    println!("screenshot: {}", browser.expect("SCREENSHOT "));
    browser.expect("ASKED");
    browser.expect("VISIBLE");
    s.prompt(&sid, "and now?", Some("p-visible"));
    assert_eq!(long_poll(&s, &sid)["client_msg_id"], "p-visible");
    answer(&s, &sid, "p-visible", "a-visible", "Seen here.");
    browser.expect("QUIET");
    browser.finish();
}

/// `POST /ask` as the agent, asserting the relay took it.
#[track_caller]
fn post_ask(s: &Server, body: Value) {
    let r = s.post_json("/ask", &body);
    assert_eq!(r.status, 200, "POST /ask: {}", r.text());
}

/// The session's stored replies: (ask_id, text), oldest first.
#[track_caller]
fn replies(s: &Server, sid: &str) -> Vec<(String, String)> {
    let history = s.messages(sid, "");
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    history["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["type"] == "reply")
        .map(|m| (text(&m["data"]["ask_id"]), text(&m["data"]["text"])))
        .collect()
}

/// Posts one part of answer `amid` (`"partial": true`).
#[track_caller]
fn part(s: &Server, sid: &str, cmid: &str, amid: &str, text: &str) {
    let body = json!({"session_id": sid, "client_msg_id": cmid, "assistant_msg_id": amid,
        "text": text, "partial": true});
    let r = s.post_json("/response", &body);
    assert_eq!(r.status, 200, "POST /response (part): {}", r.text());
    assert_eq!(r.json()["partial"], true, "{}", r.text());
    assert_eq!(r.json()["delivered"], true, "the page is subscribed");
}

/// The binary with the caller's `RELAY_*` settings removed.
fn relay() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relay"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RELAY_") || key == "PORT" {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// A new key from `relay key`.
#[track_caller]
fn relay_key() -> String {
    let out = relay().arg("key").output().expect("run relay key");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .expect("UTF-8 key")
        .trim()
        .to_string()
}

/// `relay agent --e2e-key` running `tr a-z A-Z`, killed on drop.
struct E2eAgent(Child);

impl E2eAgent {
    #[track_caller]
    fn start(s: &Server, sid: &str, key: &str) -> E2eAgent {
        let child = relay()
            .args(["agent", "--url", &format!("http://{}", s.addr())])
            .args(["--session", sid, "--e2e-key", key])
            .args(["--", "tr", "a-z", "A-Z"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn relay agent");
        s.wait_health("parked_polls", 1);
        E2eAgent(child)
    }
}

impl Drop for E2eAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The browser for this test, one test at a time; `None` (skipped) over
/// TLS, since the page is opened over http://.
pub(crate) fn browser_turn() -> Option<MutexGuard<'static, ()>> {
    if skip_with_tls("the browser opens the page over http://") {
        return None;
    }
    let one = BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    require_browser();
    Some(one)
}

/// Fails, naming what to install, when the browser or Playwright is missing.
fn require_browser() {
    let mut missing = Vec::new();
    if !Path::new(CHROMIUM).exists() {
        missing.push("Chromium at /usr/bin/chromium (apt-get install chromium)");
    }
    let playwright = Command::new("python3")
        .args(["-c", "import playwright.sync_api"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !matches!(playwright, Ok(s) if s.success()) {
        missing.push("Python Playwright for python3 (pip install playwright; no browser download)");
    }
    assert!(
        missing.is_empty(),
        "the browser test needs {}: run scripts/test, which installs them",
        missing.join(" and ")
    );
}

/// The agent's side: long-polls (8 s at a time, under the harness's 10 s
/// read timeout) until one prompt is pending; returns it.
#[track_caller]
fn long_poll(s: &Server, sid: &str) -> Value {
    long_poll_as(s, sid, &[])
}

/// `long_poll` with extra headers (an agent token).
#[track_caller]
fn long_poll_as(s: &Server, sid: &str, headers: &[(&str, &str)]) -> Value {
    let deadline = Instant::now() + LINE_TIMEOUT;
    loop {
        let r = s.request("GET", &format!("/prompts/{sid}?timeout=8"), headers, None);
        assert_eq!(r.status, 200, "GET /prompts: {}", r.text());
        if let Value::Array(mut items) = r.json() {
            if items.len() == 1 {
                return items.remove(0);
            }
            assert!(items.is_empty(), "one prompt expected: {items:?}");
        }
        assert!(Instant::now() < deadline, "no prompt arrived from the page");
    }
}

#[track_caller]
fn answer(s: &Server, sid: &str, cmid: &str, amid: &str, text: &str) {
    answer_as(s, sid, cmid, amid, text, &[]);
}

/// `answer` with metadata (an error answer).
#[track_caller]
fn answer_with(s: &Server, sid: &str, cmid: &str, amid: &str, text: &str, metadata: Value) {
    let body = json!({"session_id": sid, "client_msg_id": cmid, "assistant_msg_id": amid,
        "text": text, "metadata": metadata});
    let r = s.post_json("/response", &body);
    assert_eq!(r.status, 200, "POST /response: {}", r.text());
}

/// `answer` with extra headers (an agent token).
#[track_caller]
fn answer_as(s: &Server, sid: &str, cmid: &str, amid: &str, text: &str, auth: &[(&str, &str)]) {
    let body =
        json!({"session_id": sid, "client_msg_id": cmid, "assistant_msg_id": amid, "text": text});
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend_from_slice(auth);
    let bytes = serde_json::to_vec(&body).unwrap();
    let r = s.request("POST", "/response", &headers, Some(&bytes));
    assert_eq!(r.status, 200, "POST /response: {}", r.text());
    assert_eq!(r.json()["delivered"], true, "the page is subscribed");
}

/// The browser script as a child process, read line by line.
struct Browser {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl Browser {
    /// Runs the page script with `args`. A value that may begin with `-`
    /// (a key, a token) goes as `--flag=value`: argparse would take it for
    /// a flag.
    #[track_caller]
    fn start(args: &[&str]) -> Browser {
        let out = screenshot_dir();
        let mut child = Command::new("python3")
            .arg(SCRIPT)
            .args(args)
            .arg("--out")
            .arg(&out)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn python3");
        let (tx, lines) = channel();
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let mut err = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = err.read_to_string(&mut buf);
            sink.lock().unwrap().push_str(&buf);
        });
        Browser {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        }
    }

    /// The rest of the next line that starts with `prefix`; fails if the
    /// script prints something else, exits, or stays silent too long.
    #[track_caller]
    fn expect(&mut self, prefix: &str) -> String {
        match self.lines.recv_timeout(LINE_TIMEOUT) {
            Ok(line) if line.starts_with(prefix) => line[prefix.len()..].to_string(),
            got => self.fail(&format!("expected a line {prefix:?}, got {got:?}")),
        }
    }

    #[track_caller]
    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        if writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .is_err()
        {
            self.fail("the browser script stopped reading");
        }
    }

    /// Waits for `DONE` and a clean exit.
    #[track_caller]
    fn finish(mut self) {
        self.expect("DONE");
        self.stdin = None;
        let deadline = Instant::now() + LINE_TIMEOUT;
        loop {
            match self.child.try_wait().expect("try_wait") {
                Some(status) if status.success() => return,
                Some(status) => self.fail(&format!("browser script exited with {status}")),
                None if Instant::now() > deadline => self.fail("browser script did not exit"),
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    #[track_caller]
    fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The stderr reader finishes once the process is gone.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&self.stderr) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let stderr = self.stderr.lock().map(|s| s.clone()).unwrap_or_default();
        panic!("{why}\n--- browser script stderr ---\n{stderr}");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `target/web-test/`, beside cargo's own `target/tmp`.
fn screenshot_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("web-test")
}
