//! The fetch loops: each pulls one queue lane's task messages as slots free up, takes batches
//! apart, and hands each assignment to `Worker::dispatch` with a slot.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::Batch;
use async_nats::jetstream::{self, AckKind, stream};
use bytes::Bytes;
use futures::StreamExt as _;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;
use trellis_bus::Lane;
use trellis_proto::{assignments, subjects};
use trellis_telemetry::propagation;

use super::{MAX_ACK_PENDING, Worker};
use crate::publish::{self, Finished, now_unix_ms};
use crate::task_ack::TaskAck;

/// Most messages one fetch asks for (also bounded by the free slots).
pub(super) const FETCH_BATCH: usize = 256;
/// On a runtime of one thread, the assignments of one task message dispatched before the fetch
/// loop yields to what woke meanwhile. Each is polled in place ([`Worker::start`]), so a message
/// of 128 noop tasks held the thread for about a millisecond, and a one-task execution's offer,
/// result or observer waited behind it at each of its hops. Every 32 cut `loaded`'s tail more,
/// but the coordinator's loop, given the thread more often, ran half again as many turns of
/// fewer results (also with the publisher held back until a message's results were all in):
/// `throughput` 30,794-34,277 against 36,385-39,346 tasks/s.
const YIELD_EVERY: usize = 64;
/// How long an idle queue's long poll waits for a message before asking again.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// Pause after a failed fetch (NATS unreachable, consumer gone) before trying again; it doubles
/// with every further failure in a row, up to [`FETCH_RETRY_MAX_DELAY`].
const FETCH_RETRY_DELAY: Duration = Duration::from_millis(250);
const FETCH_RETRY_MAX_DELAY: Duration = Duration::from_secs(4);
/// Longest wait for the next message of a fetch. The server answers a fetch at once and an idle
/// poll within [`IDLE_POLL`]; a silence this long means the request was lost (the server
/// restarted), and waiting on would hold the fetch's slots forever.
const FETCH_STALL: Duration = Duration::from_secs(5);

/// What the assignments of one task message share.
pub(super) struct Delivery {
    pub(super) subject: async_nats::Subject,
    /// How often JetStream delivered the message (from 1).
    pub(super) delivered: i64,
    /// How long it waited in the queue (first deliveries only).
    pub(super) queued_seconds: Option<f64>,
    /// Where `AckProgress` for it goes (the message's reply subject).
    pub(super) progress_subject: Option<async_nats::Subject>,
}

/// One assignment as received: alone in its message, or an entry of a batch.
pub(super) struct Received {
    pub(super) payload: Bytes,
    /// The trace context of its dispatch.
    pub(super) parent: propagation::Context,
    pub(super) ack: TaskAck,
}

/// Whether messages wait for the lane's consumer after one that said how many were still
/// undelivered behind it and how often it was delivered itself (`None`: it did not say). The
/// count leaves out redeliveries, which come in bursts (a lost worker's tasks), so a redelivered
/// message counts as more.
fn more_waiting(said: Option<(u64, i64)>) -> bool {
    said.is_none_or(|(pending, delivered)| pending > 0 || delivered > 1)
}

/// How one fetch ended.
enum FetchEnd {
    /// The fetch ended normally, having delivered this many messages holding this many
    /// assignments; `more` unless its last message said none were left in the queue.
    Drained {
        messages: usize,
        assignments: usize,
        more: bool,
    },
    /// The fetch broke off (an error status from the server, or silence past [`FETCH_STALL`]).
    Failed(String),
}

