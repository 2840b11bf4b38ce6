//! The storage seam: the [`Store`] trait and its two backends over sqlx, PostgreSQL (production)
//! and SQLite (the embedded default), picked by [`connect`] from the URL's scheme.
//!
//! The trait holds what needs the database: single statements and transactions over checkpoints
//! and the read-model tables. What the service does with them (checksum verification, restore
//! with fallback, prune planning) is written once, in `impl dyn Store` in [`crate::checkpoint`],
//! so both backends behave the same by construction. Both backends run the very same SQL
//! (`sql.rs`, compiled once per backend), which the conformance suite checks against both.

pub mod backlog;
pub mod notify;
mod postgres;
mod sqlite;
pub mod templates;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use trellis_core::ids::{ExecutionId, GroupId, QuestionId, TaskInstanceId};
use trellis_core::machine::{ExecutionState, Question, StateCounts, Usage};
use trellis_core::record::{TaskState, TaskStatusRecord};
use uuid::Uuid;

pub use backlog::{Backlog, connect_backlog};
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

// ------------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------------

/// What kind of failure an [`Error`] is; decides the gRPC status code (one mapping, in `grpc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed; nothing was changed.
    InvalidArgument,
    /// The checkpoint or execution does not exist.
    NotFound,
    /// A checkpoint id is already stored with other content.
    AlreadyExists,
    /// The request does not fit what is stored (a delta whose base is not stored).
    FailedPrecondition,
    /// Stored bytes no longer match their checksum.
    DataLoss,
    /// The database cannot be reached or is overloaded; trying again may work.
    Unavailable,
    /// Anything else: a bug, or a database answer the store does not understand.
    Internal,
}

/// A failure of the store: its [`ErrorKind`], a message saying what failed, and the cause.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// Returns an error of `kind` with `message` and no cause.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Returns the kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Returns the same error with another kind.
    pub(crate) fn with_kind(mut self, kind: ErrorKind) -> Self {
        self.kind = kind;
        self
    }

    /// Returns an `InvalidArgument` error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// Returns a `NotFound` error.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// Wraps a database error: `what` says what was being done ("failed to store checkpoint ...").
    pub(crate) fn database(what: impl Into<String>, source: sqlx::Error) -> Self {
        let kind = match &source {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::WorkerCrashed => ErrorKind::Unavailable,
            sqlx::Error::Database(db)
                if db.kind() == sqlx::error::ErrorKind::ForeignKeyViolation =>
            {
                ErrorKind::FailedPrecondition
            }
            _ => ErrorKind::Internal,
        };
        let what = what.into();
        Self {
            kind,
            message: format!("{what}: {source}"),
            source: Some(Box::new(source)),
        }
    }
}

/// Returns a closure wrapping a database error with `what`, for `map_err`.
pub(crate) fn db_err(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
    let what = what.into();
    move |source| Error::database(what, source)
}

// ------------------------------------------------------------------------------------------------
// Values
// ------------------------------------------------------------------------------------------------

/// Whether a checkpoint stands alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckpointKind {
    /// A whole snapshot.
    Full,
    /// Only what changed since its base.
    Delta,
}

impl CheckpointKind {
    /// Returns the name stored in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Delta => "delta",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "full" => Some(Self::Full),
            "delta" => Some(Self::Delta),
            _ => None,
        }
    }
}

/// Everything about a checkpoint except its state bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMetadata {
    /// The checkpoint's id, a UUIDv7 chosen by the coordinator (so ids sort by creation).
    pub checkpoint_id: Uuid,
    pub execution_id: ExecutionId,
    /// The last event sequence whose effect the state includes.
    pub event_sequence: u64,
    /// The JetStream stream sequence of that event; 0 when unknown.
    pub stream_sequence: u64,
    pub kind: CheckpointKind,
    /// For a delta, the checkpoint it applies to; `None` for a full one.
    pub base_checkpoint_id: Option<Uuid>,
    /// SHA-256 of the state as stored (32 bytes unless the row is damaged).
    pub checksum_sha256: Vec<u8>,
    pub created_at_ms: u64,
    /// Length of the state as stored.
    pub size_bytes: u64,
    pub state_format_version: u32,
}

/// A checkpoint with its state. Built from a request only through
/// [`crate::checkpoint::verify_new`] (checksum and size checked); read back from the database as
/// is, to be verified by the caller.
#[derive(Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub metadata: CheckpointMetadata,
    pub state: Vec<u8>,
}

impl fmt::Debug for Checkpoint {
    // A state is megabytes of opaque bytes; its length says what matters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("metadata", &self.metadata)
            .field("state_len", &self.state.len())
            .finish()
    }
}

