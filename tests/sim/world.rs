//! The simulated world: the real API rules and relay core (and through
//! them the store and the memory engine) driven as the I/O shell drives
//! them (`src/net`), with no sockets and a virtual clock. Each step is
//! one request handled, one client's socket read or closed, or the clock
//! moved on; the relay's effects are then applied to the simulated
//! connections as `net/server/effects.rs` applies them, and the model is
//! checked.
//!
//! The shell's parts are mirrored here, not run: a parked request is a
//! deadline and the promise of one answer; a subscriber is its cursor,
//! its `lagging` flag and a queue capped like `RELAY_SUBSCRIBER_BUFFER`,
//! delivered, broadcast to and topped up by the rules of
//! `net/subscriber.rs`, and read by its client at its own pace.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;
use std::time::Duration;

use relay::api::{Api, Facts, Outcome};
use relay::config::Config;
use relay::error::ApiError;
use relay::http::parse::{RequestReader, Step};
use relay::relay::{ConnId, Effect, Engine, Relay, Ticket};
use relay::store::seam::NOBODY;
use relay::store::sqlite::Durable;
use relay::store::{Cursor, Kind, Live, MemStore, Seq, SessionId};
use relay::time::{Millis, Turn};
use serde_json::Value;

use crate::model::{Model, View};
use crate::ops::{Op, Reading, SESSIONS, WIDE_SESSIONS};

mod links;
mod requests;
mod resident;
mod shared;
mod shell;
mod storage;

/// Messages each session keeps: few, so history is trimmed all the time.
pub const HISTORY: usize = 8;
/// Bytes queued per subscriber: a few frames, so subscribers lag often.
const SUB_BUFFER: usize = 700;
const TTL_MS: u64 = 10_000;
/// How long a request waits for the storage before it is answered `503`.
const STORE_TIMEOUT_MS: u64 = 4_000;
/// The wall clock when the run starts (any fixed value: runs replay).
const UNIX_START: u64 = 1_800_000_000_000;
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The memory budget of the seeds that run with one: a few sessions'
/// worth of messages, so the clients' writes reach it within a few
/// dozen steps, and deletions, trimming and the TTL bring it back down.
pub const BUDGET: usize = 6_000;
/// The memory budget of the data directory's seeds that run with one:
/// about a session's worth, so that every step's end drops the sessions
/// nothing holds, and most requests find their session on disk only.
pub const EVICT_BUDGET: usize = 6_000;
/// More than any one simulated write adds to the memory count (a new
/// session with its first message): a write is refused at the budget
/// only when the count is within this of it.
const LARGEST_WRITE: usize = 1_500;

/// A request waiting for its answer.
#[derive(Debug)]
struct Parked {
    /// `None`: a poll of every session.
    sid: Option<String>,
    after: Option<u64>,
    deadline: Millis,
    /// A `GET /asks`: its ask id, and when the ask expires (loop time,
    /// wall clock).
    ask: Option<(String, Millis, u64)>,
    /// The life of its session it waits on.
    inc: Option<usize>,
}

struct Sub {
    sid: SessionId,
    cursor: Cursor,
    lagging: bool,
    out: VecDeque<Rc<[u8]>>,
    queued: usize,
    reading: Reading,
    view: View,
}

/// A request waiting for the storage, under its ticket.
struct Committing {
    ticket: Ticket,
    waits: Waits,
    /// Its storage timeout.
    deadline: Millis,
}

/// What a request waiting for the storage was.
enum Waits {
    /// A write: answered with its command's outcome.
    Write(Op),
    /// A read of a session the relay's log lacks (dropped from memory,
    /// or not read since start), or of every session while the start's
    /// reading is under way: run again once it is read. With a shared
    /// store, a read waiting until the relay's copy holds what any relay
    /// stored before it: run again then. `since`: the life of its
    /// session and its next `seq` when it began, which its answer must
    /// reach.
    Read {
        raw: String,
        sid: Option<String>,
        after: Option<u64>,
        since: Option<(usize, u64)>,
    },
    /// A WebSocket upgrade that created its session: run again once it is.
    Upgrade {
        raw: String,
        after: Option<u64>,
        epoch: Option<String>,
        reading: Reading,
    },
}

enum State {
    Parked(Parked),
    Sub(Box<Sub>),
    Committing(Box<Committing>),
}

struct Conn {
    id: ConnId,
    state: State,
}

/// Where a subscriber stopped, for a later one to resume from.
struct Left {
    sid: String,
    after: u64,
    epoch: String,
}

