//! A simulated checkpoint-store: it keeps the checkpoints the coordinators hand it (checksummed
//! as the real client does), prunes to the newest full ones after each full one, is sometimes
//! down, and gives back the newest chain (a full checkpoint and the deltas on it) for recovery.

use std::collections::BTreeMap;

use trellis_coordinator::turn::{CheckpointJob, KEEP_FULL};
use trellis_core::checksum;
use trellis_core::ids::ExecutionId;
use trellis_proto::v1;

/// The checkpoints of every execution, oldest first.
#[derive(Debug, Default)]
pub struct Store {
    checkpoints: BTreeMap<ExecutionId, Vec<v1::Checkpoint>>,
    pub stored: u64,
}

impl Store {
    /// Stores a checkpoint; returns its metadata as the store answers it.
    pub fn create(&mut self, job: CheckpointJob) -> Result<v1::CheckpointMetadata, String> {
        let mut checkpoint = job.checkpoint;
        let metadata = checkpoint
            .metadata
            .as_mut()
            .ok_or("a checkpoint without metadata")?;
        metadata.checksum_sha256 = checksum::sha256(&checkpoint.state).to_vec();
        metadata.size_bytes = checkpoint.state.len() as u64;
        let metadata = metadata.clone();
        let all = self.checkpoints.entry(job.id).or_default();
        all.push(checkpoint);
        self.stored += 1;
        if job.full {
            prune(all, KEEP_FULL as usize);
        }
        Ok(metadata)
    }

    /// Returns the newest chain of an execution: its newest full checkpoint and the deltas
    /// built on it, each on the one before.
    pub fn chain(&self, id: ExecutionId) -> Option<Vec<v1::Checkpoint>> {
        let all = self.checkpoints.get(&id)?;
        let full = all
            .iter()
            .rposition(|c| kind(c) == v1::CheckpointKind::Full)?;
        let mut chain = vec![all[full].clone()];
        for checkpoint in &all[full + 1..] {
            let base = checkpoint.metadata.as_ref()?.base_checkpoint_id.clone();
            let previous = chain.last()?.metadata.as_ref()?.checkpoint_id.clone();
            if base != previous {
                break;
            }
            chain.push(checkpoint.clone());
        }
        Some(chain)
    }
}

fn kind(checkpoint: &v1::Checkpoint) -> v1::CheckpointKind {
    checkpoint
        .metadata
        .as_ref()
        .map_or(v1::CheckpointKind::Unspecified, |m| m.kind())
}

/// Keeps the newest `keep` full checkpoints and what follows them.
fn prune(all: &mut Vec<v1::Checkpoint>, keep: usize) {
    let fulls: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, c)| kind(c) == v1::CheckpointKind::Full)
        .map(|(idx, _)| idx)
        .collect();
    if fulls.len() > keep {
        all.drain(..fulls[fulls.len() - keep]);
    }
}
