//! Running the agent's command for one prompt: the prompt on stdin, the
//! prompt's identity in the environment, stdout captured (capped) as the
//! answer and handed on in batches while the command runs (the streamed
//! parts), stderr passed through to the agent's own with its last 2 KiB
//! kept for an error answer.

use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::model::MAX_TEXT_BYTES;

/// Environment variables removed from the command's environment: the
/// client token is the person's, which the command has no use for. (The
/// agent's own token and key are handed to it, for `relay ask`.)
const HIDDEN_ENV: &[&str] = &["RELAY_CLIENT_TOKEN"];
/// How much of the end of a failed command's stderr its error answer
/// carries: the reason is usually in the last lines.
pub const STDERR_TAIL_BYTES: usize = 2048;
/// Where a program is looked for when `PATH` is unset (what `execvp` does).
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// How long output is gathered before it is handed on while the command
/// runs: a part per batch, not per token.
pub const BATCH_INTERVAL: Duration = Duration::from_millis(100);
/// How often a stopped group whose leader is gone is checked for
/// stragglers until its grace ends.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// How the command ended and what it printed.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Stdout as UTF-8 (invalid bytes replaced), trailing newlines removed,
    /// cut to the server's text limit.
    pub text: String,
    /// Whether stdout was longer than the limit.
    pub truncated: bool,
    pub exit: Exit,
    /// The last [`STDERR_TAIL_BYTES`] of stderr (lossy UTF-8, trimmed).
    pub stderr_tail: String,
    /// Whether it was stopped (see [`Stopper`]): then it is no answer.
    pub stopped: bool,
}

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Exit {
    fn of(status: ExitStatus) -> Exit {
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(sig)) => Exit::Signal(sig),
            (None, None) => Exit::Code(-1),
        }
    }
}

impl Outcome {
    /// Whether the command failed: a non-zero exit or a signal.
    pub fn failed(&self) -> bool {
        self.exit != Exit::Code(0)
    }

    /// What went wrong, in words, for a failed command.
    pub fn describe_exit(&self) -> String {
        match self.exit {
            Exit::Code(code) => format!("the command exited with code {code}"),
            Exit::Signal(sig) => format!("the command was killed by signal {sig}"),
        }
    }

    /// The answer's metadata: absent for a clean run. A failed run is an
    /// error answer: `error` (the stderr tail when `with_stderr` and there is
    /// one, else [`Outcome::describe_exit`]) and `exit_code` (128 + N for a
    /// command killed by signal N, as shells report it, with `signal: N`).
    /// `truncated` when stdout was cut.
    pub fn metadata(&self, with_stderr: bool) -> Option<serde_json::Value> {
        let mut meta = serde_json::Map::new();
        if self.failed() {
            let error = if with_stderr && !self.stderr_tail.is_empty() {
                self.stderr_tail.clone()
            } else {
                self.describe_exit()
            };
            meta.insert("error".into(), error.into());
        }
        match self.exit {
            Exit::Code(0) => {}
            Exit::Code(code) => {
                meta.insert("exit_code".into(), code.into());
            }
            Exit::Signal(sig) => {
                meta.insert("exit_code".into(), (128 + sig).into());
                meta.insert("signal".into(), sig.into());
            }
        }
        if self.truncated {
            meta.insert("truncated".into(), true.into());
        }
        (!meta.is_empty()).then_some(serde_json::Value::Object(meta))
    }
}

/// Checks at start that `program` can be run: a path (it contains a `/`)
/// must name an executable file; a bare name must be one in a directory of
/// `path_var` (the agent's `PATH`). `Err` says what is wrong.
pub fn check(program: &str, path_var: Option<&str>) -> Result<(), String> {
    let executable = |p: &Path| -> Result<(), String> {
        let meta = std::fs::metadata(p).map_err(|e| e.to_string())?;
        if !meta.is_file() {
            Err("not a file".into())
        } else if meta.permissions().mode() & 0o111 == 0 {
            Err("not executable (chmod +x?)".into())
        } else {
            Ok(())
        }
    };
    if program.is_empty() {
        return Err("the command is empty".into());
    }
    if program.contains('/') {
        return executable(Path::new(program)).map_err(|why| format!("{program}: {why}"));
    }
    let path_var = path_var.unwrap_or(DEFAULT_PATH);
    let found = path_var
        .split(':')
        .filter(|dir| !dir.is_empty())
        .any(|dir| executable(&Path::new(dir).join(program)).is_ok());
    if found {
        Ok(())
    } else {
        Err(format!("{program}: command not found (searched PATH)"))
    }
}

