//! The `Coordinator` gRPC service: parses and checks requests, asks the coordinator's turn
//! through the executor, and maps its domain errors to gRPC statuses, in one place ([`status`]).

use std::pin::Pin;

use futures::Stream;
use tokio::sync::broadcast::error::RecvError;
use tonic::{Request, Response, Status};
use trellis_core::ids::{ExecutionId, QuestionId};
use trellis_proto::v1;
use trellis_proto::v1::coordinator_server::Coordinator;

use trellis_grpc::server::principal;

use crate::executor::{self, Flushed, Handle};
use crate::turn::{self, Action, Answer, ErrorKind};

/// The gRPC face of the coordinator.
pub struct CoordinatorService {
    executor: Handle,
    /// The event stream, for history older than what the coordinator holds in memory.
    events: async_nats::jetstream::stream::Stream,
}

/// Returns the gRPC status of a domain error: the one place the two meet.
pub(crate) fn status(err: turn::Error) -> Status {
    let code = match err.kind {
        ErrorKind::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorKind::NotFound => tonic::Code::NotFound,
        ErrorKind::PermissionDenied => tonic::Code::PermissionDenied,
        ErrorKind::FailedPrecondition => tonic::Code::FailedPrecondition,
        ErrorKind::Unavailable => tonic::Code::Unavailable,
        ErrorKind::Internal => tonic::Code::Internal,
    };
    Status::new(code, err.message)
}

impl CoordinatorService {
    pub(crate) fn new(executor: Handle, events: async_nats::jetstream::stream::Stream) -> Self {
        Self { executor, events }
    }

    /// Asks for `action` on the execution the request names, as the caller.
    async fn on<T>(
        &self,
        request: &Request<T>,
        execution_id_field: &str,
        action: Action,
    ) -> Result<Answer, Status> {
        let scope = principal(request)?.scope;
        let id = execution_id("execution_id", execution_id_field)?;
        self.executor
            .ask(turn::Request::On { id, scope, action })
            .await
            .map_err(status)
    }

    /// Pauses, resumes or cancels an execution; returns its state afterwards.
    async fn control<T>(
        &self,
        request: &Request<T>,
        execution_id_field: &str,
        action: Action,
    ) -> Result<i32, Status> {
        match self.on(request, execution_id_field, action).await? {
            Answer::State(state) => Ok(state),
            other => Err(status(executor::unexpected(&other))),
        }
    }
}

/// Returns `text`, or `default` when it is empty.
fn or_default(text: String, default: &str) -> String {
    if text.is_empty() {
        default.to_owned()
    } else {
        text
    }
}

fn execution_id(field: &str, value: &str) -> Result<ExecutionId, Status> {
    value
        .parse()
        .map_err(|_| Status::invalid_argument(format!("{field}: not an execution id: {value:?}")))
}

type EventStream =
    Pin<Box<dyn Stream<Item = Result<v1::ObserveExecutionResponse, Status>> + Send + 'static>>;

/// Returns the answer of the expected kind, or an internal error naming what came instead.
macro_rules! expect {
    ($answer:expr, $pattern:pat => $value:expr) => {
        match $answer {
            $pattern => Ok($value),
            other => Err(status(executor::unexpected(&other))),
        }
    };
}

#[tonic::async_trait]
impl Coordinator for CoordinatorService {
    async fn start_execution(
        &self,
        request: Request<v1::StartExecutionRequest>,
    ) -> Result<Response<v1::StartExecutionResponse>, Status> {
        let principal = principal(&request)?;
        let request = request.into_inner();
        let Some(source) = request.plan_source else {
            return Err(Status::invalid_argument(
                "plan_source: missing (send plan_source.spec or a compiled plan_source.plan)",
            ));
        };
        let options = request.options.unwrap_or_default();
        let traceparent =
            trellis_telemetry::propagation::traceparent(&trellis_telemetry::propagation::current())
                .unwrap_or_default();
        let answer = self
            .executor
            .ask(turn::Request::Start {
                source: Box::new(source),
                options,
                principal,
                traceparent,
            })
            .await
            .map_err(status)?;
        let (id, created) = expect!(answer, Answer::Started { id, created } => (id, created))?;
        Ok(Response::new(v1::StartExecutionResponse {
            execution_id: id.to_string(),
            created,
        }))
    }

