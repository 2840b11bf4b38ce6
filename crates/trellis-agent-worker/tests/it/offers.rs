//! Assignments offered directly, with the test as the coordinator: an offer with a free slot is
//! answered `taken` and its task runs without a task message; one without a free slot is
//! answered `busy`; a worker told to take no offers hears none.

use std::time::Duration;

use serde_json::json;
use trellis_agent_worker::{HandlerRegistry, Outcome, TaskContext};

use super::*;

async fn echo(ctx: TaskContext) -> Outcome {
    Outcome::Completed(json!({ "echo": ctx.input().clone() }))
}

/// Holds its slot for two seconds.
async fn hold(_ctx: TaskContext) -> Outcome {
    tokio::time::sleep(Duration::from_secs(2)).await;
    Outcome::Completed(json!(null))
}

fn registry() -> HandlerRegistry {
    HandlerRegistry::new().with("echo", echo).with("hold", hold)
}

/// Offers `task` as a coordinator does, once a worker hears offers of its queue; returns the
/// answer.
async fn offer(harness: &Harness, task: &TaskAssignment) -> anyhow::Result<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let request = async_nats::Request::new()
            .payload(task.encode_to_vec().into())
            .timeout(Some(Duration::from_secs(5)));
        match harness
            .client
            .send_request(subjects::offer(&task.queue), request)
            .await
        {
            Ok(reply) => return Ok(reply.payload.to_vec()),
            Err(error)
                if error.kind() == async_nats::RequestErrorKind::NoResponders
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => bail!("the offer of {} failed: {error}", task.task_instance_id),
        }
    }
}

/// How many messages the tasks stream ever stored.
async fn tasks_stored(harness: &Harness) -> anyhow::Result<u64> {
    let mut stream = harness.js.get_stream(subjects::TASKS_STREAM).await?;
    Ok(stream.info().await?.state.last_sequence)
}

#[tokio::test]
async fn an_offer_with_a_free_slot_is_taken_and_runs_without_a_task_message() -> anyhow::Result<()>
{
    let mut harness = Harness::start().await?;
    let worker = harness.worker_with("w1", &["echo"], registry(), |config| {
        config.handoff = false;
    });
    let task = assignment("echo", json!(5));
    assert_eq!(offer(&harness, &task).await?, subjects::OFFER_TAKEN);
    let result = harness.result_of(&task.task_instance_id).await?;
    assert_eq!(completed_output(&result)?, json!({ "echo": 5 }));
    assert_eq!(
        tasks_stored(&harness).await?,
        0,
        "no task message was needed"
    );
    worker.stop().await
}

#[tokio::test]
async fn an_offer_without_a_free_slot_is_answered_busy() -> anyhow::Result<()> {
    let harness = Harness::start().await?;
    let worker = harness.worker_with("w1", &["hold"], registry(), |config| {
        config.slots = 1;
    });
    let first = assignment("hold", json!(null));
    assert_eq!(offer(&harness, &first).await?, subjects::OFFER_TAKEN);
    let second = assignment("hold", json!(null));
    assert_eq!(
        offer(&harness, &second).await?,
        subjects::OFFER_BUSY,
        "its one slot is taken"
    );
    worker.stop().await
}

#[tokio::test]
async fn a_worker_told_to_take_no_offers_hears_none() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker_with("w1", &["echo"], registry(), |config| {
        config.offers = false;
    });
    // It runs what the stream holds, so it is up; offers find no one.
    let task = assignment("echo", json!(1));
    harness.publish(&task).await?;
    harness.result_of(&task.task_instance_id).await?;
    let request = async_nats::Request::new()
        .payload(assignment("echo", json!(2)).encode_to_vec().into())
        .timeout(Some(Duration::from_secs(5)));
    let answer = harness
        .client
        .send_request(subjects::offer("echo"), request)
        .await;
    assert!(
        answer
            .as_ref()
            .is_err_and(|error| error.kind() == async_nats::RequestErrorKind::NoResponders),
        "an offer to a worker that takes none: {answer:?}"
    );
    worker.stop().await
}
