//! Conversions between the `trellis-core` model and the wire messages of [`v1`](crate::v1).
//!
//! The event log is the source of truth (docs/design.md §2), so [`event_to_proto`] and
//! [`event_from_proto`] are exact inverses: every [`EventBody`] decodes to the value that was
//! encoded, which is what lets a replay rebuild the state that was live. The other direction of
//! travel is the worker contract: [`assignment_to_proto`] builds what a worker receives and
//! [`result_to_event`] turns what it sends back into the event the coordinator records.
//!
//! Nothing that arrives on the wire is trusted: decoding checks every id, enum value, instant and
//! JSON payload and returns a [`ConvertError`] naming the field
//! (`event.task_dispatched.task_instance_id: invalid uuid "x"`), never panics. Paths name fields as
//! the `.proto` files do; a member of a `oneof` is a field of its message
//! (`task_result.completed.output`), and a missing `oneof` is named itself (`event.kind: missing`).
//!
//! Wire conventions (`common.proto`): ids are UUID text, JSON values are UTF-8 JSON `bytes`,
//! instants are `int64` milliseconds. Core instants are `u64`; those beyond `i64::MAX`
//! (292 million years from now) are written as `i64::MAX`, and negative instants are refused.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::str::FromStr;

use prost::Message;
use serde_json::Value;
use thiserror::Error;
use trellis_core::graph::{self, ExecutionGraph};
use trellis_core::ids::{ExecutionId, GroupId, TaskInstanceId, WorkerId};
use trellis_core::machine::{
    Assignment, Event, EventBody, ExecutionState, GroupRule, GroupSummary, Outcome, Progress,
    Question, ResumeContext, StateCounts, StepRecord, SubtaskSpec, TimeoutAction, Usage,
};
use trellis_core::record::{TaskState, TaskStatusRecord};

use crate::v1;

mod plan;

pub use plan::{
    analysis_to_proto, canonical_spec_json, compile_wire_plan, compile_wire_spec, file_op_to_proto,
    plan_errors_to_proto, plan_from_proto, plan_to_proto,
};

// ------------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------------

/// A wire message that does not describe a valid core value: which field, and what is wrong with
/// it. Displays as `<path>: <problem>`.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{path}: {kind}")]
pub struct ConvertError {
    path: String,
    kind: ConvertErrorKind,
}

impl ConvertError {
    /// Returns the path of the offending field, e.g. `task_result.completed.output`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Returns what is wrong with the field.
    pub fn kind(&self) -> &ConvertErrorKind {
        &self.kind
    }
}

/// What is wrong with a field.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConvertErrorKind {
    /// The bytes are not a protobuf encoding of the expected message.
    #[error("invalid protobuf: {0}")]
    Decode(String),
    /// A required field or `oneof` is not set.
    #[error("missing")]
    Missing,
    /// An id is not a UUID; holds the start of the text.
    #[error("invalid uuid {0:?}")]
    InvalidUuid(String),
    /// A JSON payload does not parse; holds the parser's message.
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    /// An enum field holds a number the contract does not define.
    #[error("unknown enum value {0}")]
    UnknownEnumValue(i32),
    /// An enum field is `*_UNSPECIFIED` where a value is required.
    #[error("must not be unspecified")]
    Unspecified,
    /// An instant is before the Unix epoch.
    #[error("negative instant {0}")]
    NegativeInstant(i64),
    /// The message contradicts itself, e.g. a quorum with a rule that is not a quorum.
    #[error("{0}")]
    Inconsistent(&'static str),
}

/// Most characters of an offending text copied into an error.
const SHOWN_CHARS: usize = 64;

/// The path of the field being decoded, a linked list on the stack: it costs nothing until an
/// error renders it.
#[derive(Clone, Copy, Debug)]
struct At<'a> {
    parent: Option<&'a At<'a>>,
    segment: Segment<'a>,
}

#[derive(Clone, Copy, Debug)]
enum Segment<'a> {
    Field(&'a str),
    Index(usize),
}

impl<'a> At<'a> {
    const fn root(name: &'static str) -> At<'static> {
        At {
            parent: None,
            segment: Segment::Field(name),
        }
    }

    fn field(&'a self, name: &'a str) -> At<'a> {
        At {
            parent: Some(self),
            segment: Segment::Field(name),
        }
    }

