//! The side effects of a turn, carried out once its appends are stored: task assignments (sent in
//! order, their acks awaited beside the loop and what was not stored published again), stop
//! messages and progress (core NATS),
//! observers, index deletes; then the result acknowledgements and the answers to writes; then
//! the background work the turn asked for.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture, context::PublishError};
use bytes::Bytes;
use futures::future::join_all;
use trellis_proto::{subjects, v1};
use trellis_telemetry::{hops, propagation};

use super::append::store_until;
use super::{Executor, Flushed};
use crate::shards;
use crate::turn::{Ack, Assign, Effects};

/// How long a result of an execution whose log does not replay waits before it is delivered
/// again: long enough not to churn, short enough that a repaired log soon gets it.
const HOLD_RESULTS: Duration = Duration::from_secs(30);

/// Task assignments published before their acks are awaited.
const PUBLISH_CHUNK: usize = 1000;

/// An assignment published, with what is needed to publish it again.
type Published = (
    String,
    HeaderMap,
    Bytes,
    Result<PublishAckFuture, PublishError>,
);

impl Executor {
    /// Carries out what a turn allows once its appends are stored, in order.
    pub(super) async fn carry_out(&mut self, effects: Effects) {
        let Effects {
            assignments,
            cancels,
            progress,
            breakers,
            observed,
            index_deletes,
            forget,
            acks,
            replies,
            checkpoints,
            handover,
            load,
            consume,
            fences,
            reserve,
            retired,
        } = effects;
        if !assignments.is_empty() {
            hops::mark_any(
                "coordinator.dispatched",
                assignments
                    .iter()
                    .flatten()
                    .map(|assign| assign.execution.0.as_u128()),
            );
        }
        for chunk in assignments.chunks(PUBLISH_CHUNK) {
            let mut published = Vec::with_capacity(chunk.len());
            for message in chunk {
                let Some(first) = message.first() else {
                    continue;
                };
                let subject = self.lanes.subject(&first.queue, first.fast);
                let (headers, payload) = task_message(message);
                if first.offer {
                    self.send_offer(super::offers::Offer::of(first, subject, headers, payload));
                    continue;
                }
                let publish = self
                    .js
                    .publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                    .await;
                published.push((subject, headers, payload, publish));
            }
            // Their acks are awaited beside the loop: the next turn need not wait a JetStream
            // round trip for them (the connection keeps their order, and the client's bound on
            // acks in flight holds the loop back when the server falls behind).
            tokio::spawn(await_assignments(
                self.js.clone(),
                self.shutdown.clone(),
                published,
            ));
        }
        for message in cancels.into_iter().chain(progress).chain(breakers) {
            let _ = self.nats.publish(message.subject, message.payload).await;
        }
        if !observed.is_empty() {
            hops::mark_any(
                "coordinator.observed",
                observed.iter().map(|observed| observed.id.0.as_u128()),
            );
        }
        for observed in observed {
            let Some(sender) = self.observers.get(&observed.id) else {
                continue;
            };
            if sender.receiver_count() > 0 {
                let mut items: Vec<v1::ObserveExecutionResponse> = observed
                    .events
                    .into_iter()
                    .map(|event| v1::ObserveExecutionResponse {
                        event: Some(event),
                        progress: None,
                    })
                    .collect();
                if let Some(last) = items.last_mut() {
                    last.progress = observed.progress;
                }
                let _ = sender.send(Arc::new(Flushed {
                    items,
                    terminal: observed.terminal,
                }));
            }
            if observed.terminal {
                self.observers.remove(&observed.id);
            }
        }
        // Finished executions leave the index once their last event is stored; a crash before
        // this only means the next owner loads them, sees them finished and removes them. The
        // deletes are queued on the connection here, so a later put of the same key (a new run)
        // follows them, but their acks are not waited for: a lost delete leaves only a key the
        // next owner removes.
        for key in index_deletes {
            match shards::queue_delete(&self.js, &key).await {
                Ok(ack) => {
                    tokio::spawn(async move {
                        if let Err(err) = ack.await {
                            tracing::debug!(%key, %err, "index delete not acknowledged");
                        }
                    });
                }
                Err(err) => tracing::debug!(%key, %err, "index delete not sent"),
            }
        }
        for id in forget {
            self.observers.remove(&id);
        }
        if !acks.is_empty() {
            crate::failpoints::reached(crate::failpoints::Point::BeforeAck);
        }
        self.acknowledge(acks).await;
        self.reply(replies);
        for job in checkpoints {
            self.spawn_checkpoint(job);
        }
        self.store_handover(handover).await;
        for id in load {
            self.spawn_load(id);
        }
        for shard in consume {
            self.spawn_consumer(shard);
        }
        for (id, epoch) in fences {
            self.spawn_fence(id, epoch);
        }
        if !reserve.is_empty() {
            self.spawn_reserve(reserve);
        }
        if !retired.is_empty() {
            // Freeing a large execution's state takes milliseconds the loop would spend, and
            // can wait while the cores are busy.
            crate::priority::spawn(move || drop(retired));
        }
    }

