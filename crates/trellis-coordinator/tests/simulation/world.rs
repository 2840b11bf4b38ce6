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
use trellis_coordinator::recovery;
use trellis_coordinator::turn::{
    Ack, Action, Answer, Append, Appended, Config, Coordinator, Delivery, Effects, Error, Input,
    LogMessage, Recovered, ReplyTo, Request, Token, Writes,
};
use trellis_core::ids::{ExecutionId, QuestionId};
use trellis_grpc::access::{Principal, Scope};
use trellis_proto::{subjects, v1};
use trellis_wire::log;

use crate::checks::Checker;
use crate::nats::{AppendError, Nats};
use crate::rng::Rng;
use crate::worker::Worker;
use crate::{Bug, plans};

const SHARDS: u32 = 4;
const N_COORDINATORS: usize = 3;
const N_WORKERS: usize = 3;
const LEASE_TTL: u64 = 300;
/// The task messages' ack wait, which running workers keep extending.
const TASK_ACK_WAIT: u64 = 150;
/// The results consumers' ack wait.
const RESULT_ACK_WAIT: u64 = 1_000;
/// How long the message-id de-duplication of the work queue lasts.
const DUPLICATE_WINDOW: u64 = 120_000;
const TICK: u64 = 20;
/// Faults are injected until this time; then the cluster heals and must finish everything.
const FAULTS_UNTIL: u64 = 3_000;
/// Everything must have completed by then.
const DEADLINE: u64 = 60_000;

/// A request a client made, waiting for its answer.
#[derive(Debug)]
enum Call {
    Start {
        plan: usize,
    },
    Answer {
        id: ExecutionId,
        question: QuestionId,
    },
}

/// A simulated coordinator process.
#[derive(Debug)]
struct Node {
    /// The pure turn; `None` while the process is down.
    turn: Option<Coordinator>,
    /// Restarts of this process, so late reports of a former life are dropped.
    incarnation: u64,
    inbox: Vec<Input>,
    /// Leases held: shard → revision of the last write.
    leases: BTreeMap<u32, u64>,
    last_renewal: u64,
    last_tick: u64,
    /// Paused (a long GC, a frozen VM) until then: no turn, no renewal.
    stalled_until: u64,
    down_until: u64,
    /// Shards whose results this process consumes, as far as it knows. The durable consumer
    /// is one per shard: a process whose consumer another took re-creates it (the real consumer
    /// loop deletes and re-creates it after an error), until it is told to stop.
    consuming: BTreeSet<u32>,
    tokens: BTreeMap<Token, (usize, u64)>,
    next_token: Token,
    calls: BTreeMap<ReplyTo, Call>,
    next_reply: ReplyTo,
    /// The appends of a turn frozen before it wrote them.
    suspended: Option<Vec<Append>>,
}

/// Work reported back to a coordinator later: recoveries take time.
#[derive(Debug)]
struct Later {
    node: usize,
    incarnation: u64,
    input: Input,
}

/// Appends refused for not following the log, over every run of the process.
pub static FENCED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// True when `TRELLIS_SIM_VERBOSE` asks for a trace of the run.
fn verbose() -> bool {
    std::env::var_os("TRELLIS_SIM_VERBOSE").is_some()
}

