//! `relay agent`: its flags, its start and its clean stop. One session is
//! served by the agent of `session` (a long-poll, a command per prompt,
//! the answer posted); every session a token opens, or a prefix of them,
//! by `agent_all`, whose workers each serve a session with that same
//! agent. What can go wrong, and how it is retried, is in `fail`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::client::Client;
use super::command;
use super::context;
use super::session::Agent;
use super::watch::Cancels;
use super::{Parsed, Spec, e2e};

/// Below nginx's 60 s default read timeout.
const DEFAULT_POLL: Duration = Duration::from_secs(50);
/// How long a cancelled command has between SIGTERM and SIGKILL.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

const HELP: &str =
    "usage: relay agent (--session ID | --all | --prefix P [--jobs N]) [--url URL] [--token-file FILE] [--ca FILE] [--e2e-key-file FILE] [--context N] [--poll-timeout S] [--kill-grace S] [--no-stream] -- CMD [ARGS...]

Long-polls the session and runs CMD once per prompt, in order: the prompt on
stdin; RELAY_URL (the server, as --url gives it), RELAY_SESSION_ID,
RELAY_CLIENT_MSG_ID and RELAY_METADATA (the prompt's metadata as JSON, {}
when it has none) in its environment, with the agent's token and key
(RELAY_AGENT_TOKEN, RELAY_E2E_KEY), so that relay ask in CMD needs no
flags. Its stdout,
trailing newlines removed, is posted as the answer; while CMD runs, what it
prints is streamed as parts of the answer (about every 0.1 s), which relay
send and the page show as they come. CMD is checked at start
(found and executable). A failure is posted as an error answer: its metadata
has \"error\" (the last 2 KiB of the command's stderr, else what went wrong)
and \"exit_code\" (N for exit N; 128+N and \"signal\":N when killed by
signal N; null when CMD could not start or the prompt could not be
decrypted); its text is whatever CMD printed to stdout, possibly nothing.
Network errors and 5xx are retried with backoff (0.1 s doubling to 5 s); the
session is created when missing.

