//! Tests of the grouping: each criterion and its reason, the weights' checks, the symmetry of a
//! pair's score, and a seeded backlog of 50 tasks whose 10 intended groups must come back exactly.

use proptest::prelude::*;

use super::naming::slugify;
use super::*;
use crate::backlog::model::{Category, Effort, Link, Priority, check_slug};
use crate::plan::FileImpact;

/// A queued task with no files, links or text beyond its title.
fn task(number: u32) -> BacklogTask {
    BacklogTask {
        number,
        title: format!("task {number}"),
        description: String::new(),
        category: Category::Task,
        priority: Priority::P3,
        effort: Effort::Medium,
        phase: 1,
        status: TaskStatus::Pending,
        placement: Placement::Evaluation,
        files: Vec::new(),
        acceptance_criteria: Vec::new(),
        codebase_tests: Vec::new(),
        api_tests: Vec::new(),
        ui_tests: Vec::new(),
        links: Vec::new(),
        blocks: Vec::new(),
    }
}

fn file(path: &str, op: FileOp) -> FileImpact {
    FileImpact {
        path: path.to_owned(),
        op,
        confidence: 1.0,
    }
}

fn with_files(mut task: BacklogTask, paths: &[(&str, FileOp)]) -> BacklogTask {
    task.files = paths.iter().map(|(path, op)| file(path, *op)).collect();
    task
}

fn link(kind: RelationshipKind, target: u32) -> Link {
    Link { kind, target }
}

/// Weights that count one criterion only, so a pair's score is that criterion's value.
fn only(criterion: Criterion) -> Weights {
    let mut weights = Weights {
        file_overlap: 0.0,
        dependency: 0.0,
        category: 0.0,
        description: 0.0,
        component: 0.0,
    };
    match criterion {
        Criterion::FileOverlap => weights.file_overlap = 1.0,
        Criterion::Dependency => weights.dependency = 1.0,
        Criterion::Category => weights.category = 1.0,
        Criterion::Description => weights.description = 1.0,
        Criterion::Component => weights.component = 1.0,
    }
    weights
}

fn assert_close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() < 1e-9,
        "{actual} is not {expected}"
    );
}

#[test]
fn a_files_component_is_its_parent_directory() {
    assert_eq!(component("src/auth/login.rs"), "src/auth");
    assert_eq!(component("src/auth.rs"), "src");
    assert_eq!(component("README.md"), "");
}

#[test]
fn file_overlap_is_the_jaccard_index_of_the_paths() {
    let a = with_files(
        task(1),
        &[("src/auth.rs", FileOp::Update), ("src/db.rs", FileOp::Read)],
    );
    let b = with_files(
        task(2),
        &[
            ("src/auth.rs", FileOp::Create),
            ("src/api.rs", FileOp::Update),
        ],
    );
    let pair = score_pair(&a, &b, &only(Criterion::FileOverlap));
    assert_close(pair.score, 1.0 / 3.0);
    // The operation named is the first task's.
    assert_eq!(pair.reasons, ["share src/auth.rs (UPDATE)"]);
    assert_eq!(
        score_pair(&b, &a, &only(Criterion::FileOverlap)).reasons,
        ["share src/auth.rs (CREATE)"]
    );
    let none = score_pair(&task(3), &task(4), &only(Criterion::FileOverlap));
    assert_eq!(none.score, 0.0);
    assert!(none.reasons.is_empty());
}

#[test]
fn the_file_reason_names_three_paths_then_counts_the_rest() {
    let paths: Vec<(&str, FileOp)> = ["a/1.rs", "a/2.rs", "a/3.rs", "a/4.rs", "a/5.rs"]
        .into_iter()
        .map(|path| (path, FileOp::Update))
        .collect();
    let a = with_files(task(1), &paths);
    let b = with_files(task(2), &paths);
    let pair = score_pair(&a, &b, &only(Criterion::FileOverlap));
    assert_close(pair.score, 1.0);
    assert_eq!(
        pair.reasons,
        ["share a/1.rs (UPDATE), a/2.rs (UPDATE), a/3.rs (UPDATE) and 2 more"]
    );
}

