//! The one replayer of an execution's log: `ExecutionStarted` plus the events after it, in
//! sequence order, become the [`Execution`] that was live and the records that changed.
//!
//! Coordinator recovery (after a checkpoint, or from the start), the checkpoint-store's ingest
//! and the monitor's live views all replay through [`Replayer`], so they agree on one policy:
//!
//! - An event at or below the replayed sequence was already applied: [`Step::Duplicate`].
//! - An event past the next sequence means events are missing: [`ReplayErrorKind::Gap`], and
//!   nothing is applied. A replica that skipped events would show a state that never was.
//! - An event that does not decode, belongs to another execution, or repeats
//!   `ExecutionStarted` is [`ReplayErrorKind::Corrupt`], [`ReplayErrorKind::OtherExecution`] or
//!   [`ReplayErrorKind::StartedAgain`], also with nothing applied.
//! - An event the state machine refuses was logged by a coordinator that accepted it: the log
//!   and this build disagree. The replay goes on ([`Step::Refused`]) and the caller reports it.
//! - An event of a kind this build does not know (written by a newer one) is skipped and the
//!   replay goes on ([`Step::Unknown`]); the caller reports it, and a coordinator, which would
//!   extend the log from a state that may be wrong, refuses to go on.
//!
//! Every error names the execution and the sequence; the caller decides what a broken log costs
//! (a failed recovery, a read model without task records, a view that stops updating) and says
//! so, never silently.
//!
//! The plan is not compiled again: `ExecutionStarted` records its canonical encoding
//! ([`trellis_core::plan::encode`]), and [`Started::plan`] decodes it. Only logs written before
//! the encoding was recorded compile their spec.

use std::sync::Arc;

use prost::Message as _;
use trellis_core::ids::ExecutionId;
use trellis_core::machine::{ApplyError, Execution};
use trellis_core::plan::Plan;
use trellis_core::record::TaskStatusRecord;
use trellis_proto::v1;

use crate::log::{self, LogEntry, Started};

/// Why a log could not be replayed further, and where.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("the log of execution {execution_id}, sequence {sequence}: {kind}")]
pub struct ReplayError {
    pub execution_id: ExecutionId,
    /// The sequence that could not be applied (for a gap, the first missing one).
    pub sequence: u64,
    pub kind: ReplayErrorKind,
}

/// What is wrong with the log at [`ReplayError::sequence`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ReplayErrorKind {
    #[error("missing (the next event in the log is sequence {found})")]
    Gap { found: u64 },
    #[error("corrupt: {0}")]
    Corrupt(String),
    #[error("the event belongs to execution {0}")]
    OtherExecution(String),
    #[error("the log does not start with execution_started")]
    NotStarted,
    #[error("execution_started again")]
    StartedAgain,
    #[error("the plan cannot be rebuilt: {0}")]
    Plan(String),
}

/// What one event did to the replayed execution.
#[derive(Debug)]
pub enum Step {
    Applied,
    /// The event was replayed before (a redelivery, or a batch overlapping a checkpoint).
    Duplicate,
    /// The state machine refused a logged event; the replay goes on without it.
    Refused(ApplyError),
    /// An event of a kind this build does not know; the replay goes on without it.
    Unknown,
}

/// An event a replay went past without applying it.
#[derive(Debug, thiserror::Error)]
pub enum Skipped {
    #[error("the state machine refused it: {0}")]
    Refused(ApplyError),
    #[error("its kind is unknown to this build (a newer one wrote it)")]
    Unknown,
}

/// An execution being rebuilt from its log.
#[derive(Debug)]
pub struct Replayer {
    started: Started,
    machine: Execution,
    sequence: u64,
}

impl Replayer {
    /// Starts a replay at sequence 1 with the plan `ExecutionStarted` records (see
    /// [`plan_of`] to have it decoded).
    pub fn new(execution_id: ExecutionId, started: Started, plan: Arc<Plan>) -> Self {
        let machine = Execution::start(
            execution_id,
            plan,
            started.run_number.max(1),
            started.started_at_ms,
        );
        Self::resume(started, machine, 1)
    }

