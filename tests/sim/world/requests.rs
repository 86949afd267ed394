//! The clients' requests of the simulated world, each checked against
//! the model as it is answered: a write acknowledged joins the model
//! with the `seq` it must have taken, a resend must name a stored one,
//! a read must show what the model has.

use super::*;

impl World {
    /// The step's own work (its checks follow in [`World::step`]).
    pub(super) fn act(&mut self, op: &Op) -> Check {
        if let Some(raw) = write_request(op) {
            if let Some((status, body)) = self.send(op, &raw)? {
                self.answered(op, status, &body)?;
            }
            return Ok(());
        }
        match *op {
            Op::Poll {
                s,
                after,
                timeout_s,
            } => {
                // `after` names a pending prompt's seq, or the log's end.
                let after = after.and_then(|a| {
                    let inc = &self.model.incs[self.model.live(&sid_of(s))?];
                    Some(inc.pending.get(a as usize).map_or(inc.next_seq(), |p| p.0))
                });
                let q = after.map_or(String::new(), |a| format!("&after={a}"));
                let raw = format!(
                    "GET /prompts/s{s}?timeout={timeout_s}{q} HTTP/1.1\r\nHost: sim\r\n\r\n"
                );
                self.poll(raw, Some(sid_of(s)), after)
            }
            Op::PollNow { s } => {
                let raw = format!("GET /prompts/s{s}?wait=false HTTP/1.1\r\nHost: sim\r\n\r\n");
                self.poll(raw, Some(sid_of(s)), None)
            }
            Op::PollEvery { timeout_s } => {
                let raw = format!("GET /prompts?timeout={timeout_s} HTTP/1.1\r\nHost: sim\r\n\r\n");
                self.poll(raw, None, None)
            }
            Op::AskPoll { s, ask, timeout_s } => {
                let raw = format!(
                    "GET /asks/s{s}/k{ask}?timeout={timeout_s} HTTP/1.1\r\nHost: sim\r\n\r\n"
                );
                self.poll(raw, Some(sid_of(s)), None)
            }
            Op::Hangup { pick } => {
                self.hang_up(pick);
                Ok(())
            }
            Op::Subscribe { s, resume, reading } => self.subscribe(s, resume, reading),
            Op::Read { pick, frames } => match self.pick_sub(pick) {
                Some(i) => self.read(i, frames as usize),
                None => Ok(()),
            },
            Op::SetReading { pick, reading } => {
                if let Some(i) = self.pick_sub(pick)
                    && let State::Sub(sub) = &mut self.node.conns[i].state
                {
                    sub.reading = reading;
                }
                Ok(())
            }
            Op::Unsubscribe { pick } => {
                if let Some(i) = self.pick_sub(pick) {
                    self.drop_sub(i);
                }
                Ok(())
            }
            Op::Messages { s } => {
                let raw = format!("GET /messages/s{s}?limit=1000 HTTP/1.1\r\nHost: sim\r\n\r\n");
                if self.shared.is_none() {
                    return self.poll(raw, Some(sid_of(s)), None);
                }
                match self.send(op, &raw)? {
                    Some((status, body)) => self.messages(&sid_of(s), status, &body, None),
                    None => Ok(()),
                }
            }
            Op::Storage { take, fail } if self.shared.is_some() => self.redis(take, fail),
            Op::Storage { take, fail } => self.storage(take, fail),
            Op::Advance { ms } => self.advance(ms),
            Op::Restart { lose } => self.restart(lose),
            _ => Ok(()),
        }
    }

    /// A write's answer, now or once its ticket is answered. With a
    /// storage, the model follows its commits, and the answer must be the
    /// outcome its own command was decided with (checked by ticket); a
    /// write answered now was decided on the loop's copy (a part, a
    /// session that exists, a deletion of one that does not).
    pub(super) fn answered(&mut self, op: &Op, status: u16, body: &[u8]) -> Check {
        if !self.alone() {
            return Ok(());
        }
        match *op {
            Op::Prompt { s, id, .. } => self.prompt(s, id, status, body),
            Op::Answer { s, prompt, .. } => self.answer(s, prompt, status, body),
            Op::Part { .. } => {
                if status == 200 && json(body)?["partial"] != true {
                    return Err("a part acknowledged as a whole answer".to_string());
                }
                Ok(())
            }
            Op::Cancel { s, prompt } => {
                let cid = format!("c{prompt}");
                if self.numbered(s, status, body, Kind::Cancel, &cid)? {
                    self.inc(s)?.unpend(&cid);
                }
                Ok(())
            }
            Op::Ask { s, id, .. } => {
                self.learn(&sid_of(s))?;
                self.numbered(s, status, body, Kind::Ask, &format!("k{id}"))?;
                Ok(())
            }
            Op::Reply { s, ask, .. } => {
                self.numbered(s, status, body, Kind::Reply, &format!("k{ask}"))?;
                Ok(())
            }
            Op::Put { s } => self.put(s, status, body),
            Op::Delete { s } => self.delete(s, status),
            _ => Ok(()),
        }
    }

