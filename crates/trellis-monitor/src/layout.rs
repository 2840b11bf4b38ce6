//! The plan as the monitor draws it: fan-outs folded into one node, and a layered layout whose
//! order inside each wave reduces edge crossings.
//!
//! A *fan-out* is a set of tasks nobody could tell apart in the drawing: same wave, same type,
//! same dependencies and same dependents (what `for_each` makes, or a hand-written list of
//! shards). At least [`FOLD_MIN`] of them become one node, labelled with their ids' common
//! prefix ("shards ×2,000"); the page counts their states and lists them in a grid.
//!
//! Columns are the plan's waves. Inside a column the order and the rows come from a Sugiyama
//! layout (`rust-sugiyama`: barycenter crossing reduction, Brandes–Köpf coordinates), computed once
//! per plan when the hub loads it.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use trellis_core::analysis::Waves;
use trellis_core::plan::Plan;

/// Fewest interchangeable tasks folded into one node.
pub const FOLD_MIN: usize = 5;
/// Most nodes drawn one by one; above it the page draws each wave as a stacked bar instead.
pub const NODE_LIMIT: usize = 300;

/// The drawing of a plan's waves.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PlanGraph {
    pub nodes: Vec<GraphNode>,
    /// `[from, to]` as indexes into `nodes`, once per pair.
    pub edges: Vec<[usize; 2]>,
    /// Pairs of nodes with a file conflict between some of their tasks, once per pair.
    pub conflicts: Vec<[usize; 2]>,
    /// The rows the tallest column needs (a node's `row` is below this).
    pub rows: f64,
}

/// One task, or a fan-out of interchangeable tasks.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GraphNode {
    /// The task id, or the common prefix of a fan-out's ids.
    pub label: String,
    #[serde(rename = "type")]
    pub task_type: String,
    /// 0-based column.
    pub wave: usize,
    /// Vertical position in rows from the top; may be fractional, at least 1 apart in a column.
    pub row: f64,
    /// The task ids the node stands for: one, or a fan-out's members in plan order.
    pub members: Vec<String>,
}

/// What tells tasks apart in the drawing: wave, type, dependencies and dependents (sorted).
type Likeness<'a> = (usize, &'a str, Vec<usize>, Vec<usize>);

/// Folds and lays out `plan`, whose waves are `waves`
/// ([`trellis_core::analysis::waves`]); `None` when even
/// folded it has more than [`NODE_LIMIT`] nodes.
pub fn plan_graph(plan: &Plan, waves: &Waves) -> Option<PlanGraph> {
    let n = plan.tasks.len();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (task, deps) in plan.deps.iter().enumerate() {
        for &dep in deps {
            dependents[dep].push(task);
        }
    }

    // Fold: the node of each drawn task; classes keyed by what tells tasks apart in the drawing.
    let mut node_of: Vec<Option<usize>> = vec![None; n];
    let mut classes: HashMap<Likeness<'_>, Vec<usize>> = HashMap::new();
    let mut class_order = Vec::new();
    for (task, wave) in waves.wave_of.iter().enumerate() {
        let Some(wave) = *wave else { continue };
        let mut deps = plan.deps[task].clone();
        deps.sort_unstable();
        let mut after = dependents[task].clone();
        after.sort_unstable();
        let key = (wave, plan.tasks[task].task_type.as_str(), deps, after);
        let members = classes.entry(key.clone()).or_default();
        if members.is_empty() {
            class_order.push(key);
        }
        members.push(task);
    }
    let mut members_of: Vec<Vec<usize>> = Vec::new();
    for key in &class_order {
        let members = &classes[key];
        if members.len() >= FOLD_MIN {
            members_of.push(members.clone());
        } else {
            members_of.extend(members.iter().map(|&t| vec![t]));
        }
    }
    // Plan order of each node's first task, so the drawing reads like the file.
    members_of.sort_by_key(|members| members[0]);
    if members_of.len() > NODE_LIMIT {
        return None;
    }
    for (node, members) in members_of.iter().enumerate() {
        for &task in members {
            node_of[task] = Some(node);
        }
    }

    let mut edges: Vec<[usize; 2]> = (0..n)
        .flat_map(|task| plan.deps[task].iter().map(move |&dep| (dep, task)))
        .filter_map(|(a, b)| Some([node_of[a]?, node_of[b]?]))
        .filter(|[a, b]| a != b)
        .collect();
    edges.sort_unstable();
    edges.dedup();
    let mut conflicts: Vec<[usize; 2]> = (0..n)
        .flat_map(|a| plan.conflicts[a].iter().map(move |&b| (a, b)))
        .filter_map(|(a, b)| Some((node_of[a]?, node_of[b]?)))
        .filter(|(a, b)| a != b)
        .map(|(a, b)| [a.min(b), a.max(b)])
        .collect();
    conflicts.sort_unstable();
    conflicts.dedup();

    let wave_of_node: Vec<usize> = members_of
        .iter()
        .map(|members| waves.wave_of[members[0]].unwrap_or(0))
        .collect();
    let rows_of_node = rows(&wave_of_node, &edges);
    let rows = rows_of_node.iter().map(|r| r + 1.0).fold(0.0, f64::max);

    let nodes = members_of
        .iter()
        .enumerate()
        .map(|(node, members)| {
            let ids: Vec<String> = members.iter().map(|&t| plan.tasks[t].id.clone()).collect();
            GraphNode {
                label: if ids.len() == 1 {
                    ids[0].clone()
                } else {
                    fan_out_label(&ids, &plan.tasks[members[0]].task_type)
                },
                task_type: plan.tasks[members[0]].task_type.clone(),
                wave: wave_of_node[node],
                row: rows_of_node[node],
                members: ids,
            }
        })
        .collect();
    Some(PlanGraph {
        nodes,
        edges,
        conflicts,
        rows,
    })
}

