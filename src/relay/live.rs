//! What the person waiting sees of the agent at work, which no engine
//! stores, kept per session beside the log ([`Live`]) and never persisted
//! (after a restart only final answers exist). Each concern has its room:
//! the drafts of streamed answers ([`drafts`](super::drafts)), the
//! agent's presence ([`agent`](super::agent)), the prompts an agent
//! fetched ([`receipts`](super::receipts)), and the bytes of their frames
//! ([`frames`](super::frames)). This room holds what spans them: a
//! session's record of all three, the live state a read of the session
//! found ([`Relay::live_synced`]), the snapshot a subscriber gets when it
//! catches up ([`Relay::live_frames`]), and the tick that ages drafts and
//! agents.
//!
//! Frames go to the subscribers that are caught up
//! ([`Effect::Broadcast`]); a subscriber that joins or falls behind gets
//! the snapshot when it catches up instead, so a live frame never
//! overtakes the log it follows.
//!
//! Time: a draft ends when no part came for the draft timeout, an agent is
//! offline once no poll is parked and the grace after its last request has
//! passed. Both are found by [`Relay::tick`], which the shell runs at
//! [`Relay::next_tick`], rounded up to [`TICK`] so a busy server does not
//! scan its sessions for every request.

use std::collections::HashMap;
use std::rc::Rc;

use log::debug;

use super::agent::MAX_INSTANCES;
use super::drafts::Draft;
use super::frames::{EndReason, delta_end_frame, delta_frame, presence_frame, receipt_frame};
use super::receipts::MAX_RECEIPTS;
use super::{Effect, Relay};
use crate::store::log::weight::Share;
use crate::store::seam::{AgentState, Announced, DraftState};
use crate::store::{Seq, SessionId};
use crate::time::{Millis, UnixMillis};

/// The granularity of draft and presence deadlines, in milliseconds.
pub const TICK: u64 = 250;

/// A session's live state (see the module doc).
#[derive(Debug, Default)]
pub struct Live {
    /// The open drafts ([`drafts`](super::drafts)).
    pub(super) drafts: Vec<Draft>,
    // The agent's presence (`agent.rs`).
    /// When the last agent request to the session ended (loop clock).
    pub(super) agent_end: Option<Millis>,
    /// The agent stopped here (`DELETE /agent`, or an all-sessions one):
    /// boxed, since few sessions ever have one and every session an agent
    /// polled has this entry.
    cut: Option<Box<EveryCut>>,
    /// The wall-clock time of the agent's last request, for `GET /sessions`.
    pub(super) agent_seen: Option<UnixMillis>,
    /// The state subscribers were last told, and since when.
    pub(super) online: bool,
    pub(super) since: UnixMillis,
    // The receipts (`receipts.rs`).
    /// The highest `seq` of a prompt whose receipt was sent, and when.
    pub(super) fetched: Seq,
    pub(super) fetched_at: UnixMillis,
    // The agent's presence as other instances see it (`agent.rs`).
    /// The other instances' agent states, as the engine heard them, and
    /// what they were last told of this one's (kept for the engine). A
    /// boxed slice, 8 bytes less than a list in every session's entry:
    /// the entry is then a 128-byte block, not a 144-byte one.
    pub(super) remote: Box<[AgentState]>,
    pub(super) told: Announced,
}

/// Where the agent stopped in a session.
#[derive(Clone, Copy, Debug)]
struct EveryCut {
    /// The graces of all-sessions polls that ended before count no more.
    stamp: u64,
    /// And when (wall clock): the graces of all-sessions polls other
    /// instances announced that began before count no more here.
    unix: UnixMillis,
}

impl Live {
    /// The all-sessions stamp at which the agent last stopped here.
    pub(super) fn every_cut(&self) -> Option<u64> {
        self.cut.as_ref().map(|c| c.stamp)
    }

    /// When (wall clock) the agent last stopped here.
    pub(super) fn every_cut_unix(&self) -> Option<UnixMillis> {
        self.cut.as_ref().map(|c| c.unix)
    }

