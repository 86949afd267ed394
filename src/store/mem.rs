//! The in-memory engine: every session's log in one map. It decides each
//! write against the log (dedupe, `seq`, caps, epochs, conflicts) and
//! answers with its outcome and the [`Record`]s that carry it out, changing
//! nothing yet; the relay then applies those records through
//! [`MemStore::apply`], the same path the storage thread's committed records
//! take. With persistence the map is the loop's copy of the database, and
//! only reads and `apply` touch it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::Rc;

use log::debug;
use uuid::Builder;

use super::arrivals::Arrivals;
use super::log::weight::Meter;
use super::log::{Cursor, PromptState, Refill, SessionLog};
use super::message::{Message, Parts, cancel_data};
use super::model::{GivenId, NewCancel, NewPrompt, NewResponse, Write};
use super::record::{Outcome, Record};
use super::types::MessagesQuery;
use super::types::{Scope, Seq, SessionId};
use crate::error::ApiError;
use crate::time::{Millis, UnixMillis};
use crate::wire::{decode, push_json_str};

mod asks;
mod budget;
mod clock;

/// The limits the engine enforces.
#[derive(Clone, Copy, Debug)]
pub struct StoreLimits {
    pub history_limit: usize,
    pub max_sessions: usize,
    pub max_pending: usize,
    /// How long a draft waits for its next part (drafts live in the
    /// store only with Redis).
    pub draft_timeout_ms: u64,
}

/// What applying a committed change means for the relay. The ids are the
/// stored message's own, shared.
#[derive(Debug)]
pub enum Applied {
    Nothing,
    /// A prompt was stored: wake the session's parked polls.
    Prompt {
        sid: SessionId,
    },
    /// An answer was stored: deliver its frame.
    Response {
        sid: SessionId,
        seq: Seq,
        /// The previous assistant message's `seq` (0 if none).
        prev: Seq,
        frame: Rc<[u8]>,
        assistant_msg_id: Rc<str>,
    },
    /// A prompt was cancelled: end its drafts, deliver the cancel's frame.
    Cancel {
        sid: SessionId,
        seq: Seq,
        /// The previous framed message's `seq` (0 if none).
        prev: Seq,
        frame: Rc<[u8]>,
        /// The prompt it stopped.
        client_msg_id: Rc<str>,
    },
    /// The session is gone: answer its polls 404, close its subscribers.
    Deleted {
        sid: SessionId,
    },
    /// An ask was stored: deliver its frame. `forgotten`: the asks the log
    /// no longer knows (their rows go).
    Ask {
        sid: SessionId,
        seq: Seq,
        prev: Seq,
        frame: Rc<[u8]>,
        forgotten: Vec<Seq>,
    },
    /// A reply was stored: deliver its frame, and answer the polls waiting
    /// on its ask. `forgotten`: the ask, when history had dropped it.
    Reply {
        sid: SessionId,
        seq: Seq,
        prev: Seq,
        frame: Rc<[u8]>,
        ask_id: Rc<str>,
        forgotten: Option<Seq>,
    },
}

/// Every session's log.
pub struct MemStore {
    limits: StoreLimits,
    /// Boxed: the table keeps room for up to twice its entries, and the
    /// allocator keeps the blocks of the tables it outgrew, so a slot
    /// holding the log inline would cost several times the log's size for
    /// every session; a box costs its size once.
    sessions: HashMap<SessionId, Box<SessionLog>>,
    ids: IdGen,
    /// Every session's pending prompts in arrival order.
    arrivals: Arrivals,
    /// The bytes the logs hold ([`budget`]), each log's share kept by it.
    meter: Meter,
    /// The bytes held beside the logs for their sessions: drafts, and
    /// the connections' output queues.
    beside: Meter,
    /// The most one append grows a log's tables by ([`budget::most_growth`]).
    most_growth: usize,
    /// The order in which sessions leave memory, where they do.
    clock: clock::Clock,
    /// Sessions that exist in the storage and that this copy does not
    /// hold (a cache's: [`evict`](Self::evict)ed, or never read): the
    /// session cap counts them with those held.
    absent: usize,
}

impl MemStore {
    /// An empty store with these limits.
    pub fn new(limits: StoreLimits) -> MemStore {
        MemStore {
            limits,
            sessions: HashMap::new(),
            ids: IdGen::new(),
            arrivals: Arrivals::default(),
            meter: Meter::default(),
            beside: Meter::default(),
            most_growth: budget::most_growth(&limits),
            clock: clock::Clock::default(),
            absent: 0,
        }
    }

