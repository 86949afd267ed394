//! The relay with persistence: writes go to the storage thread as owned
//! commands, and what it committed comes back through [`Relay::store_done`]
//! and is applied on the same path a local change takes (the log, then the
//! parked polls and the subscribers), before the requests that waited are
//! answered. Nothing here reads the disk: the storage thread does.

use log::{debug, info};

use super::{ApiError, ConnId, Effect, Engine, Relay, Write, next_ticket};
use crate::store::MemStore;
use crate::store::record::{Command, Done, Op, Outcome, Record};
use crate::store::sqlite::StoreStats;
use crate::time::Millis;

/// The connection a command for nobody (the idle sweep) is from.
const NOBODY: ConnId = ConnId {
    key: u32::MAX,
    generation: 0,
};

/// A write as the storage thread's operation. A deletion names a session
/// the loop's copy holds (else `404` here).
pub(super) fn op(store: &MemStore, w: Write, unix_ms: u64) -> Result<Op, ApiError> {
    let owned = |(id, raw): &(String, crate::wire::Raw)| (id.clone(), raw.get().to_string());
    Ok(match w {
        Write::Prompt(p) => Op::Prompt {
            sid: p.session_id.clone(),
            id: p.client_msg_id.as_ref().map(owned),
            prompt: p.prompt.get().to_string(),
            metadata: p.metadata.map(|m| m.get().to_string()),
            ts: p.ts.unwrap_or(unix_ms),
        },
        Write::Response(r) => Op::Response {
            sid: r.session_id.clone(),
            client_msg_id: r.client_msg_id.clone(),
            id: r.assistant_msg_id.as_ref().map(owned),
            text: r.text.get().to_string(),
            metadata: r.metadata.map(|m| m.get().to_string()),
            ts: r.ts.unwrap_or(unix_ms),
        },
        Write::Create { sid, put } => Op::Create {
            sid: sid.clone(),
            put,
        },
        // Decided by the loop before a write reaches the storage (see
        // `Relay::write`): a draft is never persisted.
        Write::Part(_) => return Err(ApiError::storage_unavailable()),
        Write::Delete { sid } => Op::Delete {
            sid: store
                .key(sid)
                .ok_or_else(ApiError::session_not_found)?
                .clone(),
        },
    })
}

impl Relay {
    /// Sends this turn's writes to the storage thread; called at the end of
    /// every loop turn.
    pub fn flush_store(&mut self) {
        self.engine.flush();
    }

    /// Whether the storage's queue is full: the shell takes no new request
    /// until it drains.
    pub fn store_saturated(&self) -> bool {
        self.engine.saturated()
    }

    /// Whether writes succeed (`/readyz` answers `503 storage` otherwise).
    pub fn storage_ok(&self) -> bool {
        self.engine.healthy()
    }

    /// The storage's totals, with persistence or Redis.
    pub fn store_stats(&self) -> Option<&StoreStats> {
        self.engine.stats()
    }

    /// Stops the storage thread once it committed everything it was sent.
    pub fn stop_store(&mut self) {
        self.engine.stop();
    }

    /// Applies what the storage thread committed since the last call and
    /// queues the answers of the requests that waited. Called when its
    /// waker fires.
    pub fn store_done(&mut self, now: Millis) {
        let Engine::Durable(d) = &mut self.engine else {
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
        if n > 0
            && let Engine::Durable(d) = &mut self.engine
        {
            debug!(count = n; "idle sessions to collect");
            let ticket = next_ticket(&mut self.tickets, NOBODY);
            d.submit(Command {
                ticket,
                op: Op::Collect { sids },
            });
        }
        n
    }
}
