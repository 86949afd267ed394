//! What the person waiting sees of the agent at work, which no engine
//! stores: the drafts of streamed answers, whether an agent is there, and
//! which prompts an agent has fetched. Kept per session beside the log and
//! never persisted (after a restart only final answers exist). Frames for
//! them go to the subscribers that are caught up ([`Effect::Broadcast`]); a
//! subscriber that joins or falls behind gets a snapshot of every open
//! draft and the agent's state when it catches up ([`Relay::live_frames`]).
//!
//! Time: a draft ends when no part came for the draft timeout, an agent is
//! offline once no poll is parked and the grace after its last request has
//! passed. Both are found by [`Relay::tick`], which the shell runs at
//! [`Relay::next_tick`], rounded up to [`TICK`] so a busy server does not
//! scan its sessions for every request.

use std::collections::HashMap;
use std::rc::Rc;

use log::debug;

use super::{ApiError, Effect, Engine, Relay, Reply};
use crate::store::model::NewResponse;
use crate::store::seam::{AgentHere, AgentState, Announced, DraftState};
use crate::store::{Seq, SessionId};
use crate::time::{Millis, UnixMillis};
use crate::wire::{decoded_len, push_decimal_str, push_json_str, wsframe};

/// A draft holds at most this many bytes of text: one message's limit.
pub const MAX_DRAFT_BYTES: usize = crate::store::types::MAX_TEXT_BYTES;

/// The granularity of draft and presence deadlines, in milliseconds.
pub const TICK: u64 = 250;

/// One streamed answer in progress.
#[derive(Debug)]
pub struct Draft {
    pub assistant_msg_id: Rc<str>,
    pub client_msg_id: Rc<str>,
    /// The text so far as the inside of a JSON string literal: each
    /// part's literal without its quotes, so parts are never decoded and
    /// encoded again.
    escaped: String,
    /// The decoded length of the text so far, for the cap.
    bytes: usize,
    /// Parts appended so far.
    parts: u32,
    /// Dropped when no part came by then.
    deadline: Millis,
}

impl Draft {
    /// A draft with no part yet.
    fn new(assistant_msg_id: Rc<str>, client_msg_id: Rc<str>, deadline: Millis) -> Draft {
        Draft {
            assistant_msg_id,
            client_msg_id,
            escaped: String::new(),
            bytes: 0,
            parts: 0,
            deadline,
        }
    }

    /// Appends the next part: its text's literal (quotes included) and
    /// decoded length. Returns its `delta` frame.
    fn append(&mut self, sid: &str, lit: &str, bytes: usize, deadline: Millis) -> Rc<[u8]> {
        self.escaped.push_str(&lit[1..lit.len() - 1]);
        self.bytes += bytes;
        self.parts += 1;
        self.deadline = deadline;
        delta_frame(sid, self, Some(lit), false)
    }
}

/// A session's live state (see the module doc).
#[derive(Debug, Default)]
pub struct Live {
    drafts: Vec<Draft>,
    /// When the last agent request to the session ended (loop clock).
    agent_end: Option<Millis>,
    /// The wall-clock time of the agent's last request, for `GET /sessions`.
    agent_seen: Option<UnixMillis>,
    /// The state subscribers were last told, and since when.
    online: bool,
    since: UnixMillis,
    /// The highest `seq` of a prompt whose receipt was sent, and when.
    fetched: Seq,
    fetched_at: UnixMillis,
    /// The other instances' agent states, as the engine heard them, and
    /// what they were last told of this one's (kept for the engine).
    remote: Vec<AgentState>,
    told: Announced,
}

/// Receipts a subscriber gets when it catches up, at most.
const MAX_RECEIPTS: usize = 64;

/// Other instances' agent states kept per session, at most.
const MAX_INSTANCES: usize = 64;

/// The clocks of a presence step.
#[derive(Clone, Copy)]
struct At {
    now: Millis,
    unix: UnixMillis,
    grace: u64,
}

/// What a presence step found.
struct Step {
    /// The state subscribers see changed to this.
    changed: Option<bool>,
    /// The agent here, for the other instances.
    here: AgentHere,
    /// When to look again.
    wake: Option<Millis>,
}

