//! `GetTaskOutput`: the bytes of a task output stored by reference in the Object Store bucket
//! `trellis_outputs`, read whole, checked against the reference's size and SHA-256, and sent in
//! chunks. The reference must name an object of the execution the caller asked about (object
//! names begin with the execution id), so seeing an execution is what reading its outputs takes.

use std::pin::Pin;

use futures::Stream;
use tonic::Status;
use trellis_bus::{OutputError, OutputRef, Outputs};
use trellis_core::ids::ExecutionId;
use trellis_proto::v1;

/// The `GetTaskOutput` stream.
pub(super) type OutputStream =
    Pin<Box<dyn Stream<Item = Result<v1::GetTaskOutputResponse, Status>> + Send + 'static>>;

/// Bytes per message of the stream.
const CHUNK_BYTES: usize = 1024 * 1024;

/// Reads the request's reference, which must name an object of `execution`.
pub(super) fn reference(
    execution: ExecutionId,
    reference: Option<&v1::OutputReference>,
) -> Result<OutputRef, Status> {
    let Some(reference) = reference else {
        return Err(Status::invalid_argument(
            "reference: missing (the `$trellis_ref` object of the task's output)",
        ));
    };
    let prefix = format!("{execution}/");
    if !reference.object.starts_with(&prefix) {
        return Err(Status::invalid_argument(format!(
            "reference.object: {:?} is not an output of execution {execution}",
            reference.object
        )));
    }
    OutputRef::from_proto(reference).ok_or_else(|| {
        Status::invalid_argument(format!(
            "reference.sha256: {:?} is not 64 hex digits",
            reference.sha256
        ))
    })
}

/// Reads the object and returns it as a stream of chunks.
pub(super) async fn open(outputs: &Outputs, reference: &OutputRef) -> Result<OutputStream, Status> {
    let bytes = outputs.get(reference).await.map_err(|error| match error {
        OutputError::Missing { .. } => Status::not_found(error.to_string()),
        OutputError::Corrupt { .. } => Status::data_loss(error.to_string()),
        OutputError::Read { .. } | OutputError::Write { .. } => {
            Status::unavailable(error.to_string())
        }
    })?;
    let chunks: Vec<Result<v1::GetTaskOutputResponse, Status>> = bytes
        .chunks(CHUNK_BYTES)
        .map(|chunk| {
            Ok(v1::GetTaskOutputResponse {
                chunk: chunk.to_vec(),
            })
        })
        .collect();
    Ok(Box::pin(futures::stream::iter(chunks)))
}
