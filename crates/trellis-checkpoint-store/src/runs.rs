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

/// How long one pull waits for a first message before the next pull asks again.
const FIRST_WAIT: Duration = Duration::from_secs(5);

/// Most messages one pull of a run takes.
const PULL_CHUNK: usize = 250;

/// Takes runs of a durable pull consumer's messages in pulls of its own, instead of as the server
/// pushes each one: while messages come one at a time (one small execution after another), the
/// server would deliver each as it is stored, waking this process and working itself once per
/// message right beside the executions' own path. Here a run waits for its first message (a long
/// poll), lets [`RunLimits::linger`] pass, then takes what the consumer holds in one pull, so
/// the server delivers a run in two pulls however many messages it holds. After a full run the
/// next one is pulled at once, as a backlog is read.
pub(crate) struct Puller {
    consumer: async_nats::jetstream::consumer::PullConsumer,
    limits: RunLimits,
    /// The last run was full: more may be waiting.
    full: bool,
}

impl Puller {
    pub(crate) fn new(
        consumer: async_nats::jetstream::consumer::PullConsumer,
        limits: RunLimits,
    ) -> Self {
        Self {
            consumer,
            limits,
            full: false,
        }
    }

    /// The next run: at least one message when the consumer held or got one, none when a pull
    /// after a full run found nothing. A message a shutdown leaves untaken comes again later.
    ///
    /// # Errors
    ///
    /// A pull the server refused or a delivery error, said with the server's words.
    pub(crate) async fn next(&mut self, shutdown: &CancellationToken) -> Result<Next, String> {
        let mut received = Vec::new();
        if !self.full {
            let Some(first) = self.first(shutdown).await? else {
                return Ok(Next::ShutDown);
            };
            received.push(first);
            tokio::select! {
                () = shutdown.cancelled() => return Ok(Next::ShutDown),
                () = tokio::time::sleep(self.limits.linger) => {}
            }
        }
        let bytes = self.rest(&mut received).await?;
        self.full = received.len() >= self.limits.messages || bytes >= self.limits.bytes;
        Ok(Next::Run(received))
    }

    /// Waits for one message, in pulls of [`FIRST_WAIT`] each; `None` when shut down first.
    async fn first(&self, shutdown: &CancellationToken) -> Result<Option<Message>, String> {
        loop {
            let mut pull = self
                .consumer
                .batch()
                .max_messages(1)
                .expires(FIRST_WAIT)
                .messages()
                .await
                .map_err(|err| format!("cannot pull: {err}"))?;
            let first = tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                first = pull.next() => first,
            };
            // A pull that expired with nothing asks again.
            if let Some(message) = first {
                return message.map(Some).map_err(|err| err.to_string());
            }
        }
    }

    /// Adds what the consumer holds to `received`, in pulls of at most [`PULL_CHUNK`], until it
    /// has no more or the run is full (overshooting its bytes by at most one pull's messages);
    /// returns the run's payload bytes.
    async fn rest(&self, received: &mut Vec<Message>) -> Result<usize, String> {
        let mut bytes: usize = received.iter().map(Payload::payload_len).sum();
        loop {
            let room = self.limits.messages.saturating_sub(received.len());
            if room == 0 || bytes >= self.limits.bytes {
                return Ok(bytes);
            }
            let asked = room.min(PULL_CHUNK);
            let mut pull = self
                .consumer
                .fetch()
                .max_messages(asked)
                .messages()
                .await
                .map_err(|err| format!("cannot pull: {err}"))?;
            let mut got = 0;
            while let Some(message) = pull.next().await {
                let message = message.map_err(|err| err.to_string())?;
                bytes += message.payload_len();
                received.push(message);
                got += 1;
            }
            if got < asked {
                return Ok(bytes);
            }
        }
    }
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

/// [`Puller`] against a real `nats-server -js`.
#[cfg(test)]
mod pulls {
    use std::time::Duration;

    use async_nats::jetstream::{self, consumer, stream};
    use tokio_util::sync::CancellationToken;
    use trellis_testkit::NatsServer;

    use super::{Next, Puller, RunLimits};

