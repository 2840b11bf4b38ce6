//! What the store's two consumers share (`ingest` of the event log, `logs` of the task logs):
//! taking a run of messages (those already delivered and those that arrive within a short linger,
//! so that messages arriving one at a time share a transaction), and trying a database write
//! until it lands.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::Message;
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::store::Error;

/// Longest pause between two tries of a failed write.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// How long the store's consumers let a run take messages after its first: one small execution
/// after another then shares transactions, and the read model trails the log by at most this.
pub(crate) const LINGER: Duration = Duration::from_millis(10);

/// What waiting for the next run of messages gave.
pub(crate) enum Next<T = Message> {
    /// At least one message arrived: it and whatever else came within the linger (possibly none,
    /// when all of them were delivery errors).
    Run(Vec<T>),
    /// Shutdown came first.
    ShutDown,
    /// The consumer's stream ended.
    Ended,
}

/// How large a run may grow and how long it waits to grow.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunLimits {
    /// Most messages in one run.
    pub(crate) messages: usize,
    /// Most payload bytes in one run.
    pub(crate) bytes: usize,
    /// How long after its first message a run keeps taking messages as they arrive. One write
    /// per message costs a transaction each; while messages trickle in one at a time (one small
    /// execution after another) this lets a few share one, at the price of the read model
    /// trailing the log by at most this long.
    pub(crate) linger: Duration,
}

/// A message of a run: what counts against [`RunLimits::bytes`].
pub(crate) trait Payload {
    fn payload_len(&self) -> usize;
}

impl Payload for Message {
    fn payload_len(&self) -> usize {
        self.payload.len()
    }
}

