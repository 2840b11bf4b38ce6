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
//! settled) and answers the writes; (5) starts checkpoints, loads and consumers. Requests and
//! small executions' results waiting beside many results take a turn of their own ahead of them
//! ([`intake::ahead_of_results`]). A
//! crash between any two steps loses nothing: recovery re-issues what the log says is due, and
//! unacknowledged results are delivered again. A NATS outage stalls the loop instead of skipping
//! the log.

mod append;
mod background;
mod intake;
mod lanes;
mod offers;
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
use trellis_proto::v1;
use trellis_telemetry::hops;

use crate::checkpoints::StoreClient;
use crate::failpoints::{self, Point};
use crate::metrics::{Metrics, TurnPhase};
use crate::shards::LeaseEvent;
use crate::turn::{Answer, Coordinator, Error, Input, Observation, ReplyTo, Request, Writes};

/// How often executions with timers (retries, deadlines, expiring questions) are re-examined.
const TICK: Duration = Duration::from_millis(20);
/// Most inputs taken in one turn of the loop.
const MAX_INPUTS_PER_TURN: usize = 4096;
/// Results in one turn beyond which the turn's requests and small executions' results are
/// decided in a turn of their own, ahead of them.
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
pub(crate) type Answered = (Answer, Option<broadcast::Receiver<Arc<Flushed>>>);

/// What reaches the executor task.
pub(crate) enum Inbound {
    Request {
        request: Request,
        reply: oneshot::Sender<Result<Answered, Error>>,
    },
    Results(Vec<intake::Taken>),
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

    /// Asks and waits for the answer, with the live channel of an observer when the answer
    /// opens one ([`Answer::Observation`], [`Answer::Following`]).
    pub(crate) async fn ask_live(&self, request: Request) -> Result<Answered, Error> {
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
    consumed: crate::turn::Consumed<intake::Taken>,
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
    /// The queues whose offers found no worker listening lately.
    paused_offers: Arc<offers::Paused>,
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
            paused_offers: Arc::default(),
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
            match intake::ahead_of_results(inputs, |result| self.small_execution(result)) {
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
                let observation = match &answer {
                    Answer::Observation(observation) | Answer::Following { observation, .. } => {
                        Some(observation)
                    }
                    _ => None,
                };
                let live = observation.map(|observation| {
                    if observation.terminal {
                        broadcast::channel(1).1
                    } else {
                        self.observers
                            .entry(observation.execution)
                            .or_insert_with(|| broadcast::channel(OBSERVER_CAPACITY).0)
                            .subscribe()
                    }
                });
                (answer, live)
            });
            let _ = sender.send(answered);
        }
    }
}
