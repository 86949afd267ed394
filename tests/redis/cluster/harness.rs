//! A Redis Cluster of one test's own: `redis-server --cluster-enabled yes`
//! nodes (Debian's, each on a free port with a free bus port and in a
//! directory of its own), joined by `redis-cli --cluster create`; a
//! master killed with `kill -9` and its replica's promotion awaited; slots
//! moved by `redis-cli --cluster reshard` while traffic flows. Every wait
//! has a deadline and says what it waited for; every node is killed and
//! its directory removed on drop, on a panic too.

use crate::common::{Redis, Server, free_port, unique_session};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The node timeout of the tests' clusters: short, so that a failover
/// takes a few seconds; not shorter, so that a node slowed by the relays
/// and writers sharing its cores is not taken for dead.
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// The slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long a cluster may take to form, or to settle after a failover or
/// a resharding, before the test fails.
const SETTLE: Duration = Duration::from_secs(30);

/// Waits (bounded by `limit`) until `cond` holds, polling every 20 ms;
/// panics naming `what` and the last state `cond` reported.
#[track_caller]
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + limit;
    loop {
        match cond() {
            Ok(()) => return,
            Err(last) if Instant::now() >= deadline => {
                panic!("never within {limit:?}: {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    /// `master`, `slave`, `myself`, `fail`, `fail?`, …
    pub flags: BTreeSet<String>,
    /// The master's id, for a replica.
    pub master_of: Option<String>,
    /// Slot ranges, both ends included (a slot being migrated, shown as
    /// `[slot->-id]`, is not counted).
    pub slots: Vec<(u16, u16)>,
}

impl NodeLine {
    pub fn is_master(&self) -> bool {
        self.flags.contains("master") && !self.failed()
    }

    pub fn failed(&self) -> bool {
        self.flags.contains("fail") || self.flags.contains("fail?")
    }

    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }

    pub fn slot_count(&self) -> usize {
        self.slots
            .iter()
            .map(|&(a, b)| usize::from(b - a) + 1)
            .sum()
    }
}

/// Parses `CLUSTER NODES` (`<id> <ip:port@bus> <flags> <master> <ping>
/// <pong> <epoch> <link> <slot>…`).
pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].split(',').map(str::to_string).collect(),
                master_of: (f[3] != "-").then(|| f[3].to_string()),
                slots,
            })
        })
        .collect()
}

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the part between
/// the first `{` and the next `}`, if not empty) or of the whole key,
/// modulo 16384, as Redis Cluster computes it.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// `redis-cli` against `port` with `args`; its standard output.
fn cli_at(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (scripts/install-test-deps.sh installs redis-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A live node as one node sees it: its port, its master's port (a
/// replica) and the slots it serves (a master).
type Role = (u16, Option<u16>, Vec<(u16, u16)>);

/// A master's failover: when it was killed (dead by then), and the port
/// of the replica promoted in its place.
pub struct Failover {
    pub killed_at: Instant,
    pub promoted: u16,
}

/// The nodes of a cluster (dead ones too, until the cluster is dropped).
pub struct Cluster {
    nodes: Vec<Redis>,
    /// Ports of the nodes killed so far.
    dead: BTreeSet<u16>,
}

impl Cluster {
    /// `masters` masters with `replicas_each` replicas each, failing a
    /// master over after `node_timeout_ms` without it; returns once every
    /// node reports `cluster_state:ok`, agrees on the slot map and every
    /// replica's link to its master is up.
    #[track_caller]
    pub fn start(masters: usize, replicas_each: usize, node_timeout_ms: u64) -> Cluster {
        assert!(masters >= 3, "redis-cli --cluster create wants 3 masters");
        let timeout = node_timeout_ms.to_string();
        let nodes: Vec<Redis> = (0..masters * (1 + replicas_each))
            .map(|_| start_node(&timeout))
            .collect();
        let cluster = Cluster {
            nodes,
            dead: BTreeSet::new(),
        };
        let mut args = vec!["--cluster".to_string(), "create".into()];
        args.extend(
            cluster
                .nodes
                .iter()
                .map(|n| format!("127.0.0.1:{}", n.port)),
        );
        args.extend([
            "--cluster-replicas".into(),
            replicas_each.to_string(),
            "--cluster-yes".into(),
        ]);
        Cli::spawn(&args, "redis-cli --cluster create".into()).finish("All 16384 slots covered");
        cluster.wait_settled("the cluster forms");
        let masters_now = cluster.masters();
        assert_eq!(masters_now.len(), masters, "{masters_now:?}");
        cluster
    }

    /// The live nodes' ports.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .map(|n| n.port)
            .filter(|p| !self.dead.contains(p))
            .collect()
    }

    /// `redis-cluster://` naming two of the live nodes: the relay is
    /// meant to learn the rest from them.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .live_ports()
            .iter()
            .take(2)
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }

    /// `redis-cli` against the node on `port`.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        cli_at(port, args)
    }

    /// `CLUSTER NODES` as the first live node sees it.
    #[track_caller]
    pub fn nodes(&self) -> Vec<NodeLine> {
        let port = self.live_ports()[0];
        parse_nodes(&cli_at(port, &["cluster", "nodes"]))
    }

    /// The masters serving slots, by their first slot.
    #[track_caller]
    pub fn masters(&self) -> Vec<NodeLine> {
        let mut masters: Vec<NodeLine> = self
            .nodes()
            .into_iter()
            .filter(|n| n.is_master() && !n.slots.is_empty())
            .collect();
        masters.sort_by_key(|n| n.slots.iter().map(|s| s.0).min());
        masters
    }

    /// Whether every live node reports `cluster_state:ok`, every live
    /// node sees the same masters serving the same slots and the same
    /// replicas of each, no live node is marked failed, and every live
    /// replica's link to its master is up; `Err` says what is not so yet.
    pub fn settled(&self) -> Result<(), String> {
        let mut maps = BTreeMap::new();
        for port in self.live_ports() {
            let info = cli_at(port, &["cluster", "info"]);
            if !info.contains("cluster_state:ok") {
                return Err(format!("{port}: not cluster_state:ok"));
            }
            let nodes = parse_nodes(&cli_at(port, &["cluster", "nodes"]));
            if let Some(n) = nodes
                .iter()
                .find(|n| n.failed() && !self.dead.contains(&n.port))
            {
                return Err(format!("{port} sees {} failed", n.port));
            }
            // Who serves which slots and who replicates whom, as this
            // node sees it.
            let port_of = |id: &str| nodes.iter().find(|n| n.id == id).map(|n| n.port);
            let map: BTreeSet<Role> = nodes
                .iter()
                .filter(|n| !n.failed() && !self.dead.contains(&n.port))
                .map(|n| {
                    let master = n.master_of.as_deref().and_then(port_of);
                    (n.port, master, n.slots.clone())
                })
                .collect();
            let me = nodes.iter().find(|n| n.flags.contains("myself"));
            if me.is_some_and(|n| n.flags.contains("slave")) {
                let repl = cli_at(port, &["info", "replication"]);
                if !repl.contains("master_link_status:up") {
                    return Err(format!("replica {port}: link to its master not up"));
                }
            }
            maps.insert(port, map);
        }
        let first = maps.values().next().cloned().unwrap_or_default();
        match maps.iter().find(|(_, m)| **m != first) {
            Some((port, map)) => Err(format!("{port} sees {map:?}, another {first:?}")),
            None => Ok(()),
        }
    }

    #[track_caller]
    pub fn wait_settled(&self, what: &str) {
        wait_for(what, SETTLE, || self.settled());
    }

    /// `kill -9` of the master on `port`; returns once one of its replicas
    /// serves its slots and the cluster has settled.
    #[track_caller]
    pub fn kill_master(&mut self, port: u16) -> Failover {
        let before = self.nodes();
        let old = before
            .iter()
            .find(|n| n.port == port && n.is_master())
            .unwrap_or_else(|| panic!("{port} is no master: {before:?}"))
            .clone();
        let replicas: BTreeSet<u16> = before
            .iter()
            .filter(|n| n.master_of.as_deref() == Some(old.id.as_str()))
            .map(|n| n.port)
            .collect();
        assert!(!replicas.is_empty(), "{port} has no replica to promote");
        self.kill9(port);
        let killed_at = Instant::now();
        let mut promoted = 0;
        wait_for(
            &format!("a replica of {port} ({replicas:?}) is promoted"),
            SETTLE,
            || {
                let port = *replicas
                    .iter()
                    .find(|r| {
                        cli_at(**r, &["role"]).lines().next() == Some("master")
                            && parse_nodes(&cli_at(**r, &["cluster", "nodes"]))
                                .iter()
                                .any(|n| n.flags.contains("myself") && !n.slots.is_empty())
                    })
                    .ok_or_else(|| "no replica is master yet".to_string())?;
                promoted = port;
                Ok(())
            },
        );
        self.wait_settled(&format!("the cluster settles after {port}'s failover"));
        Failover {
            killed_at,
            promoted,
        }
    }

    /// `kill -9` of the node on `port`, and nothing more.
    pub fn kill9(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on {port}"));
        node.kill9();
        self.dead.insert(port);
    }

    /// Starts `redis-cli --cluster reshard` moving `slots` slots from the
    /// master on `from` to the one on `to`, in the background; `finish`
    /// it with `"Moving slot"`.
    #[track_caller]
    pub fn reshard(&self, from: u16, to: u16, slots: u16) -> Cli {
        let id = |port: u16| cli_at(port, &["cluster", "myid"]).trim().to_string();
        let (from_id, to_id) = (id(from), id(to));
        assert!(!from_id.is_empty() && !to_id.is_empty(), "node ids");
        let args = [
            "--cluster".to_string(),
            "reshard".into(),
            format!("127.0.0.1:{from}"),
            "--cluster-from".into(),
            from_id,
            "--cluster-to".into(),
            to_id,
            "--cluster-slots".into(),
            slots.to_string(),
            "--cluster-yes".into(),
        ];
        Cli::spawn(
            &args,
            format!("resharding {slots} slots from {from} to {to}"),
        )
    }

    /// The keys matching `pattern` on each master (`--scan`), by port.
    #[track_caller]
    pub fn keys_by_master(&self, pattern: &str) -> BTreeMap<u16, Vec<String>> {
        self.masters()
            .iter()
            .map(|m| {
                let keys = cli_at(m.port, &["--scan", "--pattern", pattern]);
                (m.port, keys.lines().map(str::to_string).collect())
            })
            .collect()
    }

    /// `n` relays on this cluster with `env` besides and a key prefix of
    /// their own (returned), each ready (`/readyz` 200) before this
    /// returns.
    #[track_caller]
    pub fn relays(&self, n: usize, env: &[(&str, &str)]) -> (Vec<Server>, String) {
        let prefix = format!("{}:", unique_session());
        let url = self.url();
        let mut env = env.to_vec();
        env.push(("RELAY_REDIS_URL", url.as_str()));
        env.push(("RELAY_REDIS_PREFIX", prefix.as_str()));
        let servers: Vec<Server> = (0..n).map(|_| Server::start_with(&env)).collect();
        for s in &servers {
            wait_ready(s, &url);
        }
        (servers, prefix)
    }
}

