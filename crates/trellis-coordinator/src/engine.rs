//! The engine: one task that owns the live executions of this coordinator's shards and their
//! event logs.
//!
//! Each turn of its loop takes whatever inputs are waiting (requests, a batch of worker results, a
//! clock tick, lease changes, recovered executions), applies them, lets every touched execution
//! `decide`, and then flushes in this order: (1) each execution's new events as one `EventBatch`
//! message on its log subject, all publishes in flight together and awaited, each naming the
//! stream sequence it must follow so that only one coordinator can ever extend a log; (2) only
//! then the side effects: task assignments on the work queues (de-duplicated by `Nats-Msg-Id` =
//! `<instance>:<attempt>`), stop messages for cancelled tasks, progress snapshots; (3)
//! acknowledgements of the consumed result messages and replies to callers. A crash between (1)
//! and (2) loses nothing: recovery re-issues what the log says is due. A NATS outage stalls the
//! loop (appends are retried until stored) instead of skipping the log.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishErrorKind, kv};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::join_all;
use prost::Message as _;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::Instrument as _;
use trellis_core::ids::{ExecutionId, QuestionId, TaskInstanceId};
use trellis_core::machine::{Applied, Event, EventBody, Execution, ExecutionState, Usage};
use trellis_core::plan::{PlanErrors, compile_str};
use trellis_core::quota::Quota;
use trellis_core::record::TaskState;
use trellis_grpc::access::{self, AccessPolicy, Principal, Scope};
use trellis_proto::{subjects, v1};
use trellis_telemetry::Readiness;
use trellis_telemetry::propagation::{self, Context};
use trellis_wire::{common, log, plan, read, worker};

use crate::checkpoints::{self, FULL_EVERY, KEEP_FULL, StoreClient};
use crate::metrics::{self, Metrics};
use crate::recovery::{self, Recovered};
use crate::shards::{self, LeaseEvent};

/// How often executions with timers (retries, deadlines, expiring questions) are re-examined.
const TICK: Duration = Duration::from_millis(20);
/// Progress snapshots are published at most this often per execution.
const PROGRESS_EVERY_MS: u64 = 100;
/// Most inputs taken in one turn of the loop.
const MAX_INPUTS_PER_TURN: usize = 4096;
/// Capacity of each execution's observer channel, in flushed batches.
const OBSERVER_CAPACITY: usize = 4096;
/// Most events in one log message.
const EVENTS_PER_MESSAGE: usize = 2048;
/// Room kept beside a spec for the rest of the first log message (its other events).
const STARTED_HEADROOM: usize = 256 * 1024;
/// Task assignments published before their acks are awaited.
const PUBLISH_CHUNK: usize = 1000;
/// Longest pause between two attempts of a publish JetStream did not acknowledge.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The header naming the stream sequence an append must follow.
const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A control request on an execution.
#[derive(Debug)]
pub(crate) enum Control {
    Pause(String),
    Resume,
    Cancel(String),
}

/// What the observers of one execution receive per flush.
#[derive(Debug)]
pub(crate) struct Flushed {
    pub(crate) items: Vec<v1::ObserveExecutionResponse>,
    pub(crate) terminal: bool,
}

/// The answer to an observe request: the history so far and the live channel.
pub(crate) struct Observation {
    /// Events before the ones held in memory (an execution restored from a checkpoint keeps only
    /// the log after it): `(from, until)` sequences, inclusive, to read from JetStream first.
    pub(crate) backfill: Option<(u64, u64)>,
    pub(crate) history: Vec<v1::Event>,
    pub(crate) terminal: bool,
    pub(crate) live: broadcast::Receiver<Arc<Flushed>>,
}

type Reply<T> = oneshot::Sender<Result<T, Status>>;

/// Requests from the gRPC layer.
pub(crate) enum Request {
    Start {
        /// Boxed: a compiled plan is far larger than the other requests.
        source: Box<v1::start_execution_request::PlanSource>,
        options: v1::ExecutionOptions,
        /// Who starts it: decides the namespace and its quota.
        principal: Principal,
        /// The W3C `traceparent` of the call, recorded for the execution's later spans.
        traceparent: String,
        reply: Reply<(ExecutionId, bool)>,
    },
    /// A request about one execution, which the caller's scope must allow: an execution of
    /// another namespace is answered NOT_FOUND, as if it did not exist.
    On {
        id: ExecutionId,
        scope: Scope,
        action: On,
    },
    List {
        scope: Scope,
        reply: Reply<Vec<v1::Execution>>,
    },
}

/// What to do with one execution.
pub(crate) enum On {
    Control {
        control: Control,
        reply: Reply<i32>,
    },
    Retry {
        reply: Reply<u32>,
    },
    Checkpoint {
        reply: Reply<v1::CheckpointMetadata>,
    },
    Answer {
        question: QuestionId,
        answer: String,
        reply: Reply<(u64, Option<TaskInstanceId>)>,
    },
    Get {
        reply: Reply<v1::Execution>,
    },
    Graph {
        reply: Reply<v1::ExecutionGraph>,
    },
    Observe {
        from: u64,
        reply: Reply<Observation>,
    },
}

impl Request {
    /// The execution the request is about, if one.
    fn execution(&self) -> Option<ExecutionId> {
        match self {
            Self::On { id, .. } => Some(*id),
            Self::Start { .. } | Self::List { .. } => None,
        }
    }

    /// Answers the request with an error.
    fn fail(self, status: Status) {
        match self {
            Self::Start { reply, .. } => drop(reply.send(Err(status))),
            Self::List { reply, .. } => drop(reply.send(Err(status))),
            Self::On { action, .. } => action.fail(status),
        }
    }
}

impl On {
    /// Answers with an error.
    fn fail(self, status: Status) {
        match self {
            Self::Control { reply, .. } => drop(reply.send(Err(status))),
            Self::Retry { reply } => drop(reply.send(Err(status))),
            Self::Checkpoint { reply } => drop(reply.send(Err(status))),
            Self::Answer { reply, .. } => drop(reply.send(Err(status))),
            Self::Get { reply } => drop(reply.send(Err(status))),
            Self::Graph { reply } => drop(reply.send(Err(status))),
            Self::Observe { reply, .. } => drop(reply.send(Err(status))),
        }
    }
}

pub(crate) enum Input {
    Request(Request),
    Results(Vec<jetstream::Message>),
    Lease(LeaseEvent),
    /// Executions rebuilt by a recovery task. `acquire` is set when they are a whole shard just
    /// taken over; `then` holds requests that waited for an execution to be loaded.
    Adopt {
        shard: u32,
        acquire: bool,
        recovered: Vec<Recovered>,
        missing: Vec<ExecutionId>,
        then: Vec<Request>,
    },
    CheckpointDone {
        id: ExecutionId,
        full: bool,
        sequence: u64,
        result: Result<v1::CheckpointMetadata, String>,
    },
}

/// A cheap handle to the engine task.
#[derive(Clone)]
pub(crate) struct Handle {
    tx: mpsc::Sender<Input>,
}

impl Handle {
    pub(crate) async fn request<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Request,
    ) -> Result<T, Status> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Input::Request(make(reply)))
            .await
            .map_err(|_| Status::unavailable("the coordinator is shutting down"))?;
        rx.await
            .map_err(|_| Status::unavailable("the coordinator is shutting down"))?
    }

    /// Asks for `action` on execution `id`, which `scope` must allow.
    pub(crate) async fn on<T>(
        &self,
        id: ExecutionId,
        scope: Scope,
        make: impl FnOnce(Reply<T>) -> On,
    ) -> Result<T, Status> {
        self.request(|reply| Request::On {
            id,
            scope,
            action: make(reply),
        })
        .await
    }
}

/// Checkpoint bookkeeping of one execution.
#[derive(Default)]
struct CheckpointState {
    /// The event sequence of the last stored checkpoint (0: none).
    seq: u64,
    id: Option<String>,
    metadata: Option<v1::CheckpointMetadata>,
    /// Deltas stored since the last full checkpoint.
    since_full: u32,
    at_ms: u64,
    in_flight: bool,
    /// A checkpoint was taken while paused (one per pause).
    paused_done: bool,
    waiting: Vec<Reply<v1::CheckpointMetadata>>,
}

