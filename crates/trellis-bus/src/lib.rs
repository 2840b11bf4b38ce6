//! NATS JetStream plumbing shared by the Trellis services: one place that knows how to connect,
//! which streams and key-value buckets exist with which retention, and how the durable consumers
//! are configured, so the coordinator and the workers can start in any order and agree.

mod fences;
mod leases;
mod options;
mod outputs;
mod steps;

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use trellis_proto::subjects;

pub use fences::{FENCES_MAX_AGE, decode_fence, encode_fence, ensure_fences_bucket};
pub use leases::{host_identity, kv_bucket, take_lease};
pub use options::{NatsArgs, NatsAuth, NatsOptions, NatsTls};
pub use outputs::{
    DEFAULT_INLINE_LIMIT, OUTPUTS_BUCKET, OUTPUTS_MAX_AGE, OutputError, OutputRef, Outputs,
    REF_KEY, is_reserved, object_name, sha256_hex,
};
pub use steps::{STEPS_MAX_AGE, ensure_steps_bucket, steps_bucket};

/// How long a task message may stay unacknowledged before JetStream hands it to another worker.
/// Workers send `AckProgress` every [`HEARTBEAT_INTERVAL`], so a live worker never hits it; a
/// dead one loses its task after three silent intervals (docs/design.md §4, "Agents").
pub const TASK_ACK_WAIT: Duration = Duration::from_secs(6);

/// How often workers heartbeat and extend their in-flight task messages.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);

/// Largest message Trellis sends: a spawned group of 100,000 subtasks is one result message and
/// one log entry of about 1.5 MiB. NATS servers must allow it (`max_payload: 8MB` in their
/// configuration; the default is 1 MiB); `trellis dev` and the tests start theirs that way.
pub const MAX_PAYLOAD: usize = 8 * 1024 * 1024;

/// Errors of the NATS plumbing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot connect to NATS at {url}: {source} (start one with `nats-server -js`, or install it with `apt-get install nats-server`)"
    )]
    Connect {
        /// The URL with its credentials hidden.
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error(
        "NATS at {url} refused the credentials: {source} (check --nats-user/--nats-password, --nats-token, --nats-creds or --nats-nkey-file)"
    )]
    Unauthorized {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error(
        "TLS with NATS at {url} failed: {source} (check --nats-tls-ca, --nats-tls-cert and --nats-tls-key, and that the server speaks TLS)"
    )]
    Tls {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error("{0}")]
    Options(String),
    #[error(
        "cannot create or open JetStream stream {stream}: {message} (is JetStream enabled, `nats-server -js`?)"
    )]
    Stream { stream: String, message: String },
    #[error("cannot create consumer {consumer}: {message}")]
    Consumer { consumer: String, message: String },
    #[error(
        "cannot create or open JetStream key-value bucket {bucket}: {message} (is JetStream enabled, `nats-server -js`?)"
    )]
    Bucket { bucket: String, message: String },
}

/// Connects to the NATS server at `url` without credentials; see [`connect_with`].
pub async fn connect(url: &str, name: &str) -> Result<async_nats::Client, Error> {
    connect_with(&NatsOptions::new(url), name).await
}

