//! The plan drawing the monitor makes once per watched execution (`layout::plan_graph`): a
//! 2,000-task fan-out folded to three nodes, and 300 tasks in 10 waves of 30 (two dependencies
//! each, nothing folds), the most drawn node by node.
//!
//! Run: `cargo bench -p trellis-monitor --bench layout`.

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use trellis_core::analysis;
use trellis_core::plan::{Limits, Plan, compile_str};
use trellis_monitor::layout::plan_graph;

fn fan_out() -> Plan {
    let items: Vec<String> = (0..2_000).map(|n| n.to_string()).collect();
    let text = format!(
        "name: bench-fan-out\ntasks:\n- {{id: prepare, type: noop}}\n\
         - {{id: shards, type: noop, for_each: [{}], depends_on: [prepare]}}\n\
         - {{id: merge, type: noop, depends_on: [shards]}}\n",
        items.join(", ")
    );
    compile_str(&text, &Limits::default()).expect("the fan-out plan compiles")
}

fn dense() -> Plan {
    const WAVE: usize = 30;
    let mut text = "name: bench-dense\ntasks:\n".to_owned();
    for i in 0..300 {
        // each task its own type, so nothing folds
        let _ = write!(text, "- {{id: t{i}, type: ty{i}");
        if i >= WAVE {
            let base = (i / WAVE - 1) * WAVE;
            let a = base + (i * 7 + 3) % WAVE;
            let b = base + (i * 13 + 5) % WAVE;
            if a == b {
                let _ = write!(text, ", depends_on: [t{a}]");
            } else {
                let _ = write!(text, ", depends_on: [t{a}, t{b}]");
            }
        }
        text.push_str("}\n");
    }
    compile_str(&text, &Limits::default()).expect("the dense plan compiles")
}

fn layout(c: &mut Criterion) {
    let plan = fan_out();
    let waves = analysis::waves(&plan);
    c.bench_function("plan_graph/fan-out 2,000", |b| {
        b.iter(|| black_box(plan_graph(black_box(&plan), &waves)))
    });
    let plan = dense();
    let waves = analysis::waves(&plan);
    assert!(
        plan_graph(&plan, &waves).is_some(),
        "300 nodes are drawn one by one"
    );
    let mut group = c.benchmark_group("plan_graph");
    group.sample_size(10);
    group.bench_function("dense 300", |b| {
        b.iter(|| black_box(plan_graph(black_box(&plan), &waves)))
    });
    group.finish();
}

criterion_group!(benches, layout);
criterion_main!(benches);
