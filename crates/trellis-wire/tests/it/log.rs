//! The event log on the wire: every event survives core → proto → bytes → proto → core unchanged,
//! alone and in batches, `ExecutionStarted` keeps what recovery needs, and malformed events and
//! batches are precise errors.

use std::collections::BTreeMap;

use prost::Message;
use serde_json::{Value, json};
use trellis_core::ids::{ExecutionId, WorkerId};
use trellis_core::machine::{
    Event, EventBody, GroupRule, Outcome, PauseMode, PauseScope, Question, SubtaskSpec,
    TimeoutAction, Usage,
};
use trellis_core::plan::{CheckLevel, Limits, compile_str};
use trellis_core::record::CheckResult;
use trellis_proto::v1;
use trellis_wire::log::{
    LogEntry, Started, decode_event_batch, event_batch_to_proto, event_from_proto, event_to_proto,
    started_to_proto,
};

use crate::support::{AT_MS, example_question, execution_id, group_id, instance_id, question_id};

/// Encodes an event as the coordinator does, decodes it as a reader does, and checks it is unchanged.
pub(crate) fn check_event_round_trip(event: &Event) {
    let proto = event_to_proto(execution_id(), 7, event);
    assert_eq!(proto.sequence, 7);
    assert_eq!(proto.execution_id, execution_id().to_string());
    let decoded =
        v1::Event::decode(proto.encode_to_vec().as_slice()).expect("an encoded event decodes");
    assert_eq!(decoded, proto);
    let entry = event_from_proto(&decoded).unwrap_or_else(|err| panic!("{err} for {event:?}"));
    assert_eq!(entry, LogEntry::Event(event.clone()));
}

/// Names the variant; the match has no wildcard, so a new `EventBody` variant fails to compile
/// here until it has an example below.
fn variant(body: &EventBody) -> &'static str {
    match body {
        EventBody::TaskStarted { .. } => "task_started",
        EventBody::TaskValidated { .. } => "task_validated",
        EventBody::TaskCompleted { .. } => "task_completed",
        EventBody::TaskFailed { .. } => "task_failed",
        EventBody::SubtasksSpawned { .. } => "subtasks_spawned",
        EventBody::QuestionAsked { .. } => "question_asked",
        EventBody::StepCheckpointed { .. } => "step_checkpointed",
        EventBody::TaskLost { .. } => "task_lost",
        EventBody::TaskPreempted { .. } => "task_preempted",
        EventBody::PauseRequested { .. } => "pause_requested",
        EventBody::ResumeRequested { .. } => "resume_requested",
        EventBody::CancelRequested { .. } => "cancel_requested",
        EventBody::QuestionAnswered { .. } => "question_answered",
        EventBody::TaskDispatched { .. } => "task_dispatched",
        EventBody::TaskTimedOut { .. } => "task_timed_out",
        EventBody::QuestionExpired { .. } => "question_expired",
        EventBody::BudgetExhausted { .. } => "budget_exhausted",
        EventBody::ExecutionTimedOut => "execution_timed_out",
        EventBody::ExecutionFinished { .. } => "execution_finished",
        EventBody::RunStarted { .. } => "run_started",
        EventBody::ExecutionClaimed { .. } => "execution_claimed",
    }
}

const N_VARIANTS: usize = 21;

