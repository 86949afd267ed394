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
//! instance read the session again. That side of the engine, which reads
//! the copy, is `copy.rs`; each write's call and the reading of its
//! answer are `calls.rs`.
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
//! The script is loaded twice: as a library of functions (`FUNCTION
//! LOAD`, Redis 7 and later), called with `FCALL`, and as a script
//! (`SCRIPT LOAD`), called with `EVALSHA` until Redis confirmed the
//! library, and always on Redis 6.2, which has no functions. A library's
//! helpers are made once, where a script makes them again on every call.
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
//! limit. Debian's 7.0.15
//! does so: a PUBLISH before the refused write still goes out, and an HDEL
//! before an HSET lets the HSET through. So every write path of the script
//! makes its growing write (HSET, ZADD) first, deletes (HDEL, DEL) after
//! it, and publishes only once every write went through: a refused call
//! changed nothing and told nobody. A relay that sees a write refused
//! reads that session again all the same ([`Event::Refused`]).
//!
//! Sans-IO like the relay core: the shell owns the two sockets, hands
//! their bytes to [`RedisStore::input`] and writes what
//! [`RedisStore::take_output`] gives. Replies are decoded with
//! `redis-protocol`; commands are RESP arrays of bulk strings.

mod calls;
mod codec;
mod copy;
mod follow;
mod health;
mod lease;
mod reply;
mod url;

use std::collections::{HashMap, VecDeque};

use log::Level;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;

pub use health::{Trouble, note};
pub use reply::{Event, Head, Msg, Snapshot};
pub use url::RedisUrl;

use super::mem::{IdGen, StoreLimits};
use super::record::Outcome;
use super::seam::{StoreEvent, StoreStats};
use super::types::SessionId;
use crate::error::ApiError;
use crate::store::types::Ticket;
use crate::time::Millis;
use calls::{Function, Op, Write};
use codec::{
    Common, push_array, push_bulk, push_channel_command, push_command, push_common, push_number,
};
use follow::Follow;
use health::Health;
use reply::{bytes_of, parse_event, parse_snapshot};

// The engine's larger functions are marked `#[inline(never)]`: each runs
// once per request or reply, and inlined into the poll loop they cost the
// static binary about 9 KB, which it does not have under 2 MiB.

/// The script every instance loads (`SCRIPT LOAD`) and calls by its SHA-1
/// where Redis has no functions (6.2).
pub const SCRIPT: &str = include_str!("relay.lua");

/// The script's last line, which runs it as a script; the library has
/// the functions' registration in its place.
const ENTRY: &str = "return run(KEYS, ARGV)\n";

/// The functions of the library (Redis 7 and later), named after the
/// script's SHA-1 so that relays of different versions on one Redis each
/// call their own: one for writes (refused up front while Redis is out
/// of memory: nothing ran, nothing was published), one for reads
/// (`no-writes`: runs out of memory too, as reads did as a script), and
/// one for the writes that only delete (`allow-oom`: they ran out of
/// memory as a script too).
struct Functions {
    write: String,
    read: String,
    delete: String,
    /// `FUNCTION LOAD`'s argument.
    library: String,
}

impl Functions {
    fn new(sha: &str) -> Functions {
        let v = &sha[..16];
        let (write, read, delete) = (
            format!("relay_{v}"),
            format!("relay_r_{v}"),
            format!("relay_d_{v}"),
        );
        let body = SCRIPT.strip_suffix(ENTRY).unwrap_or(SCRIPT);
        let library = format!(
            "#!lua name=relay_{v}\n{body}redis.register_function('{write}', run)\n\
             redis.register_function{{function_name = '{read}', callback = run, flags = {{ 'no-writes' }}}}\n\
             redis.register_function{{function_name = '{delete}', callback = run, flags = {{ 'allow-oom' }}}}\n"
        );
        Functions {
            write,
            read,
            delete,
            library,
        }
    }

    /// The function that runs `op`.
    fn of(&self, op: Op) -> &str {
        match op.function() {
            Function::Read => &self.read,
            Function::Delete => &self.delete,
            Function::Write => &self.write,
        }
    }
}

/// Requests sent and not answered above which the loop takes no new
/// request until some are answered (the pipeline stays bounded).
pub const MAX_INFLIGHT: usize = 16_384;

