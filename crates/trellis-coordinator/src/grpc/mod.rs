//! The `Coordinator` gRPC service: parses and checks requests, sends each to the coordinator that
//! holds the shard it is about (`crate::forward`), asks the coordinator's turn through the
//! executor when that is this one, and maps its domain errors to gRPC statuses, in one place
//! ([`status`]).

use std::pin::Pin;

use futures::Stream;
use futures::future::BoxFuture;
use tonic::{Request, Response, Status};
use trellis_core::ids::{ExecutionId, QuestionId};
use trellis_grpc::access::{Principal, Scope};
use trellis_proto::v1;
use trellis_proto::v1::coordinator_server::Coordinator;

use trellis_grpc::server::principal;

use crate::checkpoints::StoreClient;
use crate::executor::{self, Handle};
use crate::forward::{self, Client, Route, Router};
use crate::turn::{self, Action, Answer, ErrorKind};
use trellis_core::machine::PauseScope;

/// Returns the answer of the expected kind, or an internal error naming what came instead.
macro_rules! expect {
    ($answer:expr, $pattern:pat => $value:expr) => {
        match $answer {
            $pattern => Ok($value),
            other => Err(status(executor::unexpected(&other))),
        }
    };
}

/// The forwarding half of [`CoordinatorService::routed`]: the same call on the holder's client.
macro_rules! forward {
    ($method:ident) => {
        |mut client: Client, request| Box::pin(async move { client.$method(request).await })
    };
}

mod list;
mod logs;
mod observe;
mod outputs;
mod pauses;
mod run;
mod start;

use list::{merge, page};

/// The gRPC face of the coordinator.
pub struct CoordinatorService {
    executor: Handle,
    /// The event stream, for history older than what the coordinator holds in memory.
    events: async_nats::jetstream::stream::Stream,
    router: Router,
    /// The read model lists executions when there is one.
    store: Option<StoreClient>,
    /// Start requests' plans are compiled here, before they reach the turn, within its limits;
    /// small ones are kept.
    plans: turn::PlanCache,
    /// The fleet pauses' bucket (`crate::pauses`).
    pauses: async_nats::jetstream::kv::Store,
    /// Drain requests go to workers over core NATS.
    nats: async_nats::Client,
    /// The stream of task log lines, `TRELLIS_LOGS`.
    logs: async_nats::jetstream::stream::Stream,
    /// The bucket of outputs stored by reference.
    outputs: trellis_bus::Outputs,
}

/// Returns the gRPC status of a domain error: the one place the two meet.
pub(crate) fn status(err: turn::Error) -> Status {
    let code = match err.kind {
        ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::PermissionDenied => tonic::Code::PermissionDenied,
        ErrorKind::FailedPrecondition => tonic::Code::FailedPrecondition,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        ErrorKind::NotOwned { shard } => return forward::not_owned(err.message, shard),
        ErrorKind::DataLoss => tonic::Code::DataLoss,
        ErrorKind::Internal => tonic::Code::Internal,
    };
    Status::new(code, err.message)
}

/// What the service reads from NATS outside the turn.
#[derive(Debug)]
pub(crate) struct Bus {
    /// The event stream, `TRELLIS_EVENTS`.
    pub(crate) events: async_nats::jetstream::stream::Stream,
    /// The fleet pauses' bucket.
    pub(crate) pauses: async_nats::jetstream::kv::Store,
    /// The connection drain requests go out on.
    pub(crate) nats: async_nats::Client,
    /// The stream of task log lines, `TRELLIS_LOGS`.
    pub(crate) logs: async_nats::jetstream::stream::Stream,
    /// The bucket of outputs stored by reference.
    pub(crate) outputs: trellis_bus::Outputs,
}

impl CoordinatorService {
    pub(crate) fn new(
        executor: Handle,
        router: Router,
        store: Option<StoreClient>,
        plan_limits: trellis_core::plan::Limits,
        bus: Bus,
    ) -> Self {
        let Bus {
            events,
            pauses,
            nats,
            logs,
            outputs,
        } = bus;
        Self {
            executor,
            events,
            router,
            store,
            plans: turn::PlanCache::new(plan_limits),
            pauses,
            nats,
            logs,
            outputs,
        }
    }

