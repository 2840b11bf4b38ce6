//! The pure part of the read model's writer: log messages in, replicas advanced by the one
//! replayer, rows to write out. No I/O: rebuilding a replica from the log is done by the caller
//! ([`super::Ingest`]) through [`Applier::needs_log`] and [`Applier::rebuild`].

use std::collections::{BTreeMap, HashMap};

use prost::Message as _;
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_core::machine::{Event, EventBody};
use trellis_core::record::TaskStatusRecord;
use trellis_proto::v1;
use trellis_wire::log::{self, LogEntry, Started};
use trellis_wire::replay::{Replayer, Step};

use crate::store::{
    EventRow, ExecutionRow, ExecutionWrite, ProgressRow, QuestionResolved, QuestionRow,
    ReadModelBatch, Resolution,
};

/// What the store knows about one execution between runs of messages.
#[derive(Debug, Default)]
struct Tracked {
    /// Every event at or below it has been taken into the read model (or the run being built).
    last_sequence: u64,
    replica: Option<Replica>,
    /// When the latest event happened.
    last_event_at_ms: u64,
    /// No replica can be built (the plan does not compile, or the log is incomplete): only
    /// events and sequences are recorded, and no rebuild is tried again.
    no_replica: bool,
}

#[derive(Debug)]
struct Replica {
    replay: Replayer,
    /// The labels are written with the first row of the execution this process writes.
    labels_written: bool,
    /// The current run, from its root record.
    run: RunTimes,
}

/// The current run of an execution, as its root record says.
#[derive(Debug, Clone, Copy)]
struct RunTimes {
    run_number: u32,
    started_at_ms: Option<u64>,
    ended_at_ms: Option<u64>,
}

/// One decoded message of the log: its events, in sequence order.
#[derive(Debug)]
pub(super) struct LogMessage {
    pub(super) execution_id: ExecutionId,
    pub(super) events: Vec<v1::Event>,
}

/// Decodes an `EventBatch` message. Unlike `log::decode_event_batch`, events of unknown
/// kinds are kept (to be stored and skipped); only the envelope is checked here.
pub(super) fn decode_message(payload: &[u8]) -> Result<LogMessage, String> {
    let batch =
        v1::EventBatch::decode(payload).map_err(|err| format!("invalid protobuf: {err}"))?;
    let first = batch
        .events
        .first()
        .ok_or("an event batch without events")?;
    let execution_id: ExecutionId = first
        .execution_id
        .parse()
        .map_err(|_| format!("invalid execution id {:?}", first.execution_id))?;
    if first.sequence == 0 {
        return Err("sequence 0 (sequences start at 1)".to_owned());
    }
    let mut expected = first.sequence;
    for (event_idx, event) in batch.events.iter().enumerate() {
        if event.execution_id != first.execution_id {
            return Err("events of several executions in one batch".to_owned());
        }
        if event.sequence != expected {
            return Err(format!(
                "sequence {} where {expected} was expected",
                event.sequence
            ));
        }
        // Checked: a batch running past `u64::MAX` is refused, not wrapped.
        if event_idx + 1 < batch.events.len() {
            expected = expected
                .checked_add(1)
                .ok_or("sequences beyond the largest 64-bit number")?;
        }
    }
    Ok(LogMessage {
        execution_id,
        events: batch.events,
    })
}

/// Returns the `oneof` member name of an event's kind, and the instance it is about.
fn describe(event: &v1::Event) -> (&'static str, Option<&str>) {
    use v1::event::Kind;
    match &event.kind {
        None => ("unknown", None),
        Some(kind) => match kind {
            Kind::ExecutionStarted(_) => ("execution_started", None),
            Kind::TaskStarted(e) => ("task_started", Some(e.task_instance_id.as_str())),
            Kind::TaskValidated(e) => ("task_validated", Some(e.task_instance_id.as_str())),
            Kind::TaskCompleted(e) => ("task_completed", Some(e.task_instance_id.as_str())),
            Kind::TaskFailed(e) => ("task_failed", Some(e.task_instance_id.as_str())),
            Kind::SubtasksSpawned(e) => ("subtasks_spawned", Some(e.task_instance_id.as_str())),
            Kind::QuestionAsked(e) => ("question_asked", Some(e.task_instance_id.as_str())),
            Kind::StepCheckpointed(e) => ("step_checkpointed", Some(e.task_instance_id.as_str())),
            Kind::TaskLost(e) => ("task_lost", Some(e.task_instance_id.as_str())),
            Kind::TaskPreempted(e) => ("task_preempted", Some(e.task_instance_id.as_str())),
            Kind::PauseRequested(_) => ("pause_requested", None),
            Kind::ResumeRequested(_) => ("resume_requested", None),
            Kind::CancelRequested(_) => ("cancel_requested", None),
            Kind::QuestionAnswered(_) => ("question_answered", None),
            Kind::TaskDispatched(e) => ("task_dispatched", Some(e.task_instance_id.as_str())),
            Kind::TaskTimedOut(e) => ("task_timed_out", Some(e.task_instance_id.as_str())),
            Kind::QuestionExpired(_) => ("question_expired", None),
            Kind::BudgetExhausted(_) => ("budget_exhausted", None),
            Kind::ExecutionTimedOut(_) => ("execution_timed_out", None),
            Kind::ExecutionFinished(_) => ("execution_finished", None),
            Kind::RunStarted(_) => ("run_started", None),
            Kind::ExecutionClaimed(_) => ("execution_claimed", None),
        },
    }
}

