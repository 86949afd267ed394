//! The relay core: the semantics of every endpoint over the session store
//! ([`crate::store`]), who waits on each session here (parked polls,
//! subscribers), and what the person waiting sees of the agent at work.
//! Sans-IO: every call takes `now` (and `unix_ms` where a `ts` is stamped),
//! returns its own reply, and queues work for *other* connections as
//! [`Effect`]s that the I/O shell applies after the handler returns. It never
//! touches a socket or the clock.
//!
//! A stored prompt wakes the session's parked polls; a stored answer becomes
//! one [`Effect::Deliver`], which the shell hands to every subscriber that is
//! caught up (the same framed bytes for all); a subscriber that is behind
//! reads the log by its cursor when its socket drains ([`Relay::refill`]).
//!
//! The relay holds one [`Engine`], handed to [`Relay::new`] with the log
//! it restored, and never asks which one it is: every write is submitted
//! to it and either handed back to be decided on the loop's log at once
//! or taken under a [`Ticket`] the request waits on; whatever the engine
//! committed, read or heard comes back through [`Relay::storage_done`].
//!
//! Its rooms: this file holds the [`Relay`], its effects and limits, and
//! the endpoints; `commit` applies committed records to the log and to
//! what waits on it here, and renders the requester's answer; `storage`
//! is the relay's side of its engine; `presence` who waits here; `live`
//! the per-session live state and its tick, with one room each for
//! `drafts` (streamed answers), `agent` (the agent's presence),
//! `receipts` (prompts an agent fetched) and `frames` (their bytes);
//! `asks` the agent waiting on a reply (`GET /asks`); `every` the poll
//! of every session a token opens, and `every_read` that poll where the
//! engine keeps the order (several instances).
//!
//! Session ids: a call that may create a session, or keep its id, takes a
//! [`SessionId`] (checked where it was parsed); the others look the session
//! up by `&str` (a `SessionId` derefs to one), and an id that is not valid
//! is simply not found.

mod agent;
mod asks;
mod budget;
mod commit;
mod drafts;
mod every;
mod every_read;
mod frames;
mod live;
mod receipts;
mod resident;

pub mod presence;
mod storage;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use log::{debug, info};

pub use crate::error::ApiError;
pub use crate::store::engine::Engine;
use crate::store::idmap::Keys;
pub(crate) use crate::store::model::Write;
use crate::store::model::{NewPrompt, NewResponse};
pub use crate::store::seam::Abandon;
use crate::store::seam::{Collect, NOBODY, Submit};
pub use crate::store::types::{ConnId, MessagesQuery, PromptsQuery, Ticket};
pub use asks::AskFetch;
pub use every::Scope;
pub use presence::{Presence, Waiter};

use crate::store::record::{Outcome, Record};
use crate::store::{Cursor, MemStore, Seq, SessionId, SessionLog, StoreLimits};
use crate::time::{Millis, UnixMillis};

/// The next ticket (borrows only what it needs, so a caller holding an
/// engine can take one).
fn next_ticket(tickets: &mut u64, conn: ConnId) -> Ticket {
    *tickets += 1;
    Ticket { conn, n: *tickets }
}

/// The next ticket, remembered as the one issued: the request being
/// handled waits under it.
fn issue(tickets: &mut u64, issued: &mut Option<Ticket>, conn: ConnId) -> Ticket {
    let t = next_ticket(tickets, conn);
    *issued = Some(t);
    t
}

/// Work for other connections, applied by the shell after the handler.
#[derive(Debug, PartialEq, Eq)]
pub enum Effect {
    /// Answer a parked `GET /prompts` and return it to reading requests.
    Respond {
        to: ConnId,
        status: u16,
        body: Rc<[u8]>,
    },
    /// A new assistant message of `sid` is stored: hand `frame` to every
    /// subscriber whose cursor says it is the next one it needs.
    Deliver {
        sid: SessionId,
        seq: Seq,
        /// The `seq` of the assistant message before it (0 if none).
        prev: Seq,
        frame: Rc<[u8]>,
    },
    /// Close a WebSocket subscriber with this close code.
    CloseSubscriber { to: ConnId, code: u16 },
    /// Answer a request that waited for its engine (under a ticket).
    Reply {
        to: Ticket,
        result: Result<Vec<u8>, ApiError>,
    },
    /// Run a request that waited for its engine again: what it waited for
    /// (its session, a read's barrier) is in the loop's log now.
    Retry { to: Ticket },
    /// A frame for the subscribers of `sid` that are caught up with its
    /// log (a streamed part, the agent's presence, a receipt); one that
    /// is behind gets the live state when it catches up instead.
    Broadcast { sid: SessionId, frame: Rc<[u8]> },
    /// The log of `sid` was read again whole: its subscribers here refill
    /// from their cursors, after a `resync` frame when `resync` (the log
    /// was lost and starts again under a new epoch).
    Refill { sid: SessionId, resync: bool },
}

