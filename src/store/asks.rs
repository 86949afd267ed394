//! A session's asks: the questions an agent asked (`POST /ask`) and what
//! became of each. An ask is pending state of its own beside the pending
//! prompts: open until its first reply, or until its `expires_ts`, which
//! is read against the clock of the request that looks, so nothing has to
//! wake to expire it.
//!
//! Which asks are known (the rule every engine keeps, the Lua script
//! too): an ask whose message history still holds, and an unanswered one
//! that has not expired; an answered or expired ask that history dropped
//! is forgotten, as an answered prompt is. An unanswered ask that left
//! history is kept until it is answered or, once expired, until the next
//! ask is stored: at most the open asks, which the pending cap bounds.
//!
//! The stored forms: an ask's `data` is
//! `{"session_id","ask_id","client_msg_id"?,"text","choices"?,"default"?,
//! "expires_ts","metadata"?,"ts","seq"}`, a reply's
//! `{"session_id","ask_id","text","ts","seq"}`, `seq` last as in every
//! message (the Redis engine stores what precedes it).

use std::collections::HashMap;
use std::rc::Rc;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::types::Seq;
use crate::time::UnixMillis;
use crate::wire::{decode, push_decimal_str, push_json_str};

/// What the log knows of one ask.
#[derive(Clone, Debug)]
pub struct AskEntry {
    pub seq: Seq,
    pub expires_ts: UnixMillis,
    /// The question, decoded (a resend must repeat it).
    pub text: String,
    /// Decoded, in the order asked.
    pub choices: Option<Vec<String>>,
    /// The `default` literal, as stored.
    pub default: Option<String>,
    /// The first reply: its `seq` and its `text` literal.
    pub reply: Option<(Seq, String)>,
    /// History still holds the ask's message.
    in_history: bool,
}

/// Where an ask stands at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskState {
    Open,
    Answered,
    Expired,
}

impl AskEntry {
    /// Its state at `now` (unix ms): a reply closes it, else its
    /// `expires_ts` does.
    pub fn state(&self, now: UnixMillis) -> AskState {
        if self.reply.is_some() {
            AskState::Answered
        } else if now >= self.expires_ts {
            AskState::Expired
        } else {
            AskState::Open
        }
    }

    /// `{"ask_id","state","text"?}`, the answer of `GET /asks` at `now`:
    /// the reply's text, or an expired ask's `default`.
    pub fn state_body(&self, ask_id: &str, now: UnixMillis) -> Vec<u8> {
        let mut out = String::with_capacity(64 + ask_id.len());
        out.push_str("{\"ask_id\":");
        push_json_str(&mut out, ask_id);
        let (state, text) = match self.state(now) {
            AskState::Open => ("open", None),
            AskState::Answered => ("answered", self.reply.as_ref().map(|(_, t)| t.as_str())),
            AskState::Expired => ("expired", self.default.as_deref()),
        };
        out.push_str(",\"state\":\"");
        out.push_str(state);
        out.push('"');
        if let Some(t) = text {
            out.push_str(",\"text\":");
            out.push_str(t);
        }
        out.push('}');
        out.into_bytes()
    }

    /// Whether a reply with this text (a literal) repeats the stored one.
    pub fn same_reply(&self, text: &str) -> bool {
        self.reply
            .as_ref()
            .is_some_and(|(_, t)| t == text || decode(t) == decode(text))
    }
}

/// A session's asks (see the module doc).
#[derive(Debug, Default)]
pub struct Asks {
    entries: HashMap<Rc<str>, AskEntry>,
    /// The unanswered asks, oldest first: `(seq, expires_ts)`.
    unanswered: Vec<(Seq, UnixMillis)>,
}

impl Asks {
    /// The ask `ask_id` if it is known at `now` (see the module doc).
    pub fn get(&self, ask_id: &str, now: UnixMillis) -> Option<&AskEntry> {
        self.entries
            .get(ask_id)
            .filter(|e| e.in_history || (e.reply.is_none() && now < e.expires_ts))
    }

    /// The ask `ask_id` as kept, known or not: an unanswered ask that
    /// history dropped stays after it expired, until the next ask is
    /// stored, so the polls parked until its expiry can be told it
    /// expired.
    pub fn kept(&self, ask_id: &str) -> Option<&AskEntry> {
        self.entries.get(ask_id)
    }

    /// Asks open at `now`: counted with the pending prompts against the cap.
    pub fn open_len(&self, now: UnixMillis) -> usize {
        self.unanswered.iter().filter(|(_, e)| now < *e).count()
    }

    /// Whether the message at `seq` is an unanswered ask that history
    /// dropped: kept, as a pending prompt is (SQLite keeps its row).
    pub fn retains(&self, seq: Seq) -> bool {
        self.unanswered.iter().any(|(s, _)| *s == seq)
            && !self.entries.values().any(|e| e.seq == seq && e.in_history)
    }

