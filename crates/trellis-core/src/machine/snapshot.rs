//! Snapshots: the state of an [`Execution`] as bytes, and back (docs/design.md §2, §4).
//!
//! A snapshot holds everything `apply` and `decide` read except the plan, which the caller
//! decodes from the log's `ExecutionStarted`. Indexes derived from the plan or the instances
//! (`by_id`, `group_by_id`) are rebuilt on restore and those of the plan alone are the plan's
//! ([`crate::plan::Plan::shape`]), so they cannot drift.
//! The encoding is MessagePack (`rmp-serde`): compact, self-describing enough for the JSON values
//! tasks produce, and deterministic here because every collection in it is ordered, so the same
//! state always gives the same bytes (and the same checksum).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{
    Changed, Execution, ExecutionState, Group, Holds, InstIdx, Instance, Next, OpenQuestion,
    Origin, ReadySet, Slot, StateCounts, TaskState, Usage, Work,
};
use crate::ids::{ExecutionId, QuestionId};
use crate::plan::Plan;

/// Version of the snapshot encoding; a reader refuses any other.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

/// Why snapshot bytes could not be restored.
#[derive(Debug, Error)]
pub enum SnapshotError {
    #[error(
        "snapshot format {found} is not supported (this build reads format {SNAPSHOT_FORMAT_VERSION})"
    )]
    Format { found: u32 },
    #[error("snapshot bytes are malformed: {0}")]
    Decode(String),
    #[error("snapshot does not fit the plan: {0}")]
    PlanMismatch(String),
}

/// The encoded fields, borrowed for writing. Field order is the encoding: change it only with
/// [`SNAPSHOT_FORMAT_VERSION`].
#[derive(Serialize)]
struct Borrowed<'a> {
    format: u32,
    id: ExecutionId,
    n_tasks: u32,
    run_number: u32,
    state: ExecutionState,
    reason: &'a Option<String>,
    started_at_ms: u64,
    run_started_at_ms: u64,
    ended_at_ms: Option<u64>,
    slots: &'a [Slot],
    open_slots: u32,
    failed_slots: u32,
    instances: &'a [Instance],
    groups: &'a [Group],
    questions: &'a BTreeMap<QuestionId, OpenQuestion>,
    open_questions: u32,
    ready: &'a ReadySet,
    next_ready_key: u64,
    retries: &'a BTreeSet<(u64, InstIdx)>,
    deadlines: &'a BTreeSet<(u64, InstIdx)>,
    expiries: &'a BTreeSet<(u64, QuestionId)>,
    running: u32,
    usage: Usage,
    budget_tripped: bool,
    settled_units: u64,
    holds: &'a Holds,
    finish_due: bool,
    budget_grants: u32,
}

/// The same fields, owned for reading.
#[derive(Deserialize)]
struct Owned {
    /// Checked before decoding (`read_format`).
    _format: u32,
    id: ExecutionId,
    n_tasks: u32,
    run_number: u32,
    state: ExecutionState,
    reason: Option<String>,
    started_at_ms: u64,
    run_started_at_ms: u64,
    ended_at_ms: Option<u64>,
    slots: Vec<Slot>,
    open_slots: u32,
    failed_slots: u32,
    instances: Vec<Instance>,
    groups: Vec<Group>,
    questions: BTreeMap<QuestionId, OpenQuestion>,
    open_questions: u32,
    ready: ReadySet,
    next_ready_key: u64,
    retries: BTreeSet<(u64, InstIdx)>,
    deadlines: BTreeSet<(u64, InstIdx)>,
    expiries: BTreeSet<(u64, QuestionId)>,
    running: u32,
    usage: Usage,
    budget_tripped: bool,
    settled_units: u64,
    /// Added after format 1 was fixed: older snapshots end before it and hold nothing.
    #[serde(default)]
    holds: Holds,
    /// Added after format 1 was fixed, as `holds`.
    #[serde(default)]
    finish_due: bool,
    /// Added after format 1 was fixed, as `holds`.
    #[serde(default)]
    budget_grants: u32,
}

