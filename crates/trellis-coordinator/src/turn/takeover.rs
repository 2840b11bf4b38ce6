//! What a coordinator that takes an execution over does with the attempts its former owner left
//! running.
//!
//! The log says which attempts are running, not whether a worker runs them: the assignment may
//! be on a worker, waiting in its queue, or never sent (the former owner died between its append
//! and its publish). Sending every one again, as a restart once did, runs a long task twice: the
//! queue's de-duplication window (two minutes) is all that stops the copy. Instead:
//!
//! 1. The new owner's epoch is the log sequence of its `ExecutionClaimed`; every assignment it
//!    sends carries it (`TaskAssignment.fence`), and once the claim is stored the epoch is written
//!    to the bucket `trellis_fences`. A worker refuses an assignment whose fence is below its
//!    execution's entry, so nothing a former owner sent starts from then on.
//! 2. Each running attempt is *inherited*: left alone while a worker's heartbeat names it (the
//!    worker started it before the fence), and lost once no heartbeat has named it for
//!    [`LAPSE_MS`] — its worker died, or it was never taken (and is refused when it is). A lost
//!    attempt is recorded as `TaskLost` (no retry used), its cancel sent in case a cut-off worker
//!    still runs it, and the instance dispatched again as the next attempt under the new epoch.
//!
//! 3. Nothing is dispatched under the new epoch until the fence is stored, inherited attempts or
//!    not: the message of an attempt that finished but was not acknowledged by its worker is
//!    delivered again, and once the fence is stored no worker starts it beside a retry.
//!
//! An attempt this owner sent through the queue needs none of this: JetStream hands its message
//! to another worker when the one running it dies. One it offered to a worker directly
//! (`Assign::offer`) has no message, so it is watched the same way from its dispatch, without
//! waiting for a fence (no former owner's copy can start), until a heartbeat names it in time,
//! it ends, or the offer was refused and the queue took it (`Input::OfferRefused`).

use trellis_core::ids::{ExecutionId, TaskInstanceId};
use trellis_core::machine::{Applied, Event, EventBody};
use trellis_core::record::TaskState;
use trellis_proto::v1;
use trellis_wire::worker;

use super::Coordinator;
use super::live::Live;

/// An inherited attempt no worker's heartbeat has named for this long is lost: three heartbeat
/// intervals, the silence after which a worker counts as gone.
pub(super) const LAPSE_MS: u64 = super::workers::MISSED_BEFORE_TERMINATED as u64
    * trellis_bus::HEARTBEAT_INTERVAL.as_millis() as u64;

/// An attempt a former owner dispatched, still running when this coordinator took over; or one
/// this coordinator offered to a worker directly ([`Assign::offer`](super::Assign)), which has
/// no task message to bring it back if that worker dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Inherited {
    pub(super) attempt: u32,
    /// When a heartbeat last named it (at first, when it was inherited or offered).
    pub(super) seen_ms: u64,
    /// Offered by this coordinator: lost after a lapse whether or not a fence is stored (no
    /// former owner's message can start it).
    pub(super) offered: bool,
}

impl Live {
    /// Takes over the running attempts after the claim was recorded at `self.seq`: that sequence
    /// becomes the epoch, and every running attempt is inherited. Returns whether any is.
    pub(super) fn inherit_running(&mut self, now: u64) -> bool {
        self.epoch = self.seq;
        self.inherited = self
            .machine
            .instances_in(TaskState::Running)
            .filter_map(|instance| {
                let attempt = self.machine.attempt(instance)?;
                Some((
                    instance,
                    Inherited {
                        attempt,
                        seen_ms: now,
                        offered: false,
                    },
                ))
            })
            .collect();
        // Always fenced, inherited attempts or not: a finished attempt's message that its worker
        // had not acknowledged is delivered again, and must not run beside this owner's retry.
        self.fence_due = true;
        self.fenced = false;
        !self.inherited.is_empty()
    }

    /// Watches an attempt offered to a worker directly until it ends, a heartbeat names it in
    /// time, or it goes to the stream ([`Input::OfferRefused`](super::Input)).
    pub(super) fn watch_offered(&mut self, instance: TaskInstanceId, attempt: u32, now: u64) {
        self.inherited.insert(
            instance,
            Inherited {
                attempt,
                seen_ms: now,
                offered: true,
            },
        );
    }

