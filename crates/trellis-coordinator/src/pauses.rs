//! The fleet pauses' bucket: `trellis_pauses` in NATS KV, one key per pause (`queue.<name>`,
//! `namespace.<name>` or `all`) holding a JSON [`Record`]. Any coordinator writes it
//! (`PauseFleet`, `ResumeFleet`); every coordinator watches it, keeps the set up to date from the
//! changes, and hands the whole set to its turn ([`Input::Pauses`]) each time a key changes, so a
//! pause reaches every coordinator within a NATS round trip, and a coordinator that starts reads
//! the set before it takes any shard.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::executor::Inbound;
use crate::turn::Input;
use crate::turn::pauses::{FleetPauses, Record, Target};

/// The bucket's name.
pub const BUCKET: &str = "trellis_pauses";

/// Opens (creating if needed) the bucket; its entries never expire.
pub(crate) async fn bucket(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<kv::Store, trellis_bus::Error> {
    trellis_bus::kv_bucket(
        js,
        BUCKET,
        "Pauses of worker queues, namespaces and the whole fleet (PauseFleet)",
        Duration::ZERO,
        replicas,
    )
    .await
}

/// Reads every pause in the bucket; entries this version cannot read are skipped with a warning.
pub(crate) async fn read_all(store: &kv::Store) -> Result<FleetPauses, String> {
    let mut keys = store
        .keys()
        .await
        .map_err(|err| format!("cannot list {BUCKET}: {err}"))?;
    let mut entries = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|err| format!("cannot list {BUCKET}: {err}"))?;
        let value = store
            .get(&key)
            .await
            .map_err(|err| format!("cannot read {BUCKET} key {key}: {err}"))?;
        if let Some(entry) = value.and_then(|bytes| parse(&key, &bytes)) {
            entries.push(entry);
        }
    }
    Ok(FleetPauses::new(entries))
}

/// Reads one entry; `None` (with a warning) for one this version cannot read.
fn parse(key: &str, bytes: &[u8]) -> Option<(Target, Record)> {
    let Some(target) = Target::from_key(key) else {
        tracing::warn!(key, bucket = BUCKET, "unknown pause key; ignored");
        return None;
    };
    match serde_json::from_slice::<Record>(bytes) {
        Ok(record) => Some((target, record)),
        Err(err) => {
            tracing::warn!(key, bucket = BUCKET, %err, "unreadable pause; ignored");
            None
        }
    }
}

/// Stores a pause (replacing one of the same target).
pub(crate) async fn put(store: &kv::Store, target: &Target, record: &Record) -> Result<(), String> {
    let bytes = serde_json::to_vec(record).map_err(|err| format!("cannot encode: {err}"))?;
    store
        .put(target.key(), bytes.into())
        .await
        .map(|_| ())
        .map_err(|err| format!("cannot write {BUCKET} key {}: {err}", target.key()))
}

/// Removes a pause; returns false when the target was not paused.
pub(crate) async fn remove(store: &kv::Store, target: &Target) -> Result<bool, String> {
    let key = target.key();
    let existed = store
        .get(&key)
        .await
        .map_err(|err| format!("cannot read {BUCKET} key {key}: {err}"))?
        .is_some();
    if existed {
        store
            .delete(&key)
            .await
            .map_err(|err| format!("cannot delete {BUCKET} key {key}: {err}"))?;
    }
    Ok(existed)
}

/// Hands the pauses to the executor now and after every change, until `stop`. The first set is
/// read whole and handed over before this returns, so no shard is taken before it is known;
/// later changes are applied one key at a time as the watch delivers them.
pub(crate) async fn watch(
    store: kv::Store,
    tx: mpsc::Sender<Inbound>,
    stop: CancellationToken,
) -> Result<(), crate::Error> {
    let bucket_error = |message: String| crate::Error::Bucket {
        bucket: BUCKET.to_owned(),
        message,
    };
    // Watch first, then read: a change between the two is seen twice rather than missed.
    let mut watcher = store
        .watch_all()
        .await
        .map_err(|err| bucket_error(err.to_string()))?;
    let mut pauses = read_all(&store).await.map_err(bucket_error)?;
    let first = Arc::new(pauses.clone());
    let _ = tx.send(Inbound::Input(Input::Pauses(first))).await;
    tokio::spawn(async move {
        loop {
            let change = tokio::select! {
                () = stop.cancelled() => return,
                change = watcher.next() => change,
            };
            match change {
                // Each change names its key: the set is kept here, not read again.
                Some(Ok(entry)) => {
                    let change = match entry.operation {
                        kv::Operation::Put => parse(&entry.key, &entry.value)
                            .map(|(target, record)| (target, Some(record))),
                        kv::Operation::Delete | kv::Operation::Purge => {
                            Target::from_key(&entry.key).map(|target| (target, None))
                        }
                    };
                    let Some((target, record)) = change else {
                        continue;
                    };
                    pauses.set(target, record);
                }
                Some(Err(err)) => {
                    tracing::warn!(%err, bucket = BUCKET, "pause watch failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                None => {
                    // The watch ended (a NATS restart): start another after a pause, and read
                    // the whole set again, since changes in between were not seen.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    match store.watch_all().await {
                        Ok(fresh) => watcher = fresh,
                        Err(err) => {
                            tracing::warn!(%err, bucket = BUCKET, "cannot watch pauses");
                            continue;
                        }
                    }
                    match read_all(&store).await {
                        Ok(fresh) => pauses = fresh,
                        Err(err) => {
                            tracing::warn!(%err, "cannot read the pauses");
                            continue;
                        }
                    }
                }
            }
            let input = Inbound::Input(Input::Pauses(Arc::new(pauses.clone())));
            if tx.send(input).await.is_err() {
                return;
            }
        }
    });
    Ok(())
}
