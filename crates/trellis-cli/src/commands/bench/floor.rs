//! `floor`: the bare JetStream pipeline a Trellis task rides on, with nothing of Trellis in it,
//! on the same server and with the same client settings: a producer publishes a task to a
//! work-queue stream; a worker consumes it, publishes a result to a second work-queue stream and
//! acknowledges the task once the result is stored; a consumer takes the results in batches,
//! appends one event per batch to a log stream and acknowledges them once it is stored. What
//! Trellis adds on top (plans, the state machine, its log's contents, observers) is the
//! difference between this and `throughput` / `latency`.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::join_all;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Fields, percentile, round};

const TASKS: &str = "FLOOR_TASKS";
const RESULTS: &str = "FLOOR_RESULTS";
const LOG: &str = "FLOOR_LOG";
/// A payload the size of a small task assignment.
const PAYLOAD: [u8; 160] = [b'x'; 160];
/// One-task-at-a-time samples taken after the throughput run.
const SAMPLES: usize = 500;
/// Task messages a worker holds unacknowledged: its handler slots, as `trellis bench` runs them
/// (2 workers × 256).
const MAX_ACK_PENDING: i64 = 512;
/// Task publishes in flight before their acks are awaited, as the coordinator sends assignments.
const PUBLISH_CHUNK: usize = 4096;

/// Runs `n` tasks as fast as they go, then [`SAMPLES`] one at a time.
pub(super) async fn floor(nats_url: &str, n: usize) -> Result<Fields, String> {
    let client = trellis_bus::connect(nats_url, "trellis-bench-floor")
        .await
        .map_err(|e| e.to_string())?;
    let js = jetstream::new(client);
    let streams = [
        (TASKS, "floor.tasks", stream::RetentionPolicy::WorkQueue),
        (RESULTS, "floor.results", stream::RetentionPolicy::WorkQueue),
        (LOG, "floor.log", stream::RetentionPolicy::Limits),
    ];
    for (name, subject, retention) in streams {
        // A fresh stream each run: nothing left over from an earlier one is counted.
        let _ = js.delete_stream(name).await;
        js.create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.to_owned()],
            retention,
            storage: stream::StorageType::File,
            max_message_size: trellis_bus::MAX_PAYLOAD as i32,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("cannot create stream {name}: {e}"))?;
    }
    let stop = CancellationToken::new();
    let (done_tx, mut done) = watch::channel(0usize);
    let worker = tokio::spawn(work(js.clone(), stop.clone()));
    let appender = tokio::spawn(append(js.clone(), done_tx, stop.clone()));
    let result = measure(&js, n, &mut done).await;
    stop.cancel();
    let _ = tokio::join!(worker, appender);
    for (name, _, _) in streams {
        let _ = js.delete_stream(name).await;
    }
    result
}

async fn measure(
    js: &jetstream::Context,
    n: usize,
    done: &mut watch::Receiver<usize>,
) -> Result<Fields, String> {
    let payload = Bytes::from_static(&PAYLOAD);
    let start = Instant::now();
    let mut sent = 0;
    while sent < n {
        let chunk = PUBLISH_CHUNK.min(n - sent);
        let mut acks = Vec::with_capacity(chunk);
        for _ in 0..chunk {
            acks.push(publish(js, payload.clone()).await?);
        }
        for ack in join_all(acks.into_iter().map(|ack| ack.into_future())).await {
            ack.map_err(|e| format!("a task was not stored: {e}"))?;
        }
        sent += chunk;
    }
    wait_for(done, n).await?;
    let seconds = start.elapsed().as_secs_f64();
    let mut samples = Vec::with_capacity(SAMPLES);
    for i in 1..=SAMPLES {
        let start = Instant::now();
        let ack = publish(js, payload.clone()).await?;
        wait_for(done, n + i).await?;
        samples.push(start.elapsed().as_secs_f64() * 1000.0);
        ack.await
            .map_err(|e| format!("a task was not stored: {e}"))?;
    }
    samples.sort_by(f64::total_cmp);
    Ok(vec![
        ("seconds", json!(round(seconds, 3))),
        ("tasks_per_s", json!(round(n as f64 / seconds, 0))),
        ("samples", json!(SAMPLES)),
        ("p50_ms", json!(round(percentile(&samples, 0.50), 3))),
        ("p99_ms", json!(round(percentile(&samples, 0.99), 3))),
    ])
}

