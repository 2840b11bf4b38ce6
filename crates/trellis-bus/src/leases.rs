//! Key-value buckets whose keys are leases: a key vanishes `ttl` after its last write, so the
//! holder keeps it by rewriting it (compare-and-set on its revision) more often than that, and a
//! holder that died loses it on its own.

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};

use crate::Error;

/// Opens the KV bucket `bucket` (entries gone `max_age` after their last write; zero: kept),
/// creating it with `replicas` copies if missing (idempotent, safe when several services start
/// at once). Its stream is made directly, as a KV bucket's is,
/// because `create_key_value` reads an account field servers before 2.11 do not send.
pub async fn kv_bucket(
    js: &jetstream::Context,
    bucket: &str,
    description: &str,
    max_age: Duration,
    replicas: usize,
) -> Result<kv::Store, Error> {
    crate::ensure(js, kv_stream_config(bucket, description, max_age, replicas)).await?;
    js.get_key_value(bucket)
        .await
        .map_err(|error| Error::Bucket {
            bucket: bucket.to_owned(),
            message: error.to_string(),
        })
}

/// Returns the configuration of the stream `KV_<bucket>` behind a KV bucket: what async-nats's
/// `create_key_value` would create (one revision per key, rollups, direct gets, deletes only
/// through the KV API), file storage, entries gone `max_age` after their last write (zero: kept).
pub(crate) fn kv_stream_config(
    bucket: &str,
    description: &str,
    max_age: Duration,
    replicas: usize,
) -> stream::Config {
    stream::Config {
        name: format!("KV_{bucket}"),
        description: Some(description.to_owned()),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// Takes the lease `key` for `holder` when no one holds it, or back when `holder` already does (a
/// restart under the same identity); returns its revision, or `None` when another holds it.
pub async fn take_lease(leases: &kv::Store, key: &str, holder: &str) -> Option<u64> {
    let value = bytes::Bytes::from(holder.to_owned());
    match leases.entry(key).await {
        Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
            if entry.value == value {
                leases.update(key, value, entry.revision).await.ok()
            } else {
                None
            }
        }
        Ok(_) => leases.create(key, value).await.ok(),
        Err(error) => {
            tracing::debug!(key, %error, "cannot read a lease");
            None
        }
    }
}

/// An instance's identity where nothing else names it: the host name (which Kubernetes keeps
/// stable per pod), or `fallback` when the host has none.
pub fn host_identity(fallback: &str) -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
        })
        .unwrap_or_else(|| fallback.to_owned())
}
