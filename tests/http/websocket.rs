//! WebSocket `/ws/{session_id}` against the real binary: the upgrade and its
//! refusals, broadcast, replay with `after`, epochs and `resync`, keepalive
//! (JSON and protocol pings, idle close), client frames, closes (client,
//! DELETE) and the subscriber cap. Seed scenarios 9 and 10 are the two tests
//! named after them. Slow subscribers, which are refilled from the log and
//! never closed, are in `subscriber_log.rs`.

use crate::common::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tungstenite::Message;
use tungstenite::handshake::client::generate_key;
use tungstenite::handshake::derive_accept_key;

/// A prompt `c{n}` and its answer `r{n}`: on a fresh session the answer of
/// exchange n gets seq 2n.
#[track_caller]
fn exchange(srv: &Server, sid: &str, n: u64) -> Value {
    srv.prompt(sid, "q", Some(&format!("c{n}")));
    srv.respond(sid, &format!("c{n}"), &format!("r{n}"))
}

/// The next frame, which must be a `message`; returns its `data`.
#[track_caller]
fn expect_message(ws: &mut Ws) -> Value {
    let f = ws.recv_json_skip_pings();
    assert_eq!(f["type"], "message", "{f}");
    f["data"].clone()
}

#[track_caller]
fn expect_seq(ws: &mut Ws, seq: u64) -> Value {
    let data = expect_message(ws);
    assert_eq!(data["seq"], seq, "{data}");
    data
}

#[track_caller]
fn epoch_of(srv: &Server, sid: &str) -> String {
    let r = srv.put(&format!("/sessions/{sid}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["epoch"]
        .as_str()
        .expect("epoch is a string")
        .to_string()
}

/// Reads until the peer ends the stream; returns the close code if a Close
/// frame came first. A read timeout is a failure: the socket was left open.
#[track_caller]
fn read_to_end(ws: &mut Ws) -> Option<u16> {
    for _ in 0..100_000 {
        match ws.inner().read() {
            Ok(Message::Close(frame)) => return Some(frame.map_or(1005, |f| u16::from(f.code))),
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("the server left the socket open: {e}")
            }
            Err(_) => return None,
        }
    }
    panic!("the stream never ended")
}

#[test]
fn upgrade_answers_101_with_accept_key_and_creates_the_session() {
    let srv = Server::start();
    let sid = unique_session();
    let key = generate_key();
    let r = srv.upgrade(&format!("/ws/{sid}"), &[("Sec-WebSocket-Key", &key)]);
    assert_eq!(r.status, 101, "{}", r.text());
    assert_eq!(
        r.header("Sec-WebSocket-Accept"),
        Some(derive_accept_key(key.as_bytes()).as_str())
    );
    assert!(
        r.header("Upgrade")
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
    );
    let m = srv.messages(&sid, "");
    assert_eq!(m["total"], 0, "the connect created an empty session: {m}");
    let _ws = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("subscribers", 1);
}

#[test]
fn invalid_session_id_is_refused_with_400_before_upgrade() {
    let srv = Server::start();
    let long = "a".repeat(129);
    for path in [
        format!("/ws/{long}"),
        "/ws/bad%20id".into(),
        "/ws/a!b".into(),
        "/ws/".into(),
    ] {
        let r = srv.upgrade(&path, &[]);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(r.json()["error"].is_string(), "{path}: {}", r.text());
    }
    assert_eq!(
        srv.health()["sessions"],
        0,
        "a refused upgrade must not create a session"
    );
    assert_eq!(
        srv.ws_with(&format!("/ws/{long}"), &[])
            .err()
            .map(|r| r.status),
        Some(400)
    );
}

#[test]
fn upgrade_without_key_or_with_wrong_version_gets_400_json() {
    let srv = Server::start();
    let path = format!("/ws/{}", unique_session());
    let r = srv.upgrade(&path, &[("Sec-WebSocket-Key", "")]);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"].is_string(), "{}", r.text());
    let r = srv.upgrade(&path, &[("Sec-WebSocket-Version", "8")]);
    // RFC 6455 4.2.2 also allows 426 naming the version the server speaks.
    let ok =
        r.status == 400 || (r.status == 426 && r.header("Sec-WebSocket-Version") == Some("13"));
    assert!(ok, "{} {}", r.status, r.text());
    assert!(r.json()["error"].is_string(), "{}", r.text());
    assert_eq!(srv.health()["subscribers"], 0);
}

#[test]
fn origin_outside_the_allow_list_gets_403_and_no_origin_is_allowed() {
    let srv = Server::start_with(&[("RELAY_CORS_ORIGINS", "https://app.example")]);
    let sid = unique_session();
    let r = srv.upgrade(&format!("/ws/{sid}"), &[("Origin", "https://evil.example")]);
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.json()["error"].is_string());
    let _listed = srv
        .ws_with(&format!("/ws/{sid}"), &[("Origin", "https://app.example")])
        .expect("listed origin");
    let _native = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("subscribers", 2);
}

