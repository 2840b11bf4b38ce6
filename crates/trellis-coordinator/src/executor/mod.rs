//! The executor: the one task that drives the coordinator's pure turn ([`crate::turn`]) and
//! carries out its effects.
//!
//! Each turn of its loop takes whatever inputs are waiting (requests, batches of worker results,
//! heartbeats, a clock tick, lease changes, recovered executions), hands them to
//! [`Coordinator::turn`] with the time, and then, in this order: (1) answers what needs nothing
//! durable and starts recoveries; (2) writes the index entries of new executions, then appends
//! each execution's new events, all appends in flight together, each naming the stream sequence
//! it must follow so only one coordinator can ever extend a log, retried until stored; (3) hands
//! the outcomes to [`Coordinator::appended`] and carries out what it returns: task assignments
//! (sent; their acks are awaited beside the loop), stop messages, progress, observers, index
//! deletes; (4) acknowledges the consumed result messages (a batch of results once every one is
//! settled) and answers the writes; (5) starts checkpoints, loads and consumers. Requests
//! waiting beside many results take a turn of their own ahead of them ([`requests_ahead`]). A
//! crash between any two steps loses nothing: recovery re-issues what the log says is due, and
//! unacknowledged results are delivered again. A NATS outage stalls the loop instead of skipping
//! the log.

mod append;
mod background;
mod lanes;
mod publish;

pub(crate) use background::receive_heartbeats;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use trellis_core::ids::ExecutionId;
use trellis_proto::{results, subjects, v1};
use trellis_telemetry::{hops, propagation};

use crate::checkpoints::StoreClient;
use crate::failpoints::{self, Point};
use crate::metrics::{Metrics, TurnPhase};
use crate::shards::LeaseEvent;
use crate::turn::{
    Answer, Coordinator, Delivery, Error, Input, Observation, ReplyTo, Request, Writes,
};

/// How often executions with timers (retries, deadlines, expiring questions) are re-examined.
const TICK: Duration = Duration::from_millis(20);
/// Most inputs taken in one turn of the loop.
const MAX_INPUTS_PER_TURN: usize = 4096;
/// Results in one turn beyond which the turn's requests are decided in a turn of their own,
/// ahead of them.
const RESULTS_BEHIND_REQUESTS: usize = 64;
/// Capacity of each execution's observer channel, in flushed batches.
const OBSERVER_CAPACITY: usize = 4096;

/// Returns the wall clock in Unix milliseconds: the only clock the coordinator reads.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the observers of one execution receive per turn.
#[derive(Debug)]
pub(crate) struct Flushed {
    pub(crate) items: Vec<v1::ObserveExecutionResponse>,
    pub(crate) terminal: bool,
}

/// An answer, with the live channel of an observer.
type Answered = (Answer, Option<broadcast::Receiver<Arc<Flushed>>>);

/// What reaches the executor task.
pub(crate) enum Inbound {
    Request {
        request: Request,
        reply: oneshot::Sender<Result<Answered, Error>>,
    },
    Results(Vec<jetstream::Message>),
    Heartbeat(Bytes),
    Lease(LeaseEvent),
    /// Hand a shard over: drop it in a turn of its own, store its checkpoints, then say `done`
    /// (the lease keeper deletes the lease after).
    Release {
        shard: u32,
        done: oneshot::Sender<()>,
    },
    /// What a background task (recovery, checkpoint) reports.
    Input(Input),
}

/// A cheap handle to the executor task.
#[derive(Clone, Debug)]
pub(crate) struct Handle {
    tx: mpsc::Sender<Inbound>,
}

impl Handle {
    /// Asks the coordinator and waits for the answer.
    pub(crate) async fn ask(&self, request: Request) -> Result<Answer, Error> {
        self.ask_live(request).await.map(|(answer, _)| answer)
    }

    /// Asks to observe an execution: its history so far and the live channel after it.
    pub(crate) async fn observe(
        &self,
        request: Request,
    ) -> Result<(Observation, broadcast::Receiver<Arc<Flushed>>), Error> {
        match self.ask_live(request).await? {
            (Answer::Observation(observation), Some(live)) => Ok((observation, live)),
            (other, _) => Err(unexpected(&other)),
        }
    }

