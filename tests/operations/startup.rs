//! What the real binary says at start: warnings about an open server and
//! about `RELAY_*` variables that are no setting, `localhost` as a host, and
//! one clear line per fatal start error.

use crate::common::Server;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const OPEN_WARNING: &str = "anyone who can reach this port can post prompts into the agent";

/// Runs the binary (through `wrapper`, if any) with only `env` set (on
/// port 0 of the loopback address unless `env` says otherwise) and expects
/// it to exit within 10 s; returns its status and stderr.
#[track_caller]
pub(crate) fn run_to_exit(wrapper: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    let bin = env!("CARGO_BIN_EXE_relay");
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = cmd
        .env_clear()
        .env("RELAY_PORT", "0")
        .env("RELAY_HOST", "127.0.0.1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn relay");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("relay kept running with {env:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, reader.join().unwrap())
}

#[test]
fn no_tokens_on_a_non_loopback_address_is_warned_about() {
    let srv = Server::start_with(&[("RELAY_HOST", "0.0.0.0")]);
    let line = srv.wait_for_log(OPEN_WARNING);
    assert!(line.contains("\"level\":\"warn\""), "{line}");
    for fix in [
        "RELAY_CLIENT_TOKEN",
        "RELAY_AGENT_TOKEN",
        "RELAY_HOST=127.0.0.1",
    ] {
        assert!(line.contains(fix), "{fix} missing: {line}");
    }
    // The server still listens and answers.
    assert_eq!(srv.get("/healthz").status, 200);
}

#[test]
fn loopback_or_tokens_mean_no_open_server_warning() {
    // Warnings are logged before the listening line `start` waits for.
    let local = Server::start();
    let tokens = Server::start_with(&[
        ("RELAY_HOST", "0.0.0.0"),
        ("RELAY_CLIENT_TOKEN", "c"),
        ("RELAY_AGENT_TOKEN", "a"),
    ]);
    for srv in [&local, &tokens] {
        let logs = srv.logs();
        assert!(!logs.iter().any(|l| l.contains(OPEN_WARNING)), "{logs:?}");
    }
}

#[test]
fn a_mistyped_relay_variable_is_warned_about_with_the_setting_meant() {
    // One relay: the warnings are counted in its own log.
    let srv = Server::start_single_with(&[("RELAY_PROT", "9000"), ("RELAY_CORS", "*")]);
    let line = srv.wait_for_log("RELAY_PROT");
    assert!(line.contains("did you mean RELAY_PORT?"), "{line}");
    let line = srv.wait_for_log("RELAY_CORS ");
    assert!(line.contains("did you mean RELAY_CORS_ORIGINS?"), "{line}");
    // The harness's own settings are all real: no other such warning.
    let unknown = srv
        .logs()
        .iter()
        .filter(|l| l.contains("is not a setting"))
        .count();
    assert_eq!(unknown, 2, "{:?}", srv.logs());
}

#[test]
fn localhost_is_accepted_as_127_0_0_1() {
    let srv = Server::start_with(&[("RELAY_HOST", "localhost")]);
    assert_eq!(srv.addr().ip().to_string(), "127.0.0.1");
    assert_eq!(srv.get("/healthz").status, 200);
}

#[test]
fn an_invalid_host_says_what_is_accepted() {
    let (status, stderr) = run_to_exit(&[], &[("RELAY_HOST", "relay.example")]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    for part in [
        "RELAY_HOST",
        "IPv4 or IPv6 address",
        "localhost",
        "'relay.example'",
    ] {
        assert!(stderr.contains(part), "{part} missing: {stderr}");
    }
}

#[test]
fn a_taken_port_is_reported_once_with_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    for format in ["text", "json"] {
        let (status, stderr) = run_to_exit(
            &[],
            &[
                ("RELAY_HOST", "127.0.0.1"),
                ("RELAY_PORT", &port),
                ("RELAY_LOG_FORMAT", format),
            ],
        );
        assert_eq!(status.code(), Some(1), "{format}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{format}: {stderr}");
        assert_eq!(
            stderr.matches("Address already in use").count(),
            1,
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "cannot listen on 127.0.0.1:{port}: Address already in use"
            )),
            "{format}: {stderr}"
        );
    }
}

#[test]
fn a_misspelled_security_setting_stops_the_server_and_a_misspelled_flag_is_named() {
    let (status, stderr) = run_to_exit(&[], &[("RELAY_CLIENT_TOKN", "secret")]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("did you mean RELAY_CLIENT_TOKEN?"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["--prot", "9000"])
        .output()
        .expect("run relay");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did you mean --port?"), "{stderr}");
}

#[test]
fn relay_help_prints_the_help() {
    for args in [&["help"][..], &["help", "agent"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(args)
            .output()
            .expect("run relay");
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("usage"), "{args:?}: {text}");
    }
}

#[test]
fn a_privileged_port_without_privilege_says_what_to_do() {
    // A kernel may let anyone bind low ports; root may anyway: the hint is
    // for a user who may not, run here through setpriv.
    let first_free: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024);
    let setpriv = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if first_free <= 80 || !setpriv {
        return;
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_relay"))
        .args(["--host", "127.0.0.1", "--port", "80"])
        .output()
        .expect("run relay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(stderr.contains("CAP_NET_BIND_SERVICE"), "{stderr}");
    assert!(stderr.contains("above 1023"), "{stderr}");
}

#[test]
fn an_invalid_trusted_proxy_is_quoted_once() {
    let (status, stderr) = run_to_exit(&[], &[("RELAY_TRUSTED_PROXY", "proxy.internal")]);
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("proxy.internal").count(), 1, "{stderr}");
    assert!(stderr.contains("RELAY_TRUSTED_PROXY"), "{stderr}");
}