#[test]
fn the_servers_own_origin_is_allowed_whatever_the_allow_list() {
    let srv = Server::start_with(&[("RELAY_CORS_ORIGINS", "https://chat.example.com")]);
    let sid = unique_session();
    let path = format!("/ws/{sid}");
    // The built-in page opens its WebSocket with the origin it was served
    // from: the request's own Host. The harness sends `Host: <addr>`.
    let addr = srv.addr().to_string();
    for origin in [format!("http://{addr}"), format!("https://{addr}")] {
        let ok = srv.upgrade(&path, &[("Origin", &origin), ("Host", &addr)]);
        assert_eq!(ok.status, 101, "{origin}: {}", ok.text());
    }
    // Another port or host of the same name is another origin.
    let other = format!("http://{addr}0");
    let r = srv.upgrade(&path, &[("Origin", &other), ("Host", &addr)]);
    assert_eq!(r.status, 403, "{}", r.text());
}

#[test]
fn response_is_broadcast_to_every_subscriber() {
    let srv = Server::start();
    let sid = unique_session();
    let mut clients: Vec<Ws> = (0..3).map(|_| srv.ws(&format!("/ws/{sid}"))).collect();
    srv.wait_health("subscribers", 3);
    let ack = exchange(&srv, &sid, 1);
    assert_eq!(ack["delivered"], true, "{ack}");
    for ws in &mut clients {
        let data = expect_seq(ws, 2);
        assert_eq!(data["session_id"], sid.as_str());
        assert_eq!(data["client_msg_id"], "c1");
        assert_eq!(data["text"], "r1");
        assert_eq!(data["assistant_msg_id"], ack["assistant_msg_id"]);
        assert!(data["ts"].is_u64(), "{data}");
    }
}

/// More subscribers than the server writes per loop turn (256): a pass over
/// them spans turns, the answers posted meanwhile join the queues not yet
/// written, and every subscriber still gets every frame once, in order.
#[test]
fn broadcast_to_more_subscribers_than_one_write_slice_arrives_whole_and_in_order() {
    const SUBSCRIBERS: usize = 600;
    const EXCHANGES: u64 = 5;
    let srv = Server::start();
    let sid = unique_session();
    let mut clients: Vec<Ws> = (0..SUBSCRIBERS)
        .map(|_| srv.ws(&format!("/ws/{sid}")))
        .collect();
    srv.wait_health("subscribers", SUBSCRIBERS as u64);
    for n in 1..=EXCHANGES {
        let ack = exchange(&srv, &sid, n);
        assert_eq!(ack["delivered"], true, "{ack}");
    }
    for ws in &mut clients {
        for n in 1..=EXCHANGES {
            let data = expect_seq(ws, 2 * n);
            assert_eq!(data["text"], format!("r{n}"));
        }
    }
}

#[test]
fn after_replays_stored_assistant_messages_then_goes_live() {
    let srv = Server::start();
    let sid = unique_session();
    exchange(&srv, &sid, 1);
    exchange(&srv, &sid, 2);
    let mut all = srv.ws(&format!("/ws/{sid}?after=0"));
    let mut tail = srv.ws(&format!("/ws/{sid}?after=2"));
    assert_eq!(expect_seq(&mut all, 2)["text"], "r1");
    assert_eq!(expect_seq(&mut all, 4)["text"], "r2");
    assert_eq!(
        expect_seq(&mut tail, 4)["text"],
        "r2",
        "after=2 skips seq 2, prompts never travel"
    );
    exchange(&srv, &sid, 3);
    expect_seq(&mut all, 6);
    expect_seq(&mut tail, 6);
}