/// A write's answer: now, or once its engine committed it (an
/// [`Effect::Reply`] or [`Effect::Retry`] for the connection follows).
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Now(Vec<u8>),
    Wait,
}

/// A session TTL that never passes (`RELAY_SESSION_TTL=0`).
pub const NEVER: u64 = u64::MAX;

/// Limits the core enforces (a subset of `Config`).
#[derive(Clone, Debug)]
pub struct Limits {
    pub history_limit: usize,
    pub max_sessions: usize,
    pub max_pending: usize,
    pub max_waiters: usize,
    pub max_subscribers: usize,
    pub session_ttl_ms: u64,
    /// A draft with no new part for this long is dropped.
    pub draft_timeout_ms: u64,
    /// An agent is online this long after its last request ended.
    pub agent_grace_ms: u64,
    /// The memory budget (`RELAY_MAX_MEMORY`), in bytes.
    pub max_memory: usize,
}

impl Limits {
    /// The store's part of the limits.
    pub fn store(&self) -> StoreLimits {
        StoreLimits {
            history_limit: self.history_limit,
            max_sessions: self.max_sessions,
            max_pending: self.max_pending,
            draft_timeout_ms: self.draft_timeout_ms,
        }
    }
}

/// What `GET /prompts` does now.
#[derive(Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Answer at once with this JSON array (shared with other agents
    /// asking the same).
    Ready(Rc<[u8]>),
    /// The connection is registered as a waiter; answer `[]` at the
    /// deadline. `sid` is the session's id as the log stores it, for the
    /// connection to keep while it waits (shared, not a copy); `None`
    /// for a poll of every session.
    Park {
        deadline: Millis,
        sid: Option<SessionId>,
    },
}

/// Counters for `/healthz`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Sessions stored: in the log, and known by id only.
    pub sessions: usize,
    /// Sessions the log holds in memory.
    pub resident: usize,
    /// Bytes held for sessions, as counted, and the budget.
    pub memory_bytes: usize,
    pub memory_budget: usize,
    pub subscribers: usize,
    pub parked_polls: usize,
}

/// Totals since start, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub prompts_stored: u64,
    pub responses_stored: u64,
    pub prompt_duplicates: u64,
    pub response_duplicates: u64,
    /// `resync` frames sent to subscribers.
    pub resyncs: u64,
    /// Sessions read back into memory, and dropped from it.
    pub session_loads: u64,
    pub session_evictions: u64,
}

