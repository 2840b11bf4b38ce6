//! The end of a turn: the touched executions' new events become log appends, and once the
//! appends' outcomes are known, the side effects they allow.

use std::collections::BTreeSet;

use bytes::Bytes;
use prost::Message as _;
use trellis_core::ids::ExecutionId;
use trellis_proto::{subjects, v1};
use trellis_wire::worker;

use super::batching;
use super::contract::FAST_LANE_SHARE;
use super::shards::index_key;
use super::{
    Ack, Answer, Append, Appended, Assign, Coordinator, Effects, Error, Observed, Publish, ReplyTo,
    Writes,
};
use crate::metrics;

/// Most events in one log message.
const EVENTS_PER_MESSAGE: usize = 2048;
/// Most attempts remembered as looked up again (see `results.rs`).
const MAX_RECHECKED: usize = 10_000;
/// Progress snapshots are published at most this often per execution.
const PROGRESS_EVERY_MS: u64 = 100;

impl Coordinator {
    /// Returns the turn's writes: what was answered so far and the appends of the touched
    /// executions' new events.
    pub(super) fn writes(&mut self) -> Writes {
        let mut writes = std::mem::take(&mut self.pending.writes);
        for id in &self.dirty {
            let Some(live) = self.executions.get_mut(id) else {
                continue;
            };
            if live.pending.is_empty() {
                continue;
            }
            let messages: Vec<(u64, Bytes)> = live
                .pending
                .chunks(EVENTS_PER_MESSAGE)
                .map(|chunk| {
                    let batch = v1::EventBatch {
                        events: chunk.to_vec(),
                    };
                    (chunk[0].sequence, Bytes::from(batch.encode_to_vec()))
                })
                .collect();
            live.appending.clone_from(&messages);
            writes.appends.push(Append {
                id: *id,
                index_put: live.index_put.then(|| index_key(live.shard, *id)),
                expected_stream_seq: live.stream_seq,
                messages,
                trace: live.trace.clone(),
            });
        }
        writes
    }

    /// Takes the appends' outcomes and returns the side effects they allow, the acks and the
    /// answers, with the executions whose side effects were worked out (the turn's touched ones).
    pub(super) fn side_effects(
        &mut self,
        outcomes: Vec<(ExecutionId, Appended)>,
        now: u64,
    ) -> (Effects, Vec<ExecutionId>) {
        let mut effects = Effects::default();
        // Executions dropped this turn (a lost shard) did not store what they were given either.
        let mut refused = std::mem::take(&mut self.refused);
        let mut n_events = 0u64;
        let mut stored = BTreeSet::new();
        for (id, outcome) in outcomes {
            match outcome {
                Appended::Stored { stream_seq } => {
                    stored.insert(id);
                    if let Some(live) = self.executions.get_mut(&id) {
                        live.stream_seq = stream_seq;
                        n_events += live.pending.len() as u64;
                        live.log.append(&mut live.appending);
                        if live.index_put {
                            live.index_put = false;
                            live.indexed = true;
                        }
                    }
                }
                Appended::Fenced { why } => {
                    tracing::warn!(%id, %why, "another coordinator wrote this log; reloading it");
                    self.metrics.appends_refused.inc();
                    refused.insert(id);
                    if let Some(live) = self.executions.remove(&id) {
                        self.by_key.retain(|_, v| *v != id);
                        effects.forget.push(id);
                        if self.owned.contains(&live.shard) {
                            self.loading.entry(id).or_default();
                            effects.load.push(id);
                        }
                        self.retire(live);
                    }
                }
                Appended::Stopped => {
                    refused.insert(id);
                    self.unload(id);
                }
            }
        }
        if n_events > 0 {
            self.metrics.events_appended.inc_by(n_events);
        }
        // An append without an outcome is one the executor never carried out: nothing it caused
        // may happen, as for a refused one.
        let unanswered: Vec<ExecutionId> = self
            .dirty
            .iter()
            .copied()
            .filter(|id| {
                self.executions
                    .get(id)
                    .is_some_and(|live| !live.appending.is_empty())
            })
            .collect();
        for id in unanswered {
            tracing::error!(%id, "an append was not carried out; the execution is reloaded");
            refused.insert(id);
            self.unload(id);
            effects.forget.push(id);
            self.loading.entry(id).or_default();
            effects.load.push(id);
        }
        let mut dispatched = Vec::new();
        let touched = std::mem::take(&mut self.dirty);
        for &id in &touched {
            self.effects_of(id, now, &mut effects, &mut dispatched);
        }
        // `messages` asks once per lane for its queue's limit.
        effects.assignments =
            batching::messages(dispatched, |queue| self.workers.batch_limit(queue, now));
        for (token, id) in std::mem::take(&mut self.pending.acks) {
            // Results of an execution whose append was refused are not acknowledged: they come
            // back to whoever owns the execution now.
            let ack = if id.is_some_and(|id| refused.contains(&id)) {
                Ack::Later
            } else {
                Ack::Ack
            };
            effects.acks.push((token, ack));
        }
        effects.acks.extend(
            std::mem::take(&mut self.pending.later)
                .into_iter()
                .map(|token| (token, Ack::Later)),
        );
        effects.acks.extend(
            std::mem::take(&mut self.pending.held)
                .into_iter()
                .map(|token| (token, Ack::Hold)),
        );
        for (token, key) in std::mem::take(&mut self.pending.doubtful) {
            let id = key.0;
            let ack = if stored.contains(&id) {
                // The append followed the log's last message: the state is current, and the
                // attempt unknown to it as well.
                tracing::warn!(%id, instance = %key.1, attempt = key.2, "task result for an unknown attempt set aside");
                self.metrics.set_aside("unknown_attempt");
                Ack::Ack
            } else {
                if !refused.contains(&id) && self.executions.contains_key(&id) {
                    tracing::info!(%id, "a result names an attempt this state does not know; reloading");
                    self.unload(id);
                    effects.forget.push(id);
                    self.loading.entry(id).or_default();
                    effects.load.push(id);
                }
                if self.rechecked.len() >= MAX_RECHECKED {
                    self.rechecked.clear();
                }
                self.rechecked.insert(key);
                Ack::Later
            };
            effects.acks.push((token, ack));
        }
        effects.load.append(&mut self.pending.load);
        effects.consume.append(&mut self.pending.consume);
        self.refused = refused;
        (effects, touched)
    }

