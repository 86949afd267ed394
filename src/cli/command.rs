//! Running the agent's command for one prompt: the prompt on stdin, the
//! prompt's identity in the environment, stdout captured (capped) as the
//! answer, stderr passed through to the agent's own.

use std::io::{self, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};

use crate::relay::model::MAX_TEXT_BYTES;

/// Environment variables removed from the command's environment: the
/// command needs no token, and should not be able to leak one.
const HIDDEN_ENV: &[&str] = &["RELAY_AGENT_TOKEN", "RELAY_CLIENT_TOKEN"];

/// How the command ended and what it printed.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Stdout as UTF-8 (invalid bytes replaced), trailing newlines removed,
    /// cut to the server's text limit.
    pub text: String,
    /// Whether stdout was longer than the limit.
    pub truncated: bool,
    pub exit: Exit,
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
    /// The answer's metadata: absent for a clean run, else `exit_code`
    /// (128 + N for a command killed by signal N, as shells report it, with
    /// `signal: N`) and `truncated`.
    pub fn metadata(&self) -> Option<serde_json::Value> {
        let mut meta = serde_json::Map::new();
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

/// Runs `argv` once with `input` on stdin and `env` added to the
/// environment; waits for it to exit. `Err` only when it cannot be started.
pub fn run(argv: &[String], env: &[(&str, &str)], input: &[u8]) -> io::Result<Outcome> {
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
        .stderr(Stdio::inherit());
    for name in HIDDEN_ENV {
        cmd.env_remove(name);
    }
    let mut child = cmd.spawn()?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    // The prompt is written from a second thread: a command that prints
    // before it has read all of a large prompt would otherwise block on a
    // full pipe while we block writing to it.
    let (captured, status) = std::thread::scope(|scope| {
        scope.spawn(move || {
            if let Some(mut stdin) = stdin {
                // A command that exits without reading its input is fine.
                let _ = stdin.write_all(input);
            }
        });
        let captured = stdout.map(capture).unwrap_or_default();
        (captured, child.wait())
    });
    let (bytes, overflow) = captured;
    let (text, cut) = answer_text(&bytes, overflow);
    Ok(Outcome {
        text,
        truncated: overflow || cut,
        exit: Exit::of(status?),
    })
}

/// Reads stdout to its end, keeping the first `MAX_TEXT_BYTES + 1` bytes
/// (one more than fits, so an overflow is seen) and discarding the rest, so
/// a verbose command neither blocks nor grows our memory.
fn capture(mut out: impl Read) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut overflow = false;
    loop {
        match out.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                let room = (MAX_TEXT_BYTES + 1).saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..n.min(room)]);
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

    fn sh(script: &str, input: &str) -> Outcome {
        let argv = ["sh".to_string(), "-c".to_string(), script.to_string()];
        run(&argv, &[("X_NAME", "x-value")], input.as_bytes()).unwrap()
    }

    #[test]
    fn stdin_env_and_stdout_reach_the_answer() {
        let out = sh(r#"printf '%s|' "$X_NAME"; tr a-z A-Z; echo; echo"#, "hi");
        assert_eq!(out.text, "x-value|HI");
        assert_eq!(out.exit, Exit::Code(0));
        assert_eq!(out.metadata(), None);
    }

    #[test]
    fn exit_codes_and_signals_are_reported() {
        let out = sh("echo partial; exit 3", "");
        assert_eq!((out.text.as_str(), out.exit), ("partial", Exit::Code(3)));
        assert_eq!(out.metadata(), Some(serde_json::json!({"exit_code": 3})));
        let out = sh("kill -9 $$", "");
        assert_eq!(out.exit, Exit::Signal(9));
        assert_eq!(
            out.metadata(),
            Some(serde_json::json!({"exit_code": 137, "signal": 9}))
        );
    }

    #[test]
    fn long_output_is_cut_to_the_limit_and_flagged() {
        // A multi-byte character straddles the limit: the cut stays on a boundary.
        let script = format!("printf a; yes é | head -c {}", MAX_TEXT_BYTES * 2);
        let out = sh(&script, "");
        assert!(out.truncated);
        assert!(out.text.len() <= MAX_TEXT_BYTES && out.text.len() > MAX_TEXT_BYTES - 4);
        assert_eq!(out.metadata(), Some(serde_json::json!({"truncated": true})));
    }

    #[test]
    fn a_large_prompt_does_not_deadlock_a_chatty_command() {
        let input = "y".repeat(1 << 20);
        let out = sh("head -c 200000 /dev/zero; cat > /dev/null", &input);
        assert!(out.truncated && out.exit == Exit::Code(0));
    }

    #[test]
    fn a_nul_in_a_value_does_not_stop_the_command() {
        let argv = [
            "sh".to_string(),
            "-c".to_string(),
            "printf %s \"$V\"".to_string(),
        ];
        let out = run(&argv, &[("V", "a\0b")], b"").unwrap();
        assert_eq!(out.text, "a\u{fffd}b");
    }

    #[test]
    fn a_missing_program_is_an_error() {
        assert!(run(&["/nonexistent/cmd".to_string()], &[], b"").is_err());
    }
}
