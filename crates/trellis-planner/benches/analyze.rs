//! `AnalyzePlan` on a 100,000-task plan with 10,000 file impacts, through the service handler
//! (spec text in, wire analysis out: parse, compile, analyse, convert), without the network.
//!
//! Run: `cargo bench -p trellis-planner --bench analyze`.

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tonic::Request;
use trellis_planner::PlannerService;
use trellis_proto::v1;
use trellis_proto::v1::planner_server::Planner;

/// 100,000 tasks in layers of 1,000: each task depends on two tasks of the layer before. Every
/// tenth task touches a file (10,000 impacts over 2,500 paths, UPDATE and READ mixed), so tasks of
/// one layer conflict.
fn spec_text(n: usize) -> String {
    const LAYER: usize = 1_000;
    let mut text = String::with_capacity(n * 96);
    text.push_str("name: bench-analyze\ntasks:\n");
    for i in 0..n {
        let _ = write!(text, "- {{id: t{i}, type: noop");
        if i >= LAYER {
            let a = i - LAYER;
            let b = LAYER * (i / LAYER - 1) + (i * 7 + 3) % LAYER;
            if a == b {
                let _ = write!(text, ", depends_on: [t{a}]");
            } else {
                let _ = write!(text, ", depends_on: [t{a}, t{b}]");
            }
        }
        if i % 10 == 0 {
            let op = if i % 20 == 0 { "UPDATE" } else { "READ" };
            let _ = write!(
                text,
                ", files: [{{path: src/m{}.rs, op: {op}}}]",
                (i / 10) % 2_500
            );
        }
        text.push_str("}\n");
    }
    text
}

fn benches(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime builds");
    let service = PlannerService::new(
        trellis_core::plan::Limits::default(),
        &trellis_telemetry::Registry::new(),
    );
    let spec = v1::PlanSpec {
        text: spec_text(100_000),
        format: v1::PlanFormat::Yaml.into(),
        source_name: "bench".to_owned(),
        params: Default::default(),
    };
    let mut group = c.benchmark_group("planner");
    group.sample_size(10);
    group.bench_function("analyze_100k_tasks_10k_impacts", |b| {
        b.iter(|| {
            let request = Request::new(v1::AnalyzePlanRequest {
                plan_source: Some(v1::analyze_plan_request::PlanSource::Spec(spec.clone())),
            });
            let response = runtime
                .block_on(service.analyze_plan(request))
                .expect("the request is well formed")
                .into_inner();
            match response.result {
                Some(v1::analyze_plan_response::Result::Analysis(analysis)) => {
                    black_box(analysis.waves.len())
                }
                other => panic!("the bench plan must be valid: {other:?}"),
            }
        })
    });
    group.finish();
}

criterion_group!(planner, benches);
criterion_main!(planner);
