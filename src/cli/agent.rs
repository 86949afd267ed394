//! `relay agent`: long-polls one session and runs a command once per prompt,
//! in `seq` order, posting its stdout as the answer.
//!
//! Exactly-once answers come from the server, not from local state: the
//! `assistant_msg_id` is a name-based UUID of the session and the
//! `client_msg_id`, so a second run of the same prompt (an agent restarted
//! mid-prompt, a retried post, two agents woken by one prompt) is refused as
//! a duplicate (same text) or a conflict (different text), and both mean
//! "already answered".
//!
//! While the command runs, its stdout is streamed as parts of the answer
//! (see `parts`), when the server takes them: a server without streamed
//! answers would store the first part as the whole answer, so the agent
//! first asks for `GET /sessions/{id}`, which came with them.
//!
//! The person may stop a prompt (`POST /cancel`): a second connection, the
//! session's WebSocket, watches for cancels while the agent works (see
//! `watch`). The command runs in a process group of its own; a cancel of
//! the prompt in hand ends that group (SIGTERM, then SIGKILL after
//! `--kill-grace`) and nothing more is posted for it; a cancelled prompt
//! not started yet is skipped.
//!
//! The agent's cursor (`after`) is only valid for one incarnation of the
//! session: it learns the session's `epoch` from `PUT /sessions` whenever it
//! (re)connects or finds the queue empty, and starts over from `after=0`
//! when the epoch changed (a restarted in-memory server, a deleted session).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;

use super::client::{self, Client, Limit, Response};
use super::command::{self, Exit, Outcome};
use super::context::{self, ContextFile};
use super::parts::{self, Parts};
use super::watch::{self, Cancels};
use super::{Parsed, Spec, e2e};