    async fn pause_execution(
        &self,
        request: Request<v1::PauseExecutionRequest>,
    ) -> Result<Response<v1::PauseExecutionResponse>, Status> {
        let reason = or_default(request.get_ref().reason.clone(), "paused by request");
        let state = self
            .control(
                &request,
                &request.get_ref().execution_id,
                Action::Pause(reason),
            )
            .await?;
        Ok(Response::new(v1::PauseExecutionResponse { state }))
    }

    async fn resume_execution(
        &self,
        request: Request<v1::ResumeExecutionRequest>,
    ) -> Result<Response<v1::ResumeExecutionResponse>, Status> {
        let state = self
            .control(&request, &request.get_ref().execution_id, Action::Resume)
            .await?;
        Ok(Response::new(v1::ResumeExecutionResponse { state }))
    }

    async fn cancel_execution(
        &self,
        request: Request<v1::CancelExecutionRequest>,
    ) -> Result<Response<v1::CancelExecutionResponse>, Status> {
        let reason = or_default(request.get_ref().reason.clone(), "cancelled by request");
        let state = self
            .control(
                &request,
                &request.get_ref().execution_id,
                Action::Cancel(reason),
            )
            .await?;
        Ok(Response::new(v1::CancelExecutionResponse { state }))
    }

    async fn retry_execution(
        &self,
        request: Request<v1::RetryExecutionRequest>,
    ) -> Result<Response<v1::RetryExecutionResponse>, Status> {
        let answer = self
            .on(&request, &request.get_ref().execution_id, Action::Retry)
            .await?;
        let run_number = expect!(answer, Answer::Run(run) => run)?;
        Ok(Response::new(v1::RetryExecutionResponse { run_number }))
    }

    async fn checkpoint_execution(
        &self,
        request: Request<v1::CheckpointExecutionRequest>,
    ) -> Result<Response<v1::CheckpointExecutionResponse>, Status> {
        let answer = self
            .on(
                &request,
                &request.get_ref().execution_id,
                Action::Checkpoint,
            )
            .await?;
        let checkpoint = expect!(answer, Answer::Checkpoint(metadata) => metadata)?;
        Ok(Response::new(v1::CheckpointExecutionResponse {
            checkpoint: Some(checkpoint),
        }))
    }

    async fn get_execution(
        &self,
        request: Request<v1::GetExecutionRequest>,
    ) -> Result<Response<v1::GetExecutionResponse>, Status> {
        let answer = self
            .on(&request, &request.get_ref().execution_id, Action::Get)
            .await?;
        let execution = expect!(answer, Answer::Execution(execution) => *execution)?;
        Ok(Response::new(v1::GetExecutionResponse {
            execution: Some(execution),
        }))
    }

    async fn list_executions(
        &self,
        request: Request<v1::ListExecutionsRequest>,
    ) -> Result<Response<v1::ListExecutionsResponse>, Status> {
        let scope = principal(&request)?.scope;
        let request = request.into_inner();
        let answer = self
            .executor
            .ask(turn::Request::List { scope })
            .await
            .map_err(status)?;
        let mut executions = expect!(answer, Answer::Executions(executions) => executions)?;
        executions.retain(|e| {
            (request.namespace.is_empty() || e.namespace == request.namespace)
                && (request.states.is_empty() || request.states.contains(&e.state))
                && (request.name_contains.is_empty() || e.name.contains(&request.name_contains))
                && request
                    .labels
                    .iter()
                    .all(|(k, v)| e.labels.get(k) == Some(v))
        });
        let page_size = request.page.as_ref().map_or(100, |p| {
            if p.page_size == 0 {
                100
            } else {
                p.page_size.min(1000)
            }
        });
        executions.truncate(page_size as usize);
        Ok(Response::new(v1::ListExecutionsResponse {
            executions,
            page: None,
        }))
    }

    type ObserveExecutionStream = EventStream;

