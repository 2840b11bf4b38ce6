//! Turning outcomes into `TaskResult`s and getting them accepted by JetStream.
//!
//! Final results go through one publisher task ([`crate::publisher`]). Step checkpoints are
//! published by the handler itself, and stored in the steps bucket, before the handler continues.
//!
//! A publish that fails (the NATS server restarting, a publish ack that timed out) is sent again
//! with the same `Nats-Msg-Id`, so JetStream stores it once, with a growing delay for at most
//! [`STORE_RETRY_BOUND`]; a task message waiting for its result is extended meanwhile and handed
//! back if the result still is not stored.

use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::kv;
use async_nats::jetstream::message::PublishMessage;
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use prost::Message as _;
use trellis_proto::subjects;
use trellis_proto::v1::{self, RecordedStep, RecordedSteps, TaskAssignment, task_result};

use crate::handoff::Handoffs;
use crate::sdk::{Outcome, Running, lock};
use crate::steps;
use crate::task_ack::{Settle, TaskAck};

/// How long a result, a step checkpoint or a step entry is retried before the worker gives up:
/// long enough to ride out a NATS server restart, short enough for the deduplication window
/// (two minutes) to still recognise a late copy.
pub(crate) const STORE_RETRY_BOUND: Duration = Duration::from_secs(60);
/// How long reading a redelivered instance's steps is retried before it runs without them.
pub(crate) const LOAD_RETRY_BOUND: Duration = Duration::from_secs(10);
/// The first pause between two tries; it doubles up to [`RETRY_MAX_DELAY`].
const RETRY_FIRST_DELAY: Duration = Duration::from_millis(100);
const RETRY_MAX_DELAY: Duration = Duration::from_secs(2);

/// A finished attempt waiting for its result to be published and its task message acknowledged.
pub(crate) struct Finished {
    pub(crate) subject: Subject,
    /// The shard it may be handed off to (see [`crate::handoff`]); `None` when it must go to the
    /// stream: the attempt checkpointed steps there, which the coordinator must see first.
    pub(crate) handoff: Option<u32>,
    pub(crate) msg_id: String,
    pub(crate) payload: Bytes,
    pub(crate) acker: TaskAck,
    /// The instance whose steps entry is deleted once the result is stored: set when the attempt
    /// used one and its outcome ends the instance (a failure keeps it for the retry).
    pub(crate) forget_steps: Option<String>,
    /// The attempt's trace context, sent as the `traceparent` header.
    pub(crate) traceparent: Option<String>,
}

/// Builds and addresses results for one worker, and keeps its durable steps.
#[derive(Debug)]
pub(crate) struct ResultSink {
    js: jetstream::Context,
    worker_id: String,
    /// `trellis.results.<shard>` for every configured shard, built once.
    shard_subjects: Vec<Subject>,
    /// The bucket of recorded steps, by instance id.
    steps: kv::Store,
    /// Hand-offs of final results to the coordinators; `None` when results go to the stream only.
    handoffs: Option<Handoffs>,
}

impl ResultSink {
    pub(crate) fn new(
        js: jetstream::Context,
        worker_id: String,
        n_shards: u32,
        steps: kv::Store,
        handoffs: Option<Handoffs>,
    ) -> ResultSink {
        let shard_subjects = (0..n_shards.max(1))
            .map(|shard| Subject::from(subjects::results(shard)))
            .collect();
        ResultSink {
            js,
            worker_id,
            shard_subjects,
            steps,
            handoffs,
        }
    }

    /// The JetStream context results are published with.
    pub(crate) fn js(&self) -> &jetstream::Context {
        &self.js
    }

    /// Returns the shard of an assignment's results and their subject,
    /// `trellis.results.<shard>`: the shard the coordinator names, otherwise the configured shard
    /// the execution id hashes to.
    pub(crate) fn subject(&self, assignment: &TaskAssignment) -> (u32, Subject) {
        let shard = match assignment.results_shard {
            Some(shard) => shard,
            None => {
                // The vector has one subject per configured shard, which fits in a `u32`.
                let n_shards = self.shard_subjects.len() as u32;
                subjects::shard_of(&assignment.execution_id, n_shards)
            }
        };
        let subject = match self.shard_subjects.get(shard as usize) {
            Some(subject) => subject.clone(),
            None => Subject::from(subjects::results(shard)),
        };
        (shard, subject)
    }

    /// The hand-offs of final results to coordinators, when the worker makes them.
    pub(crate) fn handoffs(&self) -> Option<&Handoffs> {
        self.handoffs.as_ref()
    }

    /// Returns the subject, `Nats-Msg-Id` and encoded `TaskResult` of a final outcome.
    pub(crate) fn encode(&self, running: &Running, outcome: Outcome) -> (Subject, String, Bytes) {
        let msg_id = subjects::result_msg_id(
            &running.task_instance_id,
            running.attempt,
            outcome.msg_id_suffix(),
        );
        let outcome = outcome_to_proto(outcome);
        let result = self.result(running, outcome);
        (
            running.results_subject.clone(),
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
            started_at_unix_ms: Some(running.started_at_unix_ms),
            validation: lock(&running.validation).clone(),
            outcome: Some(outcome),
        }
    }