    fn index(&'a self, idx: usize) -> At<'a> {
        At {
            parent: Some(self),
            segment: Segment::Index(idx),
        }
    }

    fn error(&self, kind: ConvertErrorKind) -> ConvertError {
        let mut segments = Vec::new();
        let mut at = Some(self);
        while let Some(current) = at {
            segments.push(current.segment);
            at = current.parent;
        }
        let mut path = String::new();
        for segment in segments.iter().rev() {
            match segment {
                Segment::Field(name) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(name);
                }
                Segment::Index(idx) => path.push_str(&format!("[{idx}]")),
            }
        }
        ConvertError { path, kind }
    }

    fn missing(&self) -> ConvertError {
        self.error(ConvertErrorKind::Missing)
    }
}

// ------------------------------------------------------------------------------------------------
// Field helpers
// ------------------------------------------------------------------------------------------------

fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

fn parse_id<T: FromStr>(at: &At<'_>, text: &str) -> Result<T, ConvertError> {
    if text.is_empty() {
        return Err(at.missing());
    }
    text.parse()
        .map_err(|_| at.error(ConvertErrorKind::InvalidUuid(shown(text))))
}

fn parse_optional_id<T: FromStr>(
    at: &At<'_>,
    text: Option<&str>,
) -> Result<Option<T>, ConvertError> {
    text.map(|text| parse_id(at, text)).transpose()
}

fn parse_json(at: &At<'_>, bytes: &[u8]) -> Result<Value, ConvertError> {
    serde_json::from_slice(bytes)
        .map_err(|err| at.error(ConvertErrorKind::InvalidJson(err.to_string())))
}

/// Returns the UTF-8 JSON text of a value.
pub fn json_to_bytes(value: &Value) -> Vec<u8> {
    // A `Value` always serializes: its map keys are strings and its numbers are finite.
    serde_json::to_vec(value).expect("a serde_json::Value always serializes")
}

fn instant_to_proto(unix_ms: u64) -> i64 {
    i64::try_from(unix_ms).unwrap_or(i64::MAX)
}

fn parse_instant(at: &At<'_>, unix_ms: i64) -> Result<u64, ConvertError> {
    u64::try_from(unix_ms).map_err(|_| at.error(ConvertErrorKind::NegativeInstant(unix_ms)))
}

fn parse_enum<E: TryFrom<i32>>(at: &At<'_>, value: i32) -> Result<E, ConvertError> {
    E::try_from(value).map_err(|_| at.error(ConvertErrorKind::UnknownEnumValue(value)))
}

fn required<'m, T>(at: &At<'_>, field: &'m Option<T>) -> Result<&'m T, ConvertError> {
    field.as_ref().ok_or_else(|| at.missing())
}

fn non_empty<'m>(at: &At<'_>, text: &'m str) -> Result<&'m str, ConvertError> {
    if text.is_empty() {
        Err(at.missing())
    } else {
        Ok(text)
    }
}

// ------------------------------------------------------------------------------------------------
// Shared pieces: usage, rules, subtasks, questions, states
// ------------------------------------------------------------------------------------------------

/// Returns the wire form of what an attempt consumed.
pub fn usage_to_proto(usage: Usage) -> v1::Usage {
    v1::Usage {
        tokens_used: usage.tokens_used,
        cost: usage.cost,
    }
}

/// Reads a usage report; an unset one means nothing was consumed.
/// Reads a usage report. The cost is summed into the execution's budget, so it must be a finite,
/// non-negative number: one NaN would make the sum NaN and the budget never run out.
fn usage_from_proto(at: &At<'_>, usage: Option<&v1::Usage>) -> Result<Usage, ConvertError> {
    let Some(usage) = usage else {
        return Ok(Usage::default());
    };
    if !usage.cost.is_finite() || usage.cost < 0.0 {
        return Err(at
            .field("usage")
            .field("cost")
            .error(ConvertErrorKind::Inconsistent(
                "a cost is a finite, non-negative number",
            )));
    }
    Ok(Usage {
        tokens_used: usage.tokens_used,
        cost: usage.cost,
    })
}

