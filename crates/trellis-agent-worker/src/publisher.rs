//! The publisher of final results: it sends whatever has piled up (up to [`PUBLISH_BATCH`])
//! while the sends before it are stored, the results for one shard in one `TaskResultBatch`
//! message (group commit), then awaits the publish acks together and only then acknowledges the
//! task messages. A send that fails is sent again whole, under the same `Nats-Msg-Id`. A message
//! whose results may be handed off goes to the coordinator of its shard first
//! ([`crate::handoff`]) and to the stream only when the coordinator does not take it.

use async_nats::jetstream;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use trellis_proto::subjects::BATCH_BYTES;
use trellis_proto::{results, subjects, v1};
use trellis_telemetry::hops;

use crate::handoff::Handed;
use crate::publish::{
    Backoff, Finished, ResultSink, STORE_RETRY_BOUND, headers, is_transient, nak, publish_once,
};
use crate::task_ack::Settle;

/// Most results sent before their publish acks are awaited together.
pub(crate) const PUBLISH_BATCH: usize = 256;

/// Sends of results whose publish acks may be awaited at once. More finish meanwhile wait and go
/// out together: under load many results share one message, and so one stored write (one flush
/// on a server that syncs every write); a result alone finds a send free and goes at once. One:
/// with two, a synced `trellis bench --scenario throughput` stored 26 results per message
/// instead of 42, and neither its rate nor `loaded`'s latency was better for it.
const SENDS_IN_FLIGHT: usize = 1;

/// Publishes finished results until every sender is gone, then waits for the outstanding publish
/// acks. Stops at once, acknowledging nothing more, when `abandon` fires.
///
/// It takes whatever has piled up (up to [`PUBLISH_BATCH`]), once fewer than [`SENDS_IN_FLIGHT`]
/// earlier sends await their acks (with one: once none does), and sends it without waiting
/// between messages: the results for one shard in one message (a `TaskResultBatch`,
/// [`batches`]) when several wait together, a result alone otherwise. Then it awaits the
/// messages' publish acks together, beside the loop, and only then acknowledges their task
/// messages.
///
/// A hand-off holds the send until the coordinator answers, as a publish does until it is
/// stored, so what finishes meanwhile goes in the next message (under load about one per
/// coordinator turn). Sent at once instead, each result in its own hand-off, `throughput`
/// measured 37,992–39,983 against 48,722–49,446 tasks/s, and `loaded`'s p99 19–20 ms against
/// 11–12.5 ms.
pub(crate) async fn publisher(
    sink: std::sync::Arc<ResultSink>,
    mut finished_rx: mpsc::Receiver<Finished>,
    abandon: CancellationToken,
) {
    let ack_tasks = TaskTracker::new();
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(SENDS_IN_FLIGHT));
    let mut waiting: Vec<Finished> = Vec::with_capacity(PUBLISH_BATCH);
    loop {
        // A send waits while the last ones are not stored yet: what finishes meanwhile goes out
        // together in the next (group commit), and alone when nothing is in flight.
        let permit = tokio::select! {
            biased;
            _ = abandon.cancelled() => break,
            permit = in_flight.clone().acquire_owned() => permit,
        };
        // The semaphore is never closed.
        let Ok(permit) = permit else { break };
        let first = tokio::select! {
            biased;
            _ = abandon.cancelled() => break,
            first = finished_rx.recv() => first,
        };
        let Some(first) = first else { break };
        waiting.push(first);
        while waiting.len() < PUBLISH_BATCH {
            match finished_rx.try_recv() {
                Ok(finished) => waiting.push(finished),
                Err(_) => break,
            }
        }
        hops::mark_any(
            "worker.result_sent",
            waiting
                .iter()
                .filter_map(|finished| results::execution_id(&finished.payload))
                .filter_map(hops::id_bits),
        );
        let mut pending = Vec::new();
        for outgoing in batches(std::mem::take(&mut waiting)) {
            let headers = match outgoing.headers() {
                Ok(headers) => headers,
                Err(error) => {
                    // It can never be published: set the tasks aside rather than retry them.
                    tracing::error!(%error, "task result cannot be published; task message terminated");
                    for finished in outgoing.into_finished() {
                        let _ = finished.acker.settle(Settle::SetAside).await;
                    }
                    continue;
                }
            };
            if let Some(shard) = outgoing.handoff()
                && sink.handoffs().is_some_and(|handoffs| handoffs.open(shard))
            {
                pending.push(Sending::Handoff(shard, headers, outgoing));
                continue;
            }
            let sent = sink
                .js()
                .send_publish(outgoing.subject().clone(), outgoing.publish(headers))
                .await;
            pending.push(Sending::Stream(sent, outgoing));
        }
        ack_tasks.spawn(deliver_all(sink.clone(), pending, abandon.clone(), permit));
    }
    ack_tasks.close();
    ack_tasks.wait().await;
}

