//! Receipts: which prompts an agent has fetched, so the person waiting
//! sees that a prompt reached the agent before its answer comes. A poll's
//! answer sends a `receipt` frame for each prompt in it not fetched
//! before, and tells the engine when other instances hear of agents;
//! their receipts come back through [`Relay::receipts_published`]. Per
//! session only the highest fetched `seq` and its time are kept: a
//! subscriber that catches up gets a receipt for each pending prompt up
//! to it (the oldest [`MAX_RECEIPTS`]), all stamped with that time.
//!
//! Invariant: the fetched `seq` only grows while the session's live state
//! lives (it goes with the session, or with a store that was lost).

use std::rc::Rc;

use super::frames::receipt_frame;
use super::{Effect, Relay};
use crate::store::{Seq, SessionId};
use crate::time::{Millis, UnixMillis};

/// Receipts a subscriber gets when it catches up, at most.
pub(super) const MAX_RECEIPTS: usize = 64;

impl Relay {
    /// The prompts of `sid` after `after` are in an answer to an agent's
    /// poll: a `receipt` for each one not fetched before.
    pub(super) fn fetched(&mut self, now: Millis, sid: &str, after: Option<Seq>) {
        let unix = self.unix_at(now);
        let Some((key, log)) = self.store.key_and_log(sid) else {
            return;
        };
        let key = key.clone();
        let live = self.live.entry(key.clone()).or_default();
        let to_tell = !self
            .presence
            .get(sid)
            .is_none_or(|p| p.subscribers.is_empty());
        let others_hear = self.engine.others_hear_agents();
        let mut told: Vec<Rc<str>> = Vec::new();
        for msg in log.page_prompts(after) {
            if msg.seq <= live.fetched {
                continue;
            }
            live.fetched = msg.seq;
            live.fetched_at = unix;
            if to_tell {
                self.effects.push(Effect::Broadcast {
                    sid: key.clone(),
                    frame: receipt_frame(sid, &msg.client_msg_id, unix),
                });
            }
            if others_hear {
                told.push(msg.client_msg_id.clone());
            }
        }
        if !told.is_empty() {
            let ids: Vec<&str> = told.iter().map(|id| &**id).collect();
            self.engine.publish_receipts(&key, unix, &ids);
        }
    }

    /// The prompt `seq` of `sid` is in an answer to an all-sessions poll:
    /// a `receipt` unless it was fetched before.
    pub(super) fn fetched_one(&mut self, now: Millis, sid: &SessionId, seq: Seq) {
        let unix = self.unix_at(now);
        let Some(log) = self.store.get(sid) else {
            return;
        };
        let Some(msg) = log.pending_at(seq) else {
            return;
        };
        let live = self.live.entry(sid.clone()).or_default();
        if seq <= live.fetched {
            return;
        }
        live.fetched = seq;
        live.fetched_at = unix;
        if !self.subscribers(sid).is_empty() {
            self.effects.push(Effect::Broadcast {
                sid: sid.clone(),
                frame: receipt_frame(sid, &msg.client_msg_id, unix),
            });
        }
        if self.engine.others_hear_agents() {
            let id = msg.client_msg_id.clone();
            self.engine.publish_receipts(sid, unix, &[&id]);
        }
    }

    /// Prompts an agent fetched through another instance.
    pub(super) fn receipts_published(&mut self, sid: &SessionId, ts: UnixMillis, ids: &[String]) {
        // Known here too, for the receipts of a subscriber that connects.
        if let Some(log) = self.store.get(sid) {
            let newest = ids.iter().filter_map(|id| log.prompt_seq(id)).max();
            let live = self.live.entry(sid.clone()).or_default();
            if let Some(seq) = newest.filter(|s| *s > live.fetched) {
                live.fetched = seq;
                live.fetched_at = ts;
            }
        }
        if self.subscribers(sid).is_empty() {
            return;
        }
        for id in ids {
            self.effects.push(Effect::Broadcast {
                sid: sid.clone(),
                frame: receipt_frame(sid, id, ts),
            });
        }
    }
}
