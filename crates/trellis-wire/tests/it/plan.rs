//! Plans on the wire: a compiled plan survives `plan::to_proto` → `compile_wire_plan`, its canonical
//! JSON spec compiles back to it, and validation errors and analyses carry what callers need.

use proptest::prelude::*;
use trellis_core::analysis::analyze;
use trellis_core::plan::{Limits, Plan, compile_str};
use trellis_proto::v1;
use trellis_wire::plan::{
    self, analysis_to_proto, canonical_spec_json, compile_wire_plan, compile_wire_spec,
};

const EXAMPLES: &[(&str, &str)] = &[
    ("demo", include_str!("../../../../examples/demo.yaml")),
    ("fanout", include_str!("../../../../examples/fanout.yaml")),
    (
        "feature-x",
        include_str!("../../../../examples/feature-x.yaml"),
    ),
    (
        "relationships",
        include_str!("../../../../examples/relationships.yaml"),
    ),
    (
        "seed-001",
        include_str!("../../../../examples/seed-001.yaml"),
    ),
    (
        "services",
        include_str!("../../../../examples/services.yaml"),
    ),
    ("triage", include_str!("../../../../examples/triage.yaml")),
    (
        "validated",
        include_str!("../../../../examples/validated.yaml"),
    ),
];

/// Every option and task field set away from its default.
const EVERYTHING: &str = r#"
name: everything
options:
  max_concurrency: 3
  global_timeout: 1h
  pause_on_human_review: false
  failure:
    default_action: {retry: {max: 5, backoff: {kind: linear, base: 2s, cap: 30s, jitter: 10%}}}
    continue_on_partial_failure: true
    overrides: {shell: reassign, http: skip}
  budget: {max_tokens: 1000, max_cost: 2.5, on_exhausted: fail}
  min_conflict_confidence: 0.4
tasks:
  - id: a
    type: shell
    queue: fast
    input: {cmd: "echo $${HOME}", n: [1, 2.5, null, true]}
    files: [{path: src/a.rs, op: UPDATE, confidence: 0.5}, {path: src/b.rs, op: READ}]
    timeout: 90s
    fallback: a-lite
    on_failure: [{retry: {max: 1}}, reassign, fallback, pause, abort]
  - {id: a-lite, type: noop}
  - id: b
    type: http
    depends_on: [a]
    files: [{path: src/b.rs, op: DELETE}]
    relationships: [{type: conflicts_with, target: c}, {type: related_to, target: a}]
  - {id: c, type: noop, relationships: [{type: blocks, target: d}]}
  - id: d
    type: noop
    on_failure: [skip]
    validate:
      - {name: lint, level: codebase, command: "cargo clippy", timeout: 2m}
      - {name: e2e, level: ui, command: [npx, playwright, test]}
      - {name: up, level: api, http: {url: "http://svc/health", method: HEAD, status: 204, body_contains: ok}, timeout: 5s}
      - {name: plain, level: api, http: {url: "https://svc/"}}
  - {id: d-test, type: noop, relationships: [{type: tests, target: d}]}
  - id: triage
    type: noop
    retry: {max: 7}
    route: {path: /kind, cases: {bug: [fix], feature: [build, doc], "3": [three]}, default: [ask]}
  - {id: fix, type: noop}
  - {id: build, type: noop}
  - {id: doc, type: noop}
  - {id: three, type: noop}
  - {id: ask, type: noop}
"#;

fn compile(text: &str) -> Plan {
    compile_str(text, &Limits::default()).expect("the plan compiles")
}

#[test]
fn literal_references_and_routes_keep_their_meaning() {
    let plan = compile(EVERYTHING);
    assert_eq!(plan.tasks[0].input["cmd"], "echo ${HOME}");
    let wire = plan::to_proto(&plan);
    let route = wire.tasks[6].route.as_ref().expect("triage routes");
    assert_eq!(route.path, "/kind");
    assert_eq!(route.cases["feature"].task_ids, ["build", "doc"]);
    assert_eq!(route.default, ["ask"]);
    assert!(wire.tasks[7].route.is_none());
    assert_eq!(
        wire.options.as_ref().map(|o| o.min_conflict_confidence),
        Some(0.4)
    );
}

fn assert_wire_round_trip(name: &str, plan: &Plan) {
    let wire = plan::to_proto(plan);
    let again = compile_wire_plan(&wire, &Limits::default())
        .unwrap_or_else(|e| panic!("{name}: the wire plan compiles again: {e}"));
    assert_eq!(&again, plan, "{name}: wire round trip");
    let json = canonical_spec_json(plan);
    let from_json = compile_str(&json, &Limits::default())
        .unwrap_or_else(|e| panic!("{name}: the canonical spec compiles: {e}\n{json}"));
    assert_eq!(&from_json, plan, "{name}: canonical JSON round trip");
}

