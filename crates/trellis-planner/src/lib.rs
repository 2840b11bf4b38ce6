//! The Trellis planner service: the gRPC `Planner` API (docs/design.md §8) over the compiler and the
//! analysis of `trellis-core`.
//!
//! `CompilePlan` turns a spec (text plus param values) into a compiled plan, or returns every
//! validation error with its path, hint and place in the text; `AnalyzePlan` adds the waves,
//! conflict pairs, critical path, parallelism and the tasks blocked by conflicts. A wrong plan is
//! an expected answer (status OK, errors in the response); gRPC errors are kept for malformed
//! requests. The service holds no state: any number of replicas can run behind one address.
//!
//! Given a database (`--database-url`, the checkpoint-store's), the planner also serves the
//! `Backlog` API ([`backlog`]): projects, tasks before they run, task lists, validation rules and
//! grouping suggestions. The state is the database's, so replicas still share nothing else.
//!
//! `main.rs` is a thin shell around [`run`]; `trellis planner` hosts the same service.

use std::net::SocketAddr;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};
use trellis_core::analysis::analyze;
use trellis_core::plan::{Limits, Plan, PlanErrors};
use trellis_grpc::ServerSecurity;
use trellis_grpc::server::Authenticate;
use trellis_proto::v1;
use trellis_proto::v1::backlog_server::BacklogServer;
use trellis_proto::v1::planner_server::{Planner, PlannerServer};
use trellis_telemetry::Telemetry;
use trellis_telemetry::metrics::Labels1;
use trellis_wire::plan;

pub mod backlog;
mod cli;
pub mod notify;

pub use cli::{Args, main_entry, run_with};

/// Where the planner listens unless told otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7600";

/// Largest gRPC message the planner accepts or sends: a 100,000-task plan is tens of MiB on the
/// wire.
pub const MAX_MESSAGE_BYTES: usize = 80 * 1024 * 1024;

/// Why the service stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the listener's address: {0}")]
    Listener(std::io::Error),
    #[error(transparent)]
    Grpc(#[from] trellis_grpc::Error),
    #[error("cannot open the backlog's database: {0}")]
    Database(trellis_checkpoint_store::store::Error),
}

/// Planner settings.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Enforced on every plan.
    pub limits: Limits,
    /// TLS of the gRPC port and token authentication (any valid token may compile).
    pub security: ServerSecurity,
    /// Metrics and readiness ("planner").
    pub telemetry: Telemetry,
    /// The database of the backlog (`postgres://...`, `sqlite://PATH`): with one, the planner
    /// serves the `Backlog` API too.
    pub database_url: Option<String>,
    /// Where the backlog's list runs start and answers given through sinks go; `None`:
    /// `RunList` and those answers are refused.
    pub coordinator: Option<backlog::runs::Coordinator>,
    /// How the notifier paces itself (it runs with a database).
    pub notify: notify::Settings,
}

/// The `Planner` gRPC service.
#[derive(Clone, Debug)]
pub struct PlannerService {
    limits: Limits,
    /// Plans compiled or analysed, by `result`: `compiled` or `invalid`.
    plans: Family<Labels1, Counter>,
}

impl PlannerService {
    /// Returns a service that enforces `limits` on every plan and counts into `registry`.
    pub fn new(limits: Limits, registry: &trellis_telemetry::Registry) -> Self {
        Self {
            limits,
            plans: registry.metric(
                "trellis_planner_plans",
                "Plans compiled or analysed, by result (compiled, invalid).",
                Family::default,
            ),
        }
    }

    fn count(&self, compiled: bool) {
        let result = if compiled { "compiled" } else { "invalid" };
        self.plans
            .get_or_create(&[("result", result.to_owned())])
            .inc();
    }

    /// Compiles what a request names: a spec with its param values, or a wire plan (validated
    /// again like any spec).
    fn compile(&self, source: Source<'_>) -> Result<Plan, PlanErrors> {
        match source {
            Source::Spec(spec) => plan::compile_wire_spec(spec, &self.limits),
            Source::Plan(plan) => plan::compile_wire_plan(plan, &self.limits),
        }
    }
}

