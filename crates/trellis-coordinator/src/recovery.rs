//! Recovery (docs/design.md §2): an execution is rebuilt from its latest checkpoint, when the
//! checkpoint-store has a good one, plus the events of its log after it, read back from
//! JetStream. Without a checkpoint (no store, store down, every checkpoint corrupt) the whole log
//! is replayed: slower, same state.
//!
//! Reading is async ([`recover`]); what is done with what was read is pure ([`started_of`],
//! [`replay`]), so the simulation rebuilds executions exactly as a coordinator does.

use std::sync::Arc;

use async_nats::jetstream::stream::{RawMessageErrorKind, Stream};
use trellis_core::ids::ExecutionId;
use trellis_core::plan::Plan;
use trellis_proto::subjects;
use trellis_wire::log::Started;
use trellis_wire::replay::{self, ReplayError, Replayer};

use crate::checkpoints::{Restored, StoreClient};
use crate::turn::{LogMessage, Recovered};

/// Why an execution could not be recovered.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("cannot read the log of {id}: {message}")]
    Read { id: ExecutionId, message: String },
    #[error("the log of {id} is malformed: {message}")]
    Malformed { id: ExecutionId, message: String },
    /// The log does not replay (the error names the execution and the sequence).
    #[error(transparent)]
    Replay(#[from] ReplayError),
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

/// Reads an execution's log messages with stream sequences in `from..=until`, at most `limit`.
pub(crate) async fn read_log(
    events: &Stream,
    id: ExecutionId,
    from: u64,
    until: u64,
    limit: usize,
) -> Result<Vec<LogMessage>, RecoveryError> {
    let subject = subjects::events(id);
    let mut messages = Vec::new();
    let mut next = from.max(1);
    while next <= until && messages.len() < limit {
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
    let Some(last) = last_stream_seq(events, id).await? else {
        return Ok(None);
    };
    let first = read_log(events, id, 1, last, 1)
        .await?
        .pop()
        .ok_or_else(|| RecoveryError::Malformed {
            id,
            message: "the log has no first message".to_owned(),
        })?;
    let (started, plan) = started_of(id, &first)?;
    // The latest good checkpoint, if the store has one; any failure means a full replay.
    let restored = match store {
        Some(store) => match store.restore(id, &started, Arc::clone(&plan)).await {
            Ok(restored) => restored,
            Err(err) => {
                tracing::warn!(%id, %err, "no checkpoint used: replaying the whole log");
                None
            }
        },
        None => None,
    };
    let from = match &restored {
        Some(restored) if restored.stream_sequence > 0 => restored.stream_sequence + 1,
        _ => first.stream_seq,
    };
    let log = read_log(events, id, from, last, usize::MAX).await?;
    replay(id, started, plan, restored, log, last).map(Some)
}

/// Decodes the first message of a log: `ExecutionStarted` and the plan it records (decoded, not
/// compiled again).
pub fn started_of(
    id: ExecutionId,
    first: &LogMessage,
) -> Result<(Started, Arc<Plan>), RecoveryError> {
    Ok(replay::started_of(id, &first.payload)?)
}

/// Applies the log messages after the checkpoint (all of them without one) to the checkpoint's
/// state (a fresh execution without one) through the one replayer; `last` is the stream
/// sequence of the log's last message.
pub fn replay(
    id: ExecutionId,
    started: Started,
    plan: Arc<Plan>,
    restored: Option<Restored>,
    log: Vec<LogMessage>,
    last: u64,
) -> Result<Recovered, RecoveryError> {
    let (mut replayer, checkpoint) = match restored {
        Some(Restored {
            machine,
            sequence,
            checkpoint_id,
            deltas,
            ..
        }) => {
            tracing::info!(%id, sequence, %checkpoint_id, "restored from checkpoint");
            (
                Replayer::resume(started, machine, sequence),
                Some((checkpoint_id, sequence, deltas)),
            )
        }
        None => (Replayer::new(id, started, plan), None),
    };
    for message in &log {
        let refused = replayer.apply_message(&message.payload)?;
        for (sequence, err) in refused {
            // Only applied events are logged; a refusal means the log and this build disagree.
            // Keep going: the rest of the log still holds.
            tracing::warn!(%id, sequence, %err, "logged event refused on replay");
        }
    }
    let stream_seq = log.last().map_or(last, |m| m.stream_seq).max(last);
    // Drain what replay touched: the read model is the store's business, not the coordinator's.
    let _ = replayer.take_changed_records();
    let (started, machine, seq) = replayer.into_parts();
    Ok(Recovered {
        machine,
        started,
        seq,
        stream_seq,
        log,
        checkpoint,
    })
}
