//! `trellis dev`: every service in this process, for local use.

use std::net::SocketAddr;

use clap::Args;

use super::Failure;
use crate::local;

/// Run Trellis locally: NATS, the coordinator, workers and the monitor in one process.
#[derive(Debug, Args)]
#[command(
    long_about = "Run Trellis locally: NATS, the coordinator, workers and the monitor in one \
        process.\n\n\
        Uses the NATS server at NATS_URL when it is reachable; otherwise starts `nats-server -js` \
        on a free loopback port with its store in a temporary directory. The coordinator serves \
        gRPC on --listen; other `trellis` commands reach it there by default. The monitor (web \
        UI) serves on --monitor; its controls need the token printed at start (or the one given \
        with --monitor-token). Ctrl-C or SIGTERM stops everything and removes its temporary NATS store.\n\n\
        This process and the nats-server it starts share the cores: half of them (at least one; \
        every core with --sync always) for the server's GOMAXPROCS, the rest for this process's async runtime \
        (one core: a single thread runs every task); set TOKIO_WORKER_THREADS or GOMAXPROCS to choose \
        otherwise.",
    after_help = "Examples:\n  \
        trellis dev\n  \
        trellis dev --workers 4 --slots 64\n  \
        trellis dev --monitor 127.0.0.1:8080 --monitor-token s3cret\n  \
        trellis dev --breaker-failures 5 --breaker-cooldown 1m\n  \
        trellis dev --sync always\n  \
        NATS_URL=nats://127.0.0.1:4222 trellis dev --listen 127.0.0.1:7401"
)]
pub struct DevArgs {
    /// Where the coordinator serves gRPC.
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// In-process workers (0: none; run `trellis-agent-worker --nats-url URL` yourself).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Concurrent handlers per worker.
    #[arg(long, default_value_t = 32)]
    pub slots: usize,
    /// Where the monitor serves its web UI.
    #[arg(long, value_name = "ADDR", default_value = trellis_monitor::DEFAULT_ADDR)]
    pub monitor: SocketAddr,
    /// The token the monitor's controls require; a random one when not given.
    #[arg(long, env = "TRELLIS_MONITOR_TOKEN", hide_env_values = true)]
    pub monitor_token: Option<String>,
    /// Where every service's metrics (`/metrics`) and health (`/healthz`, `/readyz`) are served;
    /// `off` disables it.
    #[arg(
        long,
        env = "TRELLIS_ADMIN_ADDR",
        value_name = "ADDR|off",
        default_value = "127.0.0.1:9464"
    )]
    pub admin_addr: String,
    /// Circuit breakers: after this many consecutive failed attempts of one queue and task type,
    /// new dispatches of that type wait (they do not fail) for `--breaker-cooldown`, then one
    /// probe goes. 0 turns them off.
    #[arg(long, env = "TRELLIS_BREAKER_FAILURES", default_value_t = 0)]
    pub breaker_failures: u32,
    /// How long an open circuit breaker holds dispatches before its probe (e.g. `30s`, `2m`).
    #[arg(long, env = "TRELLIS_BREAKER_COOLDOWN", default_value = "30s", value_parser = humantime::parse_duration)]
    pub breaker_cooldown: std::time::Duration,
    /// How the nats-server started here writes JetStream to disk: `interval` (its default: a
    /// flush every two minutes; a process crash loses nothing, a power cut up to two minutes) or
    /// `always` (every write flushed before it is acknowledged; needs nats-server 2.10 or newer).
    /// Not for a server given by NATS_URL, whose own configuration decides.
    #[arg(long, value_enum, env = "TRELLIS_SYNC", default_value_t = local::SyncMode::Interval)]
    pub sync: local::SyncMode,
    /// Most tasks of one execution dispatched and not yet started by a worker; its other ready
    /// tasks wait until one starts or ends, so one large execution cannot queue all its tasks
    /// ahead of everyone else's. 0: no limit. Default: 128, or 256 with `--sync always` (each
    /// flush then carries more tasks).
    #[arg(long, env = "TRELLIS_DISPATCH_WINDOW")]
    pub dispatch_window: Option<u32>,
    /// Workers publish every final result to the results stream instead of first handing it to
    /// the coordinator holding its shard (a core NATS request; the stream takes a stored write
    /// and a delivery). Either way a result counts once its events are stored.
    #[arg(long)]
    pub no_handoff: bool,
    /// Every task goes through the tasks stream: the coordinator offers none to an idle worker
    /// first (a core NATS request; the stream takes a stored write and a delivery).
    #[arg(long)]
    pub no_offers: bool,
}

