//! The `trellis-planner` binary's command line.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use trellis_core::plan::Limits;

/// The Trellis planner: compiles and analyses plans, serves the `Planner` gRPC API.
///
/// It keeps no state, so replicas can run side by side behind one address.
#[derive(Debug, Parser)]
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
    /// Most tasks a plan may have.
    #[arg(long, env = "TRELLIS_PLAN_MAX_TASKS", default_value_t = Limits::default().max_tasks)]
    pub max_tasks: usize,
    /// Largest plan text accepted, in bytes.
    #[arg(long, env = "TRELLIS_PLAN_MAX_BYTES", default_value_t = Limits::default().max_input_bytes)]
    pub max_input_bytes: usize,
}

impl Args {
    /// The plan limits these flags set.
    pub fn limits(&self) -> Limits {
        Limits {
            max_tasks: self.max_tasks,
            max_input_bytes: self.max_input_bytes,
            ..Limits::default()
        }
    }
}

/// Runs the `trellis-planner` binary: parses the flags, installs tracing, and serves until SIGTERM
/// or Ctrl-C.
pub fn main_entry() -> ExitCode {
    run_with(Args::parse())
}

/// Serves with flags already parsed (`trellis planner` hosts the service this way): installs
/// tracing and serves until SIGTERM or Ctrl-C.
pub fn run_with(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("trellis-planner: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // `try_init`: a host process (the `trellis` CLI) may have installed one already.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .try_init();
    runtime.block_on(serve(args))
}

/// Serves with `args` until SIGTERM or Ctrl-C; for the binary and `trellis planner`.
pub async fn serve(args: Args) -> ExitCode {
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
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        signal.cancel();
    });
    match crate::run(listener, args.limits(), shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("trellis-planner: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on SIGTERM (what Kubernetes sends) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
