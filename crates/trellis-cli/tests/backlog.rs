//! The backlog end to end through the `trellis` binary against `trellis dev` (its own NATS server,
//! coordinator, workers, checkpoint-store and planner on SQLite): tasks into a list, the list run
//! as an execution with its tests as checks, the list's counters following it; run 2 a new lane;
//! a failing test failing the run.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::Dev;

#[test]
fn a_list_runs_as_an_execution_and_its_counters_follow_it() {
    let dev = Dev::start();
    let schema = dev.ok(&[
        "tasks",
        "add",
        "Create the schema",
        "-c",
        "feature",
        "-f",
        "db/schema.sql:create",
        "--codebase-test",
        "true",
    ]);
    assert!(schema.starts_with("added T-1 "), "{schema}");
    dev.ok(&[
        "tasks",
        "add",
        "Serve the API",
        "-c",
        "feature",
        "-f",
        "src/api.rs:create",
        "--depends-on",
        "T-1",
    ]);
    dev.ok(&[
        "tasks",
        "add",
        "Draw the page",
        "-f",
        "web/page.tsx:create",
        "--depends-on",
        "T-2",
        "--ui-test",
        "test -n \"$TRELLIS_OUTPUT_FILE\"",
    ]);
    dev.ok(&["lists", "create", "release", "--max-parallel", "2"]);
    dev.ok(&["lists", "add", "release", "T-1", "T-2", "T-3"]);

    let first = dev.ok(&["lists", "run", "release", "--type", "noop", "--wait"]);
    assert!(
        first.contains("completed  3/3 completed, 0 failed"),
        "{first}"
    );
    let shown = dev.json(&["lists", "show", "release"]);
    assert_eq!(shown["status"], "completed", "{shown}");
    assert_eq!(shown["runs"], 1);
    assert_eq!(shown["total_tasks"], 3);
    assert_eq!(shown["completed_tasks"], 3);
    let tasks = shown["tasks"].as_array().expect("tasks");
    for task in tasks {
        assert_eq!(task["item_status"], "completed", "{task}");
        assert_eq!(task["status"], "completed", "{task}");
    }

    // Run 2 of the same list is a new execution, a lane of its own.
    let second = dev.json(&["lists", "run", "release", "--type", "noop", "--wait"]);
    assert_eq!(second["run"], 2);
    assert_eq!(second["status"], "completed");
    let runs = dev.json(&["lists", "runs", "release"]);
    let runs = runs["runs"].as_array().expect("runs").clone();
    assert_eq!(runs.len(), 2);
    assert_ne!(runs[0]["execution_id"], runs[1]["execution_id"]);
    assert!(
        runs.iter().all(|run| run["tasks_completed"] == 3),
        "{runs:?}"
    );

    // A test that fails fails its task (after its retries) and the run; the list pauses.
    dev.ok(&[
        "tasks",
        "add",
        "Break the build",
        "--list",
        "release",
        "--codebase-test",
        "false",
    ]);
    let (code, stdout, stderr) =
        dev.trellis(&["lists", "run", "release", "--type", "noop", "--wait"]);
    assert_eq!(code, 1, "a failed run exits 1:\n{stdout}\n{stderr}");
    assert!(stdout.contains("run 3   failed"), "{stdout}");
    let shown = dev.json(&["lists", "show", "release"]);
    assert_eq!(shown["status"], "paused", "{shown}");
    assert_eq!(shown["failed_tasks"], 1, "{shown}");
}