The agent watches the session's WebSocket for cancels (the Stop button,
POST /cancel). CMD runs in a process group of its own: when its prompt is
cancelled, the group gets SIGTERM at once and SIGKILL after --kill-grace,
and nothing more is posted for the prompt; a cancelled prompt not started
yet is skipped. Each is logged (\"prompt cancelled\").

SIGTERM or SIGINT lets the command in hand finish and its answer be
posted, tells the server the agent is gone (DELETE /agent/ID, or
DELETE /agent with --all or --prefix, so the person sees it offline at
once), then exits 0 (a Ctrl-C at the terminal does not reach CMD, which
has its own group); a second signal sends CMD's group SIGTERM and exits at
once.

  --session ID        the session to serve
  --all               serve every session the token opens: one long-poll
                      for all of them; prompts of one session in order,
                      up to --jobs sessions at once, each with its own
                      watch for cancels while it has prompts
  --prefix P          as --all, for the sessions whose id starts with P
                      only (with a token for P, that is every session it
                      opens)
  --jobs N            with --all or --prefix: how many sessions' commands
                      may run at once (default 4)
  --url URL           the server (default RELAY_URL, else http://127.0.0.1:8000)
  --token-file FILE   read the agent token from FILE (a trailing newline is
                      dropped); default RELAY_AGENT_TOKEN. Prefer one of
                      these two to --token
  --token T           the agent token itself: shown by ps to every user of
                      the machine
  --ca FILE           for an https:// URL, trust only the CA or self-signed
                      certificate in this PEM file (default RELAY_CA, else the
                      system's trust store, else built-in Mozilla roots)
  --e2e-key-file FILE read the key from FILE (a trailing newline is dropped);
                      default RELAY_E2E_KEY. Prefer one of these two to
                      --e2e-key, which ps shows
  --e2e-key KEY       decrypt prompts and encrypt answers with this key (relay
                      key makes one): the server sees only ciphertext. A
                      prompt that does not decrypt (sent
                      without the key, or with another) is not run: it is
                      answered with an error answer. Without a key, an
                      encrypted prompt is answered so too. With a key, an
                      error answer does not carry CMD's stderr (metadata
                      travels in clear), only its exit. Each streamed part
                      is encrypted on its own
  --context N         give CMD the last N messages of the session (at most
                      1000), up to and including its prompt: one
                      GET /messages entry ({\"type\", \"data\"}) per line, oldest
                      first, texts decrypted with the key, in a file only
                      this user can read, named by RELAY_CONTEXT_FILE and
                      removed when CMD ends
  --poll-timeout S    seconds a long-poll may wait, below any proxy's read timeout (default 50)
  --kill-grace S      seconds a cancelled CMD has between SIGTERM and SIGKILL
                      (default RELAY_KILL_GRACE, else 5)
  --no-stream         post only the whole answer when CMD exits, no parts

exit codes: 0 stopped by a signal, 1 a fatal error (token refused, the
server refuses the session), 2 bad usage or CMD not found or not executable
";

const SPEC: Spec = Spec {
    valued: &[
        "--url",
        "--session",
        "--token",
        "--token-file",
        "--ca",
        "--poll-timeout",
        "--kill-grace",
        "--e2e-key",
        "--e2e-key-file",
        "--context",
        "--prefix",
        "--jobs",
    ],
    switches: &["--no-stream", "--all"],
    interleaved: false,
};

/// Which sessions `relay agent` serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Serve {
    /// `--session ID`.
    One(String),
    /// `--all` (no prefix) or `--prefix P`, with `--jobs`.
    Many { prefix: Option<String>, jobs: usize },
}

/// The default of `--jobs`.
const DEFAULT_JOBS: usize = 4;
/// The most `--jobs` takes: each job is a thread, a command and two
/// connections.
const MAX_JOBS: usize = 256;

/// What `relay agent` was asked to do.
pub struct Options {
    pub client: Client,
    /// The watch for cancels' own connection to the same server.
    pub watch_client: Client,
    /// The session served; empty with [`Serve::Many`] until
    /// [`Options::for_session`] names one.
    pub session: String,
    pub serve: Serve,
    pub poll_timeout: Duration,
    pub command: Vec<String>,
    /// What the command gets besides the prompt's identity, so that
    /// `relay ask` in it needs no flags (the token, the key).
    pub handoff: Vec<(&'static str, String)>,
    /// End-to-end encryption, when a key is given.
    pub key: Option<e2e::Key>,
    /// Whether to stream stdout as parts while the command runs.
    pub stream: bool,
    /// How long a cancelled command has between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// How many messages of the conversation the command gets in a file
    /// (`--context`); 0 for none.
    pub context: u64,
}

impl Options {
    /// The options of one session served by `--all` or `--prefix`: the
    /// same settings, the worker's `client` (kept from session to
    /// session), and a connection of its own for the watch.
    pub(super) fn for_session(&self, session: &str, client: Client) -> Options {
        Options {
            client,
            watch_client: self.client.fresh(),
            session: session.to_string(),
            serve: Serve::One(session.to_string()),
            poll_timeout: self.poll_timeout,
            command: self.command.clone(),
            key: self.key.clone(),
            stream: self.stream,
            kill_grace: self.kill_grace,
            context: self.context,
            handoff: self.handoff.clone(),
        }
    }
}

/// `--session`, `--all` or `--prefix` (exactly one), and `--jobs`.
fn serve_of(parsed: &Parsed) -> Result<Serve, String> {
    let jobs = match parsed.value("--jobs") {
        None => None,
        Some(v) => Some(
            v.parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_JOBS).contains(n))
                .ok_or_else(|| format!("--jobs '{v}': a number from 1 to {MAX_JOBS}"))?,
        ),
    };
    let prefix = parsed.value("--prefix");
    let chosen = [
        parsed.value("--session").is_some(),
        parsed.switch("--all"),
        prefix.is_some(),
    ];
    match chosen {
        [true, false, false] if jobs.is_none() => Ok(Serve::One(super::session_of(parsed)?)),
        [true, false, false] => Err("--jobs goes with --all or --prefix".into()),
        [false, true, false] => Ok(Serve::Many {
            prefix: None,
            jobs: jobs.unwrap_or(DEFAULT_JOBS),
        }),
        [false, false, true] => {
            let p = prefix.unwrap_or_default();
            // A prefix is the start of a session id: the same characters.
            if !crate::store::model::valid_session_id(p) {
                return Err(format!(
                    "invalid --prefix '{p}': 1 to 128 characters from A-Z a-z 0-9 . _ ~ -"
                ));
            }
            Ok(Serve::Many {
                prefix: Some(p.to_string()),
                jobs: jobs.unwrap_or(DEFAULT_JOBS),
            })
        }
        [false, false, false] => Err("--session ID, --all or --prefix P is required".into()),
        _ => Err("--session, --all and --prefix exclude each other".into()),
    }
}

fn options(parsed: &Parsed, env: &[(String, String)]) -> Result<Options, String> {
    let url = super::url_of(parsed, env)?;
    let tls = super::tls_of(parsed, env, &url)?;
    let token = super::token_of(parsed, env, "RELAY_AGENT_TOKEN")?;
    let serve = serve_of(parsed)?;
    let session = match &serve {
        Serve::One(sid) => sid.clone(),
        Serve::Many { .. } => String::new(),
    };
    let poll_timeout = super::seconds_of(parsed, "--poll-timeout", DEFAULT_POLL)?;
    let kill_grace = super::seconds_or_env(
        parsed,
        env,
        "--kill-grace",
        "RELAY_KILL_GRACE",
        DEFAULT_KILL_GRACE,
    )?;
    let key = super::e2e_key_of(parsed, env)?;
    let handoff = super::ask::handoff(parsed, token.as_deref(), key.as_ref());
    let context = match parsed.value("--context") {
        None => 0,
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|n| (1..=context::MAX_MESSAGES).contains(n))
            .ok_or_else(|| {
                format!(
                    "--context '{v}': a number of messages from 1 to {}",
                    context::MAX_MESSAGES
                )
            })?,
    };
    if parsed.rest.is_empty() {
        return Err("a command to run is required after --".into());
    }
    Ok(Options {
        watch_client: Client::new(url.clone(), token.clone(), tls.clone()),
        client: Client::new(url, token, tls),
        session,
        serve,
        poll_timeout,
        command: parsed.rest.clone(),
        handoff,
        key,
        stream: !parsed.switch("--no-stream"),
        kill_grace,
        context,
    })
}

/// `relay agent ARGS`: parses, sets up logging and signals, serves until
/// stopped. Returns the exit code.
pub fn main(args: &[String], env: &[(String, String)]) -> u8 {
    let opts = match super::tool_options("agent", args, env, &SPEC, HELP, options) {
        Ok(o) => o,
        Err(code) => return code,
    };
    if let Err(e) = command::check(&opts.command[0], super::env_value(env, "PATH")) {
        eprintln!("relay agent: cannot run the command: {e}");
        return 2;
    }
    if let Err(e) = init_logging(env) {
        return super::usage_error("agent", &e);
    }
    let running = Running::default();
    let stop = match stop_on_signals(running.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("relay agent: cannot handle signals: {e}");
            return 1;
        }
    };
    let result = match opts.serve {
        Serve::One(_) => {
            let cancels = Cancels::new();
            running.add(&cancels);
            Agent::new(opts, stop, cancels).run()
        }
        Serve::Many { .. } => super::agent_all::run(opts, stop, running),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            log::error!(error = e.as_str(); "agent failed");
            1
        }
    }
}

