//! The worker registry, built from heartbeats (core NATS, held in memory, never a database write
//! each), with missed-heartbeat detection.

use std::collections::BTreeMap;

use trellis_proto::v1;
use trellis_wire::worker;

use crate::metrics::Metrics;

/// A worker is declared terminated after this many missed heartbeats.
pub(super) const MISSED_BEFORE_TERMINATED: u32 = 3;
/// A worker silent this long leaves the registry: `ListWorkers` no longer shows it, even with
/// `include_terminated`.
pub(super) const FORGET_AFTER_MS: u64 = 10 * 60 * 1000;
/// Most assignments in one task message: enough that a synced write and its removal are shared
/// by a whole turn's dispatches of a large execution (its dispatch window's default is 128),
/// few enough that a batch is a small part of a large worker's slots.
pub const MAX_ASSIGNMENT_BATCH: usize = 128;

/// Workers of fewer slots than this get each assignment alone: an agent that runs one long task
/// at a time should not hold several it cannot start.
const MIN_SLOTS_FOR_BATCHES: usize = 8;

#[derive(Debug)]
struct Entry {
    last: v1::WorkerHeartbeat,
    first_seen_ms: u64,
    last_seen_ms: u64,
    /// Missed heartbeats since the last one, already counted in the metric.
    missed_counted: u32,
}

impl Entry {
    /// Whole heartbeat intervals since its last heartbeat, at `now`.
    fn missed(&self, now: u64) -> u32 {
        u32::try_from(now.saturating_sub(self.last_seen_ms) / interval_ms()).unwrap_or(u32::MAX)
    }

    /// Whether it consumes `queue`.
    fn serves(&self, queue: &str) -> bool {
        self.last.queues.iter().any(|q| q == queue)
    }
}

/// The workers seen, by id.
#[derive(Debug, Default)]
pub(super) struct Registry {
    workers: BTreeMap<String, Entry>,
    last_sweep_ms: u64,
}

impl Registry {
    /// Decodes one heartbeat; an invalid one is logged and `None`.
    pub(super) fn decode(payload: &[u8]) -> Option<v1::WorkerHeartbeat> {
        worker::decode_heartbeat(payload)
            .inspect_err(|err| tracing::warn!(%err, "invalid heartbeat ignored"))
            .ok()
    }

    /// Takes one heartbeat.
    pub(super) fn heartbeat(&mut self, heartbeat: v1::WorkerHeartbeat, now: u64) {
        let entry = self
            .workers
            .entry(heartbeat.worker_id.clone())
            .or_insert_with(|| Entry {
                last: heartbeat.clone(),
                first_seen_ms: now,
                last_seen_ms: now,
                missed_counted: 0,
            });
        entry.last = heartbeat;
        entry.last_seen_ms = now;
        entry.missed_counted = 0;
    }

    /// Once per heartbeat interval, counts the intervals each worker missed since the last sweep
    /// (up to the point it is declared terminated, so a worker that is gone for good stops
    /// counting) and how many are alive.
    pub(super) fn sweep(&mut self, now: u64, metrics: &Metrics) {
        let interval_ms = interval_ms();
        if now < self.last_sweep_ms + interval_ms {
            return;
        }
        self.last_sweep_ms = now;
        self.workers
            .retain(|_, entry| now < entry.last_seen_ms + FORGET_AFTER_MS);
        let mut alive = 0;
        for entry in self.workers.values_mut() {
            let terminated = entry.last.state == v1::WorkerState::Terminated as i32;
            // Half an interval of grace: a heartbeat a few milliseconds late is not a missed one.
            let late = now.saturating_sub(entry.last_seen_ms + interval_ms / 2);
            let missed = ((late / interval_ms) as u32).min(MISSED_BEFORE_TERMINATED);
            if !terminated && missed > entry.missed_counted {
                metrics
                    .missed_heartbeats
                    .inc_by(u64::from(missed - entry.missed_counted));
                entry.missed_counted = missed;
            }
            if !terminated && missed < MISSED_BEFORE_TERMINATED {
                alive += 1;
            }
        }
        metrics.workers_alive.set(alive);
    }

    /// Returns how many assignments of `queue` may share one message: half the slots of the
    /// live worker of the queue with the fewest, at most [`MAX_ASSIGNMENT_BATCH`], so one batch
    /// never fills a worker and the rest of a turn's batches go to others; 1 (each alone) while
    /// no live worker of the queue has sent a heartbeat. A worker of fewer than
    /// [`MIN_SLOTS_FOR_BATCHES`] slots (an agent running one long task at a time) gets every task
    /// alone, as before batching.
    pub(super) fn batch_limit(&self, queue: &str, now: u64) -> usize {
        self.workers
            .values()
            .filter(|e| {
                e.last.state != v1::WorkerState::Terminated as i32
                    && e.missed(now) < MISSED_BEFORE_TERMINATED
                    && e.serves(queue)
            })
            .map(
                |e| match usize::try_from(e.last.slots).unwrap_or(usize::MAX) {
                    slots if slots < MIN_SLOTS_FOR_BATCHES => 1,
                    slots => slots / 2,
                },
            )
            .min()
            .unwrap_or(1)
            .clamp(1, MAX_ASSIGNMENT_BATCH)
    }

    /// Returns the workers with their state as seen at `now`.
    pub(super) fn list(
        &self,
        now: u64,
        queue: &str,
        include_terminated: bool,
    ) -> Vec<v1::WorkerInfo> {
        self.workers
            .iter()
            .filter(|(_, e)| queue.is_empty() || e.serves(queue))
            .map(|(id, e)| {
                let missed = e.missed(now);
                let state = if missed >= MISSED_BEFORE_TERMINATED {
                    v1::WorkerState::Terminated
                } else if e.last.running.is_empty() {
                    v1::WorkerState::Idle
                } else {
                    v1::WorkerState::Running
                };
                v1::WorkerInfo {
                    worker_id: id.clone(),
                    state: state as i32,
                    last_heartbeat: Some(e.last.clone()),
                    first_seen_at_unix_ms: e.first_seen_ms as i64,
                    missed_heartbeats: missed,
                    tasks_completed: e.last.tasks_completed,
                    tasks_failed: e.last.tasks_failed,
                }
            })
            .filter(|w| include_terminated || w.state != v1::WorkerState::Terminated as i32)
            .collect()
    }
}

fn interval_ms() -> u64 {
    (trellis_bus::HEARTBEAT_INTERVAL.as_millis() as u64).max(1)
}