impl Live {
    /// Recomputes the agent's state: online while a poll is parked here
    /// (`parked`), for the grace after the last agent request here ended,
    /// and while another instance says so.
    fn step(&mut self, at: At, parked: bool) -> Step {
        let local_until = self.agent_end.map(|t| t.after_ms(at.grace));
        let local = parked || local_until.is_some_and(|u| at.now < u);
        let remote = self
            .remote
            .iter()
            .map(|a| a.until)
            .filter(|u| *u > at.unix)
            .min();
        let online = local || remote.is_some();
        let mut wake = None;
        let mut soon = |t: Millis| wake = Some(wake.map_or(t, |w: Millis| w.min(t)));
        if let Some(u) = local_until.filter(|_| local && !parked) {
            soon(u);
        }
        if let Some(u) = remote {
            soon(at.now.after_ms(u - at.unix));
        }
        let here = if parked {
            AgentHere::Parked
        } else if let Some(u) = local_until.filter(|_| local) {
            AgentHere::Until(at.unix + u.since(at.now))
        } else {
            AgentHere::Away
        };
        let changed = (online != self.online).then(|| {
            self.online = online;
            self.since = at.unix;
            online
        });
        Step {
            changed,
            here,
            wake,
        }
    }

    /// When another instance last saw an agent, or this one did.
    fn seen(&self) -> Option<UnixMillis> {
        let remote = self.remote.iter().map(|a| a.seen).max();
        self.agent_seen.max(remote)
    }
}

impl Step {
    /// Tells the subscribers here (`watched`) and the engine, for the
    /// other instances, and schedules the next look in `next`.
    #[allow(clippy::too_many_arguments)]
    fn carry_out(
        self,
        sid: &SessionId,
        live: &mut Live,
        watched: bool,
        effects: &mut Vec<Effect>,
        engine: &mut Engine,
        next: &mut Option<Millis>,
        at: At,
    ) {
        if let Some(online) = self.changed {
            debug!(session_id = sid.as_str(), online = online; "agent presence changed");
            if watched {
                effects.push(Effect::Broadcast {
                    sid: sid.clone(),
                    frame: presence_frame(sid, online, at.unix),
                });
            }
        }
        let seen = live.agent_seen.unwrap_or(0);
        let again = engine.announce_agent(sid, &mut live.told, self.here, seen, at.unix, at.grace);
        let again = again.map(|ms| at.now.after_ms(ms));
        if let Some(w) = [self.wake, again].into_iter().flatten().min() {
            let w = round_up(w);
            *next = Some(next.map_or(w, |n| n.min(w)));
        }
    }
}

/// The live state of every session that had any (dropped with its session).
pub type LiveMap = HashMap<SessionId, Live>;

impl Relay {
    /// `POST /response` with `"partial": true`, once the log's rules took
    /// it ([`MemStore::decide`](crate::store::MemStore::decide) gave its
    /// id): appends the text to its draft and sends the part to the
    /// caught-up subscribers. In memory and with a data directory the
    /// loop's copy of the log knows every committed prompt, so a part is
    /// decided here, at once.
    pub(super) fn post_partial(
        &mut self,
        now: Millis,
        r: NewResponse,
        id: String,
    ) -> Result<Reply, ApiError> {
        let lit = &*r.text;
        let bytes = decoded_len(lit);
        let deadline = now.after_ms(self.limits.draft_timeout_ms);
        let max_drafts = self.limits.max_pending;
        let live = self.live.entry(r.session_id.clone()).or_default();
        let at = match live.drafts.iter().position(|d| *d.assistant_msg_id == *id) {
            Some(at) => {
                let d = &live.drafts[at];
                if *d.client_msg_id != *r.client_msg_id {
                    return Err(ApiError::conflict());
                }
                if d.bytes + bytes > MAX_DRAFT_BYTES {
                    return Err(ApiError::too_large_field());
                }
                at
            }
            None => {
                if live.drafts.len() >= max_drafts {
                    return Err(ApiError::unavailable(
                        "draft limit reached for this session",
                    ));
                }
                if bytes > MAX_DRAFT_BYTES {
                    return Err(ApiError::too_large_field());
                }
                // The log's rules found it: only a new draft needs it.
                let Some(prompt) = self
                    .store
                    .get(&r.session_id)
                    .and_then(|log| log.prompt_id(&r.client_msg_id))
                else {
                    return Err(ApiError::prompt_not_found());
                };
                live.drafts
                    .push(Draft::new(Rc::from(id.as_str()), prompt, deadline));
                live.drafts.len() - 1
            }
        };
        let frame = live.drafts[at].append(&r.session_id, lit, bytes, deadline);
        let delivered = self.send_part(&r.session_id, frame, deadline);
        Ok(Reply::Now(crate::store::record::partial_ack(
            &id, delivered,
        )))
    }

