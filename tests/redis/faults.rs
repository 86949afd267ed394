//! Faults injected into the Redis that several relays share, against real
//! relay processes, a real `redis-server` (Debian's, see
//! `scripts/install-test-deps.sh`) of each test's own, and real HTTP and
//! WebSocket clients. Each test counts: every request gets its own
//! answer; nothing answered `503` is ever visible to anyone (WebSocket
//! frames, `/messages`, the pending sets of every instance); nothing
//! acknowledged is lost; `seq` has no gap within an epoch.

use crate::common::*;
use crate::writers::{Kind, Tally, Writers, post, seqs, tags, wait_until};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Polls `/readyz` on `srv` (bounded, 10 s) until it answers `status`;
/// returns that answer's body.
#[track_caller]
fn wait_ready(srv: &Server, status: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = srv.get("/readyz");
        if got.status == status {
            return got.json();
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {status} (last {} {})",
            got.status,
            got.text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Checks one instance's view of `sid` against what the writers saw:
/// one epoch, `seq` from 1 without a gap, everything acknowledged stored
/// (with the `seq` its answer named), nothing refused anywhere, nothing
/// pending (every acknowledged prompt got its answer or its cancel), an
/// answer to a cancelled prompt refused, and every ask answered with its
/// reply. Returns the history.
#[track_caller]
fn check_instance(srv: &Server, sid: &str, epoch: &str, tally: &Tally) -> Value {
    let history = srv.messages(sid, "?limit=1000");
    assert_eq!(history["epoch"], epoch, "{history}");
    let seqs = seqs(&history);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    for kind in Kind::ALL {
        let stored = tags(&history, kind);
        for (tag, seq) in tally.acked(kind) {
            let got = stored.get(&tag);
            assert!(got.is_some(), "acknowledged {kind:?} {tag} lost");
            if let Some(seq) = seq {
                assert_eq!(got, Some(&seq), "acknowledged {kind:?} {tag} moved");
            }
        }
        let shown: Vec<_> = tally
            .refused(kind)
            .into_iter()
            .filter(|t| stored.contains_key(t))
            .collect();
        assert!(shown.is_empty(), "refused {kind:?} stored: {shown:?}");
    }
    for (reason, cid) in &tally.cancelled {
        let late = json!({"session_id": sid, "client_msg_id": cid,
                          "assistant_msg_id": format!("late-{reason}"), "text": "late"});
        assert_error(&srv.post_json("/response", &late), 409, "Conflict");
    }
    for (text, kid) in &tally.replied {
        let state = srv.get(&format!("/asks/{sid}/{kid}?wait=false")).json();
        assert_eq!(
            (&state["state"], &state["text"]),
            (&json!("answered"), &json!(text))
        );
    }
    let pending = srv.get(&format!("/prompts/{sid}?wait=false"));
    assert_eq!(pending.status, 200, "{}", pending.text());
    assert_eq!(pending.json(), json!([]), "pending on one instance");
    history
}

/// Reads a subscriber until it has seen every acknowledged answer,
/// cancel, ask and reply: no other frame (no close, no resync), nothing
/// refused, `seq` rising.
#[track_caller]
fn read_answers(ws: &mut Ws, tally: &Tally) {
    let mut seen: BTreeMap<Kind, BTreeSet<String>> = BTreeMap::new();
    let missing = |seen: &BTreeMap<Kind, BTreeSet<String>>| {
        Kind::ALL
            .into_iter()
            .filter(|k| k.framed_as().is_some())
            .any(|k| {
                let seen = seen.get(&k);
                tally
                    .acked(k)
                    .keys()
                    .any(|t| !seen.is_some_and(|s| s.contains(t)))
            })
    };
    let mut last = 0;
    while missing(&seen) {
        let frame = ws.recv_json_skip_pings();
        let kind = Kind::of_frame(&frame).unwrap_or_else(|| panic!("{frame}"));
        let tag = frame["data"][kind.tag_field()].as_str().unwrap_or("");
        assert!(
            !tally.refused(kind).contains(tag),
            "a refused {kind:?} was sent: {frame}"
        );
        let seq = frame["data"]["seq"].as_u64().unwrap_or(0);
        assert!(seq > last, "{seq} after {last}");
        last = seq;
        seen.entry(kind).or_default().insert(tag.to_string());
    }
}

#[test]
fn a_write_redis_refuses_out_of_memory_reaches_nobody_and_no_copy() {
    let redis = Redis::start();
    let servers = redis.relays(2, &[]);
    let sid = unique_session();
    let (epoch, mut subscribers) = subscribed_on_each(&servers, &sid);
    for s in &servers {
        s.wait_health("subscribers", 1);
    }
    let writers = Writers::start(&servers, &sid, 3, false);
    writers.wait_answers(20);
    // Redis stops taking writes in the middle of the traffic, then takes
    // them again.
    redis.config_set("maxmemory-policy", "noeviction");
    redis.config_set("maxmemory", "1");
    writers.wait_refusals(60);
    redis.config_set("maxmemory", "0");
    writers.wait_answers(20);
    let tally = writers.stop_and_join();
    for kind in Kind::ALL {
        assert!(
            !tally.refused(kind).is_empty(),
            "no {kind:?} refused: {tally:?}"
        );
    }
    eprintln!("acknowledged/refused: {}", tally.counts());

    let history = check_instance(&servers[0], &sid, &epoch, &tally);
    assert_eq!(check_instance(&servers[1], &sid, &epoch, &tally), history);
    for ws in &mut subscribers {
        read_answers(ws, &tally);
    }
}

#[test]
fn readyz_follows_redis_refusing_writes_and_hanging_both_ways_without_client_writes() {
    let mut redis = Redis::start();
    let servers = redis.relays(2, &[]);
    let sid = unique_session();
    servers[0].prompt(&sid, "before", Some("before"));
    for srv in &servers {
        wait_ready(srv, 200);
    }
    let not_ready = json!({"ready": false, "reason": "storage"});
    // Out of memory: no client writes, yet not ready; ready again once
    // Redis takes writes, again with no client write.
    redis.config_set("maxmemory-policy", "noeviction");
    redis.config_set("maxmemory", "1");
    for srv in &servers {
        assert_eq!(wait_ready(srv, 503), not_ready);
        // Reads keep working.
        assert_eq!(srv.get("/healthz").status, 200);
        assert_eq!(srv.messages(&sid, "")["total"], 1);
        let pending = srv.get(&format!("/prompts/{sid}?wait=false")).json();
        assert_eq!(client_msg_ids(pending.as_array().unwrap()), ["before"]);
    }
    redis.config_set("maxmemory", "0");
    for srv in &servers {
        wait_ready(srv, 200);
    }
    // Hung (SIGSTOP): the probe goes unanswered, then is answered again.
    redis.signal("STOP");
    for srv in &servers {
        assert_eq!(wait_ready(srv, 503), not_ready);
    }
    redis.signal("CONT");
    for srv in &servers {
        wait_ready(srv, 200);
    }
    // Unreachable, then back (empty).
    redis.kill9();
    for srv in &servers {
        assert_eq!(wait_ready(srv, 503), not_ready);
    }
    redis.run();
    for srv in &servers {
        wait_ready(srv, 200);
    }
    // And writes work.
    assert_eq!(servers[1].prompt(&sid, "x", Some("p"))["stored"], true);
}

/// Reads a subscriber through a lost store: frames of the old epoch with
/// `seq` rising, then one `resync` naming `epoch` (the new one), then
/// frames of it from its `first_seq`, rising, until every tag of `want`
/// was seen. Never a close. Returns the resync frame.
#[track_caller]
fn read_through_resync(ws: &mut Ws, epoch: &str, want: &BTreeSet<String>) -> Value {
    let mut last = 0;
    let resync = loop {
        let frame = ws.recv_json_skip_pings();
        if frame["type"] == "resync" {
            break frame;
        }
        assert!(Kind::of_frame(&frame).is_some(), "{frame}");
        let seq = frame["data"]["seq"].as_u64().unwrap_or(0);
        assert!(seq > last, "{seq} after {last}");
        last = seq;
    };
    assert_eq!(resync["epoch"], epoch, "{resync}");
    let first = resync["first_seq"].as_u64().expect("first_seq");
    let mut last = first - 1;
    let mut seen = BTreeSet::new();
    while !want.is_subset(&seen) {
        let frame = ws.recv_json_skip_pings();
        let kind = Kind::of_frame(&frame).unwrap_or_else(|| panic!("one resync only: {frame}"));
        let seq = frame["data"]["seq"].as_u64().unwrap_or(0);
        assert!(seq > last, "{seq} after {last}");
        last = seq;
        let tag = frame["data"][kind.tag_field()].as_str().unwrap_or("");
        seen.insert(tag.to_string());
    }
    resync
}

#[test]
fn redis_flushed_or_restarted_empty_is_a_resync_with_a_new_epoch_not_a_deletion() {
    let mut redis = Redis::start();
    let servers = redis.relays(2, &[]);
    let sid = unique_session();
    let (epoch, mut subscribers) = subscribed_on_each(&servers, &sid);
    // A long-poll parked on B on a quiet session, through both losses.
    let quiet = unique_session();
    servers[0].put(&format!("/sessions/{quiet}"));
    let mut parked = servers[1].conn();
    parked.send("GET", &format!("/prompts/{quiet}?timeout=60"), &[], None);
    for s in &servers {
        s.wait_health("subscribers", 1);
    }
    servers[1].wait_health("parked_polls", 1);

    // FLUSHALL in the middle of the traffic.
    let writers = Writers::start(&servers, &sid, 3, true);
    writers.wait_answers(20);
    assert!(redis.cli(&["flushall"]).contains("OK"));
    writers.progress.lost.store(true, Ordering::SeqCst);
    writers.wait_answers(20);
    let tally = writers.stop_and_join();
    assert!(
        tally.orphans > 0 || !tally.after(Kind::Answer).is_empty(),
        "{tally:?}"
    );

    let history = servers[0].messages(&sid, "?limit=1000");
    let flushed = history["epoch"].as_str().unwrap().to_string();
    assert_ne!(flushed, epoch, "a lost store is a new epoch");
    for srv in &servers {
        let h = srv.messages(&sid, "?limit=1000");
        assert_eq!(h, history, "both instances hold the same session");
        let seqs = seqs(&h);
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
        for kind in Kind::ALL {
            let stored = tags(&h, kind);
            let lost: Vec<_> = tally
                .after(kind)
                .into_iter()
                .filter(|t| !stored.contains_key(t))
                .collect();
            assert!(
                lost.is_empty(),
                "{kind:?} acknowledged after the loss, lost: {lost:?}"
            );
        }
        let pending = srv.get(&format!("/prompts/{sid}?wait=false"));
        assert_eq!(pending.json(), json!([]), "pending on one instance");
    }
    let framed: BTreeSet<String> = Kind::ALL
        .into_iter()
        .filter(|k| k.framed_as().is_some())
        .flat_map(|k| tags(&history, k).into_keys())
        .collect();
    for ws in &mut subscribers {
        let resync = read_through_resync(ws, &flushed, &framed);
        assert_eq!(resync["first_seq"], 1, "{resync}");
    }

    // Restarted empty while nobody writes: the subscribers are told all
    // the same, and the session goes on under another epoch.
    redis.kill9();
    redis.run();
    for ws in &mut subscribers {
        let frame = ws.recv_json_skip_pings();
        assert_eq!(frame["type"], "resync", "{frame}");
        assert_ne!(frame["epoch"], flushed.as_str());
        assert_ne!(frame["epoch"], epoch.as_str());
    }
    let put = servers[1].put(&format!("/sessions/{sid}")).json();
    assert_eq!(put["created"], false, "{put}");
    servers[0].prompt(&sid, "again", Some("again"));
    let ack = servers[1].post_json(
        "/response",
        &json!({"session_id": sid, "client_msg_id": "again", "assistant_msg_id": "fresh", "text": "x"}),
    );
    assert_eq!(ack.status, 200, "{}", ack.text());
    for ws in &mut subscribers {
        let frame = ws.recv_json_skip_pings();
        assert_eq!(frame["data"]["assistant_msg_id"], "fresh", "{frame}");
        assert_eq!(frame["data"]["seq"], 2, "{frame}");
        assert_eq!(frame["data"]["session_id"], sid.as_str());
    }
    // The long-poll parked through both is woken by a prompt after them.
    servers[0].prompt(&quiet, "late", Some("late"));
    let got = parked.read_response();
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(client_msg_ids(got.json().as_array().unwrap()), ["late"]);
}

#[test]
fn a_store_lost_while_redis_refuses_writes_is_renewed_once_it_takes_them() {
    // The sweep, every 2.5 s with this TTL, creates again a session
    // someone waits on that could not be created when the loss was seen.
    let redis = Redis::start();
    let servers = redis.relays(2, &[("RELAY_SESSION_TTL", "10")]);
    let sid = unique_session();
    let (epoch, mut subscribers) = subscribed_on_each(&servers, &sid);
    for s in &servers {
        s.wait_health("subscribers", 1);
    }
    servers[0].prompt(&sid, "q", Some("p1"));
    assert_eq!(servers[1].respond(&sid, "p1", "a")["delivered"], true);
    for ws in &mut subscribers {
        assert_eq!(ws.recv_json_skip_pings()["data"]["seq"], 2);
    }
    // Out of memory, then the store flushed: each relay learns of the
    // loss from the write Redis refuses it, and cannot create the
    // session again yet.
    redis.config_set("maxmemory-policy", "noeviction");
    redis.config_set("maxmemory", "1");
    assert!(redis.cli(&["flushall"]).contains("OK"));
    for (i, srv) in servers.iter().enumerate() {
        let body = json!({"session_id": sid, "prompt": "q", "client_msg_id": format!("r{i}")});
        assert_error(&srv.post_json("/prompt", &body), 503, "Storage unavailable");
        wait_ready(srv, 503);
    }
    redis.config_set("maxmemory", "0");
    let mut epochs = BTreeSet::new();
    for ws in &mut subscribers {
        let frame = ws.recv_json_skip_pings();
        assert_eq!(frame["type"], "resync", "{frame}");
        assert_eq!(frame["first_seq"], 1, "{frame}");
        epochs.insert(frame["epoch"].as_str().unwrap_or("").to_string());
    }
    assert_eq!(epochs.len(), 1, "one new epoch: {epochs:?}");
    assert!(!epochs.contains(&epoch));
    let put = servers[1].put(&format!("/sessions/{sid}")).json();
    assert_eq!(put["created"], false, "{put}");
    assert!(
        epochs.contains(put["epoch"].as_str().unwrap_or("")),
        "{put}"
    );
    for (i, srv) in servers.iter().enumerate() {
        let history = srv.messages(&sid, "");
        assert_eq!(history["total"], 0, "nothing refused stored: {history}");
        let pending = srv.get(&format!("/prompts/{sid}?wait=false")).json();
        assert_eq!(pending, json!([]), "instance {i}");
    }
}

/// The lines of `srv`'s log that contain `needle`.
fn log_lines(srv: &Server, needle: &str) -> Vec<String> {
    srv.logs()
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect()
}

/// Waits until `srv` logged at least `n` failed attempts to link to Redis
/// (one `debug` line each), then checks they made one `warn` line, which
/// names the URL without its password and says why.
#[track_caller]
fn logged_once(srv: &Server, url: &str, cause: &str, password: &str) {
    wait_until("six failed attempts", || {
        log_lines(srv, "Redis link failed").len() >= 6
    });
    let warned = log_lines(srv, "Redis unavailable");
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains("\"level\":\"warn\""), "{}", warned[0]);
    assert!(warned[0].contains(url), "{}", warned[0]);
    assert!(warned[0].contains(cause), "{}", warned[0]);
    let logs = srv.logs();
    assert!(logs.iter().all(|l| !l.contains(password)), "{logs:#?}");
    assert!(log_lines(srv, "broke the protocol").is_empty(), "{logs:#?}");
}

#[test]
fn redis_unreachable_or_refusing_the_password_is_logged_once_without_the_password() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    let prefix = format!("{}:", unique_session());
    let relay_with = |password: &str| {
        Server::start_with(&[
            (
                "RELAY_REDIS_URL",
                &format!("redis://:{password}@127.0.0.1:{port}"),
            ),
            ("RELAY_REDIS_PREFIX", &prefix),
        ])
    };
    // Nothing listens: connection refused, logged once.
    let first = relay_with("s3cret-pw");
    logged_once(&first, &url, "refused", "s3cret-pw");
    // Redis comes up there with that password: the return is logged once.
    let redis = Redis::start_on(port, &["--requirepass", "s3cret-pw"]);
    wait_ready(&first, 200);
    wait_until("the return logged", || {
        !log_lines(&first, "Redis reachable again").is_empty()
    });

    // A wrong password: Redis answers and refuses, logged once as such.
    let second = relay_with("not-it-pw");
    logged_once(&second, &url, "WRONGPASS", "not-it-pw");
    assert_eq!(second.get("/readyz").status, 503);
    // Redis is given that password: it links, and says so once.
    redis.config_set("requirepass", "not-it-pw");
    wait_ready(&second, 200);
    wait_until("the return logged", || {
        !log_lines(&second, "Redis reachable again").is_empty()
    });
    for srv in [&first, &second] {
        assert_eq!(log_lines(srv, "Redis reachable again").len(), 1);
        assert_eq!(log_lines(srv, "Redis unavailable").len(), 1);
    }
}

