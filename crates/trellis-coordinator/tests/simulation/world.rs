//! The simulated cluster: coordinators running the real pure turn, workers, a client, and the
//! simulated NATS between them, all advanced by one seeded generator.
//!
//! Each coordinator does what the executor does, in the same order, with a fault possible at
//! every boundary: the turn's inputs; its appends (fenced); `appended`; the assignments, cancels
//! and index deletes; the acknowledgements; the answers. The faults of one seed are drawn from:
//! a coordinator crash between any two of those steps (it restarts later, empty, under the same
//! id), a coordinator that stalls past its lease TTL and comes back stale (its leases taken
//! over), worker deaths (also between publishing a result and acknowledging its task), results
//! duplicated, delayed and reordered, expiring task messages, slow attempts past their
//! deadline, questions answered late, and recoveries that read the log before a takeover's
//! appends land.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use trellis_coordinator::turn::{Append, Config, Consumed, Coordinator, Input, ReplyTo, Request};
use trellis_core::ids::{ExecutionId, QuestionId};
use trellis_proto::v1;
use trellis_wire::log;

use crate::checks::Checker;
use crate::nats::Nats;
use crate::rng::Rng;
use crate::worker::Worker;
use crate::{Bug, plans};

pub(crate) const SHARDS: u32 = 6;
pub(crate) const N_COORDINATORS: usize = 3;
pub(crate) const N_WORKERS: usize = 3;
pub(crate) const LEASE_TTL: u64 = 300;
/// The task messages' ack wait, which running workers keep extending.
pub(crate) const TASK_ACK_WAIT: u64 = 150;
/// The results consumers' ack wait.
pub(crate) const RESULT_ACK_WAIT: u64 = 1_000;
/// How long the message-id de-duplication of the work queue lasts: far shorter than JetStream's
/// two minutes relative to the tasks, so a takeover that sent again what a worker still runs
/// would run it twice (`no_double_runs`).
pub(crate) const DUPLICATE_WINDOW: u64 = 50;
pub(crate) const TICK: u64 = 20;
/// Faults are injected until this time; then the cluster heals and must finish everything.
pub(crate) const FAULTS_UNTIL: u64 = 3_000;
/// Everything must have completed by then.
pub(crate) const DEADLINE: u64 = 60_000;

/// A request a client made, waiting for its answer.
#[derive(Debug)]
pub(crate) enum Call {
    Start {
        plan: usize,
    },
    /// The worker list, which must show these workers (up, heard from since the coordinator
    /// started) as not terminated.
    Workers {
        alive: BTreeSet<usize>,
    },
    Answer {
        id: ExecutionId,
        question: QuestionId,
    },
}

/// A simulated coordinator process.
#[derive(Debug)]
pub(crate) struct Node {
    /// The pure turn; `None` while the process is down.
    pub(crate) turn: Option<Coordinator>,
    /// Restarts of this process, so late reports of a former life are dropped.
    pub(crate) incarnation: u64,
    pub(crate) inbox: Vec<Input>,
    /// Leases held: shard → revision of the last write.
    pub(crate) leases: BTreeMap<u32, u64>,
    pub(crate) last_renewal: u64,
    pub(crate) last_tick: u64,
    /// Paused (a long GC, a frozen VM) until then: no turn, no renewal.
    pub(crate) stalled_until: u64,
    pub(crate) down_until: u64,
    /// Shards whose results this process consumes, as far as it knows. The durable consumer
    /// is one per shard: a process whose consumer another took re-creates it (the real consumer
    /// loop deletes and re-creates it after an error), until it is told to stop.
    pub(crate) consuming: BTreeSet<u32>,
    /// Workers whose heartbeats this process received since it started.
    pub(crate) heard: BTreeSet<usize>,
    /// Result messages taken and not acknowledged: a batch's message waits for all its results,
    /// as the executor's does.
    pub(crate) consumed: Consumed<Taken>,
    pub(crate) calls: BTreeMap<ReplyTo, Call>,
    pub(crate) next_reply: ReplyTo,
    /// The appends of a turn frozen before it wrote them.
    pub(crate) suspended: Option<Vec<Append>>,
    /// Shards to hand over (no longer renewed), with the revision of their lease.
    pub(crate) releasing: Vec<(u32, u64)>,
    /// Shards handed over in the turn under way: their leases are deleted once its effects are
    /// carried out.
    pub(crate) released: Vec<(u32, u64)>,
}

