// The SQL of the store, written once and compiled once per backend: `postgres.rs` and `sqlite.rs`
// each `include!` this file after defining
// - `Db`, the sqlx database type, and `StoreImpl`, the store type implementing `Store`;
// - `StoreImpl::pool(&self)`, `StoreImpl::lock_writes(&self)` (a guard serializing write transactions
//   where the database needs it), `text(&str) -> String` (what a free-form string is stored as),
//   `CONTAINS_FN` (the SQL function `f(haystack, needle)` returning the 1-based position) and
//   `BACKEND`.
// The write transactions and their statements are in `sql_write.rs`, included at the end.
// Placeholders are written `$1`, `$2`, ...: PostgreSQL's syntax, which SQLite also accepts.
// The generic alternative (functions over `DB: sqlx::Database`) needs a bound per column type on
// every function; compiling the same text twice keeps it plain SQL.
//
// (A plain `//` header: an included file cannot carry inner doc comments.)

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use sqlx::{QueryBuilder, Row as _};
use trellis_core::ids::{ExecutionId, TaskInstanceId, WorkerId};
use trellis_core::machine::{Question, StateCounts, TimeoutAction, Usage};
use trellis_core::record::TaskStatusRecord;
use uuid::Uuid;

use super::{
    CheckpointKind, CheckpointMetadata, Error, ErrorKind, EventRow, ExecutionQuery, ExecutionRow,
    ExecutionWrite, Inserted, LogBatchRow, LogQuery, Page, ProgressRow, QuestionResolved, QuestionRow, ReadModelBatch,
    Resolution, Store, TaskInstanceQuery, WorkerRow, db_err, from_i64, from_i64_u32,
    parse_execution_state, parse_task_state, to_i64,
};

type DbRow = <Db as sqlx::Database>::Row;

/// Most bind parameters in one statement: below both PostgreSQL's (65,535) and SQLite's (32,766)
/// limits.
const MAX_BINDS: usize = 30_000;

/// Most ids in one `IN (...)` list.
const MAX_IDS: usize = 1_000;

fn to_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Reads a column, naming it when the row does not have the expected type.
fn column<'r, T>(row: &'r DbRow, name: &str) -> Result<T, Error>
where
    T: sqlx::Decode<'r, Db> + sqlx::Type<Db>,
{
    row.try_get(name)
        .map_err(db_err(format!("failed to read column {name}")))
}

fn corrupt_row(what: &str, detail: String) -> Error {
    Error::new(
        ErrorKind::Internal,
        format!("stored {what} is not valid: {detail}"),
    )
}

// ------------------------------------------------------------------------------------------------
// Checkpoints
// ------------------------------------------------------------------------------------------------

const CHECKPOINT_METADATA_COLUMNS: &str = "checkpoint_id, execution_id, event_sequence, \
     stream_sequence, kind, base_checkpoint_id, checksum_sha256, created_at_unix_ms, size_bytes, \
     state_format_version";

fn checkpoint_metadata_from_row(row: &DbRow) -> Result<CheckpointMetadata, Error> {
    let kind: String = column(row, "kind")?;
    Ok(CheckpointMetadata {
        checkpoint_id: column(row, "checkpoint_id")?,
        execution_id: ExecutionId(column(row, "execution_id")?),
        event_sequence: from_i64(column(row, "event_sequence")?),
        stream_sequence: from_i64(column(row, "stream_sequence")?),
        kind: CheckpointKind::parse(&kind)
            .ok_or_else(|| corrupt_row("checkpoint kind", format!("{kind:?}")))?,
        base_checkpoint_id: column(row, "base_checkpoint_id")?,
        checksum_sha256: column(row, "checksum_sha256")?,
        created_at_ms: from_i64(column(row, "created_at_unix_ms")?),
        size_bytes: from_i64(column(row, "size_bytes")?),
        state_format_version: u32::try_from(column::<i32>(row, "state_format_version")?)
            .unwrap_or(0),
    })
}

// ------------------------------------------------------------------------------------------------
// Read model rows
// ------------------------------------------------------------------------------------------------

const INSTANCE_COLUMNS: &str = "execution_id, task_instance_id, task_id, parent_task_instance_id, \
     subtask_group_id, resumed_after_subtasks_group_id, continues_task_instance_id, run_number, \
     attempt, state, worker_id, created_at_unix_ms, dispatched_at_unix_ms, started_at_unix_ms, \
     ended_at_unix_ms, output, error, earlier_attempts, validation";

