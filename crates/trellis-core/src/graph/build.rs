//! [`build`]: from the flat records of one execution to an [`ExecutionGraph`].
//!
//! Three steps, each linear: index the records by id and resolve every record's single way in
//! (parent, resumed group or continued instance), checking the input as it goes; walk the tree from
//! the root with an explicit stack, numbering nodes in pre-order; move the records into that order
//! in place, so the input's allocation becomes the graph's.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasherDefault, Hasher};

use super::error::{GraphError, RecordList, RecordRef};
use super::{ExecutionGraph, Group, GroupIdx, Next, NodeIdx, group_idx, node_idx};
use crate::ids::{GroupId, TaskInstanceId};
use crate::record::TaskStatusRecord;

/// Marks an absent position in the dense `u32` tables below.
const NONE: u32 = u32::MAX;

/// The most records one graph holds: positions are `u32` and [`NONE`] is reserved.
const MAX_RECORDS: usize = NONE as usize;

/// A hash map keyed by ids, with [`IdHasher`].
type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Hashes UUIDs cheaply: a multiply-rotate fold of their two words, then a full avalanche.
///
/// Ids are UUIDv7 whose low 62 bits are random, so they need no SipHash; hashing dominates the
/// build of a large execution otherwise. There is no secret key (the core reads no random source),
/// which is acceptable as ids are minted by the coordinator, not chosen by clients.
#[derive(Clone, Copy, Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(26) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn finish(&self) -> u64 {
        // The finalizer of MurmurHash3, so that every bit of the key reaches the bits hashbrown
        // uses for the bucket (low) and the tag (high).
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// A group member while the input is being indexed: its sort key and its input position.
type MemberKey = (u64, TaskInstanceId, u32);

/// A group while the input is being indexed; positions are input positions.
#[derive(Debug)]
struct GroupBuild {
    group_id: GroupId,
    parent: u32,
    /// The members with their sort key, copied while the record is at hand so the sort reads
    /// contiguous memory rather than a record scattered anywhere in the input.
    members: Vec<MemberKey>,
    resumed_by: u32,
}

fn member_key(record: &TaskStatusRecord, pos: u32) -> MemberKey {
    (record.created_at_ms, record.task_instance_id, pos)
}

/// Every record's way out, by input position: what the traversal follows.
#[derive(Debug)]
struct Links {
    root: u32,
    /// `spawned[p]` is the index in `groups` of the group record `p` spawned, or [`NONE`].
    spawned: Vec<u32>,
    /// `continued_by[p]` is the position of the record that continues record `p`, or [`NONE`].
    continued_by: Vec<u32>,
    groups: Vec<GroupBuild>,
}

/// Builds the execution graph of one execution from its task instance records, in any order.
///
/// Members of a group are ordered by `created_at_ms`, then by instance id, and nodes are numbered
/// in pre-order, so the result does not depend on the order of `records`.
///
/// # Errors
///
/// A [`GraphError`] naming the offending records when they do not form one tree: no record or no
/// root, several roots, a duplicate instance id, records of several executions, a link to a record
/// or group that is not in the input, a record with several ways in, an instance with two groups or
/// with both a group and a continuation, a group resumed or an instance continued twice, and
/// records unreachable from the root (a cycle).
pub fn build(mut records: Vec<TaskStatusRecord>) -> Result<ExecutionGraph, GraphError> {
    if records.is_empty() {
        return Err(GraphError::Empty);
    }
    if records.len() > MAX_RECORDS {
        return Err(GraphError::TooManyRecords {
            n_records: records.len(),
            max: MAX_RECORDS,
        });
    }
    let links = index(&records)?;
    let (new_of_old, next, groups) = traverse(&records, links)?;
    reorder(&mut records, new_of_old);
    Ok(ExecutionGraph {
        records,
        next,
        groups,
    })
}

/// Converts an input position to `u32`; [`build`] has checked that every position fits.
fn pos32(pos: usize) -> u32 {
    debug_assert!(pos < MAX_RECORDS);
    pos as u32
}

fn record_at(records: &[TaskStatusRecord], pos: u32) -> RecordRef {
    RecordRef::of(&records[pos as usize])
}

