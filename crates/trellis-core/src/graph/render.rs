//! Text and nested JSON forms of an [`ExecutionGraph`], both written with an explicit stack so that
//! a graph of any depth renders without recursion.
//!
//! The text form draws a node's chain (its group, the resumed instance, its continuations, and so
//! on) as the children of the node, so a long chain stays at one indentation level; only groups
//! indent their members. Deeply nested groups would still make the indentation, and so the output,
//! grow with the square of the depth: past [`MAX_DRAWN_LEVELS`] levels a line shows `[+N]` for the
//! N outer levels it does not draw. [`ExecutionGraph::render_text_detailed`] is the form
//! `trellis tree` prints: the same tree with attempts, errors and completion rules.

use std::fmt::Write as _;

use super::{ExecutionGraph, GroupIdx, Next, NodeIdx};
use crate::ids::GroupId;
use crate::record::TaskStatusRecord;

/// The deepest indentation drawn in full by [`ExecutionGraph::render_text`].
pub const MAX_DRAWN_LEVELS: usize = 32;

/// One line still to draw in [`ExecutionGraph::render_text`].
#[derive(Clone, Copy, Debug)]
enum Line {
    /// A node that starts a chain (the root or a group member); its chain hangs under it.
    Head(NodeIdx),
    /// A node inside a chain; drawn alone, as its successors are its siblings.
    Chained(NodeIdx),
    /// A group; its members hang under it.
    Group(GroupIdx),
}

/// What [`ExecutionGraph::render_text_detailed`] adds to the lines of
/// [`ExecutionGraph::render_text`].
struct Details<'d, 'r> {
    /// Errors are cut to their first line and to this many characters.
    max_error_chars: usize,
    /// The completion rule of a group, where it is known.
    group_rule: &'d dyn Fn(GroupId) -> Option<&'r str>,
}

/// One piece still to write in [`ExecutionGraph::to_nested_json`].
#[derive(Clone, Copy, Debug)]
enum Piece {
    Node(NodeIdx),
    Group(GroupIdx),
    Text(&'static str),
}

impl ExecutionGraph {
    /// Returns the graph as an indented tree, one instance or group per line:
    ///
    /// ```text
    /// build [completed]
    /// ├─ group 01900000-0000-7000-8000-000000000001 (3 subtasks)
    /// │  ├─ compile [completed]
    /// │  ├─ ask [waiting_for_human]
    /// │  │  └─ continued: ask [completed]
    /// │  └─ lint [failed]
    /// └─ resumed: build [completed]
    /// ```
    pub fn render_text(&self) -> String {
        self.draw(None)
    }

    /// Returns the tree as [`render_text`](Self::render_text) draws it, with what `trellis tree`
    /// shows besides: each instance's attempt, the error of an instance that has one (its first
    /// line, cut to `max_error_chars` characters; `…` marks a cut), and each group's completion
    /// rule where `group_rule` knows it (the records do not carry it):
    ///
    /// ```text
    /// build [completed] attempt 1
    /// ├─ group 01900000-0000-7000-8000-000000000001 (2 subtasks, all_settled)
    /// │  ├─ compile [completed] attempt 1
    /// │  └─ lint [failed] attempt 2: exit status 1
    /// └─ resumed: build [completed] attempt 1
    /// ```
    pub fn render_text_detailed<'r>(
        &self,
        max_error_chars: usize,
        group_rule: impl Fn(GroupId) -> Option<&'r str>,
    ) -> String {
        self.draw(Some(&Details {
            max_error_chars,
            group_rule: &group_rule,
        }))
    }

