//! Tests of the execution-graph builder: fixtures for each shape and each malformed input, deep
//! chains, and property tests that rebuild randomly generated trees from shuffled records.

use proptest::prelude::*;

use super::*;
use crate::ids::{ExecutionId, TaskInstanceId};
use crate::record::TaskState;

const T0: u64 = 1_700_000_000_000;

/// The UUIDv7 layout overwrites some bits of the low bytes of a `derived` seed (version and
/// variant), so small numbers are shifted clear of them: `derived(t, 10) == derived(t, 42)`.
fn id(n: u128) -> TaskInstanceId {
    TaskInstanceId::derived(T0, n << 24)
}

fn gid(n: u128) -> GroupId {
    GroupId::derived(T0, n << 24)
}

fn execution() -> ExecutionId {
    ExecutionId::derived(T0, 7)
}

/// A completed root-like record `n` of task `task`, created at `T0 + n` ms.
fn rec(n: u128, task: &str) -> TaskStatusRecord {
    TaskStatusRecord {
        task_instance_id: id(n),
        task_id: task.to_owned(),
        parent_task_instance_id: None,
        subtask_group_id: None,
        resumed_after_subtasks_group_id: None,
        continues_task_instance_id: None,
        correlation_id: execution(),
        run_number: 1,
        attempt: 1,
        state: TaskState::Completed,
        worker_id: None,
        created_at_ms: T0 + n as u64,
        dispatched_at_ms: None,
        started_at_ms: None,
        ended_at_ms: None,
        output: None,
        error: None,
        earlier_attempts: Vec::new(),
        validation: Vec::new(),
    }
}

fn member(n: u128, task: &str, parent: u128, group: u128) -> TaskStatusRecord {
    TaskStatusRecord {
        parent_task_instance_id: Some(id(parent)),
        subtask_group_id: Some(gid(group)),
        ..rec(n, task)
    }
}

fn resumed(n: u128, task: &str, group: u128) -> TaskStatusRecord {
    TaskStatusRecord {
        resumed_after_subtasks_group_id: Some(gid(group)),
        ..rec(n, task)
    }
}

fn continues(n: u128, task: &str, continued: u128) -> TaskStatusRecord {
    TaskStatusRecord {
        continues_task_instance_id: Some(id(continued)),
        ..rec(n, task)
    }
}

fn build_ok(records: Vec<TaskStatusRecord>) -> ExecutionGraph {
    match build(records) {
        Ok(graph) => graph,
        Err(err) => panic!("build failed: {err}"),
    }
}

fn build_err(records: Vec<TaskStatusRecord>) -> GraphError {
    match build(records) {
        Ok(graph) => panic!("build succeeded:\n{}", graph.render_text()),
        Err(err) => err,
    }
}

/// Checks the rendered tree, with ids replaced by `G<n>` for the group ids of [`gid`].
fn check_text(graph: &ExecutionGraph, expected: &str) {
    let mut text = graph.render_text();
    for n in 0..100 {
        text = text.replace(&gid(n).to_string(), &format!("G{n}"));
    }
    assert_eq!(text, expected, "\n{text}");
}

/// Build a group of three under a root, resumed once: the seed's basic shape.
fn group_of_three() -> Vec<TaskStatusRecord> {
    vec![
        TaskStatusRecord {
            state: TaskState::WaitingForSubtasks,
            ..rec(1, "build")
        },
        member(2, "compile", 1, 1),
        member(3, "test", 1, 1),
        TaskStatusRecord {
            state: TaskState::Failed,
            ..member(4, "lint", 1, 1)
        },
        resumed(5, "build", 1),
    ]
}

#[test]
fn single_root() {
    let graph = build_ok(vec![rec(1, "build")]);
    assert_eq!(graph.n_nodes(), 1);
    assert_eq!(graph.n_groups(), 0);
    let root = graph.node(graph.root());
    assert_eq!(root.record.task_instance_id, id(1));
    assert_eq!(root.next, Next::None);
    check_text(&graph, "build [completed]\n");
}

