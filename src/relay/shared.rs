//! The relay with sessions shared through Redis: writes are decided by the
//! script in Redis; every reply brings this instance's copy of the session
//! up to date, and so does every change published by any instance, on the
//! path every engine's changes take (the log, then the parked polls and
//! subscribers here). A read first asks Redis what the copy lacks (one
//! round trip), then runs on the copy: what any instance acknowledged
//! before the read began is in its answer.
//!
//! The copy holds the sessions this instance serves: the sweep forgets the
//! ones nobody here waits on or used lately (Redis keeps them).

use std::rc::Rc;

use log::{debug, info};

use super::{ApiError, ConnId, Effect, PromptsQuery, Relay, Ticket, Write, issue};
use crate::store::message::{Framed, Message, Parts};
use crate::store::record::{Outcome, Record};
use crate::store::redis::{Answered, Event, Head, Known, Msg, RedisStore, Snapshot, Then};
use crate::store::{MemStore, Seq, SessionId, SessionLog};
use crate::time::Millis;

/// What the copy holds of `sid`.
fn known<'a>(store: &'a MemStore, sid: &str) -> Known<'a> {
    store.get(sid).map_or(Known::default(), |l| Known {
        epoch: l.epoch(),
        next: l.next_seq().get(),
    })
}

/// A new message's `data` up to its `seq`, which the script appends.
fn head_of(parts: &Parts) -> String {
    let mut d = parts.data(); // ends in `"seq":0}`
    d.truncate(d.len() - 2);
    d
}

/// Sends a write to Redis (which is up) under the ticket `ticket` issues,
/// once the write is known to be sent: a deletion names a valid session id
/// (else `404` here, and no ticket): the copy may not hold the session.
pub(super) fn submit(
    r: &mut RedisStore,
    store: &MemStore,
    ticket: impl FnOnce() -> Ticket,
    w: Write,
    unix_ms: u64,
) -> Result<(), ApiError> {
    match w {
        Write::Prompt(p) => {
            let given = p
                .client_msg_id
                .as_ref()
                .map(|(id, raw)| (id.clone(), raw.get().to_string()));
            let (id, literal) = r.id_and_literal(given.as_ref());
            let ts = p.ts.unwrap_or(unix_ms);
            let head = head_of(&Parts {
                session_id: &p.session_id,
                id_literal: &literal,
                prompt_id: None,
                text: p.prompt.get(),
                metadata: p.metadata.map(|m| m.get()),
                ts,
                seq: Seq(0),
            });
            r.prompt(
                ticket(),
                &p.session_id,
                id,
                head,
                ts,
                known(store, &p.session_id),
            );
        }
        Write::Response(p) => {
            let given = p
                .assistant_msg_id
                .as_ref()
                .map(|(id, raw)| (id.clone(), raw.get().to_string()));
            let (id, literal) = r.id_and_literal(given.as_ref());
            let ts = p.ts.unwrap_or(unix_ms);
            let text = p.text.get();
            let head = head_of(&Parts {
                session_id: &p.session_id,
                id_literal: &literal,
                prompt_id: Some(&p.client_msg_id),
                text,
                metadata: p.metadata.map(|m| m.get()),
                ts,
                seq: Seq(0),
            });
            let write = crate::store::redis::ResponseWrite {
                client_msg_id: &p.client_msg_id,
                id: &id,
                given: given.is_some(),
                text,
                head: &head,
                ts,
            };
            r.response(ticket(), &p.session_id, write, known(store, &p.session_id));
        }
        Write::Part(p) => submit_part(r, store, ticket(), &p),
        Write::Create { sid, put } => r.create(ticket(), sid, put, known(store, sid)),
        Write::Delete { sid } => {
            let sid = SessionId::new(sid).ok_or_else(ApiError::session_not_found)?;
            r.delete(ticket(), &sid);
        }
    }
    Ok(())
}

