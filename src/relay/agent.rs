//! The agent's presence in a session, as its subscribers see it
//! (`presence` frames) and `GET /sessions/{sid}` reports it. (Who is
//! connected here, parked polls and subscribers, is
//! [`presence`](super::presence).) The agent is online while one of its
//! polls is parked here, for the grace after its last request here ended,
//! and while another instance says so. Subscribers hear only changes, stamped
//! with the wall-clock time of the change. Each step also tells the
//! engine what this instance sees, for the other instances, which it
//! passes on as it sees fit; their states come back through
//! [`Relay::agent_published`] and are kept per session, at most
//! [`MAX_INSTANCES`].
//!
//! Invariant: `online` and `since` are what a subscriber would be told
//! now; they change only in a step, which tells the subscribers watching.

use log::debug;

use super::frames::presence_frame;
use super::live::{Live, round_up};
use super::{ApiError, Effect, Engine, Relay, Scope};
use crate::store::SessionId;
use crate::store::seam::{AgentHere, AgentState};
use crate::time::{Millis, UnixMillis};
use crate::wire::{push_decimal_str, push_json_str};

/// Other instances' agent states kept per session, at most.
pub(super) const MAX_INSTANCES: usize = 64;

/// The clocks of a presence step.
#[derive(Clone, Copy)]
pub(super) struct At {
    now: Millis,
    pub(super) unix: UnixMillis,
    grace: u64,
}

/// What a presence step found.
pub(super) struct Step {
    /// The state subscribers see changed to this.
    changed: Option<bool>,
    /// The agent here, for the other instances.
    here: AgentHere,
    /// When to look again.
    wake: Option<Millis>,
}

impl Live {
    /// Recomputes the agent's state: online while a poll is parked here
    /// (`parked`, its own or one of every session), for the grace after
    /// the last agent request here ended (`every_end`: the last
    /// all-sessions poll covering it), and while another instance says so.
    /// `every_remote`: until when another instance's agent of every
    /// session that covers it is online, if one is.
    pub(super) fn step(
        &mut self,
        at: At,
        parked: bool,
        every_end: Option<Millis>,
        every_remote: Option<u64>,
    ) -> Step {
        let end = self.agent_end.max(every_end);
        let local_until = end.map(|t| t.after_ms(at.grace));
        let local = parked || local_until.is_some_and(|u| at.now < u);
        let remote = self
            .remote
            .iter()
            .map(|a| a.until)
            .chain(every_remote)
            .filter(|u| *u > at.unix)
            .min();
        let online = local || remote.is_some();
        let mut wake = None;
        let mut soon = |t: Millis| wake = Some(wake.map_or(t, |w: Millis| w.min(t)));
        if let Some(u) = local_until.filter(|_| local && !parked) {
            soon(u);
        }
        if let Some(u) = remote {
            soon(at.now.after_ms(u - at.unix));
        }
        let here = if parked {
            AgentHere::Parked
        } else if let Some(u) = local_until.filter(|_| local) {
            AgentHere::Until(at.unix + u.since(at.now))
        } else {
            AgentHere::Away
        };
        let changed = (online != self.online).then(|| {
            self.online = online;
            self.since = at.unix;
            online
        });
        Step {
            changed,
            here,
            wake,
        }
    }

    /// When another instance last saw an agent, or this one did.
    pub(super) fn seen(&self) -> Option<UnixMillis> {
        let remote = self.remote.iter().map(|a| a.seen).max();
        self.agent_seen.max(remote)
    }
}

impl Step {
    /// Tells the subscribers here (`watched`) and the engine, for the
    /// other instances, and schedules the next look in `next`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn carry_out(
        self,
        sid: &SessionId,
        live: &mut Live,
        watched: bool,
        effects: &mut Vec<Effect>,
        engine: &mut Engine,
        next: &mut Option<Millis>,
        at: At,
    ) {
        if let Some(online) = self.changed {
            debug!(session_id = sid.as_str(), online = online; "agent presence changed");
            if watched {
                effects.push(Effect::Broadcast {
                    sid: sid.clone(),
                    frame: presence_frame(sid, online, at.unix),
                });
            }
        }
        let seen = live.agent_seen.unwrap_or(0);
        let again = engine.announce_agent(sid, &mut live.told, self.here, seen, at.unix, at.grace);
        let again = again.map(|ms| at.now.after_ms(ms));
        if let Some(w) = [self.wake, again].into_iter().flatten().min() {
            let w = round_up(w);
            *next = Some(next.map_or(w, |n| n.min(w)));
        }
    }
}

impl Relay {
    /// An agent request to `sid` (a poll or an answer) arrived: the agent
    /// is online from now. `ended`: the request is answered now (not
    /// parked), so the grace starts now too.
    pub(super) fn agent_seen(&mut self, now: Millis, sid: &str, ended: bool) {
        let unix = self.unix_at(now);
        let alone = !self.engine.others_hear_agents();
        let seen = |live: &mut Live| {
            live.agent_seen = Some(unix);
            if ended {
                live.agent_end = Some(now);
            }
            // Online already, and nobody else to tell: nothing changes
            // now, and the tick due by the grace's old end looks again
            // then.
            live.online && alone
        };
        let unchanged = match self.live.get_mut(sid) {
            Some(live) => seen(live),
            None => {
                let Some(key) = self.store.key(sid) else {
                    return;
                };
                seen(self.live.entry(key.clone()).or_default())
            }
        };
        if !unchanged {
            self.refresh_presence(now, sid);
        }
    }

