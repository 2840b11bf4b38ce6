//! Plan compiler and analysis tests: precise errors, relationship lowering, waves and conflicts.

/// One module, so `cargo test -p trellis-core plan` selects every test here.
mod plan {
    #[path = "broken.rs"]
    mod broken;
    #[path = "encoding.rs"]
    mod encoding;
    #[path = "lang.rs"]
    mod lang;
    #[path = "rich.rs"]
    mod rich;

    use std::fmt::Write as _;
    use std::time::Duration;

    use proptest::prelude::*;
    use trellis_core::analysis::{ConflictReason, analyze};
    use trellis_core::plan::{
        FileOp, Limits, NotRun, Plan, PlanErrorKind, RelationshipKind, compile_bytes, compile_str,
    };
    use trellis_core::policy::{BackoffKind, FailureAction};

    fn compile_ok(text: &str) -> Plan {
        match compile_str(text, &Limits::default()) {
            Ok(plan) => plan,
            Err(errors) => panic!("plan should compile, got:\n{errors}"),
        }
    }

    /// Compiles `text` and returns every error's Display, one per line.
    fn errors_of(text: &str) -> Vec<String> {
        match compile_str(text, &Limits::default()) {
            Ok(_) => panic!("plan should not compile:\n{text}"),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    fn check_error(text: &str, expected: &str) {
        let errors = errors_of(text);
        assert!(
            errors.iter().any(|e| e == expected),
            "expected error {expected:?}, got {errors:#?}"
        );
    }

    fn idx(plan: &Plan, id: &str) -> usize {
        plan.task_idx(id).expect("task exists")
    }

    const SEED_001: &str = "
name: seed-001
tasks:
  - {id: T-001, type: noop}
  - {id: T-002, type: noop}
  - {id: T-003, type: noop, depends_on: [T-001]}
  - {id: T-004, type: noop, depends_on: [T-002]}
  - {id: T-005, type: noop, depends_on: [T-003, T-004]}
";

    #[test]
    fn seed_001_waves() {
        let plan = compile_ok(SEED_001);
        let analysis = analyze(&plan);
        let report = analysis.report(&plan);
        assert_eq!(
            report.waves,
            vec![
                vec!["T-001", "T-002"],
                vec!["T-003", "T-004"],
                vec!["T-005"]
            ]
        );
        assert_eq!(report.critical_path.tasks, ["T-001", "T-003", "T-005"]);
        assert_eq!(analysis.max_parallelism.widest_wave, 2);
    }

    #[test]
    fn unknown_dependency_is_reported_with_its_path() {
        check_error(
            "
name: p
tasks:
  - {id: a, type: noop}
  - {id: b, type: noop}
  - {id: c, type: noop}
  - {id: d, type: noop, depends_on: [api]}
",
            r#"tasks[3].depends_on[0]: unknown task "api""#,
        );
    }

    #[test]
    fn checks_compile_with_their_defaults() {
        let plan = compile_ok(
            r#"
name: p
tasks:
  - id: a
    type: noop
    validate:
      - {name: lint, level: codebase, command: "make lint"}
      - {name: up, level: api, http: {url: "http://h:8080/up"}, timeout: 10s}
      - {name: ui.smoke, level: ui, command: [npx, playwright, test]}
"#,
        );
        let checks = &plan.tasks[0].validate;
        assert_eq!(
            checks[0].probe,
            trellis_core::plan::Probe::Command(vec!["sh".into(), "-c".into(), "make lint".into()])
        );
        assert_eq!(checks[0].timeout, Duration::from_secs(300));
        assert_eq!(
            checks[1].probe,
            trellis_core::plan::Probe::Http {
                method: "GET".into(),
                url: "http://h:8080/up".into(),
                status: 200,
                body_contains: None,
            }
        );
        assert_eq!(checks[1].timeout, Duration::from_secs(10));
        assert_eq!(checks[2].level, trellis_core::plan::CheckLevel::Ui);
    }

    #[test]
    fn bad_checks_get_precise_errors() {
        let errors = errors_of(
            r#"
name: p
tasks:
  - id: a
    type: noop
    validate:
      - {name: lint, level: codebase}
      - {name: lint, level: codebase, command: ""}
      - {name: up, level: codebase, http: {url: "http://h/up"}}
      - {name: "bad name", level: api, http: {url: "ftp://h", status: 700, method: "GE T"}}
      - {name: both, level: api, command: x, http: {url: "http://h"}, timeout: -5s}
"#,
        );
        for expected in [
            r#"tasks[0].validate[0]: check "lint" has neither `command` nor `http`"#,
            r#"tasks[0].validate[1].name: the task already has a check named "lint""#,
            "tasks[0].validate[1].command: command must not be empty",
            "tasks[0].validate[2].http: an `http` check is an api check, not a codebase one",
            r#"tasks[0].validate[3].name: check name "bad name" contains ' ': use letters, digits, `_`, `.` and `-`"#,
            r#"tasks[0].validate[3].http.url: "ftp://h" is not an http:// or https:// URL with a host"#,
            r#"tasks[0].validate[3].http.method: "GE T" is not an HTTP method (GET, POST, HEAD, ...)"#,
            "tasks[0].validate[3].http.status: status 700 is outside 100–599",
            r#"tasks[0].validate[4]: check "both" has both `command` and `http`: give one"#,
        ] {
            assert!(
                errors.iter().any(|e| e.starts_with(expected)),
                "expected {expected:?}, got {errors:#?}"
            );
        }
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("tasks[0].validate[4].timeout: invalid duration \"-5s\"")),
            "a negative timeout is refused: {errors:#?}"
        );
        // An unknown level is a parse error naming the field and the levels there are.
        let errors = errors_of(
            "name: p\ntasks:\n  - {id: a, type: noop, validate: [{name: x, level: db, command: y}]}\n",
        );
        assert!(
            errors[0].starts_with(
                "tasks[0].validate[0].level: unknown variant `db`, expected one of `codebase`, `api`, `ui`"
            ),
            "{errors:#?}"
        );
    }