/// The relay: the log and the engine it stores through, who waits on each
/// session here, the live state, and the effect outbox.
pub struct Relay {
    limits: Limits,
    /// Every session's committed log: the whole state, or the copy of
    /// what the engine stores (the sessions this instance serves).
    store: MemStore,
    /// Where writes are decided and kept (see [`Engine`]).
    engine: Engine,
    /// Who waits or listens on each session here. Boxed, as in the
    /// store's map: a table keeps room for up to twice its entries.
    presence: HashMap<SessionId, Box<Presence>, Keys>,
    /// Parked polls of every session a token opens (`every`).
    every: Vec<every::EveryWaiter>,
    /// When the last all-sessions poll of each scope ended, while its
    /// grace lasts: the agent is online in the sessions it covers.
    every_graces: Vec<every::EveryGrace>,
    /// The number of the last all-sessions grace recorded.
    every_stamps: u64,
    /// What the other instances were last told of this instance's
    /// agents of every session, per scope (`every_read`).
    every_told: Vec<(Scope, crate::store::seam::Announced)>,
    /// The other instances' agents of every session (`every_read`).
    remote_every: Vec<crate::store::seam::EveryAgentState>,
    effects: Vec<Effect>,
    counts: Counts,
    stats: Stats,
    /// The records of a write decided on the loop's log, reused.
    records: Vec<Record>,
    /// The number of the last ticket issued.
    tickets: u64,
    /// The ticket of the request being handled, if its write went to the
    /// storage (the shell takes it to park the request).
    issued: Option<Ticket>,
    /// The writes the engine holds, by ticket, with the session each
    /// writes to: none of those sessions is idle until its writes are
    /// answered, however long the storage takes.
    writing: HashMap<u64, SessionId>,
    /// Drafts, the agent's presence and receipts, per session.
    live: live::LiveMap,
    /// When [`Relay::tick`] is due.
    next_tick: Option<Millis>,
    /// The loop clock and the wall clock read at the same instant, for
    /// the wall-clock stamps of live frames.
    clock: (Millis, UnixMillis),
    /// The wall-clock time the relay started.
    started: UnixMillis,
    /// The memory budget ([`budget`]).
    budget: budget::Budget,
    /// The sessions known by id only, where the log holds only those in
    /// use ([`resident`]).
    resident: resident::Resident,
    /// Parts of streamed answers waiting for their session to be read
    /// back, by ticket: decided on the log once it is there.
    held: HashMap<u64, (Write<'static>, UnixMillis)>,
}

impl Relay {
    /// A relay that stores through `engine`, over `store`: what the
    /// engine restored at start, or empty.
    pub fn new(limits: Limits, mut store: MemStore, engine: Engine) -> Relay {
        let budget = budget::Budget::new(limits.max_memory, &engine);
        if engine.reads_back() {
            store.keep_order();
        }
        Relay {
            store,
            engine,
            limits,
            presence: HashMap::default(),
            every: Vec::new(),
            every_graces: Vec::new(),
            every_stamps: 0,
            every_told: Vec::new(),
            remote_every: Vec::new(),
            effects: Vec::new(),
            counts: Counts::default(),
            stats: Stats::default(),
            records: Vec::new(),
            tickets: 0,
            issued: None,
            writing: HashMap::new(),
            live: live::LiveMap::new(),
            next_tick: None,
            clock: (Millis(0), 0),
            started: 0,
            budget,
            resident: resident::Resident::default(),
            held: HashMap::new(),
        }
    }

    /// An empty relay whose log is the whole state (the memory engine).
    pub fn in_memory(limits: Limits) -> Relay {
        let store = MemStore::new(limits.store());
        Relay::new(limits, store, Engine::default())
    }

    /// The turn's clocks: wall-clock stamps (presence, receipts) are
    /// taken from them.
    pub fn set_clock(&mut self, now: Millis, unix_ms: UnixMillis) {
        if self.started == 0 {
            self.started = unix_ms;
        }
        self.clock = (now, unix_ms);
        self.engine.set_clock(unix_ms);
    }

    /// The ticket of the request just handled, when it waits for the
    /// storage; called by the shell after a handler answered `Wait`.
    pub fn take_ticket(&mut self) -> Option<Ticket> {
        self.issued.take()
    }

    /// The requester of `ticket` stops waiting (its storage timeout, or a
    /// shutdown): a write the storage has not taken is cancelled; one it
    /// holds is left to finish.
    pub fn abandon(&mut self, ticket: Ticket) -> Abandon {
        let abandon = self.engine.abandon(ticket);
        // A part waiting for its session is not decided once its
        // requester has been answered.
        self.held.remove(&ticket.n);
        if abandon == Abandon::Cancelled {
            self.writing.remove(&ticket.n);
        }
        abandon
    }

    /// Moves the queued effects out; called by the shell after every handler.
    /// The requests to run again come last: each runs on the state after
    /// every event of the batch, so an effect decided for an earlier state
    /// (a `Refill` with its `resync`, for the subscribers there were then)
    /// must not reach the subscriber a re-run upgrade makes.
    pub fn take_effects(&mut self, out: &mut Vec<Effect>) {
        out.extend(
            self.effects
                .extract_if(.., |e| !matches!(e, Effect::Retry { .. })),
        );
        out.append(&mut self.effects);
    }

    /// Sessions, subscribers and parked polls, for `/healthz`.
    pub fn counts(&self) -> Counts {
        Counts {
            sessions: self.store.len() + self.resident.len(),
            resident: self.store.len(),
            memory_bytes: self.memory_bytes(),
            memory_budget: self.budget_bytes(),
            ..self.counts
        }
    }

    /// Totals since start, for `/metrics`.
    pub fn stats(&self) -> Stats {
        Stats {
            session_loads: self.resident.loads,
            session_evictions: self.resident.evictions,
            ..self.stats
        }
    }

