//! The read model's writer: consumes the event log (`TRELLIS_EVENTS`) with a durable pull
//! consumer and writes executions, task instances, events and questions.
//!
//! Task instance ids are derived inside the state machine, so the store keeps a replica
//! [`Execution`](trellis_core::machine::Execution) per unfinished execution, rebuilt by the one
//! replayer ([`Replayer`]): started from `ExecutionStarted` (its recorded plan decoded, not
//! compiled), fed every later event, and asked after each run of messages which records changed.
//! A log the replayer cannot follow (a gap, an event that does not decode) ends the replica with
//! a warning naming the execution and the sequence: the events are still recorded, the task
//! instances no longer. An event of a kind this build does not know is recorded as `unknown` and
//! skipped by the replica. A replica is dropped when its execution finishes. After a restart, an
//! execution whose next event is not the first gets its replica rebuilt from its own log on
//! JetStream (an ordered consumer filtered on its subject), up to what the read model already
//! holds; so is the replica of a finished execution when a new run (`RunStarted`) arrives.
//!
//! [`apply`] is the pure part (decoding messages, the replicas, the rows to write); this module
//! is the consumer around it.
//!
//! Writes are idempotent by event sequence: the read model keeps `last_sequence` per execution,
//! events at or below it are skipped, and each run of messages (many of them, for speed) is written
//! with the new sequences in one transaction before the messages are acknowledged. Events of a kind
//! this store does not know are stored as `unknown` and skipped, with a warning.

mod apply;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use trellis_core::ids::ExecutionId;
use trellis_proto::{subjects, v1};

use crate::runs::{Next, RunLimits};
use crate::store::{ReadModelBatch, Store};
use apply::{Applier, LogMessage, Run, decode_message};

#[cfg(feature = "fuzzing")]
pub(crate) use apply::fuzzing;

/// Name of the store's durable consumers of `TRELLIS_EVENTS`: one per leadership term,
/// `checkpoint-store-<term>` (`crate::leader`).
pub const CONSUMER_NAME: &str = "checkpoint-store";

/// Most messages and payload bytes written in one transaction, and how long a transaction waits
/// for more after its first message.
const RUN: RunLimits = RunLimits {
    messages: 2_000,
    bytes: 16 * 1024 * 1024,
    linger: crate::runs::LINGER,
};
/// How long an unacknowledged message waits before JetStream delivers it again; a slow database
/// only causes redeliveries, which sequences make harmless.
const ACK_WAIT: Duration = Duration::from_secs(60);
/// Longest wait for the next message of an execution's log while rebuilding its replica.
const LOG_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest pause between two tries of a failed write.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// The consumer loop: the [`Applier`] plus the NATS and database I/O around it.
pub(crate) struct Ingest {
    store: Arc<dyn Store>,
    events: jetstream::stream::Stream,
    applier: Applier,
    metrics: crate::metrics::Metrics,
    /// The leadership term this ingest runs in: it names the consumer.
    term: u64,
}

impl Ingest {
    /// Waits for the coordinator to create the streams (logging while it waits), then consumes the
    /// event log until `shutdown`.
    pub(crate) async fn run(
        store: Arc<dyn Store>,
        nats: async_nats::Client,
        metrics: crate::metrics::Metrics,
        term: u64,
        shutdown: CancellationToken,
    ) {
        let js = jetstream::new(nats);
        let streams = loop {
            let waited = tokio::select! {
                () = shutdown.cancelled() => return,
                streams = trellis_bus::wait_for_streams(&js, Duration::from_secs(60)) => streams,
            };
            match waited {
                Ok(streams) => break streams,
                Err(err) => tracing::warn!(%err, "the read model waits for the event stream"),
            }
        };
        let mut ingest = Ingest {
            store,
            events: streams.events,
            applier: Applier::default(),
            metrics,
            term,
        };
        let mut delay = Duration::from_millis(100);
        loop {
            match ingest.consume(&shutdown).await {
                Ok(()) => return,
                Err(err) => {
                    tracing::warn!(%err, "event consumer stopped; starting it again");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(MAX_RETRY_DELAY);
                }
            }
        }
    }