#[test]
fn a_link_either_way_ties_two_tasks_fully() {
    let weights = only(Criterion::Dependency);
    let cases = [
        (RelationshipKind::DependsOn, "T-12 depends on T-9"),
        (RelationshipKind::Blocks, "T-12 blocks T-9"),
        (RelationshipKind::Enables, "T-12 enables T-9"),
        (RelationshipKind::SubtaskOf, "T-12 is a subtask of T-9"),
    ];
    for (kind, reason) in cases {
        let mut a = task(12);
        a.links.push(link(kind, 9));
        let b = task(9);
        let forward = score_pair(&a, &b, &weights);
        assert_close(forward.score, 1.0);
        assert_eq!(forward.reasons, [reason]);
        let backward = score_pair(&b, &a, &weights);
        assert_close(backward.score, 1.0);
        assert_eq!(
            backward.reasons,
            [reason],
            "the reason names the link's owner"
        );
    }
}

#[test]
fn links_for_people_only_do_not_tie_tasks() {
    let mut a = task(12);
    a.links.push(link(RelationshipKind::RelatedTo, 9));
    a.links.push(link(RelationshipKind::InspiredBy, 9));
    let pair = score_pair(&a, &task(9), &only(Criterion::Dependency));
    assert_eq!(pair.score, 0.0);
    assert!(pair.reasons.is_empty());
}

#[test]
fn a_common_dependency_ties_two_tasks_by_half() {
    let mut a = task(1);
    a.links.push(link(RelationshipKind::DependsOn, 7));
    a.links.push(link(RelationshipKind::DependsOn, 3));
    let mut b = task(2);
    b.links.push(link(RelationshipKind::DependsOn, 3));
    b.links.push(link(RelationshipKind::DependsOn, 7));
    let pair = score_pair(&a, &b, &only(Criterion::Dependency));
    assert_close(pair.score, 0.5);
    assert_eq!(pair.reasons, ["both depend on T-3, T-7"]);
}

#[test]
fn equal_categories_score_one() {
    let mut a = task(1);
    let mut b = task(2);
    a.category = Category::Bug;
    b.category = Category::Bug;
    let pair = score_pair(&a, &b, &only(Criterion::Category));
    assert_close(pair.score, 1.0);
    assert_eq!(pair.reasons, ["both bug"]);
    b.category = Category::Feature;
    assert_eq!(score_pair(&a, &b, &only(Criterion::Category)).score, 0.0);
}

#[test]
fn description_similarity_is_sorensen_dice_of_title_and_description() {
    let mut a = task(1);
    a.title = "Refresh expired session tokens".into();
    a.description = "On LOGIN".into();
    let mut b = task(2);
    b.title = "Refresh expiring session tokens".into();
    b.description = "on login".into();
    let expected = strsim::sorensen_dice(
        "refresh expired session tokens on login",
        "refresh expiring session tokens on login",
    );
    assert!(expected >= 0.5, "{expected}");
    let pair = score_pair(&a, &b, &only(Criterion::Description));
    assert_close(pair.score, expected);
    assert_eq!(
        pair.reasons,
        [format!("similar descriptions ({expected:.2})")]
    );

    // Below 0.5 the similarity counts but is no reason.
    b.title = "Rotate the billing ledger".into();
    b.description = "monthly".into();
    let pair = score_pair(&a, &b, &only(Criterion::Description));
    assert!(pair.score > 0.0 && pair.score < 0.5, "{}", pair.score);
    assert!(pair.reasons.is_empty());
}

#[test]
fn components_are_compared_as_sets_without_the_root() {
    let a = with_files(
        task(1),
        &[
            ("src/auth/login.rs", FileOp::Update),
            ("src/auth/token.rs", FileOp::Update),
            ("README.md", FileOp::Update),
        ],
    );
    let b = with_files(
        task(2),
        &[
            ("src/auth/session.rs", FileOp::Create),
            ("src/db/users.rs", FileOp::Update),
            ("Cargo.toml", FileOp::Update),
        ],
    );
    let pair = score_pair(&a, &b, &only(Criterion::Component));
    assert_close(pair.score, 0.5);
    assert_eq!(pair.reasons, ["same component src/auth"]);

    // Top-level files only: no component either side.
    let c = with_files(task(3), &[("README.md", FileOp::Update)]);
    let d = with_files(task(4), &[("README.md", FileOp::Update)]);
    let pair = score_pair(&c, &d, &only(Criterion::Component));
    assert_eq!(pair.score, 0.0);
    assert!(pair.reasons.is_empty());
}

