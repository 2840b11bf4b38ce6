//! The store's copy of the task logs: consumes `TRELLIS_LOGS` with a durable pull consumer and
//! keeps every batch (table `task_logs`), so an execution's lines stay readable after the stream's
//! retention (a week, 2 GiB) dropped them, for as long as the read model keeps the execution.
//!
//! Run by the replica that ingests the event log ([`crate::leader`]). Writes are idempotent by
//! stream sequence, so the consumer is one durable, [`CONSUMER_NAME`], shared by every term: a
//! batch delivered twice (a new leader, a write that landed before its acknowledgement was lost)
//! is stored once. Each run of messages is written in one transaction, then acknowledged by its
//! last message. A batch that does not decode is skipped with a warning, never retried forever.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_proto::{subjects, v1};

use crate::runs::{Next, RunLimits};
use crate::store::{LogBatchRow, Store};

/// The durable consumer of `TRELLIS_LOGS` that copies batches into the store.
pub const CONSUMER_NAME: &str = "checkpoint-store-logs";

/// Most batches written in one transaction.
const MAX_RUN_MESSAGES: usize = 1_000;
/// Most batches and payload bytes written in one transaction, and how long a transaction waits
/// for more after its first batch.
const RUN: RunLimits = RunLimits {
    messages: MAX_RUN_MESSAGES,
    bytes: 16 * 1024 * 1024,
    linger: crate::runs::LINGER,
};
/// How long an unacknowledged batch waits before JetStream delivers it again.
const ACK_WAIT: Duration = Duration::from_secs(60);
/// Longest pause before opening a lost consumer again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// Reads one `TRELLIS_LOGS` message into its row.
pub(crate) fn row(stream_sequence: u64, payload: &[u8]) -> Result<LogBatchRow, String> {
    let batch = v1::TaskLogBatch::decode(payload).map_err(|err| err.to_string())?;
    let execution_id: ExecutionId = batch.execution_id.parse().map_err(|_| {
        format!(
            "execution_id is not an execution id: {:?}",
            batch.execution_id
        )
    })?;
    let task_instance_id: TaskInstanceId = batch.task_instance_id.parse().map_err(|_| {
        format!(
            "task_instance_id is not a task instance id: {:?}",
            batch.task_instance_id
        )
    })?;
    Ok(LogBatchRow {
        execution_id,
        stream_sequence,
        task_instance_id,
        attempt: batch.attempt,
        batch: batch.batch,
        worker_id: batch.worker_id,
        lines: u32::try_from(batch.lines.len()).unwrap_or(u32::MAX),
        payload: payload.to_vec(),
    })
}

