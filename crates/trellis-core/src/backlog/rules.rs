//! Validation rules: what a task must have before it can run.
//!
//! A rule applies to the tasks of its categories (all, when it names none). A failed rule of
//! severity `error` blocks the task (a `validation` block whose reason is the finding); a
//! `warning` is reported and blocks nothing. A `custom` rule's command is run by the planner,
//! which feeds its outcome back as a finding.

use serde::{Deserialize, Serialize};

use super::model::{Category, FieldError};
use crate::plan::CheckLevel;

/// A rule as stored and sent: every field still text, read by [`Rule::parse`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleSpec {
    /// Unique per project: a slug.
    pub name: String,
    pub description: String,
    /// `required_field`, `test_required`, `pattern_match` or `custom`.
    pub kind: String,
    /// Category names; empty = every category.
    pub categories: Vec<String>,
    /// `required_field` and `pattern_match`: the task field (`title`, `description`,
    /// `acceptance_criteria`, `files`, `codebase_tests`, `api_tests`, `ui_tests`).
    pub field: String,
    /// `pattern_match`: a regular expression the field must match.
    pub pattern: String,
    /// `test_required`: the levels, at least one test of any of them (empty = any level).
    pub levels: Vec<String>,
    /// `custom`: a command run through `sh -c` with the task as JSON on stdin; it passes on exit
    /// status 0, its output's first line is the finding.
    pub command: String,
    /// `error` (default) or `warning`.
    pub severity: String,
    pub enabled: bool,
}

/// What a rule checks.
#[derive(Clone, Debug)]
pub enum RuleKind {
    RequiredField {
        field: TaskField,
    },
    TestRequired {
        levels: Vec<CheckLevel>,
    },
    PatternMatch {
        field: TaskField,
        pattern: regex::Regex,
    },
    Custom {
        command: String,
    },
}

/// A task field a rule can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskField {
    Title,
    Description,
    AcceptanceCriteria,
    Files,
    CodebaseTests,
    ApiTests,
    UiTests,
}

/// How much a failed rule matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Error,
    Warning,
}

/// A checked rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pub name: String,
    pub description: String,
    pub kind: RuleKind,
    pub categories: Vec<Category>,
    pub severity: Severity,
    pub enabled: bool,
}

/// One failed rule on one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: String,
    pub severity: Severity,
    pub message: String,
}

#[doc(hidden)]
pub fn _unimplemented(_: &RuleSpec, _: CheckLevel) -> Result<(), FieldError> {
    Ok(())
}
