//! Why a set of records does not form an execution graph.
//!
//! Every malformed input the builder can meet has its own variant, naming the records involved, so
//! an operator reading `trellis tree` output can find the faulty rows in the read model.

use std::fmt;

use crate::ids::{ExecutionId, GroupId, TaskInstanceId};
use crate::record::TaskStatusRecord;

/// How many records a message lists before it says "and N more".
const MAX_LISTED: usize = 5;

/// A record named in an error: its instance id and its task id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordRef {
    pub task_instance_id: TaskInstanceId,
    pub task_id: String,
}

impl RecordRef {
    pub(crate) fn of(record: &TaskStatusRecord) -> Self {
        Self {
            task_instance_id: record.task_instance_id,
            task_id: record.task_id.clone(),
        }
    }
}

impl fmt::Display for RecordRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (task {:?})", self.task_instance_id, self.task_id)
    }
}

/// A list of records, displayed as `a and b` or `a, b, c and 4 more`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordList(pub Vec<RecordRef>);

impl fmt::Display for RecordList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let records = &self.0;
        let n_shown = records.len().min(MAX_LISTED);
        for (i, record) in records[..n_shown].iter().enumerate() {
            if i > 0 {
                let last_shown_is_last = n_shown == records.len() && i + 1 == n_shown;
                f.write_str(if last_shown_is_last { " and " } else { ", " })?;
            }
            write!(f, "{record}")?;
        }
        if n_shown < records.len() {
            write!(f, " and {} more", records.len() - n_shown)?;
        }
        Ok(())
    }
}

/// Writes a count the way the messages say it: `two`, `three`, then digits.
fn count_word(n: usize) -> String {
    match n {
        2 => "two".to_owned(),
        3 => "three".to_owned(),
        _ => n.to_string(),
    }
}

/// Why [`build`](super::build) rejected its input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// The input held no record at all.
    #[error("no records: an execution graph needs at least its root")]
    Empty,

    /// The input holds more records than the graph can number (`u32` indices keep it compact).
    #[error("too many records: {n_records}, at most {max} fit in one graph")]
    TooManyRecords { n_records: usize, max: usize },

    /// Every record is linked to another one, so none can be the root.
    #[error(
        "no root: each of the {n_records} records has a parent, a resumed group or a continued instance"
    )]
    NoRoot { n_records: usize },

    /// More than one record is unlinked (sorted by instance id).
    #[error("{} roots: {roots}", count_word(.roots.0.len()))]
    SeveralRoots { roots: RecordList },

    /// Two records carry the same instance id.
    #[error("duplicate task instance id: {first} and {second}")]
    DuplicateId { first: RecordRef, second: RecordRef },

    /// A record belongs to another execution than the first record of the input.
    #[error("records of different correlation ids: {record} has {found}, expected {expected}")]
    MixedCorrelation {
        record: RecordRef,
        expected: ExecutionId,
        found: ExecutionId,
    },

    /// A record's parent is not in the input.
    #[error("orphan: {record} has parent {parent}, which is not in the input")]
    Orphan {
        record: RecordRef,
        parent: TaskInstanceId,
    },

    /// A record continues an instance that is not in the input.
    #[error("orphan: {record} continues {continued}, which is not in the input")]
    ContinuesUnknown {
        record: RecordRef,
        continued: TaskInstanceId,
    },

    /// A record resumes after a group no record is a member of.
    #[error(
        "resume of an unknown group: {record} resumes after group {group}, which has no member"
    )]
    ResumesUnknownGroup { record: RecordRef, group: GroupId },

    /// A record has a parent but no subtask group id.
    #[error("member without group: {record} has parent {parent} but no subtask group id")]
    MemberWithoutGroup {
        record: RecordRef,
        parent: TaskInstanceId,
    },

    /// A record has a subtask group id but no parent.
    #[error("group without parent: {record} is a member of group {group} but has no parent")]
    GroupWithoutParent { record: RecordRef, group: GroupId },

    /// A record has more than one way in: a parent, a resumed group, a continued instance.
    #[error(
        "several links: {record} has more than one of a parent, a resumed group and a continued instance"
    )]
    SeveralLinks { record: RecordRef },

    /// The members of one parent name different groups (an instance spawns at most one group).
    #[error(
        "two groups under one parent: {parent} has members of group {first_group} and of group {second_group}"
    )]
    SeveralGroups {
        parent: RecordRef,
        first_group: GroupId,
        second_group: GroupId,
    },

    /// The members of one group name different parents.
    #[error(
        "two parents for one group: group {group} has members under {first_parent} and under {second_parent}"
    )]
    GroupWithSeveralParents {
        group: GroupId,
        first_parent: TaskInstanceId,
        second_parent: TaskInstanceId,
    },

    /// Two records resume after the same group: the duplicate resumption the coordinator must never
    /// produce (seed 004).
    #[error("duplicate resumption of group {group}: {first} and {second}")]
    DuplicateResumption {
        group: GroupId,
        first: RecordRef,
        second: RecordRef,
    },

    /// Two records continue the same instance.
    #[error("duplicate continuation of {continued}: {first} and {second}")]
    DuplicateContinuation {
        continued: RecordRef,
        first: RecordRef,
        second: RecordRef,
    },

    /// An instance both spawned a group and is continued directly; its `next` would be both.
    #[error(
        "both a group and a continuation: {record} spawned group {group} and is continued by {continuation}"
    )]
    GroupAndContinuation {
        record: RecordRef,
        group: GroupId,
        continuation: RecordRef,
    },

    /// Records that the root never reaches: they only reach each other, in a cycle (listed in
    /// input order).
    #[error(
        "cycle: {} records are not reachable from the root: {records}",
        .records.0.len()
    )]
    Unreachable { records: RecordList },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_ref(seed: u128, task_id: &str) -> RecordRef {
        RecordRef {
            task_instance_id: TaskInstanceId::derived(1, seed),
            task_id: task_id.to_owned(),
        }
    }

    #[test]
    fn lists_name_two_records_with_and() {
        let list = RecordList(vec![record_ref(1, "a"), record_ref(2, "b")]);
        let text = list.to_string();
        assert!(text.contains(r#"(task "a") and "#), "{text}");
        assert!(text.ends_with(r#"(task "b")"#), "{text}");
    }

    #[test]
    fn long_lists_are_cut() {
        let list = RecordList((0..8).map(|i| record_ref(i, "t")).collect());
        let text = list.to_string();
        assert!(text.ends_with(" and 3 more"), "{text}");
        assert_eq!(text.matches("(task").count(), MAX_LISTED);
    }
}