    /// A parked poll of `sid` ended (answered, timed out, hung up): the
    /// grace starts now.
    pub(super) fn agent_left(&mut self, now: Millis, sid: &str) {
        let alone = !self.engine.others_hear_agents();
        let grace = self.limits.agent_grace_ms;
        let Some(live) = self.live.get_mut(sid) else {
            return;
        };
        live.agent_end = Some(now);
        if live.online && alone {
            // Still online for the grace: only the tick that may end it.
            self.wake_at(now.after_ms(grace));
            return;
        }
        self.refresh_presence(now, sid);
    }

    /// Tells the subscribers of `sid` when the agent's state changed,
    /// tells the engine (for the other instances), and schedules the next
    /// look.
    pub(super) fn refresh_presence(&mut self, now: Millis, sid: &str) {
        let at = self.at(now);
        let parked = self.parked(sid) || self.every_parked(sid);
        let every_end = self.every_end(sid);
        let every_remote = self.every_remote(sid, at.unix);
        let Relay {
            live,
            engine,
            effects,
            presence,
            next_tick,
            ..
        } = self;
        let Some(key) = live.get_key_value(sid).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(entry) = live.get_mut(sid) else {
            return;
        };
        let watched = presence.get(sid).is_some_and(|p| !p.subscribers.is_empty());
        let step = entry.step(at, parked, every_end, every_remote);
        step.carry_out(&key, entry, watched, effects, engine, next_tick, at);
    }

    /// Another instance's agent state in `sid` changed.
    pub(super) fn agent_published(&mut self, now: Millis, sid: &SessionId, state: &AgentState) {
        let live = self.live.entry(sid.clone()).or_default();
        let mut remote = std::mem::take(&mut live.remote).into_vec();
        remote.retain(|a| a.instance != state.instance);
        if remote.len() >= MAX_INSTANCES {
            remote.remove(0);
        }
        if state.until > 0 {
            remote.push(AgentState {
                instance: state.instance.clone(),
                until: state.until,
                seen: state.seen,
            });
        }
        live.remote = remote.into_boxed_slice();
        self.refresh_presence(now, sid);
    }

    /// `GET /sessions/{sid}`: the session's counters and the agent's state.
    pub fn session_info(&mut self, now: Millis, sid: &str) -> Result<Vec<u8>, ApiError> {
        let log = self.store.existing(now, sid)?;
        let (next, ..) = log.counters();
        let mut out = String::with_capacity(192);
        out.push_str("{\"session_id\":");
        push_json_str(&mut out, sid);
        out.push_str(",\"epoch\":");
        push_json_str(&mut out, log.epoch());
        out.push_str(",\"last_seq\":");
        push_decimal_str(&mut out, next.0.saturating_sub(1));
        out.push_str(",\"pending\":");
        push_decimal_str(&mut out, log.pending_len() as u64);
        let live = self.live.get(sid);
        let parked = self.parked(sid) || self.every_parked(sid);
        let every = self
            .every_end(sid)
            .is_some_and(|e| now < e.after_ms(self.limits.agent_grace_ms));
        let remote = self.every_remote(sid, self.unix_at(now)).is_some();
        let online = parked || every || remote || live.is_some_and(|l| l.online);
        out.push_str(if online {
            ",\"agent\":\"online\",\"agent_seen_ts\":"
        } else {
            ",\"agent\":\"offline\",\"agent_seen_ts\":"
        });
        match live.and_then(|l| l.seen()) {
            Some(ts) => push_decimal_str(&mut out, ts),
            None => out.push_str("null"),
        }
        out.push('}');
        Ok(out.into_bytes())
    }

    /// The clocks and the grace, for a presence step.
    pub(super) fn at(&self, now: Millis) -> At {
        At {
            now,
            unix: self.unix_at(now),
            grace: self.limits.agent_grace_ms,
        }
    }

    /// `DELETE /agent/{sid}`: the agent stops cleanly. Every grace it has
    /// in `sid` ends now (the all-sessions one too, until its next
    /// request), so the subscribers see it offline unless a poll is
    /// parked. Live state only: nothing is stored.
    pub fn agent_stopped(&mut self, now: Millis, sid: &str) -> Result<Vec<u8>, ApiError> {
        self.store.existing(now, sid)?;
        let sid = self.stop_in(now, sid)?;
        self.every_graces_told_again(now, &sid);
        self.engine.agent_stopped(&Scope::Session(sid));
        Ok(b"{\"ok\":true}".to_vec())
    }

    /// The agent stops in `sid`, which the copy holds: its graces there
    /// end (here, and the other instances' as heard here). Returns the
    /// session's id.
    pub(super) fn stop_in(&mut self, now: Millis, sid: &str) -> Result<SessionId, ApiError> {
        let Some(sid_key) = self.store.key(sid).cloned() else {
            return Err(ApiError::session_not_found());
        };
        let unix = self.unix_at(now);
        let live = self.live.entry(sid_key.clone()).or_default();
        live.agent_end = None;
        live.cut_every(self.every_stamps, unix);
        self.refresh_presence(now, sid);
        Ok(sid_key)
    }

    /// Whether an agent's poll of `sid` is parked here.
    fn parked(&self, sid: &str) -> bool {
        self.presence
            .get(sid)
            .is_some_and(|p| !p.waiters.is_empty())
    }
}
