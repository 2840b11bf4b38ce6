//! `CancelTask` (`trellis.cancel.<task_instance_id>`), as a worker takes it. The input is the
//! subject's last token, a NUL byte, then the message. No input panics; a request the worker acts
//! on names an instance (the message's, else the subject's) and carries a reason to report.
//!
//! Run: `cd fuzz && cargo fuzz run nats_cancel_task corpus/nats_cancel_task seeds/nats_cancel_task`

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use trellis_agent_worker::fuzzing;
use trellis_proto::v1;

fuzz_target!(|data: &[u8]| {
    let (token, payload) = match data.iter().position(|&byte| byte == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&b""[..], data),
    };
    let subject = format!("trellis.cancel.{}", String::from_utf8_lossy(token));
    let Some((instance, attempt, reason)) = fuzzing::cancel_request(&subject, payload) else {
        assert!(
            v1::CancelTask::decode(payload).is_err(),
            "a CancelTask was ignored"
        );
        return;
    };
    let message = v1::CancelTask::decode(payload).expect("the worker acted on a CancelTask");
    if message.task_instance_id.is_empty() {
        assert_eq!(
            instance,
            String::from_utf8_lossy(token)
                .rsplit('.')
                .next()
                .unwrap_or_default()
        );
    } else {
        assert_eq!(instance, message.task_instance_id);
    }
    assert_eq!(attempt, message.attempt);
    assert!(!reason.is_empty(), "a cancelled attempt reports no reason");
});