/// Copies `TRELLIS_LOGS` into the store until `shutdown`, starting the consumer again (after a
/// growing pause) whenever it stops.
pub(crate) async fn run(
    store: Arc<dyn Store>,
    nats: async_nats::Client,
    metrics: crate::metrics::Metrics,
    shutdown: CancellationToken,
) {
    let js = jetstream::new(nats);
    let mut delay = Duration::from_millis(100);
    let mut waiting_logged = false;
    loop {
        match js.get_stream(subjects::LOGS_STREAM).await {
            Ok(stream) => {
                waiting_logged = false;
                match copy(&stream, store.as_ref(), &metrics, &shutdown).await {
                    Ok(()) => return,
                    Err(err) => {
                        tracing::warn!(%err, "task log consumer stopped; starting it again");
                    }
                }
            }
            Err(err) if !waiting_logged => {
                tracing::info!(%err, "the task log copy waits for the coordinator to create TRELLIS_LOGS");
                waiting_logged = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}

/// Consumes the stream until `shutdown` (`Ok`) or until the consumer fails (`Err`).
async fn copy(
    stream: &jetstream::stream::Stream,
    store: &dyn Store,
    metrics: &crate::metrics::Metrics,
    shutdown: &CancellationToken,
) -> Result<(), String> {
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            CONSUMER_NAME,
            consumer::pull::Config {
                durable_name: Some(CONSUMER_NAME.to_owned()),
                filter_subject: subjects::LOGS_WILDCARD.to_owned(),
                deliver_policy: consumer::DeliverPolicy::All,
                // A run of batches is acknowledged by its last one, once written.
                ack_policy: consumer::AckPolicy::All,
                ack_wait: ACK_WAIT,
                max_ack_pending: 100_000,
                max_deliver: -1,
                ..Default::default()
            },
        )
        .await
        .map_err(|err| format!("cannot open consumer {CONSUMER_NAME}: {err}"))?;
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(MAX_RUN_MESSAGES)
        .messages()
        .await
        .map_err(|err| format!("cannot consume TRELLIS_LOGS: {err}"))?;
    tracing::info!(consumer = CONSUMER_NAME, "the store copies the task logs");
    loop {
        let received = match crate::runs::next(&mut messages, shutdown, RUN, "task log").await {
            Next::Run(received) => received,
            Next::ShutDown => return Ok(()),
            Next::Ended => return Err("the task log consumer ended".to_owned()),
        };
        let Some(last) = received.last() else {
            continue;
        };
        let rows: Vec<LogBatchRow> = received
            .iter()
            .filter_map(|message| {
                let sequence = message.info().map(|info| info.stream_sequence).ok()?;
                row(sequence, &message.payload)
                    .map_err(|err| {
                        tracing::warn!(subject = %message.subject, sequence, %err, "a task log batch that does not decode was not copied");
                    })
                    .ok()
            })
            .collect();
        let what = format!("writing {} task log batches", rows.len());
        if !crate::runs::write_until_done(shutdown, &what, || store.insert_task_logs(&rows)).await {
            // Shutting down before the write landed: the batches are delivered again later.
            return Ok(());
        }
        metrics.log_batches_copied.inc_by(rows.len() as u64);
        if let Err(err) = last.ack().await {
            tracing::warn!(%err, "failed to acknowledge task log batches (they come again and are stored once)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(execution_id: &str, task_instance_id: &str) -> Vec<u8> {
        v1::TaskLogBatch {
            execution_id: execution_id.to_owned(),
            task_instance_id: task_instance_id.to_owned(),
            attempt: 2,
            worker_id: "worker-1".to_owned(),
            lines: vec![v1::LogLine {
                at_unix_ms: 1,
                source: v1::LogSource::Stdout as i32,
                text: "hello".to_owned(),
                cut_from_bytes: None,
            }],
            dropped_before: 0,
            batch: 3,
        }
        .encode_to_vec()
    }

    const EXECUTION: &str = "0190a5c4-7d1e-7000-8000-000000000001";
    const INSTANCE: &str = "0190a5c4-7d1e-7000-8000-000000000002";

    #[test]
    fn a_batch_becomes_its_row_with_the_payload_kept_whole() {
        let payload = batch(EXECUTION, INSTANCE);
        let row = row(42, &payload).expect("a valid batch");
        assert_eq!(row.execution_id.to_string(), EXECUTION);
        assert_eq!(row.task_instance_id.to_string(), INSTANCE);
        assert_eq!(
            (row.stream_sequence, row.attempt, row.batch, row.lines),
            (42, 2, 3, 1)
        );
        assert_eq!(row.worker_id, "worker-1");
        assert_eq!(row.payload, payload);
    }

    #[test]
    fn a_batch_that_names_nothing_valid_is_refused_with_the_field() {
        let err = row(1, &batch("nope", INSTANCE)).expect_err("bad execution id");
        assert!(
            err.contains("execution_id") && err.contains("nope"),
            "{err}"
        );
        let err = row(1, &batch(EXECUTION, "")).expect_err("no instance id");
        assert!(err.contains("task_instance_id"), "{err}");
        assert!(row(1, b"\xff\xff\xff").is_err(), "not a batch at all");
    }
}
