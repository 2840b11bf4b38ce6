//! The worker contract (docs/design.md §3): what a worker receives on `trellis.tasks.<queue>`
//! ([`assignment_to_proto`], read back as a [`ReceivedAssignment`]), what it reports on
//! `trellis.results.<shard>` (a `TaskResult`, which [`result_to_event`] turns into the event the
//! coordinator records) and its heartbeats on `trellis.workers.heartbeat.<worker_id>`.
//!
//! Everything a worker sends is checked: a malformed message is a [`ConvertError`] naming the
//! field (`task_result.completed.output: invalid JSON: ...`), never a panic. The attempt a result
//! names is not checked against the execution's state here: applying the event does that.

use prost::Message;
use serde_json::Value;
use trellis_core::ids::{ExecutionId, GroupId, TaskInstanceId, WorkerId};
use trellis_core::machine::{
    Assignment, Event, EventBody, GroupSummary, ResumeContext, StepRecord,
};
use trellis_core::plan::Check;
use trellis_proto::v1;

use crate::common::{
    check_from_proto, check_results_from_proto, check_to_proto, group_rule_from_proto,
    group_rule_to_proto, instant_to_proto, json_to_bytes, question_from_proto,
    subtask_group_from_proto, usage_from_proto,
};
use crate::error::{
    At, ConvertError, ConvertErrorKind, non_empty, parse_id, parse_instant, parse_json,
    parse_optional_id, required,
};

// ------------------------------------------------------------------------------------------------
// Assignments
// ------------------------------------------------------------------------------------------------

/// Returns the message that asks a worker to run one attempt (published on
/// `trellis.tasks.<queue>`), with the instance's resume context and recorded steps.
pub fn assignment_to_proto(
    execution_id: ExecutionId,
    run_number: u32,
    assignment: &Assignment<'_>,
) -> v1::TaskAssignment {
    let resumed_after = match assignment.resume {
        Some(ResumeContext::Group(summary)) => Some(summary.group.to_string()),
        _ => None,
    };
    let (upstream, upstream_truncated) = upstream_to_proto(&assignment.upstream);
    v1::TaskAssignment {
        execution_id: execution_id.to_string(),
        task_instance_id: assignment.instance.to_string(),
        task_id: assignment.task_id.to_owned(),
        task_type: assignment.task_type.to_owned(),
        queue: assignment.queue.to_owned(),
        input: json_to_bytes(assignment.input),
        attempt: assignment.attempt,
        run_number,
        deadline_unix_ms: assignment.deadline_ms.map(instant_to_proto),
        idempotency_key: assignment.idempotency_key(),
        parent_task_instance_id: assignment.parent.map(|parent| parent.to_string()),
        subtask_group_id: assignment.group.map(|group| group.to_string()),
        resumed_after_subtasks_group_id: resumed_after,
        continues_task_instance_id: None,
        resume: resume_to_proto(assignment.resume, assignment.steps),
        avoid_worker_id: assignment.avoid_worker.map(|worker| worker.0.clone()),
        results_shard: None,
        // The coordinator sets its epoch.
        fence: 0,
        validate: assignment.checks.iter().map(check_to_proto).collect(),
        upstream,
        upstream_truncated,
        keep_output_inline: assignment.keep_output_inline,
        lost_deliveries: assignment.lost_deliveries,
    }
}

/// Most dependencies' outputs an assignment carries.
pub const UPSTREAM_LIMIT: usize = 1000;
/// Most bytes of dependencies' outputs an assignment carries; outputs past it are left out and
/// `upstream_truncated` says so. Large outputs are stored by reference, so this is rarely reached.
pub const UPSTREAM_BYTES_LIMIT: usize = 1024 * 1024;

/// Returns the wire form of a task's dependencies' outputs and whether some were left out.
fn upstream_to_proto(upstream: &[(&str, &Value)]) -> (Vec<v1::UpstreamOutput>, bool) {
    let mut bytes = 0;
    let mut truncated = false;
    let mut out = Vec::with_capacity(upstream.len().min(UPSTREAM_LIMIT));
    for (task_id, output) in upstream {
        if out.len() == UPSTREAM_LIMIT {
            truncated = true;
            break;
        }
        let output = json_to_bytes(output);
        if bytes + output.len() > UPSTREAM_BYTES_LIMIT {
            truncated = true;
            continue;
        }
        bytes += output.len();
        out.push(v1::UpstreamOutput {
            task_id: (*task_id).to_owned(),
            output,
        });
    }
    (out, truncated)
}