/// What [`Store::insert_checkpoint`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// The checkpoint is stored now.
    Created,
    /// A checkpoint with this id was stored already; its metadata.
    Existing(CheckpointMetadata),
}

/// One page of a list, keyed by the last item of the previous page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Page<K> {
    /// The key of the last item of the previous page; `None` for the first page.
    pub after: Option<K>,
    /// Most items to return (at least 1).
    pub limit: u32,
}

/// Filter of [`Store::query_task_instances`]; unset filters match everything, set ones combine
/// with AND. Ordered by task instance id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInstanceQuery {
    pub execution_id: ExecutionId,
    pub run_number: Option<u32>,
    pub states: Vec<TaskState>,
    pub task_id: Option<String>,
    pub parent_task_instance_id: Option<TaskInstanceId>,
    pub subtask_group_id: Option<GroupId>,
    pub task_instance_ids: Vec<TaskInstanceId>,
    pub page: Page<TaskInstanceId>,
}

/// Filter of [`Store::list_executions`]; ordered newest first (by execution id, a UUIDv7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutionQuery {
    pub states: Vec<ExecutionState>,
    /// Plan names containing this text, ignoring case (SQLite folds ASCII letters only); empty
    /// matches all.
    pub name_contains: String,
    /// Executions of this namespace; empty matches all.
    pub namespace: String,
    /// Executions carrying every one of these labels with these values.
    pub labels: BTreeMap<String, String>,
    pub created_after_ms: Option<u64>,
    pub created_before_ms: Option<u64>,
    /// Pages go towards older executions: `after` is the last (oldest) id of the previous page.
    pub page: Page<ExecutionId>,
}

/// Progress of an execution as stored: what `Execution::progress` said after the last event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProgressRow {
    pub counts: StateCounts,
    pub total: u64,
    pub done: u64,
    pub percent: f64,
    pub wave: u32,
    pub waves: u32,
}

/// One execution of the read model.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionRow {
    pub execution_id: ExecutionId,
    /// The plan's name.
    pub name: String,
    pub state: ExecutionState,
    pub run_number: u32,
    pub created_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    /// Why it paused, failed or was cancelled; empty otherwise.
    pub reason: String,
    pub idempotency_key: String,
    /// The namespace it runs in.
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// Every event at or below this sequence is in the read model.
    pub last_sequence: u64,
    pub usage: Usage,
    pub progress: ProgressRow,
}

/// How one execution's row changes in a [`ReadModelBatch`].
#[derive(Clone, Debug, PartialEq)]
pub enum ExecutionWrite {
    /// The whole row, known from the execution's replica; labels are written when the row is new.
    Row(Box<ExecutionRow>),
    /// Only the sequence moves on: events were read but no replica could apply them. Creates a
    /// placeholder row (state `running`, no name) when the execution is unknown.
    Sequence {
        execution_id: ExecutionId,
        last_sequence: u64,
        /// When the first of those events happened, for a placeholder's `created_at`.
        first_event_at_ms: u64,
    },
}

impl ExecutionWrite {
    /// Returns the execution.
    pub fn execution_id(&self) -> ExecutionId {
        match self {
            Self::Row(row) => row.execution_id,
            Self::Sequence { execution_id, .. } => *execution_id,
        }
    }
}

/// One event of the log as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRow {
    pub execution_id: ExecutionId,
    pub sequence: u64,
    pub at_ms: u64,
    /// The event kind's name, the `oneof` member (`task_started`), or `unknown`.
    pub kind: &'static str,
    /// The instance the event is about, when it is about one.
    pub task_instance_id: Option<TaskInstanceId>,
    /// The encoded `trellis.v1.Event`.
    pub payload: Vec<u8>,
}

/// A question asked by a task instance.
#[derive(Clone, Debug, PartialEq)]
pub struct QuestionRow {
    pub execution_id: ExecutionId,
    pub task_instance_id: TaskInstanceId,
    pub task_id: String,
    pub attempt: u32,
    pub question: Question,
    pub asked_at_ms: u64,
}

/// How a question was resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    Answered(String),
    Expired,
}

/// A question answered or expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuestionResolved {
    pub question_id: QuestionId,
    pub resolution: Resolution,
    pub at_ms: u64,
}

/// Everything the read model takes from a run of event-log messages, written in one transaction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadModelBatch {
    /// At most one per execution.
    pub executions: Vec<ExecutionWrite>,
    /// At most one per instance (the latest).
    pub instances: Vec<TaskStatusRecord>,
    pub events: Vec<EventRow>,
    pub questions_asked: Vec<QuestionRow>,
    /// Applied after `questions_asked`, in order.
    pub questions_resolved: Vec<QuestionResolved>,
}

