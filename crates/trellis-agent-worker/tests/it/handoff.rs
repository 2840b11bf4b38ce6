//! Result hand-offs, with the test as the coordinator of shard 0: a hand-off answered `done`
//! never reaches the results stream and its task message is acknowledged; one answered
//! otherwise, or not at all, is published to the stream; a shard whose hand-off went unanswered
//! gets none for a while; a worker told to make none publishes every result.

use serde_json::json;
use trellis_agent_worker::{HandlerRegistry, Outcome, TaskContext};

use super::*;

async fn echo(ctx: TaskContext) -> Outcome {
    Outcome::Completed(json!({ "echo": ctx.input().clone() }))
}

fn registry() -> HandlerRegistry {
    HandlerRegistry::new().with("echo", echo)
}

/// Plays the coordinator of shard 0: hears its hand-offs and answers each with `answer`
/// (nothing when `None`), passing on the results each carried.
async fn coordinator(
    client: &async_nats::Client,
    answer: Option<&'static [u8]>,
) -> anyhow::Result<tokio::sync::mpsc::UnboundedReceiver<Vec<TaskResult>>> {
    let mut handoffs = client
        .queue_subscribe(
            subjects::handoff(0),
            subjects::HANDOFF_QUEUE_GROUP.to_owned(),
        )
        .await?;
    client.flush().await?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let client = client.clone();
    tokio::spawn(async move {
        while let Some(message) = handoffs.next().await {
            let results = results_in(&message)
                .map(|results| results.into_iter().map(|(result, _)| result).collect())
                .unwrap_or_default();
            if let (Some(answer), Some(reply)) = (answer, message.reply.clone()) {
                let _ = client.publish(reply, answer.into()).await;
            }
            if tx.send(results).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// How many messages the results stream ever stored.
async fn results_stored(harness: &Harness) -> anyhow::Result<u64> {
    let mut stream = harness.js.get_stream(subjects::RESULTS_STREAM).await?;
    Ok(stream.info().await?.state.last_sequence)
}

async fn next_handoff(
    handoffs: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<TaskResult>>,
) -> anyhow::Result<Vec<TaskResult>> {
    tokio::time::timeout(SOON, handoffs.recv())
        .await
        .context("no hand-off came")?
        .context("the coordinator stopped")
}

#[tokio::test]
async fn a_hand_off_answered_done_is_acknowledged_and_never_published() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let mut handoffs = coordinator(&harness.client, Some(subjects::HANDOFF_DONE)).await?;
    let worker = harness.worker("w1", &["echo"], registry());

    let task = assignment("echo", json!(7));
    harness.publish(&task).await?;
    let handed = next_handoff(&mut handoffs).await?;
    let [result] = handed.as_slice() else {
        bail!("expected one result in the hand-off, got {handed:?}");
    };
    assert_eq!(result.task_instance_id, task.task_instance_id);
    assert_eq!(completed_output(result)?, json!({ "echo": 7 }));
    // The task message is acknowledged only after the answer; the stream never saw the result.
    harness.wait_until_queue_drained("echo").await?;
    assert_eq!(results_stored(&harness).await?, 0);
    worker.stop().await
}

#[tokio::test]
async fn a_hand_off_answered_publish_goes_to_the_stream() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let mut handoffs = coordinator(&harness.client, Some(subjects::HANDOFF_PUBLISH)).await?;
    let worker = harness.worker("w1", &["echo"], registry());

    let task = assignment("echo", json!("a"));
    harness.publish(&task).await?;
    assert_eq!(next_handoff(&mut handoffs).await?.len(), 1);
    let result = harness.result_of(&task.task_instance_id).await?;
    assert_eq!(completed_output(&result)?, json!({ "echo": "a" }));
    harness.wait_until_queue_drained("echo").await?;
    assert_eq!(results_stored(&harness).await?, 1);
    worker.stop().await
}

#[tokio::test]
async fn an_unanswered_hand_off_is_published_and_the_shard_skipped_for_a_while()
-> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let mut handoffs = coordinator(&harness.client, None).await?;
    let worker = harness.worker("w1", &["echo"], registry());

    let first = assignment("echo", json!(1));
    harness.publish(&first).await?;
    assert_eq!(next_handoff(&mut handoffs).await?.len(), 1);
    // No answer: the result goes to the stream once the wait is over.
    let result = harness.result_of(&first.task_instance_id).await?;
    assert_eq!(completed_output(&result)?, json!({ "echo": 1 }));
    harness.wait_until_queue_drained("echo").await?;

    // The shard is skipped now: the next result goes straight to the stream.
    let second = assignment("echo", json!(2));
    harness.publish(&second).await?;
    harness.result_of(&second.task_instance_id).await?;
    harness.wait_until_queue_drained("echo").await?;
    assert!(
        handoffs.try_recv().is_err(),
        "a result was handed off to a shard whose last hand-off went unanswered"
    );
    assert_eq!(results_stored(&harness).await?, 2);
    worker.stop().await
}

#[tokio::test]
async fn a_worker_told_to_make_no_hand_offs_publishes_every_result() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let mut handoffs = coordinator(&harness.client, Some(subjects::HANDOFF_DONE)).await?;
    let worker = harness.worker_with("w1", &["echo"], registry(), |config| {
        config.handoff = false;
    });

    let task = assignment("echo", json!(null));
    harness.publish(&task).await?;
    harness.result_of(&task.task_instance_id).await?;
    harness.wait_until_queue_drained("echo").await?;
    assert!(handoffs.try_recv().is_err(), "a result was handed off");
    assert_eq!(results_stored(&harness).await?, 1);
    worker.stop().await
}
