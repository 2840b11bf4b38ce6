//! The Trellis coordinator: runs executions.
//!
//! Every decision is made by a pure turn ([`turn::Coordinator`]: no I/O, no clock), which holds
//! one [`trellis_core::machine::Execution`] per live execution. One executor task (`executor`)
//! feeds it requests from gRPC (`grpc`), worker results from the JetStream results stream,
//! heartbeats, lease changes and clock ticks, and carries out the effects it returns in the order
//! the invariants need: every accepted event is appended to `trellis.events.<execution_id>`
//! before its side effects (dispatching tasks, stopping cancelled ones) happen, and results are
//! acknowledged after both; all of it in batches, so throughput does not pay a round trip per
//! task.

pub mod allocator;
pub mod checkpoints;
mod cli;
mod cluster;
mod executor;
mod failpoints;
mod forward;
mod grpc;
mod metrics;
mod pauses;
pub mod priority;
pub mod recovery;
mod shards;
pub mod turn;

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
    /// A finished execution leaves memory this long after it was last changed or asked about;
    /// reads of it then load it again from its checkpoint and log.
    #[serde(with = "millis")]
    pub keep_finished: Duration,
    /// The address other coordinators forward calls for this one's shards to
    /// (`http://host:port`); by default the listen address, or the host name when listening on
    /// every interface.
    pub advertise: Option<String>,
    /// Consecutive failed attempts of one queue and task type that open its circuit breaker
    /// (0: no breakers).
    pub breaker_failures: u32,
    /// How long an open breaker holds dispatches before it lets one probe through.
    #[serde(with = "millis")]
    pub breaker_cooldown: Duration,
    /// Most tasks of one execution dispatched and not yet started by a worker (0: no limit), so
    /// a large execution cannot queue all its tasks ahead of everyone else's.
    pub dispatch_window: u32,
    /// Offer a small execution's assignments to an idle worker of the queue before the tasks
    /// stream (`trellis.offer.<queue>`); what no worker takes goes to the stream.
    pub offers: bool,
    /// TLS of the gRPC port and token authentication with namespaces, quotas and limits.
    #[serde(skip)]
    pub security: ServerSecurity,
    /// The token and TLS of calls to the checkpoint-store.
    #[serde(skip)]
    pub store_client: ClientSecurity,
    /// Metrics and readiness ("coordinator": ready once it serves; any coordinator answers any
    /// call).
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
            keep_finished: Duration::from_secs(300),
            advertise: None,
            breaker_failures: 0,
            breaker_cooldown: Duration::from_secs(30),
            dispatch_window: turn::DEFAULT_DISPATCH_WINDOW,
            offers: true,
            security: ServerSecurity::default(),
            store_client: ClientSecurity::default(),
            telemetry: Telemetry::default(),
        }
    }
}

/// `<hostname>`, which Kubernetes keeps stable per pod; `coordinator` when the host has no name.
pub fn default_id() -> String {
    trellis_bus::host_identity("coordinator")
}

/// The address other coordinators reach this one at: the listen address, or the host name with
/// its port when listening on every interface.
fn advertised(addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    if addr.ip().is_unspecified() {
        format!("{scheme}://{}:{}", default_id(), addr.port())
    } else {
        format!("{scheme}://{addr}")
    }
}

/// Returns entropy for the ids this coordinator makes, from the operating system's source.
fn rand_seed() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
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

