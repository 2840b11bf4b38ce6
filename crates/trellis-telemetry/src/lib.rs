//! What every Trellis service process shares to be observed in production:
//!
//! - [`init`] installs logging (text or JSON, filtered by `RUST_LOG`) and, when the standard
//!   `OTEL_*` variables ask for it, exports `tracing` spans over OTLP/gRPC.
//! - [`propagation`] carries W3C trace context in NATS headers, gRPC metadata and the event log,
//!   so one execution is one trace across planner, coordinator, workers and store.
//! - [`metrics`] is a Prometheus registry owned by the process (not a global one): services add
//!   their metric families to the [`Registry`] they are given.
//! - [`redact`] keeps secrets out of logs: [`redact::Secret`] prints `[redacted]`, and
//!   [`redact::url`] strips credentials from URLs.
//! - [`admin`] serves `/metrics`, `/healthz`, `/readyz` and `grpc.health.v1` (for Kubernetes gRPC
//!   probes) on one plain port, whatever the security of the service's own port.
//!
//! A service's `run` takes a [`Telemetry`]: the registry and the health its components report to.
//! A binary makes one and serves it with [`admin::serve`]; `trellis dev` shares one between every
//! service it hosts. Every service binary parses its flags with [`parse_flags`], runs its body
//! with [`block_on_service`], starts its admin server with [`Args::spawn_admin`], stops on the
//! token [`cancel_on_signal`] returns, and turns its service's outcome into its exit code with
//! [`exit_code`].

pub mod admin;
pub mod hops;
pub mod metrics;
pub mod propagation;
pub mod redact;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitCode;

use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

pub use admin::{Health, Readiness};
pub use metrics::Registry;

/// The metrics and health of one process, handed to each service it runs.
#[derive(Clone, Debug, Default)]
pub struct Telemetry {
    pub registry: Registry,
    pub health: Health,
}

impl Telemetry {
    /// Returns a fresh registry and health, nothing registered yet.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Two telemetry handles are equal when they are the same process's: they share everything.
impl PartialEq for Telemetry {
    fn eq(&self, other: &Self) -> bool {
        self.registry.same(&other.registry) && self.health.same(&other.health)
    }
}

impl Eq for Telemetry {}

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The command-line flags every service binary takes for its telemetry.
#[derive(Clone, Debug, clap::Args)]
#[group(id = "telemetry")]
#[command(next_help_heading = "Observability (traces: the standard OTEL_* variables)")]
pub struct Args {
    /// The admin server: `/metrics` (Prometheus), `/healthz`, `/readyz` and `grpc.health.v1`
    /// (service "" is liveness, "ready" readiness) on one plain port; `off` disables it.
    #[arg(long, env = "TRELLIS_ADMIN_ADDR", value_name = "ADDR|off", value_parser = parse_admin_addr)]
    pub admin_addr: Option<AdminAddr>,
    /// Log format on stderr; the level comes from `RUST_LOG` (default `info`).
    #[arg(
        long,
        env = "TRELLIS_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

/// Where the admin server listens, or that it is off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminAddr {
    Listen(SocketAddr),
    Off,
}

impl Args {
    /// The admin address to use: the flag's, or `default` when none was given.
    pub fn admin_addr_or(&self, default: SocketAddr) -> Option<SocketAddr> {
        match self.admin_addr {
            Some(AdminAddr::Listen(addr)) => Some(addr),
            Some(AdminAddr::Off) => None,
            None => Some(default),
        }
    }
}

fn parse_admin_addr(text: &str) -> Result<AdminAddr, String> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(AdminAddr::Off);
    }
    text.parse().map(AdminAddr::Listen).map_err(|_| {
        format!("{text:?} is not an address such as 127.0.0.1:9400 or 0.0.0.0:9090, nor `off`")
    })
}

/// Keeps the trace exporter alive; dropping it flushes the spans not yet exported.
#[derive(Debug)]
#[must_use = "dropping the guard stops trace export"]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
}

impl Guard {
    /// Returns whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown()
        {
            eprintln!("trellis: flushing traces failed: {err}");
        }
    }
}

/// Installs logging for `service` (the default `service.name` of its spans) and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`), span export over OTLP/gRPC.
/// `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and its argument are
/// honoured. Must run inside a tokio runtime (the exporter's client needs one).
///
/// A host that installed a subscriber already (a test, `trellis dev`) keeps it: this then does
/// nothing but return a guard that exports nothing.
pub fn init(service: &'static str, format: LogFormat) -> Guard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = match otlp_provider(service) {
        Ok(provider) => provider,
        Err(err) => {
            eprintln!("{service}: traces will not be exported: {err}");
            None
        }
    };
    let otel = provider
        .as_ref()
        .map(|provider| propagation::install(provider, service));
    let fmt = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .is_ok();
    Guard {
        provider: provider.filter(|_| installed),
    }
}

/// Builds the OTLP exporter the environment asks for, if any.
fn otlp_provider(service: &'static str) -> Result<Option<SdkTracerProvider>, String> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return Ok(None);
    }
    if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
    {
        return Ok(None);
    }
    if let Some(protocol) = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .filter(|p| p != "grpc")
    {
        return Err(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported: Trellis exports OTLP over \
             gRPC (set it to `grpc` or leave it unset, and point the endpoint at port 4317)"
        ));
    }
    // The endpoint, timeout and headers come from the OTEL_EXPORTER_OTLP_* variables.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|err| format!("cannot build the OTLP exporter: {err}"))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if var("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    Ok(Some(
        SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_batch_exporter(exporter)
            .build(),
    ))
}