#[test]
fn the_score_is_the_weighted_mean_and_reasons_come_strongest_first() {
    let mut a = with_files(
        task(12),
        &[
            ("src/auth/login.rs", FileOp::Update),
            ("src/auth/mod.rs", FileOp::Update),
        ],
    );
    a.title = "Lock accounts out after failed logins".into();
    a.category = Category::Bug;
    a.links.push(link(RelationshipKind::DependsOn, 9));
    let mut b = with_files(task(9), &[("src/auth/mod.rs", FileOp::Update)]);
    b.title = "Audit trail".into();
    b.category = Category::Bug;
    let weights = Weights::default();
    let pair = score_pair(&a, &b, &weights);
    let dice = strsim::sorensen_dice("lock accounts out after failed logins ", "audit trail ");
    assert!(dice < 0.5, "{dice}");
    let expected = (0.3 * 0.5 + 0.25 + 0.2 + 0.15 * dice + 0.1) / 1.0;
    assert_close(pair.score, expected);
    // dependency 0.25, category 0.2, files 0.15, component 0.1; the wording gives no reason.
    assert_eq!(
        pair.reasons,
        [
            "T-12 depends on T-9",
            "both bug",
            "share src/auth/mod.rs (UPDATE)",
            "same component src/auth",
        ]
    );

    // Weights need not sum to 1: halving them all leaves the score as it is.
    let halved = Weights {
        file_overlap: 0.15,
        dependency: 0.125,
        category: 0.1,
        description: 0.075,
        component: 0.05,
    };
    assert_close(score_pair(&a, &b, &halved).score, expected);
}

#[test]
fn weights_must_be_numbers_from_0_to_1_and_not_all_0() {
    assert_eq!(Weights::default().check(), Ok(()));
    let bad = [
        (
            Weights {
                file_overlap: 1.5,
                ..Weights::default()
            },
            "weights.file_overlap",
        ),
        (
            Weights {
                dependency: -0.1,
                ..Weights::default()
            },
            "weights.dependency",
        ),
        (
            Weights {
                category: f64::NAN,
                ..Weights::default()
            },
            "weights.category",
        ),
        (
            Weights {
                description: f64::INFINITY,
                ..Weights::default()
            },
            "weights.description",
        ),
        (
            Weights {
                component: 2.0,
                ..Weights::default()
            },
            "weights.component",
        ),
    ];
    for (weights, field) in bad {
        let err = weights.check().unwrap_err();
        assert_eq!(err.field, field);
        assert!(err.message.contains("from 0 to 1"), "{err}");
    }
    let zero = Weights {
        file_overlap: 0.0,
        dependency: 0.0,
        category: 0.0,
        description: 0.0,
        component: 0.0,
    };
    let err = zero.check().unwrap_err();
    assert_eq!(err.field, "weights");
    // Unchecked bad weights score nothing rather than NaN.
    let pair = score_pair(&task(1), &task(1), &zero);
    assert_eq!(pair.score, 0.0);
    assert!(pair.reasons.is_empty());
}

#[test]
fn a_chain_of_pairs_is_one_group_scored_by_its_pairs() {
    // 1–2 and 2–3 are linked, 1–3 are not; 4 stands alone.
    let mut one = task(1);
    one.links.push(link(RelationshipKind::DependsOn, 2));
    let mut three = task(3);
    three.links.push(link(RelationshipKind::Blocks, 2));
    let tasks = [three, task(4), one, task(2)];
    let weights = only(Criterion::Dependency);
    let suggestions = suggest(&tasks, &weights, 0.9);
    assert_eq!(suggestions.len(), 1);
    let group = &suggestions[0];
    assert_eq!(group.tasks, [1, 2, 3]);
    assert_close(group.score, 1.0);
    assert_eq!(group.reason, "T-1 depends on T-2");
    assert_eq!(group.name, "tasks");
    assert!(check_slug("name", &group.name).is_ok());
}

