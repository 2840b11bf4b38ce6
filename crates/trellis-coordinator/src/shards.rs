//! Shards and their leases (docs/design.md §9), as kept in NATS.
//!
//! Executions are spread over `S` shards by a hash of their id. A coordinator owns a shard while
//! it holds the shard's lease: a key in the NATS KV bucket `trellis_leases` whose value is the
//! coordinator's id, renewed by compare-and-set on its revision every third of the lease TTL. The
//! bucket's `max_age` is the TTL, so the key of a coordinator that died vanishes on its own and a
//! standby's `create` then succeeds. A coordinator restarted with the same id finds its own name
//! on the key and takes the lease back at once, without waiting for the TTL.
//!
//! The lease alone is not what keeps two coordinators from both writing an execution's log: every
//! append names the stream sequence it expects to follow (`Nats-Expected-Last-Subject-Sequence`),
//! so a coordinator that lost its shard without noticing has its next append refused.
//!
//! The bucket `trellis_executions` indexes unfinished executions per shard (`<shard>.<id>`), so a
//! coordinator taking a shard over knows what to recover without scanning the event stream.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use trellis_core::ids::ExecutionId;

use crate::executor::Inbound;

/// The lease bucket.
pub(crate) const LEASES_BUCKET: &str = "trellis_leases";
/// The index of unfinished executions.
pub(crate) const INDEX_BUCKET: &str = "trellis_executions";

/// What the lease keeper tells the engine.
#[derive(Debug)]
pub(crate) enum LeaseEvent {
    /// This coordinator now owns the shard: recover its executions, then consume its results.
    Acquired(u32),
    /// The lease is gone (taken over, or not renewed in time): stop touching the shard.
    Lost(u32),
}

/// Opens (or creates, with `replicas` copies) the two buckets.
pub(crate) async fn buckets(
    js: &jetstream::Context,
    lease_ttl: Duration,
    replicas: usize,
) -> Result<(kv::Store, kv::Store), crate::Error> {
    let leases = open_or_create(
        js,
        kv::Config {
            bucket: LEASES_BUCKET.to_owned(),
            description: "coordinator shard leases (value: the owner's id)".to_owned(),
            history: 1,
            max_age: lease_ttl,
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        },
    )
    .await?;
    let index = open_or_create(
        js,
        kv::Config {
            bucket: INDEX_BUCKET.to_owned(),
            description: "unfinished executions per shard (key: <shard>.<execution id>)".to_owned(),
            history: 1,
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        },
    )
    .await?;
    Ok((leases, index))
}

/// Opens a bucket, creating its stream when missing. The stream is made here, with the settings
/// a KV bucket has, rather than through `create_key_value`, which needs an account-info answer
/// older NATS servers (2.9) do not give in the shape the client expects.
async fn open_or_create(
    js: &jetstream::Context,
    config: kv::Config,
) -> Result<kv::Store, crate::Error> {
    let stream = jetstream::stream::Config {
        name: format!("KV_{}", config.bucket),
        description: Some(config.description.clone()),
        subjects: vec![format!("$KV.{}.>", config.bucket)],
        max_messages_per_subject: config.history.max(1),
        max_age: config.max_age,
        storage: config.storage,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: true,
        discard: jetstream::stream::DiscardPolicy::New,
        num_replicas: config.num_replicas.max(1),
        ..Default::default()
    };
    let mut attempts = 0u64;
    loop {
        let error = match js.get_or_create_stream(stream.clone()).await {
            Ok(_) => match js.get_key_value(&config.bucket).await {
                Ok(store) => return Ok(store),
                Err(err) => err.to_string(),
            },
            Err(err) => err.to_string(),
        };
        attempts += 1;
        if attempts >= 10 {
            return Err(crate::Error::Bucket {
                bucket: config.bucket.clone(),
                message: error,
            });
        }
        tokio::time::sleep(Duration::from_millis(50 * attempts)).await;
    }
}

