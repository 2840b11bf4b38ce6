//! One task at a time: `latency` (idle, with where each task's time went, hop by hop) and
//! `loaded` (the same while `throughput` executions run in the same process).

use std::ops::Range;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_telemetry::hops::{self, Path};

use super::{Fields, ONE_TASK, percentile, round, run_one, run_one_split, throughput_plan};

/// One task's path through the services, as the marks of [`trellis_telemetry::hops`] name its
/// points: each hop runs from the previous point to its own.
const ONE_TASK_PATH: Path<'static> = Path::joined(
    &[
        // The client's StartExecution call reaches the coordinator's handler.
        ("submit", "coordinator.received"),
        // The plan is compiled and the request reaches the coordinator's loop.
        ("prepare", "coordinator.request"),
        // A turn decides the new execution's first events.
        ("decide", "coordinator.appending"),
    ],
    FROM_INDEX,
);

/// A new execution's way from its first turn to its caller: the hops [`ONE_TASK_PATH`] and
/// [`LOADED_PATH`] share.
const FROM_INDEX: &[(&str, &str)] = &[
    // Its index entry is stored.
    ("index", "coordinator.indexed"),
    // Its first events are stored in its log.
    ("append", "coordinator.appended"),
    // The effects of the append up to the assignment's publish.
    ("dispatch", "coordinator.dispatched"),
    // JetStream stores the assignment and a worker's pull delivers it.
    ("fetch", "worker.received"),
    // The worker reads it and starts the handler.
    ("start", "worker.started"),
    ("handler", "worker.handled"),
    // The output is stored and the result queued for the worker's publisher.
    ("result", "worker.result_sent"),
    // JetStream stores the result and the coordinator's consumer delivers it.
    ("consume", "coordinator.consumed"),
    // The loop takes it into its next turn (after the turn in progress).
    ("take", "coordinator.taken"),
    // The turn decides the execution's last events.
    ("decide_result", "coordinator.appending"),
    // They are stored in its log.
    ("append_result", "coordinator.appended"),
    // What the append allows, up to the end handed to the observers' channels.
    ("notify", "coordinator.observed"),
    // The observer's stream carries the end to the caller.
    ("observe", "bench.ended"),
    // The stream closes (its trailers reach the caller).
    ("close", "bench.done"),
];

/// One hop of a chain, from the coordinator consuming a task's result to its consuming the next
/// task's: the same points as the second half of [`ONE_TASK_PATH`], then the first's dispatch.
const CHAIN_HOP_PATH: Path<'static> = Path::new(&[
    // The loop takes the result into its next turn.
    ("take", "coordinator.taken"),
    // The turn decides the next task's dispatch.
    ("decide_result", "coordinator.appending"),
    // The result and the dispatch are stored in the log.
    ("append_result", "coordinator.appended"),
    // The effects of the append up to the assignment's publish.
    ("dispatch", "coordinator.dispatched"),
    ("fetch", "worker.received"),
    ("start", "worker.started"),
    ("handler", "worker.handled"),
    ("result", "worker.result_sent"),
    ("consume", "coordinator.consumed"),
]);

/// One task's path under load, as a trace that watches its execution sees it: the marks of the
/// services' points that know their execution (`coordinator.request` and the gRPC handler's do
/// not), between two the bench makes itself.
const LOADED_PATH: Path<'static> = Path::joined(
    // From the call to the turn that decides the execution's first events: the `submit`,
    // `prepare` and `decide` hops of [`ONE_TASK_PATH`], and the wait for the turn in progress.
    &[("until_turn", "coordinator.appending")],
    FROM_INDEX,
);