/// Parts of answer `a` to prompt `q`, posted through two relays in turn:
/// those acknowledged and those refused, in order.
struct Parts {
    addrs: [SocketAddr; 2],
    sid: String,
    acked: Vec<String>,
    refused: Vec<String>,
}

impl Parts {
    /// Posts part `tag` `i` through relay `i % 2`: `200` or `503`.
    fn post(&mut self, i: usize, tag: &str) -> u16 {
        let text = format!("{tag}{i}|");
        let body = json!({"session_id": self.sid, "client_msg_id": "q",
            "assistant_msg_id": "a", "text": text, "partial": true});
        let (status, ack) = post(self.addrs[i % 2], "/response", &body).expect("an answer");
        match status {
            200 => {
                assert_eq!(ack["partial"], true, "{ack}");
                self.acked.push(text);
            }
            503 => self.refused.push(text),
            _ => panic!("{status} {ack}"),
        }
        status
    }
}

/// The script calls a relay sent to Redis (`/metrics`).
fn storage_commands(srv: &Server) -> u64 {
    let metrics = srv.get("/metrics").text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("relay_storage_commands_total "))
        .and_then(|n| n.trim().parse().ok())
        .expect("relay_storage_commands_total")
}

/// Reads `ws` as a client draws a streamed answer, until the answer `aid`
/// arrives: a `delta` numbered one more than the last appends its text,
/// a snapshot replaces the draft, any other waits for the next snapshot.
/// No text of `refused` may ever show. Returns the draft just before the
/// answer, and the answer's text.
#[track_caller]
fn read_stream(ws: &mut Ws, aid: &str, refused: &[String]) -> (String, String) {
    let (mut draft, mut parts) = (String::new(), 0);
    loop {
        let f = ws.recv_any_skip_pings();
        let data = &f["data"];
        match f["type"].as_str() {
            Some("delta") if data["assistant_msg_id"] == aid => {
                let text = data["text"].as_str().expect("a part's text");
                let n = data["part"].as_u64().expect("a part's number");
                if data["snapshot"] == true {
                    (draft, parts) = (text.to_string(), n);
                } else if n == parts + 1 {
                    draft.push_str(text);
                    parts = n;
                }
                for r in refused {
                    assert!(!draft.contains(r.as_str()), "refused part {r} shown: {f}");
                }
            }
            Some("delta_end") => panic!("the draft was dropped: {f}"),
            Some("message") if data["assistant_msg_id"] == aid => {
                let text = data["text"].as_str().expect("the answer's text");
                return (draft, text.to_string());
            }
            _ => {}
        }
    }
}

