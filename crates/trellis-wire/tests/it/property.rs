//! Properties of the event log on the wire: any event and any batch round-trip, and no bytes make
//! a decoder panic.

use proptest::prelude::*;
use prost::Message;
use serde_json::Value;
use trellis_core::ids::{GroupId, QuestionId, TaskInstanceId, WorkerId};
use trellis_core::machine::{
    Event, EventBody, GroupRule, Outcome, PauseMode, PauseScope, Question, SubtaskSpec,
    TimeoutAction, Usage,
};
use trellis_proto::v1;
use trellis_wire::log::{LogEntry, decode_event_batch, event_batch_to_proto, event_from_proto};
use trellis_wire::worker::{decode_task_assignment, decode_task_result};

use crate::log::check_event_round_trip;
use crate::support::{AT_MS, execution_id};

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

fn arb_scope() -> impl Strategy<Value = PauseScope> {
    prop_oneof![
        Just(PauseScope::Execution),
        "[a-z][a-z0-9-]{0,12}".prop_map(PauseScope::Task),
        arb_group().prop_map(PauseScope::Group),
    ]
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
                priority: "high".to_owned(),
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
        (any::<String>(), arb_scope(), any::<bool>()).prop_map(|(reason, scope, preempt)| {
            EventBody::PauseRequested {
                reason,
                scope,
                mode: if preempt {
                    PauseMode::Preempt
                } else {
                    PauseMode::Drain
                },
            }
        }),
        arb_scope().prop_map(|scope| EventBody::ResumeRequested { scope }),
        (arb_instance(), attempt)
            .prop_map(|(instance, attempt)| EventBody::TaskPreempted { instance, attempt }),
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