#[test]
fn compiled_plans_survive_the_wire_and_the_canonical_spec() {
    for (name, text) in EXAMPLES {
        assert_wire_round_trip(name, &compile(text));
    }
    assert_wire_round_trip("everything", &compile(EVERYTHING));
}

#[test]
fn wire_plans_make_defaults_explicit() {
    let wire = plan::to_proto(&compile("name: p\ntasks:\n- {id: t, type: shell}\n"));
    let options = wire.options.expect("options are always sent");
    assert!(options.pause_on_human_review, "the spec default is true");
    let default_action = options
        .failure
        .and_then(|f| f.default_action)
        .and_then(|a| a.action);
    match default_action {
        Some(v1::failure_action::Action::Retry(retry)) => {
            assert_eq!(retry.max_retries, 3);
            let backoff = retry.backoff.expect("the backoff is explicit");
            assert_eq!((backoff.base_ms, backoff.cap_ms), (100, 60_000));
        }
        other => panic!("expected the default retry, got {other:?}"),
    }
    assert_eq!(
        wire.tasks[0].queue, "shell",
        "the queue defaults to the type"
    );
    assert!(
        wire.tasks[0].on_failure.is_empty(),
        "a task on the plan policy sends no chain of its own"
    );
}

#[test]
fn a_tampered_wire_plan_is_validated_again() {
    let mut wire = plan::to_proto(&compile(EVERYTHING));
    wire.tasks[3].depends_on = vec!["nope".to_owned()];
    wire.tasks[2].files[0].op = 99;
    let err = compile_wire_plan(&wire, &Limits::default()).expect_err("an unknown enum value");
    assert_eq!(err.errors()[0].path, "plan.tasks[2].files[0].op");
    assert!(err.errors()[0].message.contains("99"), "{err}");
    wire.tasks[2].files[0].op = v1::FileOp::Read.into();
    let err = compile_wire_plan(&wire, &Limits::default()).expect_err("an unknown dependency");
    assert_eq!(err.errors()[0].path, "tasks[3].depends_on[0]");
}

/// A wire plan's checks are read as a worker reads them, then compiled as any spec: a check
/// without a level, without a probe or with two of the same name is refused with its path.
#[test]
fn a_wire_plan_with_bad_checks_is_refused_with_their_path() {
    let wire = plan::to_proto(&compile(EVERYTHING));
    let d = wire
        .tasks
        .iter()
        .position(|task| task.id == "d")
        .expect("task d");
    assert_eq!(wire.tasks[d].validate.len(), 4, "the checks travel");
    let refused = |change: &dyn Fn(&mut v1::Check)| {
        let mut wire = wire.clone();
        change(&mut wire.tasks[d].validate[1]);
        compile_wire_plan(&wire, &Limits::default())
            .expect_err("a bad check is refused")
            .errors()[0]
            .clone()
    };
    let err = refused(&|check| check.level = v1::CheckLevel::Unspecified.into());
    assert_eq!(
        err.path,
        format!("plan.tasks[{d}].validate[1].level"),
        "{err:?}"
    );
    let err = refused(&|check| check.probe = None);
    assert_eq!(
        err.path,
        format!("plan.tasks[{d}].validate[1].probe"),
        "{err:?}"
    );
    let err = refused(&|check| check.name = "lint".to_owned());
    assert!(
        err.path.starts_with(&format!("tasks[{d}].validate")),
        "{err:?}"
    );
    assert!(err.message.contains("lint"), "{err:?}");
}

#[test]
fn wire_specs_compile_and_errors_keep_path_and_place() {
    let spec = v1::PlanSpec {
        text: "name: p\ntasks:\n- {id: a, type: noop, depends_on: [b]}\n".to_owned(),
        format: v1::PlanFormat::Yaml.into(),
        source_name: "p.yaml".to_owned(),
        params: Default::default(),
    };
    let errors = compile_wire_spec(&spec, &Limits::default()).expect_err("b is unknown");
    let wire = plan::errors_to_proto(&errors);
    assert_eq!(wire.errors.len(), 1);
    assert_eq!(wire.errors[0].path, "tasks[0].depends_on[0]");
    assert!(wire.errors[0].message.contains("\"b\""), "{wire:?}");

    let syntax = v1::PlanSpec {
        text: "name: p\ntasks: [\n".to_owned(),
        ..spec
    };
    let errors = compile_wire_spec(&syntax, &Limits::default()).expect_err("not YAML");
    let wire = plan::errors_to_proto(&errors);
    assert!(
        wire.errors[0].line > 0,
        "a parse error says where: {wire:?}"
    );
}

