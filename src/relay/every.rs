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
//! Where the loop's log does not hold every session's prompts (several
//! instances), the list is read from the engine instead, and a parked
//! poll reads again when a prompt it covers arrives anywhere
//! ([`every_read`](super::every_read)).
//!
//! Invariant: a connection appears at most once in [`Relay::every`], and
//! is counted once in the parked polls.

use std::rc::Rc;

use log::debug;

use super::{ApiError, ConnId, Effect, Fetch, Relay};
pub use crate::store::seam::Scope;
use crate::store::types::EveryQuery;
use crate::store::{MAX_PAGE_BYTES, Seq, SessionId};
use crate::time::Millis;
use crate::wire::push_decimal;

/// A parked all-sessions poll.
#[derive(Debug)]
pub struct EveryWaiter {
    pub(super) conn: ConnId,
    pub(super) scope: Scope,
    /// Only arrivals after this (the relay's arrival number; the
    /// engine's, where it keeps the order).
    pub(super) after: Option<u64>,
    pub(super) limit: usize,
    /// Where the engine keeps the order: the ticket number of the read
    /// in flight.
    pub(super) read: Option<u64>,
    /// A prompt it covers arrived while that read was in flight: it
    /// reads again if the read finds nothing.
    pub(super) dirty: bool,
    /// `wait=false` (or no timeout): answered with what its read finds,
    /// even nothing.
    pub(super) once: bool,
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
    pub(super) scope: Scope,
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

/// Appends a listed prompt's stored object to a page, with its `cursor`
/// as the last field.
pub(super) fn push_with_cursor(out: &mut Vec<u8>, data: &[u8], cursor: u64) {
    out.extend_from_slice(&data[..data.len().saturating_sub(1)]);
    out.extend_from_slice(b",\"cursor\":\"");
    push_decimal(out, cursor);
    out.extend_from_slice(b"\"}");
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
            return self.park_every_read(now, conn, scope, q);
        }
        let after = q.after.and_then(|a| a.checked_sub(self.cursor_base()));
        // A part of the sessions reads its own index of them, not a walk
        // past every other session's pending prompts.
        self.store.keep_scope(&scope);
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
            read: None,
            dirty: false,
            once: false,
        });
        self.counts.parked_polls += 1;
        self.every_seen(now, &scope, false);
        Ok(Fetch::Park {
            deadline: Millis(now.0.saturating_add(q.timeout_ms)),
            sid: None,
        })
    }

    /// Forgets a parked all-sessions poll (answered, timed out, hung up).
    pub fn cancel_every_wait(&mut self, conn: ConnId, now: Millis) {
        if let Some(i) = self.every.iter().position(|w| w.conn == conn) {
            let w = self.every.swap_remove(i);
            self.counts.parked_polls -= 1;
            self.every_left();
            self.every_seen(now, &w.scope, true);
        }
    }

    /// A prompt of `sid` arrived: every parked all-sessions poll that
    /// covers it is answered. With nobody parked there, one check.
    pub(super) fn wake_every(&mut self, now: Millis, sid: &str) {
        // Where the engine keeps the order, the arrival comes from it
        // (`every_arrived`), for a prompt stored here as for any other.
        if self.every.is_empty()
            || !self.engine.holds_every_prompt()
            || !self.every.iter().any(|w| w.scope.covers(sid))
        {
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
        let cut = self.live.get(sid).and_then(|l| l.every_cut());
        end_covering(&self.every_graces, sid, cut)
    }

    /// An all-sessions poll of `scope` parked (`ended` false) or ended:
    /// the agent is online in every session it covers, computed when a
    /// session's presence is asked; only the sessions watched here are
    /// told now (a walk over the subscribed sessions, at such a change,
    /// not over every session).
    pub(super) fn every_seen(&mut self, now: Millis, scope: &Scope, ended: bool) {
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
        self.announce_every(now, scope);
        self.tell_watched(now, scope);
    }

    /// Refreshes the agent's presence in the sessions `scope` covers that
    /// have subscribers here.
    pub(super) fn tell_watched(&mut self, now: Millis, scope: &Scope) {
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
    /// `scope` covers, here and on every other instance.
    pub fn agent_stopped_every(&mut self, now: Millis, scope: &Scope) -> Vec<u8> {
        self.stop_every(now, scope);
        self.engine.agent_stopped(scope);
        b"{\"ok\":true}".to_vec()
    }

    /// The agent stops in every session `scope` covers. The graces of
    /// its all-sessions polls there end, here and as other instances
    /// announced them, and those of its polls of one session; a poll
    /// still parked keeps it online. A walk over the sessions with live
    /// state, on this rare request only.
    pub(super) fn stop_every(&mut self, now: Millis, scope: &Scope) {
        let mut ended: Vec<Scope> = Vec::new();
        self.every_graces.retain(|g| {
            let keep = !scope.includes(&g.scope);
            if !keep {
                ended.push(g.scope.clone());
            }
            keep
        });
        self.remote_every
            .retain(|r| r.parked || !scope.includes(&r.scope));
        let (cut, unix) = (self.every_stamps, self.unix_at(now));
        let covered: Vec<SessionId> = self
            .live
            .iter_mut()
            .filter(|(sid, _)| scope.covers(sid))
            .map(|(sid, live)| {
                live.agent_end = None;
                live.cut_every(cut, unix);
                sid.clone()
            })
            .collect();
        for s in &ended {
            self.announce_every(now, s);
        }
        for sid in covered {
            self.refresh_presence(now, &sid);
        }
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
        for (n, sid, seq) in self.store.arrivals().after_in(scope, after) {
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
            push_with_cursor(&mut out, data, base.saturating_add(n));
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
