//! One session: its bounded history with `seq`, the pending-prompt index, the
//! dedupe maps, and the waiter and subscriber registries.
//!
//! Invariants: `history` holds at most `history_limit` messages in `seq`
//! order; `pending` holds exactly the unanswered prompts (also those already
//! trimmed from history); `prompts` has an entry for every prompt that is
//! pending or still in history, `responses` for every assistant message still
//! in history. So every map is bounded by `history_limit + max_pending`.

use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use super::ConnId;
use super::idmap::IdMap;
use super::model::{Kind, Message};
use crate::time::Millis;

/// What the dedupe map knows about a prompt.
#[derive(Debug)]
pub struct PromptEntry {
    pub seq: u64,
    pub answered: bool,
    pub in_history: bool,
}

/// What the dedupe map knows about an assistant message, to tell a resend
/// (same prompt, same text) from a conflict.
#[derive(Debug)]
pub struct ResponseEntry {
    pub client_msg_id: Rc<str>,
    pub msg: Rc<Message>,
}

impl ResponseEntry {
    /// The stored text, decoded (only a resend of the same id needs it).
    pub fn text(&self) -> String {
        #[derive(serde::Deserialize)]
        struct Text {
            text: String,
        }
        serde_json::from_str::<Text>(&self.msg.data).map_or_else(|_| String::new(), |t| t.text)
    }
}

/// A parked `GET /prompts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub conn: ConnId,
    pub after: Option<u64>,
}

/// A session's whole state.
#[derive(Debug)]
pub struct Session {
    pub epoch: Rc<str>,
    pub next_seq: u64,
    pub history: VecDeque<Rc<Message>>,
    pub prompts: IdMap<PromptEntry>,
    pub pending: BTreeMap<u64, Rc<Message>>,
    pub responses: IdMap<ResponseEntry>,
    pub waiters: Vec<Waiter>,
    pub subscribers: Vec<ConnId>,
    pub last_active: Millis,
}

impl Session {
    /// A new, empty session with a fresh epoch.
    pub fn new(now: Millis, epoch: Rc<str>) -> Session {
        Session {
            epoch,
            next_seq: 1,
            history: VecDeque::new(),
            prompts: IdMap::new(),
            pending: BTreeMap::new(),
            responses: IdMap::new(),
            waiters: Vec::new(),
            subscribers: Vec::new(),
            last_active: now,
        }
    }

    /// Takes the next sequence number.
    pub fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// The oldest retained `seq`, or the next one when nothing is retained.
    pub fn first_seq(&self) -> u64 {
        self.history.front().map_or(self.next_seq, |m| m.seq)
    }

    /// Appends to history, dropping the oldest messages past `limit` and the
    /// dedupe entries that only history kept alive.
    pub fn push_history(&mut self, msg: Rc<Message>, limit: usize) {
        self.history.push_back(msg);
        while self.history.len() > limit {
            let Some(old) = self.history.pop_front() else {
                break;
            };
            match old.kind {
                Kind::Prompt => {
                    let answered = match self.prompts.get_mut(&old.client_msg_id) {
                        Some(e) => {
                            e.in_history = false;
                            e.answered
                        }
                        None => false,
                    };
                    if answered {
                        self.prompts.remove(&old.client_msg_id);
                    }
                }
                Kind::Assistant => {
                    if let Some(id) = &old.assistant_msg_id {
                        self.responses.remove(id);
                    }
                }
            }
        }
    }

    /// Marks a prompt answered: it leaves the pending set, and its dedupe
    /// entry goes too if history no longer holds it.
    pub fn mark_answered(&mut self, client_msg_id: &str) {
        let Some(entry) = self.prompts.get_mut(client_msg_id) else {
            return;
        };
        if entry.answered {
            return;
        }
        entry.answered = true;
        self.pending.remove(&entry.seq);
        if !entry.in_history {
            self.prompts.remove(client_msg_id);
        }
    }

    /// `[…]` of the pending prompts with `seq > after`, oldest first.
    pub fn render_pending(&self, after: Option<u64>) -> Vec<u8> {
        let from = after.map_or(0, |a| a.saturating_add(1));
        let mut out = Vec::with_capacity(64);
        out.push(b'[');
        for (i, msg) in self.pending.range(from..).map(|(_, m)| m).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(msg.data.as_bytes());
        }
        out.push(b']');
        out
    }

    /// Whether any pending prompt has `seq > after`.
    pub fn has_pending_after(&self, after: Option<u64>) -> bool {
        let from = after.map_or(0, |a| a.saturating_add(1));
        self.pending.range(from..).next().is_some()
    }

    /// Removes `conn` from the waiter list; true if it was there.
    pub fn remove_waiter(&mut self, conn: ConnId) -> bool {
        match self.waiters.iter().position(|w| w.conn == conn) {
            Some(i) => {
                self.waiters.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Removes `conn` from the subscriber list; true if it was there.
    pub fn remove_subscriber(&mut self, conn: ConnId) -> bool {
        match self.subscribers.iter().position(|c| *c == conn) {
            Some(i) => {
                self.subscribers.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether the session may be collected: nobody connected, idle long enough.
    pub fn is_idle(&self, now: Millis, ttl_ms: u64) -> bool {
        self.waiters.is_empty()
            && self.subscribers.is_empty()
            && now.since(self.last_active) >= ttl_ms
    }
}
