//! `CancelTask` (`trellis.cancel.<task_instance_id>`), as a worker takes it. The input is the
//! subject's last token, a NUL byte, then the message. No input panics; a request the worker acts
//! on names the subject's instance and an attempt from 1, and carries a reason to report.
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
    let token = String::from_utf8_lossy(token);
    let token = token.rsplit('.').next().unwrap_or_default();
    let Some((instance, attempt, reason)) = fuzzing::cancel_request(&subject, payload) else {
        if let Ok(message) = v1::CancelTask::decode(payload) {
            assert!(
                message.task_instance_id.is_empty()
                    || message.task_instance_id != token
                    || message.attempt == 0,
                "a cancel naming the subject's instance and an attempt was ignored"
            );
        }
        return;
    };
    let message = v1::CancelTask::decode(payload).expect("the worker acted on a CancelTask");
    assert_eq!(instance, message.task_instance_id);
    assert_eq!(instance, token, "acted on another instance than the subject's");
    assert!(attempt >= 1, "acted on attempt 0 (any attempt)");
    assert_eq!(attempt, message.attempt);
    assert!(!reason.is_empty(), "a cancelled attempt reports no reason");
});