#[test]
fn reconnecting_with_after_while_responses_flow_loses_nothing() {
    const N: u64 = 40;
    let srv = Server::start();
    let sid = unique_session();
    let mut agent = srv.conn();
    let agent_sid = sid.clone();
    let poster = std::thread::spawn(move || {
        for n in 1..=N {
            let p =
                json!({"session_id": agent_sid, "prompt": "q", "client_msg_id": format!("c{n}")});
            assert_eq!(agent.post_json("/prompt", &p).status, 200);
            let a = json!({"session_id": agent_sid, "client_msg_id": format!("c{n}"), "text": format!("r{n}")});
            assert_eq!(agent.post_json("/response", &a).status, 200);
        }
    });
    let mut seqs = Vec::new();
    let mut last = 0;
    while seqs.len() < N as usize {
        // A short-lived connection: read up to three messages, then reconnect from the cursor.
        let mut ws = srv.ws(&format!("/ws/{sid}?after={last}"));
        for _ in 0..3 {
            if seqs.len() == N as usize {
                break;
            }
            let data = expect_message(&mut ws);
            last = data["seq"].as_u64().expect("seq");
            assert_eq!(data["text"], format!("r{}", last / 2));
            seqs.push(last);
        }
    }
    poster.join().expect("poster");
    let want: Vec<u64> = (1..=N).map(|n| 2 * n).collect();
    assert_eq!(
        seqs, want,
        "replay then live must have no gap and no duplicate"
    );
}

#[test]
fn matching_epoch_sends_no_resync() {
    let srv = Server::start();
    let sid = unique_session();
    let epoch = epoch_of(&srv, &sid);
    exchange(&srv, &sid, 1);
    exchange(&srv, &sid, 2);
    let mut replaying = srv.ws(&format!("/ws/{sid}?after=2&epoch={epoch}"));
    let mut current = srv.ws(&format!("/ws/{sid}?after=4&epoch={epoch}"));
    srv.wait_health("subscribers", 2);
    expect_seq(&mut replaying, 4);
    exchange(&srv, &sid, 3);
    expect_seq(&mut replaying, 6);
    expect_seq(&mut current, 6);
}

#[test]
fn epoch_mismatch_sends_resync_then_retained_assistant_messages() {
    let srv = Server::start();
    let sid = unique_session();
    let epoch = epoch_of(&srv, &sid);
    exchange(&srv, &sid, 1);
    exchange(&srv, &sid, 2);
    let stale = "00000000-0000-4000-8000-000000000000";
    let mut ws = srv.ws(&format!("/ws/{sid}?after=4&epoch={stale}"));
    let f = ws.recv_json_skip_pings();
    assert_eq!(f["type"], "resync", "{f}");
    assert_eq!(f["epoch"], epoch.as_str(), "{f}");
    assert_eq!(f["first_seq"], 1, "{f}");
    expect_seq(&mut ws, 2);
    expect_seq(&mut ws, 4);
    exchange(&srv, &sid, 3);
    expect_seq(&mut ws, 6);
}

#[test]
fn trimmed_history_sends_resync_only_when_the_cursor_fell_behind() {
    let srv = Server::start_with(&[("RELAY_HISTORY_LIMIT", "2")]);
    let sid = unique_session();
    let epoch = epoch_of(&srv, &sid);
    for n in 1..=3 {
        exchange(&srv, &sid, n);
    }
    // History keeps seqs 5 and 6; a cursor at 2 missed seqs 3 and 4.
    let mut behind = srv.ws(&format!("/ws/{sid}?after=2"));
    let f = behind.recv_json_skip_pings();
    assert_eq!(f["type"], "resync", "{f}");
    assert_eq!(f["epoch"], epoch.as_str());
    assert_eq!(f["first_seq"], 5, "{f}");
    expect_seq(&mut behind, 6);
    for path in [
        format!("/ws/{sid}?after=4"),
        format!("/ws/{sid}?after=4&epoch={epoch}"),
    ] {
        let mut ws = srv.ws(&path);
        expect_seq(&mut ws, 6);
    }
}

