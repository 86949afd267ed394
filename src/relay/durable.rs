//! The relay with persistence: writes go to the storage thread as owned
//! commands, and what it committed comes back through [`Relay::store_done`]
//! and is applied on the same path a local change takes (the log, then the
//! parked polls and the subscribers), before the requests that waited are
//! answered. Nothing here reads the disk: the storage thread does.

use log::{debug, info};

use super::model::{NewPrompt, NewResponse};
use super::{ConnId, Effect, Relay, Ticket};
use crate::store::SessionId;
use crate::store::record::{Command, Done, Op, Outcome, Record};
use crate::store::sqlite::StoreStats;
use crate::time::Millis;

/// The connection a command for nobody (the idle sweep) is from.
const NOBODY: ConnId = ConnId {
    key: u32::MAX,
    generation: 0,
};

/// `POST /prompt` as a command.
pub fn prompt(ticket: Ticket, p: &NewPrompt, unix_ms: u64) -> Command {
    Command {
        ticket,
        op: Op::Prompt {
            sid: p.session_id.clone(),
            id: p
                .client_msg_id
                .as_ref()
                .map(|(id, raw)| (id.clone(), raw.get().to_string())),
            prompt: p.prompt.get().to_string(),
            metadata: p.metadata.map(|m| m.get().to_string()),
            ts: p.ts.unwrap_or(unix_ms),
        },
    }
}

/// `POST /response` as a command.
pub fn response(ticket: Ticket, r: &NewResponse, unix_ms: u64) -> Command {
    Command {
        ticket,
        op: Op::Response {
            sid: r.session_id.clone(),
            client_msg_id: r.client_msg_id.clone(),
            id: r
                .assistant_msg_id
                .as_ref()
                .map(|(id, raw)| (id.clone(), raw.get().to_string())),
            text: r.text.get().to_string(),
            metadata: r.metadata.map(|m| m.get().to_string()),
            ts: r.ts.unwrap_or(unix_ms),
        },
    }
}

/// A session to create (`PUT`, or a WebSocket connect).
pub fn create(ticket: Ticket, sid: &SessionId, put: bool) -> Command {
    Command {
        ticket,
        op: Op::Create {
            sid: sid.clone(),
            put,
        },
    }
}

/// `DELETE /sessions` as a command.
pub fn delete(ticket: Ticket, sid: SessionId) -> Command {
    Command {
        ticket,
        op: Op::Delete { sid },
    }
}

impl Relay {
    /// Adds a write to this turn's batch for the storage thread.
    pub(super) fn submit(&mut self, cmd: Command) {
        if let Some(d) = &mut self.durable {
            d.submit(cmd);
        }
    }

    /// Sends this turn's writes to the storage thread; called at the end of
    /// every loop turn.
    pub fn flush_store(&mut self) {
        if let Some(d) = &mut self.durable {
            d.flush();
        }
    }

    /// Whether the queue to the storage thread is full: the shell takes no
    /// new request until it drains.
    pub fn store_saturated(&self) -> bool {
        self.durable.as_ref().is_some_and(|d| d.saturated())
            || self.shared.as_ref().is_some_and(|r| r.saturated())
    }

    /// Whether writes succeed (`/readyz` answers `503 storage` otherwise).
    pub fn storage_ok(&self) -> bool {
        self.durable.as_ref().is_none_or(|d| d.healthy())
            && self.shared.as_ref().is_none_or(|r| r.healthy())
    }

    /// The storage thread's totals, with persistence.
    pub fn store_stats(&self) -> Option<&StoreStats> {
        match (&self.durable, &self.shared) {
            (Some(d), _) => Some(&d.stats),
            (None, Some(r)) => Some(&r.stats),
            (None, None) => None,
        }
    }

    /// Stops the storage thread once it committed everything it was sent.
    pub fn stop_store(&mut self) {
        if let Some(d) = &mut self.durable {
            d.flush();
            d.stop(crate::store::sqlite::STOP_BOUND);
        }
    }

    /// Applies what the storage thread committed since the last call and
    /// queues the answers of the requests that waited. Called when its
    /// waker fires.
    pub fn store_done(&mut self, now: Millis) {
        let Some(d) = &mut self.durable else {
            return;
        };
        let done = d.take_done();
        for d in done {
            self.apply_done(now, d);
        }
    }

    /// One command's committed records, applied on the path every
    /// engine's changes take, then its requester answered: a session
    /// created for a WebSocket connect runs the upgrade again, a sweep has
    /// no requester.
    fn apply_done(&mut self, now: Millis, done: Done) {
        for record in &done.records {
            if let Record::Deleted { sid } = record {
                info!(session_id = sid.as_str(); "session deleted");
            }
        }
        let delivered = self.apply(now, done.records);
        let to = done.ticket;
        let result = match done.result {
            Err(e) => Err(e),
            Ok(Outcome::Session { put: false, .. }) => {
                self.effects.push(Effect::Retry { to });
                return;
            }
            Ok(Outcome::Collected) => return,
            Ok(outcome) => Ok(self.ack(outcome, delivered)),
        };
        if to.conn != NOBODY {
            self.effects.push(Effect::Reply { to, result });
        }
    }

    /// The idle sweep with persistence: the sessions nobody here is
    /// connected to and nobody touched for the TTL are deleted by the
    /// storage thread (and leave the loop's copy when that commits).
    pub(super) fn collect_durable(&mut self, now: Millis, ttl: u64) -> usize {
        let presence = &self.presence;
        let sids = self
            .store
            .idle(|sid, log| !presence.contains_key(sid) && now.since(log.last_active) >= ttl);
        let n = sids.len();
        if n > 0 && self.durable.is_some() {
            debug!(count = n; "idle sessions to collect");
            let ticket = self.ticket(NOBODY);
            self.issued = None;
            self.submit(Command {
                ticket,
                op: Op::Collect { sids },
            });
        }
        n
    }
}