    /// Where what is held beside the logs for their sessions (drafts,
    /// output queues) counts on the memory budget.
    pub fn beside(&self) -> &Meter {
        &self.beside
    }

    /// The limits it enforces.
    pub fn limits(&self) -> StoreLimits {
        self.limits
    }

    /// Every session held, with its log.
    pub fn iter(&self) -> impl Iterator<Item = (&SessionId, &SessionLog)> {
        self.sessions.iter().map(|(sid, log)| (sid, &**log))
    }

    /// Sessions stored.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is stored.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Sessions stored: those held and those the storage holds for this
    /// copy.
    pub fn stored(&self) -> usize {
        self.sessions.len() + self.absent
    }

    /// Whether the session cap is reached (`/readyz` reports it): the
    /// sessions held and those the storage holds for this copy.
    pub fn full(&self) -> bool {
        self.sessions.len() + self.absent >= self.limits.max_sessions
    }

    /// This copy is a cache of a storage that holds `n` sessions it does
    /// not hold yet (none read): they count for the session cap. Called
    /// once, on an empty copy.
    pub fn set_absent(&mut self, n: usize) {
        self.absent = n;
    }

    /// Drops the copy of a session the storage keeps, which still counts
    /// for the session cap; false if it was not held.
    pub fn evict(&mut self, sid: &str) -> bool {
        let held = self.sessions.contains_key(sid);
        if held {
            self.drop_session(sid);
            self.absent += 1;
        }
        held
    }

    /// A session this copy did not hold was deleted from the storage: it
    /// no longer counts for the session cap.
    pub fn absent_deleted(&mut self) {
        self.absent = self.absent.saturating_sub(1);
    }

    /// Puts a session read back from the storage in place (one of the
    /// absent ones, see [`evict`](Self::evict)); its pending prompts
    /// arrive now, in `seq` order.
    pub fn reload(&mut self, sid: SessionId, log: impl Into<Box<SessionLog>>) {
        if !self.sessions.contains_key(&*sid) {
            self.absent = self.absent.saturating_sub(1);
        }
        self.insert(sid, log);
    }

    /// Whether a session exists.
    pub fn contains(&self, sid: &str) -> bool {
        self.sessions.contains_key(sid)
    }

    /// The session, touched as active, or 404.
    pub fn existing(&mut self, now: Millis, sid: &str) -> Result<&mut SessionLog, ApiError> {
        let s = self
            .sessions
            .get_mut(sid)
            .ok_or_else(ApiError::session_not_found)?;
        s.last_active = now;
        Ok(s)
    }

    /// The id as stored, shared, if the session exists.
    pub fn key(&self, sid: &str) -> Option<&SessionId> {
        self.sessions.get_key_value(sid).map(|(k, _)| k)
    }

    /// The id as stored and the session, in one lookup.
    pub fn key_and_log(&self, sid: &str) -> Option<(&SessionId, &SessionLog)> {
        self.sessions.get_key_value(sid).map(|(k, v)| (k, &**v))
    }

    /// The session, without touching it, if it exists.
    pub fn get(&self, sid: &str) -> Option<&SessionLog> {
        self.sessions.get(sid).map(|s| &**s)
    }

    /// The session, without touching it, if it exists.
    pub fn get_mut(&mut self, sid: &str) -> Option<&mut SessionLog> {
        self.sessions.get_mut(sid).map(|s| &mut **s)
    }

    /// A client's write, decided by its rule below: its outcome, and its
    /// records pushed onto `out`. The one entry for every write, here and
    /// on the storage thread.
    pub fn decide(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        w: Write,
        out: &mut Vec<Record>,
    ) -> Result<Outcome, ApiError> {
        match w {
            Write::Prompt(p) => self.prompt(now, unix_ms, p, out),
            Write::Response(r) => self.response(now, unix_ms, r, out),
            Write::Part(r) => self.part(now, r),
            Write::Cancel(c) => self.cancel(now, unix_ms, c, out),
            Write::Ask(a) => self.ask(now, unix_ms, a, out),
            Write::Reply(r) => self.reply(now, unix_ms, r, out),
            Write::Create { sid, put } => self.create(now, &sid, put, out),
            Write::Delete { sid } => self.delete(&sid, out),
        }
    }

