//! Turning outcomes into `TaskResult`s and getting them accepted by JetStream.
//!
//! Final results go through one publisher task that sends whatever has piled up (up to
//! [`PUBLISH_BATCH`]) without waiting between messages, then awaits the batch's publish acks
//! together and only then acknowledges the batch's task messages. Step checkpoints are published
//! by the handler itself and awaited before the handler continues.

use std::time::{SystemTime, UNIX_EPOCH};

use async_nats::Subject;
use async_nats::jetstream::message::{Acker, PublishMessage};
use async_nats::jetstream::{self, AckKind};
use bytes::Bytes;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use trellis_proto::subjects;
use trellis_proto::v1::{self, TaskAssignment, task_result};

use crate::sdk::{Outcome, Running};

/// Most results sent before their publish acks are awaited together.
pub(crate) const PUBLISH_BATCH: usize = 256;

/// A finished attempt waiting for its result to be published and its task message acknowledged.
pub(crate) struct Finished {
    pub(crate) subject: Subject,
    pub(crate) msg_id: String,
    pub(crate) payload: Bytes,
    pub(crate) acker: Acker,
}

/// Builds and addresses results for one worker.
#[derive(Debug)]
pub(crate) struct ResultSink {
    js: jetstream::Context,
    worker_id: String,
    /// `trellis.results.<shard>` for every shard, built once.
    shard_subjects: Vec<Subject>,
}

impl ResultSink {
    pub(crate) fn new(js: jetstream::Context, worker_id: String, n_shards: u32) -> ResultSink {
        let shard_subjects = (0..n_shards.max(1))
            .map(|shard| Subject::from(subjects::results(shard)))
            .collect();
        ResultSink {
            js,
            worker_id,
            shard_subjects,
        }
    }

    fn subject(&self, execution_id: &str) -> Subject {
        // `shard_of` returns a value below the number of shards, which is the vector's length.
        let n_shards = self.shard_subjects.len() as u32;
        let shard = subjects::shard_of(execution_id, n_shards) as usize;
        self.shard_subjects[shard].clone()
    }

    /// Returns the subject, `Nats-Msg-Id` and encoded `TaskResult` of a final outcome.
    pub(crate) fn encode(&self, running: &Running, outcome: Outcome) -> (Subject, String, Bytes) {
        let msg_id = subjects::result_msg_id(
            &running.task_instance_id,
            running.attempt,
            outcome.msg_id_suffix(),
        );
        let outcome = match outcome {
            Outcome::Completed(output) => task_result::Outcome::Completed(task_result::Completed {
                output: json_bytes(&output),
            }),
            Outcome::CompletedJson(output) => {
                task_result::Outcome::Completed(task_result::Completed {
                    output: output.to_vec(),
                })
            }
            Outcome::Failed { error, retryable } => {
                task_result::Outcome::Failed(task_result::Failed { error, retryable })
            }
            Outcome::Spawn { rule, members } => {
                task_result::Outcome::Spawned(task_result::Spawned {
                    group: Some(v1::SubtaskGroup {
                        group_id: uuid::Uuid::now_v7().to_string(),
                        rule: Some(rule.to_proto()),
                        members: members
                            .into_iter()
                            .map(|member| v1::SubtaskSpec {
                                task_type: member.task_type,
                                input: json_bytes(&member.input),
                                queue: member.queue,
                            })
                            .collect(),
                    }),
                })
            }
            Outcome::Ask(question) => task_result::Outcome::Question(task_result::Asked {
                question: Some(v1::Question {
                    question_id: uuid::Uuid::now_v7().to_string(),
                    question_type: question.question_type,
                    text: question.text,
                    options: question.options,
                    expires_at_unix_ms: question.expires_at_unix_ms,
                    timeout_action: question.timeout_action as i32,
                    default_answer: question.default_answer,
                }),
            }),
        };
        let result = self.result(running, outcome);
        (
            self.subject(&running.execution_id),
            msg_id,
            Bytes::from(result.encode_to_vec()),
        )
    }

