//! The two sockets to Redis, owned by the loop like any other: one carries
//! the script calls (each turn's calls go out in one write, and replies
//! come back in order), the other listens to the channel of changes. A
//! lost socket is connected again with capped backoff; nothing waits for
//! it (requests that need Redis meanwhile get `503`). Why a link failed is
//! logged at `debug` each time, and at `warn` once when Redis becomes
//! unavailable, then at most every 30 s while it stays so; its return is
//! logged once. The URL in these lines never carries the password. With
//! `rediss://` both links speak TLS through the same layer as the server's
//! clients ([`Stream`]), the certificate checked against the URL's host.
//!
//! With `redis-sentinel://` (over TLS with `rediss-sentinel://`, each
//! certificate checked against the sentinel's host and the master's
//! address as named) a third socket talks to one sentinel at a
//! time (the next one when it fails): it asks where the master is and
//! listens for `+switch-master`. Both links go to the address it names;
//! when it names another, both are dropped and connect there, and the
//! engine takes it as a Redis restart (it reads again what it follows).
//! A lost command link asks the sentinel again, so a master that went
//! away is looked up without waiting for the failover's announcement. A
//! master named by a host name (sentinels with `announce-hostnames yes`)
//! is looked up on a short-lived thread, one at a time, which wakes the
//! loop with the addresses ([`RESOLVED`]): the loop never waits on a
//! name server.

use std::fmt::Display;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use log::Level;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};
use rustls::pki_types::ServerName;

mod cluster;

use cluster::ClusterLinks;
pub use cluster::is_cluster;

use super::buffer::WriteStatus;
use super::stream::Stream;
use crate::store::engine::Engine;
use crate::store::redis::{Link, RedisStore, RedisUrl, Sentinel, Trouble, note};
use crate::time::Millis;

pub const COMMAND: Token = Token(usize::MAX - 4);
pub const EVENTS: Token = Token(usize::MAX - 5);
pub const SENTINEL: Token = Token(usize::MAX - 6);
/// The waker a lookup of the master's host name fires.
pub const RESOLVED: Token = Token(usize::MAX - 7);

/// The first wait before connecting again, doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Bytes written per link and turn before the loop moves on.
const WRITE_BUDGET: usize = 1 << 20;

struct Sock {
    link: Link,
    token: Token,
    sock: Option<Stream>,
    /// Connected (the first writable edge came without an error).
    open: bool,
    out: Vec<u8>,
    written: usize,
    writable: bool,
    retry_at: Millis,
    backoff: Duration,
}

impl Sock {
    fn new(link: Link, token: Token) -> Sock {
        Sock {
            link,
            token,
            sock: None,
            open: false,
            out: Vec::new(),
            written: 0,
            writable: false,
            retry_at: Millis(0),
            backoff: MIN_BACKOFF,
        }
    }
}

