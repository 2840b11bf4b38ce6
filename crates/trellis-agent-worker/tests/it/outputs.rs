//! Outputs stored by reference, on the worker: an output over the inline limit goes to the
//! `trellis_outputs` bucket and the result carries its reference; references handed in (a
//! dependency's output, a group member's output) reach the handler as values; a missing or
//! corrupt object fails the attempt naming it; a router's output stays inline; an output that
//! would pass for a reference is refused.

use serde_json::json;
use trellis_agent_worker::v1::resume_context::ResumedAfter;
use trellis_agent_worker::v1::{GroupSummary, MemberOutput, ResumeContext, UpstreamOutput};
use trellis_agent_worker::{HandlerRegistry, Outcome, TaskContext};
use trellis_bus::{OutputRef, Outputs};

use super::*;

/// Completes with `{"blob": "x" * n}` for input `{"n": n}`.
async fn blob(ctx: TaskContext) -> Outcome {
    let n = ctx.input()["n"].as_u64().unwrap_or(0) as usize;
    Outcome::Completed(json!({"blob": "x".repeat(n)}))
}

/// Completes with what it was handed: its upstream outputs and its group summary's outputs.
async fn echo(ctx: TaskContext) -> Outcome {
    let members: Vec<Value> = ctx
        .group_summary()
        .map(|summary| {
            summary
                .outputs
                .iter()
                .map(|member| {
                    serde_json::from_slice(member.output.as_deref().unwrap_or(b"null"))
                        .unwrap_or(Value::Null)
                })
                .collect()
        })
        .unwrap_or_default();
    Outcome::Completed(json!({"build": ctx.upstream("build"), "members": members}))
}

fn registry() -> HandlerRegistry {
    HandlerRegistry::new().with("blob", blob).with("echo", echo)
}

/// The same assignment as a new instance.
fn again(assignment: &TaskAssignment) -> TaskAssignment {
    let instance = uuid::Uuid::now_v7().to_string();
    TaskAssignment {
        idempotency_key: subjects::task_msg_id(&instance, 1),
        task_instance_id: instance,
        ..assignment.clone()
    }
}

fn reference_of(result: &TaskResult) -> anyhow::Result<OutputRef> {
    let Some(task_result::Outcome::Completed(completed)) = &result.outcome else {
        bail!("expected a completed result, got {:?}", result.outcome);
    };
    OutputRef::from_output(&completed.output).with_context(|| {
        format!(
            "expected a reference, got {} bytes inline",
            completed.output.len()
        )
    })
}

#[tokio::test]
async fn large_outputs_go_by_reference_and_come_back_as_values() -> anyhow::Result<()> {
    let mut harness = Harness::start().await?;
    let worker = harness.worker_with("w1", &["blob", "echo"], registry(), |config| {
        config.output_inline_limit = 1000;
    });

    // Over the limit: stored, referenced with its size and checksum.
    let large = assignment("blob", json!({"n": 5000}));
    harness.publish(&large).await?;
    let reference = reference_of(&harness.result_of(&large.task_instance_id).await?)?;
    let expected = serde_json::to_vec(&json!({"blob": "x".repeat(5000)}))?;
    assert_eq!(reference.size, expected.len() as u64);
    assert_eq!(reference.sha256, trellis_bus::sha256_hex(&expected));
    assert_eq!(
        reference.object,
        format!("{}/{}/1", large.execution_id, large.task_instance_id)
    );
    let outputs = Outputs::ensure(&harness.js, 1).await?;
    assert_eq!(outputs.get(&reference).await?, expected);

    // Under the limit: inline.
    let small = assignment("blob", json!({"n": 10}));
    harness.publish(&small).await?;
    let output = completed_output(&harness.result_of(&small.task_instance_id).await?)?;
    assert_eq!(output, json!({"blob": "x".repeat(10)}));

    // A router keeps its output inline whatever its size.
    let router = TaskAssignment {
        keep_output_inline: true,
        ..assignment("blob", json!({"n": 5000}))
    };
    harness.publish(&router).await?;
    let output = completed_output(&harness.result_of(&router.task_instance_id).await?)?;
    assert_eq!(output["blob"].as_str().map(str::len), Some(5000));

    // References handed in are resolved before the handler runs.
    let reader = TaskAssignment {
        upstream: vec![UpstreamOutput {
            task_id: "build".to_owned(),
            output: reference.to_output(),
        }],
        resume: Some(ResumeContext {
            resumed_after: Some(ResumedAfter::GroupSummary(GroupSummary {
                member_count: 2,
                outputs: vec![
                    MemberOutput {
                        output: Some(reference.to_output()),
                    },
                    MemberOutput {
                        output: Some(b"7".to_vec()),
                    },
                ],
                ..GroupSummary::default()
            })),
            steps: Vec::new(),
        }),
        ..assignment("echo", json!(null))
    };
    harness.publish(&reader).await?;
    // The echo of a 5,000-byte value is itself over the limit: read it back.
    let echoed = reference_of(&harness.result_of(&reader.task_instance_id).await?)?;
    let echoed: Value = serde_json::from_slice(&outputs.get(&echoed).await?)?;
    let value: Value = serde_json::from_slice(&expected)?;
    assert_eq!(echoed, json!({"build": value, "members": [value, 7]}));

    // An output shaped like a reference is refused.
    let forged = TaskAssignment {
        input: reference.to_output(),
        ..assignment("noop", json!(null))
    };
    let noop = harness.worker("w2", &["noop"], HandlerRegistry::with_builtins());
    harness.publish(&forged).await?;
    let (error, retryable) = failure(&harness.result_of(&forged.task_instance_id).await?)?;
    assert!(
        error.contains("reserved for outputs stored by reference"),
        "{error}"
    );
    assert!(!retryable);

    // Damaged, then gone: the attempt fails and names the object and whose output it was.
    outputs
        .overwrite(&reference.object, b"\"tampered\"")
        .await?;
    let damaged = again(&reader);
    harness.publish(&damaged).await?;
    let (error, retryable) = failure(&harness.result_of(&damaged.task_instance_id).await?)?;
    assert!(
        error.starts_with(&format!(
            "the output of task \"build\": output object {} is corrupt",
            reference.location()
        )),
        "{error}"
    );
    assert!(!retryable);
    outputs.delete(&reference.object).await?;
    let gone = again(&reader);
    harness.publish(&gone).await?;
    let (error, retryable) = failure(&harness.result_of(&gone.task_instance_id).await?)?;
    assert!(
        error.starts_with(&format!(
            "the output of task \"build\": output object {} is missing",
            reference.location()
        )),
        "{error}"
    );
    assert!(!retryable);
    noop.stop().await?;
    worker.stop().await
}