/// One relay of the world and what its shell holds: the requests
/// waiting on it and its subscribers. A world has one; sharing a store
/// (`shared.rs`), several, of which one is `World::node` at a time.
pub(super) struct Node {
    api: Api,
    relay: Relay,
    reader: RequestReader,
    conns: Vec<Conn>,
    /// Generation of each slot key, as the slab reuses keys.
    generations: Vec<u32>,
    free: Vec<u32>,
    /// Connections kept open between requests: a later request comes on
    /// one under the same id, as a client's next request on its
    /// keep-alive connection does (after a `503` at its storage timeout,
    /// say, while its write may still come back).
    idle: Vec<ConnId>,
    effects: Vec<Effect>,
    frames: Vec<Rc<[u8]>>,
    next_sweep: Millis,
    left: Vec<Left>,
}

pub struct World {
    /// The relay a step acts on.
    node: Box<Node>,
    /// The other relays sharing the store, and which of them `node` is.
    others: Vec<Option<Box<Node>>>,
    at: usize,
    now: Millis,
    model: Model,
    sweep_ms: u64,
    /// The data directory's storage, played here; `None`: the memory
    /// engine.
    storage: Option<storage::Storage>,
    /// The shared store (Redis), played here, when the relays share one.
    shared: Option<shared::Shared>,
    /// The memory budget, when the run has a small one.
    budget: Option<usize>,
    /// A write was refused at the budget and none was taken since.
    full: bool,
    /// What outlives a restart of the relay.
    run: resident::Run,
    /// The sessions the clients touch: more with a data directory and a
    /// budget, whose steps are spread over more ([`Op::spread`]).
    sessions: u64,
    /// Operations run (requests, reads, deadlines fired).
    pub ops: u64,
    pub seen: Seen,
}

type Check = Result<(), String>;

/// What a run went through, so a run that checks nothing shows.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    pub steps: u64,
    pub stored: u64,
    pub refused: u64,
    pub parked: u64,
    pub woken: u64,
    pub timed_out: u64,
    pub hung_up: u64,
    pub closed_by_delete: u64,
    pub frames: u64,
    pub resyncs: u64,
    pub lagged: u64,
    pub collected: u64,
    pub ticks: u64,
    pub commits: u64,
    pub store_timeouts: u64,
    /// Links to the shared store cut, and its memory limit turned on or
    /// off.
    pub links_cut: u64,
    pub redis_oom: u64,
    /// Writes refused at the memory budget.
    pub over_budget: u64,
    /// Writes taken after a refusal at the budget, once space was freed.
    pub taken_again: u64,
    /// The most the count passed the budget by, in bytes.
    pub overshoot: u64,
    /// Sessions dropped from memory past the budget.
    pub evicted: u64,
    /// Sessions read back into memory.
    pub read_back: u64,
    /// Restarts of the relay.
    pub restarts: u64,
    /// Reads that waited for their session to be read back.
    pub read_waits: u64,
    /// All-sessions polls that waited for the start's reading.
    pub start_waits: u64,
    /// Restarts that lost committed transactions with the write-ahead
    /// log, and sessions given a new epoch at a start for it.
    pub lost_logs: u64,
    pub new_epochs: u64,
}

impl std::ops::AddAssign for Seen {
    fn add_assign(&mut self, o: Seen) {
        self.steps += o.steps;
        self.stored += o.stored;
        self.refused += o.refused;
        self.parked += o.parked;
        self.woken += o.woken;
        self.timed_out += o.timed_out;
        self.hung_up += o.hung_up;
        self.closed_by_delete += o.closed_by_delete;
        self.frames += o.frames;
        self.resyncs += o.resyncs;
        self.lagged += o.lagged;
        self.collected += o.collected;
        self.ticks += o.ticks;
        self.commits += o.commits;
        self.store_timeouts += o.store_timeouts;
        self.links_cut += o.links_cut;
        self.redis_oom += o.redis_oom;
        self.over_budget += o.over_budget;
        self.taken_again += o.taken_again;
        self.overshoot = self.overshoot.max(o.overshoot);
        self.evicted += o.evicted;
        self.read_back += o.read_back;
        self.restarts += o.restarts;
        self.read_waits += o.read_waits;
        self.start_waits += o.start_waits;
        self.lost_logs += o.lost_logs;
        self.new_epochs += o.new_epochs;
    }
}