/// Returns the wire form of a subtask group's completion rule.
pub fn group_rule_to_proto(rule: GroupRule) -> v1::CompletionRule {
    let (kind, quorum) = match rule {
        GroupRule::AllSettled => (v1::CompletionRuleKind::AllSettled, 0),
        GroupRule::AllSucceeded => (v1::CompletionRuleKind::AllSucceeded, 0),
        GroupRule::Quorum(k) => (v1::CompletionRuleKind::Quorum, k),
        GroupRule::FirstSuccess => (v1::CompletionRuleKind::FirstSuccess, 0),
    };
    v1::CompletionRule {
        kind: kind.into(),
        quorum,
    }
}

fn group_rule_from_proto(
    at: &At<'_>,
    rule: Option<&v1::CompletionRule>,
) -> Result<GroupRule, ConvertError> {
    let Some(rule) = rule else {
        return Ok(GroupRule::AllSettled);
    };
    let kind = parse_enum(&at.field("kind"), rule.kind)?;
    if kind != v1::CompletionRuleKind::Quorum && rule.quorum != 0 {
        return Err(at.field("quorum").error(ConvertErrorKind::Inconsistent(
            "a quorum is only allowed with COMPLETION_RULE_KIND_QUORUM",
        )));
    }
    Ok(match kind {
        v1::CompletionRuleKind::Unspecified | v1::CompletionRuleKind::AllSettled => {
            GroupRule::AllSettled
        }
        v1::CompletionRuleKind::AllSucceeded => GroupRule::AllSucceeded,
        v1::CompletionRuleKind::Quorum => GroupRule::Quorum(rule.quorum),
        v1::CompletionRuleKind::FirstSuccess => GroupRule::FirstSuccess,
    })
}

/// Returns the wire form of one subtask to spawn.
pub fn subtask_spec_to_proto(spec: &SubtaskSpec) -> v1::SubtaskSpec {
    v1::SubtaskSpec {
        task_type: spec.task_type.clone(),
        input: json_to_bytes(&spec.input),
        queue: spec.queue.clone(),
    }
}

fn subtask_spec_from_proto(
    at: &At<'_>,
    spec: &v1::SubtaskSpec,
) -> Result<SubtaskSpec, ConvertError> {
    Ok(SubtaskSpec {
        task_type: non_empty(&at.field("task_type"), &spec.task_type)?.to_owned(),
        queue: spec.queue.clone(),
        input: parse_json(&at.field("input"), &spec.input)?,
    })
}

/// Returns the wire form of a spawned subtask group.
pub fn subtask_group_to_proto(
    group: GroupId,
    rule: GroupRule,
    members: &[SubtaskSpec],
) -> v1::SubtaskGroup {
    v1::SubtaskGroup {
        group_id: group.to_string(),
        rule: Some(group_rule_to_proto(rule)),
        members: members.iter().map(subtask_spec_to_proto).collect(),
    }
}

fn subtask_group_from_proto(
    at: &At<'_>,
    group: &v1::SubtaskGroup,
) -> Result<(GroupId, GroupRule, Vec<SubtaskSpec>), ConvertError> {
    let group_id = parse_id(&at.field("group_id"), &group.group_id)?;
    let rule = group_rule_from_proto(&at.field("rule"), group.rule.as_ref())?;
    let members_at = at.field("members");
    let members = group
        .members
        .iter()
        .enumerate()
        .map(|(member_idx, member)| subtask_spec_from_proto(&members_at.index(member_idx), member))
        .collect::<Result<_, _>>()?;
    Ok((group_id, rule, members))
}

/// Returns the wire form of a question for a human.
pub fn question_to_proto(question: &Question) -> v1::Question {
    let (timeout_action, default_answer) = match &question.timeout_action {
        TimeoutAction::Fail => (v1::QuestionTimeoutAction::Fail, String::new()),
        TimeoutAction::Skip => (v1::QuestionTimeoutAction::Skip, String::new()),
        TimeoutAction::Answer(answer) => (v1::QuestionTimeoutAction::AnswerDefault, answer.clone()),
    };
    v1::Question {
        question_id: question.id.to_string(),
        question_type: question.question_type.clone(),
        text: question.text.clone(),
        options: question.options.clone(),
        expires_at_unix_ms: question.expires_at_ms.map(instant_to_proto),
        timeout_action: timeout_action.into(),
        default_answer,
    }
}

