//! The fences bucket (`trellis_fences`): the fencing epoch of each execution a coordinator took
//! over with attempts still running, keyed by execution id, as a decimal `u64`. A coordinator
//! writes it once its claim is stored; every worker watches the bucket and refuses an assignment
//! whose `fence` is below its execution's entry (see `TaskAssignment.fence`).

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use trellis_proto::subjects;

use crate::Error;

/// How long an entry lives after it was written: far longer than any assignment waits in its
/// queue, so a stale one is refused whenever it is delivered.
pub const FENCES_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Opens the fences bucket, creating it with `replicas` copies if missing (idempotent).
pub async fn ensure_fences_bucket(
    js: &jetstream::Context,
    replicas: usize,
) -> Result<kv::Store, Error> {
    crate::kv_bucket(
        js,
        subjects::FENCES_BUCKET,
        "fencing epochs of executions taken over with attempts running, by execution id",
        FENCES_MAX_AGE,
        replicas,
    )
    .await
}

/// Encodes an epoch as the bucket stores it.
pub fn encode_fence(epoch: u64) -> bytes::Bytes {
    bytes::Bytes::from(epoch.to_string())
}

/// Reads an entry's value; `None` for one that is not a decimal `u64`.
pub fn decode_fence(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_round_trip_and_garbage_reads_as_none() {
        for epoch in [0, 1, 42, u64::MAX] {
            assert_eq!(decode_fence(&encode_fence(epoch)), Some(epoch));
        }
        assert_eq!(decode_fence(b""), None);
        assert_eq!(decode_fence(b"-1"), None);
        assert_eq!(decode_fence(b"\xff\xfe"), None);
        assert_eq!(decode_fence(b"12x"), None);
    }
}