    /// Answers a call here or forwards it to the coordinator holding `shard` (`None`: a start
    /// that may land on any shard), trying again while the shard moves between coordinators.
    async fn routed<'a, Req, Resp>(
        &'a self,
        request: Request<Req>,
        shard: Option<u32>,
        local: impl Fn(Principal, Req) -> BoxFuture<'a, Result<Resp, Status>> + Send + Sync,
        remote: impl Fn(Client, Request<Req>) -> BoxFuture<'static, Result<Response<Resp>, Status>>
        + Send
        + Sync,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Clone + Send + Sync + 'static,
        Resp: Send,
    {
        let principal = principal(&request)?;
        let (metadata, _, message) = request.into_parts();
        if forward::is_forwarded(&metadata) {
            // Forwarded once already: answered here, whatever this coordinator holds, and the
            // coordinator that forwarded it tries again if the shard moved.
            return local(principal, message).await.map(Response::new);
        }
        let deadline = tokio::time::Instant::now() + self.router.patience();
        loop {
            let (outcome, forwarded) = match self.router.route(shard) {
                Route::Local => {
                    let outcome = local(principal.clone(), message.clone()).await;
                    (outcome.map(Response::new), false)
                }
                Route::Remote { id, client } => {
                    tracing::debug!(coordinator = %id, ?shard, "call forwarded");
                    let request = self.router.outgoing(&metadata, message.clone());
                    (remote(*client, request).await, true)
                }
            };
            // Here, only "not this coordinator's shard" is worth another try; forwarded, any
            // UNAVAILABLE (the owner may have died, or be handing the shard over).
            let moving = |status: &Status| {
                forward::is_not_owned(status)
                    || (forwarded && status.code() == tonic::Code::Unavailable)
            };
            match outcome {
                Err(status) if moving(&status) && tokio::time::Instant::now() < deadline => {
                    // Not this coordinator's shard, or its owner cannot be reached (it died,
                    // or is handing it over): the view changes within a lease TTL.
                    tracing::debug!(?shard, %status, "shard moving; trying again");
                    self.router.settle().await;
                }
                outcome => return outcome,
            }
        }
    }

    /// Asks for `action` on execution `id`, as `scope`, here.
    async fn on(&self, scope: Scope, id: ExecutionId, action: Action) -> Result<Answer, Status> {
        self.executor
            .ask(turn::Request::On { id, scope, action })
            .await
            .map_err(status)
    }

    /// Pauses, resumes or cancels an execution here; returns its state afterwards.
    async fn control(&self, scope: Scope, id: ExecutionId, action: Action) -> Result<i32, Status> {
        match self.on(scope, id, action).await? {
            Answer::State(state) => Ok(state),
            other => Err(status(executor::unexpected(&other))),
        }
    }

    /// Answers `GetExecution` of an execution no log holds from the read model, or with
    /// `not_found` when it has none either (or the caller may not see it).
    async fn read_model_record(
        &self,
        scope: &Scope,
        id: ExecutionId,
        not_found: Status,
    ) -> Result<v1::GetExecutionResponse, Status> {
        let Some(store) = &self.store else {
            return Err(not_found);
        };
        match store.record(id).await {
            Ok(Some(execution)) if scope.allows(&execution.namespace) => {
                Ok(v1::GetExecutionResponse {
                    execution: Some(execution),
                })
            }
            Ok(_) => Err(not_found),
            Err(status) => {
                tracing::debug!(%id, %status, "the read model did not answer");
                Err(not_found)
            }
        }
    }

    /// Succeeds when the execution exists and the caller may see it: in memory, or in the read
    /// model once it left the coordinator's memory.
    async fn visible(&self, scope: Scope, id: ExecutionId) -> Result<(), Status> {
        let kept = scope.clone();
        match self.on(scope, id, Action::Get).await {
            Err(status) if status.code() == tonic::Code::NotFound => {
                self.read_model_record(&kept, id, status).await.map(|_| ())
            }
            answer => answer.map(|_| ()),
        }
    }

    /// The shard of the execution a request names.
    fn shard(&self, execution_id_field: &str) -> Result<(ExecutionId, u32), Status> {
        let id = execution_id("execution_id", execution_id_field)?;
        let shard = trellis_proto::subjects::shard_of(&id.to_string(), self.router.shards());
        Ok((id, shard))
    }
}

/// True for the states an execution does not leave (until a retry starts a new run).
fn terminal(state: i32) -> bool {
    [
        v1::ExecutionState::Completed,
        v1::ExecutionState::Failed,
        v1::ExecutionState::Cancelled,
    ]
    .iter()
    .any(|terminal| *terminal as i32 == state)
}

/// Returns `text`, or `default` when it is empty.
fn or_default(text: String, default: &str) -> String {
    if text.is_empty() {
        default.to_owned()
    } else {
        text
    }
}

/// Reads the scope of a pause or resume: `task_id` or `group_id` (neither: the execution).
fn scope(task_id: &str, group_id: &str) -> Result<PauseScope, Status> {
    trellis_wire::log::pause_scope(task_id, group_id)
        .map_err(|err| Status::invalid_argument(err.to_string()))
}