/// A result message a coordinator took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// From a shard's results stream: (shard, sequence).
    Stream(usize, u64),
    /// A worker's hand-off, by id.
    Handoff(u64),
}

/// Work reported back to a coordinator later: recoveries take time.
#[derive(Debug)]
pub(crate) struct Later {
    pub(crate) node: usize,
    pub(crate) incarnation: u64,
    pub(crate) input: Input,
}

/// Appends refused for not following the log, over every run of the process.
pub static FENCED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Shards handed over gracefully (their lease deleted after the handover turn), over every run.
pub static HANDOVERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Recoveries that started from a checkpoint, over every run of the process.
pub static RESTORED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Checkpoints stored, over every run of the process.
pub static CHECKPOINTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Results handed off to a coordinator instead of published, over all seeds.
pub static HANDED_OFF: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Assignments offered to the workers and taken, refused (sent to the queue) or lost, over all
/// seeds.
pub static OFFERS_TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static OFFERS_REFUSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static OFFERS_LOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Results published in batches of several, over all seeds.
pub static BATCHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Assignments coordinators sent in batches, over every seed run.
pub static ASSIGNMENTS_BATCHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// New executions whose first append went out on a reserved id (no index write before it).
pub static RESERVED_STARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// True when `TRELLIS_SIM_VERBOSE` asks for a trace of the run.
pub(crate) fn verbose() -> bool {
    std::env::var_os("TRELLIS_SIM_VERBOSE").is_some()
}

/// The whole cluster.
pub struct World {
    pub(crate) now: u64,
    pub(crate) rng: Rng,
    pub(crate) bug: Option<Bug>,
    pub(crate) nats: Nats,
    pub(crate) nodes: Vec<Node>,
    pub(crate) workers: Vec<Worker>,
    pub(crate) checker: Checker,
    pub(crate) store: crate::store::Store,
    pub(crate) later: BTreeMap<(u64, u64), Later>,
    pub(crate) later_seq: u64,
    /// The client's plans: spec text, whether started, whether a start is in flight.
    pub(crate) plans: Vec<(u64, String, bool)>,
    pub(crate) answering: BTreeMap<QuestionId, bool>,
    /// Faults are being injected.
    pub(crate) faults: bool,
    pub(crate) last_heartbeats: u64,
    pub(crate) steps: u64,
}

impl World {
    pub fn new(seed: u64, bug: Option<Bug>) -> Self {
        let mut rng = Rng::new(seed);
        let mut nats = Nats::new(SHARDS);
        nats.events.no_fencing = bug == Some(Bug::NoFencing);
        let n_plans = rng.between(1, 3);
        let plans: Vec<(u64, String, bool)> = (0..n_plans)
            .map(|idx| {
                let at = rng.between(0, 1_500);
                (at, plans::plan(&mut rng, &format!("plan-{idx}")), false)
            })
            .collect();
        if std::env::var_os("TRELLIS_SIM_VERBOSE").is_some() {
            for (at, plan, _) in &plans {
                eprintln!("plan at +{at} ms: {plan}");
            }
        }
        let nodes = (0..N_COORDINATORS)
            .map(|idx| Node {
                turn: Some(coordinator(seed, idx, 0)),
                incarnation: 0,
                inbox: Vec::new(),
                leases: BTreeMap::new(),
                last_renewal: 0,
                last_tick: 0,
                stalled_until: 0,
                down_until: 0,
                consuming: BTreeSet::new(),
                heard: BTreeSet::new(),
                consumed: Consumed::default(),
                calls: BTreeMap::new(),
                next_reply: 0,
                suspended: None,
                releasing: Vec::new(),
                released: Vec::new(),
            })
            .collect();
        Self {
            now: 1_000_000,
            rng,
            bug,
            nats,
            nodes,
            // Odd seeds have a worker of 3 slots: while it lives each assignment goes alone,
            // while it is down the others' slots let a few share a message; even seeds' workers
            // all have room for batches.
            workers: (0..N_WORKERS)
                .map(|idx| {
                    let smallest = if seed % 2 == 1 { 3 } else { 12 };
                    Worker::new(idx, [smallest, 8, 16][idx % 3])
                })
                .collect(),
            checker: Checker::default(),
            store: crate::store::Store::default(),
            later: BTreeMap::new(),
            later_seq: 0,
            plans,
            answering: BTreeMap::new(),
            faults: true,
            last_heartbeats: 0,
            steps: 0,
        }
    }

