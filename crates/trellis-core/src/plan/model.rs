//! The compiled plan: the validated task graph the state machine runs, with relationships lowered
//! to edges and flags and routes lowered to conditions. [`super::compile`] builds it from a spec,
//! [`super::decode`] reads back what [`super::encode`] wrote of one.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::policy::{EscalationChain, FailurePolicy};

/// The task index held by a plan-wide `fallback` action (`options.failure`) that stands for "the
/// failing task's own `fallback`". Compiled tasks never hold it: their `on_failure` chains carry
/// the resolved index.
pub const OWN_FALLBACK: usize = usize::MAX;

/// Index of a task in [`Plan::tasks`].
pub type TaskIdx = usize;

/// A compiled, validated plan.
///
/// Built by [`super::compile`], or by [`super::decode`] from the encoding of a compiled plan
/// (which checks again everything the state machine relies on): every index is in range, task
/// ids are unique, dependencies form a DAG, conflicts are symmetric, and relationship semantics
/// are lowered to edges, so later code never re-checks them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub name: String,
    pub options: PlanOptions,
    /// Tasks in declaration order; a [`TaskIdx`] indexes this.
    pub tasks: Vec<Task>,
    /// For each task, the tasks that must finish before it (its `depends_on`, the tasks that declare
    /// `blocks: [it]`, and for a `tests` task its target), without duplicates.
    pub deps: Vec<Vec<TaskIdx>>,
    /// The reverse of `deps`: for each task, the tasks waiting on it.
    pub dependents: Vec<Vec<TaskIdx>>,
    /// For each task, the tasks it may never run at the same time as (file conflicts of seed 001's
    /// matrix and `conflicts_with`), symmetric, without duplicates.
    pub conflicts: Vec<Vec<TaskIdx>>,
    /// Plan task id → index.
    pub index: HashMap<String, TaskIdx>,
    /// The graph's [`Shape`], once [`Plan::shape`] worked it out: not part of the plan's value,
    /// its encoding or its equality.
    #[serde(skip)]
    pub shape: ShapeCache,
}

/// What executions read of a plan's graph besides its edges. It follows from the plan alone, so
/// every execution of one plan shares it rather than working it out again at each start (for
/// 20,000 tasks the waves took a tenth of a start).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shape {
    /// Each task's wave, from 1; 0 for a task in no wave (a subtask, a fallback-only task).
    pub wave_of: Vec<u32>,
    /// How many waves the plan has.
    pub waves: u32,
    /// The static subtask members of each parent task (`subtask_of`), in declaration order.
    pub static_members: HashMap<TaskIdx, Vec<TaskIdx>>,
    /// Some task conflicts with another (`conflicts`): a queued instance may be held back.
    pub conflicts: bool,
}

/// A plan's [`Shape`] once worked out. Equal to any other, and never encoded: it follows from
/// the rest of the plan.
#[derive(Clone, Debug, Default)]
pub struct ShapeCache(OnceLock<Shape>);

impl PartialEq for ShapeCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Plan {
    /// Returns the graph's shape, working it out on the first call. It is kept with the plan: a
    /// plan whose tasks or edges change after that (only its options ever do: a quota's cap)
    /// would keep the old one.
    pub fn shape(&self) -> &Shape {
        self.shape.0.get_or_init(|| {
            let waves = crate::analysis::waves(self);
            let mut static_members: HashMap<TaskIdx, Vec<TaskIdx>> = HashMap::new();
            for (task_idx, task) in self.tasks.iter().enumerate() {
                if let Some(parent) = task.subtask_of {
                    static_members.entry(parent).or_default().push(task_idx);
                }
            }
            Shape {
                wave_of: waves
                    .wave_of
                    .iter()
                    .map(|w| w.map_or(0, |w| w as u32 + 1))
                    .collect(),
                waves: waves.waves.len() as u32,
                static_members,
                conflicts: self.conflicts.iter().any(|c| !c.is_empty()),
            }
        })
    }

    /// Returns the index of the task with this id.
    pub fn task_idx(&self, id: &str) -> Option<TaskIdx> {
        self.index.get(id).copied()
    }

    /// Returns the number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Returns true when the plan has no tasks (never true for a compiled plan).
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }
}