    fn result(&self, running: &Running, outcome: task_result::Outcome) -> v1::TaskResult {
        v1::TaskResult {
            execution_id: running.execution_id.clone(),
            task_instance_id: running.task_instance_id.clone(),
            attempt: running.attempt,
            worker_id: self.worker_id.clone(),
            usage: Some(running.usage()),
            sent_at_unix_ms: now_unix_ms(),
            outcome: Some(outcome),
        }
    }

    /// Publishes a step checkpoint and waits until JetStream has stored it.
    pub(crate) async fn checkpoint(
        &self,
        assignment: &TaskAssignment,
        running: &Running,
        step: &str,
        merged_state: &serde_json::Value,
    ) -> Result<(), String> {
        let outcome = task_result::Outcome::StepCheckpoint(task_result::StepCheckpoint {
            step: step.to_owned(),
            merged_state: json_bytes(merged_state),
            // A handler's steps are plain code, so the worker cannot know which one comes next;
            // the recorded step names are what a redelivery resumes from.
            next_step: String::new(),
        });
        let payload = Bytes::from(self.result(running, outcome).encode_to_vec());
        let msg_id = subjects::result_msg_id(
            &assignment.task_instance_id,
            assignment.attempt,
            &format!("step:{step}"),
        );
        let publish = PublishMessage::build().message_id(msg_id).payload(payload);
        let ack = self
            .js
            .send_publish(self.subject(&assignment.execution_id), publish)
            .await
            .map_err(|error| error.to_string())?;
        ack.await.map(drop).map_err(|error| error.to_string())
    }
}

/// Encodes a JSON value. Serialising a `Value` cannot fail: its map keys are always strings.
fn json_bytes(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// Returns the current time in milliseconds since the Unix epoch.
pub(crate) fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Publishes finished results in batches until every sender is gone, then waits for the
/// outstanding publish acks. Stops at once, acknowledging nothing more, when `abandon` fires.
pub(crate) async fn publisher(
    js: jetstream::Context,
    mut finished_rx: mpsc::Receiver<Finished>,
    abandon: CancellationToken,
) {
    let ack_tasks = TaskTracker::new();
    let mut batch: Vec<Finished> = Vec::with_capacity(PUBLISH_BATCH);
    loop {
        let first = tokio::select! {
            biased;
            _ = abandon.cancelled() => break,
            first = finished_rx.recv() => first,
        };
        let Some(first) = first else { break };
        batch.push(first);
        while batch.len() < PUBLISH_BATCH {
            match finished_rx.try_recv() {
                Ok(finished) => batch.push(finished),
                Err(_) => break,
            }
        }
        let mut pending = Vec::with_capacity(batch.len());
        for finished in batch.drain(..) {
            let publish = PublishMessage::build()
                .message_id(&finished.msg_id)
                .payload(finished.payload);
            match js.send_publish(finished.subject, publish).await {
                Ok(ack) => pending.push((ack, finished.acker)),
                Err(error) => {
                    tracing::warn!(msg_id = %finished.msg_id, %error, "failed to publish a task result; handing the task back");
                    nak(&finished.acker).await;
                }
            }
        }
        let abandon = abandon.clone();
        ack_tasks.spawn(async move {
            let acks = futures::future::join_all(pending.into_iter().map(|(ack, acker)| async move {
                match ack.await {
                    Ok(_) => {
                        if let Err(error) = acker.ack().await {
                            tracing::warn!(%error, "failed to acknowledge a task message");
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "task result not accepted by jetstream; handing the task back");
                        nak(&acker).await;
                    }
                }
            }));
            tokio::select! {
                _ = abandon.cancelled() => {}
                _ = acks => {}
            }
        });
    }
    ack_tasks.close();
    ack_tasks.wait().await;
}

/// Hands a task message back for immediate redelivery.
pub(crate) async fn nak(acker: &Acker) {
    if let Err(error) = acker.ack_with(AckKind::Nak(None)).await {
        tracing::warn!(%error, "failed to hand a task message back");
    }
}