fn question_from_proto(at: &At<'_>, question: &v1::Question) -> Result<Question, ConvertError> {
    let action_at = at.field("timeout_action");
    let timeout_action = match parse_enum(&action_at, question.timeout_action)? {
        v1::QuestionTimeoutAction::AnswerDefault => {
            TimeoutAction::Answer(question.default_answer.clone())
        }
        action => {
            if !question.default_answer.is_empty() {
                return Err(at.field("default_answer").error(ConvertErrorKind::Inconsistent(
                    "a default answer is only allowed with QUESTION_TIMEOUT_ACTION_ANSWER_DEFAULT",
                )));
            }
            match action {
                v1::QuestionTimeoutAction::Skip => TimeoutAction::Skip,
                _ => TimeoutAction::Fail,
            }
        }
    };
    Ok(Question {
        id: parse_id(&at.field("question_id"), &question.question_id)?,
        question_type: question.question_type.clone(),
        text: question.text.clone(),
        options: question.options.clone(),
        expires_at_ms: question
            .expires_at_unix_ms
            .map(|unix_ms| parse_instant(&at.field("expires_at_unix_ms"), unix_ms))
            .transpose()?,
        timeout_action,
    })
}

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

fn parse_task_state(at: &At<'_>, state: i32) -> Result<TaskState, ConvertError> {
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
// The event log
// ------------------------------------------------------------------------------------------------

/// One decoded entry of an execution's log.
#[derive(Clone, Debug, PartialEq)]
pub enum LogEntry {
    /// Sequence 1: what is needed to rebuild the state machine.
    Started(Started),
    /// A state machine event, to apply in sequence order.
    Event(Event),
}

/// The `ExecutionStarted` event: the first entry of every log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Started {
    pub plan_name: String,
    pub run_number: u32,
    /// The plan spec text exactly as it was compiled; compiling it again gives the same plan.
    pub spec: String,
    pub format: v1::PlanFormat,
    pub started_at_ms: u64,
    /// The caller's idempotency key; empty when none was given.
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
    /// The namespace the execution runs in; empty in logs written before namespaces, read as
    /// `default`.
    pub namespace: String,
    /// The namespace quota's cap on running task instances, when lower than the plan's.
    pub max_concurrency_cap: Option<u32>,
    /// The W3C `traceparent` of the call that started the execution; empty when not traced.
    pub traceparent: String,
}

impl Started {
    /// Compiles the recorded spec into the plan the execution runs: the same plan as at the
    /// start, with the quota's concurrency cap applied. The log already accepted this spec, so
    /// the deployment's size limits do not apply again (they may have changed since).
    pub fn compile(&self) -> Result<trellis_core::plan::Plan, trellis_core::plan::PlanErrors> {
        let limits = trellis_core::plan::Limits {
            max_input_bytes: usize::MAX,
            max_tasks: usize::MAX,
            ..trellis_core::plan::Limits::default()
        };
        let mut plan = trellis_core::plan::compile_str(&self.spec, &limits)?;
        if let Some(cap) = self.max_concurrency_cap {
            plan.options.max_concurrency = Some(cap);
        }
        Ok(plan)
    }

    /// The namespace, `default` for logs written before namespaces.
    pub fn namespace(&self) -> &str {
        if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        }
    }
}

/// Returns the log entry (always sequence 1) recording the start of an execution.
pub fn started_to_proto(execution_id: ExecutionId, started: &Started) -> v1::Event {
    v1::Event {
        execution_id: execution_id.to_string(),
        sequence: 1,
        timestamp_unix_ms: instant_to_proto(started.started_at_ms),
        kind: Some(v1::event::Kind::ExecutionStarted(v1::ExecutionStarted {
            plan_name: started.plan_name.clone(),
            run_number: started.run_number,
            spec: started.spec.clone(),
            format: started.format.into(),
            options: Some(v1::ExecutionOptions {
                idempotency_key: started.idempotency_key.clone(),
                labels: started
                    .labels
                    .iter()
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect(),
                namespace: started.namespace.clone(),
            }),
            started_at_unix_ms: instant_to_proto(started.started_at_ms),
            max_concurrency_cap: started.max_concurrency_cap,
            traceparent: started.traceparent.clone(),
        })),
    }
}