    /// Draws the tree, with `details` on each line when given.
    fn draw(&self, details: Option<&Details<'_, '_>>) -> String {
        let mut out = String::new();
        // `guides[k]` says whether the line drawn at depth `k + 1` on the current path has siblings
        // still to come, which decides between "│  " and "   " under it.
        let mut guides: Vec<bool> = Vec::new();
        let mut stack: Vec<(Line, usize, bool)> = vec![(Line::Head(self.root()), 0, true)];
        let mut children: Vec<Line> = Vec::new();
        while let Some((line, depth, last)) = stack.pop() {
            if depth > 0 {
                guides.truncate(depth - 1);
                let n_skipped = guides.len().saturating_sub(MAX_DRAWN_LEVELS);
                if n_skipped > 0 {
                    // Infallible: writing to a String cannot fail.
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
                Line::Head(node) => {
                    self.write_node(&mut out, node, details);
                    self.chain_after(node, &mut children);
                }
                Line::Chained(node) => self.write_node(&mut out, node, details),
                Line::Group(group) => {
                    let group = self.group(group);
                    let n_members = group.nodes.len();
                    let noun = if n_members == 1 {
                        "subtask"
                    } else {
                        "subtasks"
                    };
                    let _ = write!(out, "group {} ({n_members} {noun}", group.group_id);
                    if let Some(rule) =
                        details.and_then(|details| (details.group_rule)(group.group_id))
                    {
                        let _ = write!(out, ", {rule}");
                    }
                    out.push(')');
                    children.extend(group.nodes.iter().map(|&member| Line::Head(member)));
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
        out
    }

    /// Collects what follows `node` along its chain: its group, the resumed instance, what follows
    /// that in turn, and so on, up to the end of the chain.
    fn chain_after(&self, node: NodeIdx, chain: &mut Vec<Line>) {
        let mut next = self.node(node).next;
        loop {
            match next {
                Next::None => return,
                Next::Node(node) => {
                    chain.push(Line::Chained(node));
                    next = self.node(node).next;
                }
                Next::Group(group) => {
                    chain.push(Line::Group(group));
                    let Some(resumed) = self.group(group).next else {
                        return;
                    };
                    chain.push(Line::Chained(resumed));
                    next = self.node(resumed).next;
                }
            }
        }
    }

    /// Writes `task_id [state]`, prefixed with `resumed: ` or `continued: ` as the instance is;
    /// with `details`, followed by ` attempt n` and the instance's error.
    fn write_node(&self, out: &mut String, node: NodeIdx, details: Option<&Details<'_, '_>>) {
        let record: &TaskStatusRecord = self.node(node).record;
        if record.resumed_after_subtasks_group_id.is_some() {
            out.push_str("resumed: ");
        } else if record.continues_task_instance_id.is_some() {
            out.push_str("continued: ");
        }
        let _ = write!(out, "{} [{}]", record.task_id, record.state.as_str());
        let Some(details) = details else { return };
        let _ = write!(out, " attempt {}", record.attempt);
        if !record.validation.is_empty() {
            out.push_str(" checks");
            for (k, check) in record.validation.iter().enumerate() {
                let verdict = if check.passed { "passed" } else { "FAILED" };
                let sep = if k == 0 { ":" } else { "," };
                let _ = write!(out, "{sep} {} {verdict}", check.name);
            }
        }
        if let Some(error) = record.error.as_deref().filter(|error| !error.is_empty()) {
            out.push_str(": ");
            push_cut(out, error, details.max_error_chars);
        }
    }

    /// Returns the graph as the nested JSON of seed 000: a node is `{"record": {...}, "next": X}`
    /// where `X` is `null`, a node or a group, and a group is
    /// `{"group_id": "...", "nodes": [node, ...], "next": null | node}`.
    ///
    /// The writer is iterative, so any depth is written; but a parser with a nesting limit
    /// (`serde_json` stops at 128 by default) cannot read a deep tree back. Serialize the graph
    /// itself for the flat form, which has no such limit.
    ///
    /// # Errors
    ///
    /// When a record's `output` cannot be serialized (not the case for a `serde_json::Value`).
    pub fn to_nested_json(&self) -> Result<String, serde_json::Error> {
        let mut out: Vec<u8> = Vec::new();
        let mut stack = vec![Piece::Node(self.root())];
        while let Some(piece) = stack.pop() {
            match piece {
                Piece::Text(text) => out.extend_from_slice(text.as_bytes()),
                Piece::Node(node) => {
                    let node = self.node(node);
                    out.extend_from_slice(br#"{"record":"#);
                    serde_json::to_writer(&mut out, node.record)?;
                    out.extend_from_slice(br#","next":"#);
                    stack.push(Piece::Text("}"));
                    stack.push(match node.next {
                        Next::None => Piece::Text("null"),
                        Next::Node(next) => Piece::Node(next),
                        Next::Group(group) => Piece::Group(group),
                    });
                }
                Piece::Group(group) => {
                    let group = self.group(group);
                    out.extend_from_slice(br#"{"group_id":"#);
                    serde_json::to_writer(&mut out, &group.group_id)?;
                    out.extend_from_slice(br#","nodes":["#);
                    stack.push(Piece::Text("}"));
                    stack.push(group.next.map_or(Piece::Text("null"), Piece::Node));
                    stack.push(Piece::Text(r#"],"next":"#));
                    for (i, &member) in group.nodes.iter().enumerate().rev() {
                        stack.push(Piece::Node(member));
                        if i > 0 {
                            stack.push(Piece::Text(","));
                        }
                    }
                }
            }
        }
        // serde_json writes UTF-8 and so do the literals above; the error path is never taken.
        String::from_utf8(out).map_err(serde::ser::Error::custom)
    }
}

/// Appends the first line of `text`, cut to `max_chars` characters; `…` follows when anything was
/// left out (more characters, or more lines).
fn push_cut(out: &mut String, text: &str, max_chars: usize) {
    let line = text.lines().next().unwrap_or("");
    let mut chars = line.chars();
    out.extend(chars.by_ref().take(max_chars));
    if chars.next().is_some() || text.contains('\n') {
        out.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::build;
    use crate::ids::{ExecutionId, TaskInstanceId};
    use crate::record::TaskState;

    const T0: u64 = 1_700_000_000_000;

    fn record(n: u64, task_id: &str, state: TaskState) -> TaskStatusRecord {
        TaskStatusRecord {
            task_instance_id: TaskInstanceId::derived(T0, u128::from(n) << 24),
            task_id: task_id.to_owned(),
            parent_task_instance_id: None,
            subtask_group_id: None,
            resumed_after_subtasks_group_id: None,
            continues_task_instance_id: None,
            correlation_id: ExecutionId::derived(T0, 7),
            run_number: 1,
            attempt: 1,
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

    /// A root that spawned a group of two (one failed twice, one asked a question answered by a
    /// continuation) and was resumed.
    fn graph() -> (ExecutionGraph, GroupId) {
        let group = GroupId::derived(T0, 1 << 24);
        let root = record(1, "build", TaskState::Completed);
        let member = |n, task_id, state| TaskStatusRecord {
            parent_task_instance_id: Some(root.task_instance_id),
            subtask_group_id: Some(group),
            ..record(n, task_id, state)
        };
        let lint = TaskStatusRecord {
            attempt: 2,
            error: Some("exit status 1\nstack trace".to_owned()),
            ..member(3, "lint", TaskState::Failed)
        };
        let ask = member(2, "ask", TaskState::WaitingForHuman);
        let answered = TaskStatusRecord {
            continues_task_instance_id: Some(ask.task_instance_id),
            ..record(4, "ask", TaskState::Completed)
        };
        let resumed = TaskStatusRecord {
            resumed_after_subtasks_group_id: Some(group),
            ..record(5, "build", TaskState::Completed)
        };
        let graph = build(vec![resumed, lint, answered, ask, root]).expect("a valid tree");
        (graph, group)
    }

    #[test]
    fn detailed_lines_carry_attempts_errors_and_rules() {
        let (graph, group) = graph();
        let text = graph.render_text_detailed(80, |id| (id == group).then_some("all_settled"));
        assert_eq!(
            text,
            format!(
                "build [completed] attempt 1\n\
                 ├─ group {group} (2 subtasks, all_settled)\n\
                 │  ├─ ask [waiting_for_human] attempt 1\n\
                 │  │  └─ continued: ask [completed] attempt 1\n\
                 │  └─ lint [failed] attempt 2: exit status 1…\n\
                 └─ resumed: build [completed] attempt 1\n"
            )
        );
        // Without a known rule the group shows its size alone; errors are cut to the length given.
        let text = graph.render_text_detailed(4, |_| None);
        assert!(
            text.contains(&format!("group {group} (2 subtasks)\n")),
            "{text}"
        );
        assert!(text.contains("lint [failed] attempt 2: exit…\n"), "{text}");
        // The plain form has none of it.
        assert!(!graph.render_text().contains("attempt"));
    }

    #[test]
    fn errors_are_cut_to_their_first_line_and_length() {
        let cut = |text: &str, max_chars| {
            let mut out = String::new();
            push_cut(&mut out, text, max_chars);
            out
        };
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("exactly10!", 10), "exactly10!");
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("first\nsecond", 80), "first…");
        assert_eq!(cut("ünïcödé", 3), "ünï…");
        assert_eq!(cut("", 3), "");
    }
}