impl Worker {
    /// Answers the assignments offered on one queue's subject until `shutdown`: one taken when
    /// a slot is free at once (and the worker is not draining) runs as a fast-lane task with
    /// no task message, and is answered `taken` once started; any other is answered `busy`,
    /// and its coordinator sends it to the tasks stream.
    pub(super) async fn offer_loop(
        self: Arc<Self>,
        mut offers: async_nats::Subscriber,
        finished_tx: mpsc::Sender<Finished>,
        shutdown: CancellationToken,
    ) {
        loop {
            let message = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.abandon.cancelled() => break,
                message = offers.next() => match message {
                    Some(message) => message,
                    None => break,
                },
            };
            let Some(reply) = message.reply.clone() else {
                continue;
            };
            let permit = if self.draining.load(std::sync::atomic::Ordering::Acquire) {
                None
            } else {
                self.slots.clone().try_acquire_owned().ok()
            };
            let Some(permit) = permit else {
                self.answer_offer(reply, "busy", subjects::OFFER_BUSY).await;
                continue;
            };
            let delivery = Delivery {
                subject: message.subject.clone(),
                delivered: 1,
                queued_seconds: None,
                progress_subject: None,
            };
            let received = Received {
                payload: message.payload,
                parent: propagation::extract_nats(message.headers.as_ref()),
                ack: TaskAck::offered(),
            };
            let attempt = self
                .dispatch(&delivery, received, permit, &finished_tx)
                .await;
            // Answered before the attempt runs: a handler may run long before it first waits.
            self.answer_offer(reply, "taken", subjects::OFFER_TAKEN)
                .await;
            if let Some(attempt) = attempt {
                self.start(attempt).await;
            }
        }
        // Offers already here and not looked at go unanswered: their coordinator watches them.
        let _ = offers.unsubscribe().await;
    }

    /// Answers an offer and counts the answer (`trellis_worker_offers`); an answer lost on the
    /// way leaves the attempt to its coordinator's watch.
    async fn answer_offer(
        &self,
        reply: async_nats::Subject,
        label: &'static str,
        answer: &'static [u8],
    ) {
        self.metrics
            .offers
            .get_or_create(&[("answer", label.to_owned())])
            .inc();
        let _ = self.client.publish(reply, Bytes::from_static(answer)).await;
    }

    /// Pulls the queue's messages as slots free up: a long poll for one message while the queue
    /// is idle, then fetches that return at once while it is busy, each for as many messages as
    /// the free slots take. A message that was the last one waiting (JetStream says how many
    /// are left with each) keeps the queue idle: the next pull is the long poll again, not a
    /// fetch the server can only answer with nothing.
    ///
    /// A fetch that fails (NATS restarting, the consumer gone) is retried after a growing pause,
    /// with the consumer looked up again (and created if it is missing), so the worker outlives a
    /// NATS server restart.
    pub(super) async fn fetch_loop(
        self: Arc<Self>,
        queue: String,
        lane: Lane,
        tasks: stream::Stream,
        mut consumer: PullConsumer,
        finished_tx: mpsc::Sender<Finished>,
        shutdown: CancellationToken,
    ) {
        let mut busy = false;
        let mut n_failures = 0u32;
        // Assignments per message in the last fetch (batches hold several).
        let mut per_message = 1usize;
        while !shutdown.is_cancelled() && !self.abandon.is_cancelled() {
            let (batch, permits) = if busy {
                let Some(permits) = self.reserve_slots(lane, &shutdown).await else {
                    break;
                };
                // As many messages as the free slots take at the last fetch's assignments
                // per message: a worker does not take whole batches it has no room for while
                // other workers could run them.
                let n_messages = (permits.num_permits() / per_message).max(1);
                (
                    consumer.fetch().max_messages(n_messages).messages().await,
                    Some(permits),
                )
            } else {
                let batch = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = self.abandon.cancelled() => break,
                    batch = consumer.batch().max_messages(1).expires(IDLE_POLL).messages() => batch,
                };
                (batch, None)
            };
            let end = match batch {
                Ok(batch) => {
                    self.drain_batch(lane, batch, permits, &finished_tx, &shutdown)
                        .await
                }
                Err(error) => FetchEnd::Failed(error.to_string()),
            };
            match end {
                FetchEnd::Drained {
                    messages,
                    assignments,
                    more,
                } => {
                    n_failures = 0;
                    busy = messages > 0 && more;
                    if let Some(per) = assignments.checked_div(messages) {
                        per_message = per.max(1);
                    }
                }
                FetchEnd::Failed(error) => {
                    n_failures += 1;
                    busy = false;
                    let delay = FETCH_RETRY_DELAY
                        .saturating_mul(1 << (n_failures - 1).min(8))
                        .min(FETCH_RETRY_MAX_DELAY);
                    tracing::warn!(%queue, lane = lane.name(), %error, n_failures, ?delay, "failed to fetch tasks; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = self.abandon.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    match trellis_bus::task_consumer(&tasks, &queue, lane, MAX_ACK_PENDING).await {
                        Ok(fresh) => consumer = fresh,
                        Err(error) => {
                            tracing::warn!(%queue, lane = lane.name(), %error, "cannot open the queue's consumer; retrying");
                        }
                    }
                }
            }
        }
    }

    /// Dispatches the messages of one fetch and says how it ended. Once `shutdown` fires,
    /// messages still arriving are handed back.
    async fn drain_batch(
        self: &Arc<Self>,
        lane: Lane,
        mut batch: Batch,
        mut permits: Option<OwnedSemaphorePermit>,
        finished_tx: &mpsc::Sender<Finished>,
        shutdown: &CancellationToken,
    ) -> FetchEnd {
        let (mut n_messages, mut n_assignments, mut more) = (0, 0, true);
        loop {
            let next = tokio::select! {
                biased;
                _ = self.abandon.cancelled() => return FetchEnd::Drained { messages: n_messages, assignments: n_assignments, more },
                _ = shutdown.cancelled() => {
                    // Whatever the server already sent arrives within a moment; hand it back.
                    while let Ok(Some(Ok(message))) = tokio::time::timeout(Duration::from_millis(50), batch.next()).await {
                        let _ = message.ack_with(AckKind::Nak(None)).await;
                    }
                    return FetchEnd::Drained { messages: n_messages, assignments: n_assignments, more };
                }
                next = tokio::time::timeout(FETCH_STALL, batch.next()) => match next {
                    Ok(next) => next,
                    Err(_) => {
                        return FetchEnd::Failed(format!("no answer from the server within {FETCH_STALL:?}"));
                    }
                },
            };
            match next {
                None => {
                    return FetchEnd::Drained {
                        messages: n_messages,
                        assignments: n_assignments,
                        more,
                    };
                }
                Some(Err(error)) => return FetchEnd::Failed(error.to_string()),
                Some(Ok(message)) => {
                    n_messages += 1;
                    more = more_waiting(
                        message
                            .info()
                            .ok()
                            .map(|info| (info.pending, info.delivered)),
                    );
                    let Some((delivery, received)) = self.open(message).await else {
                        continue;
                    };
                    n_assignments += received.len();
                    // A batch's assignments take the fetch's free slots, then each waits for
                    // one in turn (the message is kept ours meanwhile).
                    for (i, received) in received.into_iter().enumerate() {
                        if self.inline && i > 0 && i % YIELD_EVERY == 0 {
                            tokio::task::yield_now().await;
                        }
                        let permit = match permits.as_mut().and_then(|permits| permits.split(1)) {
                            Some(permit) => permit,
                            None => match self.wait_for_slot(lane, &received.ack, shutdown).await {
                                Some(permit) => permit,
                                None => {
                                    publish::nak(received.ack).await;
                                    continue;
                                }
                            },
                        };
                        if let Some(attempt) = self
                            .dispatch(&delivery, received, permit, finished_tx)
                            .await
                        {
                            self.start(attempt).await;
                        }
                    }
                }
            }
        }
    }

    /// Takes one task message apart: an assignment alone, or the entries of a batch, each with
    /// its hold on the message. A message marked a batch that is none is terminated (`None`).
    async fn open(&self, message: jetstream::Message) -> Option<(Delivery, Vec<Received>)> {
        let delivered = message.info().map_or(1, |info| info.delivered);
        // How long the assignment waited in the queue: JetStream's timestamp of the message to
        // now (first deliveries only; a redelivery's wait includes the lost worker's run).
        let queued_seconds = message
            .info()
            .ok()
            .filter(|info| info.delivered == 1)
            .map(|info| {
                let published_ms = info.published.unix_timestamp_nanos() / 1_000_000;
                (i128::from(now_unix_ms()) - published_ms).max(0) as f64 / 1000.0
            });
        let progress_subject = message.message.reply.clone();
        let (message, acker) = message.split();
        let delivery = Delivery {
            subject: message.subject.clone(),
            delivered,
            queued_seconds,
            progress_subject,
        };
        let batch = message
            .headers
            .as_ref()
            .is_some_and(|headers| headers.get(subjects::ASSIGNMENT_BATCH_HEADER).is_some());
        if !batch {
            let received = Received {
                payload: message.payload,
                parent: propagation::extract_nats(message.headers.as_ref()),
                ack: TaskAck::alone(acker),
            };
            return Some((delivery, vec![received]));
        }
        let entries = match assignments::unpack_batch(&message.payload) {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(subject = %message.subject, %error, "set aside a task message marked a batch that is not a TaskAssignmentBatch");
                self.set_aside("corrupt");
                let _ = acker.ack_with(AckKind::Term).await;
                return None;
            }
        };
        let acks = TaskAck::shared(acker, entries.len());
        let received = entries
            .into_iter()
            .zip(acks)
            .map(|(entry, ack)| Received {
                payload: entry.assignment.into(),
                parent: propagation::from_traceparent(&entry.traceparent),
                ack,
            })
            .collect();
        Some((delivery, received))
    }
}

#[cfg(test)]
mod tests {
    use super::more_waiting;

    /// The last message waiting keeps the queue idle (the next pull is the long poll); messages
    /// behind it, a redelivery or a message that does not say make the next pull a fetch.
    #[test]
    fn only_the_last_message_waiting_keeps_the_queue_idle() {
        assert!(!more_waiting(Some((0, 1))), "none behind a first delivery");
        assert!(more_waiting(Some((3, 1))), "three behind it");
        assert!(
            more_waiting(Some((0, 2))),
            "a redelivery: others may follow"
        );
        assert!(more_waiting(None), "unknown: assume more");
    }
}
