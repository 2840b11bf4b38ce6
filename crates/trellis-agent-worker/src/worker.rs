//! The worker's event loops: one fetch loop per queue and lane (`fetch.rs`), the attempts
//! (`attempt.rs`), the result publisher, the heartbeat, log and cancel loops (`loops.rs`), and
//! the order they stop in.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt as _;
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use trellis_bus::Lane;
use trellis_proto::subjects;
use trellis_proto::v1::{self, TaskAssignment};

use tracing::Instrument as _;
use trellis_telemetry::{hops, propagation};

use crate::fences::Fences;
use crate::handoff::Handoffs;
use crate::intake::{SetAside, accept_assignment};
use crate::logs::LogPublisher;
use crate::metrics::Metrics;
use crate::outputs::OutputStore;
use crate::publish::{self, Finished, ResultSink, now_unix_ms};
use crate::publisher::{self, PUBLISH_BATCH};
use crate::sdk::{HandlerRegistry, Outcome, Running, lock};
use crate::sysinfo::CpuMeter;
use crate::task_ack::Settle;
use crate::{Config, Error};

mod attempt;
mod fetch;
mod loops;
mod slots;

use fetch::{Delivery, Received};

/// Unacknowledged messages a queue's consumer allows over all its workers.
const MAX_ACK_PENDING: i64 = 20_000;
/// Capacity of the channel from handlers to the result publisher.
const FINISHED_CHANNEL: usize = 4 * PUBLISH_BATCH;
/// How long an assignment that avoids this worker is held back before it is offered again.
const AVOID_DELAY: Duration = Duration::from_secs(1);
/// From this delivery on, an assignment that avoids this worker runs here anyway: no other worker
/// took it during the previous deliveries (about `AVOID_DELAY` each), so this one may be the only
/// worker of its queue, and a task that never runs is worse than one that runs on a worker it
/// should have avoided.
const AVOID_MAX_DELIVERIES: i64 = 5;

/// The running attempts, by task instance id.
type RunningMap = Mutex<HashMap<String, Arc<Running>>>;

