//! `GET /asks/{sid}/{ask_id}`: an agent waiting for the person's reply.
//! Answered at once when the ask is closed (answered or expired) or the
//! request does not wait; otherwise parked like a long-poll, on the
//! session's presence here, until a reply to its ask is applied (made
//! here or on any instance: it arrives as a record like every change) or
//! its deadline passes. Its deadline is the earlier of its `timeout` and
//! the ask's `expires_ts`, so an ask expiring answers its waiters with
//! no work scheduled for the ask itself.

use std::rc::Rc;

use log::debug;

use serde_json::value::RawValue;

use super::{ApiError, ConnId, Effect, PromptsQuery, Relay};
use crate::store::asks::AskState;
use crate::store::{Seq, SessionLog};
use crate::time::{Millis, UnixMillis};
use crate::wire::push_json_str;

/// What `GET /asks` does now.
#[derive(Debug, PartialEq, Eq)]
pub enum AskFetch {
    /// Answer at once with this body.
    Ready(Vec<u8>),
    /// Parked: answer by `deadline`. The ask expires at `expires_at`
    /// (loop time), which is `expires_ts` (unix ms) on the wall clock.
    Park {
        deadline: Millis,
        expires_at: Millis,
        expires_ts: UnixMillis,
    },
}

impl Relay {
    /// `GET /asks/{sid}/{ask_id}` at `now` (`unix_ms` on the wall clock):
    /// the ask's state now, or `conn` parked until it changes or the
    /// timeout passes. 404 for the session or the ask; 503 at the
    /// session's waiter cap.
    pub fn get_ask(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        conn: ConnId,
        sid: &str,
        ask_id: &str,
        q: &PromptsQuery,
    ) -> Result<AskFetch, ApiError> {
        let (state, body) = self.store.ask_state(now, unix_ms, sid, ask_id)?;
        self.agent_seen(now, sid, true);
        if state != AskState::Open || !q.wait || q.timeout_ms == 0 {
            return Ok(AskFetch::Ready(body));
        }
        let expires_ts = self
            .store
            .get(sid)
            .and_then(|log| log.ask(ask_id, unix_ms))
            .map_or(unix_ms, |e| e.expires_ts);
        let key = self
            .store
            .key(sid)
            .ok_or_else(ApiError::session_not_found)?
            .clone();
        let here = self.presence.entry(key.clone()).or_default();
        if here.waiters.len() + here.asks().len() >= self.limits.max_waiters {
            if here.is_empty() {
                self.presence.remove(sid);
            }
            return Err(ApiError::unavailable(
                "waiter limit reached for this session",
            ));
        }
        super::presence::push_one(
            here.asks_mut(),
            super::presence::AskWaiter {
                conn,
                ask_id: Rc::from(ask_id),
            },
        );
        self.counts.parked_polls += 1;
        self.listen(&key);
        let expires_at = Millis(now.0.saturating_add(expires_ts.saturating_sub(unix_ms)));
        let deadline = Millis(now.0.saturating_add(q.timeout_ms)).min(expires_at);
        Ok(AskFetch::Park {
            deadline,
            expires_at,
            expires_ts,
        })
    }

    /// The answer of a parked `GET /asks` whose deadline passed, at
    /// `unix_ms`: its ask's state then (open at its own timeout, expired
    /// at the ask's), or 404 if the ask or its session went. An ask that
    /// history dropped while it was open is forgotten once it expires,
    /// but the polls parked until that expiry are still told it expired:
    /// that is what they waited for.
    pub fn ask_deadline(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        sid: &str,
        ask_id: &str,
    ) -> (u16, Rc<[u8]>) {
        match self.store.ask_state(now, unix_ms, sid, ask_id) {
            Ok((_, body)) => (200, Rc::from(body)),
            Err(e) => match self.store.get(sid).and_then(|l| l.kept_ask(ask_id)) {
                Some(ask) if ask.state(unix_ms) == AskState::Expired => {
                    (200, Rc::from(ask.state_body(ask_id, unix_ms)))
                }
                _ => (e.status, Rc::from(e.body())),
            },
        }
    }

    /// Forgets a parked `GET /asks` (answered, timed out, hung up).
    pub fn cancel_ask_wait(&mut self, conn: ConnId, sid: &str, now: Millis) {
        let Some(here) = self.presence.get_mut(sid) else {
            return;
        };
        if here.remove_ask_waiter(conn) {
            self.counts.parked_polls -= 1;
            let _ = self.store.existing(now, sid);
        }
        if here.is_empty() {
            self.presence.remove(sid);
        }
    }

    /// A reply to `ask_id` of `sid` is applied at `seq`: every poll parked
    /// on that ask here is answered with its state (answered, and the
    /// reply). When the reply itself pushed the ask out of history (an
    /// answered ask that history dropped is forgotten), the state is read
    /// from the reply: the agent waiting on the ask still gets it.
    pub(super) fn wake_ask_waiters(&mut self, sid: &str, ask_id: &str, seq: Seq) {
        let Some(here) = self.presence.get_mut(sid) else {
            return;
        };
        if !here.asks().iter().any(|w| &*w.ask_id == ask_id) {
            return;
        }
        let (now, unix_ms) = self.clock;
        let (status, body) = match self.store.ask_state(now, unix_ms, sid, ask_id) {
            Ok((_, body)) => (200, Rc::<[u8]>::from(body)),
            Err(e) => match self
                .store
                .get(sid)
                .and_then(|l| answered_by(l, seq, ask_id))
            {
                Some(body) => (200, Rc::from(body)),
                None => (e.status, Rc::from(e.body())),
            },
        };
        let mut woken = 0;
        here.asks_mut().retain(|w| {
            if &*w.ask_id != ask_id {
                return true;
            }
            self.effects.push(Effect::Respond {
                to: w.conn,
                status,
                body: body.clone(),
            });
            woken += 1;
            false
        });
        self.counts.parked_polls -= woken;
        if here.is_empty() {
            self.presence.remove(sid);
        }
        debug!(session_id = sid, woken = woken; "ask replied to");
    }
}

/// `{"ask_id","state":"answered","text"}` for the reply at `seq`, read
/// from the reply's stored `data`; `None` if history does not hold it.
fn answered_by(log: &SessionLog, seq: Seq, ask_id: &str) -> Option<Vec<u8>> {
    #[derive(serde::Deserialize)]
    struct Reply<'a> {
        #[serde(borrow)]
        text: &'a RawValue,
    }
    let msg = log.history().find(|m| m.seq == seq)?;
    let reply: Reply = serde_json::from_slice(msg.data()).ok()?;
    let text = reply.text.get();
    let mut out = String::with_capacity(48 + ask_id.len() + text.len());
    out.push_str("{\"ask_id\":");
    push_json_str(&mut out, ask_id);
    out.push_str(",\"state\":\"answered\",\"text\":");
    out.push_str(text);
    out.push('}');
    Some(out.into_bytes())
}
