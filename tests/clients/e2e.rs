//! End-to-end encryption in the tools against the real server: `relay key`
//! makes a key; `relay send` and `relay agent` with it round trip a
//! conversation while the server holds only ciphertext: not in
//! `/messages`, not in its debug log, not in `relay.db` (through `sqlite3`
//! and as the raw bytes of every file of the data directory), not in Redis
//! (`DUMP` and the contents of every key, with `TEST_WITH_REDIS`). A
//! prompt sent with another key, or a ciphertext moved into another
//! session or message, is answered with an error and not run.
//!
//! The agent's command here (`tr`) prints its whole answer at once and
//! exits, within the agent's 100 ms batch, so the round trips carry a
//! prompt and its answer, no streamed parts; encrypted parts are tested
//! in `tests/clients/cli.rs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::common::*;
use serde_json::{Value, json};

/// The binary with the caller's `RELAY_*` settings removed (and the
/// harness's CA trusted with `TEST_WITH_TLS`).
fn relay() -> Command {
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

fn url(srv: &Server) -> String {
    let scheme = if tls_mode() { "https" } else { "http" };
    format!("{scheme}://{}", srv.addr())
}

#[track_caller]
fn new_key() -> String {
    let out = relay().arg("key").output().expect("run relay key");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A `relay agent` with `key` running `tr a-z A-Z`, killed on drop.
struct Agent(Child);

impl Agent {
    #[track_caller]
    fn start(srv: &Server, sid: &str, key: &str) -> Agent {
        Agent::start_with(srv, sid, Some(key))
    }

    #[track_caller]
    fn start_with(srv: &Server, sid: &str, key: Option<&str>) -> Agent {
        Agent::start_command(srv, sid, key, &["tr", "a-z", "A-Z"])
    }

    #[track_caller]
    fn start_command(srv: &Server, sid: &str, key: Option<&str>, command: &[&str]) -> Agent {
        let mut cmd = relay();
        if let Some(key) = key {
            cmd.env("RELAY_E2E_KEY", key);
        }
        let child = cmd
            .args(["agent", "--url", &url(srv), "--session", sid, "--"])
            .args(command)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn relay agent");
        srv.wait_health("parked_polls", 1);
        Agent(child)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn send(srv: &Server, sid: &str, key: &str, text: &str) -> Output {
    relay()
        .args([
            "send",
            "--url",
            &url(srv),
            "--session",
            sid,
            "--timeout",
            "20",
        ])
        .args(["--e2e-key", key, text])
        .output()
        .expect("run relay send")
}

#[test]
fn a_conversation_round_trips_while_the_server_holds_only_ciphertext() {
    let srv = Server::start_with(&[("RELAY_LOG", "debug")]);
    let sid = unique_session();
    let key = new_key();
    let _agent = Agent::start(&srv, &sid, &key);
    let out = send(&srv, &sid, &key, "attack at dawn");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ATTACK AT DAWN\n");

    let history = srv.messages(&sid, "");
    let text = history.to_string();
    for clear in ["attack at dawn", "ATTACK AT DAWN"] {
        assert!(!text.contains(clear), "{clear} in /messages: {text}");
        let logged = srv.logs().into_iter().find(|l| l.contains(clear));
        assert!(logged.is_none(), "{clear} in the server's log: {logged:?}");
    }
    let messages = history["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{history}");
    for m in messages {
        let field = if m["type"] == "prompt" {
            "prompt"
        } else {
            "text"
        };
        let stored = m["data"][field].as_str().unwrap();
        assert!(stored.starts_with("e2e1:"), "{m}");
        assert_eq!(m["data"]["metadata"]["e2e"], 1, "{m}");
    }
}

#[test]
fn a_prompt_that_does_not_decrypt_gets_an_error_answer_and_is_not_run() {
    let srv = Server::start();
    let sid = unique_session();
    let key = new_key();
    let _agent = Agent::start(&srv, &sid, &key);
    // Another key: the sender cannot read the error answer's text either,
    // but is told why (its metadata is in clear) and exits 3.
    let out = send(&srv, &sid, &new_key(), "hello");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cannot decrypt\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("error: cannot decrypt the prompt"),
        "{stderr}"
    );
    // A ciphertext made for another session, one made for another message
    // of this session, both moved here, and a clear prompt.
    let other = unique_session();
    let sealed = |session: &str, client_msg_id: &str| {
        relay::cli::e2e::Key::parse(&key)
            .unwrap()
            .seal(
                "moved",
                relay::cli::e2e::Message::Prompt {
                    session,
                    client_msg_id,
                },
            )
            .unwrap()
    };
    srv.prompt(&sid, &sealed(&other, "m-moved"), Some("m-moved"));
    srv.prompt(&sid, &sealed(&sid, "m-first"), Some("m-second"));
    srv.prompt(&sid, "in clear", Some("m-clear"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let answers = loop {
        let history = srv.messages(&sid, "");
        let answers: Vec<_> = history["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == "assistant")
            .map(|m| m["data"].clone())
            .collect();
        if answers.len() == 4 || std::time::Instant::now() > deadline {
            break answers;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(answers.len(), 4, "{answers:?}");
    for a in &answers {
        assert_eq!(a["text"], "cannot decrypt", "{a}");
        assert_eq!(a["metadata"]["exit_code"], Value::Null, "{a}");
        assert!(a["metadata"].get("exit_code").is_some(), "{a}");
        assert!(
            a["metadata"]["error"]
                .as_str()
                .is_some_and(|e| e.contains("cannot decrypt")),
            "{a}"
        );
    }
    assert!(
        !json!(answers).to_string().contains("MOVED"),
        "the command never ran"
    );
}

#[test]
fn an_agent_without_a_key_answers_an_encrypted_prompt_with_an_error_and_does_not_run_it() {
    let srv = Server::start();
    let sid = unique_session();
    let _agent = Agent::start_with(&srv, &sid, None);
    let out = send(&srv, &sid, &new_key(), "hello");
    assert_eq!(out.status.code(), Some(3), "an error answer: {out:?}");
    let history = srv.messages(&sid, "");
    let answers: Vec<&Value> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "assistant")
        .collect();
    assert_eq!(answers.len(), 1, "{history}");
    let answer = &answers[0]["data"];
    assert_eq!(answer["text"], "cannot decrypt", "{answer}");
    let error = answer["metadata"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("--e2e-key"), "{answer}");
    assert!(
        !history.to_string().contains("E2E1:"),
        "the command never ran on the ciphertext: {history}"
    );
}

/// With a key, a failed command's error answer says how it ended but not
/// what it wrote on stderr: metadata travels in clear.
#[test]
fn an_error_answer_keeps_stderr_out_of_clear_metadata() {
    let srv = Server::start();
    let sid = unique_session();
    let key = new_key();
    let _agent = Agent::start_command(
        &srv,
        &sid,
        Some(&key),
        &[
            "sh",
            "-c",
            "tr a-z A-Z; echo \"secret plan failed\" >&2; exit 4",
        ],
    );
    let out = send(&srv, &sid, &key, "the plan");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "THE PLAN\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the command exited with code 4 (exit code 4)"),
        "{stderr}"
    );
    let history = srv.messages(&sid, "").to_string();
    for clear in ["secret", "plan", "PLAN"] {
        assert!(!history.contains(clear), "{clear} in /messages: {history}");
    }
}

#[test]
fn relay_key_prints_a_fresh_key_each_time() {
    let (a, b) = (new_key(), new_key());
    assert_ne!(a, b);
    assert_eq!(a.len(), 43, "{a}");
}

/// A clear text no other test uses, and its upper-case answer from the
/// agent's `tr a-z A-Z`.
fn secret() -> (String, String) {
    let clear = format!("meet at the old mill at {}", now_ms());
    let upper = clear.to_uppercase();
    (clear, upper)
}

/// One encrypted round trip of `clear` through `relay send` and `relay
/// agent`; returns the stored prompt's ciphertext (as `/messages` gives it).
#[track_caller]
fn round_trip(srv: &Server, sid: &str, clear: &str, upper: &str) -> String {
    let key = new_key();
    let agent = Agent::start(srv, sid, &key);
    let out = send(srv, sid, &key, clear);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{upper}\n"));
    drop(agent);
    let history = srv.messages(sid, "");
    let text = history.to_string();
    for c in [clear, upper] {
        assert!(!text.contains(c), "{c} in /messages: {text}");
        let logged = srv.logs().into_iter().find(|l| l.contains(c));
        assert!(
            logged.is_none(),
            "{c} in the server's debug log: {logged:?}"
        );
    }
    let prompt = history["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["type"] == "prompt"))
        .unwrap_or_else(|| panic!("no prompt stored: {history}"));
    let stored = prompt["data"]["prompt"].as_str().expect("a prompt text");
    assert!(stored.starts_with("e2e1:"), "{prompt}");
    stored.to_string()
}

#[track_caller]
fn assert_absent(haystack: &[u8], clears: &[&str], place: &str) {
    for clear in clears {
        let found = haystack.windows(clear.len()).any(|w| w == clear.as_bytes());
        assert!(!found, "the clear text {clear:?} is in {place}");
    }
}

#[track_caller]
fn assert_present(haystack: &[u8], needle: &str, place: &str) {
    let found = haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes());
    assert!(
        found,
        "the stored ciphertext is not in {place}: the search sees nothing"
    );
}

/// Every file under `dir`, its path and bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the data directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            out.push((path, bytes));
        }
    }
    out
}

/// `sqlite3 relay.db .dump`, or `None` (said on stderr) when the `sqlite3`
/// command is not installed.
fn sqlite_dump(db: &Path) -> Option<Vec<u8>> {
    let out = match Command::new("sqlite3")
        .arg("-readonly")
        .arg(db)
        .arg(".dump")
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "skipped the search through sqlite3: the sqlite3 command is not installed \
                 (scripts/test installs it); the raw bytes are still searched"
            );
            return None;
        }
        Err(e) => panic!("run sqlite3: {e}"),
    };
    assert!(out.status.success(), "sqlite3 .dump: {out:?}");
    Some(out.stdout)
}

