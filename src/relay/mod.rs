//! The relay state machine: sessions, prompts, responses, history, waiters and
//! subscribers, and the semantics of every endpoint. Sans-IO: every call takes
//! `now` (and `unix_ms` where a `ts` is stamped), returns its own reply, and
//! queues work for *other* connections as [`Effect`]s that the I/O shell
//! applies after the handler returns. It never touches a socket or the clock.

pub mod error;
mod idmap;
pub mod model;
pub mod session;

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use std::rc::Rc;
use uuid::Builder;

use log::{debug, info};
use serde::Serialize;

pub use error::ApiError;
use model::{Kind, Message, NewPrompt, NewResponse, to_json};
pub use session::{PromptEntry, ResponseEntry, Session, Waiter};

use crate::time::{Millis, UnixMillis};

/// Largest `/messages` page body: with 128 KiB messages a full page of
/// 1000 would be 128 MiB held for one answer.
pub const MAX_PAGE_BYTES: usize = 4 << 20;

/// A connection's identity: slab key plus a generation, so a stale reference
/// to a reused slot never reaches the next connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub key: u32,
    pub generation: u32,
}

/// Work for another connection, applied by the shell after the handler.
#[derive(Debug, PartialEq, Eq)]
pub enum Effect {
    /// Answer a parked `GET /prompts` and return it to reading requests.
    Respond {
        to: ConnId,
        status: u16,
        body: Rc<[u8]>,
    },
    /// Close a WebSocket subscriber with this close code.
    CloseSubscriber { to: ConnId, code: u16 },
}

/// Limits the core enforces (a subset of `Config`).
#[derive(Clone, Debug)]
pub struct Limits {
    pub history_limit: usize,
    pub max_sessions: usize,
    pub max_pending: usize,
    pub max_waiters: usize,
    pub max_subscribers: usize,
    pub session_ttl_ms: u64,
}

impl Limits {
    /// The core's view of the server's settings.
    pub fn from_config(cfg: &crate::config::Config) -> Limits {
        Limits {
            history_limit: cfg.history_limit,
            max_sessions: cfg.max_sessions,
            max_pending: cfg.max_pending,
            max_waiters: cfg.max_waiters,
            max_subscribers: cfg.max_subscribers,
            session_ttl_ms: cfg.session_ttl.as_millis() as u64,
        }
    }
}

/// `GET /prompts` parameters, already validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptsQuery {
    pub timeout_ms: u64,
    pub wait: bool,
    pub after: Option<u64>,
}

/// `GET /messages` parameters, already validated and clamped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessagesQuery {
    pub limit: usize,
    pub offset: usize,
    pub since: Option<u64>,
    pub after: Option<u64>,
}

/// What `GET /prompts` does now.
#[derive(Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Answer at once with this JSON array.
    Ready(Vec<u8>),
    /// The connection is registered as a waiter; answer `[]` at the deadline.
    Park { deadline: Millis },
}

/// What `POST /response` stored.
#[derive(Debug)]
pub enum Posted {
    /// A resend of a stored response: answer at once, broadcast nothing.
    Duplicate(Vec<u8>),
    /// A new message: broadcast `payload` to the session's subscribers, then
    /// answer with [`response_ack`] and whether anyone got it.
    Stored {
        session_id: Rc<str>,
        assistant_msg_id: Rc<str>,
        payload: Rc<str>,
    },
}

/// The reply to a stored `POST /response`.
pub fn response_ack(assistant_msg_id: &str, delivered: bool) -> Vec<u8> {
    #[derive(Serialize)]
    struct Ack<'a> {
        ok: bool,
        assistant_msg_id: &'a str,
        delivered: bool,
    }
    to_json(&Ack {
        ok: true,
        assistant_msg_id,
        delivered,
    })
}

/// Counters for `/healthz`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub sessions: usize,
    pub subscribers: usize,
    pub parked_polls: usize,
}