/// What a request asks to compile.
enum Source<'a> {
    Spec(&'a v1::PlanSpec),
    Plan(&'a v1::Plan),
}

#[tonic::async_trait]
impl Planner for PlannerService {
    async fn compile_plan(
        &self,
        request: Request<v1::CompilePlanRequest>,
    ) -> Result<Response<v1::CompilePlanResponse>, Status> {
        let request = request.into_inner();
        let spec = request
            .spec
            .ok_or_else(|| Status::invalid_argument("spec: missing"))?;
        let compiled = self.compile(Source::Spec(&spec));
        self.count(compiled.is_ok());
        let result = match compiled {
            Ok(plan) => {
                tracing::debug!(plan = %plan.name, tasks = plan.len(), "plan compiled");
                v1::compile_plan_response::Result::Plan(plan::to_proto(&plan))
            }
            Err(errors) => {
                v1::compile_plan_response::Result::Errors(plan::errors_to_proto(&errors))
            }
        };
        Ok(Response::new(v1::CompilePlanResponse {
            result: Some(result),
        }))
    }

    async fn analyze_plan(
        &self,
        request: Request<v1::AnalyzePlanRequest>,
    ) -> Result<Response<v1::AnalyzePlanResponse>, Status> {
        let request = request.into_inner();
        let compiled = match &request.plan_source {
            Some(v1::analyze_plan_request::PlanSource::Spec(spec)) => {
                self.compile(Source::Spec(spec))
            }
            Some(v1::analyze_plan_request::PlanSource::Plan(plan)) => {
                self.compile(Source::Plan(plan))
            }
            None => {
                return Err(Status::invalid_argument(
                    "plan_source: missing (send plan_source.spec or plan_source.plan)",
                ));
            }
        };
        self.count(compiled.is_ok());
        let result = match compiled {
            Ok(plan) => {
                let analysis = analyze(&plan);
                v1::analyze_plan_response::Result::Analysis(plan::analysis_to_proto(
                    &plan, &analysis,
                ))
            }
            Err(errors) => {
                v1::analyze_plan_response::Result::Errors(plan::errors_to_proto(&errors))
            }
        };
        Ok(Response::new(v1::AnalyzePlanResponse {
            result: Some(result),
        }))
    }
}

/// Serves the planner (with gRPC health and reflection) on `listener` until `shutdown` fires.
///
/// # Errors
///
/// The server could not be built or failed while serving.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    run_with_hooks(listener, None, config, shutdown).await
}

/// [`run`], and with a database and `hooks`, the HTTP endpoints answers come back to from the
/// notification sinks ([`notify::hooks`]) on that listener.
///
/// # Errors
///
/// The server could not be built or failed while serving.
pub async fn run_with_hooks(
    listener: TcpListener,
    hooks: Option<TcpListener>,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let addr: SocketAddr = listener.local_addr().map_err(Error::Listener)?;
    tracing::info!(
        %addr,
        tls = config.security.tls.is_some(),
        authentication = config.security.access.is_some(),
        "planner serving"
    );
    let readiness = config.telemetry.health.component("planner");
    let service = PlannerServer::new(PlannerService::new(
        config.limits.clone(),
        &config.telemetry.registry,
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let authenticate =
        Authenticate::new(config.security.access.clone(), &config.telemetry.registry);
    let mut routes =
        tonic::service::Routes::new(InterceptedService::new(service, authenticate.clone()));
    if let Some(url) = &config.database_url {
        let (read_model, store) = trellis_checkpoint_store::store::connect_all(url)
            .await
            .map_err(Error::Database)?;
        tracing::info!(
            runs = config.coordinator.is_some(),
            "planner serving the backlog"
        );
        let service = backlog::BacklogService::new(
            store.clone(),
            config.coordinator.clone(),
            config.limits.clone(),
        );
        tokio::spawn(backlog::runs::follow(
            service.clone(),
            read_model.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(
            notify::Notifier::new(store.clone(), read_model.clone(), config.notify.clone())
                .run(shutdown.clone()),
        );
        if let Some(hooks) = hooks {
            let addr = hooks.local_addr().map_err(Error::Listener)?;
            tracing::info!(%addr, "planner serving the notification hooks");
            let hooks_state = notify::hooks::Hooks {
                store: store.clone(),
                read_model,
                coordinator: config.coordinator.clone(),
            };
            let stop = shutdown.clone();
            tokio::spawn(async move {
                if let Err(err) = notify::hooks::serve(hooks, hooks_state, stop).await {
                    tracing::error!(%err, "the notification hooks stopped");
                }
            });
        }
        routes = routes.add_service(InterceptedService::new(
            BacklogServer::new(service),
            authenticate,
        ));
    }
    readiness.set(true);
    let health = config.telemetry.health.clone();
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        stopping.cancelled().await;
        health.stopping().await;
    });
    trellis_grpc::server::serve::<PlannerServer<PlannerService>>(
        listener,
        routes,
        &config.security,
        &config.telemetry.registry,
        shutdown,
    )
    .await?;
    Ok(())
}
