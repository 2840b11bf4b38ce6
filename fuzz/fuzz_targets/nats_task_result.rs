//! `TaskResult` (`trellis.results.<shard>`), as the coordinator takes it: decoded, turned into
//! an event, applied to the live execution, after which the coordinator decides what comes next.
//! No input panics, and afterwards the state keeps its invariants: the concurrency limit, a group
//! resumed at most once, a snapshot and a replay of the log give the same state, and a duplicate
//! delivery changes nothing.
//!
//! The first byte steers: bit 0 readdresses the result to a running attempt of the live
//! execution (bits 1–3 pick which), bit 4 delivers a `started` result for that attempt first;
//! the rest is the message.
//!
//! Run: `cd fuzz && cargo fuzz run nats_task_result corpus/nats_task_result seeds/nats_task_result`

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use trellis_core::ids::WorkerId;
use trellis_core::machine::{Applied, Event, EventBody};
use trellis_fuzz::Live;
use trellis_proto::v1;
use trellis_wire::worker;

fuzz_target!(|data: &[u8]| {
    let Some((&steer, payload)) = data.split_first() else {
        return;
    };
    let mut live = Live::new();
    let direct = worker::decode_task_result(payload, live.now);
    let Ok(mut result) = v1::TaskResult::decode(payload) else {
        assert!(direct.is_err(), "bytes that are no TaskResult converted");
        return;
    };
    assert_eq!(
        direct.ok(),
        worker::result_to_event(&result, live.now).ok(),
        "decoding in one step and in two disagree"
    );
    if steer & 1 != 0 {
        let attempts = live.attempts();
        let (instance, attempt) = attempts[usize::from(steer >> 1 & 7) % attempts.len()];
        result.execution_id = live.exec.id().to_string();
        result.task_instance_id = instance.to_string();
        result.attempt = attempt;
        if steer & 0x10 != 0 {
            let started = Event {
                at_ms: live.now,
                body: EventBody::TaskStarted {
                    instance,
                    attempt,
                    worker: WorkerId("fuzz-worker".to_owned()),
                },
            };
            live.deliver(started)
                .expect("a started result for a dispatched attempt applies");
        }
    }
    let Ok((id, event)) = worker::result_to_event(&result, live.now) else {
        return;
    };
    if id != live.exec.id() {
        return;
    }
    if let Ok(Applied::Changed { .. }) = live.deliver(event.clone()) {
        let before = live.exec.clone();
        match live.exec.apply(&event) {
            Ok(Applied::Changed { .. }) => panic!("a duplicate result changed the state"),
            Ok(Applied::Ignored(_)) | Err(_) => {}
        }
        assert!(
            before == live.exec,
            "a refused or ignored duplicate changed the state"
        );
    }
    live.decide();
    live.advance(60_000);
    live.decide();
    live.check();
});