/// Sees messages of results through together (see [`deliver`]), then frees the send's `permit`;
/// stops at once when `abandon` fires.
async fn deliver_all(
    sink: std::sync::Arc<ResultSink>,
    sending: Vec<Sending>,
    abandon: CancellationToken,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let acks =
        futures::future::join_all(sending.into_iter().map(|sending| deliver(&sink, sending)));
    tokio::select! {
        _ = abandon.cancelled() => {}
        _ = acks => {}
    }
    drop(permit);
}

/// One message of results on its way: a result alone, or several for one shard in a batch.
// Each lives only until its acks come; boxing the lone result would allocate per result.
#[allow(clippy::large_enum_variant)]
enum Outgoing {
    Lone(Finished),
    Batch {
        subject: Subject,
        /// `batch:<uuid>`, kept for the sender's retries.
        msg_id: String,
        /// The encoded `TaskResultBatch`.
        payload: Bytes,
        /// The attempts whose results it carries, in order.
        finished: Vec<Finished>,
    },
}

impl Outgoing {
    /// The message of `finished` (results for `subject`, at least one): alone or a batch.
    fn of(subject: Subject, mut finished: Vec<Finished>) -> Outgoing {
        if finished.len() == 1
            && let Some(one) = finished.pop()
        {
            return Outgoing::Lone(one);
        }
        Outgoing::batch(subject, finished)
    }

    /// Packs two or more results for `subject` into one `TaskResultBatch` of a fresh id.
    fn batch(subject: Subject, finished: Vec<Finished>) -> Outgoing {
        let entries = finished
            .iter()
            .map(|finished| v1::task_result_batch::Entry {
                result: finished.payload.to_vec(),
                msg_id: finished.msg_id.clone(),
                traceparent: finished.traceparent.clone().unwrap_or_default(),
            })
            .collect();
        Outgoing::Batch {
            subject,
            msg_id: subjects::batch_msg_id(uuid::Uuid::now_v7()),
            payload: Bytes::from(results::pack(entries)),
            finished,
        }
    }

    fn subject(&self) -> &Subject {
        match self {
            Outgoing::Lone(finished) => &finished.subject,
            Outgoing::Batch { subject, .. } => subject,
        }
    }

    /// The shard its results may be handed off to: every one of them may be.
    fn handoff(&self) -> Option<u32> {
        let mut shards = self.finished().iter().map(|finished| finished.handoff);
        let first = shards.next().flatten()?;
        shards.all(|shard| shard == Some(first)).then_some(first)
    }

    /// Its payload: the result alone, or the encoded batch.
    fn payload(&self) -> &Bytes {
        match self {
            Outgoing::Lone(finished) => &finished.payload,
            Outgoing::Batch { payload, .. } => payload,
        }
    }

    fn msg_id(&self) -> &str {
        match self {
            Outgoing::Lone(finished) => &finished.msg_id,
            Outgoing::Batch { msg_id, .. } => msg_id,
        }
    }

