//! The task log routes: `/logs`, the lines page by page, and `/logs/live`, the lines as they are
//! written (Server-Sent Events), both read through the coordinator's `GetTaskLogs`.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{Value, json};
use trellis_core::ids::ExecutionId;
use trellis_proto::v1;

use super::{ApiError, ApiResult, App, Caller, KEEP_ALIVE, event_stream, execution_id};
use crate::hub::sse_frame;
use crate::metrics::Open;

/// Most log lines one `/logs` answer carries; the page asks again from `next`.
const MAX_LOG_LINES_PAGE: usize = 2000;

#[derive(Debug, Deserialize)]
pub(super) struct LogsQuery {
    /// One task instance; every instance by default.
    instance: Option<String>,
    /// How many lines of the log the page already has.
    after: Option<usize>,
}

/// The task log lines of an execution (or one instance) after the first `after`, oldest first,
/// as `GetTaskLogs` reads them: `{lines: [{instance, attempt, worker, at_ms, source, text,
/// cut_from_bytes}], next}`; lines a worker dropped show as one line of source `dropped`.
pub(super) async fn logs(
    State(mut app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let (mut stream, after) = open_logs(&mut app, &caller, &id, query, false).await?;
    let mut lines = Vec::new();
    let mut seen = 0usize;
    while let Some(item) = stream.message().await? {
        let Some(batch) = item.batch else { continue };
        for line in log_lines(batch) {
            seen += 1;
            if seen > after && lines.len() < MAX_LOG_LINES_PAGE {
                lines.push(line);
            }
        }
    }
    let next = after + lines.len();
    Ok(super::json(&json!({ "lines": lines, "next": next })))
}

/// Opens the `GetTaskLogs` stream a `/logs` or `/logs/live` request asks for (following for the
/// live one); returns it with how many lines to skip.
async fn open_logs(
    app: &mut App,
    caller: &Caller,
    id: &str,
    query: Result<Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
    follow: bool,
) -> Result<(tonic::Streaming<v1::GetTaskLogsResponse>, usize), ApiError> {
    let (id, instance, after) = log_request(id, query)?;
    let stream = app
        .coordinator
        .get_task_logs(caller.request(v1::GetTaskLogsRequest {
            execution_id: id.to_string(),
            task_instance_id: instance,
            attempt: 0,
            follow,
        })?)
        .await?
        .into_inner();
    Ok((stream, after))
}

/// Reads a `/logs` or `/logs/live` request: the execution, the instance (empty: every one) and
/// how many lines to skip.
fn log_request(
    id: &str,
    query: Result<Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(ExecutionId, String, usize), ApiError> {
    let Query(query) = query.map_err(|err| {
        ApiError::bad_request(format!(
            "{}: `after` must be a whole number",
            err.body_text()
        ))
    })?;
    let id = execution_id(id)?;
    let instance = query.instance.unwrap_or_default();
    if !instance.is_empty() && instance.parse::<uuid::Uuid>().is_err() {
        return Err(ApiError::bad_request(format!(
            "instance `{instance}` is not a task instance id"
        )));
    }
    Ok((id, instance, query.after.unwrap_or(0)))
}

/// The lines of a batch as the monitor shows them: `{instance, attempt, worker, at_ms, source,
/// text, cut_from_bytes}`, led by one line of source `dropped` when the worker dropped some.
fn log_lines(batch: v1::TaskLogBatch) -> Vec<Value> {
    let mut lines = Vec::with_capacity(batch.lines.len() + 1);
    if batch.dropped_before > 0 {
        lines.push(json!({
            "instance": batch.task_instance_id,
            "attempt": batch.attempt,
            "worker": batch.worker_id,
            "at_ms": batch.lines.first().map_or(0, |line| line.at_unix_ms),
            "source": "dropped",
            "text": format!("{} lines dropped here: the task wrote faster than its worker could publish", batch.dropped_before),
        }));
    }
    for line in batch.lines {
        lines.push(json!({
            "instance": batch.task_instance_id,
            "attempt": batch.attempt,
            "worker": batch.worker_id,
            "at_ms": line.at_unix_ms,
            "source": v1::LogSource::label_of(line.source),
            "text": line.text,
            "cut_from_bytes": line.cut_from_bytes,
        }));
    }
    lines
}

/// Task log lines live, as Server-Sent Events: the lines after the first `after` as they are
/// written (`lines`: `{lines, next}`), then `end` (`{next}`) once the execution has ended and its
/// last lines went out, or `failed` (`{error}`) when the coordinator stopped answering. A page
/// that reconnects asks again from its `next`, so no line comes twice.
pub(super) async fn logs_live(
    State(mut app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let (mut stream, after) = open_logs(&mut app, &caller, &id, query, true).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let shutdown = app.shutdown.clone();
    let open = Open::new(&app.metrics.live_streams);
    tokio::spawn(async move {
        let _open = open;
        let mut skip = after;
        let mut next = skip;
        loop {
            let item = tokio::select! {
                () = shutdown.cancelled() => return,
                () = tx.closed() => return,
                item = tokio::time::timeout(KEEP_ALIVE, stream.message()) => item,
            };
            let frame = match item {
                Err(_) => Bytes::from_static(b": keep-alive\n\n"),
                Ok(Ok(Some(item))) => {
                    let Some(batch) = item.batch else { continue };
                    let mut lines = log_lines(batch);
                    let skipped = skip.min(lines.len());
                    lines.drain(..skipped);
                    skip -= skipped;
                    if lines.is_empty() {
                        continue;
                    }
                    next += lines.len();
                    sse_frame("lines", &json!({ "lines": lines, "next": next }))
                }
                Ok(Ok(None)) => {
                    let _ = tx.send(sse_frame("end", &json!({ "next": next }))).await;
                    return;
                }
                Ok(Err(status)) => {
                    let error = ApiError::from(status);
                    let _ = tx
                        .send(sse_frame("failed", &json!({ "error": error.message })))
                        .await;
                    return;
                }
            };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    let frames = futures::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        Ok::<Bytes, Infallible>,
    );
    Ok(event_stream(Body::from_stream(frames)))
}