    /// An ask's message appended (its `data` as stored), at `ts`: the
    /// asks that history dropped and that expired by then are forgotten
    /// first; returns their `seq`s (their rows go).
    pub fn asked(&mut self, ask_id: Rc<str>, seq: Seq, ts: UnixMillis, data: &[u8]) -> Vec<Seq> {
        let mut gone = Vec::new();
        let entries = &mut self.entries;
        self.unanswered.retain(|&(s, expires)| {
            if ts < expires {
                return true;
            }
            entries.retain(|_, e| {
                let forget = e.seq == s && !e.in_history;
                if forget {
                    gone.push(s);
                }
                !forget
            });
            false
        });
        #[derive(Deserialize)]
        struct Stored<'a> {
            text: String,
            choices: Option<Vec<String>>,
            #[serde(borrow)]
            default: Option<&'a RawValue>,
            expires_ts: u64,
        }
        // Damaged data (read back from a file) leaves an ask that has
        // expired already: nothing can be checked against it.
        let stored = serde_json::from_slice::<Stored>(data).ok();
        let entry = AskEntry {
            seq,
            expires_ts: stored.as_ref().map_or(0, |s| s.expires_ts),
            text: stored.as_ref().map_or_else(String::new, |s| s.text.clone()),
            choices: stored.as_ref().and_then(|s| s.choices.clone()),
            default: stored
                .as_ref()
                .and_then(|s| s.default)
                .map(|d| d.get().to_string()),
            reply: None,
            in_history: true,
        };
        // The same id again (its ask forgotten or expired): the new one.
        if let Some(old) = self.entries.insert(ask_id, entry) {
            self.unanswered.retain(|(s, _)| *s != old.seq);
        }
        self.unanswered
            .push((seq, stored.map_or(0, |s| s.expires_ts)));
        gone
    }

    /// A reply to `ask_id` appended (its `data` as stored): the ask is
    /// answered; forgotten at once if history dropped it. Returns the
    /// ask's `seq` when it was forgotten so (its row goes).
    pub fn replied(&mut self, ask_id: &str, seq: Seq, data: &[u8]) -> Option<Seq> {
        #[derive(Deserialize)]
        struct Stored<'a> {
            #[serde(borrow)]
            text: &'a RawValue,
        }
        let entry = self.entries.get_mut(ask_id)?;
        if entry.reply.is_some() {
            return None;
        }
        let text = serde_json::from_slice::<Stored>(data)
            .map_or_else(|_| "\"\"".to_string(), |s| s.text.get().to_string());
        entry.reply = Some((seq, text));
        let ask = entry.seq;
        self.unanswered.retain(|(s, _)| *s != ask);
        if !entry.in_history {
            self.entries.remove(ask_id);
            return Some(ask);
        }
        None
    }

    /// The ask's message left history: an answered ask is forgotten, an
    /// unanswered one kept.
    pub fn trimmed(&mut self, ask_id: &str, seq: Seq) {
        let Some(entry) = self.entries.get_mut(ask_id).filter(|e| e.seq == seq) else {
            return;
        };
        entry.in_history = false;
        if entry.reply.is_some() {
            self.entries.remove(ask_id);
        }
    }

    /// A copy that grows and weighs as these asks do: the same table,
    /// deleted slots and all, and the same room in the list. The memory
    /// budget changes the copy as a write would change the asks, to weigh
    /// them after it before anything is applied.
    pub fn copy(&self) -> Asks {
        let mut unanswered = Vec::with_capacity(self.unanswered.capacity());
        unanswered.extend_from_slice(&self.unanswered);
        Asks {
            entries: self.entries.clone(),
            unanswered,
        }
    }

    /// What the memory budget weighs of these asks, by `table` (a hash
    /// table's bytes for its room and slot size) and `block` (a heap
    /// block's for its length): a walk over this session's asks, made
    /// only when they change.
    pub fn weigh(&self, table: fn(usize, usize) -> usize, block: fn(usize) -> usize) -> usize {
        let slot = std::mem::size_of::<(Rc<str>, AskEntry)>();
        let strings: usize = self
            .entries
            .values()
            .map(|e| {
                block(e.text.len())
                    + e.choices.as_ref().map_or(0, |c| {
                        block(c.capacity() * 24) + c.iter().map(|x| block(x.len())).sum::<usize>()
                    })
                    + e.default.as_ref().map_or(0, |d| block(d.len()))
                    + e.reply.as_ref().map_or(0, |(_, t)| block(t.len()))
            })
            .sum();
        table(self.entries.capacity(), slot) + block(self.unanswered.capacity() * 16) + strings
    }

    /// Asks held (the unit tests check the bound).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.entries.len()
    }
}