    /// Runs until every plan completed (or the deadline); returns the first violation.
    pub fn run(&mut self) -> Result<(), String> {
        let start = self.now;
        for plan in &mut self.plans {
            plan.0 += start;
        }
        loop {
            self.steps += 1;
            self.now += self.rng.between(0, 3);
            self.faults = self.now < start + FAULTS_UNTIL;
            let faults = self.faults;
            if faults {
                self.inject_faults();
            } else {
                self.heal();
            }
            self.deliver_later();
            let mut order: Vec<usize> = (0..self.nodes.len()).collect();
            shuffle(&mut self.rng, &mut order);
            for node in order {
                self.node_step(node)?;
            }
            for worker in &mut self.workers {
                worker.step(&mut self.nats, &mut self.rng, self.now, TASK_ACK_WAIT);
            }
            self.no_double_runs()?;
            self.heartbeats();
            self.client_step();
            self.checker.observe(&self.nats, SHARDS)?;
            for (idx, node) in self.nodes.iter().enumerate() {
                // A process frozen in the middle of a turn holds events it has not written yet.
                if let (Some(turn), None) = (&node.turn, &node.suspended) {
                    self.checker.compare(idx, turn)?;
                }
            }
            if !faults && self.done() {
                CHECKPOINTS.fetch_add(self.store.stored, std::sync::atomic::Ordering::Relaxed);
                self.checker.at_end(&self.nats)?;
                return self.ask_for_workers();
            }
            if self.now > start + DEADLINE {
                if std::env::var_os("TRELLIS_SIM_VERBOSE").is_some() {
                    self.explain();
                }
                self.checker.at_end(&self.nats)?;
                return Err("the run did not settle before its deadline".to_owned());
            }
        }
    }

    /// Prints what a stuck run holds: each log, the queues, the coordinators.
    pub(crate) fn explain(&self) {
        for id in self.nats.events.executions() {
            eprintln!("log of {id}:");
            for record in self.nats.events.log(id) {
                if let Ok(batch) = log::decode_event_batch(&record.payload) {
                    for (offset, entry) in batch.entries.iter().enumerate() {
                        eprintln!(
                            "  {} (stream {}, by {}): {entry:?}",
                            batch.first_sequence + offset as u64,
                            record.stream_seq,
                            record.writer
                        );
                    }
                }
            }
        }
        for (seq, message) in &self.nats.tasks.messages {
            let assignment = v1::TaskAssignment::decode(message.payload.clone());
            eprintln!(
                "task {seq}: {:?} {:?}",
                message.delivery,
                assignment.map(|a| (a.task_instance_id, a.attempt))
            );
        }
        for (shard, (queue, consumer)) in self.nats.results.iter().enumerate() {
            eprintln!(
                "results {shard}: consumer {consumer:?}, {} messages",
                queue.messages.len()
            );
        }
        for (idx, node) in self.nodes.iter().enumerate() {
            eprintln!(
                "coordinator {idx}: up {}, leases {:?}, executions {:?}",
                node.turn.is_some(),
                node.leases,
                node.turn
                    .as_ref()
                    .map(|t| t.execution_ids().collect::<Vec<_>>())
            );
        }
        eprintln!("leases: {:?}", self.nats.leases.entries);
    }

