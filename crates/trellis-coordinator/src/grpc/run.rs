//! `RunExecution` here: a start, then an observer of the execution it started, in one call.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tonic::Status;
use trellis_grpc::access::Principal;
use trellis_proto::v1;

use super::{CoordinatorService, execution_id};

/// The `RunExecution` stream.
pub(crate) type RunStream =
    Pin<Box<dyn Stream<Item = Result<v1::RunExecutionResponse, Status>> + Send + 'static>>;

impl CoordinatorService {
    /// Starts the execution here, then follows it from its first event.
    ///
    /// Once the start is stored the call answers with a stream, whatever happens next: an
    /// observer that cannot be opened (the shard moved meanwhile, the coordinator is stopping)
    /// is the stream's error after the item naming the execution, so the call is never tried
    /// again as a whole, which would start the execution twice.
    pub(super) async fn run_here(
        &self,
        principal: Principal,
        request: v1::RunExecutionRequest,
    ) -> Result<RunStream, Status> {
        let v1::RunExecutionRequest {
            start,
            progress_only,
        } = request;
        let start = start.ok_or_else(|| {
            Status::invalid_argument("start: missing (send the StartExecutionRequest to run)")
        })?;
        let scope = principal.scope.clone();
        let started = self.start_here(principal, start).await?;
        let id = execution_id("execution_id", &started.execution_id)?;
        let first = futures::stream::once(std::future::ready(Ok(v1::RunExecutionResponse {
            started: Some(started),
            observed: None,
        })));
        let observed = match self.observation(scope, id, 1, progress_only).await {
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