/// All sessions and the effect outbox.
pub struct Relay {
    limits: Limits,
    sessions: HashMap<Box<str>, Session>,
    effects: Vec<Effect>,
    ids: IdGen,
    counts: Counts,
}

impl Relay {
    /// An empty relay with these limits.
    pub fn new(limits: Limits) -> Relay {
        Relay {
            limits,
            sessions: HashMap::new(),
            effects: Vec::new(),
            ids: IdGen::new(),
            counts: Counts::default(),
        }
    }

    /// Moves the queued effects out; called by the shell after every handler.
    pub fn take_effects(&mut self, out: &mut Vec<Effect>) {
        out.append(&mut self.effects);
    }

    /// Sessions, subscribers and parked polls, for `/healthz`.
    pub fn counts(&self) -> Counts {
        Counts {
            sessions: self.sessions.len(),
            ..self.counts
        }
    }

    /// Whether the session cap is reached (`/readyz` reports it).
    pub fn sessions_full(&self) -> bool {
        self.sessions.len() >= self.limits.max_sessions
    }

    /// The session, touched as active, or 404.
    fn existing(&mut self, now: Millis, sid: &str) -> Result<&mut Session, ApiError> {
        let s = self
            .sessions
            .get_mut(sid)
            .ok_or_else(ApiError::session_not_found)?;
        s.last_active = now;
        Ok(s)
    }

    /// The session, created if needed (503 at the session cap), and whether it
    /// was created.
    fn get_or_create(&mut self, now: Millis, sid: &str) -> Result<(&mut Session, bool), ApiError> {
        let full = self.sessions.len() >= self.limits.max_sessions;
        if !self.sessions.contains_key(sid) {
            if full {
                return Err(ApiError::unavailable("session limit reached"));
            }
            let epoch: Rc<str> = self.ids.uuid().into();
            self.sessions.insert(sid.into(), Session::new(now, epoch));
            let s = self
                .sessions
                .get_mut(sid)
                .ok_or_else(ApiError::session_not_found)?;
            return Ok((s, true));
        }
        let s = self
            .sessions
            .get_mut(sid)
            .ok_or_else(ApiError::session_not_found)?;
        s.last_active = now;
        Ok((s, false))
    }

    /// `POST /prompt`: store, dedupe, and wake every parked poll of the session.
    pub fn post_prompt(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        body: &[u8],
    ) -> Result<Vec<u8>, ApiError> {
        let p = NewPrompt::parse(body)?;
        let history_limit = self.limits.history_limit;
        let max_pending = self.limits.max_pending;
        let (id, id_literal) = id_and_literal(&p.client_msg_id, &mut self.ids);
        let (s, _) = self.get_or_create(now, &p.session_id)?;
        if s.prompts.contains_key(&id) {
            debug!(session_id = p.session_id.as_str(), client_msg_id = &*id; "duplicate prompt");
            return Ok(prompt_ack(&id, true));
        }
        if s.pending.len() >= max_pending {
            return Err(ApiError::unavailable(
                "pending prompt limit reached for this session",
            ));
        }
        let seq = s.take_seq();
        let ts = p.ts.unwrap_or(unix_ms);
        let msg = Rc::new(Message {
            seq,
            ts,
            kind: Kind::Prompt,
            client_msg_id: id.clone(),
            assistant_msg_id: None,
            data: model::prompt_data(&p.session_id, &id_literal, &p, ts, seq),
        });
        s.prompts.insert(
            id.clone(),
            PromptEntry {
                seq,
                answered: false,
                in_history: true,
            },
        );
        s.pending.insert(seq, msg.clone());
        s.push_history(msg, history_limit);
        debug!(session_id = p.session_id.as_str(), client_msg_id = &*id, seq = seq; "prompt stored");
        self.wake_waiters(&p.session_id);
        Ok(prompt_ack(&id, false))
    }