async fn publish(
    js: &jetstream::Context,
    payload: Bytes,
) -> Result<jetstream::context::PublishAckFuture, String> {
    js.publish("floor.tasks", payload)
        .await
        .map_err(|e| format!("cannot publish a task: {e}"))
}

/// Waits until `n` tasks have their event appended; a pipeline stalled for 30 s is an error.
async fn wait_for(done: &mut watch::Receiver<usize>, n: usize) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(30), done.wait_for(|&d| d >= n))
        .await
        .map_err(|_| format!("the pipeline stalled before task {n}"))?
        .map(|_| ())
        .map_err(|_| "the pipeline stopped".to_owned())
}

/// The worker: each task message becomes a result; the batch's task messages are acknowledged
/// once their results are stored, as Trellis's workers do.
async fn work(js: jetstream::Context, stop: CancellationToken) -> Result<(), String> {
    let consumer = consumer_of(&js, TASKS, "floor-workers", MAX_ACK_PENDING).await?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(256)
        .messages()
        .await
        .map_err(|e| e.to_string())?;
    while let Some(batch) = next_batch(&mut messages, 256, &stop).await {
        let mut acks = Vec::with_capacity(batch.len());
        for message in &batch {
            let ack = js
                .publish("floor.results", message.payload.clone())
                .await
                .map_err(|e| format!("cannot publish a result: {e}"))?;
            acks.push(ack.into_future());
        }
        for ack in join_all(acks).await {
            ack.map_err(|e| format!("a result was not stored: {e}"))?;
        }
        join_all(batch.iter().map(|message| message.ack())).await;
    }
    Ok(())
}

/// The coordinator's part: one event appended per batch of results, then the batch
/// acknowledged.
async fn append(
    js: jetstream::Context,
    done: watch::Sender<usize>,
    stop: CancellationToken,
) -> Result<(), String> {
    let consumer = consumer_of(&js, RESULTS, "floor-coordinator", 100_000).await?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(1000)
        .messages()
        .await
        .map_err(|e| e.to_string())?;
    while let Some(batch) = next_batch(&mut messages, 2000, &stop).await {
        let event = Bytes::from(format!("{{\"results\":{}}}", batch.len()));
        js.publish("floor.log", event)
            .await
            .map_err(|e| format!("cannot append: {e}"))?
            .await
            .map_err(|e| format!("an event was not stored: {e}"))?;
        join_all(batch.iter().map(|message| message.ack())).await;
        done.send_modify(|n| *n += batch.len());
    }
    Ok(())
}

async fn consumer_of(
    js: &jetstream::Context,
    stream: &str,
    name: &str,
    max_ack_pending: i64,
) -> Result<consumer::PullConsumer, String> {
    js.get_stream(stream)
        .await
        .map_err(|e| e.to_string())?
        .create_consumer(consumer::pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: trellis_bus::TASK_ACK_WAIT,
            max_ack_pending,
            max_deliver: -1,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("cannot create consumer {name}: {e}"))
}

/// Waits for one message, then takes what else is already buffered, up to `max`; `None` once
/// stopped or the stream ends.
async fn next_batch(
    messages: &mut consumer::pull::Stream,
    max: usize,
    stop: &CancellationToken,
) -> Option<Vec<jetstream::Message>> {
    let first = tokio::select! {
        () = stop.cancelled() => return None,
        next = messages.next() => next?.ok()?,
    };
    let mut batch = vec![first];
    while batch.len() < max {
        match futures::FutureExt::now_or_never(messages.next()) {
            Some(Some(Ok(message))) => batch.push(message),
            _ => break,
        }
    }
    Some(batch)
}
