//! The coordinator's metrics (Prometheus names; counters are scraped with `_total`):
//!
//! - `trellis_tasks_dispatched`, `trellis_tasks_completed`, `trellis_tasks_failed`,
//!   `trellis_tasks_lost` by `queue` and `type`: task attempts sent to workers, and the outcomes
//!   the state machine applied (a failed attempt counts whatever its retry does next);
//! - `trellis_task_offers` by `queue` and `answer` (`taken`, `busy`, `no_worker`, `unanswered`,
//!   `paused`): fast-lane assignments offered to idle workers and how each offer ended (`paused`:
//!   sent to the stream unoffered while the queue's offers pause after a `no_worker`);
//! - `trellis_task_dispatch_latency_seconds` by `queue`: from an instance becoming ready to its
//!   first assignment being sent to the queue (seed 003's "task dispatch", goal p95 < 50 ms;
//!   concurrency limits and file conflicts count in it); the workers measure the wait in the
//!   queue after it (`trellis_task_queue_wait_seconds`);
//! - `trellis_queue_depth` and `trellis_queue_in_flight` by `queue`: task messages waiting on
//!   `trellis.tasks.<queue>` and delivered but not yet done, read from JetStream every 5 s;
//! - `trellis_appends_refused`: appends refused because another coordinator wrote the log since.
//! - `trellis_events_appended` and `trellis_event_append_seconds`: events written to the logs and
//!   the time each flush's appends took;
//! - `trellis_coordinator_turn_seconds` by `phase` (decide, append, effects): where each turn of
//!   the coordinator's loop spends its time;
//! - `trellis_checkpoint_seconds` and `trellis_checkpoint_size_bytes` by `kind` (full, delta),
//!   `trellis_checkpoint_failures`;
//! - `trellis_workers_alive` and `trellis_worker_missed_heartbeats`;
//! - `trellis_executions_started` by `namespace`, `trellis_executions_finished` by `namespace` and
//!   `state`, `trellis_executions_live` (in this coordinator's memory),
//!   `trellis_executions_forgotten` (finished ones that left memory after `--keep-finished`);
//! - `trellis_results_set_aside` by `reason`: result messages that could not be applied;
//! - `trellis_circuit_breaker_state` by `queue` and `type` (0 closed, 1 half open, 2 open) and
//!   `trellis_circuit_breaker_transitions` by `queue`, `type` and `to`.
//!
//! Each is counted where the log line or the state change happens, never from a replay.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt as _;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio_util::sync::CancellationToken;
use trellis_proto::subjects;
use trellis_telemetry::Registry;
use trellis_telemetry::metrics::{
    HistogramFamily, Labels1, Labels2, Labels3, latency_buckets, latency_family, size_family,
};

/// How often queue depths are read from JetStream.
const QUEUE_POLL: Duration = Duration::from_secs(5);

/// The coordinator's metric families; cheap to clone (each family is shared).
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    pub(crate) dispatched: Family<Labels2, Counter>,
    pub(crate) completed: Family<Labels2, Counter>,
    pub(crate) failed: Family<Labels2, Counter>,
    pub(crate) lost: Family<Labels2, Counter>,
    pub(crate) offers: Family<Labels2, Counter>,
    pub(crate) dispatch_latency: HistogramFamily<Labels1>,
    pub(crate) queue_depth: Family<Labels1, Gauge>,
    pub(crate) queue_in_flight: Family<Labels1, Gauge>,
    pub(crate) events_appended: Counter,
    pub(crate) appends_refused: Counter,
    pub(crate) append_seconds: Histogram,
    /// `trellis_coordinator_turn_seconds` of the phases decide, append and effects, resolved
    /// once: the loop records them every turn.
    pub(crate) turn_seconds: [Histogram; 3],
    pub(crate) checkpoint_seconds: HistogramFamily<Labels1>,
    pub(crate) checkpoint_bytes: HistogramFamily<Labels1>,
    pub(crate) checkpoint_failures: Counter,
    pub(crate) workers_alive: Gauge,
    pub(crate) missed_heartbeats: Counter,
    pub(crate) executions_started: Family<Labels1, Counter>,
    pub(crate) executions_finished: Family<Labels2, Counter>,
    pub(crate) executions_live: Gauge,
    pub(crate) executions_needing_attention: Gauge,
    pub(crate) executions_forgotten: Counter,
    pub(crate) results_set_aside: Family<Labels1, Counter>,
    pub(crate) breaker_state: Family<Labels2, Gauge>,
    pub(crate) breaker_transitions: Family<Labels3, Counter>,
}

