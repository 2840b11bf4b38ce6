//! The canonical encoding of compiled plans: `decode(encode(p)) == p` for fixtures and generated
//! plans, the bytes are pinned, sizes stay small, and decoding refuses broken or hostile bytes with
//! precise errors and never panics.

use std::fmt::Write as _;
use std::sync::Arc;

use proptest::prelude::*;
use trellis_core::ids::ExecutionId;
use trellis_core::machine::Execution;
use trellis_core::plan::{
    Limits, NotRun, PLAN_FORMAT_VERSION, Plan, PlanDecodeError, compile_str, decode, encode,
};
use trellis_core::policy::FailureAction;

use super::rich::arb_rich_plan;
use super::{arb_plan, compile_ok};

/// A plan with every feature the encoding carries: routes with cases and a default, fallbacks
/// (a task's own, named in a chain, and the policy's bare `fallback`), static subtasks, file and
/// declared conflicts, escalation chains, a per-type override, budgets, timeouts, `not_run`,
/// `tests`, metadata relationships, a queue of its own and inputs of every JSON kind.
const EVERYTHING: &str = r#"
name: everything
options:
  max_concurrency: 4
  global_timeout: 1h 30m
  pause_on_human_review: false
  min_conflict_confidence: 0.25
  budget: {max_tokens: 100000, max_cost: 2.5, on_exhausted: fail}
  failure:
    default_action: retry
    max_retries: 5
    backoff: {kind: linear, base: 200ms, cap: 10s, jitter: 20%}
    continue_on_partial_failure: true
    overrides: {shell: skip, flaky: fallback}
tasks:
  - id: classify
    type: noop
    input: {kind: feature, n: -3, ratio: 0.5, big: 18446744073709551615, ok: true, none: null, list: [1, "two", [3]], text: "é $${x} 漢"}
    route: {path: /kind, cases: {bug: [fix], feature: [build, document]}, default: [ask]}
  - {id: fix, type: shell, queue: gpu, timeout: 90s, files: [{path: src/lib.rs, op: UPDATE}]}
  - {id: build, type: noop, files: [{path: src/lib.rs, op: UPDATE, confidence: 0.3}, {path: src/main.rs, op: CREATE}]}
  - {id: document, type: noop, files: [{path: docs/guide.md, op: DELETE}, {path: docs/guide.md, op: READ}]}
  - id: ask
    type: question
    input: {text: "What kind of issue is this?", options: [bug, feature]}
    timeout: 250ms
  - id: api
    type: noop
    fallback: api-fallback
    depends_on: [classify]
    on_failure: [{retry: {max: 3, backoff: exponential}}, reassign, {fallback: api-fallback}, pause, skip, abort, fallback]
  - {id: api-fallback, type: noop}
  - {id: fl, type: flaky, fallback: fl-fb, depends_on: [api]}
  - {id: fl-fb, type: noop, on_failure: [{retry: {backoff: {kind: constant, jitter: 0.5}}}]}
  - {id: c, type: noop, retry: {max: 7}, relationships: [{type: conflicts_with, target: fix}]}
  - id: new-build
    type: noop
    relationships: [{type: supersedes, target: old-build}, {type: blocks, target: ship}]
  - {id: old-build, type: noop}
  - {id: build-again, type: noop, relationships: [{type: duplicate_of, target: build}]}
  - id: build-tests
    type: noop
    relationships: [{type: tests, target: build}]
    validate:
      - {name: lint, level: codebase, command: "cargo clippy -- -D warnings", timeout: 10m}
      - {name: health, level: api, http: {url: "https://svc.local/health", method: head, status: 204, body_contains: ok}}
      - {name: health-cmd, level: api, command: [curl, -f, "http://svc.local"]}
      - {name: screens, level: ui, command: [npx, playwright, test]}
  - id: review
    type: question
    relationships: [{type: subtask_of, target: ship}]
  - id: ship
    type: noop
    depends_on: [fix, build, document, ask]
    relationships:
      - {type: related_to, target: classify}
      - {type: implements, target: api}
      - {type: enables, target: build}
      - {type: inspired_by, target: new-build}
"#;

/// A small plan whose encoding is pinned below.
const PINNED: &str = "
name: pinned
options: {max_concurrency: 2}
tasks:
  - {id: a, type: noop, input: {n: 1}}
  - {id: b, type: shell, queue: q, depends_on: [a], timeout: 2s, files: [{path: f, op: UPDATE}]}
  - {id: c, type: noop, depends_on: [a], on_failure: [skip], relationships: [{type: conflicts_with, target: b}]}
";

/// The encoding of `PINNED`, format 1 (before `validate:`), which must still decode.
const PINNED_V1: &str = "9501a670696e6e65649602c0c39381a57265747279920394029200ce05f5e100923c0000c29093c0c000ca0000000092a46e6f6f70a57368656c6c9395a1610081a16e0190c095a162018091009ca17191029193a16601ca3f800000920200c0c0c2c0c09090c095a163008091009cc0910190c091a4736b6970c0c2c0c09091920201c0";

