//! The engine: one task that owns every live execution's state machine and event log.
//!
//! Each turn of its loop takes whatever inputs are waiting (requests, a batch of worker results, a
//! clock tick), applies them, lets every touched execution `decide`, and then flushes in this
//! order: (1) each execution's new events as one `EventBatch` message on its log subject, all
//! publishes in flight together and awaited; (2) only then the side effects: task assignments on
//! the work queues (de-duplicated by `Nats-Msg-Id` = `<instance>:<attempt>`), stop messages for
//! cancelled tasks, progress snapshots; (3) acknowledgements of the consumed result messages and
//! replies to callers. A crash between (1) and (2) loses nothing: the log says what is due.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream;
use futures::StreamExt;
use futures::future::join_all;
use prost::Message as _;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use trellis_core::ids::{ExecutionId, QuestionId, TaskInstanceId};
use trellis_core::machine::{Applied, Event, EventBody, Execution};
use trellis_core::plan::{Limits, compile_str};
use trellis_proto::{convert, subjects, v1};

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
/// Task assignments published before their acks are awaited.
const PUBLISH_CHUNK: usize = 1000;

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
    pub(crate) history: Vec<v1::Event>,
    pub(crate) terminal: bool,
    pub(crate) live: broadcast::Receiver<Arc<Flushed>>,
}

type Reply<T> = oneshot::Sender<Result<T, Status>>;

/// Requests from the gRPC layer.
pub(crate) enum Request {
    Start {
        spec: v1::PlanSpec,
        options: v1::ExecutionOptions,
        reply: Reply<(ExecutionId, bool)>,
    },
    Control {
        id: ExecutionId,
        control: Control,
        reply: Reply<i32>,
    },
    Answer {
        id: ExecutionId,
        question: QuestionId,
        answer: String,
        reply: Reply<(u64, Option<TaskInstanceId>)>,
    },
    Get {
        id: ExecutionId,
        reply: Reply<v1::Execution>,
    },
    List {
        reply: Reply<Vec<v1::Execution>>,
    },
    Graph {
        id: ExecutionId,
        reply: Reply<v1::ExecutionGraph>,
    },
    Observe {
        id: ExecutionId,
        from: u64,
        reply: Reply<Observation>,
    },
}

enum Input {
    Request(Request),
    Results(Vec<jetstream::Message>),
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
}

struct Live {
    machine: Execution,
    labels: HashMap<String, String>,
    created_at_ms: u64,
    /// The last sequence appended (or about to be).
    seq: u64,
    /// The log so far as the encoded `EventBatch` messages appended, with each one's first
    /// sequence: compact, and what observers replay from.
    log: Vec<(u64, bytes::Bytes)>,
    pending: Vec<v1::Event>,
    dispatch: Vec<TaskInstanceId>,
    stop: Vec<TaskInstanceId>,
    observers: broadcast::Sender<Arc<Flushed>>,
    last_progress_ms: u64,
    /// The state changed since the last progress snapshot was published.
    progress_due: bool,
    dirty: bool,
}

impl Live {
    /// Applies an event and, when it changed the state, queues it for the log. Returns what apply
    /// said.
    fn record(
        &mut self,
        id: ExecutionId,
        event: Event,
    ) -> Result<Applied, trellis_core::machine::ApplyError> {
        let applied = self.machine.apply(&event)?;
        if let Applied::Changed { stop } = &applied {
            self.seq += 1;
            self.pending
                .push(convert::event_to_proto(id, self.seq, &event));
            self.stop.extend_from_slice(stop);
            if let EventBody::TaskDispatched { instance, .. } = event.body {
                self.dispatch.push(instance);
            }
        }
        Ok(applied)
    }

    /// Lets the machine decide until it has nothing more to do now.
    fn decide(&mut self, id: ExecutionId, now: u64) {
        for _ in 0..1_000 {
            let commands = self.machine.decide(now);
            if commands.is_empty() {
                return;
            }
            for command in commands {
                if let Err(err) = self.record(id, command.into_event(now)) {
                    // A decision the machine refuses is a bug in the machine; stop deciding for
                    // this turn rather than loop.
                    tracing::error!(%id, %err, "decision refused");
                    return;
                }
            }
        }
    }

