//! The state machine's public value types: execution states, errors, results of `apply`, the
//! resume context a resumed instance receives, and what a worker is handed.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::event::{GroupRule, Outcome, PauseScope};
use crate::ids::{GroupId, QuestionId, TaskInstanceId, WorkerId};
use crate::plan::Check;
use crate::record::TaskState;

/// The state of an execution (seed 003).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionState {
    Pending,
    Running,
    Paused,
    WaitingForHuman,
    Completed,
    Failed,
    Cancelled,
}

impl ExecutionState {
    /// Returns true once the execution can no longer change.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// Returns the snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::WaitingForHuman => "waiting_for_human",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl From<Outcome> for ExecutionState {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Completed => Self::Completed,
            Outcome::Failed => Self::Failed,
            Outcome::Cancelled => Self::Cancelled,
        }
    }
}

/// What applying an event did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The state changed. `stop` lists running instances the event cancelled: their workers should
    /// be told to stop (best effort; their late results are ignored anyway).
    Changed { stop: Vec<TaskInstanceId> },
    /// The event was already applied, or refers to an attempt that is no longer current (a
    /// duplicate or late delivery). Nothing changed.
    Ignored(Ignored),
}

/// Why an event changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// This result (or request) was applied before.
    Duplicate,
    /// The result is for an attempt that was superseded (timed out, retried, cancelled), or the
    /// answer (or expiry) is of a question withdrawn when the instance that asked it was
    /// cancelled.
    StaleAttempt,
}

/// An event that the state machine refuses: applying it would break a rule. The state is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ApplyError {
    #[error("unknown task instance {0}")]
    UnknownInstance(TaskInstanceId),
    #[error("unknown question {0}")]
    UnknownQuestion(QuestionId),
    #[error("the plan has no task {0:?}")]
    UnknownTask(String),
    #[error("the execution has no subtask group {0}")]
    UnknownGroup(GroupId),
    #[error("task instance {instance} is held by the pause of its {scope}")]
    Held {
        instance: TaskInstanceId,
        scope: PauseScope,
    },
    #[error("task instance {instance} has no attempt {attempt} (current attempt is {current})")]
    AttemptNotDispatched {
        instance: TaskInstanceId,
        attempt: u32,
        current: u32,
    },
    #[error("{event} is not allowed for task instance {instance} in state {state}")]
    InvalidTaskTransition {
        instance: TaskInstanceId,
        state: &'static str,
        event: &'static str,
    },
    #[error("{event} is not allowed while the execution is {state}")]
    InvalidExecutionTransition {
        state: &'static str,
        event: &'static str,
    },
    #[error("dispatching {instance} would exceed max_concurrency {limit}")]
    ConcurrencyExceeded {
        instance: TaskInstanceId,
        limit: u32,
    },
    #[error("dispatching {instance} conflicts with running task {holder:?}")]
    PathLocked {
        instance: TaskInstanceId,
        holder: String,
    },
    #[error("retry of {instance} is not due before {not_before_ms}")]
    RetryNotDue {
        instance: TaskInstanceId,
        not_before_ms: u64,
    },
    #[error("deadline of {instance} is not reached")]
    DeadlineNotReached { instance: TaskInstanceId },
    #[error("question {0} has not expired")]
    QuestionNotExpired(QuestionId),
    #[error("subtask group id {0} is already used")]
    GroupIdReused(GroupId),
    #[error("question id {0} is already used")]
    QuestionIdReused(QuestionId),
    #[error("subtask group {0} has no members (complete the task instead of spawning nothing)")]
    EmptyGroup(GroupId),
    #[error("invalid group rule: quorum {k} of {members} members")]
    InvalidQuorum { k: u32, members: usize },
    #[error("the execution cannot finish as {claimed:?}: {reason}")]
    CannotFinish { claimed: Outcome, reason: String },
    #[error("no budget is exhausted")]
    BudgetNotExhausted,
    #[error("run {got} cannot start: the next run is {expected}")]
    RunOutOfOrder { expected: u32, got: u32 },
    #[error("the global timeout has not passed")]
    GlobalTimeoutNotReached,
}

