//! The sockets to a Redis Cluster (`redis-cluster://`): a command socket
//! and an events socket per master (and, until the slot map is known, a
//! command socket to the seeds), each connected with capped backoff,
//! with `TCP_NODELAY`, over TLS with `rediss-cluster://` (each node's
//! certificate checked against the address the cluster names it by).
//! What goes over them is the router's ([`Router`]): this file moves
//! bytes between the sockets, the router and the engine.
//!
//! Tokens: node `i`'s command socket is `CLUSTER_TOKENS + 2i`, its events
//! socket the next one; the range lies far above the slab's keys and
//! below the other links' tokens.

use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use log::Level;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use rustls::pki_types::ServerName;

use super::super::stream::Stream;
use super::{MAX_BACKOFF, MIN_BACKOFF, RedisTls, connect_outcome, queue, read_all, write_queued};
use crate::store::redis::cluster::{MAX_NODES, Notice, Router, Sock};
use crate::store::redis::{Link, RedisStore, RedisUrl, Trouble, note};
use crate::time::Millis;

/// The first of the cluster sockets' tokens.
pub const CLUSTER_TOKENS: usize = usize::MAX - 512;

/// Whether `token` is one of a cluster node's sockets.
pub fn is_cluster(token: Token) -> bool {
    (CLUSTER_TOKENS..CLUSTER_TOKENS + 2 * MAX_NODES).contains(&token.0)
}

#[derive(Default)]
struct NodeSock {
    sock: Option<Stream>,
    open: bool,
    out: Vec<u8>,
    written: usize,
    writable: bool,
    retry_at: Millis,
    backoff: Duration,
}

/// Every socket to the cluster, and the router between them and the
/// engine.
pub struct ClusterLinks {
    router: Router,
    socks: Vec<[NodeSock; 2]>,
    /// The seeds as the URL names them, with the address each resolved to.
    seeds: Vec<(String, u16, SocketAddr)>,
    tls: Option<RedisTls>,
    url: String,
    trouble: Trouble,
}

fn sock_of(k: usize) -> Sock {
    if k == 0 { Sock::Command } else { Sock::Events }
}

impl ClusterLinks {
    pub(super) fn new(
        addrs: Vec<SocketAddr>,
        url: &RedisUrl,
        tls: Option<RedisTls>,
    ) -> ClusterLinks {
        let hosts = url.cluster.clone().unwrap_or_default();
        let seeds = hosts
            .iter()
            .zip(addrs)
            .map(|((h, p), a)| (h.clone(), *p, a))
            .collect();
        let mut links = ClusterLinks {
            router: Router::new(&hosts, url),
            socks: Vec::new(),
            seeds,
            tls,
            url: url.display(),
            trouble: Trouble::default(),
        };
        links.grow();
        links
    }

    /// A socket failed: logged as the one-Redis links do.
    #[inline(never)]
    fn failed(&mut self, now: Millis, cause: &dyn Display) {
        let cause = cause.to_string();
        note(Level::Debug, "Redis link failed", &self.url, &cause);
        if self.trouble.report(now.0).is_some() {
            note(
                Level::Warn,
                "Redis unavailable; connecting again",
                &self.url,
                &cause,
            );
        }
    }

    fn grow(&mut self) {
        while self.socks.len() < self.router.nodes().len() {
            let fresh = || NodeSock {
                backoff: MIN_BACKOFF,
                ..NodeSock::default()
            };
            self.socks.push([fresh(), fresh()]);
        }
    }

    /// Where node `i` is, and the name its certificate must carry.
    fn addr_of(&self, i: usize) -> Option<(SocketAddr, ServerName<'static>)> {
        let n = self.router.nodes().get(i)?;
        let name = ServerName::try_from(n.host.clone()).ok()?;
        if let Ok(ip) = n.host.parse::<IpAddr>() {
            return Some((SocketAddr::new(ip, n.port), name));
        }
        let seed = self.seeds.iter().find(|s| s.0 == n.host && s.1 == n.port)?;
        Some((seed.2, name))
    }

