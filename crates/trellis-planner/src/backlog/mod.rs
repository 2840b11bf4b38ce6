//! The `Backlog` gRPC service: tasks before they run, over the checkpoint-store's database.
//!
//! Every request is checked in full before anything is written (names, placements, relationship
//! targets, dependency cycles, rules); the store then writes each change in one transaction and
//! holds what must hold whatever the client (a task in the queue or in one list, never both).
//! After a task changes, the project's validation rules run (an error-level finding blocks the
//! task with a `validation` block, a clean check lifts it) and, for a queued task, the grouping
//! suggestions that include it are stored.

mod custom;
mod rules;
pub mod runs;
mod sinks;
mod suggestions;
mod templates;
mod wire;

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};
use trellis_checkpoint_store::store::backlog::{
    Backlog as Store, ListRow, ProjectRow, TaskFilter, TaskRow,
};
use trellis_checkpoint_store::store::{Error as StoreError, ErrorKind};
use trellis_core::backlog::grouping;
use trellis_core::backlog::model::check_slug;
use trellis_core::backlog::order::{dependency_cycle, describe_cycle, prerequisites};
use trellis_core::backlog::rules::{Finding, Rule};
use trellis_core::backlog::{
    BacklogTask, Block, BlockKind, FieldError, ListStatus, Placement, TaskStatus,
};
use trellis_core::plan::Limits;
use trellis_proto::v1;
use trellis_proto::v1::backlog_server::Backlog;

pub use custom::CUSTOM_RULE_TIMEOUT;
pub use sinks::TELEGRAM_API;

/// The project every call names unless told otherwise; it is created on first use.
pub const DEFAULT_PROJECT: &str = "default";

/// Default `max_parallel_agents` of a new list.
pub const DEFAULT_MAX_PARALLEL_AGENTS: u32 = 3;

/// The handler type a list's tasks run with unless a run names another.
pub const DEFAULT_TASK_TYPE: &str = "agent";

/// The `Backlog` service over a store.
#[derive(Clone, Debug)]
pub struct BacklogService {
    store: Arc<dyn Store>,
    /// Where list runs start; `None`: this planner starts none.
    coordinator: Option<runs::Coordinator>,
    /// Enforced on the plan of a list run.
    limits: Limits,
}

impl BacklogService {
    /// Serves the backlog of `store`, starting list runs on `coordinator`.
    pub fn new(
        store: Arc<dyn Store>,
        coordinator: Option<runs::Coordinator>,
        limits: Limits,
    ) -> Self {
        Self {
            store,
            coordinator,
            limits,
        }
    }
}

/// Now, in Unix milliseconds.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A store error as a gRPC status (its message says what failed).
fn status(err: StoreError) -> Status {
    let message = err.to_string();
    match err.kind() {
        ErrorKind::InvalidArgument => Status::invalid_argument(message),
        ErrorKind::NotFound => Status::not_found(message),
        ErrorKind::AlreadyExists => Status::already_exists(message),
        ErrorKind::FailedPrecondition => Status::failed_precondition(message),
        ErrorKind::DataLoss => Status::data_loss(message),
        ErrorKind::Unavailable => Status::unavailable(message),
        ErrorKind::Internal => Status::internal(message),
    }
}

/// Bad input: INVALID_ARGUMENT naming the field.
fn invalid(err: FieldError) -> Status {
    Status::invalid_argument(err.to_string())
}

fn task_number(number: u32) -> Result<u32, Status> {
    if number == 0 {
        return Err(Status::invalid_argument(
            "number: missing (the task's number, such as 12 for T-12)",
        ));
    }
    Ok(number)
}

