//! Runs of a list: starting one on the coordinator, and following its execution.
//!
//! A run is recorded (`starting`) before its execution starts, with the idempotency key
//! `backlog/<project>/<list>/<run>`, so a start the coordinator stored but did not answer is not
//! started twice by a retry. The follower reads the execution's task instances from the
//! checkpoint-store's read model (the same database) and writes the list's item statuses and the
//! run's counters when they change, and the run's end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use trellis_checkpoint_store::store::backlog::{ListRow, RunProgress, RunRow};
use trellis_checkpoint_store::store::{Page, Store as ReadModel, TaskInstanceQuery};
use trellis_core::backlog::model::parse_task_ref;
use trellis_core::backlog::run::item_status;
use trellis_core::backlog::run::{ListRun, list_plan};
use trellis_core::backlog::{BacklogTask, ItemStatus, Placement};
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_core::machine::ExecutionState;
use trellis_grpc::{AuthChannel, ClientSecurity};
use trellis_proto::v1;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use uuid::Uuid;

use super::{BacklogService, DEFAULT_TASK_TYPE, now_ms, status};

/// How often running runs are read from the read model.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// How long a call starting a run's execution may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a run may stay `starting` before the follower takes it for one whose start a crash
/// cut off, and starts it again (under the same idempotency key): well past [`START_TIMEOUT`],
/// so a start still in flight is not doubled.
pub const RESTART_AFTER: Duration = Duration::from_secs(30);

/// Most task instances read per page.
const PAGE: u32 = 1_000;

/// Where runs start: the coordinator and the credentials to call it with.
#[derive(Clone, Debug)]
pub struct Coordinator {
    pub url: String,
    pub security: ClientSecurity,
}

impl Coordinator {
    /// A client of the coordinator (connected on first use), whose calls give up after
    /// [`START_TIMEOUT`].
    fn client(&self) -> Result<CoordinatorClient<AuthChannel>, String> {
        let endpoint = self
            .security
            .endpoint(&self.url)
            .map_err(|err| format!("coordinator address {}: {err}", self.url))?
            .timeout(START_TIMEOUT);
        Ok(CoordinatorClient::new(
            self.security.wrap(endpoint.connect_lazy()),
        ))
    }

    /// Answers a question on the coordinator (which accepts one answer per question); returns
    /// the refusal's status as is.
    pub(crate) async fn answer(
        &self,
        execution_id: &str,
        question_id: &str,
        answer: &str,
        answered_by: &str,
    ) -> Result<v1::AnswerQuestionResponse, Status> {
        let mut client = self.client().map_err(Status::unavailable)?;
        client
            .answer_question(v1::AnswerQuestionRequest {
                execution_id: execution_id.to_owned(),
                question_id: question_id.to_owned(),
                answer: answer.to_owned(),
                answered_by: answered_by.to_owned(),
            })
            .await
            .map(Response::into_inner)
    }

    /// Starts run `run_number` of a list with `plan` under the run's idempotency key and returns
    /// the execution's id.
    async fn start(
        &self,
        plan: v1::Plan,
        project: &str,
        list: &str,
        run_number: u32,
    ) -> Result<Uuid, String> {
        let start = v1::StartExecutionRequest {
            plan_source: Some(v1::start_execution_request::PlanSource::Plan(plan)),
            options: Some(v1::ExecutionOptions {
                idempotency_key: format!("backlog/{project}/{list}/{run_number}"),
                labels: [
                    ("backlog-project".to_owned(), project.to_owned()),
                    ("backlog-list".to_owned(), list.to_owned()),
                    ("backlog-run".to_owned(), run_number.to_string()),
                ]
                .into(),
                namespace: String::new(),
            }),
        };
        let response = self
            .client()?
            .start_execution(start)
            .await
            .map_err(|status| {
                format!(
                    "the coordinator at {} refused the run: {}",
                    self.url,
                    status.message()
                )
            })?;
        response
            .into_inner()
            .execution_id
            .parse::<Uuid>()
            .map_err(|err| format!("the coordinator answered a bad execution id: {err}"))
    }
}

/// Writes a run.
pub fn run_to_proto(run: &RunRow) -> v1::ListRunView {
    v1::ListRunView {
        project: run.project.clone(),
        list: run.list.clone(),
        run_number: run.run_number,
        execution_id: run
            .execution_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        status: run.status.clone(),
        task_type: run.task_type.clone(),
        tasks_total: run.tasks_total,
        tasks_completed: run.tasks_completed,
        tasks_failed: run.tasks_failed,
        reason: run.reason.clone(),
        created_at_unix_ms: run.created_at_unix_ms,
        ended_at_unix_ms: run.ended_at_unix_ms.unwrap_or(0),
    }
}

