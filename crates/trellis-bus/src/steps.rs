//! The KV bucket of durable steps (docs/design.md §6): workers keep the steps a running task instance
//! has recorded under its instance id, so an attempt that JetStream delivers again after its
//! worker died (same attempt, no steps in the assignment) resumes after them.
//!
//! The coordinator creates the bucket at start with [`ensure_steps_bucket`]; workers call it too,
//! so a worker started against a server no coordinator has prepared still works. Entries are
//! deleted once an instance's final result is stored; the ones a failed attempt leaves behind for
//! its retry expire after [`STEPS_MAX_AGE`].

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use trellis_proto::subjects;

use crate::{Error, MAX_PAYLOAD};

/// How long an entry lives after its last write. A step-wise task that goes longer than this
/// between two steps loses the fallback, not its steps: the coordinator still hands the recorded
/// steps to every new attempt.
pub const STEPS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Returns the configuration of the bucket's stream `KV_trellis_steps`: a KV bucket's stream
/// (`crate::leases::kv_stream_config`) whose entries live [`STEPS_MAX_AGE`] and whose values
/// may be as large as a NATS message ([`MAX_PAYLOAD`]).
///
/// The stream is created directly because `create_key_value` first reads the account's API level,
/// a field servers before 2.11 do not send, and fails there.
fn stream_config(replicas: usize) -> stream::Config {
    stream::Config {
        max_message_size: MAX_PAYLOAD as i32,
        ..crate::leases::kv_stream_config(
            subjects::STEPS_BUCKET,
            "durable steps of running task instances, by instance id",
            STEPS_MAX_AGE,
            replicas,
        )
    }
}

/// Opens the steps bucket, creating it with `replicas` copies if missing (idempotent, safe when
/// several services start at once).
pub async fn ensure_steps_bucket(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<kv::Store, Error> {
    crate::ensure(js, stream_config(replicas)).await?;
    steps_bucket(js).await
}

/// Opens the steps bucket, which must exist.
pub async fn steps_bucket(js: &jetstream::Context) -> Result<kv::Store, Error> {
    js.get_key_value(subjects::STEPS_BUCKET)
        .await
        .map_err(|error| Error::Bucket {
            bucket: subjects::STEPS_BUCKET.to_owned(),
            message: error.to_string(),
        })
}
