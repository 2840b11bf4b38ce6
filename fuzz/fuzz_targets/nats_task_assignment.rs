//! `TaskAssignment` (`trellis.tasks.<queue>`), as a worker takes it: accepted or set aside, then
//! run by a built-in handler that needs no I/O (`noop`, `fail`, `fanout`, `question`). No input
//! panics or blows up memory, and for an assignment the coordinator could have sent (it passes
//! the contract's decoder), the result the handler gives is one the coordinator reads and its
//! state machine applies to the running attempt: a worker never answers with a result the
//! coordinator refuses, which would leave the task running until its deadline.
//!
//! Run: `cd fuzz && cargo fuzz run nats_task_assignment corpus/nats_task_assignment seeds/nats_task_assignment`

#![no_main]

use libfuzzer_sys::fuzz_target;
use trellis_agent_worker::fuzzing;
use trellis_fuzz::Live;
use trellis_wire::worker;

fuzz_target!(|data: &[u8]| {
    let valid = worker::decode_task_assignment(data).is_ok();
    let Some(assignment) = fuzzing::accept_assignment(data) else {
        assert!(
            !valid,
            "the worker set aside an assignment the contract accepts"
        );
        return;
    };
    let Some(mut result) = fuzzing::pure_builtin_result(&assignment, "fuzz-worker") else {
        return;
    };
    if !valid {
        return;
    }
    // The result goes back to a running attempt of the live execution.
    let mut live = Live::new();
    let (instance, attempt) = live.attempts()[0];
    result.execution_id = live.exec.id().to_string();
    result.task_instance_id = instance.to_string();
    result.attempt = attempt;
    let (_, event) = match worker::result_to_event(&result, live.now) {
        Ok(converted) => converted,
        Err(err) => panic!("the coordinator refuses a built-in's result: {err}\n{result:?}"),
    };
    if let Err(err) = live.deliver(event) {
        panic!("the state machine refuses a built-in's result: {err}\n{result:?}");
    }
    live.decide();
    live.check();
});