/// How often the index of the owned shards is listed again, to find executions a former owner
/// started after this coordinator recovered the shard.
const INDEX_SCAN_EVERY: Duration = Duration::from_secs(10);

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
    cluster::check_id(&config.id).map_err(Error::Config)?;
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
    let logs = trellis_bus::ensure_logs_stream(&js, replicas).await?;
    let (leases, index) = shards::buckets(&js, config.lease_ttl, replicas).await?;
    let members = cluster::bucket(&js, config.lease_ttl, replicas).await?;
    // Workers keep durable steps here; creating it with the streams saves each worker the race.
    trellis_bus::ensure_steps_bucket(&js, replicas).await?;
    let fences = trellis_bus::ensure_fences_bucket(&js, replicas).await?;
    // Workers put large outputs here; `GetTaskOutput` reads them back.
    let outputs = trellis_bus::Outputs::ensure(&js, replicas).await?;
    tokio::spawn(metrics::watch_queues(
        streams.tasks.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    let events = streams.events.clone();
    let coordinator = turn::Coordinator::new(
        turn::Config {
            id: config.id.clone(),
            shards: config.shards,
            checkpoint_every_ms: config.checkpoint_every.as_millis() as u64,
            checkpoint_store: store.is_some(),
            access: config.security.access.clone(),
            max_message_bytes: nats.server_info().max_payload,
            index_scan_every_ms: INDEX_SCAN_EVERY.as_millis() as u64,
            seed: rand_seed(),
            keep_finished_ms: config.keep_finished.as_millis() as u64,
            breakers: turn::BreakerConfig {
                failures: config.breaker_failures,
                cooldown_ms: u64::try_from(config.breaker_cooldown.as_millis()).unwrap_or(u64::MAX),
            },
            dispatch_window: config.dispatch_window,
            build_off_the_loop: turn::BUILT_OFF_THE_LOOP,
            offers: config.offers,
        },
        &config.telemetry.registry,
    );
    // Start requests compile their plans before they reach the turn, within the same limits.
    let plan_limits = coordinator.plan_limits();
    let stats = std::sync::Arc::new(cluster::Stats::default());
    let (handle, inputs) = executor::Executor::spawn(
        coordinator,
        executor::Setup {
            nats: nats.clone(),
            js,
            streams,
            index,
            fences,
            store: store.clone(),
            metrics,
            stats: stats.clone(),
        },
        shutdown.clone(),
    );
    executor::receive_heartbeats(&nats, inputs.clone(), shutdown.clone()).await?;
    let pause_bucket = pauses::bucket(&async_nats::jetstream::new(nats.clone()), replicas).await?;
    pauses::watch(pause_bucket.clone(), inputs.clone(), shutdown.clone()).await?;
    let addr = listener.local_addr().map_err(Error::Listener)?;
    let advertise = config
        .advertise
        .clone()
        .unwrap_or_else(|| advertised(addr, config.security.tls.is_some()));
    let (view_tx, view) =
        tokio::sync::watch::channel(std::sync::Arc::new(cluster::View::default()));
    let (first_pass, first_pass_done) = tokio::sync::oneshot::channel();
    let keeper = shards::Keeper {
        leases,
        members,
        me: config.id.clone(),
        address: advertise.clone(),
        shards: config.shards,
        ttl: config.lease_ttl,
        tx: inputs,
        stats,
        view: view_tx,
        started_at_ms: executor::now_ms(),
    };
    tokio::spawn(keeper.run(first_pass, shutdown.clone()));
    // Serve once the free shards within this coordinator's share are claimed: a start that
    // arrives while they are recovered waits for them instead of finding no shard.
    let _ = first_pass_done.await;
    readiness.set(true);
    tracing::info!(
        %addr,
        nats = %config.nats.shown_url(),
        id = %config.id,
        advertise = %advertise,
        shards = config.shards,
        tls = config.security.tls.is_some(),
        mutual_tls = config.security.mutual_tls,
        authentication = config.security.access.is_some(),
        "coordinator serving"
    );
    let router = forward::Router::new(
        config.id.clone(),
        config.shards,
        view,
        config.store_client.clone(),
        config.lease_ttl,
    );
    let service = grpc::CoordinatorService::new(
        handle,
        router,
        store,
        plan_limits,
        grpc::Bus {
            events,
            pauses: pause_bucket,
            nats,
            logs,
            outputs,
        },
    );
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
