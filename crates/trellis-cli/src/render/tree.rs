//! `trellis tree`: the flat `ExecutionGraph` of `GetExecutionGraph` drawn as an indented tree,
//! and its flat JSON form.
//!
//! The drawing is `trellis_core::graph`'s text form with details
//! ([`ExecutionGraph::render_text_detailed`](trellis_core::graph::ExecutionGraph::render_text_detailed)):
//! a node's chain (its group, the parent resumed after it, its continuations, and so on) hangs
//! under the node, so a long chain stays at one indentation level and only groups indent their
//! members:
//!
//! ```text
//! build [completed] attempt 1
//! ├─ group 0190a5c4-… (3 subtasks, all_settled)
//! │  ├─ compile [completed] attempt 1
//! │  ├─ ask [waiting_for_human] attempt 1
//! │  │  └─ continued: ask [completed] attempt 1
//! │  └─ lint [failed] attempt 2: exit status 1
//! └─ resumed: build [completed] attempt 1
//! ```
//!
//! The graph comes off the wire, so it is not drawn from its indices: its records are read back
//! and the tree rebuilt from their links by `trellis_core::graph::build`, the builder the
//! coordinator used, which checks them (one root, every link resolved, no cycle). Building and
//! drawing use explicit stacks, so a graph 100,000 levels deep draws without recursion; past
//! `trellis_core::graph::MAX_DRAWN_LEVELS` levels a line shows `[+N]` for the N outer levels it
//! does not draw, so the output grows linearly with the depth.

use std::collections::HashMap;

use serde_json::{Value, json};
use trellis_core::ids::GroupId;
use trellis_proto::v1::graph_node::Next;
use trellis_proto::v1::{CheckLevel, CheckResult, ExecutionGraph, SkippedTask};
use trellis_wire::read::graph_records_from_proto;

use super::task_state_name;

/// Longest error text shown after a failed node.
const MAX_ERROR_CHARS: usize = 80;

/// Draws `graph` as an indented tree. `rules` names the completion rule of each group id where it
/// is known (the graph itself does not carry it).
///
/// # Errors
///
/// A message naming the problem when the graph is malformed: a record that does not convert, or
/// records that do not form one tree.
pub fn render(graph: &ExecutionGraph, rules: &HashMap<String, String>) -> Result<String, String> {
    let records =
        graph_records_from_proto(graph).map_err(|err| format!("malformed graph: {err}"))?;
    let tree =
        trellis_core::graph::build(records).map_err(|err| format!("malformed graph: {err}"))?;
    // Rules are keyed by the group ids of the event log, which are the graph's; one that does not
    // parse names no group of the graph.
    let rules: HashMap<GroupId, &str> = rules
        .iter()
        .filter_map(|(group_id, rule)| Some((group_id.parse().ok()?, rule.as_str())))
        .collect();
    Ok(tree.render_text_detailed(MAX_ERROR_CHARS, |group_id| rules.get(&group_id).copied()))
}

/// Returns check results as JSON: `[{name, level, passed, duration_ms, output}]`.
fn checks_json(results: &[CheckResult]) -> Value {
    results
        .iter()
        .map(|result| {
            json!({
                "name": result.name,
                "level": CheckLevel::label_of(result.level),
                "passed": result.passed,
                "duration_ms": result.duration_ms,
                "output": result.output,
            })
        })
        .collect()
}

/// Lists the plan tasks a route skipped (they have no instance in the tree), each with why; empty
/// when there are none.
pub fn skipped_text(skipped: &[SkippedTask]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let mut text = String::from("not run (routed out):\n");
    for task in skipped {
        text.push_str(&format!("  {}: {}\n", task.task_id, task.reason));
    }
    text
}

