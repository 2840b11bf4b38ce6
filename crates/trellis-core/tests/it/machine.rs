//! Scenario tests of the execution state machine.

use trellis_core::ids::{GroupId, QuestionId, TaskInstanceId, WorkerId};
use trellis_core::machine::{
    Applied, ApplyError, Command, EventBody, ExecutionState, GroupRule, Ignored, Outcome,
    PauseMode, PauseScope, Question, ResumeContext, SubtaskSpec, TimeoutAction, Usage,
};
use trellis_core::plan::CheckLevel;
use trellis_core::policy::{Backoff, BackoffKind, FailureAction};
use trellis_core::record::{AttemptRecord, CheckResult, TaskState};

use crate::common::{PlanBuilder, Sim, T0, chain, ms};

fn running(sim: &Sim) -> Vec<TaskInstanceId> {
    sim.exec.instances_in(TaskState::Running).collect()
}

fn task_of(sim: &Sim, instance: TaskInstanceId) -> String {
    sim.exec
        .assignment(instance)
        .map(|a| a.task_id.to_owned())
        .unwrap_or_default()
}

fn complete(sim: &mut Sim, instance: TaskInstanceId) -> Applied {
    let attempt = sim.exec.attempt(instance).expect("instance exists");
    sim.apply(EventBody::TaskCompleted {
        instance,
        attempt,
        output: serde_json::json!({ "done": task_of(sim, instance) }),
        usage: Usage::default(),
    })
    .expect("completion accepted")
}

fn fail(sim: &mut Sim, instance: TaskInstanceId, retryable: bool) -> Applied {
    let attempt = sim.exec.attempt(instance).expect("instance exists");
    sim.apply(EventBody::TaskFailed {
        instance,
        attempt,
        error: "boom".to_owned(),
        retryable,
        usage: Usage::default(),
    })
    .expect("failure accepted")
}

fn spawn(
    sim: &mut Sim,
    instance: TaskInstanceId,
    n: usize,
    rule: GroupRule,
    seed: u128,
) -> GroupId {
    let group = GroupId::derived(sim.now, seed);
    let attempt = sim.exec.attempt(instance).expect("instance exists");
    let members = (0..n)
        .map(|i| SubtaskSpec {
            task_type: "noop".into(),
            queue: None,
            input: serde_json::json!(i),
        })
        .collect();
    sim.apply(EventBody::SubtasksSpawned {
        instance,
        attempt,
        group,
        rule,
        members,
    })
    .expect("spawn accepted");
    group
}

/// Runs the simulation, completing everything that runs, until nothing more happens.
fn run_to_end(sim: &mut Sim) {
    for _ in 0..10_000 {
        let decided = sim.decide();
        let running = running(sim);
        for instance in &running {
            complete(sim, *instance);
        }
        if decided == 0 && running.is_empty() {
            if sim.exec.state().is_terminal() {
                return;
            }
            sim.advance(1_000);
        }
    }
    panic!("execution did not end: {:?}", sim.exec.progress(sim.now));
}

#[test]
fn seed_001_plan_runs_in_dependency_order() {
    let plan = PlanBuilder::new()
        .task("T-001", &[])
        .task("T-002", &[])
        .task("T-003", &["T-001"])
        .task("T-004", &["T-002"])
        .task("T-005", &["T-003", "T-004"])
        .build();
    let mut sim = Sim::new(plan);
    let progress = sim.exec.progress(sim.now);
    assert_eq!((progress.wave, progress.waves), (1, 3));
    sim.decide();
    let mut first: Vec<_> = running(&sim).iter().map(|i| task_of(&sim, *i)).collect();
    first.sort();
    assert_eq!(first, ["T-001", "T-002"]);
    let t1 = running(&sim)
        .into_iter()
        .find(|i| task_of(&sim, *i) == "T-001")
        .expect("T-001 runs");
    complete(&mut sim, t1);
    sim.decide();
    let mut now: Vec<_> = running(&sim).iter().map(|i| task_of(&sim, *i)).collect();
    now.sort();
    assert_eq!(
        now,
        ["T-002", "T-003"],
        "T-003 starts as soon as T-001 is done, without waiting for the wave"
    );
    run_to_end(&mut sim);
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
    let progress = sim.exec.progress(sim.now);
    assert_eq!(
        (progress.done, progress.total, progress.percent),
        (5, 5, 100.0)
    );
    assert_eq!(sim.replay(), sim.exec);
}

#[test]
fn the_room_a_decision_is_given_limits_its_dispatches_on_top_of_max_concurrency() {
    let mut builder = PlanBuilder::new().options(|o| o.max_concurrency = Some(3));
    for i in 0..6 {
        builder = builder.task(&format!("t{i}"), &[]);
    }
    let sim = Sim::new(builder.build());
    let dispatches = |room: u32| {
        sim.exec
            .decide_holding(sim.now, room, &mut |_, _| false)
            .into_iter()
            .filter(|command| matches!(command, Command::Dispatch { .. }))
            .count()
    };
    assert_eq!(dispatches(0), 0, "no room: nothing goes");
    assert_eq!(dispatches(2), 2, "the room is the tighter limit");
    assert_eq!(dispatches(5), 3, "max_concurrency is the tighter limit");
    let mut asked = 0;
    let held = sim.exec.decide_holding(sim.now, 0, &mut |_, _| {
        asked += 1;
        true
    });
    assert_eq!(
        (held, asked),
        (vec![], 0),
        "with no room no candidate is asked about"
    );
}