/// The server's `RELAY_LOG` and `RELAY_LOG_FORMAT` apply to the agent too.
fn init_logging(env: &[(String, String)]) -> Result<(), String> {
    let logging = env
        .iter()
        .filter(|(k, _)| k == "RELAY_LOG" || k == "RELAY_LOG_FORMAT")
        .cloned();
    let cfg = match crate::config::parse(logging, std::iter::empty())? {
        crate::config::Command::Run { cfg, .. } => cfg,
        _ => return Err("unexpected logging settings".into()),
    };
    crate::logging::init(cfg.log_level, cfg.log_format)
}

/// The cancel watches of the sessions being served, whose running
/// commands a second stop signal ends.
#[derive(Clone, Default)]
pub(super) struct Running(Arc<std::sync::Mutex<Vec<std::sync::Weak<Cancels>>>>);

impl Running {
    /// Registers a session's cancels; forgotten once dropped.
    pub(super) fn add(&self, cancels: &Arc<Cancels>) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|c| c.strong_count() > 0);
        list.push(Arc::downgrade(cancels));
    }

    fn stop_running(&self) {
        let list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for cancels in list.iter().filter_map(std::sync::Weak::upgrade) {
            cancels.stop_running();
        }
    }
}

/// A flag raised by the first SIGTERM or SIGINT; a second one, for a
/// command that does not finish, sends every running command's group
/// SIGTERM (its own group gets no Ctrl-C from the terminal) and exits at
/// once (status 128 + signal).
fn stop_on_signals(cancels: Running) -> std::io::Result<Arc<AtomicBool>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if flag.swap(true, Ordering::SeqCst) {
                    cancels.stop_running();
                    std::process::exit(128 + sig);
                }
            }
        })?;
    Ok(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_of_session_all_or_prefix_is_served() {
        let serve = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            serve_of(&super::super::parse_flags(&args, &SPEC).unwrap())
        };
        assert_eq!(serve(&["--session", "s"]), Ok(Serve::One("s".into())));
        let many = |prefix: Option<&str>, jobs| Serve::Many {
            prefix: prefix.map(str::to_string),
            jobs,
        };
        assert_eq!(serve(&["--all"]), Ok(many(None, DEFAULT_JOBS)));
        assert_eq!(
            serve(&["--prefix", "team-", "--jobs", "2"]),
            Ok(many(Some("team-"), 2))
        );
        for (args, needle) in [
            (&[][..], "is required"),
            (&["--session", "s", "--all"][..], "exclude each other"),
            (&["--session", "s", "--jobs", "2"][..], "--jobs goes with"),
            (&["--all", "--jobs", "0"][..], "--jobs '0'"),
            (&["--prefix", "a/b"][..], "invalid --prefix"),
        ] {
            let e = serve(args).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }
}
