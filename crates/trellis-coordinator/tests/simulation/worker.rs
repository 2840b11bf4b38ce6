//! Simulated agent-workers: they take task messages from the work queue, run them for a while as
//! the task's `"sim"` behaviour says (see `plans.rs`), publish the result to the shard the
//! assignment names, and only then acknowledge the task message, extending it while they run, as
//! the real worker does. A worker that dies loses its runs; their messages are delivered again
//! after the ack wait. Half the time it hands the results to the coordinator of their shard
//! instead, and acknowledges their task messages once the coordinator answers `done`; any other
//! answer, or none within [`HANDOFF_WAIT`], and it publishes them to the stream first.

use bytes::Bytes;
use prost::Message as _;
use serde_json::{Value, json};
use trellis_core::ids::{GroupId, QuestionId, TaskInstanceId, mix};
use trellis_proto::{assignments, results, v1};

use crate::nats::{Handed, Handoff, Nats};
use crate::rng::Rng;

/// How long a worker waits for the answer to a hand-off before it publishes the results.
const HANDOFF_WAIT: u64 = 100;

/// A hand-off waiting for its answer, with the task messages of its results.
#[derive(Debug)]
pub struct Waiting {
    pub handoff: u64,
    /// The task messages of its results (`None`: an offered attempt's, which has none).
    pub seqs: Vec<Option<u64>>,
    pub until: u64,
}

/// A task attempt being run.
#[derive(Debug)]
pub struct Run {
    /// The task message's sequence in the work queue; `None` for an attempt taken from an
    /// offer, which came in no message.
    pub seq: Option<u64>,
    pub assignment: v1::TaskAssignment,
    pub done_at: u64,
    /// When this worker took it: every result carries it, and so does each heartbeat.
    pub started_at: u64,
}

/// One simulated worker.
#[derive(Debug)]
pub struct Worker {
    pub idx: usize,
    pub up: bool,
    pub runs: Vec<Run>,
    pub slots: usize,
    pub waiting: Vec<Waiting>,
}

impl Worker {
    pub fn new(idx: usize, slots: usize) -> Self {
        Self {
            idx,
            up: true,
            runs: Vec::new(),
            slots,
            waiting: Vec::new(),
        }
    }

    /// Returns an encoded heartbeat saying what the worker runs.
    pub fn heartbeat(&self, now: u64, interval_ms: u64) -> Bytes {
        let heartbeat = v1::WorkerHeartbeat {
            worker_id: name(self.idx),
            host: "sim".to_owned(),
            queues: vec![crate::plans::QUEUE.to_owned()],
            slots: self.slots as u32,
            running: self
                .runs
                .iter()
                .map(|run| v1::RunningTask {
                    execution_id: run.assignment.execution_id.clone(),
                    task_instance_id: run.assignment.task_instance_id.clone(),
                    attempt: run.assignment.attempt,
                    started_at_unix_ms: run.started_at as i64,
                    ..Default::default()
                })
                .collect(),
            sent_at_unix_ms: now as i64,
            interval_ms,
            state: if self.runs.is_empty() {
                v1::WorkerState::Idle
            } else {
                v1::WorkerState::Running
            }
            .into(),
            ..Default::default()
        };
        Bytes::from(heartbeat.encode_to_vec())
    }

    /// The worker dies: its runs are lost, its task messages left to time out.
    pub fn die(&mut self) {
        self.up = false;
        self.runs.clear();
        self.waiting.clear();
    }

