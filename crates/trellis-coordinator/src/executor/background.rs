//! Work the executor runs beside its loop and reports back as inputs: recovering a shard's
//! executions, loading one execution, storing a checkpoint, writing the index entries of reserved
//! ids, consuming a shard's results, and receiving worker heartbeats.

use std::convert::Infallible;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use futures::future::join_all;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use trellis_core::ids::ExecutionId;
use trellis_proto::subjects;
use trellis_telemetry::{hops, propagation};

use super::append::{MAX_BACKOFF, put_index_entries, retry_until};
use super::intake::Taken;
use super::{Executor, Inbound};
use crate::checkpoints::StoreClient;
use crate::recovery;
use crate::shards;
use crate::turn::{CheckpointJob, Input, KEEP_FULL, Recoveries, Recovery};

impl Executor {
    /// Recovers a shard's unfinished executions from the index and their logs.
    pub(super) fn spawn_recover_shard(&self, shard: u32) {
        let events = self.streams.events.clone();
        let index = self.index.clone();
        let store = self.store.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let ids = loop {
                match shards::indexed(&index, shard).await {
                    Ok(ids) => break ids,
                    Err(err) => {
                        tracing::warn!(shard, %err, "cannot list the shard's executions; retrying");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            let mut found = Recoveries::default();
            for id in ids {
                found.add(id, recover_with_retry(&events, store.as_ref(), id).await);
            }
            tracing::info!(
                shard,
                executions = found.n_recovered(),
                ms = started.elapsed().as_millis() as u64,
                "shard recovered"
            );
            let _ = tx.send(Inbound::Input(found.shard_recovered(shard))).await;
        });
    }

    /// Lists the index of some shards again, in one pass over it.
    pub(super) fn spawn_scan(&self, scan: Vec<u32>) {
        let index = self.index.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            match shards::indexed_in(&index, &scan).await {
                Ok(by_shard) => {
                    for (shard, ids) in by_shard {
                        let input = Input::Indexed { shard, ids };
                        if tx.send(Inbound::Input(input)).await.is_err() {
                            return;
                        }
                    }
                }
                Err(err) => tracing::debug!(%err, "cannot list the index of the owned shards"),
            }
        });
    }

    /// Loads one execution from its checkpoint and log.
    pub(super) fn spawn_load(&self, id: ExecutionId) {
        let events = self.streams.events.clone();
        let store = self.store.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut found = Recoveries::default();
            found.add(id, recover_with_retry(&events, store.as_ref(), id).await);
            let _ = tx.send(Inbound::Input(found.loaded())).await;
        });
    }

    /// Writes an execution's fencing epoch to the fences bucket, trying again until it is
    /// stored, and reports it ([`Input::Fenced`]): until then the turn finds no inherited attempt
    /// lost.
    pub(super) fn spawn_fence(&self, id: ExecutionId, epoch: u64) {
        let fences = self.fences.clone();
        let tx = self.tx.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let key = id.to_string();
            retry_until(&shutdown, || {
                fences.put(key.as_str(), trellis_bus::encode_fence(epoch))
            })
            .await;
            if !shutdown.is_cancelled() {
                let _ = tx.send(Inbound::Input(Input::Fenced { id, epoch })).await;
            }
        });
    }

    /// Writes the index entries of reserved ids, trying each again until it is stored, and
    /// reports them ([`Input::Reserved`]): until then no start takes them.
    pub(super) fn spawn_reserve(&self, reserve: Vec<(String, ExecutionId)>) {
        let index = self.index.clone();
        let tx = self.tx.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let (keys, ids): (Vec<String>, Vec<ExecutionId>) = reserve.into_iter().unzip();
            put_index_entries(&index, &shutdown, &keys).await;
            if !shutdown.is_cancelled() {
                let _ = tx.send(Inbound::Input(Input::Reserved(ids))).await;
            }
        });
    }

    /// Hands a checkpoint to the checkpoint-store (checksum and RPC off the loop), prunes after
    /// a full one, and reports the answer.
    pub(super) fn spawn_checkpoint(&self, job: CheckpointJob) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let tx = self.tx.clone();
        let metrics = self.metrics.clone();
        let CheckpointJob {
            id,
            full,
            sequence,
            checkpoint,
            trace,
        } = job;
        let span = if propagation::enabled() {
            let span = tracing::info_span!("checkpoint.create", execution_id = %id, sequence, full);
            propagation::set_parent(&span, trace);
            span
        } else {
            tracing::Span::none()
        };
        let kind = if full { "full" } else { "delta" };
        let size = checkpoint.state.len() as f64;
        let work = async move {
            let started = std::time::Instant::now();
            let result = store.create(checkpoint).await;
            let labels = [("kind", kind.to_owned())];
            match &result {
                Ok(_) => {
                    metrics
                        .checkpoint_seconds
                        .get_or_create(&labels)
                        .observe(started.elapsed().as_secs_f64());
                    metrics
                        .checkpoint_bytes
                        .get_or_create(&labels)
                        .observe(size);
                }
                Err(_) => {
                    metrics.checkpoint_failures.inc();
                }
            }
            if full
                && result.is_ok()
                && let Err(err) = store.prune(id, KEEP_FULL).await
            {
                tracing::debug!(%id, %err, "pruning checkpoints failed");
            }
            let input = Input::CheckpointDone {
                id,
                full,
                sequence,
                result,
            };
            let _ = tx.send(Inbound::Input(input)).await;
        };
        tokio::spawn(work.instrument(span));
    }

    /// Stores the checkpoints of a shard being handed over, all at once, before its lease is
    /// released: the next owner recovers from them instead of replaying the log since the last
    /// interval's. A checkpoint the store does not take only makes that recovery longer.
    pub(super) async fn store_handover(&self, jobs: Vec<CheckpointJob>) {
        let Some(store) = self.store.as_ref() else {
            return;
        };
        if jobs.is_empty() {
            return;
        }
        let n = jobs.len();
        let stored = join_all(jobs.into_iter().map(|job| store.create(job.checkpoint))).await;
        let failed = stored.iter().filter(|result| result.is_err()).count();
        tracing::info!(checkpoints = n, failed, "handover checkpoints stored");
    }

    /// Starts consuming a shard's results: its results stream, and the results workers hand
    /// off directly.
    pub(super) fn spawn_consumer(&mut self, shard: u32) {
        let token = self.shutdown.child_token();
        if let Some(old) = self.consumers.insert(shard, token.clone()) {
            old.cancel();
        }
        tokio::spawn(receive_handoffs(
            self.nats.clone(),
            shard,
            self.tx.clone(),
            token.clone(),
        ));
        tokio::spawn(consume_results(
            self.streams.results.clone(),
            shard,
            self.tx.clone(),
            token,
        ));
    }
}

