//! The Trellis checkpoint-store service (docs/design.md §1, §2, §8): checkpoints of executions with
//! checksums, and the queryable read model built from the event log.
//!
//! - [`store`]: the [`Store`] trait, its PostgreSQL and SQLite backends, and [`store::connect`],
//!   which picks one from the database URL and applies the embedded migrations.
//! - [`checkpoint`]: create (verified), get, restore (with fallback past corrupt links), list and
//!   prune, written once over `dyn Store`.
//! - `ingest`: consumes `TRELLIS_EVENTS` into executions, task instances, events and questions,
//!   keeping a replica state machine per unfinished execution; `heartbeats`: workers from their
//!   heartbeats, written every few seconds; `logs`: copies `TRELLIS_LOGS` into `task_logs`, so
//!   task logs outlive the stream's retention.
//! - [`grpc`]: the `CheckpointStore` gRPC service.
//!
//! [`run`] starts all of it; `main.rs` is a thin shell around [`main_entry`].

pub mod checkpoint;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
mod heartbeats;
mod ingest;
mod leader;
mod logs;
mod metrics;
mod retention;
mod runs;
pub mod store;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::interceptor::InterceptedService;
use trellis_bus::NatsOptions;
use trellis_grpc::ServerSecurity;
use trellis_grpc::server::Authenticate;
use trellis_proto::v1::checkpoint_store_server::CheckpointStoreServer;
use trellis_telemetry::Telemetry;

pub use crate::store::Store;

/// The default database: an SQLite file in the working directory, created when missing.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://trellis.db?mode=rwc";

/// The default gRPC address.
pub const DEFAULT_ADDR: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    7500,
));

/// The name of the store's durable consumers of the event log (with `-<term>` appended).
pub const EVENTS_CONSUMER: &str = ingest::CONSUMER_NAME;
/// The name of the store's durable consumer of the task logs.
pub const LOGS_CONSUMER: &str = logs::CONSUMER_NAME;
/// The KV bucket whose lease decides which replica ingests the event log.
pub const LEADER_BUCKET: &str = leader::LEADER_BUCKET;
/// The KV bucket of the store's own state (how far the event log was purged).
pub const STATE_BUCKET: &str = retention::STATE_BUCKET;

/// The ingest lease's default TTL.
pub const DEFAULT_INGEST_LEASE_TTL: Duration = Duration::from_secs(5);

/// How long the background work may take to finish after shutdown is asked.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Checkpoint-store settings.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// `postgres://...` or `sqlite://...` (see [`store::connect`]); may hold a password, never
    /// logged.
    pub database_url: String,
    /// The NATS server (JetStream enabled) carrying the event log and heartbeats.
    pub nats: NatsOptions,
    /// TLS of the gRPC port and token authentication: only tokens of every namespace ("*", the
    /// services' own) are let in, since checkpoints and the read model span namespaces.
    pub security: ServerSecurity,
    /// Metrics and readiness ("checkpoint-store").
    pub telemetry: Telemetry,
    /// This replica's identity in the ingest lease (default: the host name): unique among
    /// running replicas, stable across restarts.
    pub id: String,
    /// The ingest lease lapses this long after its holder stopped renewing it; another replica
    /// then ingests the event log.
    pub ingest_lease_ttl: Duration,
    /// A finished execution's messages leave the event log this long after it ended (`None`:
    /// the log keeps everything). Unfinished executions' messages are never removed.
    pub events_retention: Option<Duration>,
}

impl Config {
    /// The store at `database_url`, NATS at `nats_url`, nothing else set.
    pub fn new(database_url: impl Into<String>, nats_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            nats: NatsOptions::new(nats_url),
            id: trellis_bus::host_identity("checkpoint-store"),
            ingest_lease_ttl: DEFAULT_INGEST_LEASE_TTL,
            ..Self::default()
        }
    }
}

/// Why the checkpoint-store stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Bus(#[from] trellis_bus::Error),
    #[error(transparent)]
    Grpc(#[from] trellis_grpc::Error),
    #[error("cannot read the address of the gRPC listener: {0}")]
    Listener(std::io::Error),
}

/// Runs the checkpoint-store until `shutdown` is cancelled: opens the database (applying the
/// migrations), serves the `CheckpointStore` gRPC API on `listener` at once, and in the
/// background consumes the event log into the read model (once the coordinator has created the
/// streams) and records workers from their heartbeats.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let readiness = config.telemetry.health.component("checkpoint-store");
    let store = store::connect(&config.database_url).await?;
    let nats = trellis_bus::connect_with(&config.nats, "trellis-checkpoint-store").await?;
    let addr = listener.local_addr().map_err(Error::Listener)?;
    let metrics = metrics::Metrics::new(&config.telemetry.registry);
    let background = TaskTracker::new();
    // The holder is the id and a token of this process: two replicas given the same id (or none)
    // never both believe they hold the lease; a restarted one waits for its old lease to lapse.
    let id = if config.id.is_empty() {
        trellis_bus::host_identity("checkpoint-store")
    } else {
        config.id.clone()
    };
    let lease = leader::Lease {
        holder: format!("{id}#{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        ttl: if config.ingest_lease_ttl.is_zero() {
            DEFAULT_INGEST_LEASE_TTL
        } else {
            config.ingest_lease_ttl
        },
        replicas: config.nats.replicas,
        retention: config
            .events_retention
            .filter(|retention| !retention.is_zero()),
    };
    background.spawn(leader::run(
        lease,
        store.clone(),
        nats.clone(),
        metrics,
        shutdown.clone(),
    ));
    background.spawn(heartbeats::run(store.clone(), nats, shutdown.clone()));
    background.close();
    tracing::info!(
        %addr,
        backend = ?store.backend(),
        nats = %config.nats.shown_url(),
        tls = config.security.tls.is_some(),
        authentication = config.security.access.is_some(),
        "checkpoint-store serving"
    );

    let service = grpc::CheckpointStoreService::new(store, &config.telemetry.registry);
    let authenticate =
        Authenticate::new(config.security.access.clone(), &config.telemetry.registry)
            .all_namespaces_only();
    let routes = tonic::service::Routes::new(InterceptedService::new(
        CheckpointStoreServer::new(service)
            // A 100,000-task execution's full checkpoint is a few megabytes.
            .max_decoding_message_size(trellis_bus::MAX_PAYLOAD * 8)
            .max_encoding_message_size(usize::MAX),
        authenticate,
    ));
    readiness.set(true);
    let health = config.telemetry.health.clone();
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        stopping.cancelled().await;
        health.stopping().await;
    });
    let served =
        trellis_grpc::server::serve::<CheckpointStoreServer<grpc::CheckpointStoreService>>(
            listener,
            routes,
            &config.security,
            &config.telemetry.registry,
            shutdown.clone(),
        )
        .await;
    // Whatever stopped the server stops the rest; the read model finishes its write first.
    shutdown.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, background.wait())
        .await
        .is_err()
    {
        tracing::warn!("background work did not stop within {SHUTDOWN_GRACE:?}");
    }
    served?;
    tracing::info!("checkpoint-store stopped");
    Ok(())
}

