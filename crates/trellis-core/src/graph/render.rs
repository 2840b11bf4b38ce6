//! Text and nested JSON forms of an [`ExecutionGraph`], both written with an explicit stack so that
//! a graph of any depth renders without recursion.
//!
//! The text form (for `trellis tree`) draws a node's chain (its group, the resumed instance, its
//! continuations, and so on) as the children of the node, so a long chain stays at one indentation
//! level; only groups indent their members. Deeply nested groups would still make the indentation,
//! and so the output, grow with the square of the depth: past [`MAX_DRAWN_LEVELS`] levels a line
//! shows `[+N]` for the N outer levels it does not draw.

use std::fmt::Write as _;

use super::{ExecutionGraph, GroupIdx, Next, NodeIdx};
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
                    self.write_node(&mut out, node);
                    self.chain_after(node, &mut children);
                }
                Line::Chained(node) => self.write_node(&mut out, node),
                Line::Group(group) => {
                    let group = self.group(group);
                    let n_members = group.nodes.len();
                    let noun = if n_members == 1 {
                        "subtask"
                    } else {
                        "subtasks"
                    };
                    let _ = write!(out, "group {} ({n_members} {noun})", group.group_id);
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

    fn write_node(&self, out: &mut String, node: NodeIdx) {
        let record: &TaskStatusRecord = self.node(node).record;
        if record.resumed_after_subtasks_group_id.is_some() {
            out.push_str("resumed: ");
        } else if record.continues_task_instance_id.is_some() {
            out.push_str("continued: ");
        }
        let _ = write!(out, "{} [{}]", record.task_id, record.state.as_str());
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
