//! Writes the starting inputs of the NATS fuzz targets to `fuzz/seeds/<target>/`: real messages
//! of the live execution of `trellis_fuzz::Live` (its assignments, every kind of result, its log
//! as event batches), so the fuzzer begins at messages that reach deep into each consumer.
//!
//! Run from `fuzz/`: `cargo run --example seeds` (the files are committed; run it again when the
//! messages change).

use std::fs;
use std::path::Path;

use prost::Message as _;
use trellis_core::machine::{Event, EventBody};
use trellis_fuzz::{Live, PLAN, T0, execution_id};
use trellis_proto::v1::{self, task_result};
use trellis_wire::log::{self, Started};
use trellis_wire::worker;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let write = |target: &str, name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let dir = root.join(target);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join(name), bytes)
    };
    let live = Live::new();
    let attempts = live.attempts();

    // Assignments, one per attempt out with workers, and their results of every kind.
    for (n, (instance, _)) in attempts.iter().enumerate() {
        let assignment = live
            .exec
            .assignment(*instance)
            .expect("a running instance has an assignment");
        let message = worker::assignment_to_proto(execution_id(), 1, &assignment);
        write(
            "nats_task_assignment",
            &format!("{}.pb", message.task_id),
            &message.encode_to_vec(),
        )?;
        for (kind, outcome) in outcomes() {
            let result = v1::TaskResult {
                execution_id: message.execution_id.clone(),
                task_instance_id: message.task_instance_id.clone(),
                attempt: message.attempt,
                worker_id: "worker-1".to_owned(),
                usage: Some(v1::Usage {
                    tokens_used: 10,
                    cost: 0.5,
                }),
                sent_at_unix_ms: (T0 + 5) as i64,
                started_at_unix_ms: Some((T0 + 1) as i64),
                validation: Vec::new(),
                outcome: Some(outcome),
            };
            let mut bytes = vec![0u8];
            bytes.extend(result.encode_to_vec());
            write(
                "nats_task_result",
                &format!("{}-{kind}.pb", message.task_id),
                &bytes,
            )?;
            if n == 0 {
                // Readdressed to each attempt, with and without a `started` first.
                for steer in [1u8, 3, 5, 7, 0x11, 0x13] {
                    bytes[0] = steer;
                    write(
                        "nats_task_result",
                        &format!("steer{steer:02x}-{kind}.pb"),
                        &bytes,
                    )?;
                }
            }
        }
        // What a resumed fanout and an answered question receive.
        let mut resumed = message.clone();
        resumed.resume = Some(v1::ResumeContext {
            resumed_after: Some(match message.task_type.as_str() {
                "fanout" => v1::resume_context::ResumedAfter::GroupSummary(v1::GroupSummary {
                    group_id: "0190a5b0-0000-7000-8000-000000000001".to_owned(),
                    rule: Some(v1::CompletionRule {
                        kind: v1::CompletionRuleKind::AllSettled.into(),
                        quorum: 0,
                    }),
                    succeeded: true,
                    member_count: 3,
                    completed: 3,
                    ..v1::GroupSummary::default()
                }),
                _ => v1::resume_context::ResumedAfter::HumanAnswer(v1::HumanAnswer {
                    question_id: "0190a5b0-0000-7000-8000-000000000002".to_owned(),
                    answer: "yes".to_owned(),
                }),
            }),
            steps: Vec::new(),
        });
        write(
            "nats_task_assignment",
            &format!("{}-resumed.pb", message.task_id),
            &resumed.encode_to_vec(),
        )?;
    }
    for (name, input) in [
        (
            "fanout-quorum",
            r#"{"count": 4, "child": {"type": "noop", "input": {"n": 1}, "queue": "q"}, "rule": {"quorum": 2}}"#,
        ),
        (
            "fanout-first",
            r#"{"count": 2, "child": {"type": "sleep"}, "rule": "first_success"}"#,
        ),
        ("fail-never", r#"{"times": 0, "retryable": false}"#),
        ("question-plain", r#"{"text": "why?"}"#),
    ] {
        let assignment = v1::TaskAssignment {
            execution_id: execution_id().to_string(),
            task_instance_id: attempts[0].0.to_string(),
            task_id: name.to_owned(),
            task_type: name.split('-').next().unwrap_or_default().to_owned(),
            input: input.as_bytes().to_vec(),
            attempt: 1,
            run_number: 1,
            ..v1::TaskAssignment::default()
        };
        write(
            "nats_task_assignment",
            &format!("{name}.pb"),
            &assignment.encode_to_vec(),
        )?;
    }

    // The event log: the start, then the live execution's events, one batch and one per event.
    let started = Started {
        plan_name: "fuzz".to_owned(),
        run_number: 1,
        spec: PLAN.to_owned(),
        format: v1::PlanFormat::Yaml,
        started_at_ms: T0,
        idempotency_key: "key-1".to_owned(),
        labels: [("team".to_owned(), "build".to_owned())].into(),
        namespace: "default".to_owned(),
        max_concurrency_cap: Some(2),
        traceparent: String::new(),
        // As logs written before the compiled plan was recorded: replays compile the spec.
        compiled_plan: Vec::new(),
    };
    let start = v1::EventBatch {
        events: vec![log::started_to_proto(execution_id(), &started)],
    };
    write("nats_event_batch", "started.pb", &start.encode_to_vec())?;
    // As logs are written now: with the compiled plan, cap applied, which replays decode.
    let mut plan = live.exec.plan().as_ref().clone();
    plan.options.max_concurrency = Some(2);
    let recorded = Started {
        compiled_plan: trellis_core::plan::encode(&plan),
        ..started.clone()
    };
    let start_compiled = v1::EventBatch {
        events: vec![log::started_to_proto(execution_id(), &recorded)],
    };
    write(
        "nats_event_batch",
        "started-compiled.pb",
        &start_compiled.encode_to_vec(),
    )?;
    let mut log = live.log.clone();
    let (instance, attempt) = attempts[0];
    log.push(Event {
        at_ms: T0 + 1,
        body: EventBody::TaskStarted {
            instance,
            attempt,
            worker: trellis_core::ids::WorkerId("worker-1".to_owned()),
        },
    });
    log.push(Event {
        at_ms: T0 + 2,
        body: EventBody::pause("look"),
    });
    log.push(Event {
        at_ms: T0 + 3,
        body: EventBody::resume(),
    });
    log.push(Event {
        at_ms: T0 + 4,
        body: EventBody::CancelRequested {
            reason: "done".to_owned(),
        },
    });
    let mut whole = start.clone();
    whole
        .events
        .extend(log::event_batch_to_proto(execution_id(), 2, &log).events);
    write("nats_event_batch", "whole-log.pb", &whole.encode_to_vec())?;
    write(
        "nats_event_batch",
        "after-start.pb",
        &log::event_batch_to_proto(execution_id(), 2, &log).encode_to_vec(),
    )?;
    for (n, event) in log.iter().enumerate() {
        let batch =
            log::event_batch_to_proto(execution_id(), 2 + n as u64, std::slice::from_ref(event));
        write(
            "nats_event_batch",
            &format!("event-{n:02}-{}.pb", event.body.name()),
            &batch.encode_to_vec(),
        )?;
    }

    // Cancel requests: subject token, NUL, message.
    for (name, token, request) in [
        (
            "full",
            attempts[0].0.to_string(),
            v1::CancelTask {
                execution_id: execution_id().to_string(),
                task_instance_id: attempts[0].0.to_string(),
                attempt: 1,
                reason: "execution cancelled".to_owned(),
                preempt: false,
            },
        ),
        (
            "preempt",
            attempts[0].0.to_string(),
            v1::CancelTask {
                execution_id: execution_id().to_string(),
                task_instance_id: attempts[0].0.to_string(),
                attempt: 1,
                reason: "queue paused".to_owned(),
                preempt: true,
            },
        ),
        (
            "empty",
            attempts[1].0.to_string(),
            v1::CancelTask::default(),
        ),
    ] {
        let mut bytes = token.as_bytes().to_vec();
        bytes.push(0);
        bytes.extend(request.encode_to_vec());
        write("nats_cancel_task", &format!("{name}.pb"), &bytes)?;
    }

    // Heartbeats.
    let heartbeat = v1::WorkerHeartbeat {
        worker_id: "worker-1".to_owned(),
        host: "pod-1".to_owned(),
        queues: vec!["default".to_owned(), "shell".to_owned()],
        slots: 4,
        running: vec![v1::RunningTask {
            execution_id: execution_id().to_string(),
            task_instance_id: attempts[0].0.to_string(),
            attempt: 1,
            progress_percent: 40,
            current_step: "step-2".to_owned(),
            started_at_unix_ms: T0 as i64,
            task_id: "build".to_owned(),
        }],
        memory_bytes: 64 << 20,
        cpu_percent: 12.5,
        sent_at_unix_ms: T0 as i64,
        interval_ms: 1000,
        state: v1::WorkerState::Running.into(),
        tasks_completed: 12,
        tasks_failed: 1,
    };
    write(
        "nats_worker_heartbeat",
        "running.pb",
        &heartbeat.encode_to_vec(),
    )?;
    let idle = v1::WorkerHeartbeat {
        running: Vec::new(),
        state: v1::WorkerState::Idle.into(),
        ..heartbeat.clone()
    };
    write("nats_worker_heartbeat", "idle.pb", &idle.encode_to_vec())?;

    // Steps bucket entries, after a steer byte (steps the assignment carries).
    for (name, steer, n_steps) in [("longer", 1u8, 3usize), ("shorter", 3, 1), ("empty", 0, 0)] {
        let mut state = serde_json::json!({});
        let steps = (1..=n_steps)
            .map(|step_idx| {
                state["trace"] = serde_json::json!([format!("step-{step_idx}")]);
                state["done"][step_idx.to_string()] = serde_json::json!(true);
                v1::RecordedStep {
                    step: format!("step-{step_idx}"),
                    state: serde_json::to_vec(&state).unwrap_or_default(),
                }
            })
            .collect();
        let mut bytes = vec![steer];
        bytes.extend(v1::RecordedSteps { attempt: 1, steps }.encode_to_vec());
        write("nats_recorded_steps", &format!("{name}.pb"), &bytes)?;
    }
    println!("seeds written under {}", root.display());
    Ok(())
}

/// One result of each kind, valid for a running attempt.
fn outcomes() -> Vec<(&'static str, task_result::Outcome)> {
    vec![
        (
            "started",
            task_result::Outcome::Started(task_result::Started {}),
        ),
        (
            "completed",
            task_result::Outcome::Completed(task_result::Completed {
                output: br#"{"ok": true, "n": [1, 2.5]}"#.to_vec(),
            }),
        ),
        (
            "failed",
            task_result::Outcome::Failed(task_result::Failed {
                error: "boom".to_owned(),
                retryable: true,
                lost_deliveries: 0,
            }),
        ),
        (
            "failed-final",
            task_result::Outcome::Failed(task_result::Failed {
                error: "no".to_owned(),
                retryable: false,
                lost_deliveries: 0,
            }),
        ),
        (
            "spawned",
            task_result::Outcome::Spawned(task_result::Spawned {
                group: Some(v1::SubtaskGroup {
                    group_id: "0190a5b0-0000-7000-8000-0000000000a1".to_owned(),
                    rule: Some(v1::CompletionRule {
                        kind: v1::CompletionRuleKind::Quorum.into(),
                        quorum: 2,
                    }),
                    members: vec![
                        v1::SubtaskSpec {
                            task_type: "noop".to_owned(),
                            input: b"{}".to_vec(),
                            queue: None,
                        },
                        v1::SubtaskSpec {
                            task_type: "sleep".to_owned(),
                            input: br#"{"ms": 1}"#.to_vec(),
                            queue: Some("slow".to_owned()),
                        },
                        v1::SubtaskSpec {
                            task_type: "noop".to_owned(),
                            input: Vec::new(),
                            queue: None,
                        },
                    ],
                }),
            }),
        ),
        (
            "question",
            task_result::Outcome::Question(task_result::Asked {
                question: Some(v1::Question {
                    question_id: "0190a5b0-0000-7000-8000-0000000000b1".to_owned(),
                    question_type: "approval".to_owned(),
                    text: "ship it?".to_owned(),
                    options: vec!["yes".to_owned(), "no".to_owned()],
                    expires_at_unix_ms: Some((T0 + 60_000) as i64),
                    timeout_action: v1::QuestionTimeoutAction::AnswerDefault.into(),
                    default_answer: "no".to_owned(),
                    priority: "high".to_owned(),
                }),
            }),
        ),
        (
            "step",
            task_result::Outcome::StepCheckpoint(task_result::StepCheckpoint {
                step: "step-1".to_owned(),
                merged_state: br#"{"trace": ["step-1"]}"#.to_vec(),
                next_step: "step-2".to_owned(),
            }),
        ),
    ]
}