    /// `POST /prompt`, decided: the session created if needed (503 at the
    /// session cap), a resend of a stored id answered as a duplicate, 503 at
    /// the pending cap, else the next `seq`. Pushes onto `out` the records
    /// that carry it out (nothing when it is refused) and touches the
    /// session as active; changes nothing else.
    pub fn prompt(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        p: NewPrompt,
        out: &mut Vec<Record>,
    ) -> Result<Outcome, ApiError> {
        let max_pending = self.limits.max_pending;
        let full = self.full();
        let (id, id_literal) = id_and_literal(p.client_msg_id, &mut self.ids);
        let seq = match self.sessions.get_mut(&*p.session_id) {
            Some(s) => {
                s.last_active = now;
                if s.has_prompt(&id) {
                    // A resend repeats the text (compared decoded); another
                    // text under the same id is a mistake the client is
                    // told of. Once only the id is remembered, a resend is
                    // all it can be.
                    if s.prompt_text(&id).is_some_and(|t| t != decode(&p.prompt)) {
                        return Err(ApiError::prompt_conflict());
                    }
                    debug!(session_id = p.session_id.as_str(), client_msg_id = id.as_str(); "duplicate prompt");
                    return Ok(Outcome::Prompt {
                        sid: p.session_id,
                        id,
                        seq: Seq(0),
                        duplicate: true,
                    });
                }
                if s.pending_with_asks(unix_ms) >= max_pending {
                    return Err(ApiError::unavailable(
                        "pending prompt limit reached for this session",
                    ));
                }
                s.next_seq()
            }
            // A new session has no prompts, and the pending cap is at
            // least 1.
            None if full => return Err(ApiError::unavailable("session limit reached")),
            None => {
                out.push(Record::Created {
                    sid: p.session_id.clone(),
                    epoch: self.ids.uuid(),
                });
                Seq::FIRST
            }
        };
        let ts = p.ts.unwrap_or(unix_ms);
        let data = Parts {
            session_id: &p.session_id,
            id_literal: &id_literal,
            prompt_id: None,
            text: &p.prompt,
            metadata: p.metadata.as_deref(),
            ts,
            seq,
        }
        .data();
        out.push(Record::Prompt {
            sid: p.session_id.clone(),
            seq,
            ts,
            client_msg_id: id.clone(),
            data,
        });
        Ok(Outcome::Prompt {
            sid: p.session_id,
            id,
            seq,
            duplicate: false,
        })
    }

    /// `POST /response`, decided: 404 for the session, a resend of a stored
    /// answer (same prompt, same text) answered as a duplicate and any other
    /// reuse of its id refused 409, 404 for the prompt, else the next `seq`.
    /// Pushes onto `out` the record that carries it out (nothing when it is
    /// refused or a resend) and touches the session as active.
    pub fn response(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        r: NewResponse,
        out: &mut Vec<Record>,
    ) -> Result<Outcome, ApiError> {
        let given = r.assistant_msg_id.is_some();
        let (id, id_literal) = id_and_literal(r.assistant_msg_id, &mut self.ids);
        let s = self.existing(now, &r.session_id)?;
        if given && let Some(prev) = s.response(&id) {
            // A resend repeats the prompt and the text (compared decoded, so
            // a different escaping of the same text is the same text).
            if *prev.client_msg_id == *r.client_msg_id {
                // A stored answer read back damaged cannot be compared:
                // this resend alone is refused, as a server fault.
                if prev.msg.is_damaged() {
                    let seq = prev.msg.seq.get();
                    log::error!(session_id = r.session_id.as_str(), seq = seq; "stored message damaged; its resend answered 500");
                    return Err(ApiError::stored_message_damaged(seq));
                }
                if prev.text() == decode(&r.text) {
                    return Ok(Outcome::Response {
                        sid: r.session_id,
                        id,
                        seq: Seq(0),
                        duplicate: true,
                    });
                }
            }
            return Err(ApiError::conflict());
        }
        match s.prompt_state(&r.client_msg_id) {
            PromptState::Unknown => return Err(ApiError::prompt_not_found()),
            PromptState::Cancelled(_) => return Err(ApiError::prompt_cancelled()),
            PromptState::Pending | PromptState::Answered => {}
        }
        let seq = s.next_seq();
        let ts = r.ts.unwrap_or(unix_ms);
        let data = Parts {
            session_id: &r.session_id,
            id_literal: &id_literal,
            prompt_id: Some(&r.client_msg_id),
            text: &r.text,
            metadata: r.metadata.as_deref(),
            ts,
            seq,
        }
        .framed();
        out.push(Record::Response {
            sid: r.session_id.clone(),
            seq,
            ts,
            client_msg_id: r.client_msg_id.into_owned(),
            assistant_msg_id: id.clone(),
            data,
        });
        Ok(Outcome::Response {
            sid: r.session_id,
            id,
            seq,
            duplicate: false,
        })
    }

