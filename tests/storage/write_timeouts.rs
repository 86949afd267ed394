//! A write that waits for a stalled disk, against the real binary with
//! persistence: the storage thread's `fsync`/`fdatasync` are held up by
//! strace's fault injection while clients keep sending. Every request gets
//! its own answer; a write answered `503` is never stored; one the disk held
//! past the storage timeout is answered by what the disk did; a shutdown
//! does not wait for the disk and answers every waiting write.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Dir, Http, Server, skip_with_redis, unique_session};
use serde_json::{Value, json};

/// strace attached to every thread of a process, holding each of its
/// `fsync` and `fdatasync` calls for `delay` before it runs. Detached on
/// drop (the process goes on at full speed).
struct Stall {
    strace: Child,
}

impl Stall {
    /// Returns once every thread of `pid` is attached.
    #[track_caller]
    fn attach(pid: u32, delay: Duration) -> Stall {
        let inject = format!("fsync,fdatasync:delay_enter={}", delay.as_micros());
        let mut strace = Command::new("strace")
            .args(["-f", "-o", "/dev/null"])
            .args(["-e", "trace=fsync,fdatasync", "-e"])
            .arg(format!("inject={inject}"))
            .args(["-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("strace is missing: run scripts/test, which installs it");
        let mut lines = BufReader::new(strace.stderr.take().expect("stderr")).lines();
        // "Process N attached with T threads": every thread is held from
        // here on.
        loop {
            let line = lines
                .next()
                .expect("strace ended before it attached")
                .expect("strace's output");
            if line.contains("attached") {
                break;
            }
        }
        // strace's further lines are read and dropped, so it never blocks
        // on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Stall { strace }
    }
}

impl Drop for Stall {
    /// strace is killed, not asked to stop: it would first sit out a
    /// delay it is serving. The kernel detaches its tracees as it dies,
    /// and a held call then runs at once.
    fn drop(&mut self) {
        let _ = self.strace.kill();
        let _ = self.strace.wait();
    }
}

/// Waits until the storage thread of `pid` is held in a stalled flush:
/// the transaction it commits is the disk's from then on.
#[track_caller]
fn wait_storage_stalled(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|t| {
                let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
                // The state follows the parenthesised name: `t` is a
                // tracing stop; the syscall it is stopped in is fsync (74)
                // or fdatasync (75) on x86_64: the injected delay.
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                let number = call.split(' ').next().unwrap_or("");
                comm.trim() == "relay-storage"
                    && state.starts_with('t')
                    && (number == "74" || number == "75")
            });
        if held {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the storage thread never reached a flush"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn prompt_body(sid: &str, id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"session_id": sid, "prompt": id, "client_msg_id": id})).unwrap()
}

/// Sends `POST /prompt` for `id` on `conn` without reading the answer.
fn send_prompt(conn: &mut Http, sid: &str, id: &str) {
    let body = prompt_body(sid, id);
    conn.send(
        "POST",
        "/prompt",
        &[("Content-Type", "application/json")],
        Some(&body),
    );
}

/// The ids and `seq`s of a session's history, oldest first.
fn history(srv: &Server, sid: &str) -> (Vec<String>, Vec<u64>) {
    let page = srv.messages(sid, "?limit=1000");
    let msgs = page["messages"].as_array().expect("messages").clone();
    let ids = msgs
        .iter()
        .map(|m| {
            m["data"]["client_msg_id"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let seqs = msgs
        .iter()
        .map(|m| m["data"]["seq"].as_u64().unwrap_or(0))
        .collect();
    (ids, seqs)
}

#[track_caller]
fn assert_answer(resp: &common::Response, status: u16, key: &str, want: &str) {
    let body: Value = resp.json();
    assert_eq!(resp.status, status, "{body}");
    assert_eq!(body[key], want, "{body}");
}

#[test]
fn a_write_held_by_the_disk_past_its_timeout_gets_its_own_answer_and_a_queued_one_is_never_stored()
{
    if skip_with_redis("a stalled disk is the data directory's") {
        return;
    }
    let dir = Dir::created("stall");
    let env = [
        ("RELAY_DATA_DIR", dir.path()),
        ("RELAY_STORE_TIMEOUT", "0.3"),
    ];
    let srv = Server::start_single_with(&env);
    let sid = unique_session();
    srv.prompt(&sid, "p0", Some("p0"));

    let stall = Stall::attach(srv.pid(), Duration::from_secs(2));
    // p1 is taken into a transaction whose flush the disk holds for 2 s,
    // far past the 0.3 s storage timeout.
    let mut a = srv.conn();
    send_prompt(&mut a, &sid, "p1");
    wait_storage_stalled(srv.pid());
    // p2 waits behind it, not taken: at its timeout it is cancelled.
    let mut b = srv.conn();
    let refused = b.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "p2", "client_msg_id": "p2"}),
    );
    assert_answer(&refused, 503, "error", "Storage unavailable");
    // p1 is answered by what the disk did, on its own connection.
    assert_answer(&a.read_response(), 200, "client_msg_id", "p1");
    drop(stall);
    // The next request on that connection gets its own answer.
    send_prompt(&mut a, &sid, "p3");
    assert_answer(&a.read_response(), 200, "client_msg_id", "p3");
    // Once more on the refused one's connection: p2 was never stored, so
    // a resend stores it now (not a duplicate).
    let resent = b.post_json(
        "/prompt",
        &json!({"session_id": sid, "prompt": "p2", "client_msg_id": "p2"}),
    );
    assert_answer(&resent, 200, "client_msg_id", "p2");
    assert!(
        resent.json().get("duplicate").is_none(),
        "{}",
        resent.text()
    );

    let (ids, seqs) = history(&srv, &sid);
    assert_eq!(ids, ["p0", "p1", "p3", "p2"]);
    assert_eq!(seqs, [1, 2, 3, 4], "seq stays gapless");
}

#[test]
fn a_shutdown_does_not_wait_for_a_stalled_disk_and_answers_every_waiting_write() {
    if skip_with_redis("a stalled disk is the data directory's") {
        return;
    }
    let dir = Dir::created("stall");
    let env = [("RELAY_DATA_DIR", dir.path())];
    let mut srv = Server::start_single_with(&env);
    let sid = unique_session();
    srv.prompt(&sid, "p0", Some("p0"));

    // Every flush is held for a minute: far longer than the test waits.
    let stall = Stall::attach(srv.pid(), Duration::from_secs(60));
    let mut taken = srv.conn();
    send_prompt(&mut taken, &sid, "p1");
    wait_storage_stalled(srv.pid());
    let mut queued: Vec<Http> = (2..6).map(|_| srv.conn()).collect();
    for (i, c) in queued.iter_mut().enumerate() {
        send_prompt(c, &sid, &format!("q{i}"));
    }
    // A round trip on another connection after them: on loopback their
    // bytes were in the server's sockets before it, and one poll reports
    // every ready socket, so the loop has read them before the signal.
    srv.health();
    srv.sigterm();

    // The write the disk holds: its fate is unknown, and the answer says so.
    let held = taken.read_response();
    assert_eq!(held.status, 504, "{}", held.text());
    assert_eq!(held.json()["error"], "Storage timeout");
    // The writes behind it were cancelled: 503, and never stored.
    for c in &mut queued {
        assert_answer(&c.read_response(), 503, "error", "Storage unavailable");
    }
    // The loop is done while the disk still holds the flush (the log
    // waits at most 10 s of the minute). The process itself is gone once
    // its held thread is let go: a thread stopped by a tracer is reaped
    // by it, which a real disk does not need.
    srv.wait_for_log("shutdown complete");
    drop(stall);
    let status = srv
        .wait_exit(Duration::from_secs(10))
        .expect("the server exits");
    assert!(status.success(), "{status:?}");

    let again = Server::start_single_with(&env);
    let (ids, seqs) = history(&again, &sid);
    for i in 0..4 {
        let id = format!("q{i}");
        assert!(
            !ids.contains(&id),
            "{id} was answered 503 yet stored: {ids:?}"
        );
    }
    assert_eq!(ids[0], "p0");
    assert_eq!(seqs, (1..=ids.len() as u64).collect::<Vec<_>>());
}