/// Sends a part of a streamed answer to Redis under `ticket`.
fn submit_part(
    r: &mut RedisStore,
    store: &MemStore,
    ticket: Ticket,
    p: &crate::store::types::NewResponse,
) {
    let id = p
        .assistant_msg_id
        .as_ref()
        .map_or("", |(id, _)| id.as_str());
    let text = p.text.get();
    let write = crate::store::redis::PartWrite {
        client_msg_id: &p.client_msg_id,
        id,
        text,
        bytes: super::live::decoded_len(text),
        max_bytes: super::live::MAX_DRAFT_BYTES,
    };
    r.part(ticket, &p.session_id, write, known(store, &p.session_id));
}

impl Relay {
    /// The Redis engine, when sessions are shared.
    pub fn redis(&mut self) -> Option<&mut RedisStore> {
        self.engine.redis()
    }

    /// Before a read of `sid`: with Redis, makes sure the copy holds
    /// what any instance acknowledged before now, and returns true (the
    /// request runs again once it does). A copy that follows the session's
    /// channel waits for the turn's `PING`; any other asks the script what
    /// it lacks. While Redis is unreachable, a session this copy holds is
    /// read as it is.
    pub fn sync_first(&mut self, conn: ConnId, sid: &SessionId) -> Result<bool, ApiError> {
        self.sync_first_as(conn, sid, false)
    }

    /// [`sync_first`](Self::sync_first) for `GET /prompts` with `q`: a
    /// poll that would park on a copy following the session's channel
    /// parks at once, without the `PING`. Whatever was stored before it
    /// that the copy lacks is published, and wakes it when it arrives,
    /// as a later prompt would; the agent's loop (answer, poll again)
    /// then waits for Redis only on its writes.
    pub fn sync_first_poll(
        &mut self,
        conn: ConnId,
        sid: &SessionId,
        q: &PromptsQuery,
    ) -> Result<bool, ApiError> {
        let parks = q.wait
            && q.timeout_ms > 0
            && self
                .store
                .get(sid)
                .is_some_and(|log| !log.has_pending_after(q.after));
        if parks
            && self
                .engine
                .redis()
                .is_some_and(|r| r.up() && r.follows(sid))
        {
            return Ok(false);
        }
        self.sync_first(conn, sid)
    }

    /// [`sync_first`](Self::sync_first) for a WebSocket upgrade: the
    /// session's channel is listened to from the read on, not from the
    /// subscription after it, so that what is published once the
    /// subscriber has its first frames reaches it as it happens (what
    /// was published before Redis confirmed the subscription comes with
    /// the read that follows the confirmation).
    pub fn sync_first_listening(
        &mut self,
        conn: ConnId,
        sid: &SessionId,
    ) -> Result<bool, ApiError> {
        self.sync_first_as(conn, sid, true)
    }

    fn sync_first_as(
        &mut self,
        conn: ConnId,
        sid: &SessionId,
        listen: bool,
    ) -> Result<bool, ApiError> {
        if listen
            && self
                .engine
                .redis()
                .is_some_and(|r| r.up() && !r.follows(sid))
        {
            self.listen(sid);
        }
        let store = &self.store;
        let Some(r) = self.engine.redis() else {
            return Ok(false);
        };
        if !r.up() {
            return if store.contains(sid) {
                Ok(false)
            } else {
                Err(ApiError::storage_unavailable())
            };
        }
        let t = issue(&mut self.tickets, &mut self.issued, conn);
        if store.contains(sid) && r.follows(sid) {
            r.barrier(t, sid);
        } else {
            r.sync(Some(t), sid, known(store, sid));
        }
        Ok(true)
    }

    /// A read's `PING` came back: every change published before it is
    /// applied. If the copy still follows the channel (no gap was seen
    /// meanwhile, the subscription held), the read runs on it; otherwise
    /// the session is read through the script first.
    fn barrier_passed(&mut self, to: Ticket, sid: &SessionId) {
        let store = &self.store;
        let held = store.contains(sid);
        match self.engine.redis() {
            Some(r) if r.up() && !(held && r.follows(sid)) => {
                r.sync(Some(to), sid, known(store, sid));
            }
            // Redis unreachable: the copy is read as it is (as above).
            Some(r) if !r.up() && !held => self.effects.push(Effect::Reply {
                to,
                result: Err(ApiError::storage_unavailable()),
            }),
            _ => self.effects.push(Effect::Retry { to }),
        }
    }