/// Returns the log entry of a state machine event at position `sequence` of the execution's log.
pub fn event_to_proto(execution_id: ExecutionId, sequence: u64, event: &Event) -> v1::Event {
    v1::Event {
        execution_id: execution_id.to_string(),
        sequence,
        timestamp_unix_ms: instant_to_proto(event.at_ms),
        kind: Some(event_body_to_proto(&event.body)),
    }
}

/// Returns the batch of consecutive log entries `first_sequence`, `first_sequence + 1`, ... for
/// `events`, published as one message.
pub fn event_batch_to_proto(
    execution_id: ExecutionId,
    first_sequence: u64,
    events: &[Event],
) -> v1::EventBatch {
    v1::EventBatch {
        events: events
            .iter()
            .zip(first_sequence..)
            .map(|(event, sequence)| event_to_proto(execution_id, sequence, event))
            .collect(),
    }
}

fn event_body_to_proto(body: &EventBody) -> v1::event::Kind {
    use v1::event::Kind;
    let id = |instance: &TaskInstanceId| instance.to_string();
    match body {
        EventBody::TaskStarted {
            instance,
            attempt,
            worker,
        } => Kind::TaskStarted(v1::TaskStarted {
            task_instance_id: id(instance),
            attempt: *attempt,
            worker_id: worker.0.clone(),
        }),
        EventBody::TaskCompleted {
            instance,
            attempt,
            output,
            usage,
        } => Kind::TaskCompleted(v1::TaskCompleted {
            task_instance_id: id(instance),
            attempt: *attempt,
            output: json_to_bytes(output),
            usage: Some(usage_to_proto(*usage)),
        }),
        EventBody::TaskFailed {
            instance,
            attempt,
            error,
            retryable,
            usage,
        } => Kind::TaskFailed(v1::TaskFailed {
            task_instance_id: id(instance),
            attempt: *attempt,
            error: error.clone(),
            retryable: *retryable,
            usage: Some(usage_to_proto(*usage)),
        }),
        EventBody::SubtasksSpawned {
            instance,
            attempt,
            group,
            rule,
            members,
        } => Kind::SubtasksSpawned(v1::SubtasksSpawned {
            task_instance_id: id(instance),
            attempt: *attempt,
            group: Some(subtask_group_to_proto(*group, *rule, members)),
        }),
        EventBody::QuestionAsked {
            instance,
            attempt,
            question,
        } => Kind::QuestionAsked(v1::QuestionAsked {
            task_instance_id: id(instance),
            attempt: *attempt,
            question: Some(question_to_proto(question)),
        }),
        EventBody::StepCheckpointed {
            instance,
            attempt,
            step,
            state,
        } => Kind::StepCheckpointed(v1::StepCheckpointed {
            task_instance_id: id(instance),
            attempt: *attempt,
            step: step.clone(),
            state: json_to_bytes(state),
        }),
        EventBody::TaskLost { instance, attempt } => Kind::TaskLost(v1::TaskLost {
            task_instance_id: id(instance),
            attempt: *attempt,
        }),
        EventBody::PauseRequested { reason } => Kind::PauseRequested(v1::PauseRequested {
            reason: reason.clone(),
        }),
        EventBody::ResumeRequested => Kind::ResumeRequested(v1::ResumeRequested {}),
        EventBody::CancelRequested { reason } => Kind::CancelRequested(v1::CancelRequested {
            reason: reason.clone(),
        }),
        EventBody::QuestionAnswered { question, answer } => {
            Kind::QuestionAnswered(v1::QuestionAnswered {
                question_id: question.to_string(),
                answer: answer.clone(),
            })
        }
        EventBody::TaskDispatched { instance, attempt } => {
            Kind::TaskDispatched(v1::TaskDispatched {
                task_instance_id: id(instance),
                attempt: *attempt,
            })
        }
        EventBody::TaskTimedOut { instance, attempt } => Kind::TaskTimedOut(v1::TaskTimedOut {
            task_instance_id: id(instance),
            attempt: *attempt,
        }),
        EventBody::QuestionExpired { question } => Kind::QuestionExpired(v1::QuestionExpired {
            question_id: question.to_string(),
        }),
        EventBody::BudgetExhausted { reason } => Kind::BudgetExhausted(v1::BudgetExhausted {
            reason: reason.clone(),
        }),
        EventBody::ExecutionTimedOut => Kind::ExecutionTimedOut(v1::ExecutionTimedOut {}),
        EventBody::ExecutionFinished { outcome } => {
            let outcome = match outcome {
                Outcome::Completed => v1::ExecutionOutcome::Completed,
                Outcome::Failed => v1::ExecutionOutcome::Failed,
            };
            Kind::ExecutionFinished(v1::ExecutionFinished {
                outcome: outcome.into(),
            })
        }
        EventBody::RunStarted { run } => Kind::RunStarted(v1::RunStarted { run_number: *run }),
    }
}