/// Runs `argv` once with `input` on stdin and `env` added to the
/// environment, in a process group of its own; waits for it to exit. While
/// it runs, `on_output` gets what it printed on stdout since the last call
/// (never nothing), in batches (see [`BATCH_INTERVAL`]), up to the
/// answer's limit; a call that takes long only delays the next one, since
/// stdout is read meanwhile. A stop from `stop`'s [`Stopper`] ends the
/// whole group (see [`Stop`]); nothing is handed on after it. `Err` only
/// when the command cannot be started.
pub fn run(
    argv: &[String],
    env: &[(&str, &str)],
    input: &[u8],
    stop: Stop,
    on_output: &mut dyn FnMut(&[u8]),
) -> io::Result<Outcome> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
    let mut cmd = Command::new(program);
    // A variable cannot hold NUL, which a JSON string (a client_msg_id) can.
    let env = env.iter().map(|(k, v)| (k, v.replace('\0', "\u{fffd}")));
    cmd.args(args)
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so that a stop reaches every process it started
        // (a shell's children, a model runner's workers) with one kill.
        .process_group(0);
    for name in HIDDEN_ENV {
        cmd.env_remove(name);
    }
    let mut child = cmd.spawn()?;
    stop.target.started(child.id());
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let events = stop.tx.clone();
    // The prompt is written from a second thread, and stderr read from a
    // third: a command that prints before it has read all of a large
    // prompt, or fills its stderr pipe, would otherwise block on a full
    // pipe while we block on another. Stdout is read by a fourth, so that
    // this one can hand on a batch when the command pauses (a read cannot
    // wait with a deadline) and the command is not held up while it does;
    // a fifth waits for the exit, so that a stop is heard until then.
    let (captured, tail, ended) = std::thread::scope(|scope| {
        scope.spawn(move || {
            if let Some(mut stdin) = stdin {
                // A command that exits without reading its input is fine.
                let _ = stdin.write_all(input);
            }
        });
        let tail = scope.spawn(move || stderr.map(pass_stderr).unwrap_or_default());
        let tx = events.clone();
        let captured = scope.spawn(move || {
            let mut forward = |chunk: &[u8]| {
                // The receiver listens until stdout ended.
                let _ = tx.send(Event::Output(chunk.to_vec()));
            };
            let captured = stdout
                .map(|out| capture(out, &mut forward))
                .unwrap_or_default();
            let _ = tx.send(Event::StdoutEnd);
            captured
        });
        scope.spawn(move || {
            let _ = events.send(Event::Exited(child.wait()));
        });
        let ended = supervise(&stop, on_output);
        let captured = captured.join().unwrap_or_default();
        (captured, tail.join().unwrap_or_default(), ended)
    });
    let (status, stopped) = ended;
    let (bytes, overflow) = captured;
    let (text, cut) = answer_text(&bytes, overflow);
    Ok(Outcome {
        text,
        truncated: overflow || cut,
        exit: Exit::of(status?),
        stderr_tail: tail_text(&tail),
        stopped,
    })
}

/// What a run waits on.
enum Event {
    /// A piece of stdout.
    Output(Vec<u8>),
    StdoutEnd,
    /// The command (the group's leader) exited and was reaped.
    Exited(io::Result<ExitStatus>),
    /// Someone asked for the command to stop.
    Stop,
}

/// One run's stop: made before the run by whoever may stop it (the
/// [`Stopper`]s it hands out), consumed by [`run`].
pub struct Stop {
    tx: Sender<Event>,
    rx: Receiver<Event>,
    target: Arc<Target>,
    /// How long the group has between SIGTERM and SIGKILL.
    grace: Duration,
}

/// Stops one run's command from any thread: SIGTERM to its process group
/// at once, SIGKILL after the grace. A stop after the run ended does
/// nothing.
#[derive(Clone)]
pub struct Stopper {
    tx: Sender<Event>,
    target: Arc<Target>,
}

