//! NATS JetStream plumbing shared by the Trellis services: one place that knows how to connect,
//! which streams and key-value buckets exist with which retention, and how the durable consumers
//! are configured, so the coordinator and the workers can start in any order and agree.

mod steps;

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use trellis_proto::subjects;

pub use steps::{STEPS_MAX_AGE, ensure_steps_bucket, steps_bucket};

/// How long a task message may stay unacknowledged before JetStream hands it to another worker.
/// Workers send `AckProgress` every [`HEARTBEAT_INTERVAL`], so a live worker never hits it; a
/// dead one loses its task after three silent intervals (DESIGN.md §4, "Agents").
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
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
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

/// Connects to NATS with the name shown in `nats-server` monitoring.
pub async fn connect(url: &str, name: &str) -> Result<async_nats::Client, Error> {
    async_nats::ConnectOptions::new()
        .name(name)
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .client_capacity(8192)
        .subscription_capacity(65_536)
        .connect(url)
        .await
        .map_err(|source| Error::Connect {
            url: url.to_owned(),
            source,
        })
}

/// The three streams of DESIGN.md §3.
#[derive(Debug, Clone)]
pub struct Streams {
    pub tasks: stream::Stream,
    pub results: stream::Stream,
    pub events: stream::Stream,
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
pub async fn ensure_streams(js: &jetstream::Context) -> Result<Streams, Error> {
    use stream::RetentionPolicy::{Limits, WorkQueue};
    let tasks = ensure(
        js,
        config(subjects::TASKS_STREAM, subjects::TASKS_WILDCARD, WorkQueue),
    )
    .await?;
    let results = ensure(
        js,
        config(
            subjects::RESULTS_STREAM,
            subjects::RESULTS_WILDCARD,
            WorkQueue,
        ),
    )
    .await?;
    let events = ensure(
        js,
        config(subjects::EVENTS_STREAM, subjects::EVENTS_WILDCARD, Limits),
    )
    .await?;
    Ok(Streams {
        tasks,
        results,
        events,
    })
}

/// The configuration shared by the three streams: file storage, a two-minute de-duplication
/// window for `Nats-Msg-Id`, messages up to [`MAX_PAYLOAD`].
fn config(
    name: &'static str,
    wildcard: &str,
    retention: stream::RetentionPolicy,
) -> stream::Config {
    stream::Config {
        name: name.to_owned(),
        subjects: vec![wildcard.to_owned()],
        retention,
        storage: stream::StorageType::File,
        max_message_size: MAX_PAYLOAD as i32,
        duplicate_window: Duration::from_secs(120),
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

/// Returns the durable pull consumer shared by every worker of `queue`.
pub async fn task_consumer(
    tasks: &stream::Stream,
    queue: &str,
    max_ack_pending: i64,
) -> Result<consumer::PullConsumer, Error> {
    let name = format!("workers-{}", consumer_safe(queue));
    tasks
        .get_or_create_consumer(
            &name,
            consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subjects::tasks(queue),
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

/// Completes on SIGTERM (what Kubernetes sends) or Ctrl-C: every service's signal to stop
/// gracefully.
pub async fn shutdown_signal() {
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

#[cfg(test)]
mod tests {
    #[test]
    fn consumer_names_are_safe() {
        assert_eq!(super::consumer_safe("gpu.large"), "gpu_large");
        assert_eq!(super::consumer_safe("shell"), "shell");
    }
}
