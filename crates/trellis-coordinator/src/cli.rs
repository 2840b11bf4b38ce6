//! The `trellis-coordinator` binary's command line.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;

/// The default admin address: `/metrics`, `/healthz`, `/readyz`, gRPC health.
const DEFAULT_ADMIN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    9400,
));

/// The Trellis coordinator: runs executions, serves the `Coordinator` gRPC API.
#[derive(Debug, Parser)]
#[command(name = "trellis-coordinator", version, about)]
struct Binary {
    #[command(flatten)]
    args: Args,
    #[command(flatten)]
    client: trellis_grpc::ClientArgs,
}

/// Run the coordinator service in the foreground.
///
/// The coordinator's flags but the client credentials (the `trellis` command line has those for
/// every subcommand).
#[derive(Debug, clap::Args)]
#[command(
    long_about = "Run the coordinator service in the foreground: it owns shards of executions \
        through leases in NATS, recovers their state from checkpoints and the event log, and \
        serves the Coordinator gRPC API. Run several with different --id: they spread the shards \
        evenly (each holds at most shards / coordinators, rounded up), hand shards over when one \
        joins, take a dead one's shards once its leases lapse, and forward every call to the \
        coordinator holding the shard it is about, so any of them answers any call. SIGTERM or \
        Ctrl-C stops it gracefully (its leases are released at once).",
    after_help = "Examples (`trellis coordinator` takes the same flags):\n  \
        trellis-coordinator --id coordinator-0 --shards 4      # 127.0.0.1:7400, NATS on localhost\n  \
        trellis-coordinator --id coordinator-1 --listen 127.0.0.1:7401 --admin-addr 127.0.0.1:9401 --shards 4   # a second, active one\n  \
        trellis-coordinator --listen 0.0.0.0:7400 --admin-addr 0.0.0.0:9090 \\\n    \
        --nats-url nats://nats:4222 --nats-creds /etc/trellis/nats.creds \\\n    \
        --checkpoint-store https://trellis-checkpoint-store:7500 --token-file /etc/trellis/token \\\n    \
        --tls-cert tls.crt --tls-key tls.key --access-file /etc/trellis/access.yaml\n\n\
        Traces are exported over OTLP/gRPC when OTEL_EXPORTER_OTLP_ENDPOINT is set."
)]
pub struct Args {
    #[command(flatten)]
    nats: trellis_bus::NatsArgs,
    /// gRPC listen address.
    #[arg(
        long,
        env = "TRELLIS_COORDINATOR_ADDR",
        default_value = "127.0.0.1:7400"
    )]
    listen: SocketAddr,
    /// Number of shards executions are spread over; every coordinator of a deployment must use
    /// the same number.
    #[arg(long, env = "TRELLIS_SHARDS", default_value_t = 1)]
    shards: u32,
    /// This coordinator's identity in shard leases: unique among running coordinators, stable
    /// across restarts (default: the host name).
    #[arg(long, env = "TRELLIS_COORDINATOR_ID")]
    id: Option<String>,
    /// A shard lease lapses this long after its owner stopped renewing it; another coordinator takes the
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
    /// A finished execution leaves this coordinator's memory this long after it was last
    /// changed or asked about; later reads load it again from its checkpoint and log (e.g.
    /// `5m`, `30s`, `0s`).
    #[arg(long, env = "TRELLIS_KEEP_FINISHED", default_value = "5m", value_parser = humantime::parse_duration)]
    keep_finished: std::time::Duration,
    /// The address other coordinators forward calls for this one's shards to, e.g.
    /// `http://10.0.3.7:7400` (default: the listen address, or the host name and port when
    /// listening on 0.0.0.0).
    #[arg(long, env = "TRELLIS_COORDINATOR_ADVERTISE")]
    advertise: Option<String>,
    /// Circuit breakers: after this many consecutive failed attempts of one queue and task type,
    /// new dispatches of that type wait (they do not fail) for `--breaker-cooldown`, then one
    /// probe goes; its success closes the breaker, its failure opens it again. 0 turns them off.
    #[arg(long, env = "TRELLIS_BREAKER_FAILURES", default_value_t = 0)]
    breaker_failures: u32,
    /// How long an open circuit breaker holds dispatches before its probe (e.g. `30s`, `2m`).
    #[arg(long, env = "TRELLIS_BREAKER_COOLDOWN", default_value = "30s", value_parser = humantime::parse_duration)]
    breaker_cooldown: std::time::Duration,
    /// Most tasks of one execution dispatched and not yet started by a worker; its other ready
    /// tasks wait until a result or a heartbeat shows one started. Tasks wait in a queue's
    /// stream in dispatch order, so the window bounds how long one execution's tasks can keep
    /// another's waiting; tasks running on a worker's slots do not count, so long tasks still
    /// fill a fleet. 0: no limit (`max_concurrency` still applies).
    #[arg(long, env = "TRELLIS_DISPATCH_WINDOW", default_value_t = crate::turn::DEFAULT_DISPATCH_WINDOW)]
    dispatch_window: u32,
    /// Send every assignment to the tasks stream, never offering a small execution's tasks to
    /// an idle worker first (a core NATS request on `trellis.offer.<queue>`).
    #[arg(long, env = "TRELLIS_NO_OFFERS")]
    no_offers: bool,
    #[command(flatten)]
    server: trellis_grpc::ServerArgs,
    #[command(flatten)]
    telemetry: trellis_telemetry::Args,
}

