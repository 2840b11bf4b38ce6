//! The checkpoint-store as the coordinator uses it: storing the checkpoints the turn decides on
//! (`crate::turn`'s checkpoint policy), pruning, and restoring the latest good chain, verifying
//! every checksum here too, not only in the store.

use std::sync::Arc;
use std::time::Duration;

use trellis_core::checksum;
use trellis_core::ids::ExecutionId;
use trellis_core::machine::{Execution, SNAPSHOT_FORMAT_VERSION};
use trellis_core::plan::Plan;
use trellis_grpc::{AuthChannel, ClientSecurity};
use trellis_proto::v1;
use trellis_proto::v1::checkpoint_store_client::CheckpointStoreClient;
use trellis_wire::log::Started;
use trellis_wire::replay::{Replayer, Skipped};

/// Longest wait for the store on any call: recovery falls back to the log rather than hang.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A checkpoint restored and verified: the state, and where in the log it stands.
#[derive(Debug)]
pub struct Restored {
    pub machine: Execution,
    pub sequence: u64,
    pub stream_sequence: u64,
    pub checkpoint_id: String,
    /// Deltas applied on top of the full snapshot.
    pub deltas: u32,
}

/// A client of the checkpoint-store; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct StoreClient {
    client: CheckpointStoreClient<AuthChannel>,
}

impl StoreClient {
    /// Prepares a client with `security`'s token and TLS; the connection is made on first use,
    /// so a store that is down does not stop the coordinator from starting.
    pub(crate) fn new(url: &str, security: &ClientSecurity) -> Result<Self, String> {
        let endpoint = security
            .endpoint(url)
            .map_err(|err| format!("checkpoint-store address: {err}"))?
            .connect_timeout(Duration::from_secs(1))
            .timeout(CALL_TIMEOUT);
        Ok(Self {
            client: CheckpointStoreClient::new(security.wrap(endpoint.connect_lazy())),
        })
    }

    /// Stores a checkpoint (its checksum is computed here) and returns its metadata.
    pub(crate) async fn create(
        &self,
        mut checkpoint: v1::Checkpoint,
    ) -> Result<v1::CheckpointMetadata, String> {
        if let Some(metadata) = checkpoint.metadata.as_mut() {
            metadata.checksum_sha256 = checksum::sha256(&checkpoint.state).to_vec();
            metadata.size_bytes = checkpoint.state.len() as u64;
        }
        let response = self
            .client
            .clone()
            .create_checkpoint(v1::CreateCheckpointRequest {
                checkpoint: Some(checkpoint),
            })
            .await
            .map_err(|status| status.message().to_owned())?;
        response
            .into_inner()
            .metadata
            .ok_or_else(|| "the store answered without metadata".to_owned())
    }

    /// Reads one execution from the read model (`None`: it has none).
    pub(crate) async fn record(
        &self,
        id: ExecutionId,
    ) -> Result<Option<v1::Execution>, tonic::Status> {
        match self
            .client
            .clone()
            .get_execution_record(v1::GetExecutionRecordRequest {
                execution_id: id.to_string(),
            })
            .await
        {
            Ok(response) => Ok(response.into_inner().execution),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
            Err(status) => Err(status),
        }
    }