/// The process group a stop is for, and whether it was sent SIGTERM: the
/// stopper signals it at once (the run's thread may be busy posting a
/// part), or the run does when the stop came before the command started.
#[derive(Default)]
struct Target {
    state: Mutex<(Option<i32>, bool)>,
}

impl Stop {
    /// A stop for the next run, whose group gets `grace` between SIGTERM
    /// and SIGKILL.
    pub fn new(grace: Duration) -> Stop {
        let (tx, rx) = mpsc::channel();
        Stop {
            tx,
            rx,
            target: Arc::default(),
            grace,
        }
    }

    /// A handle that stops this run.
    pub fn stopper(&self) -> Stopper {
        Stopper {
            tx: self.tx.clone(),
            target: Arc::clone(&self.target),
        }
    }
}

impl Stopper {
    /// Stops the run (once; a second call changes nothing).
    pub fn stop(&self) {
        self.target.terminate();
        // The run may be over: then nobody listens.
        let _ = self.tx.send(Event::Stop);
    }
}

impl Target {
    /// The command started as the leader of group `pid`.
    fn started(&self, pid: u32) {
        let mut state = self.lock();
        state.0 = i32::try_from(pid).ok();
        if state.1 {
            // Stopped before it started.
            state.1 = false;
            drop(state);
            self.terminate();
        }
    }

    /// SIGTERM to the group, once; remembered for when it starts.
    fn terminate(&self) {
        let mut state = self.lock();
        if state.1 {
            return;
        }
        state.1 = true;
        if let Some(pgid) = state.0 {
            signal_group(pgid, libc::SIGTERM);
        }
    }

    /// Whether the group was sent SIGTERM (a stop came).
    fn terminated(&self) -> bool {
        self.lock().1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<i32>, bool)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// SIGKILL to whatever is left of the group.
    fn kill(&self) {
        if let Some(pgid) = self.lock().0 {
            signal_group(pgid, libc::SIGKILL);
        }
    }

    /// Whether a process of the group is left (a zombie counts until its
    /// new parent reaps it).
    fn alive(&self) -> bool {
        self.lock().0.is_some_and(|pgid| signal_group(pgid, 0))
    }
}

/// Sends `signal` to every process of group `pgid`; whether any was there.
fn signal_group(pgid: i32, signal: i32) -> bool {
    debug_assert!(pgid > 1, "never the caller's own group or every process");
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// Waits for the command's end, handing its output on in batches, each
/// [`BATCH_INTERVAL`] after its first byte arrived: a steady stream goes
/// out about every interval, and a command that is done within one
/// interval has nothing streamed (its final answer follows at once); what
/// is left when stdout ends is in the final answer. On a stop, nothing more
/// is handed on, and the run ends only once the whole group is gone:
/// SIGKILL for what is left after the grace. Returns the leader's exit
/// status and whether it was stopped.
fn supervise(stop: &Stop, on_output: &mut dyn FnMut(&[u8])) -> (io::Result<ExitStatus>, bool) {
    let mut batch = Vec::new();
    let mut due: Option<Instant> = None;
    let mut stdout_open = true;
    let mut status = None;
    let mut stopping = Stopping::No;
    let status = loop {
        if !stdout_open && let Some(status) = status.take() {
            break status;
        }
        let kill_at = match stopping {
            Stopping::Term { kill_at } => Some(kill_at),
            _ => None,
        };
        let got = match due.into_iter().chain(kill_at).min() {
            Some(at) => stop
                .rx
                .recv_timeout(at.saturating_duration_since(Instant::now())),
            // The run holds a sender, so the channel never disconnects.
            None => stop.rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(Event::Output(chunk)) if stopping == Stopping::No => {
                batch.extend_from_slice(&chunk);
                due.get_or_insert_with(|| Instant::now() + BATCH_INTERVAL);
            }
            Ok(Event::Output(_)) => {}
            Ok(Event::StdoutEnd) => {
                stdout_open = false;
                due = None;
            }
            Ok(Event::Exited(s)) => status = Some(s),
            Ok(Event::Stop) if stopping == Stopping::No => {
                stop.target.terminate();
                stopping = Stopping::Term {
                    kill_at: Instant::now() + stop.grace,
                };
                due = None;
            }
            Ok(Event::Stop) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                break Err(io::Error::other("the command's threads are gone"));
            }
        }
        let now = Instant::now();
        if kill_at.is_some_and(|at| now >= at) {
            stop.target.kill();
            stopping = Stopping::Killed;
        }
        if due.is_some_and(|due| now >= due) {
            on_output(&batch);
            batch.clear();
            due = None;
        }
    };
    // A stopper signals the group before its event reaches this loop (the
    // run's thread may be busy): the command can die of that SIGTERM, and
    // its end be read here, before the event is. It was stopped all the
    // same, and what is left of its group gets the grace as usual.
    if stopping == Stopping::No && stop.target.terminated() {
        stopping = Stopping::Term {
            kill_at: Instant::now() + stop.grace,
        };
    }
    match stopping {
        Stopping::No => (status, false),
        Stopping::Killed => (status, true),
        Stopping::Term { kill_at } => {
            // The leader is gone and stdout closed, but a process of its
            // group may live on (it ignored SIGTERM and closed its
            // output): it gets the rest of the grace, then SIGKILL.
            while stop.target.alive() {
                if Instant::now() >= kill_at {
                    stop.target.kill();
                    break;
                }
                std::thread::sleep(GROUP_POLL);
            }
            (status, true)
        }
    }
}