/// Bytes of replies buffered without a whole frame before the link is
/// dropped: a reply carries at most one session, and a session at most
/// `history_limit + max_pending` messages of at most the body cap each, so
/// this only stops a peer that is not Redis.
const MAX_INPUT: usize = 1 << 30;

/// One of the two connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Script calls, pipelined; replies in order.
    Command,
    /// `SUBSCRIBE` to the channel of changes.
    Events,
}

/// What to do for the requester once the copy is up to date.
#[derive(Debug)]
pub enum Then {
    Reply(Result<Outcome, ApiError>),
    /// Run the request again (a read that waited for its session, or a
    /// WebSocket connect whose session was created).
    Retry,
    /// A read's `PING` came back: the relay runs it again if the copy of
    /// the session still follows its channel, else reads the session.
    Barrier(SessionId),
    /// A read the relay asked for on its own came back (or failed).
    Resynced(SessionId),
}

/// One reply, for the relay.
#[derive(Debug)]
pub struct Answered {
    pub conn: Option<Ticket>,
    pub snapshot: Option<Snapshot>,
    pub then: Then,
    /// A new answer: another instance has subscribers of its session.
    pub delivered: bool,
}

/// What the caller's copy of a session holds: its epoch and next `seq`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Known<'a> {
    pub epoch: &'a str,
    pub next: u64,
}

/// A prompt gathered for the turn's call.
#[derive(Debug)]
struct Gathered {
    conn: Ticket,
    sid: SessionId,
    id: String,
    /// The record the script stores (see [`record`]).
    record: String,
    known_epoch: String,
    known_next: u64,
}

/// Prompts one script call carries at most: Redis runs nothing else
/// while it stores them.
const MAX_BATCH: usize = 64;

/// A reply the command link waits for, in order.
#[derive(Debug)]
enum Expect {
    /// `AUTH`, `SELECT`, `SCRIPT LOAD`.
    Setup,
    /// `FUNCTION LOAD`: once answered, calls go by `FCALL`.
    Library,
    /// The `prompts` call of one turn: one answer per prompt, in order.
    Prompts(Vec<(Ticket, SessionId, String)>),
    Write {
        conn: Ticket,
        sid: SessionId,
        write: Write,
    },
    Sync {
        conn: Option<Ticket>,
        sid: SessionId,
    },
    /// The sweep's calls: nobody waits.
    Quiet,
    /// The health probe (see `health.rs`).
    Probe,
}

#[derive(Default)]
struct Side {
    /// The socket is connected: requests may be queued.
    up: bool,
    /// Setup answered: scripts loaded, or the channel subscribed.
    ready: bool,
    out: Vec<u8>,
    input: Vec<u8>,
}

/// The Redis engine's state.
pub struct RedisStore {
    url: RedisUrl,
    prefix: String,
    /// Listened to from the start: its confirmation says the link is set
    /// up. Nothing is published on it.
    channel: String,
    /// The sessions whose channel this instance listens to, or that it
    /// reads on its own (one map: the binary carries one of its kind).
    follow: HashMap<SessionId, Follow>,
    /// How many of them are listened to.
    listened: usize,
    /// Reads waiting for the next `PING` to go out, then for each `PING`
    /// sent, in order.
    barrier_next: Vec<(Ticket, SessionId)>,
    pings: VecDeque<Vec<(Ticket, SessionId)>>,
    /// The prompts of this turn not sent yet.
    batch: Vec<Gathered>,
    sessions_key: String,
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
}