/// Runs a worker until `shutdown` is cancelled (see the crate docs for what it does).
pub(crate) async fn run(
    config: Config,
    registry: HandlerRegistry,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    config.validate().map_err(Error::Config)?;
    let worker_id = config.resolved_worker_id();
    let metrics = Metrics::new(&config.telemetry.registry);
    let readiness = config.telemetry.health.component("worker");
    let client =
        trellis_bus::connect_with(&config.nats, &format!("trellis-agent-worker {worker_id}"))
            .await?;
    let js = jetstream::new(client.clone());
    let streams = trellis_bus::wait_for_streams(&js, Duration::from_secs(60)).await?;
    // The coordinator creates the bucket too; creating it here lets a worker run on a server
    // prepared by an older coordinator or by a test.
    let steps = trellis_bus::ensure_steps_bucket(&js, config.nats.replicas).await?;
    let fences_bucket = trellis_bus::ensure_fences_bucket(&js, config.nats.replicas).await?;
    let outputs = trellis_bus::Outputs::ensure(&js, config.nats.replicas).await?;
    // Each queue has two lanes: the fast one takes the first few tasks in flight of every
    // execution, so a small execution's task does not wait behind a large one's.
    let mut consumers = Vec::with_capacity(2 * config.queues.len());
    for queue in &config.queues {
        for lane in [Lane::Fast, Lane::Normal] {
            let consumer =
                trellis_bus::task_consumer(&streams.tasks, queue, lane, MAX_ACK_PENDING).await?;
            consumers.push((queue.clone(), lane, consumer));
        }
    }
    let cancel_subject = format!("{}.>", subjects::CANCEL_PREFIX);
    let cancel_sub = client
        .subscribe(cancel_subject.clone())
        .await
        .map_err(|source| Error::Subscribe {
            subject: cancel_subject,
            source,
        })?;

    // A `DrainWorker` for this worker: stop taking tasks, finish the running ones, then return.
    let drain_subject = subjects::drain(&worker_id);
    let mut drain_sub = client
        .subscribe(drain_subject.clone())
        .await
        .map_err(|source| Error::Subscribe {
            subject: drain_subject,
            source,
        })?;
    let drain = CancellationToken::new();
    let drain_requested = drain.clone();
    let drain_listener = tokio::spawn(async move {
        if let Some(message) = drain_sub.next().await {
            let reason = v1::DrainWorker::decode(message.payload.as_ref())
                .map(|request| request.reason)
                .unwrap_or_else(|_| "drain requested".to_owned());
            tracing::info!(%reason, "draining: taking no new task, exiting once idle");
            drain_requested.cancel();
        }
    });

    // Fires when this future is dropped: every task it spawned stops at once without
    // acknowledging anything, as if the process had died.
    let abandon = CancellationToken::new();
    let _abandon_on_drop = abandon.clone().drop_guard();

    let worker = Arc::new(Worker {
        worker_id: worker_id.clone(),
        client: client.clone(),
        registry,
        sink: Arc::new(ResultSink::new(
            js.clone(),
            worker_id.clone(),
            config.shards,
            steps,
            config
                .handoff
                .then(|| Handoffs::new(client.clone(), config.shards, metrics.handoffs.clone())),
        )),
        running: Mutex::new(HashMap::new()),
        slots: Arc::new(Semaphore::new(config.slots)),
        fast_waiting: AtomicUsize::new(0),
        handlers: TaskTracker::new(),
        inline: tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::CurrentThread,
        hand_back: CancellationToken::new(),
        abandon: abandon.clone(),
        metrics: metrics.clone(),
        draining: AtomicBool::new(false),
        fences: Arc::new(Fences::default()),
        max_deliveries: i64::from(config.max_deliveries),
        completed: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        logs: LogPublisher::new(js.clone(), worker_id.clone()),
        outputs: Arc::new(OutputStore::new(outputs, config.output_inline_limit)),
    });
    let fence_watch = tokio::spawn(worker.fences.clone().watch(fences_bucket, abandon.clone()));
    metrics.slots.inc_by(config.slots as i64);
    tracing::info!(%worker_id, queues = ?config.queues, slots = config.slots, nats = %config.nats.shown_url(), "worker started");

    // Each lane's results have a publisher of their own: a fast-lane task's result goes out as
    // soon as it is ready, not after the publish ack of a large execution's results sent just
    // before it (a send waits for the last one's ack, or the answer to its hand-off, so
    // results pile up and share a message).
    let spawn_publisher = |finished_rx| {
        tokio::spawn(publisher::publisher(
            worker.sink.clone(),
            finished_rx,
            abandon.clone(),
        ))
    };
    let (finished_tx, finished_rx) = mpsc::channel(FINISHED_CHANNEL);
    let (fast_finished_tx, fast_finished_rx) = mpsc::channel(FINISHED_CHANNEL);
    let mut publisher = spawn_publisher(finished_rx);
    let mut fast_publisher = spawn_publisher(fast_finished_rx);
    let stop_beats = CancellationToken::new();
    let heartbeats = tokio::spawn(loops::heartbeat_loop(
        worker.clone(),
        config.clone(),
        stop_beats.clone(),
    ));
    let canceller = tokio::spawn(loops::cancel_loop(
        worker.clone(),
        cancel_sub,
        stop_beats.clone(),
    ));
    let log_flusher = tokio::spawn(loops::log_loop(worker.clone(), stop_beats.clone()));
    // The fetch loops stop on shutdown, and also when this future is dropped (a child token of
    // `abandon`), so a dropped worker takes no more messages.
    let stop_fetching = abandon.child_token();
    let mut fetchers: Vec<_> = consumers
        .into_iter()
        .map(|(queue, lane, consumer)| {
            tokio::spawn(worker.clone().fetch_loop(
                queue,
                lane,
                streams.tasks.clone(),
                consumer,
                match lane {
                    Lane::Fast => fast_finished_tx.clone(),
                    Lane::Normal => finished_tx.clone(),
                },
                stop_fetching.clone(),
            ))
        })
        .collect();
    // Offers are heard beside the fetch loops and stop with them; their tasks' results go with
    // the fast lane's.
    if config.offers {
        for queue in &config.queues {
            let subject = subjects::offer(queue);
            let offers = client
                .queue_subscribe(subject.clone(), subjects::OFFER_QUEUE_GROUP.to_owned())
                .await
                .map_err(|source| Error::Subscribe { subject, source })?;
            fetchers.push(tokio::spawn(worker.clone().offer_loop(
                offers,
                fast_finished_tx.clone(),
                stop_fetching.clone(),
            )));
        }
    }
    drop((finished_tx, fast_finished_tx));
    readiness.set(true);

    // Stop taking work, let running handlers finish within the grace period, then hand the rest
    // back. A drain waits for them as long as they take, unless a shutdown comes meanwhile.
    let drained = tokio::select! {
        () = shutdown.cancelled() => false,
        () = drain.cancelled() => true,
        // Only a panic ends a publisher before every sender is gone.
        ended = &mut publisher => {
            readiness.set(false);
            return Err(publisher_stopped(&worker_id, ended));
        }
        ended = &mut fast_publisher => {
            readiness.set(false);
            return Err(publisher_stopped(&worker_id, ended));
        }
    };
    readiness.set(false);
    worker.draining.store(true, Ordering::Release);
    tracing::info!(%worker_id, drained, "worker stopping");
    stop_fetching.cancel();
    drain_listener.abort();
    for fetcher in fetchers {
        let _ = fetcher.await;
    }
    worker.handlers.close();
    if drained {
        // Tell the coordinators at once that nothing new is taken here.
        worker
            .beat(&config, &mut CpuMeter::new(), v1::WorkerState::Draining)
            .await;
        tokio::select! {
            () = worker.handlers.wait() => {}
            () = shutdown.cancelled() => {}
        }
    }
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    if tokio::time::timeout(grace, worker.handlers.wait())
        .await
        .is_err()
    {
        tracing::warn!(%worker_id, n_running = lock(&worker.running).len(), "grace period over; handing running tasks back");
        worker.hand_back.cancel();
        worker.handlers.wait().await;
    }
    // Every sender is gone now, so the publishers drain what is left and return.
    let _ = publisher.await;
    let _ = fast_publisher.await;
    stop_beats.cancel();
    let _ = heartbeats.await;
    let _ = canceller.await;
    let _ = log_flusher.await;
    fence_watch.abort();
    if let Err(error) = client.flush().await {
        tracing::warn!(%error, "failed to flush the nats connection");
    }
    metrics.slots.dec_by(config.slots as i64);
    tracing::info!(%worker_id, "worker stopped");
    Ok(())
}

