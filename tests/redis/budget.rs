//! Each instance's copy of the sessions it serves obeys the memory
//! budget: past `RELAY_MAX_MEMORY` a relay forgets the least recently
//! used sessions nothing holds there (Redis keeps them) and reads them
//! back from Redis on their next use, with every acknowledged message,
//! `seq` and epoch as they were, and a subscriber resuming with no
//! `resync`.

use crate::common::*;
use serde_json::Value;
use std::collections::BTreeMap;

const SESSIONS: usize = 40;
const ROUNDS: usize = 8;

/// What a session holds, as (type, client_msg_id) in order, asserting
/// `seq` runs from 1 with no hole.
#[track_caller]
fn contents(srv: &Server, sid: &str) -> Vec<(String, String)> {
    let page = srv.messages(sid, "?limit=1000");
    let msgs = page["messages"].as_array().expect("messages").clone();
    let seqs: Vec<u64> = msgs
        .iter()
        .filter_map(|m| m["data"]["seq"].as_u64())
        .collect();
    assert_eq!(seqs, (1..=msgs.len() as u64).collect::<Vec<_>>(), "{sid}");
    msgs.iter()
        .map(|m: &Value| {
            let cid = m["data"]["client_msg_id"].as_str().unwrap_or("");
            (
                m["type"].as_str().unwrap_or("").to_string(),
                cid.to_string(),
            )
        })
        .collect()
}

#[test]
fn each_copy_keeps_to_the_budget_and_reads_sessions_back_from_redis() {
    let redis = Redis::start();
    let relays = redis.relays(2, &[("RELAY_MAX_MEMORY", "1M")]);
    let big = "r".repeat(4000);
    let sid = |i: usize| format!("rb-{i}");
    let mut acked: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut epochs = BTreeMap::new();
    for round in 0..ROUNDS {
        for i in 0..SESSIONS {
            // Both relays write every session, in turn.
            let srv = &relays[(round + i) % 2];
            let (s, cid) = (sid(i), format!("p{round}"));
            srv.prompt(&s, &format!("{round}{big}"), Some(&cid));
            srv.respond(&s, &cid, &format!("a{round}{big}"));
            let log = acked.entry(s).or_default();
            log.push(("prompt".into(), cid.clone()));
            log.push(("assistant".into(), cid));
        }
        if round == 0 {
            for i in 0..SESSIONS {
                let info = relays[0].get(&format!("/sessions/{}", sid(i))).json();
                epochs.insert(sid(i), info["epoch"].as_str().unwrap_or("").to_string());
            }
        }
    }
    for (n, srv) in relays.iter().enumerate() {
        let resident = srv.metric("relay_sessions_resident");
        assert!(
            resident < SESSIONS as u64 / 2,
            "relay {n}: {resident} of {SESSIONS} sessions in its copy under a 1 MiB budget"
        );
        assert!(srv.metric("relay_session_evictions_total") > 0, "relay {n}");
        assert!(srv.metric("relay_memory_bytes") <= 1024 * 1024 + 64 * 1024);
    }
    // A subscriber that saw seq 2 of session 0 resumes on the other relay
    // with its cursor and epoch: the rest, no resync.
    let s0 = sid(0);
    let mut ws = relays[1].ws(&format!("/ws/{s0}?after=2&epoch={}", epochs[&s0]));
    let f = ws.recv_json();
    assert_eq!(f["type"], "message", "no resync: {f}");
    // Round 1's answer (seq 3 is its prompt, which is not framed).
    assert_eq!(f["data"]["seq"], 4);
    drop(ws);
    // Every session read back, on both relays: all that was acknowledged.
    for srv in &relays {
        let loads = srv.metric("relay_session_loads_total");
        for i in 0..SESSIONS {
            let s = sid(i);
            assert_eq!(contents(srv, &s), acked[&s], "{s}");
            let info = srv.get(&format!("/sessions/{s}")).json();
            assert_eq!(info["epoch"], epochs[&s], "{s}: the same epoch");
        }
        assert!(srv.metric("relay_session_loads_total") > loads);
        assert!(srv.metric("relay_sessions_resident") < SESSIONS as u64 / 2);
    }
    // A resend through either relay is still a duplicate, and seq goes on.
    let s5 = sid(5);
    let again = relays[1].prompt(&s5, &format!("0{big}"), Some("p0"));
    assert_eq!(again["duplicate"], true);
    relays[0].prompt(&s5, "after", Some("later"));
    let last = relays[1].messages(&s5, &format!("?after={}", 2 * ROUNDS));
    assert_eq!(last["messages"][0]["data"]["seq"], 2 * ROUNDS as u64 + 1);
    assert_eq!(last["messages"][0]["data"]["client_msg_id"], "later");
}
