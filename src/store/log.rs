//! One session's log: the durable part of a session. Its history is the log
//! every consumer reads by cursor (`seq`): agents through the pending set and
//! `after`, WebSocket subscribers through [`Cursor`], `/messages` by page.
//!
//! Invariants, kept by the methods (the fields are private): `history` holds
//! at most `history_limit` messages, in `seq` order with no gaps, ending at
//! `next_seq - 1`; `pending` holds exactly the unanswered prompts (also those
//! already trimmed from history); `prompts` has an entry for every prompt
//! that is pending or still in history (a cancelled one with its cancel's
//! `seq`), `responses` for every assistant message still in history. So
//! every map is bounded by `history_limit + max_pending`.
//!
//! Cancels, asks and replies are messages of the log like answers: each
//! takes a `seq` and is sent to subscribers as its frame (a cancel also
//! stops its prompt being pending). So "the newest answer" below
//! (`last_assistant`, `dropped_assistant`) means the newest framed
//! message: what a subscriber's cursor is measured against. Which asks
//! are open is [`Asks`]'s.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::rc::Rc;

use super::asks::{AskEntry, Asks};
use super::message::{Kind, Message};
use super::pending::{Pending, cap_after_push, grow_early};
use super::types::Seq;
use crate::error::ApiError;
use crate::store::idmap::{IdMap, Keys};
use crate::store::types::MessagesQuery;
use crate::time::Millis;
use crate::time::UnixMillis;
use crate::wire::to_json;
use crate::wire::wsframe;

pub mod weight;
use weight::Meter;

/// Largest `/messages` page or `GET /prompts` answer body: with 128 KiB
/// messages a full page of 1000 would be 128 MiB held for one answer.
pub const MAX_PAGE_BYTES: usize = 4 << 20;

/// What the dedupe map knows about a prompt.
#[derive(Debug)]
pub struct PromptEntry {
    seq: Seq,
    /// Answered, or cancelled: no longer pending.
    answered: bool,
    in_history: bool,
    /// The `seq` of the cancel that stopped it; `answered` is then set.
    cancel: Option<Seq>,
}

/// What the log says of a prompt an answer or a cancel names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptState {
    /// Neither pending nor in history: unknown.
    Unknown,
    Pending,
    /// An answer to it is stored.
    Answered,
    /// Cancelled by the cancel at this `seq`.
    Cancelled(Seq),
}

/// What the dedupe map knows about an assistant message, to tell a resend
/// (same prompt, same text) from a conflict.
#[derive(Debug)]
pub struct ResponseEntry {
    pub client_msg_id: Rc<str>,
    pub msg: Rc<Message>,
}

impl ResponseEntry {
    /// The stored text, decoded (only a resend of the same id needs it).
    pub fn text(&self) -> String {
        #[derive(serde::Deserialize)]
        struct Text {
            text: String,
        }
        serde_json::from_slice::<Text>(self.msg.data()).map_or_else(|_| String::new(), |t| t.text)
    }
}

/// The `prompt` of a stored prompt's `data`, decoded; `None` if it cannot
/// be read (a damaged row: a resend of its id cannot be told from a reuse,
/// and is taken as a resend).
pub fn prompt_text_of(data: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Prompt {
        prompt: String,
    }
    serde_json::from_slice::<Prompt>(data)
        .ok()
        .map(|p| p.prompt)
}

/// A subscriber's position in the log: every assistant message with
/// `seq <= self.seq` was sent to it (or excluded by its `after`). Kept by the
/// I/O shell beside the connection; moved only by the log and by a live
/// delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub seq: Seq,
    /// A `resync` frame is owed before anything else.
    resync: bool,
}

/// What a refill did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refill {
    /// Everything stored is sent: the next live message can go straight on.
    pub caught_up: bool,
    /// A `resync` frame went first.
    pub resynced: bool,
}

/// Where a newly stored assistant message stands for one subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Live {
    /// It is the next message the subscriber needs: send it now.
    Next,
    /// Its `after` excludes it.
    Skip,
    /// The subscriber has not been sent everything before it: it reads the
    /// log when it is refilled.
    Behind,
}

impl Cursor {
    /// A cursor after `seq`, with no resync owed.
    pub fn at(seq: Seq) -> Cursor {
        Cursor { seq, resync: false }
    }

    /// Where a message at `seq`, whose previous assistant message is at
    /// `prev`, stands for this subscriber.
    pub fn live(&self, seq: Seq, prev: Seq) -> Live {
        if self.resync || self.seq < prev {
            Live::Behind
        } else if self.seq >= seq {
            Live::Skip
        } else {
            Live::Next
        }
    }

    /// The log the cursor points into was replaced by one under a new
    /// epoch: the next refill starts with a `resync` frame.
    pub fn owe_resync(&mut self) {
        self.resync = true;
    }

    /// The subscriber was sent the message at `seq`.
    pub fn advance(&mut self, seq: Seq) {
        self.seq = self.seq.max(seq);
    }
}

/// A message about to be appended to a log, as the memory budget weighs
/// it before the write is applied ([`SessionLog::bytes_after`]).
#[derive(Clone, Copy, Debug)]
pub enum Next<'a> {
    /// A new prompt.
    Prompt { weight: usize },
    /// An answer or a cancel of the prompt `prompt`; an answer's id
    /// joins the answers' map (`answer_id`).
    Answer {
        prompt: &'a str,
        answer_id: bool,
        weight: usize,
    },
    /// An ask, with its stored `data`.
    Ask {
        ask_id: &'a str,
        seq: Seq,
        ts: crate::time::UnixMillis,
        data: &'a [u8],
        weight: usize,
    },
    /// A reply to the ask `ask_id`, with its stored `data`.
    Reply {
        ask_id: &'a str,
        seq: Seq,
        data: &'a [u8],
        weight: usize,
    },
}

