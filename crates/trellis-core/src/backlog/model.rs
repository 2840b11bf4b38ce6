//! The backlog's values: tasks before they run, task lists, blocks, and the names each field takes
//! (seed 001's data model, the fields that matter for running a task).
//!
//! Names are lowercase snake_case on every surface (CLI, gRPC, database); each enum reads them with
//! `parse`, whose error lists the names it accepts.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::plan::{CheckLevel, FileImpact, FileOp, RelationshipKind};

/// What a backlog input got wrong: the field (a path such as `files[2].path`) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    /// Returns an error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Declares a closed set of names: the enum, `ALL`, `as_str`, `parse` and `Display`.
macro_rules! names {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant),+ }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$(Self::$variant),+];

            /// Returns the name used on every surface.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }

            /// Reads a name [`Self::as_str`] gives; the error names `field` and lists the names.
            pub fn parse(field: &str, text: &str) -> Result<Self, FieldError> {
                match text {
                    $($text => Ok(Self::$variant),)+
                    _ => Err(FieldError::new(
                        field,
                        format!(
                            "unknown {} {text:?} (expected one of: {})",
                            stringify!($name).to_lowercase(),
                            [$($text),+].join(", ")
                        ),
                    )),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names! {
    /// What kind of work a task is.
    Category {
        Feature = "feature",
        Bug = "bug",
        Task = "task",
        Improvement = "improvement",
        Refactor = "refactor",
        Test = "test",
        Docs = "docs",
        Infra = "infra",
        Research = "research",
    }
}

names! {
    /// How urgent a task is; `p1` first.
    Priority { P1 = "p1", P2 = "p2", P3 = "p3", P4 = "p4" }
}

names! {
    /// How much work a task is thought to be.
    Effort {
        Trivial = "trivial",
        Small = "small",
        Medium = "medium",
        Large = "large",
        Epic = "epic",
    }
}

names! {
    /// Where a task is in its life (seed 001's task state machine).
    TaskStatus {
        Draft = "draft",
        Evaluating = "evaluating",
        Pending = "pending",
        Blocked = "blocked",
        InProgress = "in_progress",
        Validating = "validating",
        Completed = "completed",
        Failed = "failed",
    }
}

names! {
    /// Where a task list is in its life.
    ListStatus {
        Draft = "draft",
        Ready = "ready",
        InProgress = "in_progress",
        Paused = "paused",
        Completed = "completed",
        Archived = "archived",
    }
}

names! {
    /// How one list item fared in the list's latest run.
    ItemStatus {
        Pending = "pending",
        InProgress = "in_progress",
        Completed = "completed",
        Failed = "failed",
        Skipped = "skipped",
    }
}

names! {
    /// Why a task is blocked.
    BlockKind {
        Validation = "validation",
        Dependency = "dependency",
        Manual = "manual",
        Conflict = "conflict",
    }
}

/// The one queue a task can wait in outside a list.
pub const EVALUATION_QUEUE: &str = "evaluation";

/// Most characters of a title.
pub const MAX_TITLE_CHARS: usize = 200;

/// Most characters of a description.
pub const MAX_DESCRIPTION_CHARS: usize = 20_000;

/// Where a task waits: in the evaluation queue or in exactly one list, never both.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// `queue = 'evaluation'`, no list.
    Evaluation,
    /// In the list with this name (unique per project), no queue.
    List(String),
}

impl Placement {
    /// Reads the two columns of the seed's model (`queue`, `task_list_id`): exactly one is set, and
    /// the queue can only be `evaluation`.
    pub fn from_parts(queue: Option<&str>, list: Option<&str>) -> Result<Self, FieldError> {
        match (
            queue.filter(|q| !q.is_empty()),
            list.filter(|l| !l.is_empty()),
        ) {
            (Some(EVALUATION_QUEUE), None) => Ok(Self::Evaluation),
            (Some(other), None) => Err(FieldError::new(
                "queue",
                format!("unknown queue {other:?} (the only queue is {EVALUATION_QUEUE:?})"),
            )),
            (None, Some(list)) => Ok(Self::List(list.to_owned())),
            (Some(_), Some(list)) => Err(FieldError::new(
                "queue",
                format!(
                    "a task waits in the evaluation queue or in a list, never both (list {list:?} \
                     given too)"
                ),
            )),
            (None, None) => Ok(Self::Evaluation),
        }
    }

    /// Returns the list's name, if the task is in one.
    pub fn list(&self) -> Option<&str> {
        match self {
            Self::Evaluation => None,
            Self::List(name) => Some(name),
        }
    }
}

/// A relationship from one backlog task to another, by number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Link {
    pub kind: RelationshipKind,
    pub target: u32,
}

