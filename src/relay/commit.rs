//! Committed changes, applied on one path. Every engine answers a write with
//! an [`Outcome`] and the [`Record`]s that carry it out, at once or when
//! it committed them, and hands over the records of changes other
//! instances made as it hears of them. [`Relay::apply`] applies
//! records to the log and to what waits on it here, in order: parked polls
//! woken, answers and cancels delivered to caught-up subscribers (a
//! cancel ending its prompt's drafts first), a deleted session's
//! polls answered 404 and its subscribers closed; [`Outcome::ack`] then
//! renders the requester's answer.

use std::rc::Rc;

use log::debug;

use super::{ApiError, Effect, Relay};
use crate::store::mem::{Applied, MemStore};
use crate::store::record::{Outcome, Record};
use crate::store::{Seq, SessionId};
use crate::time::Millis;

impl Relay {
    /// Applies committed records, in order: to the log, then to the parked
    /// polls and subscribers of their sessions. Returns
    /// whether an answer went to a subscriber connected here (the
    /// `delivered` of its acknowledgement). Called for every change, whatever
    /// engine committed it.
    pub(super) fn apply(&mut self, now: Millis, records: impl IntoIterator<Item = Record>) -> bool {
        let mut delivered = false;
        for record in records {
            if let Record::Created { sid, .. } | Record::Deleted { sid } = &record {
                self.resident.remove(sid);
            }
            match self.store.apply(now, record) {
                Applied::Nothing => {}
                Applied::Prompt { sid, .. } => {
                    self.wake_waiters(now, &sid);
                    self.wake_every(now, &sid);
                }
                Applied::Response {
                    sid,
                    seq,
                    prev,
                    frame,
                    assistant_msg_id,
                } => {
                    self.draft_done(&sid, &assistant_msg_id);
                    delivered |= self.stored_response(&sid, seq, prev, frame);
                }
                Applied::Cancel {
                    sid,
                    seq,
                    prev,
                    frame,
                    client_msg_id,
                } => {
                    self.drafts_cancelled(&sid, &client_msg_id);
                    delivered |= self.stored_response(&sid, seq, prev, frame);
                }
                Applied::Deleted { sid } => self.session_gone(&sid),
                Applied::Ask {
                    sid,
                    seq,
                    prev,
                    frame,
                    ..
                } => delivered |= self.stored_response(&sid, seq, prev, frame),
                Applied::Reply {
                    sid,
                    seq,
                    prev,
                    frame,
                    ask_id,
                    ..
                } => {
                    delivered |= self.stored_response(&sid, seq, prev, frame);
                    self.wake_ask_waiters(&sid, &ask_id, seq);
                }
            }
        }
        delivered
    }

    /// The requester's answer to a write whose records are applied
    /// (`delivered` as [`apply`](Self::apply) reported it). Every write
    /// this instance asked for is answered here, whichever engine decided
    /// it, and only those: what it stored and what it found resent are
    /// counted and logged here, once, from the outcome (the records
    /// applied may be other instances' writes).
    pub(super) fn ack(&mut self, outcome: Outcome, delivered: bool) -> Vec<u8> {
        match &outcome {
            Outcome::Prompt {
                duplicate: true, ..
            } => self.stats.prompt_duplicates += 1,
            Outcome::Response {
                duplicate: true, ..
            } => self.stats.response_duplicates += 1,
            Outcome::Prompt { sid, id, seq, .. } => {
                debug!(session_id = sid.as_str(), client_msg_id = id.as_str(), seq = seq.get(); "prompt stored");
                self.stats.prompts_stored += 1;
            }
            Outcome::Response { sid, id, seq, .. } => {
                debug!(session_id = sid.as_str(), assistant_msg_id = id.as_str(), seq = seq.get(); "response posted");
                self.stats.responses_stored += 1;
            }
            Outcome::Cancel {
                sid,
                id,
                seq,
                duplicate: false,
            } => {
                debug!(session_id = sid.as_str(), client_msg_id = id.as_str(), seq = seq.get(); "prompt cancelled");
            }
            _ => {}
        }
        outcome.ack(delivered)
    }

