//! Integration tests of the agent-worker against a real `nats-server -js` (from
//! `trellis-testkit`): the test plays the coordinator, publishing assignments and reading results.

mod builtins;
mod delivery;
mod handoff;
mod hostile;
mod offers;
mod outputs;
mod restart;
mod sigkill;
mod steps;

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Context as _, bail};
use async_nats::jetstream;
use futures::StreamExt as _;
use prost::Message as _;
use serde_json::Value;
use tokio::task::JoinHandle;
use trellis_agent_worker::v1::{self, TaskAssignment, TaskResult, task_result};
use trellis_agent_worker::{CancellationToken, Config, HandlerRegistry};
use trellis_proto::subjects;
use trellis_testkit::NatsServer;

/// How long a test waits for a result that should come at once.
// Generous: a redelivery after a killed worker can wait out a whole ack wait (6 s), and the
// suite shares two cores with other test binaries.
const SOON: Duration = Duration::from_secs(30);

/// A NATS server, a client, and a subscription to every result and heartbeat.
struct Harness {
    server: NatsServer,
    client: async_nats::Client,
    js: jetstream::Context,
    results: Results,
}

impl Harness {
    async fn start() -> anyhow::Result<Harness> {
        let server = NatsServer::start()?;
        let client = async_nats::connect(server.url()).await?;
        let js = jetstream::new(client.clone());
        trellis_bus::ensure_streams(&js, 1).await?;
        let results = Results::new(client.subscribe(subjects::RESULTS_WILDCARD).await?);
        client.flush().await?;
        Ok(Harness {
            server,
            client,
            js,
            results,
        })
    }

    /// Starts a worker of `queues` with `registry`; cancel the token to stop it gracefully, or
    /// abort the handle to make it vanish like a killed process.
    fn worker(&self, worker_id: &str, queues: &[&str], registry: HandlerRegistry) -> Worker {
        self.worker_with(worker_id, queues, registry, |_| {})
    }

    /// [`Harness::worker`], with `tune` applied to its configuration.
    fn worker_with(
        &self,
        worker_id: &str,
        queues: &[&str],
        registry: HandlerRegistry,
        tune: impl FnOnce(&mut Config),
    ) -> Worker {
        let mut config = Config {
            queues: queues.iter().map(|queue| (*queue).to_owned()).collect(),
            worker_id: Some(worker_id.to_owned()),
            shutdown_grace_ms: 500,
            ..Config::new(self.server.url())
        };
        tune(&mut config);
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(trellis_agent_worker::run(
            config,
            registry,
            shutdown.clone(),
        ));
        Worker { shutdown, handle }
    }

    async fn publish(&self, assignment: &TaskAssignment) -> anyhow::Result<()> {
        self.publish_raw(&assignment.queue, assignment.encode_to_vec())
            .await
    }

    async fn publish_raw(&self, queue: &str, payload: Vec<u8>) -> anyhow::Result<()> {
        self.js
            .publish(subjects::tasks(queue), payload.into())
            .await?
            .await?;
        Ok(())
    }

    /// Publishes `entries` (encoded assignments) to `queue` as one batch message, as a
    /// coordinator does.
    async fn publish_batch(&self, queue: &str, entries: Vec<Vec<u8>>) -> anyhow::Result<()> {
        let n = entries.len();
        let entries = entries
            .into_iter()
            .map(|assignment| v1::task_assignment_batch::Entry {
                assignment,
                msg_id: String::new(),
                traceparent: String::new(),
            })
            .collect();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(subjects::ASSIGNMENT_BATCH_HEADER, n.to_string().as_str());
        self.js
            .publish_with_headers(
                subjects::tasks(queue),
                headers,
                trellis_proto::assignments::pack(entries).into(),
            )
            .await?
            .await?;
        Ok(())
    }

    /// Returns the next result of `instance` (skipping other instances' results).
    async fn result_of(&mut self, instance: &str) -> anyhow::Result<TaskResult> {
        self.result_matching(instance, |_| true).await
    }

    /// Returns the next final (not step checkpoint) result of `instance`.
    async fn final_result_of(&mut self, instance: &str) -> anyhow::Result<TaskResult> {
        self.result_matching(instance, |result| {
            !matches!(
                result.outcome,
                Some(task_result::Outcome::StepCheckpoint(_))
            )
        })
        .await
    }

    async fn result_matching(
        &mut self,
        instance: &str,
        wanted: impl Fn(&TaskResult) -> bool,
    ) -> anyhow::Result<TaskResult> {
        let deadline = tokio::time::Instant::now() + SOON;
        loop {
            let (result, msg_id) = tokio::time::timeout_at(deadline, self.results.next())
                .await
                .with_context(|| format!("no result for {instance} within {SOON:?}"))??;
            if result.task_instance_id == instance && wanted(&result) {
                let expected_prefix = format!("{instance}:{}:", result.attempt);
                if !msg_id.starts_with(&expected_prefix) {
                    bail!("result message id {msg_id:?} does not start with {expected_prefix:?}");
                }
                return Ok(result);
            }
        }
    }

    /// Returns (pending, ack pending) of a queue's consumer.
    async fn consumer_backlog(&self, queue: &str) -> anyhow::Result<(u64, usize)> {
        let stream = self.js.get_stream(subjects::TASKS_STREAM).await?;
        let mut consumer: jetstream::consumer::PullConsumer = stream
            .get_consumer(&format!("workers-{queue}"))
            .await
            .map_err(|error| anyhow::anyhow!("cannot open consumer of {queue}: {error}"))?;
        let info = consumer.info().await?;
        Ok((info.num_pending, info.num_ack_pending))
    }

