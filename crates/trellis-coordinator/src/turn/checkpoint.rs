//! The checkpoint policy (docs/design.md §2, §4): when a checkpoint is due and whether it is a
//! full snapshot or a delta.
//!
//! Checkpoints are taken after a flush, on an interval while the state changes, once per pause,
//! and on demand. Every [`FULL_EVERY`]-th is a full snapshot of the state machine; the ones between
//! are deltas holding the events since the previous checkpoint (an encoded `EventBatch`), so
//! storage grows with the work done. The executor hands each [`CheckpointJob`] to the
//! checkpoint-store and reports the answer as [`super::Input::CheckpointDone`].

use prost::Message as _;
use trellis_core::ids::ExecutionId;
use trellis_core::machine::ExecutionState;
use trellis_proto::v1;
use trellis_telemetry::propagation::Context;

use super::{Answer, Coordinator, Error, ReplyTo};

/// A full snapshot every this many checkpoints; deltas in between.
pub const FULL_EVERY: u32 = 8;
/// Full checkpoints kept per execution (with their deltas) when pruning.
pub const KEEP_FULL: u32 = 2;

/// Checkpoint bookkeeping of one execution.
#[derive(Debug, Default)]
pub(super) struct CheckpointState {
    /// The event sequence of the last stored checkpoint (0: none).
    pub(super) seq: u64,
    pub(super) id: Option<String>,
    pub(super) metadata: Option<v1::CheckpointMetadata>,
    /// Deltas stored since the last full checkpoint.
    pub(super) since_full: u32,
    pub(super) at_ms: u64,
    in_flight: bool,
    /// A checkpoint was taken while paused (one per pause).
    paused_done: bool,
    /// Callers waiting for the next checkpoint.
    waiting: Vec<ReplyTo>,
}

/// A checkpoint to store.
#[derive(Debug)]
pub struct CheckpointJob {
    pub id: ExecutionId,
    /// A full snapshot (the store prunes older chains after it), or a delta.
    pub full: bool,
    /// The event sequence it includes.
    pub sequence: u64,
    /// Its metadata and state; the checksum and size are filled in when it is sent.
    pub checkpoint: v1::Checkpoint,
    /// The execution's trace, parent of the checkpoint's span.
    pub trace: Context,
}

impl CheckpointState {
    /// No checkpoint is being stored or waited for.
    pub(super) fn idle(&self) -> bool {
        !self.in_flight && self.waiting.is_empty()
    }

    /// When the interval checkpoint of a state at event `seq` is due, were nothing else to
    /// change: the last checkpoint's time plus `every_ms`. `None` when nothing changed since
    /// the last one, or while one is in flight (its answer touches the execution).
    pub(super) fn interval_due(&self, seq: u64, every_ms: u64) -> Option<u64> {
        (seq > self.seq && !self.in_flight).then_some(self.at_ms.saturating_add(every_ms))
    }

    /// Takes the callers waiting for the next checkpoint.
    pub(super) fn take_waiting(&mut self) -> Vec<ReplyTo> {
        std::mem::take(&mut self.waiting)
    }
}

impl Coordinator {
    /// Returns the checkpoint a shard's new owner recovers an execution from, when the last one
    /// stored is behind: taken as the shard is handed over, of stored events only.
    pub(super) fn handover_checkpoint(
        &mut self,
        id: ExecutionId,
        now: u64,
    ) -> Option<CheckpointJob> {
        if !self.config.checkpoint_store {
            return None;
        }
        let live = self.executions.get_mut(&id)?;
        let due = live.checkpoints_allowed
            && !live.checkpoint.in_flight
            && live.pending.is_empty()
            && live.appending.is_empty()
            && !live.machine.state().is_terminal()
            && live.seq > live.checkpoint.seq;
        due.then(|| checkpoint_job(&mut self.ids, id, live, now))
    }

    /// Queues a caller for the execution's next checkpoint (or refuses at once).
    pub(super) fn checkpoint_requested(&mut self, reply: ReplyTo, id: ExecutionId) {
        let store = self.config.checkpoint_store;
        let refusal = match self.executions.get_mut(&id) {
            None => Some(Error::not_found(id)),
            Some(_) if !store => Some(Error::precondition(
                "this coordinator has no checkpoint-store (start it with --checkpoint-store)",
            )),
            Some(live) if !live.checkpoints_allowed => Some(Error::precondition(format!(
                "checkpoints are not enabled for namespace {:?}: its quota does not allow \
                 them (set `checkpoints: true` for it in the access file)",
                live.namespace
            ))),
            Some(live) => {
                live.checkpoint.waiting.push(reply);
                None
            }
        };
        match refusal {
            Some(err) => self.reply_now(reply, Err(err)),
            // The policy looks at it this turn.
            None => self.wake(id),
        }
    }

