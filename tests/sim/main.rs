//! Every interleaving, seeded: the real API rules, relay core, store and
//! engine run in one process under a simulated world (clients, sockets,
//! a virtual clock, for a data directory the storage thread, whose
//! commits come late, batched or rolled back: `world/storage.rs`, and
//! for relays sharing Redis the Redis server, whose answers and published
//! changes come late and apart: `world/shared.rs`, `world/links.rs`), and a
//! model checks every promise after every step (`world.rs`,
//! `model.rs`): each request answered once (by its ticket, when it
//! waited for the storage) with its own command's outcome,
//! acknowledged writes present and refused ones absent, `seq` gapless
//! per epoch, every subscriber's frames in order with no gap and no
//! duplicate unless a `resync` says so and no part of an answer after
//! its final message or its prompt's cancel, pending sets as the model has
//! them, sessions collected by the clock's TTL and no earlier. With a
//! data directory and a small budget, sessions leave memory at the end
//! of each step and are read back on their next use
//! (`world/resident.rs`): a session known by id only must be held by
//! nothing and be, in the storage, what the model has. Those seeds also
//! restart the relay now and then on the storage it had, which reads no
//! session at start; the other seeds with a data directory crash it now
//! and then, losing the last transactions committed with the write-ahead
//! log, and the start decides what to do about it (`sqlite::recover`).
//!
//! A run is a seed: the steps are drawn from it (`ops.rs`), so a seed
//! replays the same run anywhere. The fixed seeds run by default;
//! `SIM_SEED=<seed>` runs one, `SIM_SEEDS=<n>` the first `n`,
//! `SIM_STEPS=<n>` sets the steps of each. A failing run is shrunk (its
//! steps dropped while it still fails) to a short case, printed with the
//! command that replays it (`SIM_SEED=<seed> SIM_KEEP=<steps kept>`);
//! `SIM_SHRINK=0` skips the shrinking, `SIM_TRACE=1` prints the last
//! steps of the failing run.
//!
//! The suite runs once more with a data directory, over TLS and against
//! Redis (`TEST_WITH_*`): none of those changes what runs here, so the
//! simulation runs in the plain pass only.

/// Whether `SIM_TRACE` asks for the last steps of a failing run.
fn tracing() -> bool {
    thread_local!(static ON: bool = std::env::var("SIM_TRACE").is_ok());
    ON.with(|on| *on)
}

thread_local!(static TRACE: std::cell::RefCell<std::collections::VecDeque<String>> = Default::default());

/// A line of the run's trace: the last twenty thousand are kept.
fn trace(line: String) {
    TRACE.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() >= 20_000 {
            t.pop_front();
        }
        t.push_back(line);
    });
}

#[macro_export]
macro_rules! strace {
    ($($t:tt)*) => {
        if $crate::tracing() {
            $crate::trace(format!($($t)*));
        }
    };
}

mod model;
mod ops;
mod world;

use std::time::Instant;

use ops::{Op, Rng};
use world::{BUDGET, EVICT_BUDGET, Seen, Store, World};

/// The seeds CI runs (odd ones with a data directory, even ones in
/// memory or, one in four of those, on relays sharing Redis), and the
/// steps of each.
const SEEDS: u64 = 500;
const STEPS: usize = 5_000;
/// The steps of a seed whose relays share a store, at most.
const SHARED_STEPS: usize = 2_500;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The steps of seed `seed`: those of the data directory's budget seeds
/// spread over more sessions, so that some are idle and leave memory;
/// those of its other seeds crash now and then, losing the write-ahead
/// log. Each from a generator of its own, so the other seeds' steps stay
/// as they were.
fn draw(seed: u64, steps: usize) -> Vec<Op> {
    let mut rng = Rng::new(seed);
    let mut spread = Rng::new(!seed);
    let mut crash = Rng::new(seed.rotate_left(32) ^ 0x0077_616c);
    (0..steps)
        .map(|_| Op::draw(&mut rng))
        .map(|op| match seed % 4 {
            1 => op.spread(&mut spread),
            3 => op.crash(&mut crash),
            _ => op,
        })
        .collect()
}

