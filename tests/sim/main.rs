//! Every interleaving, seeded: the real API rules, relay core, store and
//! engine run in one process under a simulated world (clients, sockets,
//! a virtual clock, and for a data directory the storage thread, whose
//! commits come late, batched or rolled back: `world/storage.rs`), and a
//! model checks every promise after every step (`world.rs`,
//! `model.rs`): each request answered once (by its ticket, when it
//! waited for the storage) with its own command's outcome,
//! acknowledged writes present and refused ones absent, `seq` gapless
//! per epoch, every subscriber's frames in order with no gap and no
//! duplicate unless a `resync` says so, pending sets as the model has
//! them, sessions collected by the clock's TTL and no earlier. With a
//! data directory and a small budget, sessions leave memory at the end
//! of each step and are read back on their next use
//! (`world/resident.rs`): a session known by id only must be held by
//! nothing and be, in the storage, what the model has. Those seeds also
//! restart the relay now and then on the storage it had, which reads no
//! session at start.
//!
//! A run is a seed: the steps are drawn from it (`ops.rs`), so a seed
//! replays the same run anywhere. The fixed seeds run by default;
//! `SIM_SEED=<seed>` runs one, `SIM_SEEDS=<n>` the first `n`,
//! `SIM_STEPS=<n>` sets the steps of each. A failing run is shrunk (its
//! steps dropped while it still fails) to a short case, printed with the
//! command that replays it (`SIM_SEED=<seed> SIM_KEEP=<steps kept>`).
//!
//! The suite runs once more with a data directory, over TLS and against
//! Redis (`TEST_WITH_*`): none of those changes what runs here, so the
//! simulation runs in the plain pass only.

mod model;
mod ops;
mod world;

use std::time::Instant;

use ops::{Op, Rng};
use world::{BUDGET, EVICT_BUDGET, Seen, World};

/// The seeds CI runs (even ones in memory, odd ones with a data
/// directory), and the steps of each.
const SEEDS: u64 = 500;
const STEPS: usize = 5_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The steps of seed `seed`: those of the data directory's budget seeds
/// spread over more sessions, so that some are idle and leave memory.
fn draw(seed: u64, steps: usize) -> Vec<Op> {
    let mut rng = Rng::new(seed);
    let mut spread = Rng::new(!seed);
    (0..steps)
        .map(|_| Op::draw(&mut rng))
        .map(|op| match seed % 4 {
            1 => op.spread(&mut spread),
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
fn run(ops: &[&Op], durable: bool, budget: Option<usize>) -> Result<(u64, Seen), Failure> {
    let mut world = World::new(durable, budget);
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
fn shrink(ops: &[Op], failing: usize, durable: bool, budget: Option<usize>) -> Vec<usize> {
    let mut keep: Vec<usize> = (0..=failing).collect();
    let fails = |keep: &[usize]| {
        let sub: Vec<&Op> = keep.iter().map(|&i| &ops[i]).collect();
        run(&sub, durable, budget).err()
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
    let ops = draw(seed, steps);
    // Odd seeds store through a data directory's storage, played by the
    // world; even seeds in memory. Every other seed of each has a small
    // memory budget: writes are refused at it in memory, and with a data
    // directory sessions are dropped from memory and read back.
    let durable = seed % 2 == 1;
    let budget = match seed % 4 {
        0 => Some(BUDGET),
        1 => Some(EVICT_BUDGET),
        _ => None,
    };
    let kept: Vec<usize> = keep.unwrap_or_else(|| (0..ops.len()).collect());
    let chosen: Vec<&Op> = kept.iter().filter_map(|&i| ops.get(i)).collect();
    let failure = match run(&chosen, durable, budget) {
        Ok(done) => return done,
        Err(f) => f,
    };
    let failing = kept[failure.step];
    let _ = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let short = shrink(&ops, failing, durable, budget);
    let _ = std::panic::take_hook();
    let last = short.iter().map(|&i| &ops[i]).collect::<Vec<_>>();
    let end = run(&last, durable, budget).err();
    let mut case = String::new();
    for (n, &i) in short.iter().enumerate() {
        case.push_str(&format!("  {n:>3}. [{i}] {}\n", ops[i]));
    }
    let list = short
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let engine = match (durable, budget) {
        (true, None) => "data directory".to_string(),
        (true, Some(b)) => format!("data directory, a budget of {b} bytes"),
        (false, None) => "memory".to_string(),
        (false, Some(b)) => format!("memory, a budget of {b} bytes"),
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
}