#[test]
fn max_concurrency_limits_dispatch() {
    let mut builder = PlanBuilder::new().options(|o| o.max_concurrency = Some(2));
    for i in 0..6 {
        builder = builder.task(&format!("t{i}"), &[]);
    }
    let mut sim = Sim::new(builder.build());
    assert_eq!(sim.decide(), 2);
    assert_eq!(sim.exec.decide(sim.now), vec![], "no slot is free");
    let queued: Vec<_> = sim.exec.instances_in(TaskState::Queued).collect();
    let refused = sim.apply(EventBody::TaskDispatched {
        instance: queued[0],
        attempt: 1,
    });
    assert!(
        matches!(
            refused,
            Err(ApplyError::ConcurrencyExceeded { limit: 2, .. })
        ),
        "{refused:?}"
    );
    run_to_end(&mut sim);
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
}

#[test]
fn conflicting_tasks_never_run_together_and_show_blocked() {
    let plan = PlanBuilder::new()
        .task("schema", &[])
        .task("migrate", &[])
        .task("docs", &[])
        .conflict("schema", "migrate")
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let names: Vec<_> = running(&sim).iter().map(|i| task_of(&sim, *i)).collect();
    assert_eq!(names, ["schema", "docs"]);
    assert_eq!(sim.exec.progress(sim.now).counts.get(TaskState::Blocked), 1);
    let migrate = sim
        .exec
        .instances_in(TaskState::Queued)
        .next()
        .expect("migrate waits");
    let refused = sim.apply(EventBody::TaskDispatched {
        instance: migrate,
        attempt: 1,
    });
    assert!(
        matches!(refused, Err(ApplyError::PathLocked { ref holder, .. }) if holder == "schema"),
        "{refused:?}"
    );
    let schema = running(&sim)[0];
    complete(&mut sim, schema);
    sim.decide();
    assert!(running(&sim).iter().any(|i| task_of(&sim, *i) == "migrate"));
}

#[test]
fn fan_out_of_1000_resumes_the_parent_exactly_once() {
    let mut sim = Sim::new(
        PlanBuilder::new()
            .task("parent", &[])
            .task("after", &["parent"])
            .build(),
    );
    sim.decide();
    let parent = running(&sim)[0];
    let group = spawn(&mut sim, parent, 1000, GroupRule::AllSettled, 1);
    assert_eq!(
        sim.exec.instance_state(parent),
        Some(TaskState::WaitingForSubtasks)
    );
    sim.decide();
    let members = running(&sim);
    assert_eq!(members.len(), 1000);
    for (i, member) in members.iter().enumerate() {
        complete(&mut sim, *member);
        // Every result delivered twice: the second is ignored.
        if i % 3 == 0 {
            let again = sim.apply(EventBody::TaskCompleted {
                instance: *member,
                attempt: 1,
                output: serde_json::json!(null),
                usage: Usage::default(),
            });
            assert_eq!(again, Ok(Applied::Ignored(Ignored::Duplicate)));
        }
    }
    assert_eq!(sim.exec.resumptions_of(group), 1);
    sim.decide();
    let resumed = running(&sim);
    assert_eq!(resumed.len(), 1);
    let assignment = sim.exec.assignment(resumed[0]).expect("resumed parent");
    assert_eq!(assignment.task_id, "parent");
    match assignment.resume {
        Some(ResumeContext::Group(summary)) => {
            assert_eq!(
                (summary.members, summary.completed, summary.failed),
                (1000, 1000, 0)
            );
            assert_eq!(summary.outputs.len(), 1000);
        }
        other => panic!("expected a group summary, got {other:?}"),
    }
    run_to_end(&mut sim);
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
    assert_eq!(sim.exec.resumptions_of(group), 1);
    assert_eq!(sim.replay(), sim.exec);
}

#[test]
fn nested_groups_settle_from_the_leaves_up() {
    let mut sim = Sim::new(PlanBuilder::new().task("root", &[]).build());
    sim.decide();
    let root = running(&sim)[0];
    let g1 = spawn(&mut sim, root, 2, GroupRule::AllSettled, 10);
    sim.decide();
    let level1 = running(&sim);
    let g2 = spawn(&mut sim, level1[0], 2, GroupRule::AllSettled, 20);
    complete(&mut sim, level1[1]);
    sim.decide();
    let level2 = running(&sim);
    let g3 = spawn(&mut sim, level2[0], 3, GroupRule::AllSettled, 30);
    complete(&mut sim, level2[1]);
    assert_eq!(
        sim.exec.resumptions_of(g1),
        0,
        "a member waiting on its own group is not settled"
    );
    run_to_end(&mut sim);
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
    for group in [g1, g2, g3] {
        assert_eq!(sim.exec.resumptions_of(group), 1);
    }
    assert_eq!(sim.replay(), sim.exec);
}

fn group_rule_case(rule: GroupRule, outcomes: &[bool]) -> (Vec<TaskState>, bool) {
    let mut sim = Sim::new(PlanBuilder::new().task("p", &[]).build());
    sim.decide();
    let parent = running(&sim)[0];
    let group = spawn(&mut sim, parent, outcomes.len(), rule, 99);
    sim.decide();
    let members = running(&sim);
    for (member, ok) in members.iter().zip(outcomes) {
        if sim.exec.instance_state(*member) != Some(TaskState::Running) {
            continue;
        }
        if *ok {
            complete(&mut sim, *member);
        } else {
            // Non-retryable, so the default retry policy does not apply.
            fail(&mut sim, *member, false);
        }
    }
    assert_eq!(sim.exec.resumptions_of(group), 1);
    sim.decide();
    let resumed = running(&sim)[0];
    let succeeded = match sim.exec.assignment(resumed).and_then(|a| a.resume) {
        Some(ResumeContext::Group(summary)) => summary.succeeded,
        other => panic!("expected a summary, got {other:?}"),
    };
    (
        members
            .iter()
            .map(|m| sim.exec.instance_state(*m).expect("member"))
            .collect(),
        succeeded,
    )
}

