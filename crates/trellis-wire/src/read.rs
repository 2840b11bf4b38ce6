//! Read projections on the wire: what the coordinator, the checkpoint-store and the monitor
//! answer about executions (the model of docs/design.md §4 in the answers of §8): task and execution states, progress snapshots
//! (published on `trellis.progress.<execution_id>`), counts by state, task instance records
//! (seed 000/001) and the execution graph, flattened so that it decodes at any depth.

use std::borrow::Cow;

use trellis_core::graph::{self, ExecutionGraph};
use trellis_core::ids::WorkerId;
use trellis_core::machine::{ExecutionState, Progress, StateCounts};
use trellis_core::record::{AttemptRecord, TaskState, TaskStatusRecord};
use trellis_proto::v1;

use crate::common::{
    check_results_from_proto, check_results_to_proto, instant_to_proto, json_to_bytes,
};
use crate::error::{
    At, ConvertError, ConvertErrorKind, parse_enum, parse_id, parse_instant, parse_json,
    parse_optional_id, required,
};

// ------------------------------------------------------------------------------------------------
// States
// ------------------------------------------------------------------------------------------------

/// Returns the wire value (`v1::TaskState`) of a task state.
pub fn task_state_to_proto(state: TaskState) -> i32 {
    let state = match state {
        TaskState::Pending => v1::TaskState::Pending,
        TaskState::Queued => v1::TaskState::Queued,
        TaskState::Blocked => v1::TaskState::Blocked,
        TaskState::Running => v1::TaskState::Running,
        TaskState::WaitingForSubtasks => v1::TaskState::WaitingForSubtasks,
        TaskState::WaitingForHuman => v1::TaskState::WaitingForHuman,
        TaskState::RetryScheduled => v1::TaskState::RetryScheduled,
        TaskState::Completed => v1::TaskState::Completed,
        TaskState::Failed => v1::TaskState::Failed,
        TaskState::Skipped => v1::TaskState::Skipped,
        TaskState::Cancelled => v1::TaskState::Cancelled,
    };
    state.into()
}

/// Reads a task state; `TASK_STATE_UNSPECIFIED` and unknown values are errors.
pub fn task_state_from_proto(state: i32) -> Result<TaskState, ConvertError> {
    parse_task_state(&At::root("task_state"), state)
}

/// Reads a task state at path `at`.
pub(crate) fn parse_task_state(at: &At<'_>, state: i32) -> Result<TaskState, ConvertError> {
    Ok(match parse_enum(at, state)? {
        v1::TaskState::Unspecified => return Err(at.error(ConvertErrorKind::Unspecified)),
        v1::TaskState::Pending => TaskState::Pending,
        v1::TaskState::Queued => TaskState::Queued,
        v1::TaskState::Blocked => TaskState::Blocked,
        v1::TaskState::Running => TaskState::Running,
        v1::TaskState::WaitingForSubtasks => TaskState::WaitingForSubtasks,
        v1::TaskState::WaitingForHuman => TaskState::WaitingForHuman,
        v1::TaskState::RetryScheduled => TaskState::RetryScheduled,
        v1::TaskState::Completed => TaskState::Completed,
        v1::TaskState::Failed => TaskState::Failed,
        v1::TaskState::Skipped => TaskState::Skipped,
        v1::TaskState::Cancelled => TaskState::Cancelled,
    })
}

/// Returns the wire value (`v1::ExecutionState`) of an execution state.
pub fn execution_state_to_proto(state: ExecutionState) -> i32 {
    let state = match state {
        ExecutionState::Pending => v1::ExecutionState::Pending,
        ExecutionState::Running => v1::ExecutionState::Running,
        ExecutionState::Paused => v1::ExecutionState::Paused,
        ExecutionState::WaitingForHuman => v1::ExecutionState::WaitingForHuman,
        ExecutionState::Completed => v1::ExecutionState::Completed,
        ExecutionState::Failed => v1::ExecutionState::Failed,
        ExecutionState::Cancelled => v1::ExecutionState::Cancelled,
    };
    state.into()
}