#[test]
fn a_part_redis_refuses_reaches_nobody_and_one_it_holds_through_a_hang_is_answered() {
    let redis = Redis::start();
    let servers = redis.relays(2, &[]);
    let sid = unique_session();
    let (_, mut subscribers) = subscribed_on_each(&servers, &sid);
    for s in &servers {
        s.wait_health("subscribers", 1);
    }
    servers[0].prompt(&sid, "tell me", Some("q"));
    let mut parts = Parts {
        addrs: [servers[0].addr(), servers[1].addr()],
        sid: sid.clone(),
        acked: Vec::new(),
        refused: Vec::new(),
    };
    for i in 0..5 {
        assert_eq!(parts.post(i, "ok"), 200);
    }
    // Redis stops taking writes in the middle of the stream, then takes
    // them again.
    redis.config_set("maxmemory-policy", "noeviction");
    redis.config_set("maxmemory", "1");
    let mut i = 0;
    while parts.refused.len() < 3 {
        parts.post(i, "oom");
        i += 1;
        assert!(i < 1000, "Redis out of memory never refused a part");
    }
    redis.config_set("maxmemory", "0");
    for i in 0..4 {
        assert_eq!(parts.post(i, "again"), 200);
    }
    // Redis hangs with a part sent to it: the part waits, and is answered
    // (and shown) once Redis runs again.
    redis.signal("STOP");
    let addr = servers[1].addr();
    let body = json!({"session_id": sid, "client_msg_id": "q",
        "assistant_msg_id": "a", "text": "hung|", "partial": true});
    let sent = storage_commands(&servers[1]);
    let hung = std::thread::spawn(move || post(addr, "/response", &body));
    wait_until("the part sent to the hung Redis", || {
        storage_commands(&servers[1]) > sent
    });
    redis.signal("CONT");
    let (status, ack) = hung.join().expect("the poster").expect("an answer");
    assert_eq!((status, &ack["partial"]), (200, &json!(true)), "{ack}");
    parts.acked.push("hung|".into());
    assert_eq!(parts.post(0, "last"), 200);

    let (whole, refused) = (parts.acked.concat(), parts.refused);
    let done = json!({"session_id": sid, "client_msg_id": "q",
        "assistant_msg_id": "a", "text": whole});
    let (status, ack) = post(servers[1].addr(), "/response", &done).expect("an answer");
    assert_eq!(status, 200, "{ack}");
    for ws in &mut subscribers {
        assert_eq!(
            read_stream(ws, "a", &refused),
            (whole.clone(), whole.clone())
        );
    }
    for s in &servers {
        let history = s.messages(&sid, "");
        assert_eq!(history["total"], 2, "{history}");
        assert!(!history.to_string().contains("oom"), "{history}");
    }
}
