//! The time of one eviction pass (`Relay::evict`) over many resident
//! sessions: the pass that runs at the end of a loop turn once the count
//! passes the budget, dropping sessions until it is an eighth under it.
//! The sessions (one answered exchange each, used in turn) are built
//! first and the pass alone is timed; each run builds them anew.
//!
//! `cargo bench --bench evict -- [sessions] [runs]` (100,000 and 5 by
//! default). Prints the median pass, the sessions it dropped and the time
//! per session dropped.

use std::time::Instant;

use relay::relay::{Limits, Relay};
use relay::store::MemStore;
use relay::store::engine::Engine;
use relay::store::model::{NewPrompt, NewResponse, Write};
use relay::store::redis::RedisStore;
use relay::store::redis::RedisUrl;
use relay::time::Millis;

fn limits(sessions: usize, max_memory: usize) -> Limits {
    Limits {
        history_limit: 100,
        max_sessions: sessions + 1,
        max_pending: 100,
        max_waiters: 100,
        max_subscribers: 100,
        session_ttl_ms: 86_400_000,
        draft_timeout_ms: 60_000,
        agent_grace_ms: 30_000,
        max_memory,
    }
}

/// A store of `n` sessions, session `i` last used at `i` ms.
fn store(n: usize) -> MemStore {
    let mut m = MemStore::new(limits(n, usize::MAX).store());
    let text = "e".repeat(100);
    let mut out = Vec::new();
    for i in 0..n {
        let now = Millis(i as u64);
        let p = format!(r#"{{"session_id":"s{i}","client_msg_id":"p","prompt":"{text}"}}"#);
        let r = format!(
            r#"{{"session_id":"s{i}","client_msg_id":"p","assistant_msg_id":"a","text":"{text}"}}"#
        );
        let prompt = NewPrompt::parse(p.as_bytes()).expect("a prompt");
        let _ = m.decide(now, i as u64, Write::Prompt(prompt), &mut out);
        for rec in out.drain(..) {
            m.apply(now, rec);
        }
        let answer = NewResponse::parse(r.as_bytes()).expect("an answer");
        let _ = m.decide(now, i as u64, Write::answer(answer), &mut out);
        for rec in out.drain(..) {
            m.apply(now, rec);
        }
    }
    m
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let runs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let mut times = Vec::new();
    let mut dropped = 0;
    for _ in 0..runs {
        let m = store(n);
        // Just past the budget: the pass drops an eighth of it.
        let budget = m.memory() - 1;
        let url = RedisUrl::parse("redis://127.0.0.1:1").expect("a URL");
        let lim = limits(n, budget);
        let engine = RedisStore::new(url, "bench", lim.store());
        let mut relay = Relay::new(lim, m, Engine::Shared(engine));
        let now = Millis(n as u64 + 1);
        let t = Instant::now();
        dropped = relay.evict(now);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        drop(relay);
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "evict: {n} sessions, median pass {median:.2} ms ({} runs: {:.2}..{:.2}), {dropped} dropped, {:.0} ns a session dropped",
        runs,
        times[0],
        times[times.len() - 1],
        median * 1e6 / dropped.max(1) as f64
    );
}