/// With a data directory, the clear text is in no file of it, read through
/// `sqlite3` or as raw bytes, while the server runs (the WAL holds the
/// rows) and after it stopped (they were checkpointed into `relay.db`).
#[test]
fn the_clear_text_is_in_no_file_of_the_data_directory() {
    let dir = std::env::temp_dir().join(format!("relay-e2e-{}-{}", std::process::id(), now_ms()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut srv = Server::start_with(&[
        ("RELAY_DATA_DIR", dir.to_str().expect("UTF-8 temp path")),
        ("RELAY_LOG", "debug"),
    ]);
    let sid = unique_session();
    let (clear, upper) = secret();
    let stored = round_trip(&srv, &sid, &clear, &upper);
    let clears = [clear.as_str(), upper.as_str()];

    let search = |when: &str| {
        let files = files_under(&dir);
        assert!(
            files.iter().any(|(p, _)| p.ends_with("relay.db")),
            "no relay.db in {dir:?}: {:?}",
            files.iter().map(|(p, _)| p).collect::<Vec<_>>()
        );
        let mut all = Vec::new();
        for (path, bytes) in &files {
            assert_absent(bytes, &clears, &format!("{path:?} ({when})"));
            all.extend_from_slice(bytes);
        }
        assert_present(&all, &stored, &format!("the data directory ({when})"));
        if let Some(dump) = sqlite_dump(&dir.join("relay.db")) {
            assert_absent(&dump, &clears, &format!("sqlite3's dump ({when})"));
            assert_present(&dump, &stored, &format!("sqlite3's dump ({when})"));
        }
    };
    search("while the relay runs");
    srv.sigterm();
    assert!(
        srv.wait_exit(std::time::Duration::from_secs(10)).is_some(),
        "relay did not stop"
    );
    search("after the relay stopped");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What every key of the Redis holds: for each, its name, its `DUMP` and
/// its contents read by type (a `DUMP` may be LZF-compressed, so a clear
/// text could hide in it; the contents cannot). One script, one round trip.
const REDIS_EVERY_KEY: &str = r#"
local out = {}
local function add(items) for _, v in ipairs(items) do out[#out + 1] = v end end
local cursor = '0'
repeat
  local page = redis.call('SCAN', cursor, 'COUNT', 1000)
  cursor = page[1]
  for _, k in ipairs(page[2]) do
    out[#out + 1] = k
    out[#out + 1] = redis.call('DUMP', k) or ''
    local t = redis.call('TYPE', k)['ok']
    if t == 'string' then out[#out + 1] = redis.call('GET', k) or ''
    elseif t == 'hash' then add(redis.call('HGETALL', k))
    elseif t == 'zset' then add(redis.call('ZRANGE', k, 0, -1, 'WITHSCORES'))
    elseif t == 'list' then add(redis.call('LRANGE', k, 0, -1))
    elseif t == 'set' then add(redis.call('SMEMBERS', k))
    elseif t == 'stream' then
      for _, e in ipairs(redis.call('XRANGE', k, '-', '+')) do out[#out + 1] = e[1]; add(e[2]) end
    end
  end
until cursor == '0'
return out
"#;

/// With `TEST_WITH_REDIS`, the clear text is in no key of the Redis the
/// two relays share.
#[test]
fn the_clear_text_is_in_no_key_of_redis() {
    let Ok(url) = std::env::var("TEST_WITH_REDIS") else {
        eprintln!("skipped: runs with TEST_WITH_REDIS=redis://HOST:PORT (.ci/run does)");
        return;
    };
    // The suite's `redis-cluster://` pass runs on one plain Redis (a
    // one-node cluster to the relay), which redis-cli reads as one.
    let url = url.replacen("redis-cluster://", "redis://", 1);
    let srv = Server::start_with(&[("RELAY_LOG", "debug")]);
    let sid = unique_session();
    let (clear, upper) = secret();
    let stored = round_trip(&srv, &sid, &clear, &upper);
    // A cluster URL of this harness names one Redis, which redis-cli
    // reads by its plain URL.
    let url = url.replacen("redis-cluster://", "redis://", 1);
    let out = Command::new("redis-cli")
        .args([
            "-u",
            &url,
            "--no-auth-warning",
            "EVAL",
            REDIS_EVERY_KEY,
            "0",
        ])
        .output()
        .expect("run redis-cli (it comes with redis-server, which scripts/test installs)");
    assert!(out.status.success(), "redis-cli EVAL: {out:?}");
    assert_absent(&out.stdout, &[&clear, &upper], "Redis");
    assert_present(&out.stdout, &stored, "Redis");
    assert_present(&out.stdout, &sid, "Redis");
}