    #[test]
    fn every_error_is_reported_not_just_the_first() {
        let errors = errors_of(
            "
name: p
options: {max_concurrency: 0, global_timeout: 5 parsecs}
tasks:
  - {id: a, type: noop, depends_on: [x], timeout: soon}
  - {id: a, type: noop, fallback: nowhere}
  - {id: 'b c', type: noop, depends_on: ['b c']}
",
        );
        let expected = [
            "options.max_concurrency: must be at least 1 (leave it out for no limit)",
            r#"tasks[1].id: duplicate task id "a" (first declared at tasks[0])"#,
            r#"tasks[0].depends_on[0]: unknown task "x""#,
            r#"tasks[1].fallback: unknown task "nowhere""#,
            r#"tasks[2].depends_on[0]: task "b c" depends on itself"#,
        ];
        for e in expected {
            assert!(
                errors.iter().any(|got| got == e),
                "missing {e:?} in {errors:#?}"
            );
        }
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("options.global_timeout: invalid duration \"5 parsecs\"")),
            "{errors:#?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("tasks[0].timeout: invalid duration \"soon\"")),
            "{errors:#?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("tasks[2].id: task id \"b c\" contains ' '")),
            "{errors:#?}"
        );
    }

    #[test]
    fn cycles_are_reported_with_their_path() {
        check_error(
            "
name: p
tasks:
  - {id: x, type: noop}
  - {id: b, type: noop, depends_on: [c]}
  - {id: a, type: noop, depends_on: [b]}
  - {id: c, type: noop, depends_on: [a]}
",
            "tasks[1].depends_on: dependency cycle: b -> c -> a -> b",
        );
        // A cycle closed by `blocks` points at the relationship.
        check_error(
            "
name: p
tasks:
  - {id: a, type: noop, relationships: [{type: blocks, target: b}]}
  - {id: b, type: noop, relationships: [{type: blocks, target: a}]}
",
            "tasks[1].relationships[0]: dependency cycle: a -> b -> a",
        );
    }

    #[test]
    fn two_separate_cycles_are_both_reported() {
        let errors = errors_of(
            "
name: p
tasks:
  - {id: a, type: noop, depends_on: [b]}
  - {id: b, type: noop, depends_on: [a]}
  - {id: c, type: noop, depends_on: [d, a]}
  - {id: d, type: noop, depends_on: [c]}
",
        );
        assert_eq!(
            errors,
            [
                "tasks[0].depends_on: dependency cycle: a -> b -> a",
                "tasks[2].depends_on: dependency cycle: c -> d -> c"
            ]
        );
    }

    /// Compiles `text` and returns every error's Display and hint.
    fn errors_with_hints(text: &str) -> Vec<(String, Option<String>)> {
        match compile_str(text, &Limits::default()) {
            Ok(_) => panic!("plan should not compile:\n{text}"),
            Err(errors) => errors
                .iter()
                .map(|e| (e.to_string(), e.hint.clone()))
                .collect(),
        }
    }

    #[test]
    fn unknown_names_get_did_you_mean_hints() {
        let errors = errors_with_hints(
            "name: p\ntasks:\n  - {id: schema, type: noop}\n  - {id: api, type: noop, depends_on: [shcema], fallback: apifallback, relationships: [{type: related_to, target: SCHEMA}]}\n  - {id: api-fallback, type: noop}\n  - {id: c, type: noop, depends_on: [zzzzzz]}\n",
        );
        assert_eq!(
            errors,
            vec![
                (
                    r#"tasks[1].depends_on[0]: unknown task "shcema""#.to_owned(),
                    Some(r#"did you mean "schema"?"#.to_owned())
                ),
                (
                    r#"tasks[1].fallback: unknown task "apifallback""#.to_owned(),
                    Some(r#"did you mean "api-fallback"?"#.to_owned())
                ),
                (
                    r#"tasks[1].relationships[0].target: unknown task "SCHEMA""#.to_owned(),
                    Some(r#"did you mean "schema"?"#.to_owned())
                ),
                (
                    r#"tasks[3].depends_on[0]: unknown task "zzzzzz""#.to_owned(),
                    None
                ),
            ]
        );
        let errors =
            errors_with_hints("name: p\ntasks:\n  - id: a\n    type: noop\n    depend_on: [b]\n");
        assert_eq!(errors[0].1.as_deref(), Some("did you mean `depends_on`?"));
        let errors = errors_with_hints(
            "name: p\ntasks:\n  - {id: a, type: noop, files: [{path: x, op: CRAETE}]}\n",
        );
        assert_eq!(errors[0].1.as_deref(), Some("did you mean `CREATE`?"));
    }

    #[test]
    fn parse_errors_carry_path_and_location() {
        check_error(
            "name: p\ntasks:\n  - id: a\n    type: noop\n    depends: [b]\n",
            "tasks[0].depends: unknown field `depends`, expected one of `id`, `type`, `use`, `for_each`, `queue`, `input`, `files`, `depends_on`, `timeout`, `fallback`, `on_failure`, `retry`, `relationships`, `route`, `validate` (line 5, column 5)",
        );
        let errors =
            errors_of("name: p\ntasks:\n  - {id: a, type: noop}\n  - id: b\n    type: x: y\n");
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0],
            "tasks[1]: mapping values are not allowed in this context (line 5, column 12)"
        );
        let errors =
            errors_of("name: p\ntasks:\n  - {id: a, type: noop, files: [{path: x, op: MOVE}]}\n");
        assert!(
            errors[0].starts_with("tasks[0].files[0].op: unknown variant `MOVE`"),
            "{errors:?}"
        );
    }

    #[test]
    fn json_input_gets_json_errors() {
        let plan = compile_ok(r#"{"name": "j", "tasks": [{"id": "a", "type": "noop"}]}"#);
        assert_eq!(plan.len(), 1);
        let errors = errors_of(r#"{"name": "j", "tasks": [{"id": "a", "type": 3}]}"#);
        assert_eq!(
            errors,
            ["tasks[0].type: invalid type: integer `3`, expected a string (line 1, column 45)"]
        );
        // YAML flow style starting with `{` is still accepted.
        compile_ok("{name: j, tasks: [{id: a, type: noop}]}");
    }

    #[test]
    fn input_problems_are_errors_not_panics() {
        let limits = Limits::default();
        let kind = |bytes: &[u8]| match compile_bytes(bytes, &limits) {
            Ok(_) => panic!("should fail"),
            Err(errors) => errors.errors()[0].kind,
        };
        assert_eq!(kind(b""), PlanErrorKind::Empty);
        assert_eq!(kind(b"  \n# just a comment\n"), PlanErrorKind::Parse);
        assert_eq!(kind(b"name: p\ntasks: []\n"), PlanErrorKind::Empty);
        assert_eq!(kind(b"name: p\ntasks: [\xff]\n"), PlanErrorKind::Encoding);
        let small = Limits {
            max_input_bytes: 10,
            ..Limits::default()
        };
        let errors = compile_bytes(&[b'x'; 11], &small).expect_err("too large");
        assert_eq!(
            errors.to_string(),
            "input is 11 bytes, over the limit of 10 bytes"
        );
        // Pseudo-random garbage, as text and as bytes.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let garbage: Vec<u8> = (0..1_000_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        assert!(compile_bytes(&garbage, &limits).is_err());
        let ascii: Vec<u8> = garbage.iter().map(|b| b % 95 + 32).collect();
        assert!(compile_bytes(&ascii, &limits).is_err());
    }

    #[test]
    fn limits_are_enforced() {
        let limits = Limits {
            max_tasks: 2,
            max_id_len: 4,
            max_depends_on: 1,
            ..Limits::default()
        };
        let errors = compile_str(
            "name: p\ntasks: [{id: a, type: t}, {id: b, type: t}, {id: c, type: t}]",
            &limits,
        )
        .expect_err("too many tasks");
        assert_eq!(
            errors.to_string(),
            "tasks: plan has 3 tasks, over the limit of 2"
        );
        let errors = compile_str(
            "name: p\ntasks: [{id: abcde, type: t}, {id: b, type: t, depends_on: [b, b]}]",
            &limits,
        )
        .expect_err("limits");
        let text = errors.to_string();
        assert!(
            text.contains("tasks[0].id: task id is 5 bytes long, over the limit of 4"),
            "{text}"
        );
        assert!(
            text.contains("tasks[1].depends_on: 2 dependencies, over the limit of 1"),
            "{text}"
        );
    }

    #[test]
    fn relationships_are_lowered() {
        let plan = compile_ok(
        "
name: rel
tasks:
  - {id: a, type: noop}
  - {id: b, type: noop, relationships: [{type: blocks, target: a}]}
  - {id: c, type: noop, relationships: [{type: tests, target: a}, {type: conflicts_with, target: b}]}
  - {id: d, type: noop, relationships: [{type: supersedes, target: e}]}
  - {id: e, type: noop}
  - {id: f, type: noop, relationships: [{type: duplicate_of, target: a}]}
  - {id: g, type: noop, relationships: [{type: subtask_of, target: a}]}
  - {id: h, type: noop, relationships: [{type: depends_on, target: a}, {type: related_to, target: b},
                                       {type: implements, target: c}, {type: enables, target: d},
                                       {type: inspired_by, target: e}]}
",
    );
        let [a, b, c, d, e, f, g, h] =
            ["a", "b", "c", "d", "e", "f", "g", "h"].map(|id| idx(&plan, id));
        // blocks: a waits for b.
        assert_eq!(plan.deps[a], [b]);
        // tests: c runs after a and records it.
        assert_eq!(plan.deps[c], [a]);
        assert_eq!(plan.tasks[c].tests, [a]);
        // conflicts_with: both directions.
        assert_eq!(plan.conflicts[c], [b]);
        assert_eq!(plan.conflicts[b], [c]);
        // supersedes: e is not run and resolves after d.
        assert_eq!(plan.tasks[e].not_run, Some(NotRun::SupersededBy(d)));
        assert_eq!(plan.deps[e], [d]);
        assert_eq!(plan.tasks[d].not_run, None);
        // duplicate_of: f is not run and resolves after a.
        assert_eq!(plan.tasks[f].not_run, Some(NotRun::DuplicateOf(a)));
        assert_eq!(plan.deps[f], [a]);
        // subtask_of.
        assert_eq!(plan.tasks[g].subtask_of, Some(a));
        assert!(plan.deps[g].is_empty());
        // depends_on as a relationship; metadata kinds only recorded.
        assert_eq!(plan.deps[h], [a]);
        let kinds: Vec<_> = plan.tasks[h].relationships.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [
                RelationshipKind::DependsOn,
                RelationshipKind::RelatedTo,
                RelationshipKind::Implements,
                RelationshipKind::Enables,
                RelationshipKind::InspiredBy
            ]
        );
        // dependents are the reverse of deps.
        assert_eq!(plan.dependents[a], [c, f, h]);
        let analysis = analyze(&plan);
        assert_eq!(analysis.subtasks, [g]);
        assert_eq!(analysis.conflict_pairs.len(), 1);
        assert_eq!(
            analysis.conflict_pairs[0].reasons,
            [ConflictReason::Declared]
        );
    }

    #[test]
    fn relationship_contradictions_are_errors() {
        check_error(
            "
name: p
tasks:
  - {id: p, type: noop}
  - {id: s, type: noop, depends_on: [p], relationships: [{type: subtask_of, target: p}]}
",
            r#"tasks[1].depends_on: task "s" is a subtask of "p" and cannot have dependencies (it runs in its parent's subtask group)"#,
        );
        check_error(
            "
name: p
tasks:
  - {id: a, type: noop, fallback: fb}
  - {id: x, type: noop}
  - {id: fb, type: noop, depends_on: [x]}
",
            r#"tasks[2].depends_on: task "fb" is the fallback of "a" and cannot have dependencies (it runs only in that role)"#,
        );
        check_error(
            "
name: p
tasks:
  - {id: a, type: noop, relationships: [{type: subtask_of, target: b}]}
  - {id: b, type: noop, relationships: [{type: subtask_of, target: a}]}
",
            "tasks[0].relationships[0]: subtask cycle: a -> b -> a",
        );
        check_error(
            "
name: p
tasks:
  - {id: a, type: noop, relationships: [{type: supersedes, target: c}]}
  - {id: b, type: noop, relationships: [{type: supersedes, target: c}]}
  - {id: c, type: noop}
",
            r#"tasks[1].relationships[0]: task "c" is already not run (superseded by "a", declared at tasks[0].relationships[0])"#,
        );
        check_error(
            "name: p\ntasks: [{id: a, type: noop, relationships: [{type: related_to, target: a}]}]",
            r#"tasks[0].relationships[0]: task "a" cannot be in a related_to relationship with itself"#,
        );
        check_error(
            "name: p\ntasks: [{id: a, type: noop, relationships: [{type: owns, target: a}]}]",
            "tasks[0].relationships[0].type: unknown variant `owns`, expected one of `depends_on`, `blocks`, `conflicts_with`, `supersedes`, `duplicate_of`, `subtask_of`, `tests`, `related_to`, `implements`, `enables`, `inspired_by` (line 2, column 52)",
        );
    }

    #[test]
    fn skip_without_continue_on_partial_failure_is_warned_about() {
        let yaml = |continue_on: bool| {
            format!(
                "name: w\noptions: {{failure: {{continue_on_partial_failure: {continue_on}, overrides: {{shell: skip}}}}}}\ntasks:\n\
                 - {{id: sh, type: shell}}\n\
                 - {{id: own, type: noop, on_failure: [{{retry: {{max: 1}}}}, skip]}}\n\
                 - {{id: plain, type: noop}}\n"
            )
        };
        let warnings = compile_ok(&yaml(false)).warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].starts_with("task sh: `skip` marks it skipped"),
            "{warnings:?}"
        );
        assert!(warnings[1].starts_with("task own: "), "{warnings:?}");
        assert!(warnings[1].contains("continue_on_partial_failure: true"));
        assert_eq!(compile_ok(&yaml(true)).warnings(), Vec::<String>::new());
    }

    #[test]
    fn failure_handling_is_lowered() {
        let plan = compile_ok(
        "
name: f
options:
  failure:
    default_action: retry
    max_retries: 5
    backoff: {kind: linear, base: 200ms, cap: 10s, jitter: 20%}
    overrides: {shell: skip, flaky: fallback}
tasks:
  - {id: plain, type: noop}
  - {id: sh, type: shell}
  - id: api
    type: noop
    fallback: api-fallback
    on_failure: [{retry: {max: 3, backoff: exponential}}, reassign, {fallback: api-fallback}, pause, abort, fallback]
  - {id: api-fallback, type: noop}
  - {id: fl, type: flaky, fallback: fl-fb}
  - {id: fl-fb, type: noop, on_failure: [{retry: {backoff: {kind: constant, jitter: 0.5}}}]}
",
    );
        let [plain, sh, api, api_fb, fl, fl_fb] =
            ["plain", "sh", "api", "api-fallback", "fl", "fl-fb"].map(|id| idx(&plan, id));
        let policy_backoff = match &plan.tasks[plain].on_failure.steps[..] {
            [FailureAction::Retry { max: 5, backoff }] => backoff.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(policy_backoff.kind, BackoffKind::Linear);
        assert_eq!(policy_backoff.base, Duration::from_millis(200));
        assert_eq!(policy_backoff.cap, Duration::from_secs(10));
        assert_eq!(policy_backoff.jitter_pct, 20);
        assert_eq!(plan.tasks[sh].on_failure.steps, [FailureAction::Skip]);
        let names: Vec<_> = plan.tasks[api]
            .on_failure
            .steps
            .iter()
            .map(FailureAction::name)
            .collect();
        assert_eq!(
            names,
            [
                "retry", "reassign", "fallback", "pause", "abort", "fallback"
            ]
        );
        match &plan.tasks[api].on_failure.steps[0] {
            FailureAction::Retry { max: 3, backoff } => {
                assert_eq!(backoff.kind, BackoffKind::Exponential);
                assert_eq!(
                    backoff.base, policy_backoff.base,
                    "unset fields come from the policy"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            plan.tasks[api].on_failure.steps[2],
            FailureAction::Fallback { task: api_fb }
        );
        assert_eq!(
            plan.tasks[api].on_failure.steps[5],
            FailureAction::Fallback { task: api_fb }
        );
        assert!(plan.tasks[api_fb].is_fallback_only);
        assert_eq!(
            plan.tasks[fl].on_failure.steps,
            [FailureAction::Fallback { task: fl_fb }]
        );
        assert!(plan.tasks[fl_fb].is_fallback_only);
        match &plan.tasks[fl_fb].on_failure.steps[..] {
            [FailureAction::Retry { max: 5, backoff }] => {
                assert_eq!(
                    (backoff.kind, backoff.jitter_pct),
                    (BackoffKind::Constant, 50)
                );
            }
            other => panic!("{other:?}"),
        }
        let analysis = analyze(&plan);
        assert_eq!(analysis.fallback_only, [api_fb, fl_fb]);
        assert!(
            analysis
                .waves
                .iter()
                .flatten()
                .all(|&t| t != api_fb && t != fl_fb)
        );
    }

    #[test]
    fn fallback_without_target_is_an_error() {
        check_error(
            "name: p\noptions: {failure: {default_action: fallback}}\ntasks: [{id: a, type: noop}]",
            r#"tasks[0]: the plan's failure policy falls back for tasks of type "noop", but task "a" declares no fallback"#,
        );
        check_error(
            "name: p\ntasks: [{id: a, type: noop, on_failure: [fallback]}]",
            "tasks[0].on_failure[0]: fallback action without a target, and the task declares no fallback",
        );
        check_error(
            "name: p\ntasks: [{id: a, type: noop, on_failure: [{fallback: b}]}]",
            r#"tasks[0].on_failure[0].fallback: unknown task "b""#,
        );
        check_error(
            "name: p\ntasks: [{id: a, type: noop, on_failure: [{pause: 3}]}]",
            "tasks[0].on_failure[0].pause: this failure action takes no argument (line 2, column 42)",
        );
    }

    #[test]
    fn options_are_compiled() {
        let plan = compile_ok(
            "
name: o
options:
  max_concurrency: 8
  global_timeout: 30m
  pause_on_human_review: false
  budget: {max_tokens: 100000, max_cost: 2.5, on_exhausted: fail}
tasks:
  - {id: a, type: shell, queue: builds, input: {command: [sh, -c, echo ok]}, timeout: 5m,
     files: [{path: db/schema.sql, op: create, confidence: 0.9}]}
",
        );
        assert_eq!(plan.options.max_concurrency, Some(8));
        assert_eq!(plan.options.global_timeout, Some(Duration::from_secs(1800)));
        assert!(!plan.options.pause_on_human_review);
        assert_eq!(plan.options.budget.max_tokens, Some(100_000));
        let task = &plan.tasks[0];
        assert_eq!(
            (task.queue.as_str(), task.task_type.as_str()),
            ("builds", "shell")
        );
        assert_eq!(task.input["command"][2], "echo ok");
        assert_eq!(task.timeout, Some(Duration::from_secs(300)));
        assert_eq!(task.files[0].op, FileOp::Create);
        let default_input = compile_ok("name: o\ntasks: [{id: a, type: t}]");
        assert_eq!(default_input.tasks[0].input, serde_json::json!({}));
        assert_eq!(default_input.tasks[0].queue, "t");
    }

    #[test]
    fn file_conflicts_follow_the_matrix() {
        let plan = compile_ok(
            "
name: files
tasks:
  - {id: w1, type: t, files: [{path: a, op: UPDATE}, {path: r, op: READ}]}
  - {id: w2, type: t, files: [{path: a, op: UPDATE}, {path: r, op: READ}]}
  - {id: c, type: t, files: [{path: a, op: CREATE}]}
  - {id: d, type: t, files: [{path: r, op: DELETE}]}
",
        );
        let analysis = analyze(&plan);
        let report = serde_json::to_value(analysis.report(&plan)).expect("serialises");
        assert_eq!(
            report["conflicts"],
            serde_json::json!([
                {"a": "w1", "b": "w2", "reasons": [{"kind": "file", "path": "a", "ops": ["UPDATE", "UPDATE"]}]},
                {"a": "w1", "b": "d", "reasons": [{"kind": "file", "path": "r", "ops": ["READ", "DELETE"]}]},
                {"a": "w2", "b": "d", "reasons": [{"kind": "file", "path": "r", "ops": ["READ", "DELETE"]}]},
            ])
        );
        // One wave of four; greedily w1 and c, then w2 and d conflict with w1.
        assert_eq!(analysis.max_parallelism.widest_wave, 4);
        assert_eq!(analysis.max_parallelism.without_conflicts, 2);
    }

    #[test]
    fn critical_path_is_weighted_by_timeouts_when_all_have_one() {
        let plan = compile_ok(
            "
name: cp
tasks:
  - {id: a, type: t, timeout: 1m}
  - {id: b, type: t, timeout: 1h}
  - {id: c, type: t, timeout: 1m, depends_on: [a]}
  - {id: d, type: t, timeout: 1m, depends_on: [c]}
",
        );
        let analysis = analyze(&plan);
        assert_eq!(analysis.critical_path.tasks, [idx(&plan, "b")]);
        assert_eq!(
            analysis.critical_path.total_timeout,
            Some(Duration::from_secs(3600))
        );
        let report = serde_json::to_value(analysis.report(&plan)).expect("serialises");
        assert_eq!(report["critical_path"]["weighted_by"], "timeout");
        assert_eq!(report["critical_path"]["total_timeout"], "1h");
    }

    fn chain_yaml(n: usize, closed: bool) -> String {
        let mut text = String::from("name: chain\ntasks:\n");
        for i in 0..n {
            let dep = if i > 0 {
                format!(", depends_on: [t{}]", i - 1)
            } else if closed {
                format!(", depends_on: [t{}]", n - 1)
            } else {
                String::new()
            };
            writeln!(text, "  - {{id: t{i}, type: noop{dep}}}").expect("writing to a string");
        }
        text
    }

    #[test]
    fn a_100_000_long_chain_does_not_overflow_the_stack() {
        let plan = compile_ok(&chain_yaml(100_000, false));
        let analysis = analyze(&plan);
        assert_eq!(analysis.waves.len(), 100_000);
        assert_eq!(analysis.critical_path.tasks.len(), 100_000);
        let errors = errors_of(&chain_yaml(100_000, true));
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("tasks[0].depends_on: dependency cycle: t0 -> t99999 -> t99998")
        );
        assert!(errors[0].ends_with("t1 -> t0"));
    }

    /// A random plan: tasks depend only on earlier ones (so it is a DAG), touch a few of a small set
    /// of paths, and sometimes declare `conflicts_with`.
    fn arb_plan() -> impl Strategy<Value = String> {
        let task = (
            prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            prop::collection::vec((0..6usize, 0..4usize), 0..4),
            prop::option::weighted(0.1, any::<prop::sample::Index>()),
        );
        prop::collection::vec(task, 1..40).prop_map(|tasks| {
            let ops = ["CREATE", "UPDATE", "DELETE", "READ"];
            let mut text = String::from("name: random\ntasks:\n");
            for (i, (deps, files, conflict)) in tasks.iter().enumerate() {
                write!(text, "  - id: t{i}\n    type: noop\n").expect("writing to a string");
                if i > 0 && !deps.is_empty() {
                    let deps: Vec<String> =
                        deps.iter().map(|d| format!("t{}", d.index(i))).collect();
                    writeln!(text, "    depends_on: [{}]", deps.join(", ")).expect("writing");
                }
                if !files.is_empty() {
                    let files: Vec<String> = files
                        .iter()
                        .map(|(p, op)| format!("{{path: f{p}, op: {}}}", ops[*op]))
                        .collect();
                    writeln!(text, "    files: [{}]", files.join(", ")).expect("writing");
                }
                if let Some(c) = conflict {
                    let target = c.index(tasks.len());
                    if target != i {
                        writeln!(
                            text,
                            "    relationships: [{{type: conflicts_with, target: t{target}}}]"
                        )
                        .expect("writing");
                    }
                }
            }
            text
        })
    }

    proptest! {
        #[test]
        fn conflicts_equal_brute_force(text in arb_plan()) {
            let plan = compile_ok(&text);
            let n = plan.len();
            for a in 0..n {
                let mut expected = Vec::new();
                for b in 0..n {
                    if a == b {
                        continue;
                    }
                    let files = plan.tasks[a].files.iter().any(|fa| {
                        plan.tasks[b].files.iter().any(|fb| fa.path == fb.path && fa.op.conflicts_with(fb.op))
                    });
                    let declared = plan.tasks[a].relationships.iter().any(|r| r.kind == RelationshipKind::ConflictsWith && r.target == b)
                        || plan.tasks[b].relationships.iter().any(|r| r.kind == RelationshipKind::ConflictsWith && r.target == a);
                    if files || declared {
                        expected.push(b);
                    }
                }
                prop_assert_eq!(&plan.conflicts[a], &expected, "task {}", a);
            }
            let analysis = analyze(&plan);
            let n_pairs: usize = plan.conflicts.iter().map(Vec::len).sum();
            prop_assert_eq!(analysis.conflict_pairs.len() * 2, n_pairs);
            for pair in &analysis.conflict_pairs {
                prop_assert!(pair.a < pair.b);
                prop_assert!(plan.conflicts[pair.a].contains(&pair.b));
            }
        }

        #[test]
        fn waves_respect_dependencies_and_are_earliest(text in arb_plan()) {
            let plan = compile_ok(&text);
            let analysis = analyze(&plan);
            let n_placed: usize = analysis.waves.iter().map(Vec::len).sum();
            prop_assert_eq!(n_placed, plan.len());
            for (t, deps) in plan.deps.iter().enumerate() {
                let wave = analysis.wave_of[t].expect("every task is in a wave");
                prop_assert!(analysis.waves[wave].contains(&t));
                let earliest = deps
                    .iter()
                    .map(|&d| analysis.wave_of[d].expect("placed") + 1)
                    .max()
                    .unwrap_or(0);
                prop_assert_eq!(wave, earliest, "task {}", t);
            }
            for wave in &analysis.waves {
                prop_assert!(wave.windows(2).all(|w| w[0] < w[1]), "declaration order");
            }
            let path = &analysis.critical_path.tasks;
            prop_assert_eq!(path.len(), analysis.waves.len());
            for w in path.windows(2) {
                prop_assert!(plan.deps[w[1]].contains(&w[0]));
            }
        }
    }
}