/// Returns the graph as flat JSON (`roots`, `nodes`, `groups` pointing at each other by index, as
/// on the wire), which any JSON parser reads back whatever the depth, and the plan tasks a route
/// skipped (`skipped`: `[{task_id, reason}]`).
pub fn json(
    graph: &ExecutionGraph,
    rules: &HashMap<String, String>,
    skipped: &[SkippedTask],
) -> Value {
    let nodes: Vec<Value> = graph
        .nodes
        .iter()
        .map(|node| {
            let record = node.record.clone().unwrap_or_default();
            json!({
                "task_instance_id": record.task_instance_id,
                "task_id": record.task_id,
                "state": task_state_name(record.state),
                "attempt": record.attempt,
                "run_number": record.run_number,
                "worker_id": record.worker_id,
                "created_at_unix_ms": record.created_at_unix_ms,
                "dispatched_at_unix_ms": record.dispatched_at_unix_ms,
                "started_at_unix_ms": record.started_at_unix_ms,
                "ended_at_unix_ms": record.ended_at_unix_ms,
                "earlier_attempts": record.earlier_attempts.iter().map(|attempt| json!({
                    "attempt": attempt.attempt,
                    "worker_id": attempt.worker_id,
                    "dispatched_at_unix_ms": attempt.dispatched_at_unix_ms,
                    "started_at_unix_ms": attempt.started_at_unix_ms,
                    "ended_at_unix_ms": attempt.ended_at_unix_ms,
                    "error": attempt.error,
                    "validation": checks_json(&attempt.validation),
                })).collect::<Vec<_>>(),
                "validation": checks_json(&record.validation),
                "parent_task_instance_id": record.parent_task_instance_id,
                "subtask_group_id": record.subtask_group_id,
                "resumed_after_subtasks_group_id": record.resumed_after_subtasks_group_id,
                "continues_task_instance_id": record.continues_task_instance_id,
                "error": record.error,
                "next_group": match node.next { Some(Next::GroupIndex(i)) => json!(i), _ => Value::Null },
                "next_node": match node.next { Some(Next::NodeIndex(i)) => json!(i), _ => Value::Null },
            })
        })
        .collect();
    let groups: Vec<Value> = graph
        .groups
        .iter()
        .map(|group| {
            json!({
                "group_id": group.group_id,
                "rule": rules.get(&group.group_id),
                "nodes": group.node_indices,
                "next_node": group.next_node_index,
            })
        })
        .collect();
    let skipped: Vec<Value> = skipped
        .iter()
        .map(|task| json!({ "task_id": task.task_id, "reason": task.reason }))
        .collect();
    json!({"roots": graph.root_indices, "nodes": nodes, "groups": groups, "skipped": skipped})
}

#[cfg(test)]
mod tests {
    use trellis_core::graph::{self, MAX_DRAWN_LEVELS};
    use trellis_core::ids::{ExecutionId, TaskInstanceId, WorkerId};
    use trellis_core::record::{AttemptRecord, TaskState, TaskStatusRecord};
    use trellis_proto::v1::GraphNode;
    use trellis_wire::read::graph_to_proto;

    use super::*;

    const T0: u64 = 1_700_000_000_000;

    /// The UUIDv7 layout overwrites some low bits of a `derived` seed, so numbers are shifted
    /// clear of them.
    fn id(n: u64) -> TaskInstanceId {
        TaskInstanceId::derived(T0, u128::from(n) << 24)
    }

    fn gid(n: u64) -> GroupId {
        GroupId::derived(T0, u128::from(n) << 24)
    }

    /// Instance `n` of `task_id`, created at `T0 + n` ms: a root unless linked.
    fn record(n: u64, task_id: &str, state: TaskState, attempt: u32) -> TaskStatusRecord {
        TaskStatusRecord {
            task_instance_id: id(n),
            task_id: task_id.to_owned(),
            parent_task_instance_id: None,
            subtask_group_id: None,
            resumed_after_subtasks_group_id: None,
            continues_task_instance_id: None,
            correlation_id: ExecutionId::derived(T0, 7),
            run_number: 1,
            attempt,
            state,
            worker_id: None,
            created_at_ms: T0 + n,
            dispatched_at_ms: None,
            started_at_ms: None,
            ended_at_ms: None,
            output: None,
            error: None,
            earlier_attempts: Vec::new(),
            validation: Vec::new(),
        }
    }

    fn member(record: TaskStatusRecord, parent: u64, group: u64) -> TaskStatusRecord {
        TaskStatusRecord {
            parent_task_instance_id: Some(id(parent)),
            subtask_group_id: Some(gid(group)),
            ..record
        }
    }

    /// The wire graph the coordinator sends for `records`.
    fn wire(records: Vec<TaskStatusRecord>) -> ExecutionGraph {
        graph_to_proto(&graph::build(records).expect("the records form a tree"))
    }

    /// Checks the drawing, with the group ids of [`gid`] written `G<n>`.
    fn check(graph: &ExecutionGraph, rules: &[(u64, &str)], expected: &str) {
        let rules = rules
            .iter()
            .map(|(g, r)| (gid(*g).to_string(), (*r).to_owned()))
            .collect();
        let mut text = render(graph, &rules).expect("valid graph");
        for n in 0..10 {
            text = text.replace(&gid(n).to_string(), &format!("g{n}"));
        }
        assert_eq!(text, expected);
    }