    async fn ask_live(&self, request: Request) -> Result<Answered, Error> {
        let (reply, rx) = oneshot::channel();
        let stopping = || Error::unavailable("the coordinator is shutting down");
        self.tx
            .send(Inbound::Request { request, reply })
            .await
            .map_err(|_| stopping())?;
        rx.await.map_err(|_| stopping())?
    }
}

/// The error for an answer of the wrong kind: a bug, said plainly rather than panicking.
pub(crate) fn unexpected(answer: &Answer) -> Error {
    Error::new(
        crate::turn::ErrorKind::Internal,
        format!("the coordinator answered with an unexpected {answer:?}"),
    )
}

/// How the executor is set up.
pub(crate) struct Setup {
    pub(crate) nats: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) streams: trellis_bus::Streams,
    pub(crate) index: kv::Store,
    /// The bucket `trellis_fences`.
    pub(crate) fences: kv::Store,
    pub(crate) store: Option<StoreClient>,
    pub(crate) metrics: Metrics,
    /// What this coordinator's record reports.
    pub(crate) stats: Arc<crate::cluster::Stats>,
}

/// The executor and the coordinator it drives.
pub(crate) struct Executor {
    coordinator: Coordinator,
    nats: async_nats::Client,
    js: jetstream::Context,
    streams: trellis_bus::Streams,
    index: kv::Store,
    fences: kv::Store,
    store: Option<StoreClient>,
    metrics: Metrics,
    tx: mpsc::Sender<Inbound>,
    shutdown: CancellationToken,
    replies: HashMap<ReplyTo, oneshot::Sender<Result<Answered, Error>>>,
    next_reply: ReplyTo,
    /// Result messages taken and not yet acknowledged.
    consumed: crate::turn::Consumed<jetstream::Message>,
    consumers: HashMap<u32, CancellationToken>,
    observers: HashMap<ExecutionId, broadcast::Sender<Arc<Flushed>>>,
    /// Shards to hand over after the current turn.
    releases: Vec<(u32, oneshot::Sender<()>)>,
    stats: Arc<crate::cluster::Stats>,
    /// Subtask groups settled per execution, counted only while the failpoint
    /// `group-settled` is armed.
    settled_groups: HashMap<ExecutionId, usize>,
    /// The queues whose workers take a fast lane.
    lanes: lanes::FastLanes,
}

