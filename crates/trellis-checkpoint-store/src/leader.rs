//! One replica writes the read model (and copies the task logs, `crate::logs`); every replica
//! serves it.
//!
//! Several checkpoint-store replicas serve reads from the one database, but the event log must be
//! ingested by one of them at a time: the writes are idempotent by event sequence, so a second
//! consumer taking later events of an execution before earlier ones would make the earlier ones
//! look old and skip them. The replica that holds the lease `ingest` in the KV bucket
//! [`LEADER_BUCKET`] ingests; it renews the lease every third of its TTL, stops ingesting the
//! moment it cannot, and deletes it when it stops gracefully. Another replica takes the lease
//! once it is free (at once after a graceful stop, within the TTL after a crash).
//!
//! Each leadership term consumes through a consumer of its own, `checkpoint-store-<term>`, made
//! by the new leader after deleting the previous ones and starting right after the oldest point
//! any of them had acknowledged: a former leader that stalled and came back finds its consumer
//! gone (nothing it acknowledges late reaches the new one), and whatever it still writes is a
//! write the new leader repeats in order, which sequences make harmless.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use tokio_util::sync::CancellationToken;

use crate::ingest::Ingest;
use crate::store::Store;

/// The bucket holding the ingest lease.
pub const LEADER_BUCKET: &str = "trellis_store_leader";
/// The lease's key.
const KEY: &str = "ingest";

/// Who this replica is and how long its lease lasts.
#[derive(Clone, Debug)]
pub(crate) struct Lease {
    pub(crate) holder: String,
    pub(crate) ttl: Duration,
    pub(crate) replicas: usize,
    /// The event log's retention, which the ingesting replica enforces.
    pub(crate) retention: Option<Duration>,
}

/// Takes part in the election until `shutdown`: while this replica holds the lease it ingests
/// the event log.
pub(crate) async fn run(
    lease: Lease,
    store: Arc<dyn Store>,
    nats: async_nats::Client,
    metrics: crate::metrics::Metrics,
    shutdown: CancellationToken,
) {
    let js = jetstream::new(nats.clone());
    let every = (lease.ttl / 3).max(Duration::from_millis(50));
    let bucket = loop {
        match trellis_bus::kv_bucket(
            &js,
            LEADER_BUCKET,
            "the checkpoint-store replica that ingests the event log (value: its id)",
            lease.ttl,
            lease.replicas,
        )
        .await
        {
            Ok(bucket) => break bucket,
            Err(err) => tracing::warn!(%err, "cannot open the ingest lease bucket; retrying"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    };
    loop {
        let Some(term) = trellis_bus::take_lease(&bucket, KEY, &lease.holder).await else {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => continue,
            }
        };
        tracing::info!(holder = %lease.holder, term, "this replica ingests the event log");
        let ingesting = shutdown.child_token();
        let task = tokio::spawn(Ingest::run(
            store.clone(),
            nats.clone(),
            metrics.clone(),
            term,
            ingesting.clone(),
        ));
        let copying = tokio::spawn(crate::logs::run(
            store.clone(),
            nats.clone(),
            metrics.clone(),
            ingesting.clone(),
        ));
        let purging = lease.retention.map(|retention| {
            tokio::spawn(crate::retention::run(
                store.clone(),
                nats.clone(),
                retention,
                lease.replicas,
                ingesting.clone(),
            ))
        });
        let (revision, lost) = hold(&bucket, &lease, term, every, &shutdown).await;
        ingesting.cancel();
        let _ = task.await;
        let _ = copying.await;
        if let Some(purging) = purging {
            let _ = purging.await;
        }
        if !lost {
            let _ = bucket.delete_expect_revision(KEY, Some(revision)).await;
            tracing::info!("ingest lease released");
            return;
        }
        tracing::warn!("ingest lease lost; another replica ingests the event log");
    }
}

/// Renews the lease until `shutdown` (returns false) or until it is lost (true); returns the
/// revision of the last renewal too.
async fn hold(
    bucket: &kv::Store,
    lease: &Lease,
    term: u64,
    every: Duration,
    shutdown: &CancellationToken,
) -> (u64, bool) {
    let value = bytes::Bytes::from(lease.holder.clone());
    let mut revision = term;
    let mut renewed = Instant::now();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return (revision, false),
            () = tokio::time::sleep(every) => {}
        }
        match bucket.update(KEY, value.clone(), revision).await {
            Ok(next) => {
                revision = next;
                renewed = Instant::now();
            }
            Err(err) => {
                let taken = err.kind() == kv::UpdateErrorKind::WrongLastRevision;
                if taken || renewed.elapsed() >= lease.ttl {
                    tracing::warn!(%err, "ingest lease not renewed in time");
                    return (revision, true);
                }
                tracing::warn!(%err, "ingest lease not renewed; retrying");
            }
        }
    }
}
