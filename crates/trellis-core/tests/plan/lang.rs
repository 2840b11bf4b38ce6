//! The plan language: params, templates, for_each, and the flat spec `expand` returns.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{Value, json};
use trellis_core::plan::{
    Limits, Plan, PlanErrorKind, compile, compile_with_params, expand, parse_param_values,
    parse_spec,
};

fn spec(text: &str) -> trellis_core::plan::PlanSpec {
    match parse_spec(text, &Limits::default()) {
        Ok(spec) => spec,
        Err(errors) => panic!("spec should parse, got:\n{errors}"),
    }
}

fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, Value> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    parse_param_values(&pairs).expect("param values parse")
}

fn compile_ok(text: &str, params: &[(&str, &str)]) -> Plan {
    match compile_with_params(spec(text), &values(params), &Limits::default()) {
        Ok(plan) => plan,
        Err(errors) => panic!("plan should compile, got:\n{errors}"),
    }
}

/// Returns every error as `path: message` plus ` [hint]` when there is one.
fn errors_of(text: &str, params: &[(&str, &str)]) -> Vec<String> {
    match compile_with_params(spec(text), &values(params), &Limits::default()) {
        Ok(_) => panic!("plan should not compile:\n{text}"),
        Err(errors) => errors
            .iter()
            .map(|e| match &e.hint {
                Some(hint) => format!("{e} [{hint}]"),
                None => e.to_string(),
            })
            .collect(),
    }
}

/// Checks the flat spec round trip: expanding, writing the flat spec as JSON, reading it back
/// and compiling gives the plan compiled from the original; expanding the flat spec again
/// changes nothing.
fn check_round_trip(text: &str, params: &BTreeMap<String, Value>) {
    let original = spec(text);
    let plan = compile_with_params(original.clone(), params, &Limits::default());
    let flat = expand(original, params);
    let (plan, flat) = match (plan, flat) {
        (Ok(plan), Ok(flat)) => (plan, flat),
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "expand and compile disagree on the errors");
            return;
        }
        (plan, flat) => panic!("expand and compile disagree: {plan:?} vs {flat:?}"),
    };
    assert!(flat.params.is_empty());
    let json = serde_json::to_string(&flat).expect("a flat spec serialises");
    let reread = parse_spec(&json, &Limits::default()).expect("the flat spec parses");
    assert_eq!(reread, flat, "the flat spec survives JSON");
    let again = compile(reread.clone(), &Limits::default()).expect("the flat spec compiles");
    assert_eq!(again, plan, "the flat spec compiles to the same plan");
    assert_eq!(
        expand(reread, &BTreeMap::new()).expect("a flat spec expands"),
        flat,
        "expansion is idempotent"
    );
}

const PARAMS: &str = r#"
name: deploy-${params.env}
params:
  env: {type: string, description: target environment}
  replicas: {type: integer, default: 2}
  services: {type: list, default: [api, web]}
  dry_run: {type: boolean, default: false}
tasks:
  - id: build-${params.env}
    type: shell
    queue: builders-${params.env}
    timeout: ${params.replicas}m
    input:
      command: ["deploy", "--env=${params.env}", "--replicas=${params.replicas}"]
      services: ${params.services}
      dry_run: ${params.dry_run}
      literal: "cost $${HOME} ${params.env}"
  - {id: check, type: noop, depends_on: ["build-${params.env}"]}
"#;