    fn summary(&self, id: ExecutionId, now: u64) -> v1::Execution {
        let progress = convert::progress_to_proto(&self.machine.progress(now));
        v1::Execution {
            execution_id: id.to_string(),
            name: self.machine.plan().name.clone(),
            state: convert::execution_state_to_proto(self.machine.state()),
            run_number: 1,
            counts: progress.counts,
            usage: Some(convert::usage_to_proto(self.machine.usage())),
            created_at_unix_ms: self.created_at_ms as i64,
            started_at_unix_ms: Some(self.created_at_ms as i64),
            ended_at_unix_ms: None,
            reason: self.machine.reason().unwrap_or_default().to_owned(),
            last_sequence: self.seq,
            labels: self.labels.clone(),
            open_questions: Vec::new(),
            progress: Some(progress),
        }
    }
}

/// The engine, before it is spawned.
pub(crate) struct Engine {
    nats: async_nats::Client,
    js: jetstream::Context,
    shards: u32,
    executions: HashMap<ExecutionId, Live>,
    by_key: HashMap<String, ExecutionId>,
    dirty: Vec<ExecutionId>,
}

impl Engine {
    pub(crate) fn new(nats: async_nats::Client, js: jetstream::Context, shards: u32) -> Self {
        Self {
            nats,
            js,
            shards: shards.max(1),
            executions: HashMap::new(),
            by_key: HashMap::new(),
            dirty: Vec::new(),
        }
    }

