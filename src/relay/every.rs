//! One agent for many sessions: `GET /prompts` with no session lists the
//! pending prompts of every session its token opens (a [`Scope`]), oldest
//! arrival first, each with its `session_id` and a `cursor`. The list is
//! read from the store's arrival index, never by a walk over sessions;
//! a poll with nothing to read parks on one relay-wide list, which a
//! prompt of any session it covers wakes: a prompt costs one check of
//! an empty list when nobody waits there.
//!
//! Cursors: an arrival number plus a base taken from the wall clock at
//! start (its milliseconds times 2^20), so a cursor of an earlier run is
//! below every arrival of this one, whose prompts it then lists again
//! (an agent dedupes by `client_msg_id`), while one of this run orders
//! its arrivals.
//!
//! Invariant: a connection appears at most once in [`Relay::every`], and
//! is counted once in the parked polls.

use std::rc::Rc;

use log::debug;

use super::{ApiError, ConnId, Effect, Fetch, Relay};
use crate::store::types::EveryQuery;
use crate::store::{MAX_PAGE_BYTES, Seq, SessionId};
use crate::time::Millis;
use crate::wire::push_decimal;

/// The sessions an all-sessions poll covers: what its token opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A server-wide token, or an open server.
    Every,
    /// A token for the sessions whose id starts with this.
    Prefix(Rc<str>),
    /// A token for one session.
    Session(SessionId),
}

impl Scope {
    /// Whether every session `other` covers, this one covers too.
    fn includes(&self, other: &Scope) -> bool {
        match (self, other) {
            (Scope::Every, _) => true,
            (Scope::Prefix(p), Scope::Prefix(q)) => q.starts_with(&**p),
            (_, Scope::Session(s)) => self.covers(s),
            _ => false,
        }
    }

    /// Whether the poll covers session `sid`.
    pub fn covers(&self, sid: &str) -> bool {
        match self {
            Scope::Every => true,
            Scope::Prefix(p) => sid.starts_with(&**p),
            Scope::Session(s) => s.as_str() == sid,
        }
    }
}

/// A parked all-sessions poll.
#[derive(Debug)]
pub struct EveryWaiter {
    conn: ConnId,
    scope: Scope,
    /// Only arrivals after this (already the relay's arrival number).
    after: Option<u64>,
    limit: usize,
}

impl EveryWaiter {
    /// Whether this poll covers session `sid`.
    pub(super) fn covers(&self, sid: &str) -> bool {
        self.scope.covers(sid)
    }
}

/// When the last all-sessions poll of a scope ended, while its grace
/// lasts.
#[derive(Debug)]
pub struct EveryGrace {
    scope: Scope,
    pub(super) end: Millis,
    /// Numbers the ends, so that an agent stopping in a session
    /// (`Live::every_cut`) cancels the graces that ended before, even in
    /// the same millisecond, and not those after.
    stamp: u64,
}

/// When the last all-sessions poll covering `sid` ended, among `graces`,
/// counting only those that ended after the agent last stopped there
/// (`cut`).
pub(super) fn end_covering(graces: &[EveryGrace], sid: &str, cut: Option<u64>) -> Option<Millis> {
    graces
        .iter()
        .filter(|g| g.scope.covers(sid) && cut.is_none_or(|c| g.stamp > c))
        .map(|g| g.end)
        .max()
}

/// An all-sessions answer: its bytes, and the prompts it lists.
type Page = (Rc<[u8]>, Vec<(SessionId, Seq)>);

/// Multiplier of the start time that makes the cursors of a run above
/// those of every earlier one (a run stores fewer than 2^20 prompts per
/// millisecond it runs).
const RUN_SHIFT: u32 = 20;