#[test]
fn group_completion_rules() {
    use TaskState::{Cancelled, Completed, Failed};
    assert_eq!(
        group_rule_case(GroupRule::AllSettled, &[true, false, true]),
        (vec![Completed, Failed, Completed], true)
    );
    assert_eq!(
        group_rule_case(GroupRule::AllSucceeded, &[true, false, true]),
        (vec![Completed, Failed, Cancelled], false),
        "the first failure ends the group and cancels the rest"
    );
    assert_eq!(
        group_rule_case(GroupRule::AllSucceeded, &[true, true]),
        (vec![Completed, Completed], true)
    );
    assert_eq!(
        group_rule_case(GroupRule::Quorum(2), &[false, true, true, true]),
        (vec![Failed, Completed, Completed, Cancelled], true)
    );
    assert_eq!(
        group_rule_case(GroupRule::Quorum(2), &[false, false, true]),
        (vec![Failed, Failed, Cancelled], false)
    );
    assert_eq!(
        group_rule_case(GroupRule::FirstSuccess, &[false, true, true]),
        (vec![Failed, Completed, Cancelled], true)
    );
}

#[test]
fn retry_waits_for_its_backoff() {
    let backoff = Backoff {
        kind: BackoffKind::Exponential,
        base: ms(100),
        cap: ms(10_000),
        jitter_pct: 0,
    };
    let plan = PlanBuilder::new()
        .task("flaky", &[])
        .edit("flaky", |t| {
            t.on_failure = chain(vec![FailureAction::Retry { max: 2, backoff }])
        })
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let flaky = running(&sim)[0];
    fail(&mut sim, flaky, true);
    assert_eq!(
        sim.exec.instance_state(flaky),
        Some(TaskState::RetryScheduled)
    );
    sim.advance(99);
    assert_eq!(sim.decide(), 0, "backoff not over");
    let early = sim.apply(EventBody::TaskDispatched {
        instance: flaky,
        attempt: 2,
    });
    assert!(
        matches!(early, Err(ApplyError::RetryNotDue { .. })),
        "{early:?}"
    );
    sim.advance(1);
    assert_eq!(sim.decide(), 1);
    assert_eq!(sim.exec.attempt(flaky), Some(2));
    // A late result of attempt 1 is ignored.
    let late = sim.apply(EventBody::TaskCompleted {
        instance: flaky,
        attempt: 1,
        output: serde_json::json!(1),
        usage: Usage::default(),
    });
    assert_eq!(late, Ok(Applied::Ignored(Ignored::Duplicate)));
    fail(&mut sim, flaky, true);
    sim.advance(199);
    assert_eq!(sim.decide(), 0, "second retry waits twice as long");
    sim.advance(1);
    sim.decide();
    fail(&mut sim, flaky, true);
    assert_eq!(
        sim.exec.instance_state(flaky),
        Some(TaskState::Failed),
        "retries exhausted"
    );
    sim.decide();
    assert_eq!(sim.exec.state(), ExecutionState::Failed);
}