#[test]
fn root_with_a_group_of_three_and_the_resumed_parent() {
    let graph = build_ok(group_of_three());
    let Next::Group(group) = graph.node(graph.root()).next else {
        panic!("the root spawned no group")
    };
    let group = graph.group(group);
    assert_eq!(group.group_id, gid(1));
    assert_eq!(group.parent, graph.root());
    let members: Vec<&str> = group
        .nodes
        .iter()
        .map(|&member| graph.node(member).record.task_id.as_str())
        .collect();
    assert_eq!(members, ["compile", "test", "lint"]);
    for &member in &group.nodes {
        assert_eq!(graph.node(member).next, Next::None);
    }
    let resumed = group.next.expect("the group has a resumed instance");
    assert_eq!(graph.node(resumed).record.task_instance_id, id(5));
    check_text(
        &graph,
        "build [waiting_for_subtasks]\n\
         ├─ group G1 (3 subtasks)\n\
         │  ├─ compile [completed]\n\
         │  ├─ test [completed]\n\
         │  └─ lint [failed]\n\
         └─ resumed: build [completed]\n",
    );
}

#[test]
fn a_group_not_resumed_yet_ends_the_chain() {
    let mut records = group_of_three();
    records.pop();
    let graph = build_ok(records);
    assert_eq!(graph.groups()[0].next, None);
    check_text(
        &graph,
        "build [waiting_for_subtasks]\n\
         └─ group G1 (3 subtasks)\n\
         \x20  ├─ compile [completed]\n\
         \x20  ├─ test [completed]\n\
         \x20  └─ lint [failed]\n",
    );
}

#[test]
fn nested_groups_three_levels_deep_resumed_at_each_level() {
    let records = vec![
        rec(1, "plan"),
        member(10, "area", 1, 1),
        member(11, "area", 1, 1),
        member(20, "module", 10, 2),
        member(21, "module", 10, 2),
        member(30, "file", 20, 3),
        member(31, "file", 20, 3),
        resumed(40, "module", 3),
        resumed(41, "area", 2),
        resumed(42, "plan", 1),
    ];
    let graph = build_ok(records);
    assert_eq!(graph.n_nodes(), 10);
    assert_eq!(graph.n_groups(), 3);
    check_text(
        &graph,
        "plan [completed]\n\
         ├─ group G1 (2 subtasks)\n\
         │  ├─ area [completed]\n\
         │  │  ├─ group G2 (2 subtasks)\n\
         │  │  │  ├─ module [completed]\n\
         │  │  │  │  ├─ group G3 (2 subtasks)\n\
         │  │  │  │  │  ├─ file [completed]\n\
         │  │  │  │  │  └─ file [completed]\n\
         │  │  │  │  └─ resumed: module [completed]\n\
         │  │  │  └─ module [completed]\n\
         │  │  └─ resumed: area [completed]\n\
         │  └─ area [completed]\n\
         └─ resumed: plan [completed]\n",
    );
    // Pre-order numbering: a node, its group, the members' subtrees, then the resumed instance.
    let order: Vec<u128> = graph
        .nodes()
        .map(|node| {
            (0..100)
                .find(|&n| id(n) == node.record.task_instance_id)
                .expect("a fixture id")
        })
        .collect();
    assert_eq!(order, [1, 10, 20, 30, 31, 40, 21, 41, 11, 42]);
}

#[test]
fn a_resumed_parent_spawns_another_group() {
    let records = vec![
        rec(1, "agent"),
        member(2, "search", 1, 1),
        resumed(3, "agent", 1),
        member(4, "write", 3, 2),
        member(5, "review", 3, 2),
        resumed(6, "agent", 2),
    ];
    let graph = build_ok(records);
    check_text(
        &graph,
        "agent [completed]\n\
         ├─ group G1 (1 subtask)\n\
         │  └─ search [completed]\n\
         ├─ resumed: agent [completed]\n\
         ├─ group G2 (2 subtasks)\n\
         │  ├─ write [completed]\n\
         │  └─ review [completed]\n\
         └─ resumed: agent [completed]\n",
    );
}

#[test]
fn continuation_node() {
    let records = vec![
        rec(1, "deploy"),
        member(2, "ask", 1, 1),
        continues(3, "ask", 2),
        member(4, "migrate", 1, 1),
        resumed(5, "deploy", 1),
        continues(6, "deploy", 5),
    ];
    let graph = build_ok(records);
    let Next::Group(group) = graph.node(graph.root()).next else {
        panic!("the root spawned no group")
    };
    let ask = graph.group(group).nodes[0];
    let Next::Node(answered) = graph.node(ask).next else {
        panic!("ask is not continued")
    };
    assert_eq!(graph.node(answered).record.task_instance_id, id(3));
    check_text(
        &graph,
        "deploy [completed]\n\
         ├─ group G1 (2 subtasks)\n\
         │  ├─ ask [completed]\n\
         │  │  └─ continued: ask [completed]\n\
         │  └─ migrate [completed]\n\
         ├─ resumed: deploy [completed]\n\
         └─ continued: deploy [completed]\n",
    );
}

