//! Fenced appends: the index entries of new executions, then each execution's new events on its
//! log subject, each message naming the stream sequence it must follow, retried until stored.
//!
//! If another coordinator wrote the log in between, JetStream refuses the append
//! (`WrongLastSequence`): the outcome is [`Appended::Fenced`] and the turn drops the execution. A
//! duplicate acknowledgement (`Nats-Msg-Id` seen before) counts as stored only if the stored
//! message is byte-identical: ours, from an attempt whose acknowledgement was lost.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::future::join_all;
use tokio_util::sync::CancellationToken;
use trellis_core::ids::ExecutionId;
use trellis_proto::subjects;
use trellis_telemetry::{hops, propagation};

use super::Executor;
use crate::turn::{Append, Appended};

/// Longest pause between two attempts of a write JetStream did not acknowledge.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The header naming the stream sequence an append must follow.
const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";

/// One execution's messages still to append.
struct Queue {
    id: ExecutionId,
    messages: VecDeque<(u64, Bytes)>,
    trace: propagation::Context,
    /// The stream sequence the next message must follow.
    stream_seq: u64,
    outcome: Option<Appended>,
}

impl Executor {
    /// Carries out the turn's appends; returns each one's outcome.
    pub(super) async fn append(&self, appends: Vec<Append>) -> Vec<(ExecutionId, Appended)> {
        if appends.is_empty() {
            return Vec::new();
        }
        self.put_index(&appends).await;
        // Marked with or without entries to write: a start that took a reserved id has none.
        hops::mark_any(
            "coordinator.indexed",
            appends.iter().map(|append| append.id.0.as_u128()),
        );
        let started = Instant::now();
        let mut queues: Vec<Queue> = appends
            .into_iter()
            .map(|append| Queue {
                id: append.id,
                messages: append.messages.into(),
                trace: append.trace,
                stream_seq: append.expected_stream_seq,
                outcome: None,
            })
            .collect();
        // One round per message of the longest queue, so each message names the sequence the
        // previous one of its execution was stored at; every execution's round goes out at once.
        while queues
            .iter()
            .any(|q| q.outcome.is_none() && !q.messages.is_empty())
        {
            let mut round = Vec::new();
            for (queue_idx, queue) in queues.iter_mut().enumerate() {
                if queue.outcome.is_some() {
                    continue;
                }
                let Some((first, bytes)) = queue.messages.pop_front() else {
                    continue;
                };
                let headers = append_headers(queue.id, first, queue.stream_seq, &queue.trace);
                let publish = self.js.publish_with_headers(
                    subjects::events(queue.id),
                    headers.clone(),
                    bytes.clone(),
                );
                round.push((queue_idx, bytes, headers, publish));
            }
            let mut acks = Vec::with_capacity(round.len());
            for (queue_idx, bytes, headers, publish) in round {
                acks.push((queue_idx, bytes, headers, publish.await));
            }
            for (queue_idx, bytes, headers, publish) in acks {
                let id = queues[queue_idx].id;
                let outcome = match publish {
                    Ok(ack) => match ack.await {
                        Ok(ack) if !ack.duplicate => Appended::Stored {
                            stream_seq: ack.sequence,
                        },
                        Ok(ack) => self.check_duplicate(id, ack.sequence, &bytes).await,
                        Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => {
                            Appended::Fenced {
                                why: err.to_string(),
                            }
                        }
                        Err(err) => {
                            tracing::warn!(%id, %err, "event log append not acknowledged; retrying");
                            self.append_until_stored(id, &headers, &bytes).await
                        }
                    },
                    Err(err) => {
                        tracing::warn!(%id, %err, "cannot append to the event log; retrying");
                        self.append_until_stored(id, &headers, &bytes).await
                    }
                };
                let queue = &mut queues[queue_idx];
                match outcome {
                    Appended::Stored { stream_seq } => queue.stream_seq = stream_seq,
                    other => queue.outcome = Some(other),
                }
            }
        }
        self.metrics
            .append_seconds
            .observe(started.elapsed().as_secs_f64());
        queues
            .into_iter()
            .map(|queue| {
                let outcome = queue.outcome.unwrap_or(Appended::Stored {
                    stream_seq: queue.stream_seq,
                });
                (queue.id, outcome)
            })
            .collect()
    }