    /// Every worker that is up heartbeats to every coordinator process, each interval.
    fn heartbeats(&mut self) {
        let interval = trellis_bus::HEARTBEAT_INTERVAL.as_millis() as u64;
        if self.now < self.last_heartbeats + interval {
            return;
        }
        self.last_heartbeats = self.now;
        for worker in &self.workers {
            if !worker.up {
                continue;
            }
            let payload = worker.heartbeat(self.now, interval);
            for node in &mut self.nodes {
                if node.turn.is_some() {
                    node.heard.insert(worker.idx);
                    node.inbox.push(Input::Heartbeat(payload.clone()));
                }
            }
        }
    }

    /// Asks every coordinator for its workers once the run settled, and checks the answers.
    fn ask_for_workers(&mut self) -> Result<(), String> {
        for idx in 0..self.nodes.len() {
            let alive: BTreeSet<usize> = self.nodes[idx]
                .heard
                .iter()
                .copied()
                .filter(|worker| self.workers[*worker].up)
                .collect();
            let request = Request::Workers {
                queue: String::new(),
                include_terminated: true,
            };
            self.call(idx, Call::Workers { alive }, request);
        }
        for _ in 0..100 {
            self.now += 1;
            for idx in 0..self.nodes.len() {
                self.node_step(idx)?;
            }
            // Other calls may still wait (an answer to a finished execution waits for its log
            // to be loaded, which this loop does not deliver): only the worker lists count.
            let asking = |call: &Call| matches!(call, Call::Workers { .. });
            if !self
                .nodes
                .iter()
                .any(|node| node.calls.values().any(asking))
            {
                return Ok(());
            }
        }
        Err("a coordinator did not answer the worker list".to_owned())
    }

    /// True once every plan started and every execution in the log completed.
    pub(crate) fn done(&self) -> bool {
        self.plans.iter().all(|(_, _, started)| *started)
            && self.nats.events.executions().all(|id| {
                self.checker
                    .replicas
                    .get(&id)
                    .is_some_and(|r| r.machine.state().is_terminal())
            })
            && self.nats.indexed_with_log().next().is_none()
    }

    pub(crate) fn inject_faults(&mut self) {
        let now = self.now;
        for idx in 0..self.nodes.len() {
            let node = &mut self.nodes[idx];
            if node.turn.is_none() {
                if now >= node.down_until {
                    self.restart(idx);
                }
                continue;
            }
            if self.rng.one_in(700) {
                self.crash(idx);
            } else if self.rng.one_in(2_000) {
                // A graceful stop: the leases are released, so others take over at once.
                for (shard, revision) in std::mem::take(&mut self.nodes[idx].leases) {
                    self.nats.leases.release(shard, revision);
                }
                if verbose() {
                    eprintln!("{now}: coordinator {idx} stops gracefully");
                }
                self.crash(idx);
            } else if self.rng.one_in(1_500) {
                // A pause longer than the lease: another coordinator takes the shards over.
                self.nodes[idx].stalled_until = now + self.rng.between(LEASE_TTL, 3 * LEASE_TTL);
                if verbose() {
                    eprintln!(
                        "{now}: coordinator {idx} stalls until {}",
                        self.nodes[idx].stalled_until
                    );
                }
            }
        }
        for idx in 0..self.workers.len() {
            if !self.workers[idx].up {
                if self.rng.one_in(50) {
                    self.workers[idx].up = true;
                }
            } else if self.rng.one_in(600) {
                self.workers[idx].die();
            }
        }
        // A result published twice (a worker's retry), delivered whenever.
        if self.rng.one_in(40) {
            let shard = self.rng.index(self.nats.results.len());
            let queue = &mut self.nats.results[shard].0;
            let seqs: Vec<u64> = queue.messages.keys().copied().collect();
            if !seqs.is_empty() {
                let seq = seqs[self.rng.index(seqs.len())];
                let payload = queue.messages[&seq].payload.clone();
                let at = now + self.rng.between(0, 100);
                queue.publish(None, payload, at, 0);
            }
        }
    }