impl Relay {
    /// `GET /prompts` with no session: the page now, or park `conn` on
    /// the relay-wide list until a prompt of a covered session arrives
    /// or `timeout` passes.
    pub fn get_every_prompts(
        &mut self,
        now: Millis,
        conn: ConnId,
        scope: Scope,
        q: EveryQuery,
    ) -> Result<Fetch, ApiError> {
        if !self.engine.holds_every_prompt() {
            return Err(ApiError::every_session_unsupported());
        }
        let after = q.after.and_then(|a| a.checked_sub(self.cursor_base()));
        let (page, listed) = self.every_page(&scope, after, q.limit)?;
        if !q.wait || !listed.is_empty() || q.timeout_ms == 0 {
            debug!(listed = listed.len(); "prompts of every session fetched");
            self.every_fetched(now, &listed);
            self.every_seen(now, &scope, true);
            return Ok(Fetch::Ready(page));
        }
        if self.every.len() >= self.limits.max_waiters {
            return Err(ApiError::unavailable(
                "waiter limit reached for every session",
            ));
        }
        self.every.push(EveryWaiter {
            conn,
            scope: scope.clone(),
            after,
            limit: q.limit,
        });
        self.counts.parked_polls += 1;
        self.every_seen(now, &scope, false);
        Ok(Fetch::Park {
            deadline: Millis(now.0.saturating_add(q.timeout_ms)),
        })
    }

    /// Forgets a parked all-sessions poll (answered, timed out, hung up).
    pub fn cancel_every_wait(&mut self, conn: ConnId, now: Millis) {
        if let Some(i) = self.every.iter().position(|w| w.conn == conn) {
            let w = self.every.swap_remove(i);
            self.counts.parked_polls -= 1;
            self.every_seen(now, &w.scope, true);
        }
    }

    /// A prompt of `sid` arrived: every parked all-sessions poll that
    /// covers it is answered. With nobody parked there, one check.
    pub(super) fn wake_every(&mut self, now: Millis, sid: &str) {
        if self.every.is_empty() || !self.every.iter().any(|w| w.scope.covers(sid)) {
            return;
        }
        let waiters = std::mem::take(&mut self.every);
        let mut listed_all = Vec::new();
        let mut scopes: Vec<Scope> = Vec::new();
        for w in waiters {
            if !w.scope.covers(sid) {
                self.every.push(w);
                continue;
            }
            let (status, body) = match self.every_page(&w.scope, w.after, w.limit) {
                Ok((body, listed)) => {
                    listed_all.extend(listed);
                    (200, body)
                }
                Err(e) => (e.status, Rc::from(e.body())),
            };
            self.effects.push(Effect::Respond {
                to: w.conn,
                status,
                body,
            });
            self.counts.parked_polls -= 1;
            if !scopes.contains(&w.scope) {
                scopes.push(w.scope);
            }
        }
        self.every_fetched(now, &listed_all);
        for scope in scopes {
            self.every_seen(now, &scope, true);
        }
    }

    /// Whether an all-sessions poll covering `sid` is parked here.
    pub(super) fn every_parked(&self, sid: &str) -> bool {
        self.every.iter().any(|w| w.covers(sid))
    }

    /// When the last all-sessions poll covering `sid` ended, if its
    /// grace may last (and the agent did not stop there since).
    pub(super) fn every_end(&self, sid: &str) -> Option<Millis> {
        let cut = self.live.get(sid).and_then(|l| l.every_cut);
        end_covering(&self.every_graces, sid, cut)
    }

    /// An all-sessions poll of `scope` parked (`ended` false) or ended:
    /// the agent is online in every session it covers, computed when a
    /// session's presence is asked; only the sessions watched here are
    /// told now (a walk over the subscribed sessions, at such a change,
    /// not over every session).
    fn every_seen(&mut self, now: Millis, scope: &Scope, ended: bool) {
        if ended {
            let grace = self.limits.agent_grace_ms;
            self.every_stamps += 1;
            let stamp = self.every_stamps;
            match self.every_graces.iter_mut().find(|g| g.scope == *scope) {
                Some(g) => {
                    g.end = now;
                    g.stamp = stamp;
                }
                None => {
                    if self.every_graces.len() >= self.limits.max_waiters.max(1) * 2 {
                        self.every_graces.remove(0);
                    }
                    self.every_graces.push(EveryGrace {
                        scope: scope.clone(),
                        end: now,
                        stamp,
                    });
                }
            }
            self.wake_at(now.after_ms(grace));
        }
        self.tell_watched(now, scope);
    }

