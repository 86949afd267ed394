//! The clients in `examples/` a user copies, run as they are against the
//! real server: the Python agent (standard library only) answers, the
//! JavaScript client (Node) asks and prints the answer it read from the
//! WebSocket.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Server, unique_session};

fn url(srv: &Server) -> String {
    let scheme = if common::tls_mode() { "https" } else { "http" };
    format!("{scheme}://{}", srv.addr())
}

/// Node runs the client; Node 20 needs a flag for its WebSocket.
fn node() -> Option<Command> {
    let version = Command::new("node").arg("--version").output().ok()?;
    let major: u32 = String::from_utf8_lossy(&version.stdout)
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()?;
    let mut cmd = Command::new("node");
    if major < 22 {
        cmd.arg("--experimental-websocket");
    }
    if common::tls_mode() {
        cmd.env("NODE_EXTRA_CA_CERTS", &common::tls_files().ca);
    }
    Some(cmd)
}

#[test]
fn the_python_agent_answers_what_the_javascript_client_asks() {
    let Some(mut client) = node() else {
        panic!(
            "node is needed by this test (Debian's nodejs): run scripts/test, which installs it"
        );
    };
    // One relay (on Redis too): the agent's parked poll is counted where
    // the test looks.
    let srv = Server::start_single();
    let sid = unique_session();
    let mut agent = Command::new("python3");
    agent
        .args(["examples/agent.py", "--url", &url(&srv), "--session", &sid])
        .args(["--max", "2"])
        .env_remove("RELAY_AGENT_TOKEN")
        .stdout(Stdio::null());
    if common::tls_mode() {
        agent.env("RELAY_CA", &common::tls_files().ca);
    }
    let mut agent = agent.spawn().expect("run python3");
    // The agent is parked on the session before anything is asked.
    srv.wait_health("parked_polls", 1);
    for question in ["hello relay", "and again"] {
        let out = client
            .args(["examples/client.mjs", &url(&srv), &sid, question])
            .output()
            .expect("run node");
        assert!(out.status.success(), "{out:?}");
        let answer = String::from_utf8_lossy(&out.stdout);
        assert_eq!(answer.trim_end(), question.to_uppercase(), "{out:?}");
        client = node().expect("node");
    }
    // Two answers given: the agent exits by itself.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = agent.try_wait().expect("try_wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the agent did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
    let history = srv.messages(&sid, "");
    assert_eq!(history["total"], 4, "{history}");
}