/// Returns the resume context of an instance; `None` for a fresh start (no context, no steps).
pub fn resume_to_proto(
    resume: Option<&ResumeContext>,
    steps: &[StepRecord],
) -> Option<v1::ResumeContext> {
    if resume.is_none() && steps.is_empty() {
        return None;
    }
    let resumed_after = resume.map(|resume| match resume {
        ResumeContext::Group(summary) => {
            v1::resume_context::ResumedAfter::GroupSummary(group_summary_to_proto(summary))
        }
        ResumeContext::Answer { question, answer } => {
            v1::resume_context::ResumedAfter::HumanAnswer(v1::HumanAnswer {
                question_id: question.to_string(),
                answer: answer.clone(),
            })
        }
    });
    Some(v1::ResumeContext {
        resumed_after,
        steps: steps
            .iter()
            .map(|step| v1::RecordedStep {
                step: step.step.clone(),
                state: json_to_bytes(&step.state),
            })
            .collect(),
    })
}

/// Returns the wire form of a settled group's summary.
pub fn group_summary_to_proto(summary: &GroupSummary) -> v1::GroupSummary {
    v1::GroupSummary {
        group_id: summary.group.to_string(),
        rule: Some(group_rule_to_proto(summary.rule)),
        succeeded: summary.succeeded,
        member_count: summary.members,
        completed: summary.completed,
        failed: summary.failed,
        cancelled: summary.cancelled,
        failed_member_ids: summary
            .failed_members
            .iter()
            .map(ToString::to_string)
            .collect(),
        outputs: summary
            .outputs
            .iter()
            .map(|output| v1::MemberOutput {
                output: output.as_ref().map(json_to_bytes),
            })
            .collect(),
        outputs_truncated: summary.outputs_truncated,
    }
}

/// Reads a settled group's summary.
fn group_summary_from_proto(
    at: &At<'_>,
    summary: &v1::GroupSummary,
) -> Result<GroupSummary, ConvertError> {
    let failed_at = at.field("failed_member_ids");
    let outputs_at = at.field("outputs");
    Ok(GroupSummary {
        group: parse_id(&at.field("group_id"), &summary.group_id)?,
        rule: group_rule_from_proto(&at.field("rule"), summary.rule.as_ref())?,
        succeeded: summary.succeeded,
        members: summary.member_count,
        completed: summary.completed,
        failed: summary.failed,
        cancelled: summary.cancelled,
        failed_members: summary
            .failed_member_ids
            .iter()
            .enumerate()
            .map(|(member_idx, id)| parse_id(&failed_at.index(member_idx), id))
            .collect::<Result<_, _>>()?,
        outputs: summary
            .outputs
            .iter()
            .enumerate()
            .map(|(member_idx, member)| {
                member
                    .output
                    .as_deref()
                    .map(|output| parse_json(&outputs_at.index(member_idx).field("output"), output))
                    .transpose()
            })
            .collect::<Result<_, _>>()?,
        outputs_truncated: summary.outputs_truncated,
    })
}

/// A decoded `TaskAssignment`: the owned form of a core [`Assignment`], as a worker receives it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedAssignment {
    pub execution_id: ExecutionId,
    pub run_number: u32,
    pub instance: TaskInstanceId,
    pub task_id: String,
    pub task_type: String,
    pub queue: String,
    pub input: Value,
    pub attempt: u32,
    pub deadline_ms: Option<u64>,
    pub avoid_worker: Option<WorkerId>,
    pub lost_deliveries: u32,
    pub resume: Option<ResumeContext>,
    pub steps: Vec<StepRecord>,
    pub parent: Option<TaskInstanceId>,
    pub group: Option<GroupId>,
    pub resumed_after_group: Option<GroupId>,
    pub continues: Option<TaskInstanceId>,
    pub checks: Vec<Check>,
    /// The dependencies' outputs (plan task id, output), as sent.
    pub upstream: Vec<(String, Value)>,
    pub keep_output_inline: bool,
}