/// Execution-wide options (`options:` in the spec).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Most task instances running at once; `None` = unlimited.
    pub max_concurrency: Option<u32>,
    pub global_timeout: Option<Duration>,
    pub pause_on_human_review: bool,
    pub failure: FailurePolicy,
    pub budget: Budget,
    /// File impacts with a confidence below this (0.0–1.0) create no conflicts: they neither
    /// block parallelism nor show in the conflict analysis. 0.0 = every estimate counts.
    pub min_conflict_confidence: f32,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            max_concurrency: None,
            global_timeout: None,
            pause_on_human_review: true,
            failure: FailurePolicy::default(),
            budget: Budget::default(),
            min_conflict_confidence: 0.0,
        }
    }
}

/// Resource limits of one execution (docs/design.md §5, "Budgets").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub max_tokens: Option<u64>,
    pub max_cost: Option<f64>,
    /// What to do when a budget is exhausted.
    pub on_exhausted: BudgetAction,
}

/// What happens when a budget runs out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BudgetAction {
    #[default]
    Pause,
    Fail,
}

/// One compiled task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    /// Handler type (`shell`, `noop`, ...).
    pub task_type: String,
    /// Worker queue; defaults to the type.
    pub queue: String,
    /// Handler input, any JSON value.
    pub input: serde_json::Value,
    pub files: Vec<FileImpact>,
    pub timeout: Option<Duration>,
    /// The failure handling of this task: its own `on_failure` chain, or the plan policy's.
    pub on_failure: EscalationChain,
    /// The task run in this one's place when a `fallback` action fires.
    pub fallback: Option<TaskIdx>,
    /// True when some other task names this one as its fallback: it runs only in that role.
    pub is_fallback_only: bool,
    /// Set when a `supersedes` or `duplicate_of` relationship means this task is not run.
    pub not_run: Option<NotRun>,
    /// Set for a task declared `subtask_of` a parent: it runs as a member of the parent's static
    /// subtask group, not on its own.
    pub subtask_of: Option<TaskIdx>,
    /// Tasks whose run this task tests: when this task fails, their run fails too.
    pub tests: Vec<TaskIdx>,
    /// Every relationship as declared, for display.
    pub relationships: Vec<Relationship>,
    /// Set for a task listed in another task's `route`: it runs only when the route picks it.
    pub condition: Option<Condition>,
    /// Checks the worker runs after the handler succeeds (`validate:`), in order.
    pub validate: Vec<Check>,
}

/// One declared check of a task's result (`validate:`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Unique within the task.
    pub name: String,
    pub level: CheckLevel,
    pub probe: Probe,
    pub timeout: Duration,
}

/// The test levels of seed 001.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckLevel {
    /// The code itself: a linter, unit tests.
    Codebase,
    /// A running service, through its API.
    Api,
    /// The user interface, through a command (a browser test).
    Ui,
}

impl CheckLevel {
    /// Returns the lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Codebase => "codebase",
            Self::Api => "api",
            Self::Ui => "ui",
        }
    }

    /// Reads a name [`Self::as_str`] gives.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "codebase" => Some(Self::Codebase),
            "api" => Some(Self::Api),
            "ui" => Some(Self::Ui),
            _ => None,
        }
    }
}

/// What a check does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe {
    /// Runs a program with arguments (a command written as one string is `sh -c <it>`); passes
    /// on exit status 0.
    Command(Vec<String>),
    /// Sends a request; passes when the answer has `status` and, if set, a body containing
    /// `body_contains`.
    Http {
        method: String,
        url: String,
        status: u16,
        body_contains: Option<String>,
    },
}

/// When a routed task runs: the deciding task's output, read at `pointer`, picks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// The deciding task; always one of this task's dependencies.
    pub router: TaskIdx,
    /// A JSON pointer into the router's output (`""` = the whole output).
    pub pointer: String,
    pub case: RouteCase,
}

/// Which outputs pick a routed task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouteCase {
    /// The value at the pointer matches this case key.
    Case(String),
    /// The value matches none of these case keys (the route's `default`).
    Default(Vec<String>),
}

impl Condition {
    /// Returns true when the router's output picks this task. A router that produced no output
    /// (it did not complete) picks nothing, not even its default.
    pub fn holds(&self, output: Option<&serde_json::Value>) -> bool {
        let Some(output) = output else {
            return false;
        };
        let value = output.pointer(&self.pointer);
        match &self.case {
            RouteCase::Case(key) => value.is_some_and(|v| case_matches(v, key)),
            RouteCase::Default(keys) => !keys
                .iter()
                .any(|key| value.is_some_and(|v| case_matches(v, key))),
        }
    }
}

