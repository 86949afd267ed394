//! What the clients were told, kept apart from the relay: every write
//! acknowledged (with the `seq` it must have taken), the pending prompts,
//! each session's epoch, and what every subscriber's client has read. The
//! relay's committed log is compared with it after every step, read
//! without touching it ([`Relay::peek`]); a subscriber's frames are
//! checked against it as its client reads them.

use std::collections::{HashMap, HashSet};

use relay::relay::Relay;
use relay::store::{Kind, Seq, SessionLog};
use relay::time::Millis;

/// One message the model knows was stored, at `seq = index + 1`.
#[derive(Clone, Debug)]
pub struct Entry {
    pub kind: Kind,
    /// A prompt's or a cancel's `client_msg_id`, an answer's
    /// `assistant_msg_id`, an ask's or a reply's `ask_id`.
    pub id: String,
}

impl Entry {
    /// Whether subscribers get it as a frame (prompts are not sent).
    pub fn framed(&self) -> bool {
        self.kind != Kind::Prompt
    }
}

/// One life of a session: from its creation to its deletion.
#[derive(Debug)]
pub struct Inc {
    pub sid: String,
    pub epoch: String,
    pub entries: Vec<Entry>,
    /// Pending prompts, oldest first: (`seq`, `client_msg_id`).
    pub pending: Vec<(u64, String)>,
    /// The last write acknowledged (the TTL counts from no earlier).
    pub last_write: Millis,
    /// The last request that named the session, or a client of it that
    /// left (the TTL counts from no later).
    pub last_touch: Millis,
    pub alive: bool,
    /// Every message acknowledged under this epoch, by `seq`, when a
    /// lost write-ahead log took the last of them from `entries`: their
    /// `seq`s must not go to other messages under this epoch.
    pub given: Vec<Entry>,
}

impl Inc {
    /// The `seq` the next stored message takes.
    pub fn next_seq(&self) -> u64 {
        self.entries.len() as u64 + 1
    }

    pub fn push(&mut self, kind: Kind, id: &str) -> u64 {
        self.entries.push(Entry {
            kind,
            id: id.to_string(),
        });
        self.entries.len() as u64
    }

    pub fn entry(&self, seq: u64) -> Option<&Entry> {
        seq.checked_sub(1)
            .and_then(|i| self.entries.get(i as usize))
    }

    /// The oldest `seq` history still holds.
    pub fn first_retained(&self, limit: usize) -> u64 {
        self.entries.len().saturating_sub(limit) as u64 + 1
    }

    /// The `seq` of the last prompt stored under `client_msg_id` before
    /// `seq`.
    pub fn prompt_before(&self, seq: u64, client_msg_id: &str) -> Option<u64> {
        let end = (seq as usize).saturating_sub(1).min(self.entries.len());
        self.entries[..end]
            .iter()
            .rposition(|e| e.kind == Kind::Prompt && e.id == client_msg_id)
            .map(|i| i as u64 + 1)
    }

    /// The first framed message after `seq`, if any is stored.
    pub fn next_framed_after(&self, seq: u64) -> Option<u64> {
        (seq as usize..self.entries.len())
            .find(|&i| self.entries[i].framed())
            .map(|i| i as u64 + 1)
    }

    /// Whether a framed message after `seq` was already trimmed: a
    /// subscriber there can only be told with a `resync`.
    pub fn trimmed_after(&self, seq: u64, limit: usize) -> bool {
        self.next_framed_after(seq)
            .is_some_and(|n| n < self.first_retained(limit))
    }

    pub fn unpend(&mut self, client_msg_id: &str) {
        self.pending.retain(|(_, id)| id != client_msg_id);
    }

    /// A message acknowledged at `seq` under this epoch before a lost
    /// log took it, if it is not this one (`kind`, `id`): the `seq` would
    /// name two messages for a client that resumes with `after`.
    pub fn reused(&self, seq: u64, kind: Kind, id: &str) -> Option<&Entry> {
        let e = seq
            .checked_sub(1)
            .and_then(|i| self.given.get(i as usize))?;
        (e.kind != kind || e.id != id).then_some(e)
    }

    /// A lost log took the messages after `last`, and left `pending` the
    /// prompts unanswered.
    pub fn cut(&mut self, last: u64, pending: Vec<(u64, String)>) {
        if self.given.len() < self.entries.len() {
            self.given = self.entries.clone();
        }
        self.entries.truncate(last as usize);
        self.pending = pending;
    }
}

/// Every session's lives, and the epochs ever handed out.
#[derive(Default)]
pub struct Model {
    pub incs: Vec<Inc>,
    /// The live incarnation of each session id.
    pub current: HashMap<String, usize>,
    epochs: HashSet<String>,
}