impl ReceivedAssignment {
    /// Returns the core view of the assignment, borrowing from it.
    pub fn as_assignment(&self) -> Assignment<'_> {
        Assignment {
            instance: self.instance,
            task_id: &self.task_id,
            task_type: &self.task_type,
            queue: &self.queue,
            input: &self.input,
            attempt: self.attempt,
            deadline_ms: self.deadline_ms,
            avoid_worker: self.avoid_worker.as_ref(),
            lost_deliveries: self.lost_deliveries,
            resume: self.resume.as_ref(),
            steps: &self.steps,
            parent: self.parent,
            group: self.group,
            checks: &self.checks,
            upstream: self
                .upstream
                .iter()
                .map(|(task_id, output)| (task_id.as_str(), output))
                .collect(),
            keep_output_inline: self.keep_output_inline,
        }
    }

    /// Returns the handler's idempotency key, `<instance>:<attempt>`.
    pub fn idempotency_key(&self) -> String {
        self.as_assignment().idempotency_key()
    }
}

/// Reads a `TaskAssignment` as a worker receives it.
pub fn assignment_from_proto(
    assignment: &v1::TaskAssignment,
) -> Result<ReceivedAssignment, ConvertError> {
    parse_assignment(&At::root("task_assignment"), assignment)
}

/// Decodes a `TaskAssignment` as received on `trellis.tasks.<queue>`.
pub fn decode_task_assignment(bytes: &[u8]) -> Result<ReceivedAssignment, ConvertError> {
    let at = At::root("task_assignment");
    let assignment = v1::TaskAssignment::decode(bytes)
        .map_err(|err| at.error(ConvertErrorKind::Decode(err.to_string())))?;
    parse_assignment(&at, &assignment)
}

/// Reads a `TaskAssignment` at path `at`.
fn parse_assignment(
    at: &At<'_>,
    assignment: &v1::TaskAssignment,
) -> Result<ReceivedAssignment, ConvertError> {
    let (resume, steps) = match &assignment.resume {
        None => (None, Vec::new()),
        Some(resume) => {
            let resume_at = at.field("resume");
            let context = match &resume.resumed_after {
                None => None,
                Some(v1::resume_context::ResumedAfter::GroupSummary(summary)) => {
                    Some(ResumeContext::Group(group_summary_from_proto(
                        &resume_at.field("group_summary"),
                        summary,
                    )?))
                }
                Some(v1::resume_context::ResumedAfter::HumanAnswer(answer)) => {
                    Some(ResumeContext::Answer {
                        question: parse_id(
                            &resume_at.field("human_answer").field("question_id"),
                            &answer.question_id,
                        )?,
                        answer: answer.answer.clone(),
                    })
                }
            };
            let steps_at = resume_at.field("steps");
            let steps = resume
                .steps
                .iter()
                .enumerate()
                .map(|(step_idx, step)| {
                    let step_at = steps_at.index(step_idx);
                    Ok(StepRecord {
                        step: non_empty(&step_at.field("step"), &step.step)?.to_owned(),
                        state: parse_json(&step_at.field("state"), &step.state)?,
                    })
                })
                .collect::<Result<_, _>>()?;
            (context, steps)
        }
    };
    Ok(ReceivedAssignment {
        execution_id: parse_id(&at.field("execution_id"), &assignment.execution_id)?,
        run_number: assignment.run_number,
        instance: parse_id(&at.field("task_instance_id"), &assignment.task_instance_id)?,
        task_id: assignment.task_id.clone(),
        task_type: non_empty(&at.field("task_type"), &assignment.task_type)?.to_owned(),
        queue: non_empty(&at.field("queue"), &assignment.queue)?.to_owned(),
        input: parse_json(&at.field("input"), &assignment.input)?,
        attempt: assignment.attempt,
        deadline_ms: assignment
            .deadline_unix_ms
            .map(|unix_ms| parse_instant(&at.field("deadline_unix_ms"), unix_ms))
            .transpose()?,
        avoid_worker: assignment.avoid_worker_id.clone().map(WorkerId),
        lost_deliveries: assignment.lost_deliveries,
        resume,
        steps,
        parent: parse_optional_id(
            &at.field("parent_task_instance_id"),
            assignment.parent_task_instance_id.as_deref(),
        )?,
        group: parse_optional_id(
            &at.field("subtask_group_id"),
            assignment.subtask_group_id.as_deref(),
        )?,
        resumed_after_group: parse_optional_id(
            &at.field("resumed_after_subtasks_group_id"),
            assignment.resumed_after_subtasks_group_id.as_deref(),
        )?,
        continues: parse_optional_id(
            &at.field("continues_task_instance_id"),
            assignment.continues_task_instance_id.as_deref(),
        )?,
        checks: assignment
            .validate
            .iter()
            .enumerate()
            .map(|(n, check)| check_from_proto(&at.field("validate").index(n), check))
            .collect::<Result<_, _>>()?,
        upstream: assignment
            .upstream
            .iter()
            .enumerate()
            .map(|(n, upstream)| {
                let list_at = at.field("upstream");
                let upstream_at = list_at.index(n);
                Ok((
                    non_empty(&upstream_at.field("task_id"), &upstream.task_id)?.to_owned(),
                    parse_json(&upstream_at.field("output"), &upstream.output)?,
                ))
            })
            .collect::<Result<_, _>>()?,
        keep_output_inline: assignment.keep_output_inline,
    })
}