/// What the read model says of a run's execution now; `None` while it has no row yet.
async fn progress(read_model: &dyn ReadModel, run: &RunRow) -> Result<Option<RunProgress>, String> {
    let Some(id) = run.execution_id else {
        return Ok(None);
    };
    let execution_id = ExecutionId(id);
    let Some(execution) = read_model
        .get_execution(execution_id)
        .await
        .map_err(|err| err.to_string())?
    else {
        return Ok(None);
    };
    let mut records = Vec::new();
    let mut after = None;
    loop {
        let page = read_model
            .query_task_instances(&TaskInstanceQuery {
                execution_id,
                run_number: None,
                states: Vec::new(),
                task_id: None,
                parent_task_instance_id: None,
                subtask_group_id: None,
                task_instance_ids: Vec::new(),
                page: Page { after, limit: PAGE },
            })
            .await
            .map_err(|err| err.to_string())?;
        let full = page.len() == usize::try_from(PAGE).unwrap_or(usize::MAX);
        after = page.last().map(|record| record.task_instance_id);
        records.extend(page);
        if !full {
            break;
        }
    }
    // Plan tasks are the children of the execution's root instance (the one without a parent);
    // members of groups their handlers spawned are not list items.
    let roots: HashSet<TaskInstanceId> = records
        .iter()
        .filter(|record| record.parent_task_instance_id.is_none())
        .map(|record| record.task_instance_id)
        .collect();
    // The latest instance of each plan task (ids sort by creation).
    let mut latest: BTreeMap<u32, (TaskInstanceId, ItemStatus)> = BTreeMap::new();
    for record in &records {
        if !record
            .parent_task_instance_id
            .is_some_and(|parent| roots.contains(&parent))
        {
            continue;
        }
        let Ok(task) = parse_task_ref("task_id", &record.task_id) else {
            continue;
        };
        let status = item_status(record.state);
        match latest.get(&task) {
            Some((seen, _)) if *seen > record.task_instance_id => {}
            _ => {
                latest.insert(task, (record.task_instance_id, status));
            }
        }
    }
    let ended = match execution.state {
        ExecutionState::Completed => Some(("completed".to_owned(), String::new())),
        ExecutionState::Failed => Some(("failed".to_owned(), execution.reason.clone())),
        ExecutionState::Cancelled => Some(("cancelled".to_owned(), execution.reason.clone())),
        _ => None,
    };
    Ok(Some(RunProgress {
        items: latest
            .into_iter()
            .map(|(task, (_, status))| (task, status))
            .collect(),
        ended,
    }))
}

/// Follows every running run until `shutdown`: reads each one's execution every
/// [`FOLLOW_EVERY`] and writes what changed; and starts again the runs a crash left `starting`
/// ([`RESTART_AFTER`]). A failure is logged and tried again next time.
pub async fn follow(
    service: BacklogService,
    read_model: Arc<dyn ReadModel>,
    shutdown: CancellationToken,
) {
    let backlog = service.store.clone();
    let mut written: HashMap<(String, String, u32), RunProgress> = HashMap::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
        service.restart_orphans().await;
        let runs = match backlog.running_runs().await {
            Ok(runs) => runs,
            Err(err) => {
                tracing::warn!(%err, "cannot read the running list runs; trying again");
                continue;
            }
        };
        written.retain(|key, _| {
            runs.iter()
                .any(|run| (&run.project, &run.list, run.run_number) == (&key.0, &key.1, key.2))
        });
        for run in runs {
            let key = (run.project.clone(), run.list.clone(), run.run_number);
            let now = match progress(&*read_model, &run).await {
                Ok(Some(now)) => now,
                Ok(None) => continue,
                Err(err) => {
                    tracing::warn!(list = %run.list, run = run.run_number, %err,
                        "cannot read a list run's execution; trying again");
                    continue;
                }
            };
            if written.get(&key) == Some(&now) {
                continue;
            }
            let at = now_ms();
            match backlog
                .follow_run(&run.project, &run.list, run.run_number, &now, at)
                .await
            {
                Ok(()) => {
                    if let Some((status, _)) = &now.ended {
                        tracing::info!(project = %run.project, list = %run.list,
                            run = run.run_number, %status, "list run ended");
                    }
                    written.insert(key, now);
                }
                Err(err) => tracing::warn!(list = %run.list, run = run.run_number, %err,
                    "cannot record a list run's progress; trying again"),
            }
        }
    }
}