/// Runs the `trellis-coordinator` binary: parses the flags, installs tracing, and runs the
/// coordinator until SIGTERM or Ctrl-C. Another package can host the same binary by calling it
/// from its own `main`.
pub fn main_entry() -> ExitCode {
    match trellis_telemetry::parse_flags::<Binary>(std::env::args_os()) {
        Ok(binary) => run_with(binary.args, &binary.client),
        Err(exit) => exit,
    }
}

/// Runs the coordinator with flags already parsed (`trellis coordinator` hosts it this way)
/// until SIGTERM or Ctrl-C.
pub fn run_with(args: Args, client: &trellis_grpc::ClientArgs) -> ExitCode {
    trellis_telemetry::block_on_service(
        "trellis-coordinator",
        args.telemetry.log_format,
        main_async(args, client),
    )
}

async fn main_async(args: Args, client: &trellis_grpc::ClientArgs) -> ExitCode {
    let fail = |message: String| {
        eprintln!("trellis-coordinator: {message}");
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
    let store_client = match client.load() {
        Ok(client) => client,
        Err(err) => return fail(err.to_string()),
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(err) => return fail(format!("cannot listen on {}: {err}", args.listen)),
    };
    let shutdown = trellis_telemetry::cancel_on_signal();
    let telemetry = trellis_telemetry::Telemetry::new();
    if let Err(err) = args
        .telemetry
        .spawn_admin(DEFAULT_ADMIN, &telemetry, shutdown.clone())
        .await
    {
        return fail(err.to_string());
    }
    let config = crate::Config {
        nats,
        shards: args.shards,
        id: args.id.unwrap_or_else(crate::default_id),
        lease_ttl: args.lease_ttl,
        checkpoint_store: args.checkpoint_store,
        checkpoint_every: args.checkpoint_every,
        keep_finished: args.keep_finished,
        breaker_failures: args.breaker_failures,
        breaker_cooldown: args.breaker_cooldown,
        dispatch_window: args.dispatch_window,
        offers: !args.no_offers,
        advertise: args.advertise,
        security,
        store_client,
        telemetry,
    };
    let outcome = crate::run(config, listener, shutdown).await;
    trellis_telemetry::exit_code("trellis-coordinator", outcome)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        super::Binary::command().debug_assert();
    }
}