    /// Whether the session cap is reached (`/readyz` reports it).
    pub fn sessions_full(&self) -> bool {
        self.store.full() || self.store.len() + self.resident.len() >= self.limits.max_sessions
    }

    /// Whether a session exists (tests and `/readyz`).
    pub fn has_session(&self, sid: &str) -> bool {
        self.store.contains(sid)
    }

    /// The committed log of `sid`, read without touching it (its idle time
    /// stays as it was): for checks from outside the relay, such as the
    /// simulation's (`tests/sim`), which compare it with a model after
    /// every step.
    #[doc(hidden)]
    pub fn peek(&self, sid: &str) -> Option<&SessionLog> {
        self.store.get(sid)
    }

    /// `POST /prompt` from its body: stored, deduped, and every parked poll
    /// of the session woken. (The API checks the body's session against
    /// the caller's grant first, and calls [`write`](Self::write).)
    pub fn post_prompt(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        conn: ConnId,
        body: &[u8],
    ) -> Result<Reply, ApiError> {
        let p = NewPrompt::parse(body)?;
        self.write(now, unix_ms, conn, Write::Prompt(p))
    }

    /// `GET /prompts/{sid}`: the pending set now, or park `conn` until a
    /// prompt arrives or `timeout` passes.
    pub fn get_prompts(
        &mut self,
        now: Millis,
        conn: ConnId,
        sid: &str,
        q: PromptsQuery,
    ) -> Result<Fetch, ApiError> {
        let log = self.store.existing(now, sid)?;
        if !q.wait || log.has_pending_after(q.after) {
            debug!(session_id = sid; "prompts fetched");
            let page = log.pending_page(q.after).inspect_err(|e| damaged(sid, e))?;
            self.page_within_budget(sid);
            self.fetched(now, sid, q.after);
            self.agent_seen(now, sid, true);
            return Ok(Fetch::Ready(page));
        }
        if q.timeout_ms == 0 {
            self.agent_seen(now, sid, true);
            return Ok(Fetch::Ready(Rc::from(&b"[]"[..])));
        }
        // The session exists (checked above): its stored id keys the
        // presence entry, shared rather than copied.
        let key = self
            .store
            .key(sid)
            .ok_or_else(ApiError::session_not_found)?;
        let here = self.presence.entry(key.clone()).or_default();
        if here.waiters.len() >= self.limits.max_waiters {
            if here.is_empty() {
                self.presence.remove(sid);
            }
            return Err(ApiError::unavailable(
                "waiter limit reached for this session",
            ));
        }
        presence::push_one(
            &mut here.waiters,
            Waiter {
                conn,
                after: q.after,
            },
        );
        self.counts.parked_polls += 1;
        let key = key.clone();
        self.listen(&key);
        self.agent_seen(now, sid, false);
        Ok(Fetch::Park {
            deadline: Millis(now.0.saturating_add(q.timeout_ms)),
            sid: Some(key),
        })
    }

    /// Forgets a parked poll (timed out, hung up, or shut down).
    pub fn cancel_wait(&mut self, conn: ConnId, sid: &str, now: Millis) {
        let Some(here) = self.presence.get_mut(sid) else {
            return;
        };
        let left = here.remove_waiter(conn);
        if left {
            self.counts.parked_polls -= 1;
            // The idle time of a session starts when its last poll ends.
            let _ = self.store.existing(now, sid);
        }
        if here.is_empty() {
            self.presence.remove(sid);
        }
        if left {
            self.agent_left(now, sid);
        }
    }

    /// `POST /response` from its body: stored, deduped or refused; a new
    /// answer becomes an [`Effect::Deliver`] for the session's subscribers.
    pub fn post_response(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        conn: ConnId,
        body: &[u8],
    ) -> Result<Reply, ApiError> {
        let r = NewResponse::parse(body)?;
        self.write(now, unix_ms, conn, Write::answer(r))
    }

    /// The subscribers of `sid` on this server, for a delivery.
    pub fn subscribers(&self, sid: &str) -> &[ConnId] {
        self.presence.get(sid).map_or(&[], |p| &p.subscribers)
    }

    /// The session's id as the log stores it, shared, in place of `sid`
    /// (a copy made from a request's path): what a connection keeps for
    /// as long as it waits on the session then costs no allocation of its
    /// own. `sid` itself if the log does not hold the session.
    pub fn stored_id(&self, sid: SessionId) -> SessionId {
        self.store.key(&sid).cloned().unwrap_or(sid)
    }

