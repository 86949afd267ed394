//! Several instances: every session's log lives in Redis, and each write
//! or read of a session is one call of one Lua script (`relay.lua`), which
//! Redis runs alone: dedupe, `seq`, caps, trimming and publishing happen in
//! one step, so concurrent instances never store an id twice or hand out
//! one `seq` twice.
//!
//! Each instance keeps a copy of the sessions it serves (the loop's
//! [`MemStore`](super::MemStore)) and serves reads from it once it is up to
//! date: every reply of the script carries what the caller's copy lacks
//! (it sends the epoch and next `seq` it holds), and every change is also
//! published on the session's own channel. Each instance's second
//! connection listens to the channels of the sessions someone waits on
//! there (a parked poll, a subscriber), so they hear of changes made
//! elsewhere, and to nothing else: a write nobody waits for costs no
//! delivery. Once a channel is listened to, the session is read again, so
//! nothing published before that is missed. Published records are hints:
//! one that does not follow the copy (a gap, another epoch) makes the
//! instance read the session again.
//!
//! A read waits until the copy holds everything acknowledged before it
//! began. For a session whose channel is listened to, whose copy follows
//! it without a gap, that is one `PING` on the channel connection: Redis
//! answers it after every message it published before it, and every write
//! acknowledged before the read began was published before the `PING`
//! (the script publishes before it returns, and Redis sends a client's
//! messages and replies in order). The reads of one loop turn share one
//! `PING`. Any other session is read through the script.
//!
//! A write Redis refuses leaves no trace. Out of memory (`maxmemory` with
//! `noeviction`), Redis refuses a function that may write up front,
//! before it runs; reads go to a `no-writes` function, which runs, and
//! the writes that only delete to an `allow-oom` one, as they ran as a
//! script. As a script, which declares no flags (a `#!lua` line, which
//! Redis 6.2 would not parse), Redis refuses a write command that may
//! grow memory only while the script has written nothing yet, and aborts
//! the script there (`redis.call` raises; the script never uses
//! `redis.pcall`); once a write went through, the rest are run, over the
//! limit: a PUBLISH before the refused write would still go out, and an
//! HDEL before an HSET would let the HSET through. So every write path of
//! the script makes its growing write (HSET, ZADD) first, deletes (HDEL,
//! DEL) after it, and publishes only once every write went through: a
//! refused call changed nothing and told nobody. A relay that sees a write refused
//! reads that session again all the same ([`Event::Refused`]).
//!
//! Sans-IO like the relay core: the shell owns the two sockets, hands
//! their bytes to [`RedisStore::input`] and writes what
//! [`RedisStore::take_output`] gives. Replies are decoded with
//! `redis-protocol`; commands are RESP arrays of bulk strings.
//!
//! The rooms, besides the [`RedisStore`] itself here (its state, its
//! construction, its health and the requests that are no client's write):
//!
//! - `link`: the two links set up (log-in, the script and the library
//!   loaded, the channels subscribed) and lost, and their output;
//! - `pipeline`: any script call written into the command link, with the
//!   reply it expects queued behind it; a turn's prompts as one call;
//! - `route`: replies routed to what waits for them, and published
//!   changes read off the events link;
//! - `calls`: each write's own call, and the reading of its answer;
//! - `copy`: the engine against this instance's copy: writes sent with
//!   what it holds, reads that wait for it, replies and changes turned
//!   into the relay's events;
//! - `follow`: which channels are listened to, barriers and resyncs;
//! - `lease`: how other instances hear of this one's agent;
//! - `every`: the order of every pending prompt, the arrivals, and the
//!   agents of every session;
//! - `health`: the probe, readiness, and a lost store noticed;
//! - `sentinel`: where the master is, as Redis Sentinel says;
//! - `slot`: a Redis Cluster's buckets of sessions, their hash tags and
//!   slots;
//! - `cluster`: the router between the two links and a Redis Cluster's
//!   masters (its sockets are `net/redis/cluster.rs`);
//! - `codec`, `reply`, `url`: commands written, replies parsed, the URL.
//!
//! With `RELAY_REDIS_REPLICAS=N`, writes are followed by one
//! `WAIT N <storage timeout>`, which covers every write sent before it on
//! the link; their answers (and every reply behind them) are held until
//! it is answered, and each becomes `504` ("may be stored") when fewer
//! than N replicas confirmed in time. One `WAIT` is in flight at a time:
//! Redis runs nothing else of the link while it waits, so the writes
//! sent meanwhile wait for the next one.
//!
//! After a Sentinel failover ([`RedisStore::master_moved`]) every session
//! the copy holds is read whole (followed ones before their channel is
//! listened to again), and one whose copy holds more than the new master
//! is given a new epoch there: the `seq`s of what was lost go to other
//! messages, so clients that saw it resync.