impl Model {
    pub fn live(&self, sid: &str) -> Option<usize> {
        self.current.get(sid).copied()
    }

    pub fn inc_mut(&mut self, sid: &str) -> Option<&mut Inc> {
        let i = self.live(sid)?;
        Some(&mut self.incs[i])
    }

    /// The relay created `sid` under `epoch`: a new life, whose epoch no
    /// earlier one had.
    pub fn create(&mut self, sid: &str, epoch: &str, now: Millis) -> Result<usize, String> {
        if !self.epochs.insert(epoch.to_string()) {
            return Err(format!("{sid} created again under an old epoch {epoch}"));
        }
        self.incs.push(Inc {
            sid: sid.to_string(),
            epoch: epoch.to_string(),
            entries: Vec::new(),
            pending: Vec::new(),
            last_write: now,
            last_touch: now,
            alive: true,
            given: Vec::new(),
        });
        let i = self.incs.len() - 1;
        self.current.insert(sid.to_string(), i);
        Ok(i)
    }

    /// `sid` is gone (deleted, or collected).
    pub fn end(&mut self, sid: &str) {
        if let Some(i) = self.current.remove(sid) {
            self.incs[i].alive = false;
        }
    }

    /// After a lost log, `sid`'s life is life `i` again (its deletion, or
    /// the creation of the one after it, was lost).
    pub fn revive(&mut self, sid: &str, i: usize) {
        self.end(sid);
        self.incs[i].alive = true;
        self.current.insert(sid.to_string(), i);
    }

    /// `sid` goes on under a new epoch, everything it holds kept: a new
    /// life, its `seq`s those of the last.
    pub fn renew(&mut self, sid: &str, epoch: &str, now: Millis) -> Result<(), String> {
        let Some(old) = self.live(sid) else {
            return Err(format!(
                "{sid} given a new epoch, the model has no such session"
            ));
        };
        self.end(sid);
        let new = self.create(sid, epoch, now)?;
        let (entries, pending) = (
            self.incs[old].entries.clone(),
            self.incs[old].pending.clone(),
        );
        let (last_write, last_touch) = (self.incs[old].last_write, self.incs[old].last_touch);
        let inc = &mut self.incs[new];
        inc.entries = entries;
        inc.pending = pending;
        inc.last_write = last_write;
        inc.last_touch = last_touch;
        Ok(())
    }

    /// The relay's committed log of `sid` against the model's: the same
    /// epoch, the next `seq`, history (the last `limit` messages, kind,
    /// `seq` and id each) and pending set.
    pub fn compare(&self, relay: &Relay, sid: &str, limit: usize) -> Result<(), String> {
        self.compare_log(relay.peek(sid), sid, limit)
    }

    /// [`compare`](Self::compare) with the log `log` of `sid`, wherever
    /// it is held (the storage's own, for a session the relay dropped).
    pub fn compare_log(
        &self,
        log: Option<&SessionLog>,
        sid: &str,
        limit: usize,
    ) -> Result<(), String> {
        let (log, i) = match (log, self.live(sid)) {
            (None, None) => return Ok(()),
            (Some(_), None) => return Err(format!("{sid} exists, the model has no such session")),
            (None, Some(_)) => return Err(format!("{sid} is gone, the model still has it")),
            (Some(log), Some(i)) => (log, i),
        };
        let inc = &self.incs[i];
        if *log.epoch() != *inc.epoch {
            return Err(format!(
                "{sid}: epoch {} where {} was",
                log.epoch(),
                inc.epoch
            ));
        }
        if log.next_seq() != Seq(inc.next_seq()) {
            return Err(format!(
                "{sid}: next seq {} where the model says {} (stored {:?})",
                log.next_seq().get(),
                inc.next_seq(),
                log.history().map(|m| m.seq.get()).collect::<Vec<_>>()
            ));
        }
        let mut want = inc.first_retained(limit);
        for m in log.history() {
            let Some(e) = inc.entry(want) else {
                return Err(format!(
                    "{sid}: history holds seq {} beyond the model",
                    m.seq.get()
                ));
            };
            let id: &str = match m.kind {
                Kind::Assistant => m.assistant_msg_id.as_deref().unwrap_or(""),
                _ => &m.client_msg_id,
            };
            if m.seq.get() != want || m.kind != e.kind || id != e.id {
                return Err(format!(
                    "{sid}: history has {:?} {id} at seq {} where the model has {:?} {} at seq {want}",
                    m.kind,
                    m.seq.get(),
                    e.kind,
                    e.id
                ));
            }
            if m.frame().is_some() != e.framed() {
                return Err(format!("{sid}: seq {want} framed wrongly"));
            }
            want += 1;
        }
        if want != inc.next_seq() {
            return Err(format!(
                "{sid}: history ends before seq {want}, the model has {}",
                inc.next_seq() - 1
            ));
        }
        let pending: Vec<(u64, &str)> = log
            .page_all_pending()
            .map(|m| (m.seq.get(), &*m.client_msg_id))
            .collect();
        let model: Vec<(u64, &str)> = inc.pending.iter().map(|(s, id)| (*s, &**id)).collect();
        if pending != model {
            return Err(format!(
                "{sid}: pending {pending:?}, the model has {model:?}"
            ));
        }
        Ok(())
    }
}