/// Checks the records and resolves every link to an input position.
fn index(records: &[TaskStatusRecord]) -> Result<Links, GraphError> {
    let n_records = records.len();
    let correlation_id = records[0].correlation_id;
    let mut pos_of_id: IdMap<TaskInstanceId, u32> =
        IdMap::with_capacity_and_hasher(n_records, BuildHasherDefault::default());
    for (pos, record) in records.iter().enumerate() {
        if record.correlation_id != correlation_id {
            return Err(GraphError::MixedCorrelation {
                record: RecordRef::of(record),
                expected: correlation_id,
                found: record.correlation_id,
            });
        }
        if let Some(first) = pos_of_id.insert(record.task_instance_id, pos32(pos)) {
            return Err(GraphError::DuplicateId {
                first: record_at(records, first),
                second: RecordRef::of(record),
            });
        }
    }

    let mut spawned = vec![NONE; n_records];
    let mut continued_by = vec![NONE; n_records];
    let mut groups: Vec<GroupBuild> = Vec::new();
    let mut group_of_id: IdMap<GroupId, u32> = IdMap::default();
    let mut resumptions: Vec<u32> = Vec::new();
    let mut roots: Vec<u32> = Vec::new();
    for (pos, record) in records.iter().enumerate() {
        let pos = pos32(pos);
        let n_links = usize::from(record.parent_task_instance_id.is_some())
            + usize::from(record.resumed_after_subtasks_group_id.is_some())
            + usize::from(record.continues_task_instance_id.is_some());
        if n_links > 1 {
            return Err(GraphError::SeveralLinks {
                record: RecordRef::of(record),
            });
        }
        match (record.parent_task_instance_id, record.subtask_group_id) {
            (Some(parent), Some(group_id)) => {
                let Some(&parent_pos) = pos_of_id.get(&parent) else {
                    return Err(GraphError::Orphan {
                        record: RecordRef::of(record),
                        parent,
                    });
                };
                match group_of_id.entry(group_id) {
                    Entry::Occupied(entry) => {
                        let group = &mut groups[*entry.get() as usize];
                        if group.parent != parent_pos {
                            return Err(GraphError::GroupWithSeveralParents {
                                group: group_id,
                                first_parent: records[group.parent as usize].task_instance_id,
                                second_parent: parent,
                            });
                        }
                        group.members.push(member_key(record, pos));
                    }
                    Entry::Vacant(entry) => {
                        let first_group = spawned[parent_pos as usize];
                        if first_group != NONE {
                            return Err(GraphError::SeveralGroups {
                                parent: record_at(records, parent_pos),
                                first_group: groups[first_group as usize].group_id,
                                second_group: group_id,
                            });
                        }
                        let group = pos32(groups.len());
                        groups.push(GroupBuild {
                            group_id,
                            parent: parent_pos,
                            members: vec![member_key(record, pos)],
                            resumed_by: NONE,
                        });
                        entry.insert(group);
                        spawned[parent_pos as usize] = group;
                    }
                }
            }
            (Some(parent), None) => {
                return Err(GraphError::MemberWithoutGroup {
                    record: RecordRef::of(record),
                    parent,
                });
            }
            (None, Some(group)) => {
                return Err(GraphError::GroupWithoutParent {
                    record: RecordRef::of(record),
                    group,
                });
            }
            (None, None) => {}
        }
        if record.resumed_after_subtasks_group_id.is_some() {
            // Resolved below, once every group is known.
            resumptions.push(pos);
        }
        if let Some(continued) = record.continues_task_instance_id {
            let Some(&continued_pos) = pos_of_id.get(&continued) else {
                return Err(GraphError::ContinuesUnknown {
                    record: RecordRef::of(record),
                    continued,
                });
            };
            let first = continued_by[continued_pos as usize];
            if first != NONE {
                return Err(GraphError::DuplicateContinuation {
                    continued: record_at(records, continued_pos),
                    first: record_at(records, first),
                    second: RecordRef::of(record),
                });
            }
            continued_by[continued_pos as usize] = pos;
        }
        if n_links == 0 {
            roots.push(pos);
        }
    }
    drop(pos_of_id);

    for pos in resumptions {
        let record = &records[pos as usize];
        let Some(group_id) = record.resumed_after_subtasks_group_id else {
            continue;
        };
        let Some(&group) = group_of_id.get(&group_id) else {
            return Err(GraphError::ResumesUnknownGroup {
                record: RecordRef::of(record),
                group: group_id,
            });
        };
        let group = &mut groups[group as usize];
        if group.resumed_by != NONE {
            return Err(GraphError::DuplicateResumption {
                group: group_id,
                first: record_at(records, group.resumed_by),
                second: RecordRef::of(record),
            });
        }
        group.resumed_by = pos;
    }

    for group in &mut groups {
        let continuation = continued_by[group.parent as usize];
        if continuation != NONE {
            return Err(GraphError::GroupAndContinuation {
                record: record_at(records, group.parent),
                group: group.group_id,
                continuation: record_at(records, continuation),
            });
        }
        // Ids are unique (checked above), so the key is a total order and an unstable sort is
        // deterministic.
        group.members.sort_unstable();
    }

    let root = match roots.as_slice() {
        [] => return Err(GraphError::NoRoot { n_records }),
        [root] => *root,
        _ => {
            let mut roots: Vec<RecordRef> = roots
                .into_iter()
                .map(|pos| record_at(records, pos))
                .collect();
            roots.sort_by_key(|root| root.task_instance_id);
            return Err(GraphError::SeveralRoots {
                roots: RecordList(roots),
            });
        }
    };
    Ok(Links {
        root,
        spawned,
        continued_by,
        groups,
    })
}