impl Metrics {
    /// Registers the families in `registry` (or finds them there).
    pub(crate) fn new(registry: &Registry) -> Self {
        Self {
            breaker_state: registry.metric(
                "trellis_circuit_breaker_state",
                "Circuit breaker of a queue and task type: 0 closed, 1 half open (one probe), \
                 2 open (dispatches wait).",
                Family::default,
            ),
            breaker_transitions: registry.metric(
                "trellis_circuit_breaker_transitions",
                "Circuit breaker state changes, by queue, task type and the state entered.",
                Family::default,
            ),
            offers: registry.metric(
                "trellis_task_offers",
                "Fast-lane assignments offered to an idle worker, by queue and how the offer \
                 ended: taken, busy, no_worker, unanswered, or paused (not offered).",
                Family::default,
            ),
            dispatched: registry.metric(
                "trellis_tasks_dispatched",
                "Task attempts published to a worker queue, by queue and task type.",
                Family::default,
            ),
            completed: registry.metric(
                "trellis_tasks_completed",
                "Task attempts that completed, by queue and task type.",
                Family::default,
            ),
            failed: registry.metric(
                "trellis_tasks_failed",
                "Task attempts that failed (timed out included), by queue and task type.",
                Family::default,
            ),
            lost: registry.metric(
                "trellis_tasks_lost",
                "Task attempts whose worker fell silent, by queue and task type.",
                Family::default,
            ),
            dispatch_latency: registry.metric(
                "trellis_task_dispatch_latency_seconds",
                "From a task instance becoming ready to its first assignment being sent, by queue.",
                latency_family,
            ),
            queue_depth: registry.metric(
                "trellis_queue_depth",
                "Task messages waiting on trellis.tasks.<queue> for a worker, by queue.",
                Family::default,
            ),
            queue_in_flight: registry.metric(
                "trellis_queue_in_flight",
                "Task messages delivered to workers and not yet done, by queue.",
                Family::default,
            ),
            events_appended: registry.metric(
                "trellis_events_appended",
                "Events appended to execution logs.",
                Counter::default,
            ),
            appends_refused: registry.metric(
                "trellis_appends_refused",
                "Appends JetStream refused because another coordinator had written the log since \
                 (this one lost the execution: it reads it again, or drops it with its shard).",
                Counter::default,
            ),
            append_seconds: registry.metric(
                "trellis_event_append_seconds",
                "Time to append one flush's events to the logs and have them stored.",
                latency_buckets,
            ),
            turn_seconds: {
                let family: HistogramFamily<Labels1> = registry.metric(
                    "trellis_coordinator_turn_seconds",
                    "Time one turn of the coordinator's loop spent in each phase: decide (the \
                     pure turn and, after the appends, what they allow), append (the log appends \
                     and index writes) and effects (assignments sent, results acknowledged, \
                     answers); a turn of the timer alone is not counted.",
                    latency_family,
                );
                TurnPhase::ALL.map(|phase| {
                    family
                        .get_or_create(&[("phase", phase.name().to_owned())])
                        .clone()
                })
            },
            checkpoint_seconds: registry.metric(
                "trellis_checkpoint_seconds",
                "Time to create a checkpoint: checksum and the checkpoint-store's write, by kind.",
                latency_family,
            ),
            checkpoint_bytes: registry.metric(
                "trellis_checkpoint_size_bytes",
                "Size of the checkpoints stored, by kind.",
                size_family,
            ),
            checkpoint_failures: registry.metric(
                "trellis_checkpoint_failures",
                "Checkpoints the checkpoint-store did not take.",
                Counter::default,
            ),
            workers_alive: registry.metric(
                "trellis_workers_alive",
                "Workers whose heartbeats arrive (not declared terminated).",
                Gauge::default,
            ),
            missed_heartbeats: registry.metric(
                "trellis_worker_missed_heartbeats",
                "Heartbeat intervals that passed without a worker's heartbeat.",
                Counter::default,
            ),
            executions_started: registry.metric(
                "trellis_executions_started",
                "Executions started, by namespace.",
                Family::default,
            ),
            executions_finished: registry.metric(
                "trellis_executions_finished",
                "Executions (runs) that ended, by namespace and final state.",
                Family::default,
            ),
            executions_live: registry.metric(
                "trellis_executions_live",
                "Executions held in this coordinator's memory.",
                Gauge::default,
            ),
            executions_needing_attention: registry.metric(
                "trellis_executions_needing_attention",
                "Executions of this coordinator's shards whose log does not replay: held, \
                 nothing dispatched, until the log is repaired (`trellis status` names the \
                 sequence).",
                Gauge::default,
            ),
            executions_forgotten: registry.metric(
                "trellis_executions_forgotten",
                "Finished executions that left this coordinator's memory after --keep-finished.",
                Counter::default,
            ),
            results_set_aside: registry.metric(
                "trellis_results_set_aside",
                "Task result messages that could not be applied, by reason.",
                Family::default,
            ),
        }
    }