/// An open block: why the task cannot go on, and what blocks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub kind: BlockKind,
    pub reason: String,
    /// The blocking task's number, for a dependency block.
    pub blocking_task: Option<u32>,
}

/// A task in the backlog, as the rules and the grouping read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BacklogTask {
    /// The task's number in its project, shown as `T-<number>`.
    pub number: u32,
    pub title: String,
    pub description: String,
    pub category: Category,
    pub priority: Priority,
    pub effort: Effort,
    /// 1–5: database, types, API, UI, tests.
    pub phase: u8,
    pub status: TaskStatus,
    pub placement: Placement,
    pub files: Vec<FileImpact>,
    pub acceptance_criteria: Vec<String>,
    /// The commands of the three test levels.
    pub codebase_tests: Vec<String>,
    pub api_tests: Vec<String>,
    pub ui_tests: Vec<String>,
    pub links: Vec<Link>,
    /// The open blocks.
    pub blocks: Vec<Block>,
}

impl BacklogTask {
    /// Returns the display id, `T-<number>`.
    pub fn display_id(&self) -> String {
        display_id(self.number)
    }

    /// Returns the tests of one level.
    pub fn tests(&self, level: CheckLevel) -> &[String] {
        match level {
            CheckLevel::Codebase => &self.codebase_tests,
            CheckLevel::Api => &self.api_tests,
            CheckLevel::Ui => &self.ui_tests,
        }
    }

    /// Returns the numbers of the tasks this one must wait for: its `depends_on` targets.
    pub fn dependencies(&self) -> impl Iterator<Item = u32> + '_ {
        self.links
            .iter()
            .filter(|link| link.kind == RelationshipKind::DependsOn)
            .map(|link| link.target)
    }

    /// Returns true when the task is small enough to be a quick win (under an hour).
    pub fn is_quick_win(&self) -> bool {
        matches!(self.effort, Effort::Trivial | Effort::Small)
    }

    /// The computed priority score, 0–100: the priority's base (p1 70, p2 50, p3 30, p4 10),
    /// 5 for each task that waits for this one (at most 20), and 10 for a quick win.
    pub fn priority_score(&self, waiting_tasks: usize) -> u32 {
        let base = match self.priority {
            Priority::P1 => 70,
            Priority::P2 => 50,
            Priority::P3 => 30,
            Priority::P4 => 10,
        };
        let waiting = u32::try_from(waiting_tasks.min(4)).unwrap_or(4) * 5;
        base + waiting + if self.is_quick_win() { 10 } else { 0 }
    }
}

/// Returns `T-<number>`.
pub fn display_id(number: u32) -> String {
    format!("T-{number}")
}

/// Reads `T-12`, `t-12` or `12` as task number 12; the error names `field`.
pub fn parse_task_ref(field: &str, text: &str) -> Result<u32, FieldError> {
    let digits = text
        .strip_prefix("T-")
        .or_else(|| text.strip_prefix("t-"))
        .unwrap_or(text);
    match digits.parse::<u32>() {
        Ok(number) if number > 0 => Ok(number),
        _ => Err(FieldError::new(
            field,
            format!("{text:?} is not a task id (expected T-<number>, such as T-12)"),
        )),
    }
}

/// Reads a file operation as written: `create`, `update`, `delete`, `read` (any case).
pub fn parse_file_op(field: &str, text: &str) -> Result<FileOp, FieldError> {
    match text.to_ascii_lowercase().as_str() {
        "create" => Ok(FileOp::Create),
        "update" => Ok(FileOp::Update),
        "delete" => Ok(FileOp::Delete),
        "read" => Ok(FileOp::Read),
        _ => Err(FieldError::new(
            field,
            format!("unknown file operation {text:?} (expected CREATE, UPDATE, DELETE or READ)"),
        )),
    }
}

/// Returns the operation's name as seed 001 writes it (`UPDATE`).
pub fn file_op_name(op: FileOp) -> &'static str {
    match op {
        FileOp::Create => "CREATE",
        FileOp::Update => "UPDATE",
        FileOp::Delete => "DELETE",
        FileOp::Read => "READ",
    }
}