fn instant(unix_ms: i64) -> u64 {
    u64::try_from(unix_ms).unwrap_or(0)
}

/// Builds [`ReadModelBatch`]es from log messages, holding the replicas. No I/O: rebuilding a
/// replica from the log is done by the caller ([`Ingest`]) through [`Applier::needs_log`] and
/// [`Applier::rebuild`].
#[derive(Debug, Default)]
pub(super) struct Applier {
    executions: HashMap<ExecutionId, Tracked>,
}

/// What one run of messages changed, being built.
#[derive(Debug, Default)]
pub(super) struct Run {
    touched: Vec<ExecutionId>,
    events: Vec<EventRow>,
    asked: Vec<QuestionRow>,
    resolved: Vec<QuestionResolved>,
}

impl Applier {
    /// Returns the executions of `messages` this applier holds nothing about.
    pub(super) fn unknown(&self, messages: &[LogMessage]) -> Vec<ExecutionId> {
        let mut res: Vec<ExecutionId> = messages
            .iter()
            .map(|message| message.execution_id)
            .filter(|id| !self.executions.contains_key(id))
            .collect();
        res.sort_unstable();
        res.dedup();
        res
    }

    /// Records what the read model holds of an execution (0 when it holds nothing).
    pub(super) fn track(&mut self, execution_id: ExecutionId, last_sequence: u64) {
        self.executions.entry(execution_id).or_insert(Tracked {
            last_sequence,
            ..Tracked::default()
        });
    }

    /// Returns the executions of `messages` with new events but no replica, and the sequence up
    /// to which each one's log must be read to rebuild it (the event before its first new one).
    pub(super) fn needs_log(&self, messages: &[LogMessage]) -> Vec<(ExecutionId, u64)> {
        let mut first_new: BTreeMap<ExecutionId, u64> = BTreeMap::new();
        for message in messages {
            let Some(tracked) = self.executions.get(&message.execution_id) else {
                continue;
            };
            if tracked.replica.is_some() || tracked.no_replica {
                continue;
            }
            let new = message
                .events
                .iter()
                .find(|event| event.sequence > tracked.last_sequence && event.kind.is_some());
            if let Some(event) = new {
                first_new
                    .entry(message.execution_id)
                    .and_modify(|seq| *seq = (*seq).min(event.sequence))
                    .or_insert(event.sequence);
            }
        }
        first_new
            .into_iter()
            .filter(|(_, first)| *first > 1)
            .map(|(id, first)| (id, first - 1))
            .collect()
    }

    /// Rebuilds an execution's replica from its log's first events (`log` holds sequences 1..n
    /// in order). Events the read model already holds are applied silently; later ones are
    /// applied and written as if they had just arrived (they were missing from the read model).
    pub(super) fn rebuild(
        &mut self,
        execution_id: ExecutionId,
        log: Vec<v1::Event>,
        run: &mut Run,
    ) {
        let Some(tracked) = self.executions.get_mut(&execution_id) else {
            return;
        };
        let held = tracked.last_sequence;
        tracked.last_sequence = 0;
        for event in log {
            let silent = event.sequence <= held;
            self.apply_event(execution_id, event, silent, run);
        }
        if let Some(tracked) = self.executions.get_mut(&execution_id) {
            tracked.last_sequence = tracked.last_sequence.max(held);
            if tracked.replica.is_some() {
                tracing::info!(%execution_id, last_sequence = tracked.last_sequence, "replica rebuilt from the log");
            }
        }
    }

    /// Records that an execution's replica cannot be rebuilt.
    pub(super) fn give_up_replica(&mut self, execution_id: ExecutionId) {
        if let Some(tracked) = self.executions.get_mut(&execution_id) {
            tracked.no_replica = true;
        }
    }

    /// Applies the messages (already tracked, replicas rebuilt where possible).
    pub(super) fn apply_messages(&mut self, messages: Vec<LogMessage>, run: &mut Run) {
        for message in messages {
            for event in message.events {
                self.apply_event(message.execution_id, event, false, run);
            }
        }
    }