/// Where the traversal attaches a node it reaches.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Root,
    /// As the continuation of a node.
    NodeNext(NodeIdx),
    /// As the next member of a group.
    GroupMember(GroupIdx),
    /// As the instance resumed after a group.
    GroupNext(GroupIdx),
}

/// The traversal's result: the new position of every input position, then the graph's links.
type Traversal = (Vec<u32>, Vec<Next>, Vec<Group>);

/// Walks the tree from the root with an explicit stack, numbering nodes in pre-order.
fn traverse(records: &[TaskStatusRecord], links: Links) -> Result<Traversal, GraphError> {
    let n_records = records.len();
    let mut new_of_old = vec![NONE; n_records];
    let mut next: Vec<Next> = Vec::with_capacity(n_records);
    let mut groups: Vec<Group> = Vec::with_capacity(links.groups.len());
    let mut stack: Vec<(u32, Slot)> = vec![(links.root, Slot::Root)];
    while let Some((old, slot)) = stack.pop() {
        if new_of_old[old as usize] != NONE {
            // Every record has one way in, so this cannot happen; should it, the input is not a
            // tree and saying so beats looping.
            return Err(GraphError::Unreachable {
                records: RecordList(vec![record_at(records, old)]),
            });
        }
        let node = node_idx(next.len());
        new_of_old[old as usize] = node.0;
        next.push(Next::None);
        match slot {
            Slot::Root => {}
            Slot::NodeNext(previous) => next[previous.index()] = Next::Node(node),
            Slot::GroupMember(group) => groups[group.index()].nodes.push(node),
            Slot::GroupNext(group) => groups[group.index()].next = Some(node),
        }
        let spawned = links.spawned[old as usize];
        if spawned != NONE {
            let group_build = &links.groups[spawned as usize];
            let group = group_idx(groups.len());
            groups.push(Group {
                group_id: group_build.group_id,
                parent: node,
                nodes: Vec::with_capacity(group_build.members.len()),
                next: None,
            });
            next[node.index()] = Next::Group(group);
            // Pushed first so that it is reached last: after every member's subtree.
            if group_build.resumed_by != NONE {
                stack.push((group_build.resumed_by, Slot::GroupNext(group)));
            }
            stack.extend(
                group_build
                    .members
                    .iter()
                    .rev()
                    .map(|&(_, _, member)| (member, Slot::GroupMember(group))),
            );
        } else {
            let continuation = links.continued_by[old as usize];
            if continuation != NONE {
                stack.push((continuation, Slot::NodeNext(node)));
            }
        }
    }
    if next.len() < n_records {
        let unreachable = new_of_old
            .iter()
            .enumerate()
            .filter(|&(_, &new)| new == NONE)
            .map(|(old, _)| RecordRef::of(&records[old]))
            .collect();
        return Err(GraphError::Unreachable {
            records: RecordList(unreachable),
        });
    }
    Ok((new_of_old, next, groups))
}

/// Moves every record to its new position, in place: each swap puts one record where it belongs,
/// so this is linear and allocates nothing.
fn reorder(records: &mut [TaskStatusRecord], mut new_of_old: Vec<u32>) {
    for pos in 0..records.len() {
        loop {
            let target = new_of_old[pos] as usize;
            if target == pos {
                break;
            }
            records.swap(pos, target);
            new_of_old.swap(pos, target);
        }
    }
}