/// Returns `n` independent `noop` tasks, as the simplest large plan.
fn noop_plan(n: usize) -> String {
    let mut text = String::from("name: flat\ntasks:\n");
    for i in 0..n {
        writeln!(text, "  - {{id: task-{i}, type: noop}}").expect("writing to a string");
    }
    text
}

fn round_trips(plan: &Plan) -> Result<(), TestCaseError> {
    let bytes = encode(plan);
    let decoded = decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&decoded, plan);
    prop_assert_eq!(encode(&decoded), bytes, "the encoding is canonical");
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        write!(s, "{b:02x}").expect("writing to a string");
        s
    })
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digits"))
        .collect()
}

#[test]
fn every_feature_round_trips() {
    let plan = compile_ok(EVERYTHING);
    // The fixture does hold what it claims to.
    let t = |id: &str| &plan.tasks[plan.task_idx(id).expect("task exists")];
    assert!(t("fix").condition.is_some() && t("ask").condition.is_some());
    assert!(t("api-fallback").is_fallback_only && t("fl-fb").is_fallback_only);
    assert_eq!(
        t("fl").on_failure.steps,
        [FailureAction::Fallback {
            task: plan.task_idx("fl-fb").expect("fl-fb")
        }]
    );
    assert!(t("review").subtask_of.is_some());
    assert!(matches!(
        t("old-build").not_run,
        Some(NotRun::SupersededBy(_))
    ));
    assert!(matches!(
        t("build-again").not_run,
        Some(NotRun::DuplicateOf(_))
    ));
    assert!(!t("build-tests").tests.is_empty());
    assert_eq!(t("build-tests").validate.len(), 4);
    assert!(plan.conflicts.iter().any(|c| !c.is_empty()));
    round_trips(&plan).expect("round trip");
}

#[test]
fn every_example_round_trips() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/ exists") {
        let path = entry.expect("a readable directory entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let plan = compile_ok(&std::fs::read_to_string(&path).expect("a readable example"));
        if let Err(e) = round_trips(&plan) {
            panic!("{}: {e}", path.display());
        }
        n += 1;
    }
    assert!(n >= 7, "only {n} examples found");
}

/// The encoding of `PINNED`, format 2: a plan without checks keeps format 1's layout. If this
/// changes, the format changed: bump `PLAN_FORMAT_VERSION` and keep old bytes readable (see
/// `plan/encoding.rs`).
const PINNED_V2: &str = "9502a670696e6e65649602c0c39381a57265747279920394029200ce05f5e100923c0000c29093c0c000ca0000000092a46e6f6f70a57368656c6c9395a1610081a16e0190c095a162018091009ca17191029193a16601ca3f800000920200c0c0c2c0c09090c095a163008091009cc0910190c091a4736b6970c0c2c0c09091920201c0";

/// A plan with checks, whose encoding is pinned below.
const PINNED_CHECKS: &str = r#"
name: checked
tasks:
  - id: a
    type: noop
    validate:
      - {name: lint, level: codebase, command: make lint, timeout: 30s}
      - {name: up, level: api, http: {url: "http://h/up", body_contains: ok}}
"#;

/// The encoding of `PINNED_CHECKS`, format 2.
const PINNED_CHECKS_V2: &str = "9502a7636865636b656496c0c0c39381a57265747279920394029200ce05f5e100923c0000c29093c0c000ca0000000091a46e6f6f709195a1610080909dc09090c0c0c0c2c0c09090c09294a46c696e740081a7636f6d6d616e6493a27368a22d63a96d616b65206c696e74921e0094a275700181a46874747094a3474554ab687474703a2f2f682f7570ccc8a26f6b92cd012c00";

#[test]
fn the_bytes_are_pinned_and_old_bytes_decode() {
    let plan = compile_ok(PINNED);
    let bytes = encode(&plan);
    assert_eq!(hex(&bytes), PINNED_V2, "the encoding of format 2 changed");
    assert_eq!(decode(&unhex(PINNED_V1)).expect("format 1 decodes"), plan);
    let checked = compile_ok(PINNED_CHECKS);
    assert_eq!(
        hex(&encode(&checked)),
        PINNED_CHECKS_V2,
        "the encoding of checks changed"
    );
    assert_eq!(PLAN_FORMAT_VERSION, 2);
}

