//! The invariants, checked after every step of the simulation (ARCHITECTURE.md, "Invariant:"
//! lines):
//!
//! - only one owner extends a log: every execution's event sequences run 1, 2, 3, ... in the
//!   stream, without a gap or a repeat (two writers would both write the same sequence);
//! - an execution is in the index before its first event and before a new run's first event;
//! - replaying the log gives the state: every logged event applies, and a coordinator's live
//!   state equals the replay of the log up to the sequence it holds;
//! - no instance completes twice, each subtask group resumes its parent at most once (and exactly
//!   once when it settled and was not abandoned, by the end), conflicting tasks never run together;
//! - no instance is lost: once faults stop, every execution completes.

use std::collections::BTreeMap;

use trellis_coordinator::recovery;
use trellis_coordinator::turn::{Coordinator, LogMessage, index_key};
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_core::machine::{Applied, EventBody, Execution, ExecutionState};
use trellis_core::record::TaskState;
use trellis_wire::log;
use trellis_wire::log::LogEntry;

use crate::nats::{Nats, Record};

/// The log as replayed so far, one execution.
#[derive(Debug)]
pub struct Replica {
    pub machine: Execution,
    pub seq: u64,
}

/// Replays the log as it grows and checks every invariant.
#[derive(Debug, Default)]
pub struct Checker {
    pub replicas: BTreeMap<ExecutionId, Replica>,
    /// Records of the event stream replayed so far.
    seen: usize,
    completions: BTreeMap<TaskInstanceId, u32>,
}

impl Checker {
    /// Replays what was appended since the last call; returns the first violation.
    pub fn observe(&mut self, nats: &Nats, shards: u32) -> Result<(), String> {
        while self.seen < nats.events.records.len() {
            let record = nats.events.records[self.seen].clone();
            self.seen += 1;
            self.replay(&record, nats, shards)?;
        }
        Ok(())
    }

    fn replay(&mut self, record: &Record, nats: &Nats, shards: u32) -> Result<(), String> {
        let id = record.id;
        let batch = log::decode_event_batch(&record.payload).map_err(|err| {
            format!(
                "log message {} of {id} does not decode: {err}",
                record.stream_seq
            )
        })?;
        let shard = trellis_proto::subjects::shard_of(&id.to_string(), shards);
        let indexed = nats.index.contains(&index_key(shard, id));
        let Some(replica) = self.replicas.get_mut(&id) else {
            if batch.first_sequence != 1 {
                return Err(format!(
                    "the log of {id} starts at sequence {}",
                    batch.first_sequence
                ));
            }
            if !indexed {
                return Err(format!("{id} was appended to before it was in the index"));
            }
            let first = LogMessage {
                stream_seq: record.stream_seq,
                first_seq: 1,
                payload: record.payload.clone(),
            };
            let (started, plan) =
                recovery::started_of(id, &first).map_err(|err| err.to_string())?;
            let recovered =
                recovery::replay(id, started, plan, None, vec![first], record.stream_seq)
                    .map_err(|err| err.to_string())?;
            let machine = recovered.machine;
            self.replicas.insert(
                id,
                Replica {
                    machine,
                    seq: recovered.seq,
                },
            );
            return self.after_events(id);
        };
        for (offset, entry) in batch.entries.into_iter().enumerate() {
            let sequence = batch.first_sequence + offset as u64;
            if sequence != replica.seq + 1 {
                return Err(format!(
                    "the log of {id} holds sequence {sequence} after {} (stream message {}, \
                     written by coordinator {}): two writers, or a gap",
                    replica.seq, record.stream_seq, record.writer
                ));
            }
            replica.seq = sequence;
            let LogEntry::Event(event) = entry else {
                return Err(format!(
                    "execution_started again at sequence {sequence} of {id}"
                ));
            };
            if let EventBody::RunStarted { .. } = event.body
                && !indexed
            {
                return Err(format!(
                    "a new run of {id} was logged before it was in the index"
                ));
            }
            match replica.machine.apply(&event) {
                Ok(Applied::Changed { .. }) => {}
                other => {
                    return Err(format!(
                        "event {sequence} of {id} ({}) does not replay: {other:?}",
                        event.body.name()
                    ));
                }
            }
            if let EventBody::TaskLost { instance, attempt } = event.body
                && let Some(acked_at) = nats.acked_results.get(&(instance.to_string(), attempt))
                && *acked_at < event.at_ms
            {
                return Err(format!(
                    "attempt {attempt} of instance {instance} of {id} was found lost at {}, \
                     but a result ending it was acknowledged at {acked_at}: the result was dropped",
                    event.at_ms
                ));
            }
            if let EventBody::TaskCompleted { instance, .. } = event.body {
                let n = self.completions.entry(instance).or_default();
                *n += 1;
                if *n > 1 {
                    return Err(format!("instance {instance} of {id} completed twice"));
                }
            }
        }
        self.after_events(id)
    }