    /// Starts a replay from `ExecutionStarted` alone, decoding its plan.
    pub fn start(execution_id: ExecutionId, started: Started) -> Result<Self, ReplayError> {
        let (started, plan) = plan_of(execution_id, started)?;
        Ok(Self::new(execution_id, started, plan))
    }

    /// Goes on from a state already rebuilt up to `sequence` (a checkpoint).
    pub fn resume(started: Started, machine: Execution, sequence: u64) -> Self {
        Self {
            started,
            machine,
            sequence,
        }
    }

    /// Starts a replay from the log's first event, which must be `ExecutionStarted` at
    /// sequence 1.
    pub fn from_first_event(
        execution_id: ExecutionId,
        event: &v1::Event,
    ) -> Result<Self, ReplayError> {
        Self::start(execution_id, started_in(execution_id, event)?)
    }

    /// Starts a replay from the log's first message (an encoded `EventBatch` whose first event
    /// is `ExecutionStarted`) and applies the rest of that message.
    pub fn from_first_message(
        execution_id: ExecutionId,
        payload: &[u8],
    ) -> Result<(Self, Vec<(u64, Skipped)>), ReplayError> {
        let batch = decode_batch(execution_id, 1, payload)?;
        let first = batch.events.first().ok_or(ReplayError {
            execution_id,
            sequence: 1,
            kind: ReplayErrorKind::NotStarted,
        })?;
        let mut replayer = Self::from_first_event(execution_id, first)?;
        let skipped = replayer.apply_events(&batch.events[1..])?;
        Ok((replayer, skipped))
    }

    /// The last sequence applied.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The log's `ExecutionStarted`, without its encoded plan (the machine holds the plan).
    pub fn started(&self) -> &Started {
        &self.started
    }

    pub fn machine(&self) -> &Execution {
        &self.machine
    }

    /// The task instance records that changed since the last call.
    pub fn take_changed_records(&mut self) -> Vec<TaskStatusRecord> {
        self.machine.take_changed_records()
    }

    /// Returns `ExecutionStarted`, the state and the last sequence applied.
    pub fn into_parts(self) -> (Started, Execution, u64) {
        (self.started, self.machine, self.sequence)
    }

    /// Applies one decoded entry at `sequence`.
    pub fn apply(&mut self, sequence: u64, entry: &LogEntry) -> Result<Step, ReplayError> {
        if let Some(step) = self.check(sequence)? {
            return Ok(step);
        }
        match entry {
            LogEntry::Started(_) => Err(self.error(sequence, ReplayErrorKind::StartedAgain)),
            LogEntry::Event(event) => {
                self.sequence = sequence;
                Ok(match self.machine.apply(event) {
                    Ok(_) => Step::Applied,
                    Err(err) => Step::Refused(err),
                })
            }
        }
    }

    /// Applies one event as read from the log.
    pub fn apply_event(&mut self, event: &v1::Event) -> Result<Step, ReplayError> {
        let sequence = event.sequence;
        if event.execution_id.parse::<ExecutionId>().ok() != Some(self.machine.id()) {
            return Err(self.error(
                sequence,
                ReplayErrorKind::OtherExecution(event.execution_id.clone()),
            ));
        }
        if let Some(step) = self.check(sequence)? {
            return Ok(step);
        }
        if event.kind.is_none() {
            self.sequence = sequence;
            return Ok(Step::Unknown);
        }
        let entry = log::event_from_proto(event)
            .map_err(|err| self.error(sequence, ReplayErrorKind::Corrupt(err.to_string())))?;
        self.apply(sequence, &entry)
    }

