//! The worker contract on the wire: results become the right events, assignments carry their
//! resume context and steps, heartbeats are checked, and malformed input is a precise error.

use prost::Message;
use serde_json::{Value, json};
use trellis_core::ids::WorkerId;
use trellis_core::machine::{
    Assignment, Event, EventBody, GroupRule, GroupSummary, ResumeContext, StepRecord, SubtaskSpec,
    TimeoutAction, Usage,
};
use trellis_core::plan::{Check, CheckLevel, Probe};
use trellis_proto::v1::{self, task_result};
use trellis_wire::error::ConvertErrorKind;
use trellis_wire::worker::{
    assignment_from_proto, assignment_to_proto, decode_heartbeat, decode_task_assignment,
    decode_task_result, result_to_event, started_from_heartbeat, started_from_result,
};

use crate::support::{AT_MS, example_question, execution_id, group_id, instance_id, question_id};

// ------------------------------------------------------------------------------------------------
// Worker results
// ------------------------------------------------------------------------------------------------

pub(crate) fn task_result(outcome: Option<task_result::Outcome>) -> v1::TaskResult {
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
        started_at_unix_ms: None,
        validation: Vec::new(),
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

/// Every result says which worker started its attempt and when; the coordinator records that
/// as `TaskStarted` at the worker's time, never later than its own now.
#[test]
fn results_and_heartbeats_tell_when_an_attempt_started() {
    let completed = task_result::Outcome::Completed(task_result::Completed {
        output: b"{}".to_vec(),
    });
    let started = EventBody::TaskStarted {
        instance: instance_id(2),
        attempt: 2,
        worker: WorkerId::from("worker-7"),
    };
    let mut result = task_result(Some(completed));
    assert_eq!(
        started_from_result(&result, AT_MS),
        None,
        "no start time: none"
    );
    result.started_at_unix_ms = Some(AT_MS as i64 - 40);
    assert_eq!(
        started_from_result(&result, AT_MS),
        Some(Event {
            at_ms: AT_MS - 40,
            body: started.clone()
        })
    );
    // A worker clock ahead of the coordinator's does not start it in the future.
    result.started_at_unix_ms = Some(AT_MS as i64 + 5_000);
    assert_eq!(
        started_from_result(&result, AT_MS).map(|event| event.at_ms),
        Some(AT_MS)
    );
    // A `started` result is that event itself, at the worker's time.
    let mut report = task_result(Some(task_result::Outcome::Started(task_result::Started {})));
    report.started_at_unix_ms = Some(AT_MS as i64 - 7);
    assert_eq!(started_from_result(&report, AT_MS), None);
    let (_, event) = result_to_event(&report, AT_MS).expect("converts");
    assert_eq!(event.at_ms, AT_MS - 7);
    // A heartbeat names the attempts its worker runs, with their start.
    let running = v1::RunningTask {
        execution_id: execution_id().to_string(),
        task_instance_id: instance_id(2).to_string(),
        attempt: 2,
        started_at_unix_ms: AT_MS as i64 - 900,
        ..Default::default()
    };
    assert_eq!(
        started_from_heartbeat("worker-7", &running, AT_MS),
        Some((
            execution_id(),
            Event {
                at_ms: AT_MS - 900,
                body: started
            }
        ))
    );
    let nameless = v1::RunningTask {
        task_instance_id: "not an id".to_owned(),
        ..running
    };
    assert_eq!(started_from_heartbeat("worker-7", &nameless, AT_MS), None);
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
            lost_deliveries: 0,
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
                priority: "critical".to_owned(),
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
        lost_deliveries: 0,
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
fn heartbeats_name_their_worker_and_report_numbers() {
    let heartbeat = v1::WorkerHeartbeat {
        worker_id: "w-1".to_owned(),
        state: v1::WorkerState::Idle.into(),
        cpu_percent: 12.5,
        ..v1::WorkerHeartbeat::default()
    };
    assert_eq!(
        decode_heartbeat(&heartbeat.encode_to_vec()),
        Ok(heartbeat.clone())
    );
    let check = |heartbeat: v1::WorkerHeartbeat, expected: &str| {
        let err = decode_heartbeat(&heartbeat.encode_to_vec()).expect_err("refused");
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
    let garbage = decode_heartbeat(&[0xff, 0xff]).expect_err("refused");
    assert!(
        matches!(garbage.kind(), ConvertErrorKind::Decode(_)),
        "{garbage}"
    );
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
    let checks = [
        Check {
            name: "lint".to_owned(),
            level: CheckLevel::Codebase,
            probe: Probe::Command(vec![
                "sh".to_owned(),
                "-c".to_owned(),
                "make lint".to_owned(),
            ]),
            timeout: std::time::Duration::from_secs(30),
        },
        Check {
            name: "up".to_owned(),
            level: CheckLevel::Api,
            probe: Probe::Http {
                method: "HEAD".to_owned(),
                url: "http://h/up".to_owned(),
                status: 204,
                body_contains: Some("ok".to_owned()),
            },
            timeout: std::time::Duration::from_millis(1500),
        },
    ];
    let lint_output = json!({"warnings": 0});
    let fetch_output = json!("page");
    let assignment = Assignment {
        instance: instance_id(2),
        task_id: "build",
        task_type: "shell",
        queue: "gpu",
        input: &input,
        attempt: 3,
        deadline_ms: Some(AT_MS + 5_000),
        avoid_worker: Some(&avoid),
        lost_deliveries: 2,
        resume: Some(&resume),
        steps: &steps,
        parent: None,
        group: None,
        checks: &checks,
        upstream: vec![("lint", &lint_output), ("fetch", &fetch_output)],
        keep_output_inline: true,
    };
    let proto = check_assignment_round_trip(&assignment);
    assert_eq!(proto.idempotency_key, format!("{}:3", instance_id(2)));
    assert_eq!(
        proto
            .upstream
            .iter()
            .map(|upstream| (upstream.task_id.as_str(), upstream.output.as_slice()))
            .collect::<Vec<_>>(),
        [("lint", &br#"{"warnings":0}"#[..]), ("fetch", b"\"page\"")]
    );
    assert!(!proto.upstream_truncated);
    assert!(proto.keep_output_inline);
    assert_eq!(
        proto.resumed_after_subtasks_group_id,
        Some(group_id(3).to_string())
    );
    assert_eq!(proto.avoid_worker_id.as_deref(), Some("worker-3"));
    assert_eq!(proto.lost_deliveries, 2);
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
        lost_deliveries: 0,
        resume: Some(&resume),
        steps: &[],
        parent: None,
        group: None,
        checks: &[],
        upstream: Vec::new(),
        keep_output_inline: false,
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
        lost_deliveries: 0,
        resume: None,
        steps: &[],
        parent: Some(instance_id(2)),
        group: Some(group_id(3)),
        checks: &[],
        upstream: Vec::new(),
        keep_output_inline: false,
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
        lost_deliveries: 0,
        resume: None,
        steps: &steps,
        parent: None,
        group: None,
        checks: &[],
        upstream: Vec::new(),
        keep_output_inline: false,
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

#[test]
fn upstream_outputs_past_the_byte_limit_are_left_out_and_flagged() {
    use trellis_wire::worker::UPSTREAM_BYTES_LIMIT;
    let input = json!(null);
    let large = json!("x".repeat(UPSTREAM_BYTES_LIMIT / 2));
    let small = json!(1);
    let assignment = Assignment {
        instance: instance_id(2),
        task_id: "join",
        task_type: "noop",
        queue: "noop",
        input: &input,
        attempt: 1,
        deadline_ms: None,
        avoid_worker: None,
        lost_deliveries: 0,
        resume: None,
        steps: &[],
        parent: None,
        group: None,
        checks: &[],
        upstream: vec![("a", &large), ("b", &large), ("c", &small)],
        keep_output_inline: false,
    };
    let proto = assignment_to_proto(execution_id(), 1, &assignment);
    let kept: Vec<&str> = proto
        .upstream
        .iter()
        .map(|upstream| upstream.task_id.as_str())
        .collect();
    // The second large output would pass the limit; the small one after it still fits.
    assert_eq!(kept, ["a", "c"]);
    assert!(proto.upstream_truncated);
}
