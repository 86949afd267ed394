//! The Redis engine against this instance's copy of the sessions it serves
//! (the relay's [`MemStore`]): writes sent with what the copy holds, reads
//! that wait until the copy holds what was acknowledged before them, and
//! every reply and published change turned into the [`StoreEvent`]s every
//! engine gives the relay. A reply brings the copy up to date, and so does
//! every change published by any instance; one that does not follow the
//! copy (a gap, another epoch) makes this instance read the session again.
//!
//! The copy holds the sessions this instance serves: the sweep forgets the
//! ones nobody here waits on or used lately (Redis keeps them).

use std::rc::Rc;

use log::info;

use super::codec::push_channel_command;
use super::reply::{Event, Head, Msg};
use super::route::{Answered, Then};
use super::{DELETED_KEPT, Known, RedisStore, base_in};
use crate::error::ApiError;
use crate::store::SessionLog;
use crate::store::mem::MemStore;
use crate::store::message::{Framed, Kind, Message};
use crate::store::model::Write as Change;
use crate::store::record::{Outcome, Record};
use crate::store::seam::{AgentState, DraftState, Read, StoreEvent, Waited};
use crate::store::types::{SessionId, Ticket};
use crate::time::Millis;

/// What the copy holds of `sid`.
fn known<'a>(copy: &'a MemStore, sid: &str) -> Known<'a> {
    copy.get(sid).map_or(Known::default(), |l| Known {
        epoch: l.epoch(),
        next: l.next_seq().get(),
    })
}

/// How long Redis counts this instance's subscribers of a session without
/// hearing again (three sweeps: an instance that died stops counting).
fn watch_grace(ttl_ms: u64) -> u64 {
    3 * (ttl_ms / 4).clamp(100, 60_000)
}

impl RedisStore {
    /// The turn's wall clock (unix ms).
    pub fn set_clock(&mut self, unix_ms: u64) {
        self.unix_ms = unix_ms;
    }

    /// Sends a write to Redis under the ticket `ticket` issues, once the
    /// write is known to be sent: Redis is up, and a deletion names a
    /// valid session id (else `404` here, and no ticket: the copy may not
    /// hold the session).
    pub fn submit(
        &mut self,
        copy: &MemStore,
        ticket: impl FnOnce() -> Ticket,
        w: &Change,
        unix_ms: u64,
    ) -> Result<(), ApiError> {
        if !self.up() {
            return Err(ApiError::storage_unavailable());
        }
        self.send(ticket, w, known(copy, w.session()), unix_ms)
    }

    /// Before a read of `sid`: makes sure the copy holds what any instance
    /// acknowledged before now, and returns true (the request runs again
    /// once it does). A copy that follows the session's channel waits for
    /// the turn's `PING`; any other asks the script what it lacks. While
    /// Redis is unreachable, a session the copy holds is read as it is.
    ///
    /// A poll that would park on a copy following the session's channel
    /// parks at once, without the `PING`: whatever was stored before it
    /// that the copy lacks is published, and wakes it when it arrives, as
    /// a later prompt would; the agent's loop (answer, poll again) then
    /// waits for Redis only on its writes. A WebSocket upgrade listens to
    /// the session's channel from the read on, not from the subscription
    /// after it, so that what is published once the subscriber has its
    /// first frames reaches it as it happens (what was published before
    /// Redis confirmed the subscription comes with the read that follows
    /// the confirmation).
    pub fn before_read(
        &mut self,
        copy: &MemStore,
        ticket: impl FnOnce() -> Ticket,
        sid: &SessionId,
        read: Read,
        waited: &dyn Waited,
    ) -> Result<bool, ApiError> {
        match read {
            Read::Poll(q) => {
                let parks = q.wait
                    && q.timeout_ms > 0
                    && copy
                        .get(sid)
                        .is_some_and(|log| !log.has_pending_after(q.after));
                if parks && self.up() && self.follows(sid) {
                    return Ok(false);
                }
            }
            Read::Subscribe if self.up() && !self.follows(sid) => self.listen_bounded(sid, waited),
            Read::Subscribe | Read::Plain => {}
        }
        if !self.up() {
            return if copy.contains(sid) {
                Ok(false)
            } else {
                Err(ApiError::storage_unavailable())
            };
        }
        let t = ticket();
        if copy.contains(sid) && self.follows(sid) {
            self.barrier(t, sid);
        } else {
            self.sync(Some(t), sid, known(copy, sid));
        }
        Ok(true)
    }

