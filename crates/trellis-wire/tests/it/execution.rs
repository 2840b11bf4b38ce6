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
