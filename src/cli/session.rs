//! The agent of one session: long-polls it and runs a command once per
//! prompt, in `seq` order, posting its stdout as the answer (`relay agent
//! --session`, and each worker of `relay agent --all`).
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

use super::agent::Options;
use super::client::{Client, Limit, Response};
use super::command::{self, Exit, Outcome};
use super::context::{self, ContextFile};
use super::e2e;
use super::fail::{Backoff, Fail, classify, gone, retry};
use super::parts::{self, Parts};
use super::watch::{self, Cancels};

/// Every request but the long-poll.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How much longer than its `timeout` a long-poll may take to be answered.
pub(super) const POLL_MARGIN: Duration = Duration::from_secs(15);
/// After a stop signal, how long posting the answer in hand is retried.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// Larger metadata is not put in the command's environment: Linux refuses
/// to start a program with a variable above 128 KiB.
const MAX_METADATA_ENV: usize = 64 * 1024;
/// The namespace of the agent's name-based answer ids.
const ANSWER_NAMESPACE: uuid::Uuid = uuid::uuid!("0eead76b-5401-44fc-899f-6ad5c502f7dd");

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
    /// Whether that is known without asking (see [`Agent::for_every`]).
    streams_known: bool,
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
            streams_known: false,
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
    pub(super) fn run(&mut self) -> Result<(), String> {
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

    /// The agent of a session served by `--all`: the server answered the
    /// all-sessions poll, which came after streamed answers, so it takes
    /// parts, and `sync` need not ask each session's `GET /sessions/{id}`.
    pub(super) fn for_every(mut self) -> Agent {
        self.server_streams = Some(true);
        self.streams_known = true;
        self
    }

    /// The agent's connection, kept for the worker's next session.
    pub(super) fn into_client(self) -> Client {
        self.client
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
        if self.stream && !self.streams_known {
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
    use serde_json::json;

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
}