    /// Writes the index entries of new executions (and runs) before their first event, so a
    /// coordinator taking the shard over finds every execution that has a log.
    async fn put_index(&self, appends: &[Append]) {
        let keys: Vec<&str> = appends
            .iter()
            .filter_map(|append| append.index_put.as_deref())
            .collect();
        put_index_entries(&self.index, &self.shutdown, &keys).await;
    }

    /// A duplicate ack means JetStream already held a message with this id: ours, stored by an
    /// earlier attempt whose ack was lost, or another coordinator's.
    async fn check_duplicate(&self, id: ExecutionId, stream_seq: u64, bytes: &Bytes) -> Appended {
        match self.streams.events.get_raw_message(stream_seq).await {
            Ok(stored) if stored.payload == *bytes => Appended::Stored { stream_seq },
            Ok(_) => Appended::Fenced {
                why: format!("message id of {id} already used by another writer"),
            },
            Err(err) => Appended::Fenced {
                why: format!("cannot check a duplicate append: {err}"),
            },
        }
    }

    /// Retries an append until JetStream stores it, refuses it, or the coordinator stops.
    async fn append_until_stored(
        &self,
        id: ExecutionId,
        headers: &HeaderMap,
        bytes: &Bytes,
    ) -> Appended {
        let mut backoff = Duration::from_millis(50);
        loop {
            if self.shutdown.is_cancelled() {
                return Appended::Stopped;
            }
            let attempt = async {
                self.js
                    .publish_with_headers(subjects::events(id), headers.clone(), bytes.clone())
                    .await?
                    .await
            };
            match attempt.await {
                Ok(ack) if !ack.duplicate => {
                    return Appended::Stored {
                        stream_seq: ack.sequence,
                    };
                }
                Ok(ack) => return self.check_duplicate(id, ack.sequence, bytes).await,
                Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => {
                    return Appended::Fenced {
                        why: err.to_string(),
                    };
                }
                Err(err) => tracing::warn!(%id, %err, "event log append failed; retrying"),
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return Appended::Stopped,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// The headers of one log message: its id, the sequence it must follow, and (when traces are
/// exported) the `events.append` span, so readers of the log continue the execution's trace.
fn append_headers(
    id: ExecutionId,
    first: u64,
    expected_stream_seq: u64,
    trace: &propagation::Context,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        subjects::MSG_ID_HEADER,
        subjects::event_msg_id(id, first).as_str(),
    );
    headers.insert(
        EXPECTED_LAST_SUBJECT_SEQ,
        expected_stream_seq.to_string().as_str(),
    );
    if propagation::enabled() {
        let span = tracing::info_span!(
            "events.append",
            otel.kind = "producer",
            execution_id = %id,
            first_sequence = first,
        );
        propagation::set_parent(&span, trace.clone());
        propagation::inject_nats(&propagation::context_of(&span), &mut headers);
    }
    headers
}

/// Writes index entries, all at once, then each one that failed again until it is stored or the
/// coordinator stops.
pub(super) async fn put_index_entries(
    index: &kv::Store,
    shutdown: &CancellationToken,
    keys: &[impl AsRef<str>],
) {
    if keys.is_empty() {
        return;
    }
    let results = join_all(
        keys.iter()
            .map(|key| index.put(key.as_ref(), Bytes::from_static(b"1"))),
    )
    .await;
    for (key, result) in keys.iter().zip(results) {
        if let Err(err) = result {
            let key = key.as_ref();
            tracing::warn!(%key, %err, "index write failed; retrying");
            retry_until(shutdown, || index.put(key, Bytes::from_static(b"1"))).await;
        }
    }
}

/// Publishes one message to JetStream until it is stored or the coordinator stops (its message
/// id, in `headers`, makes a repeat harmless).
pub(super) async fn store_until(
    js: &jetstream::Context,
    shutdown: &CancellationToken,
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
) {
    retry_until(shutdown, || async {
        js.publish_with_headers(subject.clone(), headers.clone(), payload.clone())
            .await?
            .await
            .map(|_| ())
    })
    .await;
}

/// Runs `attempt` until it succeeds or the coordinator stops, backing off between tries.
pub(super) async fn retry_until<F, Fut, T, E>(shutdown: &CancellationToken, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        match attempt().await {
            Ok(_) => return,
            Err(err) => tracing::debug!(%err, "retrying a write"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