mod calls;
pub mod cluster;
mod codec;
mod copy;
mod every;
mod follow;
mod health;
mod lease;
mod link;
mod pipeline;
mod reply;
mod route;
mod sentinel;
pub mod slot;
mod url;

use std::collections::{HashMap, VecDeque};

pub use health::{Trouble, note};
pub use link::{Link, SCRIPT};
pub use reply::{Event, Head, Msg, Snapshot};
pub use route::{Answered, Then};
pub use sentinel::Sentinel;
pub use url::{RedisUrl, Sentinels};

use super::idmap::Keys;
use super::mem::{IdGen, MemStore, StoreLimits};
use super::seam::{EveryRead, StoreEvent, StoreStats};
use super::types::SessionId;
use crate::store::types::Ticket;
use crate::time::Millis;
use calls::Op;
use codec::push_command;
use follow::Follow;
use health::Health;
use link::{Functions, Side};
use pipeline::Gathered;
use route::Expect;

// The engine's larger functions are marked `#[inline(never)]`: each runs
// once per request or reply, so the call costs nothing beside its work,
// and kept out of line it is not copied into the poll loop at every call
// site, which would grow the static binary against its size budget
// (`MAX_IMAGE_BYTES` in `scripts/image.sh`, run by `scripts/release.sh`).

/// Requests sent and not answered above which the loop takes no new
/// request until some are answered (the pipeline stays bounded).
pub const MAX_INFLIGHT: usize = 16_384;
/// How many published deletions are remembered while calls are in
/// flight (see `RedisStore::deleted`).
const DELETED_KEPT: usize = 4096;

/// [`RedisStore::base`] from its parts, for callers that write into one
/// of the store's buffers meanwhile.
pub(super) fn base_in<'a>(bases: &'a [String], prefix: &'a str, sid: &str) -> &'a str {
    match bases.is_empty() {
        true => prefix,
        false => &bases[slot::bucket_of(sid.as_bytes())],
    }
}

/// What the caller's copy of a session holds: its epoch and next `seq`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Known<'a> {
    pub epoch: &'a str,
    pub next: u64,
}

/// The Redis engine's state.
pub struct RedisStore {
    url: RedisUrl,
    prefix: String,
    /// Listened to from the start: its confirmation says the link is set
    /// up. The agents of every session are published on it (`every.rs`).
    channel: String,
    /// Arrivals of prompts, listened to while an all-sessions poll is
    /// parked here (`every.rs`): one channel, or in a cluster one per
    /// bucket. `Some` while listened to, with a bit set for each channel
    /// Redis confirmed.
    arrivals_channels: Vec<String>,
    arrivals: Option<u64>,
    /// The highest arrival number this instance knows (heard, or read):
    /// the floor an all-sessions read raises every bucket's counter to
    /// in a cluster (`every.rs`).
    every_floor: u64,
    /// The all-sessions reads of a cluster waiting for their buckets'
    /// answers (`every.rs`): at most one per all-sessions poll parked
    /// here, whose number the relay's waiter cap bounds; a lost command
    /// link answers them all.
    merges: Vec<every::Merge>,
    /// Merged all-sessions pages waiting for the `WAIT` after their
    /// calls (`RELAY_REDIS_REPLICAS` in a cluster): the floors they
    /// raised must outlive a failover before a cursor relies on them.
    pages_held: Vec<(Ticket, EveryRead)>,
    merge_ids: u64,
    /// A merged read failed: the parked all-sessions polls read again
    /// when the next probe goes out.
    every_again_owed: bool,
    /// An all-sessions poll was parked here since the last sweep.
    arrivals_wanted: bool,
    /// The sessions whose channel this instance listens to, or that it
    /// reads on its own (one map: whether a copy follows its channel asks
    /// both at once, and an entry goes when neither holds).
    follow: HashMap<SessionId, Follow, Keys>,
    /// How many of them are listened to.
    listened: usize,
    /// The epochs whose deletion was published lately, newest last (at
    /// most [`DELETED_KEPT`]): a reply carrying one ran before the
    /// deletion, which the copy applied already (the links are read
    /// apart), and would put the deleted session back.
    deleted: VecDeque<(SessionId, String)>,
    /// Reads waiting for the next `PING` to go out, then for each `PING`
    /// sent, in order.
    barrier_next: Vec<(Ticket, SessionId)>,
    pings: VecDeque<Vec<(Ticket, SessionId)>>,
    /// The prompts of this turn not sent yet.
    batch: Vec<Gathered>,
    sessions_key: String,
    /// In cluster mode (`redis-cluster://`), each bucket's base,
    /// `<prefix>{<tag>}`, which every key of its sessions and its own
    /// index keys start with (`slot.rs`); empty otherwise: one Redis and
    /// Sentinel keep the layout without buckets.
    bases: Vec<String>,
    limits: StoreLimits,
    sha: String,
    functions: Functions,
    /// The library is loaded: calls go by `FCALL` (Redis 7 and later),
    /// not `EVALSHA`.
    fcall: bool,
    ids: IdGen,
    cmd: Side,
    ev: Side,
    expect: VecDeque<Expect>,
    answered: VecDeque<Answered>,
    events: VecDeque<Event>,
    /// Answers and events read against the copy, for the relay (see
    /// `copy.rs`).
    ready: VecDeque<StoreEvent>,
    /// Totals for `/metrics` (commands sent, errors).
    pub stats: StoreStats,
    /// The wall clock of the loop turn (unix ms): activity and the TTL.
    unix_ms: u64,
    /// This instance's name in Redis (a UUID chosen at start): the
    /// agent states and receipts published under it are this instance's
    /// own, and are not handed to the relay again.
    instance: String,
    health: Health,
    /// Replicas that must confirm a write (`WAIT`), and how long it
    /// waits for them (ms).
    replicas: u32,
    wait_ms: u64,
    /// A write was sent since the last `WAIT`.
    unwaited: bool,
    /// A `WAIT` was sent and is not answered (one at a time).
    waiting: bool,
    /// The master moved: the copies are renewed on the new one once the
    /// command link is up ([`renew_copies`](Self::renew_copies)).
    renew_owed: bool,
    /// While a `WAIT` is owed: how many replies at the front of
    /// `answered` may go to the relay (the rest wait for it).
    hold: Option<usize>,
}

