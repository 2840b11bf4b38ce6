//! Durable steps (seed 002): the state merge (maps merge, the `messages` and `trace` lists
//! append, every other field replaces) and which recorded steps an attempt resumes from.
//!
//! The coordinator hands a new attempt the steps it recorded (`resume.steps`). An attempt that
//! JetStream delivers again because its worker died carries no steps, so workers also keep each
//! instance's steps in the steps bucket and read them back for such a delivery only: a first
//! delivery of a first attempt costs nothing.

use serde_json::Value;
use trellis_proto::v1::{RecordedSteps, ResumeContext, TaskAssignment};

/// Returns whether an attempt should look for steps in the steps bucket: when JetStream delivers
/// its message again (`delivered > 1`, the worker that had it died or handed it back), or when it
/// is a later attempt whose assignment carries no steps.
pub(crate) fn wants_stored_steps(delivered: i64, assignment: &TaskAssignment) -> bool {
    delivered > 1
        || (assignment.attempt > 1
            && assignment
                .resume
                .as_ref()
                .is_none_or(|resume| resume.steps.is_empty()))
}

/// Gives `assignment` the steps found in the bucket when they are more than it carries. Both lists
/// record the same instance's steps in the order they ran, so the longer one is the newer; on a
/// tie the coordinator's record stands.
pub(crate) fn resume_with(assignment: &mut TaskAssignment, stored: RecordedSteps) {
    let resume = assignment.resume.get_or_insert_with(ResumeContext::default);
    if stored.steps.len() > resume.steps.len() {
        resume.steps = stored.steps;
    }
}

/// Fields whose lists append instead of replacing.
const APPENDED_LISTS: [&str; 2] = ["messages", "trace"];

/// Merges `update` into `state`. A non-object update replaces the whole state.
pub(crate) fn merge(state: &mut Value, update: Value) {
    match (state, update) {
        (Value::Object(state), Value::Object(update)) => {
            for (key, value) in update {
                match state.get_mut(&key) {
                    Some(Value::Array(existing)) if APPENDED_LISTS.contains(&key.as_str()) => {
                        match value {
                            Value::Array(items) => existing.extend(items),
                            other => existing.push(other),
                        }
                    }
                    Some(existing @ Value::Object(_)) if value.is_object() => {
                        merge(existing, value)
                    }
                    _ => {
                        state.insert(key, value);
                    }
                }
            }
        }
        (state, update) => *state = update,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use trellis_proto::v1::{RecordedStep, RecordedSteps, ResumeContext, TaskAssignment};

    fn check(state: serde_json::Value, update: serde_json::Value, expected: serde_json::Value) {
        let mut state = state;
        super::merge(&mut state, update);
        assert_eq!(state, expected);
    }

    #[test]
    fn maps_merge_lists_append_others_replace() {
        check(json!({}), json!({"a": 1}), json!({"a": 1}));
        check(
            json!({"a": 1, "b": 2}),
            json!({"a": 3}),
            json!({"a": 3, "b": 2}),
        );
        check(
            json!({"slots": {"x": 1}}),
            json!({"slots": {"y": 2}}),
            json!({"slots": {"x": 1, "y": 2}}),
        );
        check(
            json!({"messages": [1], "trace": ["a"], "other": [1]}),
            json!({"messages": [2, 3], "trace": "b", "other": [2]}),
            json!({"messages": [1, 2, 3], "trace": ["a", "b"], "other": [2]}),
        );
        check(json!({"a": 1}), json!(7), json!(7));
        check(json!(null), json!({"a": 1}), json!({"a": 1}));
    }

    fn recorded(names: &[&str]) -> Vec<RecordedStep> {
        names
            .iter()
            .map(|name| RecordedStep {
                step: (*name).to_owned(),
                state: format!("{{\"last\":\"{name}\"}}").into_bytes(),
            })
            .collect()
    }

    fn with_steps(attempt: u32, names: &[&str]) -> TaskAssignment {
        TaskAssignment {
            attempt,
            resume: (!names.is_empty()).then(|| ResumeContext {
                steps: recorded(names),
                ..ResumeContext::default()
            }),
            ..TaskAssignment::default()
        }
    }

    #[test]
    fn only_redeliveries_and_later_attempts_without_steps_read_the_bucket() {
        let check = |delivered, assignment: &TaskAssignment, expected| {
            assert_eq!(
                super::wants_stored_steps(delivered, assignment),
                expected,
                "delivered {delivered}, {assignment:?}"
            );
        };
        check(1, &with_steps(1, &[]), false);
        check(1, &with_steps(2, &["a"]), false);
        check(2, &with_steps(1, &[]), true);
        check(3, &with_steps(2, &["a"]), true);
        check(1, &with_steps(2, &[]), true);
    }

    #[test]
    fn the_longer_list_of_steps_wins() {
        let check = |assigned: &[&str], stored: &[&str], expected: &[&str]| {
            let mut assignment = with_steps(1, assigned);
            super::resume_with(
                &mut assignment,
                RecordedSteps {
                    attempt: 1,
                    steps: recorded(stored),
                },
            );
            let resumed: Vec<&str> = assignment
                .resume
                .as_ref()
                .map(|resume| resume.steps.iter().map(|s| s.step.as_str()).collect())
                .unwrap_or_default();
            assert_eq!(
                resumed, expected,
                "assigned {assigned:?}, stored {stored:?}"
            );
        };
        check(&[], &[], &[]);
        check(&[], &["a", "b"], &["a", "b"]);
        check(&["a"], &["a", "b"], &["a", "b"]);
        check(&["a", "b"], &["a"], &["a", "b"]);
        check(&["a", "b"], &["x", "y"], &["a", "b"]);
    }
}
