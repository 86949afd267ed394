//! No single point of failure: real Redis processes of each test's own (a
//! master, its replicas, three sentinels) under steady traffic through
//! three relays, the master killed with `kill -9` and a replica promoted;
//! and `RELAY_REDIS_REPLICAS`, a write acknowledged only once a replica
//! holds it. Counted: with `RELAY_REDIS_REPLICAS=1`, nothing acknowledged
//! is lost; with `0`, only writes acknowledged before the kill may be;
//! nothing refused (`503`) is ever stored; no prompt is answered twice;
//! every subscriber, on every relay, sees every answer in order without
//! reconnecting. A failover that loses what clients saw gives the session
//! a new epoch, so a client back with its old cursor resyncs; and the
//! relay follows sentinels over TLS (`rediss-sentinel://`) and a master
//! they name by a host name.
//!
//! These tests start their own Redis processes whatever the mode, so they
//! run once per CI run: in the plain pass (`scripts/test`).

use crate::common::*;
use crate::writers::{post, read_answers, skip_unless_plain, wait_until};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One `redis-server --sentinel`, its configuration in a directory of
/// its own; killed and removed on drop.
struct Sentinel {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Sentinel {
    #[track_caller]
    fn start(master: u16) -> Sentinel {
        Sentinel::start_with("127.0.0.1", master, 2, "")
    }