/// Reads one log entry. The envelope's `execution_id` must be a UUID; its `sequence` is left to
/// the caller, who knows which one it expects.
pub fn event_from_proto(event: &v1::Event) -> Result<LogEntry, ConvertError> {
    decode_event(&At::root("event"), event)
}

fn decode_event(at: &At<'_>, event: &v1::Event) -> Result<LogEntry, ConvertError> {
    parse_id::<ExecutionId>(&at.field("execution_id"), &event.execution_id)?;
    let at_ms = parse_instant(&at.field("timestamp_unix_ms"), event.timestamp_unix_ms)?;
    let kind = required(&at.field("kind"), &event.kind)?;
    let body = match kind {
        v1::event::Kind::ExecutionStarted(started) => {
            let at = at.field("execution_started");
            let options = started.options.clone().unwrap_or_default();
            return Ok(LogEntry::Started(Started {
                plan_name: started.plan_name.clone(),
                run_number: started.run_number,
                spec: started.spec.clone(),
                format: parse_enum(&at.field("format"), started.format)?,
                started_at_ms: parse_instant(
                    &at.field("started_at_unix_ms"),
                    started.started_at_unix_ms,
                )?,
                idempotency_key: options.idempotency_key,
                labels: options.labels.into_iter().collect(),
                namespace: options.namespace,
                max_concurrency_cap: match started.max_concurrency_cap {
                    Some(0) => {
                        return Err(at.field("max_concurrency_cap").error(
                            ConvertErrorKind::Inconsistent("a concurrency cap of 0 runs nothing"),
                        ));
                    }
                    cap => cap,
                },
                traceparent: started.traceparent.clone(),
            }));
        }
        v1::event::Kind::TaskStarted(started) => {
            let at = at.field("task_started");
            EventBody::TaskStarted {
                instance: parse_id(&at.field("task_instance_id"), &started.task_instance_id)?,
                attempt: started.attempt,
                worker: WorkerId(non_empty(&at.field("worker_id"), &started.worker_id)?.to_owned()),
            }
        }
        v1::event::Kind::TaskCompleted(completed) => {
            let at = at.field("task_completed");
            EventBody::TaskCompleted {
                instance: parse_id(&at.field("task_instance_id"), &completed.task_instance_id)?,
                attempt: completed.attempt,
                output: parse_json(&at.field("output"), &completed.output)?,
                usage: usage_from_proto(&at, completed.usage.as_ref())?,
            }
        }
        v1::event::Kind::TaskFailed(failed) => {
            let at = at.field("task_failed");
            EventBody::TaskFailed {
                instance: parse_id(&at.field("task_instance_id"), &failed.task_instance_id)?,
                attempt: failed.attempt,
                error: failed.error.clone(),
                retryable: failed.retryable,
                usage: usage_from_proto(&at, failed.usage.as_ref())?,
            }
        }
        v1::event::Kind::SubtasksSpawned(spawned) => {
            let at = at.field("subtasks_spawned");
            let group_at = at.field("group");
            let (group, rule, members) =
                subtask_group_from_proto(&group_at, required(&group_at, &spawned.group)?)?;
            EventBody::SubtasksSpawned {
                instance: parse_id(&at.field("task_instance_id"), &spawned.task_instance_id)?,
                attempt: spawned.attempt,
                group,
                rule,
                members,
            }
        }
        v1::event::Kind::QuestionAsked(asked) => {
            let at = at.field("question_asked");
            let question_at = at.field("question");
            EventBody::QuestionAsked {
                instance: parse_id(&at.field("task_instance_id"), &asked.task_instance_id)?,
                attempt: asked.attempt,
                question: question_from_proto(
                    &question_at,
                    required(&question_at, &asked.question)?,
                )?,
            }
        }
        v1::event::Kind::StepCheckpointed(step) => {
            let at = at.field("step_checkpointed");
            EventBody::StepCheckpointed {
                instance: parse_id(&at.field("task_instance_id"), &step.task_instance_id)?,
                attempt: step.attempt,
                step: step.step.clone(),
                state: parse_json(&at.field("state"), &step.state)?,
            }
        }
        v1::event::Kind::TaskLost(lost) => EventBody::TaskLost {
            instance: parse_id(
                &at.field("task_lost").field("task_instance_id"),
                &lost.task_instance_id,
            )?,
            attempt: lost.attempt,
        },
        v1::event::Kind::PauseRequested(pause) => EventBody::PauseRequested {
            reason: pause.reason.clone(),
        },
        v1::event::Kind::ResumeRequested(v1::ResumeRequested {}) => EventBody::ResumeRequested,
        v1::event::Kind::CancelRequested(cancel) => EventBody::CancelRequested {
            reason: cancel.reason.clone(),
        },
        v1::event::Kind::QuestionAnswered(answered) => EventBody::QuestionAnswered {
            question: parse_id(
                &at.field("question_answered").field("question_id"),
                &answered.question_id,
            )?,
            answer: answered.answer.clone(),
        },
        v1::event::Kind::TaskDispatched(dispatched) => EventBody::TaskDispatched {
            instance: parse_id(
                &at.field("task_dispatched").field("task_instance_id"),
                &dispatched.task_instance_id,
            )?,
            attempt: dispatched.attempt,
        },
        v1::event::Kind::TaskTimedOut(timed_out) => EventBody::TaskTimedOut {
            instance: parse_id(
                &at.field("task_timed_out").field("task_instance_id"),
                &timed_out.task_instance_id,
            )?,
            attempt: timed_out.attempt,
        },
        v1::event::Kind::QuestionExpired(expired) => EventBody::QuestionExpired {
            question: parse_id(
                &at.field("question_expired").field("question_id"),
                &expired.question_id,
            )?,
        },
        v1::event::Kind::BudgetExhausted(exhausted) => EventBody::BudgetExhausted {
            reason: exhausted.reason.clone(),
        },
        v1::event::Kind::ExecutionTimedOut(v1::ExecutionTimedOut {}) => {
            EventBody::ExecutionTimedOut
        }
        v1::event::Kind::ExecutionFinished(finished) => {
            let finished_at = at.field("execution_finished");
            let outcome_at = finished_at.field("outcome");
            let outcome = match parse_enum(&outcome_at, finished.outcome)? {
                v1::ExecutionOutcome::Unspecified => {
                    return Err(outcome_at.error(ConvertErrorKind::Unspecified));
                }
                v1::ExecutionOutcome::Completed => Outcome::Completed,
                v1::ExecutionOutcome::Failed => Outcome::Failed,
            };
            EventBody::ExecutionFinished { outcome }
        }
        v1::event::Kind::RunStarted(started) => {
            if started.run_number < 2 {
                return Err(at.field("run_started").field("run_number").error(
                    ConvertErrorKind::Inconsistent("runs after the first are numbered from 2"),
                ));
            }
            EventBody::RunStarted {
                run: started.run_number,
            }
        }
    };
    Ok(LogEntry::Event(Event { at_ms, body }))
}