// ------------------------------------------------------------------------------------------------
// Results
// ------------------------------------------------------------------------------------------------

/// Turns a worker's report into the event the coordinator records at `at_ms`, and names the
/// execution it belongs to. The attempt is not checked against the state: applying the event does
/// that.
pub fn result_to_event(
    result: &v1::TaskResult,
    at_ms: u64,
) -> Result<(ExecutionId, Event), ConvertError> {
    parse_result(&At::root("task_result"), result, at_ms)
}

/// Decodes a `TaskResult` as published on `trellis.results.<shard>` and turns it into its event
/// (see [`result_to_event`]).
pub fn decode_task_result(bytes: &[u8], at_ms: u64) -> Result<(ExecutionId, Event), ConvertError> {
    let at = At::root("task_result");
    let result = v1::TaskResult::decode(bytes)
        .map_err(|err| at.error(ConvertErrorKind::Decode(err.to_string())))?;
    parse_result(&at, &result, at_ms)
}

/// Reads a `TaskResult` at path `at` into its event.
fn parse_result(
    at: &At<'_>,
    result: &v1::TaskResult,
    at_ms: u64,
) -> Result<(ExecutionId, Event), ConvertError> {
    use v1::task_result::Outcome as Reported;
    let execution_id = parse_id(&at.field("execution_id"), &result.execution_id)?;
    let instance = parse_id(&at.field("task_instance_id"), &result.task_instance_id)?;
    let attempt = result.attempt;
    let usage = usage_from_proto(at, result.usage.as_ref())?;
    let body = match required(&at.field("outcome"), &result.outcome)? {
        Reported::Started(v1::task_result::Started {}) => EventBody::TaskStarted {
            instance,
            attempt,
            worker: WorkerId(non_empty(&at.field("worker_id"), &result.worker_id)?.to_owned()),
        },
        Reported::Completed(completed) => EventBody::TaskCompleted {
            instance,
            attempt,
            output: parse_json(&at.field("completed").field("output"), &completed.output)?,
            usage,
        },
        Reported::Failed(failed) => EventBody::TaskFailed {
            instance,
            attempt,
            error: failed.error.clone(),
            retryable: failed.retryable,
            usage,
        },
        Reported::Spawned(spawned) => {
            let group_at = at.field("spawned");
            let group_at = group_at.field("group");
            let (group, rule, members) =
                subtask_group_from_proto(&group_at, required(&group_at, &spawned.group)?)?;
            EventBody::SubtasksSpawned {
                instance,
                attempt,
                group,
                rule,
                members,
            }
        }
        Reported::Question(asked) => {
            let question_at = at.field("question");
            let question_at = question_at.field("question");
            EventBody::QuestionAsked {
                instance,
                attempt,
                question: question_from_proto(
                    &question_at,
                    required(&question_at, &asked.question)?,
                )?,
            }
        }
        Reported::StepCheckpoint(step) => {
            let step_at = at.field("step_checkpoint");
            EventBody::StepCheckpointed {
                instance,
                attempt,
                step: non_empty(&step_at.field("step"), &step.step)?.to_owned(),
                state: parse_json(&step_at.field("merged_state"), &step.merged_state)?,
            }
        }
        Reported::Preempted(_) => EventBody::TaskPreempted { instance, attempt },
    };
    let at_ms = match &body {
        EventBody::TaskStarted { .. } => started_at(result.started_at_unix_ms, at_ms),
        _ => at_ms,
    };
    Ok((execution_id, Event { at_ms, body }))
}