impl RedisStore {
    pub fn new(url: RedisUrl, prefix: &str, limits: StoreLimits) -> RedisStore {
        use sha1::{Digest, Sha1};
        let sha: String = Sha1::digest(SCRIPT.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let url_text = url.display();
        let bases: Vec<String> = match url.cluster {
            Some(_) => (slot::tags().iter())
                .map(|t| format!("{prefix}{{{t}}}"))
                .collect(),
            None => Vec::new(),
        };
        // Cross-session keys and channels live in bucket 0 in a cluster.
        let first = bases.first().map_or(prefix, |b| b.as_str());
        let arrivals_channels = match bases.is_empty() {
            true => vec![format!("{prefix}arrivals")],
            false => bases.iter().map(|b| format!("{b}arrivals")).collect(),
        };
        RedisStore {
            channel: format!("{first}events"),
            url,
            prefix: prefix.to_string(),
            arrivals_channels,
            arrivals: None,
            every_floor: 0,
            merges: Vec::new(),
            pages_held: Vec::new(),
            merge_ids: 0,
            every_again_owed: false,
            arrivals_wanted: false,
            follow: HashMap::default(),
            listened: 0,
            deleted: VecDeque::new(),
            barrier_next: Vec::new(),
            pings: VecDeque::new(),
            batch: Vec::new(),
            sessions_key: format!("{prefix}sessions"),
            bases,
            limits,
            functions: Functions::new(&sha),
            fcall: false,
            sha,
            ids: IdGen::new(),
            cmd: Side::default(),
            ev: Side::default(),
            expect: VecDeque::new(),
            answered: VecDeque::new(),
            events: VecDeque::new(),
            ready: VecDeque::new(),
            stats: StoreStats::default(),
            unix_ms: 0,
            instance: IdGen::new().uuid(),
            health: Health::new(url_text),
            replicas: 0,
            wait_ms: 0,
            unwaited: false,
            waiting: false,
            renew_owed: false,
            hold: None,
        }
    }

    /// The links go to another master from now on (a Sentinel failover):
    /// it may lack the last writes the old one took.
    /// Each session followed is read again whole before its channel is
    /// listened to again, so no change published on the new master
    /// reaches the copy before that read: a copy that then holds more
    /// than Redis held what the promoted replica lacked, and is rolled
    /// back to it.
    /// And each session the copy holds is renewed there (see
    /// [`renew_copies`](Self::renew_copies)).
    pub fn master_moved(&mut self) {
        for f in self.follow.values_mut() {
            f.rollback |= f.listen.is_some();
        }
        // The promoted replica may lack a deletion: the epoch is Redis's
        // again.
        self.deleted.clear();
        self.renew_owed = true;
    }

    /// After a failover, once the command link to the new master is up:
    /// each session the copy holds is read whole by `renew`, which gives
    /// it a new epoch where the copy holds more than the new master, or
    /// its newest message is not the one the new master holds at that
    /// seq (what a client may have seen and the new master lacks: its
    /// seqs would be handed out again, or were). Followed sessions the copy lacks are read whole.
    /// These reads are the reads after a failover (`master_moved`).
    #[inline(never)]
    pub(super) fn renew_copies(&mut self, copy: &MemStore) {
        self.renew_owed = false;
        for (sid, log) in copy.iter() {
            let known = Known {
                epoch: log.epoch(),
                next: log.next_seq().get(),
            };
            self.follow.entry(sid.clone()).or_default().resyncs += 1;
            let expect = Expect::Sync {
                conn: None,
                sid: sid.clone(),
            };
            // Its newest message: whether Redis holds that one at its seq.
            let newest = log.history().last().map(|m| {
                let id = m.assistant_msg_id.as_ref().unwrap_or(&m.client_msg_id);
                [m.seq.get().to_string(), id.to_string(), m.ts.to_string()]
            });
            let extra: Vec<&[u8]> = newest.iter().flatten().map(|a| a.as_bytes()).collect();
            self.call(sid, Op::Renew, known, &extra, expect);
        }
        let rest: Vec<_> = (self.follow.iter())
            .filter(|(sid, f)| f.rollback && !copy.contains(sid))
            .map(|(sid, _)| sid.clone())
            .collect();
        for sid in rest {
            self.sync(None, &sid, Known::default());
        }
    }

    /// Writes are acknowledged once `replicas` replicas hold them, waited
    /// for at most `timeout` (then `504`).
    pub fn set_replicas(&mut self, replicas: u32, timeout: std::time::Duration) {
        self.replicas = replicas;
        self.wait_ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
    }

    /// Where Redis is.
    pub fn url(&self) -> &RedisUrl {
        &self.url
    }

    /// Writes succeed: the scripts are loaded, the channel listened to,
    /// and Redis neither refuses writes nor hangs (`/readyz`).
    pub fn healthy(&self) -> bool {
        self.linked() && self.health.ok()
    }

    /// Both links are set up: the scripts are loaded and the channel
    /// listened to.
    pub fn linked(&self) -> bool {
        self.cmd.ready && self.ev.ready
    }

    /// Called at the end of every loop turn: sends the health probe when
    /// it is due, and notices one that went unanswered too long. In a
    /// cluster the probe is one small call per bucket: a master that
    /// lost its data is noticed within a probe, as one Redis is, before
    /// a session found missing there is taken for deleted.
    #[inline(never)]
    pub fn tick(&mut self, now: Millis) {
        if self.cmd.ready && self.health.tick(now) {
            let probe = self.stats.commands;
            if std::mem::take(&mut self.every_again_owed) {
                self.ready.push_back(StoreEvent::EveryAgain);
            }
            if self.cluster() {
                self.health.probing(slot::BUCKETS);
                for b in 0..slot::BUCKETS {
                    self.call_bucket(b, Op::Probe, &[], Expect::Probe(b));
                }
            } else {
                self.health.probing(1);
                self.call("", Op::Probe, Known::default(), &[], Expect::Probe(0));
            }
            // Not a write a client asked for: not counted.
            self.stats.commands = probe;
        }
    }

    /// Whether the keys are laid out in buckets for a Redis Cluster.
    pub(super) fn cluster(&self) -> bool {
        !self.bases.is_empty()
    }

    /// The bucket of `sid` (0 without buckets).
    pub(super) fn bucket(&self, sid: &str) -> usize {
        match self.cluster() {
            true => slot::bucket_of(sid.as_bytes()),
            false => 0,
        }
    }

    /// What the keys of `sid` start with: the prefix, or its bucket's
    /// base in a cluster.
    pub(super) fn base(&self, sid: &str) -> &str {
        base_in(&self.bases, &self.prefix, sid)
    }

    /// The commands that listen to a channel, leave it and publish on
    /// it: sharded pub/sub in a cluster, where a channel belongs to the
    /// slot of its hash tag.
    pub(super) fn verbs(&self) -> [&'static [u8]; 3] {
        match self.cluster() {
            true => [b"SSUBSCRIBE", b"SUNSUBSCRIBE", b"SPUBLISH"],
            false => [b"SUBSCRIBE", b"UNSUBSCRIBE", b"PUBLISH"],
        }
    }

    /// When [`tick`](Self::tick) has work next, while the command link is
    /// set up.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.cmd.ready.then(|| self.health.next_deadline())
    }

