//! Retention of the event log (`--events-retention`): the messages of an execution leave
//! `TRELLIS_EVENTS` once it has been finished for the retention period, and never before.
//!
//! The stream itself has no age or size limit, since one would drop the messages of unfinished
//! executions too. Instead the replica that ingests the log (so the read model holds every event
//! of what it purges) lists the executions that ended before `now - retention` in the read model,
//! oldest first, and purges each one's subject. A finished execution is in a final state in the
//! read model only once its last event is written there, so nothing is purged that the read model
//! lacks; its history stays readable from the store (`GetExecutionRecord`, `QueryTaskInstances`),
//! not from the log (a coordinator can no longer load it, nor retry it). How far the purge has
//! come is kept in the KV bucket [`STATE_BUCKET`], so a new leader goes on from there.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv};
use tokio_util::sync::CancellationToken;
use trellis_proto::subjects;

use crate::store::Store;

/// The bucket of the store's own state kept in NATS (no expiry).
pub const STATE_BUCKET: &str = "trellis_store_state";
/// The key holding the end time (Unix ms) up to which finished executions were purged.
const WATERMARK: &str = "events-purged-until";
/// The longest wait between two sweeps (a short retention is swept every half of it).
const EVERY: Duration = Duration::from_secs(30);
/// Executions purged per read of the read model.
const BATCH: u32 = 1000;

/// Sweeps the log every half retention, at most every [`EVERY`], until `shutdown`.
pub(crate) async fn run(
    store: Arc<dyn Store>,
    nats: async_nats::Client,
    retention: Duration,
    replicas: usize,
    shutdown: CancellationToken,
) {
    let js = jetstream::new(nats);
    let (events, state) = loop {
        let opened = async {
            let streams = trellis_bus::wait_for_streams(&js, Duration::from_secs(60))
                .await
                .map_err(|err| err.to_string())?;
            let state = trellis_bus::kv_bucket(
                &js,
                STATE_BUCKET,
                "the checkpoint-store's own state (how far the event log was purged)",
                Duration::ZERO,
                replicas,
            )
            .await
            .map_err(|err| err.to_string())?;
            Ok::<_, String>((streams.events, state))
        };
        let opened = tokio::select! {
            () = shutdown.cancelled() => return,
            opened = opened => opened,
        };
        match opened {
            Ok(opened) => break opened,
            Err(err) => tracing::warn!(%err, "event log retention waits for NATS"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    };
    let every = (retention / 2).clamp(Duration::from_millis(100), EVERY);
    tracing::info!(retention = ?retention, "event log retention: finished executions leave the log after it");
    loop {
        match sweep(store.as_ref(), &events, &state, retention).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "finished executions left the event log"),
            Err(err) => {
                tracing::warn!(%err, "event log retention sweep stopped; trying again later")
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// Purges the subjects of the executions that ended since the watermark and before
/// `now - retention`; returns how many.
async fn sweep(
    store: &dyn Store,
    events: &jetstream::stream::Stream,
    state: &kv::Store,
    retention: Duration,
) -> Result<usize, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let until = now.saturating_sub(retention.as_millis() as u64);
    let mut after = match state.get(WATERMARK).await {
        Ok(Some(value)) => String::from_utf8_lossy(&value).parse::<u64>().unwrap_or(0),
        Ok(None) => 0,
        Err(err) => return Err(format!("cannot read the retention watermark: {err}")),
    };
    let mut purged = 0;
    loop {
        let finished = store
            .finished_between(after, until, BATCH)
            .await
            .map_err(|err| err.to_string())?;
        let (Some(first), Some(last)) = (finished.first(), finished.last()) else {
            return Ok(purged);
        };
        let (first_ended, last_ended) = (first.1, last.1);
        for (id, _) in &finished {
            events
                .purge()
                .filter(subjects::events(id))
                .await
                .map_err(|err| format!("cannot purge the log of execution {id}: {err}"))?;
        }
        purged += finished.len();
        // A full batch may have left executions that ended in the same millisecond as its last
        // one: read from just before it again (purging twice is harmless), unless the whole batch
        // ended in that millisecond.
        let full = finished.len() == BATCH as usize;
        after = if full && first_ended != last_ended {
            last_ended - 1
        } else {
            last_ended
        };
        state
            .put(WATERMARK, after.to_string().into())
            .await
            .map_err(|err| format!("cannot store the retention watermark: {err}"))?;
        if !full {
            return Ok(purged);
        }
    }
}
