//! Every relationship type of docs/design.md §4, and the plan language's routes and confidence
//! threshold, shown by its effect on a real execution: a coordinator and workers over a real
//! nats-server, judged by the event log and the execution graph.

use std::time::Duration;

use trellis_proto::v1::{self, ExecutionState, TaskState};

use crate::cluster::{self, Run};

/// The position in the timeline of the first `what` of `task`.
fn at(run: &Run, task: &str, what: &str) -> usize {
    run.timeline()
        .iter()
        .position(|(t, w)| t == task && *w == what)
        .unwrap_or_else(|| panic!("{task} never {what}: {:?}", run.timeline()))
}

/// The state of the last instance of `task` in the graph, if it has one.
fn state_of(run: &Run, task: &str) -> Option<TaskState> {
    run.graph
        .nodes
        .iter()
        .filter_map(|n| n.record.as_ref())
        .rfind(|r| r.task_id == task)
        .map(|r| TaskState::try_from(r.state).unwrap_or(TaskState::Unspecified))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depends_on_and_blocks_order_tasks() {
    let mut cluster = cluster::start(2).await;
    let run = cluster
        .run(
            "name: order\ntasks:\n\
             - {id: a, type: sleep, input: {ms: 80}}\n\
             - {id: b, type: noop, relationships: [{type: depends_on, target: a}]}\n\
             - {id: c, type: sleep, input: {ms: 80}, relationships: [{type: blocks, target: d}]}\n\
             - {id: d, type: noop}\n",
        )
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    assert!(at(&run, "a", "completed") < at(&run, "b", "dispatched"));
    assert!(
        at(&run, "c", "completed") < at(&run, "d", "dispatched"),
        "d is declared free but c blocks it: {:?}",
        run.timeline()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_tasks_never_overlap_but_uncertain_estimates_do_not_block() {
    let mut cluster = cluster::start(2).await;
    let run = cluster
        .run(
            "name: conflicts\noptions: {min_conflict_confidence: 0.5}\ntasks:\n\
             - {id: x, type: sleep, input: {ms: 150}, relationships: [{type: conflicts_with, target: y}]}\n\
             - {id: y, type: sleep, input: {ms: 150}}\n\
             - {id: f1, type: sleep, input: {ms: 150}, files: [{path: db.sql, op: UPDATE}]}\n\
             - {id: f2, type: sleep, input: {ms: 150}, files: [{path: db.sql, op: DELETE}]}\n\
             - {id: e1, type: sleep, input: {ms: 150}, files: [{path: ui.ts, op: UPDATE, confidence: 0.2}]}\n\
             - {id: e2, type: sleep, input: {ms: 150}, files: [{path: ui.ts, op: UPDATE, confidence: 0.2}]}\n",
        )
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    assert_eq!(
        run.max_running(|t| t == "x" || t == "y"),
        1,
        "conflicts_with"
    );
    assert_eq!(
        run.max_running(|t| t == "f1" || t == "f2"),
        1,
        "UPDATE and DELETE of one file"
    );
    assert_eq!(
        run.max_running(|t| t == "e1" || t == "e2"),
        2,
        "estimates below min_conflict_confidence run together"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn superseded_and_duplicate_tasks_never_run() {
    let mut cluster = cluster::start(2).await;
    // `old` and `build-again` would fail if they ran.
    let run = cluster
        .run(
            "name: replaced\ntasks:\n\
             - {id: old, type: fail, input: {times: 9, retryable: false}}\n\
             - {id: new, type: sleep, input: {ms: 50}, relationships: [{type: supersedes, target: old}]}\n\
             - {id: after-old, type: noop, depends_on: [old]}\n\
             - {id: build, type: sleep, input: {ms: 50}}\n\
             - {id: build-again, type: fail, input: {times: 9, retryable: false}, relationships: [{type: duplicate_of, target: build}]}\n\
             - {id: ship, type: noop, depends_on: [build-again]}\n",
        )
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    assert_eq!(run.count("old", "dispatched"), 0);
    assert_eq!(run.count("build-again", "dispatched"), 0);
    assert!(
        at(&run, "new", "completed") < at(&run, "after-old", "dispatched"),
        "a dependent of the superseded task waits for its replacement"
    );
    assert!(
        at(&run, "build", "completed") < at(&run, "ship", "dispatched"),
        "a dependent of a duplicate waits for the original"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subtasks_run_as_a_group_that_resumes_their_parent_once() {
    let mut cluster = cluster::start(2).await;
    let run = cluster
        .run(
            "name: group\ntasks:\n\
             - {id: ship, type: noop}\n\
             - {id: review, type: sleep, input: {ms: 40}, relationships: [{type: subtask_of, target: ship}]}\n\
             - {id: lint, type: sleep, input: {ms: 40}, relationships: [{type: subtask_of, target: ship}]}\n\
             - {id: announce, type: noop, depends_on: [ship]}\n",
        )
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    assert_eq!(run.count("ship", "dispatched"), 2, "run, then resumed once");
    let timeline = run.timeline();
    let second_ship = timeline
        .iter()
        .enumerate()
        .filter(|(_, (t, w))| t == "ship" && *w == "dispatched")
        .nth(1)
        .map(|(i, _)| i)
        .expect("a second dispatch of ship");
    for member in ["review", "lint"] {
        assert!(at(&run, member, "completed") < second_ship, "{timeline:?}");
    }
    assert!(second_ship < at(&run, "announce", "dispatched"));
    // The tree's root group holds the plan's top-level tasks; the static group hangs under ship.
    assert_eq!(run.graph.groups.len(), 2, "{:?}", run.graph.groups);
    let members: Vec<Vec<&str>> = run
        .graph
        .groups
        .iter()
        .map(|g| {
            let mut ids: Vec<&str> = g
                .node_indices
                .iter()
                .filter_map(|&i| run.graph.nodes[i as usize].record.as_ref())
                .map(|r| r.task_id.as_str())
                .collect();
            // Members are listed in the order they were created, which is not fixed.
            ids.sort_unstable();
            ids
        })
        .collect();
    assert!(
        members.contains(&vec!["lint", "review"]),
        "the static group's members: {members:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_test_fails_the_run_of_its_target() {
    let mut cluster = cluster::start(2).await;
    let run = cluster
        .run(
            "name: tested\noptions: {failure: {continue_on_partial_failure: true}}\ntasks:\n\
             - {id: build, type: noop}\n\
             - {id: build-tests, type: fail, input: {times: 9, retryable: false}, relationships: [{type: tests, target: build}]}\n",
        )
        .await;
    assert!(at(&run, "build", "completed") < at(&run, "build-tests", "dispatched"));
    assert_eq!(run.state(), ExecutionState::Failed);
    // build's attempt did complete (its instance and the instance counts say so), but its plan
    // task fails with its test: two failed tasks, not one, even with continue_on_partial_failure.
    assert_eq!(state_of(&run, "build-tests"), Some(TaskState::Failed));
    assert_eq!(
        run.execution.reason, "2 tasks failed",
        "{:?}",
        run.execution
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_relationships_change_nothing() {
    let mut cluster = cluster::start(2).await;
    let run = cluster
        .run(
            "name: metadata\ntasks:\n\
             - {id: a, type: sleep, input: {ms: 150}}\n\
             - {id: b, type: sleep, input: {ms: 150}, relationships: [{type: related_to, target: a}]}\n\
             - {id: c, type: sleep, input: {ms: 150}, relationships: [{type: implements, target: a}]}\n\
             - {id: d, type: sleep, input: {ms: 150}, relationships: [{type: enables, target: a}]}\n\
             - {id: e, type: sleep, input: {ms: 150}, relationships: [{type: inspired_by, target: a}]}\n",
        )
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    assert_eq!(run.max_running(|_| true), 5, "no order, no conflict");
}

const ROUTED: &str = "name: triage\ntasks:\n\
    - {id: triage, type: noop, input: {kind: KIND}, \
       route: {path: /kind, cases: {bug: [fix], feature: [build]}, default: [ask]}}\n\
    - {id: fix, type: noop}\n\
    - {id: build, type: noop}\n\
    - {id: ask, type: noop}\n\
    - {id: close, type: noop, depends_on: [fix, build, ask]}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_runs_only_the_branch_the_output_picks() {
    let mut cluster = cluster::start(2).await;
    for (kind, runs) in [("bug", "fix"), ("feature", "build"), ("question", "ask")] {
        let yaml = ROUTED.replace("KIND", kind);
        // Compiled by the planner's code path and sent as a plan, as `trellis submit --planner`
        // does.
        let plan = trellis_core::plan::compile_str(&yaml, &Default::default())
            .expect("the routed plan compiles");
        let id = cluster
            .client
            .start_execution(v1::StartExecutionRequest {
                plan_source: Some(v1::start_execution_request::PlanSource::Plan(
                    trellis_wire::plan::to_proto(&plan),
                )),
                options: None,
            })
            .await
            .expect("a compiled plan starts")
            .into_inner()
            .execution_id;
        let run = cluster.wait(&id, Duration::from_secs(60)).await;
        assert_eq!(run.state(), ExecutionState::Completed, "{kind}");
        for task in ["fix", "build", "ask"] {
            let expected = usize::from(task == runs);
            assert_eq!(run.count(task, "dispatched"), expected, "{kind}: {task}");
        }
        assert_eq!(
            run.count("close", "dispatched"),
            1,
            "{kind}: skipped branches let close run"
        );
        // The log records a spec that compiles to the very plan that ran.
        let Some(v1::event::Kind::ExecutionStarted(started)) =
            run.events.first().and_then(|e| e.kind.as_ref())
        else {
            panic!("the log starts with ExecutionStarted");
        };
        let recorded = trellis_core::plan::compile_str(&started.spec, &Default::default())
            .expect("the recorded spec compiles");
        assert_eq!(recorded, plan, "{kind}");
    }
}