impl BacklogService {
    async fn project(&self, project: &str) -> Result<ProjectRow, Status> {
        check_slug("project", project).map_err(invalid)?;
        if let Some(row) = self.store.project(project).await.map_err(status)? {
            return Ok(row);
        }
        if project == DEFAULT_PROJECT {
            let row = ProjectRow {
                project: DEFAULT_PROJECT.to_owned(),
                name: DEFAULT_PROJECT.to_owned(),
                description: String::new(),
                weights: grouping::Weights::default(),
                created_at_unix_ms: now_ms(),
            };
            if let Err(err) = self.store.create_project(&row).await {
                // Another call created it meanwhile: the same project.
                if err.kind() != ErrorKind::AlreadyExists {
                    return Err(status(err));
                }
            }
        }
        self.store
            .project(project)
            .await
            .map_err(status)?
            .ok_or_else(|| {
                Status::not_found(format!(
                    "project {project} not found (create it with `trellis projects create \
                     {project}`)"
                ))
            })
    }

    async fn list_row(&self, project: &str, name: &str) -> Result<ListRow, Status> {
        self.store
            .list(project, name)
            .await
            .map_err(status)?
            .ok_or_else(|| Status::not_found(format!("list {name} not found in project {project}")))
    }

    async fn task_row(&self, project: &str, number: u32) -> Result<TaskRow, Status> {
        self.store
            .task(project, number)
            .await
            .map_err(status)?
            .ok_or_else(|| {
                Status::not_found(format!("task T-{number} not found in project {project}"))
            })
    }

    async fn all_tasks(&self, project: &str) -> Result<Vec<TaskRow>, Status> {
        self.store
            .tasks(project, &TaskFilter::default())
            .await
            .map_err(status)
    }

    /// Writes a task as stored now, with the number of the project's tasks that wait for it
    /// (one read of the project's tasks).
    async fn view(&self, project: &str, number: u32) -> Result<v1::BacklogTaskView, Status> {
        let all = self.all_tasks(project).await?;
        views(&all, |row| row.task.number == number)
            .pop()
            .ok_or_else(|| {
                Status::not_found(format!("task T-{number} not found in project {project}"))
            })
    }

    /// Checks `task`'s relationships against the project's other tasks: every target exists and
    /// no dependency cycle forms.
    fn check_links(task: &BacklogTask, others: &[TaskRow]) -> Result<(), Status> {
        for (i, link) in task.links.iter().enumerate() {
            if !others.iter().any(|row| row.task.number == link.target) {
                return Err(Status::invalid_argument(format!(
                    "fields.relationships[{i}].target: task T-{} does not exist in this project",
                    link.target
                )));
            }
        }
        let mut tasks: Vec<BacklogTask> = others
            .iter()
            .filter(|row| row.task.number != task.number)
            .map(|row| row.task.clone())
            .collect();
        tasks.push(task.clone());
        if let Some(cycle) = dependency_cycle(&tasks) {
            return Err(Status::invalid_argument(format!(
                "fields.relationships: the dependencies would form a cycle: {} (a task cannot \
                 wait for itself)",
                describe_cycle(&cycle)
            )));
        }
        Ok(())
    }

    /// The answer to a change of one task: the task as stored now, the findings, the suggestions.
    async fn change(
        &self,
        project: &str,
        number: u32,
        findings: &[Finding],
        suggestions: Vec<v1::GroupingSuggestion>,
    ) -> Result<Response<v1::TaskChange>, Status> {
        Ok(Response::new(v1::TaskChange {
            task: Some(self.view(project, number).await?),
            findings: findings.iter().map(wire::finding_to_proto).collect(),
            suggestions,
        }))
    }
}

/// Writes the tasks of `all` that `keep` picks, each with the number of tasks among `all` that
/// wait for it (counted once for all of them).
fn views(all: &[TaskRow], keep: impl Fn(&TaskRow) -> bool) -> Vec<v1::BacklogTaskView> {
    let tasks: Vec<BacklogTask> = all.iter().map(|row| row.task.clone()).collect();
    let mut waiting: HashMap<u32, usize> = HashMap::new();
    for prerequisite in prerequisites(&tasks).values().flatten() {
        *waiting.entry(*prerequisite).or_default() += 1;
    }
    all.iter()
        .filter(|row| keep(row))
        .map(|row| {
            let count = waiting.get(&row.task.number).copied().unwrap_or(0);
            wire::task_to_proto(row, count)
        })
        .collect()
}