/// The whole cluster.
pub struct World {
    pub now: u64,
    rng: Rng,
    bug: Option<Bug>,
    nats: Nats,
    nodes: Vec<Node>,
    workers: Vec<Worker>,
    checker: Checker,
    later: BTreeMap<(u64, u64), Later>,
    later_seq: u64,
    /// The client's plans: spec text, whether started, whether a start is in flight.
    plans: Vec<(u64, String, bool)>,
    answering: BTreeMap<QuestionId, bool>,
    /// Faults are being injected.
    faults: bool,
    pub steps: u64,
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
                tokens: BTreeMap::new(),
                next_token: 0,
                calls: BTreeMap::new(),
                next_reply: 0,
                suspended: None,
            })
            .collect();
        Self {
            now: 1_000_000,
            rng,
            bug,
            nats,
            nodes,
            workers: (0..N_WORKERS).map(|idx| Worker::new(idx, 3)).collect(),
            checker: Checker::default(),
            later: BTreeMap::new(),
            later_seq: 0,
            plans,
            answering: BTreeMap::new(),
            faults: true,
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
            self.client_step();
            self.checker.observe(&self.nats, SHARDS)?;
            for (idx, node) in self.nodes.iter().enumerate() {
                // A process frozen in the middle of a turn holds events it has not written yet.
                if let (Some(turn), None) = (&node.turn, &node.suspended) {
                    self.checker.compare(idx, turn)?;
                }
            }
            if !faults && self.done() {
                return self.checker.at_end(&self.nats);
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
    fn explain(&self) {
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

    /// True once every plan started and every execution in the log completed.
    fn done(&self) -> bool {
        self.plans.iter().all(|(_, _, started)| *started)
            && self.nats.events.executions().all(|id| {
                self.checker
                    .replicas
                    .get(&id)
                    .is_some_and(|r| r.machine.state().is_terminal())
            })
            && self.nats.index.is_empty()
    }

    fn inject_faults(&mut self) {
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
    fn heal(&mut self) {
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

    fn crash(&mut self, idx: usize) {
        let down_for = self.rng.between(20, 400);
        if verbose() {
            eprintln!("{}: coordinator {idx} crashes for {down_for} ms", self.now);
        }
        let node = &mut self.nodes[idx];
        node.turn = None;
        node.suspended = None;
        node.inbox.clear();
        node.tokens.clear();
        node.leases.clear();
        node.consuming.clear();
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

    fn restart(&mut self, idx: usize) {
        let seed = self.rng.next_u64();
        let node = &mut self.nodes[idx];
        node.incarnation += 1;
        node.turn = Some(coordinator(seed, idx, node.incarnation));
        node.last_renewal = 0;
        node.last_tick = 0;
    }

    fn forget_call(&mut self, call: Call) {
        match call {
            Call::Start { plan } => self.plans[plan].2 = false,
            Call::Answer { question, .. } => {
                self.answering.remove(&question);
            }
        }
    }

    fn deliver_later(&mut self) {
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

    fn schedule(&mut self, node: usize, delay: u64, input: Input) {
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

    /// One step of a coordinator process.
    fn node_step(&mut self, idx: usize) -> Result<(), String> {
        let now = self.now;
        if self.nodes[idx].turn.is_none() || now < self.nodes[idx].stalled_until {
            return Ok(());
        }
        if let Some(appends) = self.nodes[idx].suspended.take() {
            return self.finish_turn(idx, appends);
        }
        // A stale process may run a turn before it learns that its leases are gone.
        if self.rng.percent(50) {
            self.keep_leases(idx);
            self.take_results(idx);
            self.turn(idx)
        } else {
            self.take_results(idx);
            self.turn(idx)?;
            self.keep_leases(idx);
            Ok(())
        }
    }

    /// The lease keeper: renews held leases, takes free ones.
    fn keep_leases(&mut self, idx: usize) {
        let now = self.now;
        let node = &mut self.nodes[idx];
        if now < node.last_renewal + LEASE_TTL / 3 {
            return;
        }
        node.last_renewal = now;
        for shard in 0..SHARDS {
            match node.leases.get(&shard) {
                Some(&revision) => match self.nats.leases.renew(shard, revision, now, LEASE_TTL) {
                    Some(revision) => {
                        node.leases.insert(shard, revision);
                    }
                    None => {
                        if verbose() {
                            eprintln!("{now}: coordinator {idx} loses shard {shard}");
                        }
                        node.leases.remove(&shard);
                        node.inbox.push(Input::LeaseLost(shard));
                    }
                },
                None => {
                    if let Some(revision) = self.nats.leases.acquire(shard, idx, now, LEASE_TTL) {
                        if verbose() {
                            eprintln!("{now}: coordinator {idx} acquires shard {shard}");
                        }
                        node.leases.insert(shard, revision);
                        node.inbox.push(Input::LeaseAcquired(shard));
                    }
                }
            }
        }
    }

    /// Delivers the results of the shards this process consumes, in any order, some twice.
    fn take_results(&mut self, idx: usize) {
        let now = self.now;
        let mut deliveries = Vec::new();
        for shard in self.nodes[idx].consuming.clone() {
            let shard = shard as usize;
            if self.nats.results[shard].1 != Some(idx) {
                if self.rng.percent(20) {
                    let (queue, consumer) = &mut self.nats.results[shard];
                    *consumer = Some(idx);
                    queue.redeliver_all(now);
                    if verbose() {
                        eprintln!(
                            "{now}: coordinator {idx} re-creates the consumer of shard {shard}"
                        );
                    }
                }
                continue;
            }
            let queue = &mut self.nats.results[shard].0;
            for seq in queue.available(now) {
                if self.rng.percent(20) {
                    continue; // delayed
                }
                let Some((payload, _)) = queue.take(seq, idx, now + RESULT_ACK_WAIT) else {
                    continue;
                };
                let node = &mut self.nodes[idx];
                node.next_token += 1;
                node.tokens.insert(node.next_token, (shard, seq));
                if verbose() {
                    eprintln!(
                        "{now}: coordinator {idx} takes result {shard}/{seq} as token {}",
                        node.next_token
                    );
                }
                deliveries.push(Delivery {
                    token: node.next_token,
                    payload,
                    span: tracing::Span::none(),
                });
            }
        }
        if !deliveries.is_empty() {
            shuffle(&mut self.rng, &mut deliveries);
            self.nodes[idx].inbox.push(Input::Results(deliveries));
        }
    }

    /// One turn, carried out as the executor does, with a crash possible between any two steps.
    fn turn(&mut self, idx: usize) -> Result<(), String> {
        let now = self.now;
        let node = &mut self.nodes[idx];
        let mut inputs = std::mem::take(&mut node.inbox);
        if now >= node.last_tick + TICK {
            node.last_tick = now;
            inputs.push(Input::Tick);
        }
        let consumed: Vec<Token> = inputs
            .iter()
            .filter_map(|input| match input {
                Input::Results(deliveries) => Some(deliveries.iter().map(|d| d.token)),
                _ => None,
            })
            .flatten()
            .collect();
        let Some(turn) = node.turn.as_mut() else {
            return Ok(());
        };
        let writes = turn.turn(inputs, now);
        let Writes {
            replies,
            recover,
            scan,
            stop_consuming,
            forget: _,
            appends,
        } = writes;
        self.answer(idx, replies)?;
        for shard in stop_consuming {
            if verbose() {
                eprintln!("{now}: coordinator {idx} stops consuming shard {shard}");
            }
            self.nodes[idx].consuming.remove(&shard);
            if self.nats.results[shard as usize].1 == Some(idx) {
                self.nats.results[shard as usize].1 = None;
            }
        }
        for shard in recover {
            let input = self.recover_shard(shard);
            let delay = self.rng.between(1, 40);
            self.schedule(idx, delay, input);
        }
        for shard in scan {
            let prefix = format!("{shard}.");
            let ids = self
                .nats
                .index
                .iter()
                .filter_map(|key| key.strip_prefix(&prefix)?.parse().ok())
                .collect();
            let delay = self.rng.between(1, 20);
            self.schedule(idx, delay, Input::Indexed { shard, ids });
        }
        if self.bug == Some(Bug::AckBeforeAppend) {
            let acks = consumed
                .into_iter()
                .map(|token| (token, Ack::Ack))
                .collect();
            self.acknowledge(idx, acks);
        }
        if self.faults && self.rng.one_in(300) {
            // The process freezes between deciding and writing (a long GC pause): its leases
            // lapse, another coordinator takes the shards over and writes the logs, and then
            // this one wakes up and appends what it decided.
            let node = &mut self.nodes[idx];
            node.stalled_until = now + self.rng.between(LEASE_TTL, 3 * LEASE_TTL);
            node.suspended = Some(appends);
            if verbose() {
                eprintln!(
                    "{now}: coordinator {idx} freezes before its appends until {}",
                    node.stalled_until
                );
            }
            return Ok(());
        }
        self.finish_turn(idx, appends)
    }

    /// The second half of a turn: the appends, then what they allow.
    fn finish_turn(&mut self, idx: usize, appends: Vec<Append>) -> Result<(), String> {
        let now = self.now;
        let mut outcomes = Vec::new();
        for append in appends {
            if self.crash_here() {
                self.crash(idx);
                return Ok(());
            }
            if let Some(key) = &append.index_put {
                self.nats.index.insert(key.clone());
            }
            let mut expected = append.expected_stream_seq;
            let mut outcome = None;
            for (first, payload) in append.messages {
                let msg_id = subjects::event_msg_id(append.id, first);
                match self
                    .nats
                    .events
                    .append(idx, append.id, msg_id, expected, payload.clone())
                {
                    Ok((stream_seq, duplicate)) => {
                        let ours = !duplicate
                            || self
                                .nats
                                .events
                                .get(stream_seq)
                                .is_some_and(|r| r.payload == payload);
                        if !ours {
                            FENCED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            outcome = Some(Appended::Fenced {
                                why: "message id used by another writer".to_owned(),
                            });
                            break;
                        }
                        expected = stream_seq;
                    }
                    Err(AppendError::WrongLastSequence { expected, last }) => {
                        FENCED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        outcome = Some(Appended::Fenced {
                            why: format!("expected {expected}, last {last}"),
                        });
                        break;
                    }
                }
            }
            outcomes.push((
                append.id,
                outcome.unwrap_or(Appended::Stored {
                    stream_seq: expected,
                }),
            ));
        }
        if self.crash_here() {
            self.crash(idx);
            return Ok(());
        }
        let Some(turn) = self.nodes[idx].turn.as_mut() else {
            return Ok(());
        };
        let effects = turn.appended(outcomes, now);
        self.carry_out(idx, effects)
    }

    fn carry_out(&mut self, idx: usize, effects: Effects) -> Result<(), String> {
        let now = self.now;
        let Effects {
            assignments,
            cancels,
            progress: _,
            observed: _,
            index_deletes,
            forget: _,
            acks,
            replies,
            checkpoints: _,
            load,
            consume,
        } = effects;
        for assign in assignments {
            if self.crash_here() {
                self.crash(idx);
                return Ok(());
            }
            self.nats
                .tasks
                .publish(Some(assign.msg_id), assign.payload, now, DUPLICATE_WINDOW);
        }
        for cancel in cancels {
            if let Ok(cancel) = v1::CancelTask::decode(cancel.payload) {
                for worker in &mut self.workers {
                    worker.cancel(&mut self.nats, &cancel);
                }
            }
        }
        for key in index_deletes {
            self.nats.index.remove(&key);
        }
        if self.crash_here() {
            self.crash(idx);
            return Ok(());
        }
        self.acknowledge(idx, acks);
        self.answer(idx, replies)?;
        for id in load {
            let input = match self.recover(id) {
                Some(recovered) => Input::Loaded {
                    recovered: vec![recovered],
                    missing: Vec::new(),
                },
                None => Input::Loaded {
                    recovered: Vec::new(),
                    missing: vec![id],
                },
            };
            let delay = self.rng.between(1, 30);
            self.schedule(idx, delay, input);
        }
        for shard in consume {
            if verbose() {
                eprintln!("{now}: coordinator {idx} consumes shard {shard}");
            }
            self.nodes[idx].consuming.insert(shard);
            let (queue, consumer) = &mut self.nats.results[shard as usize];
            *consumer = Some(idx);
            queue.redeliver_all(now);
        }
        Ok(())
    }

    /// Draws whether the process crashes at this point of its turn.
    fn crash_here(&mut self) -> bool {
        self.faults && self.rng.one_in(400)
    }

    fn acknowledge(&mut self, idx: usize, acks: Vec<(Token, Ack)>) {
        let now = self.now;
        for (token, ack) in acks {
            let Some((shard, seq)) = self.nodes[idx].tokens.remove(&token) else {
                continue;
            };
            if verbose() {
                eprintln!("{now}: coordinator {idx} {ack:?} result {shard}/{seq}");
            }
            let queue = &mut self.nats.results[shard].0;
            match ack {
                Ack::Ack => {
                    queue.ack(seq, idx);
                }
                Ack::Later => queue.nak(seq, idx, now + 20),
            }
        }
    }

    /// Reads a shard's unfinished executions from the index and rebuilds each from its log.
    fn recover_shard(&mut self, shard: u32) -> Input {
        let prefix = format!("{shard}.");
        let ids: Vec<ExecutionId> = self
            .nats
            .index
            .iter()
            .filter_map(|key| key.strip_prefix(&prefix)?.parse().ok())
            .collect();
        let mut recovered = Vec::new();
        let mut missing = Vec::new();
        for id in ids {
            match self.recover(id) {
                Some(execution) => recovered.push(execution),
                None => missing.push(id),
            }
        }
        Input::ShardRecovered {
            shard,
            recovered,
            missing,
        }
    }

    /// Rebuilds one execution from its log, as `recovery::recover` does.
    fn recover(&self, id: ExecutionId) -> Option<Recovered> {
        let log: Vec<LogMessage> = self
            .nats
            .events
            .log(id)
            .into_iter()
            .map(|record| LogMessage {
                stream_seq: record.stream_seq,
                first_seq: convert::first_sequence(&record.payload),
                payload: record.payload.clone(),
            })
            .collect();
        let first = log.first()?;
        let last = log.last()?.stream_seq;
        let (started, plan) = recovery::started_of(id, first).ok()?;
        recovery::replay(id, started, plan, None, log, last).ok()
    }

    /// Hands answers to the client.
    fn answer(
        &mut self,
        idx: usize,
        replies: Vec<(ReplyTo, Result<Answer, Error>)>,
    ) -> Result<(), String> {
        for (reply, answer) in replies {
            let Some(call) = self.nodes[idx].calls.remove(&reply) else {
                continue;
            };
            if verbose() {
                eprintln!(
                    "{}: coordinator {idx} answers {call:?}: {answer:?}",
                    self.now
                );
            }
            match (call, answer) {
                (Call::Start { plan }, Ok(Answer::Started { id, created })) => {
                    if self.nats.events.last_seq(id).is_none() {
                        return Err(format!(
                            "the start of {id} (created: {created}) was answered by coordinator \
                             {idx} before it was logged"
                        ));
                    }
                    self.plans[plan].2 = true;
                }
                (Call::Answer { id, question }, Ok(Answer::Answered { sequence, .. })) => {
                    if !logged_up_to(&self.nats, id, sequence) {
                        return Err(format!(
                            "the answer to {question} was acknowledged before it was logged"
                        ));
                    }
                }
                (call, _) => self.forget_call(call),
            }
        }
        Ok(())
    }

    /// The client: starts its plans and answers open questions, through the coordinator that
    /// owns the shard (or any that owns one, for a start).
    fn client_step(&mut self) {
        let now = self.now;
        for plan in 0..self.plans.len() {
            let (at, _, started) = &self.plans[plan];
            let in_flight = self.nodes.iter().any(|n| {
                n.calls
                    .values()
                    .any(|c| matches!(c, Call::Start { plan: p } if *p == plan))
            });
            if *started || *at > now || in_flight || !self.rng.percent(10) {
                continue;
            }
            let owners: Vec<usize> = (0..self.nodes.len())
                .filter(|idx| {
                    self.nodes[*idx].turn.is_some() && !self.nodes[*idx].leases.is_empty()
                })
                .collect();
            if owners.is_empty() {
                continue;
            }
            let node = owners[self.rng.index(owners.len())];
            let request = Request::Start {
                source: Box::new(v1::start_execution_request::PlanSource::Spec(
                    v1::PlanSpec {
                        text: self.plans[plan].1.clone(),
                        format: v1::PlanFormat::Json.into(),
                        ..Default::default()
                    },
                )),
                options: v1::ExecutionOptions {
                    idempotency_key: format!("plan-{plan}"),
                    ..Default::default()
                },
                principal: Principal::anonymous(),
                traceparent: String::new(),
            };
            self.call(node, Call::Start { plan }, request);
        }
        let open: Vec<(ExecutionId, QuestionId)> = self
            .checker
            .replicas
            .iter()
            .flat_map(|(id, replica)| {
                replica
                    .machine
                    .open_questions()
                    .into_iter()
                    .map(|q| (*id, q.question.id))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (id, question) in open {
            if self.answering.contains_key(&question) || !self.rng.percent(5) {
                continue;
            }
            let shard = subjects::shard_of(&id.to_string(), SHARDS);
            // The owner as the lease bucket says, or as a (maybe stale, maybe stalled) process
            // believes: a client may talk to either.
            let believers: Vec<usize> = (0..self.nodes.len())
                .filter(|idx| self.nodes[*idx].leases.contains_key(&shard))
                .collect();
            let owner = if !believers.is_empty() && self.rng.percent(50) {
                Some(believers[self.rng.index(believers.len())])
            } else {
                self.nats.leases.owner(shard, now)
            };
            let Some(owner) = owner else {
                continue;
            };
            if self.nodes[owner].turn.is_none() {
                continue;
            }
            self.answering.insert(question, true);
            let request = Request::On {
                id,
                scope: Scope::All,
                action: Action::Answer {
                    question,
                    answer: "yes".to_owned(),
                },
            };
            self.call(owner, Call::Answer { id, question }, request);
        }
    }

    fn call(&mut self, node: usize, call: Call, request: Request) {
        if verbose() {
            eprintln!("{}: the client asks coordinator {node}: {call:?}", self.now);
        }
        let node = &mut self.nodes[node];
        node.next_reply += 1;
        node.calls.insert(node.next_reply, call);
        node.inbox.push(Input::Request {
            reply: node.next_reply,
            request,
        });
    }
}

/// True when the log of `id` holds sequence `sequence`.
fn logged_up_to(nats: &Nats, id: ExecutionId, sequence: u64) -> bool {
    nats.events.log(id).last().is_some_and(|record| {
        log::decode_event_batch(&record.payload)
            .is_ok_and(|batch| batch.first_sequence + batch.entries.len() as u64 > sequence)
    })
}

/// A coordinator with the simulation's settings.
fn coordinator(seed: u64, idx: usize, incarnation: u64) -> Coordinator {
    Coordinator::new(
        Config {
            id: format!("coordinator-{idx}"),
            shards: SHARDS,
            checkpoint_every_ms: 1_000,
            checkpoint_store: false,
            access: None,
            max_message_bytes: 8 * 1024 * 1024,
            index_scan_every_ms: 500,
            seed: seed ^ ((idx as u64) << 40) ^ (incarnation << 20),
        },
        &trellis_telemetry::Registry::default(),
    )
}

fn shuffle<T>(rng: &mut Rng, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = rng.index(i + 1);
        items.swap(i, j);
    }
}

mod convert {
    pub use trellis_wire::log::decode_event_batch;

    /// The sequence of a batch's first event.
    pub fn first_sequence(payload: &[u8]) -> u64 {
        decode_event_batch(payload).map_or(0, |batch| batch.first_sequence)
    }
}