    /// A part of a streamed answer (`POST /response` with `"partial":
    /// true`), decided by what the log says of it: 404 for the session, 409
    /// if an answer with its id is stored, 404 for the prompt. It changes
    /// no log, so it has no records: the relay appends it to its draft,
    /// which is live state no engine but Redis keeps (`relay/drafts.rs`),
    /// and that draft's own rules (its prompt, its size, the draft cap)
    /// come after these.
    pub fn part(&mut self, now: Millis, r: NewResponse) -> Result<Outcome, ApiError> {
        let s = self.existing(now, &r.session_id)?;
        let Some((id, _)) = r.assistant_msg_id else {
            return Err(ApiError::missing_field("assistant_msg_id"));
        };
        if s.response(&id).is_some() {
            return Err(ApiError::conflict());
        }
        match s.prompt_state(&r.client_msg_id) {
            PromptState::Unknown => return Err(ApiError::prompt_not_found()),
            PromptState::Cancelled(_) => return Err(ApiError::prompt_cancelled()),
            PromptState::Pending | PromptState::Answered => {}
        }
        Ok(Outcome::Part {
            id: id.into_owned(),
        })
    }

    /// `POST /cancel`, decided: 404 for the session and for a prompt
    /// neither pending nor in history, 409 for a prompt answered already,
    /// a prompt cancelled already answered as a duplicate (with the stored
    /// cancel's `seq`), else the next `seq`. Pushes onto `out` the record
    /// that carries it out (nothing when it is refused or a resend) and
    /// touches the session as active.
    pub fn cancel(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        c: NewCancel,
        out: &mut Vec<Record>,
    ) -> Result<Outcome, ApiError> {
        let s = self.existing(now, &c.session_id)?;
        let seq = match s.prompt_state(&c.client_msg_id) {
            PromptState::Unknown => return Err(ApiError::prompt_not_found()),
            PromptState::Answered => return Err(ApiError::prompt_answered()),
            PromptState::Cancelled(seq) => {
                return Ok(Outcome::Cancel {
                    sid: c.session_id,
                    id: c.client_msg_id.into_owned(),
                    seq,
                    duplicate: true,
                });
            }
            PromptState::Pending => s.next_seq(),
        };
        let ts = c.ts.unwrap_or(unix_ms);
        let data = cancel_data(
            &c.session_id,
            &c.client_msg_id,
            c.reason.as_deref(),
            ts,
            seq,
        );
        let id = c.client_msg_id.into_owned();
        out.push(Record::Cancel {
            sid: c.session_id.clone(),
            seq,
            ts,
            client_msg_id: id.clone(),
            data,
        });
        Ok(Outcome::Cancel {
            sid: c.session_id,
            id,
            seq,
            duplicate: false,
        })
    }

    /// A session to create if needed (`PUT /sessions`, `put`, or a
    /// WebSocket connect), decided: an existing one is touched as active,
    /// a new one gets a fresh epoch (503 at the session cap).
    pub fn create(
        &mut self,
        now: Millis,
        sid: &SessionId,
        put: bool,
        out: &mut Vec<Record>,
    ) -> Result<Outcome, ApiError> {
        let full = self.full();
        let (epoch, created) = match self.sessions.get_mut(&**sid) {
            Some(s) => {
                s.last_active = now;
                (s.epoch().to_string(), false)
            }
            None if full => return Err(ApiError::unavailable("session limit reached")),
            None => {
                let epoch = self.ids.uuid();
                out.push(Record::Created {
                    sid: sid.clone(),
                    epoch: epoch.clone(),
                });
                (epoch, true)
            }
        };
        Ok(Outcome::Session {
            sid: sid.clone(),
            epoch,
            created,
            put,
        })
    }

