//! The fences a worker honours: the bucket `trellis_fences` (execution id → the epoch of the
//! coordinator that took it over) watched into memory, so refusing a stale assignment costs a
//! map lookup, not a round trip. A coordinator that takes an execution over writes its epoch
//! before it finds any inherited attempt lost, and only then dispatches it again: an assignment
//! whose `fence` is below the entry was sent by a former owner and is refused, so it never runs
//! beside its re-dispatch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;
use trellis_proto::subjects;
use trellis_proto::v1::TaskAssignment;

use crate::sdk::lock;

/// The fencing epochs known, by execution id.
#[derive(Debug, Default)]
pub(crate) struct Fences {
    epochs: Mutex<HashMap<String, u64>>,
}

impl Fences {
    /// Returns the execution's fence when `assignment` was sent below it (by a former owner).
    pub(crate) fn stale(&self, assignment: &TaskAssignment) -> Option<u64> {
        let epochs = lock(&self.epochs);
        epochs
            .get(&assignment.execution_id)
            .copied()
            .filter(|fence| assignment.fence < *fence)
    }

    fn set(&self, key: &str, epoch: Option<u64>) {
        let mut epochs = lock(&self.epochs);
        match epoch {
            Some(epoch) => {
                let entry = epochs.entry(key.to_owned()).or_insert(epoch);
                *entry = (*entry).max(epoch);
            }
            None => {
                epochs.remove(key);
            }
        }
    }

    /// Keeps the map up to date from the bucket until `stop`: every key's current value first,
    /// then each change; a watch that ends (NATS restarted) is opened again.
    pub(crate) async fn watch(self: Arc<Self>, store: kv::Store, stop: CancellationToken) {
        loop {
            let mut watcher = match store.watch_with_history(">").await {
                Ok(watcher) => watcher,
                Err(err) => {
                    tracing::warn!(%err, bucket = subjects::FENCES_BUCKET, "cannot watch the fences; retrying");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            loop {
                let change = tokio::select! {
                    () = stop.cancelled() => return,
                    change = watcher.next() => change,
                };
                match change {
                    Some(Ok(entry)) => match entry.operation {
                        kv::Operation::Put => match trellis_bus::decode_fence(&entry.value) {
                            Some(epoch) => self.set(&entry.key, Some(epoch)),
                            None => tracing::warn!(key = %entry.key, "unreadable fence ignored"),
                        },
                        kv::Operation::Delete | kv::Operation::Purge => self.set(&entry.key, None),
                    },
                    Some(Err(err)) => {
                        tracing::warn!(%err, bucket = subjects::FENCES_BUCKET, "fence watch failed");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    None => break,
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assignment(execution: &str, fence: u64) -> TaskAssignment {
        TaskAssignment {
            execution_id: execution.to_owned(),
            fence,
            ..TaskAssignment::default()
        }
    }

    #[test]
    fn an_assignment_below_its_executions_fence_is_stale() {
        let fences = Fences::default();
        assert_eq!(fences.stale(&assignment("a", 0)), None, "no fence yet");
        fences.set("a", Some(7));
        assert_eq!(fences.stale(&assignment("a", 0)), Some(7));
        assert_eq!(fences.stale(&assignment("a", 6)), Some(7));
        assert_eq!(fences.stale(&assignment("a", 7)), None, "the owner's own");
        assert_eq!(fences.stale(&assignment("a", 9)), None, "a later owner's");
        assert_eq!(fences.stale(&assignment("b", 0)), None, "another execution");
        fences.set("a", Some(3));
        assert_eq!(
            fences.stale(&assignment("a", 5)),
            Some(7),
            "a fence never goes back"
        );
        fences.set("a", None);
        assert_eq!(fences.stale(&assignment("a", 0)), None);
    }
}