    /// Someone waits on `sid` here: its changes made elsewhere must reach
    /// this instance. Channels stay listened to until the sweep after the
    /// last one left (a poll parks again soon), and at most about twice as
    /// many as are waited on.
    pub fn listen_bounded(&mut self, sid: &SessionId, waited: &dyn Waited) {
        if self.listened() >= 2 * waited.count() + 1024 {
            self.unlisten_unless(&|sid| waited.waits_on(sid));
        }
        self.listen(sid);
    }

    /// The first subscriber of `sid` here came (`on`), or the last one
    /// left: Redis is told, for the `delivered` of answers stored
    /// elsewhere.
    pub fn watching(&mut self, sid: &str, on: bool, ttl_ms: u64) {
        let until = if on {
            self.unix_ms + watch_grace(ttl_ms)
        } else {
            0
        };
        self.watch(sid, until);
    }

    /// The next thing for the relay: Redis lost its data, then each change
    /// published, then each reply, in the order they came, read against
    /// the copy as the events before them left it.
    pub fn next_event(&mut self, copy: &MemStore, waited: &dyn Waited) -> Option<StoreEvent> {
        if self.renew_owed && self.cmd.up {
            self.renew_copies(copy);
        }
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Some(e);
            }
            if self.take_lost() {
                return Some(StoreEvent::Lost);
            }
            if let Some(e) = self.events.pop_front() {
                self.published(copy, waited, e);
            } else if self.hold != Some(0)
                && let Some(a) = self.answered.pop_front()
            {
                if let Some(h) = &mut self.hold {
                    *h -= 1;
                }
                self.answered(copy, a);
            } else {
                // No reply that ran before a deletion is on its way.
                if self.expect.is_empty() && self.answered.is_empty() {
                    self.deleted.clear();
                }
                return None;
            }
        }
    }

    /// Redis restarted empty or was flushed, and the copies are dropped:
    /// each session someone waits on here is read again, created anew if
    /// missing: its parked polls stay parked and its subscribers get a
    /// `resync` with the new epoch instead of a close.
    pub fn reread_waited(&mut self, waited: &dyn Waited) {
        if self.up() {
            waited.each(&mut |sid, _| self.recreate(sid));
        }
    }

    /// A reply: the copy brought up to what it carries, then the
    /// requester's answer.
    #[inline(never)]
    fn answered(&mut self, copy: &MemStore, mut a: Answered) {
        // A reply that ran before a deletion the copy applied already
        // (published, and read before it): its session is gone from
        // Redis, and applied it would put the deleted log back, on which
        // a read that waited for everything published before it would
        // run. Its result stands; what it read is dropped (a read that
        // waited runs again and reads the session anew).
        if let Some(s) = &a.snapshot
            && let Some(h) = &s.head
            && self
                .deleted
                .iter()
                .any(|(sid, e)| *sid == s.sid && *e == h.epoch)
        {
            a.snapshot = None;
        }
        // A read answered with what follows a copy that changed meanwhile
        // (forgotten by the sweep, or set back by a whole read that ran
        // before the call and was answered after it): applied, it would
        // leave the copy short of what Redis held when the call ran, so
        // a request would be answered an older log than was acknowledged
        // before it, or the copy taken to follow its channel. The session
        // is read whole first (a copy forgotten stays so when nobody asked
        // for the read).
        if let (Some(s), Then::Retry | Then::Resynced(_)) = (&a.snapshot, &a.then)
            && let Some(h) = s.head.as_ref().filter(|h| !h.full)
            && (a.conn.is_some() || copy.contains(&s.sid))
            && !reaches(copy, &s.sid, h, &s.msgs)
        {
            let sid = s.sid.clone();
            self.sync(a.conn, &sid, Known::default());
            if let Then::Resynced(sid) = &a.then {
                self.resynced(sid);
            }
            return;
        }
        let (records, live) = match a.snapshot {
            Some(s) => {
                let key = s.sid.clone();
                let records = self.catch_up_log(copy, s.sid, s.head, s.msgs);
                (
                    records,
                    s.live.map(|(drafts, agents)| (key, drafts, agents)),
                )
            }
            None => (Vec::new(), None),
        };
        if let Then::Resynced(sid) = &a.then {
            self.resynced(sid);
        }
        match (a.conn, a.then) {
            (Some(to), Then::Reply(result)) => {
                if let Ok(Outcome::Deleted { sid }) = &result {
                    info!(session_id = sid.as_str(); "session deleted");
                }
                self.ready.push_back(StoreEvent::Answer {
                    to,
                    records,
                    result,
                    delivered: a.delivered,
                });
                self.live_read(live);
            }
            (conn, then) => {
                if !records.is_empty() {
                    self.ready.push_back(StoreEvent::Records(records));
                }
                // A read brings the drafts and agent states: after its
                // log, so no live frame overtakes the log it follows.
                self.live_read(live);
                match (conn, then) {
                    (Some(to), Then::Retry) => self.ready.push_back(StoreEvent::Retry(to)),
                    (Some(to), Then::Barrier(sid)) => self.barrier_passed(copy, to, &sid),
                    _ => {}
                }
            }
        }
    }

    fn live_read(&mut self, live: Option<(SessionId, Vec<DraftState>, Vec<AgentState>)>) {
        if let Some((sid, drafts, mut agents)) = live {
            // This instance's own state is the relay's already.
            agents.retain(|a| a.instance != self.instance);
            // Taken if the copy holds the session once the log is applied.
            self.ready.push_back(StoreEvent::LiveRead {
                sid,
                drafts,
                agents,
            });
        }
    }

    /// A read's `PING` came back: every change published before it is
    /// applied. If the copy still follows the channel (no gap was seen
    /// meanwhile, the subscription held), the read runs on it; otherwise
    /// the session is read through the script first.
    fn barrier_passed(&mut self, copy: &MemStore, to: Ticket, sid: &SessionId) {
        let held = copy.contains(sid);
        if self.up() && !(held && self.follows(sid)) {
            self.sync(Some(to), sid, known(copy, sid));
        } else if !self.up() && !held {
            // Redis unreachable: the copy is read as it is, if it holds
            // the session.
            self.ready.push_back(StoreEvent::Answer {
                to,
                records: Vec::new(),
                result: Err(ApiError::storage_unavailable()),
                delivered: false,
            });
        } else {
            self.ready.push_back(StoreEvent::Retry(to));
        }
    }

    /// Brings the copy of a session to what Redis answered: returns the
    /// records that follow what it holds; a deletion, or the session read
    /// whole, goes to the relay at once.
    fn catch_up_log(
        &mut self,
        copy: &MemStore,
        sid: SessionId,
        head: Option<Head>,
        msgs: Vec<Msg>,
    ) -> Vec<Record> {
        let local = copy.get(&sid).map(|l| (l.epoch(), l.next_seq()));
        // The first whole read after a failover, made before the channel
        // is listened to again: a copy holding more held what the
        // promoted replica lacked.
        let rolled_back = head.as_ref().is_none_or(|h| h.full) && self.read_after_failover(&sid);
        let rolled_back = rolled_back
            && head
                .as_ref()
                .zip(local.as_ref())
                .is_some_and(|(h, (e, next))| **e == *h.epoch && *next > h.next);
        let Some(head) = head else {
            if local.is_some() {
                info!(session_id = sid.as_str(); "session deleted");
                self.ready
                    .push_back(StoreEvent::Records(vec![Record::Deleted { sid }]));
            }
            return Vec::new();
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
                records
            }
            // The copy holds as much or more of this epoch: a change
            // published after the call ran can reach the copy before the
            // call's answer (the two links are read apart), and a log only
            // grows within an epoch, so an older whole session would roll
            // the copy back (unless it is the read after a failover).
            Some((epoch, next)) if *epoch == *head.epoch && next >= head.next && !rolled_back => {
                Vec::new()
            }
            // Lacking the base an increment follows (forgotten meanwhile):
            // the next read takes the whole session.
            None if !head.full => Vec::new(),
            _ => {
                let same = local.as_ref().is_some_and(|(e, _)| **e == *head.epoch);
                // A new epoch a failover gave the copy's session (`renew`):
                // not a deletion; its subscribers resync.
                let renewed = !same
                    && (local.as_ref().zip(head.prev.as_deref()))
                        .is_some_and(|((e, _), p)| **e == *p);
                if renewed {
                    info!(session_id = sid.as_str(); "session given a new epoch by a failover");
                }
                if local.is_some() && !same && !renewed {
                    self.ready
                        .push_back(StoreEvent::Records(vec![Record::Deleted {
                            sid: sid.clone(),
                        }]));
                }
                let log = Box::new(rebuild(&head, msgs, self.limits.history_limit));
                // More than history holds went by: what waits here reads
                // the log again. Without a copy before, a session first
                // read here has nobody waiting yet, and one someone waits
                // on lost its copy with the store: its subscribers start
                // the new epoch with a `resync`, and so do those of a copy
                // rolled back by a failover, and its parked polls.
                if rolled_back {
                    info!(session_id = sid.as_str(); "session rolled back by a failover");
                }
                let refill = (same || renewed || local.is_none())
                    .then_some(local.is_none() || rolled_back || renewed);
                self.ready
                    .push_back(StoreEvent::Replaced { sid, log, refill });
                Vec::new()
            }
        }
    }

    /// Whether `sid` waited for its first whole read since a failover;
    /// its channel is listened to again now.
    fn read_after_failover(&mut self, sid: &SessionId) -> bool {
        let Some(f) = self.follow.get_mut(sid).filter(|f| f.rollback) else {
            return false;
        };
        f.rollback = false;
        if f.listen.is_some() && self.ev.up {
            let subscribe = self.verbs()[0];
            let base = base_in(&self.bases, &self.prefix, sid);
            push_channel_command(&mut self.ev.out, subscribe, base.as_bytes(), sid);
        }
        true
    }

    /// A change published by an instance: applied when it follows the
    /// copy; a gap or another epoch makes the copy read again.
    #[inline(never)]
    fn published(&mut self, copy: &MemStore, waited: &dyn Waited, e: Event) {
        if let Event::Deleted { sid, epoch } = &e
            && !(self.expect.is_empty() && self.answered.is_empty())
        {
            if self.deleted.len() >= DELETED_KEPT {
                self.deleted.pop_front();
            }
            self.deleted.push_back((sid.clone(), epoch.clone()));
        }
        let e = match e {
            Event::Listening { sid } => {
                // Held here: someone waits on it, or a subscriber's
                // upgrade read it and is being set up.
                if waited.waits_on(&sid) || copy.contains(&sid) {
                    self.resync(copy, &sid);
                } else if self.up() && self.follow.get(&sid).is_some_and(|f| f.listen.is_some()) {
                    // Not held yet, but a reply on its way may bring it
                    // (the upgrade's own read, or a call answered before
                    // the confirmation): it may have run before the
                    // subscription and lack what was published between.
                    // The session is read whole after the confirmation,
                    // and is not followed until that read is applied.
                    self.sync(None, &sid, Known::default());
                }
                return;
            }
            Event::Refused { sid } => {
                if copy.contains(&sid) {
                    self.resync(copy, &sid);
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
                if copy.get(&sid).is_some_and(|l| *l.epoch() == *epoch) {
                    self.ready.push_back(StoreEvent::Part {
                        sid,
                        assistant_msg_id,
                        client_msg_id,
                        part,
                        lit,
                    });
                }
                return;
            }
            // This instance's own agent states and receipts are known
            // here already: only the other instances' are news.
            Event::Agent { sid, state } => {
                if copy.contains(&sid) && state.instance != self.instance {
                    self.ready.push_back(StoreEvent::Agent { sid, state });
                }
                return;
            }
            Event::Receipts {
                sid,
                instance,
                ts,
                ids,
            } => {
                if instance == self.instance {
                    return;
                }
                self.ready.push_back(StoreEvent::Receipts { sid, ts, ids });
                return;
            }
            e => e,
        };
        let (Event::Created { sid, epoch }
        | Event::Deleted { sid, epoch }
        | Event::Message { sid, epoch, .. }) = &e
        else {
            return; // taken above
        };
        let Some(log) = copy.get(sid) else {
            // Not served here: the next read takes it whole. One listened
            // to may be on its way here in a reply that ran before this
            // change (the links are read apart): it is read again after
            // it, so the copy does not start from that older state.
            // (Each such change asks: a read already on its way may have
            // run before it.)
            let listened = self.follow.get(sid).is_some_and(|f| f.listen.is_some());
            if listened && self.up() {
                let sid = sid.clone();
                self.sync(None, &sid, Known::default());
            }
            return;
        };
        let same = *log.epoch() == **epoch;
        let next = log.next_seq();
        match e {
            Event::Deleted { sid, .. } if same => {
                info!(session_id = sid.as_str(); "session deleted");
                self.ready
                    .push_back(StoreEvent::Records(vec![Record::Deleted { sid }]));
            }
            Event::Message { sid, msg, .. } if same => {
                if msg.seq == next {
                    self.ready
                        .push_back(StoreEvent::Records(vec![record(&sid, msg)]));
                } else if msg.seq > next {
                    self.resync(copy, &sid);
                }
            }
            Event::Created { .. } if same => {}
            Event::Created { sid, .. }
            | Event::Deleted { sid, .. }
            | Event::Message { sid, .. } => self.resync(copy, &sid),
            _ => {}
        }
    }

    /// Reads a session again, for nobody in particular. One waited on
    /// here without a copy (Redis lost its data, and creating it again
    /// failed then) is created again.
    pub fn resync(&mut self, copy: &MemStore, sid: &SessionId) {
        if self.up() {
            match copy.get(sid) {
                Some(_) => self.sync(None, sid, known(copy, sid)),
                None => self.recreate(sid),
            }
        }
    }

    /// The sweep's part in Redis: the sessions someone here waits on are
    /// marked active (and created again if Redis lost them and that
    /// failed), and the ones idle for the TTL are deleted (by whichever
    /// instance sweeps first); channels nobody here waits on any more are
    /// left.
    pub fn keep_alive(&mut self, copy: &MemStore, waited: &dyn Waited, ttl_ms: u64) {
        self.unlisten_unless(&|sid| waited.waits_on(sid));
        self.arrivals_sweep();
        let mut present: Vec<SessionId> = Vec::with_capacity(waited.count());
        waited.each(&mut |sid, _| present.push(sid.clone()));
        let names: Vec<&str> = present.iter().map(|s| s.as_str()).collect();
        self.sweep(&names, ttl_ms);
        let until = self.unix_ms + watch_grace(ttl_ms);
        let up = self.up();
        waited.each(&mut |sid, subscribed| {
            if subscribed {
                self.watch(sid, until);
            }
            // Waited on without a copy: Redis lost its data and the
            // session could not be created again then.
            if !copy.contains(sid) && up {
                self.recreate(sid);
            }
        });
    }
}