    #[test]
    fn group_and_resumed_parent() {
        let failed = TaskStatusRecord {
            error: Some("exit status 1\nstack trace".to_owned()),
            ..member(record(4, "lint", TaskState::Failed, 2), 1, 1)
        };
        let continued = TaskStatusRecord {
            continues_task_instance_id: Some(id(3)),
            ..record(5, "ask", TaskState::Completed, 1)
        };
        let resumed = TaskStatusRecord {
            resumed_after_subtasks_group_id: Some(gid(1)),
            ..record(6, "build", TaskState::Completed, 1)
        };
        let graph = wire(vec![
            record(1, "build", TaskState::WaitingForSubtasks, 1),
            member(record(2, "compile", TaskState::Completed, 1), 1, 1),
            member(record(3, "ask", TaskState::WaitingForHuman, 1), 1, 1),
            failed,
            resumed,
            continued,
        ]);
        check(
            &graph,
            &[(1, "all_settled")],
            "build [waiting_for_subtasks] attempt 1\n\
             ├─ group g1 (3 subtasks, all_settled)\n\
             │  ├─ compile [completed] attempt 1\n\
             │  ├─ ask [waiting_for_human] attempt 1\n\
             │  │  └─ continued: ask [completed] attempt 1\n\
             │  └─ lint [failed] attempt 2: exit status 1…\n\
             └─ resumed: build [completed] attempt 1\n",
        );
        let object = json(&graph, &HashMap::new(), &[]);
        assert_eq!(object["groups"][0]["next_node"], 5);
        assert_eq!(object["nodes"][0]["next_group"], 0);
        assert_eq!(object["nodes"][2]["next_node"], 3);
        assert_eq!(object["roots"], json!([0]));
    }

    /// Routed-out plan tasks have no instance: they are listed after the tree with why, and under
    /// `skipped` in the JSON.
    #[test]
    fn routed_out_tasks_are_listed_with_their_reason() {
        assert_eq!(skipped_text(&[]), "", "nothing routed out: nothing printed");
        let skipped = [
            SkippedTask {
                task_id: "fix".to_owned(),
                reason: r#"not routed: route of "classify" chose by output /kind = "feature""#
                    .to_owned(),
            },
            SkippedTask {
                task_id: "ask".to_owned(),
                reason: "not routed".to_owned(),
            },
        ];
        assert_eq!(
            skipped_text(&skipped),
            "not run (routed out):\n  fix: not routed: route of \"classify\" chose by output \
             /kind = \"feature\"\n  ask: not routed\n"
        );
        let object = json(&ExecutionGraph::default(), &HashMap::new(), &skipped);
        assert_eq!(
            object["skipped"][1],
            json!({"task_id": "ask", "reason": "not routed"})
        );
        assert_eq!(object["skipped"].as_array().map(Vec::len), Some(2));
    }

    /// `--json` records carry the instance's worker, times (unset ones as null) and earlier
    /// attempts.
    #[test]
    fn json_records_carry_their_times() {
        let ended = TaskStatusRecord {
            worker_id: Some(WorkerId("w-2".to_owned())),
            dispatched_at_ms: Some(T0 + 8),
            started_at_ms: Some(T0 + 10),
            ended_at_ms: Some(T0 + 25),
            earlier_attempts: vec![AttemptRecord {
                attempt: 1,
                worker_id: Some(WorkerId("w-1".to_owned())),
                dispatched_at_ms: Some(T0 + 2),
                started_at_ms: Some(T0 + 3),
                ended_at_ms: T0 + 5,
                error: "exit status 1".to_owned(),
                validation: Vec::new(),
            }],
            ..record(1, "build", TaskState::Completed, 2)
        };
        let queued = member(record(2, "test", TaskState::Pending, 0), 1, 1);
        let object = json(&wire(vec![ended, queued]), &HashMap::new(), &[]);
        let times = |task_id: &str| {
            let nodes = object["nodes"].as_array().expect("nodes");
            let node = nodes
                .iter()
                .find(|node| node["task_id"] == task_id)
                .expect("the node is there");
            (
                node["created_at_unix_ms"].clone(),
                node["dispatched_at_unix_ms"].clone(),
                node["started_at_unix_ms"].clone(),
                node["ended_at_unix_ms"].clone(),
                node["worker_id"].clone(),
                node["earlier_attempts"].clone(),
            )
        };
        assert_eq!(
            times("build"),
            (
                json!(T0 + 1),
                json!(T0 + 8),
                json!(T0 + 10),
                json!(T0 + 25),
                json!("w-2"),
                json!([{
                    "attempt": 1,
                    "worker_id": "w-1",
                    "dispatched_at_unix_ms": T0 + 2,
                    "started_at_unix_ms": T0 + 3,
                    "ended_at_unix_ms": T0 + 5,
                    "error": "exit status 1",
                    "validation": [],
                }]),
            )
        );
        assert_eq!(
            times("test"),
            (
                json!(T0 + 2),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                json!([])
            )
        );
    }