#[test]
fn members_are_ordered_by_creation_time_then_id() {
    let records = vec![
        rec(1, "root"),
        TaskStatusRecord {
            created_at_ms: T0 + 50,
            ..member(9, "late", 1, 1)
        },
        TaskStatusRecord {
            created_at_ms: T0,
            ..member(8, "tie-8", 1, 1)
        },
        TaskStatusRecord {
            created_at_ms: T0,
            ..member(7, "tie-7", 1, 1)
        },
    ];
    let graph = build_ok(records);
    let mut ties = [id(7), id(8)];
    ties.sort();
    let members: Vec<TaskInstanceId> = graph.groups()[0]
        .nodes
        .iter()
        .map(|&member| graph.node(member).record.task_instance_id)
        .collect();
    assert_eq!(members, [ties[0], ties[1], id(9)]);
}

#[test]
fn shuffled_input_gives_the_same_graph() {
    let mut records = vec![
        rec(1, "plan"),
        member(10, "a", 1, 1),
        member(11, "b", 1, 1),
        member(12, "c", 1, 1),
        member(20, "a1", 10, 2),
        member(21, "a2", 10, 2),
        resumed(22, "a", 2),
        continues(23, "b", 11),
        continues(24, "b", 23),
        resumed(30, "plan", 1),
    ];
    let expected = build_ok(records.clone());
    for round in 0..records.len() {
        records.rotate_left(1);
        assert_eq!(build_ok(records.clone()), expected, "rotation {round}");
        records.reverse();
        assert_eq!(build_ok(records.clone()), expected, "reversal {round}");
    }
}

#[test]
fn the_flat_form_round_trips_through_json() {
    let graph = build_ok(group_of_three());
    let value = serde_json::to_value(&graph).expect("the graph serializes");
    assert_eq!(value["next"][0], serde_json::json!({"group": 0}));
    assert_eq!(value["next"][1], serde_json::json!("none"));
    assert_eq!(value["groups"][0]["nodes"], serde_json::json!([1, 2, 3]));
    assert_eq!(value["groups"][0]["next"], serde_json::json!(4));
    assert_eq!(
        value["records"].as_array().map(Vec::len),
        Some(graph.n_nodes())
    );
}

#[test]
fn the_nested_form_follows_the_seed() {
    let graph = build_ok(vec![
        rec(1, "build"),
        member(2, "compile", 1, 1),
        member(3, "ask", 1, 1),
        continues(4, "ask", 3),
        resumed(5, "build", 1),
    ]);
    let json = graph.to_nested_json().expect("records serialize");
    let value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let group = &value["next"];
    assert_eq!(value["record"]["task_id"], "build");
    assert_eq!(group["group_id"], gid(1).to_string());
    assert_eq!(group["nodes"][0]["record"]["task_id"], "compile");
    assert_eq!(group["nodes"][0]["next"], serde_json::Value::Null);
    assert_eq!(
        group["nodes"][1]["next"]["record"]["task_instance_id"],
        id(4).to_string()
    );
    assert_eq!(
        group["next"]["record"]["task_instance_id"],
        id(5).to_string()
    );
    assert_eq!(group["next"]["next"], serde_json::Value::Null);
}

// Malformed input.

#[test]
fn no_records() {
    assert_eq!(build_err(Vec::new()), GraphError::Empty);
}

#[test]
fn no_root() {
    let err = build_err(vec![continues(1, "a", 2), continues(2, "b", 1)]);
    assert_eq!(err, GraphError::NoRoot { n_records: 2 });
    assert_eq!(
        err.to_string(),
        "no root: each of the 2 records has a parent, a resumed group or a continued instance"
    );
}

#[test]
fn two_roots() {
    let err = build_err(vec![rec(2, "b"), rec(1, "a")]);
    let (first, second) = if id(1) < id(2) {
        (id(1), id(2))
    } else {
        (id(2), id(1))
    };
    let task_of = |task_instance_id| if task_instance_id == id(1) { "a" } else { "b" };
    assert_eq!(
        err.to_string(),
        format!(
            r#"two roots: {first} (task "{}") and {second} (task "{}")"#,
            task_of(first),
            task_of(second),
        )
    );
    assert!(matches!(err, GraphError::SeveralRoots { roots } if roots.0.len() == 2));
}

