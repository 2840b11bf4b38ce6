//! The `trellis-coordinator` binary's command line.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// The Trellis coordinator: runs executions, serves the `Coordinator` gRPC API.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
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
        env = "TRELLIS_COORDINATOR_ADDR",
        default_value = "127.0.0.1:7400"
    )]
    listen: std::net::SocketAddr,
    /// Number of shards executions are spread over; every coordinator of a deployment must use
    /// the same number.
    #[arg(long, env = "TRELLIS_SHARDS", default_value_t = 1)]
    shards: u32,
    /// This coordinator's identity in shard leases: unique among running coordinators, stable
    /// across restarts (default: the host name).
    #[arg(long, env = "TRELLIS_COORDINATOR_ID")]
    id: Option<String>,
    /// A shard lease lapses this long after its owner stopped renewing it; a standby takes the
    /// shard over then (e.g. `3s`, `500ms`).
    #[arg(long, env = "TRELLIS_LEASE_TTL", default_value = "3s", value_parser = humantime::parse_duration)]
    lease_ttl: std::time::Duration,
    /// The checkpoint-store's gRPC address, e.g. `http://127.0.0.1:7500`. Without one, no
    /// checkpoints are taken and recovery replays whole event logs.
    #[arg(long, env = "TRELLIS_CHECKPOINT_STORE_URL")]
    checkpoint_store: Option<String>,
    /// How often a running execution whose state changed is checkpointed.
    #[arg(long, env = "TRELLIS_CHECKPOINT_EVERY", default_value = "10s", value_parser = humantime::parse_duration)]
    checkpoint_every: std::time::Duration,
}

/// Runs the `trellis-coordinator` binary: parses the flags, installs tracing, and runs the
/// coordinator until SIGTERM or Ctrl-C. Another package can host the same binary by calling it
/// from its own `main`.
pub fn main_entry() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("trellis-coordinator: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(main_async())
}

async fn main_async() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!(
                "trellis-coordinator: cannot listen on {}: {err}",
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
    let config = crate::Config {
        nats_url: args.nats_url,
        shards: args.shards,
        id: args.id.unwrap_or_else(crate::default_id),
        lease_ttl: args.lease_ttl,
        checkpoint_store: args.checkpoint_store,
        checkpoint_every: args.checkpoint_every,
    };
    match crate::run(config, listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("trellis-coordinator: {err}");
            ExitCode::FAILURE
        }
    }
}
