//! The `trellis-monitor` binary's command line.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use trellis_grpc::ClientSecurity;
use trellis_telemetry::redact::Secret;

/// The default admin address: `/metrics`, `/healthz`, `/readyz`, gRPC health.
const DEFAULT_ADMIN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    9700,
));

/// The Trellis monitor: a live web UI and JSON API over executions, workers and checkpoints.
///
/// Open the address it prints in a browser. Reads need nothing; controls (pause, resume, cancel,
/// retry, checkpoint, answer) need the token given with --monitor-token, sent as
/// `Authorization: Bearer <token>` (the UI asks for it, or takes `?token=` from its address).
/// With --forward-tokens, every call needs the caller's own token, which the coordinator checks.
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
    #[command(flatten)]
    client: trellis_grpc::ClientArgs,
}

/// The monitor's flags, but the coordinator's address and the client credentials (the `trellis`
/// command line has those for every subcommand).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples (the `trellis-monitor` binary takes the same flags):\n  \
        trellis monitor                                  # http://127.0.0.1:7700, read-only\n  \
        TRELLIS_MONITOR_TOKEN=$(openssl rand -hex 16) trellis monitor --listen 0.0.0.0:7700\n  \
        trellis monitor --coordinator http://coordinator:7400 --checkpoint-store http://store:7500\n  \
        trellis monitor --forward-tokens --token-file /etc/trellis/service-token   # with an access file\n\n\
        API: curl http://127.0.0.1:7700/api/executions"
)]
pub struct Args {
    /// HTTP listen address.
    #[arg(long, env = "TRELLIS_MONITOR_ADDR", default_value = crate::DEFAULT_ADDR)]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub nats: trellis_bus::NatsArgs,
    /// Checkpoint-store gRPC address (for the checkpoints of an execution).
    #[arg(long, env = "TRELLIS_CHECKPOINT_STORE_URL")]
    pub checkpoint_store: Option<String>,
    /// Planner gRPC address (for the backlog page: a planner started with --database-url).
    #[arg(long, env = "TRELLIS_PLANNER")]
    pub planner: Option<String>,
    /// Token that controls require; without one every control is refused.
    #[arg(
        long = "monitor-token",
        env = "TRELLIS_MONITOR_TOKEN",
        hide_env_values = true,
        conflicts_with = "forward_tokens"
    )]
    pub monitor_token: Option<Secret>,
    /// Forward each caller's bearer token to the coordinator, which decides what it may see and
    /// do (for coordinators started with an access file); the monitor's own --token is then
    /// used only for the checkpoint-store.
    #[arg(long, env = "TRELLIS_MONITOR_FORWARD_TOKENS")]
    pub forward_tokens: bool,
    /// How often live streams get an update while events arrive, in milliseconds.
    #[arg(long, default_value_t = crate::DEFAULT_FLUSH.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub flush_ms: u64,
    #[command(flatten)]
    pub telemetry: trellis_telemetry::Args,
}

impl Args {
    /// The service configuration these flags describe.
    pub fn config(
        &self,
        coordinator_url: String,
        client: ClientSecurity,
    ) -> Result<crate::Config, String> {
        Ok(crate::Config {
            nats: self.nats.options().map_err(|err| err.to_string())?,
            coordinator_url,
            checkpoint_store_url: self.checkpoint_store.clone(),
            planner_url: self.planner.clone(),
            token: self
                .monitor_token
                .clone()
                .filter(|t| !t.expose().is_empty()),
            forward_tokens: self.forward_tokens,
            client,
            flush: Duration::from_millis(self.flush_ms),
            telemetry: trellis_telemetry::Telemetry::new(),
        })
    }
}

/// Runs the `trellis-monitor` binary: parses the flags, installs tracing, and serves until
/// SIGTERM or Ctrl-C.
pub fn main_entry() -> ExitCode {
    match trellis_telemetry::parse_flags::<Binary>(std::env::args_os()) {
        Ok(binary) => run_with(binary.args, binary.coordinator, &binary.client),
        Err(exit) => exit,
    }
}

/// Serves with flags already parsed (`trellis monitor` hosts the service this way).
pub fn run_with(
    args: Args,
    coordinator_url: String,
    client: &trellis_grpc::ClientArgs,
) -> ExitCode {
    let client = match client.load() {
        Ok(client) => client,
        Err(err) => {
            eprintln!("trellis-monitor: {err}");
            return ExitCode::from(2);
        }
    };
    let log_format = args.telemetry.log_format;
    trellis_telemetry::block_on_service(
        "trellis-monitor",
        log_format,
        serve(args, coordinator_url, client),
    )
}

/// Serves with `args` until SIGTERM or Ctrl-C.
pub async fn serve(args: Args, coordinator_url: String, client: ClientSecurity) -> ExitCode {
    let config = match args.config(coordinator_url, client) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("trellis-monitor: {err}");
            return ExitCode::from(2);
        }
    };
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
    let shutdown = trellis_telemetry::cancel_on_signal();
    if let Err(err) = args
        .telemetry
        .spawn_admin(DEFAULT_ADMIN, &config.telemetry, shutdown.clone())
        .await
    {
        eprintln!("trellis-monitor: {err}");
        return ExitCode::from(2);
    }
    if config.token.is_none() && !config.forward_tokens {
        eprintln!(
            "trellis-monitor: no --monitor-token given: the UI is read-only, controls are refused"
        );
    }
    eprintln!("trellis-monitor: http://{}", args.listen);
    let outcome = crate::run(config, listener, shutdown).await;
    trellis_telemetry::exit_code("trellis-monitor", outcome)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        super::Binary::command().debug_assert();
    }
}