fn execution_id(field: &str, value: &str) -> Result<ExecutionId, Status> {
    value
        .parse()
        .map_err(|_| Status::invalid_argument(format!("{field}: not an execution id: {value:?}")))
}

type EventStream =
    Pin<Box<dyn Stream<Item = Result<v1::ObserveExecutionResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    async fn start_execution(
        &self,
        request: Request<v1::StartExecutionRequest>,
    ) -> Result<Response<v1::StartExecutionResponse>, Status> {
        trellis_telemetry::hops::mark("coordinator.received");
        let shard = self.start_shard(&request, request.get_ref().options.as_ref())?;
        self.routed(
            request,
            shard,
            move |principal, request: v1::StartExecutionRequest| {
                Box::pin(self.start_here(principal, request))
            },
            forward!(start_execution),
        )
        .await
    }

    async fn pause_execution(
        &self,
        request: Request<v1::PauseExecutionRequest>,
    ) -> Result<Response<v1::PauseExecutionResponse>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        let scope = scope(&request.get_ref().task_id, &request.get_ref().group_id)?;
        let mode = trellis_wire::log::pause_mode_from_proto(request.get_ref().mode);
        self.routed(
            request,
            Some(shard),
            move |principal, request: v1::PauseExecutionRequest| {
                let scope = scope.clone();
                Box::pin(async move {
                    let reason = or_default(request.reason, "paused by request");
                    let action = Action::Pause {
                        reason,
                        scope,
                        mode,
                    };
                    let state = self.control(principal.scope, id, action).await?;
                    Ok(v1::PauseExecutionResponse { state })
                })
            },
            forward!(pause_execution),
        )
        .await
    }

    async fn resume_execution(
        &self,
        request: Request<v1::ResumeExecutionRequest>,
    ) -> Result<Response<v1::ResumeExecutionResponse>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        let scope = scope(&request.get_ref().task_id, &request.get_ref().group_id)?;
        self.routed(
            request,
            Some(shard),
            move |principal, _| {
                let scope = scope.clone();
                Box::pin(async move {
                    let action = Action::Resume(scope);
                    let state = self.control(principal.scope, id, action).await?;
                    Ok(v1::ResumeExecutionResponse { state })
                })
            },
            forward!(resume_execution),
        )
        .await
    }

    async fn cancel_execution(
        &self,
        request: Request<v1::CancelExecutionRequest>,
    ) -> Result<Response<v1::CancelExecutionResponse>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        self.routed(
            request,
            Some(shard),
            move |principal, request: v1::CancelExecutionRequest| {
                Box::pin(async move {
                    let reason = or_default(request.reason, "cancelled by request");
                    let state = self
                        .control(principal.scope, id, Action::Cancel(reason))
                        .await?;
                    Ok(v1::CancelExecutionResponse { state })
                })
            },
            forward!(cancel_execution),
        )
        .await
    }

    async fn retry_execution(
        &self,
        request: Request<v1::RetryExecutionRequest>,
    ) -> Result<Response<v1::RetryExecutionResponse>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        self.routed(
            request,
            Some(shard),
            move |principal, _| {
                Box::pin(async move {
                    let answer = self.on(principal.scope, id, Action::Retry).await?;
                    let run_number = expect!(answer, Answer::Run(run) => run)?;
                    Ok(v1::RetryExecutionResponse { run_number })
                })
            },
            forward!(retry_execution),
        )
        .await
    }

    async fn checkpoint_execution(
        &self,
        request: Request<v1::CheckpointExecutionRequest>,
    ) -> Result<Response<v1::CheckpointExecutionResponse>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        self.routed(
            request,
            Some(shard),
            move |principal, _| {
                Box::pin(async move {
                    let answer = self.on(principal.scope, id, Action::Checkpoint).await?;
                    let checkpoint = expect!(answer, Answer::Checkpoint(metadata) => metadata)?;
                    Ok(v1::CheckpointExecutionResponse {
                        checkpoint: Some(checkpoint),
                    })
                })
            },
            forward!(checkpoint_execution),
        )
        .await
    }

    async fn get_execution(
        &self,
        request: Request<v1::GetExecutionRequest>,
    ) -> Result<Response<v1::GetExecutionResponse>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        self.routed(
            request,
            Some(shard),
            move |principal, _| {
                Box::pin(async move {
                    let scope = principal.scope.clone();
                    let answer = match self.on(principal.scope, id, Action::Get).await {
                        Err(status) if status.code() == tonic::Code::NotFound => {
                            // Its messages may have left the event log (the store's retention):
                            // the read model still has it.
                            return self.read_model_record(&scope, id, status).await;
                        }
                        answer => answer?,
                    };
                    let execution = expect!(answer, Answer::Execution(execution) => *execution)?;
                    Ok(v1::GetExecutionResponse {
                        execution: Some(execution),
                    })
                })
            },
            forward!(get_execution),
        )
        .await
    }

    async fn list_executions(
        &self,
        request: Request<v1::ListExecutionsRequest>,
    ) -> Result<Response<v1::ListExecutionsResponse>, Status> {
        let scope = principal(&request)?.scope;
        let (metadata, _, request) = request.into_parts();
        let live = self.in_memory(scope.clone(), &metadata, &request).await?;
        if forward::is_forwarded(&metadata) {
            // Another coordinator gathers the lists: this one's memory, whole.
            return Ok(Response::new(v1::ListExecutionsResponse {
                executions: live,
                page: None,
            }));
        }
        if let Some(store) = &self.store {
            match self.list_from_store(store, &scope, request.clone()).await {
                Ok(stored) => return Ok(Response::new(merge(stored, live, &request))),
                // The read model is out of reach: what the coordinators hold is still worth
                // listing (unfinished executions are all there).
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ) =>
                {
                    tracing::warn!(%status, "listing executions from memory: the read model is out of reach");
                }
                Err(status) => return Err(status),
            }
        }
        Ok(Response::new(page(live, &request)))
    }

    type ObserveExecutionStream = EventStream;

    async fn observe_execution(
        &self,
        request: Request<v1::ObserveExecutionRequest>,
    ) -> Result<Response<Self::ObserveExecutionStream>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        self.routed(
            request,
            Some(shard),
            move |principal, request: v1::ObserveExecutionRequest| {
                Box::pin(self.observation(
                    principal.scope,
                    id,
                    request.from_sequence,
                    request.progress_only,
                ))
            },
            |mut client: Client, request| {
                Box::pin(async move {
                    let response = client.observe_execution(request).await?;
                    let stream: EventStream = Box::pin(response.into_inner());
                    Ok(Response::new(stream))
                })
            },
        )
        .await
    }

    type RunExecutionStream = run::RunStream;

    async fn run_execution(
        &self,
        request: Request<v1::RunExecutionRequest>,
    ) -> Result<Response<Self::RunExecutionStream>, Status> {
        trellis_telemetry::hops::mark("coordinator.received");
        let Some(start) = request.get_ref().start.as_ref() else {
            return Err(run::missing_start());
        };
        let shard = self.start_shard(&request, start.options.as_ref())?;
        self.routed(
            request,
            shard,
            move |principal, request: v1::RunExecutionRequest| {
                Box::pin(self.run_here(principal, request))
            },
            |mut client: Client, request| {
                Box::pin(async move {
                    let response = client.run_execution(request).await?;
                    let stream: run::RunStream = Box::pin(response.into_inner());
                    Ok(Response::new(stream))
                })
            },
        )
        .await
    }

    type GetTaskLogsStream = logs::LogStream;

    async fn get_task_logs(
        &self,
        request: Request<v1::GetTaskLogsRequest>,
    ) -> Result<Response<Self::GetTaskLogsStream>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        let instance = logs::instance(&request.get_ref().task_instance_id)?;
        self.routed(
            request,
            Some(shard),
            move |principal, request: v1::GetTaskLogsRequest| {
                Box::pin(async move {
                    let scope = principal.scope.clone();
                    self.visible(principal.scope, id).await?;
                    let executor = self.executor.clone();
                    let ended = move || -> BoxFuture<'static, bool> {
                        let executor = executor.clone();
                        let scope = scope.clone();
                        Box::pin(async move {
                            let request = turn::Request::On {
                                id,
                                scope,
                                action: Action::Get,
                            };
                            match executor.ask(request).await {
                                Ok(Answer::Execution(execution)) => terminal(execution.state),
                                Ok(_) => false,
                                // Gone from memory: finished long enough ago.
                                Err(err) => err.kind == ErrorKind::NotFound,
                            }
                        })
                    };
                    let wanted = logs::Wanted {
                        execution: id,
                        instance,
                        attempt: request.attempt,
                        follow: request.follow,
                    };
                    logs::open(&self.logs, self.store.clone(), wanted, ended).await
                })
            },
            |mut client: Client, request| {
                Box::pin(async move {
                    let response = client.get_task_logs(request).await?;
                    let stream: logs::LogStream = Box::pin(response.into_inner());
                    Ok(Response::new(stream))
                })
            },
        )
        .await
    }

    type GetTaskOutputStream = outputs::OutputStream;

    async fn get_task_output(
        &self,
        request: Request<v1::GetTaskOutputRequest>,
    ) -> Result<Response<Self::GetTaskOutputStream>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        let reference = outputs::reference(id, request.get_ref().reference.as_ref())?;
        self.routed(
            request,
            Some(shard),
            move |principal, _| {
                let reference = reference.clone();
                Box::pin(async move {
                    self.visible(principal.scope, id).await?;
                    outputs::open(&self.outputs, &reference).await
                })
            },
            |mut client: Client, request| {
                Box::pin(async move {
                    let response = client.get_task_output(request).await?;
                    let stream: outputs::OutputStream = Box::pin(response.into_inner());
                    Ok(Response::new(stream))
                })
            },
        )
        .await
    }

    async fn get_execution_graph(
        &self,
        request: Request<v1::GetExecutionGraphRequest>,
    ) -> Result<Response<v1::GetExecutionGraphResponse>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        self.routed(
            request,
            Some(shard),
            move |principal, _| {
                Box::pin(async move {
                    let answer = self.on(principal.scope, id, Action::Graph).await?;
                    let graph = expect!(answer, Answer::Graph(graph) => graph)?;
                    Ok(v1::GetExecutionGraphResponse { graph: Some(graph) })
                })
            },
            forward!(get_execution_graph),
        )
        .await
    }

    async fn answer_question(
        &self,
        request: Request<v1::AnswerQuestionRequest>,
    ) -> Result<Response<v1::AnswerQuestionResponse>, Status> {
        let (id, shard) = self.shard(&request.get_ref().execution_id)?;
        let question: QuestionId = request.get_ref().question_id.parse().map_err(|_| {
            Status::invalid_argument(format!(
                "question_id: not a question id: {:?}",
                request.get_ref().question_id
            ))
        })?;
        self.routed(
            request,
            Some(shard),
            move |principal, request: v1::AnswerQuestionRequest| {
                Box::pin(async move {
                    let action = Action::Answer {
                        question,
                        answer: request.answer,
                    };
                    let answer = self.on(principal.scope, id, action).await?;
                    let (sequence, instance) = expect!(
                        answer,
                        Answer::Answered { sequence, continuation } => (sequence, continuation)
                    )?;
                    Ok(v1::AnswerQuestionResponse {
                        sequence,
                        task_instance_id: instance.map(|i| i.to_string()).unwrap_or_default(),
                    })
                })
            },
            forward!(answer_question),
        )
        .await
    }

    async fn list_workers(
        &self,
        request: Request<v1::ListWorkersRequest>,
    ) -> Result<Response<v1::ListWorkersResponse>, Status> {
        // Workers serve queues, not namespaces: any authenticated caller may list them. Every
        // coordinator hears every worker's heartbeats.
        principal(&request)?;
        let request = request.into_inner();
        let answer = self
            .executor
            .ask(turn::Request::Workers {
                queue: request.queue,
                include_terminated: request.include_terminated,
            })
            .await
            .map_err(status)?;
        let (workers, breakers) =
            expect!(answer, Answer::Workers(workers, breakers) => (workers, breakers))?;
        Ok(Response::new(v1::ListWorkersResponse { workers, breakers }))
    }

    async fn get_cluster(
        &self,
        request: Request<v1::GetClusterRequest>,
    ) -> Result<Response<v1::GetClusterResponse>, Status> {
        principal(&request)?;
        let view = self.router.view();
        if view.owners.is_empty() {
            return Err(Status::unavailable(
                "this coordinator has not read the deployment yet; try again in a moment",
            ));
        }
        Ok(Response::new(view.to_proto(self.router.me())))
    }

    async fn pause_fleet(
        &self,
        request: Request<v1::PauseFleetRequest>,
    ) -> Result<Response<v1::PauseFleetResponse>, Status> {
        self.pause_fleet_here(request).await
    }

    async fn resume_fleet(
        &self,
        request: Request<v1::ResumeFleetRequest>,
    ) -> Result<Response<v1::ResumeFleetResponse>, Status> {
        self.resume_fleet_here(request).await
    }

    async fn list_pauses(
        &self,
        request: Request<v1::ListPausesRequest>,
    ) -> Result<Response<v1::ListPausesResponse>, Status> {
        self.list_pauses_here(request).await
    }

    async fn drain_worker(
        &self,
        request: Request<v1::DrainWorkerRequest>,
    ) -> Result<Response<v1::DrainWorkerResponse>, Status> {
        self.drain_worker_here(request).await
    }
}