struct Live {
    machine: Execution,
    labels: HashMap<String, String>,
    created_at_ms: u64,
    shard: u32,
    namespace: Arc<str>,
    /// Whether its namespace's quota allows checkpoints.
    checkpoints_allowed: bool,
    /// The trace of the call that started it: the parent of its dispatch, append and checkpoint
    /// spans (empty when that call was not traced).
    trace: Context,
    /// The last sequence appended (or about to be).
    seq: u64,
    /// The stream sequence of the last message on this execution's log subject; the next append
    /// must follow it.
    stream_seq: u64,
    /// The log held in memory as the encoded `EventBatch` messages, with each one's first
    /// sequence: compact, and what observers replay from. It starts at `log_base`.
    log: Vec<(u64, Bytes)>,
    log_base: u64,
    pending: Vec<v1::Event>,
    dispatch: Vec<TaskInstanceId>,
    stop: Vec<TaskInstanceId>,
    observers: broadcast::Sender<Arc<Flushed>>,
    last_progress_ms: u64,
    /// The state changed since the last progress snapshot was published.
    progress_due: bool,
    dirty: bool,
    /// The index entry must be written before the next append (a new execution or run).
    index_put: bool,
    /// The index entry is written and the execution not yet finished.
    indexed: bool,
    checkpoint: CheckpointState,
}

/// What an applied event adds to the metrics.
enum Count<'m> {
    /// An instance's first dispatch: its queue and the seconds since it became ready.
    DispatchLatency(trellis_telemetry::metrics::Labels1, f64),
    /// An attempt's outcome, in the family of that outcome, by queue and type.
    Attempt(
        &'m prometheus_client::metrics::family::Family<
            trellis_telemetry::metrics::Labels2,
            prometheus_client::metrics::counter::Counter,
        >,
        trellis_telemetry::metrics::Labels2,
    ),
}

/// Who an execution belongs to and what it may do, fixed at its start.
struct Tenancy {
    namespace: Arc<str>,
    checkpoints_allowed: bool,
    traceparent: String,
}

impl Live {
    fn new(
        machine: Execution,
        labels: HashMap<String, String>,
        created_at_ms: u64,
        shard: u32,
        tenancy: Tenancy,
    ) -> Self {
        let (observers, _) = broadcast::channel(OBSERVER_CAPACITY);
        Self {
            machine,
            labels,
            created_at_ms,
            shard,
            namespace: tenancy.namespace,
            checkpoints_allowed: tenancy.checkpoints_allowed,
            trace: propagation::from_traceparent(&tenancy.traceparent),
            seq: 0,
            stream_seq: 0,
            log: Vec::new(),
            log_base: 1,
            pending: Vec::new(),
            dispatch: Vec::new(),
            stop: Vec::new(),
            observers,
            last_progress_ms: 0,
            progress_due: true,
            dirty: false,
            index_put: false,
            indexed: false,
            checkpoint: CheckpointState::default(),
        }
    }

    /// Applies an event and, when it changed the state, queues it for the log and counts it.
    /// Returns what apply said.
    fn record(
        &mut self,
        id: ExecutionId,
        event: Event,
        metrics: &Metrics,
    ) -> Result<Applied, trellis_core::machine::ApplyError> {
        // Read before apply: a settled attempt's times and labels describe the attempt.
        let counted = self.count(&event, metrics);
        let applied = self.machine.apply(&event)?;
        if let Applied::Changed { stop } = &applied {
            match counted {
                Some(Count::DispatchLatency(labels, seconds)) => {
                    metrics
                        .dispatch_latency
                        .get_or_create(&labels)
                        .observe(seconds);
                }
                Some(Count::Attempt(family, labels)) => {
                    family.get_or_create(&labels).inc();
                }
                None => {}
            }
            self.seq += 1;
            self.pending.push(log::event_to_proto(id, self.seq, &event));
            self.stop.extend_from_slice(stop);
            if let EventBody::TaskDispatched { instance, .. } = event.body {
                self.dispatch.push(instance);
            }
        }
        Ok(applied)
    }

    /// Returns what to count for `event` once it is applied: the attempt outcomes by queue and
    /// type, and the dispatch latency of an instance's first dispatch (from the instance becoming
    /// ready to its assignment being sent). `None` for other events.
    fn count<'m>(&self, event: &Event, metrics: &'m Metrics) -> Option<Count<'m>> {
        let (instance, family) = match &event.body {
            EventBody::TaskDispatched {
                instance,
                attempt: 1,
                ..
            } => {
                let assignment = self.machine.assignment(*instance)?;
                let (ready_at, _) = self.machine.instance_times(*instance)?;
                let seconds = event.at_ms.saturating_sub(ready_at) as f64 / 1000.0;
                return Some(Count::DispatchLatency(
                    [("queue", assignment.queue.to_owned())],
                    seconds,
                ));
            }
            EventBody::TaskCompleted { instance, .. } => (instance, &metrics.completed),
            EventBody::TaskFailed { instance, .. } | EventBody::TaskTimedOut { instance, .. } => {
                (instance, &metrics.failed)
            }
            EventBody::TaskLost { instance, .. } => (instance, &metrics.lost),
            _ => return None,
        };
        let assignment = self.machine.assignment(*instance)?;
        Some(Count::Attempt(
            family,
            metrics::task_labels(assignment.queue, assignment.task_type),
        ))
    }

    /// Lets the machine decide until it has nothing more to do now.
    fn decide(&mut self, id: ExecutionId, now: u64, metrics: &Metrics) {
        for _ in 0..1_000 {
            let commands = self.machine.decide(now);
            if commands.is_empty() {
                return;
            }
            for command in commands {
                if let Err(err) = self.record(id, command.into_event(now), metrics) {
                    // A decision the machine refuses is a bug in the machine; stop deciding for
                    // this turn rather than loop.
                    tracing::error!(%id, %err, "decision refused");
                    return;
                }
            }
        }
    }

    fn summary(&self, id: ExecutionId, now: u64) -> v1::Execution {
        let progress = read::progress_to_proto(&self.machine.progress(now));
        let (started, ended) = self.machine.times_ms();
        v1::Execution {
            execution_id: id.to_string(),
            name: self.machine.plan().name.clone(),
            state: read::execution_state_to_proto(self.machine.state()),
            run_number: self.machine.run_number(),
            counts: progress.counts,
            usage: Some(common::usage_to_proto(self.machine.usage())),
            created_at_unix_ms: self.created_at_ms as i64,
            started_at_unix_ms: Some(started as i64),
            ended_at_unix_ms: ended.map(|t| t as i64),
            reason: self.machine.reason().unwrap_or_default().to_owned(),
            last_sequence: self.seq,
            labels: self.labels.clone(),
            namespace: self.namespace.to_string(),
            open_questions: self
                .machine
                .open_questions()
                .into_iter()
                .map(|open| v1::OpenQuestion {
                    task_instance_id: open.instance.to_string(),
                    task_id: open.task_id,
                    question: Some(common::question_to_proto(open.question)),
                    asked_at_unix_ms: open.asked_at_ms as i64,
                })
                .collect(),
            progress: Some(progress),
        }
    }

    /// The instances a worker should be running now: after a recovery their assignments are
    /// published again (JetStream drops the copies it still holds, by message id).
    fn redispatch_running(&mut self) {
        self.dispatch = self.machine.instances_in(TaskState::Running).collect();
    }
}

/// How the engine is set up.
pub(crate) struct Setup {
    pub(crate) nats: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) streams: trellis_bus::Streams,
    pub(crate) index: kv::Store,
    pub(crate) store: Option<StoreClient>,
    pub(crate) shards: u32,
    pub(crate) checkpoint_every: Duration,
    /// Namespaces, quotas and limits; `None`: one namespace, no quota, default limits.
    pub(crate) access: Option<Arc<AccessPolicy>>,
    pub(crate) metrics: Metrics,
    /// Ready while this coordinator owns a shard.
    pub(crate) readiness: Readiness,
}

/// The engine, before it is spawned.
pub(crate) struct Engine {
    nats: async_nats::Client,
    js: jetstream::Context,
    streams: trellis_bus::Streams,
    index: kv::Store,
    store: Option<StoreClient>,
    shards: u32,
    checkpoint_every_ms: u64,
    access: Option<Arc<AccessPolicy>>,
    limits: access::Limits,
    metrics: Metrics,
    readiness: Readiness,
    tx: mpsc::Sender<Input>,
    shutdown: CancellationToken,
    /// Shards whose executions this engine holds and whose results it consumes.
    owned: HashSet<u32>,
    /// Shards being recovered after their lease was acquired.
    acquiring: HashSet<u32>,
    consumers: HashMap<u32, CancellationToken>,
    executions: HashMap<ExecutionId, Live>,
    /// Idempotency keys, per namespace: a key only finds executions of the caller's namespace.
    by_key: HashMap<(Arc<str>, String), ExecutionId>,
    dirty: Vec<ExecutionId>,
    /// Executions being loaded from the log, with the requests waiting for them.
    loading: HashMap<ExecutionId, Vec<Request>>,
    /// Requests that arrived while the shard they need was being recovered.
    parked: Vec<Request>,
}

