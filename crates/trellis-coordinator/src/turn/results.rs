//! Worker results: decoded, held to the deployment's payload limit, and applied to the attempt
//! they name. A result the state machine refuses fails its attempt instead of leaving it running;
//! one that cannot be read at all is set aside and counted.
//!
//! A result for an instance or attempt this coordinator does not know may be one its state is
//! too old for (another coordinator wrote the log meanwhile): acknowledging it would lose it. It
//! is held back; if the turn's append proves the state current, it is set aside, otherwise the
//! execution is loaded again and the result applied to what the log says.

use prost::Message as _;
use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_core::machine::{Applied, ApplyError, Event, EventBody, Usage};
use trellis_proto::v1;
use trellis_wire::worker;

use super::{Coordinator, Delivery};
use crate::metrics;

/// The attempt a result names.
pub(super) type AttemptKey = (ExecutionId, TaskInstanceId, u32);

/// What became of a result.
enum Fed {
    /// Applied, ignored as a duplicate, or set aside (no execution).
    Done(Option<ExecutionId>),
    /// Its execution is not in memory yet.
    Later,
    /// Its execution's log does not replay.
    Held,
    /// Refused for naming an instance or attempt the state does not know.
    Doubtful(AttemptKey),
}

impl Coordinator {
    /// Applies one result and records what to do with its message.
    pub(super) fn result(&mut self, delivery: Delivery, now: u64) {
        let _entered = delivery.span.enter();
        match self.apply_result(&delivery.payload, &delivery.span, now) {
            Fed::Done(Some(id)) if self.waiting_for(id) => {
                // Being loaded: let it come back once the execution is in memory.
                self.pending.later.push(delivery.token);
            }
            Fed::Done(id) => self.pending.acks.push((delivery.token, id)),
            Fed::Later => self.pending.later.push(delivery.token),
            Fed::Held => self.pending.held.push(delivery.token),
            Fed::Doubtful(key) => self.pending.doubtful.push((delivery.token, key)),
        }
    }

    /// True when the execution is not in memory but will be: it is being loaded, or its shard
    /// is being recovered.
    pub(super) fn waiting_for(&self, id: ExecutionId) -> bool {
        !self.executions.contains_key(&id)
            && (self.loading.contains_key(&id) || self.acquiring.contains(&self.shard_of(id)))
    }

