//! The relay's side of its engine ([`Engine`]): what it committed applied
//! on the path every change takes (the log, then the parked polls and
//! subscribers here) before the requests that waited are answered; reads
//! that wait for the copy; the live state other instances published,
//! handed to its rooms; the sessions waited on here, as the engine asks
//! about them; the engine handed to the shell that drives it. Nothing
//! here knows which engine it is.

use std::collections::HashMap;

use super::{ApiError, ConnId, Effect, Engine, Presence, PromptsQuery, Relay, Reply, issue};
use crate::store::SessionId;
use crate::store::idmap::Keys;
use crate::store::seam::{Read, StoreEvent, StoreStats, Waited};
use crate::time::Millis;

impl Waited for HashMap<SessionId, Box<Presence>, Keys> {
    fn waits_on(&self, sid: &str) -> bool {
        self.contains_key(sid)
    }

    fn count(&self) -> usize {
        self.len()
    }

    fn each(&self, f: &mut dyn FnMut(&SessionId, bool)) {
        for (sid, here) in self {
            f(sid, !here.subscribers.is_empty());
        }
    }
}

impl Relay {
    /// The engine, for the shell that drives its I/O (its sockets, its
    /// own timers).
    pub fn engine(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Sends this turn's writes to the storage; called at the end of every
    /// loop turn.
    pub fn flush_store(&mut self) {
        let held = self.loop_bytes();
        self.engine.flush(held);
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

    /// The storage's totals, where the engine keeps any.
    pub fn store_stats(&self) -> Option<&StoreStats> {
        self.engine.stats()
    }

    /// Stops the engine's storage once it committed everything it was
    /// sent; called at shutdown.
    pub fn stop_store(&mut self) {
        self.engine.stop();
    }

    /// Before a read of `sid`: true when it waits (under a ticket) until
    /// the copy holds what any instance acknowledged before now; the
    /// request runs again then.
    pub fn sync_first(&mut self, conn: ConnId, sid: &SessionId) -> Result<bool, ApiError> {
        self.before_read(conn, sid, Read::Plain)
    }

    /// [`sync_first`](Self::sync_first) for `GET /prompts` with `q`.
    pub fn sync_first_poll(
        &mut self,
        conn: ConnId,
        sid: &SessionId,
        q: &PromptsQuery,
    ) -> Result<bool, ApiError> {
        self.before_read(conn, sid, Read::Poll(q))
    }

    /// [`sync_first`](Self::sync_first) for a WebSocket upgrade.
    pub fn sync_first_listening(
        &mut self,
        conn: ConnId,
        sid: &SessionId,
    ) -> Result<bool, ApiError> {
        self.before_read(conn, sid, Read::Subscribe)
    }

    /// Before an all-sessions read from the log: true when it waits
    /// (under a ticket) until the log holds every pending prompt (the
    /// start's reading under way); the request runs again then.
    pub fn sync_first_every(&mut self, conn: ConnId) -> bool {
        let (tickets, issued) = (&mut self.tickets, &mut self.issued);
        let ticket = || issue(tickets, issued, conn);
        self.engine.before_every_read(ticket)
    }

    fn before_read(&mut self, conn: ConnId, sid: &SessionId, read: Read) -> Result<bool, ApiError> {
        if self.engine.reads_back() && !self.store.contains(sid) && self.holds_every_session() {
            return Ok(false);
        }
        let (tickets, issued) = (&mut self.tickets, &mut self.issued);
        let ticket = || issue(tickets, issued, conn);
        self.engine
            .before_read(&self.store, ticket, sid, read, &self.presence)
    }

    /// Applies what the engine committed, read or heard since the last
    /// call, and queues the answers of the requests that waited. Called
    /// whenever the engine may have news: its waker fired, or the shell
    /// handed it the bytes its sockets read.
    #[inline(never)]
    pub fn storage_done(&mut self, now: Millis) {
        while let Some(e) = self.engine.next_event(&self.store, &self.presence) {
            match e {
                StoreEvent::Records(records) => {
                    self.apply(now, records);
                }
                StoreEvent::Answer {
                    to,
                    records,
                    result,
                    delivered,
                } => {
                    self.writing.remove(&to.n);
                    self.held.remove(&to.n);
                    let delivered = self.apply(now, records) || delivered;
                    let result = result.map(|o| self.ack(o, delivered));
                    self.effects.push(Effect::Reply { to, result });
                }
                StoreEvent::Retry(to) => {
                    self.writing.remove(&to.n);
                    match self.held.remove(&to.n) {
                        // A part whose session was read: decided now.
                        Some((w, unix_ms)) => {
                            let result = match self.decide_write(now, unix_ms, w) {
                                Ok(Reply::Now(body)) => Ok(body),
                                Ok(Reply::Wait) => Err(ApiError::storage_unavailable()),
                                Err(e) => Err(e),
                            };
                            self.effects.push(Effect::Reply { to, result });
                        }
                        None => self.effects.push(Effect::Retry { to }),
                    }
                }
                StoreEvent::Loaded { sid, log } => self.loaded(now, sid, log),
                StoreEvent::Dormant { sids, first } => self.dormant_known(now, sids, first),
                StoreEvent::Replaced {
                    sid,
                    mut log,
                    refill,
                } => {
                    log.last_active = now;
                    // Read into a copy that lacked it: a session read
                    // back (with Redis, the copy is a cache).
                    if !self.store.contains(&sid) {
                        self.resident.loads += 1;
                    }
                    self.store.insert(sid.clone(), log);
                    self.drafts_settled(&sid);
                    if let Some(resync) = refill {
                        // A new epoch: the parked polls are checked
                        // against it at once, their cursors reset.
                        if resync && let Some(here) = self.presence.get_mut(&sid) {
                            here.new_epoch();
                        }
                        self.wake_waiters(now, &sid);
                        self.effects.push(Effect::Refill { sid, resync });
                    }
                }
                StoreEvent::Lost => {
                    // Every copy held here is of sessions that are gone,
                    // not deleted: dropped without a word (an answer that
                    // still follows one is then ignored), and the sessions
                    // waited on here read again; then their agents are
                    // told again.
                    self.store.forget_all();
                    self.engine.reread(&self.presence);
                    self.live_lost(now);
                    self.every_lost(now);
                }
                StoreEvent::Part {
                    sid,
                    assistant_msg_id,
                    client_msg_id,
                    part,
                    lit,
                } => self.part_published(now, &sid, &assistant_msg_id, &client_msg_id, part, &lit),
                StoreEvent::Agent { sid, state } => self.agent_published(now, &sid, &state),
                StoreEvent::Receipts { sid, ts, ids } => self.receipts_published(&sid, ts, &ids),
                StoreEvent::EveryPage { to, result } => self.every_page_read(now, to, result),
                StoreEvent::Arrived { sid } => self.every_arrived(&sid),
                StoreEvent::EveryAgain => self.every_again(),
                StoreEvent::EveryAgent(state) => self.every_agent_heard(now, state),
                StoreEvent::EveryAgents(states) => self.every_agents_read(now, states),
                StoreEvent::AgentStopped(scope) => self.agent_stop_heard(now, &scope),
                StoreEvent::LiveRead {
                    sid,
                    drafts,
                    agents,
                } => {
                    if self.store.contains(&sid) {
                        self.live_synced(now, &sid, drafts, agents);
                    }
                }
            }
        }
    }

    /// Someone waits on `sid` here (a parked poll, a subscriber): its
    /// changes made elsewhere must reach this instance.
    pub(super) fn listen(&mut self, sid: &SessionId) {
        self.engine.listen(sid, &self.presence);
    }

    /// The first subscriber of `sid` here came, or the last one left.
    pub(super) fn watching(&mut self, sid: &str, on: bool) {
        self.engine.watching(sid, on, self.limits.session_ttl_ms);
    }
}