#[test]
fn orphan() {
    let err = build_err(vec![rec(1, "root"), member(2, "lost", 99, 1)]);
    assert_eq!(
        err,
        GraphError::Orphan {
            record: RecordRef::of(&member(2, "lost", 99, 1)),
            parent: id(99),
        }
    );
    assert!(err.to_string().starts_with("orphan: "), "{err}");
}

#[test]
fn continuation_of_an_unknown_instance() {
    let err = build_err(vec![rec(1, "root"), continues(2, "lost", 99)]);
    assert!(
        matches!(err, GraphError::ContinuesUnknown { continued, .. } if continued == id(99)),
        "{err}"
    );
}

#[test]
fn cycle_beside_a_root() {
    let records = vec![
        rec(1, "root"),
        continues(2, "a", 3),
        member(3, "b", 4, 1),
        continues(4, "c", 2),
    ];
    let err = build_err(records);
    let GraphError::Unreachable { records } = &err else {
        panic!("not a cycle: {err}")
    };
    let ids: Vec<TaskInstanceId> = records.0.iter().map(|r| r.task_instance_id).collect();
    assert_eq!(ids, [id(2), id(3), id(4)]);
    assert!(
        err.to_string()
            .starts_with("cycle: 3 records are not reachable from the root: "),
        "{err}"
    );
}

#[test]
fn an_instance_that_continues_itself() {
    let err = build_err(vec![rec(1, "root"), continues(2, "loop", 2)]);
    assert!(matches!(err, GraphError::Unreachable { .. }), "{err}");
}

#[test]
fn an_instance_in_its_own_group() {
    let err = build_err(vec![rec(1, "root"), member(2, "loop", 2, 1)]);
    assert!(matches!(err, GraphError::Unreachable { .. }), "{err}");
}

#[test]
fn duplicate_id() {
    let err = build_err(vec![rec(1, "root"), member(2, "a", 1, 1), {
        let mut twin = member(3, "b", 1, 1);
        twin.task_instance_id = id(2);
        twin
    }]);
    assert!(
        matches!(&err, GraphError::DuplicateId { first, second }
            if first.task_instance_id == id(2) && first.task_id == "a" && second.task_id == "b"),
        "{err}"
    );
}

#[test]
fn duplicate_resumption() {
    let mut records = group_of_three();
    records.push(resumed(6, "build", 1));
    let err = build_err(records);
    assert!(
        matches!(&err, GraphError::DuplicateResumption { group, first, second }
            if *group == gid(1) && first.task_instance_id == id(5)
                && second.task_instance_id == id(6)),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with(&format!("duplicate resumption of group {}: ", gid(1))),
        "{err}"
    );
}

#[test]
fn duplicate_continuation() {
    let err = build_err(vec![
        rec(1, "root"),
        continues(2, "a", 1),
        continues(3, "b", 1),
    ]);
    assert!(
        matches!(err, GraphError::DuplicateContinuation { .. }),
        "{err}"
    );
}

#[test]
fn a_node_with_both_a_group_and_a_continuation() {
    let err = build_err(vec![
        rec(1, "root"),
        member(2, "a", 1, 1),
        continues(3, "b", 1),
    ]);
    assert!(
        matches!(&err, GraphError::GroupAndContinuation { record, group, continuation }
            if record.task_instance_id == id(1) && *group == gid(1)
                && continuation.task_instance_id == id(3)),
        "{err}"
    );
}

#[test]
fn mixed_correlation_ids() {
    let stranger = TaskStatusRecord {
        correlation_id: ExecutionId::derived(T0, 8),
        ..member(2, "a", 1, 1)
    };
    let err = build_err(vec![rec(1, "root"), stranger]);
    assert!(
        matches!(&err, GraphError::MixedCorrelation { expected, found, .. }
            if *expected == execution() && *found == ExecutionId::derived(T0, 8)),
        "{err}"
    );
}

#[test]
fn member_without_group() {
    let mut lost = member(2, "a", 1, 1);
    lost.subtask_group_id = None;
    let err = build_err(vec![rec(1, "root"), lost]);
    assert!(
        matches!(err, GraphError::MemberWithoutGroup { .. }),
        "{err}"
    );
}