    /// Applies what Redis answered and published since the last call, and
    /// queues the answers of the requests that waited. Called after the
    /// shell handed Redis's bytes to the engine.
    #[inline(never)]
    pub fn redis_done(&mut self, now: Millis) {
        let Some(r) = self.engine.redis() else {
            return;
        };
        let lost = r.take_lost();
        let events = r.take_events();
        let answered = r.take_answered();
        if lost {
            self.store_lost();
        }
        for e in events {
            self.published(now, e);
        }
        for a in answered {
            self.answered(now, a);
        }
    }

    #[inline(never)]
    fn answered(&mut self, now: Millis, a: Answered) {
        // A new message stored through this instance: counted and logged
        // here, once, whichever instances' copies apply it. Redis ran the
        // write alone, so its seq is the last the answer's session holds.
        if let (
            Then::Reply(Ok(o)),
            Some(Snapshot {
                sid, head: Some(h), ..
            }),
        ) = (&a.then, &a.snapshot)
        {
            let seq = h.next.get().saturating_sub(1);
            match o {
                Outcome::Prompt {
                    id,
                    duplicate: false,
                } => {
                    debug!(session_id = sid.as_str(), client_msg_id = id.as_str(), seq = seq; "prompt stored");
                    self.stats.prompts_stored += 1;
                }
                Outcome::Response {
                    id,
                    duplicate: false,
                } => {
                    debug!(session_id = sid.as_str(), assistant_msg_id = id.as_str(), seq = seq; "response posted");
                    self.stats.responses_stored += 1;
                }
                _ => {}
            }
        }
        let delivered = match a.snapshot {
            Some(s) => self.catch_up(now, s),
            None => false,
        } || a.delivered;
        if let Then::Resynced(sid) = &a.then
            && let Some(r) = self.engine.redis()
        {
            r.resynced(sid);
        }
        let Some(to) = a.conn else {
            return;
        };
        match a.then {
            Then::Resynced(_) => {}
            Then::Retry => self.effects.push(Effect::Retry { to }),
            Then::Barrier(sid) => self.barrier_passed(to, &sid),
            Then::Reply(result) => {
                if let Ok(Outcome::Deleted) = &result {
                    info!("session deleted");
                }
                let result = result.map(|o| self.ack(o, delivered));
                self.effects.push(Effect::Reply { to, result });
            }
        }
    }

    /// Brings the copy of a session to what Redis answered. Returns
    /// whether a new answer went to a subscriber here.
    #[inline(never)]
    fn catch_up(&mut self, now: Millis, s: Snapshot) -> bool {
        let Snapshot {
            sid,
            head,
            msgs,
            live,
        } = s;
        let key = sid.clone();
        let delivered = self.catch_up_log(now, sid, head, msgs);
        if let Some((drafts, agents)) = live
            && self.store.contains(&key)
        {
            self.live_synced(now, &key, drafts, agents);
        }
        delivered
    }

    /// [`catch_up`](Self::catch_up) for the log.
    fn catch_up_log(
        &mut self,
        now: Millis,
        sid: SessionId,
        head: Option<Head>,
        msgs: Vec<Msg>,
    ) -> bool {
        let local = self
            .store
            .get(&sid)
            .map(|l| (l.epoch().clone(), l.next_seq()));
        let Some(head) = head else {
            if local.is_some() {
                info!(session_id = sid.as_str(); "session deleted");
                self.apply(now, [Record::Deleted { sid }]);
            }
            return false;
        };
        match local {
            Some((epoch, mut next)) if *epoch == *head.epoch && !head.full => {
                let mut records = Vec::with_capacity(msgs.len());
                for m in msgs {
                    if m.seq == next {
                        next = next.next();
                        records.push(record(&sid, m));
                    }
                }
                self.apply(now, records)
            }
            Some((epoch, next)) if *epoch == *head.epoch && next == head.next => false,
            // Lacking the base an increment follows (forgotten meanwhile):
            // the next read takes the whole session.
            None if !head.full => false,
            _ => {
                let same = local.as_ref().is_some_and(|(e, _)| **e == *head.epoch);
                if local.is_some() && !same {
                    self.apply(now, [Record::Deleted { sid: sid.clone() }]);
                }
                let log = rebuild(now, &head, msgs, self.limits.history_limit);
                self.store.insert(sid.clone(), log);
                // More than history holds went by: what waits here reads
                // the log again. Without a copy before, a session first
                // read here has nobody waiting yet, and one someone waits
                // on lost its copy with the store: its subscribers start
                // the new epoch with a `resync`.
                if same || local.is_none() {
                    self.wake_waiters(now, &sid);
                    let resync = local.is_none();
                    self.effects.push(Effect::Refill { sid, resync });
                }
                false
            }
        }
    }