impl Engine {
    /// Starts the engine task; returns its handle and the sender lease events go to.
    pub(crate) fn spawn(
        setup: Setup,
        shutdown: CancellationToken,
    ) -> (Handle, mpsc::Sender<Input>) {
        let (tx, rx) = mpsc::channel(1024);
        let engine = Engine {
            nats: setup.nats,
            js: setup.js,
            streams: setup.streams,
            index: setup.index,
            store: setup.store,
            shards: setup.shards.max(1),
            checkpoint_every_ms: setup.checkpoint_every.as_millis() as u64,
            limits: setup
                .access
                .as_ref()
                .map_or_else(access::Limits::default, |access| access.limits()),
            access: setup.access,
            metrics: setup.metrics,
            readiness: setup.readiness,
            tx: tx.clone(),
            shutdown: shutdown.clone(),
            owned: HashSet::new(),
            acquiring: HashSet::new(),
            consumers: HashMap::new(),
            executions: HashMap::new(),
            by_key: HashMap::new(),
            dirty: Vec::new(),
            loading: HashMap::new(),
            parked: Vec::new(),
        };
        tokio::spawn(engine.run(rx));
        (Handle { tx: tx.clone() }, tx)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Input>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut replies: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
            let mut acks: Vec<(Option<ExecutionId>, jetstream::Message)> = Vec::new();
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                input = rx.recv() => {
                    let Some(input) = input else { break };
                    self.handle(input, &mut replies, &mut acks);
                    let mut n = 1;
                    while n < MAX_INPUTS_PER_TURN {
                        match rx.try_recv() {
                            Ok(input) => self.handle(input, &mut replies, &mut acks),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                }
                _ = tick.tick() => {
                    for (id, live) in &mut self.executions {
                        if !live.machine.state().is_terminal() && !live.dirty {
                            live.dirty = true;
                            self.dirty.push(*id);
                        }
                    }
                }
            }
            let now = now_ms();
            for id in &self.dirty {
                if let Some(live) = self.executions.get_mut(id) {
                    live.decide(*id, now, &self.metrics);
                }
            }
            let fenced = self.flush(now).await;
            let fenced = &fenced;
            // Results of an execution whose append was refused are not acknowledged: they come
            // back to whoever owns the execution now.
            join_all(acks.iter().map(|(id, message)| async move {
                if id.is_some_and(|id| fenced.contains(&id)) {
                    let _ = message
                        .ack_with(jetstream::AckKind::Nak(Some(Duration::from_millis(200))))
                        .await;
                } else {
                    let _ = message.ack().await;
                }
            }))
            .await;
            for reply in replies {
                reply();
            }
            self.checkpoints(now);
            self.metrics
                .executions_live
                .set(self.executions.len() as i64);
        }
        for token in self.consumers.values() {
            token.cancel();
        }
        tracing::info!("coordinator engine stopped");
    }

    fn mark(&mut self, id: ExecutionId) {
        if let Some(live) = self.executions.get_mut(&id)
            && !live.dirty
        {
            live.dirty = true;
            self.dirty.push(id);
        }
    }

    /// True when the execution is not in memory but will be: it is being loaded, or its shard
    /// is being recovered. Its results are handed back to JetStream for later.
    fn waiting_for(&self, id: ExecutionId) -> bool {
        !self.executions.contains_key(&id)
            && (self.loading.contains_key(&id) || self.acquiring.contains(&self.shard_of(id)))
    }

    fn shard_of(&self, id: ExecutionId) -> u32 {
        subjects::shard_of(&id.to_string(), self.shards)
    }

    fn handle(
        &mut self,
        input: Input,
        replies: &mut Vec<Box<dyn FnOnce() + Send>>,
        acks: &mut Vec<(Option<ExecutionId>, jetstream::Message)>,
    ) {
        match input {
            Input::Results(messages) => {
                tracing::debug!(n_results = messages.len(), "results received");
                let now = now_ms();
                for message in messages {
                    let id = self.result(&message, now);
                    if let Some(id) = id
                        && self.waiting_for(id)
                    {
                        // Being reloaded: let it come back once the execution is in memory.
                        let message = message;
                        tokio::spawn(async move {
                            let _ = message
                                .ack_with(jetstream::AckKind::Nak(Some(Duration::from_millis(200))))
                                .await;
                        });
                        continue;
                    }
                    acks.push((id, message));
                }
            }
            Input::Request(request) => self.request(request, replies),
            Input::Lease(LeaseEvent::Acquired(shard)) => self.acquire(shard),
            Input::Lease(LeaseEvent::Lost(shard)) => self.lose(shard),
            Input::Adopt {
                shard,
                acquire,
                recovered,
                missing,
                then,
            } => {
                self.adopt(shard, acquire, recovered);
                let parked = if acquire {
                    std::mem::take(&mut self.parked)
                } else {
                    Vec::new()
                };
                for request in parked {
                    self.request(request, replies);
                }
                for id in missing {
                    if let Some(waiting) = self.loading.remove(&id) {
                        for request in waiting {
                            request.fail(not_found(id));
                        }
                    }
                }
                for request in then {
                    self.request(request, replies);
                }
            }
            Input::CheckpointDone {
                id,
                full,
                sequence,
                result,
            } => self.checkpoint_done(id, full, sequence, result),
        }
    }

    /// Applies one result; returns the execution it belongs to.
    fn result(&mut self, message: &jetstream::Message, now: u64) -> Option<ExecutionId> {
        let mut result = match v1::TaskResult::decode(message.payload.clone()) {
            Ok(result) => result,
            Err(err) => {
                tracing::warn!(subject = %message.subject, %err, "corrupt task result set aside");
                self.metrics.set_aside("corrupt");
                return None;
            }
        };
        // The worker's span is the parent: dispatch → run → result is one line of the trace.
        let span = propagation::enabled().then(|| {
            let span = tracing::info_span!(
                "task.result",
                otel.kind = "consumer",
                execution_id = %result.execution_id,
                task_instance_id = %result.task_instance_id,
                attempt = result.attempt,
            );
            propagation::set_parent(&span, propagation::extract_nats(message.headers.as_ref()));
            span
        });
        let _entered = span.as_ref().map(tracing::Span::enter);
        if let Some(why) = enforce_payload_limit(&mut result, self.limits.max_payload_bytes) {
            tracing::warn!(
                execution_id = %result.execution_id,
                task_instance_id = %result.task_instance_id,
                %why,
                "task result over the payload limit: the attempt fails"
            );
        }
        let (id, event) = match worker::result_to_event(&result, now) {
            Ok(converted) => converted,
            Err(err) => {
                tracing::warn!(subject = %message.subject, %err, "invalid task result set aside");
                self.metrics.set_aside("invalid");
                // Set aside alone, the attempt would run on until a deadline, if it has one.
                let (id, failed) = failed_by_invalid_result(&result, now, &err)?;
                (id, failed)
            }
        };
        let Some(live) = self.executions.get_mut(&id) else {
            if !self.waiting_for(id) {
                tracing::warn!(%id, "task result for an unknown execution set aside");
                self.metrics.set_aside("unknown_execution");
            }
            return Some(id);
        };
        match live.record(id, event, &self.metrics) {
            Ok(Applied::Changed { .. }) => self.mark(id),
            Ok(Applied::Ignored(reason)) => {
                tracing::debug!(%id, ?reason, "duplicate task result ignored")
            }
            Err(err) => {
                tracing::warn!(%id, %err, "task result refused; its attempt fails");
                let failed = failed_by_invalid_result(&result, now, &err);
                if let Some((_, failed)) = failed
                    && let Ok(Applied::Changed { .. }) = live.record(id, failed, &self.metrics)
                {
                    self.mark(id);
                }
            }
        }
        Some(id)
    }

    // ------------------------------------------------------------------------------------------
    // shards
    // ------------------------------------------------------------------------------------------

