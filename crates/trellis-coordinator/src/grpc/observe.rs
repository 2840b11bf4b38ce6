//! `ObserveExecution`'s stream: history read from memory (and from JetStream before what memory
//! holds), then the live batches.

use futures::Stream;
use tokio::sync::broadcast::error::RecvError;
use tonic::Status;
use trellis_core::ids::ExecutionId;
use trellis_proto::v1;

use trellis_grpc::access::Scope;

use super::{CoordinatorService, EventStream, status};
use crate::executor::Flushed;
use crate::turn::{self, Action};

impl CoordinatorService {
    /// Opens an observer's stream of execution `id` here, from event `from` (or its progress
    /// alone): its history, older events read from JetStream, then the live batches.
    pub(super) async fn observation(
        &self,
        scope: Scope,
        id: ExecutionId,
        from: u64,
        progress_only: bool,
    ) -> Result<EventStream, Status> {
        let (observation, live) = self
            .executor
            .observe(turn::Request::On {
                id,
                scope,
                action: Action::Observe {
                    from,
                    progress_only,
                },
            })
            .await
            .map_err(status)?;
        self.open(observation, live).await
    }

    /// An observer's stream from the turn's `observation` and the execution's `live` channel.
    pub(super) async fn open(
        &self,
        mut observation: turn::Observation,
        live: tokio::sync::broadcast::Receiver<std::sync::Arc<Flushed>>,
    ) -> Result<EventStream, Status> {
        let mut older = Vec::new();
        if let Some((from, until)) = observation.backfill.take() {
            // The coordinator holds the log after its checkpoint only; older events come from
            // JetStream.
            older = backfill(&self.events, observation.execution, from, until).await?;
        }
        Ok(Box::pin(async_stream(observation, older, live)))
    }
}

/// Reads events `from..=until` of an execution's log from JetStream.
async fn backfill(
    events: &async_nats::jetstream::stream::Stream,
    id: ExecutionId,
    from: u64,
    until: u64,
) -> Result<Vec<v1::Event>, Status> {
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
        let batch = turn::History::decode(from, message.payload)
            .map_err(|err| Status::data_loss(format!("event log of {id}: {err}")))?;
        older.extend(batch.into_iter().filter(|e| e.sequence <= until));
    }
    Ok(older)
}

/// `older` (events read from JetStream, before what memory holds), then the history, then live
/// batches; the stream ends once the execution is over.
///
/// The history's batches are decoded here, one at a time as the caller takes them, not in the
/// coordinator's turn. The stream reads the execution's channel itself, with no task between
/// them: each live batch reaches the caller one hop after the loop sends it.
fn async_stream(
    observation: turn::Observation,
    older: Vec<v1::Event>,
    live: tokio::sync::broadcast::Receiver<std::sync::Arc<Flushed>>,
) -> impl Stream<Item = Result<v1::ObserveExecutionResponse, Status>> {
    let turn::Observation {
        execution,
        history,
        terminal,
        progress,
        progress_only,
        ..
    } = observation;
    let (from, batches) = history.into_batches();
    let mut following = Following {
        execution,
        live,
        from,
        batches,
        last_sent: 0,
        ready: std::collections::VecDeque::new(),
        progress: None,
        progress_only,
        over: terminal,
    };
    if progress_only {
        following.ready.extend(progress.map(progress_item));
    } else {
        following.progress = progress.filter(|_| terminal);
        following.queue(older);
    }
    futures::stream::unfold(following, Following::next)
}

/// A progress-only observer's item: the snapshot, no event.
fn progress_item(progress: v1::Progress) -> v1::ObserveExecutionResponse {
    v1::ObserveExecutionResponse {
        event: None,
        progress: Some(progress),
    }
}

/// What an observation has left to send: the history's batches not yet decoded, then the live
/// batches the loop sends.
struct Following {
    execution: ExecutionId,
    live: tokio::sync::broadcast::Receiver<std::sync::Arc<Flushed>>,
    /// The first sequence the history's batches are read from.
    from: u64,
    /// The history's batches not yet decoded.
    batches: std::vec::IntoIter<bytes::Bytes>,
    /// The last sequence queued: live batches repeat what the history held, and their
    /// sequences only grow.
    last_sent: u64,
    /// Items decoded or received and not yet yielded.
    ready: std::collections::VecDeque<v1::ObserveExecutionResponse>,
    /// A finished execution's final progress, sent with the history's last event.
    progress: Option<v1::Progress>,
    /// Progress alone: of each live batch, its snapshot without the events.
    progress_only: bool,
    /// The execution ended, or the stream failed: once the history is sent, what is ready is
    /// the rest.
    over: bool,
}