    /// A change published by an instance: applied when it follows the
    /// copy; a gap or another epoch makes the copy read again.
    #[inline(never)]
    fn published(&mut self, now: Millis, e: Event) {
        let (sid, epoch) = match &e {
            Event::Listening { sid } => {
                // Held here: someone waits on it, or a subscriber's
                // upgrade read it and is being set up.
                if self.presence.contains_key(sid) || self.store.contains(sid) {
                    self.resync(sid);
                }
                return;
            }
            Event::Refused { sid } => {
                if self.store.contains(sid) {
                    self.resync(sid);
                }
                return;
            }
            Event::Part {
                sid,
                epoch,
                assistant_msg_id,
                client_msg_id,
                part,
                lit,
            } => {
                if self.store.get(sid).is_some_and(|l| **l.epoch() == **epoch) {
                    self.part_published(now, sid, assistant_msg_id, client_msg_id, *part, lit);
                }
                return;
            }
            Event::Agent { sid, state } => {
                if self.store.contains(sid) {
                    self.agent_published(now, sid, state);
                }
                return;
            }
            Event::Receipts {
                sid,
                instance,
                ts,
                ids,
            } => {
                self.receipts_published(sid, instance, *ts, ids);
                return;
            }
            Event::Created { sid, epoch }
            | Event::Deleted { sid, epoch }
            | Event::Message { sid, epoch, .. } => (sid, epoch),
        };
        let Some(log) = self.store.get(sid) else {
            return; // not served here: the next read takes it whole
        };
        let same = **log.epoch() == **epoch;
        let next = log.next_seq();
        match e {
            Event::Deleted { sid, .. } if same => {
                info!(session_id = sid.as_str(); "session deleted");
                self.apply(now, [Record::Deleted { sid }]);
            }
            Event::Message { sid, msg, .. } if same => {
                if msg.seq == next {
                    self.apply(now, [record(&sid, msg)]);
                } else if msg.seq > next {
                    self.resync(&sid);
                }
            }
            Event::Created { .. } | Event::Deleted { .. } if same => {}
            Event::Created { sid, .. }
            | Event::Deleted { sid, .. }
            | Event::Message { sid, .. } => self.resync(&sid),
            Event::Listening { .. }
            | Event::Refused { .. }
            | Event::Part { .. }
            | Event::Agent { .. }
            | Event::Receipts { .. } => {}
        }
    }

    /// Redis restarted empty or was flushed: every copy held here is of
    /// sessions that are gone, not deleted. The copies are dropped (an
    /// answer that still follows one is then ignored), and each session
    /// someone waits on here is read again, created anew if missing:
    /// its parked polls stay parked and its subscribers get a `resync`
    /// with the new epoch instead of a close (see `catch_up`).
    #[inline(never)]
    fn store_lost(&mut self) {
        self.store.forget_all();
        self.live.clear();
        if let Some(r) = self.engine.redis().filter(|r| r.up()) {
            for sid in self.presence.keys() {
                r.recreate(sid);
            }
        }
    }

    /// Reads a session again, for nobody in particular. One waited on
    /// here without a copy (Redis lost its data, and creating it again
    /// failed then) is created again.
    pub(super) fn resync(&mut self, sid: &SessionId) {
        let store = &self.store;
        if let Some(r) = self.engine.redis()
            && r.up()
        {
            match store.get(sid) {
                Some(_) => r.sync(None, sid, known(store, sid)),
                None => r.recreate(sid),
            }
        }
    }

