//! One agent for every session across instances: `GET /prompts` with no
//! session parked on one relay is woken by a prompt posted through
//! another, in a session neither follows; the list and its cursors order
//! arrivals across relays alike; a stop (`DELETE /agent`) through one
//! relay shows the agent offline at once to a subscriber of another; a
//! parked all-sessions poll hears a prompt stored while its relay was cut
//! off from Redis, and the first prompt after a flush; a prompt Redis
//! refused is never listed; a read goes on past the entries one read may
//! look at.

use crate::common::*;
use crate::restart::{wait_agent, wait_ready};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The `client_msg_id`s and cursors of an all-sessions list on `srv`.
#[track_caller]
fn list(srv: &Server, query: &str) -> Vec<(String, String)> {
    let resp = srv.get(&format!("/prompts?wait=false{query}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    pairs(&resp.json())
}

fn pairs(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|p| {
            let cursor = p["cursor"].as_str().expect("a cursor");
            (
                p["client_msg_id"].as_str().unwrap().to_string(),
                cursor.to_string(),
            )
        })
        .collect()
}

fn ids(items: &[(String, String)]) -> Vec<&str> {
    items.iter().map(|(id, _)| id.as_str()).collect()
}

/// An all-sessions poll parked on `srv` (counted parked there).
#[track_caller]
fn park(srv: &Server, query: &str) -> Http {
    let mut poll = srv.conn();
    poll.send("GET", &format!("/prompts?timeout=30{query}"), &[], None);
    srv.wait_health("parked_polls", 1);
    poll
}

/// The answer of a parked poll, within 5 s (far below its 30 s).
#[track_caller]
fn answered(poll: &mut Http) -> Vec<(String, String)> {
    poll.tcp()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let got = poll.read_response();
    assert_eq!(got.status, 200, "{}", got.text());
    pairs(&got.json())
}

#[test]
fn a_prompt_through_one_relay_wakes_an_all_sessions_poll_parked_on_another() {
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    for round in 0..10 {
        // A session new to both relays each time: neither follows it.
        let sid = unique_session();
        let cid = format!("p{round}");
        let mut poll = park(&b, "");
        a.prompt(&sid, "wake", Some(&cid));
        let got = answered(&mut poll);
        assert_eq!(ids(&got), [cid.as_str()]);
        b.wait_health("parked_polls", 0);
        // Answered through B: no longer listed, on either relay.
        b.respond(&sid, &cid, "done");
        assert!(list(&a, "").is_empty());
        assert!(list(&b, "").is_empty());
    }
    // Only the relay where an all-sessions poll parked listens to the
    // arrivals: A, which had none, is told of no prompt. In a cluster,
    // one sharded channel per bucket.
    let (list, count, channels) = match cluster_mode() {
        true => ("shardchannels", "shardnumsub", 64),
        false => ("channels", "numsub", 1),
    };
    let listed = redis.cli(&["pubsub", list, "*arrivals"]);
    assert_eq!(listed.lines().count(), channels, "{listed}");
    for channel in listed.lines() {
        let numsub = redis.cli(&["pubsub", count, channel.trim()]);
        assert_eq!(numsub.lines().nth(1), Some("1"), "{channel} {numsub}");
    }
}

#[test]
fn arrivals_are_ordered_across_relays_and_after_a_cursor_lists_the_later_ones() {
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sids: Vec<String> = (0..3).map(|_| unique_session()).collect();
    // Arrivals alternate between the relays and the sessions.
    let mut sent = Vec::new();
    for i in 0..12 {
        let srv = if i % 2 == 0 { &a } else { &b };
        let cid = format!("c{i:02}");
        srv.prompt(&sids[i % 3], "p", Some(&cid));
        sent.push(cid);
    }
    let on_a = list(&a, "");
    let on_b = list(&b, "");
    let mut got = ids(&on_a);
    if cluster_mode() {
        // Sessions of different buckets are ordered by their buckets'
        // counters, not by when they arrived: each is listed once.
        got.sort_unstable();
    }
    assert_eq!(got, sent.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        on_a, on_b,
        "both relays list the same, with the same cursors"
    );
    let numbers: Vec<u64> = on_a.iter().map(|(_, c)| c.parse().unwrap()).collect();
    assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
    // A cursor from one relay pages on the other.
    let first = list(&a, "&limit=5");
    assert_eq!(ids(&first), ids(&on_a[..5]));
    let rest = list(&b, &format!("&limit=5&after={}", first[4].1));
    assert_eq!(ids(&rest), ids(&on_a[5..10]));
    let last = list(&a, &format!("&after={}", rest[4].1));
    assert_eq!(ids(&last), ids(&on_a[10..]));
    // A parked poll after the last cursor, on A, takes only what
    // arrives next, through B.
    let mut poll = park(&a, &format!("&after={}", on_a[11].1));
    b.prompt(&sids[0], "next", Some("n1"));
    let got = answered(&mut poll);
    assert_eq!(ids(&got), ["n1"]);
    assert!(got[0].1.parse::<u64>().unwrap() > numbers[11]);
    // A cancelled prompt and a deleted session leave the list everywhere.
    let cancel = serde_json::json!({"session_id": sids[1], "client_msg_id": "c01"});
    assert_eq!(a.post_json("/cancel", &cancel).status, 200);
    assert_eq!(b.delete(&format!("/sessions/{}", sids[2])).status, 200);
    let left = list(&b, "");
    assert!(!ids(&left).contains(&"c01"), "{left:?}");
    assert!(!ids(&left).contains(&"c02"), "{left:?}");
    assert_eq!(list(&a, ""), left);
}

/// The next `presence` frame of `ws`: `online` or `offline`.
#[track_caller]
fn next_presence(ws: &mut Ws) -> String {
    loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] == "presence" {
            return v["data"]["agent"].as_str().unwrap_or("?").to_string();
        }
    }
}

