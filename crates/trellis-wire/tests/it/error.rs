//! Errors name what is wrong and where, and stay short: a long bad id is cut, and bytes that are
//! no message of the expected kind are decode errors at the message's root.

use prost::Message;
use trellis_proto::v1::{self, task_result};
use trellis_wire::error::ConvertErrorKind;
use trellis_wire::log::decode_event_batch;
use trellis_wire::worker::{decode_task_assignment, decode_task_result, result_to_event};

use crate::support::AT_MS;
use crate::worker::task_result;

#[test]
fn long_bad_ids_are_cut_in_errors() {
    let long_id = "z".repeat(10_000);
    let err = result_to_event(
        &v1::TaskResult {
            task_instance_id: long_id,
            ..task_result(Some(task_result::Outcome::Started(task_result::Started {})))
        },
        AT_MS,
    )
    .expect_err("refused");
    assert!(matches!(err.kind(), ConvertErrorKind::InvalidUuid(shown) if shown.len() < 100));
    assert_eq!(err.path(), "task_result.task_instance_id");
}

#[test]
fn garbage_bytes_are_decode_errors() {
    let garbage = [0xff_u8, 0xff, 0xff, 0xff];
    let err = decode_task_result(&garbage, AT_MS).expect_err("refused");
    assert_eq!(err.path(), "task_result");
    assert!(matches!(err.kind(), ConvertErrorKind::Decode(_)), "{err}");
    let err = decode_event_batch(&garbage).expect_err("refused");
    assert_eq!(err.path(), "event_batch");
    assert!(matches!(err.kind(), ConvertErrorKind::Decode(_)), "{err}");
    let err = decode_task_assignment(&garbage).expect_err("refused");
    assert_eq!(err.path(), "task_assignment");
    // A valid protobuf of the wrong message misses the required fields.
    let progress = v1::Progress::default().encode_to_vec();
    assert!(decode_task_result(&progress, AT_MS).is_err());
}
