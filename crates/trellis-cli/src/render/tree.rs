//! `trellis tree`: the flat `ExecutionGraph` of `GetExecutionGraph` drawn as an indented tree,
//! and its flat JSON form.
//!
//! The drawing follows `trellis_core::graph`'s text form: a node's chain (its group, the parent
//! resumed after it, its continuations, and so on) hangs under the node, so a long chain stays at
//! one indentation level and only groups indent their members:
//!
//! ```text
//! build [completed] attempt 1
//! ├─ group g1 (3 subtasks, all_settled)
//! │  ├─ compile [completed] attempt 1
//! │  ├─ ask [waiting_for_human] attempt 1
//! │  │  └─ continued: ask [completed] attempt 1
//! │  └─ lint [failed] attempt 2: exit status 1
//! └─ resumed: build [completed] attempt 1
//! ```
//!
//! The walk uses an explicit stack, so a graph 100,000 levels deep draws without recursion; past
//! [`MAX_DRAWN_LEVELS`] levels a line shows `[+N]` for the N outer levels it does not draw, so the
//! output grows linearly with the depth. The graph comes off the wire, so every index is checked
//! and a node reached twice (a cycle or a shared node) is an error, not an endless loop.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{Value, json};
use trellis_proto::v1::graph_node::Next;
use trellis_proto::v1::{ExecutionGraph, GraphGroup, GraphNode};

use super::{one_line, task_state_name};

/// The deepest indentation drawn in full.
pub const MAX_DRAWN_LEVELS: usize = 32;

/// Longest error text shown after a failed node.
const MAX_ERROR_CHARS: usize = 80;

/// One line still to draw.
#[derive(Clone, Copy, Debug)]
enum Line {
    /// A node that starts a chain (a root or a group member); its chain hangs under it.
    Head(usize),
    /// A node inside a chain, drawn alone: its successors are its siblings.
    Chained(usize),
    /// A group; its members hang under it.
    Group(usize),
}

/// Draws `graph` as an indented tree. `rules` names the completion rule of each group id where it
/// is known (the graph itself does not carry it).
///
/// # Errors
///
/// A message naming the problem when the graph is malformed: an index out of range, or a node or
/// group reached twice.
pub fn render(graph: &ExecutionGraph, rules: &HashMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut drawn_nodes = vec![false; graph.nodes.len()];
    let mut drawn_groups = vec![false; graph.groups.len()];
    // `guides[k]` says whether the line drawn at depth `k + 1` on the current path has siblings
    // still to come, which decides between "│  " and "   " under it.
    let mut guides: Vec<bool> = Vec::new();
    let mut stack: Vec<(Line, usize, bool)> = Vec::new();
    for &root in graph.root_indices.iter().rev() {
        stack.push((Line::Head(node_index(graph, root)?), 0, true));
    }
    let mut children: Vec<Line> = Vec::new();
    while let Some((line, depth, last)) = stack.pop() {
        if depth > 0 {
            guides.truncate(depth - 1);
            let n_skipped = guides.len().saturating_sub(MAX_DRAWN_LEVELS);
            if n_skipped > 0 {
                let _ = write!(out, "[+{n_skipped}] ");
            }
            for &more in &guides[n_skipped..] {
                out.push_str(if more { "│  " } else { "   " });
            }
            out.push_str(if last { "└─ " } else { "├─ " });
            guides.push(!last);
        }
        children.clear();
        match line {
            Line::Head(node_idx) | Line::Chained(node_idx) => {
                if std::mem::replace(&mut drawn_nodes[node_idx], true) {
                    return Err(format!("malformed graph: node {node_idx} is reached twice"));
                }
                write_node(&mut out, &graph.nodes[node_idx]);
                if matches!(line, Line::Head(_)) {
                    chain_after(graph, node_idx, &mut children)?;
                }
            }
            Line::Group(group_idx) => {
                if std::mem::replace(&mut drawn_groups[group_idx], true) {
                    return Err(format!(
                        "malformed graph: group {group_idx} is reached twice"
                    ));
                }
                let group = &graph.groups[group_idx];
                write_group(&mut out, group, rules.get(&group.group_id));
                for &member in &group.node_indices {
                    children.push(Line::Head(node_index(graph, member)?));
                }
            }
        }
        out.push('\n');
        let n_children = children.len();
        stack.extend(
            children
                .iter()
                .enumerate()
                .rev()
                .map(|(i, &child)| (child, depth + 1, i + 1 == n_children)),
        );
    }
    Ok(out)
}

