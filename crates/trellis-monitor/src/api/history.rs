//! A plan's history across its executions: `/api/plans/{name}/history`, the grid of the page
//! `#/plans/<name>`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use trellis_grpc::AuthChannel;
use trellis_proto::v1;
use trellis_proto::v1::checkpoint_store_client::CheckpointStoreClient;

use super::{ApiError, ApiResult, App, Caller, MAX_LIST_PAGE, json, whole_number_in};
use crate::views::PlanHistory;

/// Executions a plan's history shows unless asked otherwise, and at most.
const DEFAULT_HISTORY: u32 = 25;
const MAX_HISTORY: u32 = 100;
/// Pages of [`MAX_LIST_PAGE`] executions a history reads at most looking for the plan's own
/// (other plans whose names contain its name share the list).
const MAX_HISTORY_SCAN_PAGES: usize = 10;
/// Task instances a history reads at most per execution, subtasks included (which the grid does
/// not show); past it, the tasks whose instances came later show no state.
const MAX_HISTORY_INSTANCES: usize = 20_000;

/// A plan's recent executions by its tasks, each cell the task's final state in that execution
/// (`API.md`, `/api/plans/{name}/history`): the executions from the coordinator's list (so the
/// caller's token decides which), their task instances from the checkpoint-store's read model.
pub(super) async fn plan_history(
    State(mut app): State<App>,
    caller: Caller,
    Path(plan): Path<String>,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(pairs) = query.map_err(|err| ApiError::bad_request(err.body_text()))?;
    let mut limit = DEFAULT_HISTORY;
    for (key, value) in pairs {
        if key == "limit" {
            limit = whole_number_in("limit", &value, 1, MAX_HISTORY)?;
        }
    }
    if plan.trim().is_empty() {
        return Err(ApiError::bad_request(
            "the plan name is empty: use /api/plans/<plan name>/history",
        ));
    }
    let Some(store) = app.store.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no checkpoint-store configured: start the monitor with --checkpoint-store URL to \
             see a plan's history",
        ));
    };
    // The list filters by a part of the name, ignoring case: keep the plan's own executions.
    let mut executions = Vec::new();
    let mut page_token = String::new();
    for _ in 0..MAX_HISTORY_SCAN_PAGES {
        let response = app
            .coordinator
            .list_executions(caller.request(v1::ListExecutionsRequest {
                name_contains: plan.clone(),
                page: Some(v1::PageRequest {
                    page_size: MAX_LIST_PAGE,
                    page_token: page_token.clone(),
                }),
                ..Default::default()
            })?)
            .await?
            .into_inner();
        executions.extend(response.executions.into_iter().filter(|e| e.name == plan));
        page_token = response.page.map(|p| p.next_page_token).unwrap_or_default();
        if executions.len() >= limit as usize || page_token.is_empty() {
            break;
        }
    }
    executions.truncate(limit as usize);
    let instances = executions.iter().map(|execution| {
        let store = store.clone();
        let id = execution.execution_id.clone();
        async move { task_instances(store, id).await }
    });
    let instances = futures::future::try_join_all(instances).await?;
    let columns: Vec<(v1::Execution, Vec<v1::TaskInstance>)> =
        executions.into_iter().zip(instances).collect();
    Ok(json(&PlanHistory::build(&plan, &columns)))
}

/// Every task instance of execution `id` in the read model, every run, at most
/// [`MAX_HISTORY_INSTANCES`].
async fn task_instances(
    mut store: CheckpointStoreClient<AuthChannel>,
    id: String,
) -> Result<Vec<v1::TaskInstance>, ApiError> {
    let mut instances = Vec::new();
    let mut page_token = String::new();
    loop {
        let response = store
            .query_task_instances(v1::QueryTaskInstancesRequest {
                execution_id: id.clone(),
                page: Some(v1::PageRequest {
                    page_size: MAX_LIST_PAGE,
                    page_token,
                }),
                ..Default::default()
            })
            .await
            .map_err(|status| ApiError::upstream("checkpoint-store", status))?
            .into_inner();
        instances.extend(response.task_instances);
        page_token = response.page.map(|p| p.next_page_token).unwrap_or_default();
        if page_token.is_empty() || instances.len() >= MAX_HISTORY_INSTANCES {
            return Ok(instances);
        }
    }
}