#[test]
fn finished_and_listed_tasks_are_never_suggested() {
    let mut tasks: Vec<BacklogTask> = (1..=4)
        .map(|n| with_files(task(n), &[("src/auth/mod.rs", FileOp::Update)]))
        .collect();
    tasks[0].status = TaskStatus::Completed;
    tasks[1].status = TaskStatus::Failed;
    tasks[2].placement = Placement::List("auth".into());
    let suggestions = suggest(&tasks, &Weights::default(), DEFAULT_THRESHOLD);
    assert!(suggestions.is_empty(), "{suggestions:?}");
    tasks[2].placement = Placement::Evaluation;
    let suggestions = suggest(&tasks, &Weights::default(), DEFAULT_THRESHOLD);
    assert_eq!(suggestions.len(), 1);
    assert_eq!(suggestions[0].tasks, [3, 4]);
    assert_eq!(suggestions[0].name, "src-auth");
}

#[test]
fn names_are_slugs_and_unique() {
    assert_eq!(
        slugify("src/auth_v2/Login").as_deref(),
        Some("src-auth-v2-login")
    );
    assert_eq!(slugify("///"), None);
    assert_eq!(slugify(&"a/".repeat(100)).map(|s| s.len()), Some(63));

    // Two groups of bugs with no component each: "bug-fixes", then "bug-fixes-2".
    let mut tasks = Vec::new();
    for (a, b) in [(1, 2), (3, 4)] {
        let mut first = task(a);
        first.category = Category::Bug;
        first.links.push(link(RelationshipKind::DependsOn, b));
        let mut second = task(b);
        second.category = Category::Bug;
        tasks.extend([first, second]);
    }
    let suggestions = suggest(&tasks, &Weights::default(), DEFAULT_THRESHOLD);
    let names: Vec<&str> = suggestions.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["bug-fixes", "bug-fixes-2"]);

    let mut taken = HashSet::new();
    let long = "a".repeat(64);
    assert_eq!(unique_name(&long, &mut taken), long);
    let second = unique_name(&long, &mut taken);
    assert_eq!(second, format!("{}-2", "a".repeat(62)));
    assert!(check_slug("name", &second).is_ok());
}

#[test]
fn suggest_for_keeps_the_groups_of_the_trigger() {
    let (tasks, groups) = seeded_backlog(7);
    let trigger = groups[3][2];
    let all = suggest(&tasks, &Weights::default(), DEFAULT_THRESHOLD);
    let mine = suggest_for(&tasks, &Weights::default(), DEFAULT_THRESHOLD, trigger);
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].tasks, groups[3]);
    assert!(all.contains(&mine[0]));
    assert!(suggest_for(&tasks, &Weights::default(), DEFAULT_THRESHOLD, 999).is_empty());
}

/// One intended group of the seeded backlog: a directory, a category, a sentence every task's
/// description starts with, and per task a file of its own and a title.
struct Theme {
    dir: &'static str,
    shared_file: &'static str,
    category: Category,
    about: &'static str,
    tasks: [(&'static str, &'static str); 5],
}

