//! What observing an execution starts from (`Action::Observe`).

use prost::Message as _;
use trellis_core::ids::ExecutionId;
use trellis_grpc::access::Scope;
use trellis_proto::v1;

use super::window::{completed, coordinator, dispatched, own_shard_0, start, turn};
use crate::turn::{Action, Answer, Coordinator, Input, Observation, Request};

/// The observation the turn answers for execution `id`, observed from its first event.
fn observe(coordinator: &mut Coordinator, id: ExecutionId, now: u64) -> Observation {
    observe_from(coordinator, id, 1, now)
}

/// The observation the turn answers for execution `id`, observed from sequence `from`.
fn observe_from(
    coordinator: &mut Coordinator,
    id: ExecutionId,
    from: u64,
    now: u64,
) -> Observation {
    let action = Action::Observe {
        from,
        progress_only: false,
    };
    answer(coordinator, id, action, now)
}

/// The observation the turn answers to `action` on execution `id`.
fn answer(coordinator: &mut Coordinator, id: ExecutionId, action: Action, now: u64) -> Observation {
    let input = Input::Request {
        reply: 9,
        request: Request::On {
            id,
            scope: Scope::All,
            action,
        },
    };
    let writes = coordinator.turn(vec![input], now);
    match writes.replies.into_iter().next() {
        Some((9, Ok(Answer::Observation(observation)))) => observation,
        other => panic!("an observation, not {other:?}"),
    }
}

/// Starts a one-task execution on `coordinator` (taking shard 0 first): its id and its task's
/// assignment.
fn one_task(coordinator: &mut Coordinator) -> (ExecutionId, Vec<u8>) {
    own_shard_0(coordinator);
    let assigned = dispatched(turn(coordinator, vec![start(1)], 3));
    let [task] = assigned.as_slice() else {
        panic!("one task dispatched: {assigned:?}");
    };
    let assignment = v1::TaskAssignment::decode(&task.payload[..]).expect("an assignment");
    let id = assignment.execution_id.parse().expect("an execution id");
    (id, task.payload.to_vec())
}

/// A running execution's observation carries no progress (its live batches will); a finished
/// one's carries the final progress with the whole history, so its observer learns how it
/// ended from the stream alone.
#[test]
fn a_finished_execution_is_observed_with_its_final_progress() {
    let mut coordinator = coordinator(0);
    let (id, task) = one_task(&mut coordinator);

    let running = observe(&mut coordinator, id, 4);
    assert!(!running.terminal, "still running");
    assert_eq!(running.progress, None, "no progress before the end");

    turn(
        &mut coordinator,
        vec![Input::Results(vec![completed(&task, 5)])],
        5,
    );
    let finished = observe(&mut coordinator, id, 6);
    assert!(finished.terminal, "over");
    let progress = finished.progress.expect("the final progress");
    assert_eq!(progress.state, v1::ExecutionState::Completed as i32);
    let history = finished.history.events().expect("the history decodes");
    let last = history.last().expect("a history").sequence;
    assert_eq!(
        progress.sequence, last,
        "the progress right after the last event"
    );
    assert_eq!(progress.done, 1, "its one task done");
}

/// Observed from a later sequence, the history holds the events from it on only, though the
/// log's batch holding it begins earlier.
#[test]
fn an_observation_from_a_later_sequence_starts_there() {
    let mut coordinator = coordinator(0);
    let (id, task) = one_task(&mut coordinator);
    turn(
        &mut coordinator,
        vec![Input::Results(vec![completed(&task, 5)])],
        5,
    );
    let whole = observe_from(&mut coordinator, id, 1, 6)
        .history
        .events()
        .expect("the history decodes");
    let sequences: Vec<u64> = whole.iter().map(|event| event.sequence).collect();
    assert!(
        sequences.len() >= 3,
        "a start, a dispatch and an end: {sequences:?}"
    );
    assert_eq!(sequences[0], 1, "from the first event");
    let later = observe_from(&mut coordinator, id, 2, 7)
        .history
        .events()
        .expect("the history decodes");
    let later: Vec<u64> = later.iter().map(|event| event.sequence).collect();
    assert_eq!(later, sequences[1..], "the same events, from the second on");
}