/// Collects what follows `node_idx` along its chain: its group, the resumed instance, what follows
/// that in turn, and so on. A chain longer than the graph has nodes and groups loops, which is an
/// error.
fn chain_after(
    graph: &ExecutionGraph,
    node_idx: usize,
    chain: &mut Vec<Line>,
) -> Result<(), String> {
    let max_len = graph.nodes.len() + graph.groups.len();
    let mut next = graph.nodes[node_idx].next;
    while let Some(step) = next {
        if chain.len() > max_len {
            return Err(format!(
                "malformed graph: the chain after node {node_idx} loops"
            ));
        }
        match step {
            Next::NodeIndex(index) => {
                let node_idx = node_index(graph, index)?;
                chain.push(Line::Chained(node_idx));
                next = graph.nodes[node_idx].next;
            }
            Next::GroupIndex(index) => {
                let group_idx = group_index(graph, index)?;
                chain.push(Line::Group(group_idx));
                let Some(resumed) = graph.groups[group_idx].next_node_index else {
                    return Ok(());
                };
                let resumed_idx = node_index(graph, resumed)?;
                chain.push(Line::Chained(resumed_idx));
                next = graph.nodes[resumed_idx].next;
            }
        }
    }
    Ok(())
}

fn node_index(graph: &ExecutionGraph, index: u32) -> Result<usize, String> {
    let idx = usize::try_from(index).unwrap_or(usize::MAX);
    if idx < graph.nodes.len() {
        Ok(idx)
    } else {
        Err(format!(
            "malformed graph: node index {index} out of range ({} nodes)",
            graph.nodes.len()
        ))
    }
}

fn group_index(graph: &ExecutionGraph, index: u32) -> Result<usize, String> {
    let idx = usize::try_from(index).unwrap_or(usize::MAX);
    if idx < graph.groups.len() {
        Ok(idx)
    } else {
        Err(format!(
            "malformed graph: group index {index} out of range ({} groups)",
            graph.groups.len()
        ))
    }
}

/// Writes `task_id [state] attempt n`, prefixed with `resumed: ` or `continued: ` as the instance
/// is, and followed by the error of a failed instance.
fn write_node(out: &mut String, node: &GraphNode) {
    let record = node.record.clone().unwrap_or_default();
    if record.resumed_after_subtasks_group_id.is_some() {
        out.push_str("resumed: ");
    } else if record.continues_task_instance_id.is_some() {
        out.push_str("continued: ");
    }
    let _ = write!(
        out,
        "{} [{}] attempt {}",
        record.task_id,
        task_state_name(record.state),
        record.attempt
    );
    if let Some(error) = record.error.as_deref().filter(|e| !e.is_empty()) {
        let _ = write!(out, ": {}", one_line(error, MAX_ERROR_CHARS));
    }
}

/// Writes `group <id> (k subtasks, rule)`.
fn write_group(out: &mut String, group: &GraphGroup, rule: Option<&String>) {
    let n_members = group.node_indices.len();
    let noun = if n_members == 1 {
        "subtask"
    } else {
        "subtasks"
    };
    let _ = write!(out, "group {} ({n_members} {noun}", group.group_id);
    if let Some(rule) = rule {
        let _ = write!(out, ", {rule}");
    }
    out.push(')');
}

/// Returns the graph as flat JSON (`roots`, `nodes`, `groups` pointing at each other by index, as
/// on the wire), which any JSON parser reads back whatever the depth.
pub fn json(graph: &ExecutionGraph, rules: &HashMap<String, String>) -> Value {
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
    json!({"roots": graph.root_indices, "nodes": nodes, "groups": groups})
}

#[cfg(test)]
mod tests {
    use trellis_proto::v1::{TaskInstance, TaskState};

    use super::*;

    fn node(task_id: &str, state: TaskState, attempt: u32, next: Option<Next>) -> GraphNode {
        GraphNode {
            record: Some(TaskInstance {
                task_id: task_id.to_owned(),
                state: state as i32,
                attempt,
                ..TaskInstance::default()
            }),
            next,
        }
    }

    fn resumed(mut node: GraphNode, group_id: &str) -> GraphNode {
        if let Some(record) = node.record.as_mut() {
            record.resumed_after_subtasks_group_id = Some(group_id.to_owned());
        }
        node
    }

    fn check(graph: &ExecutionGraph, rules: &[(&str, &str)], expected: &str) {
        let rules = rules
            .iter()
            .map(|(g, r)| ((*g).to_owned(), (*r).to_owned()))
            .collect();
        assert_eq!(render(graph, &rules).expect("valid graph"), expected);
    }