    /// `DELETE /sessions/{sid}`, decided: 404 if there is none.
    pub fn delete(&self, sid: &str, out: &mut Vec<Record>) -> Result<Outcome, ApiError> {
        let sid = self.key(sid).ok_or_else(ApiError::session_not_found)?;
        out.push(Record::Deleted { sid: sid.clone() });
        Ok(Outcome::Deleted { sid: sid.clone() })
    }

    /// The periodic sweep, decided: a deletion for every session `idle`
    /// picks. Returns how many.
    pub fn collect(
        &self,
        idle: impl FnMut(&str, &SessionLog) -> bool,
        out: &mut Vec<Record>,
    ) -> usize {
        let before = out.len();
        out.extend(
            self.idle(idle)
                .into_iter()
                .map(|sid| Record::Deleted { sid }),
        );
        out.len() - before
    }

    /// Drops every copy (Redis lost them all): no effect on anyone.
    pub fn forget_all(&mut self) {
        self.sessions.clear();
        self.arrivals.clear();
    }

    /// Drops the copy of a session (Redis keeps it): no effect on anyone.
    pub fn forget(&mut self, sid: &str) {
        self.drop_session(sid);
    }

    /// Drops the session `sid`, if held, and its pending prompts from the
    /// arrival order, by the numbers its pending set keeps: a walk over
    /// this session's prompts, not over every session's.
    fn drop_session(&mut self, sid: &str) {
        if let Some(log) = self.sessions.remove(sid) {
            for n in log.pending_arrivals() {
                self.arrivals.left(n);
            }
        }
    }

    /// Puts a restored session in place (its epoch as stored); its
    /// pending prompts arrive now, in `seq` order.
    pub fn insert(&mut self, sid: SessionId, log: impl Into<Box<SessionLog>>) {
        let mut log = log.into();
        self.drop_session(&sid);
        log.number_all_pending(|seq| self.arrivals.arrived(&sid, seq));
        log.attach(&self.meter, sid.len());
        self.enter(&sid, &mut log);
        self.sessions.insert(sid, log);
    }

    /// Orders the pending prompts restored at start by their `ts` across
    /// sessions (then by session and `seq`), as they arrived before: they
    /// are numbered again from 0 in that order. Called once at start.
    pub fn order_restored(&mut self) {
        let mut all: Vec<(u64, SessionId, Seq)> = self
            .sessions
            .iter()
            .flat_map(|(sid, log)| log.page_all_pending().map(|m| (m.ts, sid.clone(), m.seq)))
            .collect();
        all.sort_unstable();
        self.arrivals = Arrivals::default();
        for (_, sid, seq) in all {
            let n = self.arrivals.arrived(&sid, seq);
            if let Some(log) = self.sessions.get_mut(&*sid) {
                log.number_pending(seq, n);
            }
        }
    }

    /// Every session's pending prompts, oldest arrival first.
    pub fn arrivals(&self) -> &Arrivals {
        &self.arrivals
    }

    /// Keeps the pending prompts `scope` covers indexed for its polls
    /// ([`Arrivals::keep`]).
    pub fn keep_scope(&mut self, scope: &Scope) {
        self.arrivals.keep(scope);
    }