#[test]
fn group_without_parent() {
    let mut lost = member(2, "a", 1, 1);
    lost.parent_task_instance_id = None;
    let err = build_err(vec![rec(1, "root"), lost]);
    assert!(
        matches!(err, GraphError::GroupWithoutParent { .. }),
        "{err}"
    );
}

#[test]
fn resume_of_an_unknown_group() {
    let err = build_err(vec![rec(1, "root"), resumed(2, "root", 9)]);
    assert!(
        matches!(err, GraphError::ResumesUnknownGroup { group, .. } if group == gid(9)),
        "{err}"
    );
}

#[test]
fn a_record_with_several_links() {
    let mut record = member(2, "a", 1, 1);
    record.continues_task_instance_id = Some(id(1));
    let err = build_err(vec![rec(1, "root"), record]);
    assert!(matches!(err, GraphError::SeveralLinks { .. }), "{err}");
}

#[test]
fn two_groups_under_one_parent() {
    let err = build_err(vec![
        rec(1, "root"),
        member(2, "a", 1, 1),
        member(3, "b", 1, 2),
    ]);
    assert_eq!(
        err,
        GraphError::SeveralGroups {
            parent: RecordRef::of(&rec(1, "root")),
            first_group: gid(1),
            second_group: gid(2),
        }
    );
}

#[test]
fn one_group_under_two_parents() {
    let err = build_err(vec![
        rec(1, "root"),
        member(2, "a", 1, 1),
        member(3, "b", 1, 1),
        member(4, "c", 2, 1),
    ]);
    assert_eq!(
        err,
        GraphError::GroupWithSeveralParents {
            group: gid(1),
            first_parent: id(1),
            second_parent: id(2),
        }
    );
}

// Depth: nothing may recurse.

const DEEP: u128 = 100_000;

#[test]
fn a_chain_of_continuations_100_000_deep() {
    let mut records = vec![rec(0, "step")];
    records.extend((1..DEEP).map(|n| continues(n, "step", n - 1)));
    records.reverse();
    let graph = build_ok(records);
    assert_eq!(graph.n_nodes(), DEEP as usize);
    let mut node = graph.root();
    let mut n_steps = 1;
    while let Next::Node(next) = graph.node(node).next {
        assert_eq!(next.index(), node.index() + 1, "pre-order numbering");
        node = next;
        n_steps += 1;
    }
    assert_eq!(n_steps, DEEP);
    let text = graph.render_text();
    assert_eq!(text.lines().count(), DEEP as usize);
    assert!(text.ends_with("└─ continued: step [completed]\n"));
    let json = graph.to_nested_json().expect("records serialize");
    assert!(json.ends_with(&"}".repeat(DEEP as usize)));
    drop(graph);
}