    /// Time passed: the router acts, the sockets it wants are connected
    /// and what it queued is written. Called at the end of every turn.
    #[inline(never)]
    pub fn tick(&mut self, store: &mut RedisStore, registry: &Registry, now: Millis) {
        self.router.tick(now);
        self.pump(store, registry, now);
        self.connect_due(registry, now);
        self.pump(store, registry, now);
        self.flush(store, registry, now);
    }

    /// Connects the sockets the router wants and are due; drops the ones
    /// it no longer wants. Also called before the first turn, as one
    /// Redis's sockets are connected then, so that the seeds answer
    /// before the first request is read; what the router says meanwhile
    /// reaches the engine at the next `pump`.
    #[inline(never)]
    pub fn connect_due(&mut self, registry: &Registry, now: Millis) {
        self.grow();
        for i in 0..self.socks.len() {
            for k in 0..2 {
                let wants = self.router.wants(i, sock_of(k));
                let s = &self.socks[i][k];
                if !wants && s.sock.is_some() {
                    // Not a failure: nothing is logged.
                    self.drop_sock(i, k, registry, now, &"no longer a master", false);
                    self.socks[i][k].retry_at = now;
                    self.router.closed(i, sock_of(k), now);
                    continue;
                }
                if !wants || s.sock.is_some() || now < s.retry_at {
                    continue;
                }
                let token = Token(CLUSTER_TOKENS + 2 * i + k);
                let connected = match self.addr_of(i) {
                    None => Err("the cluster names a node by a host name".to_string()),
                    Some((addr, name)) => self.connect(addr, name, token, registry),
                };
                match connected {
                    Ok(stream) => {
                        let s = &mut self.socks[i][k];
                        s.sock = Some(stream);
                        s.open = false;
                        s.writable = false;
                    }
                    Err(cause) => {
                        self.failed(now, &cause);
                        let s = &mut self.socks[i][k];
                        s.retry_at = now.after(s.backoff);
                        s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
                        self.router.closed(i, sock_of(k), now);
                    }
                }
            }
        }
    }