    /// Checks one execution's replayed state after a log message.
    fn after_events(&self, id: ExecutionId) -> Result<(), String> {
        let Some(replica) = self.replicas.get(&id) else {
            return Ok(());
        };
        let machine = &replica.machine;
        for (group, parent, _, _) in machine.groups() {
            if machine.resumptions_of(group) > 1 {
                return Err(format!(
                    "group {group} of {id} resumed its parent {parent} more than once"
                ));
            }
        }
        // Path locks: the plan tasks whose chains are running (or waiting on subtasks) must not
        // conflict.
        let plan = machine.plan();
        let held: Vec<usize> = machine
            .instances_in(TaskState::Running)
            .chain(machine.instances_in(TaskState::WaitingForSubtasks))
            .filter_map(|instance| machine.lock_task(instance))
            .collect();
        for (i, a) in held.iter().enumerate() {
            for b in &held[i + 1..] {
                if a != b && plan.conflicts[*a].contains(b) {
                    return Err(format!(
                        "conflicting tasks {} and {} of {id} run at the same time",
                        plan.tasks[*a].id, plan.tasks[*b].id
                    ));
                }
            }
        }
        Ok(())
    }

    /// Checks a coordinator's live executions against the replay of the log.
    pub fn compare(&self, node: usize, coordinator: &Coordinator) -> Result<(), String> {
        // Every log the simulation writes replays: one that does not is a coordinator's bug.
        if let Some(broken) = coordinator.needing_attention().next() {
            return Err(format!(
                "coordinator {node} holds {} as needing attention: {}",
                broken.id, broken.reason
            ));
        }
        for id in coordinator.execution_ids() {
            let (Some(live), Some(sequence)) =
                (coordinator.execution(id), coordinator.last_sequence(id))
            else {
                continue;
            };
            let Some(replica) = self.replicas.get(&id) else {
                return Err(format!("coordinator {node} holds {id}, which has no log"));
            };
            if sequence > replica.seq {
                return Err(format!(
                    "coordinator {node} holds {id} at sequence {sequence}, past its log's {}",
                    replica.seq
                ));
            }
            // A coordinator behind the log lost the execution to another one; its next append
            // is refused.
            if sequence == replica.seq && *live != replica.machine {
                return Err(format!(
                    "coordinator {node}'s live state of {id} differs from the replay of its log \
                     at sequence {sequence}"
                ));
            }
        }
        Ok(())
    }

    /// Checks, once faults stopped and the cluster settled, that nothing was lost.
    pub fn at_end(&self, nats: &Nats) -> Result<(), String> {
        for (id, replica) in &self.replicas {
            let machine = &replica.machine;
            if machine.state() != ExecutionState::Completed {
                let running: Vec<String> = machine
                    .instances_in(TaskState::Running)
                    .map(|i| i.to_string())
                    .collect();
                return Err(format!(
                    "execution {id} ended {} ({}) instead of completed; running: {running:?}",
                    machine.state().as_str(),
                    machine.reason().unwrap_or(""),
                ));
            }
            // Every result tells who ran its attempt and when it started: each completed
            // instance knows its worker, and its times are in order.
            for record in machine.records() {
                let root = record.parent_task_instance_id.is_none()
                    && record.resumed_after_subtasks_group_id.is_none()
                    && record.continues_task_instance_id.is_none();
                if record.state != TaskState::Completed || root {
                    continue;
                }
                let times = [
                    Some(record.created_at_ms),
                    record.dispatched_at_ms,
                    record.started_at_ms,
                    record.ended_at_ms,
                ];
                if record.worker_id.is_none()
                    || times.iter().any(Option::is_none)
                    || !times.is_sorted()
                {
                    return Err(format!(
                        "completed instance {} of {id} has worker {:?} and times {times:?}",
                        record.task_instance_id, record.worker_id
                    ));
                }
            }
            for (group, parent, settled, abandoned) in machine.groups() {
                if settled && !abandoned && machine.resumptions_of(group) != 1 {
                    return Err(format!(
                        "group {group} of {id} settled but did not resume its parent {parent}"
                    ));
                }
            }
        }
        if let Some(key) = nats.indexed_with_log().next() {
            return Err(format!(
                "{key} is still in the index after its execution finished"
            ));
        }
        Ok(())
    }
}
