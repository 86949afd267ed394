//! A session read whole ([`SessionImage`], plain data in `record.rs`,
//! since it crosses threads) made a log again: the one way
//! ([`SessionImage::into_log`]), which is also how every row is replayed
//! at a restore ([`replay_row`]): a session read back is the session a
//! restart would give.

use std::rc::Rc;

use super::log::SessionLog;
use super::message::{Kind, Message};
use super::record::SessionImage;
use super::types::Seq;
use crate::time::Millis;

impl SessionImage {
    /// The log again, active at `now`, for a store that keeps `limit`
    /// messages of history. Called on the loop (the log holds `Rc`s).
    pub fn into_log(self, now: Millis, limit: usize) -> SessionLog {
        let (next, last, dropped) = self.counters;
        let mut log = SessionLog::restored(now, &self.epoch, next, last, dropped);
        for r in &self.rows {
            replay_row(
                &mut log,
                r.seq,
                r.kind,
                &r.client_msg_id,
                r.assistant_msg_id.as_deref(),
                r.ts,
                r.data.as_deref(),
                limit,
            );
        }
        // Rows below history (an ask kept unanswered) may come before the
        // newest framed message, which set the counters.
        log.raise_counters(next, last, dropped);
        log
    }
}

/// Appends one stored message to `log` by the rules that stored it: a
/// restore replays every row through this, oldest first, and so does a
/// session read back ([`SessionImage::into_log`]). `data` is `None` for a
/// row read back damaged.
#[allow(clippy::too_many_arguments)]
pub fn replay_row(
    log: &mut SessionLog,
    seq: Seq,
    kind: Kind,
    cid: &str,
    aid: Option<&str>,
    ts: u64,
    data: Option<&[u8]>,
    limit: usize,
) {
    match kind {
        Kind::Ask | Kind::Reply => {
            let id: Rc<str> = Rc::from(cid);
            let msg = match data {
                Some(d) if kind == Kind::Ask => Message::ask_with(id, seq, ts, d),
                Some(d) => Message::reply_with(id, seq, ts, d),
                None => Message::damaged(kind, id, None, seq, ts),
            };
            if kind == Kind::Ask {
                log.append_ask(msg, limit);
            } else {
                log.append_reply(msg, limit);
            }
        }
        Kind::Prompt => {
            let msg = match data {
                Some(d) => Message::prompt_with(Rc::from(cid), seq, ts, d.to_vec()),
                None => Message::damaged(Kind::Prompt, Rc::from(cid), None, seq, ts),
            };
            log.append_prompt(msg, limit);
        }
        Kind::Cancel => {
            let cid = log.prompt_id(cid).unwrap_or_else(|| Rc::from(cid));
            let msg = match data {
                Some(d) => Message::cancel_with(cid, seq, ts, d),
                None => Message::damaged(Kind::Cancel, cid, None, seq, ts),
            };
            log.append_cancel(msg, limit);
        }
        Kind::Assistant => {
            let aid: Rc<str> = Rc::from(aid.unwrap_or(""));
            let cid = log.prompt_id(cid).unwrap_or_else(|| Rc::from(cid));
            let msg = match data {
                Some(d) => Message::assistant_with(cid, aid, seq, ts, d),
                None => Message::damaged(Kind::Assistant, cid, Some(aid), seq, ts),
            };
            log.append_response(msg, limit);
        }
    }
}
