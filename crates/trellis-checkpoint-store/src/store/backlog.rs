//! The backlog's storage seam: the [`Backlog`] trait over the same database and backends as
//! [`super::Store`] (the SQL is in `backlog_sql.rs`, compiled once per backend).
//!
//! The store enforces what must hold whatever the client: a task waits in the evaluation queue or
//! in exactly one list (a `CHECK` on the row), numbers are unique per project, relationships and
//! blocks name tasks that exist (foreign keys). What needs the domain's rules (names, cycles,
//! validation rules, grouping) is checked by the planner before it writes.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use trellis_core::backlog::grouping::{Suggestion, Weights};
use trellis_core::backlog::rules::RuleSpec;
use trellis_core::backlog::{BacklogTask, Block, ItemStatus, ListStatus, Placement, TaskStatus};
use uuid::Uuid;

use super::Error;

/// A project: the scope of task numbers, lists, rules and grouping weights.
#[derive(Clone, Debug, PartialEq)]
pub struct ProjectRow {
    /// The project's slug.
    pub project: String,
    pub name: String,
    pub description: String,
    pub weights: Weights,
    pub created_at_unix_ms: i64,
}

/// A task list, with its counters counted from its tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListRow {
    pub project: String,
    /// The list's slug, unique in its project.
    pub name: String,
    pub description: String,
    pub status: ListStatus,
    pub max_parallel_agents: u32,
    pub auto_execute: bool,
    /// How many runs of the list have started.
    pub runs: u32,
    pub total_tasks: u32,
    pub completed_tasks: u32,
    pub failed_tasks: u32,
    pub created_at_unix_ms: i64,
    pub updated_at_unix_ms: i64,
}

/// A stored task: the task with its relationships and open blocks, and its list item.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRow {
    pub project: String,
    pub task: BacklogTask,
    /// Its place in its list, from 1; `None` in the evaluation queue.
    pub position: Option<u32>,
    /// How it fared in its list's latest run; `None` in the evaluation queue.
    pub item_status: Option<ItemStatus>,
    pub created_at_unix_ms: i64,
    pub updated_at_unix_ms: i64,
}

/// Which tasks [`Backlog::tasks`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskFilter {
    /// Only the evaluation queue, or only one list.
    pub placement: Option<Placement>,
    pub status: Option<TaskStatus>,
}

/// A stored grouping suggestion.
#[derive(Clone, Debug, PartialEq)]
pub struct SuggestionRow {
    pub suggestion_id: Uuid,
    pub project: String,
    /// `pending`, `accepted`, `rejected` or `modified`.
    pub status: String,
    pub suggestion: Suggestion,
    /// `task_created`, `dependency_changed` or `manual`.
    pub triggered_by: String,
    pub trigger_task: Option<u32>,
    /// The list an accepted suggestion created.
    pub created_list: Option<String>,
    pub created_at_unix_ms: i64,
    pub resolved_at_unix_ms: Option<i64>,
}

/// A task's block, open or resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRow {
    pub block_id: Uuid,
    pub task: u32,
    pub block: Block,
    pub created_at_unix_ms: i64,
    pub resolved_at_unix_ms: Option<i64>,
    pub resolution: Option<String>,
}

/// One run of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRow {
    pub project: String,
    pub list: String,
    /// 1, 2, ... per list.
    pub run_number: u32,
    /// `None` while `starting`.
    pub execution_id: Option<Uuid>,
    /// `starting`, `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    pub task_type: String,
    /// The worker queue; empty = the default queue.
    pub queue: String,
    pub tasks_total: u32,
    pub tasks_completed: u32,
    pub tasks_failed: u32,
    /// Why it failed or could not start; empty otherwise.
    pub reason: String,
    pub created_at_unix_ms: i64,
    pub ended_at_unix_ms: Option<i64>,
}

/// What a run's execution says now, for [`Backlog::follow_run`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunProgress {
    /// Each task's item status in this run, by task number.
    pub items: Vec<(u32, ItemStatus)>,
    /// The run's end (`completed`, `failed`, `cancelled`) with its reason, once the execution
    /// ended.
    pub ended: Option<(String, String)>,
}