    /// The attempts whose results it carries.
    fn finished(&self) -> &[Finished] {
        match self {
            Outgoing::Lone(finished) => std::slice::from_ref(finished),
            Outgoing::Batch { finished, .. } => finished,
        }
    }

    fn into_finished(self) -> Vec<Finished> {
        match self {
            Outgoing::Lone(finished) => vec![finished],
            Outgoing::Batch { finished, .. } => finished,
        }
    }

    /// Its message to the results stream (see [`Outgoing::headers`]).
    fn message(&self) -> Result<PublishMessage, String> {
        self.headers().map(|headers| self.publish(headers))
    }

    /// Its message to the results stream, with its `headers`.
    fn publish(&self, headers: HeaderMap) -> PublishMessage {
        PublishMessage::build()
            .payload(self.payload().clone())
            .headers(headers)
    }

    /// The headers of its message: its `Nats-Msg-Id`, a lone result's `traceparent`, a batch's
    /// header; a hand-off carries the same.
    fn headers(&self) -> Result<HeaderMap, String> {
        match self {
            Outgoing::Lone(finished) => {
                headers(&finished.msg_id, finished.traceparent.as_deref(), None)
            }
            Outgoing::Batch {
                msg_id, finished, ..
            } => headers(msg_id, None, Some(finished.len())),
        }
    }
}

/// A message of results on its way: published to the results stream, or being handed off to
/// the coordinator of its shard.
enum Sending {
    Stream(
        Result<jetstream::context::PublishAckFuture, PublishError>,
        Outgoing,
    ),
    Handoff(u32, HeaderMap, Outgoing),
}

/// Sees a message of results through: a hand-off the coordinator is done with settles its task
/// messages as stored; one it did not take is published to the stream, as is every other.
async fn deliver(sink: &ResultSink, sending: Sending) {
    let (sent, outgoing) = match sending {
        Sending::Stream(sent, outgoing) => (sent, outgoing),
        Sending::Handoff(shard, headers, outgoing) => {
            let handed = match sink.handoffs() {
                Some(handoffs) => {
                    handoffs
                        .hand_off(shard, headers.clone(), outgoing.payload().clone())
                        .await
                }
                None => Handed::Publish,
            };
            if handed == Handed::Done {
                return settle_tasks(sink, &Ok(()), outgoing).await;
            }
            let sent = sink
                .js()
                .send_publish(outgoing.subject().clone(), outgoing.publish(headers))
                .await;
            (sent, outgoing)
        }
    };
    settle(sink, sent, outgoing).await;
}

/// Groups finished attempts into the messages that carry their results (see [`chunks`]); a
/// group of one is sent alone.
fn batches(finished: Vec<Finished>) -> Vec<Outgoing> {
    chunks(
        finished,
        |finished| &finished.subject,
        |finished| finished.payload.len(),
    )
    .into_iter()
    .map(|(subject, chunk)| Outgoing::of(subject, chunk))
    .collect()
}

/// Splits `items` by their results subject (a shard), keeping their order within each, into
/// chunks of at most [`BATCH_BYTES`] (one larger item is a chunk of its own).
fn chunks<T>(
    items: Vec<T>,
    subject: impl Fn(&T) -> &Subject,
    bytes: impl Fn(&T) -> usize,
) -> Vec<(Subject, Vec<T>)> {
    // Few shards: a linear search of the groups beats hashing subjects.
    let mut groups: Vec<(Subject, Vec<T>)> = Vec::new();
    for item in items {
        match groups.iter_mut().find(|(group, _)| group == subject(&item)) {
            Some((_, group)) => group.push(item),
            None => groups.push((subject(&item).clone(), vec![item])),
        }
    }
    let mut chunks = Vec::new();
    for (subject, group) in groups {
        let mut chunk = Vec::new();
        let mut size = 0;
        for item in group {
            if !chunk.is_empty() && size + bytes(&item) > BATCH_BYTES {
                chunks.push((subject.clone(), std::mem::take(&mut chunk)));
                size = 0;
            }
            size += bytes(&item);
            chunk.push(item);
        }
        if !chunk.is_empty() {
            chunks.push((subject, chunk));
        }
    }
    chunks
}