#[test]
fn analyses_name_blocked_tasks_and_every_conflict_reason() {
    let plan = compile(
        "name: p\ntasks:\n\
         - {id: a, type: noop, files: [{path: x, op: UPDATE}, {path: y, op: CREATE}]}\n\
         - {id: b, type: noop, files: [{path: x, op: UPDATE}, {path: y, op: CREATE}]}\n\
         - {id: c, type: noop, relationships: [{type: conflicts_with, target: a}]}\n\
         - {id: d, type: noop}\n",
    );
    let wire = analysis_to_proto(&plan, &analyze(&plan));
    assert_eq!(wire.waves.len(), 1);
    assert_eq!(wire.widest_wave, 4);
    assert_eq!(wire.max_parallelism, 2, "a and d; b and c wait for a");
    let blocked: Vec<(&str, Vec<&str>)> = wire
        .blocked
        .iter()
        .map(|b| {
            (
                b.task_id.as_str(),
                b.blocked_by.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(blocked, vec![("b", vec!["a"]), ("c", vec!["a"])]);
    let ab = &wire.conflicts[0];
    assert_eq!(
        (ab.first_task_id.as_str(), ab.second_task_id.as_str()),
        ("a", "b")
    );
    assert_eq!(ab.reasons.len(), 2, "x and y");
    assert_eq!(ab.reason, ab.reasons.first().cloned());
    let ac = &wire.conflicts[1];
    match ac.reasons[0].reason.as_ref() {
        Some(v1::conflict_reason::Reason::Declared(declared)) => {
            assert_eq!(declared.declared_by, "c");
        }
        other => panic!("expected a declared conflict, got {other:?}"),
    }
}

fn arb_plan_text() -> impl Strategy<Value = String> {
    // Up to 12 tasks; each may depend on earlier ones, touch one of three files, carry a
    // timeout, a queue, its own failure chain or a relationship to an earlier task.
    let task = (
        proptest::collection::vec(any::<prop::sample::Index>(), 0..3),
        proptest::option::of((0usize..3, 0usize..4)),
        proptest::option::of(1u64..100_000),
        any::<bool>(),
        proptest::option::of(0usize..4),
        proptest::option::of((any::<prop::sample::Index>(), 0usize..6)),
    );
    proptest::collection::vec(task, 1..12).prop_map(|tasks| {
        let mut text = String::from("name: prop\ntasks:\n");
        for (i, (deps, file, timeout, queue, chain, relation)) in tasks.into_iter().enumerate() {
            text.push_str(&format!("- id: t{i}\n  type: noop\n"));
            if i > 0 {
                let deps: Vec<String> = deps
                    .iter()
                    .map(|d| format!("t{}", d.index(i)))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                if !deps.is_empty() {
                    text.push_str(&format!("  depends_on: [{}]\n", deps.join(", ")));
                }
                if let Some((target, kind)) = relation {
                    let kind = [
                        "conflicts_with",
                        "related_to",
                        "blocks",
                        "implements",
                        "enables",
                        "inspired_by",
                    ][kind];
                    // `blocks` points forward: the earlier task waits for this one would be a
                    // cycle when it is also a dependency, so it targets nothing earlier.
                    if kind != "blocks" {
                        text.push_str(&format!(
                            "  relationships: [{{type: {kind}, target: t{}}}]\n",
                            target.index(i)
                        ));
                    }
                }
            }
            if let Some((path, op)) = file {
                let op = ["CREATE", "UPDATE", "DELETE", "READ"][op];
                text.push_str(&format!("  files: [{{path: f{path}, op: {op}}}]\n"));
            }
            if let Some(ms) = timeout {
                text.push_str(&format!("  timeout: {ms}ms\n"));
            }
            if queue {
                text.push_str("  queue: q\n");
            }
            if let Some(chain) = chain {
                let chain = [
                    "[skip]",
                    "[reassign, abort]",
                    "[{retry: {max: 2}}]",
                    "[pause]",
                ][chain];
                text.push_str(&format!("  on_failure: {chain}\n"));
            }
        }
        text
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn any_valid_plan_survives_the_wire(text in arb_plan_text()) {
        let plan = compile_str(&text, &Limits::default());
        prop_assume!(plan.is_ok());
        let plan = plan.expect("checked above");
        let again = compile_wire_plan(&plan::to_proto(&plan), &Limits::default());
        prop_assert_eq!(again.as_ref().ok(), Some(&plan), "{}", text);
        let json = compile_str(&canonical_spec_json(&plan), &Limits::default());
        prop_assert_eq!(json.as_ref().ok(), Some(&plan), "{}", text);
    }
}