    /// Refreshes the agent's presence in the sessions `scope` covers that
    /// have subscribers here.
    fn tell_watched(&mut self, now: Millis, scope: &Scope) {
        let watched: Vec<SessionId> = self
            .presence
            .iter()
            .filter(|(sid, p)| !p.subscribers.is_empty() && scope.covers(sid))
            .map(|(sid, _)| sid.clone())
            .collect();
        for sid in watched {
            self.live.entry(sid.clone()).or_default();
            self.refresh_presence(now, &sid);
        }
    }

    /// `DELETE /agent` with no session: the agent stops in every session
    /// `scope` covers. The graces of its all-sessions polls there end, and
    /// those of its polls of one session; a poll still parked keeps it
    /// online. A walk over the sessions with live state, on this rare
    /// request only.
    pub fn agent_stopped_every(&mut self, now: Millis, scope: &Scope) -> Vec<u8> {
        self.every_graces.retain(|g| !scope.includes(&g.scope));
        let cut = self.every_stamps;
        let covered: Vec<SessionId> = self
            .live
            .iter_mut()
            .filter(|(sid, _)| scope.covers(sid))
            .map(|(sid, live)| {
                live.agent_end = None;
                live.every_cut = Some(cut);
                sid.clone()
            })
            .collect();
        for sid in covered {
            self.refresh_presence(now, &sid);
        }
        b"{\"ok\":true}".to_vec()
    }

    /// The base of this run's cursors.
    fn cursor_base(&self) -> u64 {
        self.started.saturating_mul(1 << RUN_SHIFT)
    }

    /// `[…]` of the pending prompts `scope` covers that arrived after
    /// `after`, oldest first, at most `limit` and [`MAX_PAGE_BYTES`]
    /// (always at least one), each with its `cursor`; and which prompts
    /// it lists.
    fn every_page(
        &self,
        scope: &Scope,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Page, ApiError> {
        let base = self.cursor_base();
        let mut out = Vec::with_capacity(64);
        let mut listed = Vec::new();
        out.push(b'[');
        let arrivals = self.store.arrivals().after(after);
        for (n, sid, seq) in arrivals.filter(|(_, sid, _)| scope.covers(sid)) {
            if listed.len() >= limit {
                break;
            }
            let Some(msg) = self.store.get(sid).and_then(|log| log.pending_at(seq)) else {
                debug_assert!(false, "an arrival that is not pending");
                continue;
            };
            let data = msg.data();
            if out.len() > 1 {
                if out.len() + data.len() + 40 > MAX_PAGE_BYTES {
                    break;
                }
                out.push(b',');
            }
            if msg.is_damaged() {
                return Err(ApiError::stored_message_damaged(seq.get()));
            }
            // The stored object, with its cursor as the last field.
            out.extend_from_slice(&data[..data.len().saturating_sub(1)]);
            out.extend_from_slice(b",\"cursor\":\"");
            push_decimal(&mut out, base.saturating_add(n));
            out.extend_from_slice(b"\"}");
            listed.push((sid.clone(), seq));
        }
        out.push(b']');
        Ok((Rc::from(out), listed))
    }

    /// The prompts an all-sessions answer carried: a receipt for each not
    /// fetched before, as for one session.
    fn every_fetched(&mut self, now: Millis, listed: &[(SessionId, Seq)]) {
        for (sid, seq) in listed {
            self.fetched_one(now, sid, *seq);
        }
    }
}
