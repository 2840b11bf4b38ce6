//! A worker's slots: the fetch loops reserve them, and a task of a queue's fast lane waiting for
//! one gets the next free one before the normal lanes take another.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use trellis_bus::{HEARTBEAT_INTERVAL, Lane};

use super::Worker;
use super::fetch::FETCH_BATCH;
use crate::task_ack::TaskAck;

impl Worker {
    /// Waits for one free slot and takes as many more as are free, up to [`FETCH_BATCH`]. A
    /// normal lane gives a slot back (and takes no more) while fast-lane tasks wait for one.
    pub(super) async fn reserve_slots(
        &self,
        lane: Lane,
        shutdown: &CancellationToken,
    ) -> Option<OwnedSemaphorePermit> {
        let mut permits = tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = self.abandon.cancelled() => return None,
            permit = self.acquire_slot(lane) => permit?,
        };
        let n_more = if self.yields_to_fast(lane) {
            0
        } else {
            self.slots.available_permits().min(FETCH_BATCH - 1)
        };
        if n_more > 0
            && let Ok(more) = self
                .slots
                .clone()
                .try_acquire_many_owned(u32::try_from(n_more).unwrap_or(1))
        {
            permits.merge(more);
        }
        Some(permits)
    }

    /// Waits for a free slot for an assignment already received, keeping its message ours with
    /// `AckProgress`; a fast-lane assignment counts itself in [`Worker::fast_waiting`] meanwhile.
    pub(super) async fn wait_for_slot(
        &self,
        lane: Lane,
        message: &TaskAck,
        shutdown: &CancellationToken,
    ) -> Option<OwnedSemaphorePermit> {
        /// Counts a waiting fast-lane task for as long as it lives, however its wait ends.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _waiting = (lane == Lane::Fast).then(|| {
            self.fast_waiting.fetch_add(1, Ordering::AcqRel);
            Waiting(&self.fast_waiting)
        });
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = self.abandon.cancelled() => return None,
                permit = self.acquire_slot(lane) => return permit,
                _ = tokio::time::sleep(HEARTBEAT_INTERVAL) => {
                    message.progress().await;
                }
            }
        }
    }

    /// Waits for a free slot for `lane`: a normal lane gives each slot it gets back while
    /// fast-lane tasks wait for one, and waits on. `None` once the slots are closed.
    async fn acquire_slot(&self, lane: Lane) -> Option<OwnedSemaphorePermit> {
        loop {
            let permit = self.slots.clone().acquire_owned().await.ok()?;
            if !self.yields_to_fast(lane) {
                return Some(permit);
            }
            // Returned, the permit goes to the fast task waiting in the semaphore's queue.
            drop(permit);
            tokio::task::yield_now().await;
        }
    }

    /// Whether `lane` leaves the next free slot to fast-lane tasks waiting for one.
    fn yields_to_fast(&self, lane: Lane) -> bool {
        lane == Lane::Normal && self.fast_waiting.load(Ordering::Acquire) > 0
    }
}