    /// A sentinel of the master at `host`:`master` with this quorum and
    /// `extra` lines of configuration.
    #[track_caller]
    fn start_with(host: &str, master: u16, quorum: u32, extra: &str) -> Sentinel {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("relay-sentinel-{}", unique_session()));
        std::fs::create_dir_all(&dir).expect("sentinel dir");
        let conf = dir.join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\n{extra}\
             sentinel monitor m {host} {master} {quorum}\n\
             sentinel down-after-milliseconds m 1000\n\
             sentinel failover-timeout m 4000\n\
             sentinel parallel-syncs m 2\n",
            dir.display()
        );
        std::fs::write(&conf, text).expect("sentinel conf");
        let child = Command::new("/usr/bin/redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a sentinel");
        let s = Sentinel { child, port, dir };
        wait_until("the sentinel answers", || s.cli(&["ping"]).contains("PONG"));
        s
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The port of the master this sentinel names.
    fn master_port(&self) -> String {
        let out = self.cli(&["sentinel", "get-master-addr-by-name", "m"]);
        out.lines().nth(1).unwrap_or("").to_string()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits (bounded) until `master` has `n` replicas online.
#[track_caller]
fn replicas_online(master: &Redis, n: usize) {
    wait_until("the replicas are online", || {
        master
            .cli(&["info", "replication"])
            .matches("state=online")
            .count()
            >= n
    });
}

/// Waits (bounded) until `replica` holds everything `master` held when
/// called.
#[track_caller]
fn replicated(master: &Redis, replica: &Redis) {
    let offset = |r: &Redis, field: &str| -> u64 {
        let info = r.cli(&["info", "replication"]);
        let line = info.lines().find(|l| l.starts_with(field)).unwrap_or("");
        line.split(':')
            .nth(1)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let want = offset(master, "master_repl_offset:");
    assert!(want > 0, "the master has written");
    wait_until("the replica caught up", || {
        offset(replica, "slave_repl_offset:") >= want
    });
}

/// A master with two replicas (one to promote, one that keeps the new
/// master replicated) and three sentinels watching it.
struct Set {
    redis: Vec<Redis>,
    sentinels: Vec<Sentinel>,
}

impl Set {
    #[track_caller]
    fn start() -> Set {
        Set::with_replicas(2)
    }

    /// A master with `n` replicas and three sentinels.
    #[track_caller]
    fn with_replicas(n: usize) -> Set {
        let master = Redis::start();
        let replicas: Vec<Redis> = (0..n).map(|_| Redis::replica_of(&master)).collect();
        let mut redis = vec![master];
        redis.extend(replicas);
        replicas_online(&redis[0], n);
        let slaves = n.to_string();
        let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(redis[0].port)).collect();
        // Each sentinel found the others and the replicas (through the
        // master's hello channel and INFO): a failover can be agreed on.
        wait_until("the sentinels know each other", || {
            sentinels.iter().all(|s| {
                let info = s.cli(&["sentinel", "master", "m"]);
                let field = |name: &str| {
                    let mut lines = info.lines();
                    lines.find(|l| *l == name);
                    lines.next().unwrap_or("").to_string()
                };
                field("num-other-sentinels") == "2" && field("num-slaves") == slaves
            })
        });
        Set { redis, sentinels }
    }

    fn url(&self, password: &str) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis-sentinel://{password}{}/m", hosts.join(","))
    }

    /// `n` relays following the sentinels, with a key prefix of their own.
    fn relays(&self, n: usize, env: &[(&str, &str)]) -> Vec<Server> {
        let prefix = format!("{}:", unique_session());
        let url = self.url("");
        let mut env = env.to_vec();
        env.push(("RELAY_REDIS_URL", url.as_str()));
        env.push(("RELAY_REDIS_PREFIX", prefix.as_str()));
        (0..n).map(|_| Server::start_with(&env)).collect()
    }
}

/// What the writers saw.
#[derive(Default, Debug)]
struct Seen {
    /// Acknowledged prompts and answers: tag -> acknowledged before the
    /// master was killed.
    prompts: BTreeMap<String, bool>,
    answers: BTreeMap<String, bool>,
    /// Answered `503`: never to be stored.
    refused: BTreeSet<String>,
    /// Answered `504`, then sent again with the same id until answered.
    uncertain: u64,
    /// Prompts whose answer found them gone (lost with the master).
    orphans: BTreeSet<String>,
}

/// A writer: posts a prompt through one relay and its answer through the
/// next, round after round, until `stop`. A `503` is sent again under a
/// new tag (it was not stored), a `504` again under the same one (the
/// answer says whether it was).
fn writer(
    addrs: Vec<SocketAddr>,
    sid: String,
    name: String,
    stop: Arc<AtomicBool>,
    killed: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut seen = Seen::default();
        let mut turn = 0;
        // Posts until `200` (true) or `404` (false).
        let mut send = |path: &str, field: &str, make: &dyn Fn(&str) -> Value, stem: &str| {
            let mut attempt = 0;
            let mut tag = format!("{stem}.0");
            // Once a `504` said it may be stored, it is sent again under
            // the same tag until answered: a `503` then speaks for that
            // attempt only.
            let mut uncertain = false;
            loop {
                turn += 1;
                let before = !killed.load(Ordering::SeqCst);
                let body = make(&tag);
                let addr = addrs[turn % addrs.len()];
                let (status, resp) = post(addr, path, &body).expect("an answer");
                match status {
                    200 => {
                        assert_eq!(resp[field], tag, "{path}: {resp}");
                        return Some((tag, before));
                    }
                    503 if uncertain => {}
                    503 => {
                        assert_eq!(resp["error"], "Storage unavailable", "{resp}");
                        seen.refused.insert(tag.clone());
                        attempt += 1;
                        tag = format!("{stem}.{attempt}");
                    }
                    504 => {
                        seen.uncertain += 1;
                        uncertain = true;
                    }
                    404 => return None,
                    other => panic!("{path} {body}: {other} {resp}"),
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let stem = format!("{name}-p{n}");
            let prompt =
                |tag: &str| json!({"session_id": sid, "prompt": "q", "client_msg_id": tag});
            let Some((cid, before)) = send("/prompt", "client_msg_id", &prompt, &stem) else {
                panic!("a prompt answered 404");
            };
            let answer = |tag: &str| {
                json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": tag,
                       "text": "a"})
            };
            let stem = format!("{name}-a{n}");
            match send("/response", "assistant_msg_id", &answer, &stem) {
                Some((aid, before)) => {
                    seen.answers.insert(aid, before);
                }
                None => {
                    seen.orphans.insert(cid.clone());
                }
            }
            seen.prompts.insert(cid, before);
            done.fetch_add(1, Ordering::Relaxed);
        }
        seen
    })
}