/// Whether the copy of `sid`, with the increment `msgs` Redis answered
/// applied, holds what Redis held when the call ran (`head`): the copy is
/// of that epoch and nothing between is missing.
fn reaches(copy: &MemStore, sid: &str, head: &Head, msgs: &[Msg]) -> bool {
    let Some(log) = copy.get(sid).filter(|l| *l.epoch() == *head.epoch) else {
        return false;
    };
    let mut next = log.next_seq();
    for m in msgs {
        if m.seq == next {
            next = next.next();
        }
    }
    next >= head.next
}

/// A stored message as a committed record.
fn record(sid: &SessionId, m: Msg) -> Record {
    match m.kind {
        Kind::Prompt => Record::Prompt {
            sid: sid.clone(),
            seq: m.seq,
            ts: m.ts,
            client_msg_id: m.client_msg_id,
            data: m.data,
        },
        Kind::Assistant => Record::Response {
            sid: sid.clone(),
            seq: m.seq,
            ts: m.ts,
            client_msg_id: m.client_msg_id,
            assistant_msg_id: m.assistant_msg_id,
            data: Framed::from(m.data.as_str()),
        },
        Kind::Cancel => Record::Cancel {
            sid: sid.clone(),
            seq: m.seq,
            ts: m.ts,
            client_msg_id: m.client_msg_id,
            data: m.data,
        },
        Kind::Ask | Kind::Reply => asked_record(sid, m),
    }
}