struct Worker {
    worker_id: String,
    client: async_nats::Client,
    registry: HandlerRegistry,
    sink: Arc<ResultSink>,
    running: RunningMap,
    slots: Arc<Semaphore>,
    /// Fast-lane tasks received and waiting for a slot: while there are any, the normal lanes
    /// take no slot, so a free one goes to them first.
    fast_waiting: AtomicUsize,
    handlers: TaskTracker,
    /// The runtime has one thread: attempts are polled where they are dispatched first
    /// ([`Worker::start`]).
    inline: bool,
    /// Fires when the grace period is over: running handlers stop and their tasks are handed back.
    hand_back: CancellationToken,
    abandon: CancellationToken,
    metrics: Metrics,
    /// Stopping: no new task is taken; heartbeats say `draining`.
    draining: AtomicBool,
    /// The executions' fencing epochs: an assignment below its execution's is refused.
    fences: Arc<Fences>,
    /// A message delivered more often than this without a result is not run again.
    max_deliveries: i64,
    /// Attempts completed and failed since the process started, for heartbeats.
    completed: AtomicU64,
    failed: AtomicU64,
    /// Publishes the attempts' log lines.
    logs: LogPublisher,
    /// Outputs stored by reference: large outputs put, references handed in resolved.
    outputs: Arc<OutputStore>,
}

/// How a handler task ended.
enum Ending {
    Done(Outcome),
    HandBack,
    Abandoned,
}