    /// `WebSocket /ws/{sid}` after a successful upgrade check: creates the
    /// session if needed, registers `conn`, and returns its cursor: the
    /// shell then fills it with [`refill`](Self::refill) (a `resync` and the
    /// replay first), so nothing stored in between is missed.
    pub fn subscribe(
        &mut self,
        now: Millis,
        conn: ConnId,
        sid: &SessionId,
        after: Option<Seq>,
        epoch: Option<&str>,
    ) -> Result<Option<Cursor>, ApiError> {
        let full = self.subscribers(sid).len() >= self.limits.max_subscribers;
        if !self.store.contains(sid) {
            // Created first; with a storage, the upgrade is run again once
            // the storage created it. (A creation has no `ts`.)
            let create = Write::Create {
                sid: Cow::Borrowed(sid),
                put: false,
            };
            if self.write(now, 0, conn, create)? == Reply::Wait {
                return Ok(None);
            }
        }
        let log = self.store.existing(now, sid)?;
        if full {
            return Err(ApiError::unavailable(
                "subscriber limit reached for this session",
            ));
        }
        let cursor = log.cursor(after, epoch);
        let key = self.stored_id(sid.clone());
        let subscribers = &mut self.presence.entry(key).or_default().subscribers;
        presence::push_one(subscribers, conn);
        if subscribers.len() == 1 {
            self.watching(sid, true);
            self.listen(sid);
        }
        self.counts.subscribers += 1;
        Ok(Some(cursor))
    }

    /// Pulls into `out` what a subscriber of `sid` at `cursor` needs next,
    /// within `room` bytes (one frame always when `empty`). Called when the
    /// subscriber is new or its queue drained below the low-water mark.
    /// Returns true when it is caught up.
    pub fn refill(
        &mut self,
        sid: &str,
        cursor: &mut Cursor,
        room: usize,
        empty: bool,
        out: &mut Vec<Rc<[u8]>>,
    ) -> bool {
        let had = out.len();
        let done = self.store.refill(sid, cursor, room, empty, out);
        self.stats.resyncs += u64::from(done.resynced);
        if !done.caught_up {
            return false;
        }
        // Caught up: the open drafts and the agent's state, all at once
        // (when they do not fit, they come at the next refill).
        let mut used: usize = out[had..].iter().map(|f| f.len()).sum();
        let at = out.len();
        self.live_frames(sid, out);
        used += out[at..].iter().map(|f| f.len()).sum::<usize>();
        if used > room && !(empty && had == 0 && at == had) {
            out.truncate(at);
            return false;
        }
        true
    }

    /// Forgets a subscriber (closed for any reason).
    pub fn unsubscribe(&mut self, conn: ConnId, sid: &str, now: Millis) {
        let Some(here) = self.presence.get_mut(sid) else {
            return;
        };
        let mut last = false;
        if here.remove_subscriber(conn) {
            self.counts.subscribers -= 1;
            let _ = self.store.existing(now, sid);
            last = here.subscribers.is_empty();
        }
        if here.is_empty() {
            self.presence.remove(sid);
        }
        if last {
            self.watching(sid, false);
        }
    }

    /// `GET /messages/{sid}`: a page of history, oldest first.
    pub fn messages(
        &mut self,
        now: Millis,
        sid: &str,
        q: MessagesQuery,
    ) -> Result<Vec<u8>, ApiError> {
        self.store
            .messages(now, sid, &q)
            .inspect_err(|e| damaged(sid, e))
    }

    /// `PUT /sessions/{sid}`: create if needed.
    pub fn put_session(
        &mut self,
        now: Millis,
        conn: ConnId,
        sid: &SessionId,
    ) -> Result<Reply, ApiError> {
        let create = Write::Create {
            sid: Cow::Borrowed(sid),
            put: true,
        };
        self.write(now, 0, conn, create)
    }

    /// `DELETE /sessions/{sid}`: parked polls get 404, subscribers close 1000.
    pub fn delete_session(
        &mut self,
        now: Millis,
        conn: ConnId,
        sid: &str,
    ) -> Result<Reply, ApiError> {
        let delete = Write::Delete {
            sid: Cow::Borrowed(sid),
        };
        self.write(now, 0, conn, delete)
    }