/// A whole session, as restoring one from SQLite builds it (its activity
/// is set when the copy takes it).
fn rebuild(head: &Head, msgs: Vec<Msg>, limit: usize) -> SessionLog {
    let mut log = SessionLog::restored(
        Millis(0),
        &head.epoch,
        head.next,
        head.last_assistant,
        head.dropped_assistant,
    );
    for m in msgs {
        if matches!(m.kind, Kind::Ask | Kind::Reply) {
            rebuild_asked(&mut log, m, limit);
            continue;
        }
        if m.kind == Kind::Prompt {
            let cid: Rc<str> = Rc::from(m.client_msg_id);
            log.append_prompt(
                Message::prompt_with(cid, m.seq, m.ts, m.data.into_bytes()),
                limit,
            );
            continue;
        }
        let cid = log
            .prompt_id(&m.client_msg_id)
            .unwrap_or_else(|| Rc::from(m.client_msg_id.as_str()));
        if m.kind == Kind::Cancel {
            let msg = Message::cancel_with(cid, m.seq, m.ts, m.data.as_bytes());
            log.append_cancel(msg, limit);
        } else {
            let aid: Rc<str> = Rc::from(m.assistant_msg_id);
            let msg = Message::assistant_with(cid, aid, m.seq, m.ts, m.data.as_bytes());
            log.append_response(msg, limit);
        }
    }
    log
}