    /// Applies a committed change (decided here or by the storage thread);
    /// returns what the relay must do about it (wake polls, deliver an
    /// answer, drop presence). Takes the record by value: its `data` moves
    /// into the stored message, or is copied once into an answer's frame.
    pub fn apply(&mut self, now: Millis, record: Record) -> Applied {
        let limit = self.limits.history_limit;
        match record {
            Record::Created { sid, epoch } => {
                self.insert(sid, Box::new(SessionLog::new(now, &epoch)));
                Applied::Nothing
            }
            Record::Prompt {
                sid,
                seq,
                ts,
                client_msg_id,
                data,
            } => {
                let Some(log) = self.sessions.get_mut(&*sid) else {
                    return Applied::Nothing;
                };
                log.last_active = now;
                let msg = Message::prompt_with(Rc::from(client_msg_id), seq, ts, data.into_bytes());
                if log.append_prompt(msg, limit) {
                    let n = self.arrivals.arrived(&sid, seq);
                    log.number_pending(seq, n);
                }
                Applied::Prompt { sid }
            }
            Record::Response {
                sid,
                seq,
                ts,
                client_msg_id,
                assistant_msg_id,
                data,
            } => {
                let Some(log) = self.sessions.get_mut(&*sid) else {
                    return Applied::Nothing;
                };
                log.last_active = now;
                let cid = log
                    .prompt_id(&client_msg_id)
                    .unwrap_or_else(|| Rc::from(client_msg_id));
                let aid: Rc<str> = Rc::from(assistant_msg_id);
                let msg = Message::assistant_framed(cid, aid.clone(), seq, ts, data);
                let frame = msg.frame().cloned().unwrap_or_else(|| Rc::from(&[][..]));
                let (prev, left) = log.append_response(msg, limit);
                if let Some(n) = left {
                    self.arrivals.left(n);
                }
                Applied::Response {
                    sid,
                    seq,
                    prev,
                    frame,
                    assistant_msg_id: aid,
                }
            }
            Record::Cancel {
                sid,
                seq,
                ts,
                client_msg_id,
                data,
            } => {
                let Some(log) = self.sessions.get_mut(&*sid) else {
                    return Applied::Nothing;
                };
                log.last_active = now;
                let cid = log
                    .prompt_id(&client_msg_id)
                    .unwrap_or_else(|| Rc::from(client_msg_id));
                let msg = Message::cancel_with(cid.clone(), seq, ts, data.as_bytes());
                let frame = msg.frame().cloned().unwrap_or_else(|| Rc::from(&[][..]));
                let (prev, left) = log.append_cancel(msg, limit);
                if let Some(n) = left {
                    self.arrivals.left(n);
                }
                Applied::Cancel {
                    sid,
                    seq,
                    prev,
                    frame,
                    client_msg_id: cid,
                }
            }
            Record::Deleted { sid } => {
                self.drop_session(&sid);
                Applied::Deleted { sid }
            }
            Record::Ask { .. } | Record::Reply { .. } => self.apply_asked(now, record),
        }
    }

    /// `GET /messages/{sid}`: a page of history.
    pub fn messages(
        &mut self,
        now: Millis,
        sid: &str,
        q: &MessagesQuery,
    ) -> Result<Vec<u8>, ApiError> {
        self.existing(now, sid)?.messages_page(sid, q)
    }

    /// Pulls what a subscriber of `sid` at `cursor` needs next (see
    /// [`SessionLog::refill`]); a session that is gone has nothing, and
    /// its subscribers are being closed.
    pub fn refill(
        &self,
        sid: &str,
        cursor: &mut Cursor,
        room: usize,
        empty: bool,
        out: &mut Vec<Rc<[u8]>>,
    ) -> Refill {
        match self.sessions.get(sid) {
            Some(s) => s.refill(cursor, room, empty, out),
            None => Refill {
                caught_up: true,
                resynced: false,
            },
        }
    }

    /// The sessions `idle` picks, by id, in the order of their ids (the
    /// map's own order changes from one process to the next, and what is
    /// done with them in turn would with it).
    pub fn idle(&self, mut idle: impl FnMut(&str, &SessionLog) -> bool) -> Vec<SessionId> {
        let mut picked: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(sid, log)| idle(sid, log))
            .map(|(sid, _)| sid.clone())
            .collect();
        picked.sort_unstable();
        picked
    }
}

/// Version 4 UUIDs from a keyed SipHash stream: the key comes from the OS
/// once per process (std's `RandomState`), so ids are unpredictable without
/// a system call for each one.
pub struct IdGen {
    keys: RandomState,
    counter: u64,
}

impl IdGen {
    /// A generator with fresh keys.
    pub fn new() -> IdGen {
        IdGen {
            keys: RandomState::new(),
            counter: 0,
        }
    }

    /// The next id, as its hyphenated string.
    pub fn uuid(&mut self) -> String {
        self.counter += 1;
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.keys.hash_one(self.counter).to_le_bytes());
        bytes[8..].copy_from_slice(&self.keys.hash_one(!self.counter).to_le_bytes());
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        Builder::from_random_bytes(bytes)
            .into_uuid()
            .hyphenated()
            .encode_lower(&mut text)
            .to_string()
    }
}

impl Default for IdGen {
    fn default() -> Self {
        IdGen::new()
    }
}

