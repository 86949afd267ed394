//! `relay agent`, `relay send` and `relay health` over `https://`: round
//! trips with `--ca`, and the refusals with what they say.

use std::process::Command;

use crate::certs::{Certs, connect, request};
use crate::common::unique_session;

/// The binary with the caller's `RELAY_*` settings removed.
fn relay_tool() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_relay"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RELAY_") || key == "PORT" {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(std::process::Stdio::null());
    cmd
}

/// Kills the child on drop.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn relay_agent_and_relay_send_round_trip_over_https_with_ca() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let url = format!("https://localhost:{}", srv.addr().port());
    let ca = certs.pem("ca");
    let sid = unique_session();
    let _agent = Running(
        relay_tool()
            .args(["agent", "--url", &url, "--session", &sid, "--ca"])
            .arg(&ca)
            .args(["--", "cat"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn relay agent"),
    );
    let out = relay_tool()
        .args([
            "send",
            "--url",
            &url,
            "--session",
            &sid,
            "--timeout",
            "20",
            "--ca",
        ])
        .arg(&ca)
        .arg("hello over tls")
        .output()
        .expect("run relay send");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "relay send failed: {stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello over tls",
        "{stderr}"
    );
    // RELAY_CA is the same as --ca; relay health speaks https:// too.
    let out = relay_tool()
        .args(["health", "--url", &url])
        .env("RELAY_CA", &ca)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_tools_refuse_an_untrusted_certificate_and_a_wrong_name() {
    let certs = Certs::new();
    let srv = certs.server("server", &[]);
    let url = format!("https://localhost:{}", srv.addr().port());
    let sid = unique_session();

    // Not signed by anything the system trusts.
    let out = relay_tool()
        .args(["send", "--url", &url, "--session", &sid, "hi"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not trusted") && stderr.contains("--ca"),
        "{stderr}"
    );
    let out = relay_tool()
        .args(["agent", "--url", &url, "--session", &sid, "--", "cat"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not trusted"), "{stderr}");

    // Trusted, but made for another name.
    certs.leaf("other", "ca", "DNS:other.example");
    let other = certs.server("other", &[]);
    let url = format!("https://127.0.0.1:{}", other.addr().port());
    let out = relay_tool()
        .args(["send", "--url", &url, "--session", &sid, "--ca"])
        .arg(certs.pem("ca"))
        .arg("hi")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not valid for the name 127.0.0.1"),
        "{stderr}"
    );
    // Nothing was posted on either.
    let mut tls = connect(&srv, &certs);
    let (_, body) = request(&mut tls, "GET", &format!("/prompts/{sid}?wait=false"), None);
    assert!(!String::from_utf8_lossy(&body).contains("\"hi\""));
}

#[test]
fn a_self_signed_certificate_is_trusted_with_ca_and_a_ca_made_one_is_explained() {
    let certs = Certs::new();
    certs.self_signed("own", false);
    let srv = certs.server("own", &[]);
    let url = format!("https://localhost:{}", srv.addr().port());
    let out = relay_tool()
        .args(["health", "--url", &url, "--ca"])
        .arg(certs.pem("own"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    certs.self_signed("own-ca", true);
    let srv = certs.server("own-ca", &[]);
    let url = format!("https://localhost:{}", srv.addr().port());
    let out = relay_tool()
        .args(["health", "--url", &url, "--ca"])
        .arg(certs.pem("own-ca"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("CA:FALSE"), "{stderr}");
}

#[test]
fn relay_health_checks_its_own_tls_server_with_the_servers_own_settings() {
    let certs = Certs::new();
    // A chain as certbot writes it: the certificate, then its issuer.
    let chain = [certs.pem("server"), certs.pem("ca")]
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<String>();
    std::fs::write(certs.pem("fullchain"), chain).unwrap();
    std::fs::copy(certs.key("server"), certs.key("fullchain")).unwrap();
    certs.self_signed("own", false);
    for name in ["fullchain", "own"] {
        let srv = certs.server(name, &[]);
        // The environment the server runs with, and nothing else.
        let out = relay_tool()
            .arg("health")
            .env("RELAY_PORT", srv.addr().port().to_string())
            .env("RELAY_TLS_CERT", certs.pem(name))
            .env("RELAY_TLS_KEY", certs.key(name))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
    }
}
