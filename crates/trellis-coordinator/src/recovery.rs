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
use trellis_wire::replay::{self, ReplayError, Replayer, Skipped};

use crate::checkpoints::{Restored, StoreClient};
use crate::turn::{Broken, LogMessage, Recovered, Recovery};

/// Why an execution could not be recovered.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// Reading failed; reading again may succeed.
    #[error("cannot read the log of {id}: {message}")]
    Read { id: ExecutionId, message: String },
    /// The log holds something this build cannot go on from.
    #[error("the log of {id} is malformed at sequence {sequence}: {message}")]
    Malformed {
        id: ExecutionId,
        sequence: u64,
        message: String,
    },
    /// The log does not replay (the error names the execution and the sequence).
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

impl RecoveryError {
    /// What the turn holds for a log that does not replay (`namespace`: the one its
    /// `ExecutionStarted` names, when that much was read); a read error stays an error.
    pub fn into_broken(self, namespace: Option<&str>) -> Result<Broken, RecoveryError> {
        let (id, sequence) = match &self {
            Self::Read { .. } => return Err(self),
            Self::Malformed { id, sequence, .. } => (*id, *sequence),
            Self::Replay(err) => (err.execution_id, err.sequence),
        };
        Ok(Broken {
            id,
            sequence,
            namespace: namespace.map(str::to_owned),
            reason: self.to_string(),
        })
    }
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
        // A message that is not an event batch is kept (first sequence 0): the replay names
        // the sequence it should have held.
        let first_seq = first_sequence(&message.payload).unwrap_or(0);
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

/// Rebuilds one execution; an error is a failed read, worth trying again.
pub(crate) async fn recover(
    events: &Stream,
    store: Option<&StoreClient>,
    id: ExecutionId,
) -> Result<Recovery, RecoveryError> {
    let Some(last) = last_stream_seq(events, id).await? else {
        return Ok(Recovery::Empty);
    };
    let Some(first) = read_log(events, id, 1, last, 1).await?.pop() else {
        let err = RecoveryError::Malformed {
            id,
            sequence: 1,
            message: "the log has no first message".to_owned(),
        };
        return err.into_broken(None).map(Recovery::Broken);
    };
    let (started, plan) = match started_of(id, &first) {
        Ok(started) => started,
        Err(err) => return err.into_broken(None).map(Recovery::Broken),
    };
    let namespace = started.namespace().to_owned();
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
    match replay(id, started, plan, restored, log, last) {
        Ok(recovered) => Ok(Recovery::Recovered(Box::new(recovered))),
        Err(err) => err.into_broken(Some(&namespace)).map(Recovery::Broken),
    }
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
        for (sequence, skipped) in replayer.apply_message(&message.payload)? {
            match skipped {
                // Only applied events are logged; a refusal means the log and this build
                // disagree. Keep going: the rest of the log still holds.
                Skipped::Refused(err) => {
                    tracing::warn!(%id, sequence, %err, "logged event refused on replay");
                }
                // This coordinator would extend the log from a state that may be wrong.
                Skipped::Unknown => {
                    return Err(RecoveryError::Malformed {
                        id,
                        sequence,
                        message: format!("{}: run that version", Skipped::Unknown),
                    });
                }
            }
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

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use trellis_proto::v1;
    use trellis_wire::log::started_to_proto;

    use super::*;

    fn message(stream_seq: u64, events: Vec<v1::Event>) -> LogMessage {
        LogMessage {
            stream_seq,
            first_seq: events.first().map_or(0, |event| event.sequence),
            payload: v1::EventBatch { events }.encode_to_vec().into(),
        }
    }

    /// A log a newer coordinator extended with an event of a kind this build does not know is
    /// not recovered: this coordinator would append after a state that may be wrong.
    #[test]
    fn an_event_of_an_unknown_kind_stops_recovery() {
        let id = ExecutionId(uuid::Uuid::now_v7());
        let spec = "name: p\ntasks:\n  - {id: a, type: noop}\n";
        let plan = trellis_core::plan::compile_str(spec, &trellis_core::plan::Limits::default())
            .expect("the plan compiles");
        let started = Started {
            spec: spec.to_owned(),
            run_number: 1,
            started_at_ms: 1,
            compiled_plan: trellis_core::plan::encode(&plan),
            ..Started::default()
        };
        let first = message(1, vec![started_to_proto(id, &started)]);
        let unknown = message(
            2,
            vec![v1::Event {
                execution_id: id.to_string(),
                sequence: 2,
                timestamp_unix_ms: 2,
                kind: None,
            }],
        );
        let (started, plan) = started_of(id, &first).expect("the log starts well");
        let recovered = replay(
            id,
            started.clone(),
            Arc::clone(&plan),
            None,
            vec![first.clone()],
            1,
        );
        assert!(recovered.is_ok(), "{recovered:?}");
        let err = replay(id, started, plan, None, vec![first, unknown], 2)
            .expect_err("an unknown kind stops recovery");
        assert!(
            err.to_string().contains("sequence 2: its kind is unknown"),
            "{err}"
        );
    }
}
