//! An assignment offered to a worker directly has no task message to bring it back if that
//! worker dies: the turn watches it as it watches an inherited attempt.

use prost::Message as _;
use trellis_core::ids::ExecutionId;
use trellis_proto::v1;

use super::super::takeover::LAPSE_MS;
use super::window::{completed, config, coordinator, dispatched, own_shard_0, start, turn};
use crate::turn::{Assign, Config, Coordinator, Effects, Input};

const NOW: u64 = 1_700_000_000_000;

/// A coordinator that offers fast-lane assignments to idle workers first.
fn coordinator_offering() -> Coordinator {
    let config = Config {
        offers: true,
        ..config(None, 0)
    };
    Coordinator::new(config, &trellis_telemetry::Registry::default())
}

/// Starts a one-task execution at [`NOW`] and returns its assignment.
fn started(coordinator: &mut Coordinator) -> Assign {
    own_shard_0(coordinator);
    let mut sent = dispatched(turn(coordinator, vec![start(1)], NOW));
    assert_eq!(sent.len(), 1, "one task dispatched");
    sent.remove(0)
}

/// A heartbeat of worker `w` naming `assign`'s attempt as running.
fn naming(assign: &Assign, now: u64) -> Input {
    let heartbeat = v1::WorkerHeartbeat {
        worker_id: "w".to_owned(),
        queues: vec!["noop".to_owned()],
        slots: 8,
        running: vec![v1::RunningTask {
            execution_id: assign.execution.to_string(),
            task_instance_id: assign.instance.to_string(),
            attempt: assign.attempt,
            started_at_unix_ms: i64::try_from(NOW).unwrap_or(i64::MAX),
            ..Default::default()
        }],
        sent_at_unix_ms: i64::try_from(now).unwrap_or(i64::MAX),
        ..Default::default()
    };
    Input::Heartbeat(heartbeat.encode_to_vec().into())
}

/// The turn's word that an offer of `assign`'s instance at `attempt` went to the stream.
fn refused(assign: &Assign, attempt: u32) -> Input {
    Input::OfferRefused {
        id: assign.execution,
        instance: assign.instance,
        attempt,
    }
}

/// Offers a one-task execution's task, gives the coordinator `input` about it (made from its
/// assignment), then lets the clock run to `tick_at`: the offered assignment and the attempts
/// dispatched again at that tick.
fn after(input: impl FnOnce(&Assign) -> Input, tick_at: u64) -> (Assign, Vec<(ExecutionId, u32)>) {
    let mut coordinator = coordinator_offering();
    let offered = started(&mut coordinator);
    turn(&mut coordinator, vec![input(&offered)], NOW + 1);
    let ticked = turn(&mut coordinator, vec![Input::Tick], tick_at);
    (offered, again(ticked))
}

/// The attempts a turn dispatched again, as (execution, attempt).
fn again(effects: Effects) -> Vec<(ExecutionId, u32)> {
    dispatched(effects)
        .into_iter()
        .map(|assign| (assign.execution, assign.attempt))
        .collect()
}

#[test]
fn only_a_coordinator_that_offers_marks_its_fast_lane_assignments_offered() {
    let offered = started(&mut coordinator_offering());
    assert!(offered.fast && offered.offer, "{offered:?}");
    let plain = started(&mut coordinator(0));
    assert!(plain.fast && !plain.offer, "{plain:?}");
}

/// No heartbeat names the offered attempt: once the lapse is over it is lost, a cancel goes
/// out in case a cut-off worker still runs it, and the task is dispatched again.
#[test]
fn an_offered_attempt_no_heartbeat_names_is_lost_and_dispatched_again() {
    let mut coordinator = coordinator_offering();
    let offered = started(&mut coordinator);
    let early = turn(&mut coordinator, vec![Input::Tick], NOW + LAPSE_MS - 1);
    assert!(again(early).is_empty(), "not before the lapse");
    let late = turn(&mut coordinator, vec![Input::Tick], NOW + LAPSE_MS);
    assert_eq!(late.cancels.len(), 1, "the lost attempt is cancelled");
    assert_eq!(again(late), [(offered.execution, offered.attempt + 1)]);
}

/// The attempt after a lost one is not offered: it goes to the stream, whose delivery count
/// bounds a task that kills its workers, and carries the delivery the lost attempt spent, which
/// the worker counts with the message's own against its `max_deliveries`.
#[test]
fn the_attempt_after_a_lost_one_goes_to_the_stream_counting_the_lost_delivery() {
    let mut coordinator = coordinator_offering();
    let offered = started(&mut coordinator);
    let first = v1::TaskAssignment::decode(offered.payload.clone()).expect("an assignment");
    assert_eq!(first.lost_deliveries, 0);
    let late = turn(&mut coordinator, vec![Input::Tick], NOW + LAPSE_MS);
    let [next] = dispatched(late)
        .try_into()
        .expect("one attempt dispatched again");
    assert!(next.fast && !next.offer, "{next:?}");
    let message = v1::TaskAssignment::decode(next.payload).expect("an assignment");
    assert_eq!((message.attempt, message.lost_deliveries), (2, 1));
}

/// A heartbeat that names it keeps it, for a lapse from that heartbeat.
#[test]
fn a_heartbeat_naming_an_offered_attempt_keeps_it() {
    let mut coordinator = coordinator_offering();
    let offered = started(&mut coordinator);
    let heard = NOW + LAPSE_MS / 2;
    turn(&mut coordinator, vec![naming(&offered, heard)], heard);
    let kept = turn(&mut coordinator, vec![Input::Tick], NOW + LAPSE_MS);
    assert!(again(kept).is_empty(), "named within the lapse");
    let lost = turn(&mut coordinator, vec![Input::Tick], heard + LAPSE_MS);
    assert_eq!(again(lost), [(offered.execution, offered.attempt + 1)]);
}

/// An offer no worker took went to the stream, whose redelivery brings the attempt back: the
/// watch ends. So does the attempt's end.
#[test]
fn a_refused_offer_or_a_result_ends_the_watch() {
    let (_, again) = after(
        |offered| refused(offered, offered.attempt),
        NOW + 10 * LAPSE_MS,
    );
    assert!(again.is_empty(), "refused: the stream has it");
    let completed = |offered: &Assign| Input::Results(vec![completed(&offered.payload, 1)]);
    let (_, again) = after(completed, NOW + 10 * LAPSE_MS);
    assert!(again.is_empty(), "completed: nothing to watch");
}

/// A refusal of another attempt changes nothing.
#[test]
fn a_refusal_of_another_attempt_keeps_the_watch() {
    let (offered, again) = after(
        |offered| refused(offered, offered.attempt + 1),
        NOW + LAPSE_MS,
    );
    assert_eq!(again, [(offered.execution, offered.attempt + 1)]);
}