    async fn consume(&mut self, shutdown: &CancellationToken) -> Result<(), String> {
        let name = format!("{CONSUMER_NAME}-{}", self.term);
        let consumer: consumer::PullConsumer = match self.events.get_consumer(&name).await {
            Ok(consumer) => consumer,
            Err(_) => {
                let start = self.take_over(&name).await?;
                self.events
                    .create_consumer(consumer::pull::Config {
                        durable_name: Some(name.clone()),
                        filter_subject: subjects::EVENTS_WILDCARD.to_owned(),
                        deliver_policy: start,
                        // A run of messages is acknowledged by its last one, once written.
                        ack_policy: consumer::AckPolicy::All,
                        ack_wait: ACK_WAIT,
                        max_ack_pending: 100_000,
                        max_deliver: -1,
                        ..Default::default()
                    })
                    .await
                    .map_err(|err| format!("cannot create consumer {name}: {err}"))?
            }
        };
        let mut puller = crate::runs::Puller::new(consumer, RUN);
        tracing::info!(consumer = %name, "read model consuming the event log");
        loop {
            let received = match puller.next(shutdown).await? {
                Next::Run(received) => received,
                Next::ShutDown => return Ok(()),
                Next::Ended => return Err("the event consumer ended".to_owned()),
            };
            let Some(last) = received.last() else {
                continue;
            };
            let decoded: Vec<LogMessage> = received
                .iter()
                .filter_map(|message| match decode_message(&message.payload) {
                    Ok(decoded) => {
                        trace_ingest(message, &decoded);
                        Some(decoded)
                    }
                    Err(err) => {
                        tracing::warn!(subject = %message.subject, %err, "corrupt event log message skipped");
                        None
                    }
                })
                .collect();
            let n_events: usize = decoded.iter().map(|m| m.events.len()).sum();
            let Some(batch) = self.take(decoded, shutdown).await else {
                return Ok(());
            };
            let started = std::time::Instant::now();
            if !self.write(batch, shutdown).await {
                // Shutting down before the write landed: the messages are delivered again later.
                return Ok(());
            }
            self.metrics
                .write_seconds
                .observe(started.elapsed().as_secs_f64());
            self.metrics.events_ingested.inc_by(n_events as u64);
            if let Err(err) = last.ack().await {
                tracing::warn!(%err, "failed to acknowledge event log messages (they come again and are skipped)");
            }
            self.applier.forget_finished();
        }
    }

    /// Turns decoded messages into a batch: looks up unknown executions, rebuilds missing
    /// replicas from the log, applies the events.
    /// Returns `None` when shut down first.
    /// Deletes the consumers of former terms and returns where this term's starts: right after
    /// the furthest point any of them acknowledged (everything up to it is written), or at the
    /// log's beginning when there was none.
    async fn take_over(&self, name: &str) -> Result<consumer::DeliverPolicy, String> {
        let mut names = self.events.consumer_names();
        let mut former = Vec::new();
        while let Some(found) = names.next().await {
            let found =
                found.map_err(|err| format!("cannot list the event log's consumers: {err}"))?;
            let ours = found == CONSUMER_NAME || found.starts_with(&format!("{CONSUMER_NAME}-"));
            if ours && found != name {
                former.push(found);
            }
        }
        let mut written = 0;
        for old in &former {
            let info = self
                .events
                .consumer_info(old)
                .await
                .map_err(|err| format!("cannot read consumer {old}: {err}"))?;
            written = written.max(info.ack_floor.stream_sequence);
        }
        for old in &former {
            self.events
                .delete_consumer(old)
                .await
                .map_err(|err| format!("cannot delete consumer {old}: {err}"))?;
        }
        tracing::info!(consumer = %name, after = written, former = ?former, "read model takes the event log over");
        Ok(if written == 0 {
            consumer::DeliverPolicy::All
        } else {
            consumer::DeliverPolicy::ByStartSequence {
                start_sequence: written + 1,
            }
        })
    }