impl Model {
    /// The life of `sid` whose epoch is `epoch`, if one had it.
    pub fn life_of(&self, sid: &str, epoch: &str) -> Option<usize> {
        self.incs
            .iter()
            .rposition(|i| i.sid == sid && *i.epoch == *epoch)
    }

    /// A relay's copy of `sid`, with a shared store: it may lag what the
    /// store decided, never hold anything else. Its epoch is one of the
    /// session's lives, its next `seq` no further than that life's, and
    /// every message it holds is that life's at its `seq`, a prompt it
    /// holds pending one of the life's prompts.
    pub fn compare_copy(&self, relay: &Relay, sid: &str, limit: usize) -> Result<(), String> {
        let Some(log) = relay.peek(sid) else {
            return Ok(());
        };
        let Some(i) = self.life_of(sid, log.epoch()) else {
            return Err(format!(
                "{sid}: a copy under epoch {}, which no life had",
                log.epoch()
            ));
        };
        let inc = &self.incs[i];
        if log.next_seq().get() > inc.next_seq() {
            return Err(format!(
                "{sid}: the copy's next seq is {}, the store's {}",
                log.next_seq().get(),
                inc.next_seq()
            ));
        }
        let mut want = log.first_seq().get();
        if log.history().count() > limit {
            return Err(format!("{sid}: the copy's history holds more than {limit}"));
        }
        for m in log.history() {
            let id: &str = match m.kind {
                Kind::Assistant => m.assistant_msg_id.as_deref().unwrap_or(""),
                _ => &m.client_msg_id,
            };
            let e = inc.entry(m.seq.get());
            if m.seq.get() != want || e.is_none_or(|e| e.kind != m.kind || e.id != id) {
                return Err(format!(
                    "{sid}: the copy has {:?} {id} at seq {} where the store has {e:?} at seq {want}",
                    m.kind,
                    m.seq.get(),
                ));
            }
            want += 1;
        }
        if want != log.next_seq().get() {
            return Err(format!(
                "{sid}: the copy's history ends before seq {want}, its next is {}",
                log.next_seq().get()
            ));
        }
        for m in log.page_all_pending() {
            let e = inc.entry(m.seq.get());
            if e.is_none_or(|e| e.kind != Kind::Prompt || *e.id != *m.client_msg_id) {
                return Err(format!(
                    "{sid}: the copy has {} pending at seq {}, the store {e:?}",
                    m.client_msg_id,
                    m.seq.get()
                ));
            }
        }
        Ok(())
    }
}

/// What a subscriber's client has read, checked frame by frame against
/// the life of the session it subscribed to.
#[derive(Debug)]
pub struct View {
    pub inc: usize,
    /// The `seq` of the last message it was sent (or its `after`).
    pub last: u64,
    /// It must be told `resync` before any message (its epoch differs).
    pub owed_resync: bool,
    /// Frames read.
    pub frames: u64,
    /// The answers whose `message` it read and the prompts whose `cancel`
    /// it read (since its last `resync`), with the `seq` of their prompt:
    /// no part of either may follow while that prompt is in history (the
    /// relay forgets a prompt and its answer past it, and the ids may be
    /// used again).
    pub ended: HashMap<String, u64>,
}

/// The `data` member `key` of a frame, a string.
fn data_id(payload: &[u8], key: &str) -> Result<Option<String>, String> {
    let v: serde_json::Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
    Ok(v["data"][key].as_str().map(str::to_string))
}