    /// A part was appended to a draft of `sid` (`frame`, its `delta`),
    /// which now waits until `deadline`: to the subscribers here. Returns
    /// whether there were any.
    fn send_part(&mut self, sid: &SessionId, frame: Rc<[u8]>, deadline: Millis) -> bool {
        self.wake_at(deadline);
        let delivered = !self.subscribers(sid).is_empty();
        if delivered {
            self.effects.push(Effect::Broadcast {
                sid: sid.clone(),
                frame,
            });
        }
        delivered
    }

    /// A final answer with this id is stored: its `message` frame replaces
    /// the draft in every client.
    pub(super) fn draft_done(&mut self, sid: &str, assistant_msg_id: &str) {
        if let Some(live) = self.live.get_mut(sid) {
            live.drafts
                .retain(|d| *d.assistant_msg_id != *assistant_msg_id);
        }
    }

    /// An agent request to `sid` (a poll or an answer) arrived: the agent
    /// is online from now. `ended`: the request is answered now (not
    /// parked), so the grace starts now too.
    pub(super) fn agent_seen(&mut self, now: Millis, sid: &str, ended: bool) {
        let unix = self.unix_at(now);
        let alone = !self.engine.others_hear_agents();
        let seen = |live: &mut Live| {
            live.agent_seen = Some(unix);
            if ended {
                live.agent_end = Some(now);
            }
            // Online already, and nobody else to tell: nothing changes
            // now, and the tick due by the grace's old end looks again
            // then.
            live.online && alone
        };
        let unchanged = match self.live.get_mut(sid) {
            Some(live) => seen(live),
            None => {
                let Some(key) = self.store.key(sid) else {
                    return;
                };
                seen(self.live.entry(key.clone()).or_default())
            }
        };
        if !unchanged {
            self.refresh_presence(now, sid);
        }
    }

    /// A parked poll of `sid` ended (answered, timed out, hung up): the
    /// grace starts now.
    pub(super) fn agent_left(&mut self, now: Millis, sid: &str) {
        let alone = !self.engine.others_hear_agents();
        let grace = self.limits.agent_grace_ms;
        let Some(live) = self.live.get_mut(sid) else {
            return;
        };
        live.agent_end = Some(now);
        if live.online && alone {
            // Still online for the grace: only the tick that may end it.
            self.wake_at(now.after_ms(grace));
            return;
        }
        self.refresh_presence(now, sid);
    }

    /// Tells the subscribers of `sid` when the agent's state changed,
    /// tells the engine (for the other instances), and schedules the next
    /// look.
    pub(super) fn refresh_presence(&mut self, now: Millis, sid: &str) {
        let at = self.at(now);
        let parked = self.parked(sid);
        let Relay {
            live,
            engine,
            effects,
            presence,
            next_tick,
            ..
        } = self;
        let Some(key) = live.get_key_value(sid).map(|(k, _)| k.clone()) else {
            return;
        };
        let Some(entry) = live.get_mut(sid) else {
            return;
        };
        let watched = presence.get(sid).is_some_and(|p| !p.subscribers.is_empty());
        let step = entry.step(at, parked);
        step.carry_out(&key, entry, watched, effects, engine, next_tick, at);
    }

    /// The prompts of `sid` after `after` are in an answer to an agent's
    /// poll: a `receipt` for each one not fetched before.
    pub(super) fn fetched(&mut self, now: Millis, sid: &str, after: Option<Seq>) {
        let unix = self.unix_at(now);
        let Some((key, log)) = self.store.key_and_log(sid) else {
            return;
        };
        let key = key.clone();
        let live = self.live.entry(key.clone()).or_default();
        let to_tell = !self
            .presence
            .get(sid)
            .is_none_or(|p| p.subscribers.is_empty());
        let others_hear = self.engine.others_hear_agents();
        let mut told: Vec<Rc<str>> = Vec::new();
        for msg in log.page_prompts(after) {
            if msg.seq <= live.fetched {
                continue;
            }
            live.fetched = msg.seq;
            live.fetched_at = unix;
            if to_tell {
                self.effects.push(Effect::Broadcast {
                    sid: key.clone(),
                    frame: receipt_frame(sid, &msg.client_msg_id, unix),
                });
            }
            if others_hear {
                told.push(msg.client_msg_id.clone());
            }
        }
        if !told.is_empty() {
            let ids: Vec<&str> = told.iter().map(|id| &**id).collect();
            self.engine.publish_receipts(&key, unix, &ids);
        }
    }

