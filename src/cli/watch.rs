//! `relay agent`'s watch for cancels: a second connection to the server,
//! the session's WebSocket, read by a thread of its own while the agent
//! polls and runs commands. A `cancel` frame for the prompt whose command
//! runs stops that command at once (see [`Stopper`]); one for a prompt not
//! started yet is remembered, and the agent skips that prompt.
//!
//! No cancel is missed across reconnects: the socket reconnects with
//! `after` set to the last `seq` it saw, and never above the agent's own
//! cursor (every prompt the agent may still run has a greater `seq`, so
//! its cancel has one too), with the session's `epoch`, so a session that
//! is new on the server is replayed from its start (a `resync`). The first
//! connection is live only: the agent polls after it is up, so a cancel
//! made before it was up is of a prompt no longer pending.
//!
//! Idle, the watch costs one connection: the thread blocks in a read, and
//! a Ping goes out only after a long silence, to find a dead connection.
//! An agent serving many sessions watches each only while it has prompts
//! of it: [`Cancels::retire`] then closes the socket and ends the thread.

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tungstenite::protocol::{Role, WebSocketConfig};
use tungstenite::{Message, WebSocket};

use super::client::{Client, Stream, Upgraded};
use super::command::Stopper;
use super::fail::Backoff;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Silence after which a Ping is sent (the server's own pings come every
/// 30 s by default, so a live connection is rarely quiet this long).
const QUIET: Duration = Duration::from_secs(40);
/// Silence after which the connection counts as dead and is replaced.
const DEAD: Duration = Duration::from_secs(90);
/// Cancels remembered for prompts the agent may still fetch: a bound on
/// memory, far above the prompts one poll brings in practice.
const MAX_REMEMBERED: usize = 4096;
/// Largest frame accepted: an answer replayed on reconnect is at most 128
/// KiB of text plus its metadata.
const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// What the watch and the agent share.
#[derive(Default)]
pub struct Cancels {
    state: Mutex<State>,
    /// Signalled when the first connection attempt ended.
    tried: Condvar,
}

#[derive(Default)]
struct State {
    /// Cancelled prompts seen, oldest first, at most [`MAX_REMEMBERED`].
    seen: VecDeque<String>,
    /// The prompt whose command runs, and how to stop it.
    running: Option<(String, Stopper)>,
    /// The agent's cursor: every prompt it may still run has a greater `seq`.
    floor: u64,
    /// The session's epoch as the agent last read it.
    epoch: Option<String>,
    tried: bool,
    /// Set by [`Cancels::retire`]: the watch ends.
    retired: bool,
    /// The watch's socket while connected, for `retire` to shut.
    socket: Option<std::net::TcpStream>,
}

impl Cancels {
    pub fn new() -> Arc<Cancels> {
        Arc::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether prompt `id` was cancelled. Asked before a prompt starts and
    /// before its answer is posted.
    pub fn is_cancelled(&self, id: &str) -> bool {
        self.lock().seen.iter().any(|s| s == id)
    }

    /// Registers the run of prompt `id`, which `stopper` stops; `false`
    /// (nothing registered) when it is cancelled already.
    pub fn start(&self, id: &str, stopper: Stopper) -> bool {
        let mut state = self.lock();
        if state.seen.iter().any(|s| s == id) {
            return false;
        }
        state.running = Some((id.to_string(), stopper));
        true
    }

    /// The run registered by `start` ended.
    pub fn finish(&self) {
        self.lock().running = None;
    }

    /// Stops the command that runs, if one does: the agent's second stop
    /// signal, since the command's own group does not get the terminal's.
    pub fn stop_running(&self) {
        if let Some((_, stopper)) = &self.lock().running {
            stopper.stop();
        }
    }

    /// Ends the watch: its connection is shut (which ends its blocked
    /// read) and its thread returns. Called when the session has no more
    /// prompts for the agent.
    pub fn retire(&self) {
        let mut state = self.lock();
        state.retired = true;
        if let Some(socket) = state.socket.take() {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }

    fn retired(&self) -> bool {
        self.lock().retired
    }

    /// The agent's cursor and epoch, after each prompt and each epoch read.
    pub fn set_cursor(&self, after: u64, epoch: Option<&str>) {
        let mut state = self.lock();
        state.floor = after;
        state.epoch = epoch.map(str::to_string);
    }

    /// Waits (at most `limit`) until the watch's first connection attempt
    /// ended, so that the agent's first poll comes after it.
    pub fn wait_first(&self, limit: Duration) {
        let state = self.lock();
        let _unused = self
            .tried
            .wait_timeout_while(state, limit, |s| !s.tried)
            .unwrap_or_else(|e| e.into_inner());
    }

    fn attempted(&self) {
        self.lock().tried = true;
        self.tried.notify_all();
    }

    /// A `cancel` frame for prompt `id`: remembered, and its command
    /// stopped if it runs.
    fn cancelled(&self, id: &str) {
        let mut state = self.lock();
        if let Some((running, stopper)) = &state.running
            && running == id
        {
            stopper.stop();
        }
        if !state.seen.iter().any(|s| s == id) {
            if state.seen.len() >= MAX_REMEMBERED {
                state.seen.pop_front();
            }
            state.seen.push_back(id.to_string());
        }
    }
}

/// Starts the watch of `session`'s WebSocket on a thread of its own; it
/// runs until the process ends.
pub fn spawn(client: Client, session: String, cancels: Arc<Cancels>) -> std::io::Result<()> {
    let watch = Watch {
        client,
        session,
        cancels,
        last_seen: None,
        tried_once: false,
    };
    std::thread::Builder::new()
        .name("cancel-watch".into())
        .spawn(move || watch.run())
        .map(drop)
}

struct Watch {
    client: Client,
    session: String,
    cancels: Arc<Cancels>,
    /// The greatest `seq` a frame carried, and the epoch it belongs to.
    last_seen: Option<(u64, Option<String>)>,
    /// Whether a connection was tried: only the first one is live only.
    tried_once: bool,
}

impl Watch {
    fn run(mut self) {
        let mut backoff = Backoff::new();
        let mut failing = false;
        while !self.cancels.retired() {
            match self.connect() {
                Ok(ws) => {
                    self.cancels.attempted();
                    backoff = Backoff::new();
                    if failing {
                        log::info!(session_id = self.session.as_str(); "watching for cancels again");
                    } else {
                        log::debug!(session_id = self.session.as_str(); "watching for cancels");
                    }
                    failing = false;
                    let why = self.read(ws);
                    if self.cancels.retired() {
                        break;
                    }
                    log::warn!(session_id = self.session.as_str(), error = why.as_str(); "the watch for cancels lost its connection: reconnecting");
                }
                Err(why) => {
                    self.cancels.attempted();
                    if self.cancels.retired() {
                        break;
                    }
                    let delay = backoff.delay(None);
                    if failing {
                        log::debug!(error = why.as_str(), retry_ms = delay.as_millis() as u64; "cannot watch for cancels");
                    } else {
                        log::warn!(error = why.as_str(), retry_ms = delay.as_millis() as u64; "cannot watch for cancels");
                    }
                    failing = true;
                    std::thread::sleep(delay);
                }
            }
        }
    }

    /// The path to subscribe with: live only the first time, else from
    /// the cursor (see the module's comment).
    fn path(&mut self) -> String {
        let (floor, epoch) = {
            let state = self.cancels.lock();
            (state.floor, state.epoch.clone())
        };
        if self.last_seen.as_ref().is_some_and(|(_, e)| *e != epoch) {
            // The agent found the session new: what was seen is of the old one.
            self.last_seen = None;
        }
        let mut path = format!("/ws/{}", self.session);
        if !std::mem::replace(&mut self.tried_once, true) {
            return path;
        }
        let after = self.last_seen.as_ref().map_or(0, |(s, _)| *s).max(floor);
        path.push_str(&format!("?after={after}"));
        if let Some(epoch) = epoch {
            path.push_str(&format!("&epoch={epoch}"));
        }
        path
    }

    fn connect(&mut self) -> Result<WebSocket<Stream>, String> {
        let path = self.path();
        let (stream, read) = match self.client.upgrade(&path, CONNECT_TIMEOUT) {
            Ok(Upgraded::Open(stream, read)) => (stream, read),
            Ok(Upgraded::Refused(resp)) => return Err(format!("refused: {}", resp.describe())),
            Err(e) => return Err(e.to_string()),
        };
        let tcp = stream.tcp();
        {
            let mut state = self.cancels.lock();
            if state.retired {
                return Err("retired".into());
            }
            state.socket = tcp.try_clone().ok();
        }
        tcp.set_read_timeout(Some(QUIET))
            .and_then(|()| tcp.set_write_timeout(Some(CONNECT_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        Ok(WebSocket::from_partially_read(
            stream,
            read,
            Role::Client,
            Some(config),
        ))
    }

    /// Reads frames until the connection ends; returns why it ended.
    fn read(&mut self, mut ws: WebSocket<Stream>) -> String {
        let mut heard = Instant::now();
        loop {
            match ws.read() {
                Ok(Message::Text(frame)) => {
                    heard = Instant::now();
                    self.frame(frame.as_str());
                }
                Ok(Message::Close(_)) | Err(tungstenite::Error::ConnectionClosed) => {
                    return "the server closed it".into();
                }
                Ok(_) => heard = Instant::now(),
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    if heard.elapsed() >= DEAD {
                        return format!("nothing heard for {} s", DEAD.as_secs());
                    }
                    if let Err(e) = ws.send(Message::Ping(Vec::new().into())) {
                        return e.to_string();
                    }
                }
                Err(tungstenite::Error::Io(e)) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return e.to_string(),
            }
        }
    }

    /// One text frame: a cancel is passed on; every stored message moves
    /// the cursor; a `resync` starts it over in the session's new epoch.
    fn frame(&mut self, frame: &str) {
        let Ok(v) = serde_json::from_str::<Value>(frame) else {
            return;
        };
        let epoch = self.cancels.lock().epoch.clone();
        match v["type"].as_str() {
            Some("resync") => {
                let first = v["first_seq"].as_u64().unwrap_or(1);
                let epoch = v["epoch"].as_str().map(str::to_string);
                self.last_seen = Some((first.saturating_sub(1), epoch));
                return;
            }
            Some("cancel") => {
                if let Some(id) = v["data"]["client_msg_id"].as_str() {
                    log::debug!(client_msg_id = id; "cancel seen");
                    self.cancels.cancelled(id);
                }
            }
            _ => {}
        }
        if let Some(seq) = v["data"]["seq"].as_u64() {
            let last = self.last_seen.get_or_insert((0, epoch));
            last.0 = last.0.max(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::command::Stop;

    #[test]
    fn a_cancel_before_the_start_skips_and_one_during_the_run_stops() {
        let cancels = Cancels::new();
        cancels.cancelled("m1");
        let stop = Stop::new(Duration::from_secs(5));
        assert!(cancels.is_cancelled("m1"));
        assert!(!cancels.start("m1", stop.stopper()));
        assert!(cancels.start("m2", stop.stopper()));
        cancels.cancelled("m2");
        assert!(cancels.is_cancelled("m2"));
        cancels.finish();
        assert!(cancels.lock().running.is_none());
    }

    #[test]
    fn remembered_cancels_are_bounded() {
        let cancels = Cancels::new();
        for i in 0..MAX_REMEMBERED + 10 {
            cancels.cancelled(&format!("m{i}"));
        }
        cancels.cancelled("m20");
        assert_eq!(cancels.lock().seen.len(), MAX_REMEMBERED);
        assert!(!cancels.is_cancelled("m0"));
        assert!(cancels.is_cancelled(&format!("m{}", MAX_REMEMBERED + 9)));
    }
}
