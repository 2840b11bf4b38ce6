//! The admin server of a service process: one plain port (HTTP/1 and HTTP/2 without TLS) with
//!
//! - `GET /metrics`: the Prometheus exposition of the process's [`Registry`];
//! - `GET /healthz`: 200 while the process runs (liveness);
//! - `GET /readyz`: 200 when every component reported ready, 503 naming those that are not;
//! - `grpc.health.v1.Health`: service `""` is liveness, service `ready` readiness, for Kubernetes
//!   gRPC probes, which cannot speak TLS: the admin port stays plain whatever the service's own
//!   port uses.
//!
//! Readiness is per component ([`Health::component`]): the coordinator is ready once it serves
//! (any coordinator answers any call, forwarding it to the shard's holder), a worker once it
//! consumes its queues; a process hosting several services is ready when all are.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::{HealthReporter, HealthService};

use crate::Telemetry;
use crate::metrics::Registry;

/// The gRPC health service name of readiness (liveness is the empty name).
pub const READY_SERVICE: &str = "ready";

/// The process's health: alive while it runs, ready when every component is.
#[derive(Clone, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    reporter: HealthReporter,
    components: Mutex<Vec<Readiness>>,
    stopping: AtomicBool,
    /// Held while the statuses are published, so the last publish shows the latest state.
    publishing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("ready", &self.is_ready())
            .field("not_ready", &self.not_ready())
            .finish()
    }
}

/// One component's readiness, reported by the component.
#[derive(Clone, Debug)]
pub struct Readiness {
    name: Arc<str>,
    ready: Arc<AtomicBool>,
    health: std::sync::Weak<Inner>,
}

impl Readiness {
    /// Reports the component ready or not. `/readyz` shows it at once, the gRPC health service
    /// a moment later (it is published in the background, outside a tokio runtime not at all).
    pub fn set(&self, ready: bool) {
        if self.ready.swap(ready, Ordering::Relaxed) == ready {
            return;
        }
        if let (Some(inner), Ok(runtime)) =
            (self.health.upgrade(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(async move { (Health { inner }).publish().await });
        }
    }

    /// The component's name, as `/readyz` shows it.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Health {
    /// Registers a component, not ready until it says so.
    pub fn component(&self, name: &str) -> Readiness {
        let readiness = Readiness {
            name: Arc::from(name),
            ready: Arc::new(AtomicBool::new(false)),
            health: Arc::downgrade(&self.inner),
        };
        self.lock().push(readiness.clone());
        readiness
    }

    /// Marks the process as stopping: no longer ready, whatever the components say (it stays
    /// alive until it exits, so a graceful drain is not cut short by a liveness probe).
    pub async fn stopping(&self) {
        self.inner.stopping.store(true, Ordering::Relaxed);
        self.publish().await;
    }

    /// Returns whether the process is ready: not stopping, and every component ready.
    pub fn is_ready(&self) -> bool {
        !self.inner.stopping.load(Ordering::Relaxed) && self.not_ready().is_empty()
    }

    /// Returns the names of the components not ready.
    pub fn not_ready(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|c| !c.ready.load(Ordering::Relaxed))
            .map(|c| c.name.to_string())
            .collect()
    }

    /// Returns whether two handles are the same process's health.
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    async fn publish(&self) {
        let _publishing = self.inner.publishing.lock().await;
        let ready = if self.is_ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.inner
            .reporter
            .set_service_status("", ServingStatus::Serving)
            .await;
        self.inner
            .reporter
            .set_service_status(READY_SERVICE, ready)
            .await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Readiness>> {
        // A poisoned lock only means a thread panicked while pushing a component.
        self.inner
            .components
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot listen for the admin server on {addr}: {source} (choose another address with --admin-addr, or `--admin-addr off`)"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds `addr` and serves the admin endpoints of `telemetry` in a background task until
/// `shutdown`; returns the address bound (useful with port 0).
pub async fn spawn(
    addr: SocketAddr,
    telemetry: Telemetry,
    shutdown: CancellationToken,
) -> Result<SocketAddr, Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    tokio::spawn(async move {
        if let Err(err) = serve(listener, telemetry, shutdown).await {
            tracing::error!(%err, "admin server failed");
        }
    });
    tracing::info!(addr = %bound, "admin server: /metrics, /healthz, /readyz, grpc.health.v1");
    Ok(bound)
}

/// Serves the admin endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    telemetry: Telemetry,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    telemetry.health.publish().await;
    axum::serve(listener, router(telemetry))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// The admin routes.
pub fn router(telemetry: Telemetry) -> Router {
    let grpc_health =
        tonic::service::Routes::new(tonic_health::pb::health_server::HealthServer::new(
            HealthService::from_health_reporter(telemetry.health.inner.reporter.clone()),
        ))
        .into_axum_router();
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(telemetry)
        .merge(grpc_health)
}

async fn metrics(State(telemetry): State<Telemetry>) -> Response {
    exposition(&telemetry.registry)
}

/// The OpenMetrics text of `registry`, as an HTTP response.
pub fn exposition(registry: &Registry) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        registry.encode(),
    )
        .into_response()
}

async fn readyz(State(telemetry): State<Telemetry>) -> Response {
    if telemetry.health.is_ready() {
        return (StatusCode::OK, "ready\n").into_response();
    }
    let mut waiting = telemetry.health.not_ready();
    if telemetry.health.inner.stopping.load(Ordering::Relaxed) {
        waiting.insert(0, "the process is stopping".to_owned());
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {}\n", waiting.join(", ")),
    )
        .into_response()
}