    /// A part the engine took (through any instance), heard by the
    /// instances that follow the session. Appended to the copy of
    /// its draft when it is the next part; a gap (the copy began after the
    /// draft did) makes the session read again, drafts included.
    pub(super) fn part_published(
        &mut self,
        now: Millis,
        sid: &SessionId,
        aid: &str,
        cid: &str,
        part: u32,
        lit: &str,
    ) {
        if lit.len() < 2 {
            return;
        }
        let deadline = now.after_ms(self.limits.draft_timeout_ms);
        let max_drafts = self.limits.max_pending;
        let live = self.live.entry(sid.clone()).or_default();
        let at = live.drafts.iter().position(|d| *d.assistant_msg_id == *aid);
        let d = match at {
            Some(at) if live.drafts[at].parts + 1 == part => &mut live.drafts[at],
            Some(at) if live.drafts[at].parts >= part => return,
            // The engine holds the cap; a copy never holds more than it.
            None if part == 1 && live.drafts.len() < max_drafts => {
                live.drafts
                    .push(Draft::new(Rc::from(aid), Rc::from(cid), deadline));
                let last = live.drafts.len() - 1;
                &mut live.drafts[last]
            }
            _ => {
                self.engine.resync(&self.store, sid);
                return;
            }
        };
        let frame = d.append(sid, lit, decoded_len(lit), deadline);
        self.send_part(sid, frame, deadline);
    }

    /// The drafts and the other instances' agent states a read of `sid`
    /// found.
    /// A draft the read holds further than the copy replaces it, and the
    /// subscribers here get its snapshot.
    pub(super) fn live_synced(
        &mut self,
        now: Millis,
        sid: &SessionId,
        drafts: Vec<DraftState>,
        agents: Vec<AgentState>,
    ) {
        let unix = self.unix_at(now);
        let max_drafts = self.limits.max_pending;
        let live = self.live.entry(sid.clone()).or_default();
        // A read's drafts may be older than parts published since it ran:
        // a part heard as it is published can arrive before the answer to
        // a read it followed. A draft is taken from the read only where the read
        // holds more parts than the copy; a draft the read lacks stays
        // until its deadline or its final answer.
        let mut snapshots: Vec<Rc<[u8]>> = Vec::new();
        for d in drafts.into_iter().filter(|d| d.deadline > unix) {
            let at = live
                .drafts
                .iter()
                .position(|l| *l.assistant_msg_id == *d.assistant_msg_id);
            if at.is_some_and(|at| live.drafts[at].parts >= d.parts) {
                continue;
            }
            let draft = Draft {
                assistant_msg_id: Rc::from(d.assistant_msg_id),
                client_msg_id: Rc::from(d.client_msg_id),
                escaped: d.escaped,
                bytes: d.bytes,
                parts: d.parts,
                deadline: now.after_ms(d.deadline - unix),
            };
            snapshots.push(delta_frame(sid, &draft, None, true));
            match at {
                Some(at) => live.drafts[at] = draft,
                None => live.drafts.push(draft),
            }
        }
        live.remote = agents.into_iter().take(MAX_INSTANCES).collect();
        live.drafts.truncate(max_drafts);
        let deadlines: Vec<Millis> = live.drafts.iter().map(|d| d.deadline).collect();
        for d in deadlines {
            self.wake_at(d);
        }
        if !self.subscribers(sid).is_empty() {
            for frame in snapshots {
                self.effects.push(Effect::Broadcast {
                    sid: sid.clone(),
                    frame,
                });
            }
        }
        self.refresh_presence(now, sid);
    }

    /// Another instance's agent state in `sid` changed.
    pub(super) fn agent_published(&mut self, now: Millis, sid: &SessionId, state: &AgentState) {
        let live = self.live.entry(sid.clone()).or_default();
        live.remote.retain(|a| a.instance != state.instance);
        if live.remote.len() >= MAX_INSTANCES {
            live.remote.remove(0);
        }
        if state.until > 0 {
            live.remote.push(AgentState {
                instance: state.instance.clone(),
                until: state.until,
                seen: state.seen,
            });
        }
        self.refresh_presence(now, sid);
    }