/// One hand-written example per variant, plus a few edge cases.
fn examples() -> Vec<EventBody> {
    let instance = instance_id(2);
    vec![
        EventBody::RunStarted { run: 2 },
        EventBody::ExecutionClaimed {
            coordinator: "coordinator-0".to_owned(),
        },
        EventBody::TaskStarted {
            instance,
            attempt: 1,
            worker: WorkerId::from("host-12-0"),
        },
        EventBody::TaskValidated {
            instance,
            attempt: 2,
            results: vec![
                CheckResult {
                    name: "lint".to_owned(),
                    level: CheckLevel::Codebase,
                    passed: true,
                    duration_ms: 1200,
                    output: "no warnings\n".to_owned(),
                },
                CheckResult {
                    name: "up".to_owned(),
                    level: CheckLevel::Api,
                    passed: false,
                    duration_ms: 0,
                    output: String::new(),
                },
            ],
        },
        EventBody::TaskCompleted {
            instance,
            attempt: 2,
            output: json!({"rows": 3, "ratio": 0.1, "big": u64::MAX, "neg": -5, "nested": [null, true, "é"]}),
            usage: Usage {
                tokens_used: 1234,
                cost: 0.25,
            },
        },
        EventBody::TaskCompleted {
            instance,
            attempt: 1,
            output: Value::Null,
            usage: Usage::default(),
        },
        EventBody::TaskFailed {
            instance,
            attempt: 3,
            error: "exit status 2".to_owned(),
            retryable: false,
            usage: Usage {
                tokens_used: 0,
                cost: 1e-9,
            },
        },
        EventBody::SubtasksSpawned {
            instance,
            attempt: 1,
            group: group_id(3),
            rule: GroupRule::Quorum(2),
            members: vec![
                SubtaskSpec {
                    task_type: "noop".to_owned(),
                    queue: None,
                    input: json!(1),
                },
                SubtaskSpec {
                    task_type: "shell".to_owned(),
                    queue: Some("gpu".to_owned()),
                    input: json!({"command": ["true"]}),
                },
            ],
        },
        EventBody::SubtasksSpawned {
            instance,
            attempt: 1,
            group: group_id(4),
            rule: GroupRule::FirstSuccess,
            members: Vec::new(),
        },
        EventBody::QuestionAsked {
            instance,
            attempt: 1,
            question: example_question(TimeoutAction::Answer("no".to_owned())),
        },
        EventBody::QuestionAsked {
            instance,
            attempt: 1,
            question: Question {
                expires_at_ms: None,
                options: Vec::new(),
                ..example_question(TimeoutAction::Skip)
            },
        },
        EventBody::StepCheckpointed {
            instance,
            attempt: 1,
            step: "collect".to_owned(),
            state: json!({"messages": ["a", "b"]}),
        },
        EventBody::TaskLost {
            instance,
            attempt: 4,
        },
        EventBody::pause("paused by alice".to_owned()),
        EventBody::resume(),
        EventBody::TaskPreempted {
            instance,
            attempt: 2,
        },
        EventBody::PauseRequested {
            reason: "gpu upgrade".to_owned(),
            scope: PauseScope::Task("build".to_owned()),
            mode: PauseMode::Preempt,
        },
        EventBody::ResumeRequested {
            scope: PauseScope::Group(group_id(5)),
        },
        EventBody::CancelRequested {
            reason: String::new(),
        },
        EventBody::QuestionAnswered {
            question: question_id(9),
            answer: "yes".to_owned(),
        },
        EventBody::TaskDispatched {
            instance,
            attempt: 1,
        },
        EventBody::TaskTimedOut {
            instance,
            attempt: 2,
        },
        EventBody::QuestionExpired {
            question: question_id(9),
        },
        EventBody::BudgetExhausted {
            reason: "max_cost 10 exhausted".to_owned(),
        },
        EventBody::ExecutionTimedOut,
        EventBody::ExecutionFinished {
            outcome: Outcome::Completed,
        },
        EventBody::ExecutionFinished {
            outcome: Outcome::Failed,
        },
    ]
}

#[test]
fn every_event_variant_round_trips() {
    let examples = examples();
    let covered: std::collections::BTreeSet<&str> = examples.iter().map(variant).collect();
    assert_eq!(covered.len(), N_VARIANTS, "examples cover: {covered:?}");
    for body in examples {
        check_event_round_trip(&Event { at_ms: AT_MS, body });
    }
    // The epoch and the latest instant an `int64` holds are both representable.
    for at_ms in [0, i64::MAX as u64] {
        check_event_round_trip(&Event {
            at_ms,
            body: EventBody::resume(),
        });
    }
}

