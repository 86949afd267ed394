//! Storage faults injected into the real server with a data directory
//! (`RELAY_DATA_DIR`), counted from outside: a data directory the server
//! cannot write in, and a second server after `relay.lock` was deleted.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A fresh data directory under the temp dir, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("relay-fault-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Dir(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("UTF-8 temp path")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = Command::new("chmod")
            .args(["-R", "u+w"])
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `client_msg_id` of every prompt in the session's history.
#[track_caller]
fn stored_prompts(srv: &Server, sid: &str) -> Vec<String> {
    srv.messages(sid, "?limit=1000")["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["type"] == "prompt")
        .map(|m| {
            m["data"]["client_msg_id"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// Runs the binary on `dir` (through `wrapper`, if any) expecting it to
/// stop at start; returns stderr.
#[track_caller]
fn refused(wrapper: &[&str], dir: &Path) -> String {
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
        .env("RELAY_DATA_DIR", dir)
        .env("RELAY_PORT", "0")
        .env("RELAY_HOST", "127.0.0.1")
        .env_remove("RELAY_REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run relay");
    // A server that starts instead of stopping is stopped here, bounded.
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("relay started on {} instead of stopping", dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("relay's stderr");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}

#[test]
fn a_data_directory_that_cannot_be_written_is_reported_as_such() {
    if skip_with_redis("a data directory of its own") {
        return;
    }
    let dir = Dir::new("readonly");
    let mut srv = Server::start_single_with(&[("RELAY_DATA_DIR", dir.path())]);
    let sid = unique_session();
    srv.prompt(&sid, "kept", Some("kept"));
    srv.kill9();
    let files = |d: &Dir| {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(&d.0)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = files(&dir);
    // Root ignores permission bits: as root the server runs as nobody.
    let status = Command::new("chmod")
        .args(["0555", dir.path()])
        .status()
        .unwrap();
    assert!(status.success());
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    let wrapper: &[&str] = if root {
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]
    } else {
        &[]
    };
    let err = refused(wrapper, &dir.0);
    assert!(err.contains(dir.path()), "names the directory: {err}");
    assert!(err.contains("not writable"), "{err}");
    assert!(!err.contains("not a relay database"), "{err}");
    assert_eq!(files(&dir), before, "nothing in the directory changed");
}

#[test]
fn a_second_server_is_refused_even_after_relay_lock_was_deleted() {
    if skip_with_redis("a data directory of its own") {
        return;
    }
    let dir = Dir::new("flock");
    let first = Server::start_single_with(&[("RELAY_DATA_DIR", dir.path())]);
    let sid = unique_session();
    first.prompt(&sid, "first", Some("p1"));
    let _ = std::fs::remove_file(dir.0.join("relay.lock"));
    let err = refused(&[], &dir.0);
    assert!(err.contains(dir.path()), "names the directory: {err}");
    // The first goes on, alone on its database.
    first.prompt(&sid, "second", Some("p2"));
    assert_eq!(stored_prompts(&first, &sid), ["p1", "p2"]);
}
