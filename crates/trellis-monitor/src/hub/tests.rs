//! The hub's replay policy and what the task drawer shows of questions.

use std::sync::Arc;

use trellis_core::machine::{Event, EventBody, Execution, Question, TimeoutAction};
use trellis_core::plan::{Limits, compile_str};
use trellis_wire::log::{Started, event_batch_to_proto, started_to_proto};

use super::*;

const SPEC: &str = "name: p\ntasks:\n  - {id: a, type: noop}\n";

/// A new execution of a one-task plan and its first log message (`ExecutionStarted`).
fn first_message() -> (ExecutionId, Vec<u8>) {
    let id = ExecutionId(uuid::Uuid::now_v7());
    let spec = SPEC;
    let plan = compile_str(spec, &Limits::default()).expect("the plan compiles");
    let started = Started {
        spec: spec.to_owned(),
        run_number: 1,
        started_at_ms: 1,
        compiled_plan: trellis_core::plan::encode(&plan),
        ..Started::default()
    };
    let first = v1::EventBatch {
        events: vec![started_to_proto(id, &started)],
    };
    (id, first.encode_to_vec())
}

/// The one replay policy: a gap in the log fails the hub with the execution and the first
/// missing sequence, and the projection keeps what it had.
#[test]
fn a_gap_fails_the_hub_with_the_missing_sequence() {
    let (id, first) = first_message();
    let hub = Hub::new(id, 1);
    hub.ingest(&first, 1, 0);
    assert_eq!(*hub.readiness.borrow(), Readiness::Ready);
    let resume = Event {
        at_ms: 2,
        body: EventBody::resume(),
    };
    hub.ingest(
        &event_batch_to_proto(id, 3, &[resume]).encode_to_vec(),
        2,
        0,
    );
    let Readiness::Failed(HubError::Replay(message)) = hub.readiness.borrow().clone() else {
        panic!("the hub did not fail: {:?}", *hub.readiness.borrow());
    };
    assert!(
        message.contains(&format!("execution {id}, sequence 2: missing")),
        "{message}"
    );
    assert!(hub.plan().is_some(), "the projection keeps what it had");
}

/// What the fuzz target drives: a log that replays is followed, one message that is not an
/// event batch fails the hub, whatever came before it.
#[test]
fn the_fuzzed_reader_follows_a_good_log_and_stops_at_garbage() {
    let (id, first) = first_message();
    let resume = Event {
        at_ms: 2,
        body: EventBody::resume(),
    };
    let second = event_batch_to_proto(id, 2, &[resume]).encode_to_vec();
    assert!(fuzzing::follow(id, &[&first, &second, &second]));
    assert!(!fuzzing::follow(id, &[&first, b"\xff\xff garbage"]));
}

/// Cancelling the execution withdraws the question its task waited on: no event says so, and
/// the drawer shows the question withdrawn rather than waiting for an answer.
#[test]
fn a_cancelled_asker_s_question_is_shown_withdrawn() {
    let (id, first) = first_message();
    let hub = Hub::new(id, 1);
    hub.ingest(&first, 1, 0);
    // The coordinator's side: the same machine, so the events name the instance it made.
    let plan = compile_str(SPEC, &Limits::default()).expect("the plan compiles");
    let mut machine = Execution::start(id, Arc::new(plan), 1, 1);
    let mut events: Vec<Event> = machine
        .decide(2)
        .into_iter()
        .map(|command| command.into_event(2))
        .collect();
    for event in &events {
        machine.apply(event).expect("the dispatch applies");
    }
    let asker = machine
        .instances_in(TaskState::Running)
        .next()
        .expect("task a runs");
    let question = Question {
        id: trellis_core::ids::QuestionId::derived(3, 1),
        question_type: "approval".to_owned(),
        priority: "low".to_owned(),
        text: "ok?".to_owned(),
        options: Vec::new(),
        expires_at_ms: None,
        timeout_action: TimeoutAction::Fail,
    };
    events.push(Event {
        at_ms: 3,
        body: EventBody::QuestionAsked {
            instance: asker,
            attempt: 1,
            question,
        },
    });
    let outcome = |hub: &Hub| {
        hub.instance(asker)
            .and_then(|detail| detail.questions.first().map(|q| q.outcome))
    };
    hub.ingest(&event_batch_to_proto(id, 2, &events).encode_to_vec(), 2, 0);
    assert_eq!(*hub.readiness.borrow(), Readiness::Ready);
    assert_eq!(outcome(&hub), Some("open"));

    let cancel = Event {
        at_ms: 4,
        body: EventBody::CancelRequested {
            reason: "test".to_owned(),
        },
    };
    let sequence = 2 + events.len() as u64;
    hub.ingest(
        &event_batch_to_proto(id, sequence, &[cancel]).encode_to_vec(),
        3,
        0,
    );
    assert_eq!(*hub.readiness.borrow(), Readiness::Ready);
    assert_eq!(outcome(&hub), Some("withdrawn"));
}
