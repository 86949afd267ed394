//! The in-memory engine: every session's log in one map. It decides and
//! commits in the same call (dedupe, `seq`, caps, trimming), so what it
//! returns is already visible to every reader.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::Rc;

use log::debug;
use uuid::Builder;

use super::log::{Cursor, Refill, SessionLog};
use super::message::{Message, Parts};
use super::record::Record;
use super::types::{Seq, SessionId};
use crate::relay::model::{self, NewPrompt, NewResponse};
use crate::relay::{ApiError, MessagesQuery};
use crate::time::{Millis, UnixMillis};

/// The limits the engine enforces.
#[derive(Clone, Copy, Debug)]
pub struct StoreLimits {
    pub history_limit: usize,
    pub max_sessions: usize,
    pub max_pending: usize,
}

/// What applying a committed change means for the relay.
#[derive(Debug)]
pub enum Applied {
    Nothing,
    /// A prompt was stored: wake the session's parked polls.
    Prompt,
    /// An answer was stored: deliver its frame.
    Response {
        seq: Seq,
        prev: Seq,
        frame: Rc<[u8]>,
    },
    /// The session is gone: answer its polls 404, close its subscribers.
    Deleted,
}

/// What `POST /prompt` did.
#[derive(Debug, PartialEq, Eq)]
pub struct PromptStored {
    pub client_msg_id: Rc<str>,
    /// The new prompt's `seq`; `None` for a resend (nothing stored).
    pub seq: Option<Seq>,
}

/// What `POST /response` did.
#[derive(Debug)]
pub enum ResponseStored {
    /// A resend of a stored answer: nothing stored.
    Duplicate { assistant_msg_id: Rc<str> },
    /// A new assistant message, to be delivered to the subscribers.
    New {
        assistant_msg_id: Rc<str>,
        seq: Seq,
        /// The previous assistant message's `seq` (0 if none).
        prev: Seq,
        frame: Rc<[u8]>,
    },
}

/// Every session's log.
pub struct MemStore {
    limits: StoreLimits,
    sessions: HashMap<SessionId, SessionLog>,
    ids: IdGen,
}

impl MemStore {
    /// An empty store with these limits.
    pub fn new(limits: StoreLimits) -> MemStore {
        MemStore {
            limits,
            sessions: HashMap::new(),
            ids: IdGen::new(),
        }
    }

