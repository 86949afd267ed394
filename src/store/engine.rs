//! The engine a relay stores through: one of three, behind one type, so
//! the relay holds one engine and asks it questions in its own terms,
//! never which one it is. This file only dispatches: the words of the
//! seam are `seam.rs`, and each engine is its own module.
//!
//! - [`Engine::Memory`]: the relay's own log decides every write at once
//!   (it has no state of its own here: the log is the relay's).
//! - [`Engine::Durable`]: SQLite on the storage thread, which decides with
//!   the memory engine's rules on its cache of the sessions written (read
//!   back from the file when it lacks one) and answers when the write
//!   is durable; the relay's log holds the sessions in use, and one it
//!   lacks is read back whole under a ticket.
//! - [`Engine::Shared`]: Redis, shared by several instances, whose script
//!   decides; the relay's log is this instance's copy of the sessions it
//!   serves.
//!
//! What the relay asks:
//! - [`submit`](Engine::submit) a write: decided on the copy now
//!   ([`Submit::Decide`]), or taken under a [`Ticket`] ([`Submit::Wait`]),
//!   whose request is parked until its answer;
//! - [`before_read`](Engine::before_read): whether a read must wait until
//!   the copy holds what was acknowledged before it began (a ticket too);
//! - [`next_event`](Engine::next_event): what the engine has for the
//!   relay, one [`StoreEvent`] at a time, each read against the copy as
//!   the events before it left it: committed records, a session read
//!   whole, the answer to a ticket, other instances' live state (never
//!   this instance's own, echoed back);
//! - what waits here: [`listen`](Engine::listen) when someone waits on a
//!   session, [`watching`](Engine::watching) when its first subscriber
//!   comes or its last leaves, [`reread`](Engine::reread) and
//!   [`resync`](Engine::resync) when the copy lost or missed something;
//! - the agent here: [`announce_agent`](Engine::announce_agent) (the
//!   engine decides what the other instances are told, and when it must
//!   be asked again), [`publish_receipts`](Engine::publish_receipts), and
//!   whether other instances hear of agents at all
//!   ([`others_hear_agents`](Engine::others_hear_agents));
//! - the idle sweep: [`idle_after`](Engine::idle_after) and
//!   [`collect`](Engine::collect);
//! - a requester that stops waiting [`abandon`](Engine::abandon)s its
//!   ticket.
//!
//! What the loop asks: [`set_clock`](Engine::set_clock) each turn,
//! [`flush`](Engine::flush) the turn's writes, the engine's own work
//! ([`tick`](Engine::tick), due at [`next_deadline`](Engine::next_deadline)),
//! [`saturated`](Engine::saturated), [`healthy`](Engine::healthy),
//! [`stats`](Engine::stats), [`stop`](Engine::stop) at shutdown, and, in
//! the shell that owns Redis's sockets, [`redis`](Engine::redis).

use super::mem::MemStore;
use super::model::Write;
use super::record::{Command, Op};
use super::redis::RedisStore;
use super::seam::{
    Abandon, AgentHere, Announced, Collect, Read, Scope, StoreEvent, StoreStats, Submit, Waited,
};
use super::sqlite::{Durable, STOP_BOUND};
use super::types::{SessionId, Ticket};
use crate::error::ApiError;
use crate::time::Millis;

/// The engine a relay stores through (see the module doc). The default
/// is the memory engine, as for a server started with neither a data
/// directory nor Redis.
// One per process: its size costs nothing, and a box would add an
// indirection to every write.
#[allow(clippy::large_enum_variant)]
#[derive(Default)]
pub enum Engine {
    /// The relay's own log decides every write at once.
    #[default]
    Memory,
    /// SQLite, on the storage thread.
    Durable(Durable),
    /// Redis, shared by several instances.
    Shared(RedisStore),
}

impl Engine {
    /// Whether a write past the memory budget is refused: only where the
    /// loop's log is the whole state, so no session can leave memory to
    /// make room (elsewhere the budget is counted and reported).
    pub fn refuses_at_memory_budget(&self) -> bool {
        matches!(self, Engine::Memory)
    }

    /// Whether a session the copy drops is read back on its next use, so
    /// the budget is kept by dropping the least recently used sessions
    /// nothing here holds, rather than by refusing writes: from the data
    /// directory, or from Redis (whose copy is this instance's cache).
    pub fn reads_back(&self) -> bool {
        matches!(self, Engine::Durable(_) | Engine::Shared(_))
    }