/// Steady traffic through three relays following the sentinels; the
/// master killed; the count (see the module's comment).
fn failover(replicas: &str) {
    let mut set = Set::start();
    let env = [
        ("RELAY_REDIS_REPLICAS", replicas),
        ("RELAY_STORE_TIMEOUT", "2"),
    ];
    let servers = set.relays(3, &env);
    for s in &servers {
        s.wait_for_log("connected to Redis");
    }
    let sid = unique_session();
    let (epoch, mut subscribers) = subscribed_on_each(&servers, &sid);
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let (stop, killed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let done = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let (stop, killed, done) = (stop.clone(), killed.clone(), done.clone());
            writer(
                addrs.clone(),
                sid.clone(),
                format!("w{i}"),
                stop,
                killed,
                done,
            )
        })
        .collect();
    let progress = |more: u64| {
        let want = done.load(Ordering::Relaxed) + more;
        wait_until("the writers make progress", || {
            done.load(Ordering::Relaxed) >= want
        });
    };
    progress(50);

    let old = set.redis[0].port.to_string();
    killed.store(true, Ordering::SeqCst);
    set.redis[0].kill9();
    let deadline = Instant::now() + Duration::from_secs(20);
    while set.sentinels[0].master_port() == old {
        assert!(Instant::now() < deadline, "no replica was promoted");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The relays go on: rounds complete after the promotion.
    progress(50);
    stop.store(true, Ordering::Relaxed);
    let mut all = Seen::default();
    for w in writers {
        let s = w.join().expect("writer");
        all.prompts.extend(s.prompts);
        all.answers.extend(s.answers);
        all.refused.extend(s.refused);
        all.uncertain += s.uncertain;
        all.orphans.extend(s.orphans);
    }
    let rolled_back = servers.iter().any(|s| {
        s.logs()
            .iter()
            .any(|l| l.contains("new epoch by a failover"))
    });
    eprintln!(
        "RELAY_REDIS_REPLICAS={replicas}: {} prompts, {} answers, {} refused, {} uncertain, {} lost, rolled back: {rolled_back}",
        all.prompts.len(),
        all.answers.len(),
        all.refused.len(),
        all.uncertain,
        all.orphans.len()
    );
    let lossless = replicas != "0";
    for srv in &servers {
        let history = srv.messages(&sid, "?limit=10000");
        if !rolled_back {
            assert_eq!(history["epoch"], epoch, "no new epoch: {history}");
        }
        let msgs = history["messages"].as_array().cloned().unwrap_or_default();
        let (mut prompts, mut answered, mut answers) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        let mut last = 0;
        for m in &msgs {
            let d = &m["data"];
            let seq = d["seq"].as_u64().unwrap_or(0);
            assert!(seq > last, "seq {seq} after {last}");
            last = seq;
            let cid = d["client_msg_id"].as_str().unwrap_or("").to_string();
            if m["type"] == "prompt" {
                prompts.insert(cid);
            } else if m["type"] == "assistant" {
                assert!(answered.insert(cid.clone()), "{cid} answered twice");
                answers.insert(d["assistant_msg_id"].as_str().unwrap_or("").to_string());
            }
        }
        for (kind, acked, stored) in [
            ("prompt", &all.prompts, &prompts),
            ("answer", &all.answers, &answers),
        ] {
            for (tag, before) in acked {
                if !stored.contains(tag) {
                    assert!(!lossless, "acknowledged {kind} {tag} lost");
                    assert!(before, "{kind} {tag} acknowledged after the kill lost");
                }
            }
        }
        let shown: Vec<_> = all
            .refused
            .iter()
            .filter(|t| prompts.contains(*t) || answers.contains(*t))
            .collect();
        assert!(shown.is_empty(), "refused writes stored: {shown:?}");
        if lossless {
            assert!(all.orphans.is_empty(), "prompts lost: {:?}", all.orphans);
        }
    }
    let want: BTreeSet<String> = all
        .answers
        .iter()
        .filter(|(_, before)| lossless || !**before)
        .map(|(t, _)| t.clone())
        .collect();
    if rolled_back {
        assert!(
            all.uncertain > 0 || !lossless,
            "rolled back, but nothing was 504"
        );
    }
    for ws in &mut subscribers {
        read_answers(ws, &want, &all.refused, rolled_back, None);
    }
}

#[test]
fn a_failover_under_traffic_loses_nothing_acknowledged_with_one_replica_confirming() {
    if skip_unless_plain() {
        return;
    }
    failover("1");
}

#[test]
fn a_failover_under_traffic_loses_at_most_what_was_acknowledged_before_it_without_replicas() {
    if skip_unless_plain() {
        return;
    }
    failover("0");
}

/// `POST /prompt` through `srv`: the status and body.
fn prompt(srv: &Server, sid: &str, cid: &str) -> (u16, Value) {
    let body = json!({"session_id": sid, "prompt": "q", "client_msg_id": cid});
    let r = srv.post_json("/prompt", &body);
    (r.status, r.json())
}

