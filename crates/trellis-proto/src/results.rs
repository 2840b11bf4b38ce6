//! Results as they travel on `trellis.results.<shard>`: one `TaskResult` per message, or several
//! in a `TaskResultBatch` (header [`RESULT_BATCH_HEADER`](crate::subjects::RESULT_BATCH_HEADER)),
//! which share one stored write.

use prost::Message as _;
use prost::encoding::{self, DecodeContext, WireType};

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

/// The field number of `TaskResult.execution_id`.
const EXECUTION_ID_FIELD: u32 = 1;

/// The execution a `TaskResult`'s payload names, read without decoding the rest of it: its
/// other fields are skipped, not built (an output may be large), so telling results apart by
/// execution costs a scan, not a decode per result. The last `execution_id` field counts, as in a
/// decode; `None` when the payload's fields do not parse or the id is not UTF-8.
pub fn execution_id(result: &[u8]) -> Option<&str> {
    let mut rest = result;
    let mut found = None;
    while !rest.is_empty() {
        let (field, wire_type) = encoding::decode_key(&mut rest).ok()?;
        if field == EXECUTION_ID_FIELD && wire_type == WireType::LengthDelimited {
            let len = usize::try_from(encoding::decode_varint(&mut rest).ok()?).ok()?;
            let (id, after) = rest.split_at_checked(len)?;
            found = Some(std::str::from_utf8(id).ok()?);
            rest = after;
        } else {
            encoding::skip_field(wire_type, field, &mut rest, DecodeContext::default()).ok()?;
        }
    }
    found
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
    fn a_result_s_execution_is_read_past_and_around_its_other_fields() {
        use crate::v1::task_result::{Completed, Outcome};
        let result = TaskResult {
            execution_id: "0190-exec".to_owned(),
            task_instance_id: "instance".to_owned(),
            attempt: 3,
            sent_at_unix_ms: -1,
            outcome: Some(Outcome::Completed(Completed {
                output: vec![b'x'; 100_000],
            })),
            ..TaskResult::default()
        };
        let payload = result.encode_to_vec();
        assert_eq!(execution_id(&payload), Some("0190-exec"));
        let decoded = |payload: &[u8]| TaskResult::decode(payload).unwrap().execution_id;
        assert_eq!(decoded(&payload), "0190-exec");
        // Fields in any order, the id repeated: the last one counts, as in a decode.
        let mut reordered = TaskResult {
            attempt: 2,
            ..TaskResult::default()
        }
        .encode_to_vec();
        reordered.extend(payload);
        reordered.extend(
            TaskResult {
                execution_id: "later".to_owned(),
                ..TaskResult::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(decoded(&reordered), "later");
        assert_eq!(execution_id(&reordered), Some("later"));
    }

    #[test]
    fn a_payload_that_is_no_result_names_no_execution() {
        assert_eq!(execution_id(&TaskResult::default().encode_to_vec()), None);
        // A length past the end, a bad wire type, an id that is not UTF-8.
        assert_eq!(execution_id(&[0x0a, 0x05, b'a']), None);
        assert_eq!(execution_id(&[0x0f]), None);
        assert_eq!(execution_id(&[0x0a, 0x02, 0xff, 0xfe]), None);
        assert_eq!(execution_id(&[0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn a_batch_header_on_a_payload_that_is_no_batch_is_an_error() {
        assert!(unpack(true, &[0xff, 0xff, 0xff], "batch:x", "").is_err());
    }
}