impl Execution {
    /// Returns the state as snapshot bytes. The same state always gives the same bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let borrowed = Borrowed {
            format: SNAPSHOT_FORMAT_VERSION,
            id: self.id,
            n_tasks: self.slots.len() as u32,
            run_number: self.run_number,
            state: self.state,
            reason: &self.reason,
            started_at_ms: self.started_at_ms,
            run_started_at_ms: self.run_started_at_ms,
            ended_at_ms: self.ended_at_ms,
            slots: &self.slots,
            open_slots: self.open_slots,
            failed_slots: self.failed_slots,
            instances: &self.instances,
            groups: &self.groups,
            questions: &self.questions,
            open_questions: self.open_questions,
            ready: &self.ready,
            next_ready_key: self.next_ready_key,
            retries: &self.retries,
            deadlines: &self.deadlines,
            expiries: &self.expiries,
            running: self.running,
            usage: self.usage,
            budget_tripped: self.budget_tripped,
            settled_units: self.settled_units,
            holds: &self.holds,
            finish_due: self.finish_due,
            budget_grants: self.budget_grants,
        };
        // Encoding into a Vec cannot fail: every field is a plain value, map keys included.
        rmp_serde::to_vec(&borrowed).unwrap_or_default()
    }

    /// Rebuilds an execution of `plan` from snapshot bytes. Fails, without panicking, on bytes of
    /// another format, malformed bytes, or a snapshot whose indexes do not fit the plan.
    pub fn restore(plan: Arc<Plan>, bytes: &[u8]) -> Result<Execution, SnapshotError> {
        // The first element of the encoded array is the format.
        let format = read_format(bytes)?;
        if format != SNAPSHOT_FORMAT_VERSION {
            return Err(SnapshotError::Format { found: format });
        }
        let owned: Owned =
            rmp_serde::from_slice(bytes).map_err(|err| SnapshotError::Decode(err.to_string()))?;
        check(&owned, &plan)?;
        let by_id = owned
            .instances
            .iter()
            .enumerate()
            .map(|(idx, inst)| (inst.id, idx as InstIdx))
            .collect();
        let mut by_state = StateCounts::default();
        let mut started = 0;
        for inst in &owned.instances {
            by_state.add(inst.state, 1);
            started += u32::from(inst.state == TaskState::Running && inst.worker.is_some());
        }
        let group_by_id = owned
            .groups
            .iter()
            .enumerate()
            .map(|(idx, group)| (group.id, idx as u32))
            .collect();
        Ok(Execution {
            id: owned.id,
            plan,
            run_number: owned.run_number,
            state: owned.state,
            reason: owned.reason,
            started_at_ms: owned.started_at_ms,
            run_started_at_ms: owned.run_started_at_ms,
            ended_at_ms: owned.ended_at_ms,
            slots: owned.slots,
            open_slots: owned.open_slots,
            failed_slots: owned.failed_slots,
            instances: owned.instances,
            by_id,
            groups: owned.groups,
            group_by_id,
            questions: owned.questions,
            open_questions: owned.open_questions,
            ready: owned.ready,
            next_ready_key: owned.next_ready_key,
            retries: owned.retries,
            deadlines: owned.deadlines,
            expiries: owned.expiries,
            running: owned.running,
            started,
            usage: owned.usage,
            budget_tripped: owned.budget_tripped,
            settled_units: owned.settled_units,
            holds: owned.holds,
            finish_due: owned.finish_due,
            budget_grants: owned.budget_grants,
            changed: Changed::default(),
            by_state,
        })
    }
}

/// Reads the format, the first element of the encoded array, before decoding the rest.
fn read_format(bytes: &[u8]) -> Result<u32, SnapshotError> {
    let mut rd = bytes;
    let len = rmp::decode::read_array_len(&mut rd)
        .map_err(|err| SnapshotError::Decode(format!("snapshot header: {err}")))?;
    if len == 0 {
        return Err(SnapshotError::Decode(
            "snapshot is an empty array".to_owned(),
        ));
    }
    let format: u64 = rmp::decode::read_int(&mut rd)
        .map_err(|err| SnapshotError::Decode(format!("snapshot format: {err}")))?;
    u32::try_from(format).map_err(|_| SnapshotError::Format { found: u32::MAX })
}

/// Checks every index in the snapshot against the plan and itself, so a snapshot restored with
/// the wrong plan is an error rather than a panic later.
fn check(owned: &Owned, plan: &Plan) -> Result<(), SnapshotError> {
    let n_tasks = plan.tasks.len();
    let mismatch = |what: String| Err(SnapshotError::PlanMismatch(what));
    if owned.n_tasks as usize != n_tasks || owned.slots.len() != n_tasks {
        return mismatch(format!(
            "snapshot has {} tasks, the plan {n_tasks}",
            owned.slots.len()
        ));
    }
    let n_inst = owned.instances.len();
    let n_groups = owned.groups.len();
    let inst_ok = |idx: InstIdx| (idx as usize) < n_inst;
    for (task_idx, slot) in owned.slots.iter().enumerate() {
        if slot.head.is_some_and(|h| !inst_ok(h)) || slot.result.is_some_and(|r| !inst_ok(r)) {
            return mismatch(format!("task {task_idx} refers to a missing instance"));
        }
    }
    for (idx, inst) in owned.instances.iter().enumerate() {
        let work_ok = match &inst.work {
            Work::Plan(task_idx) => *task_idx < n_tasks,
            Work::Dynamic(_) => true,
        };
        let origin_ok = match inst.origin {
            Origin::Plan => true,
            Origin::Member { group } | Origin::Resumed { group } => (group as usize) < n_groups,
            Origin::Continues { of } => inst_ok(of),
        };
        let next_ok = match inst.next {
            None => true,
            Some(Next::Group(group)) => (group as usize) < n_groups,
            Some(Next::Instance(next)) => inst_ok(next),
        };
        if !(work_ok && origin_ok && next_ok && inst_ok(inst.head)) {
            return mismatch(format!(
                "instance {idx} ({}) has an index out of range",
                inst.id
            ));
        }
    }
    for group in &owned.groups {
        let end = group.first as usize + group.len as usize;
        if !inst_ok(group.parent) || end > n_inst || group.resumed.is_some_and(|r| !inst_ok(r)) {
            return mismatch(format!("group {} has an index out of range", group.id));
        }
    }
    for question in owned.questions.values() {
        if !inst_ok(question.instance) {
            return mismatch("a question refers to a missing instance".to_owned());
        }
    }
    if owned
        .ready
        .iter()
        .chain(owned.retries.iter().copied())
        .chain(owned.deadlines.iter().copied())
        .any(|(_, idx)| !inst_ok(idx))
    {
        return mismatch("a queue refers to a missing instance".to_owned());
    }
    Ok(())
}