    /// Answers every waiter of `sid` whose pending set is now non-empty.
    fn wake_waiters(&mut self, sid: &str) {
        let Some(s) = self.sessions.get_mut(sid) else {
            return;
        };
        if s.waiters.is_empty() {
            return;
        }
        // Render once per distinct `after`; most waiters share one.
        let mut rendered: Vec<(Option<u64>, Rc<[u8]>)> = Vec::new();
        let mut kept = Vec::new();
        let waiting = s.waiters.len();
        for w in std::mem::take(&mut s.waiters) {
            if !s.has_pending_after(w.after) {
                kept.push(w);
                continue;
            }
            let body = match rendered.iter().find(|(a, _)| *a == w.after) {
                Some((_, b)) => b.clone(),
                None => {
                    let b: Rc<[u8]> = s.render_pending(w.after).into();
                    rendered.push((w.after, b.clone()));
                    b
                }
            };
            self.counts.parked_polls -= 1;
            self.effects.push(Effect::Respond {
                to: w.conn,
                status: 200,
                body,
            });
        }
        let woken = waiting - kept.len();
        s.waiters = kept;
        if woken > 0 {
            debug!(session_id = sid, woken = woken; "prompts fetched");
        }
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
        let max_waiters = self.limits.max_waiters;
        let s = self.existing(now, sid)?;
        if !q.wait || s.has_pending_after(q.after) {
            let body = s.render_pending(q.after);
            debug!(session_id = sid; "prompts fetched");
            return Ok(Fetch::Ready(body));
        }
        if q.timeout_ms == 0 {
            return Ok(Fetch::Ready(b"[]".to_vec()));
        }
        if s.waiters.len() >= max_waiters {
            return Err(ApiError::unavailable(
                "waiter limit reached for this session",
            ));
        }
        s.waiters.push(Waiter {
            conn,
            after: q.after,
        });
        self.counts.parked_polls += 1;
        Ok(Fetch::Park {
            deadline: Millis(now.0.saturating_add(q.timeout_ms)),
        })
    }

    /// Forgets a parked poll (timed out, hung up, or shut down).
    pub fn cancel_wait(&mut self, conn: ConnId, sid: &str, now: Millis) {
        if let Some(s) = self.sessions.get_mut(sid)
            && s.remove_waiter(conn)
        {
            // The idle time of a session starts when its last poll ends.
            s.last_active = now;
            self.counts.parked_polls -= 1;
        }
    }

    /// `POST /response`: store, dedupe or refuse, and hand the broadcast back.
    pub fn post_response(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        body: &[u8],
    ) -> Result<Posted, ApiError> {
        let r = NewResponse::parse(body)?;
        let history_limit = self.limits.history_limit;
        let (id, id_literal) = id_and_literal(&r.assistant_msg_id, &mut self.ids);
        let s = self.existing(now, &r.session_id)?;
        if r.assistant_msg_id.is_some()
            && let Some(prev) = s.responses.get(&id)
        {
            // A resend repeats the prompt and the text (compared decoded, so
            // a different escaping of the same text is the same text).
            if *prev.client_msg_id == *r.client_msg_id && prev.text() == model::decode(r.text.get())
            {
                let mut ack = response_ack(&id, false);
                ack.pop();
                ack.extend_from_slice(b",\"duplicate\":true}");
                return Ok(Posted::Duplicate(ack));
            }
            return Err(ApiError::conflict());
        }
        let Some((prompt_id, _)) = s.prompts.get_key_value(r.client_msg_id.as_str()) else {
            return Err(ApiError::prompt_not_found());
        };
        let prompt_id = prompt_id.clone();
        let seq = s.take_seq();
        let ts = r.ts.unwrap_or(unix_ms);
        let msg = Rc::new(Message {
            seq,
            ts,
            kind: Kind::Assistant,
            client_msg_id: prompt_id.clone(),
            assistant_msg_id: Some(id.clone()),
            data: model::assistant_data(&r.session_id, &id_literal, &prompt_id, &r, ts, seq),
        });
        s.mark_answered(&prompt_id);
        s.responses.insert(
            id.clone(),
            ResponseEntry {
                client_msg_id: prompt_id.clone(),
                msg: msg.clone(),
            },
        );
        let payload: Rc<str> = msg.ws_payload().into();
        s.push_history(msg, history_limit);
        debug!(session_id = r.session_id.as_str(), client_msg_id = &*prompt_id, assistant_msg_id = &*id, seq = seq; "response posted");
        Ok(Posted::Stored {
            session_id: r.session_id.into(),
            assistant_msg_id: id,
            payload,
        })
    }