    /// The agent stopped here at all-sessions stamp `stamp`, at `unix`.
    pub(super) fn cut_every(&mut self, stamp: u64, unix: UnixMillis) {
        self.cut = Some(Box::new(EveryCut { stamp, unix }));
    }
}

/// The live state of every session that had any (dropped with its session).
/// Boxed: a table keeps room for up to twice its entries, and each
/// session an agent ever polled has one.
pub type LiveMap = HashMap<SessionId, Box<Live>>;

impl Relay {
    /// The drafts and the other instances' agent states a read of `sid`
    /// found.
    /// A draft the read holds further than the copy replaces it, and the
    /// subscribers here get its snapshot.
    pub(super) fn live_synced(
        &mut self,
        now: Millis,
        sid: &SessionId,
        drafts: Vec<DraftState>,
        agents: Vec<AgentState>,
    ) {
        let unix = self.unix_at(now);
        let max_drafts = self.limits.max_pending;
        // A read's drafts may be older than what was heard since it ran:
        // a part or a final answer heard as it is published, or an answer's
        // reply, can arrive before the answer to a read it followed. A
        // draft whose answer or cancel the copy holds ended; another is
        // taken from the read only where the read holds more parts than
        // the copy; a draft the read lacks stays until its deadline or its
        // final answer.
        let drafts: Vec<DraftState> = drafts
            .into_iter()
            .filter(|d| {
                d.deadline > unix && !self.draft_ended(sid, &d.assistant_msg_id, &d.client_msg_id)
            })
            .collect();
        let live = self.live.entry(sid.clone()).or_default();
        let mut snapshots: Vec<Rc<[u8]>> = Vec::new();
        for d in drafts {
            let at = live
                .drafts
                .iter()
                .position(|l| *l.assistant_msg_id == *d.assistant_msg_id);
            if at.is_some_and(|at| live.drafts[at].parts >= d.parts) {
                continue;
            }
            let mut draft = Draft {
                assistant_msg_id: Rc::from(d.assistant_msg_id),
                client_msg_id: Rc::from(d.client_msg_id),
                escaped: d.escaped,
                bytes: d.bytes,
                parts: d.parts,
                deadline: now.after_ms(d.deadline - unix),
                share: Share::on(self.store.beside()),
            };
            draft.weigh();
            snapshots.push(delta_frame(sid, &draft, None, true));
            match at {
                Some(at) => live.drafts[at] = draft,
                None => live.drafts.push(draft),
            }
        }
        live.remote = agents.into_iter().take(MAX_INSTANCES).collect();
        live.drafts.truncate(max_drafts);
        let deadlines: Vec<Millis> = live.drafts.iter().map(|d| d.deadline).collect();
        for d in deadlines {
            self.wake_at(d);
        }
        if !self.subscribers(sid).is_empty() {
            for frame in snapshots {
                self.effects.push(Effect::Broadcast {
                    sid: sid.clone(),
                    frame,
                });
            }
        }
        self.refresh_presence(now, sid);
    }

    /// Frames a subscriber of `sid` needs once it is caught up with the
    /// log: a snapshot of every open draft and the agent's state.
    pub(super) fn live_frames(&self, sid: &str, out: &mut Vec<Rc<[u8]>>) {
        let Some(live) = self.live.get(sid) else {
            out.push(presence_frame(sid, false, self.started));
            return;
        };
        // The pending prompts an agent fetched already (the oldest
        // MAX_RECEIPTS of them), stamped with the latest fetch.
        if let Some(log) = self.store.get(sid)
            && live.fetched.get() > 0
        {
            for msg in log
                .page_prompts(None)
                .take_while(|m| m.seq <= live.fetched)
                .take(MAX_RECEIPTS)
            {
                out.push(receipt_frame(sid, &msg.client_msg_id, live.fetched_at));
            }
        }
        for d in &live.drafts {
            out.push(delta_frame(sid, d, None, true));
        }
        let since = if live.since == 0 {
            self.started
        } else {
            live.since
        };
        out.push(presence_frame(sid, live.online, since));
    }