/// TLS to Redis: the client settings and the name checked (with
/// Sentinel, the master's address as the sentinels name it).
struct RedisTls {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl RedisTls {
    /// `sock` over TLS, the certificate checked against `name`.
    fn stream(&self, sock: TcpStream, name: ServerName<'static>) -> Result<Stream, String> {
        match rustls::client::UnbufferedClientConnection::new(Arc::clone(&self.config), name) {
            // Replies are read whole each event: no per-turn cap on this
            // trusted peer.
            Ok(c) => Ok(Stream::tls(sock, c.into(), usize::MAX)),
            Err(e) => Err(format!("cannot start TLS: {e}")),
        }
    }
}

/// The link to one of the sentinels (`redis-sentinel://`).
struct Watch {
    addrs: Vec<SocketAddr>,
    /// Which sentinel the next connect tries.
    next: usize,
    sock: Option<Stream>,
    open: bool,
    out: Vec<u8>,
    talk: Sentinel,
    url: RedisUrl,
    retry_at: Millis,
    backoff: Duration,
}

/// A lookup of the master's host name, on a thread of its own.
struct Lookup {
    /// What the thread looks up; `host` and `port` are the newest name
    /// the sentinels gave.
    asked: (String, u16),
    host: String,
    port: u16,
    name: ServerName<'static>,
    /// Filled by the thread, which then wakes the loop.
    answer: Arc<std::sync::Mutex<Option<io::Result<Vec<SocketAddr>>>>>,
}

/// Both links, and where Redis is.
pub struct RedisLinks {
    /// Wakes the loop when a lookup answers (with a sentinel).
    waker: Option<Arc<mio::Waker>>,
    lookup: Option<Lookup>,
    /// With a sentinel: asks it where the master is (then `addrs`).
    watch: Option<Box<Watch>>,
    addrs: Vec<SocketAddr>,
    tls: Option<RedisTls>,
    socks: [Sock; 2],
    /// Which address the next connect tries.
    next_addr: usize,
    /// The URL without its password, for the logs.
    url: String,
    /// Redis cannot be reached or refuses the links: logged once, then
    /// every 30 s.
    trouble: Trouble,
    /// With `redis-cluster://`: a socket pair per master instead of
    /// `socks`, and the router between them and the engine.
    cluster: Option<Box<ClusterLinks>>,
}

impl RedisLinks {
    /// The links to Redis at `addrs`; over TLS when `url` is `rediss://`,
    /// trusting `ca` (else the system's roots). With `redis-sentinel://`,
    /// `addrs` are the sentinels'. Nothing connects yet.
    pub fn new(
        addrs: Vec<SocketAddr>,
        url: &RedisUrl,
        ca: Option<&std::path::Path>,
    ) -> Result<RedisLinks, String> {
        let tls = if url.tls {
            let ssl_cert_file = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
            let config = crate::tls::client_config(ca, ssl_cert_file.as_deref(), None)?;
            let name = ServerName::try_from(url.host.clone())
                .map_err(|_| format!("'{}' is not a host name TLS can check", url.host))?;
            Some(RedisTls { config, name })
        } else {
            None
        };
        if url.cluster.is_some() {
            let cluster = ClusterLinks::new(addrs, url, tls);
            let mut links = RedisLinks::new(
                Vec::new(),
                &RedisUrl {
                    tls: false,
                    cluster: None,
                    ..url.clone()
                },
                None,
            )?;
            links.cluster = Some(Box::new(cluster));
            return Ok(links);
        }
        let (addrs, watch) = match &url.sentinel {
            None => (addrs, None),
            Some(s) => {
                let watch = Watch {
                    addrs,
                    next: 0,
                    sock: None,
                    open: false,
                    out: Vec::new(),
                    talk: Sentinel::new(&s.master),
                    url: url.clone(),
                    retry_at: Millis(0),
                    backoff: MIN_BACKOFF,
                };
                (Vec::new(), Some(Box::new(watch)))
            }
        };
        Ok(RedisLinks {
            waker: None,
            lookup: None,
            watch,
            addrs,
            tls,
            socks: [
                Sock::new(Link::Command, COMMAND),
                Sock::new(Link::Events, EVENTS),
            ],
            next_addr: 0,
            url: url.display(),
            trouble: Trouble::default(),
            cluster: None,
        })
    }

    /// The loop's waker, with a sentinel: a host name it names for the
    /// master is looked up off the loop, which this wakes with the
    /// answer ([`RESOLVED`]).
    pub fn set_waker(&mut self, waker: Arc<mio::Waker>) {
        self.waker = Some(waker);
    }

    /// Whether a sentinel is asked where the master is.
    pub fn follows_sentinels(&self) -> bool {
        self.watch.is_some()
    }

    /// A link failed because of `cause`: logged at `debug` every time, at
    /// `warn` when it is news (see [`Trouble`]).
    #[inline(never)]
    fn failed(&mut self, now: Millis, cause: &dyn Display) {
        let cause = cause.to_string();
        let cause = cause.as_str();
        note(Level::Debug, "Redis link failed", &self.url, cause);
        if self.trouble.report(now.0).is_some() {
            let event = "Redis unavailable; connecting again";
            note(Level::Warn, event, &self.url, cause);
        }
    }