#[test]
fn a_plan_of_simple_tasks_takes_few_bytes_per_task() {
    for n in [20_000, 100_000] {
        let plan = compile_ok(&noop_plan(n));
        let bytes = encode(&plan);
        let per_task = bytes.len() as f64 / n as f64;
        eprintln!(
            "{n} independent noop tasks: {} bytes, {per_task:.1} bytes per task",
            bytes.len()
        );
        // The policy's chain, the queue and the derived lists are left out, and the fields most
        // tasks leave at their default take one byte together: what is left is the id and a
        // byte each for the task's array, its type, input, dependencies and the rest.
        assert!(per_task < 20.0, "{per_task:.1} bytes per task");
        assert_eq!(decode(&bytes).expect("decodes"), plan);
    }
}

/// A change that breaks a compiled plan.
type Edit = Box<dyn FnOnce(&mut Plan)>;

/// Encodes `plan` after `edit` and returns the error decoding gives.
fn refused(edit: impl FnOnce(&mut Plan)) -> String {
    let mut plan = compile_ok(
        "
name: p
tasks:
  - {id: a, type: noop, route: {cases: {x: [b]}}}
  - {id: b, type: noop, fallback: fb, relationships: [{type: conflicts_with, target: c}]}
  - {id: c, type: noop, depends_on: [a], relationships: [{type: tests, target: a}]}
  - {id: fb, type: noop}
",
    );
    edit(&mut plan);
    match decode(&encode(&plan)) {
        Ok(_) => panic!("decode accepted a broken plan"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn broken_plans_are_refused_naming_the_task_and_field() {
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|p| p.deps[2].push(9)),
            r#"tasks[2] ("c").deps[1]: task index 9 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| p.conflicts[1].push(7)),
            r#"tasks[1] ("b").conflicts[1]: task index 7 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| p.tasks[1].fallback = Some(4)),
            r#"tasks[1] ("b").fallback: task index 4 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| p.tasks[0].on_failure.steps = vec![FailureAction::Fallback { task: 5 }]),
            r#"tasks[0] ("a").on_failure[0].fallback: task index 5 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| p.tasks[3].subtask_of = Some(8)),
            r#"tasks[3] ("fb").subtask_of: task index 8 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| p.tasks[2].tests = vec![4]),
            r#"tasks[2] ("c").tests[0]: task index 4 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| p.tasks[2].relationships[0].target = 4),
            r#"tasks[2] ("c").relationships[0].target: task index 4 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| {
                if let Some(c) = &mut p.tasks[1].condition {
                    c.router = 6;
                }
            }),
            r#"tasks[1] ("b").condition.router: task index 6 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| {
                if let Some(c) = &mut p.tasks[1].condition {
                    c.router = 2;
                }
            }),
            r#"tasks[1] ("b").condition.router: router tasks[2] is not one of the task's dependencies"#,
        ),
        (
            Box::new(|p| p.tasks[3].not_run = Some(NotRun::DuplicateOf(4))),
            r#"tasks[3] ("fb").not_run: task index 4 is out of range (the plan has 4 tasks)"#,
        ),
        (
            Box::new(|p| p.tasks[3].id = "a".to_owned()),
            r#"tasks[3] ("a").id: duplicate task id (first used by tasks[0])"#,
        ),
        (
            Box::new(|p| p.conflicts[0].push(0)),
            r#"tasks[0] ("a").conflicts[0]: a task cannot conflict with itself"#,
        ),
        (
            Box::new(|p| p.conflicts[2].clear()),
            r#"tasks[1] ("b").conflicts[0]: conflicts with tasks[2] ("c"), which does not list it back"#,
        ),
        (
            Box::new(|p| p.conflicts[1].clear()),
            r#"tasks[2] ("c").conflicts[0]: conflicts with tasks[1] ("b"), which does not list it back"#,
        ),
        (
            Box::new(|p| {
                p.conflicts[1].push(2);
                p.conflicts[2].push(1);
            }),
            r#"tasks[1] ("b").conflicts[1]: lists tasks[2] twice"#,
        ),
        (
            Box::new(|p| p.deps[0].push(2)),
            r#"tasks[0] ("a").deps: dependency cycle: a -> c -> a"#,
        ),
        (
            Box::new(|p| p.deps[3].push(3)),
            r#"tasks[3] ("fb").deps: dependency cycle: fb -> fb"#,
        ),
        (
            Box::new(|p| {
                p.tasks[2].subtask_of = Some(3);
                p.tasks[3].subtask_of = Some(2);
            }),
            r#"tasks[2] ("c").subtask_of: subtask cycle: c -> fb -> c"#,
        ),
        (
            Box::new(|p| p.options.max_concurrency = Some(0)),
            "options.max_concurrency: must be at least 1: nothing could ever run",
        ),
        (
            Box::new(|p| {
                p.options.failure.default_action = FailureAction::Fallback { task: 10 };
            }),
            "options.failure.default_action: fallback task index 10 is out of range (the plan has 4 tasks)",
        ),
    ];
    for (edit, expected) in cases {
        assert_eq!(refused(edit), expected);
    }
    let empty = Plan {
        tasks: Vec::new(),
        deps: Vec::new(),
        dependents: Vec::new(),
        conflicts: Vec::new(),
        ..compile_ok(PINNED)
    };
    assert_eq!(
        decode(&encode(&empty)).map_err(|e| e.to_string()),
        Err("tasks: plan has no tasks".to_owned())
    );
}