impl Executor {
    /// Starts the executor task; returns its handle and the sender lease events and heartbeats
    /// go to.
    pub(crate) fn spawn(
        coordinator: Coordinator,
        setup: Setup,
        shutdown: CancellationToken,
    ) -> (Handle, mpsc::Sender<Inbound>) {
        let (tx, rx) = mpsc::channel(1024);
        let lanes = lanes::FastLanes::watch(setup.streams.tasks.clone(), shutdown.clone());
        let executor = Executor {
            coordinator,
            nats: setup.nats,
            js: setup.js,
            streams: setup.streams,
            index: setup.index,
            fences: setup.fences,
            store: setup.store,
            metrics: setup.metrics,
            tx: tx.clone(),
            shutdown,
            replies: HashMap::new(),
            next_reply: 0,
            consumed: crate::turn::Consumed::default(),
            consumers: HashMap::new(),
            observers: HashMap::new(),
            releases: Vec::new(),
            stats: setup.stats,
            settled_groups: HashMap::new(),
            lanes,
        };
        tokio::spawn(executor.run(rx));
        (Handle { tx: tx.clone() }, tx)
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Inbound>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_tick = 0;
        loop {
            let mut inputs = Vec::new();
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => break,
                inbound = rx.recv() => {
                    let Some(inbound) = inbound else { break };
                    self.take(inbound, &mut inputs);
                    let mut n = 1;
                    while n < MAX_INPUTS_PER_TURN {
                        match rx.try_recv() {
                            Ok(inbound) => self.take(inbound, &mut inputs),
                            Err(_) => break,
                        }
                        n += 1;
                    }
                }
                _ = tick.tick() => {}
            }
            let now = now_ms();
            // Timers are looked at every tick even while inputs keep the loop busy.
            if now >= last_tick + TICK.as_millis() as u64 {
                last_tick = now;
                inputs.push(Input::Tick);
                self.observers
                    .retain(|_, sender| sender.receiver_count() > 0);
            }
            self.stats.lag.store(
                (self.tx.max_capacity() - self.tx.capacity()) as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            match requests_ahead(inputs) {
                Ok(inputs) => self.one_turn(inputs, now).await,
                Err((ahead, results)) => {
                    self.one_turn(ahead, now).await;
                    self.one_turn(results, now_ms()).await;
                }
            }
            if !self.releases.is_empty() {
                self.hand_over().await;
            }
            self.stats.executions.store(
                self.coordinator.in_memory() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        for token in self.consumers.values() {
            token.cancel();
        }
        tracing::info!("coordinator engine stopped");
    }

    /// Runs one turn: decides, appends, then carries out what the appends allow.
    async fn one_turn(&mut self, inputs: Vec<Input>, now: u64) {
        // A timer's turn alone is not timed: the phases say what turns with work cost.
        let working = inputs.iter().any(|input| !matches!(input, Input::Tick));
        let started = Instant::now();
        let writes = self.coordinator.turn(inputs, now);
        let decided = started.elapsed();
        let settled = self.settles_groups(&writes);
        let appends = self.before_appends(writes);
        if !appends.is_empty() {
            failpoints::reached(Point::BeforeAppend);
        }
        let appending = !appends.is_empty();
        let appending_at = Instant::now();
        if appending {
            // A log's first append is a new execution's: a trace waiting for one watches it.
            hops::claim(
                appends
                    .iter()
                    .filter(|append| append.expected_stream_seq == 0)
                    .map(|append| append.id.0.as_u128()),
            );
            hops::mark_any(
                "coordinator.appending",
                appends.iter().map(|append| append.id.0.as_u128()),
            );
        }
        let outcomes = self.append(appends).await;
        if appending {
            hops::mark_any(
                "coordinator.appended",
                outcomes.iter().map(|(id, _)| id.0.as_u128()),
            );
            self.metrics
                .turn_phase(TurnPhase::Append, appending_at.elapsed());
        }
        // Only an armed failpoint looks at the outcomes (`settled` is never set unarmed).
        if (settled || failpoints::is_armed(Point::AfterAppend))
            && outcomes
                .iter()
                .any(|(_, outcome)| matches!(outcome, crate::turn::Appended::Stored { .. }))
        {
            failpoints::reached(Point::AfterAppend);
            if settled {
                failpoints::reached(Point::GroupSettled);
            }
        }
        let deciding_at = Instant::now();
        let effects = self.coordinator.appended(outcomes, now);
        let decided = decided + deciding_at.elapsed();
        let effects_at = Instant::now();
        self.carry_out(effects).await;
        if working || appending {
            self.metrics.turn_phase(TurnPhase::Decide, decided);
            self.metrics
                .turn_phase(TurnPhase::Effects, effects_at.elapsed());
        }
    }

    /// Whether the turn's appends settle a subtask group; looked at only while the failpoint
    /// `group-settled` is armed.
    fn settles_groups(&mut self, writes: &Writes) -> bool {
        if !failpoints::is_armed(Point::GroupSettled) {
            return false;
        }
        let mut settled = false;
        for append in &writes.appends {
            let Some(execution) = self.coordinator.execution(append.id) else {
                continue;
            };
            let n = execution.groups().filter(|group| group.2).count();
            settled |= self.settled_groups.insert(append.id, n).unwrap_or(0) < n;
        }
        settled
    }

    /// Hands shards over in a turn of their own, after a turn whose appends are all stored:
    /// their executions are checkpointed where behind and dropped, their results no longer
    /// consumed. The lease keeper releases the leases once told.
    async fn hand_over(&mut self) {
        let releases = std::mem::take(&mut self.releases);
        let inputs = releases
            .iter()
            .map(|(shard, _)| Input::LeaseReleased(*shard))
            .collect();
        self.one_turn(inputs, now_ms()).await;
        for (_, done) in releases {
            let _ = done.send(());
        }
    }

    /// Turns what reached the task into the turn's inputs, keeping what must be answered or
    /// acknowledged later.
    fn take(&mut self, inbound: Inbound, inputs: &mut Vec<Input>) {
        match inbound {
            Inbound::Request { request, reply } => {
                hops::mark("coordinator.request");
                self.next_reply += 1;
                self.replies.insert(self.next_reply, reply);
                inputs.push(Input::Request {
                    reply: self.next_reply,
                    request,
                });
            }
            Inbound::Results(messages) => {
                let mut deliveries = Vec::with_capacity(messages.len());
                for message in messages {
                    self.deliver(message, &mut deliveries);
                }
                hops::mark_any(
                    "coordinator.taken",
                    deliveries
                        .iter()
                        .filter_map(|delivery| result_execution(&delivery.payload)),
                );
                inputs.push(Input::Results(deliveries));
            }
            Inbound::Heartbeat(payload) => inputs.push(Input::Heartbeat(payload)),
            Inbound::Lease(LeaseEvent::Acquired(shard)) => inputs.push(Input::LeaseAcquired(shard)),
            Inbound::Lease(LeaseEvent::Lost(shard)) => inputs.push(Input::LeaseLost(shard)),
            Inbound::Release { shard, done } => self.releases.push((shard, done)),
            Inbound::Input(input) => inputs.push(input),
        }
    }

    /// Takes one consumed result message: a result alone, or a batch of them, each a delivery of
    /// its own. A message marked a batch that does not decode can never be applied: it is logged
    /// and terminated.
    fn deliver(&mut self, message: jetstream::Message, deliveries: &mut Vec<Delivery>) {
        if batch_len(&message).is_none() {
            let span = result_span(|| propagation::extract_nats(message.headers.as_ref()));
            let payload = message.payload.clone();
            let token = self.consumed.take(message, 1).start;
            deliveries.push(Delivery {
                token,
                payload,
                span,
            });
            return;
        }
        let entries = match results::unpack_batch(&message.payload) {
            Ok(entries) if !entries.is_empty() => entries,
            Ok(_) => return terminate(message, "a result batch with no results".to_owned()),
            Err(error) => return terminate(message, format!("not a TaskResultBatch: {error}")),
        };
        let tokens = self.consumed.take(message, entries.len());
        for (token, entry) in tokens.zip(entries) {
            let span = result_span(|| propagation::from_traceparent(&entry.traceparent));
            deliveries.push(Delivery {
                token,
                payload: Bytes::from(entry.result),
                span,
            });
        }
    }

    /// Does what the turn asks before its appends, and returns the appends.
    fn before_appends(&mut self, writes: Writes) -> Vec<crate::turn::Append> {
        let Writes {
            replies,
            recover,
            scan,
            stop_consuming,
            forget,
            appends,
        } = writes;
        self.reply(replies);
        for shard in stop_consuming {
            if let Some(token) = self.consumers.remove(&shard) {
                token.cancel();
            }
        }
        for id in forget {
            self.observers.remove(&id);
        }
        for shard in recover {
            self.spawn_recover_shard(shard);
        }
        if !scan.is_empty() {
            self.spawn_scan(scan);
        }
        appends
    }

    /// Sends answers to their callers; an observer is subscribed to the execution's live channel
    /// as it gets its history, so nothing falls between them.
    fn reply(&mut self, replies: Vec<(ReplyTo, Result<Answer, Error>)>) {
        for (reply_to, answer) in replies {
            let Some(sender) = self.replies.remove(&reply_to) else {
                continue;
            };
            let answered = answer.map(|answer| {
                let live = match &answer {
                    Answer::Observation(observation) if !observation.terminal => Some(
                        self.observers
                            .entry(observation.execution)
                            .or_insert_with(|| broadcast::channel(OBSERVER_CAPACITY).0)
                            .subscribe(),
                    ),
                    Answer::Observation(_) => Some(broadcast::channel(1).1),
                    _ => None,
                };
                (answer, live)
            });
            let _ = sender.send(answered);
        }
    }
}

/// Splits a turn's inputs in two when they hold requests and more than
/// [`RESULTS_BEHIND_REQUESTS`] results: `Err((ahead, results))`, everything but the results to
/// decide first, then the results; else `Ok(inputs)`, one turn as they are.
///
/// Under load a turn of a few thousand results takes milliseconds to decide and append; a
/// caller's start, cancel or query that came in meanwhile then waits for the turn in progress
/// only, not for the next one's results as well. Any order of inputs from different sources is
/// one the loop could have taken them in, and the results keep theirs.
fn requests_ahead(inputs: Vec<Input>) -> Result<Vec<Input>, (Vec<Input>, Vec<Input>)> {
    let mut requests = false;
    let mut results = 0;
    for input in &inputs {
        match input {
            Input::Request { .. } => requests = true,
            Input::Results(deliveries) => results += deliveries.len(),
            _ => {}
        }
    }
    if !requests || results <= RESULTS_BEHIND_REQUESTS {
        return Ok(inputs);
    }
    Err(inputs
        .into_iter()
        .partition(|input| !matches!(input, Input::Results(_))))
}

/// The span a result is applied in: a child of the worker's run, so dispatch → run → result is
/// one line of the trace. `Span::none()` when traces are not exported.
fn result_span(parent: impl FnOnce() -> propagation::Context) -> tracing::Span {
    if !propagation::enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(
        "task.result",
        otel.kind = "consumer",
        execution_id = tracing::field::Empty,
        task_instance_id = tracing::field::Empty,
        attempt = tracing::field::Empty,
    );
    propagation::set_parent(&span, parent());
    span
}

/// How many results a message carries when it is a batch (its batch header; 1 when the value is
/// no number: decoding it tells); `None` for a result alone.
fn batch_len(message: &jetstream::Message) -> Option<usize> {
    let value = message
        .headers
        .as_ref()?
        .get(subjects::RESULT_BATCH_HEADER)?;
    Some(value.as_str().parse::<usize>().map_or(1, |n| n.max(1)))
}

/// The execution a result's payload names, as the bits a trace's marks take (read only while a
/// trace watches an execution).
fn result_execution(result: &[u8]) -> Option<u128> {
    hops::id_bits(&results::execution_of(result)?)
}

/// The executions of a consumed result message's results, as [`result_execution`].
fn message_executions(message: &jetstream::Message) -> Vec<u128> {
    if batch_len(message).is_none() {
        return result_execution(&message.payload).into_iter().collect();
    }
    results::unpack_batch(&message.payload)
        .unwrap_or_default()
        .iter()
        .filter_map(|entry| result_execution(&entry.result))
        .collect()
}

/// Terminates a result message that can never be applied (JetStream will not deliver it again).
fn terminate(message: jetstream::Message, why: String) {
    tracing::warn!(subject = %message.subject, %why, "result message set aside");
    tokio::spawn(async move {
        let _ = message.ack_with(jetstream::AckKind::Term).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(first: u64, n: u64) -> Input {
        Input::Results(
            (first..first + n)
                .map(|token| Delivery {
                    token,
                    payload: Bytes::new(),
                    span: tracing::Span::none(),
                })
                .collect(),
        )
    }

    fn request(reply: ReplyTo) -> Input {
        Input::Request {
            reply,
            request: Request::Workers {
                queue: String::new(),
                include_terminated: false,
            },
        }
    }

    /// What each turn holds, in order: a request by its reply, results by their tokens.
    fn shape(inputs: &[Input]) -> Vec<String> {
        inputs
            .iter()
            .map(|input| match input {
                Input::Request { reply, .. } => format!("request {reply}"),
                Input::Results(deliveries) => format!(
                    "results {}..{}",
                    deliveries[0].token,
                    deliveries[deliveries.len() - 1].token + 1
                ),
                Input::Tick => "tick".to_owned(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn requests_go_ahead_of_many_results_which_keep_their_order() {
        let inputs = vec![
            results(0, 40),
            request(1),
            results(40, 40),
            Input::Tick,
            request(2),
        ];
        let Err((ahead, behind)) = requests_ahead(inputs) else {
            panic!("80 results behind two requests were not split off");
        };
        assert_eq!(shape(&ahead), ["request 1", "tick", "request 2"]);
        assert_eq!(shape(&behind), ["results 0..40", "results 40..80"]);
    }

    #[test]
    fn a_turn_stays_whole_without_requests_or_with_few_results() {
        let few = vec![results(0, RESULTS_BEHIND_REQUESTS as u64), request(1)];
        let Ok(few) = requests_ahead(few) else {
            panic!("a turn of few results was split");
        };
        assert_eq!(shape(&few), ["results 0..64", "request 1"]);
        let no_requests = vec![results(0, 500), Input::Tick];
        let Ok(no_requests) = requests_ahead(no_requests) else {
            panic!("a turn without requests was split");
        };
        assert_eq!(shape(&no_requests), ["results 0..500", "tick"]);
    }
}
