//! Which queues have a fast lane. Workers create each queue's consumer `fast-<queue>` beside
//! `workers-<queue>`; a coordinator sends an assignment to the fast lane
//! (`trellis.tasks.~.<queue>`) only once that consumer exists, so workers of a version without
//! the lane (during a rolling upgrade, say) still get every task.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::stream::Stream;
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;
use trellis_bus::Lane;
use trellis_proto::subjects;

/// How often the tasks stream's consumers are listed again.
const REFRESH: Duration = Duration::from_secs(2);

/// The names of the tasks stream's consumers, as last listed.
#[derive(Clone, Debug, Default)]
pub(crate) struct FastLanes {
    consumers: Arc<RwLock<HashSet<String>>>,
}

impl FastLanes {
    /// Lists the consumers of `tasks` now and every [`REFRESH`] until `shutdown`.
    pub(crate) fn watch(tasks: Stream, shutdown: CancellationToken) -> Self {
        let lanes = Self::default();
        let consumers = Arc::clone(&lanes.consumers);
        tokio::spawn(async move {
            loop {
                match list(&tasks).await {
                    Ok(names) => {
                        // A poisoned lock only means a reader panicked; the set is whole.
                        *consumers
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = names;
                    }
                    Err(err) => tracing::debug!(%err, "cannot list the task consumers"),
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(REFRESH) => {}
                }
            }
        });
        lanes
    }

    /// The subject of an assignment of `queue`: its fast lane's when `fast` asks for it and
    /// the queue's workers take that lane, else the queue's own.
    pub(crate) fn subject(&self, queue: &str, fast: bool) -> String {
        let has_lane = fast
            && self
                .consumers
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&trellis_bus::task_consumer_name(queue, Lane::Fast));
        if has_lane {
            subjects::fast_tasks(queue)
        } else {
            subjects::tasks(queue)
        }
    }
}

async fn list(tasks: &Stream) -> Result<HashSet<String>, String> {
    let mut names = tasks.consumer_names();
    let mut found = HashSet::new();
    while let Some(name) = names.next().await {
        found.insert(name.map_err(|err| err.to_string())?);
    }
    Ok(found)
}
