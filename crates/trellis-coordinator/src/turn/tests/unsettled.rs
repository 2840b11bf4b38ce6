//! What the tick and the checkpoint policy sweep: finished executions leave it.

use prost::Message as _;
use trellis_core::ids::ExecutionId;
use trellis_grpc::access::Scope;
use trellis_proto::v1;

use super::window::{completed, coordinator_checkpointed, dispatched, own_shard_0, start, turn};
use crate::turn::{Action, Assign, Input, Request};

/// A finished execution leaves what the tick and the checkpoint policy sweep each turn, so
/// those sweeps cost the running executions only; asked for a checkpoint, it is swept again
/// and the checkpoint is taken.
#[test]
fn a_finished_execution_leaves_the_sweeps_until_it_is_touched_again() {
    let mut coordinator = coordinator_checkpointed(1_000);
    own_shard_0(&mut coordinator);
    let now = 1_700_000_000_000;
    let running = dispatched(turn(&mut coordinator, vec![start(2)], now));
    // Five one-task executions finish: most of those in memory are then finished, and the
    // sweeps go by the set rather than over the whole map.
    let finishing = dispatched(turn(
        &mut coordinator,
        vec![start(1), start(1), start(1), start(1), start(1)],
        now + 1,
    ));
    let id_of = |assign: &Assign| {
        let assignment = v1::TaskAssignment::decode(assign.payload.clone()).expect("one");
        ExecutionId(assignment.execution_id.parse().expect("an execution id"))
    };
    let (running_id, finished_id) = (id_of(&running[0]), id_of(&finishing[0]));
    let results = (0..5).map(|i| completed(&finishing[i].payload, 1 + i as u64));
    turn(
        &mut coordinator,
        vec![Input::Results(results.collect())],
        now + 2,
    );
    assert!(
        coordinator
            .execution(finished_id)
            .is_some_and(|e| e.state().is_terminal()),
        "finished, and still in memory"
    );
    turn(&mut coordinator, vec![Input::Tick], now + 3);
    assert_eq!(
        coordinator.unsettled.iter().collect::<Vec<_>>(),
        [&running_id],
        "the tick after it finished lets it go"
    );

    // A checkpoint asked of it brings it back; the interval since its start has passed.
    let ask = Input::Request {
        reply: 7,
        request: Request::On {
            id: finished_id,
            scope: Scope::All,
            action: Action::Checkpoint,
        },
    };
    let asked = turn(&mut coordinator, vec![ask], now + 4);
    assert_eq!(
        asked.checkpoints.len(),
        1,
        "the checkpoint asked for is taken"
    );
    assert_eq!(asked.checkpoints[0].id, finished_id);
    assert!(coordinator.unsettled.contains(&finished_id));
    let done = Input::CheckpointDone {
        id: finished_id,
        full: true,
        sequence: asked.checkpoints[0].sequence,
        result: Ok(v1::CheckpointMetadata::default()),
    };
    turn(&mut coordinator, vec![done, Input::Tick], now + 5);
    assert!(
        !coordinator.unsettled.contains(&finished_id),
        "settled again once its checkpoint is stored"
    );
    assert!(coordinator.unsettled.contains(&running_id), "still running");
}
