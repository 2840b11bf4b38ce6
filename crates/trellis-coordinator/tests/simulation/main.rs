//! A deterministic simulation of a Trellis cluster: several coordinators running the real pure
//! turn (`trellis_coordinator::turn`), simulated workers and a simulated NATS, all driven by one
//! seeded generator, with faults at every effect boundary, and the invariants checked after every
//! step (see `world.rs` for the faults and `checks.rs` for the invariants).
//!
//! `cargo test -p trellis-coordinator --test simulation` runs 500 seeds; `TRELLIS_SIM_SEEDS=N`
//! runs N, and `TRELLIS_SIM_SEED=n` runs seed n alone (a failing seed prints the command that
//! replays it exactly).

mod checks;
mod client;
mod nats;
mod node;
mod plans;
mod results;
mod rng;
mod runs;
mod store;
mod worker;
mod world;

use std::time::Instant;

/// A deliberate bug, to show the simulation catches what it claims to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// Results are acknowledged before the events they caused are appended.
    AckBeforeAppend,
    /// The log takes appends that do not follow its last message: no fencing.
    NoFencing,
}

/// Runs one seed; returns the number of steps, or the violation.
fn run_seed(seed: u64, bug: Option<Bug>) -> Result<u64, String> {
    let mut world = world::World::new(seed, bug);
    world
        .run()
        .map(|()| world.steps)
        .map_err(|violation| format!("at step {} ({} ms): {violation}", world.steps, world.now))
}

/// Runs `seeds` on every core; returns the failures.
fn run_seeds(seeds: Vec<u64>, bug: Option<Bug>) -> Vec<(u64, String)> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunks: Vec<Vec<u64>> = (0..threads)
        .map(|t| seeds.iter().copied().skip(t).step_by(threads).collect())
        .collect();
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            std::thread::spawn(move || {
                chunk
                    .into_iter()
                    .filter_map(|seed| run_seed(seed, bug).err().map(|why| (seed, why)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut failures: Vec<(u64, String)> = handles
        .into_iter()
        .flat_map(|handle| handle.join().expect("a simulation thread panicked"))
        .collect();
    failures.sort();
    failures
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

#[test]
fn seeds_keep_every_invariant() {
    let seeds: Vec<u64> = match env_u64("TRELLIS_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_u64("TRELLIS_SIM_SEEDS").unwrap_or(500)).collect(),
    };
    let n_seeds = seeds.len();
    let started = Instant::now();
    let failures = run_seeds(seeds, None);
    eprintln!(
        "simulation: {n_seeds} seeds in {:.1} s, {} appends fenced, {} checkpoints stored, \
         {} recoveries from a checkpoint, {} shards handed over, {} results and {} assignments sent in batches, \
         {} results handed off, {} starts on a reserved id, {} assignments offered and taken, \
         {} refused, {} lost",
        started.elapsed().as_secs_f64(),
        world::FENCED.load(std::sync::atomic::Ordering::Relaxed),
        world::CHECKPOINTS.load(std::sync::atomic::Ordering::Relaxed),
        world::RESTORED.load(std::sync::atomic::Ordering::Relaxed),
        world::HANDOVERS.load(std::sync::atomic::Ordering::Relaxed),
        world::BATCHED.load(std::sync::atomic::Ordering::Relaxed),
        world::ASSIGNMENTS_BATCHED.load(std::sync::atomic::Ordering::Relaxed),
        world::HANDED_OFF.load(std::sync::atomic::Ordering::Relaxed),
        world::RESERVED_STARTS.load(std::sync::atomic::Ordering::Relaxed),
        world::OFFERS_TAKEN.load(std::sync::atomic::Ordering::Relaxed),
        world::OFFERS_REFUSED.load(std::sync::atomic::Ordering::Relaxed),
        world::OFFERS_LOST.load(std::sync::atomic::Ordering::Relaxed)
    );
    if let Some((seed, why)) = failures.first() {
        panic!(
            "{} of {n_seeds} seeds broke an invariant; the first, seed {seed}, {why}\n\
             replay it with: TRELLIS_SIM_SEED={seed} cargo test -p trellis-coordinator --test simulation",
            failures.len()
        );
    }
}

/// Acknowledging results before their events are stored loses them when the coordinator
/// crashes in between: the simulation must notice.
#[test]
fn acking_before_the_append_is_caught() {
    let failures = run_seeds((0..200).collect(), Some(Bug::AckBeforeAppend));
    assert!(
        !failures.is_empty(),
        "200 seeds with results acknowledged before their append found nothing"
    );
    eprintln!(
        "ack before append: {} of 200 seeds caught it, e.g. seed {}: {}",
        failures.len(),
        failures[0].0,
        failures[0].1
    );
}

/// Without fencing, a stale coordinator extends a log another one extends too.
#[test]
fn appends_without_fencing_are_caught() {
    let failures = run_seeds((0..200).collect(), Some(Bug::NoFencing));
    assert!(
        !failures.is_empty(),
        "200 seeds with appends that are not fenced found nothing"
    );
    eprintln!(
        "no fencing: {} of 200 seeds caught it, e.g. seed {}: {}",
        failures.len(),
        failures[0].0,
        failures[0].1
    );
}