impl ReadModelBatch {
    /// Returns true when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.executions.is_empty()
            && self.instances.is_empty()
            && self.events.is_empty()
            && self.questions_asked.is_empty()
            && self.questions_resolved.is_empty()
    }
}

/// A worker as last seen, with the heartbeats received since the previous write.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRow {
    pub worker_id: String,
    pub host: String,
    pub queues: Vec<String>,
    pub slots: u32,
    /// `spawning`, `idle`, `running`, `terminated` or `unspecified`.
    pub state: &'static str,
    pub running_tasks: u32,
    pub memory_bytes: u64,
    pub cpu_percent: f64,
    pub interval_ms: u64,
    /// When this store first received a heartbeat of the worker (kept from the first write).
    pub first_seen_at_ms: u64,
    pub last_heartbeat_at_ms: u64,
    /// Heartbeats received since the previous write; added to the stored count.
    pub new_heartbeats: u64,
    /// The last heartbeat as received.
    pub last_heartbeat: Vec<u8>,
}

/// One task log batch as the store keeps it (its copy of `TRELLIS_LOGS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBatchRow {
    pub execution_id: ExecutionId,
    /// Its sequence in `TRELLIS_LOGS`: unique, and the order batches are read in.
    pub stream_sequence: u64,
    pub task_instance_id: TaskInstanceId,
    pub attempt: u32,
    /// Its position among its attempt's batches, from 1.
    pub batch: u64,
    pub worker_id: String,
    /// How many lines it holds.
    pub lines: u32,
    /// The encoded `trellis.v1.TaskLogBatch`, as the worker published it.
    pub payload: Vec<u8>,
}

/// Which task log batches to read: one execution's, oldest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogQuery {
    pub execution_id: ExecutionId,
    /// Only this instance's.
    pub task_instance_id: Option<TaskInstanceId>,
    /// Only this attempt's.
    pub attempt: Option<u32>,
    /// Only batches after this stream sequence.
    pub after_sequence: u64,
    /// Only batches before this stream sequence.
    pub before_sequence: Option<u64>,
    pub limit: u32,
}

// ------------------------------------------------------------------------------------------------
// The trait
// ------------------------------------------------------------------------------------------------

/// Which database a [`Store`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// The database behind the checkpoint-store: checkpoints and the read model.
///
/// Implemented by [`PostgresStore`] and [`SqliteStore`]; held as `Arc<dyn Store>`. The service's
/// operations on checkpoints (create, get, restore, list, prune) are methods of `dyn Store`
/// (see [`crate::checkpoint`]) built on these.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// Returns which database this is.
    fn backend(&self) -> Backend;

    /// Stores a checkpoint whose checksum was verified, unless one with its id exists (then
    /// returns that one's metadata and changes nothing). A delta's base must be stored, for the
    /// same execution, at or below the delta's event sequence; otherwise nothing is stored and
    /// the error says why.
    async fn insert_checkpoint(&self, checkpoint: &Checkpoint) -> Result<Inserted, Error>;

    /// Returns a checkpoint with its state, as stored (not verified).
    async fn get_checkpoint(&self, checkpoint_id: Uuid) -> Result<Option<Checkpoint>, Error>;

    /// Returns the metadata of every checkpoint of an execution, oldest first.
    async fn checkpoint_metadata(
        &self,
        execution_id: ExecutionId,
    ) -> Result<Vec<CheckpointMetadata>, Error>;

    /// Returns one page of an execution's checkpoints, newest first.
    async fn list_checkpoints(
        &self,
        execution_id: ExecutionId,
        page: Page<Uuid>,
    ) -> Result<Vec<CheckpointMetadata>, Error>;

    /// Deletes these checkpoints (all or none).
    async fn delete_checkpoints(&self, checkpoint_ids: &[Uuid]) -> Result<(), Error>;

    /// Returns the `last_sequence` of each of these executions the read model knows.
    async fn last_sequences(
        &self,
        execution_ids: &[ExecutionId],
    ) -> Result<HashMap<ExecutionId, u64>, Error>;

    /// Writes a batch of the read model in one transaction. Idempotent: an execution row only
    /// moves forward (a write whose `last_sequence` is not above the stored one leaves it as is),
    /// events already stored are kept, instance rows are replaced by the newer state.
    async fn write_read_model(&self, batch: &ReadModelBatch) -> Result<(), Error>;

    /// Inserts or updates workers in one transaction.
    async fn upsert_workers(&self, workers: &[WorkerRow]) -> Result<(), Error>;

    /// Returns one page of task instances matching the query.
    async fn query_task_instances(
        &self,
        query: &TaskInstanceQuery,
    ) -> Result<Vec<TaskStatusRecord>, Error>;

    /// Returns one execution's row, with its labels.
    async fn get_execution(&self, execution_id: ExecutionId)
    -> Result<Option<ExecutionRow>, Error>;

    /// Returns one page of executions matching the query (with their labels), newest first.
    async fn list_executions(&self, query: &ExecutionQuery) -> Result<Vec<ExecutionRow>, Error>;

    /// Returns the questions of an execution still waiting for an answer, oldest first (a
    /// question whose asking instance was cancelled is withdrawn, not waiting).
    async fn open_questions(&self, execution_id: ExecutionId) -> Result<Vec<QuestionRow>, Error>;

    /// Stores task log batches in one transaction; a batch already stored (same execution and
    /// stream sequence) is left as it is.
    async fn insert_task_logs(&self, batches: &[LogBatchRow]) -> Result<(), Error>;

    /// Returns the task log batches matching the query, by stream sequence, at most `limit`.
    async fn task_logs(&self, query: &LogQuery) -> Result<Vec<LogBatchRow>, Error>;

    /// Returns executions in a final state (completed, failed, cancelled) that ended after
    /// `after_ms` and at or before `until_ms`, with when they ended, oldest first, at most
    /// `limit`.
    async fn finished_between(
        &self,
        after_ms: u64,
        until_ms: u64,
        limit: u32,
    ) -> Result<Vec<(ExecutionId, u64)>, Error>;
}

