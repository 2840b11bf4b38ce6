//! Outputs stored by reference, on the worker's side: a completed output larger than the inline
//! limit goes to the Object Store bucket `trellis_outputs` and the result carries its reference
//! ([`OutputStore::store`]); references among what an attempt is handed (its dependencies'
//! outputs, a resumed parent's group summary) are read back and checked before the handler runs
//! ([`OutputStore::resolve`]), so handlers only ever see values.

use bytes::Bytes;
use trellis_bus::{OutputError, OutputRef, Outputs, object_name};
use trellis_proto::v1::TaskAssignment;
use trellis_proto::v1::resume_context::ResumedAfter;

use crate::sdk::{Outcome, Running};

/// The bucket and the limit above which outputs go to it.
#[derive(Debug)]
pub(crate) struct OutputStore {
    outputs: Outputs,
    inline_limit: usize,
}

impl OutputStore {
    pub(crate) fn new(outputs: Outputs, inline_limit: usize) -> OutputStore {
        OutputStore {
            outputs,
            inline_limit,
        }
    }

    /// Replaces every reference among the assignment's upstream outputs and group-summary outputs
    /// with the bytes it names. A missing or corrupt object fails the attempt (not retried: the
    /// object will not come back), naming the object and whose output it was; NATS being
    /// unreachable fails it retryably.
    pub(crate) async fn resolve(&self, assignment: &mut TaskAssignment) -> Result<(), Outcome> {
        for upstream in &mut assignment.upstream {
            if let Some(reference) = OutputRef::from_output(&upstream.output) {
                upstream.output = self
                    .read(&reference, &format!("task {:?}", upstream.task_id))
                    .await?;
            }
        }
        let summary =
            assignment
                .resume
                .as_mut()
                .and_then(|resume| match resume.resumed_after.as_mut() {
                    Some(ResumedAfter::GroupSummary(summary)) => Some(summary),
                    _ => None,
                });
        if let Some(summary) = summary {
            for (member, output) in summary.outputs.iter_mut().enumerate() {
                let Some(bytes) = output.output.as_mut() else {
                    continue;
                };
                if let Some(reference) = OutputRef::from_output(bytes) {
                    *bytes = self
                        .read(&reference, &format!("subtask group member {member}"))
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn read(&self, reference: &OutputRef, whose: &str) -> Result<Vec<u8>, Outcome> {
        // Boxed, as is the put in `store`: few attempts take either path (see `validate`).
        Box::pin(self.outputs.get(reference))
            .await
            .map_err(|error| {
                let retryable = error.is_transient();
                Outcome::failed(format!("the output of {whose}: {error}"), retryable)
            })
    }

    /// Returns the outcome to report: a completed output over the inline limit stored by
    /// reference (unless `keep_inline`), an output that would pass for a reference refused, any
    /// other outcome unchanged.
    pub(crate) async fn store(
        &self,
        outcome: Outcome,
        attempt: &Running,
        keep_inline: bool,
    ) -> Outcome {
        let bytes = match outcome {
            Outcome::Completed(value) => Bytes::from(
                // A `Value` always serializes: its map keys are strings and its numbers finite.
                serde_json::to_vec(&value).unwrap_or_else(|_| b"null".to_vec()),
            ),
            Outcome::CompletedJson(bytes) => bytes,
            other => return other,
        };
        if trellis_bus::is_reserved(&bytes) {
            return Outcome::failed(
                format!(
                    "the output is an object whose only key is {:?}, which is reserved for \
                     outputs stored by reference; wrap it in another object",
                    trellis_bus::REF_KEY
                ),
                false,
            );
        }
        if keep_inline || bytes.len() <= self.inline_limit {
            return Outcome::CompletedJson(bytes);
        }
        let object = object_name(
            &attempt.execution_id,
            &attempt.task_instance_id,
            attempt.attempt,
        );
        match Box::pin(self.outputs.put(&object, &bytes)).await {
            Ok(reference) => {
                tracing::debug!(object = %reference.location(), size = reference.size, "output stored by reference");
                Outcome::CompletedJson(Bytes::from(reference.to_output()))
            }
            Err(error @ OutputError::Write { .. }) => Outcome::failed(error, true),
            Err(error) => Outcome::failed(error, false),
        }
    }
}
