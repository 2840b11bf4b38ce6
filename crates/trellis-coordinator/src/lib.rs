//! The Trellis coordinator: runs executions.
//!
//! It holds one [`trellis_core::machine::Execution`] per live execution inside a single engine task
//! ([`engine`]), which is the only writer of their event logs. Requests arrive over gRPC
//! ([`grpc`]), worker results over the JetStream results stream; every accepted event is appended
//! to `trellis.events.<execution_id>` before its side effects (dispatching tasks, stopping
//! cancelled ones) happen, and all of it is done in batches so throughput does not pay one round
//! trip per task.

mod cli;
mod engine;
mod grpc;
mod workers;

use std::net::SocketAddr;

use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use trellis_proto::v1::coordinator_server::CoordinatorServer;

pub use cli::main_entry;

/// Coordinator settings.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The NATS server (JetStream enabled).
    pub nats_url: String,
    /// Number of result shards (`trellis.results.<shard>`); workers must use the same number.
    pub shards: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            nats_url: "nats://127.0.0.1:4222".to_owned(),
            shards: 1,
        }
    }
}

/// Why the coordinator stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Bus(#[from] trellis_bus::Error),
    #[error("cannot subscribe to {subject}: {message}")]
    Subscribe { subject: String, message: String },
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("cannot read the address of the gRPC listener: {0}")]
    Listener(std::io::Error),
    #[error("cannot build the gRPC reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// The default gRPC address.
pub const DEFAULT_ADDR: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    7400,
));

/// Runs the coordinator until `shutdown` is cancelled: connects to NATS, creates the streams if
/// needed, consumes results, and serves the `Coordinator` gRPC API on `listener`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let nats = trellis_bus::connect(&config.nats_url, "trellis-coordinator").await?;
    let js = async_nats::jetstream::new(nats.clone());
    let streams = trellis_bus::ensure_streams(&js).await?;
    let registry = workers::Registry::start(&nats, shutdown.clone()).await?;
    let engine = engine::Engine::new(nats.clone(), js, config.shards);
    let handle = engine.spawn(&streams, shutdown.clone()).await?;
    let addr = listener.local_addr().map_err(Error::Listener)?;
    tracing::info!(%addr, nats = %config.nats_url, "coordinator serving");
    let service = grpc::CoordinatorService::new(handle, registry);
    // grpc.health.v1 and reflection, so load balancers and `grpcurl` work out of the box.
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<CoordinatorServer<grpc::CoordinatorService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(trellis_proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let not_serving = shutdown.clone();
    tokio::spawn(async move {
        not_serving.cancelled().await;
        health
            .set_not_serving::<CoordinatorServer<grpc::CoordinatorService>>()
            .await;
    });
    // Small request/response frames must not wait for Nagle's algorithm (a 40 ms stall against
    // delayed ACKs); tonic sets TCP_NODELAY only on listeners it binds itself.
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |stream| {
            stream.inspect(|s| {
                let _ = s.set_nodelay(true);
            })
        },
    );
    tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(CoordinatorServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await?;
    Ok(())
}