    /// Whether Redis was found to have lost its data (restarted empty or
    /// flushed) since the last call: every session held is stale.
    pub fn take_lost(&mut self) -> bool {
        self.health.take_lost()
    }

    /// Whether requests can be sent now.
    pub fn up(&self) -> bool {
        self.cmd.up
    }

    /// Whether the pipeline is full: the shell takes no new request.
    pub fn saturated(&self) -> bool {
        self.expect.len() >= MAX_INFLIGHT
    }

    /// Prompts of `sid` an agent fetched here for the first time: told
    /// to the other instances' subscribers (published, nothing stored).
    pub fn receipts(&mut self, sid: &SessionId, ts: u64, ids: &[&str]) {
        if !self.cmd.up {
            return;
        }
        self.send_batch();
        let mut msg = format!("R\n{sid}\n{}\n{ts}", self.instance);
        for id in ids {
            msg.push('\n');
            msg.push_str(id);
        }
        let channel = format!("{}e:{sid}", self.base(sid));
        let publish = self.verbs()[2];
        push_command(
            &mut self.cmd.out,
            &[publish, channel.as_bytes(), msg.as_bytes()],
        );
        self.expect.push_back(Expect::Quiet);
    }

    /// Reads what the copy of `sid` lacks; `conn`'s request runs again
    /// once it is applied.
    pub fn sync(&mut self, conn: Option<Ticket>, sid: &SessionId, known: Known) {
        if conn.is_none() {
            self.follow.entry(sid.clone()).or_default().resyncs += 1;
        }
        let expect = Expect::Sync {
            conn,
            sid: sid.clone(),
        };
        self.call(sid, Op::Sync, known, &[], expect);
    }

