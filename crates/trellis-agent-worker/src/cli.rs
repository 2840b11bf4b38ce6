//! The `trellis-agent-worker` binary's command line: reads the configuration from flags or
//! `TRELLIS_*` variables, installs tracing, and runs the worker until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use clap::Parser;

use crate::{CancellationToken, Config, HandlerRegistry};

/// Runs Trellis task handlers for the tasks published on NATS JetStream.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// NATS server URL.
    #[arg(
        long,
        env = "TRELLIS_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats_url: String,
    /// Queues to consume, comma separated (default: the built-in handlers' queues).
    #[arg(long, env = "TRELLIS_QUEUES", value_delimiter = ',')]
    queues: Option<Vec<String>>,
    /// Handlers run at the same time.
    #[arg(long, env = "TRELLIS_SLOTS")]
    slots: Option<usize>,
    /// Worker id (default: <host>-<pid>).
    #[arg(long, env = "TRELLIS_WORKER_ID")]
    worker_id: Option<String>,
    /// Number of coordinator shards.
    #[arg(long, env = "TRELLIS_SHARDS")]
    shards: Option<u32>,
    /// Milliseconds running handlers get to finish on shutdown.
    #[arg(long, env = "TRELLIS_SHUTDOWN_GRACE_MS")]
    shutdown_grace_ms: Option<u64>,
}

impl Args {
    fn into_config(self) -> Config {
        let defaults = Config::default();
        Config {
            nats_url: self.nats_url,
            queues: self.queues.unwrap_or(defaults.queues),
            slots: self.slots.unwrap_or(defaults.slots),
            worker_id: self.worker_id,
            shards: self.shards.unwrap_or(defaults.shards),
            shutdown_grace_ms: self.shutdown_grace_ms.unwrap_or(defaults.shutdown_grace_ms),
        }
    }
}

/// `EX_USAGE` of sysexits.h: the configuration is wrong.
const EXIT_USAGE: u8 = 64;

/// Runs the `trellis-agent-worker` binary: parses the flags, installs tracing, and runs the worker
/// with the built-in handlers until SIGTERM or Ctrl-C. Another package can host the same binary
/// by calling it from its own `main`.
pub fn main_entry() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("trellis-agent-worker: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(main_async())
}

async fn main_async() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let config = Args::parse().into_config();
    if let Err(error) = config.validate() {
        eprintln!("trellis-agent-worker: invalid configuration: {error}");
        return ExitCode::from(EXIT_USAGE);
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    match crate::run(config, HandlerRegistry::with_builtins(), shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("trellis-agent-worker: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Cancels `shutdown` on SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn cancel_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(terminate) => terminate,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the worker");
                let _ = ctrl_c.await;
                shutdown.cancel();
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested");
    shutdown.cancel();
}
