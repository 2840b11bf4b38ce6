//! One live execution: its state machine, its log as held in memory, and what the current turn
//! produced for it (events to append, instances to dispatch, attempts to stop).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_core::machine::{Applied, ApplyError, Command, Event, EventBody, Execution, PauseMode};
use trellis_proto::v1;
use trellis_telemetry::propagation::{self, Context};
use trellis_wire::{common, log, read};

use super::History;
use super::breakers::{self, Breakers};
use super::checkpoint::CheckpointState;
use super::pauses::FleetPauses;
use super::takeover::Inherited;
use crate::metrics::{self, Metrics};

/// Who an execution belongs to and what it may do, fixed at its start.
#[derive(Debug)]
pub(super) struct Tenancy {
    pub(super) namespace: Arc<str>,
    pub(super) checkpoints_allowed: bool,
    pub(super) traceparent: String,
}

#[derive(Debug)]
pub(super) struct Live {
    pub(super) machine: Execution,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) created_at_ms: u64,
    pub(super) shard: u32,
    pub(super) namespace: Arc<str>,
    /// Whether its namespace's quota allows checkpoints.
    pub(super) checkpoints_allowed: bool,
    /// The trace of the call that started it: the parent of its dispatch, append and checkpoint
    /// spans (empty when that call was not traced).
    pub(super) trace: Context,
    /// The last sequence appended (or about to be).
    pub(super) seq: u64,
    /// The stream sequence of the last message on this execution's log subject; the next append
    /// must follow it.
    pub(super) stream_seq: u64,
    /// The log held in memory as the encoded `EventBatch` messages, with each one's first
    /// sequence: compact, and what observers and delta checkpoints read. It starts at `log_base`.
    pub(super) log: Vec<(u64, Bytes)>,
    pub(super) log_base: u64,
    /// Events of this turn, not yet appended.
    pub(super) pending: Vec<v1::Event>,
    /// Messages of this turn being appended: they join `log` once stored.
    pub(super) appending: Vec<(u64, Bytes)>,
    /// Instances to send to workers once the turn's events are stored.
    pub(super) dispatch: Vec<TaskInstanceId>,
    /// Attempts to stop once the turn's events are stored: the attempt each instance ran when
    /// the event that stops it was applied (a retry decided in the same turn has the next one).
    pub(super) stop: Vec<(TaskInstanceId, u32)>,
    /// Attempts to ask to stop at their next durable step (a pause in `preempt` mode), with
    /// why, once the turn's events are stored.
    pub(super) preempt: Vec<(TaskInstanceId, u32, String)>,
    /// Attempts to stop (not preempt) once the turn's events are stored, with why: inherited
    /// attempts found lost, in case a cut-off worker still runs them.
    pub(super) abort: Vec<(TaskInstanceId, u32, String)>,
    /// This owner's fencing epoch: the sequence of the `ExecutionClaimed` with which it took the
    /// execution over (0 when it started it). Every assignment it sends carries it.
    pub(super) epoch: u64,
    /// Attempts a former owner dispatched that were running at the takeover (`takeover`).
    pub(super) inherited: HashMap<TaskInstanceId, Inherited>,
    /// The epoch is to be written to the fences bucket once the claim is stored.
    pub(super) fence_due: bool,
    /// The epoch is in the fences bucket: inherited attempts may be found lost from now on.
    pub(super) fenced: bool,
    pub(super) last_progress_ms: u64,
    /// The state changed since the last progress snapshot was published.
    pub(super) progress_due: bool,
    /// Touched this turn.
    pub(super) dirty: bool,
    /// When the clock alone is next to touch it, as entered in the coordinator's timers
    /// (`None`: not entered; only an input touches it).
    pub(super) wake_ms: Option<u64>,
    /// When its last decision is next to change with the clock alone: its machine's next
    /// timer, or that decision's own time when it held something back for a reason outside the
    /// execution (a fleet pause, a circuit breaker) or did not finish (decided again each tick).
    pub(super) decided_wake: Option<u64>,
    /// The index entry must be written before the next append (a new execution or run).
    pub(super) index_put: bool,
    /// The index entry is written and the execution not yet finished.
    pub(super) indexed: bool,
    pub(super) checkpoint: CheckpointState,
    /// When it was last changed or asked about: a finished execution leaves memory a while
    /// after.
    pub(super) touched_ms: u64,
    /// Attempts that ended this turn (completed or failed), by queue and type, for the
    /// circuit breakers.
    pub(super) ended: Vec<(breakers::Key, bool, (ExecutionId, TaskInstanceId, u32))>,
}