    async fn observe_execution(
        &self,
        request: Request<v1::ObserveExecutionRequest>,
    ) -> Result<Response<Self::ObserveExecutionStream>, Status> {
        let scope = principal(&request)?.scope;
        let request = request.into_inner();
        let id = execution_id("execution_id", &request.execution_id)?;
        let from = request.from_sequence;
        let (mut observation, live) = self
            .executor
            .observe(turn::Request::On {
                id,
                scope,
                action: Action::Observe { from },
            })
            .await
            .map_err(status)?;
        if let Some((from, until)) = observation.backfill.take() {
            // The coordinator holds the log after its checkpoint only; older events come from
            // JetStream.
            let older = backfill(&self.events, id, from, until).await?;
            observation.history.splice(0..0, older);
        }
        let stream = async_stream(observation, live);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_execution_graph(
        &self,
        request: Request<v1::GetExecutionGraphRequest>,
    ) -> Result<Response<v1::GetExecutionGraphResponse>, Status> {
        let answer = self
            .on(&request, &request.get_ref().execution_id, Action::Graph)
            .await?;
        let graph = expect!(answer, Answer::Graph(graph) => graph)?;
        Ok(Response::new(v1::GetExecutionGraphResponse {
            graph: Some(graph),
        }))
    }

    async fn answer_question(
        &self,
        request: Request<v1::AnswerQuestionRequest>,
    ) -> Result<Response<v1::AnswerQuestionResponse>, Status> {
        principal(&request)?;
        execution_id("execution_id", &request.get_ref().execution_id)?;
        let question: QuestionId = request.get_ref().question_id.parse().map_err(|_| {
            Status::invalid_argument(format!(
                "question_id: not a question id: {:?}",
                request.get_ref().question_id
            ))
        })?;
        let action = Action::Answer {
            question,
            answer: request.get_ref().answer.clone(),
        };
        let answer = self
            .on(&request, &request.get_ref().execution_id, action)
            .await?;
        let (sequence, instance) = expect!(
            answer,
            Answer::Answered { sequence, continuation } => (sequence, continuation)
        )?;
        Ok(Response::new(v1::AnswerQuestionResponse {
            sequence,
            task_instance_id: instance.map(|i| i.to_string()).unwrap_or_default(),
        }))
    }

    async fn list_workers(
        &self,
        request: Request<v1::ListWorkersRequest>,
    ) -> Result<Response<v1::ListWorkersResponse>, Status> {
        // Workers serve queues, not namespaces: any authenticated caller may list them.
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
        let workers = expect!(answer, Answer::Workers(workers) => workers)?;
        Ok(Response::new(v1::ListWorkersResponse { workers }))
    }
}

/// Reads events `from..=until` of an execution's log from JetStream.
async fn backfill(
    events: &async_nats::jetstream::stream::Stream,
    id: ExecutionId,
    from: u64,
    until: u64,
) -> Result<Vec<v1::Event>, Status> {
    use prost::Message as _;
    let last = crate::recovery::last_stream_seq(events, id)
        .await
        .map_err(|err| Status::unavailable(err.to_string()))?
        .unwrap_or(0);
    let mut older = Vec::new();
    for message in crate::recovery::read_log(events, id, 1, last, usize::MAX)
        .await
        .map_err(|err| Status::unavailable(err.to_string()))?
    {
        if message.first_seq > until {
            break;
        }
        let batch = v1::EventBatch::decode(message.payload)
            .map_err(|err| Status::data_loss(format!("event log of {id}: {err}")))?;
        older.extend(
            batch
                .events
                .into_iter()
                .filter(|e| e.sequence >= from && e.sequence <= until),
        );
    }
    Ok(older)
}

/// History first, then live batches; the stream ends once the execution is over.
fn async_stream(
    observation: turn::Observation,
    mut live: tokio::sync::broadcast::Receiver<std::sync::Arc<Flushed>>,
) -> impl Stream<Item = Result<v1::ObserveExecutionResponse, Status>> {
    let turn::Observation {
        history, terminal, ..
    } = observation;
    let last = history.last().map_or(0, |e| e.sequence);
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(async move {
        for event in history {
            if tx
                .send(Ok(v1::ObserveExecutionResponse {
                    event: Some(event),
                    progress: None,
                }))
                .await
                .is_err()
            {
                return;
            }
        }
        if terminal {
            return;
        }
        loop {
            match live.recv().await {
                Ok(flushed) => {
                    for item in &flushed.items {
                        if item.event.as_ref().is_some_and(|e| e.sequence <= last) {
                            continue;
                        }
                        if tx.send(Ok(item.clone())).await.is_err() {
                            return;
                        }
                    }
                    if flushed.terminal {
                        return;
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    let message = format!(
                        "observer fell {n} batches behind; observe again from the last sequence received"
                    );
                    let _ = tx.send(Err(Status::resource_exhausted(message))).await;
                    return;
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
