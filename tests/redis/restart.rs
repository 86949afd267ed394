//! What waits on a relay while the Redis it shares with another restarts
//! empty: a parked agent poll stays parked and is answered by the next
//! prompt posted anywhere, and the agent stays online for every instance.

use crate::common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

/// Polls `/readyz` on `srv` (bounded, 10 s) until it answers `status`.
#[track_caller]
fn wait_ready(srv: &Server, status: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while srv.get("/readyz").status != status {
        assert!(Instant::now() < deadline, "/readyz never answered {status}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `GET /sessions/{sid}` on `srv` until it says the agent is `want`
/// (bounded, 5 s: well inside the agent's 50 s poll); the last body.
#[track_caller]
fn wait_agent(srv: &Server, sid: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = srv.get(&format!("/sessions/{sid}"));
        if got.status == 200 && got.json()["agent"] == want {
            return got.json();
        }
        assert!(
            Instant::now() < deadline,
            "the agent never {want}: {} {}",
            got.status,
            got.text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_parked_agent_hears_the_first_prompt_after_redis_restarted_empty_and_stays_online() {
    let mut redis = Redis::start();
    let [a, b]: [Server; 2] = redis.relays(2, &[]).try_into().ok().unwrap();
    let sid = unique_session();
    a.put(&format!("/sessions/{sid}"));
    // The agent answered the session's first prompt and polls for what
    // follows it, as `relay agent` does (`after`: the last prompt's seq);
    // another poll asks for every pending prompt.
    a.prompt(&sid, "before the restart", Some("p0"));
    b.respond(&sid, "p0", "done");
    let mut polls = [
        b.start_poll(&sid, "?timeout=50&after=1"),
        b.start_poll(&sid, "?timeout=50"),
    ];
    b.wait_health("parked_polls", 2);
    wait_agent(&a, &sid, "online");

    redis.kill9();
    for srv in [&a, &b] {
        wait_ready(srv, 503);
    }
    redis.run();
    for srv in [&a, &b] {
        wait_ready(srv, 200);
    }
    assert_eq!(b.health()["parked_polls"], 2, "the polls stay parked");
    // B tells again that its agent is there: online for A, in the new
    // epoch (nothing stored in it yet).
    let info = wait_agent(&a, &sid, "online");
    assert_eq!(info["last_seq"], 0, "{info}");
    assert_eq!(b.health()["parked_polls"], 2, "the polls stay parked");

    // The first prompt after the restart, through A, answers both polls
    // at once, not when their 50 s run out: the cursor counted the old
    // epoch, and every prompt of the new one came after it.
    a.prompt(&sid, "after the restart", Some("p1"));
    for poll in &mut polls {
        poll.tcp()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let got = poll.read_response();
        assert_eq!(got.status, 200, "{}", got.text());
        assert_eq!(client_msg_ids(got.json().as_array().unwrap()), ["p1"]);
    }
}