#[test]
fn params_substitute_as_text_or_as_whole_values() {
    let plan = compile_ok(PARAMS, &[("env", "prod")]);
    assert_eq!(plan.name, "deploy-prod");
    let build = &plan.tasks[0];
    assert_eq!(build.id, "build-prod");
    assert_eq!(build.queue, "builders-prod");
    assert_eq!(build.timeout, Some(std::time::Duration::from_secs(120)));
    assert_eq!(
        build.input,
        json!({
            "command": ["deploy", "--env=prod", "--replicas=2"],
            "services": ["api", "web"],
            "dry_run": false,
            "literal": "cost ${HOME} prod",
        })
    );
    assert_eq!(plan.deps[1], vec![0]);

    let plan = compile_ok(
        PARAMS,
        &[("env", "dev"), ("services", r#"["a"]"#), ("replicas", "5")],
    );
    assert_eq!(plan.tasks[0].input["services"], json!(["a"]));
    assert_eq!(plan.tasks[0].input["command"][2], json!("--replicas=5"));
    check_round_trip(PARAMS, &values(&[("env", "prod")]));
}

#[test]
fn param_errors_are_precise() {
    assert_eq!(
        errors_of(PARAMS, &[]),
        vec![
            r#"params.env: param "env" is required: it has no default and no value was given [give it a value (e.g. --param env=...) or a default]"#
        ]
    );
    assert_eq!(
        errors_of(
            PARAMS,
            &[("env", "prod"), ("replicas", "two"), ("service", "[]")]
        ),
        vec![
            r#"params.service: a value was given for "service", but the plan declares no such param [did you mean "services"?]"#,
            r#"params.replicas: param "replicas" must be an integer, got string "two""#,
        ]
    );
    assert_eq!(
        errors_of(PARAMS, &[("env", "3")]),
        vec![
            r#"params.env: param "env" must be a string, got number 3 [values are read as JSON: quote it to pass text, env='"3"']"#
        ]
    );
    let text = "name: p\nparams: {env: {default: prod}}\ntasks:\n  - {id: a, type: noop, input: {x: '${params.evn}', y: '${item}', z: '${params.env'}}\n";
    assert_eq!(
        errors_of(text, &[]),
        vec![
            r#"tasks[0].input.x: unknown param "evn" in ${params.evn} [did you mean "env"?]"#,
            "tasks[0].input.y: ${item} is defined only in a task with for_each",
            r#"tasks[0].input.z: unterminated reference in "${params.env" [close it with `}`, or write $${ for a literal ${]"#,
        ]
    );
    let text = "name: p\nparams: {l: {default: [1]}}\ntasks:\n  - {id: a, type: noop, queue: 'q-${params.l}'}\n";
    assert_eq!(
        errors_of(text, &[]),
        vec!["tasks[0].queue: ${params.l} is a list, which cannot be written into text"]
    );
    let text = "name: p\nparams: {n: {type: number, default: x}}\ntasks: [{id: a, type: noop}]\n";
    let errors = compile(spec(text), &Limits::default()).expect_err("bad default");
    assert_eq!(errors.errors()[0].path, "params.n.default");
    assert_eq!(errors.errors()[0].kind, PlanErrorKind::InvalidValue);
}

#[test]
fn param_values_are_json_or_plain_text() {
    let parsed = values(&[
        ("env", "prod"),
        ("n", "3"),
        ("list", r#"["a", "b"]"#),
        ("quoted", r#""3""#),
        ("flag", "true"),
        ("broken", "[1, "),
    ]);
    assert_eq!(parsed["env"], json!("prod"));
    assert_eq!(parsed["n"], json!(3));
    assert_eq!(parsed["list"], json!(["a", "b"]));
    assert_eq!(parsed["quoted"], json!("3"));
    assert_eq!(parsed["flag"], json!(true));
    assert_eq!(parsed["broken"], json!("[1, "));
    let twice = parse_param_values(&[
        ("a".to_owned(), "1".to_owned()),
        ("a".to_owned(), "2".to_owned()),
    ]);
    assert!(twice.is_err());
}

/// A string made of literal text, escaped `$${` and references to the param `p`.
fn arb_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z ${}]{0,4}".prop_map(|s| s.replace("${", "$${")),
        Just("$${".to_owned()),
        Just("${params.p}".to_owned()),
    ];
    prop::collection::vec(piece, 0..4).prop_map(|pieces| pieces.concat())
}

proptest! {
    #[test]
    fn flat_specs_round_trip(
        texts in prop::collection::vec(arb_text(), 1..6),
        deps in prop::collection::vec(any::<prop::sample::Index>(), 1..6),
        value in "[a-z${}]{0,6}",
        whole in any::<bool>(),
    ) {
        let mut text = String::from("name: rt\nparams: {p: {default: x}, l: {type: list, default: [1, '${x}']}}\ntasks:\n");
        for (i, t) in texts.iter().enumerate() {
            let input = if whole && i == 0 { "${params.l}".to_owned() } else { t.clone() };
            text.push_str(&format!(
                "  - id: t{i}\n    type: noop\n    input: {{s: {}, k: {}}}\n",
                serde_json::to_string(&input).expect("a string serialises"),
                serde_json::to_string(t).expect("a string serialises"),
            ));
            if i > 0 {
                text.push_str(&format!("    depends_on: [t{}]\n", deps[i % deps.len()].index(i)));
            }
        }
        let params = BTreeMap::from([("p".to_owned(), Value::String(value))]);
        check_round_trip(&text, &params);
    }
}

const SERVICES: &str = r#"
name: services
params:
  services: {type: list, default: [api, web]}
templates:
  deploy:
    type: shell
    queue: deployers
    timeout: 10m
    input: {command: [deploy], region: eu}
tasks:
  - {id: build, type: noop}
  - id: deploy
    use: deploy
    for_each: ${params.services}
    depends_on: [build]
    input: {service: "${item}", slot: "slot-${index}", n: "${index}"}
  - {id: smoke, use: deploy, input: {region: us}, depends_on: [deploy]}
  - id: shard-${index}
    type: noop
    for_each: [{name: a, size: 1}, {name: b, size: 2}]
    input: {name: "${item.name}", size: "${item.size}"}
"#;

#[test]
fn templates_merge_and_for_each_generates_and_fans_in() {
    let plan = compile_ok(SERVICES, &[]);
    let ids: Vec<&str> = plan.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "build",
            "deploy-api",
            "deploy-web",
            "smoke",
            "shard-0",
            "shard-1"
        ]
    );
    let api = &plan.tasks[1];
    assert_eq!(api.task_type, "shell");
    assert_eq!(api.queue, "deployers");
    assert_eq!(api.timeout, Some(std::time::Duration::from_secs(600)));
    assert_eq!(
        api.input,
        json!({"command": ["deploy"], "region": "eu", "service": "api", "slot": "slot-0", "n": 0})
    );
    assert_eq!(plan.deps[1], vec![0]);
    assert_eq!(
        plan.tasks[3].input,
        json!({"command": ["deploy"], "region": "us"})
    );
    assert_eq!(plan.deps[3], vec![1, 2], "smoke waits for every deploy");
    assert_eq!(plan.tasks[5].input, json!({"name": "b", "size": 2}));

    // Items that are not usable as ids (or repeat) give index suffixes.
    let plan = compile_ok(SERVICES, &[("services", r#"["a b", "c"]"#)]);
    assert_eq!(plan.tasks[1].id, "deploy-0");
    assert_eq!(plan.tasks[2].input["service"], json!("c"));
    // An empty list makes no task, and depending on it waits for nothing.
    let plan = compile_ok(SERVICES, &[("services", "[]")]);
    assert_eq!(plan.tasks[1].id, "smoke");
    assert!(plan.deps[1].is_empty());
    check_round_trip(SERVICES, &BTreeMap::new());
}

#[test]
fn template_and_for_each_errors_point_at_the_source() {
    let text = "name: p\ntemplates:\n  base: {type: noop, queu: q}\n  named: {id: x, type: noop}\ntasks:\n  - {id: a, use: bsae}\n";
    assert_eq!(
        errors_of(text, &[]),
        vec![
            "templates.base.queu: unknown field `queu`, expected one of `id`, `type`, `use`, `for_each`, `queue`, `input`, `files`, `depends_on`, `timeout`, `fallback`, `on_failure`, `retry`, `relationships`, `route`, `validate` [did you mean `queue`?]",
            "templates.named.id: a template cannot have `id` (give it on the tasks that use the template)",
        ]
    );
    let text = "name: p\ntemplates:\n  base: {type: noop}\ntasks:\n  - {id: a, use: bsae}\n";
    assert_eq!(
        errors_of(text, &[]),
        vec![r#"tasks[0].use: unknown template "bsae" [did you mean "base"?]"#]
    );
    let text = "name: p\nparams: {n: {default: 3}}\ntasks:\n  - {id: a, type: noop, for_each: '${params.n}'}\n  - {id: b, type: noop, for_each: {x: 1}}\n";
    assert_eq!(
        errors_of(text, &[]),
        vec![
            "tasks[0].for_each: for_each must be a list, got number 3 [give a list ([a, b]) or a reference to a list param (${params.x})]",
            "tasks[1].for_each: for_each must be a list, got an object [give a list ([a, b]) or a reference to a list param (${params.x})]",
        ]
    );
    let text = "name: p\ntasks:\n  - {id: gen, type: noop, for_each: [a, b]}\n  - {id: x, type: noop, depends_on: [gen, nope]}\n  - {id: y, type: noop, for_each: [1], depends_on: [x, y]}\n";
    assert_eq!(
        errors_of(text, &[]),
        vec![
            r#"tasks[1].depends_on[1]: unknown task "nope""#,
            r#"tasks[2].depends_on[1]: task "y-1" depends on itself (in task "y-1", made by for_each from item 0)"#,
        ]
    );
}

#[test]
fn for_each_cannot_pass_the_task_limit() {
    let limits = Limits {
        max_tasks: 3,
        ..Limits::default()
    };
    let text = "name: p\ntasks:\n  - {id: a, type: noop, for_each: [1, 2, 3, 4, 5]}\n";
    let errors = compile(spec(text), &limits).expect_err("over the limit");
    assert_eq!(
        errors.to_string(),
        "tasks: plan has more than 3 tasks once for_each is expanded"
    );
}

#[test]
fn routes_are_checked_and_imply_their_dependency() {
    let text = "name: p\ntasks:\n  - {id: c, type: noop, route: {path: a.b, cases: {x: [t]}, default: [u]}}\n  - {id: t, type: noop}\n  - {id: u, type: noop}\n";
    let plan = compile_ok(text, &[]);
    assert_eq!(plan.deps[1], vec![0]);
    assert_eq!(plan.deps[2], vec![0]);
    let condition = plan.tasks[2].condition.as_ref().expect("u is routed");
    assert_eq!(condition.pointer, "/a/b");
    assert_eq!(
        condition.case,
        trellis_core::plan::RouteCase::Default(vec!["x".to_owned()])
    );
    let text = "name: p\ntasks:\n  - {id: c, type: noop, route: {cases: {x: [t, fxi, c], y: [t]}}}\n  - {id: t, type: noop}\n  - {id: fix, type: noop}\n  - {id: d, type: noop, depends_on: [e], route: {default: [e]}}\n  - {id: e, type: noop}\n  - {id: f, type: noop, route: {}}\n";
    assert_eq!(
        errors_of(text, &[]),
        vec![
            r#"tasks[0].route.cases.x[1]: unknown task "fxi" [did you mean "fix"?]"#,
            r#"tasks[0].route.cases.x[2]: task "c" cannot route to itself"#,
            r#"tasks[0].route.cases.y[0]: task "t" is already routed at tasks[0].route.cases.x[0] [a task belongs to one case of one route; give the other case its own task]"#,
            "tasks[5].route: route has no cases and no default [list the tasks each output value runs: {path: /kind, cases: {bug: [fix]}, default: [triage]}]",
            "tasks[3].depends_on: dependency cycle: d -> e -> d [no task on a cycle can ever start: remove one of its dependencies]",
        ]
    );
}

#[test]
fn per_task_retry_queue_timeout_and_fallback() {
    use trellis_core::policy::{BackoffKind, FailureAction};
    let text = "
name: p
options: {failure: {default_action: skip, overrides: {flaky: retry}}}
tasks:
  - {id: a, type: shell, queue: gpu, timeout: 90s, fallback: b, retry: {max: 5, backoff: {kind: linear, base: 1s, cap: 10s}}}
  - {id: b, type: noop}
  - {id: c, type: flaky, retry: {max: 7}}
  - {id: d, type: noop}
";
    let plan = compile_ok(text, &[]);
    let a = &plan.tasks[0];
    assert_eq!(a.queue, "gpu");
    assert_eq!(a.timeout, Some(std::time::Duration::from_secs(90)));
    assert_eq!(a.fallback, Some(1));
    assert!(plan.tasks[1].is_fallback_only);
    match a.on_failure.steps.as_slice() {
        [
            FailureAction::Retry { max: 5, backoff },
            FailureAction::Skip,
        ] => {
            assert_eq!(backoff.kind, BackoffKind::Linear);
            assert_eq!(backoff.cap, std::time::Duration::from_secs(10));
        }
        other => panic!("unexpected chain {other:?}"),
    }
    // The shorthand replaces a plan-level retry instead of retrying twice.
    assert!(matches!(
        plan.tasks[2].on_failure.steps.as_slice(),
        [FailureAction::Retry { max: 7, .. }]
    ));
    assert_eq!(plan.tasks[3].on_failure.steps, vec![FailureAction::Skip]);
    assert_eq!(plan.tasks[3].queue, "noop");

    let text = "name: p\ntasks:\n  - {id: a, type: noop, retry: {max: 2, backoff: {base: soon}}, on_failure: [skip]}\n  - {id: b, type: noop, retry: {max: 2, backoff: {base: 2s, cap: 1s}}}\n";
    assert_eq!(
        errors_of(text, &[]),
        vec![
            "tasks[0].retry: a task gives either `retry` or `on_failure`, not both [put the retry in the chain: on_failure: [{retry: {max: 3}}, ...]]",
            "tasks[1].retry.backoff.cap: cap 1s is less than base 2s",
        ]
    );
}

#[test]
fn unsure_file_impacts_below_the_threshold_create_no_conflict() {
    let text = "
name: p
options: {min_conflict_confidence: 0.5}
tasks:
  - {id: a, type: noop, files: [{path: x, op: UPDATE, confidence: 0.4}, {path: y, op: UPDATE}]}
  - {id: b, type: noop, files: [{path: x, op: UPDATE}]}
  - {id: c, type: noop, files: [{path: y, op: DELETE, confidence: 0.5}]}
";
    let plan = compile_ok(text, &[]);
    assert_eq!(plan.options.min_conflict_confidence, 0.5);
    assert!(
        plan.conflicts[1].is_empty(),
        "a guess about x blocks nothing"
    );
    assert_eq!(
        plan.conflicts[0],
        vec![2],
        "0.5 is at the threshold and counts"
    );
    let pairs = trellis_core::analysis::analyze(&plan)
        .report(&plan)
        .conflicts;
    assert_eq!(pairs.len(), 1);
    // Without a threshold every estimate counts.
    let plan = compile_ok(
        &text.replace("options: {min_conflict_confidence: 0.5}\n", ""),
        &[],
    );
    assert_eq!(plan.conflicts[0], vec![1, 2]);
    let bad = "name: p\noptions: {min_conflict_confidence: 1.5}\ntasks: [{id: a, type: noop}]\n";
    assert_eq!(
        errors_of(bad, &[]),
        vec![
            "options.min_conflict_confidence: min_conflict_confidence 1.5 is outside 0.0–1.0 [0.0 (the default) lets every file estimate count; 1.0 only certain ones]"
        ]
    );
}

#[test]
fn every_example_plan_compiles_and_round_trips() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut n_examples = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/ exists") {
        let path = entry.expect("a readable directory entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable example");
        if let Err(errors) = compile(spec(&text), &Limits::default()) {
            panic!("{} does not compile:\n{errors}", path.display());
        }
        check_round_trip(&text, &BTreeMap::new());
        n_examples += 1;
    }
    assert!(n_examples >= 7, "only {n_examples} examples found");
    let services = std::fs::read_to_string(dir.join("services.yaml")).expect("services.yaml");
    let plan = compile_ok(
        &services,
        &[("env", "prod"), ("services", r#"["a","b","c"]"#)],
    );
    assert_eq!(plan.name, "services-prod");
    assert_eq!(plan.deps[plan.task_idx("smoke").expect("smoke")].len(), 3);
    assert_eq!(
        plan.tasks[0].input["literal"],
        json!("${HOME} is not a param")
    );
}

/// Reads a YAML or JSON file into a JSON value.
fn yaml_value(text: &str) -> Value {
    serde_yaml_ng::from_str(text).expect("the file is YAML")
}

#[test]
fn the_committed_json_schema_is_current() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schema/plan.schema.json");
    let mut generated = serde_json::to_string_pretty(&trellis_core::plan::json_schema())
        .expect("the schema serialises");
    generated.push('\n');
    if std::env::var_os("TRELLIS_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a parent directory"))
            .expect("schema/ can be created");
        std::fs::write(&path, &generated).expect("the schema can be written");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "schema/plan.schema.json is stale: regenerate it with TRELLIS_BLESS=1 cargo test -p trellis-core"
    );
}

#[test]
fn examples_fit_the_json_schema_and_broken_ones_can_fail_it() {
    let schema = trellis_core::plan::json_schema();
    let validator = jsonschema::validator_for(&schema).expect("the schema is a valid JSON Schema");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n_examples = 0;
    for entry in std::fs::read_dir(root.join("../../examples")).expect("examples/ exists") {
        let path = entry.expect("a readable directory entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let plan = yaml_value(&std::fs::read_to_string(&path).expect("a readable example"));
        let errors: Vec<String> = validator
            .iter_errors(&plan)
            .map(|e| format!("{}: {e}", e.instance_path))
            .collect();
        assert!(
            errors.is_empty(),
            "{} does not fit the schema: {errors:#?}",
            path.display()
        );
        n_examples += 1;
    }
    assert!(n_examples >= 7);
    // The schema is not a rubber stamp: shape errors are caught.
    for bad in [
        "name: p\ntasks: [{id: a, type: noop, depend_on: [b]}]\n",
        "name: p\ntasks: [{id: a, type: noop, files: [{path: x, op: MOVE}]}]\n",
        "name: p\ntasks: [{id: a, type: noop, on_failure: [{retry: 3}]}]\n",
        "tasks: [{id: a, type: noop}]\n",
    ] {
        assert!(
            !validator.is_valid(&yaml_value(bad)),
            "schema accepts {bad}"
        );
    }
    let good = "name: p\ntasks: [{id: a, type: noop, on_failure: [{retry: {max: 3, backoff: {kind: linear, jitter: 10%}}}, reassign, {fallback: b}, {pause: null}]}, {id: b, type: noop}]\n";
    assert!(validator.is_valid(&yaml_value(good)));
}

/// A queue is one subject token (workers consume `trellis.tasks.<queue>` and its fast lane
/// `trellis.tasks.~.<queue>`): a queue, or a type used as the queue, with `.`, spaces or
/// wildcards is refused where it is written.
#[test]
fn a_queue_that_is_not_one_subject_token_is_refused_where_it_is_written() {
    let errors = errors_of(
        "name: q\ntasks:\n- {id: a, type: noop, queue: gpu.large}\n- {id: b, type: \"my agent\"}\n- {id: c, type: noop, queue: \"gpu*\"}\n",
        &[],
    );
    assert_eq!(
        errors,
        vec![
            r#"tasks[0].queue: queue "gpu.large" contains `.` [a queue is one name without `.`, spaces, `*` or `>`, such as gpu-large]"#,
            r#"tasks[1].type: queue "my agent" contains whitespace [a queue is one name without `.`, spaces, `*` or `>`, such as gpu-large]"#,
            r#"tasks[2].queue: queue "gpu*" contains a NATS wildcard (`*` or `>`) [a queue is one name without `.`, spaces, `*` or `>`, such as gpu-large]"#,
        ]
    );
}