impl Next<'_> {
    /// What the message itself weighs ([`weight::message`]).
    fn weight(&self) -> usize {
        match *self {
            Next::Prompt { weight, .. }
            | Next::Answer { weight, .. }
            | Next::Ask { weight, .. }
            | Next::Reply { weight, .. } => weight,
        }
    }
}

/// The rooms and counters a log is weighed by ([`SessionLog::weigh`]).
struct Shape {
    history: usize,
    pending: usize,
    prompts: usize,
    responses: usize,
    /// Whether the log holds its [`Extra`] box.
    extra: bool,
    page: usize,
    asks: usize,
    held: usize,
}

/// A session's epoch: the text of a UUID, as relay makes them, kept
/// inline (as an `Rc<str>` it would be a heap block of 64 bytes for every
/// session); any other text a store holds, on the heap.
#[derive(Debug)]
enum Epoch {
    Uuid([u8; 36]),
    Other(Box<str>),
}

impl Epoch {
    fn new(text: &str) -> Epoch {
        match <[u8; 36]>::try_from(text.as_bytes()) {
            Ok(bytes) => Epoch::Uuid(bytes),
            Err(_) => Epoch::Other(text.into()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Bytes of a whole `str`: always UTF-8.
            Epoch::Uuid(bytes) => std::str::from_utf8(bytes).unwrap_or_default(),
            Epoch::Other(text) => text,
        }
    }

    /// Its heap block, if it has one.
    fn heap_bytes(&self) -> usize {
        match self {
            Epoch::Uuid(_) => 0,
            Epoch::Other(text) => weight::alloc(text.len()),
        }
    }
}

/// The parts of a log that many sessions never use.
#[derive(Debug, Default)]
struct Extra {
    /// The asks, open or not, that the log knows.
    asks: Asks,
    /// What the asks weigh ([`Asks::weigh`]), taken again when they change.
    asks_held: usize,
    /// The last `GET /prompts` answer rendered, by its `after`: agents
    /// polling the same set share these bytes. Dropped on every change.
    page: Option<(Option<Seq>, Rc<[u8]>)>,
}

/// A session's durable state.
#[derive(Debug)]
pub struct SessionLog {
    epoch: Epoch,
    next_seq: Seq,
    history: VecDeque<Rc<Message>>,
    prompts: IdMap<PromptEntry>,
    pending: Pending,
    responses: IdMap<ResponseEntry>,
    /// The asks and the cached page: boxed, made by the first ask or
    /// `GET /prompts`, as a session nobody polls or asks in has neither.
    extra: Option<Box<Extra>>,
    /// The newest assistant message's `seq`, 0 before the first.
    last_assistant: Seq,
    /// The newest assistant message trimmed from history, 0 if none was.
    dropped_assistant: Seq,
    /// Where this session's deques grow ([`grow_early`]). This and
    /// `fixed` are 32 bits, so the two share one word of the box.
    seed: u32,
    pub last_active: Millis,
    /// The number the store gave it as it took it: tells the eviction
    /// order's entry for this log from one for a log under the same id
    /// before it (`store/mem/clock.rs`).
    pub entered: u64,
    /// What the messages held weigh ([`weight::message`]), each counted
    /// once whether history, the pending set or both hold it.
    held: usize,
    /// What the log weighs whatever it holds: its place in the store's
    /// map under its id, its epoch. Set when the store takes it.
    fixed: u32,
    /// The weight last added to the store's meter ([`bytes`](Self::bytes)).
    counted: usize,
    /// The store's meter, once the store holds this log.
    meter: Option<Meter>,
}

impl Drop for SessionLog {
    /// The log's bytes leave the store's count with it (deleted,
    /// collected, forgotten).
    fn drop(&mut self) {
        if let Some(m) = &self.meter {
            m.change(self.counted, 0);
        }
    }
}

impl SessionLog {
    /// A new, empty log with a fresh epoch.
    pub fn new(now: Millis, epoch: &str) -> SessionLog {
        SessionLog {
            epoch: Epoch::new(epoch),
            next_seq: Seq::FIRST,
            history: VecDeque::new(),
            prompts: IdMap::new(),
            pending: Pending::default(),
            responses: IdMap::new(),
            extra: None,
            last_assistant: Seq(0),
            dropped_assistant: Seq(0),
            seed: Keys::default().hash_one(0x5eed_u64) as u32,
            last_active: now,
            entered: 0,
            held: 0,
            fixed: 0,
            counted: 0,
            meter: None,
        }
    }

    /// The bytes this session holds, as the memory budget counts them
    /// (see [`weight`]): kept as the log changes.
    pub fn bytes(&self) -> usize {
        self.counted
    }

    /// The store takes this log under the id of `key_len` bytes: its bytes
    /// count on `meter` from now on, and leave it when the log is dropped.
    pub fn attach(&mut self, meter: &Meter, key_len: usize) {
        if let Some(m) = &self.meter {
            m.change(self.counted, 0);
        }
        self.meter = Some(meter.clone());
        let fixed = SessionLog::slot_weight(key_len) + self.epoch.heap_bytes();
        self.fixed = u32::try_from(fixed).unwrap_or(u32::MAX);
        self.counted = 0;
        self.sync();
    }

    /// What a log weighs in the store's map under an id of `key_len`
    /// bytes: the slot with the id and the box, and the box's block.
    fn slot_weight(key_len: usize) -> usize {
        weight::session_slot(std::mem::size_of::<Box<SessionLog>>(), key_len)
            + weight::alloc(std::mem::size_of::<SessionLog>())
    }

    /// What a new, empty log weighs in the store under an id of `key_len`
    /// bytes with this epoch (what [`attach`](Self::attach) counts).
    pub fn created_weight(key_len: usize, epoch: &str) -> usize {
        SessionLog::slot_weight(key_len) + Epoch::new(epoch).heap_bytes()
    }