    /// The subscribers of `sid`, for a broadcast.
    pub fn subscribers(&self, sid: &str) -> &[ConnId] {
        self.sessions.get(sid).map_or(&[], |s| &s.subscribers)
    }

    /// `WebSocket /ws/{sid}` after a successful upgrade check: creates the
    /// session if needed, registers `conn`, and returns the frames to send
    /// first (a `resync` and the replay), all in one call so nothing posted
    /// in between is lost.
    pub fn subscribe(
        &mut self,
        now: Millis,
        conn: ConnId,
        sid: &str,
        after: Option<u64>,
        epoch: Option<&str>,
    ) -> Result<Vec<String>, ApiError> {
        let max_subscribers = self.limits.max_subscribers;
        let (s, _) = self.get_or_create(now, sid)?;
        if s.subscribers.len() >= max_subscribers {
            return Err(ApiError::unavailable(
                "subscriber limit reached for this session",
            ));
        }
        let first_seq = s.first_seq();
        let epoch_changed = epoch.is_some_and(|e| e != &*s.epoch);
        let trimmed = after.is_some_and(|a| a.saturating_add(1) < first_seq);
        let mut frames = Vec::new();
        let replay_from = if epoch_changed || trimmed {
            #[derive(Serialize)]
            struct Resync<'a> {
                r#type: &'static str,
                epoch: &'a str,
                first_seq: u64,
            }
            let frame = to_json(&Resync {
                r#type: "resync",
                epoch: &s.epoch,
                first_seq,
            });
            frames.push(String::from_utf8(frame).unwrap_or_default());
            Some(first_seq)
        } else {
            after.map(|a| a.saturating_add(1))
        };
        if let Some(from) = replay_from {
            frames.extend(
                s.history
                    .iter()
                    .filter(|m| m.kind == Kind::Assistant && m.seq >= from)
                    .map(|m| m.ws_payload()),
            );
        }
        s.subscribers.push(conn);
        self.counts.subscribers += 1;
        Ok(frames)
    }

    /// Forgets a subscriber (closed for any reason).
    pub fn unsubscribe(&mut self, conn: ConnId, sid: &str, now: Millis) {
        if let Some(s) = self.sessions.get_mut(sid)
            && s.remove_subscriber(conn)
        {
            s.last_active = now;
            self.counts.subscribers -= 1;
        }
    }

    /// `GET /messages/{sid}`: a page of history, oldest first.
    pub fn messages(
        &mut self,
        now: Millis,
        sid: &str,
        q: MessagesQuery,
    ) -> Result<Vec<u8>, ApiError> {
        let s = self.existing(now, sid)?;
        let matching = s
            .history
            .iter()
            .filter(|m| q.since.is_none_or(|t| m.ts > t) && q.after.is_none_or(|a| m.seq > a));
        let mut total = 0usize;
        let mut returned = 0usize;
        let mut page_full = false;
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"session_id\":");
        out.extend_from_slice(&to_json(&sid));
        out.extend_from_slice(b",\"epoch\":");
        out.extend_from_slice(&to_json(&&*s.epoch));
        out.extend_from_slice(b",\"messages\":[");
        for m in matching {
            if total >= q.offset && returned < q.limit && !page_full {
                // A page stops before it passes MAX_PAGE_BYTES (it always
                // holds at least one message); `limit` then reports the
                // count applied, so the next page starts at offset + limit.
                if returned > 0 && out.len() + m.data.len() + 32 > MAX_PAGE_BYTES {
                    page_full = true;
                } else {
                    if returned > 0 {
                        out.push(b',');
                    }
                    m.write_history_entry(&mut out);
                    returned += 1;
                }
            }
            total += 1;
        }
        let limit = if page_full { returned } else { q.limit };
        out.extend_from_slice(
            format!(
                "],\"total\":{total},\"limit\":{limit},\"offset\":{}}}",
                q.offset
            )
            .as_bytes(),
        );
        Ok(out)
    }

    /// `PUT /sessions/{sid}`: create if needed.
    pub fn put_session(&mut self, now: Millis, sid: &str) -> Result<Vec<u8>, ApiError> {
        let (s, created) = self.get_or_create(now, sid)?;
        #[derive(Serialize)]
        struct Put<'a> {
            session_id: &'a str,
            epoch: &'a str,
            created: bool,
        }
        Ok(to_json(&Put {
            session_id: sid,
            epoch: &s.epoch,
            created,
        }))
    }

    /// `DELETE /sessions/{sid}`: parked polls get 404, subscribers close 1000.
    pub fn delete_session(&mut self, sid: &str) -> Result<Vec<u8>, ApiError> {
        let s = self
            .sessions
            .remove(sid)
            .ok_or_else(ApiError::session_not_found)?;
        let not_found: Rc<[u8]> = ApiError::session_not_found().body().into();
        for w in &s.waiters {
            self.effects.push(Effect::Respond {
                to: w.conn,
                status: 404,
                body: not_found.clone(),
            });
        }
        for &c in &s.subscribers {
            self.effects
                .push(Effect::CloseSubscriber { to: c, code: 1000 });
        }
        self.counts.parked_polls -= s.waiters.len();
        self.counts.subscribers -= s.subscribers.len();
        info!(session_id = sid; "session deleted");
        Ok(b"{\"deleted\":true}".to_vec())
    }

    /// Drops sessions nobody is connected to and nobody touched for the TTL.
    /// Called from the shell's periodic sweep.
    pub fn collect_idle(&mut self, now: Millis) -> usize {
        let ttl = self.limits.session_ttl_ms;
        let before = self.sessions.len();
        self.sessions.retain(|_, s| !s.is_idle(now, ttl));
        let collected = before - self.sessions.len();
        if collected > 0 {
            debug!(count = collected; "idle sessions collected");
        }
        collected
    }

    /// Whether a session exists (tests and `/readyz`).
    pub fn has_session(&self, sid: &str) -> bool {
        self.sessions.contains_key(sid)
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

/// `{"stored":true,"client_msg_id":…}`, plus `"duplicate":true` for a resend.
/// A message id as the client sent it, with its JSON literal spelled as
/// sent, or else a new UUID and its literal.
fn id_and_literal(
    given: &Option<(String, &serde_json::value::RawValue)>,
    ids: &mut IdGen,
) -> (Rc<str>, String) {
    match given {
        Some((id, raw)) => (Rc::from(id.as_str()), raw.get().to_string()),
        None => {
            let uuid = ids.uuid();
            let mut lit = String::with_capacity(uuid.len() + 2);
            model::push_json_str(&mut lit, &uuid);
            (Rc::from(uuid), lit)
        }
    }
}

fn prompt_ack(id: &str, duplicate: bool) -> Vec<u8> {
    #[derive(Serialize)]
    struct Ack<'a> {
        stored: bool,
        client_msg_id: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
    }
    to_json(&Ack {
        stored: true,
        client_msg_id: id,
        duplicate,
    })
}

#[cfg(test)]
mod tests;
