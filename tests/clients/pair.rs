//! `relay pair`: the QR code it draws in the terminal, turned into an
//! image the way a terminal shows it (on a light and on a dark background)
//! and read by a real QR reader (zbarimg), is the link it prints, exactly;
//! that link opened in Chromium (tests/clients/web/pair_test.py) has the
//! token and the key in effect and talks to a `relay agent` started from
//! the command line `relay pair` printed, whose answer the page shows
//! decrypted; without a token secret it warns that the session is open;
//! bad flags are usage errors.
//!
//! The reader is `zbarimg` (Debian's zbar-tools), the browser Chromium with
//! Python Playwright (`scripts/install-test-deps.sh`); without them the
//! tests that need them fail and say so.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::common::{Server, unique_session};

const SECRET: &str = "pair-token-secret-0123456789abcdefghij";
const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/clients/web/pair_test.py"
);
/// What starts each line of the code: black ink on white paper.
const INK_ON_PAPER: &str = "\x1b[38;5;16;48;5;231m";
const RESET: &str = "\x1b[0m";
/// Pixels a module is drawn with in the image given to the reader.
const MODULE_PX: usize = 4;

/// What `relay pair` printed on stdout, in parts.
struct Printed {
    link: String,
    /// The code's lines, colours removed: a character per column.
    code: Vec<Vec<char>>,
    /// The `relay agent` command line.
    agent: String,
}

#[test]
fn pair_code_reads_back_as_the_link_on_light_and_dark_terminals() {
    require_zbarimg();
    // A short session, and the longest id: the largest code it draws.
    for session in ["demo".to_string(), "s".repeat(128)] {
        let out = pair(
            &[
                "--url",
                "https://relay.example.org/chat",
                "--session",
                &session,
                "--e2e",
            ],
            &[("RELAY_TOKEN_SECRET", SECRET)],
        );
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let printed = printed(&out);
        assert!(
            printed
                .link
                .starts_with(&format!("https://relay.example.org/chat/#{session}&token=")),
            "{}",
            printed.link
        );
        assert!(printed.link.contains("&key="), "{}", printed.link);
        for (background, name) in [(255u8, "light"), (0u8, "dark")] {
            let image = render(&printed.code, background, name);
            assert_eq!(
                zbarimg(&image),
                printed.link,
                "the code on a {name} terminal"
            );
            let _ = std::fs::remove_file(&image);
        }
    }
}