/// The first retry delay; it doubles on each failure in a row.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest retry delay.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The longest `Retry-After` honoured.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(60);
/// Every request but the long-poll.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How much longer than its `timeout` a long-poll may take to be answered.
pub(super) const POLL_MARGIN: Duration = Duration::from_secs(15);
/// Below nginx's 60 s default read timeout.
const DEFAULT_POLL: Duration = Duration::from_secs(50);
/// How long saying goodbye (`DELETE /agent`) may take when stopping.
const GONE_TIMEOUT: Duration = Duration::from_secs(2);
/// After a stop signal, how long posting the answer in hand is retried.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a cancelled command has between SIGTERM and SIGKILL.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// Larger metadata is not put in the command's environment: Linux refuses
/// to start a program with a variable above 128 KiB.
const MAX_METADATA_ENV: usize = 64 * 1024;
/// The namespace of the agent's name-based answer ids.
const ANSWER_NAMESPACE: uuid::Uuid = uuid::uuid!("0eead76b-5401-44fc-899f-6ad5c502f7dd");

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
    /// same settings, connections of its own.
    pub(super) fn for_session(&self, session: &str) -> Options {
        Options {
            client: self.client.fresh(),
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

/// The answer id for a prompt: the same for every run of the agent, 36
/// bytes whatever the length of the `client_msg_id`.
pub fn answer_id(session: &str, client_msg_id: &str) -> String {
    use sha1::{Digest, Sha1};
    let mut hash = Sha1::new();
    hash.update(ANSWER_NAMESPACE.as_bytes());
    hash.update(session.as_bytes());
    hash.update(b"\n");
    hash.update(client_msg_id.as_bytes());
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_sha1_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// `RELAY_METADATA`: the prompt's metadata as JSON, `{}` when it has none,
/// `null` when it is too large for the environment.
fn metadata_env(metadata: Option<&serde_json::Value>) -> String {
    match metadata {
        Some(m @ serde_json::Value::Object(_)) => {
            let json = m.to_string();
            if json.len() <= MAX_METADATA_ENV {
                json
            } else {
                "null".to_string()
            }
        }
        _ => "{}".to_string(),
    }
}

/// One pending prompt as `GET /prompts` returns it.
#[derive(Debug, Deserialize)]
pub(super) struct Prompt {
    pub(super) client_msg_id: String,
    prompt: String,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
    seq: u64,
}

/// An answer ready to post.
struct Reply {
    text: String,
    metadata: Option<serde_json::Value>,
    /// The command's exit code (for the log); `None` when none ran.
    exit_code: Option<i64>,
}

/// Why a step did not complete.
#[derive(Debug)]
pub(super) enum Fail {
    /// Worth retrying after a delay (at least `wait` when the server said);
    /// `unreachable` when no connection could be made at all.
    Retry {
        why: String,
        wait: Option<Duration>,
        unreachable: bool,
    },
    /// Retrying cannot help: the agent exits 1.
    Fatal(String),
    /// A stop signal ended the wait.
    Stopped,
}

pub(super) fn retry(why: impl Into<String>) -> Fail {
    Fail::Retry {
        why: why.into(),
        wait: None,
        unreachable: false,
    }
}

/// Sorts a request's result into an answer to look at and failures.
pub(super) fn classify(result: Result<Response, client::Error>) -> Result<Response, Fail> {
    match result {
        Err(client::Error::Cancelled) => Err(Fail::Stopped),
        Err(client::Error::Tls(why)) => Err(Fail::Fatal(why)),
        Err(e @ client::Error::Connect(_)) => Err(Fail::Retry {
            why: e.to_string(),
            wait: None,
            unreachable: true,
        }),
        Err(e) => Err(retry(e.to_string())),
        Ok(r) if r.status >= 500 || r.status == 429 || r.status == 408 => Err(Fail::Retry {
            why: r.describe(),
            wait: r.retry_after.map(Duration::from_secs),
            unreachable: false,
        }),
        // The server's reason as it gave it (expired, another session,
        // which role): what the token was and where it came from is the
        // operator's to check.
        Ok(r) if r.status == 401 || r.status == 403 => Err(Fail::Fatal(format!(
            "{} (the agent token: --token, --token-file or RELAY_AGENT_TOKEN)",
            r.describe()
        ))),
        Ok(r) => Ok(r),
    }
}

/// Tells the server the agent stopped cleanly (`DELETE /agent/{id}` or
/// `DELETE /agent`), so its presence ends at once rather than after the
/// grace. Once, briefly: the agent is leaving either way, and a server
/// without the endpoint answers `404`.
pub(super) fn gone(client: &mut Client, path: &str) {
    match client.request("DELETE", path, None, Limit::within(GONE_TIMEOUT)) {
        Ok(resp) if resp.status == 200 => log::debug!(path = path; "presence ended"),
        Ok(resp) => {
            log::debug!(path = path, error = resp.describe().as_str(); "presence not ended")
        }
        Err(e) => log::debug!(path = path, error = e.to_string().as_str(); "presence not ended"),
    }
}

/// Capped exponential backoff.
#[derive(Debug)]
pub(super) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(super) fn new() -> Backoff {
        Backoff {
            next: BACKOFF_FIRST,
        }
    }

    /// The delay before the next attempt, at least the server's `wait`.
    pub(super) fn delay(&mut self, wait: Option<Duration>) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(BACKOFF_MAX);
        d.max(wait.unwrap_or_default().min(RETRY_AFTER_MAX))
    }
}

pub(super) struct Agent {
    client: Client,
    session: String,
    poll_timeout: Duration,
    command: Vec<String>,
    handoff: Vec<(&'static str, String)>,
    key: Option<e2e::Key>,
    /// Whether to stream parts (not `--no-stream`).
    stream: bool,
    kill_grace: Duration,
    /// `--context`: how many messages the command gets; 0 for none.
    context: u64,
    /// Cancels seen by the watch, and the run it may stop.
    cancels: Arc<Cancels>,
    /// The watch's connection, until the watch starts (after the first sync).
    watch_client: Option<Client>,
    /// Whether the server takes streamed parts, as found by the last
    /// `sync`; `None` before the first.
    server_streams: Option<bool>,
    stop: Arc<AtomicBool>,
    /// The `seq` of the last prompt handled in this epoch.
    after: u64,
    epoch: Option<String>,
    /// Whether `epoch` was checked since the last connection problem or idle poll.
    synced: bool,
    backoff: Backoff,
}

impl Agent {
    pub(super) fn new(opts: Options, stop: Arc<AtomicBool>, cancels: Arc<Cancels>) -> Agent {
        Agent {
            client: opts.client,
            session: opts.session,
            poll_timeout: opts.poll_timeout,
            command: opts.command,
            handoff: opts.handoff,
            key: opts.key,
            stream: opts.stream,
            kill_grace: opts.kill_grace,
            context: opts.context,
            cancels,
            watch_client: Some(opts.watch_client),
            server_streams: None,
            stop,
            after: 0,
            epoch: None,
            synced: false,
            backoff: Backoff::new(),
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Serves until a stop signal (`Ok`) or a fatal error.
    fn run(&mut self) -> Result<(), String> {
        let url = self.client.url().http("");
        log::info!(url = url.as_str(), session_id = self.session.as_str(), command = self.command.join(" ").as_str(); "agent started");
        while !self.stopping() {
            match self.turn() {
                Ok(()) => self.backoff = Backoff::new(),
                Err(Fail::Retry {
                    why,
                    wait,
                    unreachable,
                }) => {
                    let delay = self.backoff.delay(wait);
                    let retry_ms = delay.as_millis() as u64;
                    if unreachable {
                        log::warn!(url = url.as_str(), error = why.as_str(), retry_ms = retry_ms; "cannot reach the server");
                    } else {
                        log::warn!(url = url.as_str(), error = why.as_str(), retry_ms = retry_ms; "request failed");
                    }
                    self.synced = false;
                    self.pause(delay);
                }
                Err(Fail::Fatal(why)) => return Err(why),
                Err(Fail::Stopped) => break,
            }
        }
        let path = format!("/agent/{}", self.session);
        gone(&mut self.client, &path);
        log::info!(session_id = self.session.as_str(); "agent stopped");
        Ok(())
    }

    /// Makes the agent ready to answer prompts of its session brought by
    /// another poll (`--all`): the session's epoch and whether it takes
    /// parts, and the watch for cancels up.
    pub(super) fn start_serving(&mut self) -> Result<(), Fail> {
        self.sync()?;
        self.watch()
    }

    /// The session's prompts still pending, by `client_msg_id`: read once
    /// the watch is up, so a prompt cancelled before it was is known.
    pub(super) fn pending_ids(&mut self) -> Result<Vec<String>, Fail> {
        let path = format!("/prompts/{}?wait=false", self.session);
        let resp =
            classify(
                self.client
                    .request("GET", &path, None, Limit::within(REQUEST_TIMEOUT)),
            )?;
        match resp.status {
            200 => serde_json::from_slice::<Vec<Prompt>>(&resp.body)
                .map(|list| list.into_iter().map(|p| p.client_msg_id).collect())
                .map_err(|e| retry(format!("unreadable prompt list: {e}"))),
            404 => Ok(Vec::new()),
            _ => Err(Fail::Fatal(format!("GET {path}: {}", resp.describe()))),
        }
    }

    /// Sleeps `delay` before retrying, waking early for a stop signal.
    pub(super) fn pause_for(&self, delay: Duration) {
        self.pause(delay);
    }

    /// One long-poll and the prompts it brought.
    fn turn(&mut self) -> Result<(), Fail> {
        if !self.synced {
            self.sync()?;
            self.watch()?;
        }
        let prompts = self.poll()?;
        if prompts.iter().any(|p| p.seq <= self.after) {
            // A prompt at or below the cursor: the session may have
            // started over under a new epoch while the poll was parked (a
            // shared store that restarted empty), its `seq` with it. Read
            // the epoch before deciding which prompts are new, or the new
            // epoch's first prompts would be taken for ones handled.
            self.sync()?;
        }
        // Idle: check the epoch before the next poll (cheap, once per poll timeout).
        self.synced = !prompts.is_empty();
        if prompts.iter().all(|p| p.seq <= self.after) && !prompts.is_empty() {
            // Only prompts already handled: never from a correct server, but
            // answering at once again would spin.
            return Err(retry("the server sent only prompts already handled"));
        }
        for prompt in prompts {
            if self.stopping() {
                break;
            }
            if prompt.seq > self.after {
                self.answer(&prompt)?;
            }
        }
        Ok(())
    }

    /// Starts the watch for cancels once the session exists, and waits for
    /// its first connection attempt, so that no cancel of a prompt the
    /// next poll brings comes before the watch is there.
    fn watch(&mut self) -> Result<(), Fail> {
        let Some(client) = self.watch_client.take() else {
            return Ok(());
        };
        watch::spawn(client, self.session.clone(), Arc::clone(&self.cancels))
            .map_err(|e| Fail::Fatal(format!("cannot start the watch for cancels: {e}")))?;
        self.cancels.wait_first(REQUEST_TIMEOUT);
        Ok(())
    }

    /// Done with the prompt of `seq` (answered, refused, cancelled): the
    /// cursor moves past it.
    fn handled(&mut self, seq: u64) {
        self.after = seq;
        self.cancels.set_cursor(seq, self.epoch.as_deref());
    }

    /// `PUT /sessions/{id}`: creates the session if needed and learns its epoch.
    fn sync(&mut self) -> Result<(), Fail> {
        let path = format!("/sessions/{}", self.session);
        let resp =
            classify(
                self.client
                    .request("PUT", &path, None, Limit::within(REQUEST_TIMEOUT)),
            )?;
        if resp.status != 200 {
            return Err(Fail::Fatal(format!("PUT {path}: {}", resp.describe())));
        }
        let epoch = resp
            .json()
            .and_then(|v| v["epoch"].as_str().map(str::to_string));
        if epoch != self.epoch {
            if self.epoch.is_some() {
                log::info!(session_id = self.session.as_str(); "the session is new on the server: reading its prompts from the start");
            }
            self.after = 0;
            self.epoch = epoch;
            self.cancels.set_cursor(0, self.epoch.as_deref());
        }
        if self.stream {
            self.check_streaming()?;
        }
        self.synced = true;
        Ok(())
    }

    /// Whether the server takes streamed parts: one that answers
    /// `GET /sessions/{id}` does (both came with streamed answers). Asked
    /// at every `sync`, so a server replaced by another version is seen.
    fn check_streaming(&mut self) -> Result<(), Fail> {
        let path = format!("/sessions/{}", self.session);
        let resp =
            classify(
                self.client
                    .request("GET", &path, None, Limit::within(REQUEST_TIMEOUT)),
            )?;
        let streams = resp.status == 200 && resp.json().is_some_and(|v| v.get("agent").is_some());
        if self.server_streams != Some(streams) {
            if streams {
                log::debug!(session_id = self.session.as_str(); "the server takes streamed parts");
            } else {
                log::info!(session_id = self.session.as_str(); "the server does not take streamed parts: answers are posted whole");
            }
        }
        self.server_streams = Some(streams);
        Ok(())
    }

    /// `GET /prompts/{id}`, parked until a prompt, the timeout or a signal.
    fn poll(&mut self) -> Result<Vec<Prompt>, Fail> {
        let path = format!(
            "/prompts/{}?timeout={}&after={}",
            self.session,
            self.poll_timeout.as_secs_f64(),
            self.after
        );
        let limit = Limit {
            timeout: self.poll_timeout + POLL_MARGIN,
            cancel: Some(&*self.stop),
        };
        let resp = classify(self.client.request("GET", &path, None, limit))?;
        match resp.status {
            200 => serde_json::from_slice(&resp.body)
                .map_err(|e| retry(format!("unreadable prompt list: {e}"))),
            404 => Err(retry(format!("{}: creating the session", resp.describe()))),
            _ => Err(Fail::Fatal(format!("GET /prompts: {}", resp.describe()))),
        }
    }

    /// Answers `prompt` with an error answer (`metadata.error`) without
    /// running the command.
    fn refuse(&mut self, prompt: &Prompt, error: &str) -> Result<(), Fail> {
        // `exit_code: null`: every error answer has both fields, and no
        // command ran.
        let reply = Reply {
            text: "cannot decrypt".to_string(),
            metadata: Some(json!({ "error": error, "exit_code": null })),
            exit_code: None,
        };
        self.post(prompt, &reply)?;
        self.handled(prompt.seq);
        Ok(())
    }

    /// Passes over a prompt cancelled before its command started.
    fn skip(&mut self, prompt: &Prompt) -> Result<(), Fail> {
        log::info!(session_id = self.session.as_str(), client_msg_id = prompt.client_msg_id.as_str(); "prompt cancelled before it started: skipped");
        self.handled(prompt.seq);
        Ok(())
    }

    /// Runs the command for one prompt and posts its answer; with a key,
    /// decrypts the prompt first (one that does not decrypt is answered
    /// with an error and not run) and encrypts the answer.
    pub(super) fn answer(&mut self, prompt: &Prompt) -> Result<(), Fail> {
        let id = prompt.client_msg_id.as_str();
        if self.cancels.is_cancelled(id) {
            return self.skip(prompt);
        }
        let clear = match &self.key {
            // An encrypted prompt is not run as ciphertext: the agent was
            // started without the key the sender used.
            None if prompt.prompt.starts_with(e2e::PREFIX) => {
                log::warn!(session_id = self.session.as_str(), client_msg_id = id; "the prompt is end-to-end encrypted and this agent has no key: answered with an error, not run");
                let error = "the prompt is end-to-end encrypted: start the agent with --e2e-key";
                return self.refuse(prompt, error);
            }
            None => prompt.prompt.clone(),
            Some(key) => {
                let message = e2e::Message::Prompt {
                    session: &self.session,
                    client_msg_id: id,
                };
                match key.open(&prompt.prompt, message) {
                    Some(text) => text,
                    None => {
                        log::warn!(session_id = self.session.as_str(), client_msg_id = id; "cannot decrypt the prompt: answered with an error, not run");
                        let error = "cannot decrypt the prompt: it was sent without the agent's end-to-end key, or with another";
                        return self.refuse(prompt, error);
                    }
                }
            }
        };
        let metadata = metadata_env(prompt.metadata.as_ref());
        if metadata == "null" {
            log::warn!(session_id = self.session.as_str(), client_msg_id = prompt.client_msg_id.as_str(); "metadata too large for the environment: RELAY_METADATA is null");
        }
        // The server's address as the agent reached it, so the command can
        // read the conversation (`$RELAY_URL/messages/...`) without a
        // hard-coded address.
        let url = self.client.url().http("");
        // Kept until the command has ended, then removed.
        let context_file = self.context_file(prompt)?;
        let context_path = context_file
            .as_ref()
            .map(|f| f.path().to_string_lossy().into_owned());
        let mut env = vec![
            ("RELAY_URL", url.as_str()),
            ("RELAY_SESSION_ID", self.session.as_str()),
            ("RELAY_CLIENT_MSG_ID", prompt.client_msg_id.as_str()),
            ("RELAY_METADATA", metadata.as_str()),
        ];
        env.extend(self.handoff.iter().map(|(k, v)| (*k, v.as_str())));
        if let Some(path) = &context_path {
            env.push(("RELAY_CONTEXT_FILE", path.as_str()));
        }
        let assistant_msg_id = answer_id(&self.session, id);
        let answer = parts::Answer {
            session: &self.session,
            client_msg_id: id,
            assistant_msg_id: &assistant_msg_id,
        };
        let mut parts = (self.stream && self.server_streams == Some(true))
            .then(|| Parts::new(&mut self.client, answer, self.key.as_ref()));
        let stop = command::Stop::new(self.kill_grace);
        if !self.cancels.start(id, stop.stopper()) {
            return self.skip(prompt);
        }
        let ran = command::run(&self.command, &env, clear.as_bytes(), stop, &mut |batch| {
            if let Some(parts) = parts.as_mut() {
                parts.output(batch);
            }
        });
        self.cancels.finish();
        drop(context_file);
        if let Some(parts) = parts.filter(|p| p.posted() > 0) {
            log::debug!(session_id = self.session.as_str(), client_msg_id = id, parts = parts.posted(); "answer streamed");
        }
        let outcome = match ran {
            Ok(outcome) => outcome,
            Err(e) => {
                // Checked at start, so removed or broken since (a bad
                // interpreter line, a full process table): the person
                // waiting hears why, and the next prompt tries again.
                let error = format!("cannot start {}: {e}", self.command[0]);
                log::error!(session_id = self.session.as_str(), client_msg_id = id, error = error.as_str(); "command not started: answered with an error");
                let reply = self.error_reply(prompt, &error)?;
                self.post(prompt, &reply)?;
                self.handled(prompt.seq);
                return Ok(());
            }
        };
        if outcome.stopped || self.cancels.is_cancelled(id) {
            // Cancelled while it ran, or since it ended: its output is no
            // answer, and the server would refuse one.
            log::info!(session_id = self.session.as_str(), client_msg_id = id, stopped = outcome.stopped; "prompt cancelled: nothing posted");
            self.handled(prompt.seq);
            return Ok(());
        }
        if self.stopping() && matches!(outcome.exit, Exit::Signal(_)) {
            // Most likely the same Ctrl-C reached the command: its output is
            // not an answer. The prompt stays pending for the next run.
            log::warn!(session_id = self.session.as_str(), client_msg_id = prompt.client_msg_id.as_str(); "command killed while stopping: prompt left unanswered");
            return Err(Fail::Stopped);
        }
        let reply = self.reply(prompt, &outcome)?;
        self.post(prompt, &reply)?;
        self.handled(prompt.seq);
        Ok(())
    }

    /// With `--context`, the conversation up to `prompt` in a new file;
    /// a failure to read it is retried like the poll (the prompt stays
    /// pending until it is handled).
    fn context_file(&mut self, prompt: &Prompt) -> Result<Option<ContextFile>, Fail> {
        if self.context == 0 {
            return Ok(None);
        }
        let path = context::path(&self.session, prompt.seq, self.context);
        let resp =
            classify(
                self.client
                    .request("GET", &path, None, Limit::within(REQUEST_TIMEOUT)),
            )?;
        if resp.status != 200 {
            return Err(retry(format!("GET /messages: {}", resp.describe())));
        }
        let text = context::lines(&resp.body, &self.session, prompt.seq, self.key.as_ref())
            .map_err(retry)?;
        ContextFile::create(&text)
            .map(Some)
            .map_err(|e| Fail::Fatal(format!("cannot write the context file: {e}")))
    }

    /// The error answer for a command that could not start: no text,
    /// `exit_code: null` (there is none).
    fn error_reply(&self, prompt: &Prompt, error: &str) -> Result<Reply, Fail> {
        let metadata = json!({ "error": error, "exit_code": null });
        self.seal_reply(prompt, String::new(), metadata, None)
    }

    /// The answer to post for a command's outcome: an error answer for a
    /// failed run; encrypted when there is a key, whose error then carries
    /// no stderr (metadata travels in clear, and stderr may quote the
    /// prompt).
    fn reply(&self, prompt: &Prompt, outcome: &Outcome) -> Result<Reply, Fail> {
        let exit_code = Some(match outcome.exit {
            Exit::Code(c) => i64::from(c),
            Exit::Signal(s) => 128 + i64::from(s),
        });
        let metadata = outcome.metadata(self.key.is_none());
        if self.key.is_none() {
            return Ok(Reply {
                text: outcome.text.clone(),
                metadata,
                exit_code,
            });
        }
        let metadata = metadata.unwrap_or_else(|| json!({}));
        self.seal_reply(prompt, outcome.text.clone(), metadata, exit_code)
    }

    /// `text` and `metadata` as posted: as they are without a key; with
    /// one, the text encrypted (cut to what fits encrypted, then
    /// `metadata.truncated`) and `metadata.e2e` set.
    fn seal_reply(
        &self,
        prompt: &Prompt,
        mut text: String,
        mut metadata: serde_json::Value,
        exit_code: Option<i64>,
    ) -> Result<Reply, Fail> {
        let Some(key) = &self.key else {
            return Ok(Reply {
                text,
                metadata: Some(metadata),
                exit_code,
            });
        };
        let cut = e2e::cut(&mut text, e2e::MAX_CLEAR_BYTES);
        metadata["e2e"] = json!(1);
        if cut {
            metadata["truncated"] = json!(true);
        }
        let assistant_msg_id = answer_id(&self.session, &prompt.client_msg_id);
        let message = e2e::Message::Answer {
            session: &self.session,
            client_msg_id: &prompt.client_msg_id,
            assistant_msg_id: &assistant_msg_id,
        };
        let text = key.seal(&text, message).map_err(Fail::Fatal)?;
        Ok(Reply {
            text,
            metadata: Some(metadata),
            exit_code,
        })
    }

    /// `POST /response`, retried until the server has it (or a stop signal's
    /// grace ends). Resending is safe: the id makes it a duplicate.
    fn post(&mut self, prompt: &Prompt, reply: &Reply) -> Result<(), Fail> {
        let mut body = json!({
            "session_id": self.session,
            "client_msg_id": prompt.client_msg_id,
            "assistant_msg_id": answer_id(&self.session, &prompt.client_msg_id),
            "text": reply.text,
        });
        if let Some(meta) = &reply.metadata {
            body["metadata"] = meta.clone();
        }
        let body = body.to_string().into_bytes();
        let mut backoff = Backoff::new();
        let mut give_up: Option<Instant> = None;
        loop {
            let result = self.client.request(
                "POST",
                "/response",
                Some(&body),
                Limit::within(REQUEST_TIMEOUT),
            );
            match classify(result) {
                Ok(resp) => return self.posted(prompt, reply, &resp),
                Err(Fail::Retry { why, wait, .. }) => {
                    let now = Instant::now();
                    if self.stopping() && now >= *give_up.get_or_insert(now + STOP_GRACE) {
                        log::warn!(session_id = self.session.as_str(), client_msg_id = prompt.client_msg_id.as_str(), error = why.as_str(); "answer not posted before stopping: the prompt stays pending");
                        return Err(Fail::Stopped);
                    }
                    let delay = backoff.delay(wait);
                    log::warn!(error = why.as_str(), retry_ms = delay.as_millis() as u64; "posting the answer failed");
                    std::thread::sleep(delay);
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// What the server said to an answer; every outcome but a fatal one
    /// moves on to the next prompt.
    fn posted(&self, prompt: &Prompt, reply: &Reply, resp: &Response) -> Result<(), Fail> {
        let id = prompt.client_msg_id.as_str();
        let exit_code = reply.exit_code.unwrap_or(-1);
        let error = reply
            .metadata
            .as_ref()
            .is_some_and(|m| m.get("error").is_some());
        match resp.status {
            200 => {
                let duplicate = resp.json().is_some_and(|v| v["duplicate"] == true);
                log::info!(session_id = self.session.as_str(), client_msg_id = id, exit_code = exit_code, error = error, duplicate = duplicate; "prompt answered");
            }
            409 if resp
                .json()
                .is_some_and(|v| v["details"] == "prompt cancelled") =>
            {
                log::info!(session_id = self.session.as_str(), client_msg_id = id; "prompt cancelled: the answer came too late");
            }
            409 => {
                log::info!(session_id = self.session.as_str(), client_msg_id = id; "prompt already answered with a different text");
            }
            404 => {
                log::warn!(session_id = self.session.as_str(), client_msg_id = id, error = resp.describe().as_str(); "prompt gone before its answer");
            }
            _ => {
                log::error!(session_id = self.session.as_str(), client_msg_id = id, error = resp.describe().as_str(); "answer refused");
            }
        }
        Ok(())
    }

    /// Sleeps `delay`, waking early for a stop signal.
    fn pause(&self, delay: Duration) {
        let end = Instant::now() + delay;
        while !self.stopping() {
            let Some(left) = end.checked_duration_since(Instant::now()) else {
                return;
            };
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }
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

    #[test]
    fn answer_ids_are_stable_short_and_distinct() {
        let long = "x".repeat(256);
        let a = answer_id("s", &long);
        assert_eq!(a, answer_id("s", &long));
        assert_eq!(a.len(), 36);
        assert_eq!(a.as_bytes()[14], b'5', "a name-based (v5) UUID: {a}");
        assert_ne!(a, answer_id("s", "x"));
        assert_ne!(answer_id("s1", "m"), answer_id("s", "1\nm"));
    }

    #[test]
    fn metadata_reaches_the_environment_when_it_fits() {
        assert_eq!(metadata_env(None), "{}");
        let m = json!({"model": "x", "n": [1, 2]});
        assert_eq!(metadata_env(Some(&m)), r#"{"model":"x","n":[1,2]}"#);
        let big = json!({ "k": "x".repeat(MAX_METADATA_ENV) });
        assert_eq!(metadata_env(Some(&big)), "null");
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_honours_retry_after() {
        let mut b = Backoff::new();
        let delays: Vec<u128> = (0..8).map(|_| b.delay(None).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        let mut b = Backoff::new();
        assert_eq!(
            b.delay(Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        assert_eq!(b.delay(Some(Duration::from_secs(600))), RETRY_AFTER_MAX);
    }

    #[test]
    fn failures_are_sorted_by_what_retrying_can_do() {
        let resp = |status| {
            Ok(Response {
                status,
                body: br#"{"error":"x"}"#.to_vec(),
                retry_after: None,
            })
        };
        assert!(matches!(classify(resp(503)), Err(Fail::Retry { .. })));
        assert!(matches!(classify(resp(429)), Err(Fail::Retry { .. })));
        assert!(matches!(classify(resp(401)), Err(Fail::Fatal(_))));
        assert!(classify(resp(409)).is_ok());
        assert!(matches!(
            classify(Err(client::Error::Cancelled)),
            Err(Fail::Stopped)
        ));
        assert!(matches!(
            classify(Err(client::Error::TimedOut)),
            Err(Fail::Retry { .. })
        ));
    }
}