    /// Reads `sid` again for nobody in particular after Redis lost its
    /// data, creating it (a new epoch) if it is gone: someone here waits
    /// on it, and its subscribers resync rather than close.
    #[inline(never)]
    pub fn recreate(&mut self, sid: &SessionId) {
        self.follow.entry(sid.clone()).or_default().resyncs += 1;
        let expect = Expect::Sync {
            conn: None,
            sid: sid.clone(),
        };
        self.call(sid, Op::Create, Known::default(), &[], expect);
    }

    /// The sweep: marks the sessions someone here waits on as active, then
    /// deletes every session idle for `ttl_ms` (each deletion is published).
    pub fn sweep(&mut self, present: &[&str], ttl_ms: u64) {
        if !self.cmd.up {
            return;
        }
        if self.cluster() {
            // One call per bucket: a call names one slot.
            let mut by_bucket: Vec<Vec<&[u8]>> = vec![Vec::new(); slot::BUCKETS];
            for sid in present {
                by_bucket[slot::bucket_of(sid.as_bytes())].push(sid.as_bytes());
            }
            for (b, sids) in by_bucket.iter().enumerate() {
                for chunk in sids.chunks(256) {
                    self.call_bucket(b, Op::Touch, chunk, Expect::Quiet);
                }
            }
        } else {
            for chunk in present.chunks(256) {
                let extra: Vec<&[u8]> = chunk.iter().map(|s| s.as_bytes()).collect();
                self.call("", Op::Touch, Known::default(), &extra, Expect::Quiet);
            }
        }
        if ttl_ms == u64::MAX {
            return; // sessions are kept forever
        }
        let ttl = ttl_ms.to_string();
        if self.cluster() {
            for b in 0..slot::BUCKETS {
                self.call_bucket(b, Op::Collect, &[ttl.as_bytes()], Expect::Quiet);
            }
        } else {
            let extra = [ttl.as_bytes()];
            self.call("", Op::Collect, Known::default(), &extra, Expect::Quiet);
        }
    }
}

#[cfg(test)]
impl RedisStore {
    /// A store for unit tests on `url` (keys under `t:`), its command
    /// link connected and its set-up taken away: what a test finds in
    /// `cmd.out` and `expect` is what its own calls added.
    pub(super) fn for_test(url: &str, max_sessions: usize) -> RedisStore {
        let limits = StoreLimits {
            history_limit: 10,
            max_sessions,
            max_pending: 10,
            draft_timeout_ms: 60_000,
        };
        let url = RedisUrl::parse(url).expect("a test's URL");
        let mut r = RedisStore::new(url, "t:", limits);
        r.connected(link::Link::Command);
        r.expect.clear();
        r.cmd.out.clear();
        r
    }
}