/// Runs a service binary's `body` on a new multi-threaded runtime, with logging (and trace
/// export) installed for `service` first: what every service's `main` does. A runtime that cannot
/// start is reported on stderr as `service: ...`, with exit code 1.
pub fn block_on_service<F>(service: &'static str, log_format: LogFormat, body: F) -> ExitCode
where
    F: Future<Output = ExitCode>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("{service}: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // A host process (a test, the `trellis` CLI) may have installed a subscriber already;
        // `init` then leaves it in place.
        let _guard = init(service, log_format);
        body.await
    })
}

/// Parses a service binary's flags from `args` (the first is the program name). On `--help` or
/// `--version` (printed to stdout) the `Err` is exit code 0; on bad flags (explained on stderr),
/// exit code 2: the code the binary stops with.
pub fn parse_flags<P: clap::Parser>(
    args: impl IntoIterator<Item = OsString>,
) -> Result<P, ExitCode> {
    P::try_parse_from(args).map_err(|err| {
        // clap treats `--help` and `--version` as errors too, printed to stdout.
        let _ = err.print();
        if err.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        }
    })
}

impl Args {
    /// Serves the admin endpoints of `telemetry` in the background until `stop` is cancelled, on
    /// the address of `--admin-addr`, or `default` without one; with `--admin-addr off`, does
    /// nothing.
    ///
    /// # Errors
    ///
    /// When the address cannot be bound.
    pub async fn spawn_admin(
        &self,
        default: SocketAddr,
        telemetry: &Telemetry,
        stop: CancellationToken,
    ) -> Result<(), admin::Error> {
        match self.admin_addr_or(default) {
            Some(addr) => admin::spawn(addr, telemetry.clone(), stop).await.map(drop),
            None => Ok(()),
        }
    }
}

/// Returns the exit code of a service binary whose service stopped with `outcome`: success, or 1
/// after `service: <error>` on stderr.
pub fn exit_code(service: &str, outcome: Result<(), impl std::fmt::Display>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{service}: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Returns a token that is cancelled on SIGTERM or Ctrl-C ([`shutdown_signal`]): a service
/// binary's signal to stop gracefully. Call it inside the runtime.
pub fn cancel_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let signal = token.clone();
    let stop = shutdown_signal();
    tokio::spawn(async move {
        stop.await;
        tracing::info!("shutdown requested");
        signal.cancel();
    });
    token
}

/// Completes on SIGTERM (what Kubernetes sends) or Ctrl-C: every service's signal to stop
/// gracefully. The handlers are installed by this call, not by the future's first poll: a
/// signal sent at any moment after it stops the service gracefully, where SIGTERM's default
/// action would end the process at once (a process manager may send it the moment a service
/// says it is ready). Call it inside the runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        // A signal whose handler could not be installed keeps its default action; its side of
        // the wait never completes.
        async fn received(signal: Option<Signal>) {
            match signal {
                Some(mut signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let term = signal(SignalKind::terminate()).ok();
        let interrupt = signal(SignalKind::interrupt()).ok();
        async move {
            tokio::select! {
                () = received(term) => {}
                () = received(interrupt) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Flags {
        #[arg(long)]
        port: u16,
    }

    fn parse(args: &[&str]) -> Result<Flags, ExitCode> {
        parse_flags(args.iter().map(OsString::from))
    }

    #[test]
    fn flags_parse_or_give_the_exit_code() {
        assert_eq!(
            parse(&["svc", "--port", "7"]).map(|flags| flags.port),
            Ok(7)
        );
        assert_eq!(
            parse(&["svc", "--port", "x"]).map(|flags| flags.port),
            Err(ExitCode::from(2))
        );
        assert_eq!(
            parse(&["svc", "--help"]).map(|flags| flags.port),
            Err(ExitCode::SUCCESS)
        );
    }

    #[test]
    fn outcomes_give_exit_codes() {
        assert_eq!(exit_code("svc", Ok::<(), String>(())), ExitCode::SUCCESS);
        assert_eq!(exit_code("svc", Err("broken")), ExitCode::FAILURE);
    }

    #[tokio::test]
    async fn admin_server_off_spawns_nothing() {
        let args = Args {
            admin_addr: Some(AdminAddr::Off),
            log_format: LogFormat::Text,
        };
        // The default address is taken: with `off`, it is not even tried.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let default = taken.local_addr().expect("local address");
        let stop = CancellationToken::new();
        assert!(
            args.spawn_admin(default, &Telemetry::new(), stop.clone())
                .await
                .is_ok()
        );
        let args = Args {
            admin_addr: None,
            ..args
        };
        let err = args
            .spawn_admin(default, &Telemetry::new(), stop)
            .await
            .expect_err("the default address is taken");
        assert!(err.to_string().contains(&default.to_string()), "{err}");
    }

    #[test]
    fn admin_addresses_parse_or_say_why() {
        assert_eq!(parse_admin_addr("off"), Ok(AdminAddr::Off));
        assert_eq!(
            parse_admin_addr("0.0.0.0:9090"),
            Ok(AdminAddr::Listen(SocketAddr::from(([0, 0, 0, 0], 9090))))
        );
        let err = parse_admin_addr("9090").expect_err("a port alone is not an address");
        assert!(err.contains("\"9090\" is not an address"), "{err}");
    }
}
