//! Grouping suggestions: stored when a queued task is added or its relationships change, and on
//! demand; accepted (creating the list and moving the tasks in one transaction), modified or
//! rejected once.

use tonic::{Request, Response, Status};
use trellis_checkpoint_store::store::backlog::{ListRow, ProjectRow, SuggestionRow};
use trellis_core::backlog::grouping::{self, DEFAULT_THRESHOLD};
use trellis_core::backlog::model::check_slug;
use trellis_core::backlog::{BacklogTask, ListStatus};
use trellis_proto::v1;
use uuid::Uuid;

use super::{BacklogService, DEFAULT_MAX_PARALLEL_AGENTS, invalid, now_ms, status, wire};

impl BacklogService {
    /// Stores the pending suggestions that include `trigger` (when it is queued), unless the
    /// same group is already pending; returns what was stored.
    pub(super) async fn suggest_around(
        &self,
        project: &ProjectRow,
        trigger: u32,
        triggered_by: &str,
    ) -> Result<Vec<v1::GroupingSuggestion>, Status> {
        let rows = self.all_tasks(&project.project).await?;
        let tasks: Vec<BacklogTask> = rows.into_iter().map(|row| row.task).collect();
        let found = grouping::suggest_for(&tasks, &project.weights, DEFAULT_THRESHOLD, trigger);
        self.store_suggestions(project, found, triggered_by, Some(trigger))
            .await
    }

    pub(super) async fn store_suggestions(
        &self,
        project: &ProjectRow,
        found: Vec<grouping::Suggestion>,
        triggered_by: &str,
        trigger: Option<u32>,
    ) -> Result<Vec<v1::GroupingSuggestion>, Status> {
        let pending = self
            .store
            .suggestions(&project.project, Some("pending"))
            .await
            .map_err(status)?;
        let now = now_ms();
        let fresh: Vec<SuggestionRow> = found
            .into_iter()
            .filter(|suggestion| {
                !pending
                    .iter()
                    .any(|row| row.suggestion.tasks == suggestion.tasks)
            })
            .map(|suggestion| SuggestionRow {
                suggestion_id: Uuid::now_v7(),
                project: project.project.clone(),
                status: "pending".to_owned(),
                suggestion,
                triggered_by: triggered_by.to_owned(),
                trigger_task: trigger,
                created_list: None,
                created_at_unix_ms: now,
                resolved_at_unix_ms: None,
            })
            .collect();
        self.store
            .insert_suggestions(&fresh)
            .await
            .map_err(status)?;
        Ok(fresh.iter().map(wire::suggestion_to_proto).collect())
    }

    pub(super) async fn suggest_groups_now(
        &self,
        request: Request<v1::SuggestGroupsRequest>,
    ) -> Result<Response<v1::SuggestGroupsResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let threshold = match request.threshold {
            0.0 => DEFAULT_THRESHOLD,
            t if (0.0..=1.0).contains(&t) => t,
            t => {
                return Err(Status::invalid_argument(format!(
                    "threshold: {t} is not a score (expected 0-1; 0 = the default \
                     {DEFAULT_THRESHOLD})"
                )));
            }
        };
        let tasks: Vec<BacklogTask> = self
            .all_tasks(&project.project)
            .await?
            .into_iter()
            .map(|row| row.task)
            .collect();
        let found = grouping::suggest(&tasks, &project.weights, threshold);
        let suggestions = self
            .store_suggestions(&project, found, "manual", None)
            .await?;
        Ok(Response::new(v1::SuggestGroupsResponse { suggestions }))
    }

    pub(super) async fn resolve_suggestion_now(
        &self,
        request: Request<v1::ResolveSuggestionRequest>,
    ) -> Result<Response<v1::ResolveSuggestionResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let id: Uuid = request.id.parse().map_err(|err| {
            Status::invalid_argument(format!(
                "id: {:?} is not a suggestion id: {err}",
                request.id
            ))
        })?;
        let rows = self
            .store
            .suggestions(&project.project, None)
            .await
            .map_err(status)?;
        let Some(row) = rows.iter().find(|row| row.suggestion_id == id) else {
            return Err(Status::not_found(format!(
                "suggestion {id} not found in project {}",
                project.project
            )));
        };
        let now = now_ms();
        let list = match request.action.as_str() {
            "reject" => {
                self.store
                    .reject_suggestion(&project.project, id, now)
                    .await
                    .map_err(status)?;
                None
            }
            "accept" | "modify" => {
                let tasks = if request.action == "modify" {
                    if request.tasks.len() < 2 {
                        return Err(Status::invalid_argument(
                            "tasks: a modified suggestion names at least two tasks",
                        ));
                    }
                    let mut tasks = request.tasks.clone();
                    tasks.sort_unstable();
                    tasks.dedup();
                    tasks
                } else {
                    row.suggestion.tasks.clone()
                };
                let name = if request.list.is_empty() {
                    row.suggestion.name.clone()
                } else {
                    request.list.clone()
                };
                check_slug("list", &name).map_err(invalid)?;
                let list = ListRow {
                    project: project.project.clone(),
                    name,
                    description: row.suggestion.reason.clone(),
                    status: ListStatus::Draft,
                    max_parallel_agents: DEFAULT_MAX_PARALLEL_AGENTS,
                    auto_execute: false,
                    runs: 0,
                    total_tasks: 0,
                    completed_tasks: 0,
                    failed_tasks: 0,
                    created_at_unix_ms: now,
                    updated_at_unix_ms: now,
                };
                self.store
                    .accept_suggestion(id, &list, &tasks, now)
                    .await
                    .map_err(status)?;
                Some(self.list_row(&project.project, &list.name).await?)
            }
            other => {
                return Err(Status::invalid_argument(format!(
                    "action: unknown action {other:?} (expected accept, modify or reject)"
                )));
            }
        };
        let rows = self
            .store
            .suggestions(&project.project, None)
            .await
            .map_err(status)?;
        let suggestion = rows
            .iter()
            .find(|row| row.suggestion_id == id)
            .map(wire::suggestion_to_proto);
        Ok(Response::new(v1::ResolveSuggestionResponse {
            suggestion,
            list: list.as_ref().map(wire::list_to_proto),
        }))
    }
}