/// Observed for its progress alone, an execution's answer holds no history and its progress
/// now, running or finished.
#[test]
fn a_progress_only_observation_is_the_progress_now() {
    let mut coordinator = coordinator(0);
    let (id, task) = one_task(&mut coordinator);
    let observe = |coordinator: &mut Coordinator, now| {
        let action = Action::Observe {
            from: 1,
            progress_only: true,
        };
        answer(coordinator, id, action, now)
    };

    let running = observe(&mut coordinator, 4);
    assert!(running.progress_only && !running.terminal);
    assert_eq!(running.backfill, None);
    assert_eq!(
        running.history.events().expect("decodes").len(),
        0,
        "no history"
    );
    let progress = running.progress.expect("the progress now");
    assert_eq!(progress.state, v1::ExecutionState::Running as i32);
    assert_eq!(progress.done, 0);

    turn(
        &mut coordinator,
        vec![Input::Results(vec![completed(&task, 5)])],
        5,
    );
    let finished = observe(&mut coordinator, 6);
    assert!(finished.terminal);
    let progress = finished.progress.expect("the final progress");
    assert_eq!(progress.state, v1::ExecutionState::Completed as i32);
    assert_eq!(progress.done, 1, "its one task done");
    assert!(
        progress.sequence >= 3,
        "after a start, a dispatch and an end"
    );
}

/// A start of a one-task plan asking to be followed.
fn followed_start(progress_only: bool) -> Input {
    let Input::Request {
        reply,
        request:
            Request::Start {
                plan,
                options,
                principal,
                traceparent,
                ..
            },
    } = start(1)
    else {
        unreachable!("`start` makes a start request");
    };
    Input::Request {
        reply,
        request: Request::Start {
            plan,
            options,
            principal,
            traceparent,
            follow: Some(crate::turn::Follow { progress_only }),
        },
    }
}

/// A followed start is answered only once its events are stored, with an observation that holds
/// them: the observer subscribed with it is sent what later turns store, and the start's own
/// batch, which the same step hands to the observers already there, is in its history.
#[test]
fn a_followed_start_is_answered_with_its_stored_history_after_its_append() {
    let mut coordinator = coordinator(0);
    own_shard_0(&mut coordinator);
    let writes = coordinator.turn(vec![followed_start(false)], 3);
    assert!(
        writes.replies.is_empty(),
        "nothing is answered before the append"
    );
    let [append] = writes.appends.as_slice() else {
        panic!("one append: {:?}", writes.appends);
    };
    let id = append.id;
    let effects = super::window::stored(&mut coordinator, &writes, 3);
    let [
        (
            1,
            Ok(Answer::Following {
                id: followed,
                created: true,
                observation,
            }),
        ),
    ] = effects.replies.as_slice()
    else {
        panic!("the start, followed: {:?}", effects.replies);
    };
    assert_eq!(*followed, id);
    assert_eq!(observation.execution, id);
    assert!(!observation.terminal);
    let (from, batches) = observation.history.clone().into_batches();
    assert_eq!(from, 1);
    let sequences: Vec<u64> = batches
        .flat_map(|batch| {
            v1::EventBatch::decode(batch)
                .expect("an event batch")
                .events
                .into_iter()
                .map(|event| event.sequence)
        })
        .collect();
    let stored: Vec<u64> = effects
        .observed
        .iter()
        .filter(|observed| observed.id == id)
        .flat_map(|observed| observed.events.iter().map(|event| event.sequence))
        .collect();
    assert!(
        !stored.is_empty(),
        "the start's batch goes to the observers"
    );
    assert_eq!(sequences, stored, "the history is exactly the stored batch");
}

/// Followed for its progress alone, the answer carries the progress after the start's events.
#[test]
fn a_start_followed_for_its_progress_is_answered_with_the_progress_after_it() {
    let mut coordinator = coordinator(0);
    own_shard_0(&mut coordinator);
    let effects = turn(&mut coordinator, vec![followed_start(true)], 3);
    let [(1, Ok(Answer::Following { observation, .. }))] = effects.replies.as_slice() else {
        panic!("the start, followed: {:?}", effects.replies);
    };
    assert!(observation.progress_only);
    let progress = observation.progress.as_ref().expect("the progress now");
    assert_eq!(progress.state, v1::ExecutionState::Running as i32);
    let counts = progress.counts.expect("counts");
    assert_eq!(counts.running + counts.pending, 1, "{counts:?}");
}

/// A followed start whose append another coordinator's write refused did not happen, and says so.
#[test]
fn a_followed_start_whose_append_is_refused_is_refused() {
    let mut coordinator = coordinator(0);
    own_shard_0(&mut coordinator);
    let writes = coordinator.turn(vec![followed_start(false)], 3);
    let refused: Vec<_> = writes
        .appends
        .iter()
        .map(|append| {
            (
                append.id,
                crate::turn::Appended::Fenced {
                    why: "wrong last sequence".to_owned(),
                },
            )
        })
        .collect();
    let effects = coordinator.appended(refused, 3);
    let [(1, Err(err))] = effects.replies.as_slice() else {
        panic!("a refusal: {:?}", effects.replies);
    };
    assert_eq!(err.kind, crate::turn::ErrorKind::Unavailable);
}
