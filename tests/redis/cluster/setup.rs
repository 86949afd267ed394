//! What the cluster tests under traffic share: a cluster with three
//! relays on it and sessions chosen on every master, each with a
//! subscriber on every relay (`Setup`); where each session's hash lives;
//! and the check of every session's history and subscribers against what
//! the writers saw.

use super::harness::{Cluster, NODE_TIMEOUT_MS, NodeLine, key_slot};
use super::traffic::{Ack, Tally, check_history};
use crate::common::*;
use crate::writers::read_answers;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

/// Writes `keys` through `redis-cli -c` (redirections followed), one
/// `SET` each.
#[track_caller]
pub fn fill(cluster: &Cluster, keys: &[String]) {
    use std::io::Write;
    let port = cluster.live_ports()[0].to_string();
    let mut child = std::process::Command::new("redis-cli")
        .args(["-c", "-p", &port])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-cli");
    let mut stdin = child.stdin.take().expect("stdin");
    for k in keys {
        writeln!(stdin, "SET {k} 1").expect("write to redis-cli");
    }
    drop(stdin);
    assert!(child.wait().expect("redis-cli").success());
}

/// Every key on every master is on the master serving its slot; the
/// keys by master.
#[track_caller]
pub fn keys_where_they_belong(cluster: &Cluster, pattern: &str) -> BTreeMap<u16, Vec<String>> {
    let masters = cluster.masters();
    let keys = cluster.keys_by_master(pattern);
    for (port, ks) in &keys {
        let m = masters.iter().find(|m| m.port == *port).expect("a master");
        for k in ks {
            assert!(m.owns(key_slot(k)), "{k} (slot {}) on {port}", key_slot(k));
        }
    }
    keys
}

/// The session a key names, if it is `<prefix>{<tag>}s:<sid>`.
pub fn session_of<'a>(key: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (tag, rest) = rest.split_once('}')?;
    (!tag.is_empty()).then_some(())?;
    rest.strip_prefix("s:")
}

/// Where each of `sessions` lives: the master holding its hash, and the
/// hash's key. Every session must have one.
#[track_caller]
pub fn homes(
    cluster: &Cluster,
    prefix: &str,
    sessions: &[String],
) -> BTreeMap<String, (u16, String)> {
    let wanted: BTreeSet<&str> = sessions.iter().map(String::as_str).collect();
    let mut homes = BTreeMap::new();
    for (port, keys) in cluster.keys_by_master(&format!("{prefix}*")) {
        for key in keys {
            if let Some(sid) = session_of(&key, prefix).filter(|s| wanted.contains(s)) {
                let before = homes.insert(sid.to_string(), (port, key.clone()));
                assert!(before.is_none(), "{sid} has two hashes: {before:?}, {key}");
            }
        }
    }
    let missing: Vec<_> = wanted.iter().filter(|s| !homes.contains_key(**s)).collect();
    assert!(
        missing.is_empty(),
        "no hash {prefix}{{<tag>}}s:<sid> on any master for {} sessions, e.g. {:?}",
        missing.len(),
        missing.iter().take(3).collect::<Vec<_>>()
    );
    homes
}

/// `request(relay, sid)` for each of `sessions`, through `servers` in
/// turn, from 4 threads.
pub fn each(servers: &[Server], sessions: &[String], request: &(dyn Fn(&Server, &str) + Sync)) {
    std::thread::scope(|s| {
        for part in sessions.chunks(sessions.len().div_ceil(4)) {
            s.spawn(move || {
                for (i, sid) in part.iter().enumerate() {
                    request(&servers[i % servers.len()], sid);
                }
            });
        }
    });
}

/// `POST /prompt` to each of `sessions`, each answered `200`.
#[track_caller]
pub fn prompt_each(servers: &[Server], sessions: &[String]) {
    each(servers, sessions, &|srv, sid| {
        let body = json!({"session_id": sid, "prompt": "q", "client_msg_id": "p"});
        let got = srv.post_json("/prompt", &body);
        assert_eq!(got.status, 200, "POST /prompt to {sid}: {}", got.text());
    });
}

/// `PUT /sessions/{sid}` for each of `sessions`, each answered `200`.
#[track_caller]
pub fn create_each(servers: &[Server], sessions: &[String]) {
    each(servers, sessions, &|srv, sid| {
        let got = srv.put(&format!("/sessions/{sid}"));
        assert_eq!(got.status, 200, "PUT /sessions/{sid}: {}", got.text());
    });
}

/// What a test of traffic through a cluster needs: the cluster, three
/// relays on it, sessions each with a subscriber on every relay, and
/// where each session lives.
pub struct Setup {
    pub cluster: Cluster,
    pub servers: Vec<Server>,
    pub prefix: String,
    pub sessions: Vec<String>,
    /// Each session's epoch and its subscribers, one per relay.
    pub subscribers: BTreeMap<String, (String, Vec<Ws>)>,
    pub homes: BTreeMap<String, (u16, String)>,
}