/// What a resumed instance receives in its input (docs/design.md §4 and §7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResumeContext {
    /// The parent resumed after its group settled: a compact summary, never the whole history.
    Group(GroupSummary),
    /// The task resumed after a human answered its question.
    Answer {
        question: QuestionId,
        answer: String,
    },
}

/// Most member outputs and failed member ids copied into a [`GroupSummary`]; the rest are read from
/// the store by instance id.
pub const SUMMARY_LIMIT: usize = 1000;

/// The outcome of a settled subtask group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupSummary {
    pub group: GroupId,
    pub rule: GroupRule,
    /// True when the group's rule was met (all succeeded, quorum reached, ...). `all_settled`
    /// always succeeds.
    pub succeeded: bool,
    pub members: u32,
    pub completed: u32,
    pub failed: u32,
    pub cancelled: u32,
    /// Failed members (at most [`SUMMARY_LIMIT`]).
    pub failed_members: Vec<TaskInstanceId>,
    /// Member outputs in member order, `None` for members without one (at most [`SUMMARY_LIMIT`];
    /// `outputs_truncated` tells when more exist).
    pub outputs: Vec<Option<serde_json::Value>>,
    pub outputs_truncated: bool,
}

/// One recorded durable step of an instance (seed 002).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: String,
    pub state: serde_json::Value,
}

/// Everything a worker needs to run one attempt, borrowed from the state.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment<'a> {
    pub instance: TaskInstanceId,
    /// The plan task id, or the handler type for a dynamic subtask.
    pub task_id: &'a str,
    pub task_type: &'a str,
    pub queue: &'a str,
    pub input: &'a serde_json::Value,
    pub attempt: u32,
    pub deadline_ms: Option<u64>,
    /// Set on a reassignment: the worker that should not take it.
    pub avoid_worker: Option<&'a WorkerId>,
    /// Earlier attempts of the instance that ended with their worker lost: deliveries spent that
    /// the worker counts against its `max_deliveries` beside the message's own.
    pub lost_deliveries: u32,
    pub resume: Option<&'a ResumeContext>,
    /// Durable steps already recorded for this instance: the handler skips them.
    pub steps: &'a [StepRecord],
    pub parent: Option<TaskInstanceId>,
    pub group: Option<GroupId>,
    /// The task's `validate:` checks, run by the worker after its handler succeeds.
    pub checks: &'a [Check],
    /// For a plan task: the outputs of its dependencies that completed (plan task id, output), in
    /// the order of its dependencies.
    pub upstream: Vec<(&'a str, &'a serde_json::Value)>,
    /// True when the task's output decides a `route:`, so it must reach the coordinator inline.
    pub keep_output_inline: bool,
}

impl Assignment<'_> {
    /// Returns the idempotency key of the attempt (`<instance>:<attempt>`), also used as the NATS
    /// message id for de-duplication.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.instance, self.attempt)
    }
}

/// A progress snapshot (docs/design.md §4, "Progress").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub state: ExecutionState,
    /// Task instances by state, plus plan tasks not yet instantiated counted as `pending`.
    pub counts: StateCounts,
    /// Units of work known so far (plan tasks + subtasks) and those settled.
    pub total: u64,
    pub done: u64,
    pub percent: f64,
    pub eta_ms: Option<u64>,
    /// 1-based wave of the earliest unsettled plan task ("wave 3 of 7"); `waves` when all settled.
    pub wave: u32,
    pub waves: u32,
    pub reason: Option<Cow<'static, str>>,
}

/// Counts by task state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounts(pub [u64; 11]);

impl StateCounts {
    /// Returns the count for one state.
    pub fn get(&self, state: TaskState) -> u64 {
        self.0[state_index(state)]
    }

    pub(crate) fn add(&mut self, state: TaskState, n: u64) {
        self.0[state_index(state)] += n;
    }

    pub(crate) fn sub(&mut self, state: TaskState, n: u64) {
        let count = &mut self.0[state_index(state)];
        *count = count.saturating_sub(n);
    }
}

pub(crate) fn state_index(state: TaskState) -> usize {
    TaskState::ALL.iter().position(|s| *s == state).unwrap_or(0)
}
