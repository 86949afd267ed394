//! Drafts: the streamed answers in progress, kept per session in
//! [`Live`](super::live::Live) and never stored by an engine. A part the
//! log's rules took (its session, its prompt, no answer stored under its
//! id) is appended to its draft and sent as a `delta` frame to the
//! subscribers that are caught up; the final answer with the draft's id
//! replaces it ([`Relay::draft_done`]); a cancel of its prompt ends it
//! with a `delta_end` ([`Relay::drafts_cancelled`]); a draft no part
//! reached for the draft timeout is dropped by the tick, with a
//! `delta_end`.
//!
//! Invariants: a session holds at most `max_pending` drafts, and a
//! draft's decoded text at most [`MAX_DRAFT_BYTES`]; a draft belongs to
//! one prompt, so a part naming another one is a conflict; `parts`
//! counts the parts appended, so a copy of another instance's draft
//! appends only the next part and reads the session again on a gap.

use std::rc::Rc;

use super::frames::{EndReason, delta_end_frame, delta_frame};
use super::{ApiError, Effect, Relay, Reply};
use crate::store::SessionId;
use crate::store::log::weight::{Meter, Share, alloc, rc_bytes};
use crate::store::log::{PromptState, SessionLog};
use crate::store::model::NewResponse;
use crate::time::Millis;
use crate::wire::decoded_len;

/// A draft holds at most this many bytes of text: one message's limit.
pub const MAX_DRAFT_BYTES: usize = crate::store::types::MAX_TEXT_BYTES;

/// One streamed answer in progress.
#[derive(Debug)]
pub struct Draft {
    pub assistant_msg_id: Rc<str>,
    pub client_msg_id: Rc<str>,
    /// The text so far as the inside of a JSON string literal: each
    /// part's literal without its quotes, so parts are never decoded and
    /// encoded again.
    pub(super) escaped: String,
    /// The decoded length of the text so far, for the cap.
    pub(super) bytes: usize,
    /// Parts appended so far.
    pub(super) parts: u32,
    /// Dropped when no part came by then.
    pub(super) deadline: Millis,
    /// Its bytes on the memory budget's meter.
    pub(super) share: Share,
}

impl Draft {
    /// A draft with no part yet.
    fn new(
        assistant_msg_id: Rc<str>,
        client_msg_id: Rc<str>,
        deadline: Millis,
        meter: &Meter,
    ) -> Draft {
        Draft {
            assistant_msg_id,
            client_msg_id,
            escaped: String::new(),
            bytes: 0,
            parts: 0,
            deadline,
            share: Share::on(meter),
        }
    }

    /// What a draft with the id `id_len` bytes long and room for `text`
    /// bytes of text weighs: its place in the session's list, its text,
    /// its own id (the prompt's is the log's).
    fn weight(id_len: usize, text: usize) -> usize {
        std::mem::size_of::<Draft>() + alloc(text) + rc_bytes(id_len)
    }

    /// The room for text after appending `more` bytes to `len` in `cap`:
    /// doubled (or to fit, if more) when it does not fit. [`append`](Self::append)
    /// grows the text by it, and the budget weighs a part by it first.
    fn room_after(len: usize, cap: usize, more: usize) -> usize {
        if len + more <= cap {
            cap
        } else {
            (2 * cap).max(len + more)
        }
    }

    /// What appending a part whose literal is `lit` adds to what a draft
    /// weighs: to `draft`, or to a new draft with the id `id_len` bytes
    /// long.
    pub(super) fn growth(draft: Option<&Draft>, id_len: usize, lit: &str) -> usize {
        let more = lit.len().saturating_sub(2);
        match draft {
            Some(d) => {
                let (len, cap) = (d.escaped.len(), d.escaped.capacity());
                let id = d.assistant_msg_id.len();
                Draft::weight(id, Draft::room_after(len, cap, more)) - Draft::weight(id, cap)
            }
            None => Draft::weight(id_len, Draft::room_after(0, 0, more)),
        }
    }

