//! `RunExecution` here: a start, then an observer of the execution it started, in one call.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::Status;
use trellis_grpc::access::Principal;
use trellis_proto::v1;

use super::{CoordinatorService, status};
use crate::executor;
use crate::turn::{self, Answer};

/// The `RunExecution` stream.
pub(crate) type RunStream =
    Pin<Box<dyn Stream<Item = Result<v1::RunExecutionResponse, Status>> + Send + 'static>>;

/// The refusal of a run without its start.
pub(super) fn missing_start() -> Status {
    Status::invalid_argument("start: missing (send the StartExecutionRequest to run)")
}

impl CoordinatorService {
    /// Starts the execution here and follows it from its first event: the turn that stores the
    /// start opens its observer (`Answer::Following`), with no turn of its own.
    ///
    /// Once the start is stored the call answers with a stream, whatever happens next: history
    /// that cannot be read (older events from JetStream) is the stream's error after the item
    /// naming the execution, so the call is never tried again as a whole, which would start the
    /// execution twice.
    pub(super) async fn run_here(
        &self,
        principal: Principal,
        request: v1::RunExecutionRequest,
    ) -> Result<RunStream, Status> {
        let v1::RunExecutionRequest {
            start,
            progress_only,
        } = request;
        let start = start.ok_or_else(missing_start)?;
        let follow = turn::Follow { progress_only };
        let (answer, live) = self.start_answered(principal, start, Some(follow)).await?;
        let (id, created, observation) = expect!(
            answer,
            Answer::Following { id, created, observation } => (id, created, observation)
        )?;
        let started = v1::StartExecutionResponse {
            execution_id: id.to_string(),
            created,
        };
        let first = futures::stream::once(std::future::ready(Ok(v1::RunExecutionResponse {
            started: Some(started),
            observed: None,
        })));
        let opened = match live {
            Some(live) => self.open(observation, live).await,
            None => Err(Status::internal(
                "the coordinator followed a start without its channel",
            )),
        };
        let observed = match opened {
            Ok(stream) => stream,
            Err(status) => Box::pin(futures::stream::once(std::future::ready(Err(status)))),
        };
        let observed = observed.map(|item| {
            item.map(|observed| v1::RunExecutionResponse {
                started: None,
                observed: Some(observed),
            })
        });
        Ok(Box::pin(first.chain(observed)))
    }
}
