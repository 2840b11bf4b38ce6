//! `ObserveExecution`'s stream: history read from memory (and from JetStream before what memory
//! holds), then the live batches.

use futures::Stream;
use tokio::sync::broadcast::error::RecvError;
use tonic::Status;
use trellis_core::ids::ExecutionId;
use trellis_proto::v1;

use crate::executor::Flushed;
use crate::turn;

/// Reads events `from..=until` of an execution's log from JetStream.
pub(super) async fn backfill(
    events: &async_nats::jetstream::stream::Stream,
    id: ExecutionId,
    from: u64,
    until: u64,
) -> Result<Vec<v1::Event>, Status> {
    use prost::Message as _;
    let last = crate::recovery::last_stream_seq(events, id)
        .await
        .map_err(|err| Status::unavailable(err.to_string()))?
        .unwrap_or(0);
    let mut older = Vec::new();
    for message in crate::recovery::read_log(events, id, 1, last, usize::MAX)
        .await
        .map_err(|err| Status::unavailable(err.to_string()))?
    {
        if message.first_seq > until {
            break;
        }
        let batch = v1::EventBatch::decode(message.payload)
            .map_err(|err| Status::data_loss(format!("event log of {id}: {err}")))?;
        older.extend(
            batch
                .events
                .into_iter()
                .filter(|e| e.sequence >= from && e.sequence <= until),
        );
    }
    Ok(older)
}

/// History first, then live batches; the stream ends once the execution is over.
pub(super) fn async_stream(
    observation: turn::Observation,
    mut live: tokio::sync::broadcast::Receiver<std::sync::Arc<Flushed>>,
) -> impl Stream<Item = Result<v1::ObserveExecutionResponse, Status>> {
    let turn::Observation {
        execution,
        history,
        terminal,
        ..
    } = observation;
    let last = history.last().map_or(0, |e| e.sequence);
    let mut last_sent = last;
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(async move {
        for event in history {
            if tx
                .send(Ok(v1::ObserveExecutionResponse {
                    event: Some(event),
                    progress: None,
                }))
                .await
                .is_err()
            {
                return;
            }
        }
        if terminal {
            return;
        }
        loop {
            match live.recv().await {
                Ok(flushed) => {
                    for item in &flushed.items {
                        if item.event.as_ref().is_some_and(|e| e.sequence <= last) {
                            continue;
                        }
                        if let Some(event) = &item.event {
                            last_sent = event.sequence;
                        }
                        if tx.send(Ok(item.clone())).await.is_err() {
                            return;
                        }
                    }
                    if flushed.terminal {
                        return;
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    let message = format!(
                        "observer fell {n} batches behind; observe again from the last sequence received"
                    );
                    let _ = tx.send(Err(Status::resource_exhausted(message))).await;
                    return;
                }
                Err(RecvError::Closed) => {
                    // The execution left this coordinator before it ended (its shard was handed
                    // over or lost, or the coordinator is stopping): the caller observes again,
                    // from where it is, and is forwarded to the new holder.
                    let message = format!(
                        "execution {} moved to another coordinator; observe again from sequence {}",
                        execution,
                        last_sent + 1
                    );
                    let _ = tx.send(Err(Status::unavailable(message))).await;
                    return;
                }
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