    /// Records as lost the inherited attempts no heartbeat named for [`LAPSE_MS`] and forgets the
    /// ones that ended; returns how many were lost.
    fn lapse(&mut self, id: ExecutionId, now: u64, metrics: &crate::metrics::Metrics) -> usize {
        let machine = &self.machine;
        self.inherited.retain(|instance, inherited| {
            machine.instance_state(*instance) == Some(TaskState::Running)
                && machine.attempt(*instance) == Some(inherited.attempt)
        });
        // Until the fence is stored a worker may still start what a former owner sent; an
        // attempt this coordinator offered waits for no fence.
        let fenced = self.fenced;
        let mut lapsed: Vec<(TaskInstanceId, u32, bool)> = self
            .inherited
            .iter()
            .filter(|(_, inherited)| {
                now >= inherited.seen_ms + LAPSE_MS && (fenced || inherited.offered)
            })
            .map(|(instance, inherited)| (*instance, inherited.attempt, inherited.offered))
            .collect();
        lapsed.sort_unstable();
        for (instance, attempt, offered) in &lapsed {
            self.inherited.remove(instance);
            let lost = Event {
                at_ms: now,
                body: EventBody::TaskLost {
                    instance: *instance,
                    attempt: *attempt,
                },
            };
            if let Err(err) = self.record(id, lost, metrics) {
                tracing::error!(%id, %instance, %err, "task_lost refused by the state machine");
                continue;
            }
            let why = if *offered {
                "no worker ran it after it was offered"
            } else {
                "no worker ran it after the coordinator took over"
            };
            tracing::warn!(%id, %instance, attempt, why, "attempt lost; dispatching it again");
            self.abort.push((*instance, *attempt, why.to_owned()));
        }
        lapsed.len()
    }
}

impl Coordinator {
    /// An offer no worker took went to the stream: JetStream brings the attempt back if its
    /// worker dies, so the watch ends.
    pub(super) fn offer_refused(
        &mut self,
        id: ExecutionId,
        instance: TaskInstanceId,
        attempt: u32,
    ) {
        if let Some(live) = self.executions.get_mut(&id)
            && live
                .inherited
                .get(&instance)
                .is_some_and(|watched| watched.offered && watched.attempt == attempt)
        {
            live.inherited.remove(&instance);
        }
    }

    /// A heartbeat names the attempts its worker runs: each of this coordinator's that has not
    /// recorded its start yet records it now (`TaskStarted`, with the worker's start time), and
    /// inherited ones among them stay.
    pub(super) fn heard(&mut self, heartbeat: &v1::WorkerHeartbeat, now: u64) {
        for running in &heartbeat.running {
            let Some((id, started)) =
                worker::started_from_heartbeat(&heartbeat.worker_id, running, now)
            else {
                continue;
            };
            let Some(live) = self.executions.get_mut(&id) else {
                continue;
            };
            if let Ok(Applied::Changed { .. }) = live.record(id, started, &self.metrics) {
                self.mark(id);
            }
        }
        if self.inheriting.is_empty() {
            return;
        }
        for running in &heartbeat.running {
            let (Ok(id), Ok(instance)) = (
                running.execution_id.parse::<ExecutionId>(),
                running.task_instance_id.parse::<TaskInstanceId>(),
            ) else {
                continue;
            };
            if let Some(inherited) = self
                .executions
                .get_mut(&id)
                .and_then(|live| live.inherited.get_mut(&instance))
                && inherited.attempt == running.attempt
            {
                inherited.seen_ms = now;
            }
        }
    }

    /// The fences bucket holds `epoch` for `id`: from now on no worker starts an assignment of
    /// a former owner, so an inherited attempt no heartbeat names within [`LAPSE_MS`] is lost.
    pub(super) fn fenced(&mut self, id: ExecutionId, epoch: u64, now: u64) {
        let Some(live) = self.executions.get_mut(&id) else {
            return;
        };
        if live.epoch != epoch {
            return;
        }
        live.fenced = true;
        // A worker may have started one just before it learnt of the fence: its heartbeat has a
        // full lapse to name it.
        for inherited in live.inherited.values_mut() {
            inherited.seen_ms = inherited.seen_ms.max(now);
        }
        // Dispatches waited for the fence (`Live::decide`).
        self.mark(id);
    }

    /// On a tick: inherited attempts no heartbeat names any more are lost and dispatched again.
    pub(super) fn lapse_inherited(&mut self, now: u64) {
        let mut done = Vec::new();
        for id in &self.inheriting {
            let Some(live) = self.executions.get_mut(id) else {
                done.push(*id);
                continue;
            };
            if live.lapse(*id, now, &self.metrics) > 0 && !live.dirty {
                live.dirty = true;
                self.dirty.push(*id);
            }
            if live.inherited.is_empty() {
                done.push(*id);
            }
        }
        for id in done {
            self.inheriting.remove(&id);
        }
    }
}
