//! What the store's two consumers share (`ingest` of the event log, `logs` of the task logs):
//! taking a run of the messages already delivered, and trying a database write until it lands.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::Message;
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::store::Error;

/// Longest pause between two tries of a failed write.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// What waiting for the next run of messages gave.
pub(crate) enum Next {
    /// At least one message arrived: it and whatever else was already buffered (possibly none,
    /// when all of them were delivery errors).
    Run(Vec<Message>),
    /// Shutdown came first.
    ShutDown,
    /// The consumer's stream ended.
    Ended,
}

/// Waits for the next message (or `shutdown`), then takes it with whatever else is already
/// buffered, without waiting, up to `max_messages` messages or `max_bytes` payload bytes.
pub(crate) async fn next<S, E>(
    messages: &mut S,
    shutdown: &CancellationToken,
    max_messages: usize,
    max_bytes: usize,
    what: &str,
) -> Next
where
    S: Stream<Item = Result<Message, E>> + Unpin,
    E: Display,
{
    let first = tokio::select! {
        () = shutdown.cancelled() => return Next::ShutDown,
        next = messages.next() => next,
    };
    match first {
        Some(first) => Next::Run(take(first, messages, max_messages, max_bytes, what)),
        None => Next::Ended,
    }
}

/// Takes `first` and whatever else `messages` has already buffered, without waiting, up to
/// `max_messages` messages or `max_bytes` payload bytes. A delivery error is logged (naming
/// `what`) and skipped.
fn take<S, E>(
    first: Result<Message, E>,
    messages: &mut S,
    max_messages: usize,
    max_bytes: usize,
    what: &str,
) -> Vec<Message>
where
    S: Stream<Item = Result<Message, E>> + Unpin,
    E: Display,
{
    let mut received = Vec::with_capacity(64);
    let mut bytes = 0;
    let mut next = Some(first);
    while let Some(item) = next.take() {
        match item {
            Ok(message) => {
                bytes += message.payload.len();
                received.push(message);
            }
            Err(err) => tracing::warn!(%err, "{what} consumer"),
        }
        if received.len() >= max_messages || bytes >= max_bytes {
            break;
        }
        next = futures::FutureExt::now_or_never(messages.next()).flatten();
    }
    received
}

/// Runs `write` until it succeeds, pausing between tries (50 ms, doubling up to 5 s) and logging
/// each failure with `what`; returns false when `shutdown` comes first.
pub(crate) async fn write_until_done<F, Fut>(
    shutdown: &CancellationToken,
    what: &str,
    mut write: F,
) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let mut delay = Duration::from_millis(50);
    loop {
        match write().await {
            Ok(()) => return true,
            Err(err) => tracing::error!(%err, "{what} failed; trying again"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
}