    /// Applies one event: skipped when at or below the execution's `last_sequence`; otherwise the
    /// replica takes it and, unless `silent`, its rows go into `run`.
    fn apply_event(
        &mut self,
        execution_id: ExecutionId,
        event: v1::Event,
        silent: bool,
        run: &mut Run,
    ) {
        let tracked = self.executions.entry(execution_id).or_default();
        if event.sequence <= tracked.last_sequence {
            return;
        }
        if event.sequence > tracked.last_sequence.saturating_add(1) && !silent {
            tracing::warn!(
                %execution_id,
                expected = tracked.last_sequence + 1,
                got = event.sequence,
                "events missing from the log; the read model of this execution has a gap"
            );
        }
        let sequence = event.sequence;
        let at_ms = instant(event.timestamp_unix_ms);
        tracked.last_sequence = sequence;
        tracked.last_event_at_ms = at_ms;
        let (kind, instance) = describe(&event);
        if !silent {
            if !run.touched.contains(&execution_id) {
                run.touched.push(execution_id);
            }
            run.events.push(EventRow {
                execution_id,
                sequence,
                at_ms,
                kind,
                task_instance_id: instance.and_then(|text| text.parse().ok()),
                payload: event.encode_to_vec(),
            });
        }
        // An event of a kind this build does not know (a newer coordinator wrote it) is recorded
        // above and skipped by the replica, which goes on.
        if event.kind.is_none() {
            tracing::warn!(%execution_id, sequence, "event of an unknown kind skipped");
            if let Some(replica) = tracked.replica.as_mut()
                && let Err(err) = replica.replay.apply_event(&event)
            {
                end_replica(tracked, &err);
            }
            return;
        }
        let entry = match log::event_from_proto(&event) {
            Ok(entry) => entry,
            Err(err) => {
                let err = format!("execution {execution_id}, sequence {sequence}: {err}");
                end_replica(tracked, &err);
                return;
            }
        };
        if let LogEntry::Event(event) = &entry
            && !silent
        {
            collect_questions(execution_id, event, run);
        }
        match (tracked.replica.as_mut(), entry) {
            (None, LogEntry::Started(started)) if sequence == 1 => {
                tracked.replica = start_replica(execution_id, started);
                tracked.no_replica = tracked.replica.is_none();
            }
            (None, LogEntry::Started(_)) => {
                tracing::warn!(%execution_id, sequence, "ExecutionStarted after sequence 1 ignored");
            }
            (None, LogEntry::Event(_)) => {}
            (Some(replica), entry) => match replica.replay.apply(sequence, &entry) {
                Ok(Step::Applied | Step::Duplicate) => {}
                Ok(Step::Refused(err)) => {
                    tracing::warn!(%execution_id, sequence, %err, "the replica refused an event the coordinator logged");
                }
                Ok(Step::Unknown) => {}
                Err(err) => end_replica(tracked, &err),
            },
        }
    }

    /// Returns the batch to write for this run, and forgets replicas whose execution finished.
    pub(super) fn finish(&mut self, run: Run) -> ReadModelBatch {
        let mut batch = ReadModelBatch {
            events: run.events,
            questions_resolved: run.resolved,
            ..ReadModelBatch::default()
        };
        // Each execution's changed records, each instance once (an instance id names one
        // instance of one execution).
        let mut changed: Vec<Vec<TaskStatusRecord>> = Vec::with_capacity(run.touched.len());
        for execution_id in run.touched {
            let Some(tracked) = self.executions.get_mut(&execution_id) else {
                continue;
            };
            let Some(replica) = tracked.replica.as_mut() else {
                batch.executions.push(ExecutionWrite::Sequence {
                    execution_id,
                    last_sequence: tracked.last_sequence,
                    first_event_at_ms: tracked.last_event_at_ms,
                });
                continue;
            };
            let records = replica.replay.take_changed_records();
            let machine = replica.replay.machine();
            let started = replica.replay.started();
            let root_id = machine.root_instance_id();
            if let Some(root) = records
                .iter()
                .find(|record| record.task_instance_id == root_id)
            {
                replica.run = RunTimes {
                    run_number: root.run_number,
                    started_at_ms: root.started_at_ms,
                    ended_at_ms: root.ended_at_ms,
                };
            }
            changed.push(records);
            let progress = machine.progress(tracked.last_event_at_ms);
            let labels = if replica.labels_written {
                BTreeMap::new()
            } else {
                replica.labels_written = true;
                started.labels.clone()
            };
            batch
                .executions
                .push(ExecutionWrite::Row(Box::new(ExecutionRow {
                    execution_id,
                    name: started.plan_name.clone(),
                    state: machine.state(),
                    run_number: replica.run.run_number,
                    created_at_ms: started.started_at_ms,
                    started_at_ms: replica.run.started_at_ms,
                    ended_at_ms: replica.run.ended_at_ms,
                    reason: machine.reason().unwrap_or_default().to_owned(),
                    idempotency_key: started.idempotency_key.clone(),
                    namespace: started.namespace().to_owned(),
                    labels,
                    last_sequence: tracked.last_sequence,
                    usage: machine.usage(),
                    progress: ProgressRow {
                        counts: progress.counts,
                        total: progress.total,
                        done: progress.done,
                        percent: progress.percent,
                        wave: progress.wave,
                        waves: progress.waves,
                    },
                })));
            if machine.state().is_terminal() {
                tracing::debug!(%execution_id, "execution finished; replica dropped");
                tracked.replica = None;
            }
        }
        batch.instances = concat(changed);
        // In the order the store writes them: neighbours in its indexes, and the same order for
        // the same batch.
        batch
            .instances
            .sort_unstable_by_key(|record| (record.correlation_id, record.task_instance_id));
        if !run.asked.is_empty() {
            let by_id: HashMap<TaskInstanceId, &TaskStatusRecord> = batch
                .instances
                .iter()
                .map(|record| (record.task_instance_id, record))
                .collect();
            for mut asked in run.asked {
                // The asking instance changed state with the question, so its record is here.
                if let Some(record) = by_id.get(&asked.task_instance_id) {
                    asked.task_id = record.task_id.clone();
                }
                batch.questions_asked.push(asked);
            }
        }
        batch
    }