/// Reads the optional list filter of a request.
fn placement_filter(queue: &str, list: &str) -> Result<Option<Placement>, Status> {
    if queue.is_empty() && list.is_empty() {
        return Ok(None);
    }
    Placement::from_parts(Some(queue), Some(list))
        .map(Some)
        .map_err(invalid)
}

#[tonic::async_trait]
impl Backlog for BacklogService {
    async fn create_project(
        &self,
        request: Request<v1::CreateProjectRequest>,
    ) -> Result<Response<v1::BacklogProject>, Status> {
        let request = request.into_inner();
        check_slug("project", &request.project).map_err(invalid)?;
        let weights = wire::weights(request.weights.as_ref()).map_err(invalid)?;
        let row = ProjectRow {
            name: if request.name.trim().is_empty() {
                request.project.clone()
            } else {
                request.name
            },
            project: request.project,
            description: request.description,
            weights,
            created_at_unix_ms: now_ms(),
        };
        self.store.create_project(&row).await.map_err(status)?;
        Ok(Response::new(wire::project_to_proto(&row)))
    }

    async fn list_projects(
        &self,
        _request: Request<v1::ListProjectsRequest>,
    ) -> Result<Response<v1::ListProjectsResponse>, Status> {
        let projects = self.store.projects().await.map_err(status)?;
        Ok(Response::new(v1::ListProjectsResponse {
            projects: projects.iter().map(wire::project_to_proto).collect(),
        }))
    }