#[test]
fn groups_nested_100_000_deep() {
    // Member n is the only member of group n - 1 and spawns group n; every group is resumed.
    let mut records = vec![rec(0, "level")];
    records.extend((1..DEEP).map(|n| member(n, "level", n - 1, n - 1)));
    records.extend((1..DEEP).map(|n| resumed(DEEP + n, "level", n - 1)));
    records.reverse();
    let graph = build_ok(records);
    assert_eq!(graph.n_nodes(), 2 * DEEP as usize - 1);
    assert_eq!(graph.n_groups(), DEEP as usize - 1);
    let text = graph.render_text();
    assert_eq!(text.lines().count(), 3 * (DEEP as usize - 1) + 1);
    let widest = text.lines().map(|line| line.chars().count()).max();
    assert!(widest < Some(4 * MAX_DRAWN_LEVELS + 40), "{widest:?}");
    assert!(text.contains("[+"), "deep lines are cut");
    let json = graph.to_nested_json().expect("records serialize");
    assert!(json.starts_with(r#"{"record":"#));
    drop(graph);
}

#[test]
fn deep_lines_say_how_many_levels_they_skip() {
    let depth: u128 = MAX_DRAWN_LEVELS as u128 + 3;
    let mut records = vec![rec(0, "level")];
    records.extend((1..=depth).map(|n| member(n, "level", n - 1, n - 1)));
    let text = build_ok(records).render_text();
    let last = text.lines().last().expect("a line");
    // The deepest member is at depth 2 * depth; the lines draw at most MAX_DRAWN_LEVELS guides.
    let n_skipped = 2 * depth as usize - 1 - MAX_DRAWN_LEVELS;
    assert!(last.starts_with(&format!("[+{n_skipped}] ")), "{last}");
    assert!(last.ends_with("└─ level [completed]"), "{last}");
}

// Property tests.

/// What follows a node in a generated tree, by generated position.
#[derive(Clone, Copy, Debug, PartialEq)]
enum GenNext {
    None,
    Node(usize),
    Group(usize),
}

/// A tree generated for the property tests, and its records in generation order.
#[derive(Clone, Debug)]
struct GenTree {
    records: Vec<TaskStatusRecord>,
    next: Vec<GenNext>,
    /// Group id, members in the expected order, resumed instance.
    groups: Vec<(GroupId, Vec<usize>, Option<usize>)>,
    /// The node each record hangs from (its parent, the group's parent, or the continued node).
    predecessor: Vec<Option<usize>>,
}

/// Grows a tree from operations `(which open end, what to add, group size)`: an open end is a node
/// with nothing after it (it spawns a group or is continued) or a group not resumed yet.
fn generate(ops: &[(u8, u8, u8)]) -> GenTree {
    #[derive(Clone, Copy)]
    enum End {
        Node(usize),
        Group(usize),
    }
    let mut tree = GenTree {
        records: vec![rec(0, "t0")],
        next: vec![GenNext::None],
        groups: Vec::new(),
        predecessor: vec![None],
    };
    let mut ends = vec![End::Node(0)];
    // Two records per millisecond, so that members also tie on time and sort by id.
    let new_record = |tree: &mut GenTree, predecessor: usize| {
        let n = tree.records.len();
        let mut record = rec(n as u128, &format!("t{n}"));
        record.created_at_ms = T0 + n as u64 / 2;
        tree.records.push(record);
        tree.next.push(GenNext::None);
        tree.predecessor.push(Some(predecessor));
        n
    };
    for &(which, what, size) in ops {
        if ends.is_empty() {
            break;
        }
        let end = ends.swap_remove(usize::from(which) % ends.len());
        match end {
            End::Node(node) if what % 3 == 0 => {
                let continuation = new_record(&mut tree, node);
                tree.records[continuation].continues_task_instance_id = Some(id(node as u128));
                tree.next[node] = GenNext::Node(continuation);
                ends.push(End::Node(continuation));
            }
            End::Node(node) => {
                let group = tree.groups.len();
                let group_id = gid(group as u128);
                let mut members: Vec<usize> = (0..=size % 4)
                    .map(|_| {
                        let member = new_record(&mut tree, node);
                        let record = &mut tree.records[member];
                        record.parent_task_instance_id = Some(id(node as u128));
                        record.subtask_group_id = Some(group_id);
                        member
                    })
                    .collect();
                members.sort_by_key(|&m| {
                    let record = &tree.records[m];
                    (record.created_at_ms, record.task_instance_id)
                });
                ends.extend(members.iter().map(|&m| End::Node(m)));
                tree.groups.push((group_id, members, None));
                tree.next[node] = GenNext::Group(group);
                ends.push(End::Group(group));
            }
            End::Group(group) => {
                let parent = tree
                    .next
                    .iter()
                    .position(|&next| next == GenNext::Group(group))
                    .expect("every group has a parent");
                let resumed = new_record(&mut tree, parent);
                let task_id = tree.records[parent].task_id.clone();
                let record = &mut tree.records[resumed];
                record.resumed_after_subtasks_group_id = Some(tree.groups[group].0);
                record.task_id = task_id;
                tree.groups[group].2 = Some(resumed);
                ends.push(End::Node(resumed));
            }
        }
    }
    tree
}

/// Checks that `graph` has exactly the shape of `tree`, walking both side by side.
fn assert_same_shape(graph: &ExecutionGraph, tree: &GenTree) {
    assert_eq!(graph.n_nodes(), tree.records.len());
    assert_eq!(graph.n_groups(), tree.groups.len());
    let mut pairs = vec![(0usize, graph.root())];
    let mut n_visited = 0;
    while let Some((gen_node, node)) = pairs.pop() {
        n_visited += 1;
        let node = graph.node(node);
        assert_eq!(node.record, &tree.records[gen_node]);
        match (tree.next[gen_node], node.next) {
            (GenNext::None, Next::None) => {}
            (GenNext::Node(gen_next), Next::Node(next)) => pairs.push((gen_next, next)),
            (GenNext::Group(gen_group), Next::Group(group)) => {
                let (group_id, gen_members, gen_resumed) = &tree.groups[gen_group];
                let group = graph.group(group);
                assert_eq!(group.group_id, *group_id);
                assert_eq!(group.parent, node.idx);
                assert_eq!(group.nodes.len(), gen_members.len());
                pairs.extend(gen_members.iter().copied().zip(group.nodes.iter().copied()));
                match (gen_resumed, group.next) {
                    (None, None) => {}
                    (Some(gen_resumed), Some(resumed)) => pairs.push((*gen_resumed, resumed)),
                    (expected, found) => panic!("group next: {expected:?} vs {found:?}"),
                }
            }
            (expected, found) => panic!("node next: {expected:?} vs {found:?}"),
        }
    }
    assert_eq!(n_visited, tree.records.len());
}

/// Shuffles with a seeded xorshift: the test stays reproducible from proptest's seed.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    seed |= 1;
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

fn ops() -> impl Strategy<Value = Vec<(u8, u8, u8)>> {
    prop::collection::vec(any::<(u8, u8, u8)>(), 0..80)
}

proptest! {
    #[test]
    fn a_generated_tree_is_rebuilt_from_shuffled_records(ops in ops(), seed in any::<u64>()) {
        let tree = generate(&ops);
        let mut records = tree.records.clone();
        shuffle(&mut records, seed);
        let graph = build_ok(records);
        assert_same_shape(&graph, &tree);
        // The text form has a line per node and per group.
        prop_assert_eq!(
            graph.render_text().lines().count(),
            tree.records.len() + tree.groups.len()
        );
        let json = graph.to_nested_json().expect("records serialize");
        prop_assert!(serde_json::from_str::<serde_json::Value>(&json).is_ok());
    }

    #[test]
    fn removing_a_records_predecessor_is_an_error(
        ops in ops(),
        pick in any::<usize>(),
        seed in any::<u64>(),
    ) {
        let tree = generate(&ops);
        prop_assume!(tree.records.len() > 1);
        let victim = 1 + pick % (tree.records.len() - 1);
        let predecessor = tree.predecessor[victim].expect("only the root has no predecessor");
        let mut records = tree.records.clone();
        records.remove(predecessor);
        shuffle(&mut records, seed);
        prop_assert!(build(records).is_err());
    }

    #[test]
    fn unlinking_a_record_is_an_error(ops in ops(), pick in any::<usize>(), how in 0u8..3) {
        let tree = generate(&ops);
        prop_assume!(tree.records.len() > 1);
        let victim = 1 + pick % (tree.records.len() - 1);
        let mut records = tree.records.clone();
        let record = &mut records[victim];
        match how {
            // Links gone but a member keeps its group id: a group without parent, or a second
            // root.
            0 => {
                record.parent_task_instance_id = None;
                record.resumed_after_subtasks_group_id = None;
                record.continues_task_instance_id = None;
            }
            // Every link gone: a second root.
            1 => {
                record.parent_task_instance_id = None;
                record.subtask_group_id = None;
                record.resumed_after_subtasks_group_id = None;
                record.continues_task_instance_id = None;
            }
            // Pointing at itself: a cycle, or a record with several links.
            _ => record.continues_task_instance_id = Some(record.task_instance_id),
        }
        prop_assert!(build(records).is_err());
    }

    #[test]
    fn random_links_never_panic(
        ops in ops(),
        edits in prop::collection::vec(any::<(usize, u8, usize)>(), 1..6),
    ) {
        let tree = generate(&ops);
        let mut records = tree.records.clone();
        let n_records = records.len();
        for (target, field, source) in edits {
            let source_id = records[source % n_records].task_instance_id;
            let source_group = records[source % n_records].subtask_group_id;
            let record = &mut records[target % n_records];
            match field % 5 {
                0 => record.parent_task_instance_id = Some(source_id),
                1 => record.subtask_group_id = source_group,
                2 => record.resumed_after_subtasks_group_id = source_group,
                3 => record.continues_task_instance_id = Some(source_id),
                _ => record.task_instance_id = source_id,
            }
        }
        if let Ok(graph) = build(records) {
            prop_assert_eq!(graph.n_nodes(), n_records);
            prop_assert_eq!(graph.render_text().lines().count(), n_records + graph.n_groups());
        }
    }
}