    /// Every write, validated: handed to the engine, which either hands
    /// it back to be decided on the loop's log by [`MemStore::decide`],
    /// applied and answered at once, or takes it with a ticket, and the
    /// request waits for the answer to that ticket ([`Reply::Wait`]).
    pub fn write(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        conn: ConnId,
        w: Write,
    ) -> Result<Reply, ApiError> {
        if let Write::Response(r) | Write::Part(r) = &w {
            // The agent is online from its request on, whatever its answer.
            self.agent_seen(now, &r.session_id, true);
        }
        if self.budget_full_for(&w) {
            return Err(self.refuse());
        }
        // A part of a session that does not exist is refused at once.
        if matches!(w, Write::Part(_))
            && !self.store.contains(w.session())
            && self.holds_every_session()
        {
            return self.decide_write(now, unix_ms, w);
        }
        let (tickets, issued) = (&mut self.tickets, &mut self.issued);
        let ticket = || issue(tickets, issued, conn);
        let submitted = self.engine.submit(&self.store, ticket, &w, unix_ms)?;
        if submitted == Submit::Load {
            // Its session is read first; the part is decided then.
            if let Some(t) = self.issued {
                self.held.insert(t.n, (w.into_owned(unix_ms), unix_ms));
            }
            return Ok(Reply::Wait);
        }
        if submitted == Submit::Wait {
            // The session is in use from this request on: an idle sweep
            // while the write waits for the storage must not pick it, or
            // the collection, decided after the write, deletes what the
            // write stored and acknowledged.
            let _ = self.store.existing(now, w.session());
            // Named even before it exists (a prompt that creates it).
            let sid = self.store.key(w.session()).cloned();
            if let (Some(t), Some(sid)) = (self.issued, sid.or_else(|| SessionId::new(w.session())))
            {
                self.writing.insert(t.n, sid);
            }
            return Ok(Reply::Wait);
        }
        self.decide_write(now, unix_ms, w)
    }

    /// A write the engine handed back to be decided on the loop's log:
    /// decided, applied and answered now.
    fn decide_write(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        w: Write,
    ) -> Result<Reply, ApiError> {
        let decided = match w {
            // Decided like any write, on a view: the relay keeps the part
            // for its draft.
            Write::Part(r) => {
                let view = Write::Part(r.view());
                match self.decide_now(now, |store, out| store.decide(now, unix_ms, view, out))? {
                    (Outcome::Part { id }, _) => return self.post_partial(now, r, id),
                    decided => decided,
                }
            }
            w => self.decide_now(now, |store, out| store.decide(now, unix_ms, w, out))?,
        };
        let (outcome, delivered) = decided;
        if let Outcome::Deleted { sid } = &outcome {
            info!(session_id = sid.as_str(); "session deleted");
        }
        Ok(Reply::Now(self.ack(outcome, delivered)))
    }

    /// Drops sessions nobody here is connected to and nobody touched for the
    /// TTL (where the engine keeps the sessions for several instances:
    /// forgets the copies nobody here used lately, and the engine deletes
    /// the sessions past the TTL). Called from the shell's periodic sweep.
    pub fn collect_idle(&mut self, now: Millis) -> usize {
        let ttl = self.limits.session_ttl_ms;
        let after = self.engine.idle_after(ttl);
        let presence = &self.presence;
        let writing: HashSet<&str> = self.writing.values().map(SessionId::as_str).collect();
        let mut idle = self.store.idle(|sid, log| {
            !presence.contains_key(sid)
                && !writing.contains(sid)
                && now.since(log.last_active) >= after
        });
        idle.extend(self.resident.idle(now, after, &writing));
        let n = idle.len();
        let tickets = &mut self.tickets;
        let ticket = || next_ticket(tickets, NOBODY);
        match self
            .engine
            .collect(&self.store, idle, ticket, &self.presence, ttl)
        {
            Collect::Delete(sids) => {
                let records = sids.into_iter().map(|sid| Record::Deleted { sid });
                self.apply(now, records);
            }
            Collect::Forget(sids) => {
                for sid in &sids {
                    self.store.forget(sid);
                    self.live.remove(sid);
                }
                return n;
            }
            Collect::Sent => {}
        }
        if n > 0 {
            debug!(count = n; "idle sessions collected");
        }
        n
    }
}

#[cfg(test)]
mod tests;

/// Logs a page refused because a stored message it would carry was read
/// back damaged (a server fault: the operator has a row to repair).
fn damaged(sid: &str, e: &ApiError) {
    if e.status == 500 {
        log::error!(session_id = sid, details = e.details.as_deref().unwrap_or(""); "stored message damaged; page answered 500");
    }
}