#[test]
fn bytes_that_are_not_a_plan_are_refused() {
    let bytes = encode(&compile_ok(PINNED));
    let error = |bytes: &[u8]| decode(bytes).map(|_| ()).map_err(|e| e.to_string());
    let empty = error(&[]).expect_err("no bytes");
    assert!(
        empty.starts_with("plan bytes are malformed: plan header: "),
        "{empty}"
    );
    assert_eq!(
        error(&[0x90]),
        Err("plan bytes are malformed: plan is an empty array".to_owned())
    );
    let mut later = bytes.clone();
    later[1] = 3;
    assert_eq!(
        decode(&later),
        Err(PlanDecodeError::Format {
            found: 3,
            oldest: 1,
            newest: PLAN_FORMAT_VERSION
        }),
        "a later format is refused by its version"
    );
    assert_eq!(
        PlanDecodeError::Format {
            found: 2,
            oldest: 1,
            newest: 1
        }
        .to_string(),
        "plan encoding format 2 is not supported (this build reads formats 1 to 1)"
    );
    let mut trailing = bytes.clone();
    trailing.push(0xc0);
    assert_eq!(
        error(&trailing),
        Err("plan bytes are malformed: 1 bytes after the plan".to_owned())
    );
    assert!(error(&bytes[..bytes.len() - 1]).is_err(), "truncated");
    // Input nested deeper than the parsers accept (128) still decodes, on a test thread's stack.
    let mut nested = serde_json::json!(0);
    for _ in 0..200 {
        nested = serde_json::Value::Array(vec![nested]);
    }
    let mut plan = compile_ok(PINNED);
    plan.tasks[0].input = nested;
    assert_eq!(decode(&encode(&plan)), Ok(plan));
    // Input nested far deeper than that: refused, not a stack overflow.
    let mut nested = serde_json::json!(0);
    for _ in 0..10_000 {
        nested = serde_json::Value::Array(vec![nested]);
    }
    let mut deep_plan = compile_ok(PINNED);
    deep_plan.tasks[0].input = nested;
    let t0 = std::time::Instant::now();
    let deep = encode_in_thread(deep_plan);
    eprintln!("encoded {} bytes in {:?}", deep.len(), t0.elapsed());
    let refused = error(&deep).expect_err("too deep");
    eprintln!("decoded in {:?}", t0.elapsed());
    assert!(refused.contains("depth limit exceeded"), "{refused}");
}

/// Encodes in a thread with a large stack: encoding JSON nested 10,000 deep recurses that deep.
fn encode_in_thread(plan: Plan) -> Vec<u8> {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let bytes = encode(&plan);
            // Dropping the value recurses as deep; do it here too.
            drop(plan);
            bytes
        })
        .expect("thread starts")
        .join()
        .expect("encoding does not panic")
}

proptest! {
    #[test]
    fn generated_plans_round_trip(text in arb_rich_plan()) {
        let plan = match compile_str(&text, &Limits::default()) {
            Ok(plan) => plan,
            Err(errors) => return Err(TestCaseError::fail(format!("{errors}\n{text}"))),
        };
        round_trips(&plan)?;
    }

    #[test]
    fn conflict_heavy_plans_round_trip(text in arb_plan()) {
        round_trips(&compile_ok(&text))?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_decoded(&bytes)?;
    }

    #[test]
    fn mutated_encodings_never_panic(
        text in arb_rich_plan(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..4u8), 1..6),
    ) {
        let plan = compile_str(&text, &Limits::default()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut bytes = encode(&plan);
        for (at, byte, how) in edits {
            if bytes.is_empty() {
                break;
            }
            let at = at.index(bytes.len());
            match how {
                0 => bytes[at] = byte,
                1 => bytes[at] ^= 1 << (byte % 8),
                2 => bytes.truncate(at),
                _ => bytes.insert(at, byte),
            }
        }
        check_decoded(&bytes)?;
    }
}

/// Decodes `bytes`; a plan that decodes must be one the state machine can start and that
/// encodes to bytes decoding to the same plan.
fn check_decoded(bytes: &[u8]) -> Result<(), TestCaseError> {
    let Ok(plan) = decode(bytes) else {
        return Ok(());
    };
    prop_assert_eq!(decode(&encode(&plan)), Ok(plan.clone()));
    let plan = Arc::new(plan);
    let execution = Execution::start(ExecutionId::derived(1, 2), plan, 1, 0);
    let _ = execution.decide(0);
    let _ = execution.progress(0);
    Ok(())
}
