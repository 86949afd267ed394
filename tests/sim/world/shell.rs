//! The shell's side of the simulated world: parked requests and their
//! deadlines, subscribers and their queues (`net/subscriber.rs`'s rules),
//! the relay's effects applied to them (`net/server/effects.rs`), and the
//! clock moved on through every deadline (polls, the relay's tick, the
//! idle sweep).

use super::*;
use relay::relay::Abandon;

impl World {
    /// A `GET` that answers now, parks, or waits for its session to be
    /// read.
    pub(super) fn poll(&mut self, raw: String, sid: Option<String>, after: Option<u64>) -> Check {
        let id = self.connect();
        let outcome = self.request(id, raw.as_bytes(), false)?;
        self.polled(id, outcome, raw, sid, after)
    }

    /// The life of `sid` the relay serves: the model's live one, or with
    /// a shared store the one its copy holds (which may lag).
    pub(super) fn life_here(&self, sid: &str) -> Option<usize> {
        if self.shared.is_none() {
            return self.model.live(sid);
        }
        let log = self.node.relay.peek(sid)?;
        self.model.life_of(sid, log.epoch())
    }

    /// What a poll on `id` came to: answered, parked, or waiting until
    /// its session is read (with a shared store, until the relay's copy
    /// holds what was stored before it), to run again then.
    pub(super) fn polled(
        &mut self,
        id: ConnId,
        outcome: Outcome,
        raw: String,
        sid: Option<String>,
        after: Option<u64>,
    ) -> Check {
        let ask = raw.starts_with("GET /asks");
        match outcome {
            Outcome::Answer(a) if raw.starts_with("GET /messages") => {
                self.release(id);
                self.count(a.status);
                self.messages(sid.as_deref().unwrap_or(""), a.status, a.body.bytes(), None)
            }
            Outcome::Answer(a) => {
                self.release(id);
                if !ask && a.status == 200 {
                    if self.shared.is_none() {
                        self.check_pending_body(sid.as_deref(), after, a.body.bytes())?;
                    } else if let Some(i) = sid.as_deref().and_then(|s| self.life_here(s)) {
                        self.check_listed(i, after, a.body.bytes())?;
                    }
                }
                Ok(())
            }
            Outcome::Wait => {
                if self.shared.is_none() {
                    match sid {
                        Some(_) => self.seen.read_waits += 1,
                        None => self.seen.start_waits += 1,
                    }
                }
                let waits = Waits::Read {
                    raw,
                    sid,
                    after,
                    since: None,
                };
                self.wait(id, waits)
            }
            Outcome::Park {
                sid: psid,
                deadline,
            } => {
                self.seen.parked += 1;
                if psid.as_ref().map(SessionId::as_str) != sid.as_deref() {
                    return Err("parked on another session".to_string());
                }
                let inc = sid.as_deref().and_then(|s| self.life_here(s));
                self.node.conns.push(Conn {
                    id,
                    state: State::Parked(Parked {
                        sid,
                        inc,
                        after,
                        deadline,
                        ask: None,
                    }),
                });
                Ok(())
            }
            Outcome::ParkAsk {
                sid: psid,
                ask_id,
                deadline,
                expires_at,
                expires_ts,
            } => {
                self.seen.parked += 1;
                self.node.conns.push(Conn {
                    id,
                    state: State::Parked(Parked {
                        sid: Some(psid.to_string()),
                        after: None,
                        deadline,
                        ask: Some((ask_id, expires_at, expires_ts)),
                        inc: self.life_here(psid.as_str()),
                    }),
                });
                Ok(())
            }
            other => Err(format!("a poll answered {other:?}")),
        }
    }

    /// A list of pending prompts handed to an agent: of one session, the
    /// model's pending set after its `after`; of every session, prompts
    /// the model has pending.
    /// A list of prompts an agent was woken with while a transaction was
    /// applied: prompts of life `i`, after `after`, oldest first.
    pub(super) fn check_listed(&self, i: usize, after: Option<u64>, body: &[u8]) -> Check {
        let v = json(body)?;
        let list = v.as_array().ok_or("a pending list that is no array")?;
        let inc = &self.model.incs[i];
        let mut last = after.unwrap_or(0);
        for p in list {
            let seq = p["seq"].as_u64().unwrap_or(0);
            let id = p["client_msg_id"].as_str().unwrap_or("");
            let prompt = inc
                .entry(seq)
                .is_some_and(|e| e.kind == Kind::Prompt && e.id == id);
            if seq <= last || !prompt {
                return Err(format!("{}: an agent got {id} at seq {seq}", inc.sid));
            }
            last = seq;
        }
        Ok(())
    }