/// What an applied event adds to the metrics.
enum Count {
    /// An instance's first dispatch: its queue and the seconds since it became ready.
    DispatchLatency(trellis_telemetry::metrics::Labels1, f64),
    /// An attempt's outcome, by queue and type, and the attempt.
    Attempt(
        Outcome,
        trellis_telemetry::metrics::Labels2,
        (TaskInstanceId, u32),
    ),
}

#[derive(Clone, Copy)]
enum Outcome {
    Completed,
    Failed,
    Lost,
}

impl Live {
    pub(super) fn new(
        machine: Execution,
        labels: BTreeMap<String, String>,
        created_at_ms: u64,
        shard: u32,
        tenancy: Tenancy,
    ) -> Self {
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
            appending: Vec::new(),
            dispatch: Vec::new(),
            stop: Vec::new(),
            preempt: Vec::new(),
            abort: Vec::new(),
            epoch: 0,
            inherited: HashMap::new(),
            fence_due: false,
            fenced: false,
            last_progress_ms: 0,
            progress_due: true,
            dirty: false,
            wake_ms: None,
            decided_wake: None,
            index_put: false,
            indexed: false,
            checkpoint: CheckpointState::default(),
            touched_ms: created_at_ms,
            ended: Vec::new(),
        }
    }

    /// Finished, with nothing of it left to store: it may leave memory.
    pub(super) fn idle_and_finished(&self) -> bool {
        self.machine.state().is_terminal()
            && !self.dirty
            && self.pending.is_empty()
            && self.appending.is_empty()
            && !self.index_put
            && !self.indexed
            && self.checkpoint.idle()
    }

    /// Applies an event and, when it changed the state, queues it for the log and counts it.
    /// Returns what apply said.
    pub(super) fn record(
        &mut self,
        id: ExecutionId,
        event: Event,
        metrics: &Metrics,
    ) -> Result<Applied, ApplyError> {
        // Read before apply: a settled attempt's times and labels describe the attempt.
        let counted = self.count(&event);
        let applied = self.machine.apply(&event)?;
        if let Applied::Changed { stop } = &applied {
            match counted {
                Some(Count::DispatchLatency(labels, seconds)) => {
                    metrics
                        .dispatch_latency
                        .get_or_create(&labels)
                        .observe(seconds);
                }
                Some(Count::Attempt(outcome, labels, attempt)) => {
                    let family = match outcome {
                        Outcome::Completed => &metrics.completed,
                        Outcome::Failed => &metrics.failed,
                        Outcome::Lost => &metrics.lost,
                    };
                    family.get_or_create(&labels).inc();
                    // A lost worker says nothing about the task type: not counted.
                    if !matches!(outcome, Outcome::Lost) {
                        let [(_, queue), (_, task_type)] = labels;
                        let ok = matches!(outcome, Outcome::Completed);
                        self.ended
                            .push(((queue, task_type), ok, (id, attempt.0, attempt.1)));
                    }
                }
                None => {}
            }
            self.seq += 1;
            self.pending.push(log::event_to_proto(id, self.seq, &event));
            let machine = &self.machine;
            self.stop.extend(
                stop.iter()
                    .map(|instance| (*instance, machine.attempt(*instance).unwrap_or(0))),
            );
            match &event.body {
                EventBody::TaskDispatched { instance, .. } => self.dispatch.push(*instance),
                EventBody::PauseRequested {
                    reason,
                    scope,
                    mode: PauseMode::Preempt,
                } => {
                    let reason = format!("{scope} paused (preempt): {reason}");
                    let running = self.machine.running_in(scope);
                    self.preempt
                        .extend(running.into_iter().map(|(i, a)| (i, a, reason.clone())));
                }
                _ => {}
            }
        }
        Ok(applied)
    }

    /// Returns what to count for `event` once it is applied: the attempt outcomes by queue and
    /// type, and the dispatch latency of an instance's first dispatch (from the instance becoming
    /// ready to its assignment being sent). `None` for other events.
    fn count(&self, event: &Event) -> Option<Count> {
        let (instance, outcome) = match &event.body {
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
            EventBody::TaskCompleted { instance, .. } => (instance, Outcome::Completed),
            EventBody::TaskFailed { instance, .. } | EventBody::TaskTimedOut { instance, .. } => {
                (instance, Outcome::Failed)
            }
            EventBody::TaskLost { instance, .. } => (instance, Outcome::Lost),
            _ => return None,
        };
        let assignment = self.machine.assignment(*instance)?;
        Some(Count::Attempt(
            outcome,
            metrics::task_labels(assignment.queue, assignment.task_type),
            (*instance, assignment.attempt),
        ))
    }

    /// Lets the machine decide until it has nothing more to do now; nothing a fleet pause or an
    /// open circuit breaker covers is dispatched, a half-open breaker's probe is recorded, and
    /// no more than `window` tasks wait in the workers' queues at once (0: no limit): a
    /// dispatched task counts until its start is recorded, from a heartbeat or with its result,
    /// either of which brings the execution back here.
    pub(super) fn decide(
        &mut self,
        id: ExecutionId,
        now: u64,
        window: u32,
        metrics: &Metrics,
        pauses: &FleetPauses,
        breakers: &mut Breakers,
    ) {
        let window = if window == 0 { u32::MAX } else { window };
        // Taken over and the fence not stored yet: a former owner's message may still start.
        let unfenced = self.epoch > 0 && !self.fenced;
        // Until it is known to have decided all it can, it is decided again at the next tick.
        self.decided_wake = Some(now);
        let mut held_back = false;
        for _ in 0..1_000 {
            let mut probing = BTreeSet::new();
            let namespace = &self.namespace;
            // The window is the decision's room (none while unfenced), so a candidate it holds
            // is never looked at, nor spends a breaker's probe.
            let room = if unfenced {
                0
            } else {
                window.saturating_sub(self.machine.unstarted())
            };
            let commands = self
                .machine
                .decide_holding(now, room, &mut |queue, task_type| {
                    let held = pauses.holds(namespace, queue)
                        || breakers.holds(queue, task_type, &mut probing);
                    held_back |= held;
                    held
                });
            if commands.is_empty() {
                if !held_back {
                    self.decided_wake = self.machine.next_wake(now);
                }
                return;
            }
            for command in commands {
                if let Command::Dispatch { instance, attempt } = command
                    && let Some(assignment) = self.machine.assignment(instance)
                {
                    breakers.dispatched(
                        assignment.queue,
                        assignment.task_type,
                        (id, instance, attempt),
                        now,
                    );
                }
                if let Err(err) = self.record(id, command.into_event(now), metrics) {
                    // A decision the machine refuses is a bug in the machine; stop deciding for
                    // this turn rather than loop.
                    tracing::error!(%id, %err, "decision refused");
                    return;
                }
            }
        }
    }

    /// Returns the execution's progress snapshot as observers get it: right after its last
    /// event (`seq`), with the envelope the core leaves unset.
    pub(super) fn progress(&self, id: ExecutionId, now: u64) -> v1::Progress {
        v1::Progress {
            execution_id: id.to_string(),
            run_number: self.machine.run_number(),
            sequence: self.seq,
            sent_at_unix_ms: i64::try_from(now).unwrap_or(i64::MAX),
            ..read::progress_to_proto(&self.machine.progress(now))
        }
    }

    /// Returns the execution as `GetExecution` and `ListExecutions` show it.
    pub(super) fn summary(&self, id: ExecutionId, now: u64) -> v1::Execution {
        let progress = self.progress(id, now);
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
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
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
            holds: self
                .machine
                .holds()
                .map(|(scope, hold)| {
                    let (task_id, group_id) = log::scope_to_proto(&scope);
                    v1::Hold {
                        task_id,
                        group_id,
                        mode: log::pause_mode_to_proto(hold.mode) as i32,
                        reason: hold.reason.clone(),
                        since_unix_ms: hold.since_ms as i64,
                    }
                })
                .collect(),
            skipped: self
                .machine
                .routed_out()
                .into_iter()
                .map(|(task_id, reason)| v1::SkippedTask {
                    task_id: task_id.to_owned(),
                    reason,
                })
                .collect(),
        }
    }

    /// The log held in memory from sequence `from` on, still encoded.
    pub(super) fn history(&self, from: u64) -> History {
        // The batch holding `from` is the last one starting at or before it.
        let start = self
            .log
            .partition_point(|(first, _)| *first <= from)
            .saturating_sub(1);
        let batches = self.log[start..]
            .iter()
            .map(|(_, bytes)| bytes.clone())
            .collect();
        History::new(from, batches)
    }
}