    /// Checkpoints a step: writes the instance's `recorded` steps (this one last) to the steps
    /// bucket, then publishes the step's `step_checkpoint` result, each once JetStream stored the
    /// one before. In that order, a step the coordinator has recorded is already in the bucket.
    pub(crate) async fn checkpoint(
        &self,
        assignment: &TaskAssignment,
        running: &Running,
        recorded: Vec<RecordedStep>,
    ) -> Result<(), String> {
        let Some(last) = recorded.last() else {
            return Ok(());
        };
        let outcome = task_result::Outcome::StepCheckpoint(task_result::StepCheckpoint {
            step: last.step.clone(),
            merged_state: last.state.clone(),
            // A handler's steps are plain code, so the worker cannot know which one comes next;
            // the recorded step names are what a redelivery resumes from.
            next_step: String::new(),
        });
        let payload = Bytes::from(self.result(running, outcome).encode_to_vec());
        let msg_id = subjects::result_msg_id(
            &assignment.task_instance_id,
            assignment.attempt,
            &format!("step:{}", last.step),
        );
        let entry = Bytes::from(
            RecordedSteps {
                attempt: assignment.attempt,
                steps: recorded,
            }
            .encode_to_vec(),
        );
        let key = assignment.task_instance_id.as_str();
        running.steps_stored.store(true, Ordering::Relaxed);
        retry(
            "step entry",
            key,
            STORE_RETRY_BOUND,
            |_| true,
            || self.steps.put(key, entry.clone()),
        )
        .await
        .map_err(|error| format!("cannot store the steps of {key}: {error}"))?;
        retry(
            "step checkpoint",
            &msg_id,
            STORE_RETRY_BOUND,
            is_transient,
            || {
                publish_once(
                    &self.js,
                    &running.results_subject,
                    message(&msg_id, running.traceparent.as_deref(), None, &payload),
                )
            },
        )
        .await
        .map(drop)
        .map_err(|error| error.to_string())
    }

    /// Adds the steps kept in the bucket for `assignment`'s instance to the ones the assignment
    /// carries, when the bucket holds more (see [`steps::resume_with`]). Reading fails only when
    /// NATS stays unreachable; the attempt then runs with the assignment's steps.
    pub(crate) async fn load_steps(&self, assignment: &mut TaskAssignment, running: &Running) {
        let key = assignment.task_instance_id.as_str();
        let entry = match retry(
            "steps entry read",
            key,
            LOAD_RETRY_BOUND,
            |_| true,
            || self.steps.get(key),
        )
        .await
        {
            Ok(Some(entry)) => entry,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(task_instance_id = %key, %error, "cannot read recorded steps; running with the assignment's steps");
                return;
            }
        };
        let stored = match RecordedSteps::decode(entry) {
            Ok(stored) => stored,
            Err(error) => {
                tracing::warn!(task_instance_id = %key, %error, "recorded steps entry is not RecordedSteps; ignoring it");
                return;
            }
        };
        running.steps_stored.store(true, Ordering::Relaxed);
        tracing::debug!(task_instance_id = %key, n_steps = stored.steps.len(), attempt = stored.attempt, "found recorded steps");
        steps::resume_with(assignment, stored);
    }

    /// Deletes an instance's steps entry. A failure only leaves the entry to expire.
    pub(crate) async fn forget_steps(&self, task_instance_id: &str) {
        if let Err(error) = self.steps.delete(task_instance_id).await {
            tracing::debug!(%task_instance_id, %error, "cannot delete recorded steps; they expire");
        }
    }
}

/// Returns the wire form of a handler's final outcome (a new group or question gets a fresh id).
pub(crate) fn outcome_to_proto(outcome: Outcome) -> task_result::Outcome {
    match outcome {
        Outcome::Completed(output) => task_result::Outcome::Completed(task_result::Completed {
            output: json_bytes(&output),
        }),
        Outcome::CompletedJson(output) => task_result::Outcome::Completed(task_result::Completed {
            output: output.to_vec(),
        }),
        Outcome::Failed { error, retryable } => task_result::Outcome::Failed(task_result::Failed {
            error,
            retryable,
            lost_deliveries: 0,
        }),
        Outcome::Lost { deliveries } => task_result::Outcome::Failed(task_result::Failed {
            error: if deliveries == 1 {
                "worker lost 1 time".to_owned()
            } else {
                format!("worker lost {deliveries} times")
            },
            retryable: true,
            lost_deliveries: deliveries,
        }),
        Outcome::Spawn { rule, members } => task_result::Outcome::Spawned(task_result::Spawned {
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
        }),
        Outcome::Ask(question) => task_result::Outcome::Question(task_result::Asked {
            question: Some(v1::Question {
                question_id: uuid::Uuid::now_v7().to_string(),
                question_type: question.question_type,
                priority: question.priority,
                text: question.text,
                options: question.options,
                expires_at_unix_ms: question.expires_at_unix_ms,
                timeout_action: question.timeout_action as i32,
                default_answer: question.default_answer,
            }),
        }),
        Outcome::Preempted { step } => {
            task_result::Outcome::Preempted(task_result::Preempted { step })
        }
    }
}