    /// Acknowledges consumed result messages whose results are all settled, or hands them back
    /// for a later delivery.
    async fn acknowledge(&mut self, acks: Vec<(crate::turn::Token, Ack)>) {
        let messages = self.consumed.settle(acks);
        let nats = &self.nats;
        join_all(messages.iter().map(|(message, ack)| {
            message.settle(
                nats,
                match ack {
                    Ack::Ack => None,
                    Ack::Later => Some(Duration::from_millis(200)),
                    Ack::Hold => Some(HOLD_RESULTS),
                },
            )
        }))
        .await;
    }
}

/// Awaits the acks of published task assignments; those not stored are published again until
/// they are (the message id makes that safe) or the coordinator stops. A crash before they are
/// stored loses nothing: the log records them dispatched, and the next owner inherits them as
/// running attempts no heartbeat names and dispatches them again.
async fn await_assignments(
    js: jetstream::Context,
    shutdown: tokio_util::sync::CancellationToken,
    published: Vec<Published>,
) {
    let mut acks = Vec::with_capacity(published.len());
    let mut again = Vec::new();
    for (subject, headers, payload, publish) in published {
        match publish {
            Ok(ack) => acks.push(((subject, headers, payload), ack.into_future())),
            Err(_) => again.push((subject, headers, payload)),
        }
    }
    let (meta, futures): (Vec<_>, Vec<_>) = acks.into_iter().unzip();
    for (meta, ack) in meta.into_iter().zip(join_all(futures).await) {
        if ack.is_err() {
            again.push(meta);
        }
    }
    for (subject, headers, payload) in again {
        tracing::warn!(%subject, "task assignment not stored; publishing it again");
        store_until(&js, &shutdown, subject, headers, payload).await;
    }
}

/// The headers and payload of one task message: an assignment alone, with its message id, or a
/// `TaskAssignmentBatch` of several, with a message id of its own (kept when it is published
/// again) and the batch header; each carries its `task.dispatch` span (when traces are
/// exported), of which the worker's run of the task is a child.
fn task_message(message: &[Assign]) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    if let [assign] = message {
        headers.insert(subjects::MSG_ID_HEADER, assign.msg_id.as_str());
        if let Some(context) = dispatch_context(assign) {
            propagation::inject_nats(&context, &mut headers);
        }
        return (headers, assign.payload.clone());
    }
    let entries = message
        .iter()
        .map(|assign| v1::task_assignment_batch::Entry {
            assignment: assign.payload.to_vec(),
            msg_id: assign.msg_id.clone(),
            traceparent: dispatch_context(assign)
                .and_then(|context| propagation::traceparent(&context))
                .unwrap_or_default(),
        })
        .collect();
    headers.insert(
        subjects::MSG_ID_HEADER,
        subjects::batch_msg_id(uuid::Uuid::now_v7()).as_str(),
    );
    headers.insert(
        subjects::ASSIGNMENT_BATCH_HEADER,
        message.len().to_string().as_str(),
    );
    (
        headers,
        Bytes::from(trellis_proto::assignments::pack(entries)),
    )
}

/// The context of an assignment's `task.dispatch` span, when traces are exported.
fn dispatch_context(assign: &Assign) -> Option<propagation::Context> {
    if !propagation::enabled() {
        return None;
    }
    let span = tracing::info_span!(
        "task.dispatch",
        otel.kind = "producer",
        execution_id = %assign.execution,
        task_instance_id = %assign.instance,
        attempt = assign.attempt,
        queue = assign.queue.as_str(),
        fast_lane = assign.fast,
    );
    propagation::set_parent(&span, assign.trace.clone());
    Some(propagation::context_of(&span))
}