    /// Applies the events of one log message (an encoded `EventBatch`); returns the events the
    /// state machine refused or this build does not know, with their sequences.
    pub fn apply_message(&mut self, payload: &[u8]) -> Result<Vec<(u64, Skipped)>, ReplayError> {
        let batch = decode_batch(self.machine.id(), self.sequence + 1, payload)?;
        self.apply_events(&batch.events)
    }

    /// Applies events in log order; returns those skipped, with their sequences.
    fn apply_events(&mut self, events: &[v1::Event]) -> Result<Vec<(u64, Skipped)>, ReplayError> {
        let mut skipped = Vec::new();
        for event in events {
            match self.apply_event(event)? {
                Step::Applied | Step::Duplicate => {}
                Step::Refused(err) => skipped.push((event.sequence, Skipped::Refused(err))),
                Step::Unknown => skipped.push((event.sequence, Skipped::Unknown)),
            }
        }
        Ok(skipped)
    }

    /// Returns `Some(Duplicate)` for an event already applied, an error for one past the next.
    fn check(&self, sequence: u64) -> Result<Option<Step>, ReplayError> {
        if sequence <= self.sequence {
            return Ok(Some(Step::Duplicate));
        }
        if sequence != self.sequence + 1 {
            return Err(self.error(self.sequence + 1, ReplayErrorKind::Gap { found: sequence }));
        }
        Ok(None)
    }

    fn error(&self, sequence: u64, kind: ReplayErrorKind) -> ReplayError {
        ReplayError {
            execution_id: self.machine.id(),
            sequence,
            kind,
        }
    }
}

/// Decodes a log message expected to hold `sequence` onwards.
fn decode_batch(
    execution_id: ExecutionId,
    sequence: u64,
    payload: &[u8],
) -> Result<v1::EventBatch, ReplayError> {
    v1::EventBatch::decode(payload).map_err(|err| ReplayError {
        execution_id,
        sequence,
        kind: ReplayErrorKind::Corrupt(format!("a log message that is not an event batch: {err}")),
    })
}

/// Decodes the log's first message: its `ExecutionStarted` and the plan it records.
pub fn started_of(
    execution_id: ExecutionId,
    payload: &[u8],
) -> Result<(Started, Arc<Plan>), ReplayError> {
    let batch = decode_batch(execution_id, 1, payload)?;
    let first = batch.events.first().ok_or(ReplayError {
        execution_id,
        sequence: 1,
        kind: ReplayErrorKind::NotStarted,
    })?;
    plan_of(execution_id, started_in(execution_id, first)?)
}

/// Reads the log's first event, which must be this execution's `ExecutionStarted` at sequence 1.
fn started_in(execution_id: ExecutionId, event: &v1::Event) -> Result<Started, ReplayError> {
    let error = |kind| ReplayError {
        execution_id,
        sequence: event.sequence,
        kind,
    };
    if event.execution_id.parse::<ExecutionId>().ok() != Some(execution_id) {
        return Err(error(ReplayErrorKind::OtherExecution(
            event.execution_id.clone(),
        )));
    }
    match log::event_from_proto(event) {
        Ok(LogEntry::Started(started)) if event.sequence == 1 => Ok(started),
        // Sequence 1 is what is missing.
        Ok(_) => Err(ReplayError {
            execution_id,
            sequence: 1,
            kind: ReplayErrorKind::NotStarted,
        }),
        Err(err) => Err(error(ReplayErrorKind::Corrupt(err.to_string()))),
    }
}

/// Returns the plan `ExecutionStarted` records, and `ExecutionStarted` without its encoding.
pub fn plan_of(
    execution_id: ExecutionId,
    mut started: Started,
) -> Result<(Started, Arc<Plan>), ReplayError> {
    let plan = started.plan().map_err(|message| ReplayError {
        execution_id,
        sequence: 1,
        kind: ReplayErrorKind::Plan(message),
    })?;
    // The machine holds the plan from now on; the bytes would only double the memory.
    started.compiled_plan = Vec::new();
    Ok((started, Arc::new(plan)))
}