/// An ask or a reply as a committed record (its `client_msg_id` field
/// holds the `ask_id`).
fn asked_record(sid: &SessionId, m: Msg) -> Record {
    let (kind, sid, seq, ts, ask_id, data) =
        (m.kind, sid.clone(), m.seq, m.ts, m.client_msg_id, m.data);
    match kind {
        Kind::Ask => Record::Ask {
            sid,
            seq,
            ts,
            ask_id,
            data,
        },
        _ => Record::Reply {
            sid,
            seq,
            ts,
            ask_id,
            data,
        },
    }
}

/// An ask or a reply replayed into a session read whole.
fn rebuild_asked(log: &mut SessionLog, m: Msg, limit: usize) {
    let id: Rc<str> = Rc::from(m.client_msg_id);
    match m.kind {
        Kind::Ask => {
            log.append_ask(Message::ask_with(id, m.seq, m.ts, m.data.as_bytes()), limit);
        }
        _ => {
            log.append_reply(
                Message::reply_with(id, m.seq, m.ts, m.data.as_bytes()),
                limit,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::Link;
    use crate::store::types::{ConnId, Seq};

    /// Nobody waits on any session here.
    struct Nobody;

    impl Waited for Nobody {
        fn waits_on(&self, _: &str) -> bool {
            false
        }
        fn count(&self) -> usize {
            0
        }
        fn each(&self, _: &mut dyn FnMut(&SessionId, bool)) {}
    }

    fn ticket(n: u64) -> Ticket {
        let conn = ConnId {
            key: 1,
            generation: 1,
        };
        Ticket { conn, n }
    }

    /// A read's answer: the session `e1` whole, with nothing stored.
    const EMPTY: &[u8] = b"*8\r\n$2\r\nok\r\n$4\r\nsync\r\n$2\r\ne1\r\n$1\r\n1\r\n\
        $1\r\n0\r\n$1\r\n0\r\n$1\r\n1\r\n$1\r\ng\r\n";

    /// Takes every event, the copy applying the sessions read whole.
    fn drain(r: &mut RedisStore, copy: &mut MemStore) {
        while let Some(e) = r.next_event(copy, &Nobody) {
            if let StoreEvent::Replaced { sid, log, .. } = e {
                copy.insert(sid, log);
            }
        }
    }

    #[test]
    fn a_copy_read_before_its_channel_was_listened_to_is_read_again_before_it_is_followed() {
        let mut r = RedisStore::for_test("redis://127.0.0.1:6379", 10);
        r.connected(Link::Events);
        r.ev.ready = true;
        let mut copy = MemStore::new(r.limits);
        let sid = SessionId::new("s").unwrap();
        // A WebSocket upgrade of a session the copy lacks: its channel is
        // listened to, and the session read.
        let waits = r.before_read(&copy, || ticket(1), &sid, Read::Subscribe, &Nobody);
        assert_eq!(waits, Ok(true));
        r.cmd.out.clear();
        // Redis ran the read before the `SUBSCRIBE` (another instance
        // stored a message between the two, unheard here), and the
        // confirmation is read before the read's answer.
        let channel = format!("{}e:s", r.base(&sid));
        let confirm = format!(
            "*3\r\n$9\r\nsubscribe\r\n${}\r\n{channel}\r\n:1\r\n",
            channel.len()
        );
        r.input(Link::Events, confirm.as_bytes()).unwrap();
        r.input(Link::Command, EMPTY).unwrap();
        drain(&mut r, &mut copy);
        assert!(copy.contains("s"));
        // The copy may lack what was stored before the subscription: it
        // is read again, and until then a read does not trust it.
        assert!(
            !r.follows("s"),
            "followed from a read older than its channel"
        );
        assert!(r.resyncing("s"));
        assert!(String::from_utf8_lossy(&r.cmd.out).contains("sync"));
        let waits = r.before_read(&copy, || ticket(2), &sid, Read::Plain, &Nobody);
        assert_eq!(waits, Ok(true));
        assert!(r.barrier_next.is_empty(), "a read waited for a PING only");
        // Once the read made after the confirmation is applied, the copy
        // follows the channel.
        r.input(Link::Command, EMPTY).unwrap();
        drain(&mut r, &mut copy);
        assert!(r.follows("s"));
    }

    /// The session `e1`, stored up to `seq` `next - 1` (its messages
    /// left out: only where the copy stands matters here).
    fn at(next: u64) -> SessionLog {
        let head = Head {
            epoch: "e1".into(),
            prev: None,
            next: Seq(next),
            last_assistant: Seq(0),
            dropped_assistant: Seq(0),
            full: true,
        };
        rebuild(&head, Vec::new(), 10)
    }

    #[test]
    fn a_read_answered_past_a_copy_set_back_meanwhile_reads_the_session_whole_before_it_runs() {
        let mut r = RedisStore::for_test("redis://127.0.0.1:6379", 10);
        let mut copy = MemStore::new(r.limits);
        let sid = SessionId::new("s").unwrap();
        // The copy holds seqs 1 and 2, not followed: a read asks Redis
        // what follows them.
        copy.insert(sid.clone(), at(3));
        let waits = r.before_read(&copy, || ticket(1), &sid, Read::Plain, &Nobody);
        assert_eq!(waits, Ok(true));
        r.cmd.out.clear();
        // Meanwhile a whole read that ran before the call (owed since the
        // link was lost) is applied: the copy is back to seq 1.
        copy.insert(sid.clone(), at(2));
        // Redis answers the read: nothing follows seq 2, the next is 3.
        r.input(
            Link::Command,
            b"*8\r\n$2\r\nok\r\n$4\r\nsync\r\n$2\r\ne1\r\n$1\r\n3\r\n\
            $1\r\n0\r\n$1\r\n0\r\n$1\r\n0\r\n$0\r\n\r\n",
        )
        .unwrap();
        while let Some(e) = r.next_event(&copy, &Nobody) {
            assert!(
                !matches!(e, StoreEvent::Retry(_)),
                "a read answered from a copy lacking seq 2"
            );
        }
        // The session is read whole for the read, which runs once that
        // answer is applied.
        assert!(String::from_utf8_lossy(&r.cmd.out).contains("sync"));
        let mut retried = false;
        r.input(
            Link::Command,
            b"*8\r\n$2\r\nok\r\n$4\r\nsync\r\n$2\r\ne1\r\n$1\r\n3\r\n\
            $1\r\n0\r\n$1\r\n0\r\n$1\r\n1\r\n$1\r\ng\r\n",
        )
        .unwrap();
        while let Some(e) = r.next_event(&copy, &Nobody) {
            match e {
                StoreEvent::Replaced { sid, log, .. } => copy.insert(sid, log),
                StoreEvent::Retry(t) => retried = t == ticket(1),
                _ => {}
            }
        }
        assert!(retried);
        assert_eq!(copy.get("s").map(|l| l.next_seq()), Some(Seq(3)));
    }

    #[test]
    fn a_read_of_its_own_answered_past_a_copy_set_back_meanwhile_leaves_it_unfollowed() {
        let mut r = RedisStore::for_test("redis://127.0.0.1:6379", 10);
        r.connected(Link::Events);
        r.ev.ready = true;
        let mut copy = MemStore::new(r.limits);
        let sid = SessionId::new("s").unwrap();
        copy.insert(sid.clone(), at(3));
        // The channel is listened to; its confirmation reads the session
        // again for what follows seq 2.
        r.listen(&sid);
        let channel = format!("{}e:s", r.base(&sid));
        let confirm = format!(
            "*3\r\n$9\r\nsubscribe\r\n${}\r\n{channel}\r\n:1\r\n",
            channel.len()
        );
        r.input(Link::Events, confirm.as_bytes()).unwrap();
        while r.next_event(&copy, &Nobody).is_some() {}
        assert!(r.resyncing("s"));
        r.cmd.out.clear();
        // The copy is set back to seq 1 meanwhile, and the answer says
        // nothing follows seq 2.
        copy.insert(sid.clone(), at(2));
        r.input(
            Link::Command,
            b"*8\r\n$2\r\nok\r\n$4\r\nsync\r\n$2\r\ne1\r\n$1\r\n3\r\n\
            $1\r\n0\r\n$1\r\n0\r\n$1\r\n0\r\n$0\r\n\r\n",
        )
        .unwrap();
        while r.next_event(&copy, &Nobody).is_some() {}
        // Not followed on a copy lacking seq 2: read whole first.
        assert!(!r.follows("s"), "followed from a copy lacking seq 2");
        assert!(r.resyncing("s"));
        assert!(String::from_utf8_lossy(&r.cmd.out).contains("sync"));
    }

    #[test]
    fn a_read_that_ran_before_a_deletion_applied_already_does_not_put_the_session_back() {
        let mut r = RedisStore::for_test("redis://127.0.0.1:6379", 10);
        r.connected(Link::Events);
        r.ev.ready = true;
        let mut copy = MemStore::new(r.limits);
        let sid = SessionId::new("s").unwrap();
        // The copy holds seqs 1 and 2 of `e1`: a read asks Redis what
        // follows them.
        copy.insert(sid.clone(), at(3));
        let waits = r.before_read(&copy, || ticket(1), &sid, Read::Plain, &Nobody);
        assert_eq!(waits, Ok(true));
        // Redis runs the read (the session whole, as it was), then a
        // deletion, whose publication is read before the read's answer.
        let channel = format!("{}e:s", r.base(&sid));
        let deleted = format!(
            "*3\r\n$7\r\nmessage\r\n${}\r\n{channel}\r\n$6\r\nD\ns\ne1\r\n",
            channel.len()
        );
        r.input(Link::Events, deleted.as_bytes()).unwrap();
        r.input(Link::Command, EMPTY).unwrap();
        let mut retried = false;
        while let Some(e) = r.next_event(&copy, &Nobody) {
            match e {
                StoreEvent::Records(records) => {
                    for rec in records {
                        if let Record::Deleted { sid } = rec {
                            copy.forget(&sid);
                        }
                    }
                }
                StoreEvent::Replaced { sid, log, .. } => copy.insert(sid, log),
                StoreEvent::Retry(t) => retried = t == ticket(1),
                _ => {}
            }
        }
        // The read runs again on a copy without the deleted session: it
        // reads the session anew rather than answer the deleted log.
        assert!(!copy.contains("s"), "a deleted session put back");
        assert!(retried);
    }
}
