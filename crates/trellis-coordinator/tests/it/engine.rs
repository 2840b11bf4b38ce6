//! What an execution does, end to end: order, limits, groups, failures, control.

use std::time::Duration;

use trellis_proto::v1::{self, ExecutionState, event::Kind};

use crate::cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependencies_run_in_order_and_the_seed_001_plan_completes() {
    let mut cluster = cluster::start(1).await;
    let plan = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed-001.yaml"
    ))
    .expect("example plan");
    let run = cluster.run(&plan).await;
    run.assert_completed();
    let timeline = run.timeline();
    let at = |task: &str, what: &str| {
        timeline
            .iter()
            .position(|(t, w)| t == task && *w == what)
            .unwrap_or_else(|| panic!("{task} {what}"))
    };
    assert!(at("T-001", "completed") < at("T-003", "dispatched"));
    assert!(at("T-002", "completed") < at("T-004", "dispatched"));
    assert!(at("T-003", "completed") < at("T-005", "dispatched"));
    assert!(at("T-004", "completed") < at("T-005", "dispatched"));
    let progress = run.execution.progress.expect("progress");
    assert_eq!(progress.percent, 100.0);
}

/// The dispatch window holds the tasks waiting for a worker, not those running: with a window
/// of 2, six tasks of three seconds on a worker of 64 slots run more than two at once, as each
/// heartbeat shows the ones dispatched before it running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_running_on_a_worker_leave_the_dispatch_window() {
    let mut cluster = cluster::start_setup(
        1,
        trellis_agent_worker::HandlerRegistry::with_builtins,
        cluster::Setup {
            dispatch_window: Some(2),
            ..cluster::Setup::default()
        },
    )
    .await;
    let mut plan = String::from("name: long\ntasks:\n");
    for i in 0..6 {
        plan.push_str(&format!(
            "- {{id: s{i}, type: sleep, input: {{ms: 3000}}}}\n"
        ));
    }
    let run = cluster.run(&plan).await;
    run.assert_completed();
    let most = run.max_running(|_| true);
    assert!(
        most >= 4,
        "a heartbeat's starts let more go while the first two still run: at most {most} at once \
         in {:?}",
        run.timeline()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrency_and_file_conflicts_hold_in_real_runs() {
    let mut cluster = cluster::start(2).await;
    let mut plan = String::from("name: limits\noptions: {max_concurrency: 3}\ntasks:\n");
    for i in 0..12 {
        plan.push_str(&format!("- {{id: s{i}, type: sleep, input: {{ms: 40}}}}\n"));
    }
    plan.push_str(
        "- {id: w1, type: sleep, input: {ms: 40}, files: [{path: db.sql, op: UPDATE}]}\n",
    );
    plan.push_str(
        "- {id: w2, type: sleep, input: {ms: 40}, files: [{path: db.sql, op: UPDATE}]}\n",
    );
    let run = cluster.run(&plan).await;
    run.assert_completed();
    assert_eq!(
        run.max_running(|_| true),
        3,
        "never more than max_concurrency, and it is used"
    );
    assert_eq!(
        run.max_running(|t| t == "w1" || t == "w2"),
        1,
        "conflicting tasks never overlap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_of_1000_resumes_its_parent_exactly_once() {
    let mut cluster = cluster::start(2).await;
    let run = cluster
        .run("name: fan\ntasks:\n- {id: fan, type: fanout, input: {count: 1000, child: {type: noop, input: {}}}}\n- {id: after, type: noop, depends_on: [fan]}\n")
        .await;
    run.assert_completed();
    assert_eq!(
        run.count("fan", "dispatched"),
        2,
        "the parent and its one resumed instance"
    );
    assert_eq!(run.count("fan", "spawned"), 1);
    let resumed: Vec<_> = run
        .graph
        .nodes
        .iter()
        .filter_map(|n| n.record.as_ref())
        .filter(|r| r.resumed_after_subtasks_group_id.is_some())
        .collect();
    assert_eq!(resumed.len(), 1);
    let members = run
        .graph
        .groups
        .iter()
        .map(|g| g.node_indices.len())
        .max()
        .unwrap_or(0);
    assert_eq!(members, 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_groups_three_levels_deep_complete() {
    let mut cluster = cluster::start(2).await;
    let run = cluster
        .run("name: nested\ntasks:\n- id: top\n  type: fanout\n  input: {count: 3, child: {type: fanout, input: {count: 3, child: {type: fanout, input: {count: 3, child: {type: noop, input: {}}}}}}}\n")
        .await;
    run.assert_completed();
    let resumed = run
        .graph
        .nodes
        .iter()
        .filter_map(|n| n.record.as_ref())
        .filter(|r| r.resumed_after_subtasks_group_id.is_some())
        .count();
    assert_eq!(
        resumed,
        1 + 3 + 9,
        "every group at every level resumed its parent once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_retried_skipped_or_abort_as_the_policy_says() {
    let mut cluster = cluster::start(1).await;
    let retried = cluster
        .run("name: retry\noptions: {failure: {default_action: retry, max_retries: 2, backoff: {kind: constant, base: 10ms}}}\ntasks:\n- {id: flaky, type: fail, input: {times: 1, retryable: true}}\n")
        .await;
    assert_eq!(
        retried.state(),
        ExecutionState::Completed,
        "{:?}",
        retried.execution.reason
    );
    assert_eq!(retried.count("flaky", "failed"), 1);
    assert_eq!(retried.count("flaky", "dispatched"), 2);

    let skipped = cluster
        .run("name: skip\noptions: {failure: {default_action: skip, continue_on_partial_failure: true}}\ntasks:\n- {id: broken, type: fail, input: {times: 9}}\n- {id: after, type: noop, depends_on: [broken]}\n")
        .await;
    assert_eq!(
        skipped.state(),
        ExecutionState::Completed,
        "{:?}",
        skipped.execution.reason
    );
    assert_eq!(
        skipped.count("after", "completed"),
        1,
        "dependents of a skipped task proceed"
    );

    let aborted = cluster
        .run("name: abort\noptions: {failure: {default_action: abort}}\ntasks:\n- {id: broken, type: fail, input: {times: 9}}\n- {id: slow, type: sleep, input: {ms: 5000}}\n")
        .await;
    assert_eq!(aborted.state(), ExecutionState::Failed);
    assert!(
        aborted.execution.reason.contains("broken"),
        "{}",
        aborted.execution.reason
    );
}

/// Every instance says which worker ran it and when it was created, dispatched, started on the
/// worker and ended; a retried one keeps its first attempt. A long task shows its worker while
/// it runs (a heartbeat tells); a short one gets it with its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_records_its_worker_and_its_four_times() {
    let mut cluster = cluster::start(1).await;
    let id = cluster
        .start_plan(
            "name: record\noptions: {failure: {default_action: retry, max_retries: 2, backoff: {kind: constant, base: 10ms}}}\ntasks:\n- {id: quick, type: noop}\n- {id: slow, type: sleep, input: {ms: 5000}}\n- {id: flaky, type: fail, input: {times: 1, retryable: true}}\n",
        )
        .await;
    let record_of = |graph: &v1::ExecutionGraph, task: &str| {
        graph
            .nodes
            .iter()
            .filter_map(|n| n.record.clone())
            .find(|r| r.task_id == task)
    };
    // While `slow` sleeps, a heartbeat names it: its worker and start show before it ends.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let running = loop {
        let graph = cluster.graph(&id).await;
        let slow = record_of(&graph, "slow").expect("slow was instantiated at the start");
        if slow.worker_id.is_some() {
            break slow;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no worker recorded for the running task within 4 s: {slow:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(running.state, v1::TaskState::Running as i32);
    assert!(running.ended_at_unix_ms.is_none());
    let run = cluster.wait(&id, Duration::from_secs(60)).await;
    run.assert_completed();
    for task in ["quick", "slow", "flaky"] {
        let record = record_of(&run.graph, task).expect("every task has a record");
        let worker = record.worker_id.clone().unwrap_or_default();
        assert!(!worker.is_empty(), "{task} names no worker: {record:?}");
        let times = [
            Some(record.created_at_unix_ms),
            record.dispatched_at_unix_ms,
            record.started_at_unix_ms,
            record.ended_at_unix_ms,
        ];
        assert!(
            times.iter().all(Option::is_some) && times.is_sorted(),
            "{task}: created, dispatched, started and ended must all be set and in order: {times:?}"
        );
    }
    let slow = record_of(&run.graph, "slow").expect("slow");
    assert_eq!(
        slow.started_at_unix_ms, running.started_at_unix_ms,
        "one start, recorded once"
    );
    let ran = slow.ended_at_unix_ms.unwrap_or(0) - slow.started_at_unix_ms.unwrap_or(0);
    assert!(
        ran >= 5000,
        "slow ran {ran} ms between its start and its end, not its 5 s"
    );
    let flaky = record_of(&run.graph, "flaky").expect("flaky");
    assert_eq!(flaky.attempt, 2);
    let [first] = flaky.earlier_attempts.as_slice() else {
        panic!(
            "flaky keeps its first attempt only: {:?}",
            flaky.earlier_attempts
        );
    };
    assert_eq!(first.attempt, 1);
    assert!(first.worker_id.as_deref().is_some_and(|w| !w.is_empty()));
    assert!(first.error.contains("fails on purpose"), "{}", first.error);
    assert!(
        first.dispatched_at_unix_ms <= first.started_at_unix_ms
            && first.started_at_unix_ms <= Some(first.ended_at_unix_ms)
            && Some(first.ended_at_unix_ms) <= flaky.dispatched_at_unix_ms,
        "the first attempt's times are in order and before the second's: {first:?} {flaky:?}"
    );
    // Each start is one `task_started` event.
    assert_eq!(run.count("slow", "started"), 1);
    assert_eq!(run.count("flaky", "started"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_dispatch_resume_continues_cancel_stops() {
    let mut cluster = cluster::start(1).await;
    let id = cluster
        .start_plan("name: control\ntasks:\n- {id: a, type: sleep, input: {ms: 300}}\n- {id: b, type: noop, depends_on: [a]}\n")
        .await;
    let pause = v1::PauseExecutionRequest {
        execution_id: id.clone(),
        reason: "hold on".into(),
        ..Default::default()
    };
    cluster.client.pause_execution(pause).await.expect("pause");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let get = v1::GetExecutionRequest {
        execution_id: id.clone(),
    };
    let paused = cluster
        .client
        .get_execution(get.clone())
        .await
        .expect("get")
        .into_inner()
        .execution
        .expect("execution");
    assert_eq!(paused.state, ExecutionState::Paused as i32);
    let counts = paused.progress.and_then(|p| p.counts).expect("counts");
    assert_eq!(counts.completed, 1, "a finished while paused");
    assert_eq!(counts.running, 0, "b is not dispatched while paused");
    cluster
        .client
        .resume_execution(v1::ResumeExecutionRequest {
            execution_id: id.clone(),
            reason: String::new(),
            ..Default::default()
        })
        .await
        .expect("resume");
    let run = cluster.wait(&id, Duration::from_secs(10)).await;
    assert_eq!(run.state(), ExecutionState::Completed);

    let id = cluster
        .start_plan(
            "name: long\ntasks:\n- {id: forever, type: shell, input: {command: [sleep, '30']}}\n",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancel = v1::CancelExecutionRequest {
        execution_id: id.clone(),
        reason: "enough".into(),
    };
    cluster
        .client
        .cancel_execution(cancel)
        .await
        .expect("cancel");
    let run = cluster.wait(&id, Duration::from_secs(10)).await;
    assert_eq!(run.state(), ExecutionState::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_100000_subtasks_completes_and_resumes_its_parent_once() {
    let mut cluster = cluster::start(1).await;
    let id = cluster
        .start_plan("name: huge\ntasks:\n- {id: fan, type: fanout, input: {count: 100000, child: {type: noop, input: {}}}}\n")
        .await;
    let done = cluster
        .wait_until(&id, "the end of 100,000 subtasks", |e| {
            e.state == ExecutionState::Completed as i32 || e.state == ExecutionState::Failed as i32
        })
        .await;
    assert_eq!(
        done.state,
        ExecutionState::Completed as i32,
        "{}",
        done.reason
    );
    let counts = done.progress.and_then(|p| p.counts).expect("counts");
    assert_eq!(
        counts.completed,
        100_000 + 2,
        "every member, the parent and its one resumed instance"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_and_global_timeouts_are_enforced() {
    let mut cluster = cluster::start(1).await;
    let run = cluster
        .run("name: slow\noptions: {failure: {default_action: retry, max_retries: 1, backoff: {kind: constant, base: 10ms}}}\ntasks:\n- {id: slow, type: sleep, input: {ms: 5000}, timeout: 200ms}\n")
        .await;
    assert_eq!(
        run.state(),
        ExecutionState::Failed,
        "{}",
        run.execution.reason
    );
    // The coordinator times an attempt out at its deadline; the worker enforces the same
    // deadline and may report it first. Either way each attempt ends by running out of time.
    let timeouts = run
        .events
        .iter()
        .filter(|e| match &e.kind {
            Some(Kind::TaskTimedOut(_)) => true,
            Some(Kind::TaskFailed(failed)) => failed.error.contains("deadline exceeded"),
            _ => false,
        })
        .count();
    assert_eq!(
        timeouts, 2,
        "the attempt and its one retry both ran out of time"
    );
    assert!(
        run.execution.reason.contains("timed out")
            || run.execution.reason.contains("deadline exceeded"),
        "{}",
        run.execution.reason
    );

    let run = cluster
        .run("name: global\noptions: {global_timeout: 300ms}\ntasks:\n- {id: slow, type: sleep, input: {ms: 5000}}\n")
        .await;
    assert_eq!(run.state(), ExecutionState::Failed);
    assert!(
        run.execution.reason.contains("global timeout"),
        "{}",
        run.execution.reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_the_coordinator_serving() {
    let cluster = cluster::start(1).await;
    let channel = tonic::transport::Endpoint::from_shared(cluster.url.clone())
        .expect("coordinator url")
        .connect()
        .await
        .expect("health endpoint");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest {
        service: "trellis.v1.Coordinator".into(),
    };
    let status = health
        .check(request)
        .await
        .expect("health check")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_too_large_for_one_nats_message_is_refused_at_once() {
    let mut cluster = cluster::start(0).await;
    // One task whose input alone is larger than the test server's max_payload (8 MiB).
    let blob = "x".repeat(trellis_bus::MAX_PAYLOAD);
    let yaml = format!("name: huge\ntasks:\n- {{id: t, type: noop, input: {{blob: {blob}}}}}\n");
    let request = v1::StartExecutionRequest {
        plan_source: Some(v1::start_execution_request::PlanSource::Spec(
            v1::PlanSpec {
                text: yaml,
                format: v1::PlanFormat::Yaml as i32,
                source_name: "huge.yaml".to_owned(),
                params: Default::default(),
            },
        )),
        options: None,
    };
    let status = tokio::time::timeout(
        Duration::from_secs(30),
        cluster.client.start_execution(request),
    )
    .await
    .expect("the coordinator answers instead of retrying the append")
    .expect_err("the spec cannot be logged");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("max_payload"),
        "{}",
        status.message()
    );
    // The coordinator still serves.
    let id = cluster
        .start_plan("name: small\ntasks:\n- {id: t, type: noop}\n")
        .await;
    assert!(!id.is_empty());
}

/// Regression: a finished execution stayed in the index of unfinished ones (`trellis_executions`)
/// because the coordinator removed it only on a later turn, which a finished execution never
/// gets; every shard takeover then recovered every execution that ever ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_executions_leave_the_index_of_unfinished_ones() {
    let mut cluster = cluster::start(1).await;
    let run = cluster
        .run("name: short\ntasks:\n  - {id: a, type: noop}\n")
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    let nats = async_nats::connect(cluster.nats.url())
        .await
        .expect("a NATS connection");
    let js = async_nats::jetstream::new(nats);
    let index = js
        .get_key_value("trellis_executions")
        .await
        .expect("the coordinator made the index");
    let events = js
        .get_stream(trellis_proto::subjects::EVENTS_STREAM)
        .await
        .expect("the coordinator made the event log");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut keys = Vec::new();
        let mut listed = index.keys().await.expect("the index lists its keys");
        while let Some(key) = futures::StreamExt::next(&mut listed).await {
            keys.push(key.expect("a key"));
        }
        // What may stay are ids reserved for later starts (`turn::reserve`): they have no log.
        let mut logged = Vec::new();
        for key in &keys {
            let id = key.split_once('.').map_or(key.as_str(), |(_, id)| id);
            if events
                .get_last_raw_message_by_subject(&trellis_proto::subjects::events(id))
                .await
                .is_ok()
            {
                logged.push(key.clone());
            }
        }
        if logged.is_empty() {
            assert!(!keys.iter().any(|key| key.ends_with(&run.id)));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "finished executions are still indexed as unfinished: {logged:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