    #[test]
    fn unsettled_group_without_rule() {
        let graph = wire(vec![
            record(1, "fan", TaskState::WaitingForSubtasks, 1),
            member(record(2, "noop", TaskState::Running, 1), 1, 1),
        ]);
        check(
            &graph,
            &[],
            "fan [waiting_for_subtasks] attempt 1\n\
             └─ group g1 (1 subtask)\n   \
                └─ noop [running] attempt 1\n",
        );
    }

    /// Each member spawns a group of one, 100,000 times over: the deepest nesting there is.
    #[test]
    fn hundred_thousand_nested_groups_do_not_overflow() {
        const DEPTH: u64 = 100_000;
        let mut records = vec![record(0, "t", TaskState::Completed, 1)];
        records.extend(
            (1..DEPTH).map(|n| member(record(n, "t", TaskState::Completed, 1), n - 1, n - 1)),
        );
        let text = render(&wire(records), &HashMap::new()).expect("valid graph");
        assert_eq!(text.lines().count(), 2 * DEPTH as usize - 1);
        let last_line = text.lines().last().expect("lines");
        assert!(last_line.starts_with("[+"), "{last_line}");
        assert!(
            last_line.ends_with("t [completed] attempt 1"),
            "{last_line}"
        );
        // Indentation is capped, so the output grows linearly with the depth: no line is longer
        // than the drawn levels plus the `[+N]` marker and the group or node.
        let longest = text.lines().map(str::len).max().unwrap_or(0);
        assert!(longest < MAX_DRAWN_LEVELS * 5 + 80, "{longest} bytes");
    }

    /// A chain of 100,000 continuations stays at one level.
    #[test]
    fn hundred_thousand_long_chain_stays_flat() {
        const LEN: u64 = 100_000;
        let mut records = vec![record(0, "step", TaskState::Completed, 1)];
        records.extend((1..LEN).map(|n| TaskStatusRecord {
            continues_task_instance_id: Some(id(n - 1)),
            ..record(n, "step", TaskState::Completed, 1)
        }));
        let text = render(&wire(records), &HashMap::new()).expect("valid graph");
        assert_eq!(text.lines().count(), LEN as usize);
        // Every continuation hangs directly under the first instance.
        assert!(
            text.lines().skip(1).all(|line| line
                .ends_with("─ continued: step [completed] attempt 1")
                && line.chars().count() == 40),
            "{}",
            text.lines().nth(1).unwrap_or_default()
        );
    }

    #[test]
    fn malformed_graphs_are_errors() {
        // Two records linked to each other: no root.
        let mut cycle = wire(vec![record(1, "a", TaskState::Completed, 1)]);
        let mut b = cycle.nodes[0].clone();
        if let (Some(a), Some(b)) = (cycle.nodes[0].record.as_mut(), b.record.as_mut()) {
            b.task_instance_id = id(2).to_string();
            a.continues_task_instance_id = Some(b.task_instance_id.clone());
            b.continues_task_instance_id = Some(a.task_instance_id.clone());
        }
        cycle.nodes.push(b);
        let err = render(&cycle, &HashMap::new()).expect_err("cycle");
        assert!(err.starts_with("malformed graph: no root"), "{err}");
        // Two unrelated records: two roots.
        let mut two_roots = wire(vec![record(1, "a", TaskState::Completed, 1)]);
        two_roots
            .nodes
            .extend(wire(vec![record(2, "b", TaskState::Completed, 1)]).nodes);
        let err = render(&two_roots, &HashMap::new()).expect_err("two roots");
        assert!(err.starts_with("malformed graph: two roots"), "{err}");
        // A node without its record.
        let missing = ExecutionGraph {
            nodes: vec![GraphNode::default()],
            groups: vec![],
            root_indices: vec![0],
        };
        let err = render(&missing, &HashMap::new()).expect_err("no record");
        assert!(err.starts_with("malformed graph: "), "{err}");
        assert!(err.contains("nodes[0].record"), "{err}");
    }
}