/// A failure: the step that broke a promise, and which.
struct Failure {
    step: usize,
    what: String,
}

/// Runs `ops` in a fresh world; the operations it ran and what it went
/// through, or its failure.
fn run(
    ops: &[&Op],
    store: Store,
    budget: Option<usize>,
    seed: u64,
) -> Result<(u64, Seen), Failure> {
    let mut world = World::new(store, budget, seed);
    for (step, op) in ops.iter().enumerate() {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| world.step(op)));
        let what = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(what)) => what,
            Err(panic) => format!(
                "panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            ),
        };
        return Err(Failure { step, what });
    }
    Ok((world.ops, world.seen))
}

/// Drops steps while the run still fails: first everything after the
/// failing step, then chunks of halving size, then single steps.
fn shrink(
    ops: &[Op],
    failing: usize,
    store: Store,
    budget: Option<usize>,
    seed: u64,
) -> Vec<usize> {
    let mut keep: Vec<usize> = (0..=failing).collect();
    let fails = |keep: &[usize]| {
        let sub: Vec<&Op> = keep.iter().map(|&i| &ops[i]).collect();
        run(&sub, store, budget, seed).err()
    };
    let mut chunk = keep.len() / 2;
    while chunk >= 1 {
        let mut at = 0;
        while at < keep.len() {
            let mut tried = keep.clone();
            tried.drain(at..(at + chunk).min(keep.len()));
            match fails(&tried) {
                Some(f) => {
                    tried.truncate(f.step + 1);
                    keep = tried;
                }
                None => at += chunk,
            }
        }
        chunk /= 2;
    }
    keep
}

/// Runs one seed; on failure, shrinks it and panics with the case.
fn seed(seed: u64, steps: usize, keep: Option<Vec<usize>>) -> (u64, Seen) {
    // Odd seeds store through a data directory's storage, played by the
    // world; even seeds in memory, or (one in four of them) on relays
    // sharing a Redis the world plays. Every other seed of the data
    // directory and of memory has a small memory budget: writes are
    // refused at it in memory, and with a data directory sessions are
    // dropped from memory and read back.
    let store = match seed % 8 {
        1 | 3 | 5 | 7 => Store::Durable,
        2 => Store::Shared,
        _ => Store::Memory,
    };
    let budget = match seed % 4 {
        0 => Some(BUDGET),
        1 => Some(EVICT_BUDGET),
        _ => None,
    };
    // Relays sharing a store run fewer steps: each costs more (two relays,
    // the RESP both ways); `SIM_STEPS` sets theirs too.
    let steps = if store == Store::Shared && env_u64("SIM_STEPS").is_none() {
        steps.min(SHARED_STEPS)
    } else {
        steps
    };
    let ops = draw(seed, steps);
    let kept: Vec<usize> = keep.unwrap_or_else(|| (0..ops.len()).collect());
    let chosen: Vec<&Op> = kept.iter().filter_map(|&i| ops.get(i)).collect();
    let failure = match run(&chosen, store, budget, seed) {
        Ok(done) => return done,
        Err(f) => f,
    };
    let failing = kept[failure.step];
    if tracing() {
        TRACE.with(|t| {
            for l in t.borrow().iter() {
                eprintln!("{l}");
            }
        });
        eprintln!("failed: {}", failure.what);
    }
    if std::env::var("SIM_SHRINK").is_ok_and(|v| v == "0") {
        panic!(
            "seed {seed} broke a promise at step {failing}: {}",
            failure.what
        );
    }

    let _ = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let short = shrink(&ops, failing, store, budget, seed);
    let _ = std::panic::take_hook();
    let last = short.iter().map(|&i| &ops[i]).collect::<Vec<_>>();
    let end = run(&last, store, budget, seed).err();
    let mut case = String::new();
    for (n, &i) in short.iter().enumerate() {
        case.push_str(&format!("  {n:>3}. [{i}] {}\n", ops[i]));
    }
    let list = short
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let engine = match (store, budget) {
        (Store::Durable, None) => "data directory".to_string(),
        (Store::Durable, Some(b)) => format!("data directory, a budget of {b} bytes"),
        (Store::Shared, _) => "relays sharing Redis".to_string(),
        (Store::Memory, None) => "memory".to_string(),
        (Store::Memory, Some(b)) => format!("memory, a budget of {b} bytes"),
    };
    panic!(
        "seed {seed} ({engine}) broke a promise at step {failing}: {}\n\
         shrunk to {} steps, failing with: {}\n{case}\
         replay: SIM_SEED={seed} SIM_STEPS={steps} SIM_KEEP={list} cargo test --test sim\n\
         the whole run: SIM_SEED={seed} SIM_STEPS={steps} cargo test --test sim",
        failure.what,
        short.len(),
        end.map_or(
            "(passes shrunk: the failure needs every step)".to_string(),
            |f| f.what
        ),
    );
}