/// The record of an instance tells when each attempt was dispatched, which worker took it and
/// when, and keeps the attempts before the current one with why they ended.
#[test]
fn the_record_keeps_each_attempts_worker_and_times() {
    let plan = PlanBuilder::new()
        .task("api", &[])
        .edit("api", |t| {
            t.on_failure = chain(vec![FailureAction::Retry {
                max: 2,
                backoff: Backoff {
                    base: ms(0),
                    ..Backoff::default()
                },
            }]);
            t.validate = vec![trellis_core::plan::Check {
                name: "lint".to_owned(),
                level: CheckLevel::Codebase,
                probe: trellis_core::plan::Probe::Command(vec!["make".to_owned()]),
                timeout: ms(1000),
            }];
        })
        .build();
    let mut sim = Sim::new(plan);
    let check = |passed| CheckResult {
        name: "lint".to_owned(),
        level: CheckLevel::Codebase,
        passed,
        duration_ms: 7,
        output: if passed { "clean" } else { "2 warnings" }.to_owned(),
    };
    let record = |sim: &Sim, api| {
        sim.exec
            .records()
            .into_iter()
            .find(|r| r.task_instance_id == api)
            .expect("the instance has a record")
    };
    sim.now = T0 + 10;
    sim.decide();
    let api = running(&sim)[0];
    let first = record(&sim, api);
    assert_eq!(
        (first.dispatched_at_ms, first.started_at_ms, first.worker_id),
        (Some(T0 + 10), None, None),
        "dispatched, not taken by a worker yet"
    );
    // The worker's clock said it started before the dispatch: the start is the dispatch.
    sim.now = T0 + 5;
    sim.apply(EventBody::TaskStarted {
        instance: api,
        attempt: 1,
        worker: WorkerId::from("w1"),
    })
    .expect("started");
    assert_eq!(
        sim.exec.assignment(api).expect("assigned").checks.len(),
        1,
        "the assignment carries the task's checks"
    );
    sim.apply(EventBody::TaskValidated {
        instance: api,
        attempt: 1,
        results: vec![check(false)],
    })
    .expect("validated");
    assert_eq!(record(&sim, api).validation, [check(false)]);
    sim.now = T0 + 30;
    fail(&mut sim, api, true);
    sim.now = T0 + 40;
    sim.decide();
    sim.now = T0 + 47;
    let started = sim
        .apply(EventBody::TaskStarted {
            instance: api,
            attempt: 2,
            worker: WorkerId::from("w2"),
        })
        .expect("started");
    assert!(matches!(started, Applied::Changed { .. }));
    let again = sim
        .apply(EventBody::TaskStarted {
            instance: api,
            attempt: 2,
            worker: WorkerId::from("w2"),
        })
        .expect("a second report is accepted");
    assert_eq!(again, Applied::Ignored(Ignored::Duplicate));
    assert!(
        record(&sim, api).validation.is_empty(),
        "a new attempt starts without checks"
    );
    for expected in [
        Applied::Changed { stop: Vec::new() },
        Applied::Ignored(Ignored::Duplicate),
    ] {
        let validated = sim
            .apply(EventBody::TaskValidated {
                instance: api,
                attempt: 2,
                results: vec![check(true)],
            })
            .expect("validated");
        assert_eq!(validated, expected);
    }
    sim.now = T0 + 60;
    complete(&mut sim, api);
    let done = record(&sim, api);
    assert_eq!(done.attempt, 2);
    assert_eq!(done.worker_id, Some(WorkerId::from("w2")));
    assert_eq!(
        (done.dispatched_at_ms, done.started_at_ms, done.ended_at_ms),
        (Some(T0 + 40), Some(T0 + 47), Some(T0 + 60))
    );
    assert_eq!(
        done.earlier_attempts,
        vec![AttemptRecord {
            attempt: 1,
            worker_id: Some(WorkerId::from("w1")),
            dispatched_at_ms: Some(T0 + 10),
            started_at_ms: Some(T0 + 10),
            ended_at_ms: T0 + 30,
            error: "boom".to_owned(),
            validation: vec![check(false)],
        }]
    );
    assert_eq!(done.validation, [check(true)]);
    // A snapshot keeps all of it.
    let restored = trellis_core::machine::Execution::restore(
        std::sync::Arc::clone(sim.exec.plan()),
        &sim.exec.snapshot(),
    )
    .expect("restores");
    assert!(restored.records().contains(&done));
}

#[test]
fn escalation_chain_walks_retry_reassign_fallback_pause_abort() {
    let plan = PlanBuilder::new()
        .task("api", &[])
        .task("api-fallback", &[])
        .edit("api-fallback", |t| t.is_fallback_only = true)
        .edit("api", |t| {
            t.fallback = Some(1);
            t.on_failure = chain(vec![
                FailureAction::Retry {
                    max: 1,
                    backoff: Backoff {
                        base: ms(0),
                        ..Backoff::default()
                    },
                },
                FailureAction::Reassign,
                FailureAction::Fallback { task: 1 },
                FailureAction::Pause,
                FailureAction::Abort,
            ]);
        })
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let api = running(&sim)[0];
    sim.apply(EventBody::TaskStarted {
        instance: api,
        attempt: 1,
        worker: WorkerId::from("w1"),
    })
    .expect("started");
    fail(&mut sim, api, true);
    sim.decide();
    assert_eq!(sim.exec.attempt(api), Some(2), "retry");
    sim.apply(EventBody::TaskStarted {
        instance: api,
        attempt: 2,
        worker: WorkerId::from("w1"),
    })
    .expect("started");
    fail(&mut sim, api, true);
    sim.decide();
    let assignment = sim.exec.assignment(api).expect("api");
    assert_eq!(
        (assignment.attempt, assignment.avoid_worker),
        (3, Some(&WorkerId::from("w1"))),
        "reassign"
    );
    fail(&mut sim, api, true);
    assert_eq!(sim.exec.instance_state(api), Some(TaskState::Failed));
    sim.decide();
    let fallback = running(&sim)[0];
    assert_eq!(
        task_of(&sim, fallback),
        "api-fallback",
        "fallback runs in the failed task's place"
    );
    fail(&mut sim, fallback, true);
    assert_eq!(sim.exec.state(), ExecutionState::Paused, "then pause");
    assert!(
        sim.exec
            .reason()
            .is_some_and(|r| r.contains("api-fallback")),
        "{:?}",
        sim.exec.reason()
    );
    assert_eq!(sim.decide(), 0, "nothing dispatches while paused");
    sim.apply(EventBody::resume()).expect("resume");
    sim.decide();
    fail(&mut sim, fallback, true);
    assert_eq!(sim.exec.state(), ExecutionState::Failed, "then abort");
    assert_eq!(sim.replay(), sim.exec);
}

