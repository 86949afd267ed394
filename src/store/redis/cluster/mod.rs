//! Redis Cluster: the engine's two logical links ([`Link::Command`],
//! [`Link::Events`]) spread over one command socket and one events socket
//! per master, sans-IO (the shell in `net/redis.rs` owns the sockets and
//! hands their bytes here).
//!
//! The slot map comes from `CLUSTER SLOTS` (its flat arrays are simpler to
//! read than `CLUSTER SHARDS`' maps, and Redis 7 answers both); replicas
//! are ignored. A node that answers it with `ERR This instance has cluster
//! support disabled` is a one-node cluster owning every slot.
//!
//! Command link: the engine's output is cut into commands (RESP arrays of
//! bulk strings) without decoding them; script calls go by the slot of
//! their first key, `SPUBLISH` by its channel, `HGETALL` by its key; the
//! set-up commands (`AUTH`, `HELLO`, `CLIENT`, `SCRIPT`, `FUNCTION`) go to
//! every master, are replayed on every master connected later (their
//! replies swallowed), and give the engine one reply (the first error, else
//! the first reply); `WAIT` goes to every master written to since its last
//! `WAIT` (the least count wins; a lost master counts 0); anything else to
//! one master. Replies reach the engine in the order it sent the commands
//! (the `order` buffer); `-MOVED`, `-ASK` and `-TRYAGAIN` are followed
//! here, and while a slot has a command redirected or retried, the
//! commands for it wait behind it (`held`), so each slot runs them in the
//! engine's order. A master lost answers what was in flight on it with
//! `-RELAYLOST` in place; a slot without a master answers
//! `-CLUSTERDOWN` at once (nothing was sent). The logical command link is
//! up as soon as a seed's socket is, as one Redis's is: what the engine
//! sends while the map is read waits for it (`early`), and a master still
//! connecting keeps its commands until it opens.
//!
//! Events link: `SSUBSCRIBE`/`SUNSUBSCRIBE` go by the channel's slot, any
//! other subscription to the first master (Redis Cluster carries classic
//! pub/sub to every node); a `PING` goes to every master and the engine
//! gets one `pong` once all answered (each master sent what it published
//! before it). Frames reach the engine whole. The logical events link is
//! up while every master's events socket is; a socket lost, a slot of a
//! subscribed channel moved, or a new master makes it lost and connected
//! again, so the engine subscribes again and reads what it follows.
//!
//! Invariants: every command sent to a node has one entry in that node's
//! `waits`, in order; every engine command has one entry in `order` until
//! the engine got its reply; `inflight[slot]` counts the engine's commands
//! for `slot` sent and not answered; a slot is `held` while a command of
//! it waits to be sent again, and its commands are sent in `seq` order.
//!
//! Files: `command.rs` the command link (routing, redirections, replies in order);
//! `events.rs` the events link (subscriptions, the `PING` barrier, restarts);
//! `map.rs` the slot map (`CLUSTER SLOTS` read, asked again);
//! `resp.rs` the RESP frame scanner and argument helpers;
//! `tests.rs` the unit tests.

use std::collections::VecDeque;

use super::RedisUrl;
use super::codec::push_command;
use super::link::Link;
use crate::time::Millis;
use events::EvWait;
use resp::{Scan, args, scan};

mod command;
mod events;
mod map;
mod resp;
#[cfg(test)]
mod tests;

/// Hash slots of a Redis Cluster.
pub const SLOTS: usize = super::slot::SLOTS as usize;
/// Nodes known at most (seeds and masters).
pub const MAX_NODES: usize = 64;
/// Bytes a node's reply may take before the socket is dropped.
const MAX_REPLY: usize = 512 << 20;
/// Engine commands kept until the map is known at most (beyond: refused
/// in place); the engine sends its set-up and the first requests then.
const MAX_EARLY: usize = 1024;
const NO_NODE: u8 = u8::MAX;

/// One of a node's two sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sock {
    Command,
    Events,
}

/// What the engine is told about its logical links, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    Connected(Link),
    Lost(Link),
}

/// What a reply sent to a node is for.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// An engine command: its reply goes to `seq` in the order.
    Engine {
        seq: u64,
        slot: u16,
        len: u32,
        tries: u8,
    },
    /// A part of a command sent to several masters.
    Part { seq: u64 },
    /// A reply swallowed (the router's own `AUTH`, a replayed set-up,
    /// `ASKING`).
    Swallow,
    /// `CLUSTER SLOTS`.
    Slots,
}

/// What the engine's command at `seq` is given.
enum Entry {
    Waiting,
    Done(Vec<u8>),
    /// Sent to several masters: `left` replies to come.
    Group {
        left: u16,
        wait: bool,
        min: i64,
        first: Option<Vec<u8>>,
    },
}

