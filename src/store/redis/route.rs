//! Replies routed to what waits for them. The command link answers in the
//! order it was asked ([`Expect`], one per command sent): each reply is
//! matched to its requester's ticket, read as a write's answer, a
//! session's snapshot, the probe's or the set-up's; the events link brings
//! subscription confirmations, the `PONG`s of read barriers and published
//! changes. What comes out is an [`Answered`] per requester, or an
//! [`Event`], for `copy.rs` to read against the copy.
//!
//! Invariants: each entry of `expect` is taken once, by its reply or by
//! the link's loss, so a requester is answered once (by its reply, `503`
//! when Redis refuses it, `503` or `504` when the link is lost); a reply
//! nobody asked for, a frame that is not RESP, or replies buffered past
//! [`MAX_INPUT`] without a whole frame drop the link.

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;

use super::RedisStore;
use super::calls::Write;
use super::link::Link;
use super::reply::{Event, Snapshot, bytes_of, parse_event, parse_snapshot};
use crate::error::ApiError;
use crate::store::record::Outcome;
use crate::store::seam::StoreEvent;
use crate::store::types::{SessionId, Ticket};

/// Bytes of replies buffered without a whole frame before the link is
/// dropped: a reply carries at most one session, and a session at most
/// `history_limit + max_pending` messages of at most the body cap each, so
/// this only stops a peer that is not Redis.
const MAX_INPUT: usize = 1 << 30;

/// What to do for the requester once the copy is up to date.
#[derive(Debug)]
pub enum Then {
    Reply(Result<Outcome, ApiError>),
    /// Run the request again (a read that waited for its session, or a
    /// WebSocket connect whose session was created).
    Retry,
    /// A read's `PING` came back: the relay runs it again if the copy of
    /// the session still follows its channel, else reads the session.
    Barrier(SessionId),
    /// A read the relay asked for on its own came back (or failed).
    Resynced(SessionId),
}

/// One reply, for the relay.
#[derive(Debug)]
pub struct Answered {
    pub conn: Option<Ticket>,
    pub snapshot: Option<Snapshot>,
    pub then: Then,
    /// A new answer: another instance has subscribers of its session.
    pub delivered: bool,
}

/// A reply the command link waits for, in order.
#[derive(Debug)]
pub(super) enum Expect {
    /// `AUTH`, `SELECT`, `SCRIPT LOAD`.
    Setup,
    /// `FUNCTION LOAD`: once answered, calls go by `FCALL`.
    Library,
    /// The `prompts` call of one turn: one answer per prompt, in order.
    Prompts(Vec<(Ticket, SessionId, String)>),
    Write {
        conn: Ticket,
        sid: SessionId,
        write: Write,
    },
    Sync {
        conn: Option<Ticket>,
        sid: SessionId,
    },
    /// The sweep's calls: nobody waits.
    Quiet,
    /// The health probe (see `health.rs`) of one bucket (0 without
    /// buckets).
    Probe(usize),
    /// An all-sessions read (`every.rs`).
    Every(Ticket),
    /// One bucket's part of a cluster's all-sessions read (`every.rs`):
    /// the read's id, and the bucket.
    EveryPart(u64, usize),
    /// `ROLE`, on a master named by a sentinel: it must still be one.
    Role,
    /// `WAIT`: how many replicas hold the writes sent before it.
    Wait,
    /// `HGETALL` of the agents of every session.
    Agents,
}