/// Connects to NATS with the name shown in `nats-server` monitoring.
///
/// A server that is not up yet is waited for (a service may start before NATS does), retrying
/// with a growing pause; refused credentials, a TLS failure or an unparsable URL fail at once,
/// since waiting cannot fix them. Once connected, the client reconnects by itself.
pub async fn connect_with(options: &NatsOptions, name: &str) -> Result<async_nats::Client, Error> {
    use async_nats::ConnectErrorKind as Kind;
    let url = options.shown_url();
    let mut delay = Duration::from_millis(100);
    let mut logged = false;
    loop {
        let connect_options = options.connect_options(name).await?;
        let source = match connect_options
            .connect(options::without_credentials(&options.url).as_str())
            .await
        {
            Ok(client) => return Ok(client),
            Err(source) => source,
        };
        match source.kind() {
            Kind::Authentication | Kind::AuthorizationViolation => {
                return Err(Error::Unauthorized { url, source });
            }
            Kind::Tls => return Err(Error::Tls { url, source }),
            // A failed TLS handshake (an unknown issuer, a certificate the server refused)
            // comes as an I/O error holding invalid data: no retry will fix it.
            Kind::Io if is_invalid_data(&source) => return Err(Error::Tls { url, source }),
            Kind::ServerParse => return Err(Error::Connect { url, source }),
            Kind::Dns | Kind::TimedOut | Kind::Io | Kind::MaxReconnects => {}
        }
        if !logged {
            tracing::warn!(nats = %url, error = %source, "NATS not reachable yet; retrying");
            logged = true;
        } else {
            tracing::debug!(nats = %url, error = %source, "NATS still not reachable");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Returns whether an I/O error in `error`'s causes says the peer sent data that is not valid
/// (what rustls reports for a refused certificate).
fn is_invalid_data(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = error.source();
    while let Some(inner) = cause {
        if let Some(io) = inner.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::InvalidData
        {
            return true;
        }
        cause = inner.source();
    }
    false
}

/// The three streams of docs/design.md §3.
#[derive(Debug, Clone)]
pub struct Streams {
    pub tasks: stream::Stream,
    pub results: stream::Stream,
    pub events: stream::Stream,
}

/// How long `TRELLIS_LOGS` keeps a task's log lines.
pub const LOGS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// Most bytes `TRELLIS_LOGS` holds; past it the oldest lines go first.
pub const LOGS_MAX_BYTES: i64 = 2 * 1024 * 1024 * 1024;

/// Creates the stream of task log lines if it does not exist (idempotent): limits retention,
/// [`LOGS_MAX_AGE`] and [`LOGS_MAX_BYTES`], oldest dropped first. The coordinator calls it at
/// start, beside [`ensure_streams`]; workers publish into it and readers open it.
pub async fn ensure_logs_stream(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<stream::Stream, Error> {
    let mut config = config(
        subjects::LOGS_STREAM,
        subjects::LOGS_WILDCARD,
        stream::RetentionPolicy::Limits,
        replicas,
    );
    config.max_age = LOGS_MAX_AGE;
    config.max_bytes = LOGS_MAX_BYTES;
    config.discard = stream::DiscardPolicy::Old;
    ensure(js, config).await
}

/// Waits until the coordinator has created the streams (at most `timeout`) and returns them.
/// Workers call this rather than [`ensure_streams`], so that one service alone creates them.
pub async fn wait_for_streams(
    js: &jetstream::Context,
    timeout: Duration,
) -> Result<Streams, Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut logged = false;
    loop {
        let found = (
            js.get_stream(subjects::TASKS_STREAM).await,
            js.get_stream(subjects::RESULTS_STREAM).await,
            js.get_stream(subjects::EVENTS_STREAM).await,
        );
        match found {
            (Ok(tasks), Ok(results), Ok(events)) => {
                return Ok(Streams {
                    tasks,
                    results,
                    events,
                });
            }
            (tasks, results, _) => {
                let missing = if tasks.is_err() {
                    subjects::TASKS_STREAM
                } else if results.is_err() {
                    subjects::RESULTS_STREAM
                } else {
                    subjects::EVENTS_STREAM
                };
                if tokio::time::Instant::now() >= deadline {
                    return Err(Error::Stream {
                        stream: missing.to_owned(),
                        message: format!(
                            "not created within {timeout:?}: is a coordinator running against this NATS server?"
                        ),
                    });
                }
                if !logged {
                    tracing::info!(
                        stream = missing,
                        "waiting for the coordinator to create the streams"
                    );
                    logged = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Creates the streams if they do not exist (idempotent). The coordinator calls it at start.
/// `replicas` is how many servers of a JetStream cluster keep each stream (1 on a single server).
pub async fn ensure_streams(js: &jetstream::Context, replicas: usize) -> Result<Streams, Error> {
    use stream::RetentionPolicy::{Limits, WorkQueue};
    let tasks = ensure(
        js,
        config(
            subjects::TASKS_STREAM,
            subjects::TASKS_WILDCARD,
            WorkQueue,
            replicas,
        ),
    )
    .await?;
    let results = ensure(
        js,
        config(
            subjects::RESULTS_STREAM,
            subjects::RESULTS_WILDCARD,
            WorkQueue,
            replicas,
        ),
    )
    .await?;
    let events = ensure(
        js,
        config(
            subjects::EVENTS_STREAM,
            subjects::EVENTS_WILDCARD,
            Limits,
            replicas,
        ),
    )
    .await?;
    Ok(Streams {
        tasks,
        results,
        events,
    })
}

/// The configuration shared by the three streams: file storage, a two-minute de-duplication
/// window for `Nats-Msg-Id`, messages up to [`MAX_PAYLOAD`], `replicas` copies.
fn config(
    name: &'static str,
    wildcard: &str,
    retention: stream::RetentionPolicy,
    replicas: usize,
) -> stream::Config {
    stream::Config {
        name: name.to_owned(),
        subjects: vec![wildcard.to_owned()],
        retention,
        storage: stream::StorageType::File,
        max_message_size: MAX_PAYLOAD as i32,
        duplicate_window: Duration::from_secs(120),
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// Opens the stream, creating it if missing. A create that loses a race with another creator
/// fails (on some servers with "subjects overlap"); looking again finds the winner's stream.
pub(crate) async fn ensure(
    js: &jetstream::Context,
    config: stream::Config,
) -> Result<stream::Stream, Error> {
    let mut attempts = 0u64;
    loop {
        let error = match js.get_or_create_stream(config.clone()).await {
            Ok(stream) => return Ok(stream),
            Err(e) => e.to_string(),
        };
        if let Ok(stream) = js.get_stream(&config.name).await {
            return Ok(stream);
        }
        attempts += 1;
        if attempts >= 10 {
            return Err(Error::Stream {
                stream: config.name.clone(),
                message: error,
            });
        }
        tracing::debug!(stream = %config.name, %error, attempts, "stream not ready yet");
        tokio::time::sleep(Duration::from_millis((50 * attempts).min(500))).await;
    }
}

/// Which of a queue's two subjects a worker's consumer takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// `trellis.tasks.<queue>`: most tasks (consumer `workers-<queue>`, the one autoscaling
    /// watches).
    Normal,
    /// `trellis.tasks.~.<queue>`: the first few tasks in flight of each execution (consumer
    /// `fast-<queue>`).
    Fast,
}

impl Lane {
    /// The lane's name in logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::Fast => "fast",
        }
    }
}

/// The name of the durable consumer of `queue`'s `lane`: `workers-<queue>` or `fast-<queue>`.
pub fn task_consumer_name(queue: &str, lane: Lane) -> String {
    match lane {
        Lane::Normal => format!("workers-{}", consumer_safe(queue)),
        Lane::Fast => format!("fast-{}", consumer_safe(queue)),
    }
}

/// Returns the durable pull consumer shared by every worker of `queue` in `lane`.
pub async fn task_consumer(
    tasks: &stream::Stream,
    queue: &str,
    lane: Lane,
    max_ack_pending: i64,
) -> Result<consumer::PullConsumer, Error> {
    let name = task_consumer_name(queue, lane);
    let filter_subject = match lane {
        Lane::Normal => subjects::tasks(queue),
        Lane::Fast => subjects::fast_tasks(queue),
    };
    tasks
        .get_or_create_consumer(
            &name,
            consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject,
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: TASK_ACK_WAIT,
                max_ack_pending,
                max_deliver: -1,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| Error::Consumer {
            consumer: name,
            message: e.to_string(),
        })
}

/// Returns the durable consumer of one coordinator shard's results.
pub async fn results_consumer(
    results: &stream::Stream,
    shard: u32,
) -> Result<consumer::PullConsumer, Error> {
    let name = format!("coordinator-{shard}");
    results
        .get_or_create_consumer(
            &name,
            consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects::results(shard),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 100_000,
                max_deliver: -1,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| Error::Consumer {
            consumer: name,
            message: e.to_string(),
        })
}

/// Consumer names allow `[A-Za-z0-9_-]`; queue names may hold dots.
fn consumer_safe(queue: &str) -> String {
    queue
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Streams one execution's log, `trellis.events.<execution_id>` on the events stream, from the
/// message at stream sequence `start` (0: from its first message) through an ordered consumer:
/// the messages come pushed in batches, not a request each. The monitor's hubs and the
/// checkpoint-store's replicas read logs this way.
///
/// # Errors
///
/// The consumer cannot be created (NATS or the stream is unavailable).
pub async fn read_execution_log(
    events: &stream::Stream,
    execution_id: impl std::fmt::Display,
    start: u64,
) -> Result<consumer::pull::Ordered, String> {
    let deliver_policy = if start == 0 {
        consumer::DeliverPolicy::All
    } else {
        consumer::DeliverPolicy::ByStartSequence {
            start_sequence: start,
        }
    };
    events
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subjects::events(execution_id),
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|err| err.to_string())?
        .messages()
        .await
        .map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn consumer_names_are_safe() {
        assert_eq!(super::consumer_safe("gpu.large"), "gpu_large");
        assert_eq!(super::consumer_safe("shell"), "shell");
    }
}
