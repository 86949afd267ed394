//! The Redis Cluster router against a real cluster of three masters,
//! driven by a small blocking driver in place of the loop and the engine:
//! commands of the test's own (a library of two functions) routed by
//! slot, their replies back in order, a slot moved by hand followed
//! through `ASK` and `MOVED`, and sharded pub/sub with a `PING` barrier
//! over every master.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use relay::store::redis::cluster::{Notice, Router, Sock};
use relay::store::redis::slot::slot_of;
use relay::store::redis::{Link, RedisUrl};
use relay::time::Millis;

use crate::common::Redis;

fn skip_unless_plain() -> bool {
    for mode in ["TEST_WITH_REDIS", "TEST_WITH_DATA_DIR", "TEST_WITH_TLS"] {
        if std::env::var_os(mode).is_some() {
            eprintln!("skipped with {mode}: starts its own Redis processes, run in the plain pass");
            return true;
        }
    }
    false
}

/// Three masters in one cluster, its state `ok`.
fn cluster() -> Vec<Redis> {
    cluster_of(3, "0")
}

/// `n` nodes in one cluster, `replicas` per master, its state `ok`.
fn cluster_of(n: usize, replicas: &str) -> Vec<Redis> {
    let args = [
        "--save",
        "",
        "--appendonly",
        "no",
        "--cluster-enabled",
        "yes",
        "--cluster-node-timeout",
        "1000",
    ];
    let nodes: Vec<Redis> = (0..n).map(|_| Redis::start_with(&args)).collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", replicas, "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !nodes
        .iter()
        .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"))
    {
        assert!(Instant::now() < deadline, "the cluster never became ok");
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes
}

/// The loop and the engine, in a few lines: sockets opened as the router
/// wants them, bytes moved both ways, what the engine would read kept.
struct Driver {
    r: Router,
    socks: HashMap<(usize, usize), TcpStream>,
    start: Instant,
    got: [Vec<u8>; 2],
    notices: Vec<Notice>,
}

fn sock_of(k: usize) -> Sock {
    if k == 0 { Sock::Command } else { Sock::Events }
}

impl Driver {
    fn new(seed: u16) -> Driver {
        let url = RedisUrl::parse(&format!("redis-cluster://127.0.0.1:{seed}")).unwrap();
        Driver {
            r: Router::new(&[("127.0.0.1".into(), seed)], &url),
            socks: HashMap::new(),
            start: Instant::now(),
            got: [Vec::new(), Vec::new()],
            notices: Vec::new(),
        }
    }

    fn now(&self) -> Millis {
        Millis(self.start.elapsed().as_millis() as u64 + 1)
    }

    fn step(&mut self) {
        let now = self.now();
        self.r.tick(now);
        for i in 0..self.r.nodes().len() {
            if self.r.take_drop(i) {
                self.socks.remove(&(i, 1));
            }
            for k in 0..2 {
                let wants = self.r.wants(i, sock_of(k));
                if wants && !self.socks.contains_key(&(i, k)) {
                    let n = &self.r.nodes()[i];
                    match TcpStream::connect((n.host.as_str(), n.port)) {
                        Ok(s) => {
                            s.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
                            self.socks.insert((i, k), s);
                            self.r.opened(i, sock_of(k), now);
                        }
                        Err(_) => self.r.closed(i, sock_of(k), now),
                    }
                }
            }
        }
        let keys: Vec<_> = self.socks.keys().copied().collect();
        for (i, k) in keys {
            let out = self.r.take_output(i, sock_of(k));
            let Some(s) = self.socks.get_mut(&(i, k)) else {
                continue;
            };
            let mut buf = [0u8; 65536];
            let read = s.write_all(&out).and_then(|_| s.read(&mut buf));
            match read {
                Ok(n) if n > 0 => self.r.input(i, sock_of(k), &buf[..n], now).expect("input"),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                _ => {
                    // The node is gone.
                    self.socks.remove(&(i, k));
                    self.r.closed(i, sock_of(k), now);
                }
            }
        }
        for link in [Link::Command, Link::Events] {
            let k = usize::from(link == Link::Events);
            let bytes = self.r.take_engine_input(link);
            self.got[k].extend(bytes);
        }
        self.notices.extend(self.r.take_notices());
    }

    /// Steps until `done`, for at most 10 s.
    #[track_caller]
    fn until(&mut self, what: &str, done: impl Fn(&Driver) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(self) {
            assert!(Instant::now() < deadline, "never: {what}");
            self.step();
        }
    }

    fn send(&mut self, link: Link, args: &[&[u8]]) {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend(b"\r\n");
        }
        let now = self.now();
        self.r.from_engine(link, &out, now);
    }

    /// Waits for `want` on the command link and takes it.
    #[track_caller]
    fn expect(&mut self, want: &[u8]) {
        self.until(&String::from_utf8_lossy(want), |d| {
            d.got[0].len() >= want.len()
        });
        let got: Vec<u8> = self.got[0].drain(..want.len()).collect();
        assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));
    }
}

