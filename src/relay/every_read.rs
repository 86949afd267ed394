//! The all-sessions poll where the engine keeps the order of every
//! pending prompt (several instances), and the agents of every session
//! that other instances serve.
//!
//! The list comes from the engine: a poll parks at once and reads it
//! ([`Engine::read_every`](crate::store::engine::Engine::read_every));
//! a read that finds something answers it, one that finds nothing leaves
//! it parked, and each prompt it covers that arrives anywhere
//! ([`Relay::every_arrived`]) makes it read again: one check per parked
//! all-sessions poll, never a walk over sessions. A prompt that arrives
//! while a read is in flight may be in it or not, so the poll reads again
//! if that read finds nothing. Reads go only once the engine hears
//! arrivals, and every poll reads again when it hears them again
//! ([`Relay::every_again`]), so none is missed between a read and the
//! channel, across a reconnect or a store that was lost.
//!
//! Presence: this instance announces its agent of every session a scope
//! covers to the others with a lease, as for one session
//! ([`Relay::announce_every`]), and keeps theirs, read when a session's
//! presence is computed. A stop (`DELETE /agent`) anywhere ends the
//! graces everywhere; an agent announced parked stays online until its
//! instance says otherwise, which it does when it hears of the stop.

use std::rc::Rc;

use log::debug;

use super::every::{EveryWaiter, push_with_cursor};
use super::{ApiError, ConnId, Effect, Fetch, Relay, next_ticket};
use crate::store::MAX_PAGE_BYTES;
use crate::store::seam::{AgentHere, Announced, EveryAgentState, EveryRead, Listed, Scope};
use crate::store::types::EveryQuery;
use crate::time::Millis;

/// How long a `wait=false` poll waits for its read at most (a Redis that
/// stopped answering); then it is answered `[]`.
const READ_WAIT_MS: u64 = 10_000;

/// Other instances' agents of every session kept, at most.
const MAX_REMOTE_EVERY: usize = 256;

/// The soonest end among the agents of every session other instances
/// announced that cover `sid` and count there: online at `unix`, and
/// parked, or in a grace that began after the agent last stopped there
/// (`cut`, wall clock: a grace's `seen` is when its poll ended).
pub(super) fn remote_every_until(
    remote: &[EveryAgentState],
    sid: &str,
    cut: Option<u64>,
    unix: u64,
) -> Option<u64> {
    remote
        .iter()
        .filter(|r| {
            r.until > unix && r.scope.covers(sid) && (r.parked || cut.is_none_or(|c| r.seen > c))
        })
        .map(|r| r.until)
        .min()
}

impl Relay {
    /// `GET /prompts` with no session where the engine keeps the order:
    /// parked at once, answered by its read (see the module doc).
    pub(super) fn park_every_read(
        &mut self,
        now: Millis,
        conn: ConnId,
        scope: Scope,
        q: EveryQuery,
    ) -> Result<Fetch, ApiError> {
        if self.every.len() >= self.limits.max_waiters {
            return Err(ApiError::unavailable(
                "waiter limit reached for every session",
            ));
        }
        let once = !q.wait || q.timeout_ms == 0;
        // A poll that answers what it finds needs no arrivals.
        let hears = once || self.engine.every_listen(true);
        self.every.push(EveryWaiter {
            conn,
            scope: scope.clone(),
            after: q.after,
            limit: q.limit,
            read: None,
            dirty: false,
            once,
        });
        self.counts.parked_polls += 1;
        if hears {
            self.read_every(self.every.len() - 1);
        }
        self.every_seen(now, &scope, false);
        let wait = if once { READ_WAIT_MS } else { q.timeout_ms };
        Ok(Fetch::Park {
            deadline: now.after_ms(wait),
            sid: None,
        })
    }

    /// The parked all-sessions poll `i` reads the list.
    fn read_every(&mut self, i: usize) {
        let w = &mut self.every[i];
        let t = next_ticket(&mut self.tickets, w.conn);
        w.read = Some(t.n);
        w.dirty = false;
        self.engine.read_every(t, &w.scope, w.after, w.limit);
    }

    /// The last all-sessions poll here left: arrivals are needed no more.
    pub(super) fn every_left(&mut self) {
        if self.every.is_empty() {
            self.engine.every_listen(false);
        }
    }

    /// A prompt of `sid` arrived (on any instance): the parked polls that
    /// cover it read again, or once the read in flight is answered.
    pub(super) fn every_arrived(&mut self, sid: &str) {
        for i in 0..self.every.len() {
            let w = &mut self.every[i];
            if w.once || !w.scope.covers(sid) {
                continue;
            }
            if w.read.is_some() {
                w.dirty = true;
            } else {
                self.read_every(i);
            }
        }
    }

