//! The state machine running compiled plans: relationship semantics (docs/design.md §4) and the example
//! plans end to end.

use std::sync::Arc;

use trellis_core::machine::{EventBody, ExecutionState, Usage};
use trellis_core::plan::{Limits, Plan, compile_str};
use trellis_core::record::TaskState;

use crate::common::Sim;

fn compiled(yaml: &str) -> Arc<Plan> {
    Arc::new(compile_str(yaml, &Limits::default()).unwrap_or_else(|e| panic!("plan compiles: {e}")))
}

/// Runs to the end; `fail` names tasks whose attempts fail without retry. Returns the order in
/// which plan tasks were dispatched.
fn run(sim: &mut Sim, fail: &[&str]) -> Vec<String> {
    let mut dispatched = Vec::new();
    for _ in 0..1_000 {
        if sim.exec.state().is_terminal() {
            return dispatched;
        }
        sim.advance(1_000);
        sim.decide();
        let running: Vec<_> = sim.exec.instances_in(TaskState::Running).collect();
        for instance in running {
            let assignment = sim.exec.assignment(instance).expect("running instance");
            let (task_id, attempt) = (assignment.task_id.to_owned(), assignment.attempt);
            dispatched.push(task_id.clone());
            let body = if fail.contains(&task_id.as_str()) {
                EventBody::TaskFailed {
                    instance,
                    attempt,
                    error: "red".into(),
                    retryable: false,
                    usage: Usage::default(),
                }
            } else {
                EventBody::TaskCompleted {
                    instance,
                    attempt,
                    output: serde_json::json!(task_id),
                    usage: Usage::default(),
                }
            };
            sim.apply(body).expect("result accepted");
        }
    }
    panic!("execution did not end: {:?}", sim.exec.progress(sim.now));
}

fn outcome(sim: &Sim, task: &str) -> Option<TaskState> {
    sim.exec
        .task_outcome(sim.exec.plan().task_idx(task).expect("task exists"))
}

#[test]
fn superseded_tasks_are_skipped_and_their_dependents_wait_for_the_replacement() {
    let mut sim = Sim::new(compiled(
        "name: s\ntasks:\n- {id: old, type: noop}\n- {id: new, type: noop, relationships: [{type: supersedes, target: old}]}\n- {id: after, type: noop, depends_on: [old]}\n",
    ));
    let order = run(&mut sim, &[]);
    assert_eq!(order, ["new", "after"], "old never runs");
    assert_eq!(outcome(&sim, "old"), Some(TaskState::Skipped));
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
}

#[test]
fn duplicates_share_the_original_result() {
    let mut sim = Sim::new(compiled(
        "name: d\ntasks:\n- {id: build, type: noop}\n- {id: build-again, type: noop, relationships: [{type: duplicate_of, target: build}]}\n- {id: ship, type: noop, depends_on: [build-again]}\n",
    ));
    let order = run(&mut sim, &[]);
    assert_eq!(order, ["build", "ship"]);
    assert_eq!(outcome(&sim, "build-again"), Some(TaskState::Completed));
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
}

#[test]
fn static_subtasks_run_as_a_group_and_resume_their_parent() {
    let mut sim = Sim::new(compiled(
        "name: g\ntasks:\n- {id: ship, type: noop}\n- {id: review, type: noop, relationships: [{type: subtask_of, target: ship}]}\n- {id: lint, type: noop, relationships: [{type: subtask_of, target: ship}]}\n- {id: announce, type: noop, depends_on: [ship]}\n",
    ));
    let order = run(&mut sim, &[]);
    assert_eq!(
        order,
        ["ship", "review", "lint", "ship", "announce"],
        "the parent runs again after its group"
    );
    let (_, _, settled, _) = sim.exec.groups().next().expect("a static group");
    assert!(settled);
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
    trellis_core::graph::build(sim.exec.records()).expect("one tree");
}

#[test]
fn a_failing_test_task_fails_its_target() {
    let mut sim = Sim::new(compiled(
        "name: t\noptions: {failure: {continue_on_partial_failure: true}}\ntasks:\n- {id: build, type: noop}\n- {id: build-tests, type: noop, relationships: [{type: tests, target: build}]}\n",
    ));
    let order = run(&mut sim, &["build-tests"]);
    assert_eq!(order, ["build", "build-tests"]);
    assert_eq!(
        outcome(&sim, "build"),
        Some(TaskState::Failed),
        "the target's run fails with its test"
    );
    assert_eq!(sim.exec.state(), ExecutionState::Failed);
    // The target's record says why, rather than `completed`.
    let build = sim
        .exec
        .records()
        .into_iter()
        .find(|r| r.task_id == "build")
        .expect("build has a record");
    assert_eq!(build.state, TaskState::Failed);
    assert!(
        build
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("completed, but build-tests, which tests it, failed: ")),
        "{:?}",
        build.error
    );
    assert_eq!(sim.replay(), sim.exec, "a replay agrees");
}

#[test]
fn every_example_plan_runs_to_completion() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut n_examples = 0;
    for entry in std::fs::read_dir(&dir).expect("examples directory") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        n_examples += 1;
        let text = std::fs::read_to_string(&path).expect("readable example");
        let mut sim = Sim::new(compiled(&text));
        run(&mut sim, &[]);
        assert_eq!(
            sim.exec.state(),
            ExecutionState::Completed,
            "{}",
            path.display()
        );
        let progress = sim.exec.progress(sim.now);
        assert_eq!(progress.percent, 100.0, "{}", path.display());
        trellis_core::graph::build(sim.exec.records())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(sim.replay(), sim.exec, "{}", path.display());
    }
    assert!(
        n_examples >= 3,
        "found only {n_examples} examples in {}",
        dir.display()
    );
}