    #[test]
    fn group_and_resumed_parent() {
        let mut failed = node("lint", TaskState::Failed, 2, None);
        if let Some(record) = failed.record.as_mut() {
            record.error = Some("exit status 1\nstack trace".to_owned());
        }
        let ask = node(
            "ask",
            TaskState::WaitingForHuman,
            1,
            Some(Next::NodeIndex(5)),
        );
        let mut continued = node("ask", TaskState::Completed, 1, None);
        if let Some(record) = continued.record.as_mut() {
            record.continues_task_instance_id = Some("i-ask".to_owned());
        }
        let graph = ExecutionGraph {
            nodes: vec![
                node(
                    "build",
                    TaskState::WaitingForSubtasks,
                    1,
                    Some(Next::GroupIndex(0)),
                ),
                node("compile", TaskState::Completed, 1, None),
                ask,
                failed,
                resumed(node("build", TaskState::Completed, 1, None), "g1"),
                continued,
                node("docs", TaskState::Pending, 0, None),
            ],
            groups: vec![GraphGroup {
                group_id: "g1".to_owned(),
                node_indices: vec![1, 2, 3],
                next_node_index: Some(4),
            }],
            root_indices: vec![0, 6],
        };
        check(
            &graph,
            &[("g1", "all_settled")],
            "build [waiting_for_subtasks] attempt 1\n\
             ├─ group g1 (3 subtasks, all_settled)\n\
             │  ├─ compile [completed] attempt 1\n\
             │  ├─ ask [waiting_for_human] attempt 1\n\
             │  │  └─ continued: ask [completed] attempt 1\n\
             │  └─ lint [failed] attempt 2: exit status 1…\n\
             └─ resumed: build [completed] attempt 1\n\
             docs [pending] attempt 0\n",
        );
        let object = json(&graph, &HashMap::new());
        assert_eq!(object["groups"][0]["next_node"], 4);
        assert_eq!(object["nodes"][0]["next_group"], 0);
        assert_eq!(object["roots"], json!([0, 6]));
    }

    #[test]
    fn unsettled_group_without_rule() {
        let graph = ExecutionGraph {
            nodes: vec![
                node(
                    "fan",
                    TaskState::WaitingForSubtasks,
                    1,
                    Some(Next::GroupIndex(0)),
                ),
                node("noop", TaskState::Running, 1, None),
            ],
            groups: vec![GraphGroup {
                group_id: "g".to_owned(),
                node_indices: vec![1],
                next_node_index: None,
            }],
            root_indices: vec![0],
        };
        check(
            &graph,
            &[],
            "fan [waiting_for_subtasks] attempt 1\n\
             └─ group g (1 subtask)\n   \
                └─ noop [running] attempt 1\n",
        );
    }

    /// Each member spawns a group of one, 100,000 times over: the deepest nesting there is.
    #[test]
    fn hundred_thousand_nested_groups_do_not_overflow() {
        const DEPTH: usize = 100_000;
        let mut graph = ExecutionGraph::default();
        for idx in 0..DEPTH {
            let last = idx + 1 == DEPTH;
            let next = (!last).then(|| Next::GroupIndex(u32::try_from(idx).expect("fits")));
            graph.nodes.push(node("t", TaskState::Completed, 1, next));
            if !last {
                graph.groups.push(GraphGroup {
                    group_id: format!("g{idx}"),
                    node_indices: vec![u32::try_from(idx + 1).expect("fits")],
                    next_node_index: None,
                });
            }
        }
        graph.root_indices.push(0);
        let text = render(&graph, &HashMap::new()).expect("valid graph");
        assert_eq!(text.lines().count(), 2 * DEPTH - 1);
        let last_line = text.lines().last().expect("lines");
        assert!(last_line.starts_with("[+"), "{last_line}");
        assert!(
            last_line.ends_with("t [completed] attempt 1"),
            "{last_line}"
        );
        // Indentation is capped, so the output grows linearly with the depth: no line is longer
        // than the drawn levels plus the `[+N]` marker and the node.
        let longest = text.lines().map(str::len).max().unwrap_or(0);
        assert!(longest < MAX_DRAWN_LEVELS * 5 + 60, "{longest} bytes");
    }

    /// A chain of 100,000 continuations stays at one level.
    #[test]
    fn hundred_thousand_long_chain_stays_flat() {
        const LEN: usize = 100_000;
        let mut graph = ExecutionGraph::default();
        for idx in 0..LEN {
            let next =
                (idx + 1 < LEN).then(|| Next::NodeIndex(u32::try_from(idx + 1).expect("fits")));
            graph
                .nodes
                .push(node("step", TaskState::Completed, 1, next));
        }
        graph.root_indices.push(0);
        let text = render(&graph, &HashMap::new()).expect("valid graph");
        assert_eq!(text.lines().count(), LEN);
        assert!(text.lines().skip(1).all(|line| line.len() < 40));
    }

    #[test]
    fn malformed_graphs_are_errors() {
        let cycle = ExecutionGraph {
            nodes: vec![
                node("a", TaskState::Completed, 1, Some(Next::NodeIndex(1))),
                node("b", TaskState::Completed, 1, Some(Next::NodeIndex(0))),
            ],
            groups: vec![],
            root_indices: vec![0],
        };
        let err = render(&cycle, &HashMap::new()).expect_err("cycle");
        assert!(err.contains("malformed graph"), "{err}");
        let out_of_range = ExecutionGraph {
            nodes: vec![node(
                "a",
                TaskState::Completed,
                1,
                Some(Next::GroupIndex(3)),
            )],
            groups: vec![],
            root_indices: vec![0],
        };
        assert_eq!(
            render(&out_of_range, &HashMap::new()).expect_err("bad index"),
            "malformed graph: group index 3 out of range (0 groups)"
        );
        assert_eq!(
            render(&ExecutionGraph::default(), &HashMap::new()),
            Ok(String::new())
        );
    }
}