    /// Arrivals are heard again (or for the first time): every parked
    /// poll reads again.
    pub(super) fn every_again(&mut self) {
        for i in 0..self.every.len() {
            let w = &mut self.every[i];
            if w.read.is_some() {
                w.dirty = true;
            } else if !w.once {
                self.read_every(i);
            }
        }
    }

    /// The answer to the read `to` of a parked all-sessions poll: the
    /// poll is answered if it found something (or answers what it
    /// finds), reads again if a prompt arrived meanwhile, and otherwise
    /// stays parked. A read that failed leaves it parked until arrivals
    /// are heard again (the store back).
    pub(super) fn every_page_read(
        &mut self,
        now: Millis,
        to: crate::store::types::Ticket,
        result: Result<EveryRead, ApiError>,
    ) {
        let Some(i) = self
            .every
            .iter()
            .position(|w| w.conn == to.conn && w.read == Some(to.n))
        else {
            return; // answered or gone meanwhile
        };
        let w = &mut self.every[i];
        w.read = None;
        match &result {
            // Nothing it covers among as many as one read looks at: it
            // reads on from there (nothing it covers lies before).
            Ok(r) if r.listed.is_empty() && r.resume.is_some() => {
                w.after = r.resume;
                self.read_every(i);
                return;
            }
            Ok(r) if r.listed.is_empty() && !w.once => {
                if w.dirty {
                    self.read_every(i);
                }
                return;
            }
            Err(_) if !w.once => return,
            _ => {}
        }
        let w = self.every.swap_remove(i);
        self.counts.parked_polls -= 1;
        let (status, body) = match result {
            Ok(EveryRead { listed: items, .. }) => {
                let (body, listed) = listed_page(&items, w.limit);
                debug!(listed = listed; "prompts of every session fetched");
                self.listed_fetched(now, &items[..listed]);
                (200, body)
            }
            Err(e) => (e.status, Rc::from(e.body())),
        };
        self.effects.push(Effect::Respond {
            to: w.conn,
            status,
            body,
        });
        self.every_left();
        self.every_seen(now, &w.scope, true);
    }

    /// The prompts an answer listed: a receipt for each not fetched
    /// before, here through the copy when it holds the prompt, and for
    /// the other instances.
    fn listed_fetched(&mut self, now: Millis, items: &[Listed]) {
        let unix = self.unix_at(now);
        for it in items {
            let held = self.store.get(&it.sid).and_then(|l| l.pending_at(it.seq));
            if held.is_some() {
                self.fetched_one(now, &it.sid, it.seq);
            } else {
                let id = it.client_msg_id.as_str();
                self.engine.publish_receipts(&it.sid, unix, &[id]);
            }
        }
    }

    /// Tells the other instances what they must know of this instance's
    /// agent of every session `scope` covers: parked here, in its grace,
    /// or gone. Called when a poll of it parks or ends, when it stops,
    /// and from the tick (a parked poll's lease renewed, a grace passed).
    pub(super) fn announce_every(&mut self, now: Millis, scope: &Scope) {
        if !self.engine.others_hear_agents() {
            return;
        }
        let at = self.at(now);
        let grace = self.limits.agent_grace_ms;
        // Seen: now while parked; in a grace, when its poll ended.
        let (here, seen) = if self.every.iter().any(|w| w.scope == *scope) {
            (AgentHere::Parked, at.unix)
        } else {
            match self.every_graces.iter().find(|g| g.scope == *scope) {
                Some(g) if now < g.end.after_ms(grace) => (
                    AgentHere::Until(at.unix + g.end.after_ms(grace).since(now)),
                    self.unix_at(g.end),
                ),
                _ => (AgentHere::Away, at.unix),
            }
        };
        let i = match self.every_told.iter().position(|(s, _)| s == scope) {
            Some(i) => i,
            None if here == AgentHere::Away => return,
            None => {
                self.every_told.push((scope.clone(), Announced::default()));
                self.every_told.len() - 1
            }
        };
        let told = &mut self.every_told[i].1;
        let again = self
            .engine
            .announce_every(scope, told, here, seen, at.unix, grace);
        if here == AgentHere::Away && told.until == 0 {
            self.every_told.swap_remove(i);
        }
        if let Some(ms) = again {
            self.wake_at(now.after_ms(ms));
        }
    }

    /// The agent stopped in `sid`: the graces of this instance's agents
    /// of every session that cover it are told again, as graces (the
    /// others may have heard them last as parked polls, which a stop does
    /// not end), so that the others end them there.
    pub(super) fn every_graces_told_again(&mut self, now: Millis, sid: &str) {
        let graces: Vec<Scope> = self
            .every_told
            .iter()
            .filter(|(s, _)| s.covers(sid) && !self.every.iter().any(|w| w.scope == *s))
            .map(|(s, _)| s.clone())
            .collect();
        for scope in graces {
            if let Some((_, told)) = self.every_told.iter_mut().find(|(s, _)| *s == scope) {
                *told = Announced::default();
            }
            self.announce_every(now, &scope);
        }
    }