/// Waits (bounded, 20 s) until `srv` answers `/readyz` with 200.
#[track_caller]
pub fn wait_ready(srv: &Server, url: &str) {
    wait_for(
        &format!("a relay on {url} is ready (/readyz 200)"),
        Duration::from_secs(20),
        || {
            let r = srv.get("/readyz");
            if r.status == 200 {
                return Ok(());
            }
            let errors: Vec<String> = srv
                .logs()
                .into_iter()
                .filter(|l| l.contains("\"level\":\"error\"") || l.contains("\"level\":\"warn\""))
                .rev()
                .take(3)
                .collect();
            Err(format!("{} {}; logged: {errors:?}", r.status, r.text()))
        },
    );
}

/// One cluster node on a free port, its bus on another, its
/// configuration file in its own directory; another pair of ports is
/// tried if one was taken meanwhile.
#[track_caller]
fn start_node(timeout_ms: &str) -> Redis {
    for _ in 0..3 {
        let bus = free_port().to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus,
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            timeout_ms,
            "--save",
            "",
            "--appendonly",
            "no",
        ];
        let mut node = Redis::unstarted(free_port(), &args);
        if node.try_run() {
            return node;
        }
    }
    panic!("no cluster node started on three pairs of free ports");
}

/// A `redis-cli --cluster` command running in the background, its
/// output in a file; killed if dropped unfinished.
pub struct Cli {
    child: Option<Child>,
    log: std::path::PathBuf,
    what: String,
}

impl Cli {
    /// Starts `redis-cli` with `args`, for `what` (named if it fails).
    #[track_caller]
    pub fn spawn(args: &[String], what: String) -> Cli {
        let log = std::env::temp_dir().join(format!("relay-cluster-cli-{}.log", unique_session()));
        let file = std::fs::File::create(&log).expect("redis-cli log");
        let child = Command::new("redis-cli")
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("redis-cli (scripts/install-test-deps.sh installs redis-tools)");
        Cli {
            child: Some(child),
            log,
            what,
        }
    }

    /// Waits (bounded, 60 s) for the command to end, and asserts it
    /// succeeded and its output holds `expect`; its output.
    #[track_caller]
    pub fn finish(mut self, expect: &str) -> String {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break Some(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: String = log.lines().rev().take(10).collect::<Vec<_>>().join("\n");
        assert!(
            status.is_some_and(|s| s.success()) && !log.contains("[ERR]") && log.contains(expect),
            "{} failed ({status:?}, within 60 s); last lines, newest first:\n{tail}",
            self.what
        );
        log
    }
}

impl Drop for Cli {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}