#[test]
fn simulation() {
    let replay = env_u64("SIM_SEED");
    let other_pass = ["TEST_WITH_DATA_DIR", "TEST_WITH_TLS", "TEST_WITH_REDIS"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.is_empty()));
    if other_pass && replay.is_none() {
        eprintln!("simulation: runs in the plain pass only");
        return;
    }
    let steps = env_u64("SIM_STEPS").map_or(STEPS, |n| n as usize);
    let keep = std::env::var("SIM_KEEP").ok().map(|v| {
        v.split(',')
            .filter_map(|i| i.trim().parse().ok())
            .collect::<Vec<usize>>()
    });
    let seeds: Vec<u64> = match replay {
        Some(s) => vec![s],
        None => (1..=env_u64("SIM_SEEDS").unwrap_or(SEEDS)).collect(),
    };
    // Where the store's maps grow, and so the bytes the memory budget
    // counts, follows from their hash keys: fixed ones, so a seed replays
    // to the byte.
    relay::store::idmap::fix_keys_on_this_thread();
    let started = Instant::now();
    let (mut ops, mut seen) = (0, Seen::default());
    for &s in &seeds {
        let (n, s) = seed(s, steps, keep.clone());
        ops += n;
        seen += s;
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "simulation: {} seeds, {} steps, {ops} operations in {secs:.1} s ({:.0} steps and {:.0} operations a minute)",
        seeds.len(),
        seen.steps,
        seen.steps as f64 / secs * 60.0,
        ops as f64 / secs * 60.0
    );
    eprintln!("simulation: {seen:?}");
    // The budget seeds must reach the budget and come back from it, or
    // the refusals stop being checked without anyone noticing.
    if replay.is_none() && keep.is_none() && seeds.iter().any(|s| s.is_multiple_of(4)) {
        assert!(
            seen.over_budget > 0,
            "no write was refused at the memory budget: the budget seeds no longer reach it"
        );
        assert!(
            seen.taken_again > 0,
            "no write was taken again after a refusal at the budget"
        );
    }
    // Likewise the data directory's budget seeds must drop sessions and
    // read them back, and restart the relay.
    if replay.is_none() && keep.is_none() && seeds.iter().any(|s| s % 4 == 1) {
        assert!(
            seen.evicted > 0 && seen.read_back > 0,
            "no session was dropped from memory and read back ({} dropped, {} read): \
             the data directory's budget seeds no longer reach the budget",
            seen.evicted,
            seen.read_back
        );
        assert!(
            seen.read_waits > 0,
            "no read waited for its session to be read back"
        );
        assert!(
            seen.restarts > 0 && seen.start_waits > 0,
            "no all-sessions poll waited for the start's reading after a restart \
             ({} restarts)",
            seen.restarts
        );
    }
    // And the crash seeds must lose the log, and their starts notice.
    if replay.is_none() && keep.is_none() && seeds.iter().any(|s| s % 4 == 3) {
        assert!(
            seen.lost_logs > 0 && seen.new_epochs > 0,
            "no crash lost the write-ahead log and gave a session a new epoch \
             ({} crashes, {} new epochs)",
            seen.lost_logs,
            seen.new_epochs
        );
    }
}
