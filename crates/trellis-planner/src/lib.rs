//! The Trellis planner service: the gRPC `Planner` API (DESIGN.md §8) over the compiler and the
//! analysis of `trellis-core`.
//!
//! `CompilePlan` turns a spec (text plus param values) into a compiled plan, or returns every
//! validation error with its path, hint and place in the text; `AnalyzePlan` adds the waves,
//! conflict pairs, critical path, parallelism and the tasks blocked by conflicts. A wrong plan is
//! an expected answer (status OK, errors in the response); gRPC errors are kept for malformed
//! requests. The service holds no state: any number of replicas can run behind one address.
//!
//! `main.rs` is a thin shell around [`run`]; `trellis planner` hosts the same service.

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use trellis_core::analysis::analyze;
use trellis_core::plan::{Limits, Plan, PlanErrors};
use trellis_proto::convert;
use trellis_proto::v1;
use trellis_proto::v1::planner_server::{Planner, PlannerServer};

mod cli;

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
    #[error("cannot build the gRPC reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The `Planner` gRPC service.
#[derive(Clone, Debug, Default)]
pub struct PlannerService {
    limits: Limits,
}

impl PlannerService {
    /// Returns a service that enforces `limits` on every plan.
    pub fn new(limits: Limits) -> Self {
        Self { limits }
    }

    /// Compiles what a request names: a spec with its param values, or a wire plan (validated
    /// again like any spec).
    fn compile(&self, source: Source<'_>) -> Result<Plan, PlanErrors> {
        match source {
            Source::Spec(spec) => convert::compile_wire_spec(spec, &self.limits),
            Source::Plan(plan) => convert::compile_wire_plan(plan, &self.limits),
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
        let result = match self.compile(Source::Spec(&spec)) {
            Ok(plan) => {
                tracing::debug!(plan = %plan.name, tasks = plan.len(), "plan compiled");
                v1::compile_plan_response::Result::Plan(convert::plan_to_proto(&plan))
            }
            Err(errors) => {
                v1::compile_plan_response::Result::Errors(convert::plan_errors_to_proto(&errors))
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
        let result = match compiled {
            Ok(plan) => {
                let analysis = analyze(&plan);
                v1::analyze_plan_response::Result::Analysis(convert::analysis_to_proto(
                    &plan, &analysis,
                ))
            }
            Err(errors) => {
                v1::analyze_plan_response::Result::Errors(convert::plan_errors_to_proto(&errors))
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
    limits: Limits,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let addr: SocketAddr = listener.local_addr().map_err(Error::Listener)?;
    tracing::info!(%addr, "planner serving");
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<PlannerServer<PlannerService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(trellis_proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let not_serving = shutdown.clone();
    tokio::spawn(async move {
        not_serving.cancelled().await;
        health
            .set_not_serving::<PlannerServer<PlannerService>>()
            .await;
    });
    // Small replies must not wait for Nagle's algorithm; tonic sets TCP_NODELAY only on
    // listeners it binds itself.
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |stream| {
            stream.inspect(|s| {
                let _ = s.set_nodelay(true);
            })
        },
    );
    let service = PlannerServer::new(PlannerService::new(limits))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await?;
    Ok(())
}