    fn connect(
        &self,
        addr: SocketAddr,
        name: ServerName<'static>,
        token: Token,
        registry: &Registry,
    ) -> Result<Stream, String> {
        let mut sock = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        registry
            .register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| e.to_string())?;
        match &self.tls {
            None => Ok(Stream::Plain(sock)),
            Some(t) => t.stream(sock, name),
        }
    }

    /// When a socket is due to connect again, or the router to act.
    pub fn next_deadline(&self) -> Option<Millis> {
        let socks = self.socks.iter().enumerate().flat_map(|(i, p)| {
            p.iter()
                .enumerate()
                .filter(move |(k, s)| s.sock.is_none() && self.router.wants(i, sock_of(*k)))
                .map(|(_, s)| s.retry_at)
        });
        socks.chain(self.router.next_deadline()).min()
    }

    /// Whether output is left to write.
    pub fn busy(&self) -> bool {
        self.socks.iter().flatten().any(|s| {
            s.writable
                && (s.written < s.out.len() || s.sock.as_ref().is_some_and(Stream::has_records))
        })
    }

    /// An event on one of the sockets.
    #[inline(never)]
    pub fn on_event(
        &mut self,
        token: Token,
        ev: &mio::event::Event,
        store: &mut RedisStore,
        registry: &Registry,
        now: Millis,
        scratch: &mut [u8],
    ) {
        let at = token.0.wrapping_sub(CLUSTER_TOKENS);
        let (i, k) = (at / 2, at % 2);
        let Some(s) = self.socks.get_mut(i).map(|p| &mut p[k]) else {
            return;
        };
        let Some(sock) = &mut s.sock else {
            return;
        };
        if !s.open {
            if let Err(failed) = connect_outcome(sock, ev) {
                if let Some(cause) = failed {
                    self.drop_sock(i, k, registry, now, &cause, true);
                }
                return;
            }
            s.open = true;
            let _ = sock.tcp().set_nodelay(true);
            self.router.opened(i, sock_of(k), now);
        }
        if ev.is_writable() {
            s.writable = true;
        }
        let router = &mut self.router;
        let gone = match &mut self.socks[i][k].sock {
            Some(sock) => read_all(sock, scratch, &mut |bytes| {
                router.input(i, sock_of(k), bytes, now)
            }),
            None => None,
        };
        if let Some(cause) = gone {
            self.drop_sock(i, k, registry, now, &cause, true);
        }
        self.pump(store, registry, now);
        self.flush(store, registry, now);
    }

    /// Moves bytes and notices between the router and the engine until
    /// neither has more.
    #[inline(never)]
    fn pump(&mut self, store: &mut RedisStore, registry: &Registry, now: Millis) {
        for _ in 0..16 {
            let mut moved = false;
            for link in [Link::Command, Link::Events] {
                let bytes = self.router.take_engine_input(link);
                if !bytes.is_empty() {
                    moved = true;
                    if let Err(e) = store.input(link, &bytes) {
                        // The engine cannot read what it was given: that
                        // link starts again on every master.
                        let k = usize::from(link == Link::Events);
                        for i in 0..self.socks.len() {
                            if self.socks[i][k].sock.is_some() {
                                self.drop_sock(i, k, registry, now, &e, true);
                            }
                        }
                    }
                }
            }
            for notice in self.router.take_notices() {
                moved = true;
                match notice {
                    Notice::Connected(link) => store.connected(link),
                    Notice::Lost(link) => store.lost(link),
                }
            }
            for link in [Link::Command, Link::Events] {
                let out = store.take_output(link);
                if !out.is_empty() {
                    moved = true;
                    self.router.from_engine(link, &out, now);
                }
            }
            for i in 0..self.socks.len() {
                if self.router.take_drop(i) && self.socks[i][1].sock.is_some() {
                    self.drop_sock(i, 1, registry, now, &"subscriptions start again", false);
                    self.socks[i][1].retry_at = now;
                }
            }
            if !moved {
                break;
            }
        }
        self.grow();
    }

    /// Writes what the router queued on every socket.
    pub fn flush(&mut self, store: &mut RedisStore, registry: &Registry, now: Millis) {
        self.pump(store, registry, now);
        for i in 0..self.socks.len() {
            for k in 0..2 {
                self.flush_one(i, k, registry, now);
            }
        }
        if store.linked() {
            for s in self.socks.iter_mut().flatten() {
                s.backoff = MIN_BACKOFF;
            }
            if self.trouble.end(now.0).is_some() {
                note(Level::Info, "Redis reachable again", &self.url, "");
            }
        }
    }

    fn flush_one(&mut self, i: usize, k: usize, registry: &Registry, now: Millis) {
        let s = &mut self.socks[i][k];
        if !s.open {
            return;
        }
        queue(
            &mut s.out,
            &mut s.written,
            self.router.take_output(i, sock_of(k)),
        );
        let Some(sock) = &mut s.sock else {
            return;
        };
        if let Err(cause) = write_queued(sock, &mut s.out, &mut s.written, &mut s.writable) {
            self.drop_sock(i, k, registry, now, &cause, true);
        }
    }

    /// Drops node `i`'s socket `k`; `tell`: the router hears of it (else
    /// it asked for it).
    #[inline(never)]
    fn drop_sock(
        &mut self,
        i: usize,
        k: usize,
        registry: &Registry,
        now: Millis,
        cause: &dyn Display,
        tell: bool,
    ) {
        if tell {
            self.failed(now, cause);
        }
        let s = &mut self.socks[i][k];
        if let Some(mut sock) = s.sock.take() {
            let _ = registry.deregister(sock.tcp());
        }
        s.open = false;
        s.writable = false;
        s.out.clear();
        s.written = 0;
        s.retry_at = now.after(s.backoff);
        s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
        if tell {
            self.router.closed(i, sock_of(k), now);
        }
    }
}
