//! The execution-graph builder of seed 000: it links the flat task instance records of one
//! execution into the tree that shows how the execution actually ran.
//!
//! The tree has two kinds of elements (docs/design.md §4):
//!
//! - a **node** is one task instance; its `next` is the [`Group`] it spawned, or the instance that
//!   continues it directly (`continues_task_instance_id`: resumption after a human answer, a
//!   fallback run), or nothing;
//! - a **group** is the set of subtasks one instance spawned; its `next` is the parent's resumed
//!   instance (the record whose `resumed_after_subtasks_group_id` is the group), or nothing while
//!   the group runs.
//!
//! Every record but the root has exactly one way in: its parent (as a group member), the group it
//! resumes after, or the instance it continues. Anything else is a [`GraphError`], never a panic.
//!
//! The graph is an arena: nodes and groups live in flat vectors and point at each other with
//! [`NodeIdx`] and [`GroupIdx`], so a chain 100,000 deep costs no stack to build, walk or drop.
//! Nodes are numbered in pre-order (a node, then its group, the group's members each with
//! everything under it, then the group's resumed instance) and the members of a group are ordered by
//! `created_at_ms`, then by instance id. The arena therefore depends only on the set of records,
//! not on their order in the input: two builds of one execution compare equal.
//!
//! Building is linear in the number of records (hash maps keyed by id, one pass to index, one
//! traversal, an in-place reorder) apart from sorting each group's members, which costs
//! `O(m log m)` for a group of `m`.

mod build;
mod error;
mod render;
#[cfg(test)]
mod tests;

use serde::Serialize;

use crate::ids::GroupId;
use crate::record::TaskStatusRecord;

pub use build::build;
pub use error::{GraphError, RecordList, RecordRef};
pub use render::MAX_DRAWN_LEVELS;

/// The position of a node in an [`ExecutionGraph`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct NodeIdx(u32);

impl NodeIdx {
    /// Returns the position as an index into [`ExecutionGraph::records`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The position of a group in an [`ExecutionGraph`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct GroupIdx(u32);

impl GroupIdx {
    /// Returns the position as an index into [`ExecutionGraph::groups`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What follows a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Next {
    /// Nothing yet: a leaf, or an instance still running.
    None,
    /// The instance continues directly as another instance.
    Node(NodeIdx),
    /// The instance spawned a group of subtasks.
    Group(GroupIdx),
}

/// One node of the graph: a task instance and what follows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Node<'g> {
    pub idx: NodeIdx,
    pub record: &'g TaskStatusRecord,
    pub next: Next,
}

/// A group of subtasks spawned by one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    pub group_id: GroupId,
    /// The instance that spawned the group.
    pub parent: NodeIdx,
    /// The members, by `created_at_ms` then instance id; never empty (a group is known only
    /// through its members).
    pub nodes: Vec<NodeIdx>,
    /// The parent's instance resumed after the group, if it has been created.
    pub next: Option<NodeIdx>,
}

/// The tree of one execution, built by [`build`].
///
/// It serializes (serde) in a flat form that any parser can read whatever the depth:
/// `{"records": [...], "next": [...], "groups": [...]}`, where `next[i]` is `"none"`,
/// `{"node": j}` or `{"group": k}` for `records[i]`, and the root is node 0. For the nested form of
/// seed 000 see [`ExecutionGraph::to_nested_json`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExecutionGraph {
    /// The records in pre-order; `records[i]` is node `i`.
    records: Vec<TaskStatusRecord>,
    /// `next[i]` follows node `i`.
    next: Vec<Next>,
    groups: Vec<Group>,
}

impl ExecutionGraph {
    /// Returns the root: the instance the execution started with, always node 0.
    pub fn root(&self) -> NodeIdx {
        NodeIdx(0)
    }

    /// Returns the node at `idx`.
    ///
    /// # Panics
    ///
    /// If `idx` comes from another graph and is out of range.
    pub fn node(&self, idx: NodeIdx) -> Node<'_> {
        Node {
            idx,
            record: &self.records[idx.index()],
            next: self.next[idx.index()],
        }
    }

    /// Returns the group at `idx`.
    ///
    /// # Panics
    ///
    /// If `idx` comes from another graph and is out of range.
    pub fn group(&self, idx: GroupIdx) -> &Group {
        &self.groups[idx.index()]
    }

    /// Returns every node, in pre-order.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = Node<'_>> + '_ {
        self.records
            .iter()
            .zip(&self.next)
            .enumerate()
            .map(|(i, (record, &next))| Node {
                idx: node_idx(i),
                record,
                next,
            })
    }

    /// Returns every group, in pre-order of the instances that spawned them.
    pub fn groups(&self) -> &[Group] {
        &self.groups
    }

    /// Returns the records, in pre-order (`records()[i]` is node `i`).
    pub fn records(&self) -> &[TaskStatusRecord] {
        &self.records
    }

    /// Returns the number of nodes (task instances); at least 1.
    pub fn n_nodes(&self) -> usize {
        self.records.len()
    }

    /// Returns the number of groups.
    pub fn n_groups(&self) -> usize {
        self.groups.len()
    }

    /// Gives the records back, in pre-order.
    pub fn into_records(self) -> Vec<TaskStatusRecord> {
        self.records
    }
}

/// Converts a position to a [`NodeIdx`]. Positions come from a vector of records, whose length
/// [`build`] has checked fits in a `u32`.
fn node_idx(i: usize) -> NodeIdx {
    debug_assert!(u32::try_from(i).is_ok());
    NodeIdx(i as u32)
}

/// Converts a position to a [`GroupIdx`]; there are fewer groups than records.
fn group_idx(i: usize) -> GroupIdx {
    debug_assert!(u32::try_from(i).is_ok());
    GroupIdx(i as u32)
}
