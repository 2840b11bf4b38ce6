//! The Trellis agent-worker: runs task handlers for the tasks the coordinator publishes on
//! JetStream (docs/design.md §1, §3, §6, §7, §11).
//!
//! [`run`] connects to NATS, ensures the streams, and for every configured queue pulls from the
//! queue's durable consumer (`trellis.tasks.<queue>`, shared by every worker of the queue), at
//! most as many messages as there are free handler slots. For each [`v1::TaskAssignment`] it runs
//! the handler registered for the task type ([`HandlerRegistry`]), publishes the
//! [`v1::TaskResult`] on `trellis.results.<shard>` (the assignment's `results_shard`, or else the
//! configured shard the execution id hashes to) with `Nats-Msg-Id`
//! `<instance>:<attempt>:<outcome>`, waits for JetStream to accept it, and only then
//! acknowledges the task message. Results are published in batches whose acks are awaited together.
//! A final result is first handed to the coordinator holding its shard (core NATS,
//! `trellis.handoff.<shard>`; see `handoff`), which replies once its events are stored; the
//! stream takes whatever it does not.
//!
//! Around the handlers:
//! - Every `HEARTBEAT_INTERVAL` the worker publishes a [`v1::WorkerHeartbeat`] (running instances
//!   with progress and current step, memory, CPU) and sends `AckProgress` for every running task
//!   message, so a live worker keeps its tasks and a dead one loses them after the ack wait.
//! - A [`v1::CancelTask`] on `trellis.cancel.<instance>` stops that instance's handler; the attempt
//!   reports a failure that is not retryable.
//! - An assignment whose `avoid_worker_id` names this worker is handed back with a short delay so
//!   another worker takes it; from its fifth delivery on it runs here anyway, since this worker
//!   may be the only one of its queue.
//! - A message that is not a valid assignment is set aside (`AckKind::Term`) with a warning.
//! - Durable steps are kept in the KV bucket `trellis_steps` as well as published as step
//!   checkpoints; a task message delivered again (its worker died) reads them back and resumes
//!   after the last recorded step. A first delivery never reads the bucket.
//! - A NATS server restart is ridden out: fetches that fail or go silent are retried with a fresh
//!   consumer, and results are published again (same `Nats-Msg-Id`) until JetStream stores them.
//! - On shutdown the worker stops fetching, gives running handlers `shutdown_grace_ms` to finish,
//!   hands the rest back for immediate redelivery, flushes and returns. Dropping the `run` future
//!   instead behaves like a crash: nothing more is acknowledged.
//!
//! Handlers are written with the SDK of [`sdk`]: [`TaskHandler`], [`TaskContext`] (input, resume
//! context, progress, usage, durable steps) and [`Outcome`].

mod builtins;
mod cli;
mod config;
mod drain;
mod fences;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod handoff;
mod intake;
mod logs;
mod metrics;
mod outputs;
mod publish;
mod publisher;
pub mod sdk;
mod steps;
mod sysinfo;
mod task_ack;
mod validate;
mod worker;

pub use cli::main_entry;
pub use config::{Config, DEFAULT_QUEUES};
pub use sdk::{
    GroupRule, HandlerRegistry, Outcome, Question, StepError, Subtask, TaskContext, TaskHandler,
};
pub use tokio_util::sync::CancellationToken;
pub use trellis_proto::v1;

/// Why the worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// NATS or JetStream could not be reached or set up.
    #[error(transparent)]
    Bus(#[from] trellis_bus::Error),
    /// A core NATS subscription failed.
    #[error("cannot subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    /// The result publisher stopped while the worker ran: no result could be reported any more,
    /// so the worker stops (not ready from then on) instead of taking tasks it cannot report.
    #[error("the result publisher stopped: {0}")]
    Publisher(String),
}

/// Runs a worker with `registry`'s handlers until `shutdown` is cancelled, then stops gracefully
/// (see the crate docs). Returns an error when it cannot start, or when its result publisher
/// stops while it runs.
pub async fn run(
    config: Config,
    registry: HandlerRegistry,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    worker::run(config, registry, shutdown).await
}