    /// Sessions stored.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is stored.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Whether the session cap is reached (`/readyz` reports it).
    pub fn full(&self) -> bool {
        self.sessions.len() >= self.limits.max_sessions
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

    /// The session, without touching it, if it exists.
    pub fn get(&self, sid: &str) -> Option<&SessionLog> {
        self.sessions.get(sid)
    }

    /// The session, without touching it, if it exists.
    pub fn get_mut(&mut self, sid: &str) -> Option<&mut SessionLog> {
        self.sessions.get_mut(sid)
    }

    /// The session, created if needed (503 at the session cap), touched as
    /// active; and whether it was created.
    pub fn get_or_create(
        &mut self,
        now: Millis,
        sid: &SessionId,
    ) -> Result<(&mut SessionLog, bool), ApiError> {
        let created = if self.sessions.contains_key(sid) {
            false
        } else if self.full() {
            return Err(ApiError::unavailable("session limit reached"));
        } else {
            let epoch: Rc<str> = self.ids.uuid().into();
            self.sessions
                .insert(sid.clone(), SessionLog::new(now, epoch));
            true
        };
        let s = self.existing(now, sid)?;
        Ok((s, created))
    }

    /// `POST /prompt`: dedupe, assign `seq`, append.
    pub fn post_prompt(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        p: &NewPrompt,
    ) -> Result<PromptStored, ApiError> {
        let StoreLimits {
            history_limit,
            max_pending,
            ..
        } = self.limits;
        let (id, id_literal) = id_and_literal(&p.client_msg_id, &mut self.ids);
        let (s, _) = self.get_or_create(now, &p.session_id)?;
        if s.has_prompt(&id) {
            debug!(session_id = p.session_id.as_str(), client_msg_id = &*id; "duplicate prompt");
            return Ok(PromptStored {
                client_msg_id: id,
                seq: None,
            });
        }
        if s.pending_len() >= max_pending {
            return Err(ApiError::unavailable(
                "pending prompt limit reached for this session",
            ));
        }
        let seq = s.take_seq();
        let ts = p.ts.unwrap_or(unix_ms);
        let parts = Parts {
            session_id: &p.session_id,
            id_literal: &id_literal,
            prompt_id: None,
            text: p.prompt.get(),
            metadata: p.metadata.map(|m| m.get()),
            ts,
            seq,
        };
        s.append_prompt(Message::prompt(id.clone(), &parts), history_limit);
        debug!(session_id = p.session_id.as_str(), client_msg_id = &*id, seq = seq.get(); "prompt stored");
        Ok(PromptStored {
            client_msg_id: id,
            seq: Some(seq),
        })
    }

    /// `POST /response`: 404s, dedupe or conflict, assign `seq`, append.
    pub fn post_response(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        r: &NewResponse,
    ) -> Result<ResponseStored, ApiError> {
        let history_limit = self.limits.history_limit;
        let (id, id_literal) = id_and_literal(&r.assistant_msg_id, &mut self.ids);
        let s = self.existing(now, &r.session_id)?;
        if r.assistant_msg_id.is_some()
            && let Some(prev) = s.response(&id)
        {
            // A resend repeats the prompt and the text (compared decoded, so
            // a different escaping of the same text is the same text).
            if *prev.client_msg_id == *r.client_msg_id && prev.text() == model::decode(r.text.get())
            {
                return Ok(ResponseStored::Duplicate {
                    assistant_msg_id: id,
                });
            }
            return Err(ApiError::conflict());
        }
        let prompt_id = s
            .prompt_id(&r.client_msg_id)
            .ok_or_else(ApiError::prompt_not_found)?;
        let seq = s.take_seq();
        let ts = r.ts.unwrap_or(unix_ms);
        let parts = Parts {
            session_id: &r.session_id,
            id_literal: &id_literal,
            prompt_id: Some(&prompt_id),
            text: r.text.get(),
            metadata: r.metadata.map(|m| m.get()),
            ts,
            seq,
        };
        let msg = Message::assistant(prompt_id.clone(), id.clone(), &parts);
        let frame = msg.frame().cloned().unwrap_or_else(|| Rc::from(&[][..]));
        let prev = s.append_response(msg, history_limit);
        debug!(session_id = r.session_id.as_str(), client_msg_id = &*prompt_id, assistant_msg_id = &*id, seq = seq.get(); "response posted");
        Ok(ResponseStored::New {
            assistant_msg_id: id,
            seq,
            prev,
            frame,
        })
    }

    /// Puts a restored or committed session in place (its epoch chosen by
    /// the storage thread).
    pub fn insert(&mut self, sid: SessionId, log: SessionLog) {
        self.sessions.insert(sid, log);
    }

    /// Applies a change the storage thread committed; returns what the
    /// relay must do about it (wake polls, deliver an answer).
    pub fn apply(&mut self, now: Millis, record: &Record) -> Applied {
        let limit = self.limits.history_limit;
        match record {
            Record::Created { sid, epoch } => {
                self.insert(sid.clone(), SessionLog::new(now, Rc::from(epoch.as_str())));
                Applied::Nothing
            }
            Record::Prompt {
                sid,
                seq,
                ts,
                client_msg_id,
                data,
            } => {
                let Some(log) = self.sessions.get_mut(sid) else {
                    return Applied::Nothing;
                };
                log.last_active = now;
                let msg = Message::prompt_with(
                    Rc::from(client_msg_id.as_str()),
                    *seq,
                    *ts,
                    data.as_bytes().to_vec(),
                );
                log.append_prompt(msg, limit);
                Applied::Prompt
            }
            Record::Response {
                sid,
                seq,
                ts,
                client_msg_id,
                assistant_msg_id,
                data,
            } => {
                let Some(log) = self.sessions.get_mut(sid) else {
                    return Applied::Nothing;
                };
                log.last_active = now;
                let cid = log
                    .prompt_id(client_msg_id)
                    .unwrap_or_else(|| Rc::from(client_msg_id.as_str()));
                let msg = Message::assistant_with(
                    cid,
                    Rc::from(assistant_msg_id.as_str()),
                    *seq,
                    *ts,
                    data.as_bytes(),
                );
                let frame = msg.frame().cloned().unwrap_or_else(|| Rc::from(&[][..]));
                let prev = log.append_response(msg, limit);
                Applied::Response {
                    seq: *seq,
                    prev,
                    frame,
                }
            }
            Record::Deleted { sid } => {
                self.sessions.remove(sid);
                Applied::Deleted
            }
        }
    }

    /// `DELETE /sessions/{sid}`: drops the log; 404 if there is none.
    pub fn delete(&mut self, sid: &str) -> Result<(), ApiError> {
        self.sessions
            .remove(sid)
            .map(|_| ())
            .ok_or_else(ApiError::session_not_found)
    }

    /// `GET /messages/{sid}`: a page of history.
    pub fn messages(
        &mut self,
        now: Millis,
        sid: &str,
        q: &MessagesQuery,
    ) -> Result<Vec<u8>, ApiError> {
        Ok(self.existing(now, sid)?.messages_page(sid, q))
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

    /// The sessions `idle` picks, by id.
    pub fn idle(&self, mut idle: impl FnMut(&str, &SessionLog) -> bool) -> Vec<SessionId> {
        self.sessions
            .iter()
            .filter(|(sid, log)| idle(sid, log))
            .map(|(sid, _)| sid.clone())
            .collect()
    }

    /// Drops the sessions for which `idle` says so. Called from the
    /// periodic sweep.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &SessionLog) -> bool) -> usize {
        let before = self.sessions.len();
        self.sessions.retain(|sid, s| keep(sid, s));
        before - self.sessions.len()
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
