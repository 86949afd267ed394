//! `relay agent --all` and `--prefix P`: one agent for every session its
//! token opens.
//!
//! One long-poll, `GET /prompts?after=<cursor>`, brings the prompts of
//! every session in arrival order, each with its `session_id` and an
//! opaque `cursor`; the next poll asks only for later ones, so the poll
//! goes on while commands run. Each prompt joins its session's queue.
//! `--jobs` worker threads take a session each and answer its queue in
//! order, so one session's prompts never run side by side while up to
//! `--jobs` sessions run at once.
//!
//! A worker serves a session with the one-session agent (`Agent`) over
//! the worker's one keep-alive connection: streamed parts, error answers,
//! keys, and its watch for cancels (a connection of its own), started
//! when the session gets a worker and retired when its queue is empty. Prompts cancelled before the watch was up are no longer
//! pending on the server, so the worker reads the session's pending set
//! once the watch is up and passes over the others.
//!
//! A stop signal ends the poll at once; every worker finishes the prompt
//! in hand (queued ones stay pending for the next agent), then the agent
//! tells the server it is gone (`DELETE /agent`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use serde::Deserialize;

use super::agent::{Options, Running, Serve};
use super::client::{Client, Limit};
use super::fail::{self, Backoff, Fail, classify, retry};
use super::session::{Agent, POLL_MARGIN, Prompt};
use super::watch::Cancels;

/// One prompt of the all-sessions poll.
#[derive(Debug, Deserialize)]
struct Listed {
    session_id: String,
    cursor: String,
    #[serde(flatten)]
    prompt: Prompt,
}

/// The queues the poll fills and the workers drain.
#[derive(Default)]
struct Queues {
    /// Prompts not started, by session, in arrival order.
    waiting: HashMap<String, VecDeque<Prompt>>,
    /// Sessions with waiting prompts and no worker, oldest first.
    ready: VecDeque<String>,
    /// Sessions a worker serves.
    busy: HashSet<String>,
    /// `(session, client_msg_id)` of every prompt queued or running: a
    /// prompt listed again (a poll retried with an older cursor) is not
    /// run twice.
    known: HashSet<(String, String)>,
    /// Set on a stop signal or a fatal error: workers take nothing more.
    closing: bool,
    /// The first fatal error, which ends the agent.
    fatal: Option<String>,
}

struct Shared {
    queues: Mutex<Queues>,
    /// Signalled when a session becomes ready or the agent closes.
    wake: Condvar,
    stop: Arc<AtomicBool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues the prompts of one poll, in order.
    fn add(&self, listed: Vec<Listed>) {
        let mut q = self.lock();
        for item in listed {
            let key = (item.session_id.clone(), item.prompt.client_msg_id.clone());
            if !q.known.insert(key) {
                continue;
            }
            let sid = item.session_id;
            q.waiting
                .entry(sid.clone())
                .or_default()
                .push_back(item.prompt);
            if !q.busy.contains(&sid) && !q.ready.contains(&sid) {
                q.ready.push_back(sid);
            }
        }
        self.wake.notify_all();
    }

    /// Ends the agent: no new work, and `why` reported when fatal.
    fn close(&self, fatal: Option<String>) {
        let mut q = self.lock();
        q.closing = true;
        if q.fatal.is_none() {
            q.fatal = fatal;
        }
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_all();
    }