/// Runs `trellis dev` until Ctrl-C or SIGTERM.
pub async fn run(args: DevArgs) -> Result<(), Failure> {
    let token = args
        .monitor_token
        .clone()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let mut local = local::start(local::Options {
        nats_url: local::nats_from_env()?,
        listen: args.listen,
        workers: args.workers,
        slots: args.slots,
        coordinator: true,
        monitor: Some(local::MonitorOptions {
            listen: args.monitor,
            token: token.clone(),
        }),
        breakers: local::Breakers {
            failures: args.breaker_failures,
            cooldown: args.breaker_cooldown,
        },
        sync: args.sync,
        dispatch_window: args.dispatch_window,
        handoff: !args.no_handoff,
        offers: !args.no_offers,
    })
    .await?;
    let admin = if args.admin_addr.eq_ignore_ascii_case("off") {
        "off".to_owned()
    } else {
        let addr: SocketAddr = args.admin_addr.parse().map_err(|_| {
            Failure::bad_input(format!(
                "--admin-addr: {:?} is not an address such as 127.0.0.1:9400, nor `off`",
                args.admin_addr
            ))
        })?;
        let bound = trellis_telemetry::admin::spawn(
            addr,
            local.telemetry.clone(),
            local.shutdown.child_token(),
        )
        .await
        .map_err(|e| Failure::failed(e.to_string()))?;
        format!("http://{bound}/metrics")
    };
    let monitor = local.monitor_url.clone().unwrap_or_default();
    let nats = match &local.nats_version {
        Some(version) => format!(
            "{} (nats-server {version}, sync {})",
            local.nats_url,
            local.sync.name()
        ),
        None => format!(
            "{} (yours: its configuration decides durability)",
            local.nats_url
        ),
    };
    // SIGTERM is what process managers, CI runners and Kubernetes send: it cleans up as Ctrl-C.
    // Its handler is installed before the line that says the cluster is ready, so a stop sent
    // the moment it is read is caught, not SIGTERM's default action.
    let stop = trellis_telemetry::shutdown_signal();
    eprintln!(
        "trellis dev: coordinator at {}, planner at {}, NATS at {nats}, {} workers\n  \
         monitor: {monitor}/?token={token}\n  \
         hooks: {} (answers from notification sinks: trellis sinks --help)\n  \
         metrics: {admin}\n  \
         try: trellis submit --wait examples/demo.yaml\n  \
         or:  TRELLIS_PLANNER={} trellis submit --wait examples/demo.yaml\n  \
         backlog: TRELLIS_PLANNER={} trellis tasks add \"Fix the login redirect\" -c bug\n  \
         Ctrl-C (or SIGTERM) stops",
        local.coordinator_url,
        local.planner_url,
        args.workers,
        local.hooks_url,
        local.planner_url,
        local.planner_url
    );
    // A service that stops on its own ends the whole cluster, so nobody talks to half of one.
    let broken = tokio::select! {
        () = stop => None,
        reason = local.stopped.recv() => reason,
    };
    eprintln!("trellis dev: stopping");
    local.stop().await;
    match broken {
        Some(reason) => Err(Failure::failed(format!(
            "{reason}; the cluster was stopped with it"
        ))),
        None => Ok(()),
    }
}