    /// A lease was acquired: recover the shard's unfinished executions in the background, then
    /// adopt them.
    fn acquire(&mut self, shard: u32) {
        if self.owned.contains(&shard) || !self.acquiring.insert(shard) {
            return;
        }
        let events = self.streams.events.clone();
        let index = self.index.clone();
        let store = self.store.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let ids = loop {
                match shards::indexed(&index, shard).await {
                    Ok(ids) => break ids,
                    Err(err) => {
                        tracing::warn!(shard, %err, "cannot list the shard's executions; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            let mut recovered = Vec::with_capacity(ids.len());
            let mut missing = Vec::new();
            for id in ids {
                match recover_with_retry(&events, store.as_ref(), id).await {
                    Some(execution) => recovered.push(execution),
                    None => missing.push(id),
                }
            }
            tracing::info!(
                shard,
                executions = recovered.len(),
                ms = started.elapsed().as_millis() as u64,
                "shard recovered"
            );
            let _ = tx
                .send(Input::Adopt {
                    shard,
                    acquire: true,
                    recovered,
                    missing,
                    then: Vec::new(),
                })
                .await;
        });
    }

    /// A lease was lost: forget the shard's executions and stop consuming its results.
    fn lose(&mut self, shard: u32) {
        self.owned.remove(&shard);
        self.acquiring.remove(&shard);
        if let Some(token) = self.consumers.remove(&shard) {
            token.cancel();
        }
        let gone: Vec<ExecutionId> = self
            .executions
            .iter()
            .filter(|(_, live)| live.shard == shard)
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.executions.remove(id);
        }
        self.by_key.retain(|_, id| !gone.contains(id));
        self.readiness.set(!self.owned.is_empty());
        tracing::warn!(shard, executions = gone.len(), "shard given up");
    }

    /// Returns the quota of `namespace`: the access file's, or none without one. A namespace the
    /// file no longer declares (an execution started before it was removed) runs unlimited.
    fn quota(&self, namespace: &str) -> Quota {
        self.access
            .as_ref()
            .and_then(|access| access.quota(namespace).cloned())
            .unwrap_or(Quota::UNLIMITED)
    }

    fn adopt(&mut self, shard: u32, acquire: bool, recovered: Vec<Recovered>) {
        if acquire {
            if !self.acquiring.remove(&shard) {
                // The lease was lost again while recovering.
                return;
            }
            self.owned.insert(shard);
        } else if !self.owned.contains(&shard) {
            return;
        }
        for execution in recovered {
            let id = execution.machine.id();
            self.loading.remove(&id);
            let labels = execution
                .started
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let namespace: Arc<str> = Arc::from(execution.started.namespace());
            let tenancy = Tenancy {
                checkpoints_allowed: self.quota(&namespace).checkpoints,
                namespace: namespace.clone(),
                traceparent: execution.started.traceparent.clone(),
            };
            let mut live = Live::new(
                execution.machine,
                labels,
                execution.started.started_at_ms,
                shard,
                tenancy,
            );
            live.seq = execution.seq;
            live.stream_seq = execution.stream_seq;
            live.log_base = execution
                .log
                .first()
                .map_or(execution.seq + 1, |m| m.first_seq);
            live.log = execution
                .log
                .into_iter()
                .map(|m| (m.first_seq, m.payload))
                .collect();
            live.indexed = true;
            if let Some((checkpoint_id, seq, deltas)) = execution.checkpoint {
                live.checkpoint.id = Some(checkpoint_id);
                live.checkpoint.seq = seq;
                live.checkpoint.since_full = deltas;
                live.checkpoint.at_ms = now_ms();
            }
            if !live.machine.state().is_terminal() {
                live.redispatch_running();
            }
            if !execution.started.idempotency_key.is_empty() {
                self.by_key
                    .insert((namespace, execution.started.idempotency_key.clone()), id);
            }
            self.executions.insert(id, live);
            self.mark(id);
        }
        if acquire {
            let token = self.shutdown.child_token();
            self.consumers.insert(shard, token.clone());
            tokio::spawn(consume_results(
                self.streams.results.clone(),
                shard,
                self.tx.clone(),
                token,
            ));
            self.readiness.set(true);
            tracing::info!(shard, "shard owned");
        }
    }

    /// Loads an execution that is not in memory (finished before a restart, or fenced) from its
    /// log, then answers `request`.
    fn load(&mut self, id: ExecutionId, request: Request) {
        let shard = self.shard_of(id);
        if self.acquiring.contains(&shard) {
            // Its shard is being recovered: answer once it is.
            self.parked.push(request);
            return;
        }
        if !self.owned.contains(&shard) {
            request.fail(Status::unavailable(format!(
                "execution {id} belongs to shard {shard}, which this coordinator does not own; \
                 ask the coordinator that does"
            )));
            return;
        }
        if let Some(waiting) = self.loading.get_mut(&id) {
            waiting.push(request);
            return;
        }
        self.loading.insert(id, vec![request]);
        self.spawn_reload(shard, id);
    }

    fn spawn_reload(&self, shard: u32, id: ExecutionId) {
        let events = self.streams.events.clone();
        let store = self.store.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let recovered = recover_with_retry(&events, store.as_ref(), id).await;
            let (recovered, missing) = match recovered {
                Some(execution) => (vec![execution], Vec::new()),
                None => (Vec::new(), vec![id]),
            };
            let _ = tx
                .send(Input::Adopt {
                    shard,
                    acquire: false,
                    recovered,
                    missing,
                    then: Vec::new(),
                })
                .await;
        });
    }

    // ------------------------------------------------------------------------------------------
    // requests
    // ------------------------------------------------------------------------------------------

    fn request(&mut self, request: Request, replies: &mut Vec<Box<dyn FnOnce() + Send>>) {
        if let Some(id) = request.execution()
            && !self.executions.contains_key(&id)
        {
            self.load(id, request);
            return;
        }
        if matches!(request, Request::Start { .. })
            && self.owned.is_empty()
            && !self.acquiring.is_empty()
        {
            self.parked.push(request);
            return;
        }
        let now = now_ms();
        match request {
            Request::Start {
                source,
                options,
                principal,
                traceparent,
                reply,
            } => {
                let result = self.start(*source, options, &principal, traceparent, now);
                if let Ok((id, _)) = &result {
                    self.mark(*id);
                }
                // Replied after the flush: the caller learns the id once ExecutionStarted is durable.
                replies.push(Box::new(move || {
                    let _ = reply.send(result);
                }));
            }
            Request::List { scope, reply } => {
                let mut all: Vec<_> = self
                    .executions
                    .iter()
                    .filter(|(_, live)| scope.allows(&live.namespace))
                    .map(|(id, live)| live.summary(*id, now))
                    .collect();
                all.sort_by(|a, b| b.execution_id.cmp(&a.execution_id));
                let _ = reply.send(Ok(all));
            }
            Request::On { id, scope, action } => {
                // Loaded above, unless it vanished in between.
                let Some(live) = self.executions.get(&id) else {
                    action.fail(not_found(id));
                    return;
                };
                // Another namespace's execution does not exist for this caller: the same answer
                // as an unknown id, and nothing is read or changed.
                if !scope.allows(&live.namespace) {
                    action.fail(not_found(id));
                    return;
                }
                self.on(id, action, now, replies);
            }
        }
    }

    /// Carries out `action` on execution `id`, which is in memory and the caller may act on.
    fn on(
        &mut self,
        id: ExecutionId,
        action: On,
        now: u64,
        replies: &mut Vec<Box<dyn FnOnce() + Send>>,
    ) {
        match action {
            On::Control { control, reply } => {
                let result = self.control(id, control, now);
                if result.is_ok() {
                    self.mark(id);
                }
                replies.push(Box::new(move || {
                    let _ = reply.send(result);
                }));
            }
            On::Retry { reply } => {
                let result = self.retry(id, now);
                if result.is_ok() {
                    self.mark(id);
                }
                replies.push(Box::new(move || {
                    let _ = reply.send(result);
                }));
            }
            On::Checkpoint { reply } => match (&self.store, self.executions.get_mut(&id)) {
                (None, _) => {
                    let _ = reply.send(Err(Status::failed_precondition(
                        "this coordinator has no checkpoint-store (start it with --checkpoint-store)",
                    )));
                }
                (Some(_), Some(live)) if !live.checkpoints_allowed => {
                    let _ = reply.send(Err(Status::failed_precondition(format!(
                        "checkpoints are not enabled for namespace {:?}: its quota does not allow \
                         them (set `checkpoints: true` for it in the access file)",
                        live.namespace
                    ))));
                }
                (Some(_), Some(live)) => live.checkpoint.waiting.push(reply),
                (Some(_), None) => {
                    let _ = reply.send(Err(not_found(id)));
                }
            },
            On::Answer {
                question,
                answer,
                reply,
            } => {
                let result = self.answer(id, question, answer, now);
                if result.is_ok() {
                    self.mark(id);
                }
                replies.push(Box::new(move || {
                    let _ = reply.send(result);
                }));
            }
            On::Get { reply } => {
                let _ = reply.send(
                    self.executions
                        .get(&id)
                        .map(|live| live.summary(id, now))
                        .ok_or_else(|| not_found(id)),
                );
            }
            On::Graph { reply } => {
                let result = match self.executions.get(&id) {
                    None => Err(not_found(id)),
                    Some(live) => trellis_core::graph::build(live.machine.records())
                        .map(|graph| read::graph_to_proto(&graph))
                        .map_err(|err| Status::internal(format!("execution graph of {id}: {err}"))),
                };
                let _ = reply.send(result);
            }
            On::Observe { from, reply } => {
                let result = match self.executions.get(&id) {
                    None => Err(not_found(id)),
                    Some(live) => {
                        let from = from.max(1);
                        let backfill = (from < live.log_base).then(|| (from, live.log_base - 1));
                        Ok(Observation {
                            backfill,
                            history: history(&live.log, from.max(live.log_base)),
                            terminal: live.machine.state().is_terminal() && live.pending.is_empty(),
                            live: live.observers.subscribe(),
                        })
                    }
                };
                let _ = reply.send(result);
            }
        }
    }

    /// Records a human's answer to an open question.
    fn answer(
        &mut self,
        id: ExecutionId,
        question: QuestionId,
        answer: String,
        now: u64,
    ) -> Result<(u64, Option<TaskInstanceId>), Status> {
        if answer.len() > self.limits.max_payload_bytes {
            return Err(Status::invalid_argument(format!(
                "answer: {} bytes, over the limit of {} bytes (limits.max_payload_bytes)",
                answer.len(),
                self.limits.max_payload_bytes
            )));
        }
        let live = self.executions.get_mut(&id).ok_or_else(|| not_found(id))?;
        let options = live
            .machine
            .open_question(question)
            .map(|open| open.options.clone())
            .unwrap_or_default();
        if !options.is_empty() && !options.contains(&answer) {
            return Err(Status::invalid_argument(format!(
                "answer: {answer:?} is not one of the options of question {question}: {}",
                options.join(", ")
            )));
        }
        let event = Event {
            at_ms: now,
            body: EventBody::QuestionAnswered { question, answer },
        };
        match live.record(id, event, &self.metrics) {
            Ok(Applied::Changed { .. }) => {
                Ok((live.seq, live.machine.question_continuation(question)))
            }
            Ok(Applied::Ignored(_)) => Err(Status::failed_precondition(format!(
                "question {question} was already answered"
            ))),
            Err(err) => Err(Status::failed_precondition(err.to_string())),
        }
    }

    fn start(
        &mut self,
        source: v1::start_execution_request::PlanSource,
        options: v1::ExecutionOptions,
        principal: &Principal,
        traceparent: String,
        now: u64,
    ) -> Result<(ExecutionId, bool), Status> {
        use v1::start_execution_request::PlanSource;
        let namespace = principal
            .namespace_for(&options.namespace)
            .map_err(|why| Status::permission_denied(format!("namespace: {why}")))?;
        access::check_namespace_name(&namespace)
            .map_err(|why| Status::invalid_argument(format!("namespace: {why}")))?;
        if let Some(access) = &self.access
            && access.quota(&namespace).is_none()
        {
            return Err(Status::invalid_argument(format!(
                "namespace: no namespace {namespace:?} in the access file (it declares: {})",
                access.namespaces().join(", ")
            )));
        }
        if !options.idempotency_key.is_empty()
            && let Some(id) = self
                .by_key
                .get(&(namespace.clone(), options.idempotency_key.clone()))
        {
            return Ok((*id, false));
        }
        if self.owned.is_empty() {
            return Err(Status::unavailable(
                "this coordinator owns no shard (it is a standby, or still recovering); \
                 start executions on the active coordinator",
            ));
        }
        let quota = self.quota(&namespace);
        let limits = self.limits.plan();
        let invalid = |source: &str, errors: PlanErrors| {
            let lines: Vec<String> = errors.iter().map(|e| format!("{source}: {e}")).collect();
            Status::invalid_argument(lines.join("\n"))
        };
        // The log records text that compiles to the same plan on recovery: spec text as sent
        // when it needs nothing else, otherwise the plan's canonical flat JSON spec.
        let (plan, text, format) = match source {
            PlanSource::Spec(spec) => {
                let source = if spec.source_name.is_empty() {
                    "plan"
                } else {
                    spec.source_name.as_str()
                };
                if spec.params.is_empty() {
                    let plan = compile_str(&spec.text, &limits).map_err(|e| invalid(source, e))?;
                    let format =
                        v1::PlanFormat::try_from(spec.format).unwrap_or(v1::PlanFormat::Yaml);
                    (plan, spec.text, format)
                } else {
                    let plan =
                        plan::compile_wire_spec(&spec, &limits).map_err(|e| invalid(source, e))?;
                    let text = plan::canonical_spec_json(&plan);
                    (plan, text, v1::PlanFormat::Json)
                }
            }
            PlanSource::Plan(plan) => {
                let plan = plan::compile_wire_plan(&plan, &limits)
                    .map_err(|e| invalid("plan_source.plan", e))?;
                let text = plan::canonical_spec_json(&plan);
                (plan, text, v1::PlanFormat::Json)
            }
        };
        let violations = quota.check_plan(&plan);
        if !violations.is_empty() {
            let lines: Vec<String> = violations.iter().map(ToString::to_string).collect();
            return Err(Status::permission_denied(format!(
                "the plan uses failure actions namespace {namespace:?} may not use:\n{}",
                lines.join("\n")
            )));
        }
        // The quota's cap is enforced at run time: the plan runs with it, and the log records
        // it so every replay compiles the same plan.
        let asked = plan.options.max_concurrency;
        let capped = quota.cap_concurrency(asked);
        let max_concurrency_cap = (capped != asked).then_some(capped).flatten();
        let mut plan = plan;
        plan.options.max_concurrency = capped;
        // `ExecutionStarted` logs the spec whole, in one message with up to a batch of other
        // events: refuse what the NATS server would refuse, rather than retry that append forever.
        let max_payload = self.nats.server_info().max_payload;
        if max_payload > 0 && text.len() + STARTED_HEADROOM > max_payload {
            return Err(Status::invalid_argument(format!(
                "the plan's spec is {} bytes, and the log records it in one NATS message, which \
                 this NATS server limits to {max_payload} bytes: raise the server's max_payload \
                 (Trellis documents {} bytes) or split the plan",
                text.len(),
                trellis_bus::MAX_PAYLOAD
            )));
        }
        // An id whose shard this coordinator owns: expected tries = shards / owned shards.
        let (id, shard) = loop {
            let id = ExecutionId(uuid::Uuid::now_v7());
            let shard = self.shard_of(id);
            if self.owned.contains(&shard) {
                break (id, shard);
            }
        };
        let plan_name = plan.name.clone();
        let machine = Execution::start(id, Arc::new(plan), 1, now);
        let started = log::started_to_proto(
            id,
            &log::Started {
                plan_name,
                run_number: 1,
                spec: text,
                format,
                started_at_ms: now,
                idempotency_key: options.idempotency_key.clone(),
                labels: options
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                namespace: namespace.to_string(),
                max_concurrency_cap,
                traceparent: traceparent.clone(),
            },
        );
        let tenancy = Tenancy {
            namespace: namespace.clone(),
            checkpoints_allowed: quota.checkpoints,
            traceparent,
        };
        let mut live = Live::new(machine, options.labels.clone(), now, shard, tenancy);
        live.seq = 1;
        live.pending.push(started);
        live.index_put = true;
        self.executions.insert(id, live);
        if !options.idempotency_key.is_empty() {
            self.by_key
                .insert((namespace.clone(), options.idempotency_key), id);
        }
        self.metrics
            .executions_started
            .get_or_create(&[("namespace", namespace.to_string())])
            .inc();
        tracing::info!(%id, shard, %namespace, caller = %principal.name, "execution started");
        Ok((id, true))
    }

    fn control(&mut self, id: ExecutionId, control: Control, now: u64) -> Result<i32, Status> {
        let live = self.executions.get_mut(&id).ok_or_else(|| not_found(id))?;
        let body = match control {
            Control::Pause(reason) => EventBody::PauseRequested { reason },
            Control::Resume => EventBody::ResumeRequested,
            Control::Cancel(reason) => EventBody::CancelRequested { reason },
        };
        live.record(id, Event { at_ms: now, body }, &self.metrics)
            .map_err(|err| Status::failed_precondition(err.to_string()))?;
        Ok(read::execution_state_to_proto(live.machine.state()))
    }

    fn retry(&mut self, id: ExecutionId, now: u64) -> Result<u32, Status> {
        let live = self.executions.get_mut(&id).ok_or_else(|| not_found(id))?;
        let state = live.machine.state();
        if !matches!(state, ExecutionState::Failed | ExecutionState::Cancelled) {
            return Err(Status::failed_precondition(format!(
                "execution {id} is {}; only a failed or cancelled execution can run again",
                state.as_str()
            )));
        }
        let run = live.machine.run_number() + 1;
        live.record(
            id,
            Event {
                at_ms: now,
                body: EventBody::RunStarted { run },
            },
            &self.metrics,
        )
        .map_err(|err| Status::failed_precondition(err.to_string()))?;
        live.index_put = true;
        tracing::info!(%id, run, "execution run started");
        Ok(run)
    }

    // ------------------------------------------------------------------------------------------
    // flush
    // ------------------------------------------------------------------------------------------

    /// Writes the turn's events, then its side effects. Returns the executions whose append was
    /// refused because another coordinator wrote their log: they were dropped and are reloaded.
    async fn flush(&mut self, now: u64) -> HashSet<ExecutionId> {
        let dirty = std::mem::take(&mut self.dirty);
        // (0) The index learns of new executions (and runs) before their first event, so a
        // coordinator taking the shard over finds every execution that has a log.
        let mut puts = Vec::new();
        for id in &dirty {
            if let Some(live) = self.executions.get(id)
                && live.index_put
                && !live.pending.is_empty()
            {
                puts.push((*id, shards::index_key(live.shard, *id)));
            }
        }
        if !puts.is_empty() {
            let results = join_all(
                puts.iter()
                    .map(|(_, key)| self.index.put(key, Bytes::from_static(b"1"))),
            )
            .await;
            for ((id, key), result) in puts.into_iter().zip(results) {
                if let Err(err) = result {
                    tracing::warn!(%id, %err, "index write failed; retrying");
                    let shutdown = self.shutdown.clone();
                    retry_until(&shutdown, || self.index.put(&key, Bytes::from_static(b"1"))).await;
                }
                if let Some(live) = self.executions.get_mut(&id) {
                    live.index_put = false;
                    live.indexed = true;
                }
            }
        }

        // (1) The log, one round per chunk so each append names the sequence it follows.
        let append_started = std::time::Instant::now();
        let mut n_events = 0u64;
        let mut queues: Vec<(ExecutionId, VecDeque<(u64, Bytes)>)> = Vec::new();
        for id in &dirty {
            let Some(live) = self.executions.get(id) else {
                continue;
            };
            if live.pending.is_empty() {
                continue;
            }
            n_events += live.pending.len() as u64;
            let chunks = live
                .pending
                .chunks(EVENTS_PER_MESSAGE)
                .map(|chunk| {
                    let first = chunk[0].sequence;
                    let batch = v1::EventBatch {
                        events: chunk.to_vec(),
                    };
                    (first, Bytes::from(batch.encode_to_vec()))
                })
                .collect();
            queues.push((*id, chunks));
        }
        let mut fenced = HashSet::new();
        while queues.iter().any(|(_, q)| !q.is_empty()) {
            let mut round = Vec::new();
            for (id, queue) in &mut queues {
                let Some((first, bytes)) = queue.pop_front() else {
                    continue;
                };
                let Some(live) = self.executions.get(id) else {
                    continue;
                };
                let mut headers = append_headers(*id, first, live.stream_seq);
                if propagation::enabled() {
                    // Readers of the log (the checkpoint-store) continue the execution's trace.
                    let span = tracing::info_span!(
                        "events.append",
                        otel.kind = "producer",
                        execution_id = %id,
                        first_sequence = first,
                    );
                    propagation::set_parent(&span, live.trace.clone());
                    propagation::inject_nats(&propagation::context_of(&span), &mut headers);
                }
                let publish = self.js.publish_with_headers(
                    subjects::events(*id),
                    headers.clone(),
                    bytes.clone(),
                );
                round.push((*id, first, bytes, headers, publish));
            }
            let mut pending_acks = Vec::with_capacity(round.len());
            for (id, first, bytes, headers, publish) in round {
                pending_acks.push((id, first, bytes, headers, publish.await));
            }
            for (id, first, bytes, headers, publish) in pending_acks {
                let outcome = match publish {
                    Ok(ack) => match ack.await {
                        Ok(ack) if !ack.duplicate => Appended::Stored(ack.sequence),
                        Ok(ack) => self.check_duplicate(id, ack.sequence, &bytes).await,
                        Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => {
                            Appended::Fenced(err.to_string())
                        }
                        Err(err) => {
                            tracing::warn!(%id, %err, "event log append not acknowledged; retrying");
                            self.append_until_stored(id, &headers, &bytes).await
                        }
                    },
                    Err(err) => {
                        tracing::warn!(%id, %err, "cannot append to the event log; retrying");
                        self.append_until_stored(id, &headers, &bytes).await
                    }
                };
                match outcome {
                    Appended::Stored(stream_seq) => {
                        if let Some(live) = self.executions.get_mut(&id) {
                            live.stream_seq = stream_seq;
                            live.log.push((first, bytes));
                        }
                    }
                    Appended::Fenced(why) => {
                        tracing::warn!(%id, %why, "another coordinator wrote this log; reloading it");
                        fenced.insert(id);
                        if let Some((_, queue)) = queues.iter_mut().find(|(q, _)| *q == id) {
                            queue.clear();
                        }
                    }
                    Appended::ShuttingDown => {
                        fenced.insert(id);
                    }
                }
            }
        }
        if n_events > 0 {
            self.metrics.events_appended.inc_by(n_events);
            self.metrics
                .append_seconds
                .observe(append_started.elapsed().as_secs_f64());
        }
        for id in &fenced {
            if let Some(live) = self.executions.remove(id) {
                self.by_key.retain(|_, v| v != id);
                if !self.shutdown.is_cancelled() && self.owned.contains(&live.shard) {
                    self.loading.entry(*id).or_default();
                    self.spawn_reload(live.shard, *id);
                }
            }
        }

        // (2) Side effects, now that the log holds what caused them. Assignments go out in
        // chunks whose acks are awaited together: the client holds at most a few thousand
        // unacknowledged publishes.
        let mut outgoing = Vec::new();
        let mut finished = Vec::new();
        for id in &dirty {
            let Some(live) = self.executions.get_mut(id) else {
                continue;
            };
            live.dirty = false;
            for instance in live.dispatch.drain(..) {
                let Some(assignment) = live.machine.assignment(instance) else {
                    continue;
                };
                let mut message =
                    worker::assignment_to_proto(*id, live.machine.run_number(), &assignment);
                message.results_shard = Some(live.shard);
                let mut headers = HeaderMap::new();
                headers.insert(
                    subjects::MSG_ID_HEADER,
                    subjects::task_msg_id(instance, assignment.attempt).as_str(),
                );
                self.metrics
                    .dispatched
                    .get_or_create(&metrics::task_labels(
                        assignment.queue,
                        assignment.task_type,
                    ))
                    .inc();
                if propagation::enabled() {
                    // The worker's run of the task is a child of this span.
                    let span = tracing::info_span!(
                        "task.dispatch",
                        otel.kind = "producer",
                        execution_id = %id,
                        task_instance_id = %instance,
                        task_id = assignment.task_id,
                        attempt = assignment.attempt,
                        queue = assignment.queue,
                    );
                    propagation::set_parent(&span, live.trace.clone());
                    propagation::inject_nats(&propagation::context_of(&span), &mut headers);
                }
                let subject = subjects::tasks(assignment.queue);
                let payload = Bytes::from(message.encode_to_vec());
                outgoing.push((subject, headers, payload));
            }
            for instance in live.stop.drain(..) {
                let cancel = v1::CancelTask {
                    execution_id: id.to_string(),
                    task_instance_id: instance.to_string(),
                    attempt: live.machine.attempt(instance).unwrap_or(0),
                    reason: live.machine.reason().unwrap_or("cancelled").to_owned(),
                };
                let _ = self
                    .nats
                    .publish(subjects::cancel(instance), cancel.encode_to_vec().into())
                    .await;
            }
            let terminal = live.machine.state().is_terminal();
            // The log holds this turn's events by now (an execution whose append was refused
            // was dropped above), the last ones included.
            if terminal && live.indexed {
                finished.push(shards::index_key(live.shard, *id));
                live.indexed = false;
                self.metrics
                    .executions_finished
                    .get_or_create(&[
                        ("namespace", live.namespace.to_string()),
                        ("state", live.machine.state().as_str().to_owned()),
                    ])
                    .inc();
            }
            live.progress_due |= !live.pending.is_empty();
            // Idle executions (woken only by the clock tick) publish nothing: a snapshot costs a
            // pass over every instance.
            let progress = (live.progress_due
                && (terminal || now >= live.last_progress_ms + PROGRESS_EVERY_MS))
                .then(|| read::progress_to_proto(&live.machine.progress(now)));
            if let Some(progress) = &progress {
                live.last_progress_ms = now;
                live.progress_due = false;
                let _ = self
                    .nats
                    .publish(subjects::progress(id), progress.encode_to_vec().into())
                    .await;
            }
            let events = std::mem::take(&mut live.pending);
            if events.is_empty() && progress.is_none() {
                continue;
            }
            if live.observers.receiver_count() > 0 && !events.is_empty() {
                let mut items: Vec<v1::ObserveExecutionResponse> = events
                    .into_iter()
                    .map(|event| v1::ObserveExecutionResponse {
                        event: Some(event),
                        progress: None,
                    })
                    .collect();
                if let Some(last) = items.last_mut() {
                    last.progress = progress;
                }
                let _ = live.observers.send(Arc::new(Flushed { items, terminal }));
            }
        }
        for chunk in outgoing.chunks(PUBLISH_CHUNK) {
            let mut publishes = Vec::with_capacity(chunk.len());
            for (subject, headers, payload) in chunk {
                let publish = self
                    .js
                    .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                    .await;
                publishes.push((subject.clone(), headers.clone(), payload.clone(), publish));
            }
            self.await_assignments(publishes).await;
        }
        // Finished executions leave the index once their last event is stored; a crash before
        // this only means the next owner loads them, sees them finished and removes them. The
        // deletes are queued on the connection here, so a later put of the same key (a new run)
        // follows them, but their acks are not waited for: a lost delete leaves only a key the
        // next owner removes.
        for key in finished {
            match shards::queue_delete(&self.js, &key).await {
                Ok(ack) => {
                    tokio::spawn(async move {
                        if let Err(err) = ack.await {
                            tracing::debug!(%key, %err, "index delete not acknowledged");
                        }
                    });
                }
                Err(err) => tracing::debug!(%key, %err, "index delete not sent"),
            }
        }
        fenced
    }

    /// A duplicate ack means JetStream already held a message with this id: ours, stored by an
    /// earlier attempt whose ack was lost, or another coordinator's.
    async fn check_duplicate(&self, id: ExecutionId, stream_seq: u64, bytes: &Bytes) -> Appended {
        match self.streams.events.get_raw_message(stream_seq).await {
            Ok(stored) if stored.payload == *bytes => Appended::Stored(stream_seq),
            Ok(_) => Appended::Fenced(format!("message id of {id} already used by another writer")),
            Err(err) => Appended::Fenced(format!("cannot check a duplicate append: {err}")),
        }
    }

    /// Retries an append until JetStream stores it, refuses it, or the coordinator stops.
    async fn append_until_stored(
        &self,
        id: ExecutionId,
        headers: &HeaderMap,
        bytes: &Bytes,
    ) -> Appended {
        let mut backoff = Duration::from_millis(50);
        loop {
            if self.shutdown.is_cancelled() {
                return Appended::ShuttingDown;
            }
            let attempt = async {
                self.js
                    .publish_with_headers(subjects::events(id), headers.clone(), bytes.clone())
                    .await?
                    .await
            };
            match attempt.await {
                Ok(ack) if !ack.duplicate => return Appended::Stored(ack.sequence),
                Ok(ack) => return self.check_duplicate(id, ack.sequence, bytes).await,
                Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => {
                    return Appended::Fenced(err.to_string());
                }
                Err(err) => tracing::warn!(%id, %err, "event log append failed; retrying"),
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return Appended::ShuttingDown,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Awaits the acks of published task assignments; those not stored are published again until
    /// they are (the message id makes that safe).
    async fn await_assignments(
        &self,
        publishes: Vec<(
            String,
            HeaderMap,
            Bytes,
            Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError>,
        )>,
    ) {
        let mut acks = Vec::with_capacity(publishes.len());
        let mut again = Vec::new();
        for (subject, headers, payload, publish) in publishes {
            match publish {
                Ok(ack) => acks.push((subject, headers, payload, ack.into_future())),
                Err(_) => again.push((subject, headers, payload)),
            }
        }
        let (meta, futures): (Vec<_>, Vec<_>) =
            acks.into_iter().map(|(s, h, p, f)| ((s, h, p), f)).unzip();
        for (meta, ack) in meta.into_iter().zip(join_all(futures).await) {
            if ack.is_err() {
                again.push(meta);
            }
        }
        for (subject, headers, payload) in again {
            tracing::warn!(%subject, "task assignment not stored; publishing it again");
            retry_until(&self.shutdown, || async {
                self.js
                    .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                    .await?
                    .await
                    .map(|_| ())
            })
            .await;
        }
    }

    // ------------------------------------------------------------------------------------------
    // checkpoints
    // ------------------------------------------------------------------------------------------

    /// Starts the checkpoints that are due: on an interval while the state changes, once per
    /// pause, and on demand.
    fn checkpoints(&mut self, now: u64) {
        let Some(store) = &self.store else {
            return;
        };
        for (id, live) in &mut self.executions {
            let ckpt = &mut live.checkpoint;
            if ckpt.in_flight || !live.pending.is_empty() || !live.checkpoints_allowed {
                continue;
            }
            let paused = live.machine.state() == ExecutionState::Paused;
            if !paused {
                ckpt.paused_done = false;
            }
            let changed = live.seq > ckpt.seq;
            if !ckpt.waiting.is_empty() && !changed && ckpt.id.is_some() {
                // Nothing new since the last one: that one is the answer.
                if let Some(metadata) = &ckpt.metadata {
                    for reply in ckpt.waiting.drain(..) {
                        let _ = reply.send(Ok(metadata.clone()));
                    }
                    continue;
                }
            }
            let due = !ckpt.waiting.is_empty()
                || (changed && paused && !ckpt.paused_done)
                || (changed
                    && !live.machine.state().is_terminal()
                    && now >= ckpt.at_ms + self.checkpoint_every_ms);
            if !due {
                continue;
            }
            let delta = match &ckpt.id {
                Some(base) if ckpt.since_full + 1 < FULL_EVERY && ckpt.seq >= live.log_base => {
                    checkpoints::delta_state(&live.log, ckpt.seq).map(|state| (base.clone(), state))
                }
                _ => None,
            };
            let full = delta.is_none();
            let (kind, base, state, format) = match delta {
                Some((base, state)) => (v1::CheckpointKind::Delta, base, state, 1),
                None => (
                    v1::CheckpointKind::Full,
                    String::new(),
                    live.machine.snapshot(),
                    trellis_core::machine::SNAPSHOT_FORMAT_VERSION,
                ),
            };
            let checkpoint = v1::Checkpoint {
                metadata: Some(v1::CheckpointMetadata {
                    checkpoint_id: uuid::Uuid::now_v7().to_string(),
                    execution_id: id.to_string(),
                    event_sequence: live.seq,
                    stream_sequence: live.stream_seq,
                    kind: kind.into(),
                    base_checkpoint_id: base,
                    checksum_sha256: Vec::new(),
                    created_at_unix_ms: now as i64,
                    size_bytes: 0,
                    state_format_version: format,
                }),
                state,
            };
            ckpt.in_flight = true;
            ckpt.at_ms = now;
            if paused {
                ckpt.paused_done = true;
            }
            let store = store.clone();
            let tx = self.tx.clone();
            let (id, sequence) = (*id, live.seq);
            let metrics = self.metrics.clone();
            let span = if propagation::enabled() {
                let span = tracing::info_span!(
                    "checkpoint.create",
                    execution_id = %id,
                    sequence,
                    full,
                );
                propagation::set_parent(&span, live.trace.clone());
                span
            } else {
                tracing::Span::none()
            };
            let kind = if full { "full" } else { "delta" };
            let size = checkpoint.state.len() as f64;
            let work = async move {
                let started = std::time::Instant::now();
                let result = store.create(checkpoint).await;
                let labels = [("kind", kind.to_owned())];
                match &result {
                    Ok(_) => {
                        metrics
                            .checkpoint_seconds
                            .get_or_create(&labels)
                            .observe(started.elapsed().as_secs_f64());
                        metrics
                            .checkpoint_bytes
                            .get_or_create(&labels)
                            .observe(size);
                    }
                    Err(_) => {
                        metrics.checkpoint_failures.inc();
                    }
                }
                if full
                    && result.is_ok()
                    && let Err(err) = store.prune(id, KEEP_FULL).await
                {
                    tracing::debug!(%id, %err, "pruning checkpoints failed");
                }
                let _ = tx
                    .send(Input::CheckpointDone {
                        id,
                        full,
                        sequence,
                        result,
                    })
                    .await;
            };
            tokio::spawn(work.instrument(span));
        }
    }

    fn checkpoint_done(
        &mut self,
        id: ExecutionId,
        full: bool,
        sequence: u64,
        result: Result<v1::CheckpointMetadata, String>,
    ) {
        let Some(live) = self.executions.get_mut(&id) else {
            return;
        };
        let ckpt = &mut live.checkpoint;
        ckpt.in_flight = false;
        match result {
            Ok(metadata) => {
                tracing::debug!(%id, sequence, full, "checkpoint stored");
                ckpt.seq = sequence;
                ckpt.id = Some(metadata.checkpoint_id.clone());
                ckpt.since_full = if full { 0 } else { ckpt.since_full + 1 };
                for reply in ckpt.waiting.drain(..) {
                    let _ = reply.send(Ok(metadata.clone()));
                }
                ckpt.metadata = Some(metadata);
            }
            Err(err) => {
                tracing::warn!(%id, %err, "checkpoint not stored");
                for reply in ckpt.waiting.drain(..) {
                    let _ = reply.send(Err(Status::unavailable(format!(
                        "the checkpoint-store did not take the checkpoint: {err}"
                    ))));
                }
            }
        }
    }
}

/// What became of an append.
enum Appended {
    Stored(u64),
    /// Another writer extended the log: this coordinator must not.
    Fenced(String),
    ShuttingDown,
}

fn append_headers(id: ExecutionId, first: u64, expected_stream_seq: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        subjects::MSG_ID_HEADER,
        subjects::event_msg_id(id, first).as_str(),
    );
    headers.insert(
        EXPECTED_LAST_SUBJECT_SEQ,
        expected_stream_seq.to_string().as_str(),
    );
    headers
}

/// Runs `attempt` until it succeeds or the coordinator stops, backing off between tries.
async fn retry_until<F, Fut, T, E>(shutdown: &CancellationToken, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        match attempt().await {
            Ok(_) => return,
            Err(err) => tracing::debug!(%err, "retrying a publish"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Recovers one execution, retrying while NATS cannot be read; `None` when its log is empty or
/// malformed (reported).
async fn recover_with_retry(
    events: &jetstream::stream::Stream,
    store: Option<&StoreClient>,
    id: ExecutionId,
) -> Option<Recovered> {
    let mut backoff = Duration::from_millis(100);
    loop {
        match recovery::recover(events, store, id).await {
            Ok(recovered) => return recovered,
            Err(err @ recovery::RecoveryError::Malformed { .. }) => {
                tracing::error!(%id, %err, "execution cannot be recovered");
                return None;
            }
            Err(err) => {
                tracing::warn!(%id, %err, "recovery read failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Decodes the log from sequence `from` on.
fn history(log: &[(u64, Bytes)], from: u64) -> Vec<v1::Event> {
    // The batch holding `from` is the last one starting at or before it.
    let start = log
        .partition_point(|(first, _)| *first <= from)
        .saturating_sub(1);
    let mut events = Vec::new();
    for (_, bytes) in &log[start..] {
        match v1::EventBatch::decode(bytes.clone()) {
            Ok(batch) => events.extend(batch.events.into_iter().filter(|e| e.sequence >= from)),
            // The bytes were encoded by this process; failing to decode them is a bug.
            Err(err) => tracing::error!(%err, "cannot decode an event batch of the log"),
        }
    }
    events
}

/// The event that fails the attempt a refused result names: a worker that breaks the contract
/// (an output that is not JSON, a group the state machine refuses, ...) ends its attempt, not
/// retryable, with the reason, instead of leaving it running. `None` when the result does not
/// name an attempt.
fn failed_by_invalid_result(
    result: &v1::TaskResult,
    now: u64,
    why: &dyn std::fmt::Display,
) -> Option<(ExecutionId, Event)> {
    let id = result.execution_id.parse().ok()?;
    let instance = result.task_instance_id.parse().ok()?;
    let body = EventBody::TaskFailed {
        instance,
        attempt: result.attempt,
        error: format!("the worker sent a result the coordinator refuses: {why}"),
        retryable: false,
        usage: Usage::default(),
    };
    Some((id, Event { at_ms: now, body }))
}

/// Turns a result whose payload is over `max_bytes` (a completed output, a step's state, a
/// spawned subtask's input) into a failure of the attempt that is not retried, since the same
/// work would produce the same payload. Returns why, when it did.
fn enforce_payload_limit(result: &mut v1::TaskResult, max_bytes: usize) -> Option<String> {
    use v1::task_result::Outcome;
    let over = match result.outcome.as_ref()? {
        Outcome::Completed(completed) => {
            (completed.output.len() > max_bytes).then_some(("output", completed.output.len()))
        }
        Outcome::StepCheckpoint(step) => (step.merged_state.len() > max_bytes)
            .then_some(("the state of step", step.merged_state.len())),
        Outcome::Spawned(spawned) => spawned
            .group
            .as_ref()
            .and_then(|group| group.members.iter().map(|m| m.input.len()).max())
            .filter(|largest| *largest > max_bytes)
            .map(|largest| ("a subtask's input", largest)),
        _ => None,
    };
    let (what, size) = over?;
    let why = format!(
        "{what} is {size} bytes, over the deployment's limit of {max_bytes} bytes \
         (limits.max_payload_bytes of the access file)"
    );
    result.outcome = Some(Outcome::Failed(v1::task_result::Failed {
        error: why.clone(),
        retryable: false,
    }));
    Some(why)
}

fn not_found(id: ExecutionId) -> Status {
    Status::not_found(format!("no execution {id}"))
}

/// Pulls the results of one shard in batches and hands them to the engine, until `stop`. The
/// durable consumer is created afresh when the shard is taken over (and after NATS errors), so
/// results the previous owner took but never acknowledged are delivered again at once rather
/// than after the ack wait.
async fn consume_results(
    results: jetstream::stream::Stream,
    shard: u32,
    tx: mpsc::Sender<Input>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if stop.is_cancelled() {
            return;
        }
        let _ = results
            .delete_consumer(&format!("coordinator-{shard}"))
            .await;
        let messages = match trellis_bus::results_consumer(&results, shard).await {
            Ok(consumer) => consumer
                .stream()
                .max_messages_per_batch(1000)
                .messages()
                .await
                .map_err(|err| err.to_string()),
            Err(err) => Err(err.to_string()),
        };
        let mut messages = match messages {
            Ok(messages) => messages,
            Err(err) => {
                tracing::warn!(shard, %err, "cannot consume task results; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        loop {
            let first = tokio::select! {
                () = stop.cancelled() => return,
                next = messages.next() => next,
            };
            let Some(first) = first else { break };
            let mut batch = Vec::with_capacity(64);
            let mut failed = false;
            let mut next = Some(first);
            // Take whatever else is already buffered, without waiting.
            while let Some(item) = next.take() {
                match item {
                    Ok(message) => batch.push(message),
                    Err(err) => {
                        tracing::warn!(shard, %err, "results consumer failed; starting it again");
                        failed = true;
                        break;
                    }
                }
                if batch.len() >= 2000 {
                    break;
                }
                next = futures::FutureExt::now_or_never(messages.next()).flatten();
            }
            if !batch.is_empty() && tx.send(Input::Results(batch)).await.is_err() {
                return;
            }
            if failed {
                break;
            }
        }
    }
}
