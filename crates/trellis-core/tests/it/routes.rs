//! Conditional routing: a deciding task's output picks which routed tasks run.

use std::sync::Arc;

use trellis_core::machine::{EventBody, ExecutionState, Usage};
use trellis_core::plan::{Limits, compile_str};
use trellis_core::record::TaskState;

use crate::common::Sim;

const TRIAGE: &str = "
name: triage
tasks:
  - id: classify
    type: noop
    route: {path: /kind, cases: {bug: [fix], feature: [build, doc]}, default: [ask]}
  - {id: fix, type: noop}
  - {id: build, type: noop}
  - {id: doc, type: noop}
  - {id: ask, type: noop}
  - {id: report, type: noop, depends_on: [fix, build, ask]}
";

/// Runs the triage plan with `classify` answering `output` and everything else completing; returns
/// the simulation and the tasks that ran, in order.
fn run(output: serde_json::Value) -> (Sim, Vec<String>) {
    let plan = compile_str(TRIAGE, &Limits::default()).expect("the plan compiles");
    let mut sim = Sim::new(Arc::new(plan));
    let mut ran = Vec::new();
    for _ in 0..100 {
        sim.decide();
        let running: Vec<_> = sim.exec.instances_in(TaskState::Running).collect();
        if running.is_empty() && sim.exec.state().is_terminal() {
            break;
        }
        for instance in running {
            let assignment = sim.exec.assignment(instance).expect("instance exists");
            let task_id = assignment.task_id.to_owned();
            let attempt = assignment.attempt;
            let output = if task_id == "classify" {
                output.clone()
            } else {
                serde_json::json!({})
            };
            ran.push(task_id);
            sim.apply(EventBody::TaskCompleted {
                instance,
                attempt,
                output,
                usage: Usage::default(),
            })
            .expect("completion accepted");
        }
    }
    (sim, ran)
}

fn outcome(sim: &Sim, task: &str) -> Option<TaskState> {
    sim.exec
        .task_outcome(sim.exec.plan().task_idx(task).expect("task exists"))
}

#[test]
fn a_matching_case_runs_its_tasks_and_skips_the_others() {
    let (sim, ran) = run(serde_json::json!({"kind": "feature"}));
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
    let mut ran_sorted = ran.clone();
    ran_sorted.sort();
    assert_eq!(ran_sorted, ["build", "classify", "doc", "report"]);
    assert_eq!(outcome(&sim, "fix"), Some(TaskState::Skipped));
    assert_eq!(outcome(&sim, "ask"), Some(TaskState::Skipped));
    assert_eq!(outcome(&sim, "build"), Some(TaskState::Completed));
    let fix = sim.exec.plan().task_idx("fix").expect("task exists");
    assert_eq!(
        sim.exec.skip_reason(fix).as_deref(),
        Some(r#"not routed: route of "classify" chose by output /kind = "feature""#)
    );
    let build = sim.exec.plan().task_idx("build").expect("task exists");
    assert_eq!(sim.exec.skip_reason(build), None);
    let routed_out: Vec<&str> = sim.exec.routed_out().iter().map(|(id, _)| *id).collect();
    assert_eq!(
        routed_out,
        ["fix", "ask"],
        "the routed-out tasks, in plan order"
    );
    // The same log replayed gives the same state.
    assert_eq!(sim.replay(), sim.exec);
}

#[test]
fn no_matching_case_runs_the_default_and_downstream_still_finishes() {
    let (sim, ran) = run(serde_json::json!({"kind": "question"}));
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
    assert_eq!(ran, ["classify", "ask", "report"]);
    for task in ["fix", "build", "doc"] {
        assert_eq!(outcome(&sim, task), Some(TaskState::Skipped), "{task}");
    }
    assert_eq!(outcome(&sim, "report"), Some(TaskState::Completed));
    // An output without the path matches no case either.
    let (sim, ran) = run(serde_json::json!("no kind here"));
    assert_eq!(ran, ["classify", "ask", "report"]);
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
}

#[test]
fn a_case_matches_non_string_values_by_their_json_text() {
    let text = "
name: flags
tasks:
  - {id: check, type: noop, route: {path: ok, cases: {'true': [go], '3': [three]}}}
  - {id: go, type: noop}
  - {id: three, type: noop}
";
    let plan = compile_str(text, &Limits::default()).expect("the plan compiles");
    let go = plan.tasks[1].condition.clone().expect("go is routed");
    assert_eq!(go.pointer, "/ok");
    assert!(go.holds(Some(&serde_json::json!({"ok": true}))));
    assert!(!go.holds(Some(&serde_json::json!({"ok": "false"}))));
    assert!(!go.holds(None), "a router without output picks nothing");
    let three = plan.tasks[2].condition.clone().expect("three is routed");
    assert!(three.holds(Some(&serde_json::json!({"ok": 3}))));
}

/// Each plan task is handed the outputs of its dependencies that completed, in dependency order;
/// a router is told to keep its output inline (the coordinator reads it), nothing else is.
#[test]
fn assignments_carry_the_dependencies_outputs_and_routers_keep_theirs_inline() {
    let plan = compile_str(TRIAGE, &Limits::default()).expect("the plan compiles");
    let mut sim = Sim::new(Arc::new(plan));
    let mut seen = Vec::new();
    for _ in 0..100 {
        sim.decide();
        let running: Vec<_> = sim.exec.instances_in(TaskState::Running).collect();
        if running.is_empty() && sim.exec.state().is_terminal() {
            break;
        }
        for instance in running {
            let assignment = sim.exec.assignment(instance).expect("instance exists");
            let task_id = assignment.task_id.to_owned();
            let attempt = assignment.attempt;
            let upstream: Vec<(String, serde_json::Value)> = assignment
                .upstream
                .iter()
                .map(|(task, output)| ((*task).to_owned(), (*output).clone()))
                .collect();
            seen.push((task_id.clone(), upstream, assignment.keep_output_inline));
            let output = if task_id == "classify" {
                serde_json::json!({"kind": "feature"})
            } else {
                serde_json::json!({"by": task_id})
            };
            sim.apply(EventBody::TaskCompleted {
                instance,
                attempt,
                output,
                usage: Usage::default(),
            })
            .expect("completion accepted");
        }
    }
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
    let of = |task: &str| {
        seen.iter()
            .find(|(id, _, _)| id == task)
            .unwrap_or_else(|| panic!("{task} ran"))
            .clone()
    };
    let (_, upstream, inline) = of("classify");
    assert!(upstream.is_empty() && inline, "the router: {upstream:?}");
    let (_, upstream, inline) = of("build");
    assert_eq!(
        upstream,
        [(
            "classify".to_owned(),
            serde_json::json!({"kind": "feature"})
        )]
    );
    assert!(!inline);
    // `fix` and `ask` were routed out: they have no output to hand on.
    let (_, upstream, _) = of("report");
    assert_eq!(
        upstream,
        [("build".to_owned(), serde_json::json!({"by": "build"}))]
    );
}
