//! Large starts built off the loop (`Config::build_off_the_loop`): admitted first and given an id
//! and a start time (`Answer::Build`), their starting state built outside the turn for exactly
//! those, then started; what was built is what every replay of the log builds.

use prost::Message as _;
use trellis_core::ids::ExecutionId;
use trellis_grpc::access::Principal;
use trellis_proto::v1;
use trellis_wire::replay::Replayer;

use super::reserve::{NOW, keys, reserved};
use super::window::{
    coordinator_building, dispatched, prepared, start_as, stored, turn, two_namespaces,
};
use crate::turn::{Answer, Coordinator, ErrorKind, Input, Prepared, Request, USE_WITHIN_MS};

/// Plans of this many tasks or more are built off the loop in these tests.
const LARGE: usize = 5;

/// A start of a plan of `tasks` tasks under idempotency `key` (none when empty).
fn start(plan: Prepared, key: &str) -> Input {
    Input::Request {
        reply: 1,
        request: Request::Start {
            plan: Box::new(plan),
            options: v1::ExecutionOptions {
                idempotency_key: key.to_owned(),
                ..Default::default()
            },
            principal: Principal::anonymous(),
            traceparent: String::new(),
            follow: None,
        },
    }
}

/// The answers of a turn's writes or effects: each answer, or its error's kind.
fn answers(
    replies: Vec<(u64, Result<Answer, crate::turn::Error>)>,
) -> Vec<Result<Answer, ErrorKind>> {
    replies
        .into_iter()
        .map(|(_, answer)| answer.map_err(|err| err.kind))
        .collect()
}

/// A first pass: the start of a large plan at `now` is answered at once with the id and time to
/// build for, and writes nothing. Returns them with the plan, built.
fn first_pass(coordinator: &mut Coordinator, key: &str, now: u64) -> (ExecutionId, u64, Prepared) {
    let writes = coordinator.turn(vec![start(prepared(LARGE, ""), key)], now);
    assert!(
        writes.appends.is_empty(),
        "nothing is written before the build"
    );
    let [Ok(Answer::Build { id, at_ms, plan })] =
        <[_; 1]>::try_from(answers(writes.replies)).expect("one answer")
    else {
        panic!("a large start is first built");
    };
    let mut plan = *plan;
    plan.build(id, at_ms);
    (id, at_ms, plan)
}

/// The first pass gives an id and a time; the second, later, starts the execution with that id
/// and the state built for that time: the log records that time, a replay of the first append
/// runs the very tasks the turn dispatched, and the caller learns the id once it is stored.
#[test]
fn a_large_start_starts_with_the_state_built_for_the_id_and_time_it_was_given() {
    let mut coordinator = coordinator_building(None, LARGE);
    let ids = reserved(&mut coordinator, 4);
    let (id, at_ms, built) = first_pass(&mut coordinator, "", NOW + 2);
    assert_eq!(
        (id, at_ms),
        (ids[0], NOW + 2),
        "a reserved id, the turn's time"
    );
    let writes = coordinator.turn(vec![start(built, "")], NOW + 7);
    let [append] = writes.appends.as_slice() else {
        panic!("one append: {:?}", writes.appends);
    };
    assert_eq!(
        (append.id, &append.index_put),
        (id, &None),
        "its reserved id"
    );
    let (replay, _) =
        Replayer::from_first_message(id, &append.messages[0].1).expect("the first append replays");
    assert_eq!(
        replay.started().started_at_ms,
        at_ms,
        "built for the time given"
    );
    let mut effects = stored(&mut coordinator, &writes, NOW + 7);
    let answered = answers(std::mem::take(&mut effects.replies));
    let mut sent: Vec<String> = dispatched(effects)
        .iter()
        .map(|assign| {
            v1::TaskAssignment::decode(assign.payload.clone())
                .expect("an assignment")
                .task_instance_id
        })
        .collect();
    let mut replayed: Vec<String> = replay
        .machine()
        .running_on(&|_| true)
        .iter()
        .map(|(instance, _)| instance.to_string())
        .collect();
    sent.sort();
    replayed.sort();
    assert_eq!(sent.len(), LARGE, "every task dispatched");
    assert_eq!(sent, replayed, "the replay runs the tasks the turn sent");
    assert!(
        matches!(answered.as_slice(), [Ok(Answer::Started { id: started, created: true })] if *started == id),
        "{answered:?}"
    );
}

/// Two starts of one idempotency key built at once: the first to come back starts the
/// execution, the second is answered with it, and the id held for the second leaves the index.
#[test]
fn a_start_built_beside_another_of_its_key_gets_that_one_and_gives_its_id_up() {
    let mut coordinator = coordinator_building(None, LARGE);
    reserved(&mut coordinator, 4);
    let (first, _, first_built) = first_pass(&mut coordinator, "k", NOW + 2);
    let (second, _, second_built) = first_pass(&mut coordinator, "k", NOW + 3);
    assert_ne!(first, second, "each build holds its own id");
    let writes = coordinator.turn(vec![start(first_built, "k")], NOW + 4);
    stored(&mut coordinator, &writes, NOW + 4);
    let writes = coordinator.turn(vec![start(second_built, "k")], NOW + 5);
    assert!(writes.appends.is_empty(), "nothing more is started");
    let effects = stored(&mut coordinator, &writes, NOW + 5);
    let answered = answers(effects.replies);
    assert!(
        matches!(answered.as_slice(), [Ok(Answer::Started { id, created: false })] if *id == first),
        "{answered:?}"
    );
    assert_eq!(
        effects.index_deletes,
        keys(&[second]),
        "the unused id leaves the index"
    );
}