const THEMES: [Theme; 10] = [
    Theme {
        dir: "src/auth",
        shared_file: "mod.rs",
        category: Category::Feature,
        about: "Sign-in sessions: users stay signed in and session tokens refresh quietly.",
        tasks: [
            ("session.rs", "Store sign-in sessions on the server"),
            ("token.rs", "Refresh session tokens before they expire"),
            ("login.rs", "Keep users signed in after login"),
            ("logout.rs", "Revoke the session token on logout"),
            ("cookie.rs", "Set secure cookies for sign-in sessions"),
        ],
    },
    Theme {
        dir: "src/billing",
        shared_file: "mod.rs",
        category: Category::Bug,
        about: "Invoice totals: amounts, taxes and currencies must add up on every invoice.",
        tasks: [
            ("invoice.rs", "Invoice totals are off by a cent"),
            ("tax.rs", "Invoice tax is applied twice"),
            ("currency.rs", "Invoice currency is lost on conversion"),
            ("rounding.rs", "Invoice rounding differs from the ledger"),
            ("pdf.rs", "Invoice PDF shows the wrong total"),
        ],
    },
    Theme {
        dir: "src/search",
        shared_file: "mod.rs",
        category: Category::Improvement,
        about: "Search index: queries return well ranked results quickly, even when large.",
        tasks: [
            ("index.rs", "Rebuild the search index incrementally"),
            ("query.rs", "Parse search queries with quoted phrases"),
            ("ranking.rs", "Rank search results by freshness"),
            ("tokenizer.rs", "Tokenize search text in every language"),
            ("cache.rs", "Cache frequent search queries"),
        ],
    },
    Theme {
        dir: "src/notify",
        shared_file: "mod.rs",
        category: Category::Feature,
        about: "Email notifications: people hear of changes by email, batched, and can opt out.",
        tasks: [
            ("email.rs", "Send an email notification on mentions"),
            ("digest.rs", "Batch email notifications into a daily digest"),
            ("template.rs", "Render email notification templates"),
            ("unsubscribe.rs", "Unsubscribe from email notifications"),
            ("outbox.rs", "Retry failed email notifications"),
        ],
    },
    Theme {
        dir: "src/storage",
        shared_file: "mod.rs",
        category: Category::Refactor,
        about: "Blob storage: one storage trait for disk and object stores, with streaming reads.",
        tasks: [
            ("traits.rs", "Extract a blob storage trait"),
            ("disk.rs", "Move disk blob storage behind the trait"),
            (
                "object.rs",
                "Move object store blob storage behind the trait",
            ),
            ("stream.rs", "Stream blob storage reads"),
            ("gc.rs", "Collect unreferenced blobs in storage"),
        ],
    },
    Theme {
        dir: "docs/guide",
        shared_file: "SUMMARY.md",
        category: Category::Docs,
        about: "User guide: a chapter per workflow with runnable examples and screenshots.",
        tasks: [
            ("install.md", "Guide chapter: installing on every platform"),
            ("quickstart.md", "Guide chapter: a five minute quickstart"),
            ("cli.md", "Guide chapter: every CLI command with examples"),
            ("config.md", "Guide chapter: the configuration file"),
            ("faq.md", "Guide chapter: frequently asked questions"),
        ],
    },
    Theme {
        dir: "deploy/helm",
        shared_file: "Chart.yaml",
        category: Category::Infra,
        about: "Helm chart: deploy the planner and workers on Kubernetes with sane defaults.",
        tasks: [
            ("values.yaml", "Helm chart values for planner replicas"),
            ("deployment.yaml", "Helm chart deployment for workers"),
            ("service.yaml", "Helm chart service for the planner"),
            ("ingress.yaml", "Helm chart ingress with TLS"),
            ("hpa.yaml", "Helm chart autoscaling for workers"),
        ],
    },
    Theme {
        dir: "tests/e2e",
        shared_file: "harness.rs",
        category: Category::Test,
        about: "End-to-end tests: drive the command line against a live cluster, check outcomes.",
        tasks: [
            ("run.rs", "End-to-end test of a plan run"),
            ("cancel.rs", "End-to-end test of cancelling a run"),
            ("retry.rs", "End-to-end test of retries after a crash"),
            ("resume.rs", "End-to-end test of resuming from a checkpoint"),
            ("logs.rs", "End-to-end test of streaming logs"),
        ],
    },
    Theme {
        dir: "src/api",
        shared_file: "errors.rs",
        category: Category::Bug,
        about: "HTTP API errors: every endpoint answers with the right status and a JSON body.",
        tasks: [
            ("projects.rs", "HTTP API returns 500 for a missing project"),
            ("tasks.rs", "HTTP API returns 200 for an invalid task"),
            ("lists.rs", "HTTP API error body is HTML for lists"),
            ("auth.rs", "HTTP API returns 404 instead of 401"),
            ("limits.rs", "HTTP API rate limit error lacks Retry-After"),
        ],
    },
    Theme {
        dir: "src/scheduler",
        shared_file: "mod.rs",
        category: Category::Improvement,
        about: "Scheduler fairness: no project starves others of worker slots under load.",
        tasks: [
            ("queue.rs", "Scheduler: a fair queue per project"),
            ("slots.rs", "Scheduler: cap worker slots per project"),
            (
                "aging.rs",
                "Scheduler: age waiting work so it is never starved",
            ),
            ("metrics.rs", "Scheduler: export fairness metrics"),
            ("preempt.rs", "Scheduler: preempt long runs under load"),
        ],
    },
];