/// The parts of a new ask's `data` object; texts are JSON literals
/// already valid, choices and ids decoded.
pub struct AskParts<'a> {
    pub session_id: &'a str,
    pub id_literal: &'a str,
    pub client_msg_id: Option<&'a str>,
    pub text: &'a str,
    pub choices: Option<&'a [std::borrow::Cow<'a, str>]>,
    pub default: Option<&'a str>,
    pub expires_ts: UnixMillis,
    pub metadata: Option<&'a str>,
    pub ts: UnixMillis,
    pub seq: Seq,
}

impl AskParts<'_> {
    /// The `data` object (see the module doc for its fields).
    pub fn data(&self) -> String {
        let mut out = String::with_capacity(
            128 + self.text.len() + self.metadata.map_or(0, str::len) + self.id_literal.len(),
        );
        out.push_str("{\"session_id\":\"");
        out.push_str(self.session_id); // unreserved characters only
        out.push_str("\",\"ask_id\":");
        out.push_str(self.id_literal);
        if let Some(cid) = self.client_msg_id {
            out.push_str(",\"client_msg_id\":");
            push_json_str(&mut out, cid);
        }
        out.push_str(",\"text\":");
        out.push_str(self.text);
        if let Some(choices) = self.choices {
            out.push_str(",\"choices\":[");
            for (i, c) in choices.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_json_str(&mut out, c);
            }
            out.push(']');
        }
        if let Some(d) = self.default {
            out.push_str(",\"default\":");
            out.push_str(d);
        }
        out.push_str(",\"expires_ts\":");
        push_decimal_str(&mut out, self.expires_ts);
        if let Some(m) = self.metadata {
            out.push_str(",\"metadata\":");
            out.push_str(m);
        }
        push_tail(&mut out, self.ts, self.seq);
        out
    }
}

/// A reply's `data` object: `text` is the literal sent.
pub fn reply_data(session_id: &str, ask_id: &str, text: &str, ts: UnixMillis, seq: Seq) -> String {
    let mut out = String::with_capacity(80 + ask_id.len() + text.len());
    out.push_str("{\"session_id\":\"");
    out.push_str(session_id); // unreserved characters only
    out.push_str("\",\"ask_id\":");
    push_json_str(&mut out, ask_id);
    out.push_str(",\"text\":");
    out.push_str(text);
    push_tail(&mut out, ts, seq);
    out
}

fn push_tail(out: &mut String, ts: UnixMillis, seq: Seq) {
    out.push_str(",\"ts\":");
    push_decimal_str(out, ts);
    out.push_str(",\"seq\":");
    push_decimal_str(out, seq.get());
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(asks: &mut Asks, id: &str, seq: u64, ts: u64, timeout: u64) -> Vec<Seq> {
        let data = AskParts {
            session_id: "s",
            id_literal: &format!("\"{id}\""),
            client_msg_id: None,
            text: "\"q\"",
            choices: None,
            default: Some("\"d\""),
            expires_ts: ts + timeout,
            metadata: None,
            ts,
            seq: Seq(seq),
        }
        .data();
        asks.asked(Rc::from(id), Seq(seq), ts, data.as_bytes())
    }

    #[test]
    fn an_ask_is_known_in_history_or_while_open_and_forgotten_after() {
        let mut asks = Asks::default();
        ask(&mut asks, "k1", 1, 1000, 10);
        assert_eq!(asks.open_len(1000), 1);
        assert_eq!(asks.open_len(1010), 0, "expired at its expires_ts");
        let e = asks.get("k1", 5000).expect("in history: known");
        assert_eq!(e.state(5000), AskState::Expired);
        let body: serde_json::Value = serde_json::from_slice(&e.state_body("k1", 5000)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"ask_id": "k1", "state": "expired", "text": "d"})
        );
        asks.trimmed("k1", Seq(1));
        assert!(asks.get("k1", 1005).is_some(), "open, out of history");
        assert!(asks.get("k1", 1010).is_none(), "expired, out of history");
        assert!(asks.retains(Seq(1)));
        // The next ask forgets it.
        assert_eq!(ask(&mut asks, "k2", 2, 2000, 10), vec![Seq(1)]);
        assert_eq!(asks.held(), 1);
        // A reply to an ask history dropped forgets it at once.
        asks.trimmed("k2", Seq(2));
        let reply = reply_data("s", "k2", "\"yes\"", 2001, Seq(3));
        assert_eq!(asks.replied("k2", Seq(3), reply.as_bytes()), Some(Seq(2)));
        assert_eq!((asks.held(), asks.open_len(2001)), (0, 0));
    }
}
