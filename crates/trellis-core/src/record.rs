//! The task instance record (the seed's `TaskStatusRecord`): one row per task instance, the unit the
//! read model stores, the execution-graph builder links into a tree, and the UI shows.

use serde::{Deserialize, Serialize};

use crate::ids::{ExecutionId, GroupId, TaskInstanceId, WorkerId};
use crate::plan::CheckLevel;

/// The state of a task instance (docs/design.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Dependencies not met yet.
    Pending,
    /// Ready to run, waiting for a free slot.
    Queued,
    /// Ready, but held back by a file conflict with a running task (or manually).
    Blocked,
    /// Dispatched to a worker.
    Running,
    /// Its turn ended by spawning a subtask group; it is resumed as a new instance afterwards.
    WaitingForSubtasks,
    /// Its turn ended by asking a question; it is resumed as a new instance with the answer.
    WaitingForHuman,
    /// Failed, a new attempt is scheduled after a backoff delay.
    RetryScheduled,
    Completed,
    Failed,
    Skipped,
    Cancelled,
}

impl TaskState {
    /// Every state, in display order.
    pub const ALL: [TaskState; 11] = [
        Self::Pending,
        Self::Queued,
        Self::Blocked,
        Self::Running,
        Self::WaitingForSubtasks,
        Self::WaitingForHuman,
        Self::RetryScheduled,
        Self::Completed,
        Self::Failed,
        Self::Skipped,
        Self::Cancelled,
    ];

    /// Returns true for states an instance never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Skipped | Self::Cancelled
        )
    }

    /// Returns the snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Queued => "queued",
            Self::Blocked => "blocked",
            Self::Running => "running",
            Self::WaitingForSubtasks => "waiting_for_subtasks",
            Self::WaitingForHuman => "waiting_for_human",
            Self::RetryScheduled => "retry_scheduled",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One task instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskStatusRecord {
    pub task_instance_id: TaskInstanceId,
    /// The plan task id, or the handler type for a dynamic subtask.
    pub task_id: String,
    /// The instance that spawned this one as a member of a subtask group.
    pub parent_task_instance_id: Option<TaskInstanceId>,
    /// The group this instance is a member of (set together with the parent).
    pub subtask_group_id: Option<GroupId>,
    /// Set on a parent's resumed instance: the group whose completion resumed it.
    pub resumed_after_subtasks_group_id: Option<GroupId>,
    /// Set on an instance that continues another one directly: the resumption after a human answer,
    /// or a fallback run in a failed instance's place.
    pub continues_task_instance_id: Option<TaskInstanceId>,
    /// The execution (all instances of one execution share it).
    pub correlation_id: ExecutionId,
    pub run_number: u32,
    pub attempt: u32,
    pub state: TaskState,
    /// The worker that took the current attempt; `None` until one reported it (with its result,
    /// or in a heartbeat while it runs).
    pub worker_id: Option<WorkerId>,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// When the current attempt was handed to the task queue.
    pub dispatched_at_ms: Option<u64>,
    /// When a worker took the current attempt and started its handler: the time between
    /// dispatched and started is the wait in the queue.
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    pub output: Option<serde_json::Value>,
    pub error: Option<String>,
    /// The attempts before the current one, oldest first (empty for most instances).
    pub earlier_attempts: Vec<AttemptRecord>,
    /// The current attempt's `validate:` checks, in the order they ran (empty when the task has
    /// none or they have not run yet).
    pub validation: Vec<CheckResult>,
}

/// How one `validate:` check of an attempt went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub name: String,
    pub level: CheckLevel,
    pub passed: bool,
    pub duration_ms: u64,
    /// What it printed or answered (the last lines, at most [`CHECK_OUTPUT_LIMIT`] bytes), or
    /// why it could not run.
    pub output: String,
}

/// Most bytes of a check's output kept in its result.
pub const CHECK_OUTPUT_LIMIT: usize = 4096;

/// One attempt of an instance that ended and was followed by another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt: u32,
    pub worker_id: Option<WorkerId>,
    pub dispatched_at_ms: Option<u64>,
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: u64,
    /// Why it ended: the failure, or that its worker was lost or a pause stopped it.
    pub error: String,
    /// Its `validate:` checks, when they ran.
    #[serde(default)]
    pub validation: Vec<CheckResult>,
}