#[test]
fn token_budget_pauses_with_the_reason() {
    let plan = PlanBuilder::new()
        .options(|o| o.budget.max_tokens = Some(1000))
        .task("a", &[])
        .task("b", &["a"])
        .task("c", &["b"])
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let a = running(&sim)[0];
    sim.apply(EventBody::TaskCompleted {
        instance: a,
        attempt: 1,
        output: serde_json::json!({}),
        usage: Usage {
            tokens_used: 1200,
            cost: 0.0,
        },
    })
    .expect("completed");
    sim.decide();
    assert_eq!(sim.exec.state(), ExecutionState::Paused);
    assert_eq!(
        sim.exec.reason(),
        Some("token budget exhausted: 1200 of 1000 tokens used")
    );
    assert!(running(&sim).is_empty(), "b is not dispatched");

    // Resumed, it runs on with one more budget, and pauses again once that is spent too.
    sim.apply(EventBody::resume()).expect("resume");
    assert_eq!(sim.decide(), 1, "b is dispatched");
    let b = running(&sim)[0];
    sim.apply(EventBody::TaskCompleted {
        instance: b,
        attempt: 1,
        output: serde_json::json!({}),
        usage: Usage {
            tokens_used: 900,
            cost: 0.0,
        },
    })
    .expect("completed");
    sim.decide();
    assert_eq!(sim.exec.state(), ExecutionState::Paused);
    assert_eq!(
        sim.exec.reason(),
        Some(
            "token budget exhausted: 2100 of 2000 tokens used (2 budgets: resumed once after exhausting it)"
        )
    );
    let exhausted = sim
        .log
        .iter()
        .filter(|e| e.body.name() == "budget_exhausted")
        .count();
    assert_eq!(exhausted, 2, "each exhaustion is logged");
    let restored = trellis_core::machine::Execution::restore(
        std::sync::Arc::clone(sim.exec.plan()),
        &sim.exec.snapshot(),
    )
    .expect("restores");
    assert_eq!(
        restored.snapshot(),
        sim.exec.snapshot(),
        "the grants survive a snapshot"
    );
}

#[test]
fn timeouts_fail_attempts_and_executions() {
    let plan = PlanBuilder::new()
        .options(|o| o.global_timeout = Some(ms(60_000)))
        .task("slow", &[])
        .edit("slow", |t| {
            t.timeout = Some(ms(1_000));
            t.on_failure = chain(vec![FailureAction::Retry {
                max: 5,
                backoff: Backoff {
                    base: ms(0),
                    ..Backoff::default()
                },
            }]);
        })
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let slow = running(&sim)[0];
    let early = sim.apply(EventBody::TaskTimedOut {
        instance: slow,
        attempt: 1,
    });
    assert!(matches!(early, Err(ApplyError::DeadlineNotReached { .. })));
    sim.advance(1_000);
    sim.decide();
    assert_eq!(
        sim.exec.instance_state(slow),
        Some(TaskState::RetryScheduled)
    );
    sim.decide();
    assert_eq!(sim.exec.attempt(slow), Some(2));
    sim.advance(60_000);
    sim.decide();
    assert_eq!(sim.exec.state(), ExecutionState::Failed);
    assert_eq!(sim.exec.reason(), Some("global timeout of 1m exceeded"));
}

#[test]
fn pause_holds_dispatch_resume_continues_cancel_stops_running() {
    let plan = PlanBuilder::new()
        .task("a", &[])
        .task("b", &["a"])
        .task("c", &[])
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    sim.apply(EventBody::pause("lunch")).expect("pause");
    let a = running(&sim)
        .into_iter()
        .find(|i| task_of(&sim, *i) == "a")
        .expect("a runs");
    complete(&mut sim, a);
    assert_eq!(sim.decide(), 0, "paused: b waits");
    assert_eq!(
        sim.apply(EventBody::pause("again")),
        Ok(Applied::Ignored(Ignored::Duplicate))
    );
    sim.apply(EventBody::resume()).expect("resume");
    assert_eq!(sim.decide(), 1);
    let stopped = sim
        .apply(EventBody::CancelRequested {
            reason: "user".into(),
        })
        .expect("cancel");
    let Applied::Changed { stop } = stopped else {
        panic!("cancel changes state")
    };
    assert_eq!(stop.len(), 2, "b and c were running");
    assert_eq!(sim.exec.state(), ExecutionState::Cancelled);
    let refused = sim.apply(EventBody::resume());
    assert!(matches!(
        refused,
        Err(ApplyError::InvalidExecutionTransition { .. })
    ));
    // Late results of cancelled tasks change nothing.
    let late = sim.apply(EventBody::TaskCompleted {
        instance: stop[0],
        attempt: 1,
        output: serde_json::json!(1),
        usage: Usage::default(),
    });
    assert_eq!(late, Ok(Applied::Ignored(Ignored::Duplicate)));
}

#[test]
fn questions_wait_for_a_human_and_resume_with_the_answer() {
    let mut sim = Sim::new(
        PlanBuilder::new()
            .task("review", &[])
            .task("other", &[])
            .build(),
    );
    sim.decide();
    let review = running(&sim)
        .into_iter()
        .find(|i| task_of(&sim, *i) == "review")
        .expect("review");
    let question = Question {
        id: QuestionId::derived(1, 1),
        question_type: "approval".into(),
        priority: "high".into(),
        text: "ship it?".into(),
        options: vec!["yes".into(), "no".into()],
        expires_at_ms: None,
        timeout_action: TimeoutAction::Fail,
    };
    sim.apply(EventBody::QuestionAsked {
        instance: review,
        attempt: 1,
        question: question.clone(),
    })
    .expect("asked");
    assert_eq!(sim.exec.state(), ExecutionState::WaitingForHuman);
    let open = sim.exec.open_questions();
    assert_eq!(open.len(), 1);
    assert_eq!(
        (open[0].instance, open[0].task_id.as_str(), open[0].question),
        (review, "review", &question)
    );
    assert_eq!(sim.exec.open_question(question.id), Some(&question));
    sim.apply(EventBody::QuestionAnswered {
        question: question.id,
        answer: "yes".into(),
    })
    .expect("answered");
    assert!(sim.exec.open_questions().is_empty(), "answered is not open");
    assert_eq!(sim.exec.open_question(question.id), None);
    assert_eq!(
        sim.exec.question_continuation(QuestionId::derived(9, 9)),
        None
    );
    assert_eq!(
        sim.apply(EventBody::QuestionAnswered {
            question: question.id,
            answer: "no".into()
        }),
        Ok(Applied::Ignored(Ignored::Duplicate))
    );
    assert_eq!(sim.exec.state(), ExecutionState::Running);
    sim.decide();
    let resumed = running(&sim)
        .into_iter()
        .find(|i| task_of(&sim, *i) == "review")
        .expect("review resumed");
    assert_ne!(resumed, review, "a new instance");
    assert_eq!(sim.exec.question_continuation(question.id), Some(resumed));
    assert_eq!(
        sim.exec.assignment(resumed).and_then(|a| a.resume).cloned(),
        Some(ResumeContext::Answer {
            question: question.id,
            answer: "yes".into()
        })
    );
    run_to_end(&mut sim);
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
}