/// A command of the engine waiting to be sent again (or behind one that
/// is).
struct Held {
    seq: u64,
    slot: u16,
    tries: u8,
    bytes: Vec<u8>,
    ask: Option<usize>,
    at: Millis,
}

#[derive(Default)]
struct Half {
    open: bool,
    /// Connecting failed or the socket was lost (commands for it are
    /// refused until it opens).
    down: bool,
    out: Vec<u8>,
    input: Vec<u8>,
    scan: Scan,
}

/// A node: a seed of the URL or a master of the map.
pub struct Node {
    pub host: String,
    pub port: u16,
    seed: bool,
    master: bool,
    cmd: Half,
    ev: Half,
    waits: VecDeque<Wait>,
    /// The bytes of the engine commands in `waits` (for a resend), in order.
    kept: VecDeque<u8>,
    ev_waits: VecDeque<EvWait>,
    /// Written to since its last `WAIT`.
    wrote: bool,
    /// Shell: drop this socket (the events link starts again).
    drop_ev: bool,
}

/// The router: the nodes, the slot map, and the order of the engine's
/// replies.
pub struct Router {
    nodes: Vec<Node>,
    owner: Vec<u8>,
    map_known: bool,
    /// Some slot has no master in the map.
    gaps: bool,
    /// A `CLUSTER SLOTS` is in flight.
    asking_map: bool,
    refresh_at: Option<Millis>,
    last_refresh: Millis,
    auth: Vec<u8>,
    replay: Vec<Vec<u8>>,
    order: VecDeque<Entry>,
    /// The `seq` of `order`'s front; the next command gets `next`.
    base: u64,
    next: u64,
    inflight: Vec<u16>,
    held_slot: Vec<bool>,
    held: VecDeque<Held>,
    /// The engine's commands sent before the map was known, in order:
    /// routed once it is (at most `MAX_EARLY`).
    early: VecDeque<Vec<u8>>,
    cmd_linked: bool,
    ev_linked: bool,
    /// `PING` barriers: (number, masters yet to answer).
    pings: VecDeque<(u64, usize)>,
    ping_next: u64,
    /// The master events that are not sharded go to.
    home: usize,
    to_engine: [Vec<u8>; 2],
    notices: Vec<Notice>,
}

impl Router {
    /// A router starting from `seeds`, logging in as `url` says.
    pub fn new(seeds: &[(String, u16)], url: &RedisUrl) -> Router {
        let mut auth = Vec::new();
        match (&url.user, &url.password) {
            (Some(u), Some(p)) => push_command(&mut auth, &[b"AUTH", u.as_bytes(), p.as_bytes()]),
            (None, Some(p)) => push_command(&mut auth, &[b"AUTH", p.as_bytes()]),
            _ => {}
        }
        let mut r = Router {
            nodes: Vec::new(),
            owner: vec![NO_NODE; SLOTS],
            map_known: false,
            gaps: false,
            asking_map: false,
            refresh_at: None,
            last_refresh: Millis(0),
            auth,
            replay: Vec::new(),
            order: VecDeque::new(),
            base: 0,
            next: 0,
            inflight: vec![0; SLOTS],
            held_slot: vec![false; SLOTS],
            held: VecDeque::new(),
            early: VecDeque::new(),
            cmd_linked: false,
            ev_linked: false,
            pings: VecDeque::new(),
            ping_next: 0,
            home: 0,
            to_engine: [Vec::new(), Vec::new()],
            notices: Vec::new(),
        };
        for (h, p) in seeds.iter().take(MAX_NODES) {
            if let Some(i) = r.node_of(h, *p) {
                r.nodes[i].seed = true;
            }
        }
        r
    }

    fn node_of(&mut self, host: &str, port: u16) -> Option<usize> {
        if let Some(i) = self
            .nodes
            .iter()
            .position(|n| n.host == host && n.port == port)
        {
            return Some(i);
        }
        if self.nodes.len() >= MAX_NODES {
            return None;
        }
        self.nodes.push(Node {
            host: host.to_string(),
            port,
            seed: false,
            master: false,
            cmd: Half::default(),
            ev: Half::default(),
            waits: VecDeque::new(),
            kept: VecDeque::new(),
            ev_waits: VecDeque::new(),
            wrote: false,
            drop_ev: false,
        });
        Some(self.nodes.len() - 1)
    }