impl Worker {
    /// Decodes one assignment and makes its attempt, for [`Worker::start`]; `None` when the
    /// assignment was settled instead (set aside, or held back for another worker).
    async fn dispatch(
        self: &Arc<Self>,
        delivery: &Delivery,
        received: Received,
        permit: OwnedSemaphorePermit,
        finished_tx: &mpsc::Sender<Finished>,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let Delivery {
            subject,
            delivered,
            queued_seconds,
            progress_subject,
        } = delivery;
        let (delivered, queued_seconds) = (*delivered, *queued_seconds);
        let progress_subject = progress_subject.clone();
        let Received {
            payload,
            parent,
            ack: acker,
        } = received;
        let assignment = match accept_assignment(payload.as_ref()) {
            Ok(assignment) => assignment,
            Err(SetAside::Incomplete) => {
                tracing::warn!(%subject, "set aside a task assignment without instance id or task type");
                self.set_aside("incomplete");
                let _ = acker.settle(Settle::SetAside).await;
                return None;
            }
            Err(SetAside::BadId(field)) => {
                tracing::warn!(%subject, field, "set aside a task assignment whose id is not a UUID");
                self.set_aside("bad_id");
                let _ = acker.settle(Settle::SetAside).await;
                return None;
            }
            Err(SetAside::Corrupt(error)) => {
                tracing::warn!(%subject, %error, "set aside a task message that is not a TaskAssignment");
                self.set_aside("corrupt");
                let _ = acker.settle(Settle::SetAside).await;
                return None;
            }
        };
        if let Some(fence) = self.fences.stale(&assignment) {
            // Sent by a coordinator that has since lost the execution: its new owner runs the
            // attempt again under its own epoch if no worker ran this one when it took over.
            tracing::info!(
                execution_id = %assignment.execution_id,
                task_instance_id = %assignment.task_instance_id,
                attempt = assignment.attempt,
                assignment_fence = assignment.fence,
                fence,
                "refused an assignment of a former owner of the execution"
            );
            self.set_aside("stale");
            let _ = acker.settle(Settle::SetAside).await;
            return None;
        }
        // Coordinators send such an assignment alone; one in a batch runs here (handing it
        // back would hand back the whole batch).
        if assignment.avoid_worker_id.as_deref() == Some(self.worker_id.as_str())
            && delivered < AVOID_MAX_DELIVERIES
            && acker.is_alone()
        {
            tracing::debug!(task_instance_id = %assignment.task_instance_id, delivered, "assignment avoids this worker; offering it to others");
            let _ = acker.settle(Settle::Again(Some(AVOID_DELAY))).await;
            return None;
        }
        hops::mark_any("worker.received", traced(&assignment));
        let handler = self.registry.get(&assignment.task_type).cloned();
        let results = self.sink.subject(&assignment);
        // The run is a child of the coordinator's dispatch span; its results carry the run's
        // context on, so dispatch → run → result is one line of the execution's trace.
        let span = if propagation::enabled() {
            let span = tracing::info_span!(
                "task.run",
                otel.kind = "consumer",
                execution_id = %assignment.execution_id,
                task_instance_id = %assignment.task_instance_id,
                task_id = %assignment.task_id,
                task_type = %assignment.task_type,
                attempt = assignment.attempt,
                worker_id = %self.worker_id,
            );
            propagation::set_parent(&span, parent);
            span
        } else {
            tracing::Span::none()
        };
        let traceparent = propagation::traceparent(&propagation::context_of(&span));
        let running = Arc::new(Running::new(
            &assignment,
            now_unix_ms(),
            progress_subject,
            results,
            traceparent,
        ));
        let labels = [
            ("queue", assignment.queue.clone()),
            ("type", assignment.task_type.clone()),
        ];
        if let Some(seconds) = queued_seconds {
            self.metrics
                .queue_wait
                .get_or_create(&[("queue", assignment.queue.clone())])
                .observe(seconds);
        }
        lock(&self.running).insert(assignment.task_instance_id.clone(), running.clone());
        let worker = self.clone();
        let finished_tx = finished_tx.clone();
        self.metrics.running.inc();
        let started = std::time::Instant::now();
        // Earlier attempts lost with their worker spent deliveries this message does not count.
        let spent = delivered.saturating_add(i64::from(assignment.lost_deliveries));
        let lost = (spent > self.max_deliveries).then(|| {
            tracing::warn!(
                execution_id = %assignment.execution_id,
                task_instance_id = %assignment.task_instance_id,
                attempt = assignment.attempt,
                delivered,
                lost_deliveries = assignment.lost_deliveries,
                "task delivered again after its workers died {} times; not run again",
                spent - 1
            );
            Outcome::Lost {
                deliveries: u32::try_from(spent - 1).unwrap_or(u32::MAX),
            }
        });
        let work = async move {
            let ending = match lost {
                Some(lost) => Ending::Done(lost),
                None => {
                    worker
                        .execute(handler, assignment, delivered, &running)
                        .await
                }
            };
            drop(permit);
            worker.metrics.running.dec();
            worker.count(labels, &ending, started.elapsed());
            {
                let mut map = lock(&worker.running);
                if map
                    .get(&running.task_instance_id)
                    .is_some_and(|entry| Arc::ptr_eq(entry, &running))
                {
                    map.remove(&running.task_instance_id);
                }
            }
            // Its last lines are stored before its result: a recorded result has its whole log.
            if !matches!(ending, Ending::Abandoned) {
                worker.logs.flush(&running, true).await;
            }
            match ending {
                Ending::Done(outcome) => {
                    // A failure keeps the steps for the retry; every other outcome ends the
                    // instance (spawns and questions continue as new instances).
                    let steps_stored = running.steps_stored.load(Ordering::Relaxed);
                    let forget_steps = (steps_stored
                        && !matches!(outcome, Outcome::Failed { .. } | Outcome::Lost { .. }))
                    .then(|| running.task_instance_id.clone());
                    // Step checkpoints went to the stream; the outcome follows them there, so the
                    // coordinator never sees it first.
                    let handoff = (!steps_stored).then_some(running.results_shard);
                    let (subject, msg_id, payload) = worker.sink.encode(&running, outcome);
                    let finished = Finished {
                        subject,
                        handoff,
                        msg_id,
                        payload,
                        acker,
                        forget_steps,
                        traceparent: running.traceparent.clone(),
                    };
                    if let Err(mpsc::error::SendError(finished)) = finished_tx.send(finished).await
                    {
                        publish::nak(finished.acker).await;
                    }
                }
                Ending::HandBack => publish::nak(acker).await,
                Ending::Abandoned => {}
            }
        };
        Some(work.instrument(span))
    }