    /// Returns the checkpoints that are due: on an interval while the state changes, once per
    /// pause, and on demand. Only the executions the turn `touched` are looked at: each of those
    /// reasons touches the execution (a change, a pause, a request, a checkpoint's answer, the
    /// interval's timer), so an execution nothing happens to costs the policy nothing.
    pub(super) fn checkpoints(&mut self, touched: &[ExecutionId], now: u64) -> Vec<CheckpointJob> {
        let mut jobs = Vec::new();
        if !self.config.checkpoint_store {
            return jobs;
        }
        let mut answers = Vec::new();
        for &id in touched {
            let Some(live) = self.executions.get_mut(&id) else {
                continue;
            };
            let ckpt = &mut live.checkpoint;
            if ckpt.in_flight || !live.pending.is_empty() || !live.checkpoints_allowed {
                continue;
            }
            let paused = live.machine.state() == ExecutionState::Paused;
            if !paused {
                ckpt.paused_done = false;
            }
            let changed = live.seq > ckpt.seq;
            if !ckpt.waiting.is_empty()
                && !changed
                && let Some(metadata) = &ckpt.metadata
            {
                // Nothing new since the last one: that one is the answer.
                for reply in ckpt.waiting.drain(..) {
                    answers.push((reply, Ok(Answer::Checkpoint(metadata.clone()))));
                }
                continue;
            }
            let due = !ckpt.waiting.is_empty()
                || (changed && paused && !ckpt.paused_done)
                || (changed
                    && !live.machine.state().is_terminal()
                    && now >= ckpt.at_ms + self.config.checkpoint_every_ms);
            if !due {
                continue;
            }
            if paused {
                ckpt.paused_done = true;
            }
            jobs.push(checkpoint_job(&mut self.ids, id, live, now));
        }
        for (reply, answer) in answers {
            self.reply_after(reply, None, answer);
        }
        jobs
    }

    /// Takes the checkpoint-store's answer to a checkpoint.
    pub(super) fn checkpoint_done(
        &mut self,
        id: ExecutionId,
        full: bool,
        sequence: u64,
        result: Result<v1::CheckpointMetadata, String>,
    ) {
        let Some(live) = self.executions.get_mut(&id) else {
            return;
        };
        let ckpt = &mut live.checkpoint;
        ckpt.in_flight = false;
        let waiting = std::mem::take(&mut ckpt.waiting);
        let stored = match result {
            Ok(metadata) => {
                tracing::debug!(%id, sequence, full, "checkpoint stored");
                ckpt.seq = sequence;
                ckpt.id = Some(metadata.checkpoint_id.clone());
                ckpt.since_full = if full { 0 } else { ckpt.since_full + 1 };
                ckpt.metadata = Some(metadata.clone());
                Ok(metadata)
            }
            Err(err) => {
                tracing::warn!(%id, %err, "checkpoint not stored");
                Err(Error::unavailable(format!(
                    "the checkpoint-store did not take the checkpoint: {err}"
                )))
            }
        };
        for reply in waiting {
            self.reply_now(reply, stored.clone().map(Answer::Checkpoint));
        }
        // The policy looks at it again: it may have changed, or paused, meanwhile.
        self.wake(id);
    }
}

/// Builds the checkpoint of an execution due for one (full, or a delta on the last full one
/// when the events since are held in memory) and marks it in flight.
fn checkpoint_job(
    ids: &mut super::Ids,
    id: ExecutionId,
    live: &mut super::live::Live,
    now: u64,
) -> CheckpointJob {
    let ckpt = &mut live.checkpoint;
    let delta = match &ckpt.id {
        Some(base) if ckpt.since_full + 1 < FULL_EVERY && ckpt.seq >= live.log_base => {
            delta_state(&live.log, ckpt.seq).map(|state| (base.clone(), state))
        }
        _ => None,
    };
    let full = delta.is_none();
    let (kind, base, state, format) = match delta {
        Some((base, state)) => (v1::CheckpointKind::Delta, base, state, 1),
        None => (
            v1::CheckpointKind::Full,
            String::new(),
            live.machine.snapshot(),
            trellis_core::machine::SNAPSHOT_FORMAT_VERSION,
        ),
    };
    let checkpoint = v1::Checkpoint {
        metadata: Some(v1::CheckpointMetadata {
            checkpoint_id: ids.checkpoint(now),
            execution_id: id.to_string(),
            event_sequence: live.seq,
            stream_sequence: live.stream_seq,
            kind: kind.into(),
            base_checkpoint_id: base,
            checksum_sha256: Vec::new(),
            created_at_unix_ms: now as i64,
            size_bytes: 0,
            state_format_version: format,
        }),
        state,
    };
    ckpt.in_flight = true;
    ckpt.at_ms = now;
    CheckpointJob {
        id,
        full,
        sequence: live.seq,
        checkpoint,
        trace: live.trace.clone(),
    }
}

/// Encodes the events after `after` held in the in-memory log as one `EventBatch`: a delta.
pub(super) fn delta_state(log: &[(u64, bytes::Bytes)], after: u64) -> Option<Vec<u8>> {
    // The first batch holding `after + 1` is the last one starting at or before it.
    let start = log
        .partition_point(|(first, _)| *first <= after + 1)
        .saturating_sub(1);
    let mut events = Vec::new();
    for (_, bytes) in &log[start..] {
        let batch = v1::EventBatch::decode(bytes.clone()).ok()?;
        events.extend(batch.events.into_iter().filter(|e| e.sequence > after));
    }
    if events.first().is_none_or(|e| e.sequence != after + 1) {
        return None;
    }
    Some(v1::EventBatch { events }.encode_to_vec())
}
