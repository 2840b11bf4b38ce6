//! Recovery (docs/design.md §2): an execution is rebuilt from its latest checkpoint, when the
//! checkpoint-store has a good one, plus the events of its log after it, read back from
//! JetStream. Without a checkpoint (no store, store down, every checkpoint corrupt) the whole log
//! is replayed: slower, same state.

use std::sync::Arc;

use async_nats::jetstream::stream::{RawMessageErrorKind, Stream};
use bytes::Bytes;
use trellis_core::ids::ExecutionId;
use trellis_core::machine::Execution;
use trellis_proto::subjects;
use trellis_wire::log::{self, LogEntry, Started};

use crate::checkpoints::{Restored, StoreClient};

/// One message of an execution's log: an encoded `EventBatch` and where it sits in the stream.
#[derive(Clone, Debug)]
pub(crate) struct LogMessage {
    pub(crate) stream_seq: u64,
    pub(crate) first_seq: u64,
    pub(crate) payload: Bytes,
}

/// An execution rebuilt from its checkpoint and log, ready for the engine to adopt.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub(crate) machine: Execution,
    pub(crate) started: Started,
    /// The last event sequence applied.
    pub(crate) seq: u64,
    /// The stream sequence of the log's last message (the next append expects it).
    pub(crate) stream_seq: u64,
    /// The messages read after the checkpoint (all of them without one), for observers.
    pub(crate) log: Vec<LogMessage>,
    /// The checkpoint the state came from: its id, event sequence and the number of deltas on
    /// its full snapshot.
    pub(crate) checkpoint: Option<(String, u64, u32)>,
}

/// Why an execution could not be recovered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecoveryError {
    #[error("cannot read the log of {id}: {message}")]
    Read { id: ExecutionId, message: String },
    #[error("the log of {id} is malformed: {message}")]
    Malformed { id: ExecutionId, message: String },
}

/// Returns the stream sequence of the last message of an execution's log, or `None` when the log
/// is empty.
pub(crate) async fn last_stream_seq(
    events: &Stream,
    id: ExecutionId,
) -> Result<Option<u64>, RecoveryError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    match events
        .get_last_raw_message_by_subject(&subjects::events(id))
        .await
    {
        Ok(message) => Ok(Some(message.sequence)),
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(err) => Err(RecoveryError::Read {
            id,
            message: err.to_string(),
        }),
    }
}

/// Reads an execution's log messages with stream sequences in `from..=until`.
pub(crate) async fn read_log(
    events: &Stream,
    id: ExecutionId,
    from: u64,
    until: u64,
) -> Result<Vec<LogMessage>, RecoveryError> {
    let subject = subjects::events(id);
    let mut messages = Vec::new();
    let mut next = from.max(1);
    while next <= until {
        let message = match events
            .get_first_raw_message_by_subject(&subject, next)
            .await
        {
            Ok(message) => message,
            Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => break,
            Err(err) => {
                return Err(RecoveryError::Read {
                    id,
                    message: err.to_string(),
                });
            }
        };
        if message.sequence > until {
            break;
        }
        let first_seq =
            first_sequence(&message.payload).ok_or_else(|| RecoveryError::Malformed {
                id,
                message: format!("stream message {} is not an event batch", message.sequence),
            })?;
        next = message.sequence + 1;
        messages.push(LogMessage {
            stream_seq: message.sequence,
            first_seq,
            payload: message.payload,
        });
    }
    Ok(messages)
}

/// The sequence of a batch's first event, without decoding the rest.
fn first_sequence(payload: &[u8]) -> Option<u64> {
    use prost::Message as _;
    let batch = trellis_proto::v1::EventBatch::decode(payload).ok()?;
    batch.events.first().map(|event| event.sequence)
}

/// Rebuilds one execution. Returns `None` when its log is empty (it never started).
pub(crate) async fn recover(
    events: &Stream,
    store: Option<&StoreClient>,
    id: ExecutionId,
) -> Result<Option<Recovered>, RecoveryError> {
    let malformed = |message: String| RecoveryError::Malformed { id, message };
    let Some(last) = last_stream_seq(events, id).await? else {
        return Ok(None);
    };
    // Sequence 1, `ExecutionStarted`, holds the spec the plan is compiled from.
    let first = read_log(events, id, 1, last).await.map(|mut all| {
        all.truncate(1);
        all
    });
    let first = first?
        .pop()
        .ok_or_else(|| malformed("the log has no first message".to_owned()))?;
    let batch = log::decode_event_batch(&first.payload).map_err(|e| malformed(e.to_string()))?;
    let Some(LogEntry::Started(started)) = batch.entries.first().cloned() else {
        return Err(malformed("sequence 1 is not execution_started".to_owned()));
    };
    let plan = started.compile().map_err(|errors| {
        malformed(format!(
            "its plan no longer compiles: {}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ))
    })?;
    let plan = Arc::new(plan);

    // The latest good checkpoint, if the store has one; any failure means a full replay.
    let restored = match store {
        Some(store) => match store.restore(id, Arc::clone(&plan)).await {
            Ok(restored) => restored,
            Err(err) => {
                tracing::warn!(%id, %err, "no checkpoint used: replaying the whole log");
                None
            }
        },
        None => None,
    };
    let (mut machine, mut seq, from_stream, checkpoint) = match restored {
        Some(Restored {
            machine,
            sequence,
            stream_sequence,
            checkpoint_id,
            deltas,
        }) => {
            tracing::info!(%id, sequence, %checkpoint_id, "restored from checkpoint");
            let from = if stream_sequence == 0 {
                first.stream_seq
            } else {
                stream_sequence + 1
            };
            (
                machine,
                sequence,
                from,
                Some((checkpoint_id, sequence, deltas)),
            )
        }
        None => (
            Execution::start(id, plan, started.run_number.max(1), started.started_at_ms),
            1,
            first.stream_seq,
            None,
        ),
    };
    let log = read_log(events, id, from_stream, last).await?;
    for message in &log {
        let batch =
            log::decode_event_batch(&message.payload).map_err(|e| malformed(e.to_string()))?;
        for (offset, entry) in batch.entries.into_iter().enumerate() {
            let sequence = batch.first_sequence + offset as u64;
            if sequence <= seq {
                continue;
            }
            if sequence != seq + 1 {
                return Err(malformed(format!(
                    "sequence {sequence} follows {seq}: the log has a gap"
                )));
            }
            seq = sequence;
            match entry {
                LogEntry::Event(event) => {
                    if let Err(err) = machine.apply(&event) {
                        // Only applied events are logged; a refusal means the log and this build
                        // disagree. Keep going: the rest of the log still holds.
                        tracing::warn!(%id, sequence, %err, "logged event refused on replay");
                    }
                }
                LogEntry::Started(_) => {
                    return Err(malformed(format!(
                        "execution_started again at sequence {sequence}"
                    )));
                }
            }
        }
    }
    let stream_seq = log.last().map_or(last, |m| m.stream_seq).max(last);
    // Drain what replay touched: the read model is the store's business, not the coordinator's.
    let _ = machine.take_changed_records();
    Ok(Some(Recovered {
        machine,
        started,
        seq,
        stream_seq,
        log,
        checkpoint,
    }))
}