fn instance_from_row(row: &DbRow) -> Result<TaskStatusRecord, Error> {
    let state: String = column(row, "state")?;
    let output: Option<String> = column(row, "output")?;
    let output = output
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|err| corrupt_row("task instance output", err.to_string()))?;
    let optional_instant = |name: &str| -> Result<Option<u64>, Error> {
        Ok(column::<Option<i64>>(row, name)?.map(from_i64))
    };
    let earlier_attempts: Option<String> = column(row, "earlier_attempts")?;
    let earlier_attempts = earlier_attempts
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|err| corrupt_row("task instance attempts", err.to_string()))?
        .unwrap_or_default();
    let validation: Option<String> = column(row, "validation")?;
    let validation = validation
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|err| corrupt_row("task instance checks", err.to_string()))?
        .unwrap_or_default();
    Ok(TaskStatusRecord {
        task_instance_id: TaskInstanceId(column(row, "task_instance_id")?),
        task_id: column(row, "task_id")?,
        parent_task_instance_id: column::<Option<Uuid>>(row, "parent_task_instance_id")?
            .map(TaskInstanceId),
        subtask_group_id: column::<Option<Uuid>>(row, "subtask_group_id")?.map(Into::into),
        resumed_after_subtasks_group_id: column::<Option<Uuid>>(
            row,
            "resumed_after_subtasks_group_id",
        )?
        .map(Into::into),
        continues_task_instance_id: column::<Option<Uuid>>(row, "continues_task_instance_id")?
            .map(TaskInstanceId),
        correlation_id: ExecutionId(column(row, "execution_id")?),
        run_number: u32::try_from(column::<i32>(row, "run_number")?).unwrap_or(0),
        attempt: u32::try_from(column::<i32>(row, "attempt")?).unwrap_or(0),
        state: parse_task_state(&state)
            .ok_or_else(|| corrupt_row("task state", format!("{state:?}")))?,
        worker_id: column::<Option<String>>(row, "worker_id")?.map(WorkerId),
        created_at_ms: from_i64(column(row, "created_at_unix_ms")?),
        dispatched_at_ms: optional_instant("dispatched_at_unix_ms")?,
        started_at_ms: optional_instant("started_at_unix_ms")?,
        ended_at_ms: optional_instant("ended_at_unix_ms")?,
        output,
        error: column(row, "error")?,
        earlier_attempts,
        validation,
    })
}

const EXECUTION_COLUMNS: &str = "execution_id, name, state, run_number, created_at_unix_ms, \
     started_at_unix_ms, ended_at_unix_ms, reason, idempotency_key, last_sequence, tokens_used, \
     cost, pending_tasks, queued_tasks, blocked_tasks, running_tasks, waiting_for_subtasks_tasks, \
     waiting_for_human_tasks, retry_scheduled_tasks, completed_tasks, failed_tasks, \
     skipped_tasks, cancelled_tasks, total_tasks, done_tasks, percent_complete, wave, waves, \
     namespace";

/// The count columns, in `TaskState::ALL` order (the order of `StateCounts`).
const COUNT_COLUMNS: [&str; 11] = [
    "pending_tasks",
    "queued_tasks",
    "blocked_tasks",
    "running_tasks",
    "waiting_for_subtasks_tasks",
    "waiting_for_human_tasks",
    "retry_scheduled_tasks",
    "completed_tasks",
    "failed_tasks",
    "skipped_tasks",
    "cancelled_tasks",
];