    /// Starts the engine task and one results consumer per shard; returns the handle.
    pub(crate) async fn spawn(
        self,
        streams: &trellis_bus::Streams,
        shutdown: CancellationToken,
    ) -> Result<Handle, crate::Error> {
        let (tx, rx) = mpsc::channel(1024);
        for shard in 0..self.shards {
            let consumer = trellis_bus::results_consumer(&streams.results, shard).await?;
            tokio::spawn(consume_results(consumer, tx.clone(), shutdown.clone()));
        }
        tokio::spawn(self.run(rx, shutdown));
        Ok(Handle { tx })
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Input>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut replies: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
            let mut acks: Vec<jetstream::Message> = Vec::new();
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
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
                    live.decide(*id, now);
                }
            }
            self.flush(now).await;
            join_all(acks.iter().map(|m| m.ack())).await;
            for reply in replies {
                reply();
            }
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

    fn handle(
        &mut self,
        input: Input,
        replies: &mut Vec<Box<dyn FnOnce() + Send>>,
        acks: &mut Vec<jetstream::Message>,
    ) {
        match input {
            Input::Results(messages) => {
                tracing::debug!(n_results = messages.len(), "results received");
                let now = now_ms();
                for message in messages {
                    self.result(&message, now);
                    acks.push(message);
                }
            }
            Input::Request(request) => self.request(request, replies),
        }
    }

    fn result(&mut self, message: &jetstream::Message, now: u64) {
        let result = match v1::TaskResult::decode(message.payload.clone()) {
            Ok(result) => result,
            Err(err) => {
                tracing::warn!(subject = %message.subject, %err, "corrupt task result set aside");
                return;
            }
        };
        let (id, event) = match convert::result_to_event(&result, now) {
            Ok(converted) => converted,
            Err(err) => {
                tracing::warn!(subject = %message.subject, %err, "invalid task result set aside");
                return;
            }
        };
        let Some(live) = self.executions.get_mut(&id) else {
            tracing::warn!(%id, "task result for an unknown execution set aside");
            return;
        };
        match live.record(id, event) {
            Ok(Applied::Changed { .. }) => self.mark(id),
            Ok(Applied::Ignored(reason)) => {
                tracing::debug!(%id, ?reason, "duplicate task result ignored")
            }
            Err(err) => tracing::warn!(%id, %err, "task result refused"),
        }
    }

    fn request(&mut self, request: Request, replies: &mut Vec<Box<dyn FnOnce() + Send>>) {
        let now = now_ms();
        match request {
            Request::Start {
                spec,
                options,
                reply,
            } => {
                let result = self.start(spec, options, now);
                if let Ok((id, _)) = &result {
                    self.mark(*id);
                }
                // Replied after the flush: the caller learns the id once ExecutionStarted is durable.
                replies.push(Box::new(move || {
                    let _ = reply.send(result);
                }));
            }
            Request::Control { id, control, reply } => {
                let result = self.control(id, control, now);
                if result.is_ok() {
                    self.mark(id);
                }
                replies.push(Box::new(move || {
                    let _ = reply.send(result);
                }));
            }
            Request::Answer {
                id,
                question,
                answer,
                reply,
            } => {
                let result = match self.executions.get_mut(&id) {
                    None => Err(not_found(id)),
                    Some(live) => {
                        let event = Event {
                            at_ms: now,
                            body: EventBody::QuestionAnswered { question, answer },
                        };
                        match live.record(id, event) {
                            Ok(Applied::Changed { .. }) => Ok((live.seq, None)),
                            Ok(Applied::Ignored(_)) => Err(Status::failed_precondition(format!(
                                "question {question} was already answered"
                            ))),
                            Err(err) => Err(Status::failed_precondition(err.to_string())),
                        }
                    }
                };
                if result.is_ok() {
                    self.mark(id);
                }
                replies.push(Box::new(move || {
                    let _ = reply.send(result);
                }));
            }
            Request::Get { id, reply } => {
                let _ = reply.send(
                    self.executions
                        .get(&id)
                        .map(|live| live.summary(id, now))
                        .ok_or_else(|| not_found(id)),
                );
            }
            Request::List { reply } => {
                let mut all: Vec<_> = self
                    .executions
                    .iter()
                    .map(|(id, live)| live.summary(*id, now))
                    .collect();
                all.sort_by(|a, b| b.execution_id.cmp(&a.execution_id));
                let _ = reply.send(Ok(all));
            }
            Request::Graph { id, reply } => {
                let result = match self.executions.get(&id) {
                    None => Err(not_found(id)),
                    Some(live) => trellis_core::graph::build(live.machine.records())
                        .map(|graph| convert::graph_to_proto(&graph))
                        .map_err(|err| Status::internal(format!("execution graph of {id}: {err}"))),
                };
                let _ = reply.send(result);
            }
            Request::Observe { id, from, reply } => {
                let result = match self.executions.get(&id) {
                    None => Err(not_found(id)),
                    Some(live) => {
                        let skip = from.saturating_sub(1) as usize;
                        Ok(Observation {
                            history: history(&live.log, skip as u64 + 1),
                            terminal: live.machine.state().is_terminal() && live.pending.is_empty(),
                            live: live.observers.subscribe(),
                        })
                    }
                };
                let _ = reply.send(result);
            }
        }
    }

    fn start(
        &mut self,
        spec: v1::PlanSpec,
        options: v1::ExecutionOptions,
        now: u64,
    ) -> Result<(ExecutionId, bool), Status> {
        if !options.idempotency_key.is_empty()
            && let Some(id) = self.by_key.get(&options.idempotency_key)
        {
            return Ok((*id, false));
        }
        let plan = compile_str(&spec.text, &Limits::default()).map_err(|errors| {
            let source = if spec.source_name.is_empty() {
                "plan"
            } else {
                spec.source_name.as_str()
            };
            let lines: Vec<String> = errors.iter().map(|e| format!("{source}: {e}")).collect();
            Status::invalid_argument(lines.join("\n"))
        })?;
        let id = ExecutionId(uuid::Uuid::now_v7());
        let plan_name = plan.name.clone();
        let machine = Execution::start(id, Arc::new(plan), 1, now);
        let (observers, _) = broadcast::channel(OBSERVER_CAPACITY);
        let format = v1::PlanFormat::try_from(spec.format).unwrap_or(v1::PlanFormat::Yaml);
        let started = convert::started_to_proto(
            id,
            &convert::Started {
                plan_name,
                run_number: 1,
                spec: spec.text,
                format,
                started_at_ms: now,
                idempotency_key: options.idempotency_key.clone(),
                labels: options
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            },
        );
        let live = Live {
            machine,
            labels: options.labels.clone(),
            created_at_ms: now,
            seq: 1,
            log: Vec::new(),
            pending: vec![started],
            dispatch: Vec::new(),
            stop: Vec::new(),
            observers,
            last_progress_ms: 0,
            progress_due: true,
            dirty: false,
        };
        self.executions.insert(id, live);
        if !options.idempotency_key.is_empty() {
            self.by_key.insert(options.idempotency_key, id);
        }
        tracing::info!(%id, "execution started");
        Ok((id, true))
    }

    fn control(&mut self, id: ExecutionId, control: Control, now: u64) -> Result<i32, Status> {
        let live = self.executions.get_mut(&id).ok_or_else(|| not_found(id))?;
        let body = match control {
            Control::Pause(reason) => EventBody::PauseRequested { reason },
            Control::Resume => EventBody::ResumeRequested,
            Control::Cancel(reason) => EventBody::CancelRequested { reason },
        };
        live.record(id, Event { at_ms: now, body })
            .map_err(|err| Status::failed_precondition(err.to_string()))?;
        Ok(convert::execution_state_to_proto(live.machine.state()))
    }

    async fn flush(&mut self, now: u64) {
        let dirty = std::mem::take(&mut self.dirty);
        // (1) The log first.
        let mut appends = Vec::new();
        for id in &dirty {
            let Some(live) = self.executions.get(id) else {
                continue;
            };
            if live.pending.is_empty() {
                continue;
            }
            // One message per chunk keeps every append well under the server's payload limit.
            for chunk in live.pending.chunks(EVENTS_PER_MESSAGE) {
                let first = chunk[0].sequence;
                let batch = v1::EventBatch {
                    events: chunk.to_vec(),
                };
                let bytes = bytes::Bytes::from(batch.encode_to_vec());
                let mut headers = HeaderMap::new();
                headers.insert(subjects::MSG_ID_HEADER, format!("{id}:{first}").as_str());
                let publish =
                    self.js
                        .publish_with_headers(subjects::events(id), headers, bytes.clone());
                appends.push((*id, first, bytes, publish));
            }
        }
        let mut acks = Vec::with_capacity(appends.len());
        for (id, first, bytes, publish) in appends {
            match publish.await {
                Ok(ack) => acks.push((id, first, bytes, ack)),
                Err(err) => tracing::error!(%id, %err, "cannot append to the event log"),
            }
        }
        for (id, first, bytes, ack) in acks {
            if let Err(err) = ack.await {
                tracing::error!(%id, %err, "event log append not acknowledged");
            }
            if let Some(live) = self.executions.get_mut(&id) {
                live.log.push((first, bytes));
            }
        }
        // (2) Side effects, now that the log holds what caused them. Assignments go out in
        // chunks whose acks are awaited together: the client holds at most a few thousand
        // unacknowledged publishes.
        let mut publishes = Vec::new();
        for id in &dirty {
            let Some(live) = self.executions.get_mut(id) else {
                continue;
            };
            live.dirty = false;
            for instance in live.dispatch.drain(..) {
                let Some(assignment) = live.machine.assignment(instance) else {
                    continue;
                };
                let message = convert::assignment_to_proto(*id, 1, &assignment);
                let mut headers = HeaderMap::new();
                headers.insert(
                    subjects::MSG_ID_HEADER,
                    subjects::task_msg_id(instance, assignment.attempt).as_str(),
                );
                publishes.push(
                    self.js
                        .publish_with_headers(
                            subjects::tasks(assignment.queue),
                            headers,
                            message.encode_to_vec().into(),
                        )
                        .await,
                );
                if publishes.len() >= PUBLISH_CHUNK {
                    await_acks(std::mem::take(&mut publishes)).await;
                }
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
            live.progress_due |= !live.pending.is_empty();
            // Idle executions (woken only by the clock tick) publish nothing: a snapshot costs a
            // pass over every instance.
            let progress = (live.progress_due
                && (terminal || now >= live.last_progress_ms + PROGRESS_EVERY_MS))
                .then(|| convert::progress_to_proto(&live.machine.progress(now)));
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
        await_acks(publishes).await;
    }
}

/// Decodes the log from sequence `from` on.
fn history(log: &[(u64, bytes::Bytes)], from: u64) -> Vec<v1::Event> {
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

/// Awaits the acks of published task assignments.
async fn await_acks(
    publishes: Vec<Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError>>,
) {
    let mut acks = Vec::with_capacity(publishes.len());
    for publish in publishes {
        match publish {
            Ok(ack) => acks.push(ack.into_future()),
            Err(err) => tracing::error!(%err, "cannot publish a task assignment"),
        }
    }
    for ack in join_all(acks).await {
        if let Err(err) = ack {
            tracing::error!(%err, "task assignment not acknowledged");
        }
    }
}

fn not_found(id: ExecutionId) -> Status {
    Status::not_found(format!("no execution {id}"))
}

/// Pulls results of one shard in batches and hands them to the engine.
async fn consume_results(
    consumer: jetstream::consumer::PullConsumer,
    tx: mpsc::Sender<Input>,
    shutdown: CancellationToken,
) {
    let mut messages = match consumer
        .stream()
        .max_messages_per_batch(1000)
        .messages()
        .await
    {
        Ok(messages) => messages,
        Err(err) => {
            tracing::error!(%err, "cannot consume task results");
            return;
        }
    };
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => return,
            next = messages.next() => next,
        };
        let Some(first) = first else { return };
        let mut batch = Vec::with_capacity(64);
        let mut next = Some(first);
        // Take whatever else is already buffered, without waiting.
        while let Some(item) = next.take() {
            match item {
                Ok(message) => batch.push(message),
                Err(err) => tracing::warn!(%err, "results consumer"),
            }
            if batch.len() >= 2000 {
                break;
            }
            next = futures::FutureExt::now_or_never(messages.next()).flatten();
        }
        if tx.send(Input::Results(batch)).await.is_err() {
            return;
        }
    }
}