/// Reads an execution state; `EXECUTION_STATE_UNSPECIFIED` and unknown values are errors.
pub fn execution_state_from_proto(state: i32) -> Result<ExecutionState, ConvertError> {
    parse_execution_state(&At::root("execution_state"), state)
}

/// Reads an execution state at path `at`.
fn parse_execution_state(at: &At<'_>, state: i32) -> Result<ExecutionState, ConvertError> {
    Ok(match parse_enum(at, state)? {
        v1::ExecutionState::Unspecified => return Err(at.error(ConvertErrorKind::Unspecified)),
        v1::ExecutionState::Pending => ExecutionState::Pending,
        v1::ExecutionState::Running => ExecutionState::Running,
        v1::ExecutionState::Paused => ExecutionState::Paused,
        v1::ExecutionState::WaitingForHuman => ExecutionState::WaitingForHuman,
        v1::ExecutionState::Completed => ExecutionState::Completed,
        v1::ExecutionState::Failed => ExecutionState::Failed,
        v1::ExecutionState::Cancelled => ExecutionState::Cancelled,
    })
}

// ------------------------------------------------------------------------------------------------
// Progress, task instances, the execution graph
// ------------------------------------------------------------------------------------------------

/// Returns the wire form of a progress snapshot. The envelope fields the core does not know
/// (`execution_id`, `run_number`, `sequence`, `sent_at_unix_ms`) are left for the caller to set.
pub fn progress_to_proto(progress: &Progress) -> v1::Progress {
    v1::Progress {
        execution_id: String::new(),
        run_number: 0,
        state: execution_state_to_proto(progress.state),
        counts: Some(counts_to_proto(&progress.counts)),
        total: progress.total,
        done: progress.done,
        percent: progress.percent,
        eta_ms: progress.eta_ms,
        wave: progress.wave,
        waves: progress.waves,
        reason: progress.reason.as_deref().map(str::to_owned),
        sequence: 0,
        sent_at_unix_ms: 0,
    }
}

/// Reads a progress snapshot (the envelope fields are the caller's to read).
pub fn progress_from_proto(progress: &v1::Progress) -> Result<Progress, ConvertError> {
    let at = At::root("progress");
    Ok(Progress {
        state: parse_execution_state(&at.field("state"), progress.state)?,
        counts: progress
            .counts
            .as_ref()
            .map(counts_from_proto)
            .unwrap_or_default(),
        total: progress.total,
        done: progress.done,
        percent: progress.percent,
        eta_ms: progress.eta_ms,
        wave: progress.wave,
        waves: progress.waves,
        reason: progress.reason.clone().map(Cow::Owned),
    })
}

/// Returns the wire form of counts by task state.
pub fn counts_to_proto(counts: &StateCounts) -> v1::TaskStateCounts {
    let [
        pending,
        queued,
        blocked,
        running,
        waiting_for_subtasks,
        waiting_for_human,
        retry_scheduled,
        completed,
        failed,
        skipped,
        cancelled,
    ] = TaskState::ALL.map(|state| counts.get(state));
    v1::TaskStateCounts {
        pending,
        queued,
        blocked,
        running,
        waiting_for_subtasks,
        waiting_for_human,
        retry_scheduled,
        completed,
        failed,
        skipped,
        cancelled,
    }
}

/// Reads counts by task state.
pub fn counts_from_proto(counts: &v1::TaskStateCounts) -> StateCounts {
    // In the order of `TaskState::ALL`, which `StateCounts` is indexed by.
    StateCounts([
        counts.pending,
        counts.queued,
        counts.blocked,
        counts.running,
        counts.waiting_for_subtasks,
        counts.waiting_for_human,
        counts.retry_scheduled,
        counts.completed,
        counts.failed,
        counts.skipped,
        counts.cancelled,
    ])
}