#[test]
fn expired_questions_apply_their_timeout_action() {
    let mut sim = Sim::new(
        PlanBuilder::new()
            .options(|o| o.failure.continue_on_partial_failure = true)
            .task("ask", &[])
            .build(),
    );
    sim.decide();
    let ask = running(&sim)[0];
    let question = Question {
        id: QuestionId::derived(1, 2),
        question_type: "choice".into(),
        priority: String::new(),
        text: "which?".into(),
        options: vec![],
        expires_at_ms: Some(sim.now + 5_000),
        timeout_action: TimeoutAction::Skip,
    };
    sim.apply(EventBody::QuestionAsked {
        instance: ask,
        attempt: 1,
        question,
    })
    .expect("asked");
    sim.advance(5_000);
    sim.decide();
    assert_eq!(sim.exec.instance_state(ask), Some(TaskState::Skipped));
    sim.decide();
    assert_eq!(
        sim.exec.state(),
        ExecutionState::Completed,
        "a skipped task does not fail the run with continue_on_partial_failure"
    );
}

#[test]
fn refused_events_change_nothing() {
    let mut sim = Sim::new(PlanBuilder::new().task("a", &[]).task("b", &["a"]).build());
    sim.decide();
    let before = sim.exec.clone();
    let unknown = TaskInstanceId::derived(5, 5);
    let refusals = [
        EventBody::TaskCompleted {
            instance: unknown,
            attempt: 1,
            output: serde_json::json!(1),
            usage: Usage::default(),
        },
        EventBody::TaskCompleted {
            instance: running(&sim)[0],
            attempt: 7,
            output: serde_json::json!(1),
            usage: Usage::default(),
        },
        EventBody::QuestionAnswered {
            question: QuestionId::derived(1, 1),
            answer: "x".into(),
        },
        EventBody::ExecutionFinished {
            outcome: Outcome::Completed,
        },
        EventBody::BudgetExhausted {
            reason: "no".into(),
        },
        EventBody::ExecutionTimedOut,
        EventBody::SubtasksSpawned {
            instance: running(&sim)[0],
            attempt: 1,
            group: GroupId::derived(1, 1),
            rule: GroupRule::AllSettled,
            members: vec![],
        },
    ];
    for body in refusals {
        let name = body.name();
        assert!(sim.apply(body).is_err(), "{name} must be refused");
        assert_eq!(sim.exec, before, "{name} changed the state");
    }
}

#[test]
fn a_failed_task_skips_its_dependents_with_continue_on_partial_failure() {
    let plan = PlanBuilder::new()
        .options(|o| o.failure.continue_on_partial_failure = true)
        .task("a", &[])
        .task("b", &["a"])
        .task("c", &["b"])
        .task("d", &[])
        .edit("a", |t| t.on_failure = chain(vec![]))
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let a = running(&sim)
        .into_iter()
        .find(|i| task_of(&sim, *i) == "a")
        .expect("a");
    fail(&mut sim, a, true);
    run_to_end(&mut sim);
    assert_eq!(sim.exec.state(), ExecutionState::Failed);
    assert_eq!(sim.exec.task_outcome(1), Some(TaskState::Skipped));
    assert_eq!(sim.exec.task_outcome(2), Some(TaskState::Skipped));
    assert_eq!(
        sim.exec.task_outcome(3),
        Some(TaskState::Completed),
        "independent work went on"
    );
}

fn running_task(sim: &Sim, task: &str) -> Option<TaskInstanceId> {
    running(sim).into_iter().find(|i| task_of(sim, *i) == task)
}