const LIBRARY: &str = "#!lua name=routertest\n\
    redis.register_function('tset', function(k, a) return redis.call('SET', k[1], a[1]) end)\n\
    redis.register_function{function_name = 'tget', callback = function(k, a) return redis.call('GET', k[1]) end, flags = {'no-writes'}}\n";

fn id_of(n: &Redis) -> String {
    n.cli(&["cluster", "myid"]).trim().to_string()
}

#[test]
fn calls_follow_slots_asks_and_moves_and_events_pass_over_every_master() {
    if skip_unless_plain() {
        return;
    }
    let nodes = cluster();
    let mut d = Driver::new(nodes[1].port);
    d.until("the command link", |d| {
        d.notices.contains(&Notice::Connected(Link::Command))
    });
    d.until("the events link", |d| {
        d.notices.contains(&Notice::Connected(Link::Events))
    });

    // Set-up to every master, one reply.
    d.send(Link::Command, &[b"FUNCTION", b"LOAD", LIBRARY.as_bytes()]);
    d.expect(b"$10\r\nroutertest\r\n");
    for n in &nodes {
        assert!(
            n.cli(&["function", "list"]).contains("routertest"),
            "loaded on {}",
            n.port
        );
    }

    // Calls over every slot range, replies in order.
    let keys: Vec<String> = (0..60).map(|i| format!("key{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        d.send(
            Link::Command,
            &[
                b"FCALL",
                b"tset",
                b"1",
                k.as_bytes(),
                format!("v{i}").as_bytes(),
            ],
        );
    }
    for k in &keys {
        d.send(Link::Command, &[b"FCALL_RO", b"tget", b"1", k.as_bytes()]);
    }
    d.expect(&b"+OK\r\n".repeat(keys.len()));
    for i in 0..keys.len() {
        let v = format!("v{i}");
        d.expect(format!("${}\r\n{v}\r\n", v.len()).as_bytes());
    }
    for n in &nodes {
        let here = n.cli(&["dbsize"]).trim().parse::<u64>().unwrap_or(0);
        assert!(
            here > 5,
            "every master holds some keys: {here} on {}",
            n.port
        );
    }

    // A slot of key0 moved by hand from its master to another: a new key
    // of that slot while it migrates is written through ASK, key0 after
    // the move read through MOVED.
    let slot = slot_of(b"key0").to_string();
    let owner = |n: &Redis| n.cli(&["cluster", "countkeysinslot", &slot]).trim() != "0";
    let from = nodes.iter().position(owner).expect("key0's master");
    let to = (from + 1) % 3;
    let (src, dst) = (&nodes[from], &nodes[to]);
    assert!(
        dst.cli(&["cluster", "setslot", &slot, "importing", &id_of(src)])
            .contains("OK")
    );
    assert!(
        src.cli(&["cluster", "setslot", &slot, "migrating", &id_of(dst)])
            .contains("OK")
    );
    let other = (1000..)
        .map(|i| format!("other{i}"))
        .find(|k| slot_of(k.as_bytes()).to_string() == slot)
        .unwrap_or_default();
    d.send(
        Link::Command,
        &[b"FCALL", b"tset", b"1", other.as_bytes(), b"asked"],
    );
    d.expect(b"+OK\r\n");
    assert_eq!(
        dst.commands("asking"),
        1,
        "sent to the importing master with ASKING"
    );
    let port = dst.port.to_string();
    let migrated = src.cli(&[
        "migrate",
        "127.0.0.1",
        &port,
        "",
        "0",
        "5000",
        "keys",
        "key0",
    ]);
    assert!(migrated.contains("OK"), "{migrated}");
    for n in &nodes {
        n.cli(&["cluster", "setslot", &slot, "node", &id_of(dst)]);
    }
    d.send(Link::Command, &[b"FCALL_RO", b"tget", b"1", b"key0"]);
    d.send(
        Link::Command,
        &[b"FCALL_RO", b"tget", b"1", other.as_bytes()],
    );
    d.expect(b"$2\r\nv0\r\n$5\r\nasked\r\n");
    assert!(src.cli(&["info", "stats"]).contains("total_error_replies:"));
    let moved = |n: &Redis| n.cli(&["info", "errorstats"]).contains("errorstat_MOVED");
    assert!(moved(src), "key0 was asked of its old master first");

    // Sharded channels on two masters, and a PING answered once all did,
    // after the messages each published before it.
    let (a, b) = (b"chan{a}".as_slice(), b"chan{b}".as_slice());
    d.send(Link::Events, &[b"SSUBSCRIBE", a]);
    d.send(Link::Events, &[b"SSUBSCRIBE", b]);
    d.until("both confirmed", |d| {
        d.got[1].windows(10).filter(|w| w == b"ssubscribe").count() == 2
    });
    d.got[1].clear();
    d.send(Link::Command, &[b"SPUBLISH", a, b"one"]);
    d.send(Link::Command, &[b"SPUBLISH", b, b"two"]);
    d.expect(b":1\r\n:1\r\n");
    d.send(Link::Events, &[b"PING"]);
    let pong = b"*2\r\n$4\r\npong\r\n$0\r\n\r\n";
    d.until("the pong", |d| d.got[1].ends_with(pong));
    let events = String::from_utf8_lossy(&d.got[1]).into_owned();
    assert_eq!(events.matches("pong").count(), 1, "one pong: {events}");
    assert!(
        events.contains("$3\r\none\r\n") && events.contains("$3\r\ntwo\r\n"),
        "{events}"
    );
}

