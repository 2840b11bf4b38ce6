//! `GetTaskLogs`: an execution's task log lines as `TRELLIS_LOGS` keeps them, read by an ordered
//! consumer filtered to the execution (or one instance), oldest first. With `follow`, the lines
//! written afterwards follow as workers publish them, until the caller hangs up or the execution
//! has ended and its last lines went out (a worker stores an attempt's last lines before its
//! result, so nothing of an ended execution is still on its way).
//!
//! The stream keeps lines for its retention only; the checkpoint-store keeps a copy
//! (`ListTaskLogs`). Once the stream has dropped anything (its first sequence is past 1), the
//! batches the store copied from below the first one the consumer delivers (below the stream's
//! end when it delivers none) are sent first: the two sources meet at a stream sequence, so no
//! batch comes twice and the order stays the stream's. A store that does not answer then ends
//! the call with UNAVAILABLE rather than a log with a silent hole; without a store configured,
//! only what the stream holds is read.

use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use prost::Message as _;
use tonic::Status;
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_proto::{subjects, v1};

use crate::checkpoints::StoreClient;

/// The `GetTaskLogs` stream.
pub(super) type LogStream =
    Pin<Box<dyn Stream<Item = Result<v1::GetTaskLogsResponse, Status>> + Send + 'static>>;

/// How often a follower asks whether the execution has ended, once it has sent every line so far.
const END_CHECK_EVERY: Duration = Duration::from_secs(1);

/// What to read.
pub(super) struct Wanted {
    pub(super) execution: ExecutionId,
    pub(super) instance: Option<TaskInstanceId>,
    /// 0: every attempt.
    pub(super) attempt: u32,
    pub(super) follow: bool,
}

/// Reads the instance filter of a request: empty for every instance.
pub(super) fn instance(value: &str) -> Result<Option<TaskInstanceId>, Status> {
    if value.is_empty() {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        Status::invalid_argument(format!(
            "task_instance_id: not a task instance id: {value:?}"
        ))
    })
}

/// Batches of the store's copy in one `ListTaskLogs` page.
const STORED_PAGE: u32 = 500;

/// Opens the stream of the lines `wanted` names. `ended` answers whether the execution is over
/// (asked only while following).
pub(super) async fn open(
    logs: &async_nats::jetstream::stream::Stream,
    store: Option<StoreClient>,
    wanted: Wanted,
    ended: impl Fn() -> BoxFuture<'static, bool> + Send + 'static,
) -> Result<LogStream, Status> {
    let filter_subject = match wanted.instance {
        Some(instance) => subjects::logs(wanted.execution, instance),
        None => subjects::execution_logs(wanted.execution),
    };
    let unavailable =
        |err: &dyn std::fmt::Display| Status::unavailable(format!("reading task logs: {err}"));
    // Taken before the consumer exists: every batch it delivers is at or past `end`.
    let mut earlier = match store {
        Some(store) => {
            let state = logs
                .get_info()
                .await
                .map_err(|err| unavailable(&err))?
                .state;
            (state.first_sequence > 1).then(|| Earlier {
                store,
                end: state.last_sequence + 1,
            })
        }
        None => None,
    };
    let mut consumer = logs
        .create_consumer(pull::OrderedConfig {
            filter_subject,
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|err| unavailable(&err))?;
    let pending = consumer
        .info()
        .await
        .map_err(|err| unavailable(&err))?
        .num_pending;
    let mut messages = consumer.messages().await.map_err(|err| unavailable(&err))?;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut caught_up = pending == 0;
        if caught_up && let Some(earlier) = earlier.take() {
            let end = earlier.end;
            if !earlier.send(&wanted, end, &tx).await {
                return;
            }
        }
        if caught_up && !wanted.follow {
            return;
        }
        let mut check = tokio::time::interval(END_CHECK_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ending = false;
        loop {
            tokio::select! {
                message = messages.next() => {
                    let message = match message {
                        Some(Ok(message)) => message,
                        Some(Err(err)) => {
                            let _ = tx.send(Err(unavailable(&err))).await;
                            return;
                        }
                        None => return,
                    };
                    let (left, sequence) = message
                        .info()
                        .map_or((0, 0), |info| (info.pending, info.stream_sequence));
                    if let Some(earlier) = earlier.take()
                        && !earlier.send(&wanted, sequence, &tx).await
                    {
                        return;
                    }
                    match v1::TaskLogBatch::decode(message.payload.clone()) {
                        Ok(batch) if wanted.attempt == 0 || batch.attempt == wanted.attempt => {
                            let response = v1::GetTaskLogsResponse { batch: Some(batch) };
                            if tx.send(Ok(response)).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(err) => tracing::warn!(
                            subject = %message.subject,
                            %err,
                            "a task log batch that does not decode was skipped"
                        ),
                    }
                    if left == 0 {
                        caught_up = true;
                        if !wanted.follow || ending {
                            return;
                        }
                    }
                }
                _ = check.tick(), if wanted.follow && caught_up => {
                    if ending {
                        // A whole interval after the end with nothing more: done.
                        return;
                    }
                    ending = ended().await;
                }
                () = tx.closed() => return,
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// The store's copy of what the stream may no longer hold.
struct Earlier {
    store: StoreClient,
    /// The stream's next sequence when the call began.
    end: u64,
}

impl Earlier {
    /// Sends the batches the store copied below stream sequence `before`, page by page; false
    /// when the call is over (the caller hung up, or the store failed and the call was ended with
    /// its error).
    async fn send(
        self,
        wanted: &Wanted,
        before: u64,
        tx: &tokio::sync::mpsc::Sender<Result<v1::GetTaskLogsResponse, Status>>,
    ) -> bool {
        let mut after = 0;
        loop {
            let page = self
                .store
                .task_logs(v1::ListTaskLogsRequest {
                    execution_id: wanted.execution.to_string(),
                    task_instance_id: wanted
                        .instance
                        .map(|instance| instance.to_string())
                        .unwrap_or_default(),
                    attempt: wanted.attempt,
                    after_sequence: after,
                    before_sequence: before,
                    limit: STORED_PAGE,
                })
                .await;
            let page = match page {
                Ok(page) => page,
                Err(status) => {
                    let status = Status::unavailable(format!(
                        "reading task logs: the log stream no longer holds the oldest lines, and \
                         the checkpoint-store, which keeps them, did not answer: {}",
                        status.message()
                    ));
                    let _ = tx.send(Err(status)).await;
                    return false;
                }
            };
            let full = page.batches.len() == STORED_PAGE as usize;
            for stored in page.batches {
                after = stored.stream_sequence;
                let response = v1::GetTaskLogsResponse {
                    batch: stored.batch,
                };
                if tx.send(Ok(response)).await.is_err() {
                    return false;
                }
            }
            if !full {
                return true;
            }
        }
    }
}