    /// The weight by the log's counters and its tables' room: no walk.
    fn weight_with(&self, held: usize, asks: usize) -> usize {
        self.weigh(Shape {
            history: self.history.capacity(),
            pending: self.pending.capacity(),
            prompts: self.prompts.room(),
            responses: self.responses.room(),
            extra: self.extra.is_some(),
            page: self.page_bytes(),
            asks,
            held,
        })
    }

    /// What a log of this shape weighs.
    fn weigh(&self, s: Shape) -> usize {
        self.fixed as usize
            + weight::alloc(s.history * std::mem::size_of::<Rc<Message>>())
            + weight::alloc(s.pending * Pending::SLOT_BYTES)
            + weight::table(s.prompts, IdMap::<PromptEntry>::SLOT_BYTES)
            + weight::table(s.responses, IdMap::<ResponseEntry>::SLOT_BYTES)
            + if s.extra {
                weight::alloc(std::mem::size_of::<Extra>())
            } else {
                0
            }
            + s.page
            + s.asks
            + s.held
    }

    /// The rendered pending page's bytes, if one is kept.
    fn page_bytes(&self) -> usize {
        (self.extra.as_ref())
            .and_then(|x| x.page.as_ref())
            .map_or(0, |(_, p)| weight::rc_bytes(p.len()))
    }

    /// What this log weighs ([`bytes`](Self::bytes)) once `next` is
    /// appended with history kept to `limit`, worked out without changing
    /// anything: each table the append touches says what it holds after
    /// it (its growth included, [`cap_after_push`],
    /// [`IdMap::room_after_insert`], [`Pending::cap_after_remove`]), and
    /// what history trims and the prompt an answer ends leave. The memory
    /// budget admits a write by it; applying the write then counts
    /// exactly this.
    pub fn bytes_after(&self, next: &Next, limit: usize) -> usize {
        let mut shape = Shape {
            history: cap_after_push(
                self.history.len(),
                self.history.capacity(),
                self.seed as usize,
            ),
            pending: self.pending.capacity(),
            prompts: self.prompts.room(),
            responses: self.responses.room(),
            extra: self.extra.is_some(),
            page: self.page_bytes(),
            asks: self.extra.as_ref().map_or(0, |x| x.asks_held),
            held: self.held + next.weight(),
        };
        // The prompt an answer or a cancel takes off the pending set.
        let mut ends = None;
        let mut asks = None;
        match *next {
            Next::Prompt { .. } => {
                shape.prompts = self.prompts.room_after_insert();
                shape.pending = self.pending.cap_after_insert(self.seed as usize);
                shape.page = 0;
            }
            Next::Answer {
                prompt, answer_id, ..
            } => {
                if let Some(e) = self.prompts.get(prompt).filter(|e| !e.answered) {
                    ends = Some(prompt);
                    if !e.in_history {
                        shape.held = shape.held.saturating_sub(
                            self.pending_at(e.seq).map_or(0, |m| weight::message(m)),
                        );
                    }
                    shape.pending = self.pending.cap_after_remove(e.seq);
                    shape.page = 0;
                }
                if answer_id {
                    shape.responses = self.responses.room_after_insert();
                }
            }
            Next::Ask {
                ask_id,
                seq,
                ts,
                data,
                ..
            } => {
                let mut copy = self.asks_copy();
                copy.asked(Rc::from(ask_id), seq, ts, data);
                asks = Some(copy);
            }
            Next::Reply {
                ask_id, seq, data, ..
            } => {
                let mut copy = self.asks_copy();
                copy.replied(ask_id, seq, data);
                asks = Some(copy);
            }
        }
        let trim = (self.history.len() + 1).saturating_sub(limit);
        for old in self.history.iter().take(trim) {
            let pending = old.kind == Kind::Prompt
                && ends != Some(&*old.client_msg_id)
                && self
                    .prompts
                    .get(&old.client_msg_id)
                    .is_some_and(|e| !e.answered);
            if !pending {
                shape.held = shape.held.saturating_sub(weight::message(old));
            }
            if old.kind == Kind::Ask {
                asks.get_or_insert_with(|| self.asks_copy())
                    .trimmed(&old.client_msg_id, old.seq);
            }
        }
        if let Some(a) = asks {
            // An ask or a reply makes the box if the log has none.
            shape.extra = true;
            shape.asks = a.weigh(weight::table, weight::alloc);
        }
        self.weigh(shape)
    }

    /// A copy of the asks to weigh a write by ([`Asks::copy`]): empty if
    /// the log has none yet.
    fn asks_copy(&self) -> Asks {
        self.asks().map_or_else(Asks::default, Asks::copy)
    }

    /// Brings the count up to date after a change: called at the end of
    /// every method that changes what the log holds.
    fn sync(&mut self) {
        let asks = self.extra.as_ref().map_or(0, |x| x.asks_held);
        let w = self.weight_with(self.held, asks);
        if w != self.counted {
            if let Some(m) = &self.meter {
                m.change(self.counted, w);
            }
            self.counted = w;
        }
    }

    /// The asks changed: weigh them again.
    fn reweigh_asks(&mut self) {
        if let Some(x) = &mut self.extra {
            x.asks_held = x.asks.weigh(weight::table, weight::alloc);
        }
    }

