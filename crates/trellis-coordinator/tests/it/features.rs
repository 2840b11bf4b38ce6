//! Group completion rules, escalation chains, budgets, human questions and a worker that dies.

use std::time::Duration;

use serde_json::json;
use trellis_agent_worker::sdk::{GroupRule, Outcome, Subtask};
use trellis_agent_worker::{HandlerRegistry, TaskContext};
use trellis_proto::v1::{self, ExecutionState, event::Kind};

use crate::cluster;

/// `spawner {rule, outcomes: [bool]}` spawns one member per outcome (`noop` for true, a
/// non-retryable `fail` for false); resumed, it completes with the group summary.
fn registry() -> HandlerRegistry {
    let mut registry = HandlerRegistry::with_builtins();
    registry.register("spawner", |ctx: TaskContext| async move {
        if let Some(summary) = ctx.group_summary() {
            return Outcome::Completed(json!({
                "succeeded": summary.succeeded,
                "completed": summary.completed,
                "failed": summary.failed,
                "cancelled": summary.cancelled,
            }));
        }
        let input = ctx.input().clone();
        let rule = match input["rule"].as_str() {
            Some("all_succeeded") => GroupRule::AllSucceeded,
            Some("first_success") => GroupRule::FirstSuccess,
            Some("quorum") => GroupRule::Quorum(input["k"].as_u64().unwrap_or(1) as u32),
            _ => GroupRule::AllSettled,
        };
        let members = input["outcomes"]
            .as_array()
            .map(|outcomes| {
                outcomes
                    .iter()
                    .map(|ok| {
                        if ok.as_bool() == Some(true) {
                            Subtask {
                                task_type: "sleep".into(),
                                input: json!({"ms": 30}),
                                queue: None,
                            }
                        } else {
                            Subtask {
                                task_type: "fail".into(),
                                input: json!({"times": 99, "retryable": false}),
                                queue: None,
                            }
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Outcome::Spawn { rule, members }
    });
    registry.register("spend", |ctx: TaskContext| async move {
        ctx.usage(600, 0.5);
        Outcome::Completed(json!({"spent": 600}))
    });
    registry
}

fn summary_of(run: &cluster::Run) -> serde_json::Value {
    run.events
        .iter()
        .rev()
        .find_map(|e| match e.kind.as_ref()? {
            Kind::TaskCompleted(c) => serde_json::from_slice(&c.output).ok(),
            _ => None,
        })
        .expect("the resumed parent's output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_completion_rules_behave_as_designed() {
    let mut cluster = cluster::start_with(1, registry).await;
    let plan = |rule: &str, k: u32, outcomes: &str| {
        format!(
            "name: rules\noptions: {{failure: {{default_action: retry, max_retries: 0}}}}\ntasks:\n- {{id: p, type: spawner, input: {{rule: {rule}, k: {k}, outcomes: {outcomes}}}}}\n"
        )
    };
    let all_settled = cluster
        .run(&plan("all_settled", 0, "[true, false, true]"))
        .await;
    assert_eq!(
        all_settled.state(),
        ExecutionState::Completed,
        "{}",
        all_settled.execution.reason
    );
    assert_eq!(
        summary_of(&all_settled),
        json!({"succeeded": true, "completed": 2, "failed": 1, "cancelled": 0})
    );

    let all_succeeded = cluster
        .run(&plan("all_succeeded", 0, "[false, true, true, true]"))
        .await;
    let summary = summary_of(&all_succeeded);
    assert_eq!(summary["succeeded"], json!(false));
    assert_eq!(summary["failed"], json!(1));

    let quorum = cluster
        .run(&plan("quorum", 2, "[true, true, true, true, true]"))
        .await;
    let summary = summary_of(&quorum);
    assert_eq!(summary["succeeded"], json!(true));
    assert!(summary["completed"].as_u64() >= Some(2));

    let first = cluster
        .run(&plan("first_success", 0, "[false, true]"))
        .await;
    assert_eq!(summary_of(&first)["succeeded"], json!(true));
    for run in [&all_settled, &all_succeeded, &quorum, &first] {
        assert_eq!(
            run.count("p", "dispatched"),
            2,
            "one parent, one resumed instance"
        );
    }
}

/// A handler that breaks the contract (a quorum of 3 out of 1 member, which the state machine
/// refuses) fails its attempt with the reason instead of leaving it running forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_coordinator_refuses_fails_its_attempt() {
    let mut cluster = cluster::start_with(1, registry).await;
    let run = cluster
        .run("name: broken\ntasks:\n- {id: p, type: spawner, input: {rule: quorum, k: 3, outcomes: [true]}}\n")
        .await;
    assert_eq!(
        run.state(),
        ExecutionState::Failed,
        "{}",
        run.execution.reason
    );
    let error = run
        .events
        .iter()
        .find_map(|e| match e.kind.as_ref()? {
            Kind::TaskFailed(failed) => Some(failed.error.clone()),
            _ => None,
        })
        .expect("the attempt failed");
    assert!(
        error.contains("the worker sent a result the coordinator refuses")
            && error.contains("quorum 3 of 1 members"),
        "{error}"
    );
    assert_eq!(
        run.count("p", "dispatched"),
        1,
        "not retried: {:?}",
        run.timeline()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalation_chain_walks_retry_reassign_fallback_pause_then_abort() {
    let mut cluster = cluster::start_with(2, registry).await;
    let plan = "name: chain\ntasks:\n\
        - id: api\n  type: fail\n  input: {times: 99, retryable: true}\n  fallback: api-fallback\n  \
        on_failure: [{retry: {max: 1, backoff: {kind: constant, base: 10ms}}}, reassign, {fallback: api-fallback}, pause, abort]\n\
        - {id: api-fallback, type: fail, input: {times: 99, retryable: true}}\n";
    let id = cluster.start_plan(plan).await;
    let paused = cluster
        .wait_until(&id, "the pause", |e| {
            e.state == ExecutionState::Paused as i32
        })
        .await;
    assert!(paused.reason.contains("api-fallback"), "{}", paused.reason);
    cluster
        .client
        .resume_execution(v1::ResumeExecutionRequest {
            execution_id: id.clone(),
            reason: String::new(),
            ..Default::default()
        })
        .await
        .expect("resume");
    let run = cluster.wait(&id, Duration::from_secs(30)).await;
    assert_eq!(run.state(), ExecutionState::Failed);
    assert!(
        run.execution.reason.contains("aborted"),
        "{}",
        run.execution.reason
    );
    let timeline: Vec<_> = run
        .timeline()
        .into_iter()
        .filter(|(_, w)| *w == "dispatched")
        .map(|(t, _)| t)
        .collect();
    assert_eq!(
        timeline,
        ["api", "api", "api", "api-fallback", "api-fallback"],
        "retry, reassign, fallback, (pause), retry after resume"
    );
    let reassigned = run.events.iter().find_map(|e| match e.kind.as_ref()? {
        Kind::TaskDispatched(d) if d.attempt == 3 => Some(d.clone()),
        _ => None,
    });
    assert!(
        reassigned.is_some(),
        "the third attempt is the reassignment"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_that_runs_out_pauses_with_the_reason() {
    let mut cluster = cluster::start_with(1, registry).await;
    let plan = "name: budget\noptions: {budget: {max_tokens: 1000}}\ntasks:\n- {id: a, type: spend}\n- {id: b, type: spend, depends_on: [a]}\n- {id: c, type: spend, depends_on: [b]}\n";
    let id = cluster.start_plan(plan).await;
    let paused = cluster
        .wait_until(&id, "the budget pause", |e| {
            e.state == ExecutionState::Paused as i32
        })
        .await;
    assert_eq!(
        paused.reason,
        "token budget exhausted: 1200 of 1000 tokens used"
    );
    let counts = paused.progress.and_then(|p| p.counts).expect("counts");
    assert_eq!(counts.completed, 2, "c was not dispatched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_waits_for_a_human_and_the_answer_resumes_the_task() {
    let mut cluster = cluster::start(1).await;
    let id = cluster
        .start_plan("name: ask\ntasks:\n- {id: review, type: question, input: {text: ship it?, options: [yes, no]}}\n")
        .await;
    cluster
        .wait_until(&id, "the question", |e| {
            e.state == ExecutionState::WaitingForHuman as i32
        })
        .await;
    let events = cluster
        .client
        .observe_execution(v1::ObserveExecutionRequest {
            execution_id: id.clone(),
            from_sequence: 1,
            progress_only: false,
        });
    let mut stream = events.await.expect("observe").into_inner();
    let question_id = loop {
        let item = stream.message().await.expect("stream").expect("an event");
        if let Some(Kind::QuestionAsked(asked)) = item.event.and_then(|e| e.kind) {
            break asked.question.expect("question").question_id;
        }
    };
    let answer = v1::AnswerQuestionRequest {
        execution_id: id.clone(),
        question_id: question_id.clone(),
        answer: "yes".into(),
        answered_by: "test".into(),
    };
    cluster
        .client
        .answer_question(answer.clone())
        .await
        .expect("answer accepted");
    let again = cluster.client.answer_question(answer).await;
    assert_eq!(
        again.map_err(|s| s.code()).err(),
        Some(tonic::Code::FailedPrecondition),
        "answered once only"
    );
    let run = cluster.wait(&id, Duration::from_secs(20)).await;
    assert_eq!(run.state(), ExecutionState::Completed);
    let output = run
        .events
        .iter()
        .rev()
        .find_map(|e| match e.kind.as_ref()? {
            Kind::TaskCompleted(c) => serde_json::from_slice::<serde_json::Value>(&c.output).ok(),
            _ => None,
        })
        .expect("output");
    assert_eq!(output, json!({"answer": "yes"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_worker_dies_is_handed_to_another_and_completes_once() {
    let mut cluster = cluster::start(1).await;
    let id = cluster
        .start_plan("name: crash\ntasks:\n- {id: slow, type: sleep, input: {ms: 1500}}\n")
        .await;
    cluster
        .wait_until(&id, "the task running", |e| {
            e.progress
                .as_ref()
                .and_then(|p| p.counts)
                .is_some_and(|c| c.running == 1)
        })
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.workers[0].abort();
    let started = std::time::Instant::now();
    let token = cluster.shutdown.child_token();
    let url = cluster.nats.url();
    cluster.workers.push(cluster::spawn_worker(
        &url,
        "worker-rescue",
        HandlerRegistry::with_builtins(),
        token,
    ));
    let run = cluster.wait(&id, Duration::from_secs(30)).await;
    assert_eq!(run.state(), ExecutionState::Completed);
    let heartbeat = trellis_bus::HEARTBEAT_INTERVAL;
    assert!(
        started.elapsed() < heartbeat * 3 + Duration::from_millis(1500) + Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(run.count("slow", "completed"), 1, "applied once");
}