    /// Counts what the draft holds now.
    pub(super) fn weigh(&mut self) {
        let bytes = Draft::weight(self.assistant_msg_id.len(), self.escaped.capacity());
        self.share.set(bytes);
    }

    /// Appends the next part: its text's literal (quotes included) and
    /// decoded length. Returns its `delta` frame.
    fn append(&mut self, sid: &str, lit: &str, bytes: usize, deadline: Millis) -> Rc<[u8]> {
        let text = &lit[1..lit.len() - 1];
        let (len, cap) = (self.escaped.len(), self.escaped.capacity());
        let room = Draft::room_after(len, cap, text.len());
        if room > cap {
            self.escaped.reserve_exact(room - len);
        }
        self.escaped.push_str(text);
        self.bytes += bytes;
        self.parts += 1;
        self.deadline = deadline;
        self.weigh();
        delta_frame(sid, self, Some(lit), false)
    }
}

impl Relay {
    /// `POST /response` with `"partial": true`, once the log's rules took
    /// it ([`MemStore::decide`](crate::store::MemStore::decide) gave its
    /// id): appends the text to its draft and sends the part to the
    /// caught-up subscribers. Called when the engine handed the part back
    /// to be decided on the loop's log, as it does where that log holds
    /// every committed prompt.
    pub(super) fn post_partial(
        &mut self,
        now: Millis,
        r: NewResponse,
        id: String,
    ) -> Result<Reply, ApiError> {
        let lit = &*r.text;
        let bytes = decoded_len(lit);
        let deadline = now.after_ms(self.limits.draft_timeout_ms);
        let max_drafts = self.limits.max_pending;
        let live = self.live.entry(r.session_id.clone()).or_default();
        let found = live.drafts.iter().position(|d| *d.assistant_msg_id == *id);
        let growth = Draft::growth(found.map(|at| &live.drafts[at]), id.len(), lit);
        if !self.budget.admits_bytes(self.store.memory(), growth) {
            return Err(self.refuse());
        }
        let at = match found {
            Some(at) => {
                let d = &live.drafts[at];
                if *d.client_msg_id != *r.client_msg_id {
                    return Err(ApiError::conflict());
                }
                if d.bytes + bytes > MAX_DRAFT_BYTES {
                    return Err(ApiError::too_large_field());
                }
                at
            }
            None => {
                if live.drafts.len() >= max_drafts {
                    return Err(ApiError::unavailable(
                        "draft limit reached for this session",
                    ));
                }
                if bytes > MAX_DRAFT_BYTES {
                    return Err(ApiError::too_large_field());
                }
                // The log's rules found it: only a new draft needs it.
                let Some(prompt) = self
                    .store
                    .get(&r.session_id)
                    .and_then(|log| log.prompt_id(&r.client_msg_id))
                else {
                    return Err(ApiError::prompt_not_found());
                };
                let meter = self.store.beside();
                live.drafts
                    .push(Draft::new(Rc::from(id.as_str()), prompt, deadline, meter));
                live.drafts.len() - 1
            }
        };
        let frame = live.drafts[at].append(&r.session_id, lit, bytes, deadline);
        let delivered = self.send_part(&r.session_id, frame, deadline);
        Ok(Reply::Now(crate::store::record::partial_ack(
            &id, delivered,
        )))
    }

    /// A part was appended to a draft of `sid` (`frame`, its `delta`),
    /// which now waits until `deadline`: to the subscribers here. Returns
    /// whether there were any.
    fn send_part(&mut self, sid: &SessionId, frame: Rc<[u8]>, deadline: Millis) -> bool {
        self.wake_at(deadline);
        let delivered = !self.subscribers(sid).is_empty();
        if delivered {
            self.effects.push(Effect::Broadcast {
                sid: sid.clone(),
                frame,
            });
        }
        delivered
    }

