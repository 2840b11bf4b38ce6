//! A NATS server restart (same port, same store) while tasks run: the worker reconnects, fetches
//! again, gets every result stored under its one message id, drains its queue and keeps
//! heartbeating.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use async_nats::jetstream::consumer;
use async_nats::jetstream::message::PublishMessage;
use serde_json::json;
use trellis_agent_worker::HandlerRegistry;
use trellis_agent_worker::v1::task_result;

use super::*;

/// How long the server stays down.
const OUTAGE: Duration = Duration::from_secs(2);

/// Publishes an assignment with its `Nats-Msg-Id`, as the coordinator does, trying again while
/// the server restarts; the id keeps a retried publish from queueing the task twice.
async fn publish_until_stored(harness: &Harness, task: &TaskAssignment) -> anyhow::Result<()> {
    let mut n_tries = 0;
    loop {
        let publish = PublishMessage::build()
            .message_id(subjects::task_msg_id(&task.task_instance_id, task.attempt))
            .payload(task.encode_to_vec().into());
        let stored = async {
            harness
                .js
                .send_publish(subjects::tasks(&task.queue), publish)
                .await?
                .await
        };
        match stored.await {
            Ok(_) => return Ok(()),
            Err(_) if n_tries < 20 => {
                n_tries += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// The `Nats-Msg-Id`s of the final results stored for each instance.
type FinalMsgIds = HashMap<String, BTreeSet<String>>;

/// Reads the final results stored on the results stream until `n_instances` instances have one,
/// and whatever else arrives within another half second; returns their message ids by instance.
///
/// The ids, not the copies, are what counts: a result stored just before the server died may be
/// stored again by the retry its lost ack caused (the restarted server does not always remember
/// ids it stored before), and the coordinator applies one result per instance and attempt.
async fn stored_final_results(
    harness: &Harness,
    n_instances: usize,
) -> anyhow::Result<FinalMsgIds> {
    let stream = harness.js.get_stream(subjects::RESULTS_STREAM).await?;
    let reader: consumer::PullConsumer = stream
        .get_or_create_consumer(
            "test-reader",
            consumer::pull::Config {
                durable_name: Some("test-reader".to_owned()),
                ack_policy: consumer::AckPolicy::Explicit,
                ..Default::default()
            },
        )
        .await
        .map_err(|error| anyhow::anyhow!("cannot create the results reader: {error}"))?;
    let mut finals = FinalMsgIds::new();
    let deadline = tokio::time::Instant::now() + SOON * 2;
    let mut last_round = false;
    loop {
        if finals.len() >= n_instances {
            if last_round {
                return Ok(finals);
            }
            last_round = true;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "only {} of {n_instances} instances have a stored result",
                finals.len()
            );
        }
        let mut batch = reader
            .fetch()
            .max_messages(500)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|error| anyhow::anyhow!("fetch failed: {error}"))?;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|error| anyhow::anyhow!("fetch failed: {error}"))?;
            for (result, msg_id) in results_in(&message)? {
                if !matches!(
                    result.outcome,
                    Some(task_result::Outcome::StepCheckpoint(_))
                ) {
                    finals
                        .entry(result.task_instance_id)
                        .or_default()
                        .insert(msg_id);
                }
            }
            message
                .ack()
                .await
                .map_err(|error| anyhow::anyhow!("ack failed: {error}"))?;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_outlives_a_nats_server_restart() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker("w1", &["sleep"], HandlerRegistry::with_builtins());
    let mut tasks = Vec::new();
    // 16 slots of 100 ms tasks: about a second of work, so the restart lands in the middle.
    for _ in 0..160 {
        let task = assignment("sleep", json!({"ms": 100}));
        publish_until_stored(&harness, &task).await?;
        tasks.push(task);
    }
    for _ in 0..20 {
        tokio::time::timeout(SOON, harness.results.next())
            .await
            .context("no result before the restart")??;
    }
    // Down for a while, as a real restart is: publishes and pulls in flight time out.
    tokio::task::block_in_place(|| harness.server.kill());
    tokio::time::sleep(OUTAGE).await;
    tokio::task::block_in_place(|| harness.server.restart())?;
    for _ in 0..40 {
        let task = assignment("sleep", json!({"ms": 100}));
        publish_until_stored(&harness, &task).await?;
        tasks.push(task);
    }

    let finals = stored_final_results(&harness, tasks.len()).await?;
    for task in &tasks {
        let expected = BTreeSet::from([subjects::result_msg_id(
            &task.task_instance_id,
            1,
            "completed",
        )]);
        assert_eq!(
            finals.get(&task.task_instance_id),
            Some(&expected),
            "stored final results of {}",
            task.task_instance_id
        );
    }
    assert_eq!(finals.len(), tasks.len(), "results of unknown instances");
    harness.wait_until_queue_drained("sleep").await?;

    // Still heartbeating after the restart.
    let mut beats = harness.client.subscribe(subjects::heartbeat("w1")).await?;
    tokio::time::timeout(SOON, beats.next())
        .await
        .context("no heartbeat after the restart")?;
    worker.stop().await
}