/// Returns the wire form of a task instance record.
pub fn record_to_proto(record: &TaskStatusRecord) -> v1::TaskInstance {
    v1::TaskInstance {
        task_instance_id: record.task_instance_id.to_string(),
        task_id: record.task_id.clone(),
        parent_task_instance_id: record.parent_task_instance_id.map(|id| id.to_string()),
        subtask_group_id: record.subtask_group_id.map(|id| id.to_string()),
        resumed_after_subtasks_group_id: record
            .resumed_after_subtasks_group_id
            .map(|id| id.to_string()),
        continues_task_instance_id: record.continues_task_instance_id.map(|id| id.to_string()),
        correlation_id: record.correlation_id.to_string(),
        run_number: record.run_number,
        attempt: record.attempt,
        state: task_state_to_proto(record.state),
        worker_id: record.worker_id.as_ref().map(|worker| worker.0.clone()),
        created_at_unix_ms: instant_to_proto(record.created_at_ms),
        dispatched_at_unix_ms: record.dispatched_at_ms.map(instant_to_proto),
        started_at_unix_ms: record.started_at_ms.map(instant_to_proto),
        ended_at_unix_ms: record.ended_at_ms.map(instant_to_proto),
        output: record.output.as_ref().map(json_to_bytes),
        error: record.error.clone(),
        earlier_attempts: record
            .earlier_attempts
            .iter()
            .map(|attempt| v1::TaskAttempt {
                attempt: attempt.attempt,
                worker_id: attempt.worker_id.as_ref().map(|worker| worker.0.clone()),
                dispatched_at_unix_ms: attempt.dispatched_at_ms.map(instant_to_proto),
                started_at_unix_ms: attempt.started_at_ms.map(instant_to_proto),
                ended_at_unix_ms: instant_to_proto(attempt.ended_at_ms),
                error: attempt.error.clone(),
                validation: check_results_to_proto(&attempt.validation),
            })
            .collect(),
        validation: check_results_to_proto(&record.validation),
    }
}

/// Reads a task instance record.
pub fn record_from_proto(record: &v1::TaskInstance) -> Result<TaskStatusRecord, ConvertError> {
    parse_record(&At::root("task_instance"), record)
}

/// Reads a task instance record at path `at`.
fn parse_record(at: &At<'_>, record: &v1::TaskInstance) -> Result<TaskStatusRecord, ConvertError> {
    let optional_instant = |field: &'static str, unix_ms: Option<i64>| {
        unix_ms
            .map(|unix_ms| parse_instant(&at.field(field), unix_ms))
            .transpose()
    };
    Ok(TaskStatusRecord {
        task_instance_id: parse_id(&at.field("task_instance_id"), &record.task_instance_id)?,
        task_id: record.task_id.clone(),
        parent_task_instance_id: parse_optional_id(
            &at.field("parent_task_instance_id"),
            record.parent_task_instance_id.as_deref(),
        )?,
        subtask_group_id: parse_optional_id(
            &at.field("subtask_group_id"),
            record.subtask_group_id.as_deref(),
        )?,
        resumed_after_subtasks_group_id: parse_optional_id(
            &at.field("resumed_after_subtasks_group_id"),
            record.resumed_after_subtasks_group_id.as_deref(),
        )?,
        continues_task_instance_id: parse_optional_id(
            &at.field("continues_task_instance_id"),
            record.continues_task_instance_id.as_deref(),
        )?,
        correlation_id: parse_id(&at.field("correlation_id"), &record.correlation_id)?,
        run_number: record.run_number,
        attempt: record.attempt,
        state: parse_task_state(&at.field("state"), record.state)?,
        worker_id: record.worker_id.clone().map(WorkerId),
        created_at_ms: parse_instant(&at.field("created_at_unix_ms"), record.created_at_unix_ms)?,
        dispatched_at_ms: optional_instant("dispatched_at_unix_ms", record.dispatched_at_unix_ms)?,
        started_at_ms: optional_instant("started_at_unix_ms", record.started_at_unix_ms)?,
        ended_at_ms: optional_instant("ended_at_unix_ms", record.ended_at_unix_ms)?,
        output: record
            .output
            .as_deref()
            .map(|output| parse_json(&at.field("output"), output))
            .transpose()?,
        error: record.error.clone(),
        earlier_attempts: record
            .earlier_attempts
            .iter()
            .enumerate()
            .map(|(n, attempt)| parse_attempt(&at.field("earlier_attempts").index(n), attempt))
            .collect::<Result<_, _>>()?,
        validation: check_results_from_proto(&at.field("validation"), &record.validation)?,
    })
}