/// The row of each node: the Sugiyama layout's position across the layers, then per column in
/// that order, at least one row apart and packed upwards.
fn rows(wave_of: &[usize], edges: &[[usize; 2]]) -> Vec<f64> {
    let position = sugiyama_positions(wave_of.len(), edges);
    let mut columns: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (node, &wave) in wave_of.iter().enumerate() {
        columns.entry(wave).or_default().push(node);
    }
    let mut rows = vec![0.0; wave_of.len()];
    for nodes in columns.values_mut() {
        nodes.sort_by(|&a, &b| position[a].total_cmp(&position[b]).then(a.cmp(&b)));
        let mut next = f64::NEG_INFINITY;
        for &node in nodes.iter() {
            let row = position[node].max(next);
            rows[node] = row;
            next = row + 1.0;
        }
    }
    let top = rows.iter().copied().fold(f64::INFINITY, f64::min);
    if top.is_finite() {
        for row in &mut rows {
            *row -= top;
        }
    }
    rows
}

/// Each node's position across the layers, components stacked one under the other; the node's
/// index when the layout cannot be computed.
fn sugiyama_positions(count: usize, edges: &[[usize; 2]]) -> Vec<f64> {
    use rust_sugiyama::configure::{Config, RankingType};

    let fallback: Vec<f64> = (0..count).map(|node| node as f64).collect();
    let (Ok(count32), Ok(edges32)) = (
        u32::try_from(count),
        edges
            .iter()
            .map(|&[a, b]| Ok((u32::try_from(a)?, u32::try_from(b)?)))
            .collect::<Result<Vec<(u32, u32)>, std::num::TryFromIntError>>(),
    ) else {
        return fallback;
    };
    let vertices: Vec<(u32, (f64, f64))> = (0..count32).map(|v| (v, (0.0, 0.0))).collect();
    // Longest-path layers, which are the plan's waves; zero-sized vertices one unit apart.
    let config = Config {
        ranking_type: RankingType::Up,
        vertex_spacing: 1.0,
        ..Config::default()
    };
    // The layout is third-party code running on every plan the monitor shows: a panic in it
    // must cost the drawing its order, not the monitor its request.
    let Ok(layouts) = std::panic::catch_unwind(|| {
        rust_sugiyama::from_vertices_and_edges(&vertices, &edges32, &config)
    }) else {
        return fallback;
    };
    let mut position = fallback.clone();
    let mut offset = 0.0;
    for (layout, _, _) in layouts {
        let low = layout
            .iter()
            .map(|(_, (x, _))| *x)
            .fold(f64::INFINITY, f64::min);
        let high = layout
            .iter()
            .map(|(_, (x, _))| *x)
            .fold(f64::NEG_INFINITY, f64::max);
        if !low.is_finite() {
            continue;
        }
        for (node, (x, _)) in layout {
            if let Some(slot) = position.get_mut(node) {
                *slot = offset + x - low;
            }
        }
        offset += high - low + 1.0;
    }
    position
}

