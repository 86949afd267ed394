//! Script calls written into the command link's pipeline: any call's
//! command (`FCALL` of the library's function or `EVALSHA` of the
//! script's SHA-1, the session's keys, the arguments every call carries,
//! then its own), with the reply it expects queued behind it; and the
//! prompts of one loop turn gathered into one `prompts` call. Each
//! operation's own arguments, and the reading of its answer, are
//! `calls.rs`.
//!
//! Invariants: calls reach Redis in the order they were asked for (any
//! other call first sends the prompts gathered before it); a call asked
//! for while the command link is down is answered `503` at once; one call
//! carries at most [`MAX_BATCH`] prompts.

use super::calls::{Op, Write};
use super::codec::{Common, push_array, push_bulk, push_common, push_number};
use super::route::Expect;
use super::{Known, RedisStore};
use crate::error::ApiError;
use crate::store::types::{SessionId, Ticket};

/// A prompt gathered for the turn's call.
#[derive(Debug)]
pub(super) struct Gathered {
    pub(super) conn: Ticket,
    pub(super) sid: SessionId,
    pub(super) id: String,
    /// The record the script stores (see `record` in `calls.rs`).
    pub(super) record: String,
    pub(super) known_epoch: String,
    pub(super) known_next: u64,
}

/// Prompts one script call carries at most: Redis runs nothing else
/// while it stores them.
pub(super) const MAX_BATCH: usize = 64;

impl RedisStore {
    /// One script call: the session's keys, the common arguments, then
    /// `extra`. Without a connection the requester is answered `503` now.
    /// Written straight into the link's buffer: a prompt's call is about
    /// twenty arguments, and a turn may hold thousands of calls.
    #[inline(never)]
    pub(super) fn call(
        &mut self,
        sid: &str,
        op: Op,
        known: Known,
        extra: &[&[u8]],
        expect: Expect,
    ) {
        if !self.cmd.up {
            self.fail(expect, ApiError::storage_unavailable());
            return;
        }
        // Calls run in the order they were asked for.
        self.send_batch();
        let epoch = if op.creates() {
            self.ids.uuid()
        } else {
            String::new()
        };
        let (p, sid) = (self.prefix.as_bytes(), sid.as_bytes());
        let out = &mut self.cmd.out;
        push_array(out, 17 + extra.len());
        if self.fcall {
            push_bulk(out, &[b"FCALL"]);
            push_bulk(out, &[self.functions.of(op).as_bytes()]);
        } else {
            push_bulk(out, &[b"EVALSHA"]);
            push_bulk(out, &[self.sha.as_bytes()]);
        }
        push_bulk(out, &[b"3"]);
        push_bulk(out, &[p, b"s:", sid]);
        push_bulk(out, &[self.sessions_key.as_bytes()]);
        push_bulk(out, &[p, b"w:", sid]);
        let common = Common {
            unix_ms: self.unix_ms,
            limits: &self.limits,
            prefix: p,
            op: op.name().as_bytes(),
            sid,
            known,
            epoch: epoch.as_bytes(),
            channel: &[p, b"e:", sid],
        };
        push_common(out, common);
        for a in extra {
            push_bulk(out, &[a]);
        }
        self.stats.commands += 1;
        if self.replicas > 0 && matches!(expect, Expect::Write { .. }) {
            self.unwaited = true;
        }
        self.expect.push_back(expect);
    }

    /// The gathered prompts: one `prompt` call, or one `prompts` call for
    /// several.
    #[inline(never)]
    pub(super) fn send_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        if batch.len() <= 1 {
            if let Some(g) = batch.pop() {
                let extra: [&[u8]; 2] = [g.id.as_bytes(), g.record.as_bytes()];
                let known = Known {
                    epoch: &g.known_epoch,
                    next: g.known_next,
                };
                let expect = Expect::Write {
                    conn: g.conn,
                    sid: g.sid.clone(),
                    write: Write::Prompt { id: g.id.clone() },
                };
                self.call(&g.sid, Op::Prompt, known, &extra, expect);
            }
            return;
        }
        let n = batch.len();
        let p = self.prefix.as_bytes();
        let out = &mut self.cmd.out;
        push_array(out, 17 + n * 7);
        if self.fcall {
            push_bulk(out, &[b"FCALL"]);
            push_bulk(out, &[self.functions.of(Op::Prompts).as_bytes()]);
        } else {
            push_bulk(out, &[b"EVALSHA"]);
            push_bulk(out, &[self.sha.as_bytes()]);
        }
        push_number(out, 3 + n as u64);
        push_bulk(out, &[]);
        push_bulk(out, &[self.sessions_key.as_bytes()]);
        push_bulk(out, &[]);
        for g in &batch {
            push_bulk(out, &[p, b"s:", g.sid.as_bytes()]);
        }
        // Each prompt brings its own session, cursor and epoch (below).
        let common = Common {
            unix_ms: self.unix_ms,
            limits: &self.limits,
            prefix: p,
            op: Op::Prompts.name().as_bytes(),
            sid: b"",
            known: Known::default(),
            epoch: b"",
            channel: &[],
        };
        push_common(out, common);
        for g in &batch {
            let epoch = self.ids.uuid();
            push_bulk(out, &[g.sid.as_bytes()]);
            push_bulk(out, &[g.known_epoch.as_bytes()]);
            push_number(out, g.known_next);
            push_bulk(out, &[epoch.as_bytes()]);
            push_bulk(out, &[g.id.as_bytes()]);
            push_bulk(out, &[g.record.as_bytes()]);
        }
        self.stats.commands += 1;
        self.unwaited |= self.replicas > 0;
        let waiting = batch.drain(..).map(|g| (g.conn, g.sid, g.id)).collect();
        self.expect.push_back(Expect::Prompts(waiting));
    }
}