#[test]
fn bad_backlog_input_is_refused_with_its_place_and_changes_nothing() {
    let dev = Dev::start();
    dev.ok(&["lists", "create", "auth"]);
    let (code, _, stderr) = dev.trellis(&["tasks", "add", "x", "-c", "feture"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("fields.category: unknown category \"feture\""),
        "{stderr}"
    );
    let (code, _, stderr) = dev.trellis(&["tasks", "add", "x", "-f", "src/a.rs"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("expected PATH:OPERATION"), "{stderr}");
    let (code, _, stderr) = dev.trellis(&["lists", "run", "auth", "--type", "noop"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("list auth has no tasks"), "{stderr}");
    let tasks = dev.json(&["tasks", "list"]);
    assert_eq!(tasks["tasks"], Value::Array(Vec::new()), "{tasks}");
    let runs = dev.json(&["lists", "runs", "auth"]);
    assert_eq!(runs["runs"], Value::Array(Vec::new()), "{runs}");
}

/// What a crash of the planner between recording a run and starting its execution leaves behind:
/// a run `starting` with no execution. The follower takes a run `starting` for longer than
/// `RESTART_AFTER` for one and starts it, once, under the run's idempotency key.
#[test]
fn a_run_left_starting_by_a_crash_is_started_again() {
    use trellis_checkpoint_store::store::connect_backlog;

    let dev = Dev::start();
    dev.ok(&["tasks", "add", "Only task", "-f", "src/only.rs:create"]);
    dev.ok(&["lists", "create", "solo"]);
    dev.ok(&["lists", "add", "solo", "T-1"]);
    // `trellis dev` keeps its database in the temporary directory, named after its process. A
    // process killed before it could remove its own may have left one under the same process
    // number: the file is the one this process holds open.
    let prefix = format!("trellis-store-{}-", dev.child.id());
    let file = std::fs::read_dir(format!("/proc/{}/fd", dev.child.id()))
        .expect("trellis dev's open files")
        .filter_map(Result::ok)
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .find(|path| {
            path.file_name()
                .is_some_and(|name| name.to_string_lossy().starts_with(&prefix))
                && path.extension().is_some_and(|ext| ext == "db")
        })
        .expect("trellis dev's database file");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let backlog = connect_backlog(&format!("sqlite://{}", file.display()))
            .await
            .expect("the backlog opens");
        // Recorded a minute ago, never started.
        let a_minute_ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|now| i64::try_from(now.as_millis()).unwrap_or(i64::MAX) - 60_000)
            .expect("a clock after 1970");
        let run = backlog
            .start_run("default", "solo", "noop", "", a_minute_ago)
            .await
            .expect("the run is recorded");
        assert_eq!(run, 1);
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let runs = loop {
        let runs = dev.json(&["lists", "runs", "solo"]);
        if runs["runs"][0]["status"] == "completed" {
            break runs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run left starting was not started within 30 s: {runs}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(runs["runs"][0]["tasks_completed"], 1, "{runs}");
    assert_ne!(runs["runs"][0]["execution_id"], "", "{runs}");
    let shown = dev.json(&["lists", "show", "solo"]);
    assert_eq!(shown["runs"], 1, "one run, started once: {shown}");
    assert_eq!(shown["status"], "completed", "{shown}");
}

#[test]
fn a_task_made_from_a_template_takes_the_fields_it_leaves_empty() {
    let dev = Dev::start();
    let stored = dev.json(&[
        "templates",
        "put",
        "bugfix",
        "--about",
        "A bug with its regression test",
        "-c",
        "bug",
        "-p",
        "p2",
        "--criterion",
        "a test reproduces the bug",
        "--codebase-test",
        "cargo test",
        "-f",
        "src/lib.rs:update",
    ]);
    assert_eq!(stored["usage_count"], 0, "{stored}");

    dev.ok(&[
        "tasks",
        "add",
        "Fix the signup redirect",
        "--template",
        "bugfix",
        "-p",
        "p1",
        "-f",
        "src/signup.rs:update",
    ]);
    let task = dev.json(&["tasks", "show", "T-1"]);
    // Given here: the title, the priority and the files; the rest from the template.
    assert_eq!(task["title"], "Fix the signup redirect", "{task}");
    assert_eq!(task["priority"], "p1", "{task}");
    assert_eq!(task["category"], "bug", "{task}");
    assert_eq!(
        task["acceptance_criteria"],
        serde_json::json!(["a test reproduces the bug"]),
        "{task}"
    );
    assert_eq!(
        task["codebase_tests"],
        serde_json::json!(["cargo test"]),
        "{task}"
    );
    let files = task["files"].to_string();
    assert!(
        files.contains("src/signup.rs") && !files.contains("src/lib.rs"),
        "{task}"
    );
    let listed = dev.json(&["templates", "list"]);
    assert_eq!(listed["templates"][0]["usage_count"], 1, "{listed}");

    // Bad templates change nothing.
    let (code, _, stderr) = dev.trellis(&["templates", "put", "linked", "--depends-on", "T-1"]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("template.defaults.relationships: a template gives no relationships"),
        "{stderr}"
    );
    let (code, _, stderr) = dev.trellis(&["tasks", "add", "Orphan", "--template", "nope"]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("project default has no template nope"),
        "{stderr}"
    );
    let tasks = dev.json(&["tasks", "list"]);
    assert_eq!(tasks["tasks"].as_array().map(Vec::len), Some(1), "{tasks}");
    assert!(
        dev.ok(&["templates", "delete", "bugfix"])
            .contains("deleted")
    );
    assert_eq!(
        dev.json(&["templates", "list"])["templates"],
        serde_json::json!([])
    );
}