fn execution_from_row(row: &DbRow) -> Result<ExecutionRow, Error> {
    let state: String = column(row, "state")?;
    let mut counts = StateCounts::default();
    for (count, name) in counts.0.iter_mut().zip(COUNT_COLUMNS) {
        *count = from_i64(column(row, name)?);
    }
    Ok(ExecutionRow {
        execution_id: ExecutionId(column(row, "execution_id")?),
        name: column(row, "name")?,
        state: parse_execution_state(&state)
            .ok_or_else(|| corrupt_row("execution state", format!("{state:?}")))?,
        run_number: u32::try_from(column::<i32>(row, "run_number")?).unwrap_or(0),
        created_at_ms: from_i64(column(row, "created_at_unix_ms")?),
        started_at_ms: column::<Option<i64>>(row, "started_at_unix_ms")?.map(from_i64),
        ended_at_ms: column::<Option<i64>>(row, "ended_at_unix_ms")?.map(from_i64),
        reason: column(row, "reason")?,
        idempotency_key: column(row, "idempotency_key")?,
        namespace: column(row, "namespace")?,
        labels: BTreeMap::new(),
        last_sequence: from_i64(column(row, "last_sequence")?),
        usage: Usage {
            tokens_used: from_i64(column(row, "tokens_used")?),
            cost: column(row, "cost")?,
        },
        progress: ProgressRow {
            counts,
            total: from_i64(column(row, "total_tasks")?),
            done: from_i64(column(row, "done_tasks")?),
            percent: column(row, "percent_complete")?,
            wave: u32::try_from(column::<i32>(row, "wave")?).unwrap_or(0),
            waves: u32::try_from(column::<i32>(row, "waves")?).unwrap_or(0),
        },
    })
}

fn timeout_action_columns(action: &TimeoutAction) -> (&'static str, &str) {
    match action {
        TimeoutAction::Fail => ("fail", ""),
        TimeoutAction::Skip => ("skip", ""),
        TimeoutAction::Answer(answer) => ("answer_default", answer),
    }
}

fn question_from_row(row: &DbRow) -> Result<QuestionRow, Error> {
    let options: String = column(row, "options")?;
    let options: Vec<String> = serde_json::from_str(&options)
        .map_err(|err| corrupt_row("question options", err.to_string()))?;
    let action: String = column(row, "timeout_action")?;
    let default_answer: String = column(row, "default_answer")?;
    let timeout_action = match action.as_str() {
        "skip" => TimeoutAction::Skip,
        "answer_default" => TimeoutAction::Answer(default_answer),
        _ => TimeoutAction::Fail,
    };
    Ok(QuestionRow {
        execution_id: ExecutionId(column(row, "execution_id")?),
        task_instance_id: TaskInstanceId(column(row, "task_instance_id")?),
        task_id: column(row, "task_id")?,
        attempt: from_i64_u32(i64::from(column::<i32>(row, "attempt")?)),
        question: Question {
            id: column::<Uuid>(row, "question_id")?.into(),
            question_type: column(row, "question_type")?,
            priority: column(row, "priority")?,
            text: column(row, "text")?,
            options,
            expires_at_ms: column::<Option<i64>>(row, "expires_at_unix_ms")?.map(from_i64),
            timeout_action,
        },
        asked_at_ms: from_i64(column(row, "asked_at_unix_ms")?),
    })
}

/// Splits `rows` into chunks whose binds stay under [`MAX_BINDS`].
fn chunks<T>(rows: &[T], binds_per_row: usize) -> std::slice::Chunks<'_, T> {
    rows.chunks((MAX_BINDS / binds_per_row).max(1))
}

// ------------------------------------------------------------------------------------------------
// The trait
// ------------------------------------------------------------------------------------------------

#[async_trait]
impl Store for StoreImpl {
    fn backend(&self) -> super::Backend {
        BACKEND
    }