#[test]
fn json_ping_frames_carry_a_timestamp() {
    let srv = Server::start_with(&[("RELAY_PING_INTERVAL", "0.2")]);
    let mut ws = srv.ws(&format!("/ws/{}", unique_session()));
    for _ in 0..2 {
        let f = ws.recv_json();
        assert_eq!(f["type"], "ping", "{f}");
        let ts = f["ts"].as_u64().expect("ts is a non-negative integer");
        assert!(
            ts.abs_diff(now_ms()) < 60_000,
            "ts {ts} is not wall-clock ms"
        );
    }
}

#[test]
fn protocol_ping_frames_are_sent() {
    let srv = Server::start_with(&[("RELAY_PING_INTERVAL", "0.2")]);
    let mut ws = srv.ws(&format!("/ws/{}", unique_session()));
    let got_ping = (0..50).any(|_| matches!(ws.recv(), Message::Ping(_)));
    assert!(got_ping, "no protocol Ping among 50 frames");
}

#[test]
fn client_that_sends_nothing_is_closed_after_two_intervals() {
    let srv = Server::start_with(&[("RELAY_PING_INTERVAL", "0.5")]);
    let sid = unique_session();
    // Taken before the connect: the server cannot have seen silence for longer.
    let connected = Instant::now();
    let mut silent = srv.ws(&format!("/ws/{sid}"));
    let mut live = srv.ws(&format!("/ws/{sid}"));
    // The live client reads from the start, so tungstenite answers every
    // protocol Ping; both were registered before their 101.
    let stop = Arc::new(AtomicBool::new(false));
    let reader_stop = stop.clone();
    let reader = std::thread::spawn(move || {
        while !reader_stop.load(Ordering::Relaxed) {
            let m = live.recv();
            assert!(
                !matches!(m, Message::Close(_)),
                "the answering client was closed: {m:?}"
            );
        }
        live
    });
    srv.wait_health("subscribers", 1);
    assert!(
        connected.elapsed() >= Duration::from_millis(750),
        "closed before two intervals"
    );
    stop.store(true, Ordering::Relaxed);
    let mut live = reader.join().expect("reader");
    exchange(&srv, &sid, 1);
    expect_seq(&mut live, 2);
    read_to_end(&mut silent);
}

#[test]
fn pong_text_frame_is_accepted_silently() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    ws.send_text(r#"{"type":"pong","ts":1}"#);
    exchange(&srv, &sid, 1);
    expect_seq(&mut ws, 2);
}

#[test]
fn other_text_gets_an_error_frame_and_the_connection_stays_open() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    for text in [
        "hello",
        r#"{"type":"subscribe"}"#,
        "{",
        "[]",
        r#"{"type":"pong","ts":"x"}"#,
    ] {
        ws.send_text(text);
        let f = ws.recv_json_skip_pings();
        assert_eq!(f["type"], "error", "{text}: {f}");
        assert!(f["error"].as_str().is_some_and(|e| !e.is_empty()), "{f}");
    }
    srv.wait_health("subscribers", 1);
    exchange(&srv, &sid, 1);
    expect_seq(&mut ws, 2);
}

/// The contract lists one client message, `{"type":"pong"}`; "anything
/// else gets an error frame", a JSON ping included.
#[test]
fn client_json_ping_gets_an_error_frame() {
    let srv = Server::start();
    let mut ws = srv.ws(&format!("/ws/{}", unique_session()));
    ws.send_text(r#"{"type":"ping","ts":1}"#);
    let f = ws.recv_json_skip_pings();
    assert_eq!(f["type"], "error", "{f}");
}

/// The contract: anything but a pong text frame "gets an error frame" and
/// the connection stays open; a binary frame is no exception.
#[test]
fn binary_frame_gets_an_error_frame_and_the_connection_stays_open() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    ws.inner()
        .send(Message::binary(vec![1u8, 2, 3]))
        .expect("send binary");
    let f = ws.recv_json_skip_pings();
    assert_eq!(f["type"], "error", "{f}");
    exchange(&srv, &sid, 1);
    expect_seq(&mut ws, 2);
}

