//! The `CheckpointStore` gRPC service: checks each request completely (a bad one changes nothing
//! and gets INVALID_ARGUMENT naming the field), calls the [`Store`], and converts the answer.
//! [`status`] is the one mapping from store errors to gRPC codes.

use std::collections::HashMap;
use std::sync::Arc;

use prost::Message as _;
use tonic::{Code, Request, Response, Status};
use trellis_core::ids::{ExecutionId, GroupId, TaskInstanceId};
use trellis_core::machine::ExecutionState;
use trellis_proto::v1;
use trellis_proto::v1::checkpoint_store_server::CheckpointStore;
use trellis_wire::{common, read};
use uuid::Uuid;

use crate::checkpoint::{self, page_limit};
use crate::store::{
    CheckpointKind, CheckpointMetadata, Error, ErrorKind, ExecutionQuery, ExecutionRow, LogQuery,
    Page, QuestionRow, Store, TaskInstanceQuery,
};

/// The gRPC face of the store.
#[derive(Debug, Clone)]
pub struct CheckpointStoreService {
    store: Arc<dyn Store>,
    metrics: crate::metrics::Metrics,
}

impl CheckpointStoreService {
    /// Serves `store`, counting into `registry`.
    pub fn new(store: Arc<dyn Store>, registry: &trellis_telemetry::Registry) -> Self {
        Self {
            store,
            metrics: crate::metrics::Metrics::new(registry),
        }
    }
}

