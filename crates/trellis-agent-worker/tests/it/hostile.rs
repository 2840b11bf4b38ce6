//! What a worker must survive or refuse: assignments with ids a header cannot carry, cancels that
//! do not name an attempt, assignments of a former owner of the execution (fences), batches
//! with entries it cannot run or that are none, and a task that takes its workers down with it
//! (max deliveries).

use std::time::Duration;

use serde_json::json;
use trellis_agent_worker::{HandlerRegistry, Outcome, TaskContext};

use super::*;

#[tokio::test]
async fn an_assignment_whose_ids_are_not_uuids_is_set_aside_and_results_still_flow()
-> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["noop"], HandlerRegistry::with_builtins());
    // A CR/LF cannot go into the result's Nats-Msg-Id header; an id that is not a UUID did not
    // come from a coordinator.
    for (execution, instance) in [
        (
            uuid::Uuid::now_v7().to_string(),
            "abc\r\nNats-Msg-Id: x".to_owned(),
        ),
        ("not-a-uuid".to_owned(), uuid::Uuid::now_v7().to_string()),
    ] {
        let hostile = TaskAssignment {
            execution_id: execution,
            task_instance_id: instance,
            ..assignment("noop", json!("hostile"))
        };
        harness.publish(&hostile).await?;
    }
    let task = assignment("noop", json!("after"));
    harness.publish(&task).await?;
    let result = harness.result_of(&task.task_instance_id).await?;
    assert_eq!(completed_output(&result)?, json!("after"));
    harness.wait_until_queue_drained("noop").await?;
    assert!(!worker.handle.is_finished(), "the worker stopped");
    worker.stop().await
}

#[tokio::test]
async fn only_a_cancel_naming_the_subjects_instance_and_its_attempt_stops_a_task()
-> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["sleep"], HandlerRegistry::with_builtins());
    // Longer than a heartbeat interval, so a heartbeat shows it running.
    let task = assignment("sleep", json!({"ms": 4000}));
    harness.publish(&task).await?;
    heartbeat_listing(&harness.client, "w1", &task.task_instance_id).await?;
    let subject = subjects::cancel(&task.task_instance_id);
    let named = |instance: &str, attempt: u32| v1::CancelTask {
        execution_id: task.execution_id.clone(),
        task_instance_id: instance.to_owned(),
        attempt,
        reason: "stray".to_owned(),
        preempt: false,
    };
    for stray in [
        Vec::new(),
        v1::CancelTask {
            execution_id: task.execution_id.clone(),
            ..v1::CancelTask::default()
        }
        .encode_to_vec(),
        named(&task.task_instance_id, 0).encode_to_vec(),
        named(&task.task_instance_id, 2).encode_to_vec(),
        named(&uuid::Uuid::now_v7().to_string(), 1).encode_to_vec(),
    ] {
        harness
            .client
            .publish(subject.clone(), stray.into())
            .await?;
    }
    harness.client.flush().await?;
    let result = harness.final_result_of(&task.task_instance_id).await?;
    assert_eq!(completed_output(&result)?, json!({"slept_ms": 4000}));
    worker.stop().await
}

#[tokio::test]
async fn an_assignment_below_its_executions_fence_is_refused() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let (worker, stale) = worker_and_stale_assignment(&harness).await?;
    harness.publish(&stale).await?;
    let current = TaskAssignment {
        fence: 5,
        attempt: 2,
        ..stale.clone()
    };
    harness.publish(&current).await?;
    let result = harness.result_of(&stale.task_instance_id).await?;
    assert_eq!(result.attempt, 2, "the stale attempt 1 ran: {result:?}");
    assert_eq!(completed_output(&result)?, json!("stale"));
    harness.wait_until_queue_drained("noop").await?;
    worker.stop().await
}