fn sid_of(s: u64) -> String {
    format!("s{s}")
}

fn json(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|e| {
        format!(
            "an answer that is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    })
}

/// Where a world's relays store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Memory,
    /// A data directory, its storage thread played by the world.
    Durable,
    /// Redis, played by the world, shared by [`shared::NODES`] relays.
    Shared,
}

impl World {
    /// A world whose relay stores in memory, or through a data
    /// directory's storage thread played by the world, or whose relays
    /// share a Redis played by the world (`seed` draws its schedule);
    /// `budget`: a memory budget of that many bytes (the memory engine
    /// refuses writes past it), else the default, which a run never
    /// reaches.
    pub fn new(store: Store, budget: Option<usize>, seed: u64) -> World {
        let cfg = Config {
            history_limit: HISTORY,
            max_sessions: 100,
            max_pending: 4,
            max_waiters: 3,
            max_subscribers: 4,
            subscriber_buffer_bytes: SUB_BUFFER,
            session_ttl: Some(Duration::from_millis(TTL_MS)),
            draft_timeout: Duration::from_millis(3_000),
            agent_grace: Duration::from_millis(1_500),
            store_timeout: Duration::from_millis(STORE_TIMEOUT_MS),
            ..Config::default()
        };
        let cfg = Config {
            max_memory: budget.unwrap_or(cfg.max_memory),
            ..cfg
        };
        let limits = cfg.relay_limits();
        let now = Millis(1_000);
        let sweep_ms = (TTL_MS / 4).clamp(100, 60_000);
        let node = |mut relay: Relay| {
            relay.set_clock(now, UNIX_START);
            Box::new(Node {
                api: Api::new(&cfg),
                relay,
                reader: RequestReader::new(cfg.max_body_bytes),
                conns: Vec::new(),
                generations: Vec::new(),
                free: Vec::new(),
                idle: Vec::new(),
                effects: Vec::new(),
                frames: Vec::new(),
                next_sweep: now.after_ms(sweep_ms),
                left: Vec::new(),
            })
        };
        let (mut storage, mut shared, mut others) = (None, None, Vec::new());
        let first = match store {
            Store::Memory => node(Relay::in_memory(limits)),
            Store::Durable => {
                let (handle, side) = Durable::detached(limits.store());
                let view = MemStore::new(limits.store());
                storage = Some(storage::Storage::new(side, limits.store()));
                node(Relay::new(limits, view, Engine::Durable(handle)))
            }
            Store::Shared => {
                shared = Some(shared::Shared::new(limits.store(), seed));
                others.push(None);
                for _ in 1..shared::NODES {
                    others.push(Some(node(shared::relay(cfg.relay_limits()))));
                }
                node(shared::relay(limits))
            }
        };
        World {
            node: first,
            others,
            at: 0,
            now,
            model: Model::default(),
            sweep_ms,
            storage,
            shared,
            budget,
            full: false,
            run: resident::Run::new(&cfg),
            sessions: match (store, budget) {
                (Store::Durable, Some(_)) => WIDE_SESSIONS,
                _ => SESSIONS,
            },
            ops: 0,
            seen: Seen::default(),
        }
    }

    fn unix(&self) -> u64 {
        UNIX_START + self.now.0
    }

    /// A connection id as the slab hands them out: keys reused last in,
    /// first out, each reuse a new generation.
    fn connect(&mut self) -> ConnId {
        if self.ops.is_multiple_of(2)
            && let Some(id) = self.node.idle.pop()
        {
            return id;
        }
        let key = match self.node.free.pop() {
            Some(k) => k,
            None => {
                self.node.generations.push(0);
                self.node.generations.len() as u32 - 1
            }
        };
        self.node.generations[key as usize] += 1;
        ConnId {
            key,
            generation: self.node.generations[key as usize],
        }
    }

    /// A connection whose request was answered stays open for the next
    /// (a few of them do).
    fn release(&mut self, id: ConnId) {
        if self.node.idle.len() < 4 {
            self.node.idle.push(id);
        } else {
            self.close(id);
        }
    }

    /// A connection closed: its slot goes to the next one accepted.
    fn close(&mut self, id: ConnId) {
        self.node.free.push(id.key);
    }

    /// Runs one request through the parser and the API rules (`synced`:
    /// run again after what it waited for, as the shell's rerun does).
    fn request(&mut self, conn: ConnId, raw: &[u8], synced: bool) -> Result<Outcome, String> {
        self.ops += 1;
        self.node.relay.set_clock(self.now, self.unix());
        // No ticket left over from a request before it (`Ctx::handle`).
        let _ = self.node.relay.take_ticket();
        self.node.reader.push(raw);
        let head = match self.node.reader.next_step() {
            Ok(Step::Request(head)) => head,
            other => return Err(format!("the request did not parse: {other:?}")),
        };
        let facts = Facts {
            connections: self.node.conns.len() + 1,
            synced,
            ..Facts::default()
        };
        let turn = Turn {
            now: self.now,
            unix_ms: self.unix(),
        };
        let outcome = self.node.api.handle(
            &mut self.node.relay,
            turn,
            conn,
            PEER,
            &head,
            self.node.reader.body(),
            facts,
        );
        self.node.reader.finish();
        Ok(outcome)
    }

    /// A request answered now (`Some`), or waiting for the storage under
    /// a ticket (`None`): `op` is then answered when its ticket is.
    fn send(&mut self, op: &Op, raw: &str) -> Result<Option<(u16, Vec<u8>)>, String> {
        let id = self.connect();
        let outcome = self.request(id, raw.as_bytes(), false)?;
        match outcome {
            Outcome::Answer(a) => {
                self.release(id);
                self.count(a.status);
                if !matches!(op, Op::Messages { .. } | Op::Delete { .. }) {
                    self.budgeted(a.status, a.body.bytes())?;
                }
                Ok(Some((a.status, a.body.bytes().to_vec())))
            }
            Outcome::Wait => {
                let waits = match op {
                    // A read waiting until the relay's copy holds what
                    // the store held when it began.
                    Op::Messages { s } => Waits::Read {
                        raw: raw.to_string(),
                        sid: Some(sid_of(*s)),
                        after: None,
                        since: self
                            .model
                            .live(&sid_of(*s))
                            .map(|i| (i, self.model.incs[i].next_seq())),
                    },
                    _ => Waits::Write(op.clone()),
                };
                self.wait(id, waits)?;
                Ok(None)
            }
            other => Err(format!("answered {other:?}")),
        }
    }

    fn count(&mut self, status: u16) {
        if status == 200 {
            self.seen.stored += 1;
        } else {
            self.seen.refused += 1;
        }
    }

    /// A request answered `status` with `body`: a refusal at the memory
    /// budget must be the contract's, come only from a run with a budget
    /// and only when the count is near it (so a write is taken again once
    /// deletions, trimming or the TTL free space); a write taken after
    /// one is counted, to show the budget fills and empties.
    fn budgeted(&mut self, status: u16, body: &[u8]) -> Check {
        let new = !body.windows(16).any(|w| w == b"\"duplicate\":true");
        if status == 200 && new && self.full {
            self.full = false;
            self.seen.taken_again += 1;
        }
        if status != 503 || !body.windows(6).any(|w| w == b"budget") {
            return Ok(());
        }
        let want = r#"{"error":"Service Unavailable","details":"memory budget reached"}"#;
        if body != want.as_bytes() {
            return Err(format!(
                "a refusal at the budget answered {}",
                String::from_utf8_lossy(body)
            ));
        }
        let Some(budget) = self.budget else {
            return Err("a write refused at the budget in a run without one".to_string());
        };
        let held = self.node.relay.memory_bytes();
        // With a data directory sessions leave memory instead, and a
        // write is refused only past the budget, with nothing left to
        // drop (`world/resident.rs`).
        let near = match self.storage {
            None => held + LARGEST_WRITE > budget,
            Some(_) => held > budget,
        };
        if !near {
            return Err(format!(
                "a write refused at the budget of {budget} bytes with {held} held"
            ));
        }
        self.seen.over_budget += 1;
        self.full = true;
        Ok(())
    }

    /// The request just handled on `id` waits for the storage.
    fn wait(&mut self, id: ConnId, waits: Waits) -> Check {
        let ticket = self
            .node
            .relay
            .take_ticket()
            .ok_or("a request waits with no ticket")?;
        if self.alone() {
            return Err("the memory engine made a request wait".to_string());
        }
        self.node.conns.push(Conn {
            id,
            state: State::Committing(Box::new(Committing {
                ticket,
                waits,
                deadline: self.now.after_ms(STORE_TIMEOUT_MS),
            })),
        });
        Ok(())
    }

    /// Whether the relay's own log decides every write (the memory
    /// engine): elsewhere the model follows what the storage or the
    /// shared store decided.
    fn alone(&self) -> bool {
        self.storage.is_none() && self.shared.is_none()
    }

    /// Runs one step, then checks every promise. With a shared store, a
    /// client's step goes to one of the relays, the same one for the
    /// same step wherever it stands in a run (so a shrunk run keeps it).
    pub fn step(&mut self, op: &Op) -> Check {
        self.seen.steps += 1;
        if self.shared.is_some() {
            let name = op.to_string();
            let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
                (h ^ c as u64).wrapping_mul(0x100_0000_01b3)
            });
            self.enter((h % shared::NODES as u64) as usize);
        }
        crate::strace!("step at relay {}: {op}", self.at);
        self.act(op)?;
        if let Some(s) = op.session()
            && let Some(inc) = self.model.inc_mut(&sid_of(s))
        {
            inc.last_touch = self.now;
        }
        self.apply_effects()?;
        self.settle()?;
        // The turn ends: sessions dropped past the budget, and its writes
        // sent to the storage.
        self.end_turn()?;
        self.node.relay.flush_store();
        self.pump();
        self.check()
    }

    /// The relay may have created `sid` in this step: the model takes the
    /// new life with its epoch.
    fn learn(&mut self, sid: &str) -> Check {
        // With a storage, the model follows what it committed instead.
        if self.model.live(sid).is_none()
            && self.alone()
            && let Some(log) = self.node.relay.peek(sid)
        {
            let epoch = log.epoch().to_string();
            self.model.create(sid, &epoch, self.now)?;
        }
        Ok(())
    }

    fn holds(&self, c: &Conn, sid: &str) -> bool {
        match &c.state {
            State::Parked(p) => p.sid.as_deref() == Some(sid),
            State::Sub(sub) => sub.sid.as_str() == sid,
            State::Committing(_) => false,
        }
    }

    fn subscribers_of(&self, sid: &str) -> usize {
        self.node
            .conns
            .iter()
            .filter(|c| matches!(&c.state, State::Sub(s) if s.sid.as_str() == sid))
            .count()
    }

    /// The promises that hold after every step: each session's log as the
    /// model says, the relay's counts of parked polls and subscribers as
    /// the connections say, and the memory it counts as it goes equal to a
    /// recount from scratch.
    pub fn check(&mut self) -> Check {
        if self.shared.is_none() {
            return self.check_node();
        }
        let at = self.at;
        for n in 0..shared::NODES {
            self.enter(n);
            self.check_node().map_err(|e| format!("relay {n}: {e}"))?;
        }
        self.enter(at);
        Ok(())
    }

    fn check_node(&mut self) -> Check {
        if let Some(budget) = self.budget.filter(|_| self.storage.is_none()) {
            let over = self.node.relay.memory_bytes().saturating_sub(budget) as u64;
            self.seen.overshoot = self.seen.overshoot.max(over);
        }
        if self.shared.is_some() {
            for s in 0..SESSIONS {
                self.model
                    .compare_copy(&self.node.relay, &sid_of(s), HISTORY)?;
            }
        } else {
            self.check_sessions()?;
        }
        let counts = self.node.relay.counts();
        let parked = self
            .node
            .conns
            .iter()
            .filter(|c| matches!(c.state, State::Parked(_)))
            .count();
        let subs = self
            .node
            .conns
            .iter()
            .filter(|c| matches!(c.state, State::Sub(_)))
            .count();
        if counts.parked_polls != parked || counts.subscribers != subs {
            return Err(format!(
                "the relay counts {} parked polls and {} subscribers, {parked} and {subs} are",
                counts.parked_polls, counts.subscribers
            ));
        }
        if let Some(budget) = self.budget.filter(|_| self.storage.is_none())
            && self.node.relay.memory_bytes() > budget
        {
            return Err(format!(
                "{} bytes held for sessions, over the budget of {budget}",
                self.node.relay.memory_bytes()
            ));
        }
        if let Some((kept, walked)) = self.node.relay.memory_recount()
            && kept != walked
        {
            return Err(format!(
                "the relay counts {kept} bytes held for sessions, a recount {walked}"
            ));
        }
        // Until the start's reading is done, the relay knows only the
        // sessions it read or created since.
        if self.shared.is_none()
            && counts.sessions != self.model.current.len()
            && !self.node.relay.engine().warming()
        {
            return Err(format!(
                "the relay counts {} sessions, the model {}",
                counts.sessions,
                self.model.current.len()
            ));
        }
        Ok(())
    }
}