    /// A final answer with this id is stored: its `message` frame replaces
    /// the draft in every client.
    pub(super) fn draft_done(&mut self, sid: &str, assistant_msg_id: &str) {
        if let Some(live) = self.live.get_mut(sid) {
            live.drafts
                .retain(|d| *d.assistant_msg_id != *assistant_msg_id);
        }
    }

    /// A cancel of the prompt `client_msg_id` is stored (through any
    /// instance): its open drafts end, and the subscribers here that are
    /// caught up get `delta_end` with `"reason":"cancelled"` (one that is
    /// behind finds no draft in its snapshot).
    pub(super) fn drafts_cancelled(&mut self, sid: &SessionId, client_msg_id: &str) {
        let Some(live) = self.live.get_mut(&**sid) else {
            return;
        };
        let mut ended = Vec::new();
        live.drafts.retain(|d| {
            if *d.client_msg_id != *client_msg_id {
                return true;
            }
            ended.push(delta_end_frame(sid, d, EndReason::Cancelled));
            false
        });
        if ended.is_empty() || self.subscribers(sid).is_empty() {
            return;
        }
        for frame in ended {
            self.effects.push(Effect::Broadcast {
                sid: sid.clone(),
                frame,
            });
        }
    }

    /// Whether the copy of `sid` holds the end of the draft `aid` of the
    /// prompt `cid`: its final answer, or its prompt's cancel. A part
    /// stored before either, or a read that ran before either, can reach
    /// this instance after it (the answer's reply, the published part and
    /// the read come on two links, read apart); what it brings of the
    /// draft is stale then.
    pub(super) fn draft_ended(&self, sid: &str, aid: &str, cid: &str) -> bool {
        self.store.get(sid).is_some_and(|l| ended(l, aid, cid))
    }

    /// The copy of `sid` was replaced by a whole read: the drafts whose
    /// final answer or cancel it holds end without a frame (the read's
    /// log brings the subscribers the `message` or `cancel` that ends them).
    pub(super) fn drafts_settled(&mut self, sid: &str) {
        if let (Some(log), Some(live)) = (self.store.get(sid), self.live.get_mut(sid)) {
            live.drafts
                .retain(|d| !ended(log, &d.assistant_msg_id, &d.client_msg_id));
        }
    }

    /// A part the engine took (through any instance), heard by the
    /// instances that follow the session. Appended to the copy of
    /// its draft when it is the next part; a gap (the copy began after the
    /// draft did) makes the session read again, drafts included.
    pub(super) fn part_published(
        &mut self,
        now: Millis,
        sid: &SessionId,
        aid: &str,
        cid: &str,
        part: u32,
        lit: &str,
    ) {
        if lit.len() < 2 {
            return;
        }
        if self.draft_ended(sid, aid, cid) {
            return;
        }
        let deadline = now.after_ms(self.limits.draft_timeout_ms);
        let max_drafts = self.limits.max_pending;
        let live = self.live.entry(sid.clone()).or_default();
        let at = live.drafts.iter().position(|d| *d.assistant_msg_id == *aid);
        let d = match at {
            Some(at) if live.drafts[at].parts + 1 == part => &mut live.drafts[at],
            Some(at) if live.drafts[at].parts >= part => return,
            // The engine holds the cap; a copy never holds more than it.
            None if part == 1 && live.drafts.len() < max_drafts => {
                let meter = self.store.beside();
                live.drafts
                    .push(Draft::new(Rc::from(aid), Rc::from(cid), deadline, meter));
                let last = live.drafts.len() - 1;
                &mut live.drafts[last]
            }
            _ => {
                self.engine.resync(&self.store, sid);
                return;
            }
        };
        let frame = d.append(sid, lit, decoded_len(lit), deadline);
        self.send_part(sid, frame, deadline);
    }
}

/// Whether `log` holds the end of the draft `aid` of the prompt `cid`: its
/// final answer, or its prompt's cancel.
fn ended(log: &SessionLog, aid: &str, cid: &str) -> bool {
    log.response(aid).is_some() || matches!(log.prompt_state(cid), PromptState::Cancelled(_))
}