#[test]
fn a_paused_task_is_held_while_the_rest_runs_and_resumes_on_its_own() {
    let plan = PlanBuilder::new()
        .task("a", &[])
        .task("b", &["a"])
        .task("c", &[])
        .build();
    let mut sim = Sim::new(plan);
    let hold = |task: &str| EventBody::PauseRequested {
        reason: "flaky".into(),
        scope: PauseScope::Task(task.into()),
        mode: PauseMode::Drain,
    };
    sim.apply(hold("b")).expect("pause b");
    assert_eq!(
        sim.apply(hold("b")),
        Ok(Applied::Ignored(Ignored::Duplicate))
    );
    assert_eq!(
        sim.apply(hold("nope")),
        Err(ApplyError::UnknownTask("nope".into()))
    );
    assert_eq!(sim.decide(), 2, "a and c start");
    let a = running_task(&sim, "a").expect("a runs");
    complete(&mut sim, a);
    assert_eq!(sim.decide(), 0, "b is ready but held");
    assert_eq!(sim.exec.state(), ExecutionState::Running);
    let holds: Vec<_> = sim.exec.holds().map(|(scope, _)| scope).collect();
    assert_eq!(holds, vec![PauseScope::Task("b".into())]);
    // A dispatch of a held instance is refused, whoever decided it.
    let b = sim
        .exec
        .instances_in(TaskState::Queued)
        .next()
        .expect("b queued");
    assert!(matches!(
        sim.apply(EventBody::TaskDispatched {
            instance: b,
            attempt: 1
        }),
        Err(ApplyError::Held { .. })
    ));
    sim.apply(EventBody::ResumeRequested {
        scope: PauseScope::Task("b".into()),
    })
    .expect("resume b");
    assert_eq!(sim.decide(), 1, "b starts");
    assert_eq!(sim.replay(), sim.exec, "the log rebuilds the holds");
}

#[test]
fn a_paused_group_holds_its_members_only() {
    let plan = PlanBuilder::new().task("p", &[]).task("q", &[]).build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let p = running_task(&sim, "p").expect("p runs");
    let group = spawn(&mut sim, p, 3, GroupRule::AllSettled, 11);
    sim.apply(EventBody::PauseRequested {
        reason: "rate limit".into(),
        scope: PauseScope::Group(group),
        mode: PauseMode::Drain,
    })
    .expect("pause group");
    assert_eq!(sim.decide(), 0, "no member starts");
    assert_eq!(running(&sim).len(), 1, "q still runs");
    let unknown = GroupId::derived(sim.now, 99);
    assert_eq!(
        sim.apply(EventBody::PauseRequested {
            reason: String::new(),
            scope: PauseScope::Group(unknown),
            mode: PauseMode::Drain,
        }),
        Err(ApplyError::UnknownGroup(unknown))
    );
    sim.apply(EventBody::ResumeRequested {
        scope: PauseScope::Group(group),
    })
    .expect("resume group");
    assert_eq!(sim.decide(), 3, "the members start");
}

#[test]
fn a_preempted_attempt_runs_again_with_its_steps_and_uses_no_retry() {
    // No retries at all: a preemption counted as a failure would fail the task.
    let plan = PlanBuilder::new()
        .task("long", &[])
        .edit("long", |t| t.on_failure = chain(vec![]))
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let long = running_task(&sim, "long").expect("long runs");
    sim.apply(EventBody::StepCheckpointed {
        instance: long,
        attempt: 1,
        step: "one".into(),
        state: serde_json::json!({"n": 1}),
    })
    .expect("step");
    let scope = PauseScope::Task("long".into());
    sim.apply(EventBody::PauseRequested {
        reason: "deploy".into(),
        scope: scope.clone(),
        mode: PauseMode::Preempt,
    })
    .expect("pause");
    assert_eq!(sim.exec.running_in(&scope), vec![(long, 1)]);
    assert_eq!(
        sim.exec.running_in(&PauseScope::Task("other".into())),
        vec![]
    );
    sim.apply(EventBody::TaskPreempted {
        instance: long,
        attempt: 1,
    })
    .expect("preempted");
    assert_eq!(
        sim.exec.instance_state(long),
        Some(TaskState::RetryScheduled)
    );
    assert_eq!(sim.decide(), 0, "held while paused");
    sim.apply(EventBody::ResumeRequested { scope })
        .expect("resume");
    assert_eq!(sim.decide(), 1);
    let assignment = sim.exec.assignment(long).expect("assigned");
    assert_eq!(assignment.attempt, 2);
    assert_eq!(assignment.steps.len(), 1, "the recorded step goes along");
    complete(&mut sim, long);
    sim.decide();
    assert_eq!(sim.exec.state(), ExecutionState::Completed);
}

#[test]
fn decide_holding_holds_back_the_queues_it_names() {
    let plan = PlanBuilder::new()
        .task("cpu", &[])
        .task("gpu", &[])
        .edit("gpu", |t| t.queue = "gpu".into())
        .build();
    let sim = Sim::new(plan);
    let commands = sim
        .exec
        .decide_holding(sim.now, u32::MAX, &mut |queue, _| queue == "gpu");
    assert_eq!(commands.len(), 1, "{commands:?}");
    assert_eq!(
        sim.exec
            .decide_holding(sim.now, u32::MAX, &mut |_, _| true)
            .len(),
        0
    );
    assert_eq!(sim.exec.decide(sim.now).len(), 2);
}

#[test]
fn holds_survive_a_snapshot() {
    let plan = PlanBuilder::new().task("a", &[]).task("b", &[]).build();
    let mut sim = Sim::new(plan);
    sim.apply(EventBody::PauseRequested {
        reason: "why".into(),
        scope: PauseScope::Task("a".into()),
        mode: PauseMode::Preempt,
    })
    .expect("pause");
    let restored = trellis_core::machine::Execution::restore(
        std::sync::Arc::clone(sim.exec.plan()),
        &sim.exec.snapshot(),
    )
    .expect("restore");
    assert_eq!(restored, sim.exec);
    assert_eq!(restored.decide(sim.now).len(), 1, "only b starts");
}

/// The kind of the last event of the log, and the `execution_finished` outcome, if it is one.
fn last_event(sim: &Sim) -> (&'static str, Option<Outcome>) {
    let last = sim.log.last().expect("the log is not empty");
    let outcome = match &last.body {
        EventBody::ExecutionFinished { outcome } => Some(*outcome),
        _ => None,
    };
    (last.body.name(), outcome)
}

