//! `StartExecution` here: the plan compiled outside the coordinator's turn, and a large plan's
//! starting state built outside it too, so neither holds up the turn or the other calls.

use tonic::{Request, Status};
use trellis_grpc::access::Principal;
use trellis_grpc::server::principal;
use trellis_proto::v1;

use super::{CoordinatorService, status};
use crate::executor;
use crate::turn::{self, Answer};

impl CoordinatorService {
    /// The shard a start lands on: with an idempotency key the key's shard (so one coordinator
    /// remembers the key); without one, `None`: any shard this coordinator holds, or one that
    /// holds some.
    pub(super) fn start_shard<T>(
        &self,
        request: &Request<T>,
        options: Option<&v1::ExecutionOptions>,
    ) -> Result<Option<u32>, Status> {
        let caller = principal(request)?;
        let (namespace, key) = options.map_or(("", ""), |options| {
            (options.namespace.as_str(), options.idempotency_key.as_str())
        });
        Ok(caller
            .namespace_for(namespace)
            .ok()
            .and_then(|namespace| turn::start_shard(&namespace, key, self.router.shards())))
    }

    /// `StartExecution` answered here: the plan compiled, then the execution started.
    pub(super) async fn start_here(
        &self,
        principal: Principal,
        request: v1::StartExecutionRequest,
    ) -> Result<v1::StartExecutionResponse, Status> {
        let (answer, _) = self.start_answered(principal, request, None).await?;
        let (id, created) = expect!(answer, Answer::Started { id, created } => (id, created))?;
        Ok(v1::StartExecutionResponse {
            execution_id: id.to_string(),
            created,
        })
    }

    /// Compiles the start's plan and starts it here, followed as `follow` says: the turn's
    /// answer, with an observer's live channel when it is followed.
    pub(super) async fn start_answered(
        &self,
        principal: Principal,
        request: v1::StartExecutionRequest,
        follow: Option<turn::Follow>,
    ) -> Result<executor::Answered, Status> {
        let Some(source) = request.plan_source else {
            return Err(Status::invalid_argument(
                "plan_source: missing (send plan_source.spec or a compiled plan_source.plan)",
            ));
        };
        let options = request.options.unwrap_or_default();
        let traceparent =
            trellis_telemetry::propagation::traceparent(&trellis_telemetry::propagation::current())
                .unwrap_or_default();
        let plan = self.prepare(source).await?;
        let start = Start {
            options,
            principal,
            traceparent,
            follow,
        };
        self.start(plan, start).await
    }

    /// Compiles a start's plan outside the coordinator's turn (a small one compiled before comes
    /// from the cache); a large one on a blocking thread, so it holds up neither the turn nor
    /// the other calls.
    pub(super) async fn prepare(
        &self,
        source: v1::start_execution_request::PlanSource,
    ) -> Result<turn::Prepared, Status> {
        let prepared = if turn::is_large(&source) {
            let limits = self.plans.limits().clone();
            crate::priority::lowered(move || turn::prepare(source, &limits))
                .await
                .map_err(|err| Status::internal(format!("compiling the plan stopped: {err}")))?
        } else {
            self.plans.prepare(source)
        };
        prepared.map_err(status)
    }

    /// Starts an execution of `plan` here; returns the turn's answer (`Started`, or `Following`
    /// with its live channel). A large plan is admitted first, then its starting state is built
    /// on a blocking thread for the id and time the turn gave (`Answer::Build`), and the start
    /// sent again with it: building holds up neither the turn nor the other calls.
    async fn start(
        &self,
        plan: turn::Prepared,
        start: Start,
    ) -> Result<executor::Answered, Status> {
        let request = |plan| turn::Request::Start {
            plan: Box::new(plan),
            options: start.options.clone(),
            principal: start.principal.clone(),
            traceparent: start.traceparent.clone(),
            follow: start.follow,
        };
        let answered = self
            .executor
            .ask_live(request(plan))
            .await
            .map_err(status)?;
        match answered {
            (Answer::Build { id, at_ms, plan }, _) => {
                let plan = crate::priority::lowered(move || {
                    let mut plan = *plan;
                    plan.build(id, at_ms);
                    plan
                })
                .await
                .map_err(|err| {
                    Status::internal(format!("building the execution stopped: {err}"))
                })?;
                // The turn asks for a build once per start: the second pass starts or refuses.
                self.executor.ask_live(request(plan)).await.map_err(status)
            }
            answered => Ok(answered),
        }
    }
}

/// What a start carries besides its plan.
struct Start {
    options: v1::ExecutionOptions,
    principal: Principal,
    traceparent: String,
    follow: Option<turn::Follow>,
}