/// Recovers one execution, retrying while NATS cannot be read.
async fn recover_with_retry(
    events: &jetstream::stream::Stream,
    store: Option<&StoreClient>,
    id: ExecutionId,
) -> Recovery {
    let mut backoff = Duration::from_millis(100);
    loop {
        match recovery::recover(events, store, id).await {
            Ok(recovery) => return recovery,
            Err(err) => {
                tracing::warn!(%id, %err, "recovery read failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Pulls the results of one shard in batches and hands them to the executor, until `stop`. The
/// durable consumer is created afresh when the shard is taken over (and after NATS errors), so
/// results the previous owner took but never acknowledged are delivered again at once rather
/// than after the ack wait.
async fn consume_results(
    results: jetstream::stream::Stream,
    shard: u32,
    tx: mpsc::Sender<Inbound>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if stop.is_cancelled() {
            return;
        }
        let _ = results
            .delete_consumer(&format!("coordinator-{shard}"))
            .await;
        let messages = match trellis_bus::results_consumer(&results, shard).await {
            Ok(consumer) => consumer
                .stream()
                .max_messages_per_batch(1000)
                .messages()
                .await
                .map_err(|err| err.to_string()),
            Err(err) => Err(err.to_string()),
        };
        let messages = match messages {
            Ok(messages) => messages,
            Err(err) => {
                tracing::warn!(shard, %err, "cannot consume task results; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let mut messages = messages.map(|item| item.map(Taken::Stream));
        loop {
            let first = tokio::select! {
                () = stop.cancelled() => return,
                next = messages.next() => next,
            };
            let Some(first) = first else { break };
            match forward(first, &mut messages, &tx).await {
                Forwarded::Taken => {}
                Forwarded::Failed(err) => {
                    tracing::warn!(shard, %err, "results consumer failed; starting it again");
                    break;
                }
                Forwarded::Gone => return,
            }
        }
    }
}

/// What became of a handful of result messages.
enum Forwarded<E> {
    /// Handed to the executor.
    Taken,
    /// Those before the source's error were handed to the executor; the source failed.
    Failed(E),
    /// The executor is gone.
    Gone,
}

/// Hands `first` and whatever else `source` has buffered (taken without waiting, up to a
/// turn's worth of results) to the executor as one input.
async fn forward<E>(
    first: Result<Taken, E>,
    source: &mut (impl futures::Stream<Item = Result<Taken, E>> + Unpin),
    tx: &mpsc::Sender<Inbound>,
) -> Forwarded<E> {
    let mut batch = Vec::with_capacity(64);
    let mut n_results = 0;
    let mut failed = None;
    let mut next = Some(first);
    while let Some(item) = next.take() {
        match item {
            Ok(message) => {
                n_results += super::intake::batch_len(&message).unwrap_or(1);
                batch.push(message);
            }
            Err(err) => {
                failed = Some(err);
                break;
            }
        }
        if n_results >= MAX_RESULTS_TAKEN {
            break;
        }
        next = futures::FutureExt::now_or_never(source.next()).flatten();
    }
    hops::mark_any(
        "coordinator.consumed",
        batch.iter().flat_map(super::intake::message_executions),
    );
    if !batch.is_empty() && tx.send(Inbound::Results(batch)).await.is_err() {
        return Forwarded::Gone;
    }
    failed.map_or(Forwarded::Taken, Forwarded::Failed)
}

/// Most results handed to the executor at once (a turn takes several such handfuls at most).
const MAX_RESULTS_TAKEN: usize = 2000;

/// Hands the results workers hand off for `shard` (core NATS requests on
/// `trellis.handoff.<shard>`, in the coordinators' queue group) to the executor, until `stop`.
///
/// A hand-off skips the results stream: one message from the worker instead of a stored write,
/// its consumer's delivery and its ack. The worker keeps the results, and its task messages
/// unacknowledged, until the reply says their events are stored; without that reply (this
/// coordinator lost the shard, stopped or crashed, or the subscription's buffer overflowed) it
/// publishes them to the stream, so nothing depends on the hand-off arriving. Stopping
/// unsubscribes: hand-offs then find no responder and go to the stream at once.
async fn receive_handoffs(
    nats: async_nats::Client,
    shard: u32,
    tx: mpsc::Sender<Inbound>,
    stop: CancellationToken,
) {
    let subject = subjects::handoff(shard);
    let mut backoff = Duration::from_millis(50);
    let subscription = loop {
        match nats
            .queue_subscribe(subject.clone(), subjects::HANDOFF_QUEUE_GROUP.to_owned())
            .await
        {
            Ok(subscription) => break subscription,
            Err(err) => {
                tracing::warn!(shard, %err, "cannot hear result hand-offs; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    };
    let mut handoffs = subscription.map(|message| Ok::<_, Infallible>(Taken::Handoff(message)));
    loop {
        let first = tokio::select! {
            () = stop.cancelled() => return,
            next = handoffs.next() => next,
        };
        let Some(first) = first else { return };
        if let Forwarded::Gone = forward(first, &mut handoffs, &tx).await {
            return;
        }
    }
}

/// Hands worker heartbeats (core NATS) to the executor until `stop`.
pub(crate) async fn receive_heartbeats(
    nats: &async_nats::Client,
    tx: mpsc::Sender<Inbound>,
    stop: CancellationToken,
) -> Result<(), crate::Error> {
    let mut subscription = nats
        .subscribe(subjects::HEARTBEAT_WILDCARD)
        .await
        .map_err(|e| crate::Error::Subscribe {
            subject: subjects::HEARTBEAT_WILDCARD.to_owned(),
            message: e.to_string(),
        })?;
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => return,
                message = subscription.next() => message,
            };
            let Some(message) = message else { return };
            if tx.send(Inbound::Heartbeat(message.payload)).await.is_err() {
                return;
            }
        }
    });
    Ok(())
}