    /// The nodes known; indices are stable.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Whether node `i` should have socket `s` open: a master both, a
    /// seed its command socket while the map is not known or no master
    /// answers.
    pub fn wants(&self, i: usize, s: Sock) -> bool {
        let Some(n) = self.nodes.get(i) else {
            return false;
        };
        match s {
            Sock::Command => {
                n.master
                    || (n.seed && !self.any_master_open())
                    || !n.waits.is_empty()
                    || !n.cmd.out.is_empty()
            }
            Sock::Events => n.master && self.map_known,
        }
    }

    /// Whether the events socket of `i` is to be dropped (and connected
    /// again); clears the request.
    pub fn take_drop(&mut self, i: usize) -> bool {
        self.nodes
            .get_mut(i)
            .is_some_and(|n| std::mem::take(&mut n.drop_ev))
    }

    fn any_master_open(&self) -> bool {
        self.nodes.iter().any(|n| n.master && n.cmd.open)
    }

    /// Notices for the engine, in order.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// Bytes for the engine's `link` (whole replies and frames).
    pub fn take_engine_input(&mut self, link: Link) -> Vec<u8> {
        std::mem::take(&mut self.to_engine[usize::from(link == Link::Events)])
    }

    /// Bytes to write on node `i`'s socket `s`.
    pub fn take_output(&mut self, i: usize, s: Sock) -> Vec<u8> {
        match self.nodes.get_mut(i).map(|n| half(n, s)) {
            Some(h) if h.open => std::mem::take(&mut h.out),
            _ => Vec::new(),
        }
    }

    /// Node `i`'s socket `s` connected: log-in first, then the set-up
    /// replayed (command socket) and what waited for it.
    #[inline(never)]
    pub fn opened(&mut self, i: usize, s: Sock, now: Millis) {
        let Some(n) = self.nodes.get_mut(i) else {
            return;
        };
        let mut out = self.auth.clone();
        let auth = usize::from(!self.auth.is_empty());
        match s {
            Sock::Command => {
                for _ in 0..auth {
                    n.waits.push_front(Wait::Swallow);
                }
                if n.master {
                    for r in &self.replay {
                        out.extend_from_slice(r);
                    }
                }
                // Replayed ones go right behind the log-in, ahead of what
                // waited.
                for _ in 0..self.replay.len() * usize::from(n.master) {
                    n.waits.insert(auth, Wait::Swallow);
                }
            }
            Sock::Events => {
                for _ in 0..auth {
                    n.ev_waits.push_front(EvWait::Swallow);
                }
            }
        }
        let h = half(n, s);
        out.append(&mut h.out);
        h.out = out;
        h.open = true;
        h.down = false;
        if s == Sock::Command && !self.map_known && !self.asking_map {
            self.ask_map(i);
        }
        self.link_check(now);
    }

    /// Node `i`'s socket `s` is gone (or never connected).
    #[inline(never)]
    pub fn closed(&mut self, i: usize, s: Sock, now: Millis) {
        let Some(n) = self.nodes.get_mut(i) else {
            return;
        };
        let was_open = half(n, s).open;
        *half(n, s) = Half {
            down: true,
            ..Half::default()
        };
        match s {
            Sock::Command => {
                let waits = std::mem::take(&mut n.waits);
                n.kept.clear();
                n.wrote = false;
                let why: &[u8] = if was_open {
                    b"-RELAYLOST the connection to a master was lost\r\n"
                } else {
                    b"-CLUSTERDOWN relay: no master for the slot\r\n"
                };
                for w in waits {
                    match w {
                        Wait::Engine { seq, slot, .. } => {
                            self.slot_done(slot);
                            self.deliver(seq, why);
                        }
                        Wait::Part { seq } => self.part(seq, None),
                        Wait::Slots => self.asking_map = false,
                        Wait::Swallow => {}
                    }
                }
                if n_master(&self.nodes, i) {
                    self.refresh_soon(now);
                }
            }
            Sock::Events => {
                n.ev_waits.clear();
                if n.master {
                    self.events_lost();
                }
            }
        }
        self.link_check(now);
        self.release(now);
    }