    /// A write the engine handed back to be decided on the loop's log
    /// (`decide` pushes its records): its records applied at once, on the
    /// path every engine's take.
    /// Returns its outcome and `delivered`.
    pub(super) fn decide_now(
        &mut self,
        now: Millis,
        decide: impl FnOnce(&mut MemStore, &mut Vec<Record>) -> Result<Outcome, ApiError>,
    ) -> Result<(Outcome, bool), ApiError> {
        // One buffer for every write, so a write allocates no list of its own.
        let mut records = std::mem::take(&mut self.records);
        let decided = decide(&mut self.store, &mut records);
        if let Err(e) = self.admit(&records) {
            records.clear();
            self.records = records;
            return Err(e);
        }
        let delivered = self.apply(now, records.drain(..));
        self.records = records;
        Ok((decided?, delivered))
    }

    /// Answers every waiter of `sid` whose pending set is now non-empty.
    pub(super) fn wake_waiters(&mut self, now: Millis, sid: &str) {
        let Some(here) = self.presence.get_mut(sid) else {
            return;
        };
        let Some(log) = self.store.get_mut(sid) else {
            return;
        };
        let waiting = here.waiters.len();
        let mut woken = 0;
        let mut pages = Vec::new();
        here.waiters.retain(|w| {
            if !log.has_pending_after(w.after) {
                return true;
            }
            // Rendered once per distinct `after`, shared by the waiters
            // asking the same (the log keeps the last page).
            let (status, body) = match log.pending_page(w.after) {
                Ok(body) => (200, body),
                Err(e) => {
                    super::damaged(sid, &e);
                    (e.status, Rc::from(e.body()))
                }
            };
            self.effects.push(Effect::Respond {
                to: w.conn,
                status,
                body,
            });
            if status == 200 && !pages.contains(&w.after) {
                pages.push(w.after);
            }
            woken += 1;
            false
        });
        self.counts.parked_polls -= woken;
        if here.is_empty() {
            self.presence.remove(sid);
        }
        if woken > 0 {
            self.page_within_budget(sid);
        }
        for after in pages {
            self.fetched(now, sid, after);
        }
        if woken > 0 {
            self.agent_left(now, sid);
        }
        if woken > 0 {
            debug!(session_id = sid, woken = woken, waiting = waiting; "prompts fetched");
        }
    }

    /// A new answer or cancel is stored (and committed): delivered to
    /// the session's subscribers. Returns `delivered`: a subscriber was
    /// connected as the message was stored (it gets it unless it
    /// disconnects first).
    pub(super) fn stored_response(
        &mut self,
        sid: &SessionId,
        seq: Seq,
        prev: Seq,
        frame: Rc<[u8]>,
    ) -> bool {
        let delivered = !self.subscribers(sid).is_empty();
        if delivered {
            self.effects.push(Effect::Deliver {
                sid: sid.clone(),
                seq,
                prev,
                frame,
            });
        }
        delivered
    }

    /// A session is deleted: its parked polls get 404, its subscribers
    /// close with 1000. The deletion is logged by whoever asked for it
    /// (`DELETE`, the idle sweep), not here.
    fn session_gone(&mut self, sid: &str) {
        self.live.remove(sid);
        let Some(here) = self.presence.remove(sid) else {
            return;
        };
        let not_found: Rc<[u8]> = ApiError::session_not_found().body().into();
        let asks = here.asks().iter().map(|w| w.conn);
        for to in here.waiters.iter().map(|w| w.conn).chain(asks) {
            self.effects.push(Effect::Respond {
                to,
                status: 404,
                body: not_found.clone(),
            });
        }
        for &c in &here.subscribers {
            self.effects
                .push(Effect::CloseSubscriber { to: c, code: 1000 });
        }
        self.counts.parked_polls -= here.waiters.len() + here.asks().len();
        self.counts.subscribers -= here.subscribers.len();
    }
}
