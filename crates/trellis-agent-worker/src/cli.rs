//! The `trellis-agent-worker` binary's command line: reads the configuration from flags or
//! `TRELLIS_*` variables, installs tracing, and runs the worker until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;

use crate::{CancellationToken, Config, HandlerRegistry};

/// The default admin address: `/metrics`, `/healthz`, `/readyz`, gRPC health. Two workers on
/// one host need `--admin-addr` for one of them (or `--admin-addr off`).
const DEFAULT_ADMIN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    9800,
));

/// Runs Trellis task handlers for the tasks published on NATS JetStream.
#[derive(Debug, Parser)]
#[command(
    version,
    after_help = "Examples:\n  \
        trellis-agent-worker                                  # every built-in queue, 16 slots\n  \
        trellis-agent-worker --queues shell,http --slots 4 --admin-addr 0.0.0.0:9090\n  \
        TRELLIS_NATS_URL=tls://nats:4222 TRELLIS_NATS_CREDS=/etc/trellis/nats.creds trellis-agent-worker\n  \
        trellis-agent-worker --drain --worker-id worker-7    # drain worker-7, wait until it exits"
)]
struct Args {
    #[command(flatten)]
    nats: trellis_bus::NatsArgs,
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
    /// Deliveries of one task message without a result (each worker that took it died) after
    /// which it is not run again: the attempt fails with "worker lost N times" and the plan's
    /// failure policy decides [default: 10].
    #[arg(long, env = "TRELLIS_MAX_DELIVERIES", value_parser = clap::value_parser!(u32).range(1..))]
    max_deliveries: Option<u32>,
    /// Outputs larger than this many bytes go to the Object Store bucket `trellis_outputs` and the
    /// result carries a reference (size and SHA-256) instead; readers get the value back
    /// transparently [default: 262144].
    #[arg(long, env = "TRELLIS_OUTPUT_INLINE_LIMIT", value_name = "BYTES")]
    output_inline_limit: Option<usize>,
    /// Publish every final result to the results stream instead of first handing it to the
    /// coordinator holding its shard (a core NATS request: one message where the stream takes a
    /// stored write and its delivery). Either way a result counts only once its events are
    /// stored; this changes the path, not what is kept.
    #[arg(long)]
    no_handoff: bool,
    /// Take no assignment offered directly by a coordinator (`trellis.offer.<queue>`): every
    /// task comes from the tasks stream. A coordinator whose offers no worker hears sends
    /// them to the stream.
    #[arg(long)]
    no_offers: bool,
    /// Run no worker: ask the worker named by --worker-id (another process, e.g. this pod's own
    /// worker from a Kubernetes preStop hook) to drain, and return once it has exited. It takes
    /// no new task and finishes the running ones however long they take.
    #[arg(long, requires = "worker_id")]
    drain: bool,
    #[command(flatten)]
    telemetry: trellis_telemetry::Args,
}

/// `EX_USAGE` of sysexits.h: the configuration is wrong.
const EXIT_USAGE: u8 = 64;

/// Runs the `trellis-agent-worker` binary: parses the flags, installs tracing, and runs the worker
/// with the built-in handlers until SIGTERM or Ctrl-C. Another package can host the same binary
/// by calling it from its own `main`.
pub fn main_entry() -> ExitCode {
    let args: Args = match trellis_telemetry::parse_flags(std::env::args_os()) {
        Ok(args) => args,
        Err(exit) => return exit,
    };
    trellis_telemetry::block_on_service(
        "trellis-agent-worker",
        args.telemetry.log_format,
        main_async(args),
    )
}

async fn main_async(args: Args) -> ExitCode {
    let nats = match args.nats.options() {
        Ok(nats) => nats,
        Err(error) => {
            eprintln!("trellis-agent-worker: invalid configuration: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if args.drain {
        let worker_id = args.worker_id.unwrap_or_default();
        let outcome = crate::drain::drain_and_wait(&nats, &worker_id).await;
        return trellis_telemetry::exit_code("trellis-agent-worker", outcome);
    }
    let defaults = Config::default();
    let config = Config {
        nats,
        queues: args.queues.unwrap_or(defaults.queues),
        slots: args.slots.unwrap_or(defaults.slots),
        worker_id: args.worker_id,
        shards: args.shards.unwrap_or(defaults.shards),
        shutdown_grace_ms: args.shutdown_grace_ms.unwrap_or(defaults.shutdown_grace_ms),
        max_deliveries: args.max_deliveries.unwrap_or(defaults.max_deliveries),
        output_inline_limit: args
            .output_inline_limit
            .unwrap_or(defaults.output_inline_limit),
        handoff: !args.no_handoff,
        offers: !args.no_offers,
        telemetry: trellis_telemetry::Telemetry::new(),
    };
    if let Err(error) = config.validate() {
        eprintln!("trellis-agent-worker: invalid configuration: {error}");
        return ExitCode::from(EXIT_USAGE);
    }
    let shutdown = trellis_telemetry::cancel_on_signal();
    if let Err(error) = args
        .telemetry
        .spawn_admin(
            DEFAULT_ADMIN,
            &config.telemetry,
            // The admin server outlives the worker's drain: probes see it stop being ready.
            CancellationToken::new(),
        )
        .await
    {
        eprintln!("trellis-agent-worker: {error}");
        return ExitCode::from(EXIT_USAGE);
    }
    let outcome = crate::run(config, HandlerRegistry::with_builtins(), shutdown).await;
    trellis_telemetry::exit_code("trellis-agent-worker", outcome)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        super::Args::command().debug_assert();
    }
}