/// Reads a relationship kind by its snake_case name.
pub fn parse_relationship(field: &str, text: &str) -> Result<RelationshipKind, FieldError> {
    RelationshipKind::ALL
        .into_iter()
        .find(|kind| kind.as_str() == text)
        .ok_or_else(|| {
            let names: Vec<&str> = RelationshipKind::ALL.iter().map(|k| k.as_str()).collect();
            FieldError::new(
                field,
                format!(
                    "unknown relationship {text:?} (expected one of: {})",
                    names.join(", ")
                ),
            )
        })
}

/// Checks a title: not blank, at most [`MAX_TITLE_CHARS`] characters, one line.
pub fn check_title(title: &str) -> Result<(), FieldError> {
    if title.trim().is_empty() {
        return Err(FieldError::new("title", "must not be empty"));
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        return Err(FieldError::new(
            "title",
            format!("longer than {MAX_TITLE_CHARS} characters"),
        ));
    }
    if title.contains('\n') {
        return Err(FieldError::new("title", "must be one line"));
    }
    Ok(())
}

/// Checks a description's length.
pub fn check_description(description: &str) -> Result<(), FieldError> {
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(FieldError::new(
            "description",
            format!("longer than {MAX_DESCRIPTION_CHARS} characters"),
        ));
    }
    Ok(())
}

/// Checks a phase: 1–5.
pub fn check_phase(phase: u32) -> Result<u8, FieldError> {
    u8::try_from(phase)
        .ok()
        .filter(|phase| (1..=5).contains(phase))
        .ok_or_else(|| {
            FieldError::new(
                "phase",
                format!("{phase} is not a phase (1 database, 2 types, 3 API, 4 UI, 5 tests)"),
            )
        })
}

/// Checks a slug (a project's or a list's name): 1–64 of `[a-z0-9-]`, starting with a letter or a
/// digit.
pub fn check_slug(field: &str, slug: &str) -> Result<(), FieldError> {
    let valid = !slug.is_empty()
        && slug.len() <= 64
        && slug
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !slug.starts_with('-');
    if valid {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!(
                "{slug:?} is not a valid name (1-64 of a-z, 0-9 and '-', not starting with '-')"
            ),
        ))
    }
}

/// Checks an affected file's path: relative, no `..`, not empty.
pub fn check_file_path(field: &str, path: &str) -> Result<(), FieldError> {
    if path.is_empty() || path.starts_with('/') || path.split('/').any(|part| part == "..") {
        return Err(FieldError::new(
            field,
            format!("{path:?} is not a relative path inside the project (no leading '/', no '..')"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for category in Category::ALL {
            assert_eq!(Category::parse("c", category.as_str()), Ok(*category));
        }
        let err = Category::parse("rules[0].categories[1]", "feture").unwrap_err();
        assert_eq!(err.field, "rules[0].categories[1]");
        assert!(err.message.contains("\"feture\""), "{err}");
        assert!(err.message.contains("feature, bug"), "{err}");
    }

    #[test]
    fn a_task_is_in_the_queue_or_a_list_never_both() {
        assert_eq!(
            Placement::from_parts(Some("evaluation"), None),
            Ok(Placement::Evaluation)
        );
        assert_eq!(
            Placement::from_parts(None, Some("auth")),
            Ok(Placement::List("auth".into()))
        );
        assert_eq!(Placement::from_parts(None, None), Ok(Placement::Evaluation));
        let both = Placement::from_parts(Some("evaluation"), Some("auth")).unwrap_err();
        assert_eq!(both.field, "queue");
        assert!(both.message.contains("never both"), "{both}");
        assert!(Placement::from_parts(Some("triage"), None).is_err());
    }

    #[test]
    fn task_references_read_display_ids_and_numbers() {
        assert_eq!(parse_task_ref("t", "T-12"), Ok(12));
        assert_eq!(parse_task_ref("t", "12"), Ok(12));
        assert!(parse_task_ref("t", "T-0").is_err());
        assert!(parse_task_ref("t", "X-1").is_err());
    }

    #[test]
    fn paths_must_stay_inside_the_project() {
        assert!(check_file_path("files[0].path", "src/auth.rs").is_ok());
        assert!(check_file_path("files[0].path", "/etc/passwd").is_err());
        assert!(check_file_path("files[0].path", "src/../../x").is_err());
    }
}
