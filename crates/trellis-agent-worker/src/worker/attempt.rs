//! One attempt, once dispatched: where it runs (in place or as a task of its own) and how it
//! ends (its handler's outcome, a cancel, its deadline, the worker's stop).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::FutureExt as _;
use trellis_proto::v1::TaskAssignment;
use trellis_telemetry::hops;

use super::{Ending, Worker, traced};
use crate::publish::now_unix_ms;
use crate::sdk::{Outcome, Running, TaskContext, TaskHandler, lock};
use crate::steps::wants_stored_steps;
use crate::validate::validate;

impl Worker {
    /// Runs an attempt made by [`Worker::dispatch`]. On a runtime of one thread a task of its
    /// own buys the attempt no parallelism, only a trip through the run queue behind whatever
    /// was woken meanwhile (under load, hundreds of tasks): it is polled here first, and only one
    /// that has to wait (a handler that sleeps or calls out, a full result channel) goes on as a
    /// task. On a runtime of many threads every attempt is a task, so the threads share them.
    ///
    /// That first poll is outside the fetch loop's cooperative budget: within it a message's
    /// attempts would start waiting on the result channel part-way through (as if it were full),
    /// and the results of one assignment message would leave in several (a third more turns and
    /// messages per task in `throughput`, and fewer tasks a second).
    pub(super) async fn start(&self, work: impl Future<Output = ()> + Send + 'static) {
        if !self.inline {
            self.handlers.spawn(work);
            return;
        }
        let mut work = Box::pin(self.handlers.track_future(work));
        let polled = tokio::task::unconstrained(std::future::poll_fn(|cx| {
            Poll::Ready(std::panic::catch_unwind(AssertUnwindSafe(|| {
                work.as_mut().poll(cx)
            })))
        }))
        .await;
        match polled {
            Ok(Poll::Ready(())) => {}
            // Polled again by its task, with the task's waker.
            Ok(Poll::Pending) => drop(tokio::spawn(work)),
            // Handlers' panics are caught in `execute`; this is the worker's own, which a task
            // of its own would have ended the same way.
            Err(_) => tracing::error!("an attempt panicked outside its handler"),
        }
    }

    /// Runs the handler until it ends, is cancelled, passes its deadline or the worker stops.
    ///
    /// A task message delivered again (`delivered > 1`), or a later attempt without recorded
    /// steps, first looks for steps kept in the steps bucket, so a handler whose worker died
    /// resumes after its last checkpointed step; a first delivery does not look.
    pub(super) async fn execute(
        &self,
        handler: Option<Arc<dyn TaskHandler>>,
        mut assignment: TaskAssignment,
        delivered: i64,
        running: &Arc<Running>,
    ) -> Ending {
        let Some(handler) = handler else {
            let error = format!(
                "no handler for task type {:?} on worker {}",
                assignment.task_type, self.worker_id
            );
            return Ending::Done(Outcome::failed(error, false));
        };
        let deadline = assignment.deadline_unix_ms.unwrap_or(0);
        let sink = self.sink.clone();
        let attempt_running = running.clone();
        let checks = std::mem::take(&mut assignment.validate);
        let outputs = self.outputs.clone();
        let traced = traced(&assignment);
        let attempt = async move {
            if wants_stored_steps(delivered, &assignment) {
                // Boxed: a delivery again is rare, and the lookup's future large.
                Box::pin(sink.load_steps(&mut assignment, &attempt_running)).await;
            }
            if let Err(outcome) = outputs.resolve(&mut assignment).await {
                return outcome;
            }
            let keep_inline = assignment.keep_output_inline;
            let ctx = TaskContext::new(assignment, attempt_running.clone(), sink);
            hops::mark_any("worker.started", traced);
            let outcome = handler.run(ctx).await;
            hops::mark_any("worker.handled", traced);
            let (outcome, results) = validate(&checks, outcome, &attempt_running).await;
            *lock(&attempt_running.validation) = results;
            outputs.store(outcome, &attempt_running, keep_inline).await
        };
        let handler_future = AssertUnwindSafe(attempt).catch_unwind();
        let until_deadline = async move {
            if deadline > 0 {
                let left = u64::try_from(deadline - now_unix_ms()).unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(left)).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let ending = tokio::select! {
            biased;
            _ = self.abandon.cancelled() => Ending::Abandoned,
            _ = self.hand_back.cancelled() => Ending::HandBack,
            _ = running.cancel.cancelled() => {
                let reason = lock(&running.cancel_reason).clone();
                Ending::Done(Outcome::failed(format!("cancelled: {reason}"), false))
            }
            _ = until_deadline => Ending::Done(Outcome::failed("deadline exceeded", true)),
            outcome = handler_future => match outcome {
                Ok(outcome) => return Ending::Done(outcome),
                Err(_) => Ending::Done(Outcome::failed("handler panicked", true)),
            },
        };
        // The handler's future is gone; tell whatever it started elsewhere to stop too.
        running.cancel.cancel();
        ending
    }
}