impl Setup {
    /// `count` sessions spread over the masters in turn, at least
    /// `wanted` of them (if any) in a slot `want` accepts: chosen among
    /// eight times as many created, once their hashes show where each
    /// lives.
    #[track_caller]
    pub fn start(
        replicas_each: usize,
        env: &[(&str, &str)],
        count: usize,
        want: &dyn Fn(u16) -> bool,
        wanted: usize,
    ) -> Setup {
        let cluster = Cluster::start(3, replicas_each, NODE_TIMEOUT_MS);
        let (servers, prefix) = cluster.relays(3, env);
        let candidates: Vec<String> = (0..count * 8).map(|_| unique_session()).collect();
        create_each(&servers, &candidates);
        let all = homes(&cluster, &prefix, &candidates);
        let mut sessions: Vec<String> = all
            .iter()
            .filter(|(_, (_, key))| want(key_slot(key)))
            .map(|(sid, _)| sid.clone())
            .take(wanted)
            .collect();
        assert_eq!(sessions.len(), wanted, "sessions in the slots wanted");
        let mut by_master: BTreeMap<u16, Vec<&String>> = BTreeMap::new();
        for (sid, (port, _)) in &all {
            if !sessions.contains(sid) {
                by_master.entry(*port).or_default().push(sid);
            }
        }
        assert_eq!(by_master.len(), 3, "sessions on every master: {all:?}");
        let mut lists: Vec<_> = by_master.into_values().map(Vec::into_iter).collect();
        while sessions.len() < count {
            let before = sessions.len();
            for list in &mut lists {
                if let Some(sid) = list.next().filter(|_| sessions.len() < count) {
                    sessions.push(sid.clone());
                }
            }
            assert!(
                sessions.len() > before,
                "only {before} sessions to choose from"
            );
        }
        let subscribers = sessions
            .iter()
            .map(|sid| (sid.clone(), subscribed_on_each(&servers, sid)))
            .collect();
        let homes = sessions
            .iter()
            .map(|sid| (sid.clone(), all[sid].clone()))
            .collect();
        Setup {
            cluster,
            servers,
            prefix,
            sessions,
            subscribers,
            homes,
        }
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(|s| s.addr()).collect()
    }

    /// The master holding the most sessions.
    pub fn busiest_master(&self) -> u16 {
        let mut count: BTreeMap<u16, usize> = BTreeMap::new();
        for (port, _) in self.homes.values() {
            *count.entry(*port).or_default() += 1;
        }
        count
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .expect("a master")
            .0
    }

    /// `check_all` of this setup's sessions.
    #[track_caller]
    pub fn check(
        &mut self,
        tally: &Tally,
        may_lose: &dyn Fn(&Ack) -> Result<(), String>,
        renew_allowed: &dyn Fn(&str) -> bool,
    ) -> BTreeSet<String> {
        let (servers, subscribers) = (&self.servers, &mut self.subscribers);
        check_all(servers, subscribers, tally, may_lose, renew_allowed)
    }

    /// A prompt to every session through every relay, each answered
    /// `200`: the cluster serves every session again.
    #[track_caller]
    pub fn every_session_writable(&self) {
        for (i, srv) in self.servers.iter().enumerate() {
            for sid in &self.sessions {
                srv.prompt(sid, "after", Some(&format!("after-{i}")));
            }
        }
    }
}

/// Checks every session's history on every relay against `tally`
/// (see `check_history`; a write may be lost only if `may_lose` says so),
/// then every subscriber of `subscribers` (by session: its epoch and one
/// per relay): every stored answer, in order, without reconnecting; a
/// `resync` only where the session took a new epoch, which
/// `renew_allowed` must allow. The sessions given a new epoch.
#[track_caller]
pub fn check_all(
    servers: &[Server],
    subscribers: &mut BTreeMap<String, (String, Vec<Ws>)>,
    tally: &Tally,
    may_lose: &dyn Fn(&Ack) -> Result<(), String>,
    renew_allowed: &dyn Fn(&str) -> bool,
) -> BTreeSet<String> {
    let mut renewed = BTreeSet::new();
    for (sid, (epoch, subscribers)) in subscribers.iter_mut() {
        let epoch = json!(epoch);
        let mut first: Option<BTreeSet<String>> = None;
        let mut answers = BTreeSet::new();
        for srv in servers {
            let shown = check_history(srv, sid, tally, may_lose);
            if shown.epoch != epoch {
                assert!(renew_allowed(sid), "{sid}: a new epoch {}", shown.epoch);
                renewed.insert(sid.clone());
            }
            match &first {
                None => first = Some(shown.tags),
                Some(tags) => assert_eq!(tags, &shown.tags, "{sid}: relays disagree"),
            }
            answers = shown.answers;
        }
        for ws in subscribers.iter_mut() {
            let rolled_back = renewed.contains(sid);
            read_answers(ws, &answers, &tally.refused, rolled_back, Some(&epoch));
        }
    }
    renewed
}

/// The lowest `n` slots `master` serves: those `redis-cli --cluster
/// reshard` takes first from it.
pub fn lowest_slots(master: &NodeLine, n: usize) -> BTreeSet<u16> {
    let mut slots: Vec<u16> = master.slots.iter().flat_map(|&(a, b)| a..=b).collect();
    slots.sort();
    slots.into_iter().take(n).collect()
}

/// Where each of `sessions` lives now: on the master serving its slot.
#[track_caller]
pub fn homes_now(setup: &Setup) -> BTreeMap<String, (u16, String)> {
    let now = homes(&setup.cluster, &setup.prefix, &setup.sessions);
    let masters = setup.cluster.masters();
    for (sid, (port, key)) in &now {
        let slot = key_slot(key);
        let serving = masters.iter().find(|m| m.owns(slot)).expect("served");
        assert_eq!(*port, serving.port, "{sid}: {key} (slot {slot})");
    }
    now
}
