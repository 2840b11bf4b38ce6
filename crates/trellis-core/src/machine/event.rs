//! Events (what happened, appended to the execution's log before any side effect) and commands
//! (what [`Execution::decide`](super::Execution::decide) wants done next).

use serde::{Deserialize, Serialize};

use super::ExecutionState;
use crate::ids::{GroupId, QuestionId, TaskInstanceId, WorkerId};
use crate::record::CheckResult;

/// One entry of an execution's event log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// When the coordinator recorded it, in milliseconds since the Unix epoch. Replays use this
    /// value, never the clock, so they rebuild the same state.
    pub at_ms: u64,
    pub body: EventBody,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    // ----- reported by workers (the results subject) -----
    /// A worker took the instance's attempt.
    TaskStarted {
        instance: TaskInstanceId,
        attempt: u32,
        worker: WorkerId,
    },
    /// The worker checked the attempt's result with the task's `validate:` checks; recorded just
    /// before the `TaskCompleted` (all passed) or `TaskFailed` (one failed) it led to.
    TaskValidated {
        instance: TaskInstanceId,
        attempt: u32,
        results: Vec<CheckResult>,
    },
    /// The attempt succeeded.
    TaskCompleted {
        instance: TaskInstanceId,
        attempt: u32,
        output: serde_json::Value,
        usage: Usage,
    },
    /// The attempt failed; `retryable = false` skips retries.
    TaskFailed {
        instance: TaskInstanceId,
        attempt: u32,
        error: String,
        retryable: bool,
        usage: Usage,
    },
    /// The attempt ended its turn by spawning a subtask group.
    SubtasksSpawned {
        instance: TaskInstanceId,
        attempt: u32,
        group: GroupId,
        rule: GroupRule,
        members: Vec<SubtaskSpec>,
    },
    /// The attempt ended its turn by asking a human.
    QuestionAsked {
        instance: TaskInstanceId,
        attempt: u32,
        question: Question,
    },
    /// A durable step of the attempt finished (seed 002); `state` is the merged state after it.
    StepCheckpointed {
        instance: TaskInstanceId,
        attempt: u32,
        step: String,
        state: serde_json::Value,
    },
    /// The worker running the attempt stopped heartbeating; the task is handed to another worker.
    TaskLost {
        instance: TaskInstanceId,
        attempt: u32,
    },
    /// The attempt stopped at a durable step because it was asked to (a pause in `preempt`
    /// mode). No retry is used: the instance runs again, from its next step, once nothing holds
    /// it.
    TaskPreempted {
        instance: TaskInstanceId,
        attempt: u32,
    },

    // ----- asked for by people and clients -----
    /// Pause the execution, one of its plan tasks or one of its subtask groups: nothing in
    /// `scope` is dispatched until the matching `ResumeRequested`. The mode says what becomes
    /// of the attempts running then; the state machine records it, the coordinator acts on it.
    PauseRequested {
        reason: String,
        #[serde(default)]
        scope: PauseScope,
        #[serde(default)]
        mode: PauseMode,
    },
    ResumeRequested {
        #[serde(default)]
        scope: PauseScope,
    },
    CancelRequested {
        reason: String,
    },
    QuestionAnswered {
        question: QuestionId,
        answer: String,
    },

    // ----- decided by the state machine (see `Command`) -----
    TaskDispatched {
        instance: TaskInstanceId,
        attempt: u32,
    },
    TaskTimedOut {
        instance: TaskInstanceId,
        attempt: u32,
    },
    QuestionExpired {
        question: QuestionId,
    },
    BudgetExhausted {
        reason: String,
    },
    ExecutionTimedOut,
    ExecutionFinished {
        outcome: Outcome,
    },

    // ----- asked for after the end -----
    /// Run `run` of a failed or cancelled execution starts: what did not complete runs again.
    RunStarted {
        run: u32,
    },

    // ----- recorded by coordinators -----
    /// A coordinator took the execution over. Nothing in the state changes; the append itself
    /// is the point: any other coordinator's later append no longer follows the log's last
    /// message, so a former owner that has not noticed it lost the execution cannot extend the
    /// log behind the new owner's back.
    ExecutionClaimed {
        coordinator: String,
    },
}

impl EventBody {
    /// Returns a pause of the whole execution in `drain` mode.
    pub fn pause(reason: impl Into<String>) -> Self {
        Self::PauseRequested {
            reason: reason.into(),
            scope: PauseScope::Execution,
            mode: PauseMode::Drain,
        }
    }

    /// Returns the resume of the whole execution.
    pub fn resume() -> Self {
        Self::ResumeRequested {
            scope: PauseScope::Execution,
        }
    }