#[test]
fn writes_wait_for_a_replica_and_are_504_past_the_storage_timeout_while_it_is_stopped() {
    if skip_unless_plain() {
        return;
    }
    let master = Redis::start();
    let replica = Redis::replica_of(&master);
    replicas_online(&master, 1);
    let env = [("RELAY_REDIS_REPLICAS", "1"), ("RELAY_STORE_TIMEOUT", "1")];
    let [srv]: [Server; 1] = master.relays(1, &env).try_into().ok().unwrap();
    srv.wait_for_log("connected to Redis");
    let sid = unique_session();
    srv.put(&format!("/sessions/{sid}"));
    let waits = master.commands("wait");
    assert_eq!(prompt(&srv, &sid, "p1").0, 200);
    assert!(master.commands("wait") > waits, "a WAIT followed the write");

    replica.signal("STOP");
    let started = Instant::now();
    let (status, body) = prompt(&srv, &sid, "p2");
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"], "Storage timeout", "{body}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    replica.signal("CONT");
    // Taken again once the replica runs: the resend of p2 tells it was
    // stored (the master ran it), and a new prompt is acknowledged.
    wait_until("writes are acknowledged again", || {
        prompt(&srv, &sid, "p3").0 == 200
    });
    let (status, body) = prompt(&srv, &sid, "p2");
    assert_eq!((status, &body["duplicate"]), (200, &json!(true)), "{body}");
    let history = srv.messages(&sid, "");
    let ids: Vec<_> = history["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| m["data"]["client_msg_id"].clone())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(ids, [json!("p1"), json!("p2"), json!("p3")], "{history}");

    // Without RELAY_REDIS_REPLICAS, no WAIT is sent.
    let [plain]: [Server; 1] = master.relays(1, &[]).try_into().ok().unwrap();
    plain.wait_for_log("connected to Redis");
    let waits = master.commands("wait");
    let sid = unique_session();
    plain.put(&format!("/sessions/{sid}"));
    assert_eq!(prompt(&plain, &sid, "p1").0, 200);
    assert_eq!(master.commands("wait"), waits);
}

/// A sentinel of the test's own making: it names `port` to every
/// connection (a real one never names a replica, but may name a master
/// demoted since).
fn fake_sentinel(port: Arc<AtomicU64>) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let port = port.load(Ordering::SeqCst).to_string();
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                let _ = conn.read(&mut buf);
                let reply = format!(
                    "*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n\
                     *3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n",
                    port.len()
                );
                let _ = conn.write_all(reply.as_bytes());
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    at
}

#[test]
fn a_replica_a_sentinel_names_is_never_written_to() {
    if skip_unless_plain() {
        return;
    }
    let master = Redis::start();
    let replica = Redis::replica_of(&master);
    replicas_online(&master, 1);
    let named = Arc::new(AtomicU64::new(u64::from(replica.port)));
    let sentinel = fake_sentinel(named.clone());
    let url = format!("redis-sentinel://127.0.0.1:{sentinel}/m");
    let srv = Server::start_with(&[("RELAY_REDIS_URL", &url)]);
    srv.wait_for_log("not a master");
    let sid = unique_session();
    let r = srv.put(&format!("/sessions/{sid}"));
    assert_error(&r, 503, "Storage unavailable");
    assert_eq!(srv.get("/readyz").status, 503);
    assert_eq!(master.cli(&["dbsize"]).trim(), "0", "nothing was written");
    // Named the master, the relay is asked again (its link to the
    // replica is dropped) and takes writes.
    named.store(u64::from(master.port), Ordering::SeqCst);
    srv.wait_for_log("connected to Redis");
    wait_until("ready", || srv.get("/readyz").status == 200);
    assert_eq!(srv.put(&format!("/sessions/{sid}")).status, 200);
}

