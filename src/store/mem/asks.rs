//! The rules of asks and replies (`POST /ask`, `POST /reply`), decided
//! like every write: against the log, changing nothing, into an outcome
//! and the records that carry it out; and how those records change the
//! log. What the log knows of asks is `store/asks.rs`; the same rules in
//! Lua are `relay.lua`'s `ask` and `reply`.
//!
//! Time is the decision's `unix_ms`: an ask expires `timeout` after it is
//! stored, and a reply or a read is checked against the clock of the
//! request that makes it.

use std::rc::Rc;

use super::{Applied, MemStore, id_and_literal};
use crate::error::ApiError;
use crate::store::asks::{AskParts, AskState, reply_data};
use crate::store::message::Message;
use crate::store::model::{NewAsk, NewReply};
use crate::store::record::{Outcome, Record};
use crate::time::{Millis, UnixMillis};
use crate::wire::decode;

impl MemStore {
    /// `POST /ask`, decided: 404 for the session (an ask creates none),
    /// the same `ask_id` with the same text and choices answered as a
    /// duplicate and with others refused 409, 404 for a `client_msg_id`
    /// the log does not know, 503 once the pending prompts and open asks
    /// reach the cap, else the next `seq`, open until `unix_ms + timeout`.
    pub fn ask(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        a: NewAsk,
        out: &mut Vec<Record>,
    ) -> Result<Outcome, ApiError> {
        let max_pending = self.limits.max_pending;
        let (id, id_literal) = id_and_literal(a.ask_id, &mut self.ids);
        let s = self.existing(now, &a.session_id)?;
        if let Some(e) = s.ask(&id, unix_ms) {
            let same_choices = match (&e.choices, &a.choices) {
                (None, None) => true,
                (Some(x), Some(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| x == y),
                _ => false,
            };
            if e.text != decode(&a.text) || !same_choices {
                return Err(ApiError::ask_conflict());
            }
            return Ok(Outcome::Ask {
                sid: a.session_id,
                id,
                seq: e.seq,
                expires_ts: e.expires_ts,
                duplicate: true,
            });
        }
        if let Some(cid) = &a.client_msg_id
            && !s.has_prompt(cid)
        {
            return Err(ApiError::prompt_not_found());
        }
        if s.pending_with_asks(unix_ms) >= max_pending {
            return Err(ApiError::unavailable(
                "pending limit reached for this session (prompts and asks)",
            ));
        }
        let seq = s.next_seq();
        let expires_ts = unix_ms.saturating_add(a.timeout_ms);
        let data = AskParts {
            session_id: &a.session_id,
            id_literal: &id_literal,
            client_msg_id: a.client_msg_id.as_deref(),
            text: &a.text,
            choices: a.choices.as_deref(),
            default: a.default.as_deref(),
            expires_ts,
            metadata: a.metadata.as_deref(),
            ts: unix_ms,
            seq,
        }
        .data();
        out.push(Record::Ask {
            sid: a.session_id.clone(),
            seq,
            ts: unix_ms,
            ask_id: id.clone(),
            data,
        });
        Ok(Outcome::Ask {
            sid: a.session_id,
            id,
            seq,
            expires_ts,
            duplicate: false,
        })
    }

    /// `POST /reply`, decided: 404 for the session and for the ask, then
    /// in this order: answered already (the same text is a duplicate,
    /// another 409), expired (409), not one of its choices byte for byte
    /// (400); else the next `seq`.
    pub fn reply(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        r: NewReply,
        out: &mut Vec<Record>,
    ) -> Result<Outcome, ApiError> {
        let s = self.existing(now, &r.session_id)?;
        let e = s
            .ask(&r.ask_id, unix_ms)
            .ok_or_else(ApiError::ask_not_found)?;
        match e.state(unix_ms) {
            AskState::Answered if e.same_reply(&r.text) => {
                return Ok(Outcome::Reply {
                    sid: r.session_id,
                    ask_id: r.ask_id.into_owned(),
                    seq: e.reply.as_ref().map_or(e.seq, |(seq, _)| *seq),
                    duplicate: true,
                });
            }
            AskState::Answered => return Err(ApiError::ask_answered()),
            AskState::Expired => return Err(ApiError::ask_expired()),
            AskState::Open => {}
        }
        if let Some(choices) = &e.choices
            && !choices.iter().any(|c| *c == decode(&r.text))
        {
            return Err(ApiError::invalid_reply());
        }
        let seq = s.next_seq();
        let data = reply_data(&r.session_id, &r.ask_id, &r.text, unix_ms, seq);
        out.push(Record::Reply {
            sid: r.session_id.clone(),
            seq,
            ts: unix_ms,
            ask_id: r.ask_id.clone().into_owned(),
            data,
        });
        Ok(Outcome::Reply {
            sid: r.session_id,
            ask_id: r.ask_id.into_owned(),
            seq,
            duplicate: false,
        })
    }

    /// `GET /asks/{sid}/{ask_id}` at `unix_ms`: its state, and the
    /// answer's body.
    pub fn ask_state(
        &mut self,
        now: Millis,
        unix_ms: UnixMillis,
        sid: &str,
        ask_id: &str,
    ) -> Result<(AskState, Vec<u8>), ApiError> {
        let s = self.existing(now, sid)?;
        let e = s.ask(ask_id, unix_ms).ok_or_else(ApiError::ask_not_found)?;
        Ok((e.state(unix_ms), e.state_body(ask_id, unix_ms)))
    }

    /// Applies a committed ask or reply (see [`MemStore::apply`]).
    pub(super) fn apply_asked(&mut self, now: Millis, record: Record) -> Applied {
        let limit = self.limits.history_limit;
        match record {
            Record::Ask {
                sid,
                seq,
                ts,
                ask_id,
                data,
            } => {
                let Some(log) = self.sessions.get_mut(&*sid) else {
                    return Applied::Nothing;
                };
                log.last_active = now;
                let msg = Message::ask_with(Rc::from(ask_id), seq, ts, data.as_bytes());
                let frame = msg.frame().cloned().unwrap_or_else(|| Rc::from(&[][..]));
                let (prev, forgotten) = log.append_ask(msg, limit);
                Applied::Ask {
                    sid,
                    seq,
                    prev,
                    frame,
                    forgotten,
                }
            }
            Record::Reply {
                sid,
                seq,
                ts,
                ask_id,
                data,
            } => {
                let Some(log) = self.sessions.get_mut(&*sid) else {
                    return Applied::Nothing;
                };
                log.last_active = now;
                let ask_id: Rc<str> = Rc::from(ask_id);
                let msg = Message::reply_with(ask_id.clone(), seq, ts, data.as_bytes());
                let frame = msg.frame().cloned().unwrap_or_else(|| Rc::from(&[][..]));
                let (prev, forgotten) = log.append_reply(msg, limit);
                Applied::Reply {
                    sid,
                    seq,
                    prev,
                    frame,
                    ask_id,
                    forgotten,
                }
            }
            _ => Applied::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::StoreLimits;
    use crate::store::model::{NewPrompt, Write};
    use crate::store::types::{Seq, SessionId};

    fn store(history_limit: usize) -> MemStore {
        MemStore::new(StoreLimits {
            history_limit,
            max_sessions: 4,
            max_pending: if history_limit < 10 { 10 } else { 3 },
            draft_timeout_ms: 60_000,
        })
    }

    /// Decides a write at `unix_ms` and applies its records.
    fn run(m: &mut MemStore, unix_ms: u64, body: &str) -> Result<Outcome, ApiError> {
        let w = if body.contains("\"prompt\"") {
            Write::Prompt(NewPrompt::parse(body.as_bytes())?)
        } else if body.contains("\"ask_id\"")
            && !body.contains("\"choices\"")
            && body.contains("reply")
        {
            Write::Reply(NewReply::parse(body.as_bytes())?)
        } else {
            Write::Ask(NewAsk::parse(body.as_bytes())?)
        };
        let mut out = Vec::new();
        let outcome = m.decide(Millis(0), unix_ms, w, &mut out)?;
        for r in out {
            m.apply(Millis(0), r);
        }
        Ok(outcome)
    }

    fn created(history_limit: usize) -> MemStore {
        let mut m = store(history_limit);
        let mut out = Vec::new();
        let sid = SessionId::new("s").unwrap();
        m.create(Millis(0), &sid, true, &mut out).unwrap();
        for r in out {
            m.apply(Millis(0), r);
        }
        m
    }

    const ASK: &str = r#"{"session_id":"s","ask_id":"k","text":"Deploy?","choices":["yes","no"],"default":"no","timeout":10}"#;

    fn reply(text: &str) -> String {
        format!(r#"{{"session_id":"s","ask_id":"k","text":"{text}","reply":1}}"#)
    }

    #[test]
    fn an_ask_is_stored_deduped_and_replied_to_once() {
        let mut m = created(10);
        let first = run(&mut m, 1000, ASK).unwrap();
        assert!(matches!(
            first,
            Outcome::Ask {
                seq: Seq(1),
                expires_ts: 11_000,
                duplicate: false,
                ..
            }
        ));
        let again = run(&mut m, 2000, ASK).unwrap();
        assert!(matches!(
            again,
            Outcome::Ask {
                seq: Seq(1),
                expires_ts: 11_000,
                duplicate: true,
                ..
            }
        ));
        let other = ASK.replace("Deploy?", "Delete?");
        assert_eq!(
            run(&mut m, 2000, &other).unwrap_err(),
            ApiError::ask_conflict()
        );
        let fewer = ASK
            .replace(r#"["yes","no"]"#, r#"["yes"]"#)
            .replace(r#","default":"no""#, "");
        assert_eq!(
            run(&mut m, 2000, &fewer).unwrap_err(),
            ApiError::ask_conflict()
        );
        assert_eq!(
            run(&mut m, 2000, &reply("maybe")).unwrap_err(),
            ApiError::invalid_reply()
        );
        let ok = run(&mut m, 3000, &reply("yes")).unwrap();
        assert!(matches!(
            ok,
            Outcome::Reply {
                seq: Seq(2),
                duplicate: false,
                ..
            }
        ));
        let dup = run(&mut m, 3000, &reply("yes")).unwrap();
        assert!(matches!(
            dup,
            Outcome::Reply {
                seq: Seq(2),
                duplicate: true,
                ..
            }
        ));
        assert_eq!(
            run(&mut m, 3000, &reply("no")).unwrap_err(),
            ApiError::ask_answered()
        );
        // Answered comes before expired.
        assert_eq!(
            run(&mut m, 99_000, &reply("no")).unwrap_err(),
            ApiError::ask_answered()
        );
        let (state, body) = m.ask_state(Millis(0), 99_000, "s", "k").unwrap();
        assert_eq!(state, AskState::Answered);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"ask_id": "k", "state": "answered", "text": "yes"})
        );
    }

    #[test]
    fn an_ask_expires_at_its_expires_ts_and_then_answers_its_default() {
        let mut m = created(10);
        run(&mut m, 1000, ASK).unwrap();
        let (state, _) = m.ask_state(Millis(0), 10_999, "s", "k").unwrap();
        assert_eq!(state, AskState::Open);
        assert_eq!(
            run(&mut m, 11_000, &reply("yes")).unwrap_err(),
            ApiError::ask_expired()
        );
        let (state, body) = m.ask_state(Millis(0), 11_000, "s", "k").unwrap();
        assert_eq!(state, AskState::Expired);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["text"], "no");
        assert_eq!(
            m.ask_state(Millis(0), 1, "s", "x").unwrap_err(),
            ApiError::ask_not_found()
        );
    }

    #[test]
    fn open_asks_and_pending_prompts_share_the_cap() {
        let mut m = created(10);
        run(
            &mut m,
            1000,
            r#"{"session_id":"s","prompt":"p","client_msg_id":"c"}"#,
        )
        .unwrap();
        run(&mut m, 1000, ASK).unwrap();
        let ask2 = ASK.replace("\"k\"", "\"k2\"");
        run(&mut m, 1000, &ask2).unwrap();
        let ask3 = ASK.replace("\"k\"", "\"k3\"");
        assert_eq!(run(&mut m, 1000, &ask3).unwrap_err().status, 503);
        let p = r#"{"session_id":"s","prompt":"p","client_msg_id":"c2"}"#;
        assert_eq!(run(&mut m, 1000, p).unwrap_err().status, 503);
        // Once the asks expire, they count no more.
        assert!(run(&mut m, 11_000, p).is_ok());
        let about = ASK
            .replace("\"k\"", "\"k4\"")
            .replace(r#""timeout":10"#, r#""client_msg_id":"nope""#);
        assert_eq!(
            run(&mut m, 11_000, &about).unwrap_err(),
            ApiError::prompt_not_found()
        );
        let nowhere = ASK.replace("\"s\"", "\"t\"");
        assert_eq!(
            run(&mut m, 1, &nowhere).unwrap_err(),
            ApiError::session_not_found()
        );
    }

    #[test]
    fn asks_history_dropped_are_forgotten_once_closed() {
        let mut m = created(2);
        run(&mut m, 1000, ASK).unwrap();
        for n in 0..2 {
            let p = format!(r#"{{"session_id":"s","prompt":"p","client_msg_id":"c{n}"}}"#);
            run(&mut m, 1000, &p).unwrap();
        }
        // Out of history but open: still known, and its reply is taken.
        assert!(run(&mut m, 2000, &reply("yes")).is_ok());
        assert_eq!(
            run(&mut m, 2000, &reply("yes")).unwrap_err(),
            ApiError::ask_not_found()
        );
        // Out of history and expired: forgotten.
        let ask2 = ASK.replace("\"k\"", "\"k2\"");
        run(&mut m, 3000, &ask2).unwrap();
        for n in 2..4 {
            let p = format!(r#"{{"session_id":"s","prompt":"p","client_msg_id":"c{n}"}}"#);
            run(&mut m, 3000, &p).unwrap();
        }
        assert!(m.ask_state(Millis(0), 12_999, "s", "k2").is_ok());
        assert_eq!(
            m.ask_state(Millis(0), 13_000, "s", "k2").unwrap_err(),
            ApiError::ask_not_found()
        );
    }
}