    async fn set_grouping_weights(
        &self,
        request: Request<v1::SetGroupingWeightsRequest>,
    ) -> Result<Response<v1::BacklogProject>, Status> {
        let request = request.into_inner();
        let mut project = self.project(&request.project).await?;
        let Some(weights) = request.weights.as_ref() else {
            return Err(Status::invalid_argument("weights: missing"));
        };
        project.weights = wire::weights(Some(weights)).map_err(invalid)?;
        self.store
            .set_weights(&project.project, &project.weights)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::project_to_proto(&project)))
    }

    async fn add_task(
        &self,
        request: Request<v1::AddTaskRequest>,
    ) -> Result<Response<v1::TaskChange>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let placement =
            Placement::from_parts(Some(&request.queue), Some(&request.list)).map_err(invalid)?;
        if let Placement::List(name) = &placement {
            self.list_row(&project.project, name).await?;
        }
        let fields = request
            .fields
            .ok_or_else(|| Status::invalid_argument("fields: missing"))?;
        let base = self
            .task_base(&project.project, &request.template, placement.clone())
            .await?;
        // From a template, only the fields the request gives replace the template's.
        let given = (!request.template.is_empty()).then(|| templates::given_fields(&fields));
        let task = wire::task_fields(&fields, base, given.as_deref()).map_err(invalid)?;
        let others = self.all_tasks(&project.project).await?;
        Self::check_links(&task, &others)?;
        let number = self
            .store
            .add_task(&project.project, &task, now_ms())
            .await
            .map_err(status)?;
        if !request.template.is_empty() {
            self.store
                .template_used(&project.project, &request.template, now_ms())
                .await
                .map_err(status)?;
        }
        let stored = self.task_row(&project.project, number).await?;
        let findings = self
            .apply_rules(&project.project, &stored.task, false)
            .await?;
        let suggestions = if placement == Placement::Evaluation {
            self.suggest_around(&project, number, "task_created")
                .await?
        } else {
            Vec::new()
        };
        self.change(&project.project, number, &findings, suggestions)
            .await
    }

    async fn get_task(
        &self,
        request: Request<v1::GetTaskRequest>,
    ) -> Result<Response<v1::BacklogTaskView>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let number = task_number(request.number)?;
        Ok(Response::new(self.view(&project.project, number).await?))
    }

    async fn list_tasks(
        &self,
        request: Request<v1::ListTasksRequest>,
    ) -> Result<Response<v1::ListTasksResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let placement = placement_filter(&request.queue, &request.list)?;
        if let Some(Placement::List(name)) = &placement {
            self.list_row(&project.project, name).await?;
        }
        let status_filter = if request.status.is_empty() {
            None
        } else {
            Some(TaskStatus::parse("status", &request.status).map_err(invalid)?)
        };
        let all = self.all_tasks(&project.project).await?;
        let tasks = views(&all, |row| {
            placement.as_ref().is_none_or(|p| &row.task.placement == p)
                && status_filter.is_none_or(|status| row.task.status == status)
        });
        Ok(Response::new(v1::ListTasksResponse { tasks }))
    }

    async fn edit_task(
        &self,
        request: Request<v1::EditTaskRequest>,
    ) -> Result<Response<v1::TaskChange>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let number = task_number(request.number)?;
        if request.update_mask.is_empty() {
            return Err(Status::invalid_argument(format!(
                "update_mask: empty (name the fields to change: {})",
                wire::EDITABLE.join(", ")
            )));
        }
        for (i, name) in request.update_mask.iter().enumerate() {
            if !wire::EDITABLE.contains(&name.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "update_mask[{i}]: {name:?} cannot be edited (expected one of: {})",
                    wire::EDITABLE.join(", ")
                )));
            }
        }
        let stored = self.task_row(&project.project, number).await?;
        let fields = request.fields.unwrap_or_default();
        let task = wire::task_fields(&fields, stored.task.clone(), Some(&request.update_mask))
            .map_err(invalid)?;
        let others = self.all_tasks(&project.project).await?;
        let links_changed = task.links != stored.task.links;
        if links_changed {
            Self::check_links(&task, &others)?;
        }
        self.store
            .update_task(&project.project, &task, now_ms())
            .await
            .map_err(status)?;
        let stored = self.task_row(&project.project, number).await?;
        let findings = self
            .apply_rules(&project.project, &stored.task, false)
            .await?;
        let suggestions = if links_changed && stored.task.placement == Placement::Evaluation {
            self.suggest_around(&project, number, "dependency_changed")
                .await?
        } else {
            Vec::new()
        };
        self.change(&project.project, number, &findings, suggestions)
            .await
    }

    async fn block_task(
        &self,
        request: Request<v1::BlockTaskRequest>,
    ) -> Result<Response<v1::BacklogTaskView>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let number = task_number(request.number)?;
        let kind = if request.kind.is_empty() {
            BlockKind::Manual
        } else {
            BlockKind::parse("kind", &request.kind).map_err(invalid)?
        };
        if request.reason.trim().is_empty() {
            return Err(Status::invalid_argument(
                "reason: missing (say why the task is blocked)",
            ));
        }
        let blocking_task = match request.blocking_task {
            0 => None,
            blocking => {
                self.task_row(&project.project, blocking).await?;
                Some(blocking)
            }
        };
        if kind == BlockKind::Dependency && blocking_task.is_none() {
            return Err(Status::invalid_argument(
                "blocking_task: a dependency block names the task it waits for",
            ));
        }
        self.task_row(&project.project, number).await?;
        let block = Block {
            kind,
            reason: request.reason,
            blocking_task,
        };
        self.store
            .add_block(&project.project, number, &block, now_ms())
            .await
            .map_err(status)?;
        Ok(Response::new(self.view(&project.project, number).await?))
    }

    async fn unblock_task(
        &self,
        request: Request<v1::UnblockTaskRequest>,
    ) -> Result<Response<v1::BacklogTaskView>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let number = task_number(request.number)?;
        let kind = if request.kind.is_empty() {
            None
        } else {
            Some(BlockKind::parse("kind", &request.kind).map_err(invalid)?)
        };
        let row = self.task_row(&project.project, number).await?;
        if !row
            .task
            .blocks
            .iter()
            .any(|block| kind.is_none_or(|kind| block.kind == kind))
        {
            return Err(Status::failed_precondition(format!(
                "T-{number} has no open {}block",
                kind.map(|k| format!("{k} ")).unwrap_or_default()
            )));
        }
        let resolution = if request.resolution.trim().is_empty() {
            "unblocked by hand".to_owned()
        } else {
            request.resolution
        };
        self.store
            .resolve_blocks(&project.project, number, kind, &resolution, now_ms())
            .await
            .map_err(status)?;
        Ok(Response::new(self.view(&project.project, number).await?))
    }

    async fn check_task(
        &self,
        request: Request<v1::CheckTaskRequest>,
    ) -> Result<Response<v1::TaskChange>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let number = task_number(request.number)?;
        let row = self.task_row(&project.project, number).await?;
        let findings = self.apply_rules(&project.project, &row.task, true).await?;
        self.change(&project.project, number, &findings, Vec::new())
            .await
    }

    async fn create_list(
        &self,
        request: Request<v1::CreateListRequest>,
    ) -> Result<Response<v1::TaskListView>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        check_slug("name", &request.name).map_err(invalid)?;
        let now = now_ms();
        let row = ListRow {
            project: project.project,
            name: request.name,
            description: request.description,
            status: ListStatus::Draft,
            max_parallel_agents: match request.max_parallel_agents {
                0 => DEFAULT_MAX_PARALLEL_AGENTS,
                n => n,
            },
            auto_execute: request.auto_execute,
            runs: 0,
            total_tasks: 0,
            completed_tasks: 0,
            failed_tasks: 0,
            created_at_unix_ms: now,
            updated_at_unix_ms: now,
        };
        self.store.create_list(&row).await.map_err(status)?;
        Ok(Response::new(wire::list_to_proto(&row)))
    }

    async fn get_list(
        &self,
        request: Request<v1::GetListRequest>,
    ) -> Result<Response<v1::GetListResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let list = self.list_row(&project.project, &request.name).await?;
        let all = self.all_tasks(&project.project).await?;
        let placement = Placement::List(list.name.clone());
        let tasks = views(&all, |row| row.task.placement == placement);
        Ok(Response::new(v1::GetListResponse {
            list: Some(wire::list_to_proto(&list)),
            tasks,
        }))
    }

    async fn list_lists(
        &self,
        request: Request<v1::ListListsRequest>,
    ) -> Result<Response<v1::ListListsResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let lists = self.store.lists(&project.project).await.map_err(status)?;
        Ok(Response::new(v1::ListListsResponse {
            lists: lists.iter().map(wire::list_to_proto).collect(),
        }))
    }

    async fn move_task(
        &self,
        request: Request<v1::MoveTaskRequest>,
    ) -> Result<Response<v1::BacklogTaskView>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let number = task_number(request.number)?;
        let placement = if request.list.is_empty() {
            if request.position != 0 {
                return Err(Status::invalid_argument(
                    "position: the evaluation queue has no positions (name a list)",
                ));
            }
            Placement::Evaluation
        } else {
            self.list_row(&project.project, &request.list).await?;
            Placement::List(request.list.clone())
        };
        self.task_row(&project.project, number).await?;
        let position = (request.position != 0).then_some(request.position);
        self.store
            .place_task(&project.project, number, &placement, position, now_ms())
            .await
            .map_err(status)?;
        Ok(Response::new(self.view(&project.project, number).await?))
    }

    async fn run_list(
        &self,
        request: Request<v1::RunListRequest>,
    ) -> Result<Response<v1::ListRunView>, Status> {
        self.run_list_now(request).await
    }

    async fn list_runs(
        &self,
        request: Request<v1::ListRunsRequest>,
    ) -> Result<Response<v1::ListRunsResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let list = self.list_row(&project.project, &request.name).await?;
        let runs = self
            .store
            .runs(&project.project, &list.name)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::ListRunsResponse {
            runs: runs.iter().map(runs::run_to_proto).collect(),
        }))
    }

    async fn put_rule(
        &self,
        request: Request<v1::PutRuleRequest>,
    ) -> Result<Response<v1::ValidationRuleSpec>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let spec = wire::rule_spec(
            request
                .rule
                .as_ref()
                .ok_or_else(|| Status::invalid_argument("rule: missing"))?,
        );
        let prefix = |err: FieldError| FieldError::new(format!("rule.{}", err.field), err.message);
        Rule::parse(&spec).map_err(|err| invalid(prefix(err)))?;
        self.store
            .put_rule(&project.project, &spec)
            .await
            .map_err(status)?;
        Ok(Response::new(wire::rule_to_proto(&spec)))
    }

    async fn list_rules(
        &self,
        request: Request<v1::ListRulesRequest>,
    ) -> Result<Response<v1::ListRulesResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let rules = self.store.rules(&project.project).await.map_err(status)?;
        Ok(Response::new(v1::ListRulesResponse {
            rules: rules.iter().map(wire::rule_to_proto).collect(),
        }))
    }

    async fn delete_rule(
        &self,
        request: Request<v1::DeleteRuleRequest>,
    ) -> Result<Response<v1::DeleteRuleResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let deleted = self
            .store
            .delete_rule(&project.project, &request.name)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::DeleteRuleResponse { deleted }))
    }

    async fn suggest_groups(
        &self,
        request: Request<v1::SuggestGroupsRequest>,
    ) -> Result<Response<v1::SuggestGroupsResponse>, Status> {
        self.suggest_groups_now(request).await
    }

    async fn list_suggestions(
        &self,
        request: Request<v1::ListSuggestionsRequest>,
    ) -> Result<Response<v1::SuggestGroupsResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        const STATUSES: [&str; 4] = ["pending", "accepted", "modified", "rejected"];
        if !request.status.is_empty() && !STATUSES.contains(&request.status.as_str()) {
            return Err(Status::invalid_argument(format!(
                "status: unknown suggestion status {:?} (expected one of: {})",
                request.status,
                STATUSES.join(", ")
            )));
        }
        let status_filter = (!request.status.is_empty()).then_some(request.status.as_str());
        let rows = self
            .store
            .suggestions(&project.project, status_filter)
            .await
            .map_err(status)?;
        Ok(Response::new(v1::SuggestGroupsResponse {
            suggestions: rows.iter().map(wire::suggestion_to_proto).collect(),
        }))
    }

    async fn resolve_suggestion(
        &self,
        request: Request<v1::ResolveSuggestionRequest>,
    ) -> Result<Response<v1::ResolveSuggestionResponse>, Status> {
        self.resolve_suggestion_now(request).await
    }

    async fn add_sink(
        &self,
        request: Request<v1::AddSinkRequest>,
    ) -> Result<Response<v1::AddSinkResponse>, Status> {
        self.add_sink_now(request).await
    }

    async fn list_sinks(
        &self,
        request: Request<v1::ListSinksRequest>,
    ) -> Result<Response<v1::ListSinksResponse>, Status> {
        self.list_sinks_now(request).await
    }

    async fn remove_sink(
        &self,
        request: Request<v1::RemoveSinkRequest>,
    ) -> Result<Response<v1::RemoveSinkResponse>, Status> {
        self.remove_sink_now(request).await
    }

    async fn list_deliveries(
        &self,
        request: Request<v1::ListDeliveriesRequest>,
    ) -> Result<Response<v1::ListDeliveriesResponse>, Status> {
        self.list_deliveries_now(request).await
    }

    async fn put_template(
        &self,
        request: Request<v1::PutTemplateRequest>,
    ) -> Result<Response<v1::TaskTemplate>, Status> {
        self.put_template_now(request).await
    }

    async fn list_templates(
        &self,
        request: Request<v1::ListTemplatesRequest>,
    ) -> Result<Response<v1::ListTemplatesResponse>, Status> {
        self.list_templates_now(request).await
    }

    async fn delete_template(
        &self,
        request: Request<v1::DeleteTemplateRequest>,
    ) -> Result<Response<v1::DeleteTemplateResponse>, Status> {
        self.delete_template_now(request).await
    }
}
