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
            r#"params.replicas: param "replicas" must be a integer, got string "two""#,
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
