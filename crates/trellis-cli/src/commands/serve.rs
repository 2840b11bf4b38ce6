//! `trellis coordinator`: the coordinator service in the foreground, as the `trellis-coordinator`
//! binary runs it (one binary is enough for a laptop or a container).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::Failure;

/// Run the coordinator service in the foreground.
#[derive(Debug, Args)]
#[command(
    long_about = "Run the coordinator service in the foreground: it owns shards of executions \
        through leases in NATS, recovers their state from checkpoints and the event log, and \
        serves the Coordinator gRPC API. Run two with different --id for a standby: it takes the \
        shards over when the active one stops renewing its leases. SIGTERM or Ctrl-C stops it \
        gracefully (its leases are released at once).",
    after_help = "Examples:\n  \
        trellis coordinator --nats-url nats://127.0.0.1:4222 --id coordinator-0\n  \
        trellis coordinator --id coordinator-1 --listen 127.0.0.1:7401   # a standby\n  \
        trellis coordinator --checkpoint-store http://127.0.0.1:7500 --checkpoint-every 5s"
)]
pub struct CoordinatorArgs {
    /// NATS server with JetStream.
    #[arg(
        long,
        env = "TRELLIS_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,
    /// Where to serve gRPC.
    #[arg(
        long,
        env = "TRELLIS_COORDINATOR_ADDR",
        default_value = "127.0.0.1:7400"
    )]
    pub listen: SocketAddr,
    /// Identity in shard leases: unique among running coordinators, stable across restarts
    /// (default: the host name).
    #[arg(long, env = "TRELLIS_COORDINATOR_ID")]
    pub id: Option<String>,
    /// Shards executions are spread over; the same for every coordinator of a deployment.
    #[arg(long, env = "TRELLIS_SHARDS", default_value_t = 1)]
    pub shards: u32,
    /// A lease lapses this long after its owner stopped renewing it.
    #[arg(long, env = "TRELLIS_LEASE_TTL", default_value = "3s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
    /// The checkpoint-store's gRPC address, e.g. http://127.0.0.1:7500.
    #[arg(long, env = "TRELLIS_CHECKPOINT_STORE_URL")]
    pub checkpoint_store: Option<String>,
    /// How often a running execution whose state changed is checkpointed.
    #[arg(long, env = "TRELLIS_CHECKPOINT_EVERY", default_value = "10s", value_parser = humantime::parse_duration)]
    pub checkpoint_every: Duration,
}

/// Runs `trellis coordinator` until SIGTERM or Ctrl-C.
pub async fn coordinator(args: CoordinatorArgs) -> Result<(), Failure> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| Failure::bad_input(format!("cannot listen on {}: {e}", args.listen)))?;
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        terminated().await;
        signal.cancel();
    });
    let config = trellis_coordinator::Config {
        nats_url: args.nats_url,
        shards: args.shards,
        id: args.id.unwrap_or_else(trellis_coordinator::default_id),
        lease_ttl: args.lease_ttl,
        checkpoint_store: args.checkpoint_store,
        checkpoint_every: args.checkpoint_every,
    };
    trellis_coordinator::run(config, listener, shutdown)
        .await
        .map_err(|e| Failure::failed(format!("coordinator: {e}")))
}

/// Completes on SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn terminated() {
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