/// Queues the deletion of an index key on the NATS connection, as `kv::Store::delete` would
/// send it, and returns the future of its acknowledgement without waiting for it.
pub(crate) async fn queue_delete(
    js: &jetstream::Context,
    key: &str,
) -> Result<jetstream::context::PublishAckFuture, jetstream::context::PublishError> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("KV-Operation", "DEL");
    js.publish_with_headers(format!("$KV.{INDEX_BUCKET}.{key}"), headers, Bytes::new())
        .await
}

/// Lists the unfinished executions of a shard from the index.
pub(crate) async fn indexed(index: &kv::Store, shard: u32) -> Result<Vec<ExecutionId>, String> {
    let mut by_shard = indexed_in(index, &[shard]).await?;
    Ok(by_shard.remove(&shard).unwrap_or_default())
}

/// Lists the unfinished executions of several shards from the index, in one pass over it.
pub(crate) async fn indexed_in(
    index: &kv::Store,
    shards: &[u32],
) -> Result<HashMap<u32, Vec<ExecutionId>>, String> {
    use futures::StreamExt;
    let mut keys = index.keys().await.map_err(|e| e.to_string())?;
    let mut by_shard: HashMap<u32, Vec<ExecutionId>> =
        shards.iter().map(|shard| (*shard, Vec::new())).collect();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| e.to_string())?;
        let Some((shard, id)) = key.split_once('.') else {
            continue;
        };
        if let (Ok(shard), Ok(id)) = (shard.parse::<u32>(), id.parse())
            && let Some(ids) = by_shard.get_mut(&shard)
        {
            ids.push(id);
        }
    }
    Ok(by_shard)
}

/// Keeps this coordinator's leases until `shutdown`, then releases them so a standby takes over
/// without waiting for the TTL.
pub(crate) async fn keep_leases(
    leases: kv::Store,
    me: String,
    shards: u32,
    ttl: Duration,
    tx: mpsc::Sender<Inbound>,
    first_pass: tokio::sync::oneshot::Sender<()>,
    shutdown: CancellationToken,
) {
    let mut first_pass = Some(first_pass);
    let every = (ttl / 3).max(Duration::from_millis(50));
    // Shard → (revision of our last write, when it was written).
    let mut owned: HashMap<u32, (u64, Instant)> = HashMap::new();
    let value = Bytes::from(me.clone());
    loop {
        for shard in 0..shards {
            let key = format!("shard-{shard}");
            if let Some(&(revision, renewed)) = owned.get(&shard) {
                match leases.update(&key, value.clone(), revision).await {
                    Ok(revision) => {
                        owned.insert(shard, (revision, Instant::now()));
                    }
                    Err(err) => {
                        let taken = err.kind() == kv::UpdateErrorKind::WrongLastRevision;
                        // Not renewed within the TTL: someone else may hold it by now.
                        if taken || renewed.elapsed() >= ttl {
                            tracing::warn!(shard, %err, "shard lease lost");
                            owned.remove(&shard);
                            if tx
                                .send(Inbound::Lease(LeaseEvent::Lost(shard)))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        } else {
                            tracing::warn!(shard, %err, "shard lease not renewed; retrying");
                        }
                    }
                }
                continue;
            }
            let acquired = match leases.entry(&key).await {
                Ok(Some(entry))
                    if entry.operation == kv::Operation::Put && entry.value == value =>
                {
                    // Our own lease, from before a restart under the same id.
                    leases
                        .update(&key, value.clone(), entry.revision)
                        .await
                        .ok()
                }
                Ok(Some(entry)) if entry.operation == kv::Operation::Put => None,
                Ok(_) => leases.create(&key, value.clone()).await.ok(),
                Err(err) => {
                    tracing::debug!(shard, %err, "cannot read shard lease");
                    None
                }
            };
            if let Some(revision) = acquired {
                tracing::info!(shard, coordinator = %me, "shard lease acquired");
                owned.insert(shard, (revision, Instant::now()));
                if tx
                    .send(Inbound::Lease(LeaseEvent::Acquired(shard)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        if let Some(done) = first_pass.take() {
            let _ = done.send(());
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(every) => {}
        }
    }
    for (shard, (revision, _)) in owned {
        let _ = leases
            .delete_expect_revision(format!("shard-{shard}"), Some(revision))
            .await;
        tracing::info!(shard, "shard lease released");
    }
}