impl RedisStore {
    /// Bytes read from `link`: every whole reply is handled. An error (the
    /// peer refused the link's setup, or broke the protocol) says why the
    /// caller drops the link; the caller logs it.
    #[inline(never)]
    pub fn input(&mut self, link: Link, bytes: &[u8]) -> Result<(), String> {
        let side = self.side(link);
        side.input.extend_from_slice(bytes);
        if side.input.len() > MAX_INPUT {
            return Err("reply too large".into());
        }
        let mut at = 0;
        loop {
            let side = self.side(link);
            let (frame, used) = match decode(&side.input[at..]) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return Err(format!("bad reply: {e:?}")),
            };
            at += used;
            match link {
                Link::Command => self.on_reply(frame)?,
                Link::Events => self.on_event(frame)?,
            }
        }
        self.side(link).input.drain(..at);
        Ok(())
    }

    #[inline(never)]
    fn on_reply(&mut self, frame: OwnedFrame) -> Result<(), String> {
        let Some(expect) = self.expect.pop_front() else {
            return Err("a reply nobody asked for".into());
        };
        if let Expect::Wait = expect {
            self.waiting = false;
            let confirmed =
                matches!(frame, OwnedFrame::Integer(n) if n >= i64::from(self.replicas));
            self.unhold(confirmed);
            self.release_pages(confirmed);
            return Ok(());
        }
        if (self.waiting || self.unwaited)
            && self.hold.is_none()
            && matches!(expect, Expect::Write { .. } | Expect::Prompts(_))
        {
            // Held, with every reply behind it, until the `WAIT` after it.
            self.hold = Some(self.answered.len());
        }
        if let Expect::Library = expect {
            // Loaded, or loaded before by a relay of this version; any
            // other error (no FUNCTION: Redis 6.2) keeps EVALSHA.
            self.fcall = match &frame {
                OwnedFrame::Error(e) => e.contains("already exists"),
                _ => true,
            };
            return Ok(());
        }
        if let OwnedFrame::Error(e) = &frame {
            self.stats.errors += 1;
            if e.starts_with("RELAYLOST") && !matches!(expect, Expect::Setup | Expect::Role) {
                // The router lost the connection to the call's master:
                // answered as if the command link were lost.
                self.relay_lost(expect);
                return Ok(());
            }
            self.reload(e);
            if matches!(expect, Expect::Setup | Expect::Role) {
                return Err(format!("Redis refused the connection's setup: {e}"));
            }
            self.health.refused(self.unix_ms, e);
            if let Expect::Probe(b) = expect {
                self.health.probed(self.unix_ms, b, None);
            }
            self.refused(&expect);
            self.fail(expect, ApiError::storage_unavailable());
            if e.contains("READONLY") {
                // A replica now (demoted by a failover): the link goes,
                // and with a sentinel the master is asked for again.
                return Err(format!("Redis is a replica: {e}"));
            }
            return Ok(());
        }
        match expect {
            Expect::Prompts(waiting) => {
                let OwnedFrame::Array(answers) = frame else {
                    self.fail(Expect::Prompts(waiting), ApiError::storage_unavailable());
                    return Err("the script answered something else than an array".into());
                };
                if answers.len() != waiting.len() {
                    self.fail(Expect::Prompts(waiting), ApiError::storage_unavailable());
                    return Err("the script answered another number of prompts".into());
                }
                let mut broken = Ok(());
                for ((conn, sid, id), answer) in waiting.into_iter().zip(answers) {
                    let write = Write::Prompt { id };
                    if let Err(e) = self.written(conn, sid, write, answer) {
                        broken = Err(e);
                    }
                }
                return broken;
            }
            Expect::Setup => {
                if let OwnedFrame::BulkString(sha) = &frame {
                    if sha.as_slice() != self.sha.as_bytes() {
                        return Err("SCRIPT LOAD answered another SHA-1".into());
                    }
                    self.cmd.ready = true;
                    self.set_up();
                }
            }
            Expect::Quiet | Expect::Library | Expect::Wait => {}
            Expect::Role => {
                let role = match &frame {
                    OwnedFrame::Array(parts) => parts.first().map_or(&b""[..], bytes_of),
                    _ => b"",
                };
                if role != b"master" {
                    let role = String::from_utf8_lossy(role);
                    return Err(format!(
                        "the sentinel's master is not a master (ROLE: {role})"
                    ));
                }
            }
            Expect::Probe(b) => {
                let generation = match &frame {
                    OwnedFrame::Array(parts) => parts.get(1).map_or(&b""[..], bytes_of),
                    _ => b"",
                };
                if generation.is_empty() {
                    return Err("the probe answered something else".into());
                }
                self.health.probed(self.unix_ms, b, Some(generation));
            }
            Expect::Sync { conn, sid } => {
                let bucket = self.bucket(&sid);
                let parsed = parse_snapshot(sid.clone(), frame, bucket, &mut self.health);
                let snapshot = match parsed {
                    Ok(s) => s,
                    Err(e) => {
                        self.fail(Expect::Sync { conn, sid }, ApiError::storage_unavailable());
                        return Err(e);
                    }
                };
                let then = match conn {
                    Some(_) => Then::Retry,
                    None => Then::Resynced(sid),
                };
                self.answered.push_back(Answered {
                    conn,
                    snapshot: Some(snapshot.1),
                    then,
                    delivered: false,
                });
            }
            Expect::Write { conn, sid, write } => return self.written(conn, sid, write, frame),
            Expect::Every(to) => return self.every_read(to, frame),
            Expect::EveryPart(id, b) => return self.every_part(id, b, frame),
            Expect::Agents => self.every_agents(frame),
        }
        Ok(())
    }

    #[inline(never)]
    fn on_event(&mut self, frame: OwnedFrame) -> Result<(), String> {
        let parts = match frame {
            OwnedFrame::Array(parts) => parts,
            OwnedFrame::Error(e) => {
                return Err(format!("Redis refused the connection's setup: {e}"));
            }
            _ => return Ok(()), // AUTH, SELECT
        };
        let kind = parts.first().map(bytes_of);
        match kind {
            // Sharded pub/sub (a cluster) says the same with an `s`.
            Some(b"subscribe" | b"ssubscribe") => {
                let channel = parts.get(1).map_or(&b""[..], bytes_of);
                if channel == self.channel.as_bytes() {
                    self.ev.ready = true;
                    self.set_up();
                } else if let Some(b) = self.arrivals_bucket(channel) {
                    self.arrivals_listened(b);
                } else if let Some(sid) = self.sid_of_channel(channel)
                    && let Some(f) = self.follow.get_mut(&sid)
                    && f.listen.is_some()
                {
                    f.listen = Some(true);
                    self.events.push_back(Event::Listening { sid });
                }
            }
            Some(b"pong") => {
                for (conn, sid) in self.pings.pop_front().unwrap_or_default() {
                    self.answered.push_back(Answered {
                        conn: Some(conn),
                        snapshot: None,
                        then: Then::Barrier(sid),
                        delivered: false,
                    });
                }
            }
            Some(b"message" | b"smessage") => {
                let channel = parts.get(1).map_or(&b""[..], bytes_of);
                let payload = parts.get(2).map_or(&b""[..], bytes_of);
                if self.every_message(channel, payload) {
                    return Ok(());
                }
                if let Some(e) = parse_event(payload) {
                    self.events.push_back(e);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Redis refused the write `expect` waited for: the copies of its
    /// sessions are read again (see [`Event::Refused`]), unless such a
    /// read is on its way already.
    fn refused(&mut self, expect: &Expect) {
        match expect {
            Expect::Write { sid, .. } => self.reread(sid),
            Expect::Prompts(waiting) => {
                for (i, (_, sid, _)) in waiting.iter().enumerate() {
                    if waiting[..i].iter().all(|(_, s, _)| s != sid) {
                        self.reread(sid);
                    }
                }
            }
            _ => {}
        }
    }

    fn reread(&mut self, sid: &SessionId) {
        if !self.resyncing(sid) {
            self.events.push_back(Event::Refused { sid: sid.clone() });
        }
    }

    /// What a request sent on a connection that was lost becomes (the
    /// command link, or in a cluster the connection to the master its
    /// call went to): a write Redis may have run is `504`, "may be
    /// stored" (a resend with the same id tells), anything else `503`.
    /// A read the relay asked for on its own is handed back: it stays
    /// owed, since its copy may lack changes it was to bring.
    pub(super) fn answer_lost(&mut self, e: Expect, uncertain: &ApiError) -> Option<SessionId> {
        match e {
            Expect::Sync { conn: None, sid } => Some(sid),
            Expect::Prompts(_) | Expect::Write { .. } => {
                self.fail(e, uncertain.clone());
                None
            }
            Expect::Probe(b) => {
                self.health.probed(self.unix_ms, b, None);
                None
            }
            _ => {
                self.fail(e, ApiError::storage_unavailable());
                None
            }
        }
    }

    /// A call answered `RELAYLOST`: the router lost the connection it
    /// went on, and the command link stays. Answered as a lost link
    /// answers it; the sessions of a write are read again (it may have
    /// been stored), and a read the relay asked for on its own is sent
    /// again now.
    fn relay_lost(&mut self, e: Expect) {
        self.refused(&e);
        let agents = matches!(e, Expect::Agents);
        let uncertain = ApiError::storage_uncertain("the connection to Redis was lost");
        if let Some(sid) = self.answer_lost(e, &uncertain) {
            let expect = Expect::Sync {
                conn: None,
                sid: sid.clone(),
            };
            self.call(&sid, super::Op::Sync, super::Known::default(), &[], expect);
        }
        if agents {
            // The agents of every session, read again.
            self.every_linked_agents();
        }
    }

    /// A request that cannot be answered by Redis: `503`.
    #[inline(never)]
    pub(super) fn fail(&mut self, expect: Expect, e: ApiError) {
        match expect {
            Expect::Prompts(waiting) => {
                for (conn, ..) in waiting {
                    self.answered.push_back(Answered {
                        conn: Some(conn),
                        snapshot: None,
                        then: Then::Reply(Err(e.clone())),
                        delivered: false,
                    });
                }
            }
            Expect::Sync { conn: None, sid } => self.answered.push_back(Answered {
                conn: None,
                snapshot: None,
                then: Then::Resynced(sid),
                delivered: false,
            }),
            Expect::Every(to) => self
                .ready
                .push_back(StoreEvent::EveryPage { to, result: Err(e) }),
            Expect::EveryPart(id, _) => self.every_part_failed(id),
            Expect::Write { conn, .. }
            | Expect::Sync {
                conn: Some(conn), ..
            } => self.answered.push_back(Answered {
                conn: Some(conn),
                snapshot: None,
                then: Then::Reply(Err(e)),
                delivered: false,
            }),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::{Known, Link};
    use crate::store::types::ConnId;

    fn store(url: &str) -> RedisStore {
        RedisStore::for_test(url, 10)
    }

    fn ticket(n: u64) -> Ticket {
        let conn = ConnId {
            key: 1,
            generation: 1,
        };
        Ticket { conn, n }
    }

    const LOST: &[u8] = b"-RELAYLOST the connection to 127.0.0.1:7001 was lost\r\n";

    #[test]
    fn a_call_whose_master_was_lost_is_answered_as_a_lost_link_answers_it() {
        let mut r = store("redis-cluster://127.0.0.1:7000");
        let sid = SessionId::new("s").unwrap();
        r.expect.push_back(Expect::Write {
            conn: ticket(1),
            sid: sid.clone(),
            write: Write::Delete,
        });
        r.sync(Some(ticket(2)), &sid, Known::default());
        let own = SessionId::new("own").unwrap();
        r.listen(&own);
        r.sync(None, &own, Known::default());
        r.cmd.out.clear();
        for _ in 0..3 {
            r.input(Link::Command, LOST).unwrap();
        }
        let status = |a: &Answered| match &a.then {
            Then::Reply(Err(e)) => e.status,
            _ => 0,
        };
        // A write Redis may have run: 504, and its session read again.
        assert_eq!(status(&r.answered[0]), 504);
        assert!(matches!(r.events.pop_front(), Some(Event::Refused { .. })));
        // A read: 503.
        assert_eq!(status(&r.answered[1]), 503);
        assert_eq!(r.answered.len(), 2);
        // The relay's own read stays owed: sent again at once.
        assert!(matches!(
            r.expect.pop_front(),
            Some(Expect::Sync { conn: None, .. })
        ));
        assert!(r.expect.is_empty());
        let out = String::from_utf8_lossy(&r.cmd.out);
        assert!(out.contains("sync") && out.contains("t:{"), "{out}");
        assert!(r.resyncing(&own), "not followed until it is answered");
    }

    #[test]
    fn a_lost_link_and_a_lost_master_answer_alike() {
        let uncertain = ApiError::storage_uncertain("lost");
        let mut r = store("redis://127.0.0.1:6379");
        let sid = SessionId::new("s").unwrap();
        let write = Expect::Write {
            conn: ticket(1),
            sid: sid.clone(),
            write: Write::Delete,
        };
        assert_eq!(r.answer_lost(write, &uncertain), None);
        let prompts = Expect::Prompts(vec![(ticket(2), sid.clone(), "c".into())]);
        assert_eq!(r.answer_lost(prompts, &uncertain), None);
        let read = Expect::Sync {
            conn: Some(ticket(3)),
            sid: sid.clone(),
        };
        assert_eq!(r.answer_lost(read, &uncertain), None);
        let own = Expect::Sync {
            conn: None,
            sid: sid.clone(),
        };
        assert_eq!(r.answer_lost(own, &uncertain), Some(sid));
        let statuses: Vec<u16> = (r.answered.iter())
            .map(|a| match &a.then {
                Then::Reply(Err(e)) => e.status,
                _ => 0,
            })
            .collect();
        assert_eq!(statuses, [504, 504, 503]);
    }
}