    /// Whether the engine keeps the sessions the copy drops, and deletes
    /// them past the TTL itself (Redis): the copy then forgets a dropped
    /// session outright instead of knowing it by id for its idle sweep.
    pub fn collects_itself(&self) -> bool {
        matches!(self, Engine::Shared(_))
    }

    /// Whether the start's reading of the sessions the copy needs (those
    /// with pending prompts) is under way.
    pub fn warming(&self) -> bool {
        match self {
            Engine::Durable(d) => d.warming(),
            _ => false,
        }
    }

    /// Bytes the engine holds for sessions outside the relay's log (the
    /// storage thread's cache), counted in the one memory budget.
    pub fn held_bytes(&self) -> usize {
        match self {
            Engine::Durable(d) => d.cache_bytes(),
            Engine::Memory | Engine::Shared(_) => 0,
        }
    }

    /// Redis, when sessions are shared.
    pub fn redis(&mut self) -> Option<&mut RedisStore> {
        match self {
            Engine::Shared(r) => Some(r),
            _ => None,
        }
    }

    /// Hands a write to the engine; `ticket` issues the ticket it waits
    /// under, called only once the write is taken. A storage that cannot
    /// take writes refuses with `503` (and no ticket).
    pub fn submit(
        &mut self,
        copy: &MemStore,
        ticket: impl FnOnce() -> Ticket,
        w: &Write,
        unix_ms: u64,
    ) -> Result<Submit, ApiError> {
        match self {
            Engine::Memory => Ok(Submit::Decide),
            // A part is decided on the copy, once it holds the session
            // (read first when it does not).
            Engine::Durable(d) if matches!(w, Write::Part(_)) => {
                let sid = w.session();
                match SessionId::new(sid).filter(|_| !copy.contains(sid)) {
                    Some(sid) => {
                        d.submit(Command {
                            ticket: ticket(),
                            op: Op::Load { sid },
                            unix_ms,
                            load: false,
                        });
                        Ok(Submit::Load)
                    }
                    None => Ok(Submit::Decide),
                }
            }
            // A session the loop's copy holds exists on disk: creating
            // it changes nothing.
            Engine::Durable(_) if matches!(w, Write::Create { sid, .. } if copy.contains(sid)) => {
                Ok(Submit::Decide)
            }
            Engine::Durable(d) => {
                // A session the copy does not hold comes back with the
                // answer, as it stood before the write (a deletion needs
                // nothing of it).
                let load = !copy.contains(w.session()) && !matches!(w, Write::Delete { .. });
                d.submit(Command {
                    ticket: ticket(),
                    op: Op::Write(w.clone().into_owned(unix_ms)),
                    unix_ms,
                    load,
                });
                Ok(Submit::Wait)
            }
            Engine::Shared(r) => {
                r.submit(copy, ticket, w, unix_ms)?;
                Ok(Submit::Wait)
            }
        }
    }