/// The entries of one `EventBatch` message.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedBatch {
    pub execution_id: ExecutionId,
    /// The sequence of `entries[0]`; the others follow without gaps.
    pub first_sequence: u64,
    pub entries: Vec<LogEntry>,
}

/// Decodes an `EventBatch` as published on `trellis.events.<execution_id>`: at least one event,
/// all of one execution, with consecutive sequences.
pub fn decode_event_batch(bytes: &[u8]) -> Result<DecodedBatch, ConvertError> {
    let at = At::root("event_batch");
    let batch = v1::EventBatch::decode(bytes)
        .map_err(|err| at.error(ConvertErrorKind::Decode(err.to_string())))?;
    let events_at = at.field("events");
    let first = batch.events.first().ok_or_else(|| events_at.missing())?;
    let first_at = events_at.index(0);
    let execution_id = parse_id(&first_at.field("execution_id"), &first.execution_id)?;
    if first.sequence == 0 {
        return Err(first_at
            .field("sequence")
            .error(ConvertErrorKind::Inconsistent("sequences start at 1")));
    }
    let mut entries = Vec::with_capacity(batch.events.len());
    for (event_idx, event) in batch.events.iter().enumerate() {
        let event_at = events_at.index(event_idx);
        // Checked: a batch that starts near `u64::MAX` would otherwise wrap (or panic in a
        // debug build) instead of being refused.
        let expected_sequence = u64::try_from(event_idx)
            .ok()
            .and_then(|offset| first.sequence.checked_add(offset));
        if event.execution_id != first.execution_id {
            return Err(event_at
                .field("execution_id")
                .error(ConvertErrorKind::Inconsistent(
                    "every event of a batch belongs to the execution of the first",
                )));
        }
        if Some(event.sequence) != expected_sequence {
            return Err(event_at
                .field("sequence")
                .error(ConvertErrorKind::Inconsistent(
                    "the sequences of a batch follow each other without gaps",
                )));
        }
        entries.push(decode_event(&event_at, event)?);
    }
    Ok(DecodedBatch {
        execution_id,
        first_sequence: first.sequence,
        entries,
    })
}