    /// Node `i`'s socket `s` sent `bytes`. An error drops the socket.
    #[inline(never)]
    pub fn input(&mut self, i: usize, s: Sock, bytes: &[u8], now: Millis) -> Result<(), String> {
        let Some(n) = self.nodes.get_mut(i) else {
            return Ok(());
        };
        let h = half(n, s);
        if !h.open {
            // A socket being dropped: what it still says is not heard.
            return Ok(());
        }
        h.input.extend_from_slice(bytes);
        if h.input.len() > MAX_REPLY {
            return Err("reply too large".into());
        }
        let mut buf = std::mem::take(&mut h.input);
        let mut scan_state = h.scan;
        let mut at = 0;
        let mut result = Ok(());
        loop {
            let mut sc = scan_state;
            if at > 0 {
                sc = Scan::default();
            }
            match scan(&buf[at..], &mut sc) {
                Ok(Some(len)) => {
                    scan_state = Scan::default();
                    let frame = &buf[at..at + len];
                    at += len;
                    let r = match s {
                        Sock::Command => self.on_reply(i, frame, now),
                        Sock::Events => self.on_event(i, frame, now),
                    };
                    if let Err(e) = r {
                        result = Err(e);
                        break;
                    }
                    // The socket was dropped meanwhile (events start again).
                    if !self.nodes.get_mut(i).is_some_and(|n| half(n, s).open) {
                        break;
                    }
                }
                Ok(None) => {
                    scan_state = sc;
                    break;
                }
                Err(e) => {
                    result = Err(format!("bad reply: {e}"));
                    break;
                }
            }
        }
        if let Some(n) = self.nodes.get_mut(i) {
            buf.drain(..at);
            let h = half(n, s);
            if h.open {
                h.input = buf;
                h.scan = scan_state;
            }
        }
        self.release(now);
        result
    }

    /// When the earliest held command may be sent again.
    pub fn next_deadline(&self) -> Option<Millis> {
        let held = self.held.iter().map(|h| h.at).min();
        held.into_iter().chain(self.refresh_at).min()
    }

    /// Time passed: retries due, the map read again when due.
    pub fn tick(&mut self, now: Millis) {
        self.release(now);
        if let Some(at) = self.refresh_at
            && at <= now
            && !self.asking_map
        {
            let open = self.nodes.iter().position(|n| n.master && n.cmd.open);
            let any = open.or_else(|| self.nodes.iter().position(|n| n.cmd.open));
            if let Some(i) = any {
                self.refresh_at = None;
                self.last_refresh = now;
                self.ask_map(i);
            }
        }
        // A slot without a master: asked again until one is promoted.
        if self.map_known
            && self.refresh_at.is_none()
            && (self.gaps || self.nodes.iter().any(|n| n.master && n.cmd.down))
        {
            self.refresh_soon(now);
        }
    }

    /// The engine's logical links follow the sockets. The command link is
    /// up as soon as a command can go somewhere, as one Redis's is once
    /// its socket is: while the map is read, a seed's socket is open (the
    /// commands wait in `early`); once it is known, some master's socket
    /// is open or still connecting for the first time (its commands wait
    /// in its output). Only when no master can be reached are commands
    /// refused.
    fn link_check(&mut self, now: Millis) {
        let up = if self.map_known {
            self.nodes.iter().any(|n| n.master && !n.cmd.down)
        } else {
            self.nodes.iter().any(|n| n.cmd.open)
        };
        if up && !self.cmd_linked {
            self.cmd_linked = true;
            self.notices.push(Notice::Connected(Link::Command));
        } else if !up && self.cmd_linked {
            self.cmd_linked = false;
            self.order.clear();
            self.base = self.next;
            self.held.clear();
            self.held_slot.fill(false);
            self.early.clear();
            self.to_engine[0].clear();
            self.notices.push(Notice::Lost(Link::Command));
            self.refresh_soon(now);
        }
        let masters = || self.nodes.iter().filter(|n| n.master);
        let ev_up = self.map_known && masters().count() > 0 && masters().all(|n| n.ev.open);
        if ev_up && !self.ev_linked {
            self.ev_linked = true;
            self.home = self.nodes.iter().position(|n| n.master).unwrap_or(0);
            self.notices.push(Notice::Connected(Link::Events));
        }
    }

    /// The engine's output on `link`: every command routed.
    #[inline(never)]
    pub fn from_engine(&mut self, link: Link, bytes: &[u8], now: Millis) {
        let mut at = 0;
        while at < bytes.len() {
            let Some((len, count, a)) = args(&bytes[at..]) else {
                break;
            };
            let cmd = &bytes[at..at + len];
            match link {
                Link::Command if self.cmd_linked => {
                    if !self.map_known && self.early.len() < MAX_EARLY {
                        self.early.push_back(cmd.to_vec());
                    } else {
                        self.command(cmd, count, a, now);
                    }
                }
                Link::Command => {}
                Link::Events => self.event_command(cmd, count, a),
            }
            at += len;
        }
    }
}

fn half(n: &mut Node, s: Sock) -> &mut Half {
    match s {
        Sock::Command => &mut n.cmd,
        Sock::Events => &mut n.ev,
    }
}

fn n_master(nodes: &[Node], i: usize) -> bool {
    nodes.get(i).is_some_and(|n| n.master)
}