/// Reads one earlier attempt of a record at path `at`.
fn parse_attempt(at: &At<'_>, attempt: &v1::TaskAttempt) -> Result<AttemptRecord, ConvertError> {
    let optional_instant = |field: &'static str, unix_ms: Option<i64>| {
        unix_ms
            .map(|unix_ms| parse_instant(&at.field(field), unix_ms))
            .transpose()
    };
    Ok(AttemptRecord {
        attempt: attempt.attempt,
        worker_id: attempt.worker_id.clone().map(WorkerId),
        dispatched_at_ms: optional_instant("dispatched_at_unix_ms", attempt.dispatched_at_unix_ms)?,
        started_at_ms: optional_instant("started_at_unix_ms", attempt.started_at_unix_ms)?,
        ended_at_ms: parse_instant(&at.field("ended_at_unix_ms"), attempt.ended_at_unix_ms)?,
        error: attempt.error.clone(),
        validation: check_results_from_proto(&at.field("validation"), &attempt.validation)?,
    })
}

/// Returns the flat wire form of an execution graph: nodes in the graph's pre-order (node 0 is the
/// root), groups in the graph's order, and indices between them.
pub fn graph_to_proto(execution_graph: &ExecutionGraph) -> v1::ExecutionGraph {
    // The graph builder numbers at most `u32::MAX` nodes, so its indices always fit.
    let to_u32 = |idx: usize| u32::try_from(idx).unwrap_or(u32::MAX);
    let nodes = execution_graph
        .nodes()
        .map(|node| v1::GraphNode {
            record: Some(record_to_proto(node.record)),
            next: match node.next {
                graph::Next::None => None,
                graph::Next::Node(next) => {
                    Some(v1::graph_node::Next::NodeIndex(to_u32(next.index())))
                }
                graph::Next::Group(group) => {
                    Some(v1::graph_node::Next::GroupIndex(to_u32(group.index())))
                }
            },
        })
        .collect();
    let groups = execution_graph
        .groups()
        .iter()
        .map(|group| v1::GraphGroup {
            group_id: group.group_id.to_string(),
            node_indices: group
                .nodes
                .iter()
                .map(|node| to_u32(node.index()))
                .collect(),
            next_node_index: group.next.map(|node| to_u32(node.index())),
        })
        .collect();
    v1::ExecutionGraph {
        nodes,
        groups,
        root_indices: vec![to_u32(execution_graph.root().index())],
    }
}

/// Reads the records of a flat execution graph, in node order; rebuild the tree from them with
/// `trellis_core::graph::build`, which checks the links.
pub fn graph_records_from_proto(
    execution_graph: &v1::ExecutionGraph,
) -> Result<Vec<TaskStatusRecord>, ConvertError> {
    let at = At::root("execution_graph");
    let nodes_at = at.field("nodes");
    execution_graph
        .nodes
        .iter()
        .enumerate()
        .map(|(node_idx, node)| {
            let record_at = nodes_at.index(node_idx);
            let record_at = record_at.field("record");
            parse_record(&record_at, required(&record_at, &node.record)?)
        })
        .collect()
}
