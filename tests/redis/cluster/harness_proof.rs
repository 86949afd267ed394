//! The cluster harness proven with `redis-cli` alone, and the traffic
//! and count of the cluster tests proven through relays on one plain
//! Redis: these pass without the cluster feature.

use super::harness::{self, Cluster, NODE_TIMEOUT_MS, key_slot};
use super::setup::{check_all, fill, keys_where_they_belong, lowest_slots, session_of};
use super::traffic::{Agent, PHASE, Traffic};
use crate::common::*;
use crate::writers::skip_unless_plain;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Instant;

#[test]
fn a_cluster_forms_and_a_killed_master_s_replica_takes_its_slots() {
    if skip_unless_plain() {
        return;
    }
    let mut cluster = Cluster::start(3, 2, NODE_TIMEOUT_MS);
    let masters = cluster.masters();
    let ranges: Vec<_> = masters.iter().map(|m| m.slots.clone()).collect();
    assert_eq!(
        ranges,
        [[(0, 5460)], [(5461, 10922)], [(10923, 16383)]],
        "the ranges --cluster create gives"
    );
    // The slot computed here is the one Redis computes.
    let port = masters[0].port;
    for key in [
        "relay:{b07}s:t-1-2",
        "plain",
        "a{}b{c}",
        "x{y}{z}",
        "{}",
        "é{ü}",
    ] {
        let theirs = cluster.cli(port, &["cluster", "keyslot", key]);
        assert_eq!(theirs.trim(), key_slot(key).to_string(), "{key}");
    }
    let keys: Vec<String> = (0..300).map(|i| format!("k{{{i}}}")).collect();
    fill(&cluster, &keys);
    let victim = masters[0].clone();
    let held = cluster.cli(victim.port, &["dbsize"]).trim().parse::<u64>();
    let held = held.expect("DBSIZE");
    assert!(held > 50, "{held} keys on {}", victim.port);
    let acked = cluster.cli(victim.port, &["wait", "2", "2000"]);
    assert_eq!(acked.trim(), "2", "both replicas hold the keys");

    let failover = cluster.kill_master(victim.port);
    let now = cluster.masters();
    let promoted = now.iter().find(|m| m.port == failover.promoted).cloned();
    let promoted = promoted.expect("the promoted replica serves slots");
    assert_eq!(promoted.slots, victim.slots, "the killed master's slots");
    let replica_of: Vec<_> = cluster
        .nodes()
        .into_iter()
        .filter(|n| n.master_of.as_deref() == Some(promoted.id.as_str()) && !n.failed())
        .collect();
    assert_eq!(replica_of.len(), 1, "the other replica follows it");
    let dbsize = cluster.cli(promoted.port, &["dbsize"]);
    assert_eq!(dbsize.trim(), held.to_string(), "nothing replicated lost");
    let all = keys_where_they_belong(&cluster, "k*");
    assert_eq!(all.values().map(Vec::len).sum::<usize>(), keys.len());
}

#[test]
fn resharding_moves_slots_and_their_keys_between_masters() {
    if skip_unless_plain() {
        return;
    }
    let cluster = Cluster::start(3, 1, NODE_TIMEOUT_MS);
    let keys: Vec<String> = (0..300).map(|i| format!("k{{{i}}}")).collect();
    fill(&cluster, &keys);
    let before = cluster.masters();
    let (a, b) = (&before[0], &before[1]);
    let started = Instant::now();
    let reshard = cluster.reshard(a.port, b.port, 2000);
    // Writes go on while it runs (redis-cli -c follows MOVED and ASK).
    let more: Vec<String> = (0..300).map(|i| format!("k{{m{i}}}")).collect();
    fill(&cluster, &more);
    reshard.finish("Moving slot");
    cluster.wait_settled("the cluster settles after the resharding");
    eprintln!("2000 slots moved in {:?}", started.elapsed());
    let after = cluster.masters();
    let count = |port: u16| {
        let m = after.iter().find(|m| m.port == port).expect("a master");
        m.slot_count()
    };
    assert_eq!(count(a.port), a.slot_count() - 2000);
    assert_eq!(count(b.port), b.slot_count() + 2000);
    // The source's lowest slots went, as the resharding test expects.
    let serving = |slot: u16| after.iter().find(|m| m.owns(slot)).map(|m| m.port);
    for slot in lowest_slots(a, 2000) {
        assert_eq!(serving(slot), Some(b.port), "slot {slot}");
    }
    let moved: Vec<&String> = keys
        .iter()
        .filter(|k| a.owns(key_slot(k)) && serving(key_slot(k)) == Some(b.port))
        .collect();
    assert!(!moved.is_empty(), "some keys were in the slots moved");
    let all = keys_where_they_belong(&cluster, "k*");
    let stored = all.values().map(Vec::len).sum::<usize>();
    assert_eq!(stored, keys.len() + more.len());
    for k in moved {
        assert!(all[&b.port].contains(k), "{k} moved to {}", b.port);
    }
}

