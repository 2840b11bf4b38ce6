//! The loops beside the fetch loops: heartbeats (with `AckProgress` for the running attempts),
//! log flushes and cancels.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt as _;
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use trellis_bus::HEARTBEAT_INTERVAL;
use trellis_proto::subjects;
use trellis_proto::v1;

use super::Worker;
use crate::Config;
use crate::intake::cancel_request;
use crate::logs;
use crate::publish::now_unix_ms;
use crate::sdk::{Running, lock};
use crate::sysinfo::{self, CpuMeter};

impl Worker {
    /// Builds this worker's heartbeat and extends the running task messages.
    pub(super) async fn beat(&self, config: &Config, cpu: &mut CpuMeter, state: v1::WorkerState) {
        let running: Vec<Arc<Running>> = lock(&self.running).values().cloned().collect();
        for entry in &running {
            if let Some(subject) = &entry.progress_subject {
                let _ = self
                    .client
                    .publish(subject.clone(), bytes::Bytes::from_static(b"+WPI"))
                    .await;
            }
        }
        let state = if state == v1::WorkerState::Idle && self.draining.load(Ordering::Acquire) {
            v1::WorkerState::Draining
        } else if state == v1::WorkerState::Idle && !running.is_empty() {
            v1::WorkerState::Running
        } else {
            state
        };
        let heartbeat = v1::WorkerHeartbeat {
            worker_id: self.worker_id.clone(),
            host: sysinfo::host_name(),
            queues: config.queues.clone(),
            slots: u32::try_from(config.slots).unwrap_or(u32::MAX),
            running: running
                .iter()
                .map(|entry| v1::RunningTask {
                    execution_id: entry.execution_id.clone(),
                    task_instance_id: entry.task_instance_id.clone(),
                    attempt: entry.attempt,
                    progress_percent: entry.progress_percent.load(Ordering::Relaxed),
                    current_step: lock(&entry.current_step).clone(),
                    started_at_unix_ms: entry.started_at_unix_ms,
                    task_id: entry.task_id.clone(),
                })
                .collect(),
            memory_bytes: sysinfo::resident_memory_bytes(),
            cpu_percent: cpu.percent(),
            sent_at_unix_ms: now_unix_ms(),
            interval_ms: u64::try_from(HEARTBEAT_INTERVAL.as_millis()).unwrap_or(u64::MAX),
            state: state as i32,
            tasks_completed: self.completed.load(Ordering::Relaxed),
            tasks_failed: self.failed.load(Ordering::Relaxed),
        };
        match self
            .client
            .publish(
                subjects::heartbeat(&self.worker_id),
                heartbeat.encode_to_vec().into(),
            )
            .await
        {
            Ok(()) => {
                self.metrics.heartbeats.inc();
            }
            Err(error) => tracing::warn!(%error, "failed to publish a heartbeat"),
        }
    }
}

/// Heartbeats every [`HEARTBEAT_INTERVAL`] (and `AckProgress` for running tasks) until `stop`,
/// then sends a last heartbeat saying the worker terminated.
pub(super) async fn heartbeat_loop(worker: Arc<Worker>, config: Config, stop: CancellationToken) {
    let mut cpu = CpuMeter::new();
    let mut interval = tokio::time::interval(HEARTBEAT_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = worker.abandon.cancelled() => return,
            _ = stop.cancelled() => break,
            _ = interval.tick() => worker.beat(&config, &mut cpu, v1::WorkerState::Idle).await,
        }
    }
    worker
        .beat(&config, &mut cpu, v1::WorkerState::Terminated)
        .await;
}

/// Publishes the running attempts' log lines every [`logs::FLUSH_EVERY`] until `stop`.
pub(super) async fn log_loop(worker: Arc<Worker>, stop: CancellationToken) {
    let mut interval = tokio::time::interval(logs::FLUSH_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = worker.abandon.cancelled() => return,
            _ = stop.cancelled() => return,
            _ = interval.tick() => {
                let running: Vec<Arc<Running>> = lock(&worker.running).values().cloned().collect();
                for attempt in running {
                    worker.logs.flush(&attempt, false).await;
                }
            }
        }
    }
}

/// Cancels running attempts named by `CancelTask` messages.
pub(super) async fn cancel_loop(
    worker: Arc<Worker>,
    mut cancel_sub: async_nats::Subscriber,
    stop: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = worker.abandon.cancelled() => return,
            _ = stop.cancelled() => return,
            message = cancel_sub.next() => message,
        };
        let Some(message) = message else { return };
        let request = match cancel_request(&message.subject, message.payload.as_ref()) {
            Ok(request) => request,
            Err(error) => {
                tracing::warn!(subject = %message.subject, %error, "ignored a cancel message");
                continue;
            }
        };
        let Some(running) = lock(&worker.running)
            .get(&request.task_instance_id)
            .cloned()
        else {
            continue;
        };
        if request.attempt != running.attempt {
            continue;
        }
        if request.preempt {
            tracing::info!(task_instance_id = %request.task_instance_id, attempt = running.attempt, reason = %request.reason, "preempting task at its next step");
            running.preempt.store(true, Ordering::Release);
            continue;
        }
        tracing::info!(task_instance_id = %request.task_instance_id, attempt = running.attempt, reason = %request.reason, "cancelling task");
        *lock(&running.cancel_reason) = request.reason;
        running.cancel.cancel();
    }
}