#[test]
fn a_stop_through_one_relay_shows_the_agent_offline_on_another_at_once() {
    let redis = Redis::start();
    let grace = [("RELAY_AGENT_GRACE", "60")];
    let [a, b]: [Server; 2] = redis.relays(2, &grace).try_into().ok().unwrap();
    let (watched, quiet) = (unique_session(), unique_session());
    a.put(&format!("/sessions/{quiet}"));
    let mut ws = b.ws(&format!("/ws/{watched}"));
    assert_eq!(next_presence(&mut ws), "offline");
    // The agent's all-sessions poll, through B, ends: its grace is B's.
    let mut poll = b.conn();
    poll.send("GET", "/prompts?timeout=0.2", &[], None);
    assert_eq!(next_presence(&mut ws), "online");
    assert!(poll.read_response().json().as_array().unwrap().is_empty());
    wait_agent(&a, &quiet, "online");
    // It stops through A: offline on B's subscriber and on both relays,
    // not after the grace.
    let resp = a.delete("/agent");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(next_presence(&mut ws), "offline");
    wait_agent(&a, &quiet, "offline");
    wait_agent(&b, &quiet, "offline");

    // The all-sessions poll through B again, and a stop of one session
    // through A: B had told A of a parked poll, then of nothing while
    // its grace ran; the stop ends that grace in that session on both.
    let mut poll = b.conn();
    poll.send("GET", "/prompts?timeout=0.2", &[], None);
    assert_eq!(next_presence(&mut ws), "online");
    assert!(poll.read_response().json().as_array().unwrap().is_empty());
    wait_agent(&a, &quiet, "online");
    assert_eq!(a.delete(&format!("/agent/{quiet}")).status, 200);
    wait_agent(&a, &quiet, "offline");
    wait_agent(&b, &quiet, "offline");
    // It still counts in the sessions it was not stopped in.
    wait_agent(&a, &watched, "online");
    assert_eq!(b.delete("/agent").status, 200);
    assert_eq!(next_presence(&mut ws), "offline");

    // The same for one session: a poll of it through B, a stop of that
    // session through A.
    let mut poll = b.conn();
    poll.send("GET", &format!("/prompts/{watched}?timeout=0.2"), &[], None);
    assert_eq!(next_presence(&mut ws), "online");
    assert_eq!(poll.read_response().status, 200);
    let resp = a.delete(&format!("/agent/{watched}"));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(next_presence(&mut ws), "offline");
    wait_agent(&a, &watched, "offline");

    // An all-sessions poll still parked on B keeps the agent online
    // through a stop anywhere.
    let _parked = park(&b, "");
    assert_eq!(next_presence(&mut ws), "online");
    assert_eq!(a.delete("/agent").status, 200);
    assert_eq!(a.delete(&format!("/agent/{watched}")).status, 200);
    wait_agent(&a, &quiet, "online");
    wait_agent(&a, &watched, "online");
    wait_agent(&b, &quiet, "online");
}