    /// Records how long one turn of the loop spent in `phase`.
    pub(crate) fn turn_phase(&self, phase: TurnPhase, took: Duration) {
        self.turn_seconds[phase as usize].observe(took.as_secs_f64());
    }

    /// Counts one offer of `queue`'s that ended with `answer`.
    pub(crate) fn offer(&self, queue: &str, answer: &'static str) {
        self.offers
            .get_or_create(&[("queue", queue.to_owned()), ("answer", answer.to_owned())])
            .inc();
    }

    pub(crate) fn set_aside(&self, reason: &'static str) {
        self.results_set_aside
            .get_or_create(&[("reason", reason.to_owned())])
            .inc();
    }
}

/// A phase of one turn of the coordinator's loop, as `trellis_coordinator_turn_seconds` labels it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TurnPhase {
    Decide,
    Append,
    Effects,
}

impl TurnPhase {
    const ALL: [Self; 3] = [Self::Decide, Self::Append, Self::Effects];

    fn name(self) -> &'static str {
        match self {
            Self::Decide => "decide",
            Self::Append => "append",
            Self::Effects => "effects",
        }
    }
}

/// Returns the label pair of a task's queue and type.
pub(crate) fn task_labels(queue: &str, task_type: &str) -> Labels2 {
    [("queue", queue.to_owned()), ("type", task_type.to_owned())]
}

/// Reads the depth of every task queue from JetStream every [`QUEUE_POLL`] until `stop`.
pub(crate) async fn watch_queues(
    tasks: async_nats::jetstream::stream::Stream,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut known: HashSet<String> = HashSet::new();
    let mut tick = tokio::time::interval(QUEUE_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match read_queues(&tasks).await {
            Ok(queues) => {
                for (queue, (waiting, in_flight)) in &queues {
                    let labels = [("queue", queue.clone())];
                    metrics.queue_depth.get_or_create(&labels).set(*waiting);
                    metrics
                        .queue_in_flight
                        .get_or_create(&labels)
                        .set(*in_flight);
                    known.insert(queue.clone());
                }
                // A queue that emptied has no subject left: it shows 0, not its last depth.
                for queue in &known {
                    if !queues.contains_key(queue) {
                        let labels = [("queue", queue.clone())];
                        metrics.queue_depth.get_or_create(&labels).set(0);
                        metrics.queue_in_flight.get_or_create(&labels).set(0);
                    }
                }
            }
            Err(err) => tracing::debug!(%err, "cannot read the task queues' depth"),
        }
    }
}

/// Returns `(waiting, in flight)` per queue: messages stored on each queue's subject (work-queue
/// retention keeps a message until it is acknowledged) less those its consumer delivered and
/// awaits an acknowledgement for.
async fn read_queues(
    tasks: &async_nats::jetstream::stream::Stream,
) -> Result<std::collections::HashMap<String, (i64, i64)>, String> {
    let mut queues = std::collections::HashMap::new();
    let mut subjects_info = tasks
        .info_with_subjects(subjects::TASKS_WILDCARD)
        .await
        .map_err(|err| err.to_string())?;
    while let Some(entry) = subjects_info.next().await {
        let (subject, stored) = entry.map_err(|err| err.to_string())?;
        if let Some(queue) = subject.strip_prefix(&format!("{}.", subjects::TASKS_PREFIX)) {
            queues.insert(queue.to_owned(), (stored as i64, 0));
        }
    }
    let mut consumers = tasks.consumers();
    while let Some(info) = consumers.next().await {
        let info = info.map_err(|err| err.to_string())?;
        let Some(queue) = info
            .config
            .filter_subject
            .strip_prefix(&format!("{}.", subjects::TASKS_PREFIX))
        else {
            continue;
        };
        let in_flight = info.num_ack_pending as i64;
        let entry = queues.entry(queue.to_owned()).or_insert((0, 0));
        entry.0 = (entry.0 - in_flight).max(0);
        entry.1 = in_flight;
    }
    Ok(queues)
}