/// The worker's start time, as the coordinator records it at `now`: never in the future (a
/// worker's clock may run ahead), `now` when the worker did not say.
fn started_at(started_at_unix_ms: Option<i64>, now: u64) -> u64 {
    started_at_unix_ms
        .and_then(|ms| u64::try_from(ms).ok())
        .map_or(now, |ms| ms.min(now))
}

/// The `TaskValidated` a result brings: the `validate:` checks its worker ran, recorded before
/// the outcome they led to. `None` for a result without checks, or one whose checks or attempt
/// do not read (`result_to_event` reports a bad attempt; checks without a name or level are
/// not recorded).
pub fn validated_from_result(result: &v1::TaskResult, now: u64) -> Option<Event> {
    if result.validation.is_empty() {
        return None;
    }
    let at = At::root("task_result");
    let body = EventBody::TaskValidated {
        instance: result.task_instance_id.parse().ok()?,
        attempt: result.attempt,
        results: check_results_from_proto(&at.field("validation"), &result.validation).ok()?,
    };
    Some(Event { at_ms: now, body })
}

/// The `TaskStarted` a result implies: each result carries the worker that ran its attempt and
/// when that worker started it, so the coordinator records the start together with the outcome
/// of a task that ended before any heartbeat named it. `None` for a result without a start time,
/// or one that names no attempt (`result_to_event` reports why).
pub fn started_from_result(result: &v1::TaskResult, now: u64) -> Option<Event> {
    if result.started_at_unix_ms.is_none()
        || result.worker_id.is_empty()
        || matches!(result.outcome, Some(v1::task_result::Outcome::Started(_)))
    {
        return None;
    }
    let body = EventBody::TaskStarted {
        instance: result.task_instance_id.parse().ok()?,
        attempt: result.attempt,
        worker: WorkerId(result.worker_id.clone()),
    };
    Some(Event {
        at_ms: started_at(result.started_at_unix_ms, now),
        body,
    })
}

/// The `TaskStarted` a heartbeat implies for one of the attempts its worker runs: a long task
/// shows its worker and start time within a heartbeat interval, without a message of its own.
/// `None` when the heartbeat names no valid attempt.
pub fn started_from_heartbeat(
    worker_id: &str,
    running: &v1::RunningTask,
    now: u64,
) -> Option<(ExecutionId, Event)> {
    if worker_id.is_empty() {
        return None;
    }
    let execution_id = running.execution_id.parse().ok()?;
    let body = EventBody::TaskStarted {
        instance: running.task_instance_id.parse().ok()?,
        attempt: running.attempt,
        worker: WorkerId(worker_id.to_owned()),
    };
    let at_ms = started_at(Some(running.started_at_unix_ms), now);
    Some((execution_id, Event { at_ms, body }))
}

// ------------------------------------------------------------------------------------------------
// Heartbeats
// ------------------------------------------------------------------------------------------------

/// Decodes a `WorkerHeartbeat` as published on `trellis.workers.heartbeat.<worker_id>`: it names
/// its worker, its state is one the contract defines, and its CPU figure is a number (a NaN would
/// not fit the store's `NOT NULL` column and fail the write of every worker's row).
pub fn decode_heartbeat(bytes: &[u8]) -> Result<v1::WorkerHeartbeat, ConvertError> {
    let at = At::root("worker_heartbeat");
    let heartbeat = v1::WorkerHeartbeat::decode(bytes)
        .map_err(|err| at.error(ConvertErrorKind::Decode(err.to_string())))?;
    non_empty(&at.field("worker_id"), &heartbeat.worker_id)?;
    if v1::WorkerState::try_from(heartbeat.state).is_err() {
        return Err(at
            .field("state")
            .error(ConvertErrorKind::UnknownEnumValue(heartbeat.state)));
    }
    if !heartbeat.cpu_percent.is_finite() || heartbeat.cpu_percent < 0.0 {
        return Err(at
            .field("cpu_percent")
            .error(ConvertErrorKind::Inconsistent(
                "CPU use is a finite, non-negative percentage",
            )));
    }
    Ok(heartbeat)
}