/// The Trellis checkpoint-store: checkpoints and the read model, served over gRPC.
#[derive(Debug, Parser)]
#[command(name = "trellis-checkpoint-store", version, about)]
struct Args {
    /// Database: postgres://user@host/db, or sqlite://path (created when missing).
    ///
    /// PostgreSQL uses TLS when the server offers it (sslmode=prefer). To insist on it and check
    /// the server, add ?sslmode=verify-full&sslrootcert=/path/ca.pem; to present a client
    /// certificate, also &sslcert=/path/client.pem&sslkey=/path/client.key.
    #[arg(
        long,
        env = "TRELLIS_DATABASE_URL",
        default_value = DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    database_url: String,
    #[command(flatten)]
    nats: trellis_bus::NatsArgs,
    /// gRPC listen address.
    #[arg(
        long,
        env = "TRELLIS_CHECKPOINT_STORE_ADDR",
        default_value = "127.0.0.1:7500"
    )]
    listen: SocketAddr,
    /// This replica's identity in the ingest lease: every replica serves reads, the one
    /// holding the lease also writes the read model from the event log (default: the host
    /// name).
    #[arg(long, env = "TRELLIS_CHECKPOINT_STORE_ID")]
    id: Option<String>,
    /// The ingest lease lapses this long after its holder stopped renewing it; another replica
    /// then takes the event log over (e.g. `5s`).
    #[arg(long, env = "TRELLIS_INGEST_LEASE_TTL", default_value = "5s", value_parser = humantime::parse_duration)]
    ingest_lease_ttl: Duration,
    /// Remove a finished execution's messages from the event log this long after it ended (e.g.
    /// `30d`); its history stays in the read model, but a coordinator can no longer load or retry
    /// it. Unfinished executions' messages are never removed. Default: keep everything.
    #[arg(long, env = "TRELLIS_EVENTS_RETENTION", value_parser = humantime::parse_duration)]
    events_retention: Option<Duration>,
    #[command(flatten)]
    server: trellis_grpc::ServerArgs,
    #[command(flatten)]
    telemetry: trellis_telemetry::Args,
}

/// The default admin address: `/metrics`, `/healthz`, `/readyz`, gRPC health.
const DEFAULT_ADMIN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    9500,
));

/// The `trellis-checkpoint-store` binary: parses the process's arguments, installs logging, runs
/// until SIGTERM or Ctrl-C. Exit code 2 for bad arguments, 1 when the service fails.
pub fn main_entry() -> ExitCode {
    main_from(std::env::args_os())
}

/// [`main_entry`] with the arguments given (the first is the program name), so another package
/// can host the same binary.
pub fn main_from(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Args = match trellis_telemetry::parse_flags(args) {
        Ok(args) => args,
        Err(exit) => return exit,
    };
    let log_format = args.telemetry.log_format;
    trellis_telemetry::block_on_service("trellis-checkpoint-store", log_format, async move {
        let fail = |message: String| {
            eprintln!("trellis-checkpoint-store: {message}");
            ExitCode::from(2)
        };
        let nats = match args.nats.options() {
            Ok(nats) => nats,
            Err(err) => return fail(err.to_string()),
        };
        let security = match args.server.load() {
            Ok(security) => security,
            Err(err) => return fail(err.to_string()),
        };
        let listener = match TcpListener::bind(args.listen).await {
            Ok(listener) => listener,
            Err(err) => return fail(format!("cannot listen on {}: {err}", args.listen)),
        };
        let shutdown = trellis_telemetry::cancel_on_signal();
        let telemetry = Telemetry::new();
        if let Err(err) = args
            .telemetry
            .spawn_admin(DEFAULT_ADMIN, &telemetry, shutdown.clone())
            .await
        {
            return fail(err.to_string());
        }
        let config = Config {
            database_url: args.database_url,
            nats,
            security,
            telemetry,
            id: args
                .id
                .unwrap_or_else(|| trellis_bus::host_identity("checkpoint-store")),
            ingest_lease_ttl: args.ingest_lease_ttl,
            events_retention: args.events_retention,
        };
        let outcome = run(config, listener, shutdown).await;
        trellis_telemetry::exit_code("trellis-checkpoint-store", outcome)
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        super::Args::command().debug_assert();
    }
}