impl Following {
    /// Queues the events after the last one queued, in order; once the history's last batch is
    /// queued, the last event carries a finished execution's final progress.
    fn queue(&mut self, events: Vec<v1::Event>) {
        for event in events {
            if event.sequence <= self.last_sent {
                continue;
            }
            self.last_sent = event.sequence;
            self.ready.push_back(v1::ObserveExecutionResponse {
                event: Some(event),
                progress: None,
            });
        }
        if self.batches.len() == 0
            && let Some(last) = self.ready.back_mut()
            && let Some(progress) = self.progress.take()
        {
            last.progress = Some(progress);
        }
    }

    async fn next(mut self) -> Option<(Result<v1::ObserveExecutionResponse, Status>, Self)> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some((Ok(item), self));
            }
            if let Some(batch) = self.batches.next() {
                match turn::History::decode(self.from, batch) {
                    Ok(events) => self.queue(events),
                    Err(err) => {
                        // The bytes were encoded by this process; failing to decode them is a bug.
                        self.over = true;
                        self.batches = Vec::new().into_iter();
                        let message =
                            format!("event log of {} held in memory: {err}", self.execution);
                        return Some((Err(Status::internal(message)), self));
                    }
                }
                continue;
            }
            if self.over {
                return None;
            }
            match self.live.recv().await {
                Ok(flushed) if self.progress_only => {
                    // A batch carries its snapshot, if one went out with it, on its last item.
                    let snapshot = flushed.items.last().and_then(|item| item.progress.clone());
                    self.ready.extend(snapshot.map(progress_item));
                    self.over = flushed.terminal;
                }
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
                // Snapshots missed are older than the ones to come, and the end is the last
                // batch sent: a progress-only observer loses nothing by going on.
                Err(RecvError::Lagged(_)) if self.progress_only => {}
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

    /// An encoded `EventBatch` of events of these sequences.
    fn batch(sequences: &[u64]) -> bytes::Bytes {
        use prost::Message as _;
        v1::EventBatch {
            events: sequences.iter().map(|&sequence| event(sequence)).collect(),
        }
        .encode_to_vec()
        .into()
    }

    /// The observation from sequence `from` of a log held as these batches.
    fn observation_of(batches: &[&[u64]], from: u64, terminal: bool) -> turn::Observation {
        let last = batches.iter().flat_map(|b| b.iter()).copied().max();
        turn::Observation {
            execution: ExecutionId(uuid::Uuid::nil()),
            backfill: None,
            history: turn::History::new(from, batches.iter().map(|b| batch(b)).collect()),
            terminal,
            progress: terminal.then(|| v1::Progress {
                state: v1::ExecutionState::Completed as i32,
                sequence: last.unwrap_or(0),
                ..Default::default()
            }),
            progress_only: false,
        }
    }

    /// A progress-only observation of an execution at `sequence`, as the turn answers it.
    fn progress_only(sequence: u64, terminal: bool) -> turn::Observation {
        turn::Observation {
            execution: ExecutionId(uuid::Uuid::nil()),
            backfill: None,
            history: turn::History::default(),
            terminal,
            progress: Some(snapshot(sequence, terminal)),
            progress_only: true,
        }
    }

    fn snapshot(sequence: u64, terminal: bool) -> v1::Progress {
        let state = if terminal {
            v1::ExecutionState::Completed
        } else {
            v1::ExecutionState::Running
        };
        v1::Progress {
            state: state as i32,
            sequence,
            ..Default::default()
        }
    }

    /// A live batch of these sequences whose last event carries a snapshot.
    fn flushed_with_snapshot(sequences: &[u64], terminal: bool) -> Arc<Flushed> {
        let mut items = flushed(sequences, terminal).items.clone();
        if let Some(last) = items.last_mut() {
            last.progress = Some(snapshot(
                last.event.as_ref().map_or(0, |e| e.sequence),
                terminal,
            ));
        }
        Arc::new(Flushed { items, terminal })
    }

    /// Each item of a stream that ends without error: the sequence of its event (0: none) and
    /// of its progress (0: none).
    async fn items(
        stream: impl Stream<Item = Result<v1::ObserveExecutionResponse, Status>>,
    ) -> Vec<(u64, u64)> {
        stream
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .map(|item| {
                let item = item.expect("no error");
                (
                    item.event.map_or(0, |e| e.sequence),
                    item.progress.map_or(0, |p| p.sequence),
                )
            })
            .collect()
    }

    /// Progress only: the snapshot now, then the live batches' snapshots without their events
    /// (a batch without one sends nothing), up to the end's.
    #[tokio::test]
    async fn a_progress_only_observer_gets_the_snapshots_alone() {
        let (tx, rx) = broadcast::channel(8);
        tx.send(flushed_with_snapshot(&[3, 4], false))
            .expect("a receiver");
        tx.send(flushed(&[5], false)).expect("a receiver");
        tx.send(flushed_with_snapshot(&[6, 7], true))
            .expect("a receiver");
        tx.send(flushed_with_snapshot(&[8], false))
            .expect("a receiver");
        let sent = items(async_stream(progress_only(2, false), Vec::new(), rx)).await;
        assert_eq!(sent, [(0, 2), (0, 4), (0, 7)]);
    }

    /// A finished execution observed for its progress is one item, its end.
    #[tokio::test]
    async fn a_finished_execution_s_progress_is_one_item() {
        let (tx, rx) = broadcast::channel(8);
        tx.send(flushed_with_snapshot(&[9], false))
            .expect("a receiver");
        let sent = items(async_stream(progress_only(8, true), Vec::new(), rx)).await;
        assert_eq!(sent, [(0, 8)]);
    }

    /// A progress-only observer behind the channel goes on: what it missed is older than what
    /// follows, and the end still comes.
    #[tokio::test]
    async fn a_progress_only_observer_behind_the_channel_goes_on_to_the_end() {
        let (tx, rx) = broadcast::channel(1);
        tx.send(flushed_with_snapshot(&[2], false))
            .expect("a receiver");
        tx.send(flushed_with_snapshot(&[3], true))
            .expect("a receiver");
        let sent = items(async_stream(progress_only(1, false), Vec::new(), rx)).await;
        assert_eq!(sent, [(0, 1), (0, 3)]);
    }

    /// The observation of a log of one batch per sequence, from its start.
    fn observation(history: &[u64], terminal: bool) -> turn::Observation {
        let batches: Vec<&[u64]> = history.iter().map(std::slice::from_ref).collect();
        observation_of(&batches, 1, terminal)
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
        let (sequences, error) =
            read(async_stream(observation(&[1, 2], false), Vec::new(), rx)).await;
        assert_eq!(sequences, [1, 2, 3, 4]);
        assert_eq!(error, None);
    }

    /// A finished execution's history is the whole stream.
    #[tokio::test]
    async fn a_finished_execution_ends_with_its_history() {
        let (tx, rx) = broadcast::channel(8);
        tx.send(flushed(&[3], false)).expect("a receiver");
        let (sequences, error) =
            read(async_stream(observation(&[1, 2], true), Vec::new(), rx)).await;
        assert_eq!(sequences, [1, 2]);
        assert_eq!(error, None);
    }

    /// A finished execution's last event carries its final progress, and no other event does.
    #[tokio::test]
    async fn a_finished_execution_s_last_event_says_how_it_ended() {
        let (_tx, rx) = broadcast::channel(8);
        let items: Vec<_> = async_stream(observation(&[1, 2, 3], true), Vec::new(), rx)
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
        let (sequences, error) = read(async_stream(observation(&[1], false), Vec::new(), rx)).await;
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
        let (sequences, error) = read(async_stream(observation(&[1], false), Vec::new(), rx)).await;
        assert_eq!(sequences, [1]);
        let error = error.expect("an error");
        assert!(error.contains("fell 1 batches behind"), "{error}");
    }

    /// The history is read from `from` on, though its first batch begins before it.
    #[tokio::test]
    async fn the_history_starts_at_the_sequence_asked_for_inside_a_batch() {
        let (_tx, rx) = broadcast::channel(8);
        let observation = observation_of(&[&[1, 2, 3], &[4, 5]], 2, true);
        let (sequences, error) = read(async_stream(observation, Vec::new(), rx)).await;
        assert_eq!(sequences, [2, 3, 4, 5]);
        assert_eq!(error, None);
    }

    /// Events read from JetStream come first; the last of the history, not of them, carries
    /// the final progress.
    #[tokio::test]
    async fn older_events_come_before_the_history() {
        let (_tx, rx) = broadcast::channel(8);
        let observation = observation_of(&[&[3, 4], &[5]], 3, true);
        let items: Vec<_> = async_stream(observation, vec![event(1), event(2)], rx)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .expect("no error");
        let carried: Vec<(u64, bool)> = items
            .iter()
            .map(|item| {
                (
                    item.event.as_ref().map_or(0, |e| e.sequence),
                    item.progress.is_some(),
                )
            })
            .collect();
        assert_eq!(
            carried,
            [(1, false), (2, false), (3, false), (4, false), (5, true)]
        );
    }

    /// A batch of the history that does not decode ends the stream with an error after what
    /// came before it.
    #[tokio::test]
    async fn a_batch_that_does_not_decode_ends_the_stream() {
        let (_tx, rx) = broadcast::channel(8);
        let mut observation = observation_of(&[&[1, 2]], 1, false);
        let (from, batches) = observation.history.into_batches();
        let mut batches: Vec<bytes::Bytes> = batches.collect();
        batches.push(bytes::Bytes::from_static(b"\xff\xff\xff"));
        observation.history = turn::History::new(from, batches);
        let (sequences, error) = read(async_stream(observation, Vec::new(), rx)).await;
        assert_eq!(sequences, [1, 2]);
        let error = error.expect("an error");
        assert!(error.contains("held in memory"), "{error}");
    }
}
