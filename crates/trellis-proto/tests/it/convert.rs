//! The conversions between core values and wire messages: events survive core → proto → bytes →
//! proto → core unchanged, worker results become the right events, assignments carry their resume
//! context, and malformed input is a precise error, never a panic.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use prost::Message;
use serde_json::{Value, json};
use trellis_core::ids::{ExecutionId, GroupId, QuestionId, TaskInstanceId, WorkerId};
use trellis_core::machine::{
    Assignment, Command, Event, EventBody, Execution, GroupRule, GroupSummary, Outcome, Question,
    ResumeContext, StepRecord, SubtaskSpec, TimeoutAction, Usage,
};
use trellis_core::plan::{Limits, compile_str};
use trellis_core::record::TaskState;
use trellis_proto::convert::{
    self, ConvertErrorKind, LogEntry, Started, assignment_from_proto, assignment_to_proto,
    decode_event_batch, decode_task_assignment, decode_task_result, event_batch_to_proto,
    event_from_proto, event_to_proto, result_to_event, started_to_proto,
};
use trellis_proto::v1::{self, task_result};

const AT_MS: u64 = 1_760_000_000_123;

fn execution_id() -> ExecutionId {
    ExecutionId::derived(AT_MS, 1)
}

fn instance_id(seed: u128) -> TaskInstanceId {
    TaskInstanceId::derived(AT_MS, seed)
}

fn group_id(seed: u128) -> GroupId {
    GroupId::derived(AT_MS, seed)
}

fn question_id(seed: u128) -> QuestionId {
    QuestionId::derived(AT_MS, seed)
}

/// Encodes an event as the coordinator does, decodes it as a reader does, and checks it is unchanged.
fn check_event_round_trip(event: &Event) {
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
        EventBody::TaskCompleted { .. } => "task_completed",
        EventBody::TaskFailed { .. } => "task_failed",
        EventBody::SubtasksSpawned { .. } => "subtasks_spawned",
        EventBody::QuestionAsked { .. } => "question_asked",
        EventBody::StepCheckpointed { .. } => "step_checkpointed",
        EventBody::TaskLost { .. } => "task_lost",
        EventBody::PauseRequested { .. } => "pause_requested",
        EventBody::ResumeRequested => "resume_requested",
        EventBody::CancelRequested { .. } => "cancel_requested",
        EventBody::QuestionAnswered { .. } => "question_answered",
        EventBody::TaskDispatched { .. } => "task_dispatched",
        EventBody::TaskTimedOut { .. } => "task_timed_out",
        EventBody::QuestionExpired { .. } => "question_expired",
        EventBody::BudgetExhausted { .. } => "budget_exhausted",
        EventBody::ExecutionTimedOut => "execution_timed_out",
        EventBody::ExecutionFinished { .. } => "execution_finished",
        EventBody::RunStarted { .. } => "run_started",
    }
}

const N_VARIANTS: usize = 18;

fn example_question(timeout_action: TimeoutAction) -> Question {
    Question {
        id: question_id(9),
        question_type: "approval".to_owned(),
        text: "deploy to production?".to_owned(),
        options: vec!["yes".to_owned(), "no".to_owned()],
        expires_at_ms: Some(AT_MS + 60_000),
        timeout_action,
    }
}