#[test]
fn execution_started_round_trips() {
    let started = Started {
        plan_name: "feature-x".to_owned(),
        run_number: 1,
        spec: "name: feature-x\ntasks:\n  - id: a\n    type: noop\n".to_owned(),
        format: v1::PlanFormat::Yaml,
        started_at_ms: AT_MS,
        idempotency_key: "req-42".to_owned(),
        labels: BTreeMap::from([("team".to_owned(), "infra".to_owned())]),
        namespace: "team-a".to_owned(),
        max_concurrency_cap: Some(3),
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        compiled_plan: vec![0x92, 0x01, 0x90],
    };
    let proto = started_to_proto(execution_id(), &started);
    assert_eq!(proto.sequence, 1);
    let decoded = v1::Event::decode(proto.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(event_from_proto(&decoded), Ok(LogEntry::Started(started)));
}

#[test]
fn a_recorded_concurrency_cap_is_applied_when_an_old_log_is_compiled_again() {
    let started = Started {
        spec: "name: p\noptions: {max_concurrency: 8}\ntasks:\n  - {id: a, type: noop}\n"
            .to_owned(),
        max_concurrency_cap: Some(3),
        ..Started::default()
    };
    let plan = started.plan().expect("the spec compiles");
    assert_eq!(plan.options.max_concurrency, Some(3));
    let uncapped = Started {
        max_concurrency_cap: None,
        ..started
    };
    assert_eq!(
        uncapped
            .plan()
            .expect("the spec compiles")
            .options
            .max_concurrency,
        Some(8)
    );
    // Logs written before namespaces read as `default`.
    assert_eq!(uncapped.namespace(), "default");
}

#[test]
fn a_recorded_plan_is_decoded_not_compiled() {
    let spec = "name: p\ntasks:\n  - {id: a, type: noop}\n";
    let mut plan = compile_str(spec, &Limits::default()).expect("the spec compiles");
    plan.options.max_concurrency = Some(2);
    let started = Started {
        // A spec that would not compile: only the recorded plan is read.
        spec: "not: [a plan".to_owned(),
        compiled_plan: trellis_core::plan::encode(&plan),
        ..Started::default()
    };
    assert_eq!(started.plan(), Ok(plan));
    let corrupt = Started {
        compiled_plan: vec![0xff, 0x00],
        ..started
    };
    let err = corrupt.plan().expect_err("garbage does not decode");
    assert!(
        err.starts_with("its recorded plan does not decode"),
        "{err}"
    );
}

#[test]
fn a_cap_of_zero_is_refused_as_a_contradiction() {
    let mut proto = started_to_proto(
        execution_id(),
        &Started {
            spec: "name: p\ntasks:\n  - {id: a, type: noop}\n".to_owned(),
            started_at_ms: AT_MS,
            ..Started::default()
        },
    );
    if let Some(v1::event::Kind::ExecutionStarted(started)) = proto.kind.as_mut() {
        started.max_concurrency_cap = Some(0);
    }
    let err = event_from_proto(&proto).expect_err("a cap of 0 runs nothing");
    assert_eq!(
        err.to_string(),
        "event.execution_started.max_concurrency_cap: a concurrency cap of 0 runs nothing"
    );
}

#[test]
fn event_batch_round_trips() {
    let events: Vec<Event> = examples()
        .into_iter()
        .enumerate()
        .map(|(event_idx, body)| Event {
            at_ms: AT_MS + event_idx as u64,
            body,
        })
        .collect();
    let batch = event_batch_to_proto(execution_id(), 5, &events);
    let decoded = decode_event_batch(&batch.encode_to_vec()).expect("a batch just encoded decodes");
    assert_eq!(decoded.execution_id, execution_id());
    assert_eq!(decoded.first_sequence, 5);
    let expected: Vec<LogEntry> = events.into_iter().map(LogEntry::Event).collect();
    assert_eq!(decoded.entries, expected);
}

// ------------------------------------------------------------------------------------------------
// Malformed input
// ------------------------------------------------------------------------------------------------

fn check_event_error(event: v1::Event, expected: &str) {
    let err = event_from_proto(&event).expect_err("a malformed event is refused");
    assert_eq!(err.to_string(), expected);
}

fn envelope(kind: Option<v1::event::Kind>) -> v1::Event {
    v1::Event {
        execution_id: execution_id().to_string(),
        sequence: 3,
        timestamp_unix_ms: AT_MS as i64,
        kind,
    }
}

#[test]
fn malformed_events_are_precise_errors() {
    check_event_error(envelope(None), "event.kind: missing");
    check_event_error(
        envelope(Some(v1::event::Kind::TaskDispatched(v1::TaskDispatched {
            task_instance_id: "x".to_owned(),
            attempt: 1,
        }))),
        r#"event.task_dispatched.task_instance_id: invalid uuid "x""#,
    );
    check_event_error(
        v1::Event {
            execution_id: String::new(),
            ..envelope(Some(v1::event::Kind::ResumeRequested(
                v1::ResumeRequested::default(),
            )))
        },
        "event.execution_id: missing",
    );
    check_event_error(
        v1::Event {
            timestamp_unix_ms: -1,
            ..envelope(Some(v1::event::Kind::ResumeRequested(
                v1::ResumeRequested::default(),
            )))
        },
        "event.timestamp_unix_ms: negative instant -1",
    );
    check_event_error(
        envelope(Some(v1::event::Kind::ExecutionFinished(
            v1::ExecutionFinished {
                outcome: v1::ExecutionOutcome::Unspecified.into(),
            },
        ))),
        "event.execution_finished.outcome: must not be unspecified",
    );
    check_event_error(
        envelope(Some(v1::event::Kind::ExecutionFinished(
            v1::ExecutionFinished { outcome: 7 },
        ))),
        "event.execution_finished.outcome: unknown enum value 7",
    );
    check_event_error(
        envelope(Some(v1::event::Kind::SubtasksSpawned(
            v1::SubtasksSpawned {
                task_instance_id: instance_id(2).to_string(),
                attempt: 1,
                group: None,
            },
        ))),
        "event.subtasks_spawned.group: missing",
    );
    check_event_error(
        envelope(Some(v1::event::Kind::TaskStarted(v1::TaskStarted {
            task_instance_id: instance_id(2).to_string(),
            attempt: 1,
            worker_id: String::new(),
        }))),
        "event.task_started.worker_id: missing",
    );
    check_event_error(
        envelope(Some(v1::event::Kind::ExecutionStarted(
            v1::ExecutionStarted {
                format: 9,
                ..v1::ExecutionStarted::default()
            },
        ))),
        "event.execution_started.format: unknown enum value 9",
    );
}

#[test]
fn malformed_batches_are_precise_errors() {
    let check = |batch: v1::EventBatch, expected: &str| {
        let err = decode_event_batch(&batch.encode_to_vec()).expect_err("refused");
        assert_eq!(err.to_string(), expected);
    };
    check(
        v1::EventBatch { events: Vec::new() },
        "event_batch.events: missing",
    );
    let resume = || {
        envelope(Some(v1::event::Kind::ResumeRequested(
            v1::ResumeRequested::default(),
        )))
    };
    check(
        v1::EventBatch {
            events: vec![resume(), resume()],
        },
        "event_batch.events[1].sequence: the sequences of a batch follow each other without gaps",
    );
    check(
        v1::EventBatch {
            events: vec![
                resume(),
                v1::Event {
                    sequence: 4,
                    execution_id: ExecutionId::derived(AT_MS, 2).to_string(),
                    ..resume()
                },
            ],
        },
        "event_batch.events[1].execution_id: every event of a batch belongs to the execution of the first",
    );
    check(
        v1::EventBatch {
            events: vec![
                resume(),
                v1::Event {
                    sequence: 4,
                    ..envelope(None)
                },
            ],
        },
        "event_batch.events[1].kind: missing",
    );
    check(
        v1::EventBatch {
            events: vec![v1::Event {
                sequence: 0,
                ..resume()
            }],
        },
        "event_batch.events[0].sequence: sequences start at 1",
    );
    // A batch running past the largest sequence is refused, not wrapped around.
    check(
        v1::EventBatch {
            events: vec![
                v1::Event {
                    sequence: u64::MAX,
                    ..resume()
                },
                v1::Event {
                    sequence: 0,
                    ..resume()
                },
            ],
        },
        "event_batch.events[1].sequence: the sequences of a batch follow each other without gaps",
    );
    let last = v1::EventBatch {
        events: vec![v1::Event {
            sequence: u64::MAX,
            ..resume()
        }],
    };
    assert_eq!(
        decode_event_batch(&last.encode_to_vec()).map(|batch| batch.first_sequence),
        Ok(u64::MAX)
    );
}

#[test]
fn a_pause_naming_both_a_task_and_a_group_is_refused_with_the_field() {
    check_event_error(
        envelope(Some(v1::event::Kind::PauseRequested(v1::PauseRequested {
            task_id: "build".to_owned(),
            group_id: "0190a5c4-7d1e-7000-8000-000000000001".to_owned(),
            ..v1::PauseRequested::default()
        }))),
        "event.pause_requested: names both a task and a group; a pause covers one of them",
    );
}
