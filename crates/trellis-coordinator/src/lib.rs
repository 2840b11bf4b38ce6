//! The Trellis coordinator: runs executions.
//!
//! It holds one [`trellis_core::machine::Execution`] per live execution inside a single engine task
//! ([`engine`]), which is the only writer of their event logs. Requests arrive over gRPC
//! ([`grpc`]), worker results over the JetStream results stream; every accepted event is appended
//! to `trellis.events.<execution_id>` before its side effects (dispatching tasks, stopping
//! cancelled ones) happen, and all of it is done in batches so throughput does not pay one round
//! trip per task.

mod checkpoints;
mod cli;
mod engine;
mod grpc;
mod metrics;
mod recovery;
mod shards;
mod workers;

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use trellis_bus::NatsOptions;
use trellis_grpc::server::Authenticate;
use trellis_grpc::{ClientSecurity, ServerSecurity};
use trellis_proto::v1::coordinator_server::CoordinatorServer;
use trellis_telemetry::Telemetry;

pub use cli::{Args, main_entry, run_with};

/// Coordinator settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The NATS server (JetStream enabled), its credentials and TLS.
    #[serde(skip)]
    pub nats: NatsOptions,
    /// Number of shards executions are spread over (`trellis.results.<shard>`). Every
    /// coordinator of a deployment must use the same number; workers learn the shard of each
    /// task from its assignment.
    pub shards: u32,
    /// This coordinator's identity in shard leases. Must be unique among running coordinators
    /// and stable across restarts: a coordinator restarted under the same id takes its leases
    /// back at once instead of waiting for them to lapse.
    pub id: String,
    /// A shard lease lapses this long after its owner stopped renewing it.
    #[serde(with = "millis")]
    pub lease_ttl: Duration,
    /// The checkpoint-store's gRPC address (`http://host:port`); without one, no checkpoints
    /// are taken and recovery replays whole logs.
    pub checkpoint_store: Option<String>,
    /// How often a running execution whose state changed is checkpointed.
    #[serde(with = "millis")]
    pub checkpoint_every: Duration,
    /// TLS of the gRPC port and token authentication with namespaces, quotas and limits.
    #[serde(skip)]
    pub security: ServerSecurity,
    /// The token and TLS of calls to the checkpoint-store.
    #[serde(skip)]
    pub store_client: ClientSecurity,
    /// Metrics and readiness ("coordinator": ready while it owns a shard).
    #[serde(skip)]
    pub telemetry: Telemetry,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            nats: NatsOptions::default(),
            shards: 1,
            id: default_id(),
            lease_ttl: Duration::from_secs(3),
            checkpoint_store: None,
            checkpoint_every: Duration::from_secs(10),
            security: ServerSecurity::default(),
            store_client: ClientSecurity::default(),
            telemetry: Telemetry::default(),
        }
    }
}

/// `<hostname>`, which Kubernetes StatefulSets keep stable across restarts; `coordinator` when
/// the host has no name.
pub fn default_id() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
        })
        .unwrap_or_else(|| "coordinator".to_owned())
}

/// Durations in the config file as milliseconds.
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Why the coordinator stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Bus(#[from] trellis_bus::Error),
    #[error("cannot subscribe to {subject}: {message}")]
    Subscribe { subject: String, message: String },
    #[error(transparent)]
    Grpc(#[from] trellis_grpc::Error),
    #[error("cannot read the address of the gRPC listener: {0}")]
    Listener(std::io::Error),
    #[error("cannot open the key-value bucket {bucket}: {message}")]
    Bucket { bucket: String, message: String },
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// The default gRPC address.
pub const DEFAULT_ADDR: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    7400,
));

/// Largest gRPC message the coordinator accepts or sends: a compiled 100,000-task plan in
/// `StartExecution` is tens of MiB.
pub const MAX_MESSAGE_BYTES: usize = 80 * 1024 * 1024;

/// Runs the coordinator until `shutdown` is cancelled: connects to NATS, creates the streams if
/// needed, consumes results, and serves the `Coordinator` gRPC API on `listener`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    if config.shards == 0 {
        return Err(Error::Config("shards must be at least 1".to_owned()));
    }
    if config.id.is_empty() {
        return Err(Error::Config(
            "the coordinator id must not be empty".to_owned(),
        ));
    }
    let store = config
        .checkpoint_store
        .as_deref()
        .map(|url| checkpoints::StoreClient::new(url, &config.store_client))
        .transpose()
        .map_err(Error::Config)?;
    let metrics = metrics::Metrics::new(&config.telemetry.registry);
    let readiness = config.telemetry.health.component("coordinator");
    let nats = trellis_bus::connect_with(&config.nats, "trellis-coordinator").await?;
    let js = async_nats::jetstream::new(nats.clone());
    let replicas = config.nats.replicas;
    let streams = trellis_bus::ensure_streams(&js, replicas).await?;
    let (leases, index) = shards::buckets(&js, config.lease_ttl, replicas).await?;
    // Workers keep durable steps here; creating it with the streams saves each worker the race.
    trellis_bus::ensure_steps_bucket(&js, replicas).await?;
    let registry = workers::Registry::start(&nats, metrics.clone(), shutdown.clone()).await?;
    let events = streams.events.clone();
    tokio::spawn(metrics::watch_queues(
        streams.tasks.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    let (handle, inputs) = engine::Engine::spawn(
        engine::Setup {
            nats: nats.clone(),
            js,
            streams,
            index,
            store,
            shards: config.shards,
            checkpoint_every: config.checkpoint_every,
            access: config.security.access.clone(),
            metrics,
            readiness,
        },
        shutdown.clone(),
    );
    let (first_pass, first_pass_done) = tokio::sync::oneshot::channel();
    tokio::spawn(shards::keep_leases(
        leases,
        config.id.clone(),
        config.shards,
        config.lease_ttl,
        inputs,
        first_pass,
        shutdown.clone(),
    ));
    // Serve once every free shard is claimed: a start that arrives while they are recovered waits
    // for them instead of finding no shard.
    let _ = first_pass_done.await;
    let addr = listener.local_addr().map_err(Error::Listener)?;
    tracing::info!(
        %addr,
        nats = %config.nats.shown_url(),
        id = %config.id,
        shards = config.shards,
        tls = config.security.tls.is_some(),
        mutual_tls = config.security.mutual_tls,
        authentication = config.security.access.is_some(),
        "coordinator serving"
    );
    let service = grpc::CoordinatorService::new(handle, registry, events);
    let authenticate =
        Authenticate::new(config.security.access.clone(), &config.telemetry.registry);
    let routes = tonic::service::Routes::new(InterceptedService::new(
        CoordinatorServer::new(service)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        authenticate,
    ));
    let health = config.telemetry.health.clone();
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        stopping.cancelled().await;
        health.stopping().await;
    });
    trellis_grpc::server::serve::<CoordinatorServer<grpc::CoordinatorService>>(
        listener,
        routes,
        &config.security,
        &config.telemetry.registry,
        shutdown,
    )
    .await?;
    Ok(())
}