    async fn take(
        &mut self,
        messages: Vec<LogMessage>,
        shutdown: &CancellationToken,
    ) -> Option<ReadModelBatch> {
        let unknown = self.applier.unknown(&messages);
        if !unknown.is_empty() {
            let mut delay = Duration::from_millis(50);
            let known = loop {
                match self.store.last_sequences(&unknown).await {
                    Ok(known) => break known,
                    Err(err) => {
                        tracing::error!(%err, "failed to read the executions' last sequences; trying again")
                    }
                }
                tokio::select! {
                    () = shutdown.cancelled() => return None,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(MAX_RETRY_DELAY);
            };
            for execution_id in unknown {
                let last_sequence = known.get(&execution_id).copied().unwrap_or(0);
                self.applier.track(execution_id, last_sequence);
            }
        }
        let mut run = Run::default();
        for (execution_id, up_to) in self.applier.needs_log(&messages) {
            match read_log(&self.events, execution_id, up_to).await {
                Ok(log) => self.applier.rebuild(execution_id, log, &mut run),
                Err(err) => {
                    tracing::warn!(
                        %execution_id,
                        %err,
                        "cannot rebuild the replica from the log; its task instances are not recorded"
                    );
                    self.applier.give_up_replica(execution_id);
                }
            }
        }
        self.applier.apply_messages(messages, &mut run);
        Some(self.applier.finish(run))
    }

    /// Writes the batch, trying again until it lands; returns false when shut down first.
    async fn write(&self, batch: ReadModelBatch, shutdown: &CancellationToken) -> bool {
        let what = format!("read model write of {} events", batch.events.len());
        crate::runs::write_until_done(shutdown, &what, || self.store.write_read_model(&batch)).await
    }
}

/// Marks the read model's taking of a log message in the execution's trace, as a child of the
/// coordinator's append (when tracing is on and the message carries its context).
fn trace_ingest(message: &jetstream::Message, decoded: &LogMessage) {
    use trellis_telemetry::propagation;
    if !propagation::enabled() {
        return;
    }
    let span = tracing::info_span!(
        "events.ingest",
        otel.kind = "consumer",
        execution_id = %decoded.execution_id,
        events = decoded.events.len(),
    );
    propagation::set_parent(&span, propagation::extract_nats(message.headers.as_ref()));
}

/// Reads an execution's log from its first event up to `up_to` (inclusive) with an ordered
/// consumer filtered on its subject.
async fn read_log(
    events: &jetstream::stream::Stream,
    execution_id: ExecutionId,
    up_to: u64,
) -> Result<Vec<v1::Event>, String> {
    let mut messages = trellis_bus::read_execution_log(events, execution_id, 0)
        .await
        .map_err(|err| format!("cannot read the log: {err}"))?;
    let mut log: Vec<v1::Event> = Vec::new();
    while (log.len() as u64) < up_to {
        let message = tokio::time::timeout(LOG_READ_TIMEOUT, messages.next())
            .await
            .map_err(|_| format!("the log ends at sequence {}", log.len()))?
            .ok_or("the log reader stopped")?
            .map_err(|err| format!("cannot read the log: {err}"))?;
        let pending = message.info().map(|info| info.pending).unwrap_or(1);
        match decode_message(&message.payload) {
            Ok(decoded) => {
                for event in decoded.events {
                    let expected = log.len() as u64 + 1;
                    if event.sequence < expected || event.sequence > up_to {
                        continue;
                    }
                    if event.sequence > expected {
                        return Err(format!(
                            "the log jumps from sequence {} to {}",
                            expected - 1,
                            event.sequence
                        ));
                    }
                    log.push(event);
                }
            }
            Err(err) => tracing::warn!(%execution_id, %err, "corrupt event log message skipped"),
        }
        if pending == 0 && (log.len() as u64) < up_to {
            return Err(format!(
                "the log ends at sequence {} before {up_to}",
                log.len()
            ));
        }
    }
    Ok(log)
}