    async fn wait_until_queue_drained(&self, queue: &str) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + SOON;
        loop {
            let backlog = self.consumer_backlog(queue).await?;
            if backlog == (0, 0) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("queue {queue} still has (pending, ack pending) = {backlog:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Reads results from a subscription to results subjects one at a time, taking batches apart.
struct Results {
    subscription: async_nats::Subscriber,
    /// Results of a batch not returned yet, with their `Nats-Msg-Id`s.
    pending: VecDeque<(TaskResult, String)>,
    /// How many messages carried more than one result.
    batches: usize,
}

impl Results {
    fn new(subscription: async_nats::Subscriber) -> Results {
        Results {
            subscription,
            pending: VecDeque::new(),
            batches: 0,
        }
    }

    /// Returns the next result and the `Nats-Msg-Id` it carries (its own, inside a batch).
    async fn next(&mut self) -> anyhow::Result<(TaskResult, String)> {
        loop {
            if let Some(next) = self.pending.pop_front() {
                return Ok(next);
            }
            let message = self
                .subscription
                .next()
                .await
                .context("results subscription ended")?;
            let results = results_in(&message)?;
            if results.len() > 1 {
                self.batches += 1;
            }
            self.pending.extend(results);
        }
    }
}

/// Returns the results a message on a results subject carries (a batch's entries, or the
/// message alone), each with its `Nats-Msg-Id`.
fn results_in(message: &async_nats::Message) -> anyhow::Result<Vec<(TaskResult, String)>> {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(name))
            .map(|value| value.as_str().to_owned())
    };
    let batch = header(subjects::RESULT_BATCH_HEADER).is_some();
    let msg_id = header(subjects::MSG_ID_HEADER).unwrap_or_default();
    if batch && !msg_id.starts_with("batch:") {
        bail!("a batch of results has the message id {msg_id:?}, not batch:<id>");
    }
    trellis_proto::results::unpack(batch, &message.payload, &msg_id, "")?
        .into_iter()
        .map(|entry| Ok((TaskResult::decode(entry.result.as_slice())?, entry.msg_id)))
        .collect()
}

struct Worker {
    shutdown: CancellationToken,
    handle: JoinHandle<Result<(), trellis_agent_worker::Error>>,
}

impl Worker {
    /// Stops the worker gracefully and checks it returned `Ok`.
    async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        tokio::time::timeout(SOON, self.handle)
            .await
            .context("worker did not stop")???;
        Ok(())
    }

    /// Drops the worker's future, like a process killed without warning.
    async fn kill(self) {
        self.handle.abort();
        let _ = self.handle.await;
    }
}

/// Returns a fresh assignment of `task_type` on the queue of the same name, attempt 1.
fn assignment(task_type: &str, input: Value) -> TaskAssignment {
    let instance = uuid::Uuid::now_v7().to_string();
    TaskAssignment {
        execution_id: uuid::Uuid::now_v7().to_string(),
        task_id: task_type.to_owned(),
        task_type: task_type.to_owned(),
        queue: task_type.to_owned(),
        input: serde_json::to_vec(&input).unwrap_or_default(),
        attempt: 1,
        run_number: 1,
        idempotency_key: subjects::task_msg_id(&instance, 1),
        task_instance_id: instance,
        ..TaskAssignment::default()
    }
}

/// Returns the same instance's next attempt.
fn next_attempt(assignment: &TaskAssignment) -> TaskAssignment {
    let attempt = assignment.attempt + 1;
    TaskAssignment {
        attempt,
        idempotency_key: subjects::task_msg_id(&assignment.task_instance_id, attempt),
        ..assignment.clone()
    }
}

fn completed_output(result: &TaskResult) -> anyhow::Result<Value> {
    match &result.outcome {
        Some(task_result::Outcome::Completed(completed)) => {
            Ok(serde_json::from_slice(&completed.output)?)
        }
        other => bail!("expected a completed result, got {other:?}"),
    }
}

fn failure(result: &TaskResult) -> anyhow::Result<(String, bool)> {
    match &result.outcome {
        Some(task_result::Outcome::Failed(failed)) => Ok((failed.error.clone(), failed.retryable)),
        other => bail!("expected a failed result, got {other:?}"),
    }
}

/// Waits for a heartbeat of `worker_id` that lists `instance` as running.
async fn heartbeat_listing(
    client: &async_nats::Client,
    worker_id: &str,
    instance: &str,
) -> anyhow::Result<v1::WorkerHeartbeat> {
    let mut beats = client.subscribe(subjects::heartbeat(worker_id)).await?;
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let message = tokio::time::timeout_at(deadline, beats.next())
            .await
            .with_context(|| format!("no heartbeat of {worker_id} listing {instance}"))?
            .context("heartbeat subscription ended")?;
        let beat = v1::WorkerHeartbeat::decode(message.payload.as_ref())?;
        if beat
            .running
            .iter()
            .any(|running| running.task_instance_id == instance)
        {
            return Ok(beat);
        }
    }
}

/// Waits until process `pid` no longer runs: gone, or a zombie waiting to be reaped.
async fn wait_until_gone(pid: &str, within: Duration) -> anyhow::Result<()> {
    let pid = pid.to_owned();
    trellis_testkit::wait_for(
        || {
            let pid = pid.clone();
            async move {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map_or(true, |stat| stat.contains(") Z"))
            }
        },
        within,
    )
    .await
}