/// Waits until JetStream stored a message of results, publishing it again while it did not,
/// then acknowledges its task messages (or hands them back when it cannot be stored).
async fn settle(
    sink: &ResultSink,
    sent: Result<jetstream::context::PublishAckFuture, PublishError>,
    outgoing: Outgoing,
) {
    let first = match sent {
        Ok(ack) => ack.await.map(drop),
        Err(error) => Err(error),
    };
    let stored = match first {
        Ok(()) => Ok(()),
        Err(error) if !is_transient(&error) => Err(error),
        Err(error) => {
            tracing::warn!(msg_id = %outgoing.msg_id(), %error, "task result not stored yet; publishing it again");
            let mut backoff = Backoff::new(STORE_RETRY_BOUND);
            loop {
                // Keep the task messages ours while their results wait.
                for finished in outgoing.finished() {
                    finished.acker.progress().await;
                }
                if !backoff.wait().await {
                    break Err(error);
                }
                match publish_once(sink.js(), outgoing.subject(), outgoing.message()).await {
                    Ok(_) => break Ok(()),
                    Err(error) if !is_transient(&error) => break Err(error),
                    Err(error) => {
                        tracing::debug!(msg_id = %outgoing.msg_id(), %error, "task result still not stored");
                    }
                }
            }
        }
    };
    settle_tasks(sink, &stored, outgoing).await;
}

/// Acknowledges the task messages of a message of results once it is stored (with their steps
/// entries, together), or hands them back when it cannot be.
async fn settle_tasks(sink: &ResultSink, stored: &Result<(), PublishError>, outgoing: Outgoing) {
    futures::future::join_all(outgoing.into_finished().into_iter().map(|finished| async move {
        match stored {
            Ok(()) => {
                if let Err(error) = finished.acker.settle(Settle::Done).await {
                    tracing::warn!(%error, "failed to acknowledge a task message");
                }
                if let Some(task_instance_id) = &finished.forget_steps {
                    sink.forget_steps(task_instance_id).await;
                }
            }
            Err(error) => {
                tracing::warn!(msg_id = %finished.msg_id, %error, "task result not accepted by jetstream; handing the task back");
                nak(finished.acker).await;
            }
        }
    }))
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(items: &[(&str, usize)]) -> Vec<(String, Vec<usize>)> {
        let items: Vec<(Subject, usize)> = items
            .iter()
            .map(|(subject, size)| (Subject::from(*subject), *size))
            .collect();
        chunks(items, |(subject, _)| subject, |(_, size)| *size)
            .into_iter()
            .map(|(subject, chunk)| {
                (
                    subject.to_string(),
                    chunk.into_iter().map(|(_, size)| size).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn results_for_one_shard_share_a_chunk_and_other_shards_get_their_own() {
        let got = chunked(&[("r.0", 1), ("r.1", 2), ("r.0", 3), ("r.1", 4), ("r.0", 5)]);
        assert_eq!(
            got,
            [
                ("r.0".to_owned(), vec![1, 3, 5]),
                ("r.1".to_owned(), vec![2, 4]),
            ]
        );
    }

    #[test]
    fn a_chunk_stops_before_the_byte_limit_and_a_larger_result_goes_alone() {
        let half = BATCH_BYTES / 2;
        let got = chunked(&[
            ("r.0", half),
            ("r.0", half),
            ("r.0", 1),
            ("r.0", BATCH_BYTES * 2),
            ("r.0", 7),
        ]);
        assert_eq!(
            got,
            [
                ("r.0".to_owned(), vec![half, half]),
                ("r.0".to_owned(), vec![1]),
                ("r.0".to_owned(), vec![BATCH_BYTES * 2]),
                ("r.0".to_owned(), vec![7]),
            ]
        );
    }

    #[test]
    fn nothing_waiting_makes_no_chunk() {
        assert!(chunked(&[]).is_empty());
    }
}
