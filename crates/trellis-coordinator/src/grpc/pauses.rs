//! The pauses that reach past one execution: `PauseFleet`, `ResumeFleet` and `ListPauses` write
//! and read the bucket `trellis_pauses` (`crate::pauses`) from whichever coordinator is called,
//! which every coordinator watches; `DrainWorker` tells one worker over core NATS.

use prost::Message as _;
use tonic::{Request, Response, Status};
use trellis_grpc::access::{Principal, Scope};
use trellis_grpc::server::principal;
use trellis_proto::v1;

use super::{CoordinatorService, or_default, status};
use crate::executor;
use crate::turn::pauses::{self, Record, Target};
use crate::turn::{self, Answer};

impl CoordinatorService {
    /// Stores a pause of a queue, a namespace or the fleet (replacing one of the same target).
    pub(super) async fn pause_fleet_here(
        &self,
        request: Request<v1::PauseFleetRequest>,
    ) -> Result<Response<v1::PauseFleetResponse>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let target =
            Target::from_proto(request.target.as_ref()).map_err(Status::invalid_argument)?;
        may_pause(&caller, &target)?;
        let record = Record {
            mode: trellis_wire::log::pause_mode_from_proto(request.mode),
            reason: or_default(request.reason, "paused by request"),
            since_ms: executor::now_ms(),
            by: caller.name.to_string(),
        };
        crate::pauses::put(&self.pauses, &target, &record)
            .await
            .map_err(Status::unavailable)?;
        tracing::info!(%target, mode = record.mode.as_str(), reason = %record.reason, by = %record.by, "paused");
        Ok(Response::new(v1::PauseFleetResponse {
            pause: Some(pauses::record_to_proto(&target, &record)),
        }))
    }

    /// Lifts a pause; says whether there was one.
    pub(super) async fn resume_fleet_here(
        &self,
        request: Request<v1::ResumeFleetRequest>,
    ) -> Result<Response<v1::ResumeFleetResponse>, Status> {
        let caller = principal(&request)?;
        let request = request.into_inner();
        let target =
            Target::from_proto(request.target.as_ref()).map_err(Status::invalid_argument)?;
        may_pause(&caller, &target)?;
        let resumed = crate::pauses::remove(&self.pauses, &target)
            .await
            .map_err(Status::unavailable)?;
        tracing::info!(%target, resumed, by = %caller.name, "resumed");
        Ok(Response::new(v1::ResumeFleetResponse { resumed }))
    }

    /// Lists the pauses in force, as the bucket holds them now.
    pub(super) async fn list_pauses_here(
        &self,
        request: Request<v1::ListPausesRequest>,
    ) -> Result<Response<v1::ListPausesResponse>, Status> {
        // Every pause may hold back the caller's work, so every caller sees every one.
        principal(&request)?;
        let pauses = crate::pauses::read_all(&self.pauses)
            .await
            .map_err(Status::unavailable)?;
        Ok(Response::new(v1::ListPausesResponse {
            pauses: pauses.to_proto(),
        }))
    }

    /// Tells a live worker to drain: it takes nothing new, finishes its tasks and exits.
    pub(super) async fn drain_worker_here(
        &self,
        request: Request<v1::DrainWorkerRequest>,
    ) -> Result<Response<v1::DrainWorkerResponse>, Status> {
        let caller = principal(&request)?;
        if !matches!(caller.scope, Scope::All) {
            return Err(Status::permission_denied(format!(
                "token {} may not drain a worker: workers serve every namespace, so draining one \
                 needs a token of every namespace (\"*\")",
                caller.name
            )));
        }
        let request = request.into_inner();
        if request.worker_id.is_empty()
            || request
                .worker_id
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>'))
        {
            return Err(Status::invalid_argument(format!(
                "worker_id: {:?} is not a worker id (trellis workers lists them)",
                request.worker_id
            )));
        }
        let answer = self
            .executor
            .ask(turn::Request::Workers {
                queue: String::new(),
                include_terminated: false,
            })
            .await
            .map_err(status)?;
        let workers = expect!(answer, Answer::Workers(workers, _) => workers)?;
        if !workers.iter().any(|w| w.worker_id == request.worker_id) {
            return Err(Status::not_found(format!(
                "no live worker {:?}: trellis workers lists the live ones",
                request.worker_id
            )));
        }
        let message = v1::DrainWorker {
            worker_id: request.worker_id.clone(),
            reason: or_default(request.reason, &format!("drained by {}", caller.name)),
        };
        self.nats
            .publish(
                trellis_proto::subjects::drain(&request.worker_id),
                message.encode_to_vec().into(),
            )
            .await
            .map_err(|err| Status::unavailable(format!("cannot reach NATS: {err}")))?;
        self.nats
            .flush()
            .await
            .map_err(|err| Status::unavailable(format!("cannot reach NATS: {err}")))?;
        tracing::info!(worker = %request.worker_id, by = %caller.name, "drain requested");
        Ok(Response::new(v1::DrainWorkerResponse {}))
    }
}

/// Checks that the caller may pause or resume `target`: a namespace needs a token of it, a queue
/// or the fleet one of every namespace (they reach every namespace's executions).
fn may_pause(principal: &Principal, target: &Target) -> Result<(), Status> {
    let allowed = match target {
        Target::Namespace(namespace) => principal.scope.allows(namespace),
        Target::Queue(_) | Target::All => matches!(principal.scope, Scope::All),
    };
    if allowed {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "token {} may not pause {target}: a namespace needs a token of it, a queue or the \
             whole fleet a token of every namespace (\"*\")",
            principal.name
        )))
    }
}