/// A shard lost while a start is built: the id held for it leaves the index with the shard's
/// other reservations, and the start, come back, is refused as not owned here.
#[test]
fn a_start_built_for_a_shard_lost_meanwhile_is_refused() {
    let mut coordinator = coordinator_building(None, LARGE);
    let ids = reserved(&mut coordinator, 2);
    let (id, _, built) = first_pass(&mut coordinator, "", NOW + 2);
    let effects = turn(&mut coordinator, vec![Input::LeaseLost(0)], NOW + 3);
    let mut deleted = effects.index_deletes;
    deleted.sort();
    assert_eq!(deleted, keys(&ids[..2]), "the held id and the unused one");
    assert!(deleted.contains(&crate::turn::index_key(0, id)));
    let writes = coordinator.turn(vec![start(built, "")], NOW + 4);
    assert!(writes.appends.is_empty());
    let answered = answers(writes.replies);
    assert!(
        matches!(answered.as_slice(), [Err(ErrorKind::NotOwned { .. })]),
        "{answered:?}"
    );
}

/// A build that does not come back within `USE_WITHIN_MS` gives its id up; if it comes back
/// after all, the start takes another id and builds in the turn: what was built for the old id
/// is never used.
#[test]
fn a_build_that_comes_back_late_is_not_used() {
    let mut coordinator = coordinator_building(None, LARGE);
    reserved(&mut coordinator, 4);
    let (id, at_ms, built) = first_pass(&mut coordinator, "", NOW + 2);
    let late = NOW + 2 + USE_WITHIN_MS;
    let effects = turn(&mut coordinator, Vec::new(), late);
    assert!(
        effects
            .index_deletes
            .contains(&crate::turn::index_key(0, id)),
        "given up: {:?}",
        effects.index_deletes
    );
    let writes = coordinator.turn(vec![start(built, "")], late + 1);
    let [append] = writes.appends.as_slice() else {
        panic!("started in the turn: {:?}", writes.replies);
    };
    assert_ne!(append.id, id, "another id");
    let (replay, _) = Replayer::from_first_message(append.id, &append.messages[0].1)
        .expect("the first append replays");
    assert_ne!(
        replay.started().started_at_ms,
        at_ms,
        "built in the turn, for its time"
    );
}

/// A quota's cap changes the plan in the turn, so a capped large start is built there, at once.
#[test]
fn a_large_start_a_quota_caps_is_built_in_the_turn() {
    let access = two_namespaces();
    let principal = access
        .authenticate("token-of-small")
        .expect("a known token")
        .clone();
    let mut coordinator = coordinator_building(Some(access.clone()), LARGE);
    super::window::own_shard_0(&mut coordinator);
    let writes = coordinator.turn(vec![start_as(LARGE, "max_concurrency: 8", principal)], 3);
    assert_eq!(
        writes.appends.len(),
        1,
        "started at once: {:?}",
        writes.replies
    );
    assert_eq!(
        super::window::recorded_plan(&writes)
            .options
            .max_concurrency,
        Some(2)
    );
}

/// A finished execution as large as a plan built off the loop leaves memory through the turn's
/// effects, for the executor to drop off the loop; a smaller one is dropped in the turn. Both are
/// gone from the coordinator's memory either way.
#[test]
fn a_large_finished_execution_is_dropped_off_the_loop() {
    let mut coordinator = coordinator_building(None, LARGE);
    reserved(&mut coordinator, 4);
    let (large, _, built) = first_pass(&mut coordinator, "", NOW + 2);
    let writes = coordinator.turn(vec![start(built, "")], NOW + 3);
    let mut running = dispatched(stored(&mut coordinator, &writes, NOW + 3));
    let small_start = start(prepared(LARGE - 1, ""), "");
    running.extend(dispatched(turn(
        &mut coordinator,
        vec![small_start],
        NOW + 4,
    )));
    assert_eq!(running.len(), 2 * LARGE - 1, "both executions' tasks run");
    let results = running
        .iter()
        .zip(0..)
        .map(|(assign, token)| super::window::completed(&assign.payload, token))
        .collect();
    let effects = turn(&mut coordinator, vec![Input::Results(results)], NOW + 5);
    assert!(
        effects.retired.is_empty(),
        "nothing leaves memory at its end"
    );
    assert_eq!(coordinator.executions.len(), 2);
    let keep = coordinator.config.keep_finished_ms;
    let effects = turn(&mut coordinator, vec![Input::Tick], NOW + 5 + keep);
    assert!(coordinator.executions.is_empty(), "both left memory");
    assert_eq!(
        effects.retired.len(),
        1,
        "the large one to drop off the loop"
    );
    let Some(left) = effects.retired.0.first() else {
        unreachable!("one retired");
    };
    assert_eq!(left.machine.id(), large);
}
