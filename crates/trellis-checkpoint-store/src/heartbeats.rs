//! Workers in the read model, from their heartbeats on core NATS
//! (`trellis.workers.heartbeat.<worker_id>`).
//!
//! Heartbeats arrive every couple of seconds from every worker; they are held in memory and each
//! worker's latest is written at most once per [`FLUSH_INTERVAL`], in one transaction for all
//! workers, never one database write per heartbeat.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use trellis_proto::{subjects, v1};
use trellis_wire::worker;

use crate::store::{Store, WorkerRow};

/// How often the workers' latest heartbeats are written.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(3);

/// A worker not heard from for this long is dropped from memory (its row stays).
const FORGET_AFTER: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Seen {
    row: WorkerRow,
    dirty: bool,
    last_seen: tokio::time::Instant,
}

fn worker_state(state: i32) -> &'static str {
    match v1::WorkerState::try_from(state) {
        Ok(v1::WorkerState::Spawning) => "spawning",
        Ok(v1::WorkerState::Idle) => "idle",
        Ok(v1::WorkerState::Running) => "running",
        Ok(v1::WorkerState::Draining) => "draining",
        Ok(v1::WorkerState::Terminated) => "terminated",
        Ok(v1::WorkerState::Unspecified) | Err(_) => "unspecified",
    }
}

/// The workers seen since the last write, by id.
#[derive(Debug, Default)]
pub(crate) struct Workers {
    seen: HashMap<String, Seen>,
}

impl Workers {
    /// Takes one heartbeat message; a corrupt one is ignored with a warning.
    pub(crate) fn receive(&mut self, subject: &str, payload: &[u8], now_ms: u64) {
        let heartbeat = match worker::decode_heartbeat(payload) {
            Ok(heartbeat) => heartbeat,
            Err(err) => {
                tracing::warn!(%subject, %err, "invalid heartbeat ignored");
                return;
            }
        };
        let row = WorkerRow {
            worker_id: heartbeat.worker_id.clone(),
            host: heartbeat.host.clone(),
            queues: heartbeat.queues.clone(),
            slots: heartbeat.slots,
            state: worker_state(heartbeat.state),
            running_tasks: u32::try_from(heartbeat.running.len()).unwrap_or(u32::MAX),
            memory_bytes: heartbeat.memory_bytes,
            cpu_percent: f64::from(heartbeat.cpu_percent),
            interval_ms: heartbeat.interval_ms,
            first_seen_at_ms: now_ms,
            last_heartbeat_at_ms: now_ms,
            new_heartbeats: 1,
            last_heartbeat: payload.to_vec(),
        };
        let now = tokio::time::Instant::now();
        match self.seen.get_mut(&heartbeat.worker_id) {
            Some(seen) => {
                let new_heartbeats = seen.row.new_heartbeats + 1;
                let first_seen_at_ms = seen.row.first_seen_at_ms;
                seen.row = WorkerRow {
                    new_heartbeats,
                    first_seen_at_ms,
                    ..row
                };
                seen.dirty = true;
                seen.last_seen = now;
            }
            None => {
                self.seen.insert(
                    heartbeat.worker_id,
                    Seen {
                        row,
                        dirty: true,
                        last_seen: now,
                    },
                );
            }
        }
    }

    /// Returns the workers to write: those heard from since the last successful write.
    pub(crate) fn dirty(&self) -> Vec<WorkerRow> {
        let mut rows: Vec<WorkerRow> = self
            .seen
            .values()
            .filter(|seen| seen.dirty)
            .map(|seen| seen.row.clone())
            .collect();
        rows.sort_unstable_by(|a, b| a.worker_id.cmp(&b.worker_id));
        rows
    }

    /// Marks `written` as stored, and forgets workers silent for long.
    pub(crate) fn written(&mut self, written: &[WorkerRow]) {
        for row in written {
            if let Some(seen) = self.seen.get_mut(&row.worker_id) {
                // Heartbeats that arrived during the write stay counted for the next one.
                seen.row.new_heartbeats =
                    seen.row.new_heartbeats.saturating_sub(row.new_heartbeats);
                seen.dirty = seen.row.new_heartbeats > 0;
            }
        }
        let now = tokio::time::Instant::now();
        self.seen
            .retain(|_, seen| seen.dirty || now.duration_since(seen.last_seen) < FORGET_AFTER);
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Subscribes to heartbeats and writes the workers every [`FLUSH_INTERVAL`] until `shutdown`,
/// then writes once more.
pub(crate) async fn run(
    store: Arc<dyn Store>,
    nats: async_nats::Client,
    shutdown: CancellationToken,
) {
    let mut subscription = match nats.subscribe(subjects::HEARTBEAT_WILDCARD).await {
        Ok(subscription) => subscription,
        Err(err) => {
            tracing::error!(%err, "cannot subscribe to worker heartbeats; workers are not recorded");
            return;
        }
    };
    let mut workers = Workers::default();
    let mut flush = tokio::time::interval(FLUSH_INTERVAL);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            message = subscription.next() => {
                let Some(message) = message else { break };
                workers.receive(message.subject.as_str(), &message.payload, now_ms());
            }
            _ = flush.tick() => write(&*store, &mut workers).await,
        }
    }
    write(&*store, &mut workers).await;
}

async fn write(store: &dyn Store, workers: &mut Workers) {
    let rows = workers.dirty();
    if rows.is_empty() {
        return;
    }
    match store.upsert_workers(&rows).await {
        Ok(()) => workers.written(&rows),
        Err(err) => {
            tracing::warn!(%err, workers = rows.len(), "failed to write workers; trying again later")
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    fn heartbeat(worker_id: &str, state: v1::WorkerState) -> Vec<u8> {
        v1::WorkerHeartbeat {
            worker_id: worker_id.to_owned(),
            host: "host-1".to_owned(),
            queues: vec!["shell".to_owned()],
            slots: 4,
            state: state.into(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn heartbeats_coalesce_until_written() {
        let mut workers = Workers::default();
        for at in 0..5 {
            workers.receive("s", &heartbeat("w1", v1::WorkerState::Idle), 100 + at);
        }
        workers.receive("s", &heartbeat("w2", v1::WorkerState::Running), 200);
        workers.receive("s", b"\xff\xff", 300);
        workers.receive("s", &heartbeat("", v1::WorkerState::Idle), 300);
        // A NaN CPU figure would fail the whole write (the column is NOT NULL): ignored.
        let mut not_a_number =
            v1::WorkerHeartbeat::decode(&heartbeat("w3", v1::WorkerState::Idle)[..])
                .expect("the test's heartbeat decodes");
        not_a_number.cpu_percent = f32::NAN;
        workers.receive("s", &not_a_number.encode_to_vec(), 300);
        let rows = workers.dirty();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].worker_id, "w1");
        assert_eq!(rows[0].new_heartbeats, 5);
        assert_eq!(rows[0].first_seen_at_ms, 100);
        assert_eq!(rows[0].last_heartbeat_at_ms, 104);
        assert_eq!(rows[1].state, "running");
        // One more heartbeat of w1 arrives while the write is under way.
        workers.receive("s", &heartbeat("w1", v1::WorkerState::Idle), 105);
        workers.written(&rows);
        let rows = workers.dirty();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].new_heartbeats, 1);
        assert_eq!(rows[0].first_seen_at_ms, 100);
    }
}