/// Returns 1–`n` shuffled by a small deterministic generator seeded with `seed`.
fn shuffled_numbers(n: u32, seed: u64) -> Vec<u32> {
    let mut numbers: Vec<u32> = (1..=n).collect();
    let mut state = seed;
    for i in (1..numbers.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = usize::try_from((state >> 33) % (i as u64 + 1)).expect("below the length");
        numbers.swap(i, j);
    }
    numbers
}

/// Builds the 50-task backlog of [`THEMES`], task numbers shuffled by `seed` and the tasks in
/// shuffled order; returns it with each theme's task numbers, ascending.
///
/// In a group every task updates the shared file and creates its own, all in one directory; tasks
/// 2 and 3 of a group depend on task 1, task 5 depends on task 4.
fn seeded_backlog(seed: u64) -> (Vec<BacklogTask>, Vec<Vec<u32>>) {
    let numbers = shuffled_numbers(50, seed);
    let mut tasks = Vec::new();
    let mut groups = Vec::new();
    for (g, theme) in THEMES.iter().enumerate() {
        let ids = &numbers[g * 5..g * 5 + 5];
        for (k, (own, title)) in theme.tasks.iter().enumerate() {
            let mut t = task(ids[k]);
            t.title = (*title).to_owned();
            t.description = format!("{} This one: {}.", theme.about, title.to_lowercase());
            t.category = theme.category;
            t.files = vec![
                file(
                    &format!("{}/{}", theme.dir, theme.shared_file),
                    FileOp::Update,
                ),
                file(&format!("{}/{own}", theme.dir), FileOp::Create),
            ];
            match k {
                1 | 2 => t.links.push(link(RelationshipKind::DependsOn, ids[0])),
                4 => t.links.push(link(RelationshipKind::DependsOn, ids[3])),
                _ => {}
            }
            tasks.push(t);
        }
        let mut group = ids.to_vec();
        group.sort_unstable();
        groups.push(group);
    }
    // Interleave the groups: the order the tasks come in must not matter.
    let order = shuffled_numbers(50, seed ^ 0x5eed);
    let mut interleaved: Vec<BacklogTask> = order
        .iter()
        .map(|n| tasks[*n as usize - 1].clone())
        .collect();
    interleaved.rotate_left(seed as usize % 50);
    (interleaved, groups)
}

#[test]
fn a_seeded_backlog_of_50_tasks_comes_back_as_its_10_groups() {
    for seed in [1, 2, 3, 42, 2024] {
        let (tasks, groups) = seeded_backlog(seed);
        assert_eq!(tasks.len(), 50);
        let suggestions = suggest(&tasks, &Weights::default(), DEFAULT_THRESHOLD);

        let mut found: Vec<Vec<u32>> = suggestions.iter().map(|s| s.tasks.clone()).collect();
        found.sort();
        let mut expected = groups.clone();
        expected.sort();
        assert_eq!(found, expected, "seed {seed}: {suggestions:#?}");

        for suggestion in &suggestions {
            let g = groups
                .iter()
                .position(|group| *group == suggestion.tasks)
                .expect("every suggestion is an intended group, checked above");
            let theme = &THEMES[g];
            assert_eq!(suggestion.name, theme.dir.replace('/', "-"));
            assert!(suggestion.score >= DEFAULT_THRESHOLD && suggestion.score <= 1.0);
            assert!(
                suggestion
                    .reason
                    .contains(&format!("same component {}", theme.dir)),
                "{}",
                suggestion.reason
            );
            assert!(
                suggestion
                    .reason
                    .contains(&format!("both {}", theme.category)),
                "{}",
                suggestion.reason
            );
            assert!(suggestion.reason.split("; ").count() <= MAX_GROUP_REASONS);
        }
        // Highest score first, then the first task.
        for pair in suggestions.windows(2) {
            assert!(
                pair[0].score > pair[1].score
                    || (pair[0].score == pair[1].score && pair[0].tasks[0] < pair[1].tasks[0]),
                "{pair:#?}"
            );
        }
        // The same backlog in another order gives the same suggestions.
        let mut reversed = tasks.clone();
        reversed.reverse();
        assert_eq!(
            suggest(&reversed, &Weights::default(), DEFAULT_THRESHOLD),
            suggestions
        );
    }
}