impl RedisStore {
    pub fn new(url: RedisUrl, prefix: &str, limits: StoreLimits) -> RedisStore {
        use sha1::{Digest, Sha1};
        let sha: String = Sha1::digest(SCRIPT.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let url_text = url.display();
        RedisStore {
            url,
            prefix: prefix.to_string(),
            channel: format!("{prefix}events"),
            follow: HashMap::new(),
            listened: 0,
            barrier_next: Vec::new(),
            pings: VecDeque::new(),
            batch: Vec::new(),
            sessions_key: format!("{prefix}sessions"),
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
        }
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
    /// it is due, and notices one that went unanswered too long.
    #[inline(never)]
    pub fn tick(&mut self, now: Millis) {
        if self.cmd.ready && self.health.tick(now) {
            let probe = self.stats.commands;
            self.call("", Op::Probe, Known::default(), &[], Expect::Probe);
            // Not a write a client asked for: not counted.
            self.stats.commands = probe;
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

    fn side(&mut self, link: Link) -> &mut Side {
        match link {
            Link::Command => &mut self.cmd,
            Link::Events => &mut self.ev,
        }
    }

    /// The socket connected: log in, select the database, and load the
    /// script or subscribe. Requests may follow at once (Redis answers in
    /// order).
    #[inline(never)]
    pub fn connected(&mut self, link: Link) {
        let mut setup = Vec::new();
        match (&self.url.user, &self.url.password) {
            (Some(u), Some(p)) => push_command(&mut setup, &[b"AUTH", u.as_bytes(), p.as_bytes()]),
            (None, Some(p)) => push_command(&mut setup, &[b"AUTH", p.as_bytes()]),
            _ => {}
        }
        let mut replies = usize::from(self.url.password.is_some());
        if self.url.db != 0 {
            push_command(&mut setup, &[b"SELECT", self.url.db.to_string().as_bytes()]);
            replies += 1;
        }
        match link {
            Link::Command => {
                push_command(&mut setup, &[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()]);
                for _ in 0..=replies {
                    self.expect.push_back(Expect::Setup);
                }
                // Calls go by EVALSHA until Redis confirms the library
                // (Redis 6.2 has no FUNCTION, and keeps them so).
                self.fcall = false;
                let library = self.functions.library.as_bytes();
                push_command(&mut setup, &[b"FUNCTION", b"LOAD", library]);
                self.expect.push_back(Expect::Library);
            }
            Link::Events => {
                push_command(&mut setup, &[b"SUBSCRIBE", self.channel.as_bytes()]);
                for (sid, f) in &mut self.follow {
                    if f.listen.is_some() {
                        f.listen = Some(false);
                        push_channel_command(&mut setup, b"SUBSCRIBE", self.prefix.as_bytes(), sid);
                    }
                }
            }
        }
        let side = self.side(link);
        side.up = true;
        side.ready = false;
        side.input.clear();
        side.out = setup;
    }

    /// The socket is gone: every request waiting on it is answered `503`.
    /// The shell logs why.
    #[inline(never)]
    pub fn lost(&mut self, link: Link) {
        let side = self.side(link);
        *side = Side::default();
        if link == Link::Command {
            self.fcall = false;
            self.health.link_lost();
            // A write sent is Redis's to run or not: whether it did is not
            // known now (a resend with the same id tells). A read changed
            // nothing.
            let uncertain = ApiError::storage_uncertain("the connection to Redis was lost");
            for e in std::mem::take(&mut self.expect) {
                let e_for = match e {
                    Expect::Prompts(_) | Expect::Write { .. } => uncertain.clone(),
                    _ => ApiError::storage_unavailable(),
                };
                self.fail(e, e_for);
            }
            let unsent = std::mem::take(&mut self.batch);
            let waiting = unsent.into_iter().map(|g| (g.conn, g.sid, g.id)).collect();
            self.fail(Expect::Prompts(waiting), ApiError::storage_unavailable());
        } else {
            // The reads waiting for a `PING` go back to the relay, which
            // finds their channels no longer listened to.
            let waiting: Vec<_> = self.pings.drain(..).flatten().collect();
            for (conn, sid) in waiting.into_iter().chain(self.barrier_next.drain(..)) {
                self.answered.push_back(Answered {
                    conn: Some(conn),
                    snapshot: None,
                    then: Then::Barrier(sid),
                    delivered: false,
                });
            }
        }
    }

    /// Bytes to write on `link` (appended by the caller to what it has not
    /// written yet).
    pub fn take_output(&mut self, link: Link) -> Vec<u8> {
        if link == Link::Command {
            self.send_batch();
        }
        if link == Link::Events && !self.barrier_next.is_empty() && self.ev.up {
            push_command(&mut self.ev.out, &[b"PING"]);
            self.pings.push_back(std::mem::take(&mut self.barrier_next));
        }
        std::mem::take(&mut self.side(link).out)
    }

    /// Bytes read from `link`: every whole reply is handled. An error (the
    /// peer refused the link's setup, or broke the protocol) says why the
    /// caller drops the link; the caller logs it.
    #[inline(never)]
    pub fn input(&mut self, link: Link, bytes: &[u8]) -> Result<(), String> {
        let side = self.side(link);
        side.input.extend_from_slice(bytes);
        if side.input.len() > MAX_INPUT {
            return Err("reply too large".into());
        }
        let mut at = 0;
        loop {
            let side = self.side(link);
            let (frame, used) = match decode(&side.input[at..]) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return Err(format!("bad reply: {e:?}")),
            };
            at += used;
            match link {
                Link::Command => self.on_reply(frame)?,
                Link::Events => self.on_event(frame)?,
            }
        }
        self.side(link).input.drain(..at);
        Ok(())
    }

    #[inline(never)]
    fn on_reply(&mut self, frame: OwnedFrame) -> Result<(), String> {
        let Some(expect) = self.expect.pop_front() else {
            return Err("a reply nobody asked for".into());
        };
        if let Expect::Library = expect {
            // Loaded, or loaded before by a relay of this version; any
            // other error (no FUNCTION: Redis 6.2) keeps EVALSHA.
            self.fcall = match &frame {
                OwnedFrame::Error(e) => e.contains("already exists"),
                _ => true,
            };
            return Ok(());
        }
        if let OwnedFrame::Error(e) = &frame {
            self.stats.errors += 1;
            if e.starts_with("NOSCRIPT") {
                // Redis lost its scripts (SCRIPT FLUSH): load it again.
                push_command(&mut self.cmd.out, &[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()]);
                self.expect.push_back(Expect::Setup);
            }
            if self.fcall && e.contains("Function not found") {
                // Redis lost its functions (FUNCTION FLUSH): EVALSHA
                // until the library is loaded again.
                self.fcall = false;
                let library = self.functions.library.as_bytes();
                push_command(&mut self.cmd.out, &[b"FUNCTION", b"LOAD", library]);
                self.expect.push_back(Expect::Library);
            }
            if matches!(expect, Expect::Setup) {
                return Err(format!("Redis refused the connection's setup: {e}"));
            }
            let probe = matches!(expect, Expect::Probe);
            self.health.refused(self.unix_ms, probe, e);
            self.refused(&expect);
            self.fail(expect, ApiError::storage_unavailable());
            return Ok(());
        }
        match expect {
            Expect::Prompts(waiting) => {
                let OwnedFrame::Array(answers) = frame else {
                    self.fail(Expect::Prompts(waiting), ApiError::storage_unavailable());
                    return Err("the script answered something else than an array".into());
                };
                if answers.len() != waiting.len() {
                    self.fail(Expect::Prompts(waiting), ApiError::storage_unavailable());
                    return Err("the script answered another number of prompts".into());
                }
                let mut broken = Ok(());
                for ((conn, sid, id), answer) in waiting.into_iter().zip(answers) {
                    let write = Write::Prompt { id };
                    if let Err(e) = self.written(conn, sid, write, answer) {
                        broken = Err(e);
                    }
                }
                return broken;
            }
            Expect::Setup => {
                if let OwnedFrame::BulkString(sha) = &frame {
                    if sha.as_slice() != self.sha.as_bytes() {
                        return Err("SCRIPT LOAD answered another SHA-1".into());
                    }
                    self.cmd.ready = true;
                    self.set_up();
                }
            }
            Expect::Quiet | Expect::Library => {}
            Expect::Probe => {
                let generation = match &frame {
                    OwnedFrame::Array(parts) => parts.get(1).map_or(&b""[..], bytes_of),
                    _ => b"",
                };
                if generation.is_empty() {
                    return Err("the probe answered something else".into());
                }
                self.health.probed(self.unix_ms, generation);
            }
            Expect::Sync { conn, sid } => {
                let snapshot = match parse_snapshot(sid.clone(), frame, &mut self.health) {
                    Ok(s) => s,
                    Err(e) => {
                        self.fail(Expect::Sync { conn, sid }, ApiError::storage_unavailable());
                        return Err(e);
                    }
                };
                let then = match conn {
                    Some(_) => Then::Retry,
                    None => Then::Resynced(sid),
                };
                self.answered.push_back(Answered {
                    conn,
                    snapshot: Some(snapshot.1),
                    then,
                    delivered: false,
                });
            }
            Expect::Write { conn, sid, write } => return self.written(conn, sid, write, frame),
        }
        Ok(())
    }

    #[inline(never)]
    fn on_event(&mut self, frame: OwnedFrame) -> Result<(), String> {
        let parts = match frame {
            OwnedFrame::Array(parts) => parts,
            OwnedFrame::Error(e) => {
                return Err(format!("Redis refused the connection's setup: {e}"));
            }
            _ => return Ok(()), // AUTH, SELECT
        };
        let kind = parts.first().map(bytes_of);
        match kind {
            Some(b"subscribe") => {
                let channel = parts.get(1).map_or(&b""[..], bytes_of);
                if channel == self.channel.as_bytes() {
                    self.ev.ready = true;
                    self.set_up();
                } else if let Some(sid) = self.sid_of_channel(channel)
                    && let Some(f) = self.follow.get_mut(&sid)
                    && f.listen.is_some()
                {
                    f.listen = Some(true);
                    self.events.push_back(Event::Listening { sid });
                }
            }
            Some(b"pong") => {
                for (conn, sid) in self.pings.pop_front().unwrap_or_default() {
                    self.answered.push_back(Answered {
                        conn: Some(conn),
                        snapshot: None,
                        then: Then::Barrier(sid),
                        delivered: false,
                    });
                }
            }
            Some(b"message") => {
                if let Some(e) = parts.get(2).and_then(|p| parse_event(bytes_of(p))) {
                    self.events.push_back(e);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A link finished its setup: once both have, the relay is connected
    /// (logged, and what the tests wait for before their first request).
    fn set_up(&self) {
        if self.linked() {
            note(Level::Info, "connected to Redis", self.health.url(), "");
        }
    }

    /// Redis refused the write `expect` waited for: the copies of its
    /// sessions are read again (see [`Event::Refused`]), unless such a
    /// read is on its way already.
    fn refused(&mut self, expect: &Expect) {
        match expect {
            Expect::Write { sid, .. } => self.reread(sid),
            Expect::Prompts(waiting) => {
                for (i, (_, sid, _)) in waiting.iter().enumerate() {
                    if waiting[..i].iter().all(|(_, s, _)| s != sid) {
                        self.reread(sid);
                    }
                }
            }
            _ => {}
        }
    }

    fn reread(&mut self, sid: &SessionId) {
        if !self.resyncing(sid) {
            self.events.push_back(Event::Refused { sid: sid.clone() });
        }
    }

    /// A request that cannot be answered by Redis: `503`.
    #[inline(never)]
    fn fail(&mut self, expect: Expect, e: ApiError) {
        match expect {
            Expect::Prompts(waiting) => {
                for (conn, ..) in waiting {
                    self.answered.push_back(Answered {
                        conn: Some(conn),
                        snapshot: None,
                        then: Then::Reply(Err(e.clone())),
                        delivered: false,
                    });
                }
            }
            Expect::Sync { conn: None, sid } => self.answered.push_back(Answered {
                conn: None,
                snapshot: None,
                then: Then::Resynced(sid),
                delivered: false,
            }),
            Expect::Write { conn, .. }
            | Expect::Sync {
                conn: Some(conn), ..
            } => self.answered.push_back(Answered {
                conn: Some(conn),
                snapshot: None,
                then: Then::Reply(Err(e)),
                delivered: false,
            }),
            _ => {}
        }
    }

    /// One script call: the session's keys, the common arguments, then
    /// `extra`. Without a connection the requester is answered `503` now.
    /// Written straight into the link's buffer: a prompt's call is about
    /// twenty arguments, and a turn may hold thousands of calls.
    #[inline(never)]
    fn call(&mut self, sid: &str, op: Op, known: Known, extra: &[&[u8]], expect: Expect) {
        if !self.cmd.up {
            self.fail(expect, ApiError::storage_unavailable());
            return;
        }
        // Calls run in the order they were asked for.
        self.send_batch();
        let epoch = if op.creates() {
            self.ids.uuid()
        } else {
            String::new()
        };
        let (p, sid) = (self.prefix.as_bytes(), sid.as_bytes());
        let out = &mut self.cmd.out;
        push_array(out, 17 + extra.len());
        if self.fcall {
            push_bulk(out, &[b"FCALL"]);
            push_bulk(out, &[self.functions.of(op).as_bytes()]);
        } else {
            push_bulk(out, &[b"EVALSHA"]);
            push_bulk(out, &[self.sha.as_bytes()]);
        }
        push_bulk(out, &[b"3"]);
        push_bulk(out, &[p, b"s:", sid]);
        push_bulk(out, &[self.sessions_key.as_bytes()]);
        push_bulk(out, &[p, b"w:", sid]);
        let common = Common {
            unix_ms: self.unix_ms,
            limits: &self.limits,
            prefix: p,
            op: op.name().as_bytes(),
            sid,
            known,
            epoch: epoch.as_bytes(),
            channel: &[p, b"e:", sid],
        };
        push_common(out, common);
        for a in extra {
            push_bulk(out, &[a]);
        }
        self.stats.commands += 1;
        self.expect.push_back(expect);
    }

    /// The gathered prompts: one `prompt` call, or one `prompts` call for
    /// several.
    #[inline(never)]
    fn send_batch(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        if batch.len() <= 1 {
            if let Some(g) = batch.pop() {
                let extra: [&[u8]; 2] = [g.id.as_bytes(), g.record.as_bytes()];
                let known = Known {
                    epoch: &g.known_epoch,
                    next: g.known_next,
                };
                let expect = Expect::Write {
                    conn: g.conn,
                    sid: g.sid.clone(),
                    write: Write::Prompt { id: g.id.clone() },
                };
                self.call(&g.sid, Op::Prompt, known, &extra, expect);
            }
            return;
        }
        let n = batch.len();
        let p = self.prefix.as_bytes();
        let out = &mut self.cmd.out;
        push_array(out, 17 + n * 7);
        if self.fcall {
            push_bulk(out, &[b"FCALL"]);
            push_bulk(out, &[self.functions.of(Op::Prompts).as_bytes()]);
        } else {
            push_bulk(out, &[b"EVALSHA"]);
            push_bulk(out, &[self.sha.as_bytes()]);
        }
        push_number(out, 3 + n as u64);
        push_bulk(out, &[]);
        push_bulk(out, &[self.sessions_key.as_bytes()]);
        push_bulk(out, &[]);
        for g in &batch {
            push_bulk(out, &[p, b"s:", g.sid.as_bytes()]);
        }
        // Each prompt brings its own session, cursor and epoch (below).
        let common = Common {
            unix_ms: self.unix_ms,
            limits: &self.limits,
            prefix: p,
            op: Op::Prompts.name().as_bytes(),
            sid: b"",
            known: Known::default(),
            epoch: b"",
            channel: &[],
        };
        push_common(out, common);
        for g in &batch {
            let epoch = self.ids.uuid();
            push_bulk(out, &[g.sid.as_bytes()]);
            push_bulk(out, &[g.known_epoch.as_bytes()]);
            push_number(out, g.known_next);
            push_bulk(out, &[epoch.as_bytes()]);
            push_bulk(out, &[g.id.as_bytes()]);
            push_bulk(out, &[g.record.as_bytes()]);
        }
        self.stats.commands += 1;
        let waiting = batch.drain(..).map(|g| (g.conn, g.sid, g.id)).collect();
        self.expect.push_back(Expect::Prompts(waiting));
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
        let channel = format!("{}e:{sid}", self.prefix);
        push_command(
            &mut self.cmd.out,
            &[b"PUBLISH", channel.as_bytes(), msg.as_bytes()],
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
        for chunk in present.chunks(256) {
            let extra: Vec<&[u8]> = chunk.iter().map(|s| s.as_bytes()).collect();
            self.call("", Op::Touch, Known::default(), &extra, Expect::Quiet);
        }
        if ttl_ms == u64::MAX {
            return; // sessions are kept forever
        }
        let ttl = ttl_ms.to_string();
        self.call(
            "",
            Op::Collect,
            Known::default(),
            &[ttl.as_bytes()],
            Expect::Quiet,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_the_script_with_its_functions_in_place_of_its_last_line() {
        assert!(SCRIPT.ends_with(ENTRY));
        let f = Functions::new("0123456789abcdef0123");
        assert!(f.library.starts_with("#!lua name=relay_0123456789abcdef\n"));
        assert!(!f.library.contains(ENTRY));
        assert_eq!(f.of(Op::Prompt), "relay_0123456789abcdef");
        assert_eq!(f.of(Op::Sync), "relay_r_0123456789abcdef");
        assert_eq!(f.of(Op::Delete), "relay_d_0123456789abcdef");
    }
}
