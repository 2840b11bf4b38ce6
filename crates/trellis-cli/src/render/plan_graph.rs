//! `trellis plan graph`: a compiled plan as a Mermaid flowchart or a Graphviz DOT digraph, with
//! waves as ranks, dependency edges, and conflicts marked.
//!
//! Task ids may hold characters neither syntax accepts in a node name (`-`, `.`, `/`), so nodes
//! are named by index (`t0`, `t1`, ...) and labelled with the id. Labels are escaped for each
//! syntax, so no id can break out of its label.

use std::fmt::Write as _;

use trellis_core::analysis::{Analysis, ConflictReason, op_name};
use trellis_core::plan::Plan;

/// Returns the conflict pairs' labels, one per pair: the shared paths with both operations, or
/// `conflicts_with`.
fn conflict_label(reasons: &[ConflictReason]) -> String {
    reasons
        .iter()
        .map(|reason| match reason {
            ConflictReason::File { path, op_a, op_b } => {
                format!("{path} {}/{}", op_name(*op_a), op_name(*op_b))
            }
            ConflictReason::Declared => "conflicts_with".to_owned(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Escapes text for a quoted Mermaid label (`"` and the characters Mermaid reads as markup).
fn mermaid_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("#quot;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '#' => out.push_str("#35;"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Escapes text for a quoted DOT string.
fn dot_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Renders the plan as a Mermaid flowchart: one subgraph per wave (left to right), tasks that
/// run only as a fallback or a subtask in their own subgraphs, `-->` for dependencies, a dotted
/// red link labelled with the reason for each conflict, and blocked tasks outlined in red.
pub fn mermaid(plan: &Plan, analysis: &Analysis) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "%% plan {}", mermaid_text(&plan.name));
    out.push_str("flowchart LR\n");
    let node = |out: &mut String, t: usize| {
        let _ = writeln!(out, "    t{t}[\"{}\"]", mermaid_text(&plan.tasks[t].id));
    };
    for (w, wave) in analysis.waves.iter().enumerate() {
        let _ = writeln!(out, "  subgraph wave{}[\"wave {}\"]", w + 1, w + 1);
        out.push_str("    direction TB\n");
        for &t in wave {
            node(&mut out, t);
        }
        out.push_str("  end\n");
    }
    for (name, tasks) in [
        ("fallback only", &analysis.fallback_only),
        ("subtasks", &analysis.subtasks),
    ] {
        if tasks.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  subgraph {}[\"{name}\"]", name.replace(' ', "_"));
        for &t in tasks {
            node(&mut out, t);
        }
        out.push_str("  end\n");
    }
    for (t, deps) in plan.deps.iter().enumerate() {
        for &d in deps {
            let _ = writeln!(out, "  t{d} --> t{t}");
        }
    }
    for (t, task) in plan.tasks.iter().enumerate() {
        if let Some(parent) = task.subtask_of {
            let _ = writeln!(out, "  t{parent} -. subtask .-> t{t}");
        }
        if let Some(fallback) = task.fallback {
            let _ = writeln!(out, "  t{t} -. fallback .-> t{fallback}");
        }
    }
    let first_conflict_link = plan.deps.iter().map(Vec::len).sum::<usize>()
        + plan
            .tasks
            .iter()
            .map(|t| usize::from(t.subtask_of.is_some()) + usize::from(t.fallback.is_some()))
            .sum::<usize>();
    for pair in &analysis.conflict_pairs {
        let _ = writeln!(
            out,
            "  t{} -. \"conflict: {}\" .- t{}",
            pair.a,
            mermaid_text(&conflict_label(&pair.reasons)),
            pair.b
        );
    }
    if !analysis.conflict_pairs.is_empty() {
        let links: Vec<String> = (first_conflict_link
            ..first_conflict_link + analysis.conflict_pairs.len())
            .map(|i| i.to_string())
            .collect();
        let _ = writeln!(
            out,
            "  linkStyle {} stroke:#d33,color:#d33",
            links.join(",")
        );
    }
    if !analysis.blocked.is_empty() {
        out.push_str("  classDef blocked stroke:#d33,stroke-width:3px\n");
        let blocked: Vec<String> = analysis
            .blocked
            .iter()
            .map(|b| format!("t{}", b.task))
            .collect();
        let _ = writeln!(out, "  class {} blocked", blocked.join(","));
    }
    out
}

/// Renders the plan as a DOT digraph: waves as `rank=same` clusters left to right, dependency
/// edges, dashed edges to subtasks and fallbacks, and each conflict as a red dashed undirected
/// edge labelled with its reason that does not constrain the layout; blocked tasks are red.
pub fn dot(plan: &Plan, analysis: &Analysis) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", dot_text(&plan.name));
    out.push_str("  rankdir=LR;\n  node [shape=box, style=rounded];\n");
    let blocked: std::collections::HashSet<usize> =
        analysis.blocked.iter().map(|b| b.task).collect();
    let node = |out: &mut String, t: usize| {
        let colour = if blocked.contains(&t) {
            ", color=\"#d33\", penwidth=2"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "    t{t} [label=\"{}\"{colour}];",
            dot_text(&plan.tasks[t].id)
        );
    };
    for (w, wave) in analysis.waves.iter().enumerate() {
        let _ = writeln!(out, "  subgraph cluster_wave{} {{", w + 1);
        let _ = writeln!(out, "    label=\"wave {}\"; rank=same;", w + 1);
        for &t in wave {
            node(&mut out, t);
        }
        out.push_str("  }\n");
    }
    for (name, tasks) in [
        ("fallback only", &analysis.fallback_only),
        ("subtasks", &analysis.subtasks),
    ] {
        if tasks.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  subgraph cluster_{} {{", name.replace(' ', "_"));
        let _ = writeln!(out, "    label=\"{name}\"; style=dashed;");
        for &t in tasks {
            node(&mut out, t);
        }
        out.push_str("  }\n");
    }
    for (t, deps) in plan.deps.iter().enumerate() {
        for &d in deps {
            let _ = writeln!(out, "  t{d} -> t{t};");
        }
    }
    for (t, task) in plan.tasks.iter().enumerate() {
        if let Some(parent) = task.subtask_of {
            let _ = writeln!(
                out,
                "  t{parent} -> t{t} [style=dashed, label=\"subtask\"];"
            );
        }
        if let Some(fallback) = task.fallback {
            let _ = writeln!(
                out,
                "  t{t} -> t{fallback} [style=dashed, label=\"fallback\"];"
            );
        }
    }
    for pair in &analysis.conflict_pairs {
        let _ = writeln!(
            out,
            "  t{} -> t{} [dir=none, style=dashed, color=\"#d33\", fontcolor=\"#d33\", \
             constraint=false, label=\"conflict: {}\"];",
            pair.a,
            pair.b,
            dot_text(&conflict_label(&pair.reasons))
        );
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use trellis_core::analysis::analyze;
    use trellis_core::plan::{Limits, compile_str};

    use super::*;

    const PLAN: &str = r#"
name: "graph \"test\""
tasks:
  - {id: schema, type: noop, files: [{path: db/schema.sql, op: UPDATE}]}
  - {id: api, type: noop, depends_on: [schema]}
  - {id: ui, type: noop, depends_on: [schema], files: [{path: db/schema.sql, op: UPDATE}]}
  - {id: docs, type: noop, depends_on: [schema], fallback: docs-lite}
  - {id: docs-lite, type: noop}
"#;

    fn compiled() -> (Plan, Analysis) {
        let plan = compile_str(PLAN, &Limits::default()).expect("the test plan compiles");
        let analysis = analyze(&plan);
        (plan, analysis)
    }

    #[test]
    fn mermaid_has_waves_edges_and_marked_conflicts() {
        let (plan, analysis) = compiled();
        let text = mermaid(&plan, &analysis);
        assert!(text.starts_with("%% plan graph #quot;test#quot;\nflowchart LR\n"));
        assert!(text.contains("subgraph wave1[\"wave 1\"]"), "{text}");
        assert!(text.contains("subgraph wave2[\"wave 2\"]"), "{text}");
        assert!(
            text.contains("t0 --> t1") && text.contains("t0 --> t2"),
            "{text}"
        );
        assert!(text.contains("subgraph fallback_only"), "{text}");
        assert!(text.contains("t3 -. fallback .-> t4"), "{text}");
        // schema and ui conflict over the file but never share a wave, so nothing is blocked;
        // the conflict is still drawn, and its link is the one after the 3 + 1 before it.
        assert!(
            text.contains("t0 -. \"conflict: db/schema.sql UPDATE/UPDATE\" .- t2"),
            "{text}"
        );
        assert!(text.contains("linkStyle 4 stroke:#d33"), "{text}");
        assert!(!text.contains("class t"), "{text}");
    }

    #[test]
    fn dot_ranks_waves_and_escapes_labels() {
        let (plan, analysis) = compiled();
        let text = dot(&plan, &analysis);
        assert!(
            text.starts_with("digraph \"graph \\\"test\\\"\" {"),
            "{text}"
        );
        assert!(text.contains("label=\"wave 2\"; rank=same;"), "{text}");
        assert!(text.contains("t0 -> t1;"), "{text}");
        assert!(text.contains("constraint=false, label=\"conflict: db/schema.sql UPDATE/UPDATE\""));
        assert!(text.trim_end().ends_with('}'));
    }

    #[test]
    fn tasks_blocked_in_their_wave_are_marked() {
        let plan = compile_str(
            "name: b\ntasks:\n- {id: a, type: noop, files: [{path: x, op: CREATE}]}\n\
             - {id: b, type: noop, files: [{path: x, op: CREATE}]}\n",
            &Limits::default(),
        )
        .expect("compiles");
        let analysis = analyze(&plan);
        assert_eq!(analysis.blocked.len(), 1);
        assert!(mermaid(&plan, &analysis).contains("class t1 blocked"));
        assert!(dot(&plan, &analysis).contains("t1 [label=\"b\", color=\"#d33\""));
    }
}