/// Connects to the database named by `url` and applies the embedded migrations:
/// `postgres://` or `postgresql://` for PostgreSQL, `sqlite:` for SQLite (`sqlite://trellis.db` for a
/// file created if missing, `sqlite::memory:` for a database that lives as long as the store).
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, Error> {
    Ok(connect_all(url).await?.0)
}

/// Opens the database of `url` once (one pool, the migrations applied once) as both the
/// checkpoint-store's [`Store`] and the planner's [`Backlog`]; schemes as [`connect`].
pub async fn connect_all(url: &str) -> Result<(Arc<dyn Store>, Arc<dyn Backlog>), Error> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let store = Arc::new(PostgresStore::connect(url).await?);
        Ok((store.clone(), store))
    } else if url.starts_with("sqlite:") {
        let store = Arc::new(SqliteStore::connect(url).await?);
        Ok((store.clone(), store))
    } else {
        Err(Error::invalid(format!(
            "unsupported database URL {:?}: use postgres://... or sqlite://...",
            redact(url)
        )))
    }
}

/// Returns the URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_owned(),
    }
}

// ------------------------------------------------------------------------------------------------
// Conversions between values and columns, shared by both backends
// ------------------------------------------------------------------------------------------------

/// Converts a count or instant to a BIGINT column; values beyond `i64::MAX` (never reached by
/// real counts or instants) are stored as `i64::MAX`.
pub(crate) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Converts a BIGINT column back; a negative value (only from a hand-edited row) reads as 0.
pub(crate) fn from_i64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// Converts an INTEGER column back; out-of-range values (hand-edited rows) saturate.
pub(crate) fn from_i64_u32(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

pub(crate) fn parse_task_state(text: &str) -> Option<TaskState> {
    TaskState::ALL
        .into_iter()
        .find(|state| state.as_str() == text)
}

pub(crate) const EXECUTION_STATES: [ExecutionState; 7] = [
    ExecutionState::Pending,
    ExecutionState::Running,
    ExecutionState::Paused,
    ExecutionState::WaitingForHuman,
    ExecutionState::Completed,
    ExecutionState::Failed,
    ExecutionState::Cancelled,
];

pub(crate) fn parse_execution_state(text: &str) -> Option<ExecutionState> {
    EXECUTION_STATES
        .into_iter()
        .find(|state| state.as_str() == text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        let check = |url: &str, expected: &str| assert_eq!(redact(url), expected);
        check(
            "postgres://user:secret@db:5432/trellis",
            "postgres://user:***@db:5432/trellis",
        );
        check("postgres://db/trellis", "postgres://db/trellis");
        check("sqlite::memory:", "sqlite::memory:");
    }

    #[test]
    fn states_round_trip_through_their_names() {
        for state in TaskState::ALL {
            assert_eq!(parse_task_state(state.as_str()), Some(state));
        }
        for state in EXECUTION_STATES {
            assert_eq!(parse_execution_state(state.as_str()), Some(state));
        }
        assert_eq!(parse_task_state("nope"), None);
    }
}