/// Where a chain's hops went, over every hop the trace holds whole: the median of each part of
/// [`CHAIN_HOP_PATH`] and its mean, in path order, and how many hops that was. `per_hop_ms` is a
/// mean, which the slow hops raise; the parts' means add up to the mean hop, their medians to
/// less.
pub(super) fn chain_hops(trace: &[(&'static str, Instant)]) -> ChainHops {
    let mut splits: Vec<Vec<f64>> = vec![Vec::new(); CHAIN_HOP_PATH.names().count()];
    let mut whole = 0;
    for (at, (point, _)) in trace.iter().enumerate() {
        if *point != "coordinator.consumed" {
            continue;
        }
        if let Some(split) = CHAIN_HOP_PATH.split("coordinator.consumed", &trace[at..]) {
            whole += 1;
            for (hop, (_, took)) in splits.iter_mut().zip(split) {
                hop.push(took.as_secs_f64() * 1e6);
            }
        }
    }
    let means = CHAIN_HOP_PATH
        .names()
        .zip(&splits)
        .map(|(name, took)| {
            let mean = took.iter().sum::<f64>() / took.len().max(1) as f64;
            json!([name, round(mean, 0)])
        })
        .collect();
    ChainHops {
        medians: medians(CHAIN_HOP_PATH, &mut splits),
        means: Value::Array(means),
        whole,
    }
}

/// [`chain_hops`]'s answer.
pub(super) struct ChainHops {
    /// `[name, µs]` pairs: the median of each part.
    pub(super) medians: Value,
    /// `[name, µs]` pairs: the mean of each part.
    pub(super) means: Value,
    /// The hops seen whole.
    pub(super) whole: usize,
}

/// The median of each hop's samples, as `[name, µs]` pairs in path order.
fn medians(path: Path<'static>, splits: &mut [Vec<f64>]) -> Value {
    let hops: Vec<Value> = path
        .names()
        .zip(splits)
        .map(|(name, took)| {
            took.sort_by(f64::total_cmp);
            json!([name, round(percentile(took, 0.5), 0)])
        })
        .collect();
    Value::Array(hops)
}

/// `n` one-task executions, one after the other: percentiles of their latency, the median of
/// each hop of [`ONE_TASK_PATH`] (`hop_p50_us`, in path order), and the same over the samples at
/// or above the 95th percentile (`hop_tail_us`): where the slow twentieth's time went.
pub(super) async fn latency(
    client: CoordinatorClient<Channel>,
    n: usize,
) -> Result<Fields, String> {
    let mut samples = Vec::with_capacity(n);
    // Each split sample: its latency (ms) and its hops (µs), in path order.
    let mut split_samples: Vec<(f64, Vec<f64>)> = Vec::with_capacity(n);
    for _ in 0..n {
        hops::start();
        hops::mark("bench.submit");
        let took = run_one(client.clone(), ONE_TASK.to_owned()).await;
        hops::mark("bench.done");
        let trace = hops::take();
        let took = took?.as_secs_f64() * 1000.0;
        samples.push(took);
        if let Some(split) = ONE_TASK_PATH.split("bench.submit", &trace) {
            let hops = split
                .into_iter()
                .map(|(_, hop)| hop.as_secs_f64() * 1e6)
                .collect();
            split_samples.push((took, hops));
        }
    }
    samples.sort_by(f64::total_cmp);
    let unsplit = samples.len() - split_samples.len();
    let p95 = percentile(&samples, 0.95);
    let (hops, tail) = hop_splits(ONE_TASK_PATH, &split_samples, p95);
    Ok(vec![
        ("p50_ms", json!(round(percentile(&samples, 0.50), 3))),
        ("p95_ms", json!(round(p95, 3))),
        ("p99_ms", json!(round(percentile(&samples, 0.99), 3))),
        ("hop_p50_us", json!(hops)),
        ("hop_tail_us", json!(tail)),
        ("unsplit", json!(unsplit)),
    ])
}

/// The median of each hop of `path` over every split sample, and over those whose latency is at
/// least `p95` (ms).
fn hop_splits(path: Path<'static>, split_samples: &[(f64, Vec<f64>)], p95: f64) -> (Value, Value) {
    let all = hop_medians(path, split_samples.iter());
    let tail = hop_medians(path, split_samples.iter().filter(|(took, _)| *took >= p95));
    (all, tail)
}

/// The median of each hop of `path` over the given split samples, as `[name, µs]` pairs in path
/// order.
fn hop_medians<'a>(
    path: Path<'static>,
    samples: impl Iterator<Item = &'a (f64, Vec<f64>)>,
) -> Value {
    let mut splits: Vec<Vec<f64>> = vec![Vec::new(); path.names().count()];
    for (_, hops) in samples {
        for (split, took) in splits.iter_mut().zip(hops) {
            split.push(*took);
        }
    }
    medians(path, &mut splits)
}

/// A sample's hops along [`LOADED_PATH`] (µs), from the marks of the trace that watched it,
/// between the call made at `submitted` and its end seen at `done`.
fn loaded_split(
    mut trace: Vec<(&'static str, Instant)>,
    submitted: Instant,
    done: Instant,
) -> Option<Vec<f64>> {
    trace.insert(0, ("bench.submit", submitted));
    trace.push(("bench.done", done));
    let split = LOADED_PATH.split("bench.submit", &trace)?;
    Some(
        split
            .into_iter()
            .map(|(_, hop)| hop.as_secs_f64() * 1e6)
            .collect(),
    )
}

/// Tasks of each background `throughput` execution of `loaded`.
const LOAD_TASKS: usize = 20_000;
/// How long `loaded` samples at most: without a dispatch window each sample can wait for a whole
/// load execution, and 1,000 of them would take most of an hour.
const LOADED_FOR_AT_MOST: Duration = Duration::from_secs(60);

/// `n` one-task executions, one after the other, while `throughput` executions of
/// [`LOAD_TASKS`] tasks run back to back in the same process: their latency percentiles, how
/// many were taken (`samples`: fewer than `n` when [`LOADED_FOR_AT_MOST`] ran out), the same
/// over the samples taken while a load execution ran its tasks (`running_*`, see [`within`]),
/// the background's rate, and where a sample's time went: the median of each hop of
/// [`LOADED_PATH`] (`hop_p50_us`) and the same over the samples at or above the 95th percentile
/// (`hop_tail_us`), from a trace that watches each sample's execution (`unsplit`: samples whose
/// trace watched a load execution started at the same moment, or missed a point).
pub(super) async fn loaded(client: CoordinatorClient<Channel>, n: usize) -> Result<Fields, String> {
    let stop = CancellationToken::new();
    let load = tokio::spawn({
        let client = client.clone();
        let stop = stop.clone();
        async move {
            // Written once: the bench's own work runs on the services' thread (a runtime of
            // one core), and a load's client in a process of its own would not be measured.
            let plan = throughput_plan(LOAD_TASKS);
            let start = Instant::now();
            let mut tasks = 0;
            let mut running = Vec::new();
            while !stop.is_cancelled() {
                let called = Instant::now();
                let (_, named, took) = run_one_split(client.clone(), plan.clone()).await?;
                running.push(called + named..called + took);
                tasks += LOAD_TASKS;
            }
            Ok::<_, String>((tasks, start.elapsed(), running))
        }
    });
    // Let the first load execution get going before sampling.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut samples = Vec::with_capacity(n);
    let mut answered = Vec::with_capacity(n);
    let mut split_samples: Vec<(f64, Vec<f64>)> = Vec::with_capacity(n);
    let mut spans: Vec<(Range<Instant>, f64)> = Vec::with_capacity(n);
    let mut failure = None;
    let sampling = Instant::now();
    while samples.len() < n && sampling.elapsed() < LOADED_FOR_AT_MOST {
        hops::watch();
        let submitted = Instant::now();
        let sample = run_one_split(client.clone(), ONE_TASK.to_owned()).await;
        let done = Instant::now();
        let watched = sample
            .as_ref()
            .is_ok_and(|(id, _, _)| hops::id_bits(id).is_some_and(hops::watches));
        let trace = hops::take();
        match sample {
            Ok((_, started, took)) => {
                let took = took.as_secs_f64() * 1000.0;
                answered.push(started.as_secs_f64() * 1000.0);
                samples.push(took);
                spans.push((submitted..done, took));
                if let Some(hops) = watched
                    .then(|| loaded_split(trace, submitted, done))
                    .flatten()
                {
                    split_samples.push((took, hops));
                }
            }
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    stop.cancel();
    let (tasks, took, running) = load.await.map_err(|e| format!("the load failed: {e}"))??;
    if let Some(error) = failure {
        return Err(error);
    }
    let mut while_running = within(&spans, &running);
    while_running.sort_by(f64::total_cmp);
    samples.sort_by(f64::total_cmp);
    answered.sort_by(f64::total_cmp);
    let unsplit = samples.len() - split_samples.len();
    let (hops, tail) = hop_splits(LOADED_PATH, &split_samples, percentile(&samples, 0.95));
    Ok(vec![
        ("samples", json!(samples.len())),
        (
            "started_p50_ms",
            json!(round(percentile(&answered, 0.50), 3)),
        ),
        (
            "started_p99_ms",
            json!(round(percentile(&answered, 0.99), 3)),
        ),
        ("p50_ms", json!(round(percentile(&samples, 0.50), 3))),
        ("p99_ms", json!(round(percentile(&samples, 0.99), 3))),
        ("p999_ms", json!(round(percentile(&samples, 0.999), 3))),
        ("max_ms", json!(round(percentile(&samples, 1.0), 3))),
        ("running_samples", json!(while_running.len())),
        ("running_p50_ms", percentile_field(&while_running, 0.50)),
        ("running_p99_ms", percentile_field(&while_running, 0.99)),
        (
            "load_tasks_per_s",
            json!(round(tasks as f64 / took.as_secs_f64(), 0)),
        ),
        ("hop_p50_us", hops),
        ("hop_tail_us", tail),
        ("unsplit", json!(unsplit)),
    ])
}

/// The latencies (ms) of the samples whose whole span, from the call to the end seen, fell
/// within one of the load executions' `running` spans (from `RunExecution` naming it, its start
/// stored, to its end seen): under the load proper, and not while the next load execution's
/// plan of [`LOAD_TASKS`] tasks was compiled and its start stored, when nothing of the load
/// runs. Both lists are in time order.
fn within(samples: &[(Range<Instant>, f64)], running: &[Range<Instant>]) -> Vec<f64> {
    let mut load = running.iter().peekable();
    samples
        .iter()
        .filter(|(span, _)| {
            while load.next_if(|run| run.end < span.end).is_some() {}
            load.peek()
                .is_some_and(|run| run.start <= span.start && span.end <= run.end)
        })
        .map(|(_, took)| *took)
        .collect()
}

/// A percentile (ms) of `sorted` as a field: `null` when there are no samples.
fn percentile_field(sorted: &[f64], q: f64) -> Value {
    if sorted.is_empty() {
        Value::Null
    } else {
        json!(round(percentile(sorted, q), 3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twenty samples of 1..=20 ms whose first hop is a hundred times their latency (µs) and
    /// every other hop 1 µs more than its place in the path.
    fn samples() -> Vec<(f64, Vec<f64>)> {
        let n_hops = ONE_TASK_PATH.names().count();
        (1..=20)
            .map(|ms| {
                let took = f64::from(ms);
                let mut hops = vec![took * 100.0];
                hops.extend((1..n_hops).map(|at| at as f64 + 1.0));
                (took, hops)
            })
            .collect()
    }

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    /// A sample counts as under load only when its whole span lies within one load execution's
    /// running span: not across the gap between two, not before the first or after the last.
    #[test]
    fn samples_within_a_running_load_are_told_apart() {
        let t = Instant::now();
        let running = [at(t, 10)..at(t, 20), at(t, 30)..at(t, 40)];
        let samples = [
            (at(t, 0)..at(t, 5), 1.0),   // before the first
            (at(t, 9)..at(t, 11), 2.0),  // across its start
            (at(t, 10)..at(t, 12), 3.0), // within the first
            (at(t, 19)..at(t, 20), 4.0), // within, to its end
            (at(t, 19)..at(t, 31), 5.0), // across the gap
            (at(t, 25)..at(t, 28), 6.0), // in the gap
            (at(t, 31)..at(t, 39), 7.0), // within the second
            (at(t, 39)..at(t, 41), 8.0), // across its end
            (at(t, 50)..at(t, 51), 9.0), // after the last
        ];
        assert_eq!(within(&samples, &running), vec![3.0, 4.0, 7.0]);
        assert!(within(&samples, &[]).is_empty(), "no load ran: none");
    }

    #[test]
    fn a_percentile_of_no_samples_is_null() {
        assert_eq!(percentile_field(&[], 0.99), Value::Null);
        assert_eq!(percentile_field(&[1.0, 2.0, 3.0], 0.5), json!(2.0));
    }

    #[test]
    fn the_tail_holds_only_the_samples_at_or_above_the_95th_percentile() {
        let (all, tail) = hop_splits(ONE_TASK_PATH, &samples(), 18.0);
        // Every sample: the first hop's median is the 11th sample's (1,100 µs), the middle of
        // twenty rounding up.
        assert_eq!(all[0], json!(["submit", 1100.0]));
        // The tail: the 18, 19 and 20 ms samples, whose median is the 19 ms one.
        assert_eq!(tail[0], json!(["submit", 1900.0]));
        assert_eq!(tail[1], json!(["prepare", 2.0]));
        let names: Vec<&str> = ONE_TASK_PATH.names().collect();
        let tail_names: Vec<&str> = tail
            .as_array()
            .map(|hops| hops.iter().filter_map(|hop| hop[0].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(tail_names, names, "every hop, in path order");
    }

    #[test]
    fn no_sample_in_the_tail_gives_zeros_not_a_panic() {
        let (_, tail) = hop_splits(ONE_TASK_PATH, &samples(), 21.0);
        assert_eq!(tail[0], json!(["submit", 0.0]));
    }

    /// The points of [`LOADED_PATH`] but the bench's own, 10 µs apart from `at`.
    fn loaded_marks(at: Instant) -> Vec<(&'static str, Instant)> {
        let points = [
            "coordinator.appending",
            "coordinator.indexed",
            "coordinator.appended",
            "coordinator.dispatched",
            "worker.received",
            "worker.started",
            "worker.handled",
            "worker.result_sent",
            "coordinator.consumed",
            "coordinator.taken",
            "coordinator.appending",
            "coordinator.appended",
            "coordinator.observed",
            "bench.ended",
        ];
        (1..)
            .zip(points)
            .map(|(i, point)| (point, at + Duration::from_micros(10 * i)))
            .collect()
    }

    #[test]
    fn a_watched_sample_splits_between_the_benchs_own_marks() {
        let submitted = Instant::now();
        let marks = loaded_marks(submitted);
        let done = submitted + Duration::from_micros(1_000);
        let split = loaded_split(marks, submitted, done).expect("every point was reached");
        let mut expected = vec![10.0; LOADED_PATH.names().count() - 1];
        // The end seen at 140 µs, the close at 1,000.
        expected.push(860.0);
        let rounded: Vec<f64> = split.iter().map(|us| us.round()).collect();
        assert_eq!(rounded, expected);
    }

    #[test]
    fn a_sample_that_missed_a_point_is_not_split() {
        let submitted = Instant::now();
        let mut marks = loaded_marks(submitted);
        marks.retain(|(point, _)| *point != "coordinator.taken");
        let done = submitted + Duration::from_micros(1_000);
        assert_eq!(loaded_split(marks, submitted, done), None);
    }
}