#[test]
fn a_copy_holding_what_the_promoted_replica_lacks_takes_a_new_epoch_with_a_resync() {
    if skip_unless_plain() {
        return;
    }
    let mut master = Redis::start();
    let replica = Redis::replica_of(&master);
    replicas_online(&master, 1);
    let named = Arc::new(AtomicU64::new(u64::from(master.port)));
    let sentinel = fake_sentinel(named.clone());
    let url = format!("redis-sentinel://127.0.0.1:{sentinel}/m");
    let srv = Server::start_with(&[("RELAY_REDIS_URL", &url)]);
    srv.wait_for_log("connected to Redis");
    let sid = unique_session();
    let (epoch, mut subscribers) = subscribed_on_each(std::slice::from_ref(&srv), &sid);
    let ws = &mut subscribers[0];
    srv.prompt(&sid, "q", Some("p1"));
    srv.respond(&sid, "p1", "kept");
    assert_eq!(ws.recv_json_skip_pings()["data"]["seq"], 2);
    replicated(&master, &replica);
    // Acknowledged without a replica confirming (RELAY_REDIS_REPLICAS=0)
    // once the replica is cut off: only the master and the copy hold it.
    assert!(replica.cli(&["replicaof", "no", "one"]).contains("OK"));
    srv.prompt(&sid, "q", Some("p2"));
    srv.respond(&sid, "p2", "lost");
    assert_eq!(ws.recv_json_skip_pings()["data"]["seq"], 4);
    named.store(u64::from(replica.port), Ordering::SeqCst);
    master.kill9();
    srv.wait_for_log("session given a new epoch by a failover");
    let resync = ws.recv_json_skip_pings();
    assert_eq!(resync["type"], "resync", "{resync}");
    assert_ne!(resync["epoch"], json!(epoch), "a new epoch: {resync}");
    let now = resync["epoch"].clone();
    let kept = ws.recv_json_skip_pings();
    assert_eq!(kept["data"]["text"], "kept", "{kept}");
    // The seq the lost answer had goes to the next one, which the
    // subscriber receives.
    wait_until("ready", || srv.get("/readyz").status == 200);
    srv.prompt(&sid, "q", Some("p3"));
    srv.respond(&sid, "p3", "after");
    let after = ws.recv_json_skip_pings();
    assert_eq!(
        (&after["data"]["text"], &after["data"]["seq"]),
        (&json!("after"), &json!(4)),
        "{after}"
    );
    let history = srv.messages(&sid, "");
    let ids: Vec<_> = history["messages"]
        .as_array()
        .map(|m| m.iter().map(|m| m["data"]["seq"].clone()).collect())
        .unwrap_or_default();
    assert_eq!(ids, [json!(1), json!(2), json!(3), json!(4)], "{history}");
    assert_eq!(history["messages"][3]["data"]["text"], "after", "{history}");
    assert_eq!(history["epoch"], now, "{history}");
}

/// The first frame of `ws` other than a ping that is a message, skipping
/// any `resync`s before it; the `resync`s' epochs.
#[track_caller]
fn after_resyncs(ws: &mut Ws) -> (Vec<String>, Value) {
    let mut epochs = Vec::new();
    loop {
        let frame = ws.recv_json_skip_pings();
        if frame["type"] != "resync" {
            return (epochs, frame);
        }
        epochs.push(frame["epoch"].as_str().unwrap_or("").to_string());
    }
}

