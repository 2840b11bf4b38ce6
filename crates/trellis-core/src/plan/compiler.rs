//! The compiler's working state: the errors found so far, the task id index every reference
//! resolves through (with "did you mean" hints), durations and ids checked with precise errors,
//! and where each edge of the dependency graph was declared.

use std::collections::HashMap;
use std::time::Duration;

use super::errors::{PlanError, PlanErrorKind};
use super::limits::Limits;
use super::model::TaskIdx;
use super::suggest::did_you_mean;

/// Where an edge of the dependency graph was declared, to point errors at it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Origin {
    pub(super) task: TaskIdx,
    pub(super) field: OriginField,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum OriginField {
    DependsOn,
    Relationship(usize),
    Route,
}

impl Origin {
    pub(super) fn path(self) -> String {
        match self.field {
            OriginField::DependsOn => format!("tasks[{}].depends_on", self.task),
            OriginField::Relationship(k) => format!("tasks[{}].relationships[{k}]", self.task),
            OriginField::Route => format!("tasks[{}].route", self.task),
        }
    }
}

/// An edge `dependent` waits for `dep`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Edge {
    pub(super) dependent: TaskIdx,
    pub(super) dep: TaskIdx,
    pub(super) origin: Origin,
}

pub(super) struct Compiler<'a> {
    pub(super) limits: &'a Limits,
    pub(super) errors: Vec<PlanError>,
    pub(super) index: HashMap<String, TaskIdx>,
    /// Task ids in declaration order, the candidates of "did you mean" hints.
    pub(super) ids: Vec<&'a str>,
    /// Hints still to be given: each costs a pass over the ids, so a plan with thousands of
    /// unknown references gets hints for the first few only.
    pub(super) hints_left: usize,
}

/// Most "did you mean" hints computed for one plan.
pub(super) const MAX_HINTS: usize = 100;

impl Compiler<'_> {
    pub(super) fn error(
        &mut self,
        kind: PlanErrorKind,
        path: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.errors.push(PlanError::new(kind, path, message));
    }

    pub(super) fn error_with_hint(
        &mut self,
        kind: PlanErrorKind,
        path: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.errors
            .push(PlanError::new(kind, path, message).with_hint(hint));
    }

    pub(super) fn resolve(&mut self, id: &str, path: impl FnOnce() -> String) -> Option<TaskIdx> {
        let found = self.index.get(id).copied();
        if found.is_none() {
            let mut error = PlanError::new(
                PlanErrorKind::UnknownTask,
                path(),
                format!("unknown task {id:?}"),
            );
            if self.hints_left > 0 {
                self.hints_left -= 1;
                error.hint = did_you_mean(id, self.ids.iter().copied());
            }
            self.errors.push(error);
        }
        found
    }

    pub(super) fn duration(
        &mut self,
        text: &str,
        path: impl FnOnce() -> String,
    ) -> Option<Duration> {
        match humantime::parse_duration(text.trim()) {
            Ok(d) if d.is_zero() => {
                self.error(
                    PlanErrorKind::InvalidValue,
                    path(),
                    "duration must be greater than zero",
                );
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                let reason = e.to_string().to_lowercase();
                self.error_with_hint(
                    PlanErrorKind::InvalidValue,
                    path(),
                    format!("invalid duration {text:?}: {reason} (use e.g. 500ms, 30s, 5m, 1h)"),
                    "a duration is a number and a unit: ms, s, m, h, d; parts add up (1h 30m)",
                );
                None
            }
        }
    }

    pub(super) fn check_id(&mut self, i: usize, id: &str) {
        let path = || format!("tasks[{i}].id");
        if id.is_empty() {
            self.error(
                PlanErrorKind::InvalidId,
                path(),
                "task id must not be empty",
            );
        } else if id.len() > self.limits.max_id_len {
            self.error(
                PlanErrorKind::InvalidId,
                path(),
                format!(
                    "task id is {} bytes long, over the limit of {}",
                    id.len(),
                    self.limits.max_id_len
                ),
            );
        } else if let Some(c) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            self.error(
                PlanErrorKind::InvalidId,
                path(),
                format!("task id {id:?} contains {c:?}; ids use only A-Z a-z 0-9 _ . -"),
            );
        }
    }
}