/// The traffic, the all-sessions agent and the count the cluster tests
/// use, through three relays on one plain Redis with no fault: every
/// acknowledged write stored and shown alike by every relay, every
/// subscriber given every answer in order, every prompt listed once.
#[test]
fn the_traffic_and_its_count_hold_through_relays_on_one_redis() {
    if skip_unless_plain() {
        return;
    }
    let redis = Redis::start();
    let servers = redis.relays(3, &[]);
    for s in &servers {
        s.wait_for_log("connected to Redis");
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let sessions: Vec<String> = (0..12).map(|_| unique_session()).collect();
    let mut subscribers: BTreeMap<String, (String, Vec<Ws>)> = sessions
        .iter()
        .map(|sid| (sid.clone(), subscribed_on_each(&servers, sid)))
        .collect();
    let traffic = Traffic::start(&addrs, &sessions, 4, true);
    traffic.wait_rounds(100, PHASE);
    traffic.wait_each_acked_since(&sessions, Instant::now(), PHASE);
    let tally = traffic.stop();
    assert!(tally.answers.len() >= 100, "{}", tally.answers.len());
    let renewed = check_all(
        &servers,
        &mut subscribers,
        &tally,
        &|_| Err("".into()),
        &|_| false,
    );
    assert!(renewed.is_empty());

    let agent = Agent::start(&addrs);
    let traffic = Traffic::start(&addrs, &sessions, 3, false);
    traffic.wait_rounds(100, PHASE);
    let tally = traffic.stop();
    let want: BTreeSet<String> = tally.prompts.iter().map(|a| a.tag.clone()).collect();
    agent.wait_for_all(&want, PHASE);
    let got = agent.stop();
    let listed: BTreeSet<String> = got.iter().map(|(c, _)| c.clone()).collect();
    assert_eq!(listed, want);
    assert_eq!(got.len(), want.len(), "each listed once");
}

#[test]
fn cluster_nodes_and_session_keys_are_read_as_redis_writes_them() {
    let text = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-292f]
292f 127.0.0.1:30002@40002 master,fail - 1426238316232 1426238313000 2 disconnected
";
    let nodes = harness::parse_nodes(text);
    assert_eq!(nodes.len(), 3);
    assert_eq!(
        (nodes[0].port, nodes[0].master_of.as_deref()),
        (30004, Some("e7d1"))
    );
    assert!(nodes[1].is_master() && nodes[1].owns(7000) && !nodes[1].owns(5461));
    assert_eq!(nodes[1].slot_count(), 5462);
    assert!(!nodes[2].is_master() && nodes[2].failed());
    assert_eq!(session_of("t-1:{b07}s:t-9-1", "t-1:"), Some("t-9-1"));
    assert_eq!(session_of("t-1:{b07}p:t-9-1", "t-1:"), None);
    assert_eq!(session_of("t-1:{}s:t-9-1", "t-1:"), None);
    assert_eq!(session_of("t-1:s:t-9-1", "t-1:"), None);
}
