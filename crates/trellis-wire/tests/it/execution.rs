//! A real execution through the wire: every event, assignment and result travels as bytes before
//! it is applied, and the decoded log alone rebuilds the live state.

use std::sync::Arc;

use prost::Message;
use trellis_core::ids::{GroupId, TaskInstanceId};
use trellis_core::machine::{Command, Event, Execution, GroupRule, ResumeContext};
use trellis_core::plan::{Limits, compile_str};
use trellis_proto::v1::{self, task_result};
use trellis_wire::log::{
    LogEntry, Started, decode_event_batch, event_batch_to_proto, started_to_proto,
};
use trellis_wire::replay::{ReplayErrorKind, Replayer, Skipped};
use trellis_wire::worker::{assignment_to_proto, decode_task_assignment, decode_task_result};
use trellis_wire::{common, read};

use crate::support::{AT_MS, execution_id};

const PLAN: &str = r#"
name: wire
tasks:
  - id: fan
    type: fanout
  - id: after
    type: noop
    depends_on: [fan]
"#;

/// An execution run to its end, every event through the wire.
struct Run {
    live: Execution,
    /// The log: one encoded `EventBatch` per message, `ExecutionStarted` first.
    log: Vec<Vec<u8>>,
    now: u64,
}

/// Runs an execution whose events all travel through the wire (core → proto → bytes → core)
/// before being applied; the resumed parent's assignment carries its group summary.
fn run() -> Run {
    let plan = Arc::new(compile_str(PLAN, &Limits::default()).expect("the plan compiles"));
    let started = Started {
        plan_name: plan.name.clone(),
        run_number: 1,
        spec: PLAN.to_owned(),
        format: v1::PlanFormat::Yaml,
        started_at_ms: AT_MS,
        compiled_plan: trellis_core::plan::encode(&plan),
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
                started_at_unix_ms: Some(sent_at_unix_ms),
                validation: Vec::new(),
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
                        rule: Some(common::group_rule_to_proto(GroupRule::AllSettled)),
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

    Run { live, log, now }
}

/// Replays the decoded log into a fresh execution: it ends in the live state, and its read
/// projections survive the wire.
#[test]
fn replaying_the_decoded_log_rebuilds_the_live_state() {
    let Run { live, log, now } = run();
    let (mut replayer, refused) =
        Replayer::from_first_message(execution_id(), &log[0]).expect("the log starts well");
    assert!(refused.is_empty());
    for message in &log[1..] {
        let refused = replayer.apply_message(message).expect("the log replays");
        assert!(refused.is_empty(), "refused: {refused:?}");
    }
    assert_eq!(replayer.sequence(), log.len() as u64);
    assert_eq!(*replayer.machine(), live);
    // The plan came from its recorded encoding; `ExecutionStarted` no longer holds the bytes.
    assert!(replayer.started().compiled_plan.is_empty());
    assert_eq!(
        read::progress_from_proto(&read::progress_to_proto(&live.progress(now))),
        Ok(live.progress(now))
    );
    let graph = trellis_core::graph::build(live.records()).expect("the records form a tree");
    let proto_graph = read::graph_to_proto(&graph);
    assert_eq!(proto_graph.nodes.len(), graph.n_nodes());
    assert_eq!(proto_graph.groups.len(), graph.n_groups());
    assert_eq!(proto_graph.root_indices, [0]);
    let records = read::graph_records_from_proto(
        &v1::ExecutionGraph::decode(proto_graph.encode_to_vec().as_slice()).expect("decodes"),
    )
    .expect("records convert back");
    assert_eq!(records, graph.records());
}

/// One policy for every replayer: duplicates are skipped, a gap, a corrupt message, another
/// execution's event or a second `ExecutionStarted` stop the replay with the execution and the
/// sequence named, and apply nothing.
#[test]
fn a_broken_log_is_reported_with_its_execution_and_sequence() {
    let Run { live, log, .. } = run();
    let start = || {
        Replayer::from_first_message(execution_id(), &log[0])
            .expect("the log starts well")
            .0
    };

    // A redelivered message changes nothing.
    let mut replayer = start();
    replayer.apply_message(&log[1]).expect("applies");
    let before = replayer.machine().clone();
    replayer
        .apply_message(&log[1])
        .expect("a duplicate is skipped");
    assert_eq!(*replayer.machine(), before);

    // A missing message: the next one is refused and names the first missing sequence.
    let err = replayer.apply_message(&log[3]).expect_err("a gap");
    assert_eq!(err.execution_id, execution_id());
    assert_eq!(err.sequence, 3);
    assert_eq!(err.kind, ReplayErrorKind::Gap { found: 4 });
    assert_eq!(*replayer.machine(), before);
    assert_eq!(replayer.sequence(), 2);
    assert!(
        err.to_string().starts_with(&format!(
            "the log of execution {}, sequence 3: missing",
            execution_id()
        )),
        "{err}"
    );

    // A corrupt message.
    let err = replayer.apply_message(b"\xff\xff").expect_err("corrupt");
    assert_eq!((err.sequence, replayer.sequence()), (3, 2));
    assert!(matches!(err.kind, ReplayErrorKind::Corrupt(_)), "{err}");

    // An event of another execution.
    let mut other = v1::EventBatch::decode(log[2].as_slice()).expect("decodes");
    other.events[0].execution_id = "00000000-0000-7000-8000-000000000001".to_owned();
    let err = replayer
        .apply_message(&other.encode_to_vec())
        .expect_err("another execution's event");
    assert!(
        matches!(err.kind, ReplayErrorKind::OtherExecution(_)),
        "{err}"
    );

    // `ExecutionStarted` again, at the next sequence.
    let mut again = v1::EventBatch::decode(log[0].as_slice()).expect("decodes");
    again.events[0].sequence = 3;
    let err = replayer
        .apply_message(&again.encode_to_vec())
        .expect_err("started again");
    assert_eq!((err.sequence, err.kind), (3, ReplayErrorKind::StartedAgain));

    // A log that does not start with `ExecutionStarted`.
    let err = Replayer::from_first_message(execution_id(), &log[1]).expect_err("not started");
    assert_eq!((err.sequence, err.kind), (1, ReplayErrorKind::NotStarted));

    // An event of a kind this build does not know is skipped, and said so; the replay goes on.
    let mut newer = start();
    let mut unknown = v1::EventBatch::decode(log[1].as_slice()).expect("decodes");
    unknown.events[0].kind = None;
    let skipped = newer
        .apply_message(&unknown.encode_to_vec())
        .expect("an unknown kind is skipped");
    assert!(
        matches!(skipped[..], [(2, Skipped::Unknown)]),
        "{skipped:?}"
    );
    assert_eq!(newer.sequence(), 2);

    // Nothing of the above was applied: the rest of the log still replays to the live state.
    for message in &log[2..] {
        replayer.apply_message(message).expect("the log replays");
    }
    assert_eq!(*replayer.machine(), live);
}