/// Where a run is in stopping its command.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stopping {
    No,
    /// SIGTERM sent; SIGKILL for what is left at `kill_at`.
    Term {
        kill_at: Instant,
    },
    Killed,
}

/// Copies the command's stderr to the agent's own as it comes (the
/// operator sees it live) and keeps its last [`STDERR_TAIL_BYTES`].
fn pass_stderr(mut err: impl Read) -> Vec<u8> {
    let mut tail = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match err.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                // Our stderr gone (closed by a supervisor) is no reason to
                // stop reading the command's.
                let _ = io::stderr().write_all(&chunk[..n]);
                tail.extend_from_slice(&chunk[..n]);
                if tail.len() > STDERR_TAIL_BYTES {
                    tail.drain(..tail.len() - STDERR_TAIL_BYTES);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    tail
}

/// The stderr tail as text: a character cut at the front by the 2 KiB
/// window is skipped (not shown as a replacement mark), surrounding
/// whitespace removed.
fn tail_text(tail: &[u8]) -> String {
    let start = tail
        .iter()
        .take(3)
        .take_while(|b| (**b & 0xC0) == 0x80)
        .count();
    String::from_utf8_lossy(&tail[start..]).trim().to_string()
}

/// Reads stdout to its end, keeping the first `MAX_TEXT_BYTES + 1` bytes
/// (one more than fits, so an overflow is seen) and discarding the rest, so
/// a verbose command neither blocks nor grows our memory. `kept_piece`
/// sees each piece as it is kept.
fn capture(mut out: impl Read, kept_piece: &mut dyn FnMut(&[u8])) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut overflow = false;
    loop {
        match out.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                let room = (MAX_TEXT_BYTES + 1).saturating_sub(kept.len());
                let piece = &chunk[..n.min(room)];
                if !piece.is_empty() {
                    kept_piece(piece);
                }
                kept.extend_from_slice(piece);
                overflow |= n > room;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    (kept, overflow)
}

/// Stdout as the answer: lossy UTF-8, trailing newlines removed (as shell
/// `$(…)` does) unless the output was cut already, then cut at a character
/// boundary within the server's limit. The flag says whether it was cut.
fn answer_text(bytes: &[u8], overflow: bool) -> (String, bool) {
    let text = String::from_utf8_lossy(bytes);
    let text = if overflow {
        &text[..]
    } else {
        text.trim_end_matches(['\n', '\r'])
    };
    if text.len() <= MAX_TEXT_BYTES {
        return (text.to_string(), false);
    }
    let mut cut = MAX_TEXT_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    (text[..cut].to_string(), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(5);

    fn sh(script: &str, input: &str) -> Outcome {
        let argv = ["sh".to_string(), "-c".to_string(), script.to_string()];
        run(
            &argv,
            &[("X_NAME", "x-value")],
            input.as_bytes(),
            Stop::new(GRACE),
            &mut |_| {},
        )
        .unwrap()
    }

    #[test]
    fn stdin_env_and_stdout_reach_the_answer() {
        let out = sh(r#"printf '%s|' "$X_NAME"; tr a-z A-Z; echo; echo"#, "hi");
        assert_eq!(out.text, "x-value|HI");
        assert_eq!(out.exit, Exit::Code(0));
        assert_eq!(out.metadata(true), None);
    }

    #[test]
    fn exit_codes_and_signals_are_reported() {
        let out = sh("echo partial; echo 'no model' >&2; exit 3", "");
        assert_eq!((out.text.as_str(), out.exit), ("partial", Exit::Code(3)));
        assert_eq!(
            out.metadata(true),
            Some(serde_json::json!({"error": "no model", "exit_code": 3}))
        );
        let hidden = serde_json::json!({"error": "the command exited with code 3", "exit_code": 3});
        assert_eq!(out.metadata(false), Some(hidden), "stderr withheld");
        let out = sh("kill -9 $$", "");
        assert_eq!(out.exit, Exit::Signal(9));
        assert_eq!(
            out.metadata(true),
            Some(serde_json::json!({
                "error": "the command was killed by signal 9", "exit_code": 137, "signal": 9
            }))
        );
    }

    #[test]
    fn long_output_is_cut_to_the_limit_and_flagged() {
        // A multi-byte character straddles the limit: the cut stays on a boundary.
        let script = format!("printf a; yes é | head -c {}", MAX_TEXT_BYTES * 2);
        let out = sh(&script, "");
        assert!(out.truncated);
        assert!(out.text.len() <= MAX_TEXT_BYTES && out.text.len() > MAX_TEXT_BYTES - 4);
        assert_eq!(
            out.metadata(true),
            Some(serde_json::json!({"truncated": true}))
        );
    }

    #[test]
    fn a_large_prompt_does_not_deadlock_a_chatty_command() {
        let input = "y".repeat(1 << 20);
        let out = sh("head -c 200000 /dev/zero; cat > /dev/null", &input);
        assert!(out.truncated && out.exit == Exit::Code(0));
    }

    #[test]
    fn output_is_handed_on_while_the_command_runs() {
        // The command prints its second word only once the first was
        // handed on: it would wait forever for a batch made at its exit.
        let go = std::env::temp_dir().join(format!("relay-batch-{}", std::process::id()));
        let _ = std::fs::remove_file(&go);
        let script = r#"printf first; while [ ! -e "$GO" ]; do sleep 0.01; done; printf ' second'"#;
        let argv = ["sh".to_string(), "-c".to_string(), script.to_string()];
        let mut batches: Vec<Vec<u8>> = Vec::new();
        let go_path = go.to_string_lossy().into_owned();
        let out = run(
            &argv,
            &[("GO", &go_path)],
            b"",
            Stop::new(GRACE),
            &mut |batch| {
                if batches.is_empty() {
                    std::fs::write(&go, b"").unwrap();
                }
                batches.push(batch.to_vec());
            },
        )
        .unwrap();
        let _ = std::fs::remove_file(&go);
        assert_eq!(out.text, "first second");
        assert_eq!(batches[0], b"first");
        assert!(
            b"first second".starts_with(&batches.concat()),
            "{batches:?}"
        );
        assert!(batches.iter().all(|b| !b.is_empty()));
    }

    #[test]
    fn a_nul_in_a_value_does_not_stop_the_command() {
        let argv = [
            "sh".to_string(),
            "-c".to_string(),
            "printf %s \"$V\"".to_string(),
        ];
        let out = run(&argv, &[("V", "a\0b")], b"", Stop::new(GRACE), &mut |_| {}).unwrap();
        assert_eq!(out.text, "a\u{fffd}b");
    }

    #[test]
    fn a_missing_program_is_an_error() {
        assert!(
            run(
                &["/nonexistent/cmd".to_string()],
                &[],
                b"",
                Stop::new(GRACE),
                &mut |_| {}
            )
            .is_err()
        );
    }

    #[test]
    fn only_the_end_of_a_long_stderr_is_kept() {
        // 1000 lines of 'é' (3 bytes each with the newline) then a last
        // line: the 2 KiB window starts on the second byte of an 'é', which
        // is skipped.
        let out = sh(
            "yes é | head -c 3000 >&2; echo the last words >&2; exit 1",
            "",
        );
        assert!(
            out.stderr_tail.ends_with("é\nthe last words"),
            "{}",
            out.stderr_tail
        );
        assert!(out.stderr_tail.len() <= STDERR_TAIL_BYTES);
        assert!(!out.stderr_tail.contains('\u{fffd}'));
        assert_eq!(tail_text(b"\x80\xA9ok \n"), "ok");
    }

    #[test]
    fn commands_are_checked_before_they_are_needed() {
        assert_eq!(check("sh", Some("/nonexistent:/bin:/usr/bin")), Ok(()));
        assert_eq!(check("/bin/sh", None), Ok(()));
        let e = check("no-such-relay-cmd", Some("/bin:/usr/bin")).unwrap_err();
        assert!(e.contains("not found"), "{e}");
        let e = check("/nonexistent/cmd", None).unwrap_err();
        assert!(e.contains("/nonexistent/cmd"), "{e}");
        let plain = std::env::temp_dir().join(format!("relay-check-{}", std::process::id()));
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = check(plain.to_str().unwrap(), None).unwrap_err();
        let _ = std::fs::remove_file(&plain);
        assert!(e.contains("not executable"), "{e}");
        assert!(check("/tmp", None).unwrap_err().contains("not a file"));
    }
    /// Runs `script` under `sh -c`, stopping it once it created `$READY`;
    /// returns the outcome and how long the stop took.
    fn stopped(script: &str, grace: Duration) -> (Outcome, Duration) {
        let ready = std::env::temp_dir().join(format!(
            "relay-stop-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        let ready_path = ready.to_string_lossy().into_owned();
        let argv = ["sh".to_string(), "-c".to_string(), script.to_string()];
        let stop = Stop::new(grace);
        let stopper = stop.stopper();
        let (tx, rx) = mpsc::channel();
        let ready_seen = ready.clone();
        let watcher = std::thread::spawn(move || {
            while !ready_seen.exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            let at = Instant::now();
            stopper.stop();
            tx.send(at).unwrap();
        });
        let out = run(&argv, &[("READY", &ready_path)], b"", stop, &mut |_| {}).unwrap();
        let took = rx.recv().unwrap().elapsed();
        watcher.join().unwrap();
        let _ = std::fs::remove_file(&ready);
        (out, took)
    }

    #[test]
    fn a_stop_whose_event_comes_late_is_a_stop_all_the_same() {
        // The stopper signals the group before it sends its event: the
        // command can die of the signal and its end be read first. Here
        // the event never comes at all.
        let ready = std::env::temp_dir().join(format!("relay-late-{}", uuid::Uuid::new_v4()));
        let ready_path = ready.to_string_lossy().into_owned();
        let script = r#"sleep 300 & touch "$READY"; wait"#;
        let argv = ["sh".to_string(), "-c".to_string(), script.to_string()];
        let stop = Stop::new(GRACE);
        let target = Arc::clone(&stop.target);
        let ready_seen = ready.clone();
        let watcher = std::thread::spawn(move || {
            while !ready_seen.exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
            target.terminate();
        });
        let out = run(&argv, &[("READY", &ready_path)], b"", stop, &mut |_| {}).unwrap();
        watcher.join().unwrap();
        let _ = std::fs::remove_file(&ready);
        assert!(out.stopped);
    }

    #[test]
    fn a_stop_ends_the_command_and_everything_it_started() {
        // The children hold stdout: the run could not end while one lived.
        let (out, took) = stopped(r#"sleep 300 & sleep 300 & touch "$READY"; wait"#, GRACE);
        assert!(out.stopped);
        assert!(took < GRACE, "ended by SIGTERM, not the grace: {took:?}");
    }

    #[test]
    fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
        let grace = Duration::from_millis(300);
        let script = r#"trap '' TERM; touch "$READY"; while :; do sleep 0.05; done"#;
        let (out, took) = stopped(script, grace);
        assert!(out.stopped);
        assert_eq!(out.exit, Exit::Signal(9));
        assert!(took >= grace, "{took:?}");
    }

    #[test]
    fn a_stop_before_the_start_or_after_the_end_is_harmless() {
        let stop = Stop::new(GRACE);
        stop.stopper().stop();
        let argv = ["sleep".to_string(), "300".to_string()];
        let out = run(&argv, &[], b"", stop, &mut |_| {}).unwrap();
        assert!(out.stopped);
        let stop = Stop::new(GRACE);
        let late = stop.stopper();
        let out = run(&["true".to_string()], &[], b"", stop, &mut |_| {}).unwrap();
        assert!(!out.stopped);
        late.stop();
    }
}