/// A message id as the client sent it, with its JSON literal spelled as
/// sent, or else a new UUID and its literal.
pub(super) fn id_and_literal<'a>(
    given: Option<GivenId<'a>>,
    ids: &mut IdGen,
) -> (String, Cow<'a, str>) {
    match given {
        Some((id, lit)) => (id.into_owned(), lit),
        None => {
            let uuid = ids.uuid();
            let mut lit = String::with_capacity(uuid.len() + 2);
            push_json_str(&mut lit, &uuid);
            (uuid, Cow::Owned(lit))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> MemStore {
        MemStore::new(StoreLimits {
            history_limit: 10,
            max_sessions: 1,
            max_pending: 2,
            draft_timeout_ms: 60_000,
        })
    }

    #[track_caller]
    fn prompt(body: &str) -> NewPrompt<'_> {
        NewPrompt::parse(body.as_bytes()).expect("a valid body")
    }

    #[test]
    fn a_decision_changes_nothing_until_its_records_are_applied() {
        let mut m = store();
        let mut out = Vec::new();
        let body = r#"{"session_id":"s","client_msg_id":"p1","prompt":"hi"}"#;
        let outcome = m.prompt(Millis(0), 7, prompt(body), &mut out).unwrap();
        assert_eq!(
            outcome,
            Outcome::Prompt {
                sid: SessionId::new("s").unwrap(),
                id: "p1".into(),
                seq: Seq(1),
                duplicate: false
            }
        );
        assert!(m.is_empty(), "decided, not applied");
        assert!(matches!(
            &out[..],
            [Record::Created { .. }, Record::Prompt { seq: Seq(1), .. }]
        ));
        for record in out.drain(..) {
            m.apply(Millis(0), record);
        }
        assert!(m.get("s").is_some_and(|s| s.has_prompt("p1")));
        // The same id again: a resend, with nothing to apply.
        let again = m.prompt(Millis(1), 8, prompt(body), &mut out).unwrap();
        assert_eq!(
            again,
            Outcome::Prompt {
                sid: SessionId::new("s").unwrap(),
                id: "p1".into(),
                seq: Seq(0),
                duplicate: true
            }
        );
        assert!(out.is_empty());
    }

    #[test]
    fn a_refused_write_has_no_records() {
        let mut m = store();
        let mut out = Vec::new();
        let sid = SessionId::new("s").unwrap();
        m.create(Millis(0), &sid, true, &mut out).unwrap();
        for record in out.drain(..) {
            m.apply(Millis(0), record);
        }
        let other = r#"{"session_id":"t","prompt":"hi"}"#;
        let e = m.prompt(Millis(0), 7, prompt(other), &mut out).unwrap_err();
        assert_eq!(e.status, 503, "session cap");
        let no_prompt = r#"{"session_id":"s","client_msg_id":"x","text":"t"}"#;
        let r = NewResponse::parse(no_prompt.as_bytes()).unwrap();
        assert_eq!(
            m.response(Millis(0), 7, r, &mut out).unwrap_err().status,
            404
        );
        assert!(m.delete("t", &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn a_part_and_a_deletion_are_decided_like_any_write() {
        let mut m = store();
        let mut out = Vec::new();
        let body = r#"{"session_id":"s","client_msg_id":"p1","prompt":"hi"}"#;
        m.decide(Millis(0), 7, Write::Prompt(prompt(body)), &mut out)
            .unwrap();
        for record in out.drain(..) {
            m.apply(Millis(0), record);
        }
        let part = |cid: &str| {
            let body = format!(
                r#"{{"session_id":"s","client_msg_id":"{cid}","assistant_msg_id":"a1","text":"x","partial":true}}"#
            );
            Write::answer(NewResponse::parse(body.as_bytes()).unwrap()).into_owned(0)
        };
        // A part the log accepts: its id, and nothing for the log.
        let outcome = m.decide(Millis(1), 8, part("p1"), &mut out).unwrap();
        assert_eq!(outcome, Outcome::Part { id: "a1".into() });
        assert!(out.is_empty());
        // A part of an answer to no prompt is refused by the same rules.
        let e = m.decide(Millis(1), 8, part("p2"), &mut out);
        assert_eq!(e.unwrap_err().status, 404);
        // A deletion says which session went, for the relay's log line.
        let sid = Cow::Borrowed("s");
        let outcome = m.decide(Millis(2), 9, Write::Delete { sid }, &mut out);
        let s = SessionId::new("s").unwrap();
        assert_eq!(outcome.unwrap(), Outcome::Deleted { sid: s.clone() });
        assert_eq!(out, [Record::Deleted { sid: s }]);
    }
}