    /// Does what is due at `now`: extends running tasks, finishes those done, takes new ones.
    pub fn step(&mut self, nats: &mut Nats, rng: &mut Rng, now: u64, ack_wait: u64) {
        if !self.up {
            return;
        }
        for seq in self.runs.iter().filter_map(|run| run.seq) {
            nats.tasks.extend(seq, self.idx, now + ack_wait);
        }
        for waiting in &self.waiting {
            for seq in waiting.seqs.iter().flatten() {
                nats.tasks.extend(*seq, self.idx, now + ack_wait);
            }
        }
        self.finish_handoffs(nats, now);
        let (done, running): (Vec<Run>, Vec<Run>) =
            self.runs.drain(..).partition(|run| run.done_at <= now);
        self.runs = running;
        // Lost its message meanwhile (the ack wait passed): another worker has it.
        let done: Vec<Run> = done
            .into_iter()
            .filter(|run| run.seq.is_none_or(|seq| nats.tasks.holds(seq, self.idx)))
            .collect();
        let results: Vec<(usize, Option<u64>, v1::TaskResult)> = done
            .iter()
            .map(|run| {
                let outcome = outcome(&run.assignment, self.idx, now);
                (
                    shard_of(run),
                    run.seq,
                    result_of(self.idx, run, outcome, now),
                )
            })
            .collect();
        for (handoff, seqs) in publish_finals(nats, rng, results, now) {
            self.waiting.push(Waiting {
                handoff,
                seqs,
                until: now + HANDOFF_WAIT,
            });
        }
        for run in done {
            // Died between publishing and acknowledging: the task runs again elsewhere.
            if rng.one_in(200) {
                self.die();
                return;
            }
            self.settle(nats, run.seq);
        }
        while self.runs.len() < self.slots {
            let Some(seq) = nats.tasks.available(now).first().copied() else {
                break;
            };
            let batch = nats.tasks.messages.get(&seq).is_some_and(|m| m.batch);
            let Some((payload, _)) = nats.tasks.take(seq, self.idx, now + ack_wait) else {
                break;
            };
            // A batch's entries all run here, each as it would alone (beyond the free slots,
            // as the real worker queues them for its slots); the message is acknowledged once
            // none of them runs any more.
            let assignments: Vec<v1::TaskAssignment> = if batch {
                assignments::unpack_batch(&payload)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|entry| {
                        v1::TaskAssignment::decode(entry.assignment.as_slice()).ok()
                    })
                    .collect()
            } else {
                v1::TaskAssignment::decode(payload).into_iter().collect()
            };
            for assignment in assignments {
                self.start(nats, rng, Some(seq), assignment, now);
            }
            self.settle(nats, Some(seq));
        }
    }

    /// Acknowledges the task message `seq` unless one of its assignments still runs here, or
    /// waits for the answer to its result's hand-off.
    fn settle(&self, nats: &mut Nats, seq: Option<u64>) {
        let Some(seq) = seq else {
            return;
        };
        if !self.runs.iter().any(|run| run.seq == Some(seq))
            && !self
                .waiting
                .iter()
                .any(|waiting| waiting.seqs.contains(&Some(seq)))
        {
            nats.tasks.ack(seq, self.idx);
        }
    }

    /// Ends the hand-offs answered, or waited for long enough: the results of one answered
    /// anything but `done`, or not at all, are published to the stream; then their task messages
    /// are acknowledged.
    fn finish_handoffs(&mut self, nats: &mut Nats, now: u64) {
        let (ended, waiting): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|waiting| {
                now >= waiting.until
                    || nats.handoffs.get(&waiting.handoff).is_none_or(|handoff| {
                        matches!(handoff.state, Handed::Done | Handed::Publish)
                    })
            });
        self.waiting = waiting;
        for waiting in ended {
            let Some(handoff) = nats.handoffs.get(&waiting.handoff) else {
                continue;
            };
            if handoff.state != Handed::Done {
                let (shard, payload, batch) =
                    (handoff.shard, handoff.payload.clone(), handoff.batch);
                if let Some((queue, _)) = nats.results.get_mut(shard) {
                    let seq = queue.publish_results(payload, batch, now);
                    if crate::world::verbose() {
                        eprintln!(
                            "{now}: hand-off {} ({:?}) published as {shard}/{seq}",
                            waiting.handoff, handoff.state
                        );
                    }
                }
            }
            for seq in waiting.seqs {
                self.settle(nats, seq);
            }
        }
    }

    /// Starts one assignment of the task message `seq`, unless the real worker would refuse it.
    fn start(
        &mut self,
        nats: &mut Nats,
        rng: &mut Rng,
        seq: Option<u64>,
        assignment: v1::TaskAssignment,
        now: u64,
    ) {
        // Past its deadline (timed out while it waited in the queue): the real worker ends
        // it at once as "deadline exceeded", which the coordinator ignores as a result of
        // an attempt it has already ended; it never runs.
        if assignment
            .deadline_unix_ms
            .is_some_and(|deadline| deadline <= now as i64)
        {
            return;
        }
        // Sent by a former owner of the execution: refused, as the real worker does.
        if nats
            .fences
            .get(&assignment.execution_id)
            .is_some_and(|fence| assignment.fence < *fence)
        {
            return;
        }
        let slow = sim(&assignment)["slow"] == json!(true) && assignment.attempt == 1;
        let duration = if slow { 200 } else { rng.between(1, 25) };
        let run = Run {
            seq,
            assignment,
            done_at: now + duration,
            started_at: now,
        };
        // Like the real worker, only some say so on their own: the others' results (and
        // heartbeats) tell that they started.
        if rng.percent(30) {
            let started = v1::task_result::Outcome::Started(v1::task_result::Started {});
            publish_result(nats, self.idx, &run, started, now);
        }
        self.runs.push(run);
    }

    /// Takes an offered assignment if a slot is free: it runs as if delivered, with no task
    /// message. Returns whether it was taken (the real worker answers `taken` once it has
    /// started it, or set it aside as stale or late).
    pub fn take_offered(
        &mut self,
        nats: &mut Nats,
        rng: &mut Rng,
        assignment: v1::TaskAssignment,
        now: u64,
    ) -> bool {
        if !self.up || self.runs.len() >= self.slots {
            return false;
        }
        self.start(nats, rng, None, assignment, now);
        true
    }

    /// A cancel for an attempt: the run stops, and its message is acknowledged unless another
    /// assignment of its batch still runs.
    pub fn cancel(&mut self, nats: &mut Nats, cancel: &v1::CancelTask) {
        let Some(at) = self.runs.iter().position(|run| {
            run.assignment.task_instance_id == cancel.task_instance_id
                && run.assignment.attempt == cancel.attempt
        }) else {
            return;
        };
        let stopped = self.runs.remove(at);
        self.settle(nats, stopped.seq);
    }
}