    /// A stream `T` of subjects `t.>`, a durable pull consumer of it, and a publisher.
    async fn consumer(nats: &NatsServer) -> (jetstream::Context, consumer::PullConsumer) {
        let client = async_nats::connect(nats.url()).await.expect("connect");
        let js = jetstream::new(client);
        let stream = js
            .create_stream(stream::Config {
                name: "T".to_owned(),
                subjects: vec!["t.>".to_owned()],
                ..Default::default()
            })
            .await
            .expect("the stream");
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("reader".to_owned()),
                ack_policy: consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .expect("the consumer");
        (js, consumer)
    }

    async fn publish(js: &jetstream::Context, from: usize, n: usize) {
        for i in from..from + n {
            js.publish("t.x", i.to_string().into())
                .await
                .expect("publish")
                .await
                .expect("stored");
        }
    }

    fn payloads(next: Next) -> Vec<usize> {
        match next {
            Next::Run(run) => run
                .iter()
                .map(|m| {
                    std::str::from_utf8(&m.payload)
                        .ok()
                        .and_then(|text| text.parse().ok())
                        .expect("a number")
                })
                .collect(),
            Next::ShutDown => panic!("a run was expected, not a shutdown"),
            Next::Ended => panic!("a run was expected, not the end"),
        }
    }

    fn limits(messages: usize, linger: Duration) -> RunLimits {
        RunLimits {
            messages,
            bytes: 1 << 20,
            linger,
        }
    }

    #[tokio::test]
    async fn messages_that_come_one_at_a_time_within_the_linger_share_a_run() {
        let nats = NatsServer::start().expect("a nats-server (apt-get install nats-server)");
        let (js, consumer) = consumer(&nats).await;
        let shutdown = CancellationToken::new();
        let mut puller = Puller::new(consumer, limits(100, Duration::from_millis(300)));
        let publisher = {
            let js = js.clone();
            tokio::spawn(async move {
                for i in 0..3 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    publish(&js, i, 1).await;
                }
            })
        };
        let run = payloads(puller.next(&shutdown).await.expect("a run"));
        publisher.await.expect("the publisher");
        assert_eq!(
            run,
            [0, 1, 2],
            "the first message waited for, then the linger's"
        );
        publish(&js, 3, 1).await;
        let run = payloads(puller.next(&shutdown).await.expect("a run"));
        assert_eq!(run, [3]);
    }

    #[tokio::test]
    async fn a_backlog_comes_in_full_runs_pulled_back_to_back() {
        let nats = NatsServer::start().expect("a nats-server (apt-get install nats-server)");
        let (js, consumer) = consumer(&nats).await;
        publish(&js, 0, 700).await;
        let shutdown = CancellationToken::new();
        // A linger no full run waits for: the test ends long before it.
        let mut puller = Puller::new(consumer, limits(300, Duration::from_millis(100)));
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(payloads(puller.next(&shutdown).await.expect("a run")));
        }
        let lengths: Vec<usize> = runs.iter().map(Vec::len).collect();
        assert_eq!(
            lengths,
            [300, 300, 100],
            "runs of at most 300, in pulls of 250"
        );
        let all: Vec<usize> = runs.into_iter().flatten().collect();
        assert_eq!(
            all,
            (0..700).collect::<Vec<_>>(),
            "every message once, in order"
        );
        // After a run that was not full the next waits for a message of its own.
        let waiting =
            tokio::time::timeout(Duration::from_millis(300), puller.next(&shutdown)).await;
        assert!(waiting.is_err(), "nothing more was published");
    }

    #[tokio::test]
    async fn a_shutdown_ends_the_wait_for_a_first_message() {
        let nats = NatsServer::start().expect("a nats-server (apt-get install nats-server)");
        let (_js, consumer) = consumer(&nats).await;
        let shutdown = CancellationToken::new();
        let mut puller = Puller::new(consumer, limits(10, Duration::from_millis(10)));
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stop.cancel();
        });
        let next = tokio::time::timeout(Duration::from_secs(5), puller.next(&shutdown))
            .await
            .expect("the shutdown ends the wait")
            .expect("no error");
        assert!(matches!(next, Next::ShutDown));
    }
}