    /// `POST /prompt`: a new prompt takes the next `seq` and is pending;
    /// a resend must name a stored one.
    fn prompt(&mut self, s: u64, id: u64, status: u16, body: &[u8]) -> Check {
        self.learn(&sid_of(s))?;
        if status != 200 {
            return Ok(());
        }
        let v = json(body)?;
        let now = self.now;
        let inc = self.inc(s)?;
        let cid = format!("c{id}");
        if v["duplicate"] == true {
            if !inc
                .entries
                .iter()
                .any(|e| e.kind == Kind::Prompt && e.id == cid)
            {
                return Err(format!("prompt {cid} acknowledged as a resend of nothing"));
            }
        } else {
            let seq = inc.push(Kind::Prompt, &cid);
            inc.pending.push((seq, cid));
            inc.last_write = now;
        }
        Ok(())
    }

    /// `POST /response`: a new answer takes the next `seq`, answers its
    /// prompt, and says `delivered` exactly when a subscriber is there.
    fn answer(&mut self, s: u64, prompt: u64, status: u16, body: &[u8]) -> Check {
        if status != 200 {
            return Ok(());
        }
        let v = json(body)?;
        let subscribed = self.subscribers_of(&sid_of(s)) > 0;
        let now = self.now;
        let inc = self.inc(s)?;
        let aid = v["assistant_msg_id"].as_str().unwrap_or("").to_string();
        if v["duplicate"] == true {
            if !inc
                .entries
                .iter()
                .any(|e| e.kind == Kind::Assistant && e.id == aid)
            {
                return Err(format!("answer {aid} acknowledged as a resend of nothing"));
            }
            return Ok(());
        }
        inc.push(Kind::Assistant, &aid);
        inc.unpend(&format!("c{prompt}"));
        inc.last_write = now;
        if v["delivered"] != subscribed {
            return Err(format!(
                "answer {aid} delivered={} with {} subscribers",
                v["delivered"], subscribed as u8
            ));
        }
        Ok(())
    }

    /// A write whose answer carries its `seq` (cancel, ask, reply); true
    /// when it stored something new.
    fn numbered(
        &mut self,
        s: u64,
        status: u16,
        body: &[u8],
        kind: Kind,
        id: &str,
    ) -> Result<bool, String> {
        if status != 200 {
            return Ok(false);
        }
        let v = json(body)?;
        let seq = v["seq"].as_u64().unwrap_or(0);
        let duplicate = v["duplicate"] == true;
        self.written(s, seq, duplicate, kind, id)?;
        Ok(!duplicate)
    }

    /// `PUT /sessions`: `created` exactly when the model had no session,
    /// under the epoch the relay keeps.
    fn put(&mut self, s: u64, status: u16, body: &[u8]) -> Check {
        let sid = sid_of(s);
        let was_new = self.model.live(&sid).is_none();
        self.learn(&sid)?;
        if status != 200 {
            return Ok(());
        }
        let v = json(body)?;
        if v["created"] != was_new {
            return Err(format!(
                "PUT answered created={} where it was {was_new}",
                v["created"]
            ));
        }
        if v["epoch"] != *self.inc(s)?.epoch {
            return Err("PUT answered another epoch".to_string());
        }
        Ok(())
    }

    /// `DELETE /sessions`: `200` exactly when the session existed, and
    /// then nothing of it is left waiting here.
    fn delete(&mut self, s: u64, status: u16) -> Check {
        let sid = sid_of(s);
        let existed = self.model.live(&sid).is_some();
        if (status == 200) != existed {
            return Err(format!(
                "DELETE answered {status} where the session existed: {existed}"
            ));
        }
        if status == 200 {
            self.model.end(&sid);
        }
        self.apply_effects()?;
        if status == 200 && self.node.conns.iter().any(|c| self.holds(c, &sid)) {
            return Err(format!("{sid} deleted, a poll or subscriber of it left"));
        }
        Ok(())
    }

    /// A write acknowledged with its `seq`: a new one takes the next, a
    /// resend names the stored one.
    fn written(&mut self, s: u64, seq: u64, duplicate: bool, kind: Kind, id: &str) -> Check {
        let now = self.now;
        let inc = self.inc(s)?;
        if duplicate {
            return match inc.entry(seq) {
                Some(e) if e.kind == kind && e.id == id => Ok(()),
                e => Err(format!(
                    "{kind:?} {id} a resend of seq {seq}, which is {e:?}"
                )),
            };
        }
        if seq != inc.next_seq() {
            return Err(format!(
                "{kind:?} {id} stored at seq {seq}, the next is {}",
                inc.next_seq()
            ));
        }
        inc.push(kind, id);
        inc.last_write = now;
        Ok(())
    }

    fn inc(&mut self, s: u64) -> Result<&mut crate::model::Inc, String> {
        let sid = sid_of(s);
        self.model
            .inc_mut(&sid)
            .ok_or_else(|| format!("a write to {sid} acknowledged, the session unknown"))
    }