#[test]
fn pair_warns_of_an_open_session_and_of_addresses_the_phone_cannot_use() {
    let out = pair(
        &["--url", "http://192.0.2.7:8000", "--session", "open-one"],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = printed(&out);
    assert_eq!(printed.link, "http://192.0.2.7:8000/#open-one");
    assert_eq!(
        printed.agent,
        "relay agent --url http://192.0.2.7:8000 --session open-one -- CMD"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "RELAY_TOKEN_SECRET is not set",
        "open to anyone who can reach the server",
        "security chapter",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // A loopback address is named as one the phone cannot reach.
    let out = pair(&["--url", "http://127.0.0.1:8000", "--session", "s"], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a phone cannot reach"), "{err}");
    // An end-to-end key over http:// to another machine: the page cannot
    // encrypt there, and is said to refuse.
    let out = pair(
        &["--url", "http://192.0.2.7:8000", "--session", "s", "--e2e"],
        &[("RELAY_TOKEN_SECRET", SECRET)],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("encrypt only on https://"), "{err}");
    // With the secret, no warning at all.
    let out = pair(
        &["--url", "http://192.0.2.7:8000", "--session", "s"],
        &[("RELAY_TOKEN_SECRET", SECRET)],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn pair_bad_flags_are_usage_errors() {
    let url = ["--url", "http://192.0.2.7"];
    for (args, env, needle) in [
        (
            &["--session", "s"][..],
            &[][..],
            "--url PUBLIC_URL is required",
        ),
        (&url[..], &[][..], "--session ID is required"),
        (
            &["--url", "192.0.2.7", "--session", "s"][..],
            &[][..],
            "http://",
        ),
        (
            &[url[0], url[1], "--session", "a b"][..],
            &[][..],
            "invalid --session",
        ),
        (
            &[url[0], url[1], "--session", "s", "--nope"][..],
            &[][..],
            "unknown flag '--nope'",
        ),
        (
            &[url[0], url[1], "--session", "s", "--e2e=1"][..],
            &[][..],
            "--e2e takes no value",
        ),
        (
            &[url[0], url[1], "--session", "s", "--expires"][..],
            &[][..],
            "--expires needs a value",
        ),
        (
            &[url[0], url[1], "--session", "s", "--expires", "60"][..],
            &[][..],
            "--expires needs RELAY_TOKEN_SECRET",
        ),
        (
            &[url[0], url[1], "--session", "s", "--expires", "soon"][..],
            &[("RELAY_TOKEN_SECRET", SECRET)][..],
            "invalid --expires 'soon'",
        ),
        (
            &[url[0], url[1], "--session", "s"][..],
            &[("RELAY_TOKEN_SECRET", "short")][..],
            "RELAY_TOKEN_SECRET",
        ),
    ] {
        let out = pair(args, env);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("relay pair: "), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(err.contains("see relay pair --help"), "{args:?}: {err}");
    }
    let help = pair(&["--help"], &[]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.starts_with("usage: relay pair --url PUBLIC_URL"),
        "{text}"
    );
    let via_help = relay().args(["help", "pair"]).output().expect("run relay");
    assert_eq!(via_help.stdout, help.stdout);
}

/// A second phone joins an encrypted conversation: `--e2e-key-file` hands
/// over the key in use (from its file, never from RELAY_E2E_KEY) in the
/// link and the agent's line alike; with `--e2e`, or a file that holds no
/// key, it is a usage error.
#[test]
fn pair_hands_over_the_key_in_use_from_a_file() {
    let dir = crate::common::Dir::new("pair-key");
    std::fs::create_dir_all(dir.path()).expect("mkdir");
    let key_out = relay().arg("key").output().expect("run relay key");
    assert_eq!(key_out.status.code(), Some(0), "{key_out:?}");
    let key = String::from_utf8(key_out.stdout).expect("UTF-8 key");
    let key = key.trim();
    let file = format!("{}/key", dir.path());
    std::fs::write(&file, format!("{key}\n")).expect("write the key");
    let file = file.as_str();
    let args = [
        "--url",
        "https://relay.example",
        "--session",
        "s1",
        "--e2e-key-file",
        file,
    ];
    let other = "e2e1-not-this-one";
    let out = pair(
        &args,
        &[("RELAY_TOKEN_SECRET", SECRET), ("RELAY_E2E_KEY", other)],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let p = printed(&out);
    assert!(p.link.ends_with(&format!("&key={key}")), "{}", p.link);
    assert!(
        p.agent.contains(&format!("RELAY_E2E_KEY={key} ")),
        "{}",
        p.agent
    );
    assert!(!p.link.contains(other) && !p.agent.contains(other));
    // The same key each time: the phones share the conversation.
    assert_eq!(
        printed(&pair(&args, &[])).link,
        format!("https://relay.example/#s1&key={key}")
    );

    let both = [&args[..], &["--e2e"]].concat();
    let bad = format!("{}/bad", dir.path());
    std::fs::write(&bad, "not a key\n").expect("write");
    let bad = bad.as_str();
    for (args, needle) in [
        (&both[..], "give one of them"),
        (
            &[
                "--url",
                "https://h",
                "--session",
                "s",
                "--e2e-key-file",
                bad,
            ][..],
            "--e2e-key-file",
        ),
        (
            &[
                "--url",
                "https://h",
                "--session",
                "s",
                "--e2e-key-file",
                "/nonexistent/k",
            ][..],
            "cannot read",
        ),
    ] {
        let out = pair(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// The round trip a person makes: `relay pair`, the agent line it printed
/// run in a shell, the link opened in the browser; the prompt typed there
/// reaches the agent encrypted, and the answer shows decrypted. The server
/// has only the token secret: no request without a minted token works.
#[test]
fn pair_link_and_agent_line_talk_through_the_page() {
    let Some(_one) = crate::web_page::browser_turn() else {
        return;
    };
    let s = Server::start_with(&[("RELAY_TOKEN_SECRET", SECRET)]);
    let sid = unique_session();
    let url = format!("http://{}", s.addr());
    let out = pair(
        &[
            "--url",
            &url,
            "--session",
            &sid,
            "--e2e",
            "--",
            "tr",
            "a-z",
            "A-Z",
        ],
        &[("RELAY_TOKEN_SECRET", SECRET)],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = printed(&out);
    assert!(
        printed.agent.starts_with("RELAY_AGENT_TOKEN="),
        "{}",
        printed.agent
    );
    assert!(
        printed.agent.ends_with(" -- tr a-z A-Z"),
        "{}",
        printed.agent
    );
    let _agent = Agent::start(&printed.agent);
    s.wait_health("parked_polls", 1);

    let shots = screenshot_dir();
    let browser = Command::new("python3")
        .arg(SCRIPT)
        .arg(format!("--link={}", printed.link))
        .args(["--prompt", "hello from the phone"])
        .args(["--answer", "HELLO FROM THE PHONE"])
        .arg("--out")
        .arg(&shots)
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    let said = String::from_utf8_lossy(&browser.stdout);
    assert!(
        browser.status.success() && said.ends_with("DONE\n"),
        "the page: {said}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&browser.stderr)
    );
    let cmid = said
        .lines()
        .find_map(|l| l.strip_prefix("PROMPTED "))
        .expect("a PROMPTED line");

    // What the server holds is ciphertext that the key opens: the agent
    // had the key and the agent token from the line it was started with.
    let key = printed.link.split("&key=").nth(1).expect("a key");
    let key = relay::cli::e2e::Key::parse(key).expect("a key");
    let client = printed.link.split("&token=").nth(1).expect("a token");
    let client = client.split('&').next().unwrap_or(client);
    let r = s.request(
        "GET",
        &format!("/messages/{sid}"),
        &[("Authorization", &format!("Bearer {client}"))],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let history = r.json();
    let answer = history["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["type"] == "assistant" && m["data"]["client_msg_id"] == cmid)
        .unwrap_or_else(|| panic!("no answer to {cmid}: {history}"))["data"]
        .clone();
    let message = relay::cli::e2e::Message::Answer {
        session: &sid,
        client_msg_id: cmid,
        assistant_msg_id: answer["assistant_msg_id"].as_str().expect("an id"),
    };
    let text = answer["text"].as_str().expect("a text");
    assert_eq!(
        key.open(text, message).as_deref(),
        Some("HELLO FROM THE PHONE")
    );
    assert!(!history.to_string().contains("HELLO"), "{history}");
    assert_eq!(
        s.request("GET", &format!("/messages/{sid}"), &[], None)
            .status,
        401
    );
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

#[track_caller]
fn pair(args: &[&str], env: &[(&str, &str)]) -> Output {
    relay()
        .arg("pair")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run relay pair")
}

/// Splits what `relay pair` printed: the link is the line that starts
/// with a scheme, the code the lines in its colours, the agent's line the
/// last one.
#[track_caller]
fn printed(out: &Output) -> Printed {
    let text = String::from_utf8(out.stdout.clone()).expect("UTF-8 output");
    let link = text
        .lines()
        .find(|l| l.starts_with("http://") || l.starts_with("https://"))
        .unwrap_or_else(|| panic!("no link in {text}"))
        .to_string();
    let code: Vec<Vec<char>> = text
        .lines()
        .filter_map(|l| l.strip_prefix(INK_ON_PAPER))
        .map(|l| {
            l.strip_suffix(RESET)
                .unwrap_or_else(|| panic!("a code line without its reset: {l:?}"))
                .chars()
                .collect()
        })
        .collect();
    assert!(code.len() > 10, "no code in {text}");
    let agent = text
        .lines()
        .rev()
        .find(|l| !l.is_empty())
        .expect("an agent line")
        .to_string();
    assert!(agent.contains("relay agent --url "), "{agent}");
    Printed { link, code, agent }
}

/// The code as a terminal shows it: each character a cell one module wide
/// and two high, its upper and lower half black (the foreground) or white
/// (the background) as the character says, the cells on a terminal whose
/// own background is `background` (a margin around them). Written as a
/// PGM file; returns its path.
#[track_caller]
fn render(code: &[Vec<char>], background: u8, name: &str) -> PathBuf {
    let margin = 6 * MODULE_PX;
    let cols = code[0].len();
    assert!(code.iter().all(|l| l.len() == cols), "a ragged code");
    let (w, h) = (
        cols * MODULE_PX + 2 * margin,
        code.len() * 2 * MODULE_PX + 2 * margin,
    );
    let mut pixels = vec![background; w * h];
    for (row, line) in code.iter().enumerate() {
        for (col, c) in line.iter().enumerate() {
            let (top, bottom) = match c {
                ' ' => (false, false),
                '▀' => (true, false),
                '▄' => (false, true),
                '█' => (true, true),
                other => panic!("unexpected character {other:?} in the code"),
            };
            for (half, dark) in [(0, top), (1, bottom)] {
                let y0 = margin + (2 * row + half) * MODULE_PX;
                let x0 = margin + col * MODULE_PX;
                for y in y0..y0 + MODULE_PX {
                    pixels[y * w + x0..y * w + x0 + MODULE_PX].fill(if dark { 0 } else { 255 });
                }
            }
        }
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pair");
    std::fs::create_dir_all(&dir).expect("image directory");
    let path = dir.join(format!("code-{name}-{}-{}.pgm", cols, std::process::id()));
    let mut file = format!("P5\n{w} {h}\n255\n").into_bytes();
    file.extend_from_slice(&pixels);
    std::fs::write(&path, file).expect("write the image");
    path
}

/// What zbarimg reads in the image: the one code's text.
#[track_caller]
fn zbarimg(image: &Path) -> String {
    let out = Command::new("zbarimg")
        .args(["--raw", "--quiet", "-Sdisable", "-Sqrcode.enable"])
        .arg(image)
        .output()
        .expect("run zbarimg");
    assert!(
        out.status.success(),
        "zbarimg read no code in {image:?}: {out:?}"
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8 from zbarimg");
    text.strip_suffix('\n').unwrap_or(&text).to_string()
}

/// Fails, naming what to install, when the QR reader is missing.
fn require_zbarimg() {
    let found = Command::new("zbarimg")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "the QR code test needs zbarimg (apt-get install zbar-tools): run scripts/test, which installs it"
    );
}

/// The agent line run by a shell, as a person pastes it, with this build's
/// `relay` first on `PATH`; its process group is killed on drop.
struct Agent(Child);

impl Agent {
    #[track_caller]
    fn start(line: &str) -> Agent {
        let bin = Path::new(env!("CARGO_BIN_EXE_relay"))
            .parent()
            .expect("the binary's directory");
        let path = std::env::var("PATH").unwrap_or_default();
        let mut shell = Command::new("sh");
        for (key, _) in std::env::vars() {
            if key.starts_with("RELAY_") || key == "PORT" {
                shell.env_remove(key);
            }
        }
        let child = shell
            .args(["-c", line])
            .env("PATH", format!("{}:{path}", bin.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        Agent(child)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // The shell and the agent it started share the group.
        if let Ok(pid) = i32::try_from(self.0.id()) {
            // SAFETY: kill(2) on the group this test created.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.0.wait();
    }
}

/// `target/web-test/`, beside cargo's own `target/tmp`.
fn screenshot_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("web-test")
}