#[test]
fn client_close_is_answered_and_the_subscriber_dropped() {
    let srv = Server::start();
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("subscribers", 1);
    ws.inner().close(None).expect("send close");
    assert!(
        read_to_end(&mut ws).is_some(),
        "the server must answer a Close with a Close"
    );
    srv.wait_health("subscribers", 0);
    assert_eq!(exchange(&srv, &sid, 1)["delivered"], false);
}

#[test]
fn deleting_the_session_closes_its_subscribers_with_1000() {
    let srv = Server::start();
    let sid = unique_session();
    let mut a = srv.ws(&format!("/ws/{sid}"));
    let mut b = srv.ws(&format!("/ws/{sid}"));
    let mut other = srv.ws(&format!("/ws/{}", unique_session()));
    srv.wait_health("subscribers", 3);
    let r = srv.delete(&format!("/sessions/{sid}"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(a.expect_close(), 1000);
    assert_eq!(b.expect_close(), 1000);
    srv.wait_health("subscribers", 1);
    other.send_text("still here?");
    assert_eq!(
        other.recv_json_skip_pings()["type"],
        "error",
        "another session's subscriber stays"
    );
}

#[test]
fn subscriber_cap_answers_503_before_upgrade() {
    // One relay: the cap counts its own subscribers.
    let srv = Server::start_single_with(&[("RELAY_MAX_SUBSCRIBERS", "2")]);
    let sid = unique_session();
    let _a = srv.ws(&format!("/ws/{sid}"));
    let mut b = srv.ws(&format!("/ws/{sid}"));
    let r = srv.upgrade(&format!("/ws/{sid}"), &[]);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.json()["error"].is_string());
    let _elsewhere = srv.ws(&format!("/ws/{}", unique_session()));
    b.inner().close(None).expect("close");
    read_to_end(&mut b);
    srv.wait_health("subscribers", 2);
    let _c = srv.ws(&format!("/ws/{sid}"));
}

/// Seed scenario 9: WebSocket connection handling (open, close, error events).
#[test]
fn scenario_9_websocket_open_close_and_error_events() {
    let srv = Server::start();
    let sid = unique_session();
    // open
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    srv.wait_health("subscribers", 1);
    exchange(&srv, &sid, 1);
    expect_seq(&mut ws, 2);
    // error: a bad frame is reported, the socket survives
    ws.send_text("not json");
    assert_eq!(ws.recv_json_skip_pings()["type"], "error");
    exchange(&srv, &sid, 2);
    expect_seq(&mut ws, 4);
    // close, then a reconnect with the cursor picks up what was missed
    ws.inner().close(None).expect("close");
    assert!(read_to_end(&mut ws).is_some());
    srv.wait_health("subscribers", 0);
    exchange(&srv, &sid, 3);
    let mut again = srv.ws(&format!("/ws/{sid}?after=4"));
    expect_seq(&mut again, 6);
}

/// Seed scenario 10: WebSocket ping/pong keepalive.
#[test]
fn scenario_10_ping_pong_keepalive() {
    let srv = Server::start_with(&[("RELAY_PING_INTERVAL", "0.2")]);
    let sid = unique_session();
    let mut ws = srv.ws(&format!("/ws/{sid}"));
    let started = Instant::now();
    let (mut json_pings, mut proto_pings) = (0, 0);
    // Answer for well over two intervals: JSON pings with a pong frame,
    // protocol Pings through tungstenite's automatic Pong.
    while started.elapsed() < Duration::from_millis(1200) || json_pings < 2 || proto_pings < 2 {
        match ws.recv() {
            Message::Ping(_) => proto_pings += 1,
            Message::Text(t) => {
                let f: Value = serde_json::from_str(&t).expect("JSON text frame");
                if f["type"] == "presence" {
                    continue;
                }
                assert_eq!(f["type"], "ping", "{f}");
                json_pings += 1;
                ws.send_text(&json!({"type": "pong", "ts": f["ts"]}).to_string());
            }
            other => panic!("unexpected frame {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(20), "pings stopped");
    }
    assert_eq!(
        srv.health()["subscribers"],
        1,
        "a client that answers stays connected"
    );
    exchange(&srv, &sid, 1);
    expect_seq(&mut ws, 2);
}
