//! The dispatch window: how many tasks of one execution wait for a worker at once.

use super::window::{
    completed, coordinator, dispatched, heartbeat_running, own_shard_0, start, turn,
};
use crate::turn::Input;
use trellis_proto::v1;

/// An execution keeps at most the window's tasks in flight; each result lets one more go,
/// and every task still runs.
#[test]
fn an_execution_keeps_no_more_than_its_window_in_flight() {
    let mut coordinator = coordinator(3);
    own_shard_0(&mut coordinator);
    let mut in_flight = dispatched(turn(&mut coordinator, vec![start(10)], 3));
    assert_eq!(in_flight.len(), 3, "the window's worth dispatched at once");
    let mut ran = 0;
    let mut now = 4;
    while let Some(done) = in_flight.pop() {
        ran += 1;
        let more = dispatched(turn(
            &mut coordinator,
            vec![Input::Results(vec![completed(&done.payload, now)])],
            now,
        ));
        assert!(more.len() <= 1, "one finished, at most one more: {more:?}");
        in_flight.extend(more);
        assert!(in_flight.len() <= 3, "never more than the window in flight");
        now += 1;
    }
    assert_eq!(ran, 10, "every task ran");
}

/// The window counts the tasks waiting for a worker: once a heartbeat shows a dispatched
/// task running on a worker, its room goes to the next one, so tasks that run for long fill
/// a fleet's slots while the queue never holds more than the window of one execution.
#[test]
fn a_task_a_worker_started_leaves_the_window() {
    let mut coordinator = coordinator(3);
    own_shard_0(&mut coordinator);
    let first = dispatched(turn(&mut coordinator, vec![start(10)], 3));
    assert_eq!(first.len(), 3, "the window's worth dispatched at once");
    let running = |assigns: &[crate::turn::Assign]| -> Vec<v1::RunningTask> {
        assigns
            .iter()
            .map(|assign| v1::RunningTask {
                execution_id: assign.execution.to_string(),
                task_instance_id: assign.instance.to_string(),
                attempt: assign.attempt,
                started_at_unix_ms: 4,
                ..Default::default()
            })
            .collect()
    };
    // Two of the three start: two more go, and the queue holds three again.
    let second = dispatched(turn(
        &mut coordinator,
        vec![heartbeat_running("w", 16, running(&first[..2]), 5)],
        5,
    ));
    assert_eq!(second.len(), 2, "room for those that started: {second:?}");
    // The same heartbeat again changes nothing.
    let again = dispatched(turn(
        &mut coordinator,
        vec![heartbeat_running("w", 16, running(&first[..2]), 6)],
        6,
    ));
    assert!(again.is_empty(), "a start counts once: {again:?}");
    // A started task that completes frees no room in the queue; one that never started does.
    let after_started = dispatched(turn(
        &mut coordinator,
        vec![Input::Results(vec![completed(&first[0].payload, 7)])],
        7,
    ));
    assert!(after_started.is_empty(), "{after_started:?}");
    let after_queued = dispatched(turn(
        &mut coordinator,
        vec![Input::Results(vec![completed(&first[2].payload, 8)])],
        8,
    ));
    assert_eq!(after_queued.len(), 1, "{after_queued:?}");
}

/// Without a window (0) every ready task goes at once.
#[test]
fn no_window_dispatches_every_ready_task() {
    let mut coordinator = coordinator(0);
    own_shard_0(&mut coordinator);
    assert_eq!(
        dispatched(turn(&mut coordinator, vec![start(10)], 3)).len(),
        10
    );
}
