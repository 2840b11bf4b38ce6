//! The worker registry: built from heartbeats (core NATS, held in memory, never a database write
//! each), with missed-heartbeat detection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use trellis_proto::{subjects, v1};
use trellis_wire::worker;

use crate::engine::now_ms;

/// A worker is declared terminated after this many missed heartbeats.
const MISSED_BEFORE_TERMINATED: u32 = 3;

#[derive(Debug)]
struct Entry {
    last: v1::WorkerHeartbeat,
    first_seen_ms: u64,
    last_seen_ms: u64,
    /// Missed heartbeats since the last one, already counted in the metric.
    missed_counted: u32,
}

/// Shared view of the workers.
#[derive(Clone, Debug, Default)]
pub(crate) struct Registry {
    inner: Arc<Mutex<HashMap<String, Entry>>>,
}

impl Registry {
    /// Subscribes to heartbeats and keeps the registry up to date until `shutdown`.
    pub(crate) async fn start(
        nats: &async_nats::Client,
        metrics: crate::metrics::Metrics,
        shutdown: CancellationToken,
    ) -> Result<Self, crate::Error> {
        let mut subscription = nats
            .subscribe(subjects::HEARTBEAT_WILDCARD)
            .await
            .map_err(|e| crate::Error::Subscribe {
                subject: subjects::HEARTBEAT_WILDCARD.to_owned(),
                message: e.to_string(),
            })?;
        let registry = Self::default();
        let inner = Arc::clone(&registry.inner);
        let interval = trellis_bus::HEARTBEAT_INTERVAL;
        let mut sweep = tokio::time::interval(interval);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = sweep.tick() => {
                        count_missed(&inner, &metrics, now_ms(), interval.as_millis() as u64);
                        continue;
                    }
                    message = subscription.next() => message,
                };
                let Some(message) = message else { return };
                let heartbeat = match worker::decode_heartbeat(&message.payload) {
                    Ok(heartbeat) => heartbeat,
                    Err(err) => {
                        tracing::warn!(subject = %message.subject, %err, "invalid heartbeat ignored");
                        continue;
                    }
                };
                let now = now_ms();
                // A poisoned lock only means another thread panicked mid-update; the map is
                // still usable.
                let mut workers = inner
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let entry = workers
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
        });
        Ok(registry)
    }
}

/// Counts the heartbeat intervals each worker missed since the last sweep (up to the point it is
/// declared terminated, so a worker that is gone for good stops counting) and how many are alive.
fn count_missed(
    inner: &Mutex<HashMap<String, Entry>>,
    metrics: &crate::metrics::Metrics,
    now: u64,
    interval_ms: u64,
) {
    let mut workers = inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut alive = 0;
    for entry in workers.values_mut() {
        let terminated = entry.last.state == v1::WorkerState::Terminated as i32;
        // Half an interval of grace: a heartbeat a few milliseconds late is not a missed one.
        let late = now.saturating_sub(entry.last_seen_ms + interval_ms / 2);
        let missed = ((late / interval_ms.max(1)) as u32).min(MISSED_BEFORE_TERMINATED);
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

impl Registry {
    /// Returns the workers with their state as seen now.
    pub(crate) fn list(&self, queue: &str, include_terminated: bool) -> Vec<v1::WorkerInfo> {
        let now = now_ms();
        let interval = trellis_bus::HEARTBEAT_INTERVAL.as_millis() as u64;
        let workers = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut list: Vec<v1::WorkerInfo> = workers
            .iter()
            .filter(|(_, e)| queue.is_empty() || e.last.queues.iter().any(|q| q == queue))
            .map(|(id, e)| {
                let missed = (now.saturating_sub(e.last_seen_ms) / interval.max(1)) as u32;
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
                    tasks_completed: 0,
                    tasks_failed: 0,
                }
            })
            .filter(|w| include_terminated || w.state != v1::WorkerState::Terminated as i32)
            .collect();
        list.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        list
    }
}