    fn set_aside(&self, reason: &'static str) {
        self.metrics
            .set_aside
            .get_or_create(&[("reason", reason.to_owned())])
            .inc();
    }

    /// Counts an attempt that ended, by queue, type and outcome, with its run time.
    fn count(
        &self,
        [queue, task_type]: [(&'static str, String); 2],
        ending: &Ending,
        ran: Duration,
    ) {
        let outcome = match ending {
            Ending::Done(Outcome::Completed(_) | Outcome::CompletedJson(_)) => "completed",
            Ending::Done(Outcome::Failed { .. }) => "failed",
            Ending::Done(Outcome::Spawn { .. }) => "spawned",
            Ending::Done(Outcome::Ask(_)) => "asked",
            Ending::Done(Outcome::Preempted { .. }) => "preempted",
            Ending::Done(Outcome::Lost { .. }) => "lost",
            Ending::HandBack => {
                self.metrics.handed_back.inc();
                return;
            }
            Ending::Abandoned => return,
        };
        match outcome {
            "completed" => self.completed.fetch_add(1, Ordering::Relaxed),
            "failed" | "lost" => self.failed.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        let labels = [queue, task_type, ("outcome", outcome.to_owned())];
        self.metrics.tasks.get_or_create(&labels).inc();
        self.metrics
            .duration
            .get_or_create(&labels)
            .observe(ran.as_secs_f64());
    }
}

/// The assignment's execution as a trace's marks name it; read only while a trace is on.
fn traced(assignment: &TaskAssignment) -> Option<u128> {
    hops::on()
        .then(|| hops::id_bits(&assignment.execution_id))
        .flatten()
}

/// The error of a worker whose result publisher stopped while tasks could still finish: it
/// could not report them, so it stops.
fn publisher_stopped(worker_id: &str, ended: Result<(), tokio::task::JoinError>) -> Error {
    let why = match ended {
        Err(error) => error.to_string(),
        Ok(()) => "it returned".to_owned(),
    };
    tracing::error!(%worker_id, %why, "the result publisher stopped; the worker stops");
    Error::Publisher(why)
}