    async fn insert_checkpoint(&self, checkpoint: &super::Checkpoint) -> Result<Inserted, Error> {
        let meta = &checkpoint.metadata;
        let failed = || format!("failed to store checkpoint {}", meta.checkpoint_id);
        let _writes = self.lock_writes().await;
        // One statement, one round trip: a delta is inserted only when its base is stored for the
        // same execution at or below its sequence (the base row is read by the same statement).
        // Only when nothing was inserted is it worth finding out why.
        let sql = match meta.base_checkpoint_id {
            None => {
                "INSERT INTO checkpoints (checkpoint_id, execution_id, event_sequence, \
                 stream_sequence, kind, base_checkpoint_id, checksum_sha256, created_at_unix_ms, \
                 size_bytes, state_format_version, state) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
                 ON CONFLICT (checkpoint_id) DO NOTHING"
            }
            Some(_) => {
                "INSERT INTO checkpoints (checkpoint_id, execution_id, event_sequence, \
                 stream_sequence, kind, base_checkpoint_id, checksum_sha256, created_at_unix_ms, \
                 size_bytes, state_format_version, state) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 FROM checkpoints base \
                 WHERE base.checkpoint_id = $6 AND base.execution_id = $2 \
                 AND base.event_sequence <= $3 \
                 ON CONFLICT (checkpoint_id) DO NOTHING"
            }
        };
        let inserted = sqlx::query(sql)
            .bind(meta.checkpoint_id)
            .bind(meta.execution_id.0)
            .bind(to_i64(meta.event_sequence))
            .bind(to_i64(meta.stream_sequence))
            .bind(meta.kind.as_str())
            .bind(meta.base_checkpoint_id)
            .bind(meta.checksum_sha256.as_slice())
            .bind(to_i64(meta.created_at_ms))
            .bind(to_i64(meta.size_bytes))
            .bind(to_i32(meta.state_format_version))
            .bind(checkpoint.state.as_slice())
            .execute(self.pool())
            .await
            .map_err(db_err(failed()))?;
        if inserted.rows_affected() == 1 {
            return Ok(Inserted::Created);
        }
        if let Some(existing) = fetch_metadata(self.pool(), meta.checkpoint_id).await? {
            return Ok(Inserted::Existing(existing));
        }
        let base = match meta.base_checkpoint_id {
            Some(base_id) => fetch_metadata(self.pool(), base_id).await?,
            None => None,
        };
        crate::checkpoint::check_base(meta, base.as_ref())?;
        // The base changed between the insert and the look-up (a concurrent prune).
        Err(Error::new(
            ErrorKind::FailedPrecondition,
            format!("{}: its base checkpoint changed meanwhile", failed()),
        ))
    }