    /// Forgets executions without a replica (finished ones): what they need is in the read
    /// model. Keeps memory bounded by the unfinished executions.
    pub(super) fn forget_finished(&mut self) {
        self.executions
            .retain(|_, tracked| tracked.replica.is_some() || tracked.no_replica);
    }
}

/// The records of every execution in one list, allocated once at its full size. A run of one
/// execution's messages (the common case under load) hands over its list as it is.
fn concat<T>(mut parts: Vec<Vec<T>>) -> Vec<T> {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut all = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for part in parts {
        all.extend(part);
    }
    all
}

/// Ends the replica of an execution whose log it cannot follow: the events are still recorded,
/// its task instances no longer (they would be wrong).
fn end_replica(tracked: &mut Tracked, err: &dyn std::fmt::Display) {
    tracing::warn!(%err, "the replica cannot follow the log; the execution's task instances are no longer recorded");
    tracked.replica = None;
    tracked.no_replica = true;
}

fn start_replica(execution_id: ExecutionId, started: Started) -> Option<Replica> {
    let run = RunTimes {
        run_number: started.run_number,
        started_at_ms: Some(started.started_at_ms),
        ended_at_ms: None,
    };
    match Replayer::start(execution_id, started) {
        Ok(replay) => Some(Replica {
            replay,
            run,
            labels_written: false,
        }),
        Err(err) => {
            tracing::warn!(%err, "no replica of the execution; its task instances are not recorded");
            None
        }
    }
}

fn collect_questions(execution_id: ExecutionId, event: &Event, run: &mut Run) {
    match &event.body {
        EventBody::QuestionAsked {
            instance,
            attempt,
            question,
        } => run.asked.push(QuestionRow {
            execution_id,
            task_instance_id: *instance,
            task_id: String::new(),
            attempt: *attempt,
            question: question.clone(),
            asked_at_ms: event.at_ms,
        }),
        EventBody::QuestionAnswered { question, answer } => run.resolved.push(QuestionResolved {
            question_id: *question,
            resolution: Resolution::Answered(answer.clone()),
            at_ms: event.at_ms,
        }),
        EventBody::QuestionExpired { question } => run.resolved.push(QuestionResolved {
            question_id: *question,
            resolution: Resolution::Expired,
            at_ms: event.at_ms,
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests;

/// The read model's consumption of the event log, with no I/O, for the fuzz targets in `fuzz/`.
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing {
    use super::{Applier, LogMessage, Run, decode_message};

    /// Feeds `payloads` to a fresh read model as consecutive runs of log messages, the way the
    /// store's consumer does when every execution is new to it: messages that do not decode are
    /// skipped, a replica missing its start gives up. Returns how many events the batches would
    /// write.
    pub(crate) fn ingest(payloads: &[&[u8]]) -> usize {
        let mut applier = Applier::default();
        let mut written = 0;
        for payload in payloads {
            let messages: Vec<LogMessage> = decode_message(payload).into_iter().collect();
            for execution_id in applier.unknown(&messages) {
                applier.track(execution_id, 0);
            }
            for (execution_id, _) in applier.needs_log(&messages) {
                // The log is not read here: as if it could not be.
                applier.give_up_replica(execution_id);
            }
            let mut run = Run::default();
            applier.apply_messages(messages, &mut run);
            let batch = applier.finish(run);
            written += batch.events.len();
            applier.forget_finished();
        }
        written
    }
}
