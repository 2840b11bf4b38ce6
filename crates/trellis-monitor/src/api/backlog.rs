//! The backlog through the planner: `GET /api/backlog` (the evaluation queue, the lists and the
//! pending grouping suggestions of one project) and
//! `POST /api/backlog/suggestions/{id}/{accept|reject}` (a control: it needs the token).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use trellis_grpc::AuthChannel;
use trellis_proto::v1;
use trellis_proto::v1::backlog_client::BacklogClient;

use super::{ApiError, ApiResult, App, authorize, body_fields};

/// The project a page shows unless it names another.
const DEFAULT_PROJECT: &str = "default";

#[derive(Debug, Deserialize)]
pub(super) struct ProjectQuery {
    project: Option<String>,
}

fn planner(app: &App) -> Result<BacklogClient<AuthChannel>, ApiError> {
    app.backlog.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no backlog here: start the monitor with --planner URL (a planner serving the \
             backlog, as trellis dev does)",
        )
    })
}

fn upstream(status: tonic::Status) -> ApiError {
    ApiError::upstream("planner", status)
}

fn task_json(task: &v1::BacklogTaskView) -> Value {
    let fields = task.fields.clone().unwrap_or_default();
    json!({
        "id": task.display_id,
        "number": task.number,
        "title": fields.title,
        "category": fields.category,
        "priority": fields.priority,
        "priority_score": task.priority_score,
        "effort": fields.effort,
        "status": task.status,
        "list": task.list,
        "position": task.position,
        "item_status": task.item_status,
        "files": fields.files.iter().map(|f| json!({"path": f.path, "operation": f.operation})).collect::<Vec<_>>(),
        "blocks": task.blocks.iter().map(|b| json!({"kind": b.kind, "reason": b.reason})).collect::<Vec<_>>(),
    })
}

fn list_json(list: &v1::TaskListView) -> Value {
    json!({
        "name": list.name,
        "description": list.description,
        "status": list.status,
        "max_parallel_agents": list.max_parallel_agents,
        "runs": list.runs,
        "total_tasks": list.total_tasks,
        "completed_tasks": list.completed_tasks,
        "failed_tasks": list.failed_tasks,
    })
}

fn suggestion_json(suggestion: &v1::GroupingSuggestion) -> Value {
    json!({
        "id": suggestion.id,
        "status": suggestion.status,
        "name": suggestion.name,
        "tasks": suggestion.tasks,
        "score": suggestion.score,
        "reason": suggestion.reason,
        "triggered_by": suggestion.triggered_by,
        "created_list": suggestion.created_list,
    })
}

/// `GET /api/backlog?project=P`.
pub(super) async fn backlog(
    State(app): State<App>,
    Query(query): Query<ProjectQuery>,
) -> ApiResult {
    let mut client = planner(&app)?;
    let project = query
        .project
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PROJECT.to_owned());
    let tasks = client
        .list_tasks(v1::ListTasksRequest {
            project: project.clone(),
            ..Default::default()
        })
        .await
        .map_err(upstream)?
        .into_inner()
        .tasks;
    let lists = client
        .list_lists(v1::ListListsRequest {
            project: project.clone(),
        })
        .await
        .map_err(upstream)?
        .into_inner()
        .lists;
    let suggestions = client
        .list_suggestions(v1::ListSuggestionsRequest {
            project: project.clone(),
            status: "pending".to_owned(),
        })
        .await
        .map_err(upstream)?
        .into_inner()
        .suggestions;
    Ok(super::json(&json!({
        "project": project,
        "tasks": tasks.iter().map(task_json).collect::<Vec<_>>(),
        "lists": lists.iter().map(list_json).collect::<Vec<_>>(),
        "suggestions": suggestions.iter().map(suggestion_json).collect::<Vec<_>>(),
    })))
}

/// `POST /api/backlog/suggestions/{id}/{accept|reject}`, body `{"project": P, "list": NAME}`
/// (both optional).
pub(super) async fn resolve(
    State(app): State<App>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    authorize(&app, &headers)?;
    if action != "accept" && action != "reject" {
        return Err(ApiError::bad_request(format!(
            "`{action}` is not an action on a suggestion (accept or reject)"
        )));
    }
    let mut fields = body_fields(&body)?;
    let mut client = planner(&app)?;
    let project = fields
        .remove("project")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| DEFAULT_PROJECT.to_owned());
    let resolved = client
        .resolve_suggestion(v1::ResolveSuggestionRequest {
            project,
            id: id.clone(),
            action: action.clone(),
            list: fields.remove("list").unwrap_or_default(),
            tasks: Vec::new(),
        })
        .await
        .map_err(upstream)?
        .into_inner();
    tracing::info!(%id, %action, "suggestion resolved");
    Ok(super::json(&json!({
        "suggestion": resolved.suggestion.as_ref().map(suggestion_json),
        "list": resolved.list.as_ref().map(list_json),
    })))
}
