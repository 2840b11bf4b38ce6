//! The Trellis checkpoint-store service (DESIGN.md §1, §2, §8): checkpoints of executions with
//! checksums, and the queryable read model built from the event log.
//!
//! - [`store`]: the [`Store`] trait, its PostgreSQL and SQLite backends, and [`store::connect`],
//!   which picks one from the database URL and applies the embedded migrations.
//! - [`checkpoint`]: create (verified), get, restore (with fallback past corrupt links), list and
//!   prune, written once over `dyn Store`.
//! - `ingest`: consumes `TRELLIS_EVENTS` into executions, task instances, events and questions,
//!   keeping a replica state machine per unfinished execution; `heartbeats`: workers from their
//!   heartbeats, written every few seconds.
//! - [`grpc`]: the `CheckpointStore` gRPC service.
//!
//! [`run`] starts all of it; `main.rs` is a thin shell around [`main_entry`].

pub mod checkpoint;
pub mod grpc;
mod heartbeats;
mod ingest;
pub mod store;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use trellis_proto::v1::checkpoint_store_server::CheckpointStoreServer;

pub use crate::store::Store;

/// The default database: an SQLite file in the working directory, created when missing.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://trellis.db?mode=rwc";

/// The default gRPC address.
pub const DEFAULT_ADDR: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    7500,
));

/// The name of the store's durable consumer of the event log.
pub const EVENTS_CONSUMER: &str = ingest::CONSUMER_NAME;

/// How long the background work may take to finish after shutdown is asked.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Checkpoint-store settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `postgres://...` or `sqlite://...` (see [`store::connect`]).
    pub database_url: String,
    /// The NATS server (JetStream enabled) carrying the event log and heartbeats.
    pub nats_url: String,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            database_url: DEFAULT_DATABASE_URL.to_owned(),
            nats_url: "nats://127.0.0.1:4222".to_owned(),
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
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("cannot read the address of the gRPC listener: {0}")]
    Listener(std::io::Error),
    #[error("cannot build the gRPC reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
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
    let store = store::connect(&config.database_url).await?;
    let nats = trellis_bus::connect(&config.nats_url, "trellis-checkpoint-store").await?;
    let addr = listener.local_addr().map_err(Error::Listener)?;
    let background = TaskTracker::new();
    background.spawn(ingest::Ingest::run(
        store.clone(),
        nats.clone(),
        shutdown.clone(),
    ));
    background.spawn(heartbeats::run(store.clone(), nats, shutdown.clone()));
    background.close();
    tracing::info!(%addr, backend = ?store.backend(), nats = %config.nats_url, "checkpoint-store serving");

    let service = grpc::CheckpointStoreService::new(store);
    // grpc.health.v1 and reflection, so load balancers and `grpcurl` work out of the box.
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<CheckpointStoreServer<grpc::CheckpointStoreService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(trellis_proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let not_serving = shutdown.clone();
    tokio::spawn(async move {
        not_serving.cancelled().await;
        health
            .set_not_serving::<CheckpointStoreServer<grpc::CheckpointStoreService>>()
            .await;
    });
    // Small request/response frames must not wait for Nagle's algorithm; tonic sets TCP_NODELAY
    // only on listeners it binds itself.
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |stream| {
            stream.inspect(|s| {
                let _ = s.set_nodelay(true);
            })
        },
    );
    let served = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(
            CheckpointStoreServer::new(service)
                // A 100,000-task execution's full checkpoint is a few megabytes.
                .max_decoding_message_size(trellis_bus::MAX_PAYLOAD * 8)
                .max_encoding_message_size(usize::MAX),
        )
        .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned())
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
    /// Database: postgres://user@host/db, or sqlite://path?mode=rwc (created when missing).
    #[arg(long, env = "TRELLIS_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    database_url: String,
    /// NATS server with JetStream.
    #[arg(
        long,
        env = "TRELLIS_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats_url: String,
    /// gRPC listen address.
    #[arg(
        long,
        env = "TRELLIS_CHECKPOINT_STORE_ADDR",
        default_value = "127.0.0.1:7500"
    )]
    listen: SocketAddr,
}

/// The `trellis-checkpoint-store` binary: parses the process's arguments, installs logging, runs
/// until SIGTERM or Ctrl-C. Exit code 2 for bad arguments, 1 when the service fails.
pub fn main_entry() -> ExitCode {
    main_from(std::env::args_os())
}

/// [`main_entry`] with the arguments given (the first is the program name), so another package
/// can host the same binary.
pub fn main_from(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Another host (a test, `trellis dev`) may have installed a subscriber already.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("trellis-checkpoint-store: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::bind(args.listen).await {
            Ok(listener) => listener,
            Err(err) => {
                eprintln!(
                    "trellis-checkpoint-store: cannot listen on {}: {err}",
                    args.listen
                );
                return ExitCode::from(2);
            }
        };
        let shutdown = CancellationToken::new();
        let signal = shutdown.clone();
        tokio::spawn(async move {
            trellis_bus::shutdown_signal().await;
            signal.cancel();
        });
        let config = Config {
            database_url: args.database_url,
            nats_url: args.nats_url,
        };
        match run(config, listener, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("trellis-checkpoint-store: {err}");
                ExitCode::FAILURE
            }
        }
    })
}
