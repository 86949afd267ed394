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
            return Ok(Fetch::Ready(page));
        }
        if self.every.len() >= self.limits.max_waiters {
            return Err(ApiError::unavailable(
                "waiter limit reached for every session",
            ));
        }
        self.every.push(EveryWaiter {
            conn,
            scope,
            after,
            limit: q.limit,
        });
        self.counts.parked_polls += 1;
        Ok(Fetch::Park {
            deadline: Millis(now.0.saturating_add(q.timeout_ms)),
        })
    }

    /// Forgets a parked all-sessions poll (answered, timed out, hung up).
    pub fn cancel_every_wait(&mut self, conn: ConnId, _now: Millis) {
        if let Some(i) = self.every.iter().position(|w| w.conn == conn) {
            self.every.swap_remove(i);
            self.counts.parked_polls -= 1;
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
        }
        self.every_fetched(now, &listed_all);
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