    /// Adds the side effects of one touched execution whose events are stored.
    fn effects_of(
        &mut self,
        id: ExecutionId,
        now: u64,
        effects: &mut Effects,
        dispatched: &mut Vec<Assign>,
    ) {
        let Some(live) = self.executions.get_mut(&id) else {
            return;
        };
        live.dirty = false;
        let run_number = live.machine.run_number();
        // The execution's tasks in flight, this turn's dispatches among them: while they are
        // at most FAST_LANE_SHARE, this turn's ride the fast lane.
        let fast = live.machine.running() <= FAST_LANE_SHARE;
        let mut offered = Vec::new();
        for instance in live.dispatch.drain(..) {
            let Some(assignment) = live.machine.assignment(instance) else {
                continue;
            };
            let mut message = worker::assignment_to_proto(id, run_number, &assignment);
            message.results_shard = Some(live.shard);
            message.fence = live.epoch;
            self.metrics
                .dispatched
                .get_or_create(&metrics::task_labels(
                    assignment.queue,
                    assignment.task_type,
                ))
                .inc();
            // An assignment that avoids a worker goes through the queue, where that worker
            // hands it back; an offer cannot say which worker takes it. One following an attempt
            // lost with its worker goes there too: a task that kills its workers is brought back
            // by JetStream, whose delivery count bounds it, not offered again after each loss.
            let offer = self.config.offers
                && fast
                && assignment.avoid_worker.is_none()
                && assignment.lost_deliveries == 0;
            if offer {
                offered.push((instance, assignment.attempt));
            }
            dispatched.push(Assign {
                queue: assignment.queue.to_owned(),
                fast,
                offer,
                alone: assignment.avoid_worker.is_some(),
                msg_id: subjects::task_msg_id(instance, assignment.attempt),
                payload: Bytes::from(message.encode_to_vec()),
                trace: live.trace.clone(),
                execution: id,
                instance,
                attempt: assignment.attempt,
            });
        }
        if !offered.is_empty() {
            for (instance, attempt) in offered {
                live.watch_offered(instance, attempt, now);
            }
            self.inheriting.insert(id);
        }
        let reason = live.machine.reason().unwrap_or("cancelled");
        let stops = live
            .stop
            .drain(..)
            .map(|(instance, attempt)| (instance, attempt, reason.to_owned(), false));
        let preempts = live
            .preempt
            .drain(..)
            .map(|(instance, attempt, reason)| (instance, attempt, reason, true));
        let aborts = live
            .abort
            .drain(..)
            .map(|(instance, attempt, reason)| (instance, attempt, reason, false));
        for (instance, attempt, reason, preempt) in stops.chain(preempts).chain(aborts) {
            let message = v1::CancelTask {
                execution_id: id.to_string(),
                task_instance_id: instance.to_string(),
                attempt,
                reason,
                preempt,
            };
            effects.cancels.push(Publish {
                subject: subjects::cancel(instance),
                payload: Bytes::from(message.encode_to_vec()),
            });
        }
        if std::mem::take(&mut live.fence_due) {
            effects.fences.push((id, live.epoch));
        }
        let terminal = live.machine.state().is_terminal();
        // The log holds this turn's events by now, the last ones included.
        if terminal && live.indexed {
            effects.index_deletes.push(index_key(live.shard, id));
            live.indexed = false;
            self.metrics
                .executions_finished
                .get_or_create(&[
                    ("namespace", live.namespace.to_string()),
                    ("state", live.machine.state().as_str().to_owned()),
                ])
                .inc();
        }
        live.progress_due |= !live.pending.is_empty();
        // Idle executions (woken only by the clock tick) publish nothing: a snapshot costs a pass
        // over every instance.
        let progress = (live.progress_due
            && (terminal || now >= live.last_progress_ms + PROGRESS_EVERY_MS))
            .then(|| live.progress(id, now));
        if let Some(progress) = &progress {
            live.last_progress_ms = now;
            live.progress_due = false;
            effects.progress.push(Publish {
                subject: subjects::progress(id),
                payload: Bytes::from(progress.encode_to_vec()),
            });
        }
        // The clock touches it next when its last decision may change, when a progress
        // snapshot held back may go out, or when its interval checkpoint is due; a finished one
        // only an input touches.
        let wake = if terminal {
            None
        } else {
            let progress = live
                .progress_due
                .then_some(live.last_progress_ms + PROGRESS_EVERY_MS);
            let checkpoint = (self.config.checkpoint_store && live.checkpoints_allowed)
                .then(|| {
                    live.checkpoint
                        .interval_due(live.seq, self.config.checkpoint_every_ms)
                })
                .flatten();
            [live.decided_wake, progress, checkpoint]
                .into_iter()
                .flatten()
                .min()
        };
        if wake != live.wake_ms {
            if let Some(at) = live.wake_ms {
                self.timers.remove(&(at, id));
            }
            if let Some(at) = wake {
                self.timers.insert((at, id));
            }
            live.wake_ms = wake;
        }
        let events = std::mem::take(&mut live.pending);
        if !events.is_empty() {
            effects.observed.push(Observed {
                id,
                events,
                progress,
                terminal,
            });
        }
    }

    /// Returns the answers to this turn's writes: a write to an execution whose append was
    /// refused did not happen, and says so. A followed start's observation is made here, once
    /// its events are stored and handed to observers.
    pub(super) fn write_replies(&mut self) -> Vec<(ReplyTo, Result<Answer, Error>)> {
        let refused = std::mem::take(&mut self.refused);
        let not_done = |id: ExecutionId| {
            Error::unavailable(format!(
                "execution {id} was changed by another coordinator meanwhile; \
                 nothing was done: try again"
            ))
        };
        let mut replies: Vec<_> = std::mem::take(&mut self.pending.replies)
            .into_iter()
            .map(|(reply, id, answer)| match id {
                Some(id) if refused.contains(&id) => (reply, Err(not_done(id))),
                _ => (reply, answer),
            })
            .collect();
        for (reply, id, created, follow) in std::mem::take(&mut self.pending.follows) {
            let answer = if refused.contains(&id) {
                Err(not_done(id))
            } else {
                self.observation(id, 1, follow.progress_only, self.now)
                    .map(|observation| Answer::Following {
                        id,
                        created,
                        observation,
                    })
            };
            replies.push((reply, answer));
        }
        replies
    }
}