    /// Prompts an agent fetched through another instance.
    pub(super) fn receipts_published(&mut self, sid: &SessionId, ts: UnixMillis, ids: &[String]) {
        // Known here too, for the receipts of a subscriber that connects.
        if let Some(log) = self.store.get(sid) {
            let newest = ids.iter().filter_map(|id| log.prompt_seq(id)).max();
            let live = self.live.entry(sid.clone()).or_default();
            if let Some(seq) = newest.filter(|s| *s > live.fetched) {
                live.fetched = seq;
                live.fetched_at = ts;
            }
        }
        if self.subscribers(sid).is_empty() {
            return;
        }
        for id in ids {
            self.effects.push(Effect::Broadcast {
                sid: sid.clone(),
                frame: receipt_frame(sid, id, ts),
            });
        }
    }

    /// Frames a subscriber of `sid` needs once it is caught up with the
    /// log: a snapshot of every open draft and the agent's state.
    pub(super) fn live_frames(&self, sid: &str, out: &mut Vec<Rc<[u8]>>) {
        let Some(live) = self.live.get(sid) else {
            out.push(presence_frame(sid, false, self.started));
            return;
        };
        // The pending prompts an agent fetched already (the oldest
        // MAX_RECEIPTS of them), stamped with the latest fetch.
        if let Some(log) = self.store.get(sid)
            && live.fetched.get() > 0
        {
            for msg in log
                .page_prompts(None)
                .take_while(|m| m.seq <= live.fetched)
                .take(MAX_RECEIPTS)
            {
                out.push(receipt_frame(sid, &msg.client_msg_id, live.fetched_at));
            }
        }
        for d in &live.drafts {
            out.push(delta_frame(sid, d, None, true));
        }
        let since = if live.since == 0 {
            self.started
        } else {
            live.since
        };
        out.push(presence_frame(sid, live.online, since));
    }

    /// When [`tick`](Self::tick) is next due, if anything waits on time.
    pub fn next_tick(&self) -> Option<Millis> {
        self.next_tick
    }

    /// Drops the drafts that stopped (`delta_end` to subscribers) and
    /// turns offline the agents whose grace passed.
    pub fn tick(&mut self, now: Millis) {
        if self.next_tick.is_none_or(|t| now < t) {
            return;
        }
        self.next_tick = None;
        let at = self.at(now);
        let mut next: Option<Millis> = None;
        let mut soon = |t: Millis| next = Some(next.map_or(t, |n: Millis| n.min(t)));
        for (sid, live) in &mut self.live {
            let here = self.presence.get(&**sid);
            let watched = here.is_some_and(|p| !p.subscribers.is_empty());
            live.drafts.retain(|d| {
                if now < d.deadline {
                    soon(d.deadline);
                    return true;
                }
                debug!(session_id = sid.as_str(), assistant_msg_id = &*d.assistant_msg_id; "draft timed out");
                if watched {
                    self.effects.push(Effect::Broadcast {
                        sid: sid.clone(),
                        frame: delta_end_frame(sid, d),
                    });
                }
                false
            });
            let parked = here.is_some_and(|p| !p.waiters.is_empty());
            let step = live.step(at, parked);
            let mut later = None;
            step.carry_out(
                sid,
                live,
                watched,
                &mut self.effects,
                &mut self.engine,
                &mut later,
                at,
            );
            if let Some(t) = later {
                soon(t);
            }
        }
        self.next_tick = next.map(round_up);
    }

    /// Schedules a tick by `deadline`.
    fn wake_at(&mut self, deadline: Millis) {
        let t = round_up(deadline);
        if self.next_tick.is_none_or(|n| t < n) {
            self.next_tick = Some(t);
        }
    }

