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
///
/// The stream reads the execution's channel itself, with no task between them: each batch
/// reaches the caller one hop after the loop sends it.
pub(super) fn async_stream(
    observation: turn::Observation,
    live: tokio::sync::broadcast::Receiver<std::sync::Arc<Flushed>>,
) -> impl Stream<Item = Result<v1::ObserveExecutionResponse, Status>> {
    use futures::StreamExt as _;
    let turn::Observation {
        execution,
        history,
        terminal,
        progress,
        ..
    } = observation;
    let last = history.last().map_or(0, |e| e.sequence);
    let mut items: Vec<_> = history
        .into_iter()
        .map(|event| v1::ObserveExecutionResponse {
            event: Some(event),
            progress: None,
        })
        .collect();
    // A finished execution's last event carries its final progress, as the live stream's last
    // batch does.
    if let Some(item) = items.last_mut() {
        item.progress = progress;
    }
    let history = futures::stream::iter(items.into_iter().map(Ok));
    let following = Following {
        execution,
        live,
        last_sent: last,
        ready: std::collections::VecDeque::new(),
        over: terminal,
    };
    history.chain(futures::stream::unfold(following, Following::next))
}

/// The live part of an observation: the batches the loop sends after the history.
struct Following {
    execution: ExecutionId,
    live: tokio::sync::broadcast::Receiver<std::sync::Arc<Flushed>>,
    /// The last sequence sent, the history's at first: live batches repeat what it holds, and
    /// their sequences only grow.
    last_sent: u64,
    /// Items of the last batch not yet yielded.
    ready: std::collections::VecDeque<v1::ObserveExecutionResponse>,
    /// The execution ended, or the stream failed: what is ready is the rest.
    over: bool,
}

impl Following {
    async fn next(mut self) -> Option<(Result<v1::ObserveExecutionResponse, Status>, Self)> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some((Ok(item), self));
            }
            if self.over {
                return None;
            }
            match self.live.recv().await {
                Ok(flushed) => {
                    for item in &flushed.items {
                        if item
                            .event
                            .as_ref()
                            .is_some_and(|e| e.sequence <= self.last_sent)
                        {
                            continue;
                        }
                        if let Some(event) = &item.event {
                            self.last_sent = event.sequence;
                        }
                        self.ready.push_back(item.clone());
                    }
                    self.over = flushed.terminal;
                }
                Err(RecvError::Lagged(n)) => {
                    self.over = true;
                    let message = format!(
                        "observer fell {n} batches behind; observe again from the last sequence received"
                    );
                    return Some((Err(Status::resource_exhausted(message)), self));
                }
                Err(RecvError::Closed) => {
                    // The execution left this coordinator before it ended (its shard was handed
                    // over or lost, or the coordinator is stopping): the caller observes again,
                    // from where it is, and is forwarded to the new holder.
                    self.over = true;
                    let message = format!(
                        "execution {} moved to another coordinator; observe again from sequence {}",
                        self.execution,
                        self.last_sent + 1
                    );
                    return Some((Err(Status::unavailable(message)), self));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::StreamExt as _;
    use tokio::sync::broadcast;

    use super::*;

    fn event(sequence: u64) -> v1::Event {
        v1::Event {
            sequence,
            ..Default::default()
        }
    }

    fn flushed(sequences: &[u64], terminal: bool) -> Arc<Flushed> {
        Arc::new(Flushed {
            items: sequences
                .iter()
                .map(|&sequence| v1::ObserveExecutionResponse {
                    event: Some(event(sequence)),
                    progress: None,
                })
                .collect(),
            terminal,
        })
    }

    fn observation(history: &[u64], terminal: bool) -> turn::Observation {
        turn::Observation {
            execution: ExecutionId(uuid::Uuid::nil()),
            backfill: None,
            history: history.iter().map(|&sequence| event(sequence)).collect(),
            terminal,
            progress: terminal.then(|| v1::Progress {
                state: v1::ExecutionState::Completed as i32,
                sequence: history.last().copied().unwrap_or(0),
                ..Default::default()
            }),
        }
    }

    /// The sequences a stream yields until it ends, and the message of the error it ends with.
    async fn read(
        stream: impl Stream<Item = Result<v1::ObserveExecutionResponse, Status>>,
    ) -> (Vec<u64>, Option<String>) {
        let mut stream = std::pin::pin!(stream);
        let mut sequences = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(item) => sequences.extend(item.event.map(|e| e.sequence)),
                Err(status) => return (sequences, Some(status.message().to_owned())),
            }
        }
        (sequences, None)
    }

    /// History, then the live batches without what the history held, up to the terminal one.
    #[tokio::test]
    async fn history_then_live_batches_until_the_end() {
        let (tx, rx) = broadcast::channel(8);
        tx.send(flushed(&[2, 3], false)).expect("a receiver");
        tx.send(flushed(&[4], true)).expect("a receiver");
        tx.send(flushed(&[5], false)).expect("a receiver");
        let (sequences, error) = read(async_stream(observation(&[1, 2], false), rx)).await;
        assert_eq!(sequences, [1, 2, 3, 4]);
        assert_eq!(error, None);
    }

    /// A finished execution's history is the whole stream.
    #[tokio::test]
    async fn a_finished_execution_ends_with_its_history() {
        let (tx, rx) = broadcast::channel(8);
        tx.send(flushed(&[3], false)).expect("a receiver");
        let (sequences, error) = read(async_stream(observation(&[1, 2], true), rx)).await;
        assert_eq!(sequences, [1, 2]);
        assert_eq!(error, None);
    }

    /// A finished execution's last event carries its final progress, and no other event does.
    #[tokio::test]
    async fn a_finished_execution_s_last_event_says_how_it_ended() {
        let (_tx, rx) = broadcast::channel(8);
        let items: Vec<_> = async_stream(observation(&[1, 2, 3], true), rx)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("no error");
        let carried: Vec<(u64, Option<i32>)> = items
            .iter()
            .map(|item| {
                (
                    item.event.as_ref().map_or(0, |e| e.sequence),
                    item.progress.as_ref().map(|p| p.state),
                )
            })
            .collect();
        let completed = Some(v1::ExecutionState::Completed as i32);
        assert_eq!(carried, [(1, None), (2, None), (3, completed)]);
    }

    /// A channel closed before the end says where to observe again from.
    #[tokio::test]
    async fn a_closed_channel_says_where_to_observe_again_from() {
        let (tx, rx) = broadcast::channel(8);
        tx.send(flushed(&[2, 3], false)).expect("a receiver");
        drop(tx);
        let (sequences, error) = read(async_stream(observation(&[1], false), rx)).await;
        assert_eq!(sequences, [1, 2, 3]);
        let error = error.expect("an error");
        assert!(error.contains("observe again from sequence 4"), "{error}");
    }

    /// An observer that fell behind the channel is told so, and the stream ends.
    #[tokio::test]
    async fn an_observer_behind_the_channel_is_told_to_observe_again() {
        let (tx, rx) = broadcast::channel(1);
        tx.send(flushed(&[2], false)).expect("a receiver");
        tx.send(flushed(&[3], false)).expect("a receiver");
        let (sequences, error) = read(async_stream(observation(&[1], false), rx)).await;
        assert_eq!(sequences, [1]);
        let error = error.expect("an error");
        assert!(error.contains("fell 1 batches behind"), "{error}");
    }
}