    /// Blocks until a session is ready for this worker (it is then busy),
    /// or the agent closes (`None`).
    fn next_session(&self) -> Option<String> {
        let mut q = self.lock();
        loop {
            if q.closing {
                return None;
            }
            if let Some(sid) = q.ready.pop_front() {
                q.busy.insert(sid.clone());
                return Some(sid);
            }
            q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The next prompt of a busy session; `None` when its queue is empty
    /// (it is then no longer busy) or the agent closes.
    fn next_prompt(&self, sid: &str) -> Option<Prompt> {
        let mut q = self.lock();
        let next = if q.closing {
            None
        } else {
            q.waiting.get_mut(sid).and_then(VecDeque::pop_front)
        };
        if next.is_none() {
            q.busy.remove(sid);
            if q.waiting.get(sid).is_some_and(VecDeque::is_empty) {
                q.waiting.remove(sid);
            }
        }
        next
    }

    /// Done with a prompt: a later listing of it may run it again.
    fn done(&self, sid: &str, client_msg_id: &str) {
        self.lock()
            .known
            .remove(&(sid.to_string(), client_msg_id.to_string()));
    }
}

/// Serves every session the token opens (or those starting with the
/// prefix) until a stop signal (`Ok`) or a fatal error.
pub fn run(opts: Options, stop: Arc<AtomicBool>, running: Running) -> Result<(), String> {
    let Serve::Many { prefix, jobs } = opts.serve.clone() else {
        return Err("not an agent for many sessions".into());
    };
    let url = opts.client.url().http("");
    log::info!(url = url.as_str(), prefix = prefix.as_deref().unwrap_or(""), jobs = jobs, command = opts.command.join(" ").as_str(); "agent started for every session");
    let shared = Arc::new(Shared {
        queues: Mutex::default(),
        wake: Condvar::new(),
        stop: Arc::clone(&stop),
    });
    let opts = Arc::new(opts);
    let mut workers = Vec::with_capacity(jobs);
    for i in 0..jobs {
        let (shared, opts, running) = (Arc::clone(&shared), Arc::clone(&opts), running.clone());
        let worker = std::thread::Builder::new()
            .name(format!("agent-job-{i}"))
            .spawn(move || work(&shared, &opts, &running))
            .map_err(|e| format!("cannot start a worker: {e}"))?;
        workers.push(worker);
    }
    let mut client = opts.client.fresh();
    poll_loop(&mut client, &opts, prefix.as_deref(), &shared);
    shared.close(None);
    for worker in workers {
        let _ = worker.join();
    }
    fail::gone(&mut client, "/agent");
    let fatal = shared.lock().fatal.take();
    match fatal {
        Some(why) => Err(why),
        None => {
            log::info!("agent stopped");
            Ok(())
        }
    }
}

/// Long-polls for every session's prompts until the agent stops.
fn poll_loop(client: &mut Client, opts: &Options, prefix: Option<&str>, shared: &Shared) {
    let url = client.url().http("");
    let mut after: Option<String> = None;
    let mut backoff = Backoff::new();
    while !shared.stop.load(Ordering::SeqCst) {
        match poll(client, opts, after.as_deref(), &shared.stop) {
            Ok(listed) => {
                backoff = Backoff::new();
                if let Some(last) = listed.last() {
                    after = Some(last.cursor.clone());
                }
                let listed = listed
                    .into_iter()
                    .filter(|l| prefix.is_none_or(|p| l.session_id.starts_with(p)))
                    .collect();
                shared.add(listed);
            }
            Err(Fail::Retry {
                why,
                wait,
                unreachable,
            }) => {
                let delay = backoff.delay(wait);
                let retry_ms = delay.as_millis() as u64;
                if unreachable {
                    log::warn!(url = url.as_str(), error = why.as_str(), retry_ms = retry_ms; "cannot reach the server");
                } else {
                    log::warn!(url = url.as_str(), error = why.as_str(), retry_ms = retry_ms; "request failed");
                }
                pause(&shared.stop, delay);
            }
            Err(Fail::Fatal(why)) => return shared.close(Some(why)),
            Err(Fail::Stopped) => return,
        }
    }
}

/// `GET /prompts?timeout=…[&after=cursor]`, parked until a prompt of any
/// session, the timeout or a signal.
fn poll(
    client: &mut Client,
    opts: &Options,
    after: Option<&str>,
    stop: &AtomicBool,
) -> Result<Vec<Listed>, Fail> {
    let mut path = format!("/prompts?timeout={}", opts.poll_timeout.as_secs_f64());
    if let Some(cursor) = after {
        path.push_str("&after=");
        path.push_str(&escape(cursor));
    }
    let limit = Limit {
        timeout: opts.poll_timeout + POLL_MARGIN,
        cancel: Some(stop),
    };
    let resp = classify(client.request("GET", &path, None, limit))?;
    match resp.status {
        200 => serde_json::from_slice(&resp.body)
            .map_err(|e| retry(format!("unreadable prompt list: {e}"))),
        // A server without the all-sessions poll: nothing to wait for.
        _ => Err(Fail::Fatal(format!("GET /prompts: {}", resp.describe()))),
    }
}

/// A worker: serves one ready session at a time until the agent closes.
fn work(shared: &Shared, opts: &Options, running: &Running) {
    // One keep-alive connection for every session this worker serves.
    let mut client = opts.client.fresh();
    while let Some(sid) = shared.next_session() {
        let cancels = Cancels::new();
        running.add(&cancels);
        let mut agent = Agent::new(
            opts.for_session(&sid, client),
            Arc::clone(&shared.stop),
            Arc::clone(&cancels),
        )
        .for_every();
        let result = serve(shared, &mut agent, &sid);
        cancels.retire();
        client = agent.into_client();
        if let Err(Fail::Fatal(why)) = result {
            shared.close(Some(why));
        }
    }
}

/// Answers the queue of session `sid` in order, until it is empty.
fn serve(shared: &Shared, agent: &mut Agent, sid: &str) -> Result<(), Fail> {
    retrying(shared, agent, |a| a.start_serving())?;
    let mut pending = retrying(shared, agent, Agent::pending_ids)?;
    while let Some(prompt) = shared.next_prompt(sid) {
        let id = prompt.client_msg_id.clone();
        if !pending.contains(&id) {
            // Listed after the pending set was read, or cancelled before
            // the watch was up: the server knows which.
            pending = retrying(shared, agent, Agent::pending_ids)?;
        }
        if pending.contains(&id) {
            retrying(shared, agent, |a| a.answer(&prompt))?;
        } else {
            log::info!(session_id = sid, client_msg_id = id.as_str(); "prompt no longer pending: skipped");
        }
        shared.done(sid, &id);
    }
    Ok(())
}

/// Runs `step` until it succeeds, fails for good, or the agent stops;
/// transient failures wait with backoff, as the one-session agent does.
fn retrying<T>(
    shared: &Shared,
    agent: &mut Agent,
    mut step: impl FnMut(&mut Agent) -> Result<T, Fail>,
) -> Result<T, Fail> {
    let mut backoff = Backoff::new();
    loop {
        match step(agent) {
            Err(Fail::Retry { why, wait, .. }) => {
                if shared.stop.load(Ordering::SeqCst) {
                    return Err(Fail::Stopped);
                }
                let delay = backoff.delay(wait);
                log::warn!(error = why.as_str(), retry_ms = delay.as_millis() as u64; "request failed");
                agent.pause_for(delay);
            }
            other => return other,
        }
    }
}

/// Sleeps `delay`, waking early for a stop signal.
fn pause(stop: &AtomicBool, delay: Duration) {
    let end = std::time::Instant::now() + delay;
    while !stop.load(Ordering::SeqCst) {
        let Some(left) = end.checked_duration_since(std::time::Instant::now()) else {
            return;
        };
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// Percent-encodes a cursor for a query string: it is opaque, so every
/// byte but the URL-unreserved ones is escaped.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(sid: &str, id: &str) -> Listed {
        let v = serde_json::json!({"session_id": sid, "cursor": id, "client_msg_id": id,
            "prompt": "p", "seq": 1});
        serde_json::from_value(v).unwrap()
    }

    fn shared() -> Shared {
        Shared {
            queues: Mutex::default(),
            wake: Condvar::new(),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    #[test]
    fn one_session_is_served_by_one_worker_in_order() {
        let s = shared();
        s.add(vec![listed("a", "1"), listed("b", "2"), listed("a", "3")]);
        assert_eq!(s.next_session().as_deref(), Some("a"));
        assert_eq!(s.next_session().as_deref(), Some("b"));
        // A prompt of a busy session joins its queue, not the ready list.
        s.add(vec![listed("a", "4"), listed("a", "1")]);
        assert!(s.lock().ready.is_empty());
        let order: Vec<String> = std::iter::from_fn(|| s.next_prompt("a"))
            .map(|p| p.client_msg_id)
            .collect();
        assert_eq!(order, ["1", "3", "4"], "the repeated 1 is not queued twice");
        assert!(!s.lock().busy.contains("a"));
        s.add(vec![listed("a", "5")]);
        assert_eq!(s.next_session().as_deref(), Some("a"));
        s.close(None);
        assert_eq!(s.next_prompt("a").map(|p| p.client_msg_id), None);
        assert_eq!(s.next_session(), None);
    }

    #[test]
    fn cursors_are_escaped() {
        assert_eq!(escape("1-2.x_~"), "1-2.x_~");
        assert_eq!(escape("a b&c=/"), "a%20b%26c%3D%2F");
    }
}