    /// Connects the links that are down and due.
    pub fn tick(&mut self, registry: &Registry, now: Millis) {
        if let Some(c) = &mut self.cluster {
            // What the router has to say reaches the engine in `flush`,
            // which has it at hand.
            c.connect_due(registry, now);
            return;
        }
        if let Some(w) = &mut self.watch
            && w.sock.is_none()
            && now >= w.retry_at
            && !w.addrs.is_empty()
        {
            let at = w.next % w.addrs.len();
            let addr = w.addrs[at];
            let interest = Interest::READABLE | Interest::WRITABLE;
            // Over TLS, the sentinel's certificate names its host in the URL.
            let hosts = w.url.sentinel.as_ref().map(|s| &s.hosts[..]);
            let host = hosts.and_then(|h| h.get(at)).map_or("", |h| h.0.as_str());
            let registered = TcpStream::connect(addr).and_then(|mut sock| {
                registry.register(&mut sock, SENTINEL, interest)?;
                match &self.tls {
                    None => Ok(Stream::Plain(sock)),
                    Some(t) => {
                        let name = ServerName::try_from(host.to_string());
                        match name.map(|n| t.stream(sock, n)) {
                            Ok(Ok(s)) => Ok(s),
                            Ok(Err(e)) => Err(io::Error::other(e)),
                            Err(_) => Err(io::Error::other("not a name TLS can check")),
                        }
                    }
                }
            });
            match registered {
                Ok(sock) => {
                    w.sock = Some(sock);
                    w.open = false;
                }
                Err(e) => self.sentinel_failed(registry, now, &e),
            }
        }
        for i in 0..2 {
            let s = &mut self.socks[i];
            if s.sock.is_some() || now < s.retry_at || self.addrs.is_empty() {
                continue;
            }
            let addr = self.addrs[self.next_addr % self.addrs.len()];
            match TcpStream::connect(addr) {
                Ok(mut sock) => {
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    if registry.register(&mut sock, s.token, interest).is_ok() {
                        let stream = match &self.tls {
                            None => Stream::Plain(sock),
                            Some(t) => match t.stream(sock, t.name.clone()) {
                                Ok(s) => s,
                                Err(cause) => {
                                    self.failed(now, &cause);
                                    let s = &mut self.socks[i];
                                    s.retry_at = now.after(s.backoff);
                                    s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
                                    continue;
                                }
                            },
                        };
                        s.sock = Some(stream);
                        s.open = false;
                        s.writable = false;
                    } else {
                        self.next_addr += 1;
                        s.retry_at = now.after(s.backoff);
                        s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
                    }
                }
                Err(e) => {
                    self.failed(now, &e);
                    let s = &mut self.socks[i];
                    self.next_addr += 1;
                    s.retry_at = now.after(s.backoff);
                    s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// When a link is due to connect again, if one is down.
    pub fn next_deadline(&self) -> Option<Millis> {
        if let Some(c) = &self.cluster {
            return c.next_deadline();
        }
        let watch = self.watch.as_ref().filter(|w| w.sock.is_none());
        self.socks
            .iter()
            .filter(|s| s.sock.is_none() && !self.addrs.is_empty())
            .map(|s| s.retry_at)
            .chain(watch.map(|w| w.retry_at))
            .min()
    }

    /// The sentinel link failed: the next sentinel is tried after the
    /// backoff. While no sentinel has named the master yet, Redis is
    /// unavailable, and logged as such (once, then every 30 s).
    #[inline(never)]
    fn sentinel_failed(&mut self, registry: &Registry, now: Millis, cause: &dyn Display) {
        if self.addrs.is_empty() {
            self.failed(now, cause);
        } else {
            let cause = cause.to_string();
            note(Level::Debug, "Redis sentinel failed", &self.url, &cause);
        }
        let Some(w) = &mut self.watch else {
            return;
        };
        if let Some(mut sock) = w.sock.take() {
            let _ = registry.deregister(sock.tcp());
        }
        w.open = false;
        w.out.clear();
        w.next += 1;
        w.retry_at = now.after(w.backoff);
        w.backoff = (w.backoff * 2).min(MAX_BACKOFF);
    }

    /// An event on the sentinel link: the questions written once it
    /// connects, every address it names followed.
    #[inline(never)]
    fn on_sentinel(
        &mut self,
        ev: &mio::event::Event,
        store: &mut RedisStore,
        registry: &Registry,
        now: Millis,
        scratch: &mut [u8],
    ) {
        let Some(w) = &mut self.watch else {
            return;
        };
        let Some(sock) = &mut w.sock else {
            return;
        };
        if !w.open {
            if let Err(failed) = connect_outcome(sock, ev) {
                if let Some(cause) = failed {
                    self.sentinel_failed(registry, now, &cause);
                }
                return;
            }
            w.open = true;
            w.out = w.talk.hello(&w.url);
        }
        let mut gone = None;
        let mut heard = Vec::new();
        while !w.out.is_empty() {
            match sock.write(&w.out) {
                Ok(n) => drop(w.out.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    gone = Some(e.to_string());
                    break;
                }
            }
        }
        if gone.is_none()
            && sock.has_records()
            && matches!(sock.flush_records(), WriteStatus::Failed)
        {
            gone = Some("TLS write failed".to_string());
        }
        while gone.is_none() {
            match sock.read(scratch) {
                Ok(0) => gone = Some("the sentinel closed the connection".to_string()),
                Ok(n) => match w.talk.input(&scratch[..n]) {
                    Ok(h) => heard.extend(h),
                    Err(e) => gone = Some(e.to_string()),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => gone = Some(e.to_string()),
            }
        }
        for (host, port) in heard {
            self.master_at(&host, port, store, registry, now);
        }
        if let Some(cause) = gone {
            self.sentinel_failed(registry, now, &cause);
        }
    }

    /// A sentinel says the master is at `host:port`: if that is news,
    /// both links are dropped and connect there at once.
    /// A host name (sentinels with `announce-hostnames yes`) is looked up
    /// on a thread of its own, which wakes the loop with the addresses
    /// ([`resolved`](Self::resolved)); a newer answer of the sentinel
    /// supersedes a lookup under way.
    #[inline(never)]
    fn master_at(
        &mut self,
        host: &str,
        port: u16,
        store: &mut RedisStore,
        registry: &Registry,
        now: Millis,
    ) {
        let Some(w) = &mut self.watch else {
            return;
        };
        w.backoff = MIN_BACKOFF;
        let Ok(ip) = host.parse::<std::net::IpAddr>() else {
            self.lookup(host, port);
            return;
        };
        self.lookup = None;
        self.master_addrs(
            vec![SocketAddr::new(ip, port)],
            ServerName::from(ip),
            store,
            registry,
            now,
        );
    }

    /// Starts looking `host` up off the loop, unless that lookup is under
    /// way.
    fn lookup(&mut self, host: &str, port: u16) {
        let (Some(waker), Ok(name)) = (&self.waker, ServerName::try_from(host.to_string())) else {
            let cause = "the sentinel named a host name that cannot be looked up";
            note(Level::Warn, "Redis master not followed", &self.url, cause);
            return;
        };
        if let Some(l) = &mut self.lookup {
            // One lookup at a time: another name waits for its answer.
            (l.host, l.port, l.name) = (host.to_string(), port, name);
            return;
        }
        let answer = Arc::new(std::sync::Mutex::new(None));
        let (to, waker, name_of) = (Arc::clone(&answer), Arc::clone(waker), host.to_string());
        let spawned = std::thread::Builder::new()
            .name("relay-resolve".into())
            .spawn(move || {
                use std::net::ToSocketAddrs;
                let found = (name_of.as_str(), port)
                    .to_socket_addrs()
                    .map(|a| a.take(16).collect::<Vec<_>>());
                if let Ok(mut slot) = to.lock() {
                    *slot = Some(found);
                }
                let _ = waker.wake();
            });
        if let Err(e) = spawned {
            note(
                Level::Warn,
                "Redis master not followed",
                &self.url,
                &e.to_string(),
            );
            return;
        }
        self.lookup = Some(Lookup {
            asked: (host.to_string(), port),
            host: host.to_string(),
            port,
            name,
            answer,
        });
    }

    /// The loop was woken: a lookup of the master's name may have
    /// answered.
    fn resolved(&mut self, store: &mut RedisStore, registry: &Registry, now: Millis) {
        let Some(l) = &self.lookup else {
            return;
        };
        let found = match l.answer.lock() {
            Ok(mut slot) => slot.take(),
            Err(_) => Some(Err(io::Error::other("the lookup failed"))),
        };
        let Some(found) = found else {
            return;
        };
        let Some(l) = self.lookup.take() else {
            return;
        };
        if l.asked.0 != l.host || l.asked.1 != l.port {
            // The sentinels named another since: that one is looked up.
            self.lookup(&l.host, l.port);
            return;
        }
        match found {
            Ok(addrs) if !addrs.is_empty() => {
                self.master_addrs(addrs, l.name, store, registry, now)
            }
            Ok(_) => {
                let cause = format!("{} has no address", l.host);
                note(Level::Warn, "Redis master not followed", &self.url, &cause);
            }
            Err(e) => {
                let cause = format!("cannot resolve {}: {e}", l.host);
                note(Level::Warn, "Redis master not followed", &self.url, &cause);
            }
        }
    }

    /// The master is at `addrs` (each tried in turn), its certificate
    /// checked against `name` over TLS: if that is news, both links are
    /// dropped and connect there at once.
    fn master_addrs(
        &mut self,
        addrs: Vec<SocketAddr>,
        name: ServerName<'static>,
        store: &mut RedisStore,
        registry: &Registry,
        now: Millis,
    ) {
        if self.addrs == addrs {
            return;
        }
        let shown: Vec<String> = addrs.iter().map(SocketAddr::to_string).collect();
        note(Level::Info, "Redis master", &self.url, &shown.join(","));
        store.master_moved();
        self.addrs = addrs;
        // Over TLS, the master's certificate names the address (or host
        // name) the sentinels name.
        if let Some(t) = &mut self.tls {
            t.name = name;
        }
        // The sentinel that said so is not asked again.
        let watch = self.watch.take();
        for i in 0..2 {
            if self.socks[i].sock.is_some() {
                self.drop_link(i, store, registry, now, &"the master moved");
            }
            let s = &mut self.socks[i];
            s.retry_at = now;
            s.backoff = MIN_BACKOFF;
        }
        self.watch = watch;
        self.next_addr = 0;
    }

    /// An event on one of the links: connects, reads every reply into the
    /// engine, writes what is queued. A failure drops the link.
    pub fn on_event(
        &mut self,
        token: Token,
        ev: &mio::event::Event,
        engine: &mut Engine,
        registry: &Registry,
        now: Millis,
        scratch: &mut [u8],
    ) {
        let Some(store) = engine.redis() else {
            return;
        };
        if let Some(c) = &mut self.cluster {
            c.on_event(token, ev, store, registry, now, scratch);
            return;
        }
        if token == SENTINEL {
            self.on_sentinel(ev, store, registry, now, scratch);
            return;
        }
        if token == RESOLVED {
            self.resolved(store, registry, now);
            return;
        }
        let i = usize::from(token == EVENTS);
        let s = &mut self.socks[i];
        let Some(sock) = &mut s.sock else {
            return;
        };
        if !s.open {
            if let Err(failed) = connect_outcome(sock, ev) {
                if let Some(cause) = failed {
                    self.drop_link(i, store, registry, now, &cause);
                }
                return;
            }
            s.open = true;
            let _ = sock.tcp().set_nodelay(true);
            store.connected(s.link);
        }
        if ev.is_writable() {
            s.writable = true;
        }
        let link = s.link;
        let gone = read_all(sock, scratch, &mut |bytes| store.input(link, bytes));
        if let Some(cause) = gone {
            self.drop_link(i, store, registry, now, &cause);
            return;
        }
        self.flush_one(i, store, registry, now);
    }

    /// Writes what the engine queued on both links; called at the end of
    /// every turn, so a turn's calls go out together.
    pub fn flush(&mut self, engine: &mut Engine, registry: &Registry, now: Millis) {
        let Some(store) = engine.redis() else {
            return;
        };
        if let Some(c) = &mut self.cluster {
            c.tick(store, registry, now);
            return;
        }
        for i in 0..2 {
            self.flush_one(i, store, registry, now);
        }
    }

    fn flush_one(&mut self, i: usize, store: &mut RedisStore, registry: &Registry, now: Millis) {
        let s = &mut self.socks[i];
        if !s.open {
            return;
        }
        queue(&mut s.out, &mut s.written, store.take_output(s.link));
        let Some(sock) = &mut s.sock else {
            return;
        };
        if let Err(cause) = write_queued(sock, &mut s.out, &mut s.written, &mut s.writable) {
            self.drop_link(i, store, registry, now, &cause);
            return;
        }
        if store.linked() {
            for s in &mut self.socks {
                s.backoff = MIN_BACKOFF;
            }
            if self.trouble.end(now.0).is_some() {
                note(Level::Info, "Redis reachable again", &self.url, "");
            }
        }
    }

    /// Whether output is left to write (the loop polls again at once).
    pub fn busy(&self) -> bool {
        if let Some(c) = &self.cluster {
            return c.busy();
        }
        self.socks.iter().any(|s| {
            s.writable
                && (s.written < s.out.len() || s.sock.as_ref().is_some_and(Stream::has_records))
        })
    }

    #[inline(never)]
    fn drop_link(
        &mut self,
        i: usize,
        store: &mut RedisStore,
        registry: &Registry,
        now: Millis,
        cause: &dyn Display,
    ) {
        self.failed(now, cause);
        let s = &mut self.socks[i];
        if let Some(mut sock) = s.sock.take() {
            let _ = registry.deregister(sock.tcp());
        }
        s.open = false;
        s.out.clear();
        s.written = 0;
        s.retry_at = now.after(s.backoff);
        s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
        store.lost(s.link);
        self.next_addr += 1;
        // Where is the master now? The sentinel is asked again.
        if i == 0
            && let Some(w) = &mut self.watch
            && w.open
        {
            if let Some(mut sock) = w.sock.take() {
                let _ = registry.deregister(sock.tcp());
            }
            w.open = false;
            w.retry_at = now;
        }
    }
}

/// What an event says of a socket still connecting: connected (`Ok`),
/// failed with its cause (`Err(Some)`), or not yet known (`Err(None)`:
/// an event that neither writes nor fails comes before the outcome).
pub(super) fn connect_outcome(
    sock: &mut Stream,
    ev: &mio::event::Event,
) -> Result<(), Option<String>> {
    let tcp = sock.tcp();
    let cause = match tcp.take_error() {
        Ok(Some(e)) | Err(e) => Some(e.to_string()),
        Ok(None) if ev.is_error() => Some("connection failed".to_string()),
        Ok(None) => tcp.peer_addr().err().map(|e| e.to_string()),
    };
    match cause {
        None => Ok(()),
        Some(cause) if ev.is_writable() || ev.is_error() || ev.is_read_closed() => Err(Some(cause)),
        Some(_) => Err(None),
    }
}

/// Reads what `sock` has into `take`, a read at a time, until it would
/// block. Why the socket goes, if it does: closed by Redis, refused by
/// `take`, or a read error (a TLS failure, such as an untrusted
/// certificate or a wrong name, says so).
pub(super) fn read_all(
    sock: &mut Stream,
    scratch: &mut [u8],
    take: &mut dyn FnMut(&[u8]) -> Result<(), String>,
) -> Option<String> {
    loop {
        match sock.read(scratch) {
            Ok(0) => return Some("Redis closed the connection".to_string()),
            Ok(n) => {
                if let Err(e) = take(&scratch[..n]) {
                    return Some(e);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Some(format!("TLS failed: {e}"));
            }
            Err(e) => return Some(e.to_string()),
        }
    }
}

/// Appends `more` to what `out` has still to write from `written` on.
pub(super) fn queue(out: &mut Vec<u8>, written: &mut usize, more: Vec<u8>) {
    if more.is_empty() {
        return;
    }
    if out.is_empty() {
        *out = more;
        *written = 0;
    } else {
        out.extend_from_slice(&more);
    }
}

/// Writes what `out` holds from `written` on while the socket takes it,
/// at most [`WRITE_BUDGET`] bytes this turn, then the TLS records; once
/// all is written the buffer is emptied. An error says why the socket
/// goes.
pub(super) fn write_queued(
    sock: &mut Stream,
    out: &mut Vec<u8>,
    written: &mut usize,
    writable: &mut bool,
) -> Result<(), String> {
    let mut budget = WRITE_BUDGET;
    while *writable && *written < out.len() && budget > 0 {
        let end = out.len().min(*written + budget);
        match sock.write(&out[*written..end]) {
            Ok(0) => break,
            Ok(n) => {
                *written += n;
                budget -= n.min(budget);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => *writable = false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    if *writable && sock.has_records() {
        match sock.flush_records() {
            WriteStatus::Drained => {}
            WriteStatus::WouldBlock | WriteStatus::Budget => *writable = false,
            WriteStatus::Failed => return Err("TLS write failed".to_string()),
        }
    }
    if *written == out.len() {
        out.clear();
        *written = 0;
    }
    Ok(())
}