/// "shards" for `shards-0` … `shards-1999`; the type when the ids share no prefix.
fn fan_out_label(ids: &[String], task_type: &str) -> String {
    let first = &ids[0];
    let mut len = first.len();
    for id in &ids[1..] {
        len = first
            .char_indices()
            .zip(id.chars())
            .take_while(|((_, a), b)| a == b)
            .last()
            .map_or(0, |((at, c), _)| at + c.len_utf8())
            .min(len);
    }
    let prefix =
        first[..len].trim_end_matches(|c: char| c.is_ascii_digit() || "-_.:/[(".contains(c));
    if prefix.is_empty() {
        task_type.to_owned()
    } else {
        prefix.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_core::analysis;
    use trellis_core::plan::{Limits, compile_str};

    fn graph(text: &str) -> PlanGraph {
        let plan = compile_str(text, &Limits::default()).expect("the plan compiles");
        plan_graph(&plan, &analysis::waves(&plan)).expect("few enough nodes")
    }

    fn node<'a>(graph: &'a PlanGraph, label: &str) -> &'a GraphNode {
        graph
            .nodes
            .iter()
            .find(|n| n.label == label)
            .unwrap_or_else(|| panic!("no node {label} in {graph:?}"))
    }

    #[test]
    fn a_for_each_fan_out_is_one_node_and_its_edges_are_drawn_once() {
        let g = graph(
            "name: p\ntasks:\n\
             - {id: prepare, type: noop}\n\
             - {id: shards, type: noop, for_each: [1, 2, 3, 4, 5, 6, 7], depends_on: [prepare]}\n\
             - {id: merge, type: noop, depends_on: [shards]}\n",
        );
        assert_eq!(g.nodes.len(), 3, "{g:?}");
        let shards = node(&g, "shards");
        assert_eq!(shards.members.len(), 7);
        assert_eq!(shards.wave, 1);
        assert_eq!(g.edges.len(), 2, "one edge in, one out: {g:?}");
    }

    #[test]
    fn fewer_than_fold_min_alike_tasks_stay_apart() {
        let g = graph(
            "name: p\ntasks:\n\
             - {id: a, type: noop}\n\
             - {id: b, type: noop}\n\
             - {id: c, type: noop, depends_on: [a, b]}\n",
        );
        assert_eq!(g.nodes.len(), 3);
        assert!(g.nodes.iter().all(|n| n.members.len() == 1));
    }

    #[test]
    fn tasks_with_different_dependents_are_not_folded() {
        let mut text = "name: p\ntasks:\n".to_owned();
        for i in 0..6 {
            text += &format!("- {{id: s{i}, type: noop}}\n");
        }
        text += "- {id: only-first, type: noop, depends_on: [s0]}\n";
        let g = graph(&text);
        // s1..s5 are alike; s0 has a dependent of its own
        assert_eq!(g.nodes.len(), 3, "{g:?}");
        assert_eq!(node(&g, "s").members, ["s1", "s2", "s3", "s4", "s5"]);
        assert_eq!(node(&g, "s0").members, ["s0"]);
    }

    /// Two chains whose waves are written crosswise: a1 → b2 and a2 → b1. Packed in plan order the
    /// edges cross; the layout orders the second column after the first and they do not.
    #[test]
    fn the_order_inside_a_wave_removes_a_crossing() {
        let g = graph(
            "name: p\ntasks:\n\
             - {id: a1, type: noop}\n\
             - {id: a2, type: x}\n\
             - {id: b1, type: noop, depends_on: [a2]}\n\
             - {id: b2, type: x, depends_on: [a1]}\n",
        );
        let row = |label: &str| node(&g, label).row;
        let crossing = (row("a1") - row("a2")) * (row("b2") - row("b1")) < 0.0;
        assert!(!crossing, "edges cross: {g:?}");
        for (a, b) in [("a1", "a2"), ("b1", "b2")] {
            assert!((row(a) - row(b)).abs() >= 1.0, "{a} and {b} overlap: {g:?}");
        }
    }

    #[test]
    fn a_plan_too_big_even_folded_is_not_drawn_node_by_node() {
        let mut text = "name: p\ntasks:\n".to_owned();
        for i in 0..=NODE_LIMIT {
            // each task its own type: nothing folds
            text += &format!("- {{id: t{i}, type: ty{i}}}\n");
        }
        let plan = compile_str(&text, &Limits::default()).expect("the plan compiles");
        assert_eq!(plan_graph(&plan, &analysis::waves(&plan)), None);
    }

    #[test]
    fn a_fan_out_without_a_common_prefix_is_named_by_its_type() {
        let ids: Vec<String> = ["x", "y"].map(str::to_owned).to_vec();
        assert_eq!(fan_out_label(&ids, "lint"), "lint");
        let ids: Vec<String> = ["shard-9", "shard-10"].map(str::to_owned).to_vec();
        assert_eq!(fan_out_label(&ids, "lint"), "shard");
    }
}