    /// The rarely used parts, made on first use.
    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Box::default)
    }

    /// The cached `GET /prompts` page is stale: the pending set changed.
    fn forget_page(&mut self) {
        if let Some(x) = &mut self.extra {
            x.page = None;
        }
    }

    /// The weight counted from scratch, walking every message held: what
    /// the tests compare the kept count with.
    pub fn recount(&self) -> usize {
        let first = self.first_seq();
        let held = self
            .history
            .iter()
            .map(|m| weight::message(m))
            .sum::<usize>()
            + self
                .pending
                .from(Seq(0))
                .take_while(|m| m.seq < first)
                .map(|m| weight::message(m))
                .sum::<usize>();
        let asks = self
            .asks()
            .map_or(0, |a| a.weigh(weight::table, weight::alloc));
        self.weight_with(held, asks)
    }

    /// The session's epoch, chosen when it was created.
    pub fn epoch(&self) -> &str {
        self.epoch.as_str()
    }

    /// A log restored from the database: its counters as stored (a floor
    /// the replayed messages raise), its messages to follow, oldest first,
    /// through [`append_prompt`](Self::append_prompt) and
    /// [`append_response`](Self::append_response).
    pub fn restored(
        now: Millis,
        epoch: &str,
        next_seq: Seq,
        last_assistant: Seq,
        dropped_assistant: Seq,
    ) -> SessionLog {
        let mut log = SessionLog::new(now, epoch);
        log.next_seq = next_seq;
        log.last_assistant = last_assistant;
        log.dropped_assistant = dropped_assistant;
        log
    }

    /// Raises the counters to at least these (a session read back
    /// whole: the rows replayed may have set them lower than the log
    /// they were read from had them).
    pub fn raise_counters(&mut self, next_seq: Seq, last_assistant: Seq, dropped_assistant: Seq) {
        self.next_seq = self.next_seq.max(next_seq);
        self.last_assistant = self.last_assistant.max(last_assistant);
        self.dropped_assistant = self.dropped_assistant.max(dropped_assistant);
    }

    /// The `seq` the next message gets; appending it moves this on.
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }

    /// The oldest retained `seq`, or the next one when nothing is retained.
    pub fn first_seq(&self) -> Seq {
        self.history.front().map_or(self.next_seq, |m| m.seq)
    }

    /// Whether the prompt with this `seq` is pending.
    pub fn is_pending(&self, seq: Seq) -> bool {
        self.pending.from(seq).next().is_some_and(|m| m.seq == seq)
    }

    /// The counters a restore takes as its floor (see
    /// [`restored`](Self::restored)): the next `seq`, the newest answer's,
    /// and the newest answer's that history dropped.
    pub fn counters(&self) -> (Seq, Seq, Seq) {
        (self.next_seq, self.last_assistant, self.dropped_assistant)
    }

    /// Unanswered prompts.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Whether a prompt with this id is pending or in history.
    pub fn has_prompt(&self, client_msg_id: &str) -> bool {
        self.prompts.contains_key(client_msg_id)
    }

    /// The decoded text of the prompt stored under `client_msg_id`, while
    /// it is pending or in history (a resend of the same id needs it, to
    /// tell a resend from a reuse of the id); `None` once only its id is
    /// remembered.
    pub fn prompt_text(&self, client_msg_id: &str) -> Option<String> {
        let entry = self.prompts.get(client_msg_id)?;
        let msg = if entry.in_history {
            let first = self.history.front()?.seq;
            let at = usize::try_from(entry.seq.get().checked_sub(first.get())?).ok()?;
            self.history.get(at).filter(|m| m.seq == entry.seq)
        } else if !entry.answered {
            self.pending
                .from(entry.seq)
                .next()
                .filter(|m| m.seq == entry.seq)
        } else {
            None
        }?;
        prompt_text_of(msg.data())
    }

    /// Whether the prompt under `client_msg_id` is known, pending,
    /// answered or cancelled (the rules of answers and cancels read it).
    pub fn prompt_state(&self, client_msg_id: &str) -> PromptState {
        match self.prompts.get(client_msg_id) {
            None => PromptState::Unknown,
            Some(PromptEntry {
                cancel: Some(seq), ..
            }) => PromptState::Cancelled(*seq),
            Some(e) if e.answered => PromptState::Answered,
            Some(_) => PromptState::Pending,
        }
    }

    /// The `seq` of the prompt stored under `client_msg_id`, while it is
    /// pending or in history.
    pub fn prompt_seq(&self, client_msg_id: &str) -> Option<Seq> {
        self.prompts.get(client_msg_id).map(|e| e.seq)
    }

    /// The stored id of a prompt, shared, if it is pending or in history.
    pub fn prompt_id(&self, client_msg_id: &str) -> Option<Rc<str>> {
        self.prompts
            .get_key_value(client_msg_id)
            .map(|(k, _)| k.clone())
    }

    /// The assistant message stored under `assistant_msg_id`, while in history.
    pub fn response(&self, assistant_msg_id: &str) -> Option<&ResponseEntry> {
        self.responses.get(assistant_msg_id)
    }

    /// Appends a new prompt (its `seq` from [`next_seq`](Self::next_seq)).
    /// Returns whether it is newly pending: the store then gives it its
    /// arrival number ([`number_pending`](Self::number_pending)).
    pub fn append_prompt(&mut self, msg: Message, history_limit: usize) -> bool {
        let msg = Rc::new(msg);
        let entry = PromptEntry {
            seq: msg.seq,
            answered: false,
            in_history: true,
            cancel: None,
        };
        self.prompts.insert(msg.client_msg_id.clone(), entry);
        let fresh = self.pending.insert(msg.clone(), self.seed as usize);
        self.forget_page();
        self.push_history(msg, history_limit);
        self.sync();
        fresh
    }

    /// Gives the pending prompt at `seq` its arrival number in the store.
    pub fn number_pending(&mut self, seq: Seq, arrival: u64) {
        self.pending.number(seq, arrival);
    }

    /// Gives every pending prompt, oldest first, the arrival number
    /// `arrival` returns for its `seq` (the store taking the log whole).
    pub fn number_all_pending(&mut self, arrival: impl FnMut(Seq) -> u64) {
        self.pending.number_all(arrival);
    }

    /// The arrival numbers of the pending prompts (the store dropping
    /// the log removes them from its order).
    pub fn pending_arrivals(&self) -> impl Iterator<Item = u64> {
        self.pending.arrivals()
    }

    /// Appends an assistant message and marks its prompt answered. Returns
    /// the `seq` of the assistant message before it (0 if none), which tells
    /// a live subscriber whether it has everything before this one, and the
    /// arrival number of the prompt it took off the pending set, if any.
    pub fn append_response(&mut self, msg: Message, history_limit: usize) -> (Seq, Option<u64>) {
        let msg = Rc::new(msg);
        let prev = self.last_assistant;
        self.last_assistant = msg.seq;
        let left = self.mark_answered(&msg.client_msg_id);
        if let Some(id) = &msg.assistant_msg_id {
            let entry = ResponseEntry {
                client_msg_id: msg.client_msg_id.clone(),
                msg: msg.clone(),
            };
            self.responses.insert(id.clone(), entry);
        }
        self.push_history(msg, history_limit);
        self.sync();
        (prev, left)
    }

    /// Appends a cancel (its `client_msg_id` the prompt it stops): the
    /// prompt leaves the pending set and remembers the cancel's `seq`
    /// while its entry lives. Returns what
    /// [`append_response`](Self::append_response) does.
    pub fn append_cancel(&mut self, msg: Message, history_limit: usize) -> (Seq, Option<u64>) {
        let msg = Rc::new(msg);
        let prev = self.last_assistant;
        self.last_assistant = msg.seq;
        let left = self.mark_answered(&msg.client_msg_id);
        if let Some(entry) = self.prompts.get_mut(&msg.client_msg_id) {
            entry.cancel = Some(msg.seq);
        }
        self.push_history(msg, history_limit);
        self.sync();
        (prev, left)
    }

    /// The asks this log knows (see [`Asks`]), if any was ever stored.
    fn asks(&self) -> Option<&Asks> {
        self.extra.as_ref().map(|x| &x.asks)
    }

    /// The ask `ask_id` if it is known at `now` ([`Asks::get`]).
    pub fn ask(&self, ask_id: &str, now: UnixMillis) -> Option<&AskEntry> {
        self.asks()?.get(ask_id, now)
    }

    /// The ask `ask_id` as kept, known or not ([`Asks::kept`]).
    pub fn kept_ask(&self, ask_id: &str) -> Option<&AskEntry> {
        self.asks()?.kept(ask_id)
    }

    /// Unanswered prompts and asks open at `now` (unix ms): what the
    /// pending cap counts.
    pub fn pending_with_asks(&self, now: u64) -> usize {
        self.pending.len() + self.asks().map_or(0, |a| a.open_len(now))
    }

    /// Whether the message at `seq`, below history, is kept: a pending
    /// prompt, or an unanswered ask.
    pub fn retains(&self, seq: Seq) -> bool {
        self.is_pending(seq) || self.asks().is_some_and(|a| a.retains(seq))
    }

    /// Appends an ask (its `client_msg_id` field holds its `ask_id`).
    /// Returns the `seq` of the framed message before it, as
    /// [`append_response`](Self::append_response) does, and the asks
    /// forgotten meanwhile (dropped by history, and expired by its `ts`).
    pub fn append_ask(&mut self, msg: Message, history_limit: usize) -> (Seq, Vec<Seq>) {
        let msg = Rc::new(msg);
        let prev = self.last_assistant;
        self.last_assistant = msg.seq;
        let gone = self
            .extra()
            .asks
            .asked(msg.client_msg_id.clone(), msg.seq, msg.ts, msg.data());
        self.push_history(msg, history_limit);
        self.reweigh_asks();
        self.sync();
        (prev, gone)
    }

    /// Appends a reply (its `client_msg_id` field holds the `ask_id` it
    /// answers). Returns the `seq` of the framed message before it, and
    /// the ask's when history had dropped it and it is now forgotten.
    pub fn append_reply(&mut self, msg: Message, history_limit: usize) -> (Seq, Option<Seq>) {
        let msg = Rc::new(msg);
        let prev = self.last_assistant;
        self.last_assistant = msg.seq;
        let gone = self
            .extra()
            .asks
            .replied(&msg.client_msg_id, msg.seq, msg.data());
        self.push_history(msg, history_limit);
        self.reweigh_asks();
        self.sync();
        (prev, gone)
    }

    /// Appends to history, dropping the oldest messages past `limit` and the
    /// dedupe entries that only history kept alive.
    fn push_history(&mut self, msg: Rc<Message>, limit: usize) {
        // A message committed by the storage thread comes with its seq.
        self.next_seq = self.next_seq.max(msg.seq.next());
        grow_early(&mut self.history, self.seed as usize);
        self.held += weight::message(&msg);
        self.history.push_back(msg);
        let mut asks_trimmed = false;
        while self.history.len() > limit {
            let Some(old) = self.history.pop_front() else {
                break;
            };
            // A prompt still pending stays held by the pending set.
            let pending = old.kind == Kind::Prompt
                && self
                    .prompts
                    .get(&old.client_msg_id)
                    .is_some_and(|e| !e.answered);
            if !pending {
                self.held = self.held.saturating_sub(weight::message(&old));
            }
            match old.kind {
                Kind::Prompt => {
                    let answered = self.prompts.get_mut(&old.client_msg_id).is_some_and(|e| {
                        e.in_history = false;
                        e.answered
                    });
                    if answered {
                        self.prompts.remove(&old.client_msg_id);
                    }
                }
                Kind::Assistant => {
                    self.dropped_assistant = self.dropped_assistant.max(old.seq);
                    if let Some(id) = &old.assistant_msg_id {
                        self.responses.remove(id);
                    }
                }
                Kind::Cancel => {
                    self.dropped_assistant = self.dropped_assistant.max(old.seq);
                }
                Kind::Ask => {
                    self.dropped_assistant = self.dropped_assistant.max(old.seq);
                    if let Some(x) = &mut self.extra {
                        x.asks.trimmed(&old.client_msg_id, old.seq);
                        asks_trimmed = true;
                    }
                }
                Kind::Reply => {
                    self.dropped_assistant = self.dropped_assistant.max(old.seq);
                }
            }
        }
        if asks_trimmed {
            self.reweigh_asks();
        }
    }

    /// Marks a prompt answered: it leaves the pending set, and its dedupe
    /// entry goes too if history no longer holds it. Returns the arrival
    /// number of the prompt that left the pending set, if one did.
    fn mark_answered(&mut self, client_msg_id: &str) -> Option<u64> {
        let entry = self.prompts.get_mut(client_msg_id)?;
        if entry.answered {
            return None;
        }
        entry.answered = true;
        if !entry.in_history {
            // History dropped it already: it leaves with the pending set.
            let seq = entry.seq;
            let w = self
                .pending
                .from(seq)
                .next()
                .filter(|m| m.seq == seq)
                .map_or(0, |m| weight::message(m));
            self.held = self.held.saturating_sub(w);
        }
        let left = self.pending.remove(entry.seq);
        if !entry.in_history {
            self.prompts.remove(client_msg_id);
        }
        self.forget_page();
        left
    }

    /// The pending prompt at `seq`, if it is pending.
    pub fn pending_at(&self, seq: Seq) -> Option<&Rc<Message>> {
        self.pending.from(seq).next().filter(|m| m.seq == seq)
    }

    /// Every pending prompt, oldest first.
    pub fn page_all_pending(&self) -> impl Iterator<Item = &Rc<Message>> {
        self.pending.from(Seq(0))
    }

    /// Whether any pending prompt has `seq > after`.
    pub fn has_pending_after(&self, after: Option<Seq>) -> bool {
        let from = after.map_or(Seq(0), Seq::next);
        self.pending.from(from).next().is_some()
    }

    /// `[…]` of the pending prompts with `seq > after`, oldest first, at
    /// most [`MAX_PAGE_BYTES`] (always at least one prompt): the agent asks
    /// for the rest with `after` set to the last `seq` it got. The bytes are
    /// shared with every other agent asking the same while nothing changes.
    /// A prompt read back damaged that the page would carry is an error
    /// instead ([`Message::damaged`]).
    pub fn pending_page(&mut self, after: Option<Seq>) -> Result<Rc<[u8]>, ApiError> {
        if let Some((a, body)) = self.extra.as_ref().and_then(|x| x.page.as_ref())
            && *a == after
        {
            return Ok(body.clone());
        }
        let from = after.map_or(Seq(0), Seq::next);
        let mut out = Vec::with_capacity(64);
        out.push(b'[');
        for msg in self.pending.from(from) {
            let data = msg.data();
            if out.len() > 1 {
                if out.len() + data.len() + 2 > MAX_PAGE_BYTES {
                    break;
                }
                out.push(b',');
            }
            if msg.is_damaged() {
                return Err(ApiError::stored_message_damaged(msg.seq.get()));
            }
            out.extend_from_slice(data);
        }
        out.push(b']');
        let body: Rc<[u8]> = Rc::from(out);
        self.extra().page = Some((after, body.clone()));
        self.sync();
        Ok(body)
    }

    /// Drops the rendered page kept for the next agent asking the same
    /// (a read at the memory budget must not take the count past it).
    pub fn drop_page(&mut self) {
        self.forget_page();
        // The box made only for the page goes with it.
        if self.extra.as_ref().is_some_and(|x| x.asks_held == 0) {
            self.extra = None;
        }
        self.sync();
    }

    /// The prompts [`pending_page`](Self::pending_page) carries for
    /// `after`, by the same size rule.
    pub fn page_prompts(&self, after: Option<Seq>) -> impl Iterator<Item = &Rc<Message>> {
        let from = after.map_or(Seq(0), Seq::next);
        let mut len = 1usize;
        self.pending.from(from).take_while(move |msg| {
            let n = msg.data().len();
            if len > 1 {
                if len + n + 2 > MAX_PAGE_BYTES {
                    return false;
                }
                len += 1;
            }
            len += n;
            true
        })
    }

    /// History, pending set, prompt ids and answer ids held: the bounds
    /// the unit tests check.
    #[cfg(test)]
    pub fn sizes(&self) -> (usize, usize, usize, usize) {
        (
            self.history.len(),
            self.pending.len(),
            self.prompts.len(),
            self.responses.len(),
        )
    }

    /// Every retained message, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &Rc<Message>> {
        self.history.iter()
    }

    /// The position of a subscriber that connects with `after` and `epoch`
    /// (contract, "Continuity"): a resync first when its epoch differs or
    /// messages after its cursor were dropped (`after + 1 < first_seq`);
    /// without `after`, it starts at the end of the log (live only).
    pub fn cursor(&self, after: Option<Seq>, epoch: Option<&str>) -> Cursor {
        let first_seq = self.first_seq();
        let epoch_changed = epoch.is_some_and(|e| e != self.epoch());
        let trimmed = after.is_some_and(|a| a.next() < first_seq);
        match after {
            _ if epoch_changed || trimmed => Cursor {
                seq: first_seq.before(),
                resync: true,
            },
            Some(a) => Cursor {
                seq: a,
                resync: false,
            },
            None => Cursor {
                seq: self.next_seq.before(),
                resync: false,
            },
        }
    }

    /// Pulls the frames a subscriber at `cursor` needs next into `out`:
    /// a `resync` first when one is owed or history was trimmed past an
    /// assistant message it never got, then the assistant messages after
    /// it, oldest first, while they fit in `room` bytes (the first one
    /// always fits when `empty`, so a frame larger than the room still goes
    /// out). Returns true when the subscriber is caught up: everything
    /// stored is sent, and the next live message can go straight to it.
    pub fn refill(
        &self,
        cursor: &mut Cursor,
        mut room: usize,
        empty: bool,
        out: &mut Vec<Rc<[u8]>>,
    ) -> Refill {
        let first_seq = self.first_seq();
        if self.dropped_assistant > cursor.seq {
            cursor.resync = true;
        }
        let mut any = !empty;
        let resynced = cursor.resync;
        if cursor.resync {
            let frame: Rc<[u8]> = Rc::from(self.resync_frame(first_seq));
            room = room.saturating_sub(frame.len());
            out.push(frame);
            cursor.resync = false;
            cursor.seq = first_seq.before();
            any = true;
        }
        let start = cursor.seq.next().max(first_seq);
        let skip = (start.get() - first_seq.get()) as usize;
        for msg in self.history.iter().skip(skip) {
            let Some(frame) = msg.frame() else { continue };
            if any && frame.len() > room {
                return Refill {
                    caught_up: false,
                    resynced,
                };
            }
            room = room.saturating_sub(frame.len());
            out.push(frame.clone());
            cursor.seq = msg.seq;
            any = true;
        }
        cursor.seq = cursor.seq.max(self.next_seq.before());
        Refill {
            caught_up: true,
            resynced,
        }
    }

    /// `GET /messages`: a page of history, oldest first, at most
    /// [`MAX_PAGE_BYTES`] (always at least one message): a page that would
    /// pass it ends early and its `limit` reports the count applied, so
    /// `offset + limit` is where the next page starts. `total` counts every
    /// match.
    /// A message read back damaged that the page would carry is an
    /// error instead ([`Message::damaged`]).
    pub fn messages_page(&self, sid: &str, q: &MessagesQuery) -> Result<Vec<u8>, ApiError> {
        let matching = self
            .history
            .iter()
            .filter(|m| q.since.is_none_or(|t| m.ts > t) && q.after.is_none_or(|a| m.seq > a));
        let mut total = 0usize;
        let mut returned = 0usize;
        let mut page_full = false;
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"session_id\":");
        out.extend_from_slice(&to_json(&sid));
        out.extend_from_slice(b",\"epoch\":");
        out.extend_from_slice(&to_json(&self.epoch()));
        out.extend_from_slice(b",\"messages\":[");
        for m in matching {
            if total >= q.offset && returned < q.limit && !page_full {
                if returned > 0 && out.len() + m.data().len() + 32 > MAX_PAGE_BYTES {
                    page_full = true;
                } else {
                    if m.is_damaged() {
                        return Err(ApiError::stored_message_damaged(m.seq.get()));
                    }
                    if returned > 0 {
                        out.push(b',');
                    }
                    m.write_history_entry(&mut out);
                    returned += 1;
                }
            }
            total += 1;
        }
        let limit = if page_full { returned } else { q.limit };
        out.extend_from_slice(
            format!(
                "],\"total\":{total},\"limit\":{limit},\"offset\":{}}}",
                q.offset
            )
            .as_bytes(),
        );
        Ok(out)
    }

    fn resync_frame(&self, first_seq: Seq) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Resync<'a> {
            r#type: &'static str,
            epoch: &'a str,
            first_seq: u64,
        }
        let payload = to_json(&Resync {
            r#type: "resync",
            epoch: self.epoch(),
            first_seq: first_seq.get(),
        });
        wsframe::text_frame(&[&payload])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::message::Parts;

    const LIMIT: usize = 1000;

    #[test]
    fn an_empty_session_stays_small() {
        // Every session takes this much, in its box in the store's map
        // (docs/src/benchmarks.md, idle connections): a part most sessions
        // never use goes in `Extra`. Built for the tests, each dedupe map
        // carries 8 bytes more of hash keys (`fixed-hash-keys`): 320 in
        // the release, a block of 336 from the allocator.
        let size = std::mem::size_of::<SessionLog>();
        assert!(size <= 336, "a session's log is {size} bytes");
    }

    fn log() -> SessionLog {
        SessionLog::new(Millis(0), "epoch-1")
    }

    fn parts(text: &str, seq: Seq) -> Parts<'_> {
        Parts {
            session_id: "s",
            id_literal: "\"id\"",
            prompt_id: Some("c"),
            text,
            metadata: None,
            ts: 0,
            seq,
        }
    }

    /// Appends a prompt with id `id`.
    fn prompt(l: &mut SessionLog, id: &str, text: &str, limit: usize) {
        let seq = l.next_seq();
        let p = Parts {
            prompt_id: None,
            ..parts(text, seq)
        };
        l.append_prompt(Message::prompt(Rc::from(id), &p), limit);
    }

    /// A prompt and its answer of `text_len` bytes; returns the answer's seq.
    fn exchange(l: &mut SessionLog, n: usize, text_len: usize, limit: usize) -> Seq {
        let id: Rc<str> = Rc::from(format!("c{n}"));
        prompt(l, &id, "\"q\"", limit);
        let seq = l.next_seq();
        let text = format!("\"{}\"", "x".repeat(text_len));
        let msg = Message::assistant(id, Rc::from(format!("a{n}")), &parts(&text, seq));
        l.append_response(msg, limit);
        seq
    }

    /// The JSON payloads of frames.
    fn payloads(frames: &[Rc<[u8]>]) -> Vec<serde_json::Value> {
        frames
            .iter()
            .map(|f| {
                let at = match f[1] {
                    126 => 4,
                    127 => 10,
                    _ => 2,
                };
                serde_json::from_slice(&f[at..]).expect("JSON payload")
            })
            .collect()
    }

    fn seqs(frames: &[Rc<[u8]>]) -> Vec<u64> {
        payloads(frames)
            .iter()
            .filter(|p| p["type"] == "message")
            .map(|p| p["data"]["seq"].as_u64().expect("seq"))
            .collect()
    }

    #[test]
    fn a_refill_is_paced_by_the_room_and_resumes_at_the_cursor() {
        let mut l = log();
        for n in 0..10 {
            exchange(&mut l, n, 100, LIMIT);
        }
        let mut cursor = l.cursor(Some(Seq(0)), None);
        let frame_len = l.history().nth(1).and_then(|m| m.frame()).unwrap().len();
        let mut out = Vec::new();
        // Room for three frames and a bit: three go, and it is not caught up.
        assert!(
            !l.refill(&mut cursor, 3 * frame_len + 10, false, &mut out)
                .caught_up
        );
        assert_eq!(seqs(&out), vec![2, 4, 6]);
        assert_eq!(cursor.seq, Seq(6));
        out.clear();
        // No room, but an empty queue: one frame still goes.
        assert!(!l.refill(&mut cursor, 0, true, &mut out).caught_up);
        assert_eq!(seqs(&out), vec![8]);
        out.clear();
        assert!(l.refill(&mut cursor, usize::MAX, false, &mut out).caught_up);
        assert_eq!(seqs(&out), vec![10, 12, 14, 16, 18, 20]);
        assert_eq!(cursor.seq, Seq(20), "caught up at the end of the log");
    }

    #[test]
    fn a_live_message_goes_straight_only_to_a_caught_up_cursor() {
        let mut l = log();
        let a = exchange(&mut l, 0, 10, LIMIT);
        let mut live = l.cursor(None, None);
        assert_eq!(live.seq, a, "without after: the end of the log");
        let mut behind = l.cursor(Some(Seq(0)), None);
        let ahead = l.cursor(Some(Seq(100)), None);
        let b = exchange(&mut l, 1, 10, LIMIT);
        assert_eq!(live.live(b, a), Live::Next);
        live.advance(b);
        assert_eq!(behind.live(b, a), Live::Behind);
        assert_eq!(ahead.live(b, a), Live::Skip);
        let mut out = Vec::new();
        assert!(l.refill(&mut behind, usize::MAX, true, &mut out).caught_up);
        assert_eq!(seqs(&out), vec![a.get(), b.get()]);
        assert_eq!(live, behind, "both at the end of the log");
    }

    #[test]
    fn prompts_after_a_caught_up_cursor_do_not_make_it_behind() {
        let mut l = log();
        let a = exchange(&mut l, 0, 10, 4);
        let mut cursor = l.cursor(None, None);
        // Prompts only, trimming history past the cursor.
        for n in 0..10 {
            prompt(&mut l, &format!("p{n}"), "\"q\"", 4);
        }
        assert!(l.first_seq() > a.next());
        let mut out = Vec::new();
        assert!(l.refill(&mut cursor, usize::MAX, true, &mut out).caught_up);
        assert!(out.is_empty(), "no answer was missed, so no resync");
        let b = exchange(&mut l, 1, 10, 4);
        assert_eq!(cursor.live(b, a), Live::Next);
    }

    #[test]
    fn history_trimmed_past_a_lagging_cursor_resyncs_from_first_seq() {
        let mut l = log();
        exchange(&mut l, 0, 10, 6);
        let mut cursor = l.cursor(Some(Seq(0)), None);
        let mut out = Vec::new();
        assert!(
            !l.refill(&mut cursor, 0, false, &mut out).caught_up,
            "no room yet"
        );
        for n in 1..10 {
            exchange(&mut l, n, 10, 6);
        }
        let first = l.first_seq();
        assert_eq!(first, Seq(15), "six messages retained: 15 to 20");
        assert!(l.refill(&mut cursor, usize::MAX, true, &mut out).caught_up);
        let p = payloads(&out);
        assert_eq!(
            p[0],
            serde_json::json!({"type": "resync", "epoch": "epoch-1", "first_seq": 15})
        );
        assert_eq!(seqs(&out), vec![16, 18, 20]);
    }

    #[test]
    fn connecting_with_another_epoch_or_a_trimmed_cursor_owes_a_resync() {
        let mut l = log();
        for n in 0..5 {
            exchange(&mut l, n, 10, 4);
        }
        assert_eq!(l.first_seq(), Seq(7));
        for (after, epoch, resync) in [
            (Some(5), None, true),
            (Some(6), None, false),
            (Some(8), Some("epoch-1"), false),
            (Some(8), Some("epoch-0"), true),
            (None, Some("epoch-0"), true),
        ] {
            let mut c = l.cursor(after.map(Seq), epoch);
            let mut out = Vec::new();
            l.refill(&mut c, usize::MAX, true, &mut out);
            let first = payloads(&out).first().map(|p| p["type"].clone());
            assert_eq!(
                first == Some(serde_json::json!("resync")),
                resync,
                "after {after:?} epoch {epoch:?}"
            );
        }
    }

    #[test]
    fn a_pending_page_stops_at_four_mib_and_is_shared_until_a_change() {
        let mut l = log();
        let big = format!("\"{}\"", "y".repeat(120 * 1024));
        for n in 0..40 {
            prompt(&mut l, &format!("p{n}"), &big, LIMIT);
        }
        let page = l.pending_page(None).unwrap();
        assert!(page.len() <= MAX_PAGE_BYTES);
        let list: Vec<serde_json::Value> = serde_json::from_slice(&page).unwrap();
        assert!(
            list.len() < 40 && !list.is_empty(),
            "{} prompts",
            list.len()
        );
        assert!(
            Rc::ptr_eq(&page, &l.pending_page(None).unwrap()),
            "shared bytes"
        );
        prompt(&mut l, "new", "\"q\"", LIMIT);
        assert!(
            !Rc::ptr_eq(&page, &l.pending_page(None).unwrap()),
            "a change renders anew"
        );
    }
}