/// Waits for the next message (or `shutdown`), then takes it with whatever else is buffered or
/// arrives within `limits.linger` of it, up to `limits.messages` messages or `limits.bytes`
/// payload bytes. A delivery error is logged (naming `what`) and skipped. Shutdown or the end of
/// the stream during the linger ends the run early; the next call reports them.
pub(crate) async fn next<S, T, E>(
    messages: &mut S,
    shutdown: &CancellationToken,
    limits: RunLimits,
    what: &str,
) -> Next<T>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    T: Payload,
    E: Display,
{
    let first = tokio::select! {
        () = shutdown.cancelled() => return Next::ShutDown,
        next = messages.next() => next,
    };
    let Some(first) = first else {
        return Next::Ended;
    };
    let deadline = tokio::time::Instant::now() + limits.linger;
    let mut received = Vec::with_capacity(64);
    let mut bytes = 0;
    let mut next = Some(first);
    while let Some(item) = next.take() {
        match item {
            Ok(message) => {
                bytes += message.payload_len();
                received.push(message);
            }
            Err(err) => tracing::warn!(%err, "{what} consumer"),
        }
        if received.len() >= limits.messages || bytes >= limits.bytes {
            break;
        }
        next = match futures::FutureExt::now_or_never(messages.next()) {
            Some(item) => item,
            None => tokio::select! {
                () = shutdown.cancelled() => None,
                () = tokio::time::sleep_until(deadline) => None,
                item = messages.next() => item,
            },
        };
    }
    Next::Run(received)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    /// A message of `n` payload bytes.
    #[derive(Debug, PartialEq)]
    struct Sent(usize);

    impl Payload for Sent {
        fn payload_len(&self) -> usize {
            self.0
        }
    }

    type Sender = mpsc::UnboundedSender<Result<Sent, String>>;

    fn channel() -> (Sender, UnboundedReceiverStream<Result<Sent, String>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, UnboundedReceiverStream::new(rx))
    }

    fn limits(messages: usize, linger: Duration) -> RunLimits {
        RunLimits {
            messages,
            bytes: 1_000,
            linger,
        }
    }

    /// Sends `Sent(n)` after `after`.
    fn send_later(tx: &Sender, n: usize, after: Duration) {
        let tx = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let _ = tx.send(Ok(Sent(n)));
        });
    }

    fn run(next: Next<Sent>) -> Vec<Sent> {
        match next {
            Next::Run(run) => run,
            Next::ShutDown => panic!("a run was expected, not a shutdown"),
            Next::Ended => panic!("a run was expected, not the end"),
        }
    }

    #[tokio::test]
    async fn a_run_takes_what_arrives_within_its_linger() {
        let (tx, mut messages) = channel();
        let shutdown = CancellationToken::new();
        tx.send(Ok(Sent(1))).unwrap(); // the receiver is alive: it is `messages`
        send_later(&tx, 2, Duration::from_millis(20));
        send_later(&tx, 3, Duration::from_millis(40));
        // A linger far longer than the sends: the run ends when it is full.
        let taken = tokio::time::timeout(
            Duration::from_secs(5),
            next(
                &mut messages,
                &shutdown,
                limits(3, Duration::from_secs(60)),
                "test",
            ),
        )
        .await
        .expect("a full run returns before its linger ends");
        assert_eq!(run(taken), [Sent(1), Sent(2), Sent(3)]);
    }

    #[tokio::test]
    async fn without_a_linger_a_run_takes_only_what_is_buffered() {
        let (tx, mut messages) = channel();
        let shutdown = CancellationToken::new();
        tx.send(Ok(Sent(1))).unwrap(); // the receiver is alive: it is `messages`
        tx.send(Ok(Sent(2))).unwrap();
        send_later(&tx, 3, Duration::from_millis(50));
        let taken = next(&mut messages, &shutdown, limits(10, Duration::ZERO), "test").await;
        assert_eq!(run(taken), [Sent(1), Sent(2)]);
        let taken = next(&mut messages, &shutdown, limits(10, Duration::ZERO), "test").await;
        assert_eq!(run(taken), [Sent(3)]);
    }

    #[tokio::test]
    async fn the_end_of_the_stream_or_a_shutdown_ends_a_lingering_run_early() {
        let (tx, mut messages) = channel();
        let shutdown = CancellationToken::new();
        tx.send(Ok(Sent(1))).unwrap(); // the receiver is alive: it is `messages`
        tx.send(Err("lost".to_owned())).unwrap();
        send_later(&tx, 2, Duration::from_millis(20));
        drop(tx);
        let lingering = limits(10, Duration::from_secs(60));
        let taken = tokio::time::timeout(
            Duration::from_secs(5),
            next(&mut messages, &shutdown, lingering, "test"),
        )
        .await
        .expect("the stream's end ends the run");
        assert_eq!(run(taken), [Sent(1), Sent(2)], "the error is skipped");
        assert!(matches!(
            next(&mut messages, &shutdown, lingering, "test").await,
            Next::Ended
        ));

        let (tx, mut messages) = channel();
        tx.send(Ok(Sent(1))).unwrap(); // the receiver is alive: it is `messages`
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            stop.cancel();
        });
        let taken = tokio::time::timeout(
            Duration::from_secs(5),
            next(&mut messages, &shutdown, lingering, "test"),
        )
        .await
        .expect("a shutdown ends the run");
        assert_eq!(run(taken), [Sent(1)]);
        assert!(matches!(
            next(&mut messages, &shutdown, lingering, "test").await,
            Next::ShutDown
        ));
        drop(tx);
    }

    #[tokio::test]
    async fn a_run_stops_at_its_byte_limit() {
        let (tx, mut messages) = channel();
        let shutdown = CancellationToken::new();
        for n in [600, 500, 1] {
            tx.send(Ok(Sent(n))).unwrap(); // the receiver is alive: it is `messages`
        }
        let taken = next(
            &mut messages,
            &shutdown,
            limits(10, Duration::from_secs(60)),
            "test",
        );
        let taken = tokio::time::timeout(Duration::from_secs(5), taken)
            .await
            .expect("a run past its byte limit returns at once");
        assert_eq!(run(taken), [Sent(600), Sent(500)]);
    }
}