/// Sends `signal` (`STOP`, `CONT`) to the relay `srv`.
#[track_caller]
fn signal(srv: &Server, signal: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &srv.pid().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{signal}");
}

#[test]
fn a_parked_all_sessions_poll_hears_a_prompt_stored_while_its_relay_was_cut_off() {
    // Redis keeps its data across the restart (the store is not lost):
    // only the relay's reading again once its links are set up finds
    // the prompt.
    let mut redis = Redis::start_durable();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    a.prompt(&unique_session(), "before", Some("p0"));
    let before = list(&b, "");
    let mut poll = park(&b, &format!("&after={}", before[0].1));
    // B is stopped while Redis restarts and A stores a prompt: B hears
    // no arrival of it, and reads again once its links are set up.
    signal(&b, "STOP");
    redis.kill9();
    wait_ready(&a, 503);
    redis.run();
    wait_ready(&a, 200);
    a.prompt(&unique_session(), "after", Some("p1"));
    signal(&b, "CONT");
    let got = answered(&mut poll);
    assert_eq!(ids(&got), ["p1"]);
    assert!(got[0].1.parse::<u64>().unwrap() > before[0].1.parse::<u64>().unwrap());
}

#[test]
fn a_parked_all_sessions_poll_hears_the_first_prompt_after_a_flush() {
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    a.prompt(&unique_session(), "before", Some("p0"));
    let before = list(&a, "");
    let mut poll = park(&b, &format!("&after={}", before[0].1));
    assert!(redis.cli(&["flushall"]).contains("OK"));
    // The flush is noticed (the probe, once a second); the prompt then
    // posted is listed above the cursor given before it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !b.logs().iter().any(|l| l.contains("Redis lost its data")) {
        assert!(Instant::now() < deadline, "the flush was never noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    a.prompt(&unique_session(), "after", Some("p1"));
    let got = answered(&mut poll);
    assert_eq!(ids(&got), ["p1"]);
    assert!(got[0].1.parse::<u64>().unwrap() > before[0].1.parse::<u64>().unwrap());
    assert_eq!(
        ids(&list(&a, "")),
        ["p1"],
        "the old prompt went with the flush"
    );
}

#[test]
fn a_prompt_redis_refused_is_never_listed_and_the_next_one_wakes_the_poll() {
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    a.put(&format!("/sessions/{sid}"));
    let mut poll = park(&b, "");
    redis.config_set("maxmemory-policy", "noeviction");
    redis.config_set("maxmemory", "1");
    let body = serde_json::json!({"session_id": sid, "client_msg_id": "refused", "prompt": "x"});
    let resp = a.post_json("/prompt", &body);
    assert_error(&resp, 503, "Storage unavailable");
    redis.config_set("maxmemory", "0");
    assert!(list(&a, "").is_empty(), "a refused prompt is not listed");
    assert_eq!(b.health()["parked_polls"], 1, "nor does it wake anyone");
    a.prompt(&sid, "kept", Some("kept"));
    assert_eq!(ids(&answered(&mut poll)), ["kept"]);
}

#[test]
fn a_read_goes_on_past_as_many_entries_as_one_read_looks_at() {
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    a.prompt(&sid, "p", Some("real"));
    // 10,050 entries before it that name no pending prompt of its
    // session (left over, as from a store written by hand): more than
    // one read looks at.
    let key = redis.cli(&["--scan", "--pattern", "*pending"]);
    let script =
        "for i = 1, 10050 do redis.call('ZADD', KEYS[1], i, ARGV[1] .. '\\n' .. (i + 100)) end";
    redis.cli(&["eval", script, "1", key.trim(), &sid]);
    assert_eq!(redis.cli(&["zcard", key.trim()]).trim(), "10051");
    assert_eq!(ids(&list(&b, "")), ["real"]);
    // The reads dropped what they met that names nothing.
    assert_eq!(redis.cli(&["zcard", key.trim()]).trim(), "1");
}
