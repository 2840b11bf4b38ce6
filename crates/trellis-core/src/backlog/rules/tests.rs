//! Tests of the validation rules: reading each kind and each mistake in a spec, and checking tasks
//! against rules of every kind and severity.

use super::*;
use crate::backlog::model::{Effort, Placement, Priority, TaskStatus};
use crate::plan::{FileImpact, FileOp};

fn task(category: Category) -> BacklogTask {
    BacklogTask {
        number: 1,
        title: "[auth] Refresh tokens".into(),
        description: "Tokens refresh before they expire.".into(),
        category,
        priority: Priority::P2,
        effort: Effort::Small,
        phase: 2,
        status: TaskStatus::Draft,
        placement: Placement::Evaluation,
        files: vec![FileImpact {
            path: "src/auth/token.rs".into(),
            op: FileOp::Update,
            confidence: 1.0,
        }],
        acceptance_criteria: vec!["an expired token is refreshed".into()],
        codebase_tests: vec!["cargo test auth".into()],
        api_tests: Vec::new(),
        ui_tests: Vec::new(),
        links: Vec::new(),
        blocks: Vec::new(),
    }
}

fn spec(name: &str, kind: &str) -> RuleSpec {
    RuleSpec {
        name: name.into(),
        kind: kind.into(),
        enabled: true,
        ..RuleSpec::default()
    }
}

fn required(field: &str) -> RuleSpec {
    RuleSpec {
        field: field.into(),
        ..spec("needs-it", "required_field")
    }
}

fn pattern(field: &str, pattern: &str) -> RuleSpec {
    RuleSpec {
        field: field.into(),
        pattern: pattern.into(),
        ..spec("matches", "pattern_match")
    }
}

fn parse(spec: &RuleSpec) -> Rule {
    Rule::parse(spec).unwrap_or_else(|err| panic!("{spec:?} should parse: {err}"))
}

fn parse_err(spec: &RuleSpec) -> FieldError {
    match Rule::parse(spec) {
        Ok(rule) => panic!("{spec:?} should not parse, got {rule:?}"),
        Err(err) => err,
    }
}

