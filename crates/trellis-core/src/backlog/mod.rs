//! The backlog: tasks before they run (seed 001's planning side), as pure values and rules.
//!
//! - [`model`] — tasks, lists, blocks, placements, and the names each field takes.
//! - [`grouping`] — scoring pairs of queued tasks with weighted criteria and suggesting lists.
//! - [`rules`] — validation rules a task must pass before it can run.
//!
//! Storage is the checkpoint-store's database; the planner serves it over gRPC. Nothing here does
//! I/O: a custom rule's command is named here and run by the planner.

pub mod grouping;
pub mod model;
pub mod order;
pub mod rules;
pub mod run;

pub use grouping::{
    DEFAULT_THRESHOLD, PairScore, Suggestion, Weights, score_pair, suggest, suggest_for,
};
pub use model::{
    BacklogTask, Block, BlockKind, Category, Effort, FieldError, ItemStatus, Link, ListStatus,
    Placement, Priority, TaskStatus, display_id, parse_task_ref,
};
pub use rules::{Finding, Rule, RuleKind, RuleSpec, Severity, TaskField};