#[tokio::test]
async fn a_batch_runs_its_sound_entries_and_sets_the_rest_aside() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let (worker, stale) = worker_and_stale_assignment(&harness).await?;
    let first = assignment("noop", json!("first"));
    let last = assignment("noop", json!("last"));
    harness
        .publish_batch(
            "noop",
            vec![
                first.encode_to_vec(),
                vec![0xff, 0xff, 0xff],
                stale.encode_to_vec(),
                last.encode_to_vec(),
            ],
        )
        .await?;
    // Marked a batch, but none: set aside whole.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(subjects::ASSIGNMENT_BATCH_HEADER, "2");
    harness
        .js
        .publish_with_headers(subjects::tasks("noop"), headers, vec![0xff, 0x01].into())
        .await?
        .await?;
    let after = assignment("noop", json!("after"));
    harness.publish(&after).await?;
    for (task, output) in [(&first, "first"), (&last, "last"), (&after, "after")] {
        let result = harness.result_of(&task.task_instance_id).await?;
        assert_eq!(completed_output(&result)?, json!(output));
    }
    // Every message is settled: the batch once its sound entries' results are stored, the
    // false batch at once; the stale entry never ran.
    harness.wait_until_queue_drained("noop").await?;
    worker.stop().await?;
    while let Ok(Ok((result, _))) =
        tokio::time::timeout(Duration::from_millis(200), harness.results.next()).await
    {
        assert_ne!(
            result.task_instance_id, stale.task_instance_id,
            "the stale entry ran"
        );
    }
    Ok(())
}

/// Starts a worker `w1` of `noop` and returns it with a `noop` assignment of fence 3 whose
/// execution's fence is 5, once the worker knows that fence.
async fn worker_and_stale_assignment(
    harness: &Harness,
) -> anyhow::Result<(Worker, TaskAssignment)> {
    let worker = harness.worker("w1", &["noop"], HandlerRegistry::with_builtins());
    // The worker is up before the fence is written: it learns of it from its watch.
    heartbeat_listing_any(&harness.client, "w1").await?;
    let fences = trellis_bus::ensure_fences_bucket(&harness.js, 1).await?;
    let stale = TaskAssignment {
        fence: 3,
        ..assignment("noop", json!("stale"))
    };
    fences
        .put(&stale.execution_id, trellis_bus::encode_fence(5))
        .await?;
    // Time for the watch to bring the fence in.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok((worker, stale))
}

/// Waits for any heartbeat of `worker_id`.
async fn heartbeat_listing_any(client: &async_nats::Client, worker_id: &str) -> anyhow::Result<()> {
    let mut beats = client.subscribe(subjects::heartbeat(worker_id)).await?;
    tokio::time::timeout(SOON, beats.next())
        .await
        .with_context(|| format!("no heartbeat of {worker_id}"))?
        .context("heartbeat subscription ended")?;
    Ok(())
}

/// A handler that never finishes: its worker is killed while it runs.
fn hang() -> HandlerRegistry {
    HandlerRegistry::new().with("hang", |_ctx: TaskContext| async {
        std::future::pending::<()>().await;
        Outcome::Completed(json!(null))
    })
}

#[tokio::test]
async fn a_task_delivered_past_max_deliveries_fails_as_lost_without_running() -> anyhow::Result<()>
{
    let mut harness = Harness::start().await?;
    let task = assignment("hang", json!(null));
    harness.publish(&task).await?;
    // The first worker dies with the task: one delivery without a result.
    let first = harness.worker("w1", &["hang"], hang());
    heartbeat_listing(&harness.client, "w1", &task.task_instance_id).await?;
    first.kill().await;
    let second = harness.worker_with("w2", &["hang"], hang(), |config| config.max_deliveries = 1);
    let result = tokio::time::timeout(
        trellis_bus::TASK_ACK_WAIT + SOON,
        harness.final_result_of(&task.task_instance_id),
    )
    .await
    .context("no result after the redelivery")??;
    assert_eq!(result.worker_id, "w2");
    match &result.outcome {
        Some(task_result::Outcome::Failed(failed)) => {
            assert_eq!(failed.error, "worker lost 1 time");
            assert!(failed.retryable, "the plan's failure policy decides");
            assert_eq!(failed.lost_deliveries, 1);
        }
        other => anyhow::bail!("expected a lost failure, got {other:?}"),
    }
    harness.wait_until_queue_drained("hang").await?;
    second.stop().await
}