// ------------------------------------------------------------------------------------------------
// Worker heartbeats
// ------------------------------------------------------------------------------------------------

/// Decodes a `WorkerHeartbeat` as published on `trellis.workers.heartbeat.<worker_id>`: it names
/// its worker, its state is one the contract defines, and its CPU figure is a number (a NaN would
/// not fit the store's `NOT NULL` column and fail the write of every worker's row).
pub fn decode_worker_heartbeat(bytes: &[u8]) -> Result<v1::WorkerHeartbeat, ConvertError> {
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

// ------------------------------------------------------------------------------------------------
// The worker contract: results
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
    };
    Ok((execution_id, Event { at_ms, body }))
}

// ------------------------------------------------------------------------------------------------
// The worker contract: assignments
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
    }
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
    pub resume: Option<ResumeContext>,
    pub steps: Vec<StepRecord>,
    pub parent: Option<TaskInstanceId>,
    pub group: Option<GroupId>,
    pub resumed_after_group: Option<GroupId>,
    pub continues: Option<TaskInstanceId>,
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
            resume: self.resume.as_ref(),
            steps: &self.steps,
            parent: self.parent,
            group: self.group,
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
    })
}

// ------------------------------------------------------------------------------------------------
// Read models: progress, task instances, the execution graph
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
        started_at_unix_ms: record.started_at_ms.map(instant_to_proto),
        ended_at_unix_ms: record.ended_at_ms.map(instant_to_proto),
        output: record.output.as_ref().map(json_to_bytes),
        error: record.error.clone(),
    }
}

/// Reads a task instance record.
pub fn record_from_proto(record: &v1::TaskInstance) -> Result<TaskStatusRecord, ConvertError> {
    parse_record(&At::root("task_instance"), record)
}

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
        started_at_ms: optional_instant("started_at_unix_ms", record.started_at_unix_ms)?,
        ended_at_ms: optional_instant("ended_at_unix_ms", record.ended_at_unix_ms)?,
        output: record
            .output
            .as_deref()
            .map(|output| parse_json(&at.field("output"), output))
            .transpose()?,
        error: record.error.clone(),
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
