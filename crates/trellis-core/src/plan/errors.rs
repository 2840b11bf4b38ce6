//! The errors of parsing, expanding and compiling a plan: each [`PlanError`] says what is wrong,
//! where in the spec (`tasks[3].depends_on[0]`), where in the text when the parser knows, and how
//! to fix it when there is something better to say than the message. And the errors of decoding
//! a compiled plan's bytes ([`PlanDecodeError`]), naming the task and field.

use std::fmt;

use serde::Serialize;
use thiserror::Error;

use super::model::TaskIdx;

/// What kind of problem a [`PlanError`] reports, for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanErrorKind {
    /// The input is over [`Limits`].
    TooLarge,
    /// The input is not UTF-8 text.
    Encoding,
    /// The input is empty.
    Empty,
    /// The text is not a well-formed spec: YAML/JSON syntax, a wrong type, an unknown or missing
    /// field.
    Parse,
    /// A task id is empty, too long or uses characters outside `[A-Za-z0-9_.-]`.
    InvalidId,
    DuplicateId,
    /// A reference names no task of the plan.
    UnknownTask,
    /// A task depends on, falls back to or relates to itself.
    SelfReference,
    /// Dependencies (or subtask parents) form a cycle.
    Cycle,
    /// A value is out of range or malformed (durations, counts, confidence, jitter, ...).
    InvalidValue,
    /// A `${...}` reference or a `use:` names no declared param, template or item field, or a
    /// value was given for a param the plan does not declare.
    UnknownReference,
    /// A required param (one without a default) was given no value.
    MissingParam,
    /// Declarations contradict each other (a subtask with dependencies, a task superseded twice,
    /// a `fallback` action with nothing to fall back to, ...).
    Contradiction,
}

/// A position in the input text, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

/// One problem found in a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanError {
    pub kind: PlanErrorKind,
    /// Where in the spec, like `tasks[3].depends_on[0]`; empty for the whole input.
    pub path: String,
    /// What is wrong, lowercase, without trailing period.
    pub message: String,
    /// Where in the text, when the parser knows.
    pub location: Option<Location>,
    /// How to fix it, when there is something better to say than the message (`did you mean
    /// "schema"?`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl PlanError {
    /// Returns an error of `kind` at `path`, with no location or hint.
    pub fn new(kind: PlanErrorKind, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            path: path.into(),
            message: message.into(),
            location: None,
            hint: None,
        }
    }

    /// Adds a hint on how to fix the problem.
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.path.is_empty(), self.location) {
            (false, Some(at)) => write!(
                f,
                "{}: {} (line {}, column {})",
                self.path, self.message, at.line, at.column
            ),
            (false, None) => write!(f, "{}: {}", self.path, self.message),
            (true, Some(at)) => write!(
                f,
                "line {}, column {}: {}",
                at.line, at.column, self.message
            ),
            (true, None) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PlanError {}

/// All the problems found in a plan (never empty), in the order they were found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanErrors(Vec<PlanError>);

impl PlanErrors {
    /// Returns a list of exactly this error.
    pub fn one(error: PlanError) -> Self {
        Self(vec![error])
    }

    /// Wraps errors found by the parser, the expander or the compiler; `errors` is never empty.
    pub(crate) fn from_vec(errors: Vec<PlanError>) -> Self {
        Self(errors)
    }

    /// Returns the errors.
    pub fn errors(&self) -> &[PlanError] {
        &self.0
    }

    /// Returns the errors, owned.
    pub fn into_vec(self) -> Vec<PlanError> {
        self.0
    }

    /// Returns an iterator over the errors.
    pub fn iter(&self) -> std::slice::Iter<'_, PlanError> {
        self.0.iter()
    }

    /// Returns the number of errors (at least one).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Returns false: a `PlanErrors` always holds at least one error.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a PlanErrors {
    type Item = &'a PlanError;
    type IntoIter = std::slice::Iter<'a, PlanError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Display for PlanErrors {
    /// Writes one error per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PlanErrors {}

/// Why bytes could not be decoded into a plan.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum PlanDecodeError {
    /// The bytes are of a format version this build does not read.
    #[error(
        "plan encoding format {found} is not supported (this build reads formats {oldest} to {newest})"
    )]
    Format {
        found: u64,
        /// The oldest and the newest format this build reads.
        oldest: u32,
        newest: u32,
    },
    /// The bytes are not an encoded plan: truncated, of the wrong shape, nested too deep, or
    /// followed by more bytes.
    #[error("plan bytes are malformed: {0}")]
    Malformed(String),
    /// A task breaks a rule of compiled plans.
    #[error("tasks[{task}] ({id:?}).{field}: {message}")]
    InvalidTask {
        task: TaskIdx,
        id: String,
        /// The field of the task, with its position in a list (`deps[2]`).
        field: String,
        message: String,
    },
    /// A plan-wide value breaks a rule of compiled plans.
    #[error("{field}: {message}")]
    InvalidPlan { field: String, message: String },
}