/// Takes the next reply on the command link (a simple or error line, or
/// a short bulk string).
#[track_caller]
fn next_reply(d: &mut Driver) -> String {
    d.until("a reply", |d| {
        let text = String::from_utf8_lossy(&d.got[0]).into_owned();
        match text.as_bytes().first() {
            Some(b'$') => text.matches("\r\n").count() >= 2,
            Some(_) => text.contains("\r\n"),
            None => false,
        }
    });
    let text = String::from_utf8_lossy(&d.got[0]).into_owned();
    let lines = if text.starts_with('$') { 2 } else { 1 };
    let end = text
        .match_indices("\r\n")
        .nth(lines - 1)
        .map_or(0, |(i, _)| i + 2);
    d.got[0].drain(..end);
    text[..end].to_string()
}

#[test]
fn a_killed_master_is_followed_to_its_promoted_replica() {
    if skip_unless_plain() {
        return;
    }
    let mut nodes = cluster_of(6, "1");
    // Every replica in sync with its master.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !nodes.iter().all(|n| {
        let role = n.cli(&["role"]);
        !role.starts_with("slave") || role.contains("connected")
    }) {
        assert!(Instant::now() < deadline, "replicas never in sync");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut d = Driver::new(nodes[0].port);
    d.until("both links", |d| d.notices.len() >= 2);
    d.send(Link::Command, &[b"FUNCTION", b"LOAD", LIBRARY.as_bytes()]);
    d.expect(b"$10\r\nroutertest\r\n");
    d.send(Link::Command, &[b"FCALL", b"tset", b"1", b"key0", b"v0"]);
    d.expect(b"+OK\r\n");
    let slot = slot_of(b"key0").to_string();
    let master = nodes
        .iter()
        .position(|n| {
            n.cli(&["role"]).starts_with("master")
                && n.cli(&["cluster", "countkeysinslot", &slot]).trim() != "0"
        })
        .expect("key0's master");
    let wait = nodes[master].cli(&["wait", "1", "2000"]);
    assert_eq!(wait.trim(), "1", "key0 on the replica");
    d.notices.clear();
    nodes[master].kill9();

    // Reads of the slot fail (never hang) until the replica is promoted,
    // then find key0 there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failed = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "never read from the promoted replica"
        );
        d.send(Link::Command, &[b"FCALL_RO", b"tget", b"1", b"key0"]);
        let r = next_reply(&mut d);
        if r == "$2\r\nv0\r\n" {
            break;
        }
        assert!(
            r.starts_with("-RELAYLOST") || r.starts_with("-CLUSTERDOWN"),
            "{r}"
        );
        failed += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(failed > 0, "the slot had no master for a while");
    assert!(
        !d.notices.contains(&Notice::Lost(Link::Command)),
        "{:?}",
        d.notices
    );
    // The events link started again on the new set of masters.
    d.until("events again", |d| {
        d.notices.last() == Some(&Notice::Connected(Link::Events))
    });
    assert!(d.notices.contains(&Notice::Lost(Link::Events)));
}

/// `rediss-cluster://` against one plain Redis speaking TLS (a one-node
/// cluster): the relay reaches it over TLS, the certificate checked
/// against the address it is named by, and stores a prompt there.
#[test]
fn a_one_node_cluster_over_tls_serves_prompts() {
    if skip_unless_plain() {
        return;
    }
    let tls_port = crate::common::free_port();
    let f = crate::common::tls_files();
    let (cert, key, ca) = (
        f.cert.display().to_string(),
        f.key.display().to_string(),
        f.ca.display().to_string(),
    );
    let port = tls_port.to_string();
    let args = [
        "--save",
        "",
        "--appendonly",
        "no",
        "--tls-port",
        &port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ];
    let redis = Redis::start_with(&args);
    let url = format!("rediss-cluster://127.0.0.1:{tls_port}");
    let srv =
        crate::common::Server::start_with(&[("RELAY_REDIS_URL", &url), ("RELAY_REDIS_CA", &ca)]);
    srv.wait_for_log("connected to Redis");
    let sid = crate::common::unique_session();
    srv.prompt(&sid, "over TLS", Some("p1"));
    assert_eq!(srv.pending(&sid).len(), 1);
    let calls = redis.commands("fcall") + redis.commands("evalsha");
    assert!(calls >= 1, "the prompt went to Redis: {calls}");
}