    /// Reads one page of the task log batches the store copied from `TRELLIS_LOGS`.
    pub(crate) async fn task_logs(
        &self,
        request: v1::ListTaskLogsRequest,
    ) -> Result<v1::ListTaskLogsResponse, tonic::Status> {
        self.client
            .clone()
            .list_task_logs(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Lists executions from the read model.
    pub(crate) async fn list(
        &self,
        request: v1::ListExecutionRecordsRequest,
    ) -> Result<v1::ListExecutionRecordsResponse, tonic::Status> {
        self.client
            .clone()
            .list_execution_records(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| {
                tonic::Status::new(
                    status.code(),
                    format!("the checkpoint-store's read model: {}", status.message()),
                )
            })
    }

    /// Deletes all but the newest `keep` full checkpoints of an execution (with their deltas).
    pub(crate) async fn prune(&self, id: ExecutionId, keep: u32) -> Result<u64, String> {
        let response = self
            .client
            .clone()
            .prune_checkpoints(v1::PruneCheckpointsRequest {
                execution_id: id.to_string(),
                keep,
            })
            .await
            .map_err(|status| status.message().to_owned())?;
        Ok(response.into_inner().freed_bytes)
    }

    /// Restores the latest good checkpoint of an execution; `None` when it has none.
    pub(crate) async fn restore(
        &self,
        id: ExecutionId,
        started: &Started,
        plan: Arc<Plan>,
    ) -> Result<Option<Restored>, String> {
        let response = match self
            .client
            .clone()
            .restore_checkpoint(v1::RestoreCheckpointRequest {
                execution_id: id.to_string(),
                checkpoint_id: String::new(),
            })
            .await
        {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == tonic::Code::NotFound => return Ok(None),
            Err(status) => return Err(status.message().to_owned()),
        };
        restore_chain(id, started, plan, &response.chain).map(Some)
    }
}

/// Applies a checkpoint chain (a full snapshot, then deltas: event batches, replayed by the one
/// replayer), checking every checksum.
pub fn restore_chain(
    id: ExecutionId,
    started: &Started,
    plan: Arc<Plan>,
    chain: &[v1::Checkpoint],
) -> Result<Restored, String> {
    let (full, deltas) = chain
        .split_first()
        .ok_or_else(|| "the store returned an empty chain".to_owned())?;
    let (full_meta, full_state) = verified(full)?;
    if full_meta.kind() != v1::CheckpointKind::Full {
        return Err(format!(
            "checkpoint {} starts the chain but is not full",
            full_meta.checkpoint_id
        ));
    }
    if full_meta.state_format_version != SNAPSHOT_FORMAT_VERSION {
        return Err(format!(
            "checkpoint {} has snapshot format {}, this build reads {SNAPSHOT_FORMAT_VERSION}",
            full_meta.checkpoint_id, full_meta.state_format_version
        ));
    }
    let machine = Execution::restore(plan, full_state)
        .map_err(|err| format!("checkpoint {}: {err}", full_meta.checkpoint_id))?;
    if machine.id() != id {
        return Err(format!(
            "checkpoint {} holds execution {}, not {id}",
            full_meta.checkpoint_id,
            machine.id()
        ));
    }
    let mut replayer = Replayer::resume(started.clone(), machine, full_meta.event_sequence);
    let mut last = full_meta;
    for delta in deltas {
        let (meta, state) = verified(delta)?;
        let skipped = replayer
            .apply_message(state)
            .map_err(|err| format!("delta {}: {err}", meta.checkpoint_id))?;
        for (at, skipped) in skipped {
            match skipped {
                Skipped::Refused(err) => {
                    tracing::warn!(%id, at, %err, "event in a delta refused on restore");
                }
                Skipped::Unknown => {
                    return Err(format!(
                        "delta {}: sequence {at}: {skipped}",
                        meta.checkpoint_id
                    ));
                }
            }
        }
        last = meta;
    }
    let (_, machine, sequence) = replayer.into_parts();
    Ok(Restored {
        machine,
        sequence,
        stream_sequence: last.stream_sequence,
        checkpoint_id: last.checkpoint_id.clone(),
        deltas: deltas.len() as u32,
    })
}

fn verified(checkpoint: &v1::Checkpoint) -> Result<(&v1::CheckpointMetadata, &[u8]), String> {
    let metadata = checkpoint
        .metadata
        .as_ref()
        .ok_or_else(|| "a checkpoint without metadata".to_owned())?;
    if !checksum::verify(&checkpoint.state, &metadata.checksum_sha256) {
        return Err(format!(
            "checkpoint {} does not match its checksum",
            metadata.checkpoint_id
        ));
    }
    Ok((metadata, &checkpoint.state))
}