    /// After the faults: every process up, nothing stalled.
    pub(crate) fn heal(&mut self) {
        for idx in 0..self.nodes.len() {
            self.nodes[idx].stalled_until = 0;
            if self.nodes[idx].turn.is_none() {
                self.restart(idx);
            }
        }
        for worker in &mut self.workers {
            worker.up = true;
        }
    }

    pub(crate) fn crash(&mut self, idx: usize) {
        let down_for = self.rng.between(20, 400);
        if verbose() {
            eprintln!("{}: coordinator {idx} crashes for {down_for} ms", self.now);
        }
        let node = &mut self.nodes[idx];
        node.turn = None;
        node.suspended = None;
        node.releasing.clear();
        node.released.clear();
        node.inbox.clear();
        node.consumed = Consumed::default();
        node.leases.clear();
        node.consuming.clear();
        node.heard.clear();
        node.down_until = self.now + down_for;
        // The client's calls to it get no answer: they are made again.
        for (_, call) in std::mem::take(&mut node.calls) {
            self.forget_call(call);
        }
        // Its deliveries stay out until a new consumer takes the shard (and gets them at once).
        for (_, consumer) in &mut self.nats.results {
            if *consumer == Some(idx) {
                *consumer = None;
            }
        }
    }

    pub(crate) fn restart(&mut self, idx: usize) {
        let seed = self.rng.next_u64();
        let node = &mut self.nodes[idx];
        node.incarnation += 1;
        node.turn = Some(coordinator(seed, idx, node.incarnation));
        node.last_renewal = 0;
        node.last_tick = 0;
    }

    pub(crate) fn forget_call(&mut self, call: Call) {
        match call {
            Call::Start { plan } => self.plans[plan].2 = false,
            Call::Answer { question, .. } => {
                self.answering.remove(&question);
            }
            Call::Workers { .. } => {}
        }
    }

    pub(crate) fn deliver_later(&mut self) {
        while let Some(entry) = self.later.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let later = entry.remove();
            let node = &mut self.nodes[later.node];
            if node.turn.is_some() && node.incarnation == later.incarnation {
                node.inbox.push(later.input);
            }
        }
    }

    pub(crate) fn schedule(&mut self, node: usize, delay: u64, input: Input) {
        self.later_seq += 1;
        let incarnation = self.nodes[node].incarnation;
        self.later.insert(
            (self.now + delay, self.later_seq),
            Later {
                node,
                incarnation,
                input,
            },
        );
    }
}

/// A coordinator with the simulation's settings.
pub(crate) fn coordinator(seed: u64, idx: usize, incarnation: u64) -> Coordinator {
    Coordinator::new(
        Config {
            id: format!("coordinator-{idx}"),
            shards: SHARDS,
            checkpoint_every_ms: 100,
            checkpoint_store: true,
            access: None,
            max_message_bytes: 8 * 1024 * 1024,
            index_scan_every_ms: 500,
            seed: seed ^ ((idx as u64) << 40) ^ (incarnation << 20),
            keep_finished_ms: 300,
            // Breakers on, tripping often: holding dispatches must keep every invariant.
            breakers: trellis_coordinator::turn::BreakerConfig {
                failures: 2,
                cooldown_ms: 200,
            },
            // A small window, so executions keep tasks waiting for it: holding them back must
            // keep every invariant too.
            dispatch_window: 3,
            // Starts of plans of five tasks or more come twice, their state built between the
            // passes, while shards move as they do.
            build_off_the_loop: 5,
            // Small executions' assignments are offered to the workers first (`node::offer`) by
            // every other incarnation, so the queue still carries batches of assignments, and a
            // takeover meets attempts offered by the former owner.
            offers: (seed ^ incarnation ^ idx as u64).is_multiple_of(2),
        },
        &trellis_telemetry::Registry::default(),
    )
}

pub(crate) fn shuffle<T>(rng: &mut Rng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = rng.index(i + 1);
        items.swap(i, j);
    }
}

pub(crate) mod convert {
    pub use trellis_wire::log::decode_event_batch;

    /// The sequence of a batch's first event.
    pub fn first_sequence(payload: &[u8]) -> u64 {
        decode_event_batch(payload).map_or(0, |batch| batch.first_sequence)
    }
}