/// Returns the gRPC status of a store error.
pub fn status(err: Error) -> Status {
    let code = match err.kind() {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::DataLoss => Code::DataLoss,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
    };
    if code == Code::Internal || code == Code::Unavailable {
        tracing::error!(%err, "checkpoint-store request failed");
    }
    Status::new(code, err.to_string())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn to_unix_ms(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn from_unix_ms(field: &str, ms: i64) -> Result<Option<u64>, Status> {
    match ms {
        0 => Ok(None),
        ms if ms < 0 => Err(Status::invalid_argument(format!(
            "{field}: negative instant {ms}"
        ))),
        ms => Ok(Some(ms as u64)),
    }
}

fn uuid(field: &str, text: &str) -> Result<Uuid, Status> {
    checkpoint::parse_checkpoint_id(field, text).map_err(status)
}

fn execution_id(field: &str, text: &str) -> Result<ExecutionId, Status> {
    uuid(field, text).map(ExecutionId)
}

/// Reads a page token: empty for the first page, else the key the previous page ended with.
fn page_after(page: Option<&v1::PageRequest>) -> Result<(Option<Uuid>, u32), Status> {
    let page = page.cloned().unwrap_or_default();
    let after = match page.page_token.as_str() {
        "" => None,
        token => Some(Uuid::parse_str(token).map_err(|_| {
            Status::invalid_argument(format!(
                "page.page_token: {token:?} is not a token this service returned"
            ))
        })?),
    };
    Ok((after, page_limit(page.page_size)))
}

fn page_response(next: Option<String>) -> Option<v1::PageResponse> {
    Some(v1::PageResponse {
        next_page_token: next.unwrap_or_default(),
    })
}

/// Keeps `limit` items of a list fetched with one extra, and returns the token of the next page.
fn split_page<T>(
    mut items: Vec<T>,
    limit: u32,
    key: impl Fn(&T) -> String,
) -> (Vec<T>, Option<String>) {
    if items.len() > limit as usize {
        items.truncate(limit as usize);
        let next = items.last().map(key);
        (items, next)
    } else {
        (items, None)
    }
}

fn metadata_to_proto(meta: &CheckpointMetadata) -> v1::CheckpointMetadata {
    v1::CheckpointMetadata {
        checkpoint_id: meta.checkpoint_id.to_string(),
        execution_id: meta.execution_id.to_string(),
        event_sequence: meta.event_sequence,
        stream_sequence: meta.stream_sequence,
        kind: match meta.kind {
            CheckpointKind::Full => v1::CheckpointKind::Full,
            CheckpointKind::Delta => v1::CheckpointKind::Delta,
        }
        .into(),
        base_checkpoint_id: meta
            .base_checkpoint_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        checksum_sha256: meta.checksum_sha256.clone(),
        created_at_unix_ms: to_unix_ms(meta.created_at_ms),
        size_bytes: meta.size_bytes,
        state_format_version: meta.state_format_version,
    }
}

fn checkpoint_to_proto(checkpoint: crate::store::Checkpoint) -> v1::Checkpoint {
    v1::Checkpoint {
        metadata: Some(metadata_to_proto(&checkpoint.metadata)),
        state: checkpoint.state,
    }
}

fn question_to_proto(question: &QuestionRow) -> v1::OpenQuestion {
    v1::OpenQuestion {
        task_instance_id: question.task_instance_id.to_string(),
        task_id: question.task_id.clone(),
        question: Some(common::question_to_proto(&question.question)),
        asked_at_unix_ms: to_unix_ms(question.asked_at_ms),
    }
}

/// Returns the wire summary of an execution row.
pub fn execution_to_proto(row: &ExecutionRow, open_questions: &[QuestionRow]) -> v1::Execution {
    let state = read::execution_state_to_proto(row.state);
    let counts = read::counts_to_proto(&row.progress.counts);
    let reason = (!row.reason.is_empty()).then(|| row.reason.clone());
    v1::Execution {
        execution_id: row.execution_id.to_string(),
        name: row.name.clone(),
        state,
        run_number: row.run_number,
        counts: Some(counts),
        usage: Some(common::usage_to_proto(row.usage)),
        created_at_unix_ms: to_unix_ms(row.created_at_ms),
        started_at_unix_ms: row.started_at_ms.map(to_unix_ms),
        ended_at_unix_ms: row.ended_at_ms.map(to_unix_ms),
        reason: row.reason.clone(),
        last_sequence: row.last_sequence,
        namespace: row.namespace.clone(),
        // The read model keeps no pauses of tasks or groups: it answers for finished executions.
        holds: Vec::new(),
        skipped: Vec::new(),
        labels: row
            .labels
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect::<HashMap<_, _>>(),
        open_questions: open_questions.iter().map(question_to_proto).collect(),
        progress: Some(v1::Progress {
            execution_id: row.execution_id.to_string(),
            run_number: row.run_number,
            state,
            counts: Some(counts),
            total: row.progress.total,
            done: row.progress.done,
            percent: row.progress.percent,
            eta_ms: None,
            wave: row.progress.wave,
            waves: row.progress.waves,
            reason,
            sequence: row.last_sequence,
            sent_at_unix_ms: 0,
        }),
    }
}

fn execution_states(states: &[i32]) -> Result<Vec<ExecutionState>, Status> {
    states
        .iter()
        .enumerate()
        .map(|(idx, state)| {
            read::execution_state_from_proto(*state)
                .map_err(|err| Status::invalid_argument(format!("states[{idx}]: {}", err.kind())))
        })
        .collect()
}

#[tonic::async_trait]
impl CheckpointStore for CheckpointStoreService {
    async fn create_checkpoint(
        &self,
        request: Request<v1::CreateCheckpointRequest>,
    ) -> Result<Response<v1::CreateCheckpointResponse>, Status> {
        let checkpoint = request
            .into_inner()
            .checkpoint
            .ok_or_else(|| Status::invalid_argument("checkpoint: missing"))?;
        let started = std::time::Instant::now();
        let checkpoint = checkpoint::verify_new(checkpoint, now_ms()).map_err(status)?;
        let meta = self
            .store
            .create_checkpoint(&checkpoint)
            .await
            .map_err(status)?;
        let kind = match meta.kind {
            CheckpointKind::Full => "full",
            CheckpointKind::Delta => "delta",
        };
        let labels = [("kind", kind.to_owned())];
        self.metrics.checkpoints.get_or_create(&labels).inc();
        self.metrics
            .checkpoint_bytes
            .get_or_create(&labels)
            .observe(meta.size_bytes as f64);
        self.metrics
            .checkpoint_seconds
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        Ok(Response::new(v1::CreateCheckpointResponse {
            metadata: Some(metadata_to_proto(&meta)),
        }))
    }

    async fn get_checkpoint(
        &self,
        request: Request<v1::GetCheckpointRequest>,
    ) -> Result<Response<v1::GetCheckpointResponse>, Status> {
        let checkpoint_id = uuid("checkpoint_id", &request.get_ref().checkpoint_id)?;
        let checkpoint = self
            .store
            .verified_checkpoint(checkpoint_id)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::GetCheckpointResponse {
            checkpoint: Some(checkpoint_to_proto(checkpoint)),
        }))
    }

    async fn restore_checkpoint(
        &self,
        request: Request<v1::RestoreCheckpointRequest>,
    ) -> Result<Response<v1::RestoreCheckpointResponse>, Status> {
        let request = request.into_inner();
        let execution_id = execution_id("execution_id", &request.execution_id)?;
        let checkpoint_id = match request.checkpoint_id.as_str() {
            "" => None,
            text => Some(uuid("checkpoint_id", text)?),
        };
        let restored = self
            .store
            .restore(execution_id, checkpoint_id)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::RestoreCheckpointResponse {
            chain: restored
                .chain
                .into_iter()
                .map(checkpoint_to_proto)
                .collect(),
            replay_from_sequence: restored.replay_from_sequence,
            corrupt: restored
                .corrupt
                .into_iter()
                .map(|corrupt| v1::CorruptCheckpoint {
                    checkpoint_id: corrupt.checkpoint_id.to_string(),
                    reason: corrupt.reason,
                })
                .collect(),
        }))
    }

    async fn list_checkpoints(
        &self,
        request: Request<v1::ListCheckpointsRequest>,
    ) -> Result<Response<v1::ListCheckpointsResponse>, Status> {
        let request = request.into_inner();
        let execution_id = execution_id("execution_id", &request.execution_id)?;
        let (after, limit) = page_after(request.page.as_ref())?;
        let (checkpoints, next) = self
            .store
            .list(execution_id, after, limit)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::ListCheckpointsResponse {
            checkpoints: checkpoints.iter().map(metadata_to_proto).collect(),
            page: page_response(next.map(|id| id.to_string())),
        }))
    }

    async fn prune_checkpoints(
        &self,
        request: Request<v1::PruneCheckpointsRequest>,
    ) -> Result<Response<v1::PruneCheckpointsResponse>, Status> {
        let request = request.into_inner();
        let execution_id = execution_id("execution_id", &request.execution_id)?;
        let pruned = self
            .store
            .prune(execution_id, request.keep)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::PruneCheckpointsResponse {
            deleted_checkpoint_ids: pruned.deleted.iter().map(Uuid::to_string).collect(),
            freed_bytes: pruned.freed_bytes,
        }))
    }

    async fn query_task_instances(
        &self,
        request: Request<v1::QueryTaskInstancesRequest>,
    ) -> Result<Response<v1::QueryTaskInstancesResponse>, Status> {
        let request = request.into_inner();
        let execution_id = execution_id("execution_id", &request.execution_id)?;
        let states = request
            .states
            .iter()
            .enumerate()
            .map(|(idx, state)| {
                read::task_state_from_proto(*state).map_err(|err| {
                    Status::invalid_argument(format!("states[{idx}]: {}", err.kind()))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let task_instance_ids = request
            .task_instance_ids
            .iter()
            .enumerate()
            .map(|(idx, id)| uuid(&format!("task_instance_ids[{idx}]"), id).map(TaskInstanceId))
            .collect::<Result<Vec<_>, _>>()?;
        if task_instance_ids.len() > 1000 {
            return Err(Status::invalid_argument(
                "task_instance_ids: at most 1000 per request",
            ));
        }
        let (after, limit) = page_after(request.page.as_ref())?;
        let query = TaskInstanceQuery {
            execution_id,
            run_number: (request.run_number != 0).then_some(request.run_number),
            states,
            task_id: request.task_id,
            parent_task_instance_id: request
                .parent_task_instance_id
                .as_deref()
                .map(|id| uuid("parent_task_instance_id", id).map(TaskInstanceId))
                .transpose()?,
            subtask_group_id: request
                .subtask_group_id
                .as_deref()
                .map(|id| uuid("subtask_group_id", id).map(GroupId))
                .transpose()?,
            task_instance_ids,
            page: Page {
                after: after.map(TaskInstanceId),
                limit: limit + 1,
            },
        };
        let records = self
            .store
            .query_task_instances(&query)
            .await
            .map_err(status)?;
        let (records, next) =
            split_page(records, limit, |record| record.task_instance_id.to_string());
        Ok(Response::new(v1::QueryTaskInstancesResponse {
            task_instances: records.iter().map(read::record_to_proto).collect(),
            page: page_response(next),
        }))
    }

    async fn get_execution_record(
        &self,
        request: Request<v1::GetExecutionRecordRequest>,
    ) -> Result<Response<v1::GetExecutionRecordResponse>, Status> {
        let execution_id = execution_id("execution_id", &request.get_ref().execution_id)?;
        let row = self
            .store
            .get_execution(execution_id)
            .await
            .map_err(status)?
            .ok_or_else(|| Status::not_found(format!("no execution {execution_id}")))?;
        let questions = self
            .store
            .open_questions(execution_id)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::GetExecutionRecordResponse {
            execution: Some(execution_to_proto(&row, &questions)),
        }))
    }

    async fn list_execution_records(
        &self,
        request: Request<v1::ListExecutionRecordsRequest>,
    ) -> Result<Response<v1::ListExecutionRecordsResponse>, Status> {
        let request = request.into_inner();
        let (after, limit) = page_after(request.page.as_ref())?;
        let query = ExecutionQuery {
            states: execution_states(&request.states)?,
            name_contains: request.name_contains,
            namespace: request.namespace,
            labels: request.labels.into_iter().collect(),
            created_after_ms: from_unix_ms("created_after_unix_ms", request.created_after_unix_ms)?,
            created_before_ms: from_unix_ms(
                "created_before_unix_ms",
                request.created_before_unix_ms,
            )?,
            page: Page {
                after: after.map(ExecutionId),
                limit: limit + 1,
            },
        };
        let rows = self.store.list_executions(&query).await.map_err(status)?;
        let (rows, next) = split_page(rows, limit, |row| row.execution_id.to_string());
        Ok(Response::new(v1::ListExecutionRecordsResponse {
            executions: rows
                .iter()
                .map(|row| execution_to_proto(row, &[]))
                .collect(),
            page: page_response(next),
        }))
    }

    async fn list_task_logs(
        &self,
        request: Request<v1::ListTaskLogsRequest>,
    ) -> Result<Response<v1::ListTaskLogsResponse>, Status> {
        let request = request.into_inner();
        let execution_id = execution_id("execution_id", &request.execution_id)?;
        let task_instance_id = match request.task_instance_id.as_str() {
            "" => None,
            id => Some(TaskInstanceId(uuid("task_instance_id", id)?)),
        };
        let limit = match request.limit {
            0 => DEFAULT_LOG_PAGE,
            limit if limit <= MAX_LOG_PAGE => limit,
            limit => {
                return Err(Status::invalid_argument(format!(
                    "limit: {limit} is over {MAX_LOG_PAGE} batches per page"
                )));
            }
        };
        let query = LogQuery {
            execution_id,
            task_instance_id,
            attempt: (request.attempt != 0).then_some(request.attempt),
            after_sequence: request.after_sequence,
            before_sequence: (request.before_sequence != 0).then_some(request.before_sequence),
            limit,
        };
        let rows = self.store.task_logs(&query).await.map_err(status)?;
        let batches = rows
            .into_iter()
            .map(|row| {
                let batch = v1::TaskLogBatch::decode(row.payload.as_slice()).map_err(|err| {
                    status(Error::new(
                        ErrorKind::DataLoss,
                        format!(
                            "stored task log batch {} of execution {execution_id} does not \
                             decode: {err}",
                            row.stream_sequence
                        ),
                    ))
                })?;
                Ok(v1::StoredTaskLogBatch {
                    stream_sequence: row.stream_sequence,
                    batch: Some(batch),
                })
            })
            .collect::<Result<_, Status>>()?;
        Ok(Response::new(v1::ListTaskLogsResponse { batches }))
    }
}

/// Task log batches in a `ListTaskLogs` page when the request does not say.
const DEFAULT_LOG_PAGE: u32 = 500;
/// Most task log batches in a `ListTaskLogs` page.
const MAX_LOG_PAGE: u32 = 1000;
