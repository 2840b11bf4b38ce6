//! The `trellis-monitor` binary's command line.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tokio_util::sync::CancellationToken;

/// The Trellis monitor: a live web UI and JSON API over executions, workers and checkpoints.
///
/// Open the address it prints in a browser. Reads need nothing; controls (pause, resume, cancel,
/// retry, checkpoint, answer) need the token given with --token, sent as
/// `Authorization: Bearer <token>` (the UI asks for it, or takes `?token=` from its address).
#[derive(Debug, Parser)]
#[command(name = "trellis-monitor", version, about)]
struct Binary {
    #[command(flatten)]
    args: Args,
    /// Coordinator gRPC address.
    #[arg(
        long,
        env = "TRELLIS_COORDINATOR",
        default_value = "http://127.0.0.1:7400"
    )]
    coordinator: String,
}

/// The monitor's flags, but the coordinator's address (the `trellis` command line has that one
/// for every subcommand).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples (the `trellis-monitor` binary takes the same flags):\n  \
        trellis monitor                                  # http://127.0.0.1:7700, read-only\n  \
        TRELLIS_MONITOR_TOKEN=$(openssl rand -hex 16) trellis monitor --listen 0.0.0.0:7700\n  \
        trellis monitor --coordinator http://coordinator:7400 --checkpoint-store http://store:7500\n\n\
        API: curl http://127.0.0.1:7700/api/executions"
)]
pub struct Args {
    /// HTTP listen address.
    #[arg(long, env = "TRELLIS_MONITOR_ADDR", default_value = crate::DEFAULT_ADDR)]
    pub listen: SocketAddr,
    /// NATS server with the event log.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// Checkpoint-store gRPC address (for the checkpoints of an execution).
    #[arg(long, env = "TRELLIS_CHECKPOINT_STORE")]
    pub checkpoint_store: Option<String>,
    /// Token that controls require; without one every control is refused.
    #[arg(long, env = "TRELLIS_MONITOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How often live streams get an update while events arrive, in milliseconds.
    #[arg(long, default_value_t = crate::DEFAULT_FLUSH.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub flush_ms: u64,
}

impl Args {
    /// The service configuration these flags describe.
    pub fn config(&self, coordinator_url: String) -> crate::Config {
        crate::Config {
            nats_url: self.nats.clone(),
            coordinator_url,
            checkpoint_store_url: self.checkpoint_store.clone(),
            token: self.token.clone().filter(|t| !t.is_empty()),
            flush: Duration::from_millis(self.flush_ms),
        }
    }
}

/// Runs the `trellis-monitor` binary: parses the flags, installs tracing, and serves until
/// SIGTERM or Ctrl-C.
pub fn main_entry() -> ExitCode {
    let binary = Binary::parse();
    run_with(binary.args, binary.coordinator)
}

/// Serves with flags already parsed (`trellis monitor` hosts the service this way).
pub fn run_with(args: Args, coordinator_url: String) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("trellis-monitor: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // `try_init`: a host process (the `trellis` CLI) may have installed one already.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .try_init();
    runtime.block_on(serve(args, coordinator_url))
}

/// Serves with `args` until SIGTERM or Ctrl-C.
pub async fn serve(args: Args, coordinator_url: String) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!(
                "trellis-monitor: cannot listen on {}: {err} (is another monitor running? pick \
                 another address with --listen)",
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
    if args.token.as_deref().is_none_or(str::is_empty) {
        eprintln!("trellis-monitor: no --token given: the UI is read-only, controls are refused");
    }
    eprintln!("trellis-monitor: http://{}", args.listen);
    match crate::run(args.config(coordinator_url), listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("trellis-monitor: {err}");
            ExitCode::FAILURE
        }
    }
}
