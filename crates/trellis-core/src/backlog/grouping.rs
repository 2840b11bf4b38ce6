//! Grouping suggestions: which queued tasks belong in one list.
//!
//! Every pair of queued tasks is scored with five weighted criteria (seed 001's defaults: file
//! overlap 0.3, dependencies 0.25, category 0.2, description similarity 0.15, component 0.1);
//! pairs at or above a threshold join into groups, and each group of two or more is a suggestion
//! with a score and a reason people can read.

use serde::{Deserialize, Serialize};

use super::model::{BacklogTask, FieldError};

/// The weight of each criterion, per project. Each is in 0–1; they need not sum to 1 (a pair's
/// score is divided by their sum), but at least one must be above 0.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    pub file_overlap: f64,
    pub dependency: f64,
    pub category: f64,
    pub description: f64,
    pub component: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            file_overlap: 0.3,
            dependency: 0.25,
            category: 0.2,
            description: 0.15,
            component: 0.1,
        }
    }
}

/// The score at or above which two tasks are suggested together, unless a request names another.
pub const DEFAULT_THRESHOLD: f64 = 0.4;

/// One pair's score (0–1) and the reasons behind it, strongest first.
#[derive(Clone, Debug, PartialEq)]
pub struct PairScore {
    pub score: f64,
    pub reasons: Vec<String>,
}

/// A suggested list: its tasks (numbers, ascending), a name, a score and a reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Suggestion {
    pub tasks: Vec<u32>,
    pub name: String,
    pub score: f64,
    pub reason: String,
}

#[doc(hidden)]
pub fn _unimplemented(_: &BacklogTask) -> Result<(), FieldError> {
    Ok(())
}
