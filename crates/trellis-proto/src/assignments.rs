//! Assignments as they travel on `trellis.tasks.<queue>`: one `TaskAssignment` per message, or
//! several of one queue's lane in a `TaskAssignmentBatch` (header
//! [`ASSIGNMENT_BATCH_HEADER`](crate::subjects::ASSIGNMENT_BATCH_HEADER)), which share one stored
//! write and one removal.

use prost::Message as _;

use crate::v1::{TaskAssignmentBatch, task_assignment_batch::Entry};

/// Returns the entries of a batch's payload; fails when it is not a `TaskAssignmentBatch`.
pub fn unpack_batch(payload: &[u8]) -> Result<Vec<Entry>, prost::DecodeError> {
    Ok(TaskAssignmentBatch::decode(payload)?.entries)
}

/// Returns the payload of a batch of `entries`.
pub fn pack(entries: Vec<Entry>) -> Vec<u8> {
    TaskAssignmentBatch { entries }.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::TaskAssignment;

    fn entry(instance: &str) -> Entry {
        Entry {
            assignment: TaskAssignment {
                task_instance_id: instance.to_owned(),
                attempt: 1,
                ..TaskAssignment::default()
            }
            .encode_to_vec(),
            msg_id: format!("{instance}:1"),
            traceparent: String::new(),
        }
    }

    #[test]
    fn a_packed_batch_unpacks_to_its_entries_in_order() {
        let entries = vec![entry("a"), entry("b"), entry("c")];
        assert_eq!(unpack_batch(&pack(entries.clone())).unwrap(), entries);
    }

    #[test]
    fn a_payload_that_is_no_batch_is_an_error() {
        assert!(unpack_batch(&[0xff, 0xff, 0xff]).is_err());
    }
}