impl BacklogService {
    pub(super) async fn run_list_now(
        &self,
        request: Request<v1::RunListRequest>,
    ) -> Result<Response<v1::ListRunView>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let list = self.list_row(&project.project, &request.name).await?;
        if self.coordinator.is_none() {
            return Err(Status::failed_precondition(
                "this planner starts no runs: start it with --coordinator URL (trellis dev does)",
            ));
        }
        let task_type = if request.task_type.is_empty() {
            DEFAULT_TASK_TYPE
        } else {
            request.task_type.as_str()
        };
        // Everything is checked before the run is recorded: a refused run writes nothing.
        self.run_plan(&list, list.runs + 1, task_type, &request.queue)
            .await?;
        let run_number = self
            .store
            .start_run(
                &project.project,
                &list.name,
                task_type,
                &request.queue,
                now_ms(),
            )
            .await
            .map_err(status)?;
        let run = self
            .start_recorded(&list, run_number, task_type, &request.queue)
            .await?;
        if run.status == "failed" {
            return Err(Status::unavailable(run.reason));
        }
        Ok(Response::new(run_to_proto(&run)))
    }

    /// The plan of run `run_number` of `list` as the list is now.
    async fn run_plan(
        &self,
        list: &ListRow,
        run_number: u32,
        task_type: &str,
        queue: &str,
    ) -> Result<v1::Plan, Status> {
        let all: Vec<BacklogTask> = self
            .all_tasks(&list.project)
            .await?
            .into_iter()
            .map(|row| row.task)
            .collect();
        // `all_tasks` orders a list's tasks by position.
        let placement = Placement::List(list.name.clone());
        let listed: Vec<BacklogTask> = all
            .iter()
            .filter(|task| task.placement == placement)
            .cloned()
            .collect();
        let run = ListRun {
            project: &list.project,
            list: &list.name,
            run_number,
            max_parallel_agents: list.max_parallel_agents,
            task_type,
            queue: (!queue.is_empty()).then_some(queue),
        };
        let spec = list_plan(&run, &listed, &all)
            .map_err(|err| Status::failed_precondition(err.to_string()))?;
        let plan = trellis_core::plan::compile(spec, &self.limits).map_err(|errors| {
            Status::invalid_argument(format!(
                "list {} does not make a valid plan: {errors}",
                list.name
            ))
        })?;
        Ok(trellis_wire::plan::to_proto(&plan))
    }

    /// Starts the execution of a run recorded as `starting`, under the run's idempotency key (a
    /// start the coordinator stored but did not answer returns the same execution), and records
    /// how it went; returns the run as recorded.
    async fn start_recorded(
        &self,
        list: &ListRow,
        run_number: u32,
        task_type: &str,
        queue: &str,
    ) -> Result<RunRow, Status> {
        let started = match (
            &self.coordinator,
            self.run_plan(list, run_number, task_type, queue).await,
        ) {
            (None, _) => Err("this planner starts no runs (no --coordinator)".to_owned()),
            (Some(_), Err(refused)) => Err(refused.message().to_owned()),
            (Some(coordinator), Ok(plan)) => {
                coordinator
                    .start(plan, &list.project, &list.name, run_number)
                    .await
            }
        };
        let recorded = match &started {
            Ok(id) => Ok(*id),
            Err(reason) => Err(reason.as_str()),
        };
        self.store
            .run_started(&list.project, &list.name, run_number, recorded, now_ms())
            .await
            .map_err(status)?;
        self.store
            .runs(&list.project, &list.name)
            .await
            .map_err(status)?
            .into_iter()
            .find(|run| run.run_number == run_number)
            .ok_or_else(|| Status::internal(format!("run {run_number} was not recorded")))
    }

    /// Starts the runs a crash left `starting` for longer than [`RESTART_AFTER`].
    async fn restart_orphans(&self) {
        let before = now_ms() - i64::try_from(RESTART_AFTER.as_millis()).unwrap_or(i64::MAX);
        let orphans = match self.store.starting_runs(before).await {
            Ok(orphans) => orphans,
            Err(err) => {
                tracing::warn!(%err, "cannot read the starting list runs; trying again");
                return;
            }
        };
        for run in orphans {
            let list = match self.list_row(&run.project, &run.list).await {
                Ok(list) => list,
                Err(err) => {
                    tracing::warn!(list = %run.list, err = %err.message(), "cannot restart a list run");
                    continue;
                }
            };
            match self
                .start_recorded(&list, run.run_number, &run.task_type, &run.queue)
                .await
            {
                Ok(started) => tracing::info!(project = %run.project, list = %run.list,
                    run = run.run_number, status = %started.status,
                    "a list run left starting was started again"),
                Err(err) => tracing::warn!(list = %run.list, run = run.run_number,
                    err = %err.message(), "cannot restart a list run; trying again"),
            }
        }
    }
}