    /// The sweep with Redis: the sessions someone here waits on are marked
    /// active (and created again if Redis lost them and that failed), the
    /// ones idle for the TTL are deleted (by whichever instance sweeps
    /// first), and copies nobody here used for `forget_ms` are forgotten.
    pub(super) fn sweep_shared(&mut self, now: Millis, ttl_ms: u64) -> usize {
        let forget_ms = ttl_ms.min(60_000);
        let presence = &self.presence;
        let idle = self.store.idle(|sid, log| {
            !presence.contains_key(sid) && now.since(log.last_active) >= forget_ms
        });
        for sid in &idle {
            self.store.forget(sid);
            self.live.remove(sid);
        }
        let present: Vec<&str> = self.presence.keys().map(|s| s.as_str()).collect();
        let grace = watch_grace(ttl_ms);
        let store = &self.store;
        if let Some(r) = self.engine.redis() {
            r.unlisten_unless(&|sid| presence.contains_key(sid));
            r.sweep(&present, ttl_ms);
            let until = r.unix_ms + grace;
            for (sid, here) in &self.presence {
                if !here.subscribers.is_empty() {
                    r.watch(sid, until);
                }
                // Waited on without a copy: Redis lost its data and the
                // session could not be created again then.
                if !store.contains(sid) && r.up() {
                    r.recreate(sid);
                }
            }
        }
        idle.len()
    }

    /// Someone waits on `sid` here (a parked poll, a subscriber): its
    /// changes made elsewhere must reach this instance. Channels stay
    /// listened to until the sweep after the last one left (a poll parks
    /// again soon), and at most about twice as many as are waited on.
    pub(super) fn listen(&mut self, sid: &SessionId) {
        let presence = &self.presence;
        if let Some(r) = self.engine.redis() {
            if r.listened() >= 2 * presence.len() + 1024 {
                r.unlisten_unless(&|sid| presence.contains_key(sid));
            }
            r.listen(sid);
        }
    }

    /// The first subscriber of `sid` here came, or the last one left:
    /// Redis is told, for the `delivered` of answers stored elsewhere.
    pub(super) fn watching(&mut self, sid: &str, on: bool) {
        let grace = watch_grace(self.limits.session_ttl_ms);
        if let Some(r) = self.engine.redis() {
            let until = if on { r.unix_ms + grace } else { 0 };
            r.watch(sid, until);
        }
    }
}

/// How long Redis counts this instance's subscribers of a session without
/// hearing again (three sweeps: an instance that died stops counting).
fn watch_grace(ttl_ms: u64) -> u64 {
    3 * (ttl_ms / 4).clamp(100, 60_000)
}

/// A stored message as a committed record.
fn record(sid: &SessionId, m: Msg) -> Record {
    if m.prompt {
        Record::Prompt {
            sid: sid.clone(),
            seq: m.seq,
            ts: m.ts,
            client_msg_id: m.client_msg_id,
            data: m.data,
        }
    } else {
        Record::Response {
            sid: sid.clone(),
            seq: m.seq,
            ts: m.ts,
            client_msg_id: m.client_msg_id,
            assistant_msg_id: m.assistant_msg_id,
            data: Framed::from(m.data.as_str()),
        }
    }
}

/// A whole session, as restoring one from SQLite builds it.
fn rebuild(now: Millis, head: &Head, msgs: Vec<Msg>, limit: usize) -> SessionLog {
    let mut log = SessionLog::restored(
        now,
        Rc::from(head.epoch.as_str()),
        head.next,
        head.last_assistant,
        head.dropped_assistant,
    );
    for m in msgs {
        if m.prompt {
            let cid: Rc<str> = Rc::from(m.client_msg_id);
            log.append_prompt(
                Message::prompt_with(cid, m.seq, m.ts, m.data.into_bytes()),
                limit,
            );
        } else {
            let cid = log
                .prompt_id(&m.client_msg_id)
                .unwrap_or_else(|| Rc::from(m.client_msg_id.as_str()));
            let aid: Rc<str> = Rc::from(m.assistant_msg_id);
            let msg = Message::assistant_with(cid, aid, m.seq, m.ts, m.data.as_bytes());
            log.append_response(msg, limit);
        }
    }
    log
}