#[test]
fn each_kind_parses_with_its_fields() {
    let rule = parse(&required("acceptance_criteria"));
    assert!(matches!(
        rule.kind,
        RuleKind::RequiredField {
            field: TaskField::AcceptanceCriteria
        }
    ));
    assert_eq!(rule.severity, Severity::Error, "an empty severity is error");
    assert!(rule.categories.is_empty());

    let rule = parse(&RuleSpec {
        levels: vec!["api".into(), "codebase".into(), "api".into()],
        severity: "warning".into(),
        categories: vec!["feature".into(), "bug".into()],
        ..spec("tested", "test_required")
    });
    match &rule.kind {
        RuleKind::TestRequired { levels } => {
            assert_eq!(levels, &[CheckLevel::Api, CheckLevel::Codebase]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rule.severity, Severity::Warning);
    assert_eq!(rule.categories, [Category::Feature, Category::Bug]);

    let rule = parse(&spec("tested", "test_required"));
    match &rule.kind {
        RuleKind::TestRequired { levels } => assert_eq!(levels, &ALL_LEVELS),
        other => panic!("{other:?}"),
    }

    let rule = parse(&pattern("title", r"^\[.*\]"));
    match &rule.kind {
        RuleKind::PatternMatch { field, pattern } => {
            assert_eq!(*field, TaskField::Title);
            assert_eq!(pattern.as_str(), r"^\[.*\]");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rule.kind.as_str(), "pattern_match");

    let rule = parse(&RuleSpec {
        command: "./scripts/check-task".into(),
        ..spec("house-rules", "custom")
    });
    assert!(
        matches!(&rule.kind, RuleKind::Custom { command } if command == "./scripts/check-task")
    );
}

#[test]
fn a_name_must_be_a_slug() {
    for name in ["Needs Title", "", "-dash"] {
        let err = parse_err(&RuleSpec {
            name: name.into(),
            ..required("title")
        });
        assert_eq!(err.field, "name", "{name:?}");
    }
}

#[test]
fn an_unknown_kind_lists_the_kinds() {
    let err = parse_err(&spec("r", "regex"));
    assert_eq!(err.field, "kind");
    assert!(err.message.contains("\"regex\""), "{err}");
    assert!(
        err.message
            .contains("required_field, test_required, pattern_match, custom"),
        "{err}"
    );
}

#[test]
fn an_unknown_category_names_its_index_and_the_categories() {
    let err = parse_err(&RuleSpec {
        categories: vec!["bug".into(), "feture".into()],
        ..required("title")
    });
    assert_eq!(err.field, "categories[1]");
    assert!(err.message.contains("\"feture\""), "{err}");
    assert!(err.message.contains("feature, bug, task"), "{err}");
}

#[test]
fn a_field_must_be_named_and_known() {
    let err = parse_err(&required(""));
    assert_eq!(err.field, "field");
    assert!(err.message.contains("needs a field"), "{err}");
    assert!(err.message.contains("acceptance_criteria"), "{err}");
    let err = parse_err(&pattern("summary", "x"));
    assert_eq!(err.field, "field");
    assert!(err.message.contains("\"summary\""), "{err}");
    assert!(
        err.message
            .contains("title, description, acceptance_criteria"),
        "{err}"
    );
}

#[test]
fn a_bad_pattern_gives_the_regex_message() {
    // Built at run time: the lints check literal patterns, and this one is wrong on purpose.
    let bad = String::from("[unclosed");
    let err = parse_err(&pattern("title", &bad));
    assert_eq!(err.field, "pattern");
    assert!(
        err.message.contains("not a valid regular expression"),
        "{err}"
    );
    let regex_message = regex::Regex::new(&bad).unwrap_err().to_string();
    assert!(err.message.contains(&regex_message), "{err}");
    let err = parse_err(&pattern("title", ""));
    assert_eq!(err.field, "pattern");
    assert!(err.message.contains("needs a pattern"), "{err}");
}

#[test]
fn an_unknown_level_names_its_index() {
    let err = parse_err(&RuleSpec {
        levels: vec!["codebase".into(), "e2e".into()],
        ..spec("tested", "test_required")
    });
    assert_eq!(err.field, "levels[1]");
    assert!(err.message.contains("\"e2e\""), "{err}");
    assert!(err.message.contains("codebase, api, ui"), "{err}");
}

#[test]
fn a_custom_rule_needs_a_command() {
    let err = parse_err(&spec("house-rules", "custom"));
    assert_eq!(err.field, "command");
    let err = parse_err(&RuleSpec {
        command: "   ".into(),
        ..spec("house-rules", "custom")
    });
    assert_eq!(err.field, "command");
}

#[test]
fn a_severity_is_error_or_warning() {
    let err = parse_err(&RuleSpec {
        severity: "fatal".into(),
        ..required("title")
    });
    assert_eq!(err.field, "severity");
    assert!(err.message.contains("\"fatal\""), "{err}");
    assert_eq!(Severity::parse("s", "error"), Ok(Severity::Error));
}

#[test]
fn a_field_of_another_kind_is_refused() {
    let cases = [
        (
            RuleSpec {
                pattern: "x".into(),
                ..required("title")
            },
            "pattern",
        ),
        (
            RuleSpec {
                field: "title".into(),
                ..spec("tested", "test_required")
            },
            "field",
        ),
        (
            RuleSpec {
                levels: vec!["api".into()],
                ..pattern("title", "x")
            },
            "levels",
        ),
        (
            RuleSpec {
                command: "true".into(),
                ..required("title")
            },
            "command",
        ),
        (
            RuleSpec {
                field: "title".into(),
                command: "true".into(),
                ..spec("house-rules", "custom")
            },
            "field",
        ),
    ];
    for (spec, field) in cases {
        let err = parse_err(&spec);
        assert_eq!(err.field, field, "{spec:?}");
        assert!(
            err.message
                .contains(&format!("a {} rule takes no {field}", spec.kind)),
            "{err}"
        );
    }
}

#[test]
fn a_rule_applies_to_its_categories_or_to_all() {
    let all = parse(&required("title"));
    assert!(Category::ALL.iter().all(|c| all.applies_to(*c)));
    let some = parse(&RuleSpec {
        categories: vec!["bug".into()],
        ..required("title")
    });
    assert!(some.applies_to(Category::Bug));
    assert!(!some.applies_to(Category::Feature));
}

#[test]
fn required_fields_fail_when_blank_or_empty() {
    let rules: Vec<Rule> = [
        "title",
        "description",
        "acceptance_criteria",
        "files",
        "api_tests",
    ]
    .into_iter()
    .map(|field| parse(&required(field)))
    .collect();
    let good = task(Category::Feature);
    let findings = check(&good, &rules);
    assert_eq!(
        findings,
        [Finding {
            rule: "needs-it".into(),
            severity: Severity::Error,
            message: "api_tests is empty".into(),
        }]
    );

    let mut bad = good.clone();
    bad.title = "   ".into();
    bad.description = String::new();
    bad.acceptance_criteria = vec![" ".into()];
    bad.files.clear();
    let messages: Vec<String> = check(&bad, &rules).into_iter().map(|f| f.message).collect();
    assert_eq!(
        messages,
        [
            "title is empty",
            "description is empty",
            "acceptance_criteria is empty",
            "files is empty",
            "api_tests is empty",
        ]
    );
}

#[test]
fn test_required_wants_a_test_of_one_of_its_levels() {
    let rule = parse(&RuleSpec {
        levels: vec!["codebase".into(), "api".into()],
        ..spec("tested", "test_required")
    });
    let mut t = task(Category::Feature);
    assert!(check(&t, std::slice::from_ref(&rule)).is_empty());
    t.codebase_tests = vec![String::new()];
    let findings = check(&t, std::slice::from_ref(&rule));
    assert_eq!(findings.len(), 1);
    assert_eq!(
        findings[0].message,
        "needs at least one codebase or api test"
    );
    t.api_tests = vec!["hurl api.hurl".into()];
    assert!(check(&t, std::slice::from_ref(&rule)).is_empty());

    // A UI test does not count for a rule that wants codebase or api tests.
    t.api_tests.clear();
    t.ui_tests = vec!["playwright test".into()];
    assert_eq!(check(&t, std::slice::from_ref(&rule)).len(), 1);
    let any = parse(&spec("tested", "test_required"));
    assert!(check(&t, std::slice::from_ref(&any)).is_empty());
    t.ui_tests.clear();
    assert_eq!(
        check(&t, std::slice::from_ref(&any))[0].message,
        "needs at least one codebase, api or ui test"
    );
    let one = parse(&RuleSpec {
        levels: vec!["ui".into()],
        ..spec("tested", "test_required")
    });
    assert_eq!(
        check(&t, std::slice::from_ref(&one))[0].message,
        "needs at least one ui test"
    );
}

#[test]
fn pattern_match_checks_a_text_and_each_element_of_a_list() {
    let title = parse(&pattern("title", r"^\[.*\]"));
    let mut t = task(Category::Feature);
    assert!(check(&t, std::slice::from_ref(&title)).is_empty());
    t.title = "Refresh tokens".into();
    assert_eq!(
        check(&t, std::slice::from_ref(&title))[0].message,
        r"title does not match ^\[.*\]"
    );

    let files = parse(&pattern("files", r"^src/"));
    assert!(check(&t, std::slice::from_ref(&files)).is_empty());
    for path in [
        "docs/auth.md",
        "src/auth/mod.rs",
        "README.md",
        "tests/auth.rs",
    ] {
        t.files.push(FileImpact {
            path: path.into(),
            op: FileOp::Update,
            confidence: 1.0,
        });
    }
    assert_eq!(
        check(&t, std::slice::from_ref(&files))[0].message,
        r#"files[1] ("docs/auth.md") does not match ^src/ (and 2 more)"#
    );
    // An empty list has no element that fails.
    t.files.clear();
    assert!(check(&t, std::slice::from_ref(&files)).is_empty());
}

#[test]
fn disabled_rules_and_rules_of_other_categories_are_skipped() {
    let t = task(Category::Feature);
    let mut disabled = parse(&required("api_tests"));
    disabled.enabled = false;
    let bugs_only = parse(&RuleSpec {
        categories: vec!["bug".into()],
        ..required("api_tests")
    });
    assert!(check(&t, &[disabled, bugs_only.clone()]).is_empty());
    assert_eq!(check(&task(Category::Bug), &[bugs_only]).len(), 1);
}

#[test]
fn custom_rules_are_left_to_the_planner() {
    let custom = |name: &str, categories: &[&str], enabled: bool| {
        parse(&RuleSpec {
            command: "exit 1".into(),
            categories: categories.iter().map(|c| (*c).to_owned()).collect(),
            enabled,
            ..spec(name, "custom")
        })
    };
    let rules = [
        custom("everyone", &[], true),
        parse(&required("api_tests")),
        custom("off", &[], false),
        custom("bugs", &["bug"], true),
        custom("features", &["feature"], true),
    ];
    let t = task(Category::Feature);
    let findings = check(&t, &rules);
    assert_eq!(
        findings.len(),
        1,
        "only the required_field rule: {findings:?}"
    );
    let names: Vec<&str> = custom_rules(&t, &rules).map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["everyone", "features"]);
}

#[test]
fn only_errors_block() {
    let error = parse(&required("api_tests"));
    let warning = parse(&RuleSpec {
        severity: "warning".into(),
        ..required("ui_tests")
    });
    let t = task(Category::Feature);
    let warned = check(&t, std::slice::from_ref(&warning));
    assert_eq!(warned.len(), 1);
    assert_eq!(warned[0].severity, Severity::Warning);
    assert!(!blocking(&warned));
    let both = check(&t, &[warning, error]);
    assert_eq!(both.len(), 2);
    assert!(blocking(&both));
    assert!(!blocking(&[]));
}
