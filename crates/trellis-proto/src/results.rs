//! Results as they travel on `trellis.results.<shard>`: one `TaskResult` per message, or several
//! in a `TaskResultBatch` (header [`RESULT_BATCH_HEADER`](crate::subjects::RESULT_BATCH_HEADER)),
//! which share one stored write.

use prost::Message as _;

use crate::v1::{TaskResultBatch, task_result_batch::Entry};

/// Returns the results one message carries: a batch's entries when `batch` (the message has the
/// batch header), otherwise the message itself as one entry, with its `Nats-Msg-Id` and
/// `traceparent` headers (`""` when absent). Fails when a batch's payload is not a
/// `TaskResultBatch`; a lone result's payload is not decoded here.
pub fn unpack(
    batch: bool,
    payload: &[u8],
    msg_id: &str,
    traceparent: &str,
) -> Result<Vec<Entry>, prost::DecodeError> {
    if batch {
        return unpack_batch(payload);
    }
    Ok(vec![Entry {
        result: payload.to_vec(),
        msg_id: msg_id.to_owned(),
        traceparent: traceparent.to_owned(),
    }])
}

/// The execution a `TaskResult`'s payload names; `None` if it is not one.
pub fn execution_of(result: &[u8]) -> Option<String> {
    Some(crate::v1::TaskResult::decode(result).ok()?.execution_id)
}

/// Returns the entries of a batch's payload; fails when it is not a `TaskResultBatch`.
pub fn unpack_batch(payload: &[u8]) -> Result<Vec<Entry>, prost::DecodeError> {
    Ok(TaskResultBatch::decode(payload)?.entries)
}

/// Returns the payload of a batch of `entries`.
pub fn pack(entries: Vec<Entry>) -> Vec<u8> {
    TaskResultBatch { entries }.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::TaskResult;

    fn entry(instance: &str) -> Entry {
        Entry {
            result: TaskResult {
                task_instance_id: instance.to_owned(),
                attempt: 1,
                ..TaskResult::default()
            }
            .encode_to_vec(),
            msg_id: format!("{instance}:1:completed"),
            traceparent: String::new(),
        }
    }

    #[test]
    fn a_packed_batch_unpacks_to_its_entries_in_order() {
        let entries = vec![entry("a"), entry("b"), entry("c")];
        let payload = pack(entries.clone());
        assert_eq!(unpack(true, &payload, "batch:x", "").unwrap(), entries);
    }

    #[test]
    fn a_lone_result_is_one_entry_named_by_the_message_headers() {
        let lone = entry("a");
        let unpacked = unpack(false, &lone.result, "a:1:completed", "00-tp").unwrap();
        assert_eq!(
            unpacked,
            [Entry {
                traceparent: "00-tp".to_owned(),
                ..lone
            }]
        );
    }

    #[test]
    fn a_batch_header_on_a_payload_that_is_no_batch_is_an_error() {
        assert!(unpack(true, &[0xff, 0xff, 0xff], "batch:x", "").is_err());
    }
}