/// Encodes a JSON value. Serialising a `Value` cannot fail: its map keys are always strings.
pub(crate) fn json_bytes(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

/// Returns the current time in milliseconds since the Unix epoch.
pub(crate) fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Publishes one results message (built by [`message`], whose error it passes on) and waits for
/// JetStream's ack.
pub(crate) async fn publish_once(
    js: &jetstream::Context,
    subject: &Subject,
    message: Result<PublishMessage, String>,
) -> Result<jetstream::publish::PublishAck, PublishError> {
    let message =
        message.map_err(|error| PublishError::with_source(PublishErrorKind::Other, error))?;
    js.send_publish(subject.clone(), message).await?.await
}

/// A results message: its payload, `Nats-Msg-Id`, when traced `traceparent`, and when it is a
/// batch the batch header with the number of results. Header values are checked, not asserted:
/// one a header cannot carry (`\r`, `\n`) is an error for this message alone, never a panic of
/// the publisher.
pub(crate) fn message(
    msg_id: &str,
    traceparent: Option<&str>,
    batch: Option<usize>,
    payload: &Bytes,
) -> Result<PublishMessage, String> {
    Ok(PublishMessage::build()
        .payload(payload.clone())
        .headers(headers(msg_id, traceparent, batch)?))
}

/// The headers of a results message (see [`message`]); a hand-off carries the same.
pub(crate) fn headers(
    msg_id: &str,
    traceparent: Option<&str>,
    batch: Option<usize>,
) -> Result<HeaderMap, String> {
    let header = |name: &str, value: &str| {
        value
            .parse::<async_nats::HeaderValue>()
            .map_err(|error| format!("{name} {value:?} cannot be a header: {error}"))
    };
    let mut headers = HeaderMap::new();
    if let Some(n) = batch {
        headers.insert(subjects::RESULT_BATCH_HEADER, n.to_string().as_str());
    }
    if let Some(traceparent) = traceparent {
        headers.insert(
            subjects::TRACEPARENT_HEADER,
            header(subjects::TRACEPARENT_HEADER, traceparent)?,
        );
    }
    headers.insert(
        async_nats::header::NATS_MESSAGE_ID,
        header(subjects::MSG_ID_HEADER, msg_id)?,
    );
    Ok(headers)
}

/// Returns false for a publish error that another try cannot fix.
pub(crate) fn is_transient(error: &PublishError) -> bool {
    !matches!(error.kind(), PublishErrorKind::MaxPayloadExceeded)
}

/// Growing pauses between tries, for at most a bound from the first failure.
#[derive(Debug)]
pub(crate) struct Backoff {
    deadline: tokio::time::Instant,
    delay: Duration,
}

impl Backoff {
    pub(crate) fn new(bound: Duration) -> Backoff {
        Backoff {
            deadline: tokio::time::Instant::now() + bound,
            delay: RETRY_FIRST_DELAY,
        }
    }

    /// Sleeps before the next try; returns false, at once, when the bound has passed.
    pub(crate) async fn wait(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now >= self.deadline {
            return false;
        }
        tokio::time::sleep(self.delay.min(self.deadline - now)).await;
        self.delay = (self.delay * 2).min(RETRY_MAX_DELAY);
        true
    }
}

/// Runs `op` until it succeeds or `bound` has passed, with [`Backoff`] pauses; returns the last
/// error then, or at once an error that is not `transient`. Logs the first failure at warn,
/// naming `what` and `key`.
async fn retry<T, E, Fut>(
    what: &str,
    key: &str,
    bound: Duration,
    transient: impl Fn(&E) -> bool,
    mut op: impl FnMut() -> Fut,
) -> Result<T, E>
where
    E: fmt::Display,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = Backoff::new(bound);
    let mut n_failures = 0u32;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(error) if !transient(&error) => return Err(error),
            Err(error) => {
                n_failures += 1;
                if n_failures == 1 {
                    tracing::warn!(what, key, %error, "nats did not take it; trying again");
                } else {
                    tracing::debug!(what, key, %error, n_failures, "still failing");
                }
                if !backoff.wait().await {
                    return Err(error);
                }
            }
        }
    }
}

/// Hands an assignment's task message back for immediate redelivery (once every assignment of
/// its batch is settled). The settling is boxed: an attempt's future awaits this on a rare path,
/// and would otherwise carry its size on every attempt.
pub(crate) async fn nak(acker: TaskAck) {
    if let Err(error) = Box::pin(acker.settle(Settle::Again(None))).await {
        tracing::warn!(%error, "failed to hand a task message back");
    }
}
