//! The Trellis monitor: a live web UI and a JSON API over executions, task instances, events,
//! workers, checkpoints and questions (`API.md`).
//!
//! - Reads come from the coordinator (lists, questions, workers) and the checkpoint-store
//!   (checkpoints) over gRPC, and from live projections of each watched execution's event log on
//!   NATS ([`hub`]): the domain state machine replayed read-only, as recovery does.
//! - `GET /api/executions/{id}/live` streams batched updates as Server-Sent Events, at most one
//!   every 50 ms while events arrive.
//! - Controls (pause, resume, cancel, retry, checkpoint, answer) go to the coordinator over gRPC
//!   and require the configured bearer token; without it they are refused and change nothing.
//!   With `forward_tokens`, every call instead carries the caller's own token to the
//!   coordinator, which decides what the caller may see and do (namespaces included).
//! - The UI's assets are compiled into the binary.
//!
//! `main.rs` is a thin shell around [`main_entry`]; `trellis monitor` and `trellis dev` host the
//! same service.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use trellis_bus::NatsOptions;
use trellis_grpc::{AuthChannel, ClientSecurity};
use trellis_proto::v1::backlog_client::BacklogClient;
use trellis_proto::v1::checkpoint_store_client::CheckpointStoreClient;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_telemetry::Telemetry;
use trellis_telemetry::redact::Secret;

pub mod api;
mod assets;
mod cli;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod hub;
pub mod layout;
pub mod metrics;
pub mod views;

pub use cli::{Args, main_entry, run_with, serve};

/// Where the monitor listens unless told otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7700";
/// How often a live stream gets an update while events arrive.
pub const DEFAULT_FLUSH: Duration = Duration::from_millis(50);
/// How long the monitor waits for the coordinator to create the event stream.
const STREAMS_TIMEOUT: Duration = Duration::from_secs(60);

/// What the monitor connects to.
#[derive(Clone, Debug)]
pub struct Config {
    pub nats: NatsOptions,
    /// The coordinator's gRPC address (`http://host:port`).
    pub coordinator_url: String,
    /// The checkpoint-store's gRPC address; without it `/checkpoints` says so.
    pub checkpoint_store_url: Option<String>,
    /// The planner's gRPC address, for the backlog page; without it `/api/backlog` says so.
    pub planner_url: Option<String>,
    /// The bearer token controls require; `None` disables every control (unless tokens are
    /// forwarded).
    pub token: Option<Secret>,
    /// Forward each caller's bearer token to the coordinator, which authorizes every read and
    /// control; excludes `token`.
    pub forward_tokens: bool,
    /// The monitor's own token and TLS for its calls (the checkpoint-store takes only tokens of
    /// every namespace).
    pub client: ClientSecurity,
    /// How often live streams are updated.
    pub flush: Duration,
    /// Metrics and readiness ("monitor").
    pub telemetry: Telemetry,
}

impl Config {
    /// A monitor of the services at these addresses, read-only, default settings.
    pub fn new(nats_url: &str, coordinator_url: &str) -> Self {
        Self {
            nats: NatsOptions::new(nats_url),
            coordinator_url: coordinator_url.to_owned(),
            checkpoint_store_url: None,
            planner_url: None,
            token: None,
            forward_tokens: false,
            client: ClientSecurity::default(),
            flush: DEFAULT_FLUSH,
            telemetry: Telemetry::default(),
        }
    }
}

/// Why the monitor stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the listener's address: {0}")]
    Listener(std::io::Error),
    #[error(transparent)]
    Bus(#[from] trellis_bus::Error),
    #[error("{name} address `{url}` is not a valid URL: {message}")]
    Url {
        name: &'static str,
        url: String,
        message: String,
    },
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    #[error("invalid configuration: {0}")]
    Config(String),
}

fn channel(name: &'static str, url: &str, client: &ClientSecurity) -> Result<AuthChannel, Error> {
    client.lazy_channel(url).map_err(|err| Error::Url {
        name,
        url: url.to_owned(),
        message: err.to_string(),
    })
}

/// Serves the monitor on `listener` until `shutdown` fires.
///
/// # Errors
///
/// NATS or its event stream cannot be reached, an address is malformed, or serving fails.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let addr: SocketAddr = listener.local_addr().map_err(Error::Listener)?;
    let access = match (&config.token, config.forward_tokens) {
        (Some(_), true) => {
            return Err(Error::Config(
                "a control token and forwarded tokens exclude each other: with forwarded \
                 tokens the coordinator authorizes every call"
                    .to_owned(),
            ));
        }
        (Some(token), false) => api::Access::SharedToken(token.clone()),
        (None, true) => api::Access::ForwardTokens,
        (None, false) => api::Access::ReadOnly,
    };
    let readiness = config.telemetry.health.component("monitor");
    let coordinator = CoordinatorClient::new(channel(
        "coordinator",
        &config.coordinator_url,
        &config.client,
    )?)
    .max_decoding_message_size(64 * 1024 * 1024);
    let store = config
        .checkpoint_store_url
        .as_deref()
        .map(|url| channel("checkpoint-store", url, &config.client).map(CheckpointStoreClient::new))
        .transpose()?;
    let backlog = config
        .planner_url
        .as_deref()
        .map(|url| channel("planner", url, &config.client).map(BacklogClient::new))
        .transpose()?;
    let nats = trellis_bus::connect_with(&config.nats, "trellis-monitor").await?;
    let js = async_nats::jetstream::new(nats);
    let streams = tokio::select! {
        () = shutdown.cancelled() => return Ok(()),
        streams = trellis_bus::wait_for_streams(&js, STREAMS_TIMEOUT) => streams?,
    };
    let metrics = metrics::Metrics::new(&config.telemetry.registry);
    let app = api::App {
        hubs: hub::Hubs::new(
            streams.events,
            config.flush,
            shutdown.clone(),
            metrics.executions_watched.clone(),
        ),
        coordinator,
        store,
        backlog,
        access,
        shutdown: shutdown.clone(),
        metrics,
        names: api::Names::default(),
    };
    tracing::info!(%addr, access = ?app.access_mode(), "monitor serving");
    let router = api::router(app);
    readiness.set(true);
    // Live updates are small writes that must not wait for Nagle's algorithm.
    let listener = axum::serve::ListenerExt::tap_io(listener, |stream| {
        let _ = stream.set_nodelay(true);
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(Error::Serve)
}