/// One hand-written example per variant, plus a few edge cases.
fn examples() -> Vec<EventBody> {
    let instance = instance_id(2);
    vec![
        EventBody::RunStarted { run: 2 },
        EventBody::TaskStarted {
            instance,
            attempt: 1,
            worker: WorkerId::from("host-12-0"),
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
        EventBody::PauseRequested {
            reason: "paused by alice".to_owned(),
        },
        EventBody::ResumeRequested,
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
            body: EventBody::ResumeRequested,
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
    };
    let proto = started_to_proto(execution_id(), &started);
    assert_eq!(proto.sequence, 1);
    let decoded = v1::Event::decode(proto.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(event_from_proto(&decoded), Ok(LogEntry::Started(started)));
}

#[test]
fn a_recorded_concurrency_cap_is_applied_on_every_recompilation() {
    let started = Started {
        spec: "name: p\noptions: {max_concurrency: 8}\ntasks:\n  - {id: a, type: noop}\n"
            .to_owned(),
        max_concurrency_cap: Some(3),
        ..Started::default()
    };
    let plan = started.compile().expect("the spec compiles");
    assert_eq!(plan.options.max_concurrency, Some(3));
    let uncapped = Started {
        max_concurrency_cap: None,
        ..started
    };
    assert_eq!(
        uncapped
            .compile()
            .expect("the spec compiles")
            .options
            .max_concurrency,
        Some(8)
    );
    // Logs written before namespaces read as `default`.
    assert_eq!(uncapped.namespace(), "default");
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
// Property: any event round-trips
// ------------------------------------------------------------------------------------------------

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Every finite double, subnormals included: the log must give back the very same bits.
        any::<f64>().prop_filter_map("JSON numbers are finite", |f| {
            serde_json::Number::from_f64(f).map(Value::Number)
        }),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn arb_instance() -> impl Strategy<Value = TaskInstanceId> {
    any::<(u64, u128)>().prop_map(|(ms, seed)| TaskInstanceId::derived(ms >> 16, seed))
}

fn arb_group() -> impl Strategy<Value = GroupId> {
    any::<(u64, u128)>().prop_map(|(ms, seed)| GroupId::derived(ms >> 16, seed))
}

fn arb_question_id() -> impl Strategy<Value = QuestionId> {
    any::<(u64, u128)>().prop_map(|(ms, seed)| QuestionId::derived(ms >> 16, seed))
}

/// Instants an `int64` can hold.
fn arb_instant() -> impl Strategy<Value = u64> {
    0..=i64::MAX as u64
}

fn arb_usage() -> impl Strategy<Value = Usage> {
    (
        any::<u64>(),
        any::<f64>().prop_filter("costs are finite and not negative", |cost| {
            cost.is_finite() && *cost >= 0.0
        }),
    )
        .prop_map(|(tokens_used, cost)| Usage { tokens_used, cost })
}

fn arb_rule() -> impl Strategy<Value = GroupRule> {
    prop_oneof![
        Just(GroupRule::AllSettled),
        Just(GroupRule::AllSucceeded),
        any::<u32>().prop_map(GroupRule::Quorum),
        Just(GroupRule::FirstSuccess),
    ]
}

fn arb_question() -> impl Strategy<Value = Question> {
    let timeout_action = prop_oneof![
        Just(TimeoutAction::Fail),
        Just(TimeoutAction::Skip),
        any::<String>().prop_map(TimeoutAction::Answer),
    ];
    (
        arb_question_id(),
        any::<String>(),
        any::<String>(),
        prop::collection::vec(any::<String>(), 0..3),
        prop::option::of(arb_instant()),
        timeout_action,
    )
        .prop_map(
            |(id, question_type, text, options, expires_at_ms, timeout_action)| Question {
                id,
                question_type,
                text,
                options,
                expires_at_ms,
                timeout_action,
            },
        )
}

fn arb_member() -> impl Strategy<Value = SubtaskSpec> {
    ("[a-z]{1,8}", prop::option::of("[a-z]{1,8}"), arb_json()).prop_map(
        |(task_type, queue, input)| SubtaskSpec {
            task_type,
            queue,
            input,
        },
    )
}

/// Bodies reported by workers.
fn arb_worker_body() -> impl Strategy<Value = EventBody> {
    let attempt = any::<u32>();
    prop_oneof![
        (arb_instance(), attempt, "[a-z0-9-]{1,16}").prop_map(|(instance, attempt, worker)| {
            EventBody::TaskStarted {
                instance,
                attempt,
                worker: WorkerId(worker),
            }
        }),
        (arb_instance(), attempt, arb_json(), arb_usage()).prop_map(
            |(instance, attempt, output, usage)| EventBody::TaskCompleted {
                instance,
                attempt,
                output,
                usage,
            }
        ),
        (
            arb_instance(),
            attempt,
            any::<String>(),
            any::<bool>(),
            arb_usage()
        )
            .prop_map(|(instance, attempt, error, retryable, usage)| {
                EventBody::TaskFailed {
                    instance,
                    attempt,
                    error,
                    retryable,
                    usage,
                }
            }),
        (
            arb_instance(),
            attempt,
            arb_group(),
            arb_rule(),
            prop::collection::vec(arb_member(), 0..4)
        )
            .prop_map(|(instance, attempt, group, rule, members)| {
                EventBody::SubtasksSpawned {
                    instance,
                    attempt,
                    group,
                    rule,
                    members,
                }
            }),
        (arb_instance(), attempt, arb_question()).prop_map(|(instance, attempt, question)| {
            EventBody::QuestionAsked {
                instance,
                attempt,
                question,
            }
        }),
        (arb_instance(), attempt, any::<String>(), arb_json()).prop_map(
            |(instance, attempt, step, state)| EventBody::StepCheckpointed {
                instance,
                attempt,
                step,
                state,
            }
        ),
        (arb_instance(), attempt)
            .prop_map(|(instance, attempt)| EventBody::TaskLost { instance, attempt }),
    ]
}

/// Bodies requested by people and decided by the machine.
fn arb_other_body() -> impl Strategy<Value = EventBody> {
    let attempt = any::<u32>();
    prop_oneof![
        any::<String>().prop_map(|reason| EventBody::PauseRequested { reason }),
        Just(EventBody::ResumeRequested),
        any::<String>().prop_map(|reason| EventBody::CancelRequested { reason }),
        (arb_question_id(), any::<String>())
            .prop_map(|(question, answer)| EventBody::QuestionAnswered { question, answer }),
        (arb_instance(), attempt)
            .prop_map(|(instance, attempt)| EventBody::TaskDispatched { instance, attempt }),
        (arb_instance(), attempt)
            .prop_map(|(instance, attempt)| EventBody::TaskTimedOut { instance, attempt }),
        arb_question_id().prop_map(|question| EventBody::QuestionExpired { question }),
        any::<String>().prop_map(|reason| EventBody::BudgetExhausted { reason }),
        Just(EventBody::ExecutionTimedOut),
        prop_oneof![Just(Outcome::Completed), Just(Outcome::Failed)]
            .prop_map(|outcome| EventBody::ExecutionFinished { outcome }),
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    (
        arb_instant(),
        prop_oneof![arb_worker_body(), arb_other_body()],
    )
        .prop_map(|(at_ms, body)| Event { at_ms, body })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_event_round_trips(event in arb_event()) {
        check_event_round_trip(&event);
    }

    #[test]
    fn any_batch_round_trips(events in prop::collection::vec(arb_event(), 1..6), first in 1..1_000_000u64) {
        let batch = event_batch_to_proto(execution_id(), first, &events);
        let decoded = decode_event_batch(&batch.encode_to_vec()).map_err(|err| TestCaseError::fail(err.to_string()))?;
        prop_assert_eq!(decoded.first_sequence, first);
        let expected: Vec<LogEntry> = events.into_iter().map(LogEntry::Event).collect();
        prop_assert_eq!(decoded.entries, expected);
    }

    #[test]
    fn garbage_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        // Whatever the bytes, decoding returns (an error or a value); it never panics.
        let _ = decode_event_batch(&bytes);
        let _ = decode_task_result(&bytes, AT_MS);
        let _ = decode_task_assignment(&bytes);
        if let Ok(event) = v1::Event::decode(bytes.as_slice()) {
            let _ = event_from_proto(&event);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Worker results
// ------------------------------------------------------------------------------------------------

fn task_result(outcome: Option<task_result::Outcome>) -> v1::TaskResult {
    v1::TaskResult {
        execution_id: execution_id().to_string(),
        task_instance_id: instance_id(2).to_string(),
        attempt: 2,
        worker_id: "worker-7".to_owned(),
        usage: Some(v1::Usage {
            tokens_used: 1234,
            cost: 0.25,
        }),
        sent_at_unix_ms: 1,
        outcome,
    }
}

fn check_result(outcome: task_result::Outcome, expected: EventBody) {
    let result = task_result(Some(outcome));
    let (decoded_execution, event) =
        result_to_event(&result, AT_MS).expect("a valid result converts");
    assert_eq!(decoded_execution, execution_id());
    assert_eq!(
        event,
        Event {
            at_ms: AT_MS,
            body: expected.clone()
        }
    );
    // The same through bytes, as the coordinator receives it.
    let (_, event) = decode_task_result(&result.encode_to_vec(), AT_MS).expect("decodes");
    assert_eq!(event.body, expected);
}

#[test]
fn results_become_events() {
    let instance = instance_id(2);
    let usage = Usage {
        tokens_used: 1234,
        cost: 0.25,
    };
    check_result(
        task_result::Outcome::Started(task_result::Started {}),
        EventBody::TaskStarted {
            instance,
            attempt: 2,
            worker: WorkerId::from("worker-7"),
        },
    );
    check_result(
        task_result::Outcome::Completed(task_result::Completed {
            output: br#"{"ok":true,"n":1.5}"#.to_vec(),
        }),
        EventBody::TaskCompleted {
            instance,
            attempt: 2,
            output: json!({"ok": true, "n": 1.5}),
            usage,
        },
    );
    check_result(
        task_result::Outcome::Failed(task_result::Failed {
            error: "exit status 2".to_owned(),
            retryable: true,
        }),
        EventBody::TaskFailed {
            instance,
            attempt: 2,
            error: "exit status 2".to_owned(),
            retryable: true,
            usage,
        },
    );
    check_result(
        task_result::Outcome::Spawned(task_result::Spawned {
            group: Some(v1::SubtaskGroup {
                group_id: group_id(3).to_string(),
                rule: Some(v1::CompletionRule {
                    kind: v1::CompletionRuleKind::Quorum.into(),
                    quorum: 2,
                }),
                members: vec![
                    v1::SubtaskSpec {
                        task_type: "noop".to_owned(),
                        input: b"1".to_vec(),
                        queue: None,
                    },
                    v1::SubtaskSpec {
                        task_type: "shell".to_owned(),
                        input: br#"{"command":["true"]}"#.to_vec(),
                        queue: Some("gpu".to_owned()),
                    },
                    v1::SubtaskSpec {
                        task_type: "noop".to_owned(),
                        input: b"null".to_vec(),
                        queue: None,
                    },
                ],
            }),
        }),
        EventBody::SubtasksSpawned {
            instance,
            attempt: 2,
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
                SubtaskSpec {
                    task_type: "noop".to_owned(),
                    queue: None,
                    input: Value::Null,
                },
            ],
        },
    );
    // An unset rule is `all_settled`, as the contract says.
    check_result(
        task_result::Outcome::Spawned(task_result::Spawned {
            group: Some(v1::SubtaskGroup {
                group_id: group_id(4).to_string(),
                rule: None,
                members: Vec::new(),
            }),
        }),
        EventBody::SubtasksSpawned {
            instance,
            attempt: 2,
            group: group_id(4),
            rule: GroupRule::AllSettled,
            members: Vec::new(),
        },
    );
    check_result(
        task_result::Outcome::Question(task_result::Asked {
            question: Some(v1::Question {
                question_id: question_id(9).to_string(),
                question_type: "approval".to_owned(),
                text: "deploy to production?".to_owned(),
                options: vec!["yes".to_owned(), "no".to_owned()],
                expires_at_unix_ms: Some((AT_MS + 60_000) as i64),
                timeout_action: v1::QuestionTimeoutAction::AnswerDefault.into(),
                default_answer: "no".to_owned(),
            }),
        }),
        EventBody::QuestionAsked {
            instance,
            attempt: 2,
            question: example_question(TimeoutAction::Answer("no".to_owned())),
        },
    );
    check_result(
        task_result::Outcome::StepCheckpoint(task_result::StepCheckpoint {
            step: "collect".to_owned(),
            merged_state: br#"{"messages":["a","b"]}"#.to_vec(),
            next_step: "act".to_owned(),
        }),
        EventBody::StepCheckpointed {
            instance,
            attempt: 2,
            step: "collect".to_owned(),
            state: json!({"messages": ["a", "b"]}),
        },
    );
}

#[test]
fn a_result_without_usage_consumed_nothing() {
    let mut result = task_result(Some(task_result::Outcome::Failed(task_result::Failed {
        error: "boom".to_owned(),
        retryable: false,
    })));
    result.usage = None;
    let (_, event) = result_to_event(&result, AT_MS).expect("converts");
    let EventBody::TaskFailed { usage, .. } = event.body else {
        panic!("expected task_failed, got {event:?}");
    };
    assert_eq!(usage, Usage::default());
}

// ------------------------------------------------------------------------------------------------
// Malformed input
// ------------------------------------------------------------------------------------------------

fn check_result_error(result: &v1::TaskResult, expected: &str) {
    let err = result_to_event(result, AT_MS).expect_err("a malformed result is refused");
    assert_eq!(err.to_string(), expected);
}

fn check_result_error_prefix(result: &v1::TaskResult, expected_prefix: &str) {
    let err = result_to_event(result, AT_MS).expect_err("a malformed result is refused");
    let message = err.to_string();
    assert!(
        message.starts_with(expected_prefix),
        "{message:?} should start with {expected_prefix:?}"
    );
}

#[test]
fn malformed_results_are_precise_errors() {
    check_result_error(&task_result(None), "task_result.outcome: missing");
    check_result_error(
        &v1::TaskResult {
            execution_id: "x".to_owned(),
            ..task_result(Some(task_result::Outcome::Started(task_result::Started {})))
        },
        r#"task_result.execution_id: invalid uuid "x""#,
    );
    check_result_error(
        &v1::TaskResult {
            task_instance_id: String::new(),
            ..task_result(Some(task_result::Outcome::Started(task_result::Started {})))
        },
        "task_result.task_instance_id: missing",
    );
    check_result_error(
        &v1::TaskResult {
            worker_id: String::new(),
            ..task_result(Some(task_result::Outcome::Started(task_result::Started {})))
        },
        "task_result.worker_id: missing",
    );
    // A NaN cost would make the execution's cost NaN, and its budget would never run out.
    for cost in [f64::NAN, f64::INFINITY, -1.0] {
        check_result_error(
            &v1::TaskResult {
                usage: Some(v1::Usage {
                    tokens_used: 1,
                    cost,
                }),
                ..task_result(Some(task_result::Outcome::Started(task_result::Started {})))
            },
            "task_result.usage.cost: a cost is a finite, non-negative number",
        );
    }
    check_result_error_prefix(
        &task_result(Some(task_result::Outcome::Completed(
            task_result::Completed {
                output: b"{not json".to_vec(),
            },
        ))),
        "task_result.completed.output: invalid JSON: ",
    );
    // Empty bytes are not JSON: a handler without output sends `null`.
    check_result_error_prefix(
        &task_result(Some(task_result::Outcome::Completed(
            task_result::Completed { output: Vec::new() },
        ))),
        "task_result.completed.output: invalid JSON: ",
    );
    check_result_error(
        &task_result(Some(task_result::Outcome::Spawned(task_result::Spawned {
            group: None,
        }))),
        "task_result.spawned.group: missing",
    );
    let group = |rule: v1::CompletionRule, input: &[u8]| {
        task_result(Some(task_result::Outcome::Spawned(task_result::Spawned {
            group: Some(v1::SubtaskGroup {
                group_id: group_id(3).to_string(),
                rule: Some(rule),
                members: vec![
                    v1::SubtaskSpec {
                        task_type: "noop".to_owned(),
                        input: b"1".to_vec(),
                        queue: None,
                    },
                    v1::SubtaskSpec {
                        task_type: "noop".to_owned(),
                        input: input.to_vec(),
                        queue: None,
                    },
                ],
            }),
        })))
    };
    check_result_error_prefix(
        &group(v1::CompletionRule::default(), b"[1,"),
        "task_result.spawned.group.members[1].input: invalid JSON: ",
    );
    // A quorum sent without its kind would silently become `all_settled`: refused instead.
    check_result_error(
        &group(
            v1::CompletionRule {
                kind: v1::CompletionRuleKind::Unspecified.into(),
                quorum: 2,
            },
            b"2",
        ),
        "task_result.spawned.group.rule.quorum: a quorum is only allowed with COMPLETION_RULE_KIND_QUORUM",
    );
    check_result_error(
        &group(
            v1::CompletionRule {
                kind: 42,
                quorum: 0,
            },
            b"2",
        ),
        "task_result.spawned.group.rule.kind: unknown enum value 42",
    );
    check_result_error(
        &task_result(Some(task_result::Outcome::Question(task_result::Asked {
            question: None,
        }))),
        "task_result.question.question: missing",
    );
    let question = v1::Question {
        question_id: question_id(9).to_string(),
        expires_at_unix_ms: Some(-5),
        ..v1::Question::default()
    };
    check_result_error(
        &task_result(Some(task_result::Outcome::Question(task_result::Asked {
            question: Some(question.clone()),
        }))),
        "task_result.question.question.expires_at_unix_ms: negative instant -5",
    );
    check_result_error(
        &task_result(Some(task_result::Outcome::Question(task_result::Asked {
            question: Some(v1::Question {
                expires_at_unix_ms: None,
                timeout_action: v1::QuestionTimeoutAction::Skip.into(),
                default_answer: "yes".to_owned(),
                ..question
            }),
        }))),
        "task_result.question.question.default_answer: a default answer is only allowed with QUESTION_TIMEOUT_ACTION_ANSWER_DEFAULT",
    );
    check_result_error(
        &task_result(Some(task_result::Outcome::StepCheckpoint(
            task_result::StepCheckpoint {
                step: String::new(),
                merged_state: b"{}".to_vec(),
                next_step: String::new(),
            },
        ))),
        "task_result.step_checkpoint.step: missing",
    );
}

#[test]
fn long_bad_ids_are_cut_in_errors() {
    let long_id = "z".repeat(10_000);
    let err = result_to_event(
        &v1::TaskResult {
            task_instance_id: long_id,
            ..task_result(Some(task_result::Outcome::Started(task_result::Started {})))
        },
        AT_MS,
    )
    .expect_err("refused");
    assert!(matches!(err.kind(), ConvertErrorKind::InvalidUuid(shown) if shown.len() < 100));
    assert_eq!(err.path(), "task_result.task_instance_id");
}

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
                v1::ResumeRequested {},
            )))
        },
        "event.execution_id: missing",
    );
    check_event_error(
        v1::Event {
            timestamp_unix_ms: -1,
            ..envelope(Some(v1::event::Kind::ResumeRequested(
                v1::ResumeRequested {},
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
            v1::ResumeRequested {},
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
fn heartbeats_name_their_worker_and_report_numbers() {
    let heartbeat = v1::WorkerHeartbeat {
        worker_id: "w-1".to_owned(),
        state: v1::WorkerState::Idle.into(),
        cpu_percent: 12.5,
        ..v1::WorkerHeartbeat::default()
    };
    assert_eq!(
        convert::decode_worker_heartbeat(&heartbeat.encode_to_vec()),
        Ok(heartbeat.clone())
    );
    let check = |heartbeat: v1::WorkerHeartbeat, expected: &str| {
        let err =
            convert::decode_worker_heartbeat(&heartbeat.encode_to_vec()).expect_err("refused");
        assert_eq!(err.to_string(), expected);
    };
    check(
        v1::WorkerHeartbeat {
            worker_id: String::new(),
            ..heartbeat.clone()
        },
        "worker_heartbeat.worker_id: missing",
    );
    check(
        v1::WorkerHeartbeat {
            state: 17,
            ..heartbeat.clone()
        },
        "worker_heartbeat.state: unknown enum value 17",
    );
    check(
        v1::WorkerHeartbeat {
            cpu_percent: f32::NAN,
            ..heartbeat.clone()
        },
        "worker_heartbeat.cpu_percent: CPU use is a finite, non-negative percentage",
    );
    let garbage = convert::decode_worker_heartbeat(&[0xff, 0xff]).expect_err("refused");
    assert!(
        matches!(garbage.kind(), ConvertErrorKind::Decode(_)),
        "{garbage}"
    );
}

#[test]
fn garbage_bytes_are_decode_errors() {
    let garbage = [0xff_u8, 0xff, 0xff, 0xff];
    let err = decode_task_result(&garbage, AT_MS).expect_err("refused");
    assert_eq!(err.path(), "task_result");
    assert!(matches!(err.kind(), ConvertErrorKind::Decode(_)), "{err}");
    let err = decode_event_batch(&garbage).expect_err("refused");
    assert_eq!(err.path(), "event_batch");
    assert!(matches!(err.kind(), ConvertErrorKind::Decode(_)), "{err}");
    let err = decode_task_assignment(&garbage).expect_err("refused");
    assert_eq!(err.path(), "task_assignment");
    // A valid protobuf of the wrong message misses the required fields.
    let progress = v1::Progress::default().encode_to_vec();
    assert!(decode_task_result(&progress, AT_MS).is_err());
}

// ------------------------------------------------------------------------------------------------
// Assignments
// ------------------------------------------------------------------------------------------------

fn summary() -> GroupSummary {
    GroupSummary {
        group: group_id(3),
        rule: GroupRule::Quorum(2),
        succeeded: true,
        members: 3,
        completed: 2,
        failed: 1,
        cancelled: 0,
        failed_members: vec![instance_id(11)],
        outputs: vec![Some(json!({"n": 1})), None, Some(Value::Null)],
        outputs_truncated: false,
    }
}

fn check_assignment_round_trip(assignment: &Assignment<'_>) -> v1::TaskAssignment {
    let proto = assignment_to_proto(execution_id(), 2, assignment);
    let received =
        decode_task_assignment(&proto.encode_to_vec()).expect("an assignment just encoded decodes");
    assert_eq!(received.execution_id, execution_id());
    assert_eq!(received.run_number, 2);
    assert_eq!(&received.as_assignment(), assignment);
    assert_eq!(received.idempotency_key(), proto.idempotency_key);
    assert_eq!(assignment_from_proto(&proto).as_ref(), Ok(&received));
    proto
}

#[test]
fn assignment_carries_group_summary_and_steps() {
    let input = json!({"command": ["sh", "-c", "echo ok"]});
    let resume = ResumeContext::Group(summary());
    let steps = vec![
        StepRecord {
            step: "collect".to_owned(),
            state: json!({"messages": ["a"]}),
        },
        StepRecord {
            step: "act".to_owned(),
            state: json!({"messages": ["a", "b"], "done": 0.5}),
        },
    ];
    let avoid = WorkerId::from("worker-3");
    let assignment = Assignment {
        instance: instance_id(2),
        task_id: "build",
        task_type: "shell",
        queue: "gpu",
        input: &input,
        attempt: 3,
        deadline_ms: Some(AT_MS + 5_000),
        avoid_worker: Some(&avoid),
        resume: Some(&resume),
        steps: &steps,
        parent: None,
        group: None,
    };
    let proto = check_assignment_round_trip(&assignment);
    assert_eq!(proto.idempotency_key, format!("{}:3", instance_id(2)));
    assert_eq!(
        proto.resumed_after_subtasks_group_id,
        Some(group_id(3).to_string())
    );
    assert_eq!(proto.avoid_worker_id.as_deref(), Some("worker-3"));
    assert_eq!(proto.deadline_unix_ms, Some((AT_MS + 5_000) as i64));
    let resume = proto
        .resume
        .expect("a resumed instance has a resume context");
    let Some(v1::resume_context::ResumedAfter::GroupSummary(group_summary)) = resume.resumed_after
    else {
        panic!("expected a group summary, got {:?}", resume.resumed_after);
    };
    assert_eq!(group_summary.member_count, 3);
    assert_eq!(group_summary.outputs[1].output, None);
    assert_eq!(
        group_summary.outputs[2].output.as_deref(),
        Some(&b"null"[..])
    );
    assert_eq!(
        resume
            .steps
            .iter()
            .map(|step| step.step.as_str())
            .collect::<Vec<_>>(),
        ["collect", "act"]
    );
}

#[test]
fn assignment_carries_answer() {
    let input = json!(null);
    let resume = ResumeContext::Answer {
        question: question_id(9),
        answer: "yes".to_owned(),
    };
    let assignment = Assignment {
        instance: instance_id(2),
        task_id: "deploy",
        task_type: "question",
        queue: "question",
        input: &input,
        attempt: 1,
        deadline_ms: None,
        avoid_worker: None,
        resume: Some(&resume),
        steps: &[],
        parent: None,
        group: None,
    };
    let proto = check_assignment_round_trip(&assignment);
    let resume = proto
        .resume
        .expect("a resumed instance has a resume context");
    assert_eq!(
        resume.resumed_after,
        Some(v1::resume_context::ResumedAfter::HumanAnswer(
            v1::HumanAnswer {
                question_id: question_id(9).to_string(),
                answer: "yes".to_owned(),
            }
        ))
    );
    assert!(resume.steps.is_empty());
}

#[test]
fn fresh_member_assignment_has_no_resume_context() {
    let input = json!(7);
    let assignment = Assignment {
        instance: instance_id(20),
        task_id: "noop",
        task_type: "noop",
        queue: "noop",
        input: &input,
        attempt: 1,
        deadline_ms: None,
        avoid_worker: None,
        resume: None,
        steps: &[],
        parent: Some(instance_id(2)),
        group: Some(group_id(3)),
    };
    let proto = check_assignment_round_trip(&assignment);
    assert_eq!(proto.resume, None);
    assert_eq!(
        proto.parent_task_instance_id,
        Some(instance_id(2).to_string())
    );
    assert_eq!(proto.subtask_group_id, Some(group_id(3).to_string()));
}

#[test]
fn malformed_assignments_are_precise_errors() {
    let input = json!(1);
    let steps = [StepRecord {
        step: "collect".to_owned(),
        state: json!({}),
    }];
    let assignment = Assignment {
        instance: instance_id(2),
        task_id: "t",
        task_type: "noop",
        queue: "noop",
        input: &input,
        attempt: 1,
        deadline_ms: None,
        avoid_worker: None,
        resume: None,
        steps: &steps,
        parent: None,
        group: None,
    };
    let mut proto = assignment_to_proto(execution_id(), 1, &assignment);
    if let Some(resume) = proto.resume.as_mut() {
        resume.steps[0].state = b"{".to_vec();
    }
    let err = assignment_from_proto(&proto).expect_err("refused");
    assert_eq!(err.path(), "task_assignment.resume.steps[0].state");
    assert!(
        matches!(err.kind(), ConvertErrorKind::InvalidJson(_)),
        "{err}"
    );
}

// ------------------------------------------------------------------------------------------------
// Read models
// ------------------------------------------------------------------------------------------------

#[test]
fn task_states_map_one_to_one() {
    let mut seen = std::collections::BTreeSet::new();
    for state in TaskState::ALL {
        let wire = convert::task_state_to_proto(state);
        assert!(seen.insert(wire), "{state:?} shares wire value {wire}");
        assert_eq!(convert::task_state_from_proto(wire), Ok(state));
        assert_eq!(
            v1::TaskState::try_from(wire).map(|s| s.as_str_name().to_ascii_lowercase()),
            Ok(format!("task_state_{}", state.as_str()))
        );
    }
    assert!(convert::task_state_from_proto(0).is_err());
    assert!(convert::task_state_from_proto(99).is_err());
}

// ------------------------------------------------------------------------------------------------
// A real execution through the wire
// ------------------------------------------------------------------------------------------------

const PLAN: &str = r#"
name: wire
tasks:
  - id: fan
    type: fanout
  - id: after
    type: noop
    depends_on: [fan]
"#;

/// Runs an execution whose events all travel through the wire (core → proto → bytes → core)
/// before being applied, then replays the decoded log into a fresh execution: both end in the
/// same state, and the resumed parent's assignment carries its group summary.
#[test]
fn replaying_the_decoded_log_rebuilds_the_live_state() {
    let plan = Arc::new(compile_str(PLAN, &Limits::default()).expect("the plan compiles"));
    let started = Started {
        plan_name: plan.name.clone(),
        run_number: 1,
        spec: PLAN.to_owned(),
        format: v1::PlanFormat::Yaml,
        started_at_ms: AT_MS,
        ..Started::default()
    };
    let mut live = Execution::start(execution_id(), Arc::clone(&plan), 1, AT_MS);
    let mut log = vec![
        v1::EventBatch {
            events: vec![started_to_proto(execution_id(), &started)],
        }
        .encode_to_vec(),
    ];
    let mut now = AT_MS;
    let mut saw_group_summary = false;

    // Records an event: encode it as the next log entry, decode it, apply what was decoded.
    let record = |live: &mut Execution, log: &mut Vec<Vec<u8>>, event: Event| {
        let sequence = log.len() as u64 + 1;
        let bytes = event_batch_to_proto(execution_id(), sequence, std::slice::from_ref(&event))
            .encode_to_vec();
        let decoded = decode_event_batch(&bytes).expect("a batch just encoded decodes");
        assert_eq!(decoded.entries, [LogEntry::Event(event.clone())]);
        live.apply(&event).expect("the machine accepts the event");
        log.push(bytes);
    };

    for _ in 0..100 {
        now += 10;
        let commands = live.decide(now);
        let dispatched: Vec<TaskInstanceId> = commands
            .iter()
            .filter_map(|command| match command {
                Command::Dispatch { instance, .. } => Some(*instance),
                _ => None,
            })
            .collect();
        let finished = commands
            .iter()
            .any(|command| matches!(command, Command::Finish { .. }));
        for command in commands {
            record(&mut live, &mut log, command.into_event(now));
        }
        if finished {
            break;
        }
        for instance in dispatched {
            let assignment = live
                .assignment(instance)
                .expect("a dispatched instance has an assignment");
            let proto = assignment_to_proto(execution_id(), 1, &assignment);
            let received = decode_task_assignment(&proto.encode_to_vec()).expect("decodes");
            assert_eq!(received.as_assignment(), assignment);
            // The worker reports through `TaskResult`s, which the coordinator turns into events.
            let sent_at_unix_ms = now as i64;
            let report = |outcome: task_result::Outcome| v1::TaskResult {
                execution_id: execution_id().to_string(),
                task_instance_id: instance.to_string(),
                attempt: received.attempt,
                worker_id: "worker-1".to_owned(),
                usage: Some(v1::Usage {
                    tokens_used: 10,
                    cost: 0.1,
                }),
                sent_at_unix_ms,
                outcome: Some(outcome),
            };
            let mut outcomes = vec![
                task_result::Outcome::Started(task_result::Started {}),
                task_result::Outcome::StepCheckpoint(task_result::StepCheckpoint {
                    step: "prepare".to_owned(),
                    merged_state: br#"{"x":0.30000000000000004}"#.to_vec(),
                    next_step: String::new(),
                }),
            ];
            let spawns = received.task_id == "fan" && received.resume.is_none();
            if spawns {
                let member = |n: u32| v1::SubtaskSpec {
                    task_type: "noop".to_owned(),
                    input: n.to_string().into_bytes(),
                    queue: None,
                };
                outcomes.push(task_result::Outcome::Spawned(task_result::Spawned {
                    group: Some(v1::SubtaskGroup {
                        group_id: GroupId::derived(now, u128::from(instance.0.as_u128() as u64))
                            .to_string(),
                        rule: Some(convert::group_rule_to_proto(GroupRule::AllSettled)),
                        members: vec![member(1), member(2), member(3)],
                    }),
                }));
            } else {
                if let Some(ResumeContext::Group(summary)) = &received.resume {
                    saw_group_summary = true;
                    assert_eq!(summary.members, 3);
                    assert_eq!(summary.outputs.len(), 3);
                    assert_eq!(received.resumed_after_group, Some(summary.group));
                }
                outcomes.push(task_result::Outcome::Completed(task_result::Completed {
                    output: format!(r#"{{"task":"{}","ratio":{}}}"#, received.task_id, 1.0 / 3.0)
                        .into_bytes(),
                }));
            }
            for outcome in outcomes {
                now += 1;
                let (execution, event) = decode_task_result(&report(outcome).encode_to_vec(), now)
                    .expect("a valid result converts");
                assert_eq!(execution, execution_id());
                record(&mut live, &mut log, event);
            }
        }
    }
    assert!(
        live.state().is_terminal(),
        "the execution ended: {:?}",
        live.state()
    );
    assert!(saw_group_summary, "the fan task resumed after its group");

    // Recovery: read the log from the start and rebuild the execution from it alone.
    let mut entries = log.iter().flat_map(|bytes| {
        decode_event_batch(bytes)
            .expect("every logged batch decodes")
            .entries
    });
    let Some(LogEntry::Started(started)) = entries.next() else {
        panic!("the log starts with execution_started");
    };
    let plan =
        Arc::new(compile_str(&started.spec, &Limits::default()).expect("the spec compiles again"));
    let mut replayed = Execution::start(
        execution_id(),
        plan,
        started.run_number,
        started.started_at_ms,
    );
    for entry in entries {
        let LogEntry::Event(event) = entry else {
            panic!("execution_started appears only once");
        };
        replayed.apply(&event).expect("replayed events apply");
    }
    assert_eq!(replayed, live);
    assert_eq!(
        convert::progress_from_proto(&convert::progress_to_proto(&live.progress(now))),
        Ok(live.progress(now))
    );
    let graph = trellis_core::graph::build(live.records()).expect("the records form a tree");
    let proto_graph = convert::graph_to_proto(&graph);
    assert_eq!(proto_graph.nodes.len(), graph.n_nodes());
    assert_eq!(proto_graph.groups.len(), graph.n_groups());
    assert_eq!(proto_graph.root_indices, [0]);
    let records = convert::graph_records_from_proto(
        &v1::ExecutionGraph::decode(proto_graph.encode_to_vec().as_slice()).expect("decodes"),
    )
    .expect("records convert back");
    assert_eq!(records, graph.records());
}