/// The id a worker heartbeats under.
pub fn name(idx: usize) -> String {
    format!("sim-worker-{idx}")
}

/// The task's behaviour.
fn sim(assignment: &v1::TaskAssignment) -> Value {
    serde_json::from_slice::<Value>(&assignment.input)
        .ok()
        .and_then(|input| input.get("sim").cloned())
        .unwrap_or(Value::Null)
}

/// What an attempt reports when it ends.
fn outcome(assignment: &v1::TaskAssignment, worker: usize, now: u64) -> v1::task_result::Outcome {
    use v1::task_result::{Asked, Completed, Failed, Outcome, Spawned};
    let completed = |output: Value| {
        Outcome::Completed(Completed {
            output: output.to_string().into_bytes(),
        })
    };
    if let Some(resume) = &assignment.resume {
        match &resume.resumed_after {
            Some(v1::resume_context::ResumedAfter::GroupSummary(summary)) => {
                return completed(json!({ "resumed": summary.group_id, "worker": worker }));
            }
            Some(v1::resume_context::ResumedAfter::HumanAnswer(answer)) => {
                return completed(json!({ "answer": answer.answer }));
            }
            None => {}
        }
    }
    let behaviour = sim(assignment);
    let fail = behaviour["fail"].as_u64().unwrap_or(0);
    if u64::from(assignment.attempt) <= fail {
        return Outcome::Failed(Failed {
            error: format!("attempt {} fails on purpose", assignment.attempt),
            retryable: true,
            lost_deliveries: 0,
        });
    }
    let instance: TaskInstanceId = assignment
        .task_instance_id
        .parse()
        .unwrap_or(TaskInstanceId::nil());
    let entropy = mix(instance.0.as_u128(), &[u64::from(assignment.attempt)]);
    if behaviour["ask"] == json!(true) {
        return Outcome::Question(Asked {
            question: Some(v1::Question {
                question_id: QuestionId::derived(now, entropy).to_string(),
                question_type: "approval".to_owned(),
                text: "go on?".to_owned(),
                options: vec!["yes".to_owned(), "no".to_owned()],
                ..Default::default()
            }),
        });
    }
    if let Some(spawn) = behaviour.get("spawn") {
        let members = spawn["members"]
            .as_array()
            .map(|members| {
                members
                    .iter()
                    .map(|member| v1::SubtaskSpec {
                        task_type: crate::plans::QUEUE.to_owned(),
                        input: json!({ "sim": member }).to_string().into_bytes(),
                        queue: None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let (kind, quorum) = match &spawn["rule"] {
            Value::String(rule) if rule == "all_succeeded" => {
                (v1::CompletionRuleKind::AllSucceeded, 0)
            }
            Value::String(rule) if rule == "first_success" => {
                (v1::CompletionRuleKind::FirstSuccess, 0)
            }
            Value::Object(rule) => (
                v1::CompletionRuleKind::Quorum,
                rule.get("quorum").and_then(Value::as_u64).unwrap_or(1) as u32,
            ),
            _ => (v1::CompletionRuleKind::AllSettled, 0),
        };
        return Outcome::Spawned(Spawned {
            group: Some(v1::SubtaskGroup {
                group_id: GroupId::derived(now, entropy).to_string(),
                rule: Some(v1::CompletionRule {
                    kind: kind.into(),
                    quorum,
                }),
                members,
            }),
        });
    }
    completed(json!({ "task": assignment.task_id, "worker": worker }))
}

/// The results shard the assignment of `run` names.
fn shard_of(run: &Run) -> usize {
    run.assignment.results_shard.unwrap_or(0) as usize
}

/// The result of `run` with `outcome`.
fn result_of(
    worker: usize,
    run: &Run,
    outcome: v1::task_result::Outcome,
    now: u64,
) -> v1::TaskResult {
    let assignment = &run.assignment;
    v1::TaskResult {
        execution_id: assignment.execution_id.clone(),
        task_instance_id: assignment.task_instance_id.clone(),
        attempt: assignment.attempt,
        worker_id: name(worker),
        usage: None,
        sent_at_unix_ms: now as i64,
        started_at_unix_ms: Some(run.started_at as i64),
        validation: Vec::new(),
        outcome: Some(outcome),
    }
}

/// Publishes a result on the results stream of the assignment's shard.
fn publish_result(
    nats: &mut Nats,
    worker: usize,
    run: &Run,
    outcome: v1::task_result::Outcome,
    now: u64,
) {
    let result = result_of(worker, run, outcome, now);
    let shard = shard_of(run);
    if let Some((queue, _)) = nats.results.get_mut(shard) {
        let seq = queue.publish(None, Bytes::from(result.encode_to_vec()), now, 0);
        trace(now, shard, seq, &result);
    }
}

/// A message of results: its payload, whether it is a batch, and the results it carries with
/// the task messages they came from.
/// Results with the task messages they came in (`None`: an offered attempt's, which has none).
type Carried = Vec<(Option<u64>, v1::TaskResult)>;
type Outgoing = (Bytes, bool, Carried);

/// Publishes the final results of runs that ended together, as the real worker's publisher does:
/// those for one shard as one batch (most of the time: sometimes each alone), a lone one alone;
/// half the time a shard's message is handed off instead. Returns the hand-offs, each with the
/// task messages of its results.
fn publish_finals(
    nats: &mut Nats,
    rng: &mut Rng,
    results: Vec<(usize, Option<u64>, v1::TaskResult)>,
    now: u64,
) -> Vec<(u64, Vec<Option<u64>>)> {
    let mut by_shard: Vec<(usize, Carried)> = Vec::new();
    for (shard, seq, result) in results {
        match by_shard.iter_mut().find(|(s, _)| *s == shard) {
            Some((_, group)) => group.push((seq, result)),
            None => by_shard.push((shard, vec![(seq, result)])),
        }
    }
    let mut handed = Vec::new();
    for (shard, group) in by_shard {
        if shard >= nats.results.len() {
            continue;
        }
        let messages: Vec<Outgoing> = if group.len() > 1 && !rng.one_in(4) {
            let entries = group
                .iter()
                .map(|(_, result)| v1::task_result_batch::Entry {
                    result: result.encode_to_vec(),
                    msg_id: String::new(),
                    traceparent: String::new(),
                })
                .collect();
            crate::world::BATCHED
                .fetch_add(group.len() as u64, std::sync::atomic::Ordering::Relaxed);
            vec![(Bytes::from(results::pack(entries)), true, group)]
        } else {
            group
                .into_iter()
                .map(|(seq, result)| {
                    (
                        Bytes::from(result.encode_to_vec()),
                        false,
                        vec![(seq, result)],
                    )
                })
                .collect()
        };
        for (payload, batch, carried) in messages {
            if rng.percent(50) {
                let id = nats.handoffs.len() as u64 + 1;
                nats.handoffs.insert(
                    id,
                    Handoff {
                        shard,
                        payload,
                        batch,
                        state: Handed::Sent,
                    },
                );
                crate::world::HANDED_OFF
                    .fetch_add(carried.len() as u64, std::sync::atomic::Ordering::Relaxed);
                for (_, result) in &carried {
                    trace(now, shard, None, result);
                }
                handed.push((id, carried.into_iter().map(|(seq, _)| seq).collect()));
                continue;
            }
            let Some((queue, _)) = nats.results.get_mut(shard) else {
                continue;
            };
            let seq = queue.publish_results(payload, batch, now);
            for (_, result) in &carried {
                trace(now, shard, Some(seq), result);
            }
        }
    }
    handed
}

fn trace(now: u64, shard: usize, seq: Option<u64>, result: &v1::TaskResult) {
    if std::env::var_os("TRELLIS_SIM_VERBOSE").is_some() {
        eprintln!(
            "{now}: result {shard}/{seq:?} of {} attempt {}: {:?}",
            result.task_instance_id,
            result.attempt,
            result.outcome.as_ref().map(std::mem::discriminant)
        );
    }
}