/// A real failover that loses acknowledged writes (`RELAY_REDIS_REPLICAS=0`,
/// the one replica stopped and cut off while they were written): a client
/// that saw them, away during the failover and back with its old cursor,
/// gets a `resync` to a new epoch, never a `seq` it saw given to another
/// message under the epoch it knows; a subscriber that stayed gets the
/// same `resync`, not a close.
#[test]
fn a_client_back_after_a_failover_that_lost_what_it_saw_gets_a_resync() {
    if skip_unless_plain() {
        return;
    }
    let mut set = Set::with_replicas(1);
    let servers = set.relays(2, &[]);
    for s in &servers {
        s.wait_for_log("connected to Redis");
    }
    let (a, b) = (&servers[0], &servers[1]);
    let sid = unique_session();
    let (epoch, mut subscribers) = subscribed_on_each(&servers[..1], &sid);
    let stayed = &mut subscribers[0];
    let mut away = b.ws(&format!("/ws/{sid}?after=0&epoch={epoch}"));
    a.prompt(&sid, "q", Some("p1"));
    b.respond(&sid, "p1", "kept");
    assert_eq!(away.recv_json_skip_pings()["data"]["seq"], 2);
    assert_eq!(stayed.recv_json_skip_pings()["data"]["seq"], 2);
    replicated(&set.redis[0], &set.redis[1]);
    // The replica stopped and its link dropped: what the master
    // acknowledges now reaches no replica.
    set.redis[1].signal("STOP");
    let killed = set.redis[0].cli(&["client", "kill", "type", "replica"]);
    assert_eq!(killed.trim(), "1", "the replica's link dropped");
    b.prompt(&sid, "q", Some("p2"));
    a.respond(&sid, "p2", "lost");
    let lost = away.recv_json_skip_pings();
    assert_eq!(
        (&lost["data"]["seq"], &lost["data"]["text"]),
        (&json!(4), &json!("lost")),
        "{lost}"
    );
    drop(away);
    assert_eq!(stayed.recv_json_skip_pings()["data"]["seq"], 4);
    let old = set.redis[0].port.to_string();
    set.redis[0].kill9();
    set.redis[1].signal("CONT");
    let promoted = set.redis[1].port.to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    while set.sentinels[0].master_port() != promoted {
        assert!(Instant::now() < deadline, "the replica was not promoted");
        assert_ne!(
            set.sentinels[0].master_port(),
            "",
            "the sentinel forgot the master"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_ne!(old, promoted);
    for s in &servers {
        wait_until("ready", || s.get("/readyz").status == 200);
    }
    a.wait_for_log("session given a new epoch by a failover");
    let now = a.messages(&sid, "")["epoch"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert_ne!(now, epoch, "a new epoch");
    // The seqs the lost prompt and answer had go to the next ones.
    a.prompt(&sid, "q", Some("p3"));
    b.respond(&sid, "p3", "after");
    for srv in &servers {
        wait_until("the epoch is the new one on every relay", || {
            srv.messages(&sid, "")["epoch"] == json!(now)
        });
        let history = srv.messages(&sid, "");
        let seqs: Vec<_> = history["messages"]
            .as_array()
            .map(|m| m.iter().map(|m| m["data"]["seq"].clone()).collect())
            .unwrap_or_default();
        assert_eq!(seqs, [json!(1), json!(2), json!(3), json!(4)], "{history}");
        assert_eq!(history["messages"][3]["data"]["text"], "after", "{history}");
        // The client back with the cursor it had, through either relay.
        let mut back = srv.ws(&format!("/ws/{sid}?after=4&epoch={epoch}"));
        let resync = back.recv_json_skip_pings();
        assert_eq!(
            (&resync["type"], &resync["epoch"], &resync["first_seq"]),
            (&json!("resync"), &json!(now), &json!(1)),
            "{resync}"
        );
        let kept = back.recv_json_skip_pings();
        assert_eq!(
            (&kept["data"]["seq"], &kept["data"]["text"]),
            (&json!(2), &json!("kept")),
            "{kept}"
        );
        let after = back.recv_json_skip_pings();
        assert_eq!(
            (&after["data"]["seq"], &after["data"]["text"]),
            (&json!(4), &json!("after")),
            "{after}"
        );
    }
    // The subscriber that stayed: a resync to the new epoch, then the log.
    let (epochs, kept) = after_resyncs(stayed);
    assert_eq!(epochs.last(), Some(&now), "resyncs: {epochs:?}");
    assert_eq!(kept["data"]["text"], "kept", "{kept}");
    let (epochs, after) = after_resyncs(stayed);
    assert!(epochs.iter().all(|e| *e == now), "resyncs: {epochs:?}");
    assert_eq!(
        (&after["data"]["seq"], &after["data"]["text"]),
        (&json!(4), &json!("after")),
        "{after}"
    );
}

/// The lines that make a `redis-server` (or a sentinel) also speak TLS
/// on `port`, with the test CA's certificate for 127.0.0.1, and
/// replicate over TLS.
fn tls_conf(port: u16) -> String {
    let f = tls_files();
    format!(
        "tls-port {port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
         tls-auth-clients no\ntls-replication yes\n",
        f.cert.display(),
        f.key.display(),
        f.ca.display()
    )
}

/// `tls_conf` as command-line arguments.
fn tls_args(port: u16) -> Vec<String> {
    let mut args = vec![
        "--save".to_string(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
    ];
    for line in tls_conf(port).lines() {
        let (k, v) = line.split_once(' ').unwrap_or((line, ""));
        args.extend([format!("--{k}"), v.to_string()]);
    }
    args
}

/// `rediss-sentinel://`: the relay asks a sentinel over TLS where the
/// master is, speaks TLS to the master it names (the certificate checked
/// against that address), and follows a failover to the replica, over
/// TLS too. Each Redis also listens in plain text, for the test's own
/// `redis-cli`; the sentinel names only TLS ports.
#[test]
fn sentinel_and_master_over_tls() {
    if skip_unless_plain() {
        return;
    }
    let (master_tls, replica_tls, sentinel_tls) = (free_port(), free_port(), free_port());
    let args = tls_args(master_tls);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let master = Redis::start_with(&args);
    let mut args = tls_args(replica_tls);
    args.extend([
        "--replicaof".into(),
        "127.0.0.1".into(),
        master_tls.to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replica = Redis::start_with(&args);
    replicas_online(&master, 1);
    let sentinel = Sentinel::start_with("127.0.0.1", master_tls, 1, &tls_conf(sentinel_tls));
    let ca = tls_files().ca.display().to_string();
    let url = format!("rediss-sentinel://127.0.0.1:{sentinel_tls}/m");
    let srv = Server::start_with(&[("RELAY_REDIS_URL", &url), ("RELAY_REDIS_CA", &ca)]);
    srv.wait_for_log("connected to Redis");
    assert!(
        srv.logs()
            .iter()
            .any(|l| l.contains("Redis master") && l.contains(&format!(":{master_tls}"))),
        "the master's TLS port"
    );
    let sid = unique_session();
    srv.prompt(&sid, "over TLS", Some("p1"));
    assert_eq!(
        master.cli(&["hget", &format!("relay:s:{sid}"), "n"]).trim(),
        "2"
    );
    replicated(&master, &replica);
    wait_until("the sentinel knows the replica", || {
        sentinel
            .cli(&["sentinel", "replicas", "m"])
            .contains(&replica_tls.to_string())
    });
    // Until the sentinel has heard enough of the replica to promote it.
    wait_until("a failover starts", || {
        sentinel.cli(&["sentinel", "failover", "m"]).contains("OK")
    });
    srv.wait_for_log(&format!("127.0.0.1:{replica_tls}"));
    wait_until("ready", || srv.get("/readyz").status == 200);
    srv.prompt(&sid, "after the failover", Some("p2"));
    assert_eq!(
        replica
            .cli(&["hget", &format!("relay:s:{sid}"), "n"])
            .trim(),
        "3"
    );
    assert_eq!(srv.pending(&sid).len(), 2);
}

/// `kill -<name>` of a relay.
fn signal(srv: &Server, name: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{name}"), &srv.pid().to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{name}");
}

/// As above, but the lost seqs are taken again, by a relay that held no
/// copy of the session, before the relay that held them hears of the
/// failover (stopped meanwhile): the same count of messages, others than
/// its copy's. It gives the session a new epoch all the same.
#[test]
fn a_lost_seq_taken_by_another_relay_before_the_renewal_still_gives_a_new_epoch() {
    if skip_unless_plain() {
        return;
    }
    let mut set = Set::with_replicas(1);
    let servers = set.relays(2, &[]);
    for s in &servers {
        s.wait_for_log("connected to Redis");
    }
    let (a, b) = (&servers[0], &servers[1]);
    let sid = unique_session();
    let epoch = a.put(&format!("/sessions/{sid}")).json()["epoch"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let mut away = a.ws(&format!("/ws/{sid}?after=0&epoch={epoch}"));
    a.prompt(&sid, "q", Some("p1"));
    a.respond(&sid, "p1", "kept");
    assert_eq!(away.recv_json_skip_pings()["data"]["seq"], 2);
    replicated(&set.redis[0], &set.redis[1]);
    set.redis[1].signal("STOP");
    let killed = set.redis[0].cli(&["client", "kill", "type", "replica"]);
    assert_eq!(killed.trim(), "1", "the replica's link dropped");
    a.prompt(&sid, "q", Some("p2"));
    a.respond(&sid, "p2", "lost");
    assert_eq!(away.recv_json_skip_pings()["data"]["text"], "lost");
    drop(away);
    signal(a, "STOP");
    set.redis[0].kill9();
    set.redis[1].signal("CONT");
    let promoted = set.redis[1].port.to_string();
    wait_until("the replica is promoted", || {
        set.sentinels[0].master_port() == promoted
    });
    wait_until("B follows it", || b.get("/readyz").status == 200);
    // Through B, which holds no copy: seqs 3 and 4 again, under the epoch
    // A's clients know.
    b.prompt(&sid, "q", Some("p3"));
    b.respond(&sid, "p3", "after");
    assert_eq!(b.messages(&sid, "")["epoch"], json!(epoch));
    signal(a, "CONT");
    a.wait_for_log("session given a new epoch by a failover");
    let now = a.messages(&sid, "")["epoch"].clone();
    assert_ne!(now, json!(epoch), "a new epoch");
    for srv in &servers {
        wait_until("the new epoch on every relay", || {
            srv.messages(&sid, "")["epoch"] == now
        });
        let mut back = srv.ws(&format!("/ws/{sid}?after=4&epoch={epoch}"));
        let resync = back.recv_json_skip_pings();
        assert_eq!(
            (&resync["type"], &resync["epoch"]),
            (&json!("resync"), &now),
            "{resync}"
        );
        assert_eq!(back.recv_json_skip_pings()["data"]["text"], "kept");
        assert_eq!(back.recv_json_skip_pings()["data"]["text"], "after");
    }
}

/// Sentinels that announce host names (`announce-hostnames yes`) name
/// the master `localhost`: the relay looks the name up off its loop and
/// follows it, and a failover to a replica announced as `localhost` too.
#[test]
fn a_master_named_by_its_host_name_is_followed() {
    if skip_unless_plain() {
        return;
    }
    let master = Redis::start();
    let mut args = vec![
        "--save",
        "",
        "--appendonly",
        "no",
        "--replica-announce-ip",
        "localhost",
    ];
    let port = master.port.to_string();
    args.extend(["--replicaof", "127.0.0.1", &port]);
    let replica = Redis::start_with(&args);
    replicas_online(&master, 1);
    let names = "sentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n";
    let sentinel = Sentinel::start_with("localhost", master.port, 1, names);
    let named = sentinel.cli(&["sentinel", "get-master-addr-by-name", "m"]);
    assert!(named.starts_with("localhost"), "{named}");
    let url = format!("redis-sentinel://127.0.0.1:{}/m", sentinel.port);
    let srv = Server::start_with(&[("RELAY_REDIS_URL", &url)]);
    srv.wait_for_log("connected to Redis");
    let sid = unique_session();
    srv.prompt(&sid, "by name", Some("p1"));
    assert_eq!(
        master.cli(&["hget", &format!("relay:s:{sid}"), "n"]).trim(),
        "2"
    );
    replicated(&master, &replica);
    wait_until("the sentinel knows the replica", || {
        sentinel
            .cli(&["sentinel", "replicas", "m"])
            .contains(&replica.port.to_string())
    });
    // Until the sentinel has heard enough of the replica to promote it.
    wait_until("a failover starts", || {
        sentinel.cli(&["sentinel", "failover", "m"]).contains("OK")
    });
    srv.wait_for_log(&format!(":{}", replica.port));
    wait_until("ready", || srv.get("/readyz").status == 200);
    srv.prompt(&sid, "after the failover", Some("p2"));
    assert_eq!(
        replica
            .cli(&["hget", &format!("relay:s:{sid}"), "n"])
            .trim(),
        "3"
    );
    assert!(!srv.logs().iter().any(|l| l.contains("not followed")));
    // Nothing was lost: the session keeps its epoch.
    assert!(
        !srv.logs()
            .iter()
            .any(|l| l.contains("new epoch by a failover"))
    );
}

#[test]
fn bad_replicas_or_sentinel_settings_exit_2() {
    if skip_unless_plain() {
        return;
    }
    for (key, value, says) in [
        (
            "RELAY_REDIS_REPLICAS",
            "-1",
            "expected a whole number from 0 to 100",
        ),
        ("RELAY_REDIS_REPLICAS", "1", "RELAY_REDIS_URL is not"),
        (
            "RELAY_REDIS_URL",
            "redis-sentinel://127.0.0.1:1",
            "no master name",
        ),
        (
            "RELAY_REDIS_URL",
            "rediss-sentinel://127.0.0.1:1",
            "no master name",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_relay"))
            .env(key, value)
            .env("RELAY_PORT", "0")
            .output()
            .expect("relay");
        assert_eq!(out.status.code(), Some(2), "{key}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(key) && err.contains(says),
            "{key}={value}: {err}"
        );
    }
}

#[test]
fn no_sentinel_answering_is_logged_once_and_not_ready() {
    if skip_unless_plain() {
        return;
    }
    let url = format!("redis-sentinel://:s3cret@127.0.0.1:{}/m", free_port());
    let srv = Server::start_with(&[("RELAY_REDIS_URL", &url)]);
    let line = srv.wait_for_log("Redis unavailable");
    assert!(line.contains("redis-sentinel://127.0.0.1:"), "{line}");
    assert!(!line.contains("s3cret"), "{line}");
    assert_eq!(srv.get("/readyz").status, 503);
    let sid = unique_session();
    assert_error(
        &srv.put(&format!("/sessions/{sid}")),
        503,
        "Storage unavailable",
    );
}
