//! A smoke client for a running relay: one prompt, a long-poll that gets
//! it, a response, and the WebSocket message that carries it. Used to check
//! a cross-built binary (for instance the aarch64 one under qemu).
//!
//! `cargo run --example smoke -- 127.0.0.1:8000`

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Duration;

fn request(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: smoke\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read: {e}"))?;
    let status = out
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or(format!("bad answer: {out}"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn check(what: &str, ok: bool, detail: &str) -> Result<(), String> {
    if ok {
        println!("ok   {what}");
        Ok(())
    } else {
        Err(format!("FAIL {what}: {detail}"))
    }
}

fn run(addr: &str) -> Result<(), String> {
    let sid = "smoke";
    let (mut ws, _) =
        tungstenite::connect(format!("ws://{addr}/ws/{sid}")).map_err(|e| format!("ws: {e}"))?;
    let (st, body) = request(
        addr,
        "POST",
        "/prompt",
        Some(r#"{"session_id":"smoke","client_msg_id":"p1","prompt":"ping"}"#),
    )?;
    check(
        "POST /prompt",
        st == 200 && body.contains("\"stored\":true"),
        &body,
    )?;
    let (st, body) = request(addr, "GET", "/prompts/smoke?timeout=10", None)?;
    check(
        "GET /prompts long-poll",
        st == 200 && body.contains("\"prompt\":\"ping\""),
        &body,
    )?;
    let (st, body) = request(
        addr,
        "POST",
        "/response",
        Some(r#"{"session_id":"smoke","client_msg_id":"p1","text":"pong"}"#),
    )?;
    check(
        "POST /response",
        st == 200 && body.contains("\"delivered\":true"),
        &body,
    )?;
    loop {
        let msg = ws.read().map_err(|e| format!("ws read: {e}"))?;
        // Frames of other types (the agent's presence) are skipped, as
        // every client skips the types it does not know.
        if let tungstenite::Message::Text(t) = msg
            && t.starts_with("{\"type\":\"message\"")
        {
            return check(
                "WebSocket message",
                t.contains("\"text\":\"pong\""),
                t.as_str(),
            );
        }
    }
}

fn main() -> ExitCode {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8000".into());
    match run(&addr) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
