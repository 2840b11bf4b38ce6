//! The clock touches an execution only when something of it is due.

use trellis_core::ids::ExecutionId;
use trellis_grpc::access::{Principal, Scope};
use trellis_proto::v1;

use super::window::{
    completed, coordinator, coordinator_checkpointed, dispatched, own_shard_0, start, start_as,
    turn,
};
use crate::turn::{Action, Coordinator, Input, Request};

/// The ids of the executions in memory that `before` did not hold.
fn new_ids(coordinator: &Coordinator, before: &[ExecutionId]) -> Vec<ExecutionId> {
    coordinator
        .execution_ids()
        .filter(|id| !before.contains(id))
        .collect()
}

/// An execution with a global timeout is entered in the timers at that time and times out at
/// the first tick after it; one with nothing timed is never touched by a tick.
#[test]
fn a_tick_touches_only_the_executions_whose_clock_is_due() {
    let mut coordinator = coordinator(0);
    own_shard_0(&mut coordinator);
    let now = 1_700_000_000_000;
    turn(&mut coordinator, vec![start(1)], now);
    let untimed = new_ids(&coordinator, &[]);
    let timed_start = start_as(1, "global_timeout: 10s", Principal::anonymous());
    turn(&mut coordinator, vec![timed_start], now + 1);
    let timed = new_ids(&coordinator, &untimed);
    let (untimed, timed) = (untimed[0], timed[0]);
    // Their progress snapshots went out with their start: only the timeout is left to wait for.
    let entered =
        |coordinator: &Coordinator| coordinator.timers.iter().copied().collect::<Vec<_>>();
    assert_eq!(entered(&coordinator), [(now + 1 + 10_000, timed)]);

    let ticked = turn(&mut coordinator, vec![Input::Tick], now + 5_000);
    assert!(
        ticked.progress.is_empty() && ticked.observed.is_empty(),
        "a tick with nothing due touches nobody"
    );
    assert_eq!(entered(&coordinator), [(now + 1 + 10_000, timed)]);

    let ticked = turn(&mut coordinator, vec![Input::Tick], now + 1 + 10_000);
    let state = |id| coordinator.execution(id).map(|e| e.state().as_str());
    assert_eq!(state(timed), Some("failed"), "timed out by the clock alone");
    assert_eq!(state(untimed), Some("running"));
    assert_eq!(
        ticked.observed.iter().map(|o| o.id).collect::<Vec<_>>(),
        [timed],
        "only the timed-out execution changed"
    );
    assert!(
        entered(&coordinator).is_empty(),
        "a finished one waits for no clock"
    );
}

/// A running execution nothing happens to is checkpointed once its interval has passed, by
/// its timer; a finished one is looked at again when a checkpoint is asked of it.
#[test]
fn the_checkpoint_policy_looks_at_what_is_touched_and_due() {
    let mut coordinator = coordinator_checkpointed(1_000);
    own_shard_0(&mut coordinator);
    let now = 1_700_000_000_000;
    let running = dispatched(turn(&mut coordinator, vec![start(1)], now));
    let id = new_ids(&coordinator, &[])[0];
    let before = turn(&mut coordinator, vec![Input::Tick], now + 999);
    assert!(before.checkpoints.is_empty(), "none within the interval");
    let due = turn(&mut coordinator, vec![Input::Tick], now + 1_000);
    assert_eq!(
        due.checkpoints.iter().map(|job| job.id).collect::<Vec<_>>(),
        [id],
        "the interval's timer brings it to the policy"
    );
    let done = |sequence| Input::CheckpointDone {
        id,
        full: true,
        sequence,
        result: Ok(v1::CheckpointMetadata::default()),
    };
    turn(
        &mut coordinator,
        vec![done(due.checkpoints[0].sequence)],
        now + 1_001,
    );
    assert!(
        coordinator.timers.is_empty(),
        "nothing changed since: no clock to wait for"
    );

    // It finishes; later a checkpoint is asked of it.
    turn(
        &mut coordinator,
        vec![Input::Results(vec![completed(&running[0].payload, 1)])],
        now + 1_002,
    );
    assert!(
        coordinator
            .execution(id)
            .is_some_and(|e| e.state().is_terminal())
    );
    let ticked = turn(&mut coordinator, vec![Input::Tick], now + 5_000);
    assert!(
        ticked.checkpoints.is_empty(),
        "a finished one has no interval"
    );
    let ask = Input::Request {
        reply: 7,
        request: Request::On {
            id,
            scope: Scope::All,
            action: Action::Checkpoint,
        },
    };
    let asked = turn(&mut coordinator, vec![ask], now + 5_001);
    assert_eq!(
        asked
            .checkpoints
            .iter()
            .map(|job| job.id)
            .collect::<Vec<_>>(),
        [id],
        "the checkpoint asked for is taken"
    );
    // The answer goes out at once, with the turn's writes.
    let answered = coordinator.turn(vec![done(asked.checkpoints[0].sequence)], now + 5_002);
    assert!(
        answered
            .replies
            .iter()
            .any(|(reply, answer)| *reply == 7 && answer.is_ok()),
        "the caller learns of its checkpoint"
    );
}