/// Returns true when `value` matches the case key: a string equal to it, or any other value whose
/// JSON text equals it.
pub fn case_matches(value: &serde_json::Value, key: &str) -> bool {
    match value {
        serde_json::Value::String(s) => s == key,
        // Not `*other == key`: a `Value` equals a `str` only when it is that string, while here
        // the JSON text of a number or boolean is compared.
        #[allow(clippy::cmp_owned)]
        other => other.to_string() == key,
    }
}

impl Task {
    /// Returns a task of `task_type` on the queue of that name, with empty input, no files, no
    /// relationships and the default failure policy. Handy for plans built in code.
    pub fn new(id: impl Into<String>, task_type: impl Into<String>) -> Self {
        let task_type = task_type.into();
        Self {
            id: id.into(),
            queue: task_type.clone(),
            on_failure: FailurePolicy::default().chain_for(&task_type),
            task_type,
            input: serde_json::Value::Object(serde_json::Map::new()),
            files: Vec::new(),
            timeout: None,
            fallback: None,
            is_fallback_only: false,
            not_run: None,
            subtask_of: None,
            tests: Vec::new(),
            relationships: Vec::new(),
            condition: None,
            validate: Vec::new(),
        }
    }
}

/// Why a task is not run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NotRun {
    /// Another task supersedes this one; it is skipped and the other's result stands for it.
    SupersededBy(TaskIdx),
    /// This task duplicates another; it shares the other's result.
    DuplicateOf(TaskIdx),
}

/// A file a task touches (seed 001's `task_file_impacts`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileImpact {
    pub path: String,
    pub op: FileOp,
    /// How sure the author is, 0.0–1.0; below `options.min_conflict_confidence` the impact
    /// creates no conflict.
    pub confidence: f32,
}

/// What a task does to a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FileOp {
    Create,
    Update,
    Delete,
    Read,
}

impl FileOp {
    /// Returns true when two tasks doing `self` and `other` to one path must not run together
    /// (seed 001's conflict matrix, symmetric).
    pub fn conflicts_with(self, other: FileOp) -> bool {
        use FileOp::*;
        matches!(
            (self, other),
            (Create, Create)
                | (Create, Delete)
                | (Delete, Create)
                | (Update, Update)
                | (Update, Delete)
                | (Delete, Update)
                | (Delete, Delete)
                | (Delete, Read)
                | (Read, Delete)
        )
    }
}

/// One of the 11 relationship types (docs/design.md §4), written in snake_case in plans.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RelationshipKind {
    DependsOn,
    Blocks,
    ConflictsWith,
    Supersedes,
    DuplicateOf,
    SubtaskOf,
    Tests,
    RelatedTo,
    Implements,
    Enables,
    InspiredBy,
}

impl RelationshipKind {
    /// Every kind, in the order of docs/design.md §4.
    pub const ALL: [RelationshipKind; 11] = [
        Self::DependsOn,
        Self::Blocks,
        Self::ConflictsWith,
        Self::Supersedes,
        Self::DuplicateOf,
        Self::SubtaskOf,
        Self::Tests,
        Self::RelatedTo,
        Self::Implements,
        Self::Enables,
        Self::InspiredBy,
    ];

    /// Returns the snake_case name used in plan files.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DependsOn => "depends_on",
            Self::Blocks => "blocks",
            Self::ConflictsWith => "conflicts_with",
            Self::Supersedes => "supersedes",
            Self::DuplicateOf => "duplicate_of",
            Self::SubtaskOf => "subtask_of",
            Self::Tests => "tests",
            Self::RelatedTo => "related_to",
            Self::Implements => "implements",
            Self::Enables => "enables",
            Self::InspiredBy => "inspired_by",
        }
    }

    /// Returns true for kinds that only carry meaning for people (shown in the UI, no effect on
    /// scheduling).
    pub fn is_metadata(self) -> bool {
        matches!(
            self,
            Self::RelatedTo | Self::Implements | Self::Enables | Self::InspiredBy
        )
    }
}

/// A declared relationship from the owning task to `target`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relationship {
    pub kind: RelationshipKind,
    pub target: TaskIdx,
}

#[cfg(test)]
mod tests {
    use super::FileOp::{self, *};

    #[test]
    fn conflict_matrix_matches_seed_001() {
        let conflicting = [
            (Create, Create),
            (Create, Delete),
            (Update, Update),
            (Update, Delete),
            (Delete, Delete),
            (Delete, Read),
        ];
        let all = [Create, Update, Delete, Read];
        for a in all {
            for b in all {
                let expected = conflicting.contains(&(a, b)) || conflicting.contains(&(b, a));
                assert_eq!(FileOp::conflicts_with(a, b), expected, "{a:?}-{b:?}");
            }
        }
    }
}
