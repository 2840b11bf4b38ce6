//! What the worker does with the messages it consumes from NATS, up to the first I/O, for the
//! fuzz targets in `fuzz/` (feature `fuzzing`; not a stable API).

use trellis_proto::v1::{self, RecordedSteps, TaskAssignment, TaskResult};

use crate::builtins::{self, Given};
use crate::publish::{now_unix_ms, outcome_to_proto};
use crate::sdk::StepLog;
use crate::{intake, steps};

/// Reads a task message (`trellis.tasks.<queue>`) as the worker does: `None` when it is set
/// aside.
pub fn accept_assignment(payload: &[u8]) -> Option<TaskAssignment> {
    intake::accept_assignment(payload).ok()
}

/// Returns the result the worker publishes for `assignment` when its task type is a built-in
/// handler that does no I/O (`noop`, `fail`, `fanout`, `question`); `None` for other types.
pub fn pure_builtin_result(assignment: &TaskAssignment, worker_id: &str) -> Option<TaskResult> {
    let resumed_after = assignment
        .resume
        .as_ref()
        .and_then(|resume| resume.resumed_after.as_ref());
    let given = Given {
        task_type: &assignment.task_type,
        input: &assignment.input,
        attempt: assignment.attempt,
        summary: match resumed_after {
            Some(v1::resume_context::ResumedAfter::GroupSummary(summary)) => Some(summary),
            _ => None,
        },
        answer: match resumed_after {
            Some(v1::resume_context::ResumedAfter::HumanAnswer(answer)) => Some(answer),
            _ => None,
        },
    };
    let outcome = builtins::pure_outcome(given)?;
    Some(TaskResult {
        execution_id: assignment.execution_id.clone(),
        task_instance_id: assignment.task_instance_id.clone(),
        attempt: assignment.attempt,
        worker_id: worker_id.to_owned(),
        usage: Some(v1::Usage::default()),
        sent_at_unix_ms: now_unix_ms(),
        started_at_unix_ms: None,
        validation: Vec::new(),
        outcome: Some(outcome_to_proto(outcome)),
    })
}

/// A cancel request (`trellis.cancel.<instance>`) as the worker acts on it: the instance, the
/// attempt and the reason; `None` when the message is ignored.
pub fn cancel_request(subject: &str, payload: &[u8]) -> Option<(String, u32, String)> {
    let request = intake::cancel_request(subject, payload).ok()?;
    Some((request.task_instance_id, request.attempt, request.reason))
}

/// Reads an entry of the steps bucket (`RecordedSteps`) for `assignment` as a redelivered attempt
/// does, and returns the names of the steps it will skip and its starting state; `None` when the
/// entry is ignored.
pub fn resume_from_bucket(
    assignment: &mut TaskAssignment,
    entry: &[u8],
) -> Option<(Vec<String>, serde_json::Value)> {
    use prost::Message as _;
    let stored = RecordedSteps::decode(entry).ok()?;
    steps::resume_with(assignment, stored);
    let log = StepLog::of(assignment);
    let mut done: Vec<String> = log.done.into_iter().collect();
    done.sort_unstable();
    Some((done, log.state))
}

/// Merges a step's update into the state, as a durable step does.
pub fn merge_step(state: &mut serde_json::Value, update: serde_json::Value) {
    steps::merge(state, update);
}