/// The frame's type, and the `seq` at its end when it carries one
/// (every stored message's `data` ends with it).
fn type_and_seq(payload: &[u8]) -> Result<(&str, Option<u64>), String> {
    let text = std::str::from_utf8(payload).map_err(|_| "a frame not UTF-8".to_string())?;
    let rest = text
        .strip_prefix("{\"type\":\"")
        .ok_or_else(|| format!("a frame without a type first: {text}"))?;
    let ty = &rest[..rest.find('"').unwrap_or(0)];
    let seq = text.rfind("\"seq\":").and_then(|at| {
        let digits: String = text[at + 6..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    });
    Ok((ty, seq))
}

/// The payload of one server frame (unmasked, one text frame).
pub fn payload(frame: &[u8]) -> Result<&[u8], String> {
    if frame.len() < 2 || frame[0] != 0x81 {
        return Err(format!(
            "not a final text frame: {:?}",
            &frame[..frame.len().min(4)]
        ));
    }
    let (len, at) = match frame[1] & 0x7f {
        126 => (u16::from_be_bytes([frame[2], frame[3]]) as usize, 4),
        127 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&frame[2..10]);
            (u64::from_be_bytes(b) as usize, 10)
        }
        n => (n as usize, 2),
    };
    if frame.len() != at + len {
        return Err("a frame whose length is not its header's".to_string());
    }
    Ok(&frame[at..])
}

impl View {
    /// Checks one frame the client read: a message must be the next one
    /// the model has after the last it saw (no gap, no duplicate), a
    /// `resync` must have a cause and name the live epoch and the oldest
    /// retained `seq`.
    pub fn read(&mut self, model: &Model, frame: &[u8], limit: usize) -> Result<(), String> {
        self.frames += 1;
        let payload = payload(frame)?;
        let (ty, seq) = type_and_seq(payload)?;
        let inc = &model.incs[self.inc];
        match ty {
            "message" | "cancel" | "ask" | "reply" => {
                let seq = seq.ok_or_else(|| format!("a {ty} frame without seq"))?;
                if self.owed_resync {
                    return Err(format!("{ty} seq {seq} before the resync owed"));
                }
                let want = inc.next_framed_after(self.last);
                if want != Some(seq) {
                    return Err(format!(
                        "{}: {ty} seq {seq} after seq {}, where the next is {want:?}",
                        inc.sid, self.last
                    ));
                }
                let kind = match ty {
                    "message" => Kind::Assistant,
                    "cancel" => Kind::Cancel,
                    "ask" => Kind::Ask,
                    _ => Kind::Reply,
                };
                if inc.entry(seq).map(|e| e.kind) != Some(kind) {
                    return Err(format!("{}: seq {seq} sent as {ty}", inc.sid));
                }
                let end = match kind {
                    Kind::Assistant => {
                        data_id(payload, "assistant_msg_id")?.map(|a| format!("a {a}"))
                    }
                    Kind::Cancel => data_id(payload, "client_msg_id")?.map(|c| format!("c {c}")),
                    _ => None,
                };
                let cid = data_id(payload, "client_msg_id")?.unwrap_or_default();
                if let (Some(end), Some(prompt)) = (end, inc.prompt_before(seq, &cid)) {
                    self.ended.insert(end, prompt);
                }
                self.last = seq;
            }
            "resync" => {
                let v: serde_json::Value =
                    serde_json::from_slice(payload).map_err(|e| e.to_string())?;
                let epoch = v["epoch"].as_str().unwrap_or("");
                let first = v["first_seq"].as_u64().unwrap_or(0);
                if !self.owed_resync && !inc.trimmed_after(self.last, limit) {
                    return Err(format!(
                        "{}: a resync after seq {} with nothing trimmed",
                        inc.sid, self.last
                    ));
                }
                if epoch != inc.epoch {
                    return Err(format!(
                        "{}: resync to epoch {epoch}, not {}",
                        inc.sid, inc.epoch
                    ));
                }
                // The frame was made when it was queued: history may have
                // moved on since, never back.
                if first == 0 || first > inc.first_retained(limit) {
                    return Err(format!(
                        "{}: resync at first_seq {first}, history starts at {}",
                        inc.sid,
                        inc.first_retained(limit)
                    ));
                }
                self.owed_resync = false;
                self.last = first - 1;
                self.ended.clear();
            }
            "delta" => {
                // A part (or a snapshot) of an answer whose final message
                // or whose prompt's cancel this client read is stale.
                let aid = data_id(payload, "assistant_msg_id")?.unwrap_or_default();
                let cid = data_id(payload, "client_msg_id")?.unwrap_or_default();
                let held = |key: String| {
                    self.ended
                        .get(&key)
                        .is_some_and(|&p| p >= inc.first_retained(limit))
                };
                if held(format!("a {aid}")) {
                    return Err(format!(
                        "{}: a part of {aid} after its final answer",
                        inc.sid
                    ));
                }
                if held(format!("c {cid}")) {
                    return Err(format!(
                        "{}: a part of {aid} after its prompt {cid}'s cancel",
                        inc.sid
                    ));
                }
            }
            "delta_end" | "presence" | "receipt" => {}
            other => return Err(format!("a frame of unknown type {other}")),
        }
        Ok(())
    }
}