    /// Returns the event's snake_case name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::TaskStarted { .. } => "task_started",
            Self::TaskValidated { .. } => "task_validated",
            Self::TaskCompleted { .. } => "task_completed",
            Self::TaskFailed { .. } => "task_failed",
            Self::SubtasksSpawned { .. } => "subtasks_spawned",
            Self::QuestionAsked { .. } => "question_asked",
            Self::StepCheckpointed { .. } => "step_checkpointed",
            Self::TaskLost { .. } => "task_lost",
            Self::TaskPreempted { .. } => "task_preempted",
            Self::PauseRequested { .. } => "pause_requested",
            Self::ResumeRequested { .. } => "resume_requested",
            Self::CancelRequested { .. } => "cancel_requested",
            Self::QuestionAnswered { .. } => "question_answered",
            Self::TaskDispatched { .. } => "task_dispatched",
            Self::TaskTimedOut { .. } => "task_timed_out",
            Self::QuestionExpired { .. } => "question_expired",
            Self::BudgetExhausted { .. } => "budget_exhausted",
            Self::ExecutionTimedOut => "execution_timed_out",
            Self::ExecutionFinished { .. } => "execution_finished",
            Self::RunStarted { .. } => "run_started",
            Self::ExecutionClaimed { .. } => "execution_claimed",
        }
    }
}

/// What a pause inside one execution covers.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseScope {
    /// The whole execution (its state becomes `paused`).
    #[default]
    Execution,
    /// Every instance of one plan task (by its id), its retries and resumptions included.
    Task(String),
    /// The members of one subtask group.
    Group(GroupId),
}

impl std::fmt::Display for PauseScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Execution => f.write_str("execution"),
            Self::Task(task) => write!(f, "task {task}"),
            Self::Group(group) => write!(f, "group {group}"),
        }
    }
}

/// What a pause does to the work already running (dispatching stops in both modes).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// Running attempts finish; nothing new starts.
    #[default]
    Drain,
    /// Running attempts are asked to stop at their next durable step and run again, from that
    /// step, after the resume; an attempt without steps finishes as in `drain`.
    Preempt,
}

impl PauseMode {
    /// Returns the snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Drain => "drain",
            Self::Preempt => "preempt",
        }
    }
}

/// What a task attempt consumed (seed 003's `TaskOutput`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub tokens_used: u64,
    pub cost: f64,
}

/// When a subtask group is done (docs/design.md §4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupRule {
    /// Every member terminal; the parent gets each member's outcome.
    #[default]
    AllSettled,
    /// The first failure ends the group and cancels the rest.
    AllSucceeded,
    /// `k` successes end the group (and cancel the rest); it fails once `k` can no longer be reached.
    Quorum(u32),
    /// The first success ends the group.
    FirstSuccess,
}

/// One subtask of a spawned group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubtaskSpec {
    pub task_type: String,
    /// Worker queue; defaults to the type.
    pub queue: Option<String>,
    pub input: serde_json::Value,
}

/// A question for a human (docs/design.md §7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Question {
    pub id: QuestionId,
    pub question_type: String,
    /// How urgent it is, free-form; seed 001 names `critical`, `high`, `medium` and `low`. Only
    /// the people it reaches read it: the state machine treats every question alike.
    #[serde(default)]
    pub priority: String,
    pub text: String,
    pub options: Vec<String>,
    pub expires_at_ms: Option<u64>,
    pub timeout_action: TimeoutAction,
}

/// What an expired question does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutAction {
    /// The asking task fails.
    #[default]
    Fail,
    /// The asking task is skipped.
    Skip,
    /// The task resumes as if this answer had been given.
    Answer(String),
}

/// How an execution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    Failed,
    /// Cancelled by a request; only ever the outcome of an execution already ended by it.
    Cancelled,
}

impl Outcome {
    /// The outcome that ends an execution in `state`; `None` while it has not ended.
    pub fn of(state: ExecutionState) -> Option<Outcome> {
        match state {
            ExecutionState::Completed => Some(Outcome::Completed),
            ExecutionState::Failed => Some(Outcome::Failed),
            ExecutionState::Cancelled => Some(Outcome::Cancelled),
            _ => None,
        }
    }
}

/// What the state machine wants done. Each command becomes exactly one event, appended to the log
/// before its side effect runs (write-ahead).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send this attempt of the instance to a worker (see `Execution::assignment`).
    Dispatch {
        instance: TaskInstanceId,
        attempt: u32,
    },
    /// The attempt ran past its deadline.
    TimeOut {
        instance: TaskInstanceId,
        attempt: u32,
    },
    /// The question expired unanswered.
    ExpireQuestion { question: QuestionId },
    /// A budget ran out.
    ExhaustBudget { reason: String },
    /// The execution ran past its global timeout.
    TimeOutExecution,
    /// Every task has settled.
    Finish { outcome: Outcome },
}

impl Command {
    /// Returns the event that records this command.
    pub fn into_event(self, at_ms: u64) -> Event {
        let body = match self {
            Self::Dispatch { instance, attempt } => EventBody::TaskDispatched { instance, attempt },
            Self::TimeOut { instance, attempt } => EventBody::TaskTimedOut { instance, attempt },
            Self::ExpireQuestion { question } => EventBody::QuestionExpired { question },
            Self::ExhaustBudget { reason } => EventBody::BudgetExhausted { reason },
            Self::TimeOutExecution => EventBody::ExecutionTimedOut,
            Self::Finish { outcome } => EventBody::ExecutionFinished { outcome },
        };
        Event { at_ms, body }
    }
}