    /// The engine lost every session (the copies are dropped): the drafts
    /// and receipts went with them, and so did what the other instances
    /// were told of the agents here. The agent's presence in a session
    /// someone waits on here (a parked poll is an agent online) stays,
    /// since that session is created again, and is told to the other
    /// instances again at once rather than when it next changes; the
    /// other instances' states stay too (each told its own lease, and
    /// tells it again in turn). The rest goes with its copy.
    pub(super) fn live_lost(&mut self, now: Millis) {
        let presence = &self.presence;
        self.live.retain(|sid, live| {
            live.drafts.clear();
            (live.fetched, live.fetched_at) = (Seq::default(), 0);
            live.told = Announced::default();
            presence.contains_key(sid)
        });
        let kept: Vec<SessionId> = self.live.keys().cloned().collect();
        for sid in kept {
            self.refresh_presence(now, &sid);
        }
    }

    /// When [`tick`](Self::tick) is next due, if anything waits on time.
    pub fn next_tick(&self) -> Option<Millis> {
        self.next_tick
    }

    /// Drops the drafts that stopped (`delta_end` to subscribers) and
    /// turns offline the agents whose grace passed.
    pub fn tick(&mut self, now: Millis) {
        if self.next_tick.is_none_or(|t| now < t) {
            return;
        }
        self.next_tick = None;
        let at = self.at(now);
        let mut next: Option<Millis> = None;
        let mut soon = |t: Millis| next = Some(next.map_or(t, |n: Millis| n.min(t)));
        let grace = self.limits.agent_grace_ms;
        self.every_graces.retain(|g| now < g.end.after_ms(grace));
        self.every_tick(now);
        let (every, every_graces) = (&self.every, &self.every_graces);
        let remote_every = &self.remote_every;
        for (sid, live) in &mut self.live {
            let here = self.presence.get(&**sid);
            let watched = here.is_some_and(|p| !p.subscribers.is_empty());
            live.drafts.retain(|d| {
                if now < d.deadline {
                    soon(d.deadline);
                    return true;
                }
                debug!(session_id = sid.as_str(), assistant_msg_id = &*d.assistant_msg_id; "draft timed out");
                if watched {
                    self.effects.push(Effect::Broadcast {
                        sid: sid.clone(),
                        frame: delta_end_frame(sid, d, EndReason::Timeout),
                    });
                }
                false
            });
            let parked =
                here.is_some_and(|p| !p.waiters.is_empty()) || every.iter().any(|w| w.covers(sid));
            let every_end = super::every::end_covering(every_graces, sid, live.every_cut());
            let cut = live.every_cut_unix();
            let every_remote =
                super::every_read::remote_every_until(remote_every, sid, cut, at.unix);
            let step = live.step(at, parked, every_end, every_remote);
            let mut later = None;
            step.carry_out(
                sid,
                live,
                watched,
                &mut self.effects,
                &mut self.engine,
                &mut later,
                at,
            );
            if let Some(t) = later {
                soon(t);
            }
        }
        self.next_tick = next.map(round_up);
    }

    /// Schedules a tick by `deadline`.
    pub(super) fn wake_at(&mut self, deadline: Millis) {
        let t = round_up(deadline);
        if self.next_tick.is_none_or(|n| t < n) {
            self.next_tick = Some(t);
        }
    }

    /// The wall-clock time at loop time `at`, before the turn's clock
    /// (when a poll ended, told later) as after it.
    pub(super) fn unix_at(&self, at: Millis) -> UnixMillis {
        let (now, unix) = self.clock;
        if at >= now {
            unix.saturating_add(at.0 - now.0)
        } else {
            unix.saturating_sub(now.0 - at.0)
        }
    }
}

/// A deadline rounded up to the tick granularity.
pub(super) fn round_up(t: Millis) -> Millis {
    Millis(t.0.div_ceil(TICK).saturating_mul(TICK))
}
