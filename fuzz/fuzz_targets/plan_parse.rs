//! The plan parser and compiler on arbitrary bytes: any input is a plan or a list of errors,
//! never a panic, a hang or a blow-up; and a plan that compiles keeps its meaning through its
//! canonical flat spec.
//!
//! Run: `cargo fuzz run plan_parse fuzz/seeds/plan_parse -- -max_total_time=600` (from the
//! repository root, with `cargo install cargo-fuzz`).

#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use trellis_core::analysis::analyze;
use trellis_core::plan::{
    Limits, compile, compile_with_params, expand_with_limits, parse_spec_bytes,
};

fuzz_target!(|data: &[u8]| {
    // Small limits keep each run fast; the limits themselves are under test too.
    let limits = Limits {
        max_input_bytes: 64 * 1024,
        max_tasks: 2_000,
        ..Limits::default()
    };
    let Ok(spec) = parse_spec_bytes(data, &limits) else {
        return;
    };
    let Ok(flat) = expand_with_limits(spec.clone(), &BTreeMap::new(), &limits) else {
        return;
    };
    let Ok(plan) = compile_with_params(spec, &BTreeMap::new(), &limits) else {
        return;
    };
    let analysis = analyze(&plan);
    assert!(analysis.waves.iter().map(Vec::len).sum::<usize>() <= plan.len());
    // The flat spec is what the planner hands on: it must compile to the same plan, also after
    // a trip through JSON.
    let again = compile(flat.clone(), &limits).expect("the flat spec of a valid plan compiles");
    assert_eq!(again, plan);
    let json = serde_json::to_string(&flat).expect("a spec serializes");
    let from_json = trellis_core::plan::compile_str(&json, &Limits::default())
        .expect("the flat spec's JSON compiles");
    assert_eq!(from_json, plan);
});
