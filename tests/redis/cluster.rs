//! A Redis Cluster of each test's own (`redis-server --cluster-enabled
//! yes`, three masters, `redis-cli --cluster create`) behind relays given
//! `RELAY_REDIS_URL=redis-cluster://…`: sessions spread evenly over the
//! masters, every key under a session's hash tag; a master killed with
//! `kill -9` under steady traffic through three relays, and its replica
//! promoted: with `RELAY_REDIS_REPLICAS=1` nothing acknowledged is lost,
//! with `0` only what was acknowledged in the last moments before the
//! kill, on the killed master; slots moved by `redis-cli --cluster
//! reshard` under traffic lose and refuse nothing; one agent for every session
//! receives every prompt once across masters and a failover; and a
//! `redis-cluster://` naming a plain Redis works as a one-node cluster.
//! Counted as for Sentinel (`sentinel.rs`): no prompt answered twice,
//! nothing refused (`503`) stored, every subscriber on every relay sees
//! every answer in order without reconnecting.
//!
//! The tests of `harness_proof` prove the cluster harness itself with
//! `redis-cli` alone. These tests start their own Redis processes
//! whatever the mode, so they run once per CI run: in the plain pass.

mod harness;
mod harness_proof;
mod setup;
mod traffic;

use crate::common::*;
use crate::writers::skip_unless_plain;
use harness::{Cluster, NODE_TIMEOUT_MS};
use serde_json::json;
use setup::{
    Setup, homes, homes_now, keys_where_they_belong, lowest_slots, prompt_each, session_of,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use traffic::{Ack, Agent, PHASE, Tally, Traffic};

/// With `RELAY_REDIS_REPLICAS=0`, how long before the kill an
/// acknowledged write may have been and still be lost: a master's
/// replica is normally a few milliseconds behind.
const LOSS_WINDOW: Duration = Duration::from_secs(1);

#[test]
fn sessions_spread_evenly_over_the_masters_every_key_under_a_hash_tag() {
    if skip_unless_plain() {
        return;
    }
    let cluster = Cluster::start(3, 1, NODE_TIMEOUT_MS);
    let (servers, prefix) = cluster.relays(3, &[]);
    let sessions: Vec<String> = (0..1500).map(|_| unique_session()).collect();
    prompt_each(&servers, &sessions);
    let keys = keys_where_they_belong(&cluster, &format!("{prefix}*"));
    let untagged: Vec<&String> = keys
        .values()
        .flatten()
        .filter(|k| {
            let rest = k.strip_prefix(prefix.as_str()).unwrap_or(k);
            !(rest.starts_with('{') && rest.find('}').is_some_and(|end| end > 1))
        })
        .collect();
    assert!(
        untagged.is_empty(),
        "keys outside <prefix>{{<tag>}}…: {untagged:?}"
    );
    let homes = homes(&cluster, &prefix, &sessions);
    let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
    let mut tags: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    for (port, key) in homes.values() {
        *per_master.entry(*port).or_default() += 1;
        let tag = key.split_once('{').and_then(|(_, r)| r.split_once('}'));
        tags.entry(*port)
            .or_default()
            .insert(tag.expect("a tag").0.to_string());
    }
    eprintln!("sessions per master: {per_master:?}");
    assert_eq!(
        per_master.len(),
        3,
        "sessions on every master: {per_master:?}"
    );
    for (port, n) in &per_master {
        let share = *n as f64 / sessions.len() as f64;
        assert!(
            (0.25..=0.42).contains(&share),
            "master {port} holds {n} of {} sessions ({:.0}%): {per_master:?}",
            sessions.len(),
            share * 100.0
        );
    }
    let mut buckets: Vec<usize> = tags.values().map(BTreeSet::len).collect();
    buckets.sort();
    assert_eq!(
        buckets,
        [21, 21, 22],
        "buckets (hash tags) per master: {tags:?}"
    );
}

/// The summary a fault test prints.
fn report(what: &str, tally: &Tally, lost: usize) {
    eprintln!(
        "{what}: {} prompts, {} answers acknowledged, {} refused, {} uncertain, {lost} lost, {} answers found their prompt gone",
        tally.prompts.len(),
        tally.answers.len(),
        tally.refused.len(),
        tally.uncertain,
        tally.orphans.len()
    );
}

/// Steady traffic over 24 sessions through three relays; the master
/// holding most of them killed; the count (see the module's comment).
fn failover_under_traffic(replicas: &str) {
    let lossless = replicas != "0";
    // With a replica confirming each write, the promoted master needs a
    // replica of its own to take writes: two per master.
    let env = [
        ("RELAY_REDIS_REPLICAS", replicas),
        ("RELAY_STORE_TIMEOUT", "2"),
    ];
    let mut setup = Setup::start(if lossless { 2 } else { 1 }, &env, 24, &|_| true, 0);
    let victim = setup.busiest_master();
    let on_victim: BTreeSet<String> = setup
        .homes
        .iter()
        .filter(|(_, h)| h.0 == victim)
        .map(|(s, _)| s.clone())
        .collect();
    let traffic = Traffic::start(&setup.addrs(), &setup.sessions, 6, true);
    traffic.wait_rounds(150, PHASE);
    let failover = setup.cluster.kill_master(victim);
    let promoted = Instant::now();
    traffic.wait_each_acked_since(&setup.sessions, promoted, PHASE);
    traffic.wait_rounds(100, PHASE);
    let tally = traffic.stop();
    let killed = failover.killed_at;
    let lost = std::cell::Cell::new(0);
    let may_lose = |ack: &Ack| -> Result<(), String> {
        if lossless {
            return Err(format!("RELAY_REDIS_REPLICAS={replicas}"));
        }
        if !on_victim.contains(&ack.sid) {
            return Err(format!("its master was not killed (killed {victim})"));
        }
        if ack.sent > killed {
            return Err("sent after the kill".into());
        }
        if ack.acked + LOSS_WINDOW < killed {
            let early = killed - ack.acked;
            return Err(format!("acknowledged {early:?} before the kill"));
        }
        lost.set(lost.get() + 1);
        Ok(())
    };
    // A session of the killed master may take a new epoch where a relay's
    // copy held what the promoted replica lacks: with a replica
    // confirming, only a write answered 504 (never acknowledged) can be
    // that, as in the Sentinel tests.
    let renew_allowed = |sid: &str| on_victim.contains(sid) && (!lossless || tally.uncertain > 0);
    let renewed = setup.check(&tally, &may_lose, &renew_allowed);
    report(
        &format!("RELAY_REDIS_REPLICAS={replicas}, {} renewed", renewed.len()),
        &tally,
        lost.get() / setup.servers.len(),
    );
    let sid_of: BTreeMap<&str, &str> = tally
        .prompts
        .iter()
        .map(|a| (a.tag.as_str(), a.sid.as_str()))
        .collect();
    for cid in &tally.orphans {
        assert!(!lossless, "prompt {cid} lost");
        let sid = sid_of.get(cid.as_str()).copied().unwrap_or("?");
        assert!(
            on_victim.contains(sid),
            "prompt {cid} of {sid} lost, not on {victim}"
        );
    }
    setup.every_session_writable();
}

#[test]
fn a_master_killed_under_traffic_loses_nothing_acknowledged_with_one_replica_confirming() {
    if skip_unless_plain() {
        return;
    }
    failover_under_traffic("1");
}

#[test]
fn a_master_killed_under_traffic_loses_at_most_the_last_moment_s_writes_without_replicas() {
    if skip_unless_plain() {
        return;
    }
    failover_under_traffic("0");
}

#[test]
fn resharding_under_traffic_loses_nothing_and_moves_the_sessions_keys() {
    if skip_unless_plain() {
        return;
    }
    // 2000 slots move from the first master to the second, then 2000
    // from the second to the third: the same ones, as each move takes
    // the lowest slots of its source. Six of the 24 sessions live there.
    // `--cluster create` gives the first master slots 0 to 5460.
    const MOVED: usize = 2000;
    let first: BTreeSet<u16> = (0..MOVED as u16).collect();
    let mut setup = Setup::start(1, &[], 24, &|slot| first.contains(&slot), 6);
    let masters = setup.cluster.masters();
    assert_eq!(
        lowest_slots(&masters[0], MOVED),
        first,
        "the same slot ranges"
    );
    let traffic = Traffic::start(&setup.addrs(), &setup.sessions, 6, true);
    traffic.wait_rounds(60, PHASE);
    let moving: Vec<String> = setup.sessions[..6].to_vec();
    for (from, to) in [(&masters[0], &masters[1]), (&masters[1], &masters[2])] {
        let rounds = traffic.rounds();
        setup
            .cluster
            .reshard(from.port, to.port, MOVED as u16)
            .finish("Moving slot");
        setup
            .cluster
            .wait_settled("the cluster settles after the resharding");
        eprintln!(
            "{MOVED} slots {} -> {}: {} rounds meanwhile",
            from.port,
            to.port,
            traffic.rounds() - rounds
        );
        traffic.wait_rounds(30, PHASE);
        let now = homes_now(&setup);
        for sid in &moving {
            assert_eq!(now[sid].0, to.port, "{sid} ({}) moved", now[sid].1);
        }
    }
    let tally = traffic.stop();
    report("resharding", &tally, 0);
    // A slot migrating costs no write: each is retried until it settles.
    assert_eq!(
        (tally.refused.len(), tally.uncertain),
        (0, 0),
        "writes refused (503) and answered 504 while slots moved"
    );
    let renewed = setup.check(&tally, &|_| Err("no master failed".into()), &|_| false);
    assert!(renewed.is_empty());
    setup.every_session_writable();
}

#[test]
fn one_agent_for_every_session_gets_each_prompt_once_across_masters_and_a_failover() {
    if skip_unless_plain() {
        return;
    }
    let env = [("RELAY_REDIS_REPLICAS", "1"), ("RELAY_STORE_TIMEOUT", "2")];
    let mut setup = Setup::start(2, &env, 24, &|_| true, 0);
    let agent = Agent::start(&setup.addrs());
    let traffic = Traffic::start(&setup.addrs(), &setup.sessions, 3, false);
    traffic.wait_rounds(150, PHASE);
    let victim = setup.busiest_master();
    setup.cluster.kill_master(victim);
    let promoted = Instant::now();
    traffic.wait_each_acked_since(&setup.sessions, promoted, PHASE);
    traffic.wait_rounds(100, PHASE);
    let tally = traffic.stop();
    let want: BTreeSet<String> = tally.prompts.iter().map(|a| a.tag.clone()).collect();
    agent.wait_for_all(&want, PHASE);
    let got = agent.stop();
    report("all-sessions agent", &tally, 0);
    let mut times: BTreeMap<&str, usize> = BTreeMap::new();
    for (cid, _) in &got {
        *times.entry(cid).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "prompts listed more than once: {twice:?}");
    let refused: Vec<_> = got
        .iter()
        .filter(|(c, _)| tally.refused.contains(c))
        .collect();
    assert!(refused.is_empty(), "refused prompts listed: {refused:?}");
    let sid_of: BTreeMap<&str, &str> = tally
        .prompts
        .iter()
        .map(|a| (a.tag.as_str(), a.sid.as_str()))
        .collect();
    for (cid, sid) in &got {
        assert_eq!(sid_of.get(cid.as_str()), Some(&sid.as_str()), "{cid}");
    }
}

#[test]
fn a_cluster_url_naming_a_plain_redis_works_as_a_one_node_cluster() {
    if skip_unless_plain() {
        return;
    }
    let redis = Redis::start();
    let url = format!("redis-cluster://127.0.0.1:{}", redis.port);
    let prefix = format!("{}:", unique_session());
    let env = [
        ("RELAY_REDIS_URL", url.as_str()),
        ("RELAY_REDIS_PREFIX", prefix.as_str()),
    ];
    let servers: Vec<Server> = (0..2).map(|_| Server::start_with(&env)).collect();
    for s in &servers {
        harness::wait_ready(s, &url);
    }
    let (a, b) = (&servers[0], &servers[1]);
    let sid = unique_session();
    let (_, mut subscribers) = subscribed_on_each(&servers, &sid);
    a.prompt(&sid, "q", Some("p1"));
    assert_eq!(client_msg_ids(&b.pending(&sid)), ["p1"]);
    b.respond(&sid, "p1", "the answer");
    for ws in &mut subscribers {
        let frame = ws.recv_json_skip_pings();
        assert_eq!(
            (&frame["type"], &frame["data"]["text"]),
            (&json!("message"), &json!("the answer")),
            "{frame}"
        );
    }
    let history = a.messages(&sid, "");
    let types: Vec<_> = history["messages"]
        .as_array()
        .map(|m| m.iter().map(|m| m["type"].clone()).collect())
        .unwrap_or_default();
    assert_eq!(types, [json!("prompt"), json!("assistant")], "{history}");
    let keys = redis.cli(&["--scan", "--pattern", &format!("{prefix}*")]);
    assert!(
        keys.lines()
            .any(|k| session_of(k, &prefix) == Some(sid.as_str())),
        "the session's hash {prefix}{{<tag>}}s:{sid} among {keys}"
    );
    for s in &servers {
        assert_eq!(s.get("/readyz").status, 200);
    }
}