#[test]
fn every_end_is_logged_as_execution_finished_once() {
    // Cancelled by a request.
    let mut sim = Sim::new(PlanBuilder::new().task("a", &[]).task("b", &["a"]).build());
    sim.decide();
    sim.apply(EventBody::CancelRequested {
        reason: "user".into(),
    })
    .expect("cancel");
    assert_eq!(sim.decide(), 1, "the end is decided");
    assert_eq!(
        last_event(&sim),
        ("execution_finished", Some(Outcome::Cancelled))
    );
    assert_eq!(sim.exec.state(), ExecutionState::Cancelled);
    assert_eq!(sim.exec.reason(), Some("user"), "the reason stays");
    assert_eq!(sim.decide(), 0, "logged once");
    assert_eq!(
        sim.apply(EventBody::ExecutionFinished {
            outcome: Outcome::Cancelled
        }),
        Err(ApplyError::InvalidExecutionTransition {
            state: "cancelled",
            event: "execution_finished"
        }),
        "a second end is refused"
    );
    assert_eq!(sim.replay().state(), ExecutionState::Cancelled);
    assert_eq!(
        sim.replay().decide(sim.now),
        vec![],
        "the replay is ended too"
    );

    // Failed by an escalation chain that aborts.
    let plan = PlanBuilder::new()
        .task("a", &[])
        .task("b", &[])
        .edit("a", |t| t.on_failure = chain(vec![FailureAction::Abort]))
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let a = running(&sim)
        .into_iter()
        .find(|i| task_of(&sim, *i) == "a")
        .expect("a runs");
    fail(&mut sim, a, true);
    assert_eq!(sim.exec.state(), ExecutionState::Failed);
    sim.decide();
    assert_eq!(
        last_event(&sim),
        ("execution_finished", Some(Outcome::Failed))
    );

    // Failed by its global timeout.
    let plan = PlanBuilder::new()
        .options(|o| o.global_timeout = Some(ms(1_000)))
        .task("a", &[])
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    sim.advance(1_000);
    sim.decide();
    assert_eq!(sim.exec.state(), ExecutionState::Failed);
    assert_eq!(
        sim.decide(),
        1,
        "the end is decided once the timeout is applied"
    );
    assert_eq!(
        last_event(&sim),
        ("execution_finished", Some(Outcome::Failed))
    );
    assert_eq!(
        sim.log.iter().rev().nth(1).map(|e| e.body.name()),
        Some("execution_timed_out")
    );

    // A claimed outcome other than how it ended is refused, and so is cancelling by finishing.
    let mut sim = Sim::new(PlanBuilder::new().task("a", &[]).build());
    sim.decide();
    assert!(matches!(
        sim.apply(EventBody::ExecutionFinished {
            outcome: Outcome::Cancelled
        }),
        Err(ApplyError::CannotFinish { .. })
    ));
    sim.apply(EventBody::CancelRequested {
        reason: "user".into(),
    })
    .expect("cancel");
    assert!(matches!(
        sim.apply(EventBody::ExecutionFinished {
            outcome: Outcome::Completed
        }),
        Err(ApplyError::CannotFinish { .. })
    ));
}

/// A failed run does not read as finished work: the task left behind the failure never ran, so
/// it counts in `total` (in its state) but not in `done`, and the run is not at 100%.
#[test]
fn a_failed_run_counts_what_never_ran() {
    let plan = PlanBuilder::new()
        .task("a", &[])
        .task("b", &["a"])
        .task("c", &[])
        .build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let a = running_task(&sim, "a").expect("a runs");
    fail(&mut sim, a, false);
    run_to_end(&mut sim);
    assert_eq!(sim.exec.state(), ExecutionState::Failed);
    let progress = sim.exec.progress(sim.now);
    assert_eq!((progress.done, progress.total), (2, 3), "{progress:?}");
    assert!(
        (progress.percent - 200.0 / 3.0).abs() < 1e-9,
        "{progress:?}"
    );
    // `a` failed; the failure cancelled `c`, which ran, and `b`, which never did.
    assert_eq!(progress.counts.get(TaskState::Failed), 1, "{progress:?}");
    assert_eq!(progress.counts.get(TaskState::Cancelled), 2, "{progress:?}");
    assert_eq!(progress.eta_ms, None, "an ended run has no ETA");
}

/// The ETA is for a running execution only: paused, it has none (instead of one that grows
/// while nothing runs).
#[test]
fn a_paused_execution_has_no_eta() {
    let plan = PlanBuilder::new().task("a", &[]).task("b", &["a"]).build();
    let mut sim = Sim::new(plan);
    sim.decide();
    let a = running_task(&sim, "a").expect("a runs");
    sim.advance(1_000);
    complete(&mut sim, a);
    let running = sim.exec.progress(sim.now);
    assert_eq!(running.state, ExecutionState::Running);
    assert_eq!(
        running.eta_ms,
        Some(1_000),
        "one of two done in 1 s: 1 s to go"
    );
    sim.apply(EventBody::PauseRequested {
        reason: "lunch".into(),
        scope: PauseScope::Execution,
        mode: PauseMode::Drain,
    })
    .expect("pause");
    sim.advance(60_000);
    let paused = sim.exec.progress(sim.now);
    assert_eq!(paused.state, ExecutionState::Paused, "{paused:?}");
    assert_eq!(paused.eta_ms, None, "{paused:?}");
}