    /// The tick: every lease of this instance's agents of every session
    /// looked at again.
    pub(super) fn every_tick(&mut self, now: Millis) {
        let scopes: Vec<Scope> = self.every_told.iter().map(|(s, _)| s.clone()).collect();
        for scope in scopes {
            self.announce_every(now, &scope);
        }
    }

    /// The engine lost everything it held, the agents of every session
    /// too: this instance's are told again.
    pub(super) fn every_lost(&mut self, now: Millis) {
        for (_, told) in &mut self.every_told {
            *told = Announced::default();
        }
        self.every_tick(now);
        self.every_again();
    }

    /// Another instance's agent of every session a scope covers changed.
    pub(super) fn every_agent_heard(&mut self, now: Millis, state: EveryAgentState) {
        let scope = state.scope.clone();
        self.remote_every
            .retain(|r| !(r.instance == state.instance && r.scope == scope));
        if state.until > 0 {
            if self.remote_every.len() >= MAX_REMOTE_EVERY {
                self.remote_every.remove(0);
            }
            self.remote_every.push(state);
        }
        self.tell_watched(now, &scope);
    }

    /// The other instances' agents of every session, read whole.
    pub(super) fn every_agents_read(&mut self, now: Millis, mut states: Vec<EveryAgentState>) {
        states.truncate(MAX_REMOTE_EVERY);
        self.remote_every = states;
        self.tell_watched(now, &Scope::Every);
    }

    /// An agent stopped through another instance (`DELETE /agent`): its
    /// graces here end as if it had stopped here.
    pub(super) fn agent_stop_heard(&mut self, now: Millis, scope: &Scope) {
        match scope {
            // Not held here: no grace of one session, nobody watching;
            // a grace of every session may cover it all the same.
            Scope::Session(sid) => {
                let _ = self.stop_in(now, sid);
                self.every_graces_told_again(now, sid);
            }
            _ => self.stop_every(now, scope),
        }
    }

    /// Where another instance announced an agent of every session that
    /// covers `sid`, online at `unix`: until when, at the soonest.
    pub(super) fn every_remote(&self, sid: &str, unix: u64) -> Option<u64> {
        let cut = self.live.get(sid).and_then(|l| l.every_cut_unix());
        remote_every_until(&self.remote_every, sid, cut, unix)
    }
}

/// `[…]` of the prompts a read listed, at most `limit` and
/// [`MAX_PAGE_BYTES`] (always at least one), each with its `cursor` (its
/// arrival number as the engine numbered it); and how many it lists.
fn listed_page(items: &[Listed], limit: usize) -> (Rc<[u8]>, usize) {
    let mut out = Vec::with_capacity(64);
    out.push(b'[');
    let mut listed = 0;
    for it in items.iter().take(limit) {
        let data = it.data.as_bytes();
        if out.len() > 1 {
            if out.len() + data.len() + 40 > MAX_PAGE_BYTES {
                break;
            }
            out.push(b',');
        }
        push_with_cursor(&mut out, data, it.n);
        listed += 1;
    }
    out.push(b']');
    (Rc::from(out), listed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SessionId;

    fn listed(n: u64, sid: &str, data: &str) -> Listed {
        Listed {
            n,
            sid: SessionId::new(sid).unwrap(),
            seq: crate::store::Seq(1),
            client_msg_id: "c".into(),
            data: data.into(),
        }
    }

    #[test]
    fn a_read_page_carries_each_prompt_with_its_cursor_up_to_the_limit() {
        let items = [listed(7, "a", "{\"x\":1}"), listed(9, "b", "{\"x\":2}")];
        let (body, n) = listed_page(&items, 1);
        assert_eq!((&*body, n), (&b"[{\"x\":1,\"cursor\":\"7\"}]"[..], 1));
        let (body, n) = listed_page(&items, 5);
        assert_eq!(n, 2);
        assert!(body.ends_with(b"{\"x\":2,\"cursor\":\"9\"}]"));
    }

    #[test]
    fn a_remote_grace_is_hidden_by_a_later_stop_and_a_parked_poll_is_not() {
        let state = |parked| EveryAgentState {
            instance: "i".into(),
            scope: Scope::Prefix(Rc::from("a")),
            until: 100,
            seen: 30,
            parked,
        };
        let grace = [state(false)];
        assert_eq!(remote_every_until(&grace, "ab", None, 50), Some(100));
        assert_eq!(remote_every_until(&grace, "ab", Some(29), 50), Some(100));
        assert_eq!(remote_every_until(&grace, "ab", Some(30), 50), None);
        assert_eq!(remote_every_until(&grace, "b", None, 50), None);
        assert_eq!(remote_every_until(&grace, "ab", None, 100), None);
        let parked = [state(true)];
        assert_eq!(remote_every_until(&parked, "ab", Some(90), 50), Some(100));
    }
}