    /// Applies one encoded result.
    fn apply_result(&mut self, payload: &[u8], span: &tracing::Span, now: u64) -> Fed {
        let mut result = match v1::TaskResult::decode(payload) {
            Ok(result) => result,
            Err(err) => {
                tracing::warn!(%err, "corrupt task result set aside");
                self.metrics.set_aside("corrupt");
                return Fed::Done(None);
            }
        };
        if !span.is_none() {
            span.record("execution_id", result.execution_id.as_str());
            span.record("task_instance_id", result.task_instance_id.as_str());
            span.record("attempt", result.attempt);
        }
        if let Some(why) = enforce_payload_limit(&mut result, self.limits.max_payload_bytes) {
            tracing::warn!(
                execution_id = %result.execution_id,
                task_instance_id = %result.task_instance_id,
                %why,
                "task result over the payload limit: the attempt fails"
            );
        }
        let (id, event) = match worker::result_to_event(&result, now) {
            Ok(converted) => converted,
            Err(err) => {
                tracing::warn!(
                    execution_id = %result.execution_id,
                    %err,
                    "invalid task result set aside"
                );
                self.metrics.set_aside("invalid");
                // Set aside alone, the attempt would run on until a deadline, if it has one.
                match failed_by_invalid_result(&result, now, &err) {
                    Some(failed) => failed,
                    None => return Fed::Done(None),
                }
            }
        };
        let Some(live) = self.executions.get_mut(&id) else {
            if self.waiting_for(id) {
                return Fed::Later;
            }
            if !self.owned.contains(&self.shard_of(id)) {
                // Its shard was lost (this turn, or the consumer has not stopped yet): the
                // result is for the shard's owner.
                return Fed::Later;
            }
            if self.attention.contains_key(&id) {
                return Fed::Held;
            }
            if !self.missing.contains(&id) {
                // An execution of this shard that is not in memory: started by a former owner
                // after this coordinator read the index, or finished before a restart. Its log
                // decides; the result waits for it.
                self.loading.insert(id, Vec::new());
                self.pending.load.push(id);
                self.loads_for_results.insert(id);
                return Fed::Later;
            }
            tracing::warn!(%id, "task result for an unknown execution set aside");
            self.metrics.set_aside("unknown_execution");
            return Fed::Done(None);
        };
        let lost = matches!(
            &result.outcome,
            Some(v1::task_result::Outcome::Failed(failed)) if failed.lost_deliveries > 0
        );
        let labels = lost
            .then(|| {
                let instance = result.task_instance_id.parse::<TaskInstanceId>().ok()?;
                let assignment = live.machine.assignment(instance)?;
                Some(metrics::task_labels(assignment.queue, assignment.task_type))
            })
            .flatten();
        // The result also says which worker took the attempt, and when: recorded first, once
        // (a heartbeat may have told already). Refused or stale, it is simply not recorded.
        let started = worker::started_from_result(&result, now).is_some_and(|started| {
            matches!(
                live.record(id, started, &self.metrics),
                Ok(Applied::Changed { .. })
            )
        });
        if started {
            self.mark(id);
        }
        // Its `validate:` checks, recorded before the outcome they led to (once: a redelivered
        // result brings the same checks, a duplicate).
        let validated = worker::validated_from_result(&result, now).is_some_and(|validated| {
            self.executions.get_mut(&id).is_some_and(|live| {
                matches!(
                    live.record(id, validated, &self.metrics),
                    Ok(Applied::Changed { .. })
                )
            })
        });
        if validated {
            self.mark(id);
        }
        let Some(live) = self.executions.get_mut(&id) else {
            return Fed::Done(Some(id));
        };
        match live.record(id, event, &self.metrics) {
            Ok(Applied::Changed { .. }) => {
                if let Some(labels) = labels {
                    // Its workers died with it, delivery after delivery (a poison task).
                    self.metrics.lost.get_or_create(&labels).inc();
                }
                self.mark(id)
            }
            Ok(Applied::Ignored(reason)) => {
                tracing::debug!(%id, ?reason, "duplicate task result ignored");
            }
            Err(ApplyError::UnknownInstance(instance))
            | Err(ApplyError::AttemptNotDispatched { instance, .. })
                if !self.rechecked.contains(&(id, instance, result.attempt)) =>
            {
                return Fed::Doubtful((id, instance, result.attempt));
            }
            Err(err) => {
                tracing::warn!(%id, %err, "task result refused; its attempt fails");
                let failed = failed_by_invalid_result(&result, now, &err);
                if let Some((_, failed)) = failed
                    && let Ok(Applied::Changed { .. }) = live.record(id, failed, &self.metrics)
                {
                    self.mark(id);
                }
            }
        }
        Fed::Done(Some(id))
    }
}

/// The event that fails the attempt a refused result names: a worker that breaks the contract
/// (an output that is not JSON, a group the state machine refuses, ...) ends its attempt, not
/// retryable, with the reason, instead of leaving it running. `None` when the result does not
/// name an attempt.
fn failed_by_invalid_result(
    result: &v1::TaskResult,
    now: u64,
    why: &dyn std::fmt::Display,
) -> Option<(ExecutionId, Event)> {
    let id = result.execution_id.parse().ok()?;
    let instance = result.task_instance_id.parse().ok()?;
    let body = EventBody::TaskFailed {
        instance,
        attempt: result.attempt,
        error: format!("the worker sent a result the coordinator refuses: {why}"),
        retryable: false,
        usage: Usage::default(),
    };
    Some((id, Event { at_ms: now, body }))
}

/// Turns a result whose payload is over `max_bytes` (a completed output, a step's state, a
/// spawned subtask's input) into a failure of the attempt that is not retried, since the same
/// work would produce the same payload. Returns why, when it did.
fn enforce_payload_limit(result: &mut v1::TaskResult, max_bytes: usize) -> Option<String> {
    use v1::task_result::Outcome;
    let over = match result.outcome.as_ref()? {
        Outcome::Completed(completed) => {
            (completed.output.len() > max_bytes).then_some(("output", completed.output.len()))
        }
        Outcome::StepCheckpoint(step) => (step.merged_state.len() > max_bytes)
            .then_some(("the state of step", step.merged_state.len())),
        Outcome::Spawned(spawned) => spawned
            .group
            .as_ref()
            .and_then(|group| group.members.iter().map(|m| m.input.len()).max())
            .filter(|largest| *largest > max_bytes)
            .map(|largest| ("a subtask's input", largest)),
        _ => None,
    };
    let (what, size) = over?;
    let why = format!(
        "{what} is {size} bytes, over the deployment's limit of {max_bytes} bytes \
         (limits.max_payload_bytes of the access file)"
    );
    result.outcome = Some(Outcome::Failed(v1::task_result::Failed {
        error: why.clone(),
        retryable: false,
        lost_deliveries: 0,
    }));
    Some(why)
}