    /// Before a read of `sid`: true when the read must wait (under the
    /// ticket `ticket` issues) until the copy holds what any instance
    /// acknowledged before now; it runs again then. Alone, the copy
    /// always does.
    pub fn before_read(
        &mut self,
        copy: &MemStore,
        ticket: impl FnOnce() -> Ticket,
        sid: &SessionId,
        read: Read,
        waited: &dyn Waited,
    ) -> Result<bool, ApiError> {
        match self {
            Engine::Shared(r) => r.before_read(copy, ticket, sid, read, waited),
            // A session the copy does not hold may be on disk: read it.
            Engine::Durable(d) if !copy.contains(sid) => {
                d.submit(Command {
                    ticket: ticket(),
                    op: Op::Load { sid: sid.clone() },
                    unix_ms: 0,
                    load: false,
                });
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Before an all-sessions read from the copy (where it
    /// [`holds_every_prompt`](Self::holds_every_prompt)): true when it
    /// must wait (under the ticket `ticket` issues) until the copy holds
    /// every pending prompt, which it does not while the start's reading
    /// is under way; it runs again then.
    pub fn before_every_read(&mut self, ticket: impl FnOnce() -> Ticket) -> bool {
        match self {
            Engine::Durable(d) => d.before_every_read(ticket),
            _ => false,
        }
    }

    /// The next thing the engine has for the relay, read against the copy
    /// as the events before it left it; `None` when there is nothing more.
    pub fn next_event(&mut self, copy: &MemStore, waited: &dyn Waited) -> Option<StoreEvent> {
        match self {
            Engine::Memory => None,
            Engine::Durable(d) => d.next_event(),
            Engine::Shared(r) => r.next_event(copy, waited),
        }
    }

    /// Someone waits on `sid` here: changes made elsewhere must reach
    /// this instance.
    pub fn listen(&mut self, sid: &SessionId, waited: &dyn Waited) {
        if let Engine::Shared(r) = self {
            r.listen_bounded(sid, waited);
        }
    }

    /// The first subscriber of `sid` here came (`on`), or the last one
    /// left: other instances' answers then say `delivered`.
    pub fn watching(&mut self, sid: &str, on: bool, ttl_ms: u64) {
        if let Engine::Shared(r) = self {
            r.watching(sid, on, ttl_ms);
        }
    }

    /// The copies are gone ([`StoreEvent::Lost`]): the sessions waited on
    /// here are read again, and created again if missing.
    pub fn reread(&mut self, waited: &dyn Waited) {
        if let Engine::Shared(r) = self {
            r.reread_waited(waited);
        }
    }

    /// The copy of `sid` missed a change made elsewhere (a part out of
    /// order): it is read again.
    pub fn resync(&mut self, copy: &MemStore, sid: &SessionId) {
        if let Engine::Shared(r) = self {
            r.resync(copy, sid);
        }
    }

    /// How long a session nobody here is connected to stays in the copy
    /// unused: the TTL, or with Redis at most a minute (Redis keeps it).
    pub fn idle_after(&self, ttl_ms: u64) -> u64 {
        match self {
            Engine::Shared(_) => ttl_ms.min(60_000),
            _ => ttl_ms,
        }
    }

    /// The idle sweep: `idle` are the sessions nobody here used for
    /// [`idle_after`](Self::idle_after); `ticket` issues the ticket of a
    /// collection sent to the storage.
    pub fn collect(
        &mut self,
        copy: &MemStore,
        idle: Vec<SessionId>,
        ticket: impl FnOnce() -> Ticket,
        waited: &dyn Waited,
        ttl_ms: u64,
    ) -> Collect {
        match self {
            Engine::Memory => Collect::Delete(idle),
            Engine::Durable(d) => {
                if !idle.is_empty() {
                    d.submit(Command {
                        ticket: ticket(),
                        op: Op::Collect { sids: idle },
                        unix_ms: 0,
                        load: false,
                    });
                }
                Collect::Sent
            }
            Engine::Shared(r) => {
                r.keep_alive(copy, waited, ttl_ms);
                Collect::Forget(idle)
            }
        }
    }

    /// When the engine has work of its own next (Redis's health probe);
    /// the loop sleeps no longer.
    pub fn next_deadline(&self) -> Option<Millis> {
        match self {
            Engine::Shared(r) => r.next_deadline(),
            _ => None,
        }
    }

    /// The engine's own work that is due (Redis's health probe); called
    /// at the end of every loop turn.
    pub fn tick(&mut self, now: Millis) {
        if let Engine::Shared(r) = self {
            r.tick(now);
        }
    }

    /// The turn's wall clock (unix ms), for the activity a Redis write
    /// records.
    pub fn set_clock(&mut self, unix_ms: u64) {
        if let Engine::Shared(r) = self {
            r.set_clock(unix_ms);
        }
    }

    /// Whether every prompt stored anywhere reaches the loop's log as it
    /// arrives, so a poll of every session can be answered from it: not
    /// while other instances store prompts in sessions this one does not
    /// follow.
    pub fn holds_every_prompt(&self) -> bool {
        !matches!(self, Engine::Shared(_))
    }

    /// An all-sessions poll is parked here (`on`), or the last one left.
    /// Returns whether its reads may go now: alone, always; with other
    /// instances, once arrivals are heard here
    /// ([`StoreEvent::EveryAgain`] says when, if not now).
    pub fn every_listen(&mut self, on: bool) -> bool {
        match self {
            Engine::Shared(r) => r.every_listen(on),
            _ => true,
        }
    }

    /// Where the loop's log does not hold every prompt: reads the pending
    /// prompts `scope` covers that arrived after `after`, at most
    /// `limit`, oldest first ([`StoreEvent::EveryPage`] for `to`).
    pub fn read_every(&mut self, to: Ticket, scope: &Scope, after: Option<u64>, limit: usize) {
        if let Engine::Shared(r) = self {
            r.read_every(to, scope, after, limit);
        }
    }

    /// [`announce_agent`](Self::announce_agent) for this instance's
    /// agent of every session `scope` covers.
    pub fn announce_every(
        &mut self,
        scope: &Scope,
        told: &mut Announced,
        here: AgentHere,
        seen: u64,
        unix_ms: u64,
        grace_ms: u64,
    ) -> Option<u64> {
        match self {
            Engine::Shared(r) => r.announce_every(scope, told, here, seen, unix_ms, grace_ms),
            _ => None,
        }
    }

    /// An agent stopped in every session `scope` covers (`DELETE
    /// /agent`) here: the other instances end its graces there too.
    pub fn agent_stopped(&mut self, scope: &Scope) {
        if let Engine::Shared(r) = self {
            r.agent_stopped(scope);
        }
    }

    /// Whether other instances hear of this one's agents (their presence
    /// and the prompts they fetched): when none do, an agent that stays
    /// online here changes nothing anyone must be told.
    pub fn others_hear_agents(&self) -> bool {
        matches!(self, Engine::Shared(_))
    }

    /// This instance's agent in `sid` is `here` at `unix_ms`, last seen
    /// at `seen`: the other instances that serve `sid` are told what they
    /// must know of it (`told`: what they were told before). Returns in
    /// how many ms to call again while nothing changes, if the engine
    /// needs that (a lease to renew). Alone, there is nobody to tell.
    pub fn announce_agent(
        &mut self,
        sid: &SessionId,
        told: &mut Announced,
        here: AgentHere,
        seen: u64,
        unix_ms: u64,
        grace_ms: u64,
    ) -> Option<u64> {
        match self {
            Engine::Shared(r) => r.announce_agent(sid, told, here, seen, unix_ms, grace_ms),
            _ => None,
        }
    }

    /// Tells the other instances' subscribers that an agent fetched these
    /// prompts of `sid` here, at `ts`.
    pub fn publish_receipts(&mut self, sid: &SessionId, ts: u64, ids: &[&str]) {
        if let Engine::Shared(r) = self {
            r.receipts(sid, ts, ids);
        }
    }

    /// The requester of `ticket` stops waiting (its storage timeout, or a
    /// shutdown): a write the storage has not taken is cancelled; one it
    /// holds is left to finish.
    pub fn abandon(&mut self, ticket: Ticket) -> Abandon {
        match self {
            Engine::Durable(d) => {
                if d.cancel(ticket.n) {
                    Abandon::Cancelled
                } else {
                    Abandon::InFlight
                }
            }
            // A write is sent in the turn it is asked for, so the script
            // is already Redis's to run (or the connection was lost and
            // the write was answered then).
            Engine::Shared(_) => Abandon::InFlight,
            Engine::Memory => Abandon::Cancelled,
        }
    }

    /// Sends this turn's writes to the storage thread, and tells it how
    /// many bytes the relay's log holds (`held`: its cache takes what
    /// they leave of the memory budget); called at the end of every loop
    /// turn.
    pub fn flush(&mut self, held: usize) {
        if let Engine::Durable(d) = self {
            d.loop_holds(held);
            d.flush();
        }
    }

    /// Whether the storage's queue is full: the shell takes no new request
    /// until it drains.
    pub fn saturated(&self) -> bool {
        match self {
            Engine::Memory => false,
            Engine::Durable(d) => d.saturated(),
            Engine::Shared(r) => r.saturated(),
        }
    }

    /// Whether writes succeed (`/readyz` answers `503 storage` otherwise).
    pub fn healthy(&self) -> bool {
        match self {
            Engine::Memory => true,
            Engine::Durable(d) => d.healthy(),
            Engine::Shared(r) => r.healthy(),
        }
    }

    /// The storage's totals, for `/metrics`.
    pub fn stats(&self) -> Option<&StoreStats> {
        match self {
            Engine::Memory => None,
            Engine::Durable(d) => Some(&d.stats),
            Engine::Shared(r) => Some(&r.stats),
        }
    }

    /// Stops the storage thread once it committed everything it was sent
    /// (at most [`STOP_BOUND`] more).
    pub fn stop(&mut self) {
        if let Engine::Durable(d) = self {
            d.flush();
            d.stop(STOP_BOUND);
        }
    }
}
