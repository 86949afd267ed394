//! Which sessions the relay's log holds, with a data directory and a
//! small budget: the world ends each step as the loop ends its turn
//! (`Relay::evict`, then the turn's writes sent), and checks that the
//! sessions dropped were held by nothing, that a session known by id
//! only is the one the storage holds (the model's, unchanged since it
//! left), and that a session is in the log or known by id, never both.
//! And the relay restarts: a new one on the same storage, which reads
//! no session at start (only, as its first command, those with pending
//! prompts whole and the others' ids).

use super::*;

/// What outlives a restart of the relay.
pub(super) struct Run {
    cfg: Config,
    /// The relay's read-backs when last looked at.
    loads: u64,
}

impl Run {
    pub(super) fn new(cfg: &Config) -> Run {
        Run {
            cfg: cfg.clone(),
            loads: 0,
        }
    }
}

impl World {
    /// The end of a loop turn: sessions nothing holds dropped past the
    /// budget. Each one dropped must have been held by nothing: no parked
    /// poll or `GET /asks`, no subscriber, no open draft, no write in
    /// flight, no pending prompt (the all-sessions poll reads those from
    /// the log). A read waiting for its session (and a part, which waits
    /// for one as a read does) holds nothing: its read brings it back.
    pub(super) fn end_turn(&mut self) -> Check {
        let resident: Vec<bool> = (0..self.sessions)
            .map(|s| self.node.relay.peek(&sid_of(s)).is_some())
            .collect();
        let dropped = self.node.relay.evict(self.now);
        if dropped == 0 {
            return Ok(());
        }
        self.seen.evicted += dropped as u64;
        for s in 0..self.sessions {
            let sid = sid_of(s);
            if !resident[s as usize] || self.node.relay.peek(&sid).is_some() {
                continue;
            }
            let writing = self.node.conns.iter().find_map(|c| match &c.state {
                State::Committing(c) => match &c.waits {
                    // A part waits for its session's read, as a read
                    // does: the read brings the session back.
                    Waits::Write(op)
                        if op.session() == Some(s) && !matches!(op, Op::Part { .. }) =>
                    {
                        Some(format!("{op} (ticket {})", c.ticket.n))
                    }
                    _ => None,
                },
                _ => None,
            });
            let pending = self
                .model
                .live(&sid)
                .is_some_and(|i| !self.model.incs[i].pending.is_empty());
            if writing.is_some() || pending || self.node.relay.drafting(&sid) {
                return Err(format!(
                    "{sid} dropped from memory while held (a write in flight: {writing:?}, \
                     pending prompts: {pending}, a draft: {})",
                    self.node.relay.drafting(&sid)
                ));
            }
        }
        Ok(())
    }

    /// Every session against the model: the relay's log where it holds
    /// it; where it knows it by id only, the storage's (what a read-back
    /// brings), and nothing here may be waiting on it.
    pub(super) fn check_sessions(&mut self) -> Check {
        let loads = self.node.relay.stats().session_loads;
        self.seen.read_back += loads.saturating_sub(self.run.loads);
        self.run.loads = loads;
        // While the start's reading is under way, a session may be
        // neither in the log nor known by id yet.
        let warming = self.node.relay.engine().warming();
        for s in 0..self.sessions {
            let sid = sid_of(s);
            let dormant = self.node.relay.dormant(&sid);
            let unread =
                warming && self.node.relay.peek(&sid).is_none() && self.model.live(&sid).is_some();
            if !dormant && !unread {
                self.model.compare(&self.node.relay, &sid, HISTORY)?;
                continue;
            }
            if self.node.relay.peek(&sid).is_some() {
                return Err(format!("{sid} is in the log and known by id only"));
            }
            if self.model.live(&sid).is_none() {
                return Err(format!(
                    "{sid} is known by id, the model has no such session"
                ));
            }
            let Some(st) = &self.storage else {
                return Err(format!("{sid} dropped from memory by the memory engine"));
            };
            self.model.compare_log(st.copy.get(&sid), &sid, HISTORY)?;
            if let Some(c) = self.node.conns.iter().find(|c| self.holds(c, &sid)) {
                let what = match c.state {
                    State::Parked(_) => "a parked request",
                    _ => "a subscriber",
                };
                return Err(format!(
                    "{sid} dropped from memory while {what} waits on it"
                ));
            }
            if self.node.relay.drafting(&sid) {
                return Err(format!("{sid} dropped from memory with a draft open"));
            }
            if dormant
                && self
                    .model
                    .inc_mut(&sid)
                    .is_some_and(|i| !i.pending.is_empty())
            {
                return Err(format!("{sid} dropped from memory with prompts pending"));
            }
        }
        Ok(())
    }

    /// The relay restarts on the storage it had: every connection is
    /// closed (a subscriber's client keeps where it stopped, to resume
    /// from), what the storage had not committed is lost, and the new
    /// relay's first command is the start's reading. With `lose`, the last
    /// `lose` committed transactions are lost too (with the write-ahead
    /// log), and the start decides what to do about it as `open` does.
    pub(super) fn restart(&mut self, lose: u64) -> Check {
        let Some(st) = &mut self.storage else {
            return Ok(());
        };
        self.ops += 1;
        self.seen.restarts += 1;
        let limits = self.run.cfg.relay_limits();
        let (handle, side) = Durable::detached_starting(limits.store());
        st.restart(side);
        if lose > 0 {
            st.lose(lose);
            self.seen.lost_logs += 1;
            self.follow_loss()?;
        }
        if let Some(r) = self.storage.as_mut().and_then(|st| st.recover()) {
            for (sid, epoch) in &r.epochs {
                self.model.renew(sid, epoch, self.now)?;
                self.seen.new_epochs += 1;
            }
        }
        let view = MemStore::new(limits.store());
        let mut relay = Relay::new(limits, view, Engine::Durable(handle));
        relay.set_clock(self.now, self.unix());
        self.node.relay = relay;
        self.node.api = Api::new(&self.run.cfg);
        for c in std::mem::take(&mut self.node.conns) {
            if let State::Sub(sub) = c.state {
                let life = &self.model.incs[sub.view.inc];
                self.node.left.push(Left {
                    sid: sub.sid.to_string(),
                    after: sub.view.last,
                    epoch: life.epoch.clone(),
                });
            }
        }
        let keep = self.node.left.len().saturating_sub(16);
        self.node.left.drain(..keep);
        self.node.idle.clear();
        self.node.effects.clear();
        self.full = false;
        self.node.next_sweep = self.now.after_ms(self.sweep_ms);
        self.run.loads = 0;
        Ok(())
    }

    /// The model follows a lost log: each session as the database now
    /// holds it, its messages after that gone (and remembered, under
    /// their epoch), the life whose deletion was lost back.
    fn follow_loss(&mut self) -> Check {
        let Some(st) = &self.storage else {
            return Ok(());
        };
        for s in 0..self.sessions {
            let sid = sid_of(s);
            let Some(log) = st.copy.get(&sid) else {
                self.model.end(&sid);
                continue;
            };
            let Some(i) = self.model.life_of(&sid, log.epoch()) else {
                return Err(format!(
                    "{sid}: the database holds epoch {}, which no life had",
                    log.epoch()
                ));
            };
            if self.model.live(&sid) != Some(i) {
                self.model.revive(&sid, i);
            }
            let pending = log
                .page_all_pending()
                .map(|m| (m.seq.get(), m.client_msg_id.to_string()))
                .collect();
            self.model.incs[i].cut(log.next_seq().get() - 1, pending);
        }
        Ok(())
    }
}