    /// `GET /sessions/{sid}`: the session's counters and the agent's state.
    pub fn session_info(&mut self, now: Millis, sid: &str) -> Result<Vec<u8>, ApiError> {
        let log = self.store.existing(now, sid)?;
        let (next, ..) = log.counters();
        let mut out = String::with_capacity(192);
        out.push_str("{\"session_id\":");
        push_json_str(&mut out, sid);
        out.push_str(",\"epoch\":");
        push_json_str(&mut out, log.epoch());
        out.push_str(",\"last_seq\":");
        push_decimal_str(&mut out, next.0.saturating_sub(1));
        out.push_str(",\"pending\":");
        push_decimal_str(&mut out, log.pending_len() as u64);
        let live = self.live.get(sid);
        let parked = self.parked(sid);
        let online = parked || live.is_some_and(|l| l.online);
        out.push_str(if online {
            ",\"agent\":\"online\",\"agent_seen_ts\":"
        } else {
            ",\"agent\":\"offline\",\"agent_seen_ts\":"
        });
        match live.and_then(Live::seen) {
            Some(ts) => push_decimal_str(&mut out, ts),
            None => out.push_str("null"),
        }
        out.push('}');
        Ok(out.into_bytes())
    }

    /// The clocks and the grace, for a presence step.
    fn at(&self, now: Millis) -> At {
        At {
            now,
            unix: self.unix_at(now),
            grace: self.limits.agent_grace_ms,
        }
    }

    /// Whether an agent's poll of `sid` is parked here.
    fn parked(&self, sid: &str) -> bool {
        self.presence
            .get(sid)
            .is_some_and(|p| !p.waiters.is_empty())
    }

    /// The wall-clock time at loop time `now`.
    fn unix_at(&self, now: Millis) -> UnixMillis {
        self.clock
            .1
            .saturating_add(now.0.saturating_sub(self.clock.0.0))
    }
}

/// A deadline rounded up to the tick granularity.
fn round_up(t: Millis) -> Millis {
    Millis(t.0.div_ceil(TICK).saturating_mul(TICK))
}

fn frame(json: &str) -> Rc<[u8]> {
    Rc::from(wsframe::text_frame(&[json.as_bytes()]))
}

/// The draft's ids as the head of a `delta` or `delta_end` object.
fn head(out: &mut String, kind: &str, sid: &str, d: &Draft) {
    out.push_str("{\"type\":\"");
    out.push_str(kind);
    out.push_str("\",\"data\":{\"session_id\":");
    push_json_str(out, sid);
    out.push_str(",\"client_msg_id\":");
    push_json_str(out, &d.client_msg_id);
    out.push_str(",\"assistant_msg_id\":");
    push_json_str(out, &d.assistant_msg_id);
}

/// A `delta` frame: the part just appended (`part`, its literal), or the
/// whole draft as a snapshot.
fn delta_frame(sid: &str, d: &Draft, part: Option<&str>, snapshot: bool) -> Rc<[u8]> {
    let mut out = String::with_capacity(160 + d.escaped.len());
    head(&mut out, "delta", sid, d);
    out.push_str(",\"part\":");
    push_decimal_str(&mut out, u64::from(d.parts));
    out.push_str(",\"text\":");
    match part {
        Some(lit) => out.push_str(lit),
        None => {
            out.push('"');
            out.push_str(&d.escaped);
            out.push('"');
        }
    }
    if snapshot {
        out.push_str(",\"snapshot\":true");
    }
    out.push_str("}}");
    frame(&out)
}

fn delta_end_frame(sid: &str, d: &Draft) -> Rc<[u8]> {
    let mut out = String::with_capacity(160);
    head(&mut out, "delta_end", sid, d);
    out.push_str(",\"reason\":\"timeout\"}}");
    frame(&out)
}

fn presence_frame(sid: &str, online: bool, since: UnixMillis) -> Rc<[u8]> {
    let mut out = String::with_capacity(96);
    out.push_str("{\"type\":\"presence\",\"data\":{\"session_id\":");
    push_json_str(&mut out, sid);
    out.push_str(if online {
        ",\"agent\":\"online\",\"since\":"
    } else {
        ",\"agent\":\"offline\",\"since\":"
    });
    push_decimal_str(&mut out, since);
    out.push_str("}}");
    frame(&out)
}

fn receipt_frame(sid: &str, client_msg_id: &str, ts: UnixMillis) -> Rc<[u8]> {
    let mut out = String::with_capacity(128);
    out.push_str("{\"type\":\"receipt\",\"data\":{\"session_id\":");
    push_json_str(&mut out, sid);
    out.push_str(",\"client_msg_id\":");
    push_json_str(&mut out, client_msg_id);
    out.push_str(",\"state\":\"fetched\",\"ts\":");
    push_decimal_str(&mut out, ts);
    out.push_str("}}");
    frame(&out)
}
