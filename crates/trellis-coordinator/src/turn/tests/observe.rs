//! What observing an execution starts from (`Action::Observe`).

use prost::Message as _;
use trellis_core::ids::ExecutionId;
use trellis_grpc::access::Scope;
use trellis_proto::v1;

use super::window::{completed, coordinator, dispatched, own_shard_0, start, turn};
use crate::turn::{Action, Answer, Coordinator, Input, Observation, Request};

/// The observation the turn answers for execution `id`, observed from its first event.
fn observe(coordinator: &mut Coordinator, id: ExecutionId, now: u64) -> Observation {
    let input = Input::Request {
        reply: 9,
        request: Request::On {
            id,
            scope: Scope::All,
            action: Action::Observe { from: 1 },
        },
    };
    let writes = coordinator.turn(vec![input], now);
    match writes.replies.into_iter().next() {
        Some((9, Ok(Answer::Observation(observation)))) => observation,
        other => panic!("an observation, not {other:?}"),
    }
}

/// A running execution's observation carries no progress (its live batches will); a finished
/// one's carries the final progress with the whole history, so its observer learns how it
/// ended from the stream alone.
#[test]
fn a_finished_execution_is_observed_with_its_final_progress() {
    let mut coordinator = coordinator(0);
    own_shard_0(&mut coordinator);
    let assigned = dispatched(turn(&mut coordinator, vec![start(1)], 3));
    let [task] = assigned.as_slice() else {
        panic!("one task dispatched: {assigned:?}");
    };
    let assignment = v1::TaskAssignment::decode(&task.payload[..]).expect("an assignment");
    let id: ExecutionId = assignment.execution_id.parse().expect("an execution id");

    let running = observe(&mut coordinator, id, 4);
    assert!(!running.terminal, "still running");
    assert_eq!(running.progress, None, "no progress before the end");

    turn(
        &mut coordinator,
        vec![Input::Results(vec![completed(&task.payload, 5)])],
        5,
    );
    let finished = observe(&mut coordinator, id, 6);
    assert!(finished.terminal, "over");
    let progress = finished.progress.expect("the final progress");
    assert_eq!(progress.state, v1::ExecutionState::Completed as i32);
    let last = finished.history.last().expect("a history").sequence;
    assert_eq!(
        progress.sequence, last,
        "the progress right after the last event"
    );
    assert_eq!(progress.done, 1, "its one task done");
}
