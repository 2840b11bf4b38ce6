//! A generator of random plans that use every part of the plan language, for the tests of the
//! plan encoding.

use std::fmt::Write as _;

use proptest::prelude::*;

/// A random plan using every part of the language, valid by construction: edges only point from
/// later tasks to earlier ones, each task is not run for one reason at most, and subtasks and
/// fallbacks come last, with nothing ordering them.
pub fn arb_rich_plan() -> impl Strategy<Value = String> {
    let task = (
        (0..3usize, prop::option::weighted(0.1, 0..2usize), 0..6usize),
        prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        prop::collection::vec((0..5usize, 0..4usize, prop::option::of(0..5u8)), 0..3),
        (prop::option::of(0..3usize), prop::option::of(0..6usize)),
        (
            prop::option::weighted(0.3, (0..7usize, any::<prop::sample::Index>())),
            any::<bool>(),
            prop::option::weighted(0.2, 0..2usize),
        ),
    );
    let options = (
        prop::option::of(1..8u32),
        prop::option::of(0..3usize),
        any::<bool>(),
        0..4usize,
        any::<bool>(),
        prop::option::of((1..1_000_000u64, any::<bool>())),
    );
    (
        prop::collection::vec(task, 1..25),
        options,
        0..3usize,
        0..3usize,
    )
        .prop_map(|(tasks, options, n_subtasks, n_fallbacks)| {
            let n = tasks.len();
            let (max_concurrency, global_timeout, pause, default_action, cont, budget) = options;
            let mut text = String::from("name: rich\noptions:\n");
            if let Some(m) = max_concurrency {
                writeln!(text, "  max_concurrency: {m}").expect("writing");
            }
            if let Some(t) = global_timeout {
                writeln!(text, "  global_timeout: {}", ["1h", "90s", "1500ms"][t]).expect("writing");
            }
            writeln!(text, "  pause_on_human_review: {pause}").expect("writing");
            let action = ["retry", "skip", "pause", "{retry: {max: 1, backoff: constant}}"];
            writeln!(
                text,
                "  failure: {{default_action: {}, continue_on_partial_failure: {cont}, overrides: {{http: abort}}}}",
                action[default_action]
            )
            .expect("writing");
            if let Some((tokens, fail)) = budget {
                let on = if fail { "fail" } else { "pause" };
                writeln!(text, "  budget: {{max_tokens: {tokens}, max_cost: {}.25, on_exhausted: {on}}}", tokens % 100)
                    .expect("writing");
            }
            text.push_str("tasks:\n");
            let types = ["noop", "shell", "http"];
            let inputs = [
                "{}",
                "{cmd: make, args: [-j, 4]}",
                "{n: -7, x: 0.125}",
                "[1, true, null]",
                "\"text\"",
                "{nested: {deep: [{k: v}]}}",
            ];
            let ops = ["CREATE", "UPDATE", "DELETE", "READ"];
            let chains = [
                "on_failure: [skip]",
                "on_failure: [{retry: {max: 2, backoff: {kind: linear, base: 1s, cap: 10s, jitter: 20%}}}, reassign, pause, abort]",
                "retry: {max: 5}",
            ];
            for (i, (head, deps, files, (timeout, chain), (rel, route, fb))) in
                tasks.iter().enumerate()
            {
                let (ty, queue, input) = *head;
                write!(text, "  - id: t{i}\n    type: {}\n    input: {}\n", types[ty], inputs[input])
                    .expect("writing");
                if let Some(q) = queue {
                    writeln!(text, "    queue: q{q}").expect("writing");
                }
                if i > 0 && !deps.is_empty() {
                    let deps: Vec<String> = deps.iter().map(|d| format!("t{}", d.index(i))).collect();
                    writeln!(text, "    depends_on: [{}]", deps.join(", ")).expect("writing");
                }
                if !files.is_empty() {
                    let files: Vec<String> = files
                        .iter()
                        .map(|(p, op, c)| match c {
                            Some(c) => format!("{{path: f{p}, op: {}, confidence: 0.{c}}}", ops[*op]),
                            None => format!("{{path: f{p}, op: {}}}", ops[*op]),
                        })
                        .collect();
                    writeln!(text, "    files: [{}]", files.join(", ")).expect("writing");
                }
                if let Some(t) = timeout {
                    writeln!(text, "    timeout: {}", ["5s", "1m 30s", "250ms"][*t]).expect("writing");
                }
                if let Some(fb) = fb.filter(|&fb| fb < n_fallbacks) {
                    writeln!(text, "    fallback: fb{fb}").expect("writing");
                    writeln!(text, "    on_failure: [reassign, fallback]").expect("writing");
                } else if let Some(c) = chain.filter(|&c| c < chains.len()) {
                    writeln!(text, "    {}", chains[c]).expect("writing");
                }
                // Kinds that order the target after this task point forward, the others back;
                // `supersedes` only from tasks 3k to 3k+1, `duplicate_of` only from 3k+2.
                let relationship = rel.and_then(|(kind, target)| {
                    let back = (i > 0).then(|| format!("t{}", target.index(i)));
                    match kind {
                        0 => back.map(|t| ("depends_on", t)),
                        1 => back.map(|t| ("tests", t)),
                        2 => back.map(|t| ("conflicts_with", t)),
                        3 => back.map(|t| (["related_to", "implements", "enables", "inspired_by"][i % 4], t)),
                        4 if i + 1 < n => Some(("blocks", format!("t{}", i + 1))),
                        5 if i % 3 == 0 && i + 1 < n => Some(("supersedes", format!("t{}", i + 1))),
                        6 if i % 3 == 2 => back.map(|t| ("duplicate_of", t)),
                        _ => None,
                    }
                });
                if let Some((kind, target)) = relationship {
                    writeln!(text, "    relationships: [{{type: {kind}, target: {target}}}]").expect("writing");
                }
                // Routes from tasks 4k pick 4k+1 and 4k+2, which no other route lists.
                if *route && i % 4 == 0 && i + 2 < n {
                    writeln!(
                        text,
                        "    route: {{path: kind, cases: {{a: [t{}]}}, default: [t{}]}}",
                        i + 1,
                        i + 2
                    )
                    .expect("writing");
                }
            }
            for s in 0..n_subtasks {
                writeln!(
                    text,
                    "  - {{id: s{s}, type: noop, relationships: [{{type: subtask_of, target: t{}}}]}}",
                    s % n
                )
                .expect("writing");
            }
            for fb in 0..n_fallbacks {
                writeln!(text, "  - {{id: fb{fb}, type: shell}}").expect("writing");
            }
            text
        })
}
