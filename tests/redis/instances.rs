//! Several instances sharing sessions through Redis (`RELAY_REDIS_URL`),
//! against real relay processes and a real `redis-server` (Debian's,
//! installed by `scripts/install-test-deps.sh`) started on a free port in
//! a temporary directory: every flow of the seed across instances, one id
//! posted concurrently to three instances stored once, Redis killed and
//! restarted in the middle of traffic with nothing acknowledged lost and
//! every subscriber caught up without reconnecting, an instance killed
//! whose clients resume on another without a resync.

use crate::common;

use crate::common::*;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Polls `path` on `srv` (bounded, 10 s) until it answers `status`.
#[track_caller]
fn wait_status(srv: &Server, path: &str, status: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = srv.get(path).status;
        if got == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path} never answered {status} (last {got})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn answer(srv: &Server, sid: &str, cid: &str, aid: &str, text: &str) -> Response {
    srv.post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": aid, "text": text}),
    )
}

/// The `seq` of every message of a `/messages` page, in order.
fn seqs(history: &Value) -> Vec<u64> {
    history["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["data"]["seq"].as_u64()).collect())
        .unwrap_or_default()
}

/// Every message of a session, as one instance reads it.
#[track_caller]
fn all_messages(srv: &Server, sid: &str) -> Value {
    srv.messages(sid, "?limit=1000")
}

#[test]
fn every_flow_of_the_seed_works_across_instances() {
    let redis = Redis::start();
    let [a, b, c]: [Server; 3] = redis.relays(3, &[]).try_into().ok().unwrap();
    let sid = unique_session();

    // Flow 1: the web client's socket on A comes first and creates the session.
    let mut ws = a.ws(&format!("/ws/{sid}"));
    // The agent's long-poll parks on B; the prompt is posted to C.
    let mut poll = b.conn();
    poll.send("GET", &format!("/prompts/{sid}?timeout=10"), &[], None);
    b.wait_health("parked_polls", 1);
    let ack = c.prompt(&sid, "hello", Some("p1"));
    assert_eq!(ack, json!({"stored": true, "client_msg_id": "p1"}));
    let got = poll.read_response();
    assert_eq!(got.status, 200, "{}", got.text());
    let prompts = got.json();
    assert_eq!(client_msg_ids(prompts.as_array().unwrap()), ["p1"]);
    assert_eq!(prompts[0]["prompt"], "hello");
    assert_eq!(prompts[0]["seq"], 1);

    // The answer is posted to B and reaches the subscriber on A.
    let ack = answer(&b, &sid, "p1", "a1", "hi there");
    assert_eq!(ack.status, 200, "{}", ack.text());
    assert_eq!(ack.json()["delivered"], true, "a subscriber on A counts");
    let frame = ws.recv_json_skip_pings();
    assert_eq!(frame["type"], "message");
    assert_eq!(frame["data"]["assistant_msg_id"], "a1");
    assert_eq!(frame["data"]["text"], "hi there");
    assert_eq!(frame["data"]["seq"], 2);

    // Every instance sees the same session: pending set, history, epoch.
    for srv in [&a, &b, &c] {
        assert!(srv.pending(&sid).is_empty());
    }
    let history = all_messages(&a, &sid);
    assert_eq!(history["total"], 2);
    assert_eq!(all_messages(&b, &sid), history);
    assert_eq!(all_messages(&c, &sid), history);
    let epoch = history["epoch"].as_str().unwrap().to_string();
    let put = c.put(&format!("/sessions/{sid}")).json();
    assert_eq!(put["epoch"], epoch.as_str());
    assert_eq!(put["created"], false);

    // Flow 2: the agent polls with `after`, without waiting; prompts
    // posted to two instances are both pending, once each, in seq order.
    a.prompt(&sid, "second", Some("p2"));
    b.prompt(&sid, "third", Some("p3"));
    let dup = c.prompt(&sid, "second", Some("p2"));
    assert_eq!(dup["duplicate"], true);
    let resp = c.get(&format!("/prompts/{sid}?wait=false&after=3"));
    assert_eq!(client_msg_ids(resp.json().as_array().unwrap()), ["p3"]);
    assert_eq!(client_msg_ids(&a.pending(&sid)), ["p2", "p3"]);

    // A second subscriber on C replays from its cursor and then goes live
    // with the first one.
    let mut ws_c = c.ws(&format!("/ws/{sid}?after=0&epoch={epoch}"));
    let replay = ws_c.recv_json_skip_pings();
    assert_eq!(replay["data"]["assistant_msg_id"], "a1");
    let ack = answer(&a, &sid, "p2", "a2", "two");
    assert_eq!(ack.status, 200, "{}", ack.text());
    for ws in [&mut ws, &mut ws_c] {
        let frame = ws.recv_json_skip_pings();
        assert_eq!(frame["data"]["assistant_msg_id"], "a2");
        assert_eq!(frame["data"]["seq"], 5);
    }
    // An answer to a prompt no instance knows is refused everywhere.
    let resp = answer(&c, &sid, "nope", "a3", "x");
    assert_error(&resp, 404, "Prompt not found");

    // A delete on B closes the subscribers of A and C, and the session is
    // gone on every instance.
    assert_eq!(b.delete(&format!("/sessions/{sid}")).status, 200);
    assert_eq!(ws.expect_close(), 1000);
    assert_eq!(ws_c.expect_close(), 1000);
    for srv in [&a, &b, &c] {
        assert_error(
            &srv.get(&format!("/messages/{sid}")),
            404,
            "Session not found",
        );
    }
    // Created again, it is a new session with a new epoch.
    let again = a.put(&format!("/sessions/{sid}")).json();
    assert_eq!(again["created"], true);
    assert_ne!(again["epoch"], epoch.as_str());
}

#[test]
fn a_long_poll_parked_on_one_instance_is_woken_by_a_prompt_on_another() {
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    a.put(&format!("/sessions/{sid}"));
    for round in 0..20 {
        let mut poll = a.conn();
        poll.send(
            "GET",
            &format!("/prompts/{sid}?timeout=10&after={}", round * 2),
            &[],
            None,
        );
        a.wait_health("parked_polls", 1);
        let cid = format!("p{round}");
        b.prompt(&sid, "wake", Some(&cid));
        let got = poll.read_response().json();
        assert_eq!(client_msg_ids(got.as_array().unwrap()), [cid.as_str()]);
        assert_eq!(
            answer(&b, &sid, &cid, &format!("a{round}"), "ok").status,
            200
        );
    }
}

/// A counter of `/metrics` (a line without labels).
#[track_caller]
fn counter(srv: &Server, name: &str) -> u64 {
    let text = srv.get("/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[test]
fn each_instance_counts_the_messages_stored_through_it() {
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    // The first write of the session goes to A, which holds no copy of it.
    a.prompt(&sid, "one", Some("p1"));
    let mut ws = a.ws(&format!("/ws/{sid}"));
    a.wait_health("subscribers", 1);
    b.prompt(&sid, "two", Some("p2"));
    b.prompt(&sid, "two", Some("p2")); // a duplicate stores nothing
    assert_eq!(answer(&b, &sid, "p1", "a1", "hi").status, 200);
    // A applied B's answer (its subscriber has it), yet did not store it.
    assert_eq!(ws.recv_json_skip_pings()["data"]["assistant_msg_id"], "a1");
    let stored = |srv: &Server| {
        (
            counter(srv, "relay_prompts_stored_total"),
            counter(srv, "relay_responses_stored_total"),
        )
    };
    assert_eq!(stored(&a), (1, 0));
    assert_eq!(stored(&b), (1, 1));
}

#[test]
fn a_poll_parked_on_a_session_new_to_its_instance_is_woken_however_soon_the_prompt_follows() {
    // An instance hears of another's writes only for the sessions someone
    // waits on there: this poll's session gets listened to as it parks,
    // and a prompt stored just before that must still wake it.
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    for round in 0..40 {
        let sid = unique_session();
        b.put(&format!("/sessions/{sid}"));
        let mut poll = a.conn();
        poll.send("GET", &format!("/prompts/{sid}?timeout=5"), &[], None);
        if round % 2 == 0 {
            a.wait_health("parked_polls", 1);
        }
        b.prompt(&sid, "wake", Some("p"));
        let got = poll.read_response();
        assert_eq!(got.status, 200);
        assert_eq!(
            client_msg_ids(got.json().as_array().unwrap()),
            ["p"],
            "round {round}"
        );
        a.wait_health("parked_polls", 0);
    }
}

#[test]
fn shared_sessions_follow_the_single_servers_rules_step_by_step() {
    // The script in Redis re-states the in-memory log's rules (history,
    // dedupe windows, the pending cap, answers to prompts out of history):
    // the same random writes go to a single in-memory server and to two
    // relays on Redis, and every answer and the final state must match,
    // the order of every pending prompt across sessions (the list of an
    // agent of every session) too.
    let redis = Redis::start();
    let limits = [("RELAY_HISTORY_LIMIT", "5"), ("RELAY_MAX_PENDING", "4")];
    let single = Server::start_single_with(&limits);
    let prefix = format!("{}:", unique_session());
    let url = redis.url();
    let mut env = limits.to_vec();
    env.push(("RELAY_REDIS_URL", &url));
    env.push(("RELAY_REDIS_PREFIX", &prefix));
    let shared = [Server::start_with(&env), Server::start_with(&env)];
    let sids = [unique_session(), unique_session(), unique_session()];
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for step in 0..400 {
        let via = &shared[step % 2];
        let sid = &sids[next(3) as usize];
        let (path, body) = if next(2) == 0 {
            let cid = format!("c{}", next(12));
            let body = json!({"session_id": sid, "client_msg_id": cid, "prompt": "q", "ts": step});
            ("/prompt", body)
        } else {
            let (cid, aid) = (format!("c{}", next(12)), format!("a{}", next(10)));
            let text = format!("t{}", next(2));
            let body = json!({"session_id": sid, "client_msg_id": cid,
                "assistant_msg_id": aid, "text": text, "ts": step});
            ("/response", body)
        };
        let (want, got) = (single.post_json(path, &body), via.post_json(path, &body));
        assert_eq!(
            (got.status, got.text()),
            (want.status, want.text()),
            "step {step}: {path} {body}"
        );
    }
    let strip = |mut v: Value| {
        v.as_object_mut().map(|o| o.remove("epoch"));
        v
    };
    for sid in &sids {
        let want = strip(single.messages(sid, "?limit=1000"));
        for srv in &shared {
            assert_eq!(strip(srv.messages(sid, "?limit=1000")), want);
            assert_eq!(srv.pending(sid), single.pending(sid));
        }
    }
    // Cursors are each engine's own; the order is the rule.
    let order = |srv: &Server| -> Vec<(String, String)> {
        let list = srv.get("/prompts?wait=false&limit=1000").json();
        let items = list.as_array().expect("a list").iter();
        items
            .map(|p| (p["session_id"].to_string(), p["client_msg_id"].to_string()))
            .collect()
    };
    let want = order(&single);
    assert!(!want.is_empty(), "some prompts are pending");
    for srv in &shared {
        assert_eq!(order(srv), want);
    }
}

#[test]
fn a_write_acknowledged_by_one_instance_is_read_at_once_on_another() {
    // A holds a subscriber, so it listens to the session's channel and
    // its reads wait for one PING rather than a script call; B's writes
    // must be in them all the same, however soon the read follows.
    let redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    let mut ws = a.ws(&format!("/ws/{sid}"));
    a.wait_health("subscribers", 1);
    let before = redis.commands("ping");
    for i in 0..100 {
        let cid = format!("p{i}");
        b.prompt(&sid, "q", Some(&cid));
        let pending = a.get(&format!("/prompts/{sid}?wait=false"));
        assert_eq!(
            client_msg_ids(pending.json().as_array().unwrap()),
            [cid.as_str()]
        );
        assert_eq!(answer(&b, &sid, &cid, &format!("a{i}"), "x").status, 200);
        let history = all_messages(&a, &sid);
        let last = history["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned();
        assert_eq!(
            last.unwrap_or_default()["data"]["assistant_msg_id"],
            format!("a{i}")
        );
        assert_eq!(
            ws.recv_json_skip_pings()["data"]["assistant_msg_id"],
            format!("a{i}")
        );
    }
    assert!(
        redis.commands("ping") >= before + 100,
        "A's reads waited for PINGs"
    );
}

/// One `POST` with `Connection: close` on `conn`, from a thread of the
/// test's own: the status and the JSON body.
fn post_on(conn: TcpStream, path: &str, body: &[u8]) -> (u16, Value) {
    try_post_on(conn, path, body).expect("an answer")
}

/// `post_on`, or `None` when the connection fails before a whole answer.
fn try_post_on(conn: TcpStream, path: &str, body: &[u8]) -> Option<(u16, Value)> {
    conn.set_read_timeout(Some(IO_TIMEOUT)).ok()?;
    let mut conn = common::Stream::try_over(conn).ok()?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).ok()?;
    conn.write_all(body).ok()?;
    let mut out = Vec::new();
    conn.read_to_end(&mut out).ok()?;
    if out.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(&out);
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text}"));
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let json = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"));
    Some((status, json))
}

/// Posts `body` to `path` on every instance in turn from `threads` threads
/// released together; returns the bodies of the answers.
fn race(servers: &[Server], threads: usize, path: &str, body: Value) -> Vec<Value> {
    let barrier = Arc::new(Barrier::new(threads));
    let addrs: Vec<_> = servers.iter().map(|s| s.addr()).collect();
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let addr = addrs[i % addrs.len()];
            let body = serde_json::to_vec(&body).unwrap();
            let path = path.to_string();
            std::thread::spawn(move || {
                let conn = TcpStream::connect(addr).expect("connect");
                barrier.wait();
                let (status, body) = post_on(conn, &path, &body);
                assert_eq!(status, 200, "{body}");
                body
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn the_prompts_of_one_turn_are_stored_in_one_call_each_as_alone() {
    // 64 prompts posted at once reach the relay in a few loop turns, and
    // each turn's prompts go to Redis as one script call: 32 ids, each
    // posted twice (sometimes in the same call), over 4 sessions.
    let redis = Redis::start();
    let srv = redis.relays(1, &[]).remove(0);
    let sids: Vec<String> = (0..4).map(|_| unique_session()).collect();
    // Calls go by FCALL once Redis confirmed the library, which it has
    // once the relay is connected.
    srv.wait_for_log("connected to Redis");
    // Script calls as the relay counts them: its health probe (a call
    // per bucket in a cluster, every second) is not one of them.
    let script_calls = || counter(&srv, "relay_storage_commands_total");
    let before = script_calls();
    let barrier = Arc::new(Barrier::new(64));
    let handles: Vec<_> = (0..64)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            let addr = srv.addr();
            let body = json!({"session_id": sids[(i / 2) % 4], "client_msg_id": format!("c{}", i / 2),
                "prompt": "q"});
            std::thread::spawn(move || {
                let conn = TcpStream::connect(addr).expect("connect");
                barrier.wait();
                post_on(conn, "/prompt", &serde_json::to_vec(&body).unwrap())
            })
        })
        .collect();
    let answers: Vec<(u16, Value)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
    let duplicates = answers
        .iter()
        .filter(|(_, b)| b["duplicate"] == true)
        .count();
    assert_eq!(duplicates, 32, "{answers:?}");
    let calls = script_calls() - before;
    assert!(calls < 64, "64 prompts took {calls} script calls");
    // Redis 7 and later: the library loaded, and calls went by FCALL.
    if !redis.cli(&["info", "server"]).contains("redis_version:6.") {
        assert!(redis.commands("fcall") > 0, "the library was not used");
    }
    for sid in &sids {
        let history = all_messages(&srv, sid);
        assert_eq!(history["total"], 8);
        assert_eq!(seqs(&history), (1..=8).collect::<Vec<u64>>());
    }
    // Posted again together, every one is a duplicate.
    let again = race(
        std::slice::from_ref(&srv),
        8,
        "/prompt",
        json!({"session_id": sids[0], "client_msg_id": "c0", "prompt": "q"}),
    );
    assert!(again.iter().all(|b| b["duplicate"] == true), "{again:?}");
}

#[test]
fn one_id_posted_fifty_times_over_three_instances_is_stored_once() {
    let redis = Redis::start();
    let servers = redis.relays(3, &[]);
    let sid = unique_session();

    let acks = race(
        &servers,
        50,
        "/prompt",
        json!({"session_id": sid, "prompt": "once", "client_msg_id": "same"}),
    );
    let stored = acks.iter().filter(|a| a.get("duplicate").is_none()).count();
    let dups = acks.iter().filter(|a| a["duplicate"] == true).count();
    assert_eq!((stored, dups), (1, 49), "{acks:?}");

    let acks = race(
        &servers,
        50,
        "/response",
        json!({"session_id": sid, "client_msg_id": "same",
               "assistant_msg_id": "answer", "text": "once"}),
    );
    let stored = acks.iter().filter(|a| a.get("duplicate").is_none()).count();
    let dups = acks.iter().filter(|a| a["duplicate"] == true).count();
    assert_eq!((stored, dups), (1, 49), "{acks:?}");

    for srv in &servers {
        let history = all_messages(srv, &sid);
        assert_eq!(history["total"], 2, "{history}");
        assert_eq!(seqs(&history), [1, 2]);
    }
}

/// What the writers of a test got acknowledged, and how many `503`s.
#[derive(Default)]
struct Acked {
    prompts: BTreeSet<String>,
    answers: BTreeSet<String>,
    unavailable: u64,
}

/// A writer: prompt then answer, alternating instances, until `stop`;
/// a prompt that got no `200` is never answered.
fn writer(
    addrs: Vec<std::net::SocketAddr>,
    sid: String,
    name: String,
    stop: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
) -> std::thread::JoinHandle<Acked> {
    std::thread::spawn(move || {
        let mut acked = Acked::default();
        let mut turn = 0usize;
        let mut post = |path: &str, body: Value, acked: &mut Acked| -> bool {
            turn += 1;
            // An instance that was killed refuses the connection or drops
            // it: not acknowledged, the next turn goes to another.
            let Ok(conn) = TcpStream::connect(addrs[turn % addrs.len()]) else {
                return false;
            };
            let Some((status, resp)) = try_post_on(conn, path, &serde_json::to_vec(&body).unwrap())
            else {
                return false;
            };
            match status {
                200 => true,
                503 => {
                    assert_eq!(resp["error"], "Storage unavailable");
                    acked.unavailable += 1;
                    false
                }
                // Sent to Redis as the connection broke: not acknowledged,
                // and perhaps stored (a resend with the same id tells).
                504 => {
                    assert_eq!(resp["error"], "Storage timeout");
                    false
                }
                other => panic!("{path}: {other} {resp}"),
            }
        };
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let cid = format!("{name}-p{n}");
            let body = json!({"session_id": sid, "prompt": "work", "client_msg_id": cid});
            if !post("/prompt", body, &mut acked) {
                continue;
            }
            acked.prompts.insert(cid.clone());
            // The answer is resent until it is acknowledged: an agent does that.
            let aid = format!("{name}-a{n}");
            let body = json!({"session_id": sid, "client_msg_id": cid,
                              "assistant_msg_id": aid, "text": "done"});
            while !post("/response", body.clone(), &mut acked) {}
            acked.answers.insert(aid);
            progress.fetch_add(1, Ordering::Relaxed);
        }
        acked
    })
}

/// Reads a subscriber until it has seen every id of `want`; returns the
/// `seq`s of the frames it got, in order. Fails on a `resync` frame.
#[track_caller]
fn read_all(ws: &mut Ws, want: &BTreeSet<String>) -> Vec<u64> {
    let mut seen = BTreeSet::new();
    let mut seqs = Vec::new();
    while !want.is_subset(&seen) {
        let frame = ws.recv_json_skip_pings();
        assert_eq!(frame["type"], "message", "{frame}");
        seen.insert(
            frame["data"]["assistant_msg_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        seqs.push(frame["data"]["seq"].as_u64().unwrap());
    }
    seqs
}

#[test]
fn redis_restarted_in_the_middle_of_traffic_loses_nothing_acknowledged() {
    let mut redis = Redis::start_durable();
    let servers = redis.relays(2, &[]);
    let addrs: Vec<_> = servers.iter().map(|s| s.addr()).collect();
    let sid = unique_session();
    // A subscriber on each instance, and a long-poll parked on B for a
    // session that gets its prompt only after the outage.
    let (epoch, mut subscribers) = subscribed_on_each(&servers, &sid);
    let quiet = unique_session();
    servers[0].put(&format!("/sessions/{quiet}"));
    let mut parked = servers[1].conn();
    parked.send("GET", &format!("/prompts/{quiet}?timeout=60"), &[], None);
    servers[1].wait_health("parked_polls", 1);

    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..3)
        .map(|i| {
            writer(
                addrs.clone(),
                sid.clone(),
                format!("w{i}"),
                Arc::clone(&stop),
                Arc::clone(&progress),
            )
        })
        .collect();
    let wait_progress = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while progress.load(Ordering::Relaxed) < n {
            assert!(Instant::now() < deadline, "writers stuck");
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // Three outages, each in the middle of the writers' traffic.
    for _ in 0..3 {
        let before = progress.load(Ordering::Relaxed);
        wait_progress(before + 30);
        redis.kill9();
        // During the outage: not ready, writes refused, liveness and the
        // connections kept.
        for srv in &servers {
            wait_status(srv, "/readyz", 503);
            assert_eq!(srv.get("/healthz").status, 200);
        }
        let resp = servers[0].post_json(
            "/prompt",
            &json!({"session_id": sid, "prompt": "x", "client_msg_id": "during"}),
        );
        assert_error(&resp, 503, "Storage unavailable");
        redis.run();
        for srv in &servers {
            wait_status(srv, "/readyz", 200);
        }
    }
    let before = progress.load(Ordering::Relaxed);
    wait_progress(before + 30);
    stop.store(true, Ordering::Relaxed);
    let mut acked = Acked::default();
    for w in writers {
        let got = w.join().unwrap();
        acked.prompts.extend(got.prompts);
        acked.answers.extend(got.answers);
        acked.unavailable += got.unavailable;
    }
    assert!(acked.unavailable > 0, "the writers saw the outage");

    // Everything acknowledged is in the log, seq without holes, the epoch
    // unchanged, and the same on both instances.
    for srv in &servers {
        let history = all_messages(srv, &sid);
        assert_eq!(history["epoch"], epoch.as_str());
        let messages = history["messages"].as_array().unwrap();
        let seqs = seqs(&history);
        assert_eq!(seqs.len(), messages.len());
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
        let ids = |kind: &str, field: &str| -> BTreeSet<String> {
            messages
                .iter()
                .filter(|m| m["type"] == kind)
                .map(|m| m["data"][field].as_str().unwrap().to_string())
                .collect()
        };
        let prompts = ids("prompt", "client_msg_id");
        let answers = ids("assistant", "assistant_msg_id");
        assert!(acked.prompts.is_subset(&prompts), "a prompt was lost");
        assert!(acked.answers.is_subset(&answers), "an answer was lost");
        // No acknowledged prompt is pending: they were all answered.
        let pending: BTreeSet<String> = client_msg_ids(&srv.pending(&sid)).into_iter().collect();
        assert!(pending.is_disjoint(&acked.prompts), "{pending:?}");
    }
    // Both subscribers, on their first connection, hold every answer in
    // order, without a resync.
    for ws in &mut subscribers {
        let seqs = read_all(ws, &acked.answers);
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
    // The long-poll parked through the outage is woken by a prompt after it.
    servers[0].prompt(&quiet, "after the outage", Some("late"));
    let got = parked.read_response();
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(client_msg_ids(got.json().as_array().unwrap()), ["late"]);
}

#[test]
fn the_clients_of_a_killed_instance_resume_on_another_without_resync() {
    let redis = Redis::start();
    let mut servers = redis.relays(2, &[]);
    let addrs: Vec<_> = servers.iter().map(|s| s.addr()).collect();
    let sid = unique_session();
    let epoch = servers[0].put(&format!("/sessions/{sid}")).json()["epoch"]
        .as_str()
        .unwrap()
        .to_string();
    let mut ws = servers[0].ws(&format!("/ws/{sid}?after=0&epoch={epoch}"));
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..3)
        .map(|i| {
            writer(
                addrs.clone(),
                sid.clone(),
                format!("w{i}"),
                Arc::clone(&stop),
                Arc::clone(&progress),
            )
        })
        .collect();
    // The web client reads on A while the writers write to A and B.
    let mut seen = Vec::new();
    while seen.len() < 30 {
        let f = ws.recv_json_skip_pings();
        seen.push(f["data"].clone());
    }
    servers[0].kill9();
    // What A had sent before it died, then the close.
    while let Ok(tungstenite::Message::Text(t)) = ws.inner().read() {
        let f: Value = serde_json::from_str(t.as_str()).unwrap();
        if f["type"] == "message" {
            seen.push(f["data"].clone());
        }
    }
    let before = progress.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(30);
    while progress.load(Ordering::Relaxed) < before + 30 {
        assert!(Instant::now() < deadline, "writers stuck on B");
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    let mut acked = BTreeSet::new();
    let mut prompts = BTreeSet::new();
    for w in writers {
        let got = w.join().unwrap();
        acked.extend(got.answers);
        prompts.extend(got.prompts);
    }

    // The web client reconnects to B with its cursor and epoch: no resync,
    // and it then holds every acknowledged answer, in order.
    let last = seen.last().unwrap()["seq"].as_u64().unwrap();
    let b = &servers[1];
    let mut ws = b.ws(&format!("/ws/{sid}?after={last}&epoch={epoch}"));
    let mut ids: BTreeSet<String> = seen
        .iter()
        .map(|d| d["assistant_msg_id"].as_str().unwrap().to_string())
        .collect();
    let mut seqs: Vec<u64> = seen.iter().map(|d| d["seq"].as_u64().unwrap()).collect();
    while !acked.is_subset(&ids) {
        let f = ws.recv_json_skip_pings();
        assert_eq!(f["type"], "message", "no resync: {f}");
        ids.insert(f["data"]["assistant_msg_id"].as_str().unwrap().to_string());
        seqs.push(f["data"]["seq"].as_u64().unwrap());
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let history = all_messages(b, &sid);
    assert_eq!(history["epoch"], epoch.as_str());
    // Every acknowledged prompt is stored and, answered, no longer pending.
    let stored: BTreeSet<String> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "prompt")
        .map(|m| m["data"]["client_msg_id"].as_str().unwrap().to_string())
        .collect();
    assert!(prompts.is_subset(&stored), "a prompt was lost");
    let pending: BTreeSet<String> = client_msg_ids(&b.pending(&sid)).into_iter().collect();
    assert!(pending.is_disjoint(&prompts), "{pending:?}");
}

#[test]
fn redis_unreachable_at_start_is_waited_for() {
    let port = free_port();
    let srv = Server::start_with(&[
        ("RELAY_REDIS_URL", &format!("redis://127.0.0.1:{port}")),
        ("RELAY_REDIS_PREFIX", "late:"),
    ]);
    assert_eq!(srv.get("/healthz").status, 200);
    let ready = srv.get("/readyz");
    assert_eq!(ready.status, 503, "{}", ready.text());
    let resp = srv.post_json(
        "/prompt",
        &json!({"session_id": "s", "prompt": "x", "client_msg_id": "c"}),
    );
    assert_error(&resp, 503, "Storage unavailable");
    // Redis comes up on that port: the server connects on its own.
    let mut redis = Redis::unstarted(port, &["--save", "", "--appendonly", "no"]);
    redis.run();
    wait_status(&srv, "/readyz", 200);
    let ack = srv.prompt("s", "x", Some("c"));
    assert_eq!(ack["stored"], true);
    assert!(ack.get("duplicate").is_none(), "the 503 stored nothing");
}

#[test]
fn a_data_dir_and_a_redis_url_together_are_refused_at_start() {
    let dir = std::env::temp_dir().join(format!("relay-redis-dd-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .env_clear()
        .env("RELAY_PORT", "0")
        .env("RELAY_DATA_DIR", &dir)
        .env("RELAY_REDIS_URL", "redis://127.0.0.1:6379")
        .stdin(Stdio::null())
        .output()
        .expect("run relay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("RELAY_DATA_DIR"), "{stderr}");
    assert!(stderr.contains("RELAY_REDIS_URL"), "{stderr}");
    assert!(!dir.exists(), "nothing created");
}

#[test]
fn a_bad_redis_url_or_prefix_is_refused_at_start() {
    for (key, value, says) in [
        ("RELAY_REDIS_URL", "http://127.0.0.1:6379", "redis://"),
        ("RELAY_REDIS_URL", "rediss://", "no host"),
        ("RELAY_REDIS_PREFIX", "has space", "RELAY_REDIS_PREFIX"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_relay"))
            .env_clear()
            .env("RELAY_PORT", "0")
            .env("RELAY_REDIS_URL", "redis://127.0.0.1:6379")
            .env(key, value)
            .stdin(Stdio::null())
            .output()
            .expect("run relay");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}={value}: {stderr}");
        assert!(stderr.contains(says), "{key}={value}: {stderr}");
    }
}

#[test]
fn a_write_redis_holds_past_the_store_timeout_gets_its_own_answer_and_the_next_request_its_own() {
    let redis = Redis::start();
    let prefix = format!("{}:", unique_session());
    let srv = Server::start_single_with(&[
        ("RELAY_REDIS_URL", &redis.url()),
        ("RELAY_REDIS_PREFIX", &prefix),
        ("RELAY_STORE_TIMEOUT", "0.2"),
    ]);
    let sid = unique_session();
    srv.prompt(&sid, "p0", Some("p0"));
    // Redis stops with p1's script sent: the write is Redis's to run, so
    // the storage timeout passes and the request goes on waiting.
    redis.signal("STOP");
    let mut conn = srv.conn();
    let p = |id: &str| json!({"session_id": sid, "prompt": id, "client_msg_id": id});
    let body = serde_json::to_vec(&p("p1")).unwrap();
    let json_type = [("Content-Type", "application/json")];
    conn.send("POST", "/prompt", &json_type, Some(&body));
    srv.wait_for_log("beyond its timeout");
    redis.signal("CONT");
    let first = conn.read_response();
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["client_msg_id"], "p1");
    let second = conn.post_json("/prompt", &p("p2"));
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.json()["client_msg_id"], "p2");

    let history = all_messages(&srv, &sid);
    let ids: Vec<&str> = history["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["data"]["client_msg_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, ["p0", "p1", "p2"]);
    assert_eq!(seqs(&history), [1, 2, 3]);
}

/// The next frame of `ws` that is not a ping or a `presence` (a short
/// grace on a loaded machine may let the agent go offline and back).
#[track_caller]
fn content_frame(ws: &mut Ws) -> Value {
    loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] != "presence" {
            return v;
        }
    }
}

#[test]
fn parts_presence_and_receipts_reach_every_instance() {
    let redis = Redis::start();
    let env = [("RELAY_AGENT_GRACE", "0.5")];
    let [a, b]: [Server; 2] = redis.relays(2, &env).try_into().ok().unwrap();
    let sid = unique_session();
    let cid = a.prompt(&sid, "tell me", None)["client_msg_id"]
        .as_str()
        .unwrap()
        .to_string();
    let part = |srv: &Server, text: &str| {
        srv.post_json(
            "/response",
            &json!({"session_id": sid, "client_msg_id": cid, "assistant_msg_id": "x-1",
                    "text": text, "partial": true}),
        )
    };
    // Two parts through `a` before `b` has anyone on the session: `b`
    // serves the snapshot from Redis.
    assert_eq!(part(&a, "one ").status, 200);
    assert_eq!(part(&a, "two ").status, 200);
    let mut ws = b.ws(&format!("/ws/{sid}"));
    let mut snapshot = None;
    let mut online = false;
    // The snapshot may come with the catch-up or after the read of the
    // session; the agent (seen through `a`) is online either way.
    while snapshot.is_none() || !online {
        let v = ws.recv_any_skip_pings();
        match v["type"].as_str() {
            Some("delta") => snapshot = Some(v["data"].clone()),
            Some("presence") => online = v["data"]["agent"] == "online",
            other => panic!("unexpected frame {other:?}: {v}"),
        }
    }
    let snapshot = snapshot.unwrap();
    assert_eq!(snapshot["text"], "one two ");
    assert_eq!(snapshot["part"], 2);
    assert_eq!(snapshot["snapshot"], true);
    // A live part through `a` reaches `b`'s subscriber. A read of the
    // session still under way (`b` reads it again once it listens to its
    // channel) may refill the subscriber first, which then gets the draft
    // as a snapshot again: as it was, or with the new part already in it
    // (the live part is then not sent, being held).
    assert_eq!(part(&a, "three").status, 200);
    let v = loop {
        let v = content_frame(&mut ws);
        assert_eq!(v["type"], "delta", "{v}");
        if v["data"]["snapshot"] != true || v["data"]["part"] == 3 {
            break v;
        }
        assert_eq!(v["data"]["text"], "one two ", "{v}");
    };
    assert_eq!(v["data"]["part"], 3, "{v}");
    let whole = v["data"]["snapshot"] == true;
    assert_eq!(
        v["data"]["text"],
        if whole { "one two three" } else { "three" }
    );
    // The final answer through `a` replaces the draft everywhere.
    let fin = answer(&a, &sid, &cid, "x-1", "one two three");
    assert_eq!(fin.status, 200, "{}", fin.text());
    assert_eq!(fin.json()["delivered"], true);
    let v = content_frame(&mut ws);
    assert_eq!(v["type"], "message", "{v}");
    // The agent's grace passes on `a`: offline on `b` too.
    loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] == "presence" {
            assert_eq!(v["data"]["agent"], "offline", "{v}");
            break;
        }
    }
    // An agent parked on `a` is online for `b`'s subscriber; its fetch of
    // a new prompt is a receipt there.
    let mut poll = a.conn();
    poll.send("GET", &format!("/prompts/{sid}?timeout=10"), &[], None);
    let v = ws.recv_any_skip_pings();
    assert_eq!(v["data"]["agent"], "online", "{v}");
    let info = b.get(&format!("/sessions/{sid}")).json();
    assert_eq!(info["agent"], "online", "{info}");
    assert_eq!(info["last_seq"], 2);
    let next = b.prompt(&sid, "and then?", None)["client_msg_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(poll.read_response().status, 200);
    loop {
        let v = ws.recv_any_skip_pings();
        if v["type"] == "receipt" {
            assert_eq!(v["data"]["client_msg_id"], next.as_str());
            break;
        }
        assert_eq!(v["type"], "presence", "{v}");
    }
    // Nothing of the draft is left in Redis.
    let keys = redis.cli(&["KEYS", "*d:*"]);
    assert!(keys.trim().is_empty(), "{keys}");
}
