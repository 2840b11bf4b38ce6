//! Plan compile and analysis throughput on a generated 100,000-task plan, and reading a compiled
//! 20,000-task plan back from its encoding against compiling it again.
//!
//! The plans are shaped like real work: each task depends on up to three of the 1,000 tasks
//! declared before it, and a third of the tasks touch one or two of 40,000 paths with mixed
//! operations (so there are file conflicts, but not a quadratic number of them).
//! Run with `cargo bench -p trellis-core --bench plan` (`-- plan_20k` for the encoding only).

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use trellis_core::analysis::analyze;
use trellis_core::plan::spec::{FileOpSpec, FileSpec, PlanSpec, TaskSpec};
use trellis_core::plan::{Limits, compile, compile_str, decode, encode};

const N_TASKS: usize = 100_000;

/// Returns a deterministic pseudo-random plan of `n` tasks.
fn generated_plan(n: usize) -> PlanSpec {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    let ops = [
        FileOpSpec::Create,
        FileOpSpec::Update,
        FileOpSpec::Delete,
        FileOpSpec::Read,
    ];
    let tasks = (0..n)
        .map(|i| {
            let n_deps = if i == 0 { 0 } else { next(4) };
            let mut depends_on: Vec<String> = (0..n_deps)
                .map(|_| format!("task-{}", i - 1 - next(i.min(1000))))
                .collect();
            depends_on.sort();
            depends_on.dedup();
            let files = if next(3) == 0 {
                (0..1 + next(2))
                    .map(|_| FileSpec {
                        path: format!("src/module_{}/file.rs", next(40_000)),
                        op: ops[next(4)],
                        confidence: None,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            TaskSpec {
                id: format!("task-{i}"),
                task_type: "noop".to_owned(),
                queue: None,
                input: serde_json::json!({}),
                files,
                depends_on,
                timeout: None,
                ..TaskSpec::default()
            }
        })
        .collect();
    PlanSpec {
        name: "bench".to_owned(),
        tasks,
        ..PlanSpec::default()
    }
}

fn bench_plan(c: &mut Criterion) {
    let limits = Limits::default();
    let spec = generated_plan(N_TASKS);
    let json = serde_json::to_string(&spec).expect("spec serialises");
    let mut group = c.benchmark_group("plan_100k");
    group.sample_size(10);
    group.bench_function("compile_and_analyze", |b| {
        b.iter_batched(
            || spec.clone(),
            |spec| {
                let plan = compile(spec, &limits).expect("generated plan is valid");
                black_box(analyze(&plan));
                plan
            },
            BatchSize::LargeInput,
        );
    });
    group.bench_function("parse_json_compile_and_analyze", |b| {
        b.iter(|| {
            let plan = compile_str(&json, &limits).expect("generated plan is valid");
            black_box(analyze(&plan));
            plan
        });
    });
    group.finish();
}

/// Decoding a recorded plan against compiling its spec again, as recovery would without it.
fn bench_encoding(c: &mut Criterion) {
    let limits = Limits::default();
    let spec = generated_plan(20_000);
    let json = serde_json::to_string(&spec).expect("spec serialises");
    let plan = compile(spec.clone(), &limits).expect("generated plan is valid");
    let bytes = encode(&plan);
    eprintln!(
        "plan_20k: {} bytes encoded, {:.1} per task",
        bytes.len(),
        bytes.len() as f64 / 20_000.0
    );
    let mut group = c.benchmark_group("plan_20k");
    group.sample_size(20);
    group.bench_function("compile", |b| {
        b.iter_batched(
            || spec.clone(),
            |spec| compile(spec, &limits).expect("generated plan is valid"),
            BatchSize::LargeInput,
        );
    });
    // Batched like `compile`, so every plan is dropped outside the timed region alike.
    group.bench_function("parse_json_and_compile", |b| {
        b.iter_batched(
            || (),
            |()| compile_str(&json, &limits).expect("generated plan is valid"),
            BatchSize::LargeInput,
        );
    });
    group.bench_function("decode", |b| {
        b.iter_batched(
            || (),
            |()| decode(black_box(&bytes)).expect("encoded plan decodes"),
            BatchSize::LargeInput,
        );
    });
    group.bench_function("encode", |b| {
        b.iter(|| encode(black_box(&plan)));
    });
    group.finish();
}

criterion_group!(benches, bench_plan, bench_encoding);
criterion_main!(benches);