    pub(super) fn check_pending_body(
        &self,
        sid: Option<&str>,
        after: Option<u64>,
        body: &[u8],
    ) -> Check {
        let v = json(body)?;
        let list = v.as_array().ok_or("a pending list that is no array")?;
        match sid {
            Some(sid) => {
                let got: Vec<(u64, &str)> = list
                    .iter()
                    .map(|p| {
                        (
                            p["seq"].as_u64().unwrap_or(0),
                            p["client_msg_id"].as_str().unwrap_or(""),
                        )
                    })
                    .collect();
                let want: Vec<(u64, &str)> = match self.model.live(sid) {
                    Some(i) => self.model.incs[i]
                        .pending
                        .iter()
                        .filter(|(seq, _)| after.is_none_or(|a| *seq > a))
                        .map(|(seq, id)| (*seq, &**id))
                        .collect(),
                    None => Vec::new(),
                };
                if got != want {
                    return Err(format!(
                        "{sid}: an agent got pending {got:?}, the model has {want:?}"
                    ));
                }
            }
            None => {
                for p in list {
                    let s = p["session_id"].as_str().unwrap_or("");
                    let id = p["client_msg_id"].as_str().unwrap_or("");
                    let pending = self
                        .model
                        .live(s)
                        .is_some_and(|i| self.model.incs[i].pending.iter().any(|(_, c)| c == id));
                    if !pending {
                        return Err(format!("every-session poll got {s}/{id}, not pending"));
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn parked_index(&self, pick: u64) -> Option<usize> {
        let parked: Vec<usize> = (0..self.node.conns.len())
            .filter(|&i| matches!(self.node.conns[i].state, State::Parked(_)))
            .collect();
        (!parked.is_empty()).then(|| parked[(pick % parked.len() as u64) as usize])
    }

    pub(super) fn pick_sub(&self, pick: u64) -> Option<usize> {
        let subs: Vec<usize> = (0..self.node.conns.len())
            .filter(|&i| matches!(self.node.conns[i].state, State::Sub(_)))
            .collect();
        (!subs.is_empty()).then(|| subs[(pick % subs.len() as u64) as usize])
    }

    /// The client of a parked request hangs up: its waiter leaves, as
    /// `Ctx::cancel_parked` has it leave.
    pub(super) fn hang_up(&mut self, pick: u64) {
        let Some(i) = self.parked_index(pick) else {
            return;
        };
        let conn = self.node.conns.swap_remove(i);
        let State::Parked(p) = conn.state else {
            return;
        };
        self.unpark(conn.id, &p);
        self.close(conn.id);
        self.seen.hung_up += 1;
    }

    pub(super) fn unpark(&mut self, id: ConnId, p: &Parked) {
        self.ops += 1;
        match (&p.ask, &p.sid) {
            (Some(_), Some(sid)) => self.node.relay.cancel_ask_wait(id, sid, self.now),
            (None, Some(sid)) => self.node.relay.cancel_wait(id, sid, self.now),
            (_, None) => self.node.relay.cancel_every_wait(id, self.now),
        }
        if let Some(sid) = &p.sid
            && let Some(inc) = self.model.inc_mut(sid)
        {
            inc.last_touch = self.now;
        }
    }

    /// A parked request answered (woken, timed out, its session deleted):
    /// it must be parked still, and is answered once.
    pub(super) fn answer_parked(&mut self, to: ConnId, status: u16, body: &[u8]) -> Check {
        let Some(i) = self.node.conns.iter().position(|c| c.id == to) else {
            return Err(format!("an answer for {to:?}, which waits for none"));
        };
        let State::Parked(p) = &self.node.conns[i].state else {
            return Err(format!("an answer for {to:?}, a subscriber"));
        };
        if p.ask.is_none() && status == 200 {
            if self.alone() {
                self.check_pending_body(p.sid.as_deref(), p.after, body)?;
            } else if let Some(i) = p.inc {
                // Rendered while a transaction's records were applied:
                // prompts of its life, pending then if not now.
                self.check_listed(i, p.after, body)?;
            }
        }
        // A 404 comes only with the end of the session's life.
        if status == 404 && p.inc.is_some_and(|i| self.model.incs[i].alive) {
            let sid = p.sid.clone().unwrap_or_default();
            return Err(format!(
                "a parked poll of {sid} answered 404, the session is there"
            ));
        }
        let conn = self.node.conns.swap_remove(i);
        if let State::Parked(p) = &conn.state {
            self.unpark(conn.id, p);
        }
        self.release(conn.id);
        Ok(())
    }

    pub(super) fn subscribe(&mut self, s: u64, resume: Option<u64>, reading: Reading) -> Check {
        let sid = sid_of(s);
        let resume = resume.and_then(|r| {
            let mine: Vec<&Left> = self.node.left.iter().filter(|l| l.sid == sid).collect();
            (!mine.is_empty()).then(|| mine[(r as usize) % mine.len()])
        });
        let (after, epoch) = match resume {
            Some(l) => (Some(l.after), Some(l.epoch.clone())),
            None => (None, None),
        };
        let mut q = String::new();
        if let Some(a) = after {
            q = format!("?after={a}");
            if let Some(e) = &epoch {
                q.push_str(&format!("&epoch={e}"));
            }
        }
        let raw = format!(
            "GET /ws/{sid}{q} HTTP/1.1\r\nHost: sim\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        let id = self.connect();
        let outcome = self.request(id, raw.as_bytes(), false)?;
        let waits = Waits::Upgrade {
            raw,
            after,
            epoch,
            reading,
        };
        self.upgraded(id, outcome, waits)
    }

    /// What became of a WebSocket upgrade on `id` (`waits` says what it
    /// was): a subscriber, a refusal, or a wait for its session.
    pub(super) fn upgraded(&mut self, id: ConnId, outcome: Outcome, waits: Waits) -> Check {
        let Waits::Upgrade {
            after,
            epoch,
            reading,
            ..
        } = &waits
        else {
            return Err("an upgrade that was no upgrade".to_string());
        };
        let (after, epoch, reading) = (*after, epoch.clone(), *reading);
        match outcome {
            Outcome::Upgrade {
                sid: usid, cursor, ..
            } => {
                self.learn(&usid)?;
                let sid = usid.to_string();
                let inc = self
                    .life_here(&sid)
                    .ok_or("a subscriber of a session the model lacks")?;
                let life = &self.model.incs[inc];
                // What the relay's log holds: the model's, or with a
                // shared store the relay's copy, which may lag it.
                let (next, first) = match (&self.shared, self.node.relay.peek(&sid)) {
                    (Some(_), Some(log)) => (log.next_seq().get(), log.first_seq().get()),
                    _ => (life.next_seq(), life.first_retained(HISTORY)),
                };
                let last = after.unwrap_or(next - 1);
                crate::strace!("subscriber {id:?} of {sid} after {last}: {cursor:?}");
                let owed_resync = epoch.as_ref().is_some_and(|e| *e != life.epoch)
                    || after.is_some_and(|a| a + 1 < first);
                self.node.conns.push(Conn {
                    id,
                    state: State::Sub(Box::new(Sub {
                        sid: usid,
                        cursor,
                        lagging: true,
                        out: VecDeque::new(),
                        queued: 0,
                        reading,
                        view: View {
                            inc,
                            last,
                            owed_resync,
                            frames: 0,
                            ended: std::collections::HashMap::new(),
                        },
                    })),
                });
                Ok(())
            }
            Outcome::Answer(a) if a.status >= 400 => {
                self.release(id);
                self.budgeted(a.status, a.body.bytes())
            }
            Outcome::Wait => self.wait(id, waits),
            other => Err(format!("an upgrade answered {other:?}")),
        }
    }

    /// A subscriber leaves (hangs up, or is closed): what it saw is kept
    /// for a later one to resume from.
    pub(super) fn drop_sub(&mut self, i: usize) {
        self.ops += 1;
        let conn = self.node.conns.swap_remove(i);
        let State::Sub(sub) = conn.state else {
            return;
        };
        self.node.relay.unsubscribe(conn.id, &sub.sid, self.now);
        let life = &self.model.incs[sub.view.inc];
        self.node.left.push(Left {
            sid: sub.sid.to_string(),
            after: sub.view.last,
            epoch: life.epoch.clone(),
        });
        if self.node.left.len() > 16 {
            self.node.left.remove(0);
        }
        if let Some(inc) = self.model.inc_mut(&sub.sid) {
            inc.last_touch = self.now;
        }
        self.close(conn.id);
    }

    /// Refills a lagging subscriber once its queue is at or below half
    /// the cap (`subscriber::top_up`).
    pub(super) fn top_up(&mut self, i: usize) {
        let State::Sub(sub) = &mut self.node.conns[i].state else {
            return;
        };
        if !sub.lagging || sub.queued > SUB_BUFFER / 2 {
            return;
        }
        let room = SUB_BUFFER - sub.queued;
        let caught_up = self.node.relay.refill(
            &sub.sid,
            &mut sub.cursor,
            room,
            sub.out.is_empty(),
            &mut self.node.frames,
        );
        sub.lagging = !caught_up;
        for f in self.node.frames.drain(..) {
            sub.queued += f.len();
            sub.out.push_back(f);
        }
    }

    /// The client of subscriber `i` reads up to `n` frames; the queue is
    /// topped up as it drains, as the shell does when it writes.
    pub(super) fn read(&mut self, i: usize, n: usize) -> Check {
        for _ in 0..n {
            self.top_up(i);
            let State::Sub(sub) = &mut self.node.conns[i].state else {
                return Ok(());
            };
            let Some(frame) = sub.out.pop_front() else {
                return Ok(());
            };
            self.ops += 1;
            sub.queued -= frame.len();
            self.seen.frames += 1;
            if frame.get(2..15) == Some(&b"{\"type\":\"resy"[..]) {
                self.seen.resyncs += 1;
            }
            crate::strace!(
                "{} subscriber reads {}",
                sub.sid,
                String::from_utf8_lossy(&frame)
            );
            sub.view.read(&self.model, &frame, HISTORY)?;
        }
        Ok(())
    }

    /// The end of a step: fast readers read all they have.
    pub(super) fn settle(&mut self) -> Check {
        for i in 0..self.node.conns.len() {
            match &self.node.conns[i].state {
                State::Sub(sub) if sub.reading == Reading::Fast => self.read(i, usize::MAX)?,
                State::Sub(_) => self.top_up(i),
                State::Parked(_) | State::Committing(_) => {}
            }
        }
        Ok(())
    }

    /// Applies the relay's effects as `net/server/effects.rs` does.
    pub(super) fn apply_effects(&mut self) -> Check {
        self.node.relay.take_effects(&mut self.node.effects);
        while !self.node.effects.is_empty() {
            for effect in std::mem::take(&mut self.node.effects) {
                self.apply(effect)?;
            }
            self.node.relay.take_effects(&mut self.node.effects);
        }
        Ok(())
    }

    pub(super) fn apply(&mut self, effect: Effect) -> Check {
        if !matches!(effect, Effect::Deliver { .. } | Effect::Broadcast { .. }) {
            crate::strace!("effect {effect:?}");
        }
        match effect {
            Effect::Respond { to, status, body } => {
                self.seen.woken += 1;
                self.answer_parked(to, status, &body)
            }
            Effect::Deliver {
                sid,
                seq,
                prev,
                frame,
            } => {
                let mut lagged = 0;
                self.each_sub(&sid, |sub| lagged += deliver(sub, seq, prev, &frame));
                self.seen.lagged += lagged;
                Ok(())
            }
            Effect::Broadcast { sid, frame } => {
                self.each_sub(&sid, |sub| broadcast(sub, &frame));
                Ok(())
            }
            Effect::Refill { sid, resync } => {
                self.each_sub(&sid, |sub| {
                    if resync {
                        sub.cursor.owe_resync();
                    }
                    sub.lagging = true;
                });
                Ok(())
            }
            Effect::CloseSubscriber { to, .. } => {
                let Some(i) = self.node.conns.iter().position(|c| c.id == to) else {
                    return Err(format!("a close for {to:?}, no such subscriber"));
                };
                let State::Sub(sub) = &self.node.conns[i].state else {
                    return Err(format!("a close for {to:?}, not a subscriber"));
                };
                if self.model.incs[sub.view.inc].alive {
                    return Err(format!(
                        "a subscriber of {} closed, the session is there",
                        sub.sid
                    ));
                }
                self.seen.closed_by_delete += 1;
                // What was queued before the close is read first.
                let n = sub.out.len();
                self.read(i, n)?;
                self.drop_sub(i);
                Ok(())
            }
            Effect::Reply { to, result } => {
                let (status, body) = match result {
                    Ok(body) => (200, body),
                    Err(e) => (e.status, e.body()),
                };
                self.ticket_answered(to, status, &body)
            }
            Effect::Retry { to } => self.retry(to),
        }
    }

    /// The request waiting on `to`, taken off its connection.
    fn committing(&mut self, to: Ticket) -> Option<(ConnId, Box<Committing>)> {
        let i = self
            .node
            .conns
            .iter()
            .position(|c| matches!(&c.state, State::Committing(w) if w.ticket == to))?;
        let conn = self.node.conns.swap_remove(i);
        match conn.state {
            State::Committing(w) => Some((conn.id, w)),
            _ => None,
        }
    }

    /// A ticket's answer: its request's, once, and the outcome its own
    /// command was decided with. One whose request was answered `503` at
    /// its timeout (cancelled, never to be committed) is dropped, as the
    /// shell drops it, and must not say it stored anything.
    fn ticket_answered(&mut self, to: Ticket, status: u16, body: &[u8]) -> Check {
        if self.shared.is_some() {
            let Some((id, w)) = self.committing(to) else {
                return Err(format!("ticket {} answered, nobody waits on it", to.n));
            };
            self.release(id);
            self.count(status);
            return match &w.waits {
                Waits::Write(op) => self.check_shared(op, status, body),
                Waits::Read {
                    raw,
                    sid: Some(sid),
                    since,
                    ..
                } if raw.starts_with("GET /messages") => self.messages(sid, status, body, *since),
                _ => Ok(()),
            };
        }
        let Some((id, w)) = self.committing(to) else {
            let abandoned = self
                .storage
                .as_ref()
                .is_some_and(|st| st.abandoned.contains(&to.n));
            if !abandoned {
                return Err(format!("ticket {} answered, nobody waits on it", to.n));
            }
            if status == 200 {
                return Err(format!(
                    "ticket {}: a write answered 503 at its timeout was stored",
                    to.n
                ));
            }
            return self.check_ticket(to.n, status, body);
        };
        self.check_ticket(to.n, status, body)?;
        self.release(id);
        self.count(status);
        match &w.waits {
            Waits::Write(op) => self.answered(op, status, body),
            Waits::Read { .. } | Waits::Upgrade { .. } => Ok(()),
        }
    }

    /// The session an upgrade or a read waited for is in the log now (or
    /// known not to exist): it runs again, as the shell reruns a request
    /// without a body. An all-sessions poll waits on no command, but on
    /// the start's reading.
    fn retry(&mut self, to: Ticket) -> Check {
        // Answered `503` at its timeout, and its connection moved on: the
        // shell finds no request waiting on the ticket, and drops it.
        let waiting = self
            .node
            .conns
            .iter()
            .any(|c| matches!(&c.state, State::Committing(w) if w.ticket == to));
        if !waiting
            && self
                .storage
                .as_ref()
                .is_some_and(|st| st.abandoned.contains(&to.n))
        {
            return Ok(());
        }
        let every = self.node.conns.iter().any(|c| {
            matches!(&c.state, State::Committing(w)
                if w.ticket == to && matches!(w.waits, Waits::Read { sid: None, .. }))
        });
        if let Some(st) = &mut self.storage
            && !every
            && !st.reads.remove(&to.n)
        {
            match st.expected.remove(&to.n) {
                Some(storage::Expect::Ok(_)) => {}
                e => return Err(format!("ticket {} run again, decided {e:?}", to.n)),
            }
        }
        let Some((id, w)) = self.committing(to) else {
            return Ok(()); // answered at its timeout: dropped
        };
        let outcome = match &w.waits {
            Waits::Upgrade { raw, .. } | Waits::Read { raw, .. } => {
                self.request(id, raw.clone().as_bytes(), true)?
            }
            // A part whose session was read after its requester's
            // timeout (the relay dropped it then): a request with a body
            // cannot run again, and is answered `503`, never stored.
            Waits::Write(Op::Part { .. }) => {
                self.release(id);
                self.count(503);
                return Ok(());
            }
            Waits::Write(_) => return Err(format!("ticket {}: a write told to run again", to.n)),
        };
        match w.waits {
            Waits::Read {
                raw,
                sid,
                after,
                since,
            } => {
                if self.shared.is_none() || !raw.starts_with("GET /messages") {
                    return self.polled(id, outcome, raw, sid, after);
                }
                match outcome {
                    Outcome::Answer(a) => {
                        self.release(id);
                        let sid = sid.unwrap_or_default();
                        self.messages(&sid, a.status, a.body.bytes(), since)
                    }
                    Outcome::Wait => {
                        let waits = Waits::Read {
                            raw,
                            sid,
                            after,
                            since,
                        };
                        self.wait(id, waits)
                    }
                    other => Err(format!("messages answered {other:?}")),
                }
            }
            waits => self.upgraded(id, outcome, waits),
        }
    }

    pub(super) fn each_sub(&mut self, sid: &str, mut f: impl FnMut(&mut Sub)) {
        let order: Vec<ConnId> = self.node.relay.subscribers(sid).to_vec();
        for id in order {
            if let Some(c) = self.node.conns.iter_mut().find(|c| c.id == id)
                && let State::Sub(sub) = &mut c.state
            {
                f(sub);
            }
        }
    }

    /// Moves the clock on by `ms`, firing every deadline on the way in
    /// order: parked requests, the relay's tick (drafts, agents), the
    /// idle sweep.
    pub(super) fn advance(&mut self, ms: u64) -> Check {
        let end = self.now.after_ms(ms);
        let nodes = if self.shared.is_some() {
            shared::NODES
        } else {
            1
        };
        loop {
            // The relay whose deadline comes first.
            let mut first: Option<(Millis, usize)> = None;
            for n in 0..nodes {
                self.enter(n);
                if let Some(t) = self.next_deadline().filter(|t| *t <= end)
                    && first.is_none_or(|(f, _)| t < f)
                {
                    first = Some((t, n));
                }
            }
            let Some((at, n)) = first else {
                self.now = end;
                return Ok(());
            };
            self.enter(n);
            self.now = self.now.max(at);
            self.node.relay.set_clock(self.now, self.unix());
            self.fire()?;
            self.apply_effects()?;
            self.settle()?;
            self.check()?;
        }
    }

    /// The relay's next deadline: a parked request's, its tick's, the
    /// idle sweep's.
    fn next_deadline(&self) -> Option<Millis> {
        let parked = self
            .node
            .conns
            .iter()
            .filter_map(|c| match &c.state {
                State::Parked(p) => Some(p.deadline),
                State::Committing(w) => Some(w.deadline),
                State::Sub(_) => None,
            })
            .min();
        [
            parked,
            self.node.relay.next_tick(),
            Some(self.node.next_sweep),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Every deadline due now.
    pub(super) fn fire(&mut self) -> Check {
        let now = self.now;
        while let Some(i) = self
            .node
            .conns
            .iter()
            .position(|c| matches!(&c.state, State::Parked(p) if p.deadline <= now))
        {
            self.ops += 1;
            let State::Parked(p) = &self.node.conns[i].state else {
                continue;
            };
            let (status, body) = match (&p.ask, &p.sid) {
                (Some((ask, expires_at, expires_ts)), Some(sid)) => {
                    let mut unix = self.unix();
                    if now >= *expires_at {
                        unix = unix.max(*expires_ts);
                    }
                    self.node.relay.ask_deadline(now, unix, sid, ask)
                }
                _ => (200, Rc::from(&b"[]"[..])),
            };
            let id = self.node.conns[i].id;
            self.seen.timed_out += 1;
            self.answer_parked(id, status, &body)?;
            self.apply_effects()?;
        }
        self.store_timeouts()?;
        if self.node.relay.next_tick().is_some_and(|t| now >= t) {
            self.ops += 1;
            self.seen.ticks += 1;
            self.node.relay.tick(now);
        }
        if now >= self.node.next_sweep {
            self.ops += 1;
            self.node.relay.collect_idle(now);
            self.node.next_sweep = now.after_ms(self.sweep_ms);
            if self.alone() {
                self.collected()?;
            }
            self.apply_effects()?;
            // The sweep's collection goes to the storage at the turn's end.
            self.node.relay.flush_store();
        }
        Ok(())
    }

    /// Requests whose storage timeout passed (`parked::commit_timed_out`):
    /// a write the storage has not taken is cancelled and answered `503`;
    /// one it holds is waited for another timeout.
    fn store_timeouts(&mut self) -> Check {
        let now = self.now;
        while let Some(i) = self
            .node
            .conns
            .iter()
            .position(|c| matches!(&c.state, State::Committing(w) if w.deadline <= now))
        {
            self.ops += 1;
            let State::Committing(w) = &mut self.node.conns[i].state else {
                continue;
            };
            let ticket = w.ticket;
            match self.node.relay.abandon(ticket) {
                Abandon::InFlight => w.deadline = now.after_ms(STORE_TIMEOUT_MS),
                Abandon::Cancelled => {
                    let conn = self.node.conns.swap_remove(i);
                    self.release(conn.id);
                    self.seen.store_timeouts += 1;
                    if let Some(st) = &mut self.storage {
                        st.abandoned.insert(ticket.n);
                    }
                }
            }
        }
        Ok(())
    }

    /// After the idle sweep: a session is gone only if nobody waited on
    /// it and it was written no later than the TTL ago; one nobody
    /// touched for the TTL is gone.
    pub(super) fn collected(&mut self) -> Check {
        for s in 0..SESSIONS {
            let sid = sid_of(s);
            let Some(i) = self.model.live(&sid) else {
                continue;
            };
            let held = self.node.conns.iter().any(|c| self.holds(c, &sid));
            let inc = &self.model.incs[i];
            let gone = !self.node.relay.has_session(&sid);
            if gone && (held || self.now.since(inc.last_write) < TTL_MS) {
                return Err(format!(
                    "{sid} collected {} ms after its last write, held: {held}",
                    self.now.since(inc.last_write)
                ));
            }
            if !gone && !held && self.now.since(inc.last_touch) >= TTL_MS {
                return Err(format!(
                    "{sid} kept {} ms after it was last touched",
                    self.now.since(inc.last_touch)
                ));
            }
            if gone {
                self.seen.collected += 1;
                self.model.end(&sid);
            }
        }
        Ok(())
    }
}

/// A new stored message for one subscriber (`subscriber::deliver`).
fn deliver(sub: &mut Sub, seq: Seq, prev: Seq, frame: &Rc<[u8]>) -> u64 {
    if sub.lagging {
        return 0;
    }
    match sub.cursor.live(seq, prev) {
        Live::Skip => {}
        Live::Next if sub.out.is_empty() || sub.queued + frame.len() <= SUB_BUFFER => {
            sub.queued += frame.len();
            sub.out.push_back(frame.clone());
            sub.cursor.advance(seq);
        }
        Live::Next | Live::Behind => {
            sub.lagging = true;
            return 1;
        }
    }
    0
}

/// A live frame for one subscriber (`subscriber::broadcast`).
fn broadcast(sub: &mut Sub, frame: &Rc<[u8]>) {
    if sub.lagging {
        return;
    }
    if sub.out.is_empty() || sub.queued + frame.len() <= SUB_BUFFER {
        sub.queued += frame.len();
        sub.out.push_back(frame.clone());
    } else {
        sub.lagging = true;
    }
}
