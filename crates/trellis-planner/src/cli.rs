//! The `trellis-planner` binary's command line.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use trellis_core::plan::Limits;

/// The `trellis-planner` binary: the planner's flags and the client credentials it calls the
/// coordinator with (the `trellis` command line has those for every subcommand).
#[derive(Debug, Parser)]
#[command(name = "trellis-planner", version, about)]
struct Binary {
    #[command(flatten)]
    args: Args,
    #[command(flatten)]
    client: trellis_grpc::ClientArgs,
}

/// The Trellis planner: compiles and analyses plans, serves the `Planner` gRPC API.
///
/// It keeps no state, so replicas can run side by side behind one address.
#[derive(Debug, clap::Args)]
#[command(
    version,
    about,
    after_help = "Examples (the `trellis-planner` binary takes the same flags):\n  \
        trellis planner                          # on 127.0.0.1:7600\n  \
        trellis planner --listen 0.0.0.0:7600 --max-tasks 200000\n  \
        TRELLIS_PLANNER=http://127.0.0.1:7600 trellis submit --wait examples/demo.yaml\n\n\
        Try it: trellis plan analyze --planner http://127.0.0.1:7600 examples/feature-x.yaml"
)]
pub struct Args {
    /// gRPC listen address.
    #[arg(long, env = "TRELLIS_PLANNER_ADDR", default_value = crate::DEFAULT_ADDR)]
    pub listen: SocketAddr,
    /// Most tasks a plan may have (default: the access file's `limits.max_tasks`, else 200000).
    #[arg(long, env = "TRELLIS_PLAN_MAX_TASKS")]
    pub max_tasks: Option<usize>,
    /// Largest plan text accepted, in bytes (default: the access file's `limits.max_plan_bytes`,
    /// else 64 MiB).
    #[arg(long, env = "TRELLIS_PLAN_MAX_BYTES")]
    pub max_input_bytes: Option<usize>,
    /// The backlog's database, the checkpoint-store's (postgres://USER@HOST/DB or
    /// sqlite://PATH); with one, the planner also serves the Backlog API (`trellis tasks`,
    /// `trellis lists`). Without, it only compiles and analyses plans.
    #[arg(long, env = "TRELLIS_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// The coordinator list runs start on (`trellis lists run`) and answers given through
    /// notification sinks go to, called with the --token and TLS flags; without, the backlog
    /// starts no runs and takes no answers.
    #[arg(long, env = "TRELLIS_COORDINATOR", value_name = "URL")]
    pub coordinator: Option<String>,
    /// Where the notification sinks' answers come back (HTTP): Telegram's webhook at
    /// /hooks/telegram/PROJECT/SINK, a webhook's signed answers at /hooks/webhook/PROJECT/SINK.
    /// Needs --database-url; put it behind your HTTPS proxy. Without, sinks only notify.
    #[arg(long, env = "TRELLIS_PLANNER_HOOKS", value_name = "ADDR")]
    pub hooks_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub server: trellis_grpc::ServerArgs,
    #[command(flatten)]
    pub telemetry: trellis_telemetry::Args,
}

/// The default admin address: `/metrics`, `/healthz`, `/readyz`, gRPC health.
const DEFAULT_ADMIN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    9600,
));

impl Args {
    /// The plan limits these flags set, over those of `security`'s access file.
    pub fn limits(&self, security: &trellis_grpc::ServerSecurity) -> Limits {
        let base = security
            .access
            .as_ref()
            .map(|access| access.limits().plan())
            .unwrap_or_default();
        Limits {
            max_tasks: self.max_tasks.unwrap_or(base.max_tasks),
            max_input_bytes: self.max_input_bytes.unwrap_or(base.max_input_bytes),
            ..base
        }
    }
}

/// Runs the `trellis-planner` binary: parses the flags, installs tracing, and serves until SIGTERM
/// or Ctrl-C.
pub fn main_entry() -> ExitCode {
    match trellis_telemetry::parse_flags::<Binary>(std::env::args_os()) {
        Ok(binary) => run_with(binary.args, &binary.client),
        Err(exit) => exit,
    }
}

/// Serves with flags already parsed (`trellis planner` hosts the service this way): installs
/// tracing and serves until SIGTERM or Ctrl-C.
pub fn run_with(args: Args, client: &trellis_grpc::ClientArgs) -> ExitCode {
    let log_format = args.telemetry.log_format;
    trellis_telemetry::block_on_service("trellis-planner", log_format, serve(args, client))
}

/// Serves with `args` until SIGTERM or Ctrl-C; for the binary and `trellis planner`.
pub async fn serve(args: Args, client: &trellis_grpc::ClientArgs) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            eprintln!(
                "trellis-planner: cannot listen on {}: {err} (is another planner running? pick \
                 another address with --listen)",
                args.listen
            );
            return ExitCode::from(2);
        }
    };
    let security = match args.server.load() {
        Ok(security) => security,
        Err(err) => {
            eprintln!("trellis-planner: {err}");
            return ExitCode::from(2);
        }
    };
    let hooks = match args.hooks_listen {
        None => None,
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => Some(listener),
            Err(err) => {
                eprintln!(
                    "trellis-planner: cannot listen for hooks on {addr}: {err} (pick another \
                     address with --hooks-listen)"
                );
                return ExitCode::from(2);
            }
        },
    };
    if hooks.is_some() && args.database_url.is_none() {
        eprintln!(
            "trellis-planner: --hooks-listen needs --database-url: the sinks and questions are \
             the database's"
        );
        return ExitCode::from(2);
    }
    let shutdown = trellis_telemetry::cancel_on_signal();
    let telemetry = trellis_telemetry::Telemetry::new();
    if let Err(err) = args
        .telemetry
        .spawn_admin(DEFAULT_ADMIN, &telemetry, shutdown.clone())
        .await
    {
        eprintln!("trellis-planner: {err}");
        return ExitCode::from(2);
    }
    let coordinator = match (&args.coordinator, client.load()) {
        (None, _) => None,
        (Some(url), Ok(security)) => Some(crate::backlog::runs::Coordinator {
            url: url.clone(),
            security,
        }),
        (Some(_), Err(err)) => {
            eprintln!("trellis-planner: {err}");
            return ExitCode::from(2);
        }
    };
    let config = crate::Config {
        limits: args.limits(&security),
        security,
        telemetry,
        database_url: args.database_url.clone(),
        coordinator,
        notify: crate::notify::Settings::default(),
    };
    let outcome = crate::run_with_hooks(listener, hooks, config, shutdown).await;
    trellis_telemetry::exit_code("trellis-planner", outcome)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        super::Binary::command().debug_assert();
    }
}