/// The backlog's tables (and, through [`super::notify::Notifications`] and
/// [`super::templates::Templates`], its notifications' and templates'). Every method is one
/// transaction: on an error nothing was changed.
#[async_trait]
pub trait Backlog:
    super::notify::Notifications + super::templates::Templates + Send + Sync + fmt::Debug
{
    /// Stores a new project; `AlreadyExists` when its slug is taken.
    async fn create_project(&self, project: &ProjectRow) -> Result<(), Error>;

    /// Returns a project.
    async fn project(&self, project: &str) -> Result<Option<ProjectRow>, Error>;

    /// Returns every project, by slug.
    async fn projects(&self) -> Result<Vec<ProjectRow>, Error>;

    /// Replaces a project's grouping weights.
    async fn set_weights(&self, project: &str, weights: &Weights) -> Result<(), Error>;

    /// Stores a new list; `AlreadyExists` when its name is taken in the project.
    async fn create_list(&self, list: &ListRow) -> Result<(), Error>;

    /// Returns a list with its counters.
    async fn list(&self, project: &str, name: &str) -> Result<Option<ListRow>, Error>;

    /// Returns a project's lists, by name.
    async fn lists(&self, project: &str) -> Result<Vec<ListRow>, Error>;

    /// Updates a list's description, status, `max_parallel_agents`, `auto_execute` and `runs`.
    async fn update_list(&self, list: &ListRow, now_ms: i64) -> Result<(), Error>;

    /// Stores a new task with its relationships and returns its number (`task.number` is
    /// ignored). A task placed in a list goes to its end.
    async fn add_task(&self, project: &str, task: &BacklogTask, now_ms: i64) -> Result<u32, Error>;

    /// Returns a task with its relationships, open blocks and list item.
    async fn task(&self, project: &str, number: u32) -> Result<Option<TaskRow>, Error>;

    /// Returns a project's tasks: those in lists by list and position, then the queue by number.
    async fn tasks(&self, project: &str, filter: &TaskFilter) -> Result<Vec<TaskRow>, Error>;

    /// Replaces a task's fields and relationships (not its placement, status or blocks).
    async fn update_task(
        &self,
        project: &str,
        task: &BacklogTask,
        now_ms: i64,
    ) -> Result<(), Error>;

    /// Moves a task to the evaluation queue or into a list at `position` (from 1; `None` or past
    /// the end = last), renumbering the positions of the lists it leaves and enters.
    async fn place_task(
        &self,
        project: &str,
        number: u32,
        placement: &Placement,
        position: Option<u32>,
        now_ms: i64,
    ) -> Result<(), Error>;

    /// Sets a task's status, and its list item's status when it is in a list and `item` is given.
    async fn set_status(
        &self,
        project: &str,
        number: u32,
        status: TaskStatus,
        item: Option<ItemStatus>,
        now_ms: i64,
    ) -> Result<(), Error>;

    /// Records an open block and marks the task blocked; returns the block's id.
    async fn add_block(
        &self,
        project: &str,
        number: u32,
        block: &Block,
        now_ms: i64,
    ) -> Result<Uuid, Error>;

    /// Resolves a task's open blocks (of one kind, or all) and returns how many; a task left with
    /// none goes back to waiting (`pending` in a list, `evaluating` in the queue).
    async fn resolve_blocks(
        &self,
        project: &str,
        number: u32,
        kind: Option<trellis_core::backlog::BlockKind>,
        resolution: &str,
        now_ms: i64,
    ) -> Result<usize, Error>;

    /// Returns a task's blocks, open and resolved, oldest first.
    async fn blocks(&self, project: &str, number: u32) -> Result<Vec<BlockRow>, Error>;

    /// Stores a validation rule, replacing one of the same name.
    async fn put_rule(&self, project: &str, rule: &RuleSpec) -> Result<(), Error>;

    /// Returns a project's rules, by name.
    async fn rules(&self, project: &str) -> Result<Vec<RuleSpec>, Error>;

    /// Deletes a rule; returns whether there was one.
    async fn delete_rule(&self, project: &str, name: &str) -> Result<bool, Error>;

    /// Stores new suggestions.
    async fn insert_suggestions(&self, rows: &[SuggestionRow]) -> Result<(), Error>;

    /// Returns a project's suggestions (of one status, or all), newest first.
    async fn suggestions(
        &self,
        project: &str,
        status: Option<&str>,
    ) -> Result<Vec<SuggestionRow>, Error>;

    /// Rejects a pending suggestion; `FailedPrecondition` when it is not pending.
    async fn reject_suggestion(&self, project: &str, id: Uuid, now_ms: i64) -> Result<(), Error>;

    /// Records a new run of a list as `starting` and returns its number: the list's `runs` counts
    /// it, the list goes `in_progress`, and every item of the list is `pending` again.
    async fn start_run(
        &self,
        project: &str,
        list: &str,
        task_type: &str,
        queue: &str,
        now_ms: i64,
    ) -> Result<u32, Error>;

    /// Records that a run's execution started (`running`), or that it could not (`failed`, with
    /// `reason`; the list goes back to `ready`); only a run still `starting` changes (a second
    /// record of one start is a no-op).
    async fn run_started(
        &self,
        project: &str,
        list: &str,
        run_number: u32,
        started: Result<Uuid, &str>,
        now_ms: i64,
    ) -> Result<(), Error>;

    /// Returns a list's runs, newest first.
    async fn runs(&self, project: &str, list: &str) -> Result<Vec<RunRow>, Error>;

    /// Returns every run still `running`, in every project.
    async fn running_runs(&self) -> Result<Vec<RunRow>, Error>;

    /// Returns every run still `starting` that was recorded before `before_ms`, in every project:
    /// the runs whose start a crash may have cut off.
    async fn starting_runs(&self, before_ms: i64) -> Result<Vec<RunRow>, Error>;

    /// Writes what a running run's execution says: its items' statuses (a completed or failed
    /// item's task becomes completed or failed too), the run's counters, and, once it ended, the
    /// run's status and its list's (`completed` when every task completed, else `paused`).
    async fn follow_run(
        &self,
        project: &str,
        list: &str,
        run_number: u32,
        progress: &RunProgress,
        now_ms: i64,
    ) -> Result<(), Error>;

    /// Accepts a pending suggestion in one transaction: creates `list`, moves `tasks` (the
    /// suggestion's, or a modified set: then the status is `modified`) from the evaluation queue
    /// into it in that order, and records the list. `FailedPrecondition` when the suggestion is
    /// not pending or a task is no longer in the queue.
    async fn accept_suggestion(
        &self,
        id: Uuid,
        list: &ListRow,
        tasks: &[u32],
        now_ms: i64,
    ) -> Result<(), Error>;
}

/// Opens the backlog on the database of `url` (the checkpoint-store's: `postgres://`,
/// `sqlite://` or `sqlite::memory:`), applying the migrations.
pub async fn connect_backlog(url: &str) -> Result<Arc<dyn Backlog>, Error> {
    Ok(super::connect_all(url).await?.1)
}
