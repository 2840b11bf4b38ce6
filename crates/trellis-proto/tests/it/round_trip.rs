//! Messages survive an encode/decode round trip unchanged, and the flat execution graph decodes
//! at depths a nested representation could not.

use prost::Message;
use trellis_proto::v1::{
    CompletionRule, CompletionRuleKind, Event, ExecutionGraph, GraphNode, Question,
    QuestionTimeoutAction, SubtaskGroup, SubtaskSpec, TaskCompleted, TaskInstance, TaskResult,
    TaskState, Usage, event, graph_node, task_result,
};

const EXECUTION_ID: &str = "01968f3e-7b2a-7c4d-9e1f-0a1b2c3d4e5f";
const INSTANCE_ID: &str = "01968f3e-7b2a-7c4d-9e1f-aaaaaaaaaaaa";

fn check_round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(message: &M) {
    let bytes = message.encode_to_vec();
    let decoded = M::decode(bytes.as_slice()).expect("a message just encoded decodes");
    assert_eq!(&decoded, message);
}

fn task_result(outcome: task_result::Outcome) -> TaskResult {
    TaskResult {
        execution_id: EXECUTION_ID.to_owned(),
        task_instance_id: INSTANCE_ID.to_owned(),
        attempt: 2,
        worker_id: "worker-7".to_owned(),
        usage: Some(Usage {
            tokens_used: 1234,
            cost: 0.25,
        }),
        sent_at_unix_ms: 1_760_000_000_000,
        started_at_unix_ms: Some(1_759_999_999_990),
        validation: Vec::new(),
        outcome: Some(outcome),
    }
}

#[test]
fn task_result_round_trips_with_every_outcome() {
    let outcomes = [
        task_result::Outcome::Started(task_result::Started {}),
        task_result::Outcome::Completed(task_result::Completed {
            output: br#"{"ok":true}"#.to_vec(),
        }),
        task_result::Outcome::Failed(task_result::Failed {
            error: "exit status 2".to_owned(),
            retryable: true,
            lost_deliveries: 3,
        }),
        task_result::Outcome::Spawned(task_result::Spawned {
            group: Some(SubtaskGroup {
                group_id: "01968f3e-7b2a-7c4d-9e1f-bbbbbbbbbbbb".to_owned(),
                rule: Some(CompletionRule {
                    kind: CompletionRuleKind::Quorum.into(),
                    quorum: 2,
                }),
                members: vec![
                    SubtaskSpec {
                        task_type: "noop".to_owned(),
                        input: b"1".to_vec(),
                        queue: None,
                    },
                    SubtaskSpec {
                        task_type: "shell".to_owned(),
                        input: br#"{"command":["true"]}"#.to_vec(),
                        queue: Some("gpu".to_owned()),
                    },
                ],
            }),
        }),
        task_result::Outcome::Question(task_result::Asked {
            question: Some(Question {
                question_id: "01968f3e-7b2a-7c4d-9e1f-cccccccccccc".to_owned(),
                question_type: "approval".to_owned(),
                text: "deploy to production?".to_owned(),
                options: vec!["yes".to_owned(), "no".to_owned()],
                expires_at_unix_ms: Some(1_760_000_600_000),
                timeout_action: QuestionTimeoutAction::AnswerDefault.into(),
                default_answer: "no".to_owned(),
                priority: "high".to_owned(),
            }),
        }),
        task_result::Outcome::StepCheckpoint(task_result::StepCheckpoint {
            step: "collect".to_owned(),
            merged_state: br#"{"messages":["a","b"]}"#.to_vec(),
            next_step: "action".to_owned(),
        }),
    ];
    for outcome in outcomes {
        check_round_trip(&task_result(outcome));
    }
}

#[test]
fn event_round_trips() {
    let event = Event {
        execution_id: EXECUTION_ID.to_owned(),
        sequence: 17,
        timestamp_unix_ms: 1_760_000_000_123,
        kind: Some(event::Kind::TaskCompleted(TaskCompleted {
            task_instance_id: INSTANCE_ID.to_owned(),
            attempt: 1,
            output: br#"{"rows":3}"#.to_vec(),
            usage: Some(Usage {
                tokens_used: 10,
                cost: 0.0,
            }),
        })),
    };
    check_round_trip(&event);
}

#[test]
fn enums_decode_unknown_values_without_failing() {
    // A newer sender may add enum values; older receivers must still decode the message and see
    // the raw number (proto3 open enums), not fail.
    let instance = TaskInstance {
        state: 99,
        ..TaskInstance::default()
    };
    let decoded = TaskInstance::decode(instance.encode_to_vec().as_slice())
        .expect("a message just encoded decodes");
    assert_eq!(decoded.state, 99);
    assert!(TaskState::try_from(decoded.state).is_err());
}

#[test]
fn deep_execution_graph_decodes() {
    // A chain 100,000 instances long: nested messages would hit prost's recursion limit of 100,
    // the flat representation decodes at any depth.
    const DEPTH: u32 = 100_000;
    let nodes = (0..DEPTH)
        .map(|node_idx| GraphNode {
            record: Some(TaskInstance {
                task_id: "step".to_owned(),
                ..TaskInstance::default()
            }),
            next: (node_idx + 1 < DEPTH).then_some(graph_node::Next::NodeIndex(node_idx + 1)),
        })
        .collect();
    let graph = ExecutionGraph {
        nodes,
        groups: Vec::new(),
        root_indices: vec![0],
    };
    let decoded = ExecutionGraph::decode(graph.encode_to_vec().as_slice())
        .expect("a deep flat graph decodes");
    assert_eq!(decoded.nodes.len(), DEPTH as usize);
    assert_eq!(decoded, graph);
}