#[test]
fn tasks_placed_in_a_list_leave_the_seeded_groups() {
    let (mut tasks, groups) = seeded_backlog(42);
    // Two tasks of group 0 and four of group 5 move into lists; the one left in group 5 has no
    // partner in the queue.
    let listed: Vec<u32> = groups[0][..2]
        .iter()
        .chain(&groups[5][..4])
        .copied()
        .collect();
    for t in tasks.iter_mut().filter(|t| listed.contains(&t.number)) {
        t.placement = Placement::List("sprint-1".into());
    }
    let suggestions = suggest(&tasks, &Weights::default(), DEFAULT_THRESHOLD);
    assert_eq!(suggestions.len(), 9, "{suggestions:#?}");
    for suggestion in &suggestions {
        assert!(
            suggestion.tasks.iter().all(|n| !listed.contains(n)),
            "{suggestion:?}"
        );
    }
    assert!(suggestions.iter().any(|s| s.tasks == groups[0][2..]));
    assert!(
        suggestions.iter().all(|s| !s.tasks.contains(&groups[5][4])),
        "a lone task is no group"
    );
}

fn arb_task(number: u32) -> impl Strategy<Value = BacklogTask> {
    let paths = prop::sample::select(vec![
        "README.md",
        "src/lib.rs",
        "src/auth/login.rs",
        "src/auth/mod.rs",
        "src/db/users.rs",
        "docs/guide/cli.md",
    ]);
    let ops = prop::sample::select(vec![FileOp::Create, FileOp::Update, FileOp::Read]);
    let kinds = prop::sample::select(RelationshipKind::ALL.to_vec());
    (
        prop::sample::select(Category::ALL.to_vec()),
        "[a-zA-Z é]{0,30}",
        "[a-z ]{0,60}",
        prop::collection::vec((paths, ops), 0..5),
        prop::collection::vec((kinds, 1u32..6), 0..4),
    )
        .prop_map(move |(category, title, description, files, links)| {
            let mut t = task(number);
            t.category = category;
            t.title = title;
            t.description = description;
            t.files = files.into_iter().map(|(path, op)| file(path, op)).collect();
            t.links = links
                .into_iter()
                .map(|(kind, target)| link(kind, target))
                .collect();
            t
        })
}

fn arb_weights() -> impl Strategy<Value = Weights> {
    (
        0.0..=1.0f64,
        0.0..=1.0f64,
        0.0..=1.0f64,
        0.0..=1.0f64,
        0.0..=1.0f64,
    )
        .prop_map(
            |(file_overlap, dependency, category, description, component)| Weights {
                file_overlap,
                dependency,
                category,
                description,
                component,
            },
        )
        .prop_filter("at least one weight counts", |w| w.check().is_ok())
}

proptest! {
    #[test]
    fn a_pairs_score_is_symmetric_and_from_0_to_1(
        a in arb_task(1),
        b in arb_task(2),
        weights in prop_oneof![Just(Weights::default()), arb_weights()],
    ) {
        let ab = score_pair(&a, &b, &weights);
        let ba = score_pair(&b, &a, &weights);
        prop_assert_eq!(ab.score, ba.score);
        prop_assert!((0.0..=1.0).contains(&ab.score), "{}", ab.score);
    }
}