    async fn get_checkpoint(
        &self,
        checkpoint_id: Uuid,
    ) -> Result<Option<super::Checkpoint>, Error> {
        let row = sqlx::query(&format!(
            "SELECT {CHECKPOINT_METADATA_COLUMNS}, state FROM checkpoints WHERE checkpoint_id = $1"
        ))
        .bind(checkpoint_id)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err(format!("failed to read checkpoint {checkpoint_id}")))?;
        row.map(|row| {
            Ok(super::Checkpoint {
                metadata: checkpoint_metadata_from_row(&row)?,
                state: column(&row, "state")?,
            })
        })
        .transpose()
    }

    async fn checkpoint_metadata(
        &self,
        execution_id: ExecutionId,
    ) -> Result<Vec<CheckpointMetadata>, Error> {
        let rows = sqlx::query(&format!(
            "SELECT {CHECKPOINT_METADATA_COLUMNS} FROM checkpoints WHERE execution_id = $1 \
             ORDER BY checkpoint_id"
        ))
        .bind(execution_id.0)
        .fetch_all(self.pool())
        .await
        .map_err(db_err(format!(
            "failed to read the checkpoints of execution {execution_id}"
        )))?;
        rows.iter().map(checkpoint_metadata_from_row).collect()
    }

    async fn list_checkpoints(
        &self,
        execution_id: ExecutionId,
        page: Page<Uuid>,
    ) -> Result<Vec<CheckpointMetadata>, Error> {
        let mut query = QueryBuilder::<Db>::new(format!(
            "SELECT {CHECKPOINT_METADATA_COLUMNS} FROM checkpoints WHERE execution_id = "
        ));
        query.push_bind(execution_id.0);
        if let Some(after) = page.after {
            query.push(" AND checkpoint_id < ").push_bind(after);
        }
        query
            .push(" ORDER BY checkpoint_id DESC LIMIT ")
            .push_bind(i64::from(page.limit));
        let rows = query
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(db_err(format!(
                "failed to list the checkpoints of execution {execution_id}"
            )))?;
        rows.iter().map(checkpoint_metadata_from_row).collect()
    }

    async fn delete_checkpoints(&self, checkpoint_ids: &[Uuid]) -> Result<(), Error> {
        if checkpoint_ids.is_empty() {
            return Ok(());
        }
        // Deltas first (newest first), so a base is never deleted before what is built on it;
        // the caller deletes whole chains.
        let mut ordered = checkpoint_ids.to_vec();
        ordered.sort_unstable_by(|a, b| b.cmp(a));
        self.write("failed to delete checkpoints", || {
            Box::new(ordered.chunks(MAX_IDS).map(checkpoints_delete))
        })
        .await
    }

    async fn last_sequences(
        &self,
        execution_ids: &[ExecutionId],
    ) -> Result<HashMap<ExecutionId, u64>, Error> {
        let mut res = HashMap::with_capacity(execution_ids.len());
        for ids in execution_ids.chunks(MAX_IDS) {
            let mut query = QueryBuilder::<Db>::new(
                "SELECT execution_id, last_sequence FROM executions WHERE execution_id IN (",
            );
            let mut separated = query.separated(", ");
            for id in ids {
                separated.push_bind(id.0);
            }
            query.push(")");
            let rows = query
                .build()
                .fetch_all(self.pool())
                .await
                .map_err(db_err("failed to read the executions' last sequences"))?;
            for row in &rows {
                res.insert(
                    ExecutionId(column(row, "execution_id")?),
                    from_i64(column(row, "last_sequence")?),
                );
            }
        }
        Ok(res)
    }

    async fn write_read_model(&self, batch: &ReadModelBatch) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        let rows: Vec<&ExecutionRow> = batch
            .executions
            .iter()
            .filter_map(|write| match write {
                ExecutionWrite::Row(row) => Some(&**row),
                ExecutionWrite::Sequence { .. } => None,
            })
            .collect();
        let sequences: Vec<(ExecutionId, u64, u64)> = batch
            .executions
            .iter()
            .filter_map(|write| match write {
                ExecutionWrite::Sequence {
                    execution_id,
                    last_sequence,
                    first_event_at_ms,
                } => Some((*execution_id, *last_sequence, *first_event_at_ms)),
                ExecutionWrite::Row(_) => None,
            })
            .collect();
        let labels: Vec<(ExecutionId, &String, &String)> = rows
            .iter()
            .flat_map(|row| {
                row.labels
                    .iter()
                    .map(|(key, value)| (row.execution_id, key, value))
            })
            .collect();
        self.write("failed to write the read model", || {
            // The rows' update time is when the transaction got the write lock.
            let now = now_ms();
            Box::new(
                chunks(&rows, 29)
                    .map(move |rows| executions_upsert(rows, now))
                    .chain(chunks(&sequences, 7).map(move |rows| last_sequences_upsert(rows, now)))
                    .chain(chunks(&labels, 3).map(labels_insert))
                    .chain(chunks(&batch.instances, 19).map(instances_upsert))
                    .chain(chunks(&batch.events, 6).map(events_insert))
                    .chain(chunks(&batch.questions_asked, 14).map(questions_insert))
                    .chain(batch.questions_resolved.iter().map(question_resolve)),
            )
        })
        .await
    }

    async fn upsert_workers(&self, workers: &[WorkerRow]) -> Result<(), Error> {
        if workers.is_empty() {
            return Ok(());
        }
        self.write("failed to write workers", || {
            Box::new(chunks(workers, 13).map(workers_upsert))
        })
        .await
    }

    async fn query_task_instances(
        &self,
        filter: &TaskInstanceQuery,
    ) -> Result<Vec<TaskStatusRecord>, Error> {
        let mut query = QueryBuilder::<Db>::new(format!(
            "SELECT {INSTANCE_COLUMNS} FROM task_instances WHERE execution_id = "
        ));
        query.push_bind(filter.execution_id.0);
        if let Some(run_number) = filter.run_number {
            query
                .push(" AND run_number = ")
                .push_bind(to_i32(run_number));
        }
        if !filter.states.is_empty() {
            query.push(" AND state IN (");
            let mut separated = query.separated(", ");
            for state in &filter.states {
                separated.push_bind(state.as_str());
            }
            query.push(")");
        }
        if let Some(task_id) = &filter.task_id {
            query.push(" AND task_id = ").push_bind(text(task_id));
        }
        if let Some(parent) = filter.parent_task_instance_id {
            query
                .push(" AND parent_task_instance_id = ")
                .push_bind(parent.0);
        }
        if let Some(group) = filter.subtask_group_id {
            query.push(" AND subtask_group_id = ").push_bind(group.0);
        }
        if !filter.task_instance_ids.is_empty() {
            query.push(" AND task_instance_id IN (");
            let mut separated = query.separated(", ");
            for id in &filter.task_instance_ids {
                separated.push_bind(id.0);
            }
            query.push(")");
        }
        if let Some(after) = filter.page.after {
            query.push(" AND task_instance_id > ").push_bind(after.0);
        }
        query
            .push(" ORDER BY task_instance_id LIMIT ")
            .push_bind(i64::from(filter.page.limit));
        let rows = query
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(db_err(format!(
                "failed to query the task instances of execution {}",
                filter.execution_id
            )))?;
        rows.iter().map(instance_from_row).collect()
    }

    async fn get_execution(
        &self,
        execution_id: ExecutionId,
    ) -> Result<Option<ExecutionRow>, Error> {
        let failed = || format!("failed to read execution {execution_id}");
        let row = sqlx::query(&format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions WHERE execution_id = $1"
        ))
        .bind(execution_id.0)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err(failed()))?;
        let Some(row) = row else { return Ok(None) };
        let mut execution = execution_from_row(&row)?;
        let labels = sqlx::query("SELECT key, value FROM execution_labels WHERE execution_id = $1")
            .bind(execution_id.0)
            .fetch_all(self.pool())
            .await
            .map_err(db_err(failed()))?;
        for label in &labels {
            execution
                .labels
                .insert(column(label, "key")?, column(label, "value")?);
        }
        Ok(Some(execution))
    }

    async fn list_executions(&self, filter: &ExecutionQuery) -> Result<Vec<ExecutionRow>, Error> {
        let failed = "failed to list executions";
        let mut query = QueryBuilder::<Db>::new(format!(
            "SELECT {EXECUTION_COLUMNS} FROM executions WHERE 1 = 1"
        ));
        if !filter.states.is_empty() {
            query.push(" AND state IN (");
            let mut separated = query.separated(", ");
            for state in &filter.states {
                separated.push_bind(state.as_str());
            }
            query.push(")");
        }
        if !filter.namespace.is_empty() {
            query
                .push(" AND namespace = ")
                .push_bind(text(&filter.namespace));
        }
        if !filter.name_contains.is_empty() {
            // Case does not matter: people type `build` for `Nightly Build`. SQLite's `lower`
            // folds ASCII letters only; PostgreSQL's folds every letter.
            query
                .push(format!(" AND {CONTAINS_FN}(lower(name), lower("))
                .push_bind(text(&filter.name_contains))
                .push(")) > 0");
        }
        for (key, value) in &filter.labels {
            query
                .push(
                    " AND EXISTS (SELECT 1 FROM execution_labels l \
                     WHERE l.execution_id = executions.execution_id AND l.key = ",
                )
                .push_bind(text(key))
                .push(" AND l.value = ")
                .push_bind(text(value))
                .push(")");
        }
        if let Some(after) = filter.created_after_ms {
            query
                .push(" AND created_at_unix_ms >= ")
                .push_bind(to_i64(after));
        }
        if let Some(before) = filter.created_before_ms {
            query
                .push(" AND created_at_unix_ms < ")
                .push_bind(to_i64(before));
        }
        if let Some(after) = filter.page.after {
            query.push(" AND execution_id < ").push_bind(after.0);
        }
        query
            .push(" ORDER BY execution_id DESC LIMIT ")
            .push_bind(i64::from(filter.page.limit));
        let rows = query
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(db_err(failed))?;
        let mut executions = rows
            .iter()
            .map(execution_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        if executions.is_empty() {
            return Ok(executions);
        }
        let mut query = QueryBuilder::<Db>::new(
            "SELECT execution_id, key, value FROM execution_labels WHERE execution_id IN (",
        );
        let mut separated = query.separated(", ");
        for execution in &executions {
            separated.push_bind(execution.execution_id.0);
        }
        query.push(")");
        let labels = query
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(db_err(failed))?;
        let mut by_execution: HashMap<ExecutionId, BTreeMap<String, String>> = HashMap::new();
        for label in &labels {
            by_execution
                .entry(ExecutionId(column(label, "execution_id")?))
                .or_default()
                .insert(column(label, "key")?, column(label, "value")?);
        }
        for execution in &mut executions {
            if let Some(labels) = by_execution.remove(&execution.execution_id) {
                execution.labels = labels;
            }
        }
        Ok(executions)
    }

    async fn open_questions(&self, execution_id: ExecutionId) -> Result<Vec<QuestionRow>, Error> {
        let rows = sqlx::query(&format!(
            "SELECT question_id, execution_id, task_instance_id, task_id, attempt, \
             question_type, text, options, default_answer, timeout_action, expires_at_unix_ms, \
             asked_at_unix_ms, priority FROM questions q \
             WHERE execution_id = $1 AND {QUESTION_STILL_ASKED} ORDER BY question_id"
        ))
        .bind(execution_id.0)
        .fetch_all(self.pool())
        .await
        .map_err(db_err(format!(
            "failed to read the questions of execution {execution_id}"
        )))?;
        rows.iter().map(question_from_row).collect()
    }

    async fn insert_task_logs(&self, batches: &[LogBatchRow]) -> Result<(), Error> {
        if batches.is_empty() {
            return Ok(());
        }
        self.write("failed to write task logs", || {
            Box::new(chunks(batches, 8).map(task_logs_insert))
        })
        .await
    }

    async fn task_logs(&self, filter: &LogQuery) -> Result<Vec<LogBatchRow>, Error> {
        let mut query = QueryBuilder::<Db>::new(
            "SELECT execution_id, stream_sequence, task_instance_id, attempt, batch, worker_id, \
             lines, payload FROM task_logs WHERE execution_id = ",
        );
        query.push_bind(filter.execution_id.0);
        query.push(" AND stream_sequence > ");
        query.push_bind(to_i64(filter.after_sequence));
        if let Some(before) = filter.before_sequence {
            query.push(" AND stream_sequence < ");
            query.push_bind(to_i64(before));
        }
        if let Some(instance) = filter.task_instance_id {
            query.push(" AND task_instance_id = ");
            query.push_bind(instance.0);
        }
        if let Some(attempt) = filter.attempt {
            query.push(" AND attempt = ");
            query.push_bind(to_i32(attempt));
        }
        query.push(" ORDER BY stream_sequence LIMIT ");
        query.push_bind(i64::from(filter.limit));
        let rows = query
            .build()
            .fetch_all(self.pool())
            .await
            .map_err(db_err(format!(
                "failed to read the task logs of execution {}",
                filter.execution_id
            )))?;
        rows.iter()
            .map(|row| {
                Ok(LogBatchRow {
                    execution_id: ExecutionId(column(row, "execution_id")?),
                    stream_sequence: from_i64(column(row, "stream_sequence")?),
                    task_instance_id: TaskInstanceId(column(row, "task_instance_id")?),
                    attempt: from_i64_u32(i64::from(column::<i32>(row, "attempt")?)),
                    batch: from_i64(column(row, "batch")?),
                    worker_id: column(row, "worker_id")?,
                    lines: from_i64_u32(i64::from(column::<i32>(row, "lines")?)),
                    payload: column(row, "payload")?,
                })
            })
            .collect()
    }

    async fn finished_between(
        &self,
        after_ms: u64,
        until_ms: u64,
        limit: u32,
    ) -> Result<Vec<(ExecutionId, u64)>, Error> {
        let rows = sqlx::query(
            "SELECT execution_id, ended_at_unix_ms FROM executions \
             WHERE state IN ('completed', 'failed', 'cancelled') \
             AND ended_at_unix_ms > $1 AND ended_at_unix_ms <= $2 \
             ORDER BY ended_at_unix_ms, execution_id LIMIT $3",
        )
        .bind(to_i64(after_ms))
        .bind(to_i64(until_ms))
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(db_err("failed to list finished executions"))?;
        rows.iter()
            .map(|row| {
                let id = ExecutionId(column(row, "execution_id")?);
                let ended = column::<Option<i64>>(row, "ended_at_unix_ms")?.map_or(0, from_i64);
                Ok((id, ended))
            })
            .collect()
    }
}

/// Reads one checkpoint's metadata.
async fn fetch_metadata(
    pool: &sqlx::Pool<Db>,
    checkpoint_id: Uuid,
) -> Result<Option<CheckpointMetadata>, Error> {
    let row = sqlx::query(&format!(
        "SELECT {CHECKPOINT_METADATA_COLUMNS} FROM checkpoints WHERE checkpoint_id = $1"
    ))
    .bind(checkpoint_id)
    .fetch_optional(pool)
    .await
    .map_err(db_err(format!("failed to read checkpoint {checkpoint_id}")))?;
    row.as_ref().map(checkpoint_metadata_from_row).transpose()
}

/// Where a `questions q` row still waits for an answer: pending, and the instance that asked it
/// not cancelled (cancelling it withdraws the question, with no event of its own).
const QUESTION_STILL_ASKED: &str = "q.status = 'pending' AND NOT EXISTS (SELECT 1 \
    FROM task_instances t WHERE t.execution_id = q.execution_id \
    AND t.task_instance_id = q.task_instance_id AND t.state = 'cancelled')";

include!("sql_write.rs");