    /// `GET /messages`: the history the model says, with its epoch. With
    /// a shared store, a run of the history of one of the session's
    /// lives, reaching what the store held when the read began (`since`:
    /// that life, and its next `seq` then) if it is that life's.
    pub(super) fn messages(
        &mut self,
        sid: &str,
        status: u16,
        body: &[u8],
        since: Option<(usize, u64)>,
    ) -> Check {
        let sid = sid.to_string();
        if self.shared.is_some() {
            return self.messages_shared(&sid, status, body, since);
        }
        let Some(i) = self.model.live(&sid) else {
            return if status == 404 {
                Ok(())
            } else {
                Err(format!(
                    "messages of {sid} answered {status}, the session unknown"
                ))
            };
        };
        let v = json(body)?;
        let inc = &self.model.incs[i];
        if v["epoch"] != *inc.epoch {
            return Err(format!("messages of {sid} under another epoch"));
        }
        let got = seqs_of(&v);
        let want: Vec<u64> = (inc.first_retained(HISTORY)..inc.next_seq()).collect();
        if got != want {
            return Err(format!(
                "messages of {sid}: seqs {got:?}, the model has {want:?}"
            ));
        }
        Ok(())
    }
}

impl World {
    fn messages_shared(
        &mut self,
        sid: &str,
        status: u16,
        body: &[u8],
        since: Option<(usize, u64)>,
    ) -> Check {
        let alive_since = since.filter(|(i, _)| self.model.incs[*i].alive);
        if status == 404 {
            return match alive_since {
                Some(_) => Err(format!(
                    "messages of {sid} answered 404, the session is there"
                )),
                None => Ok(()),
            };
        }
        if status != 200 {
            return Ok(());
        }
        let v = json(body)?;
        let epoch = v["epoch"].as_str().unwrap_or("");
        let i = self
            .model
            .life_of(sid, epoch)
            .ok_or_else(|| format!("messages of {sid} under epoch {epoch}, which no life had"))?;
        let inc = &self.model.incs[i];
        let got = seqs_of(&v);
        let end = got.last().map_or(0, |l| l + 1);
        if got.iter().zip(got.iter().skip(1)).any(|(a, b)| a + 1 != *b) || end > inc.next_seq() {
            return Err(format!(
                "messages of {sid}: seqs {got:?}, the store has {} messages",
                inc.next_seq() - 1
            ));
        }
        if let Some((j, next)) = since
            && j == i
            && end.max(got.first().copied().unwrap_or(1)) < next
        {
            return Err(format!(
                "messages of {sid}: seqs {got:?}, where {} messages were stored before the read",
                next - 1
            ));
        }
        Ok(())
    }
}

/// The request of a write step, if the step is one.
fn write_request(op: &Op) -> Option<String> {
    let (path, body) = match *op {
        Op::Prompt { s, id, text } => (
            "/prompt",
            format!(r#"{{"session_id":"s{s}","client_msg_id":"c{id}","prompt":"t{text}"}}"#),
        ),
        Op::Answer {
            s,
            prompt,
            id,
            text,
        } => {
            let aid = id.map_or(String::new(), |i| format!(r#","assistant_msg_id":"a{i}""#));
            (
                "/response",
                format!(
                    r#"{{"session_id":"s{s}","client_msg_id":"c{prompt}","text":"t{text}"{aid}}}"#
                ),
            )
        }
        Op::Part {
            s,
            prompt,
            id,
            text,
        } => (
            "/response",
            format!(
                r#"{{"session_id":"s{s}","client_msg_id":"c{prompt}","assistant_msg_id":"a{id}","text":"t{text}","partial":true}}"#
            ),
        ),
        Op::Cancel { s, prompt } => (
            "/cancel",
            format!(r#"{{"session_id":"s{s}","client_msg_id":"c{prompt}"}}"#),
        ),
        Op::Ask { s, id, text } => (
            "/ask",
            format!(r#"{{"session_id":"s{s}","ask_id":"k{id}","text":"q{text}","timeout":5}}"#),
        ),
        Op::Reply { s, ask, text } => (
            "/reply",
            format!(r#"{{"session_id":"s{s}","ask_id":"k{ask}","text":"r{text}"}}"#),
        ),
        Op::Put { s } => {
            return Some(format!(
                "PUT /sessions/s{s} HTTP/1.1\r\nHost: sim\r\nContent-Length: 0\r\n\r\n"
            ));
        }
        Op::Delete { s } => {
            return Some(format!(
                "DELETE /sessions/s{s} HTTP/1.1\r\nHost: sim\r\n\r\n"
            ));
        }
        _ => return None,
    };
    Some(format!(
        "POST {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ))
}

/// The `seq` of each message of a `/messages` page, in order.
fn seqs_of(page: &serde_json::Value) -> Vec<u64> {
    page["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| m["data"]["seq"].as_u64().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}
