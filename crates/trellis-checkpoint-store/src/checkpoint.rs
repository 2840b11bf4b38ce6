//! Checkpoints (docs/design.md §2, §4): what the service does with them, once for both backends.
//!
//! - A checkpoint from a caller is verified before anything is stored ([`verify_new`]): ids,
//!   kind, SHA-256 of the state against `checksum_sha256`, length against `size_bytes`.
//! - Every read verifies again ([`verify_stored`]), since disks and people corrupt rows.
//! - [`restore`](Store::restore) returns the chain from the nearest full checkpoint to the
//!   requested one; when a link is corrupt it reports it and falls back to the newest earlier
//!   checkpoint whose whole chain verifies, so the caller replays more events instead of failing.
//! - [`prune`](Store::prune) keeps the newest full checkpoints with everything built on them.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use trellis_core::ids::ExecutionId;
use trellis_proto::v1;
use uuid::Uuid;

use crate::store::{
    Checkpoint, CheckpointKind, CheckpointMetadata, Error, ErrorKind, Inserted, Page, Store,
};

/// Page size when a request does not say.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
/// Largest page served.
pub const MAX_PAGE_SIZE: u32 = 1000;

/// Returns the page size to use for a requested one (0 means the default).
pub fn page_limit(requested: u32) -> u32 {
    match requested {
        0 => DEFAULT_PAGE_SIZE,
        n => n.min(MAX_PAGE_SIZE),
    }
}

/// Returns the SHA-256 of `bytes` (the core's, so checkpoint makers and the store agree).
pub use trellis_core::checksum::sha256;

fn hex(bytes: &[u8]) -> String {
    let mut res = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(res, "{byte:02x}");
    }
    res
}

fn parse_uuid(field: &str, text: &str) -> Result<Uuid, Error> {
    if text.is_empty() {
        return Err(Error::invalid(format!("{field}: missing")));
    }
    Uuid::parse_str(text).map_err(|_| {
        let shown: String = text.chars().take(64).collect();
        Error::invalid(format!("{field}: invalid uuid {shown:?}"))
    })
}

/// Parses a checkpoint id from a request (a UUID; the caller creates UUIDv7s).
pub fn parse_checkpoint_id(field: &str, text: &str) -> Result<Uuid, Error> {
    parse_uuid(field, text)
}

/// Parses an execution id from a request.
pub fn parse_execution_id(field: &str, text: &str) -> Result<ExecutionId, Error> {
    parse_uuid(field, text).map(ExecutionId)
}

/// Checks a checkpoint sent by a caller and returns it ready to store: every id parses, the kind
/// is set and agrees with `base_checkpoint_id`, `checksum_sha256` is the SHA-256 of `state` and
/// `size_bytes` its length. `created_at_unix_ms` 0 means `now_ms`.
pub fn verify_new(checkpoint: v1::Checkpoint, now_ms: u64) -> Result<Checkpoint, Error> {
    let meta = checkpoint
        .metadata
        .ok_or_else(|| Error::invalid("checkpoint.metadata: missing"))?;
    let checkpoint_id = parse_uuid("checkpoint.metadata.checkpoint_id", &meta.checkpoint_id)?;
    if checkpoint_id.get_version_num() != 7 {
        return Err(Error::invalid(format!(
            "checkpoint.metadata.checkpoint_id: {checkpoint_id} is not a UUIDv7 (ids must sort by creation)"
        )));
    }
    let execution_id = parse_execution_id("checkpoint.metadata.execution_id", &meta.execution_id)?;
    let kind = match v1::CheckpointKind::try_from(meta.kind) {
        Ok(v1::CheckpointKind::Full) => CheckpointKind::Full,
        Ok(v1::CheckpointKind::Delta) => CheckpointKind::Delta,
        Ok(v1::CheckpointKind::Unspecified) => {
            return Err(Error::invalid(
                "checkpoint.metadata.kind: must not be unspecified",
            ));
        }
        Err(_) => {
            return Err(Error::invalid(format!(
                "checkpoint.metadata.kind: unknown enum value {}",
                meta.kind
            )));
        }
    };
    let base_checkpoint_id = match (kind, meta.base_checkpoint_id.as_str()) {
        (CheckpointKind::Full, "") => None,
        (CheckpointKind::Full, _) => {
            return Err(Error::invalid(
                "checkpoint.metadata.base_checkpoint_id: a full checkpoint has no base",
            ));
        }
        (CheckpointKind::Delta, "") => {
            return Err(Error::invalid(
                "checkpoint.metadata.base_checkpoint_id: missing (a delta needs its base)",
            ));
        }
        (CheckpointKind::Delta, text) => {
            let base = parse_uuid("checkpoint.metadata.base_checkpoint_id", text)?;
            if base == checkpoint_id {
                return Err(Error::invalid(
                    "checkpoint.metadata.base_checkpoint_id: a delta cannot be its own base",
                ));
            }
            Some(base)
        }
    };
    if meta.event_sequence == 0 {
        return Err(Error::invalid(
            "checkpoint.metadata.event_sequence: must be at least 1 (ExecutionStarted)",
        ));
    }
    if meta.checksum_sha256.len() != 32 {
        return Err(Error::invalid(format!(
            "checkpoint.metadata.checksum_sha256: must be 32 bytes, got {}",
            meta.checksum_sha256.len()
        )));
    }
    let state_len = checkpoint.state.len() as u64;
    if meta.size_bytes != state_len {
        return Err(Error::invalid(format!(
            "checkpoint.metadata.size_bytes: says {} but the state is {state_len} bytes",
            meta.size_bytes
        )));
    }
    let computed = sha256(&checkpoint.state);
    if computed[..] != meta.checksum_sha256[..] {
        return Err(Error::invalid(format!(
            "checkpoint.metadata.checksum_sha256: {} is not the SHA-256 of the state ({})",
            hex(&meta.checksum_sha256),
            hex(&computed)
        )));
    }
    let created_at_ms = match meta.created_at_unix_ms {
        0 => now_ms,
        ms if ms < 0 => {
            return Err(Error::invalid(format!(
                "checkpoint.metadata.created_at_unix_ms: negative instant {ms}"
            )));
        }
        ms => ms as u64,
    };
    Ok(Checkpoint {
        metadata: CheckpointMetadata {
            checkpoint_id,
            execution_id,
            event_sequence: meta.event_sequence,
            stream_sequence: meta.stream_sequence,
            kind,
            base_checkpoint_id,
            checksum_sha256: meta.checksum_sha256,
            created_at_ms,
            size_bytes: meta.size_bytes,
            state_format_version: meta.state_format_version,
        },
        state: checkpoint.state,
    })
}

/// Checks a delta against its base as stored (`None` when the base is not stored).
pub(crate) fn check_base(
    delta: &CheckpointMetadata,
    base: Option<&CheckpointMetadata>,
) -> Result<(), Error> {
    let base_id = delta.base_checkpoint_id.unwrap_or_default();
    let Some(base) = base else {
        return Err(Error::new(
            ErrorKind::FailedPrecondition,
            format!(
                "base checkpoint {base_id} of delta {} is not stored",
                delta.checkpoint_id
            ),
        ));
    };
    if base.execution_id != delta.execution_id {
        return Err(Error::invalid(format!(
            "base checkpoint {base_id} belongs to execution {}, not {}",
            base.execution_id, delta.execution_id
        )));
    }
    if base.event_sequence > delta.event_sequence {
        return Err(Error::invalid(format!(
            "delta {} at event sequence {} cannot build on checkpoint {base_id} at later sequence {}",
            delta.checkpoint_id, delta.event_sequence, base.event_sequence
        )));
    }
    Ok(())
}

/// Checks a checkpoint read back from the database against its own metadata; returns why it is
/// corrupt.
pub fn verify_stored(checkpoint: &Checkpoint) -> Result<(), String> {
    let meta = &checkpoint.metadata;
    let state_len = checkpoint.state.len() as u64;
    if state_len != meta.size_bytes {
        return Err(format!(
            "size mismatch: stored as {} bytes, holds {state_len}",
            meta.size_bytes
        ));
    }
    let computed = sha256(&checkpoint.state);
    if computed[..] != meta.checksum_sha256[..] {
        return Err(format!(
            "checksum mismatch: stored {}, computed {}",
            hex(&meta.checksum_sha256),
            hex(&computed)
        ));
    }
    Ok(())
}

/// A checkpoint found unusable while restoring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptCheckpoint {
    pub checkpoint_id: Uuid,
    /// What is wrong with it.
    pub reason: String,
}

/// What recovery needs (see [`Store::restore`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The full checkpoint, then each delta up to the restored one; all verified.
    pub chain: Vec<Checkpoint>,
    /// The first event to replay: the restored checkpoint's sequence plus one.
    pub replay_from_sequence: u64,
    /// Checkpoints found corrupt on the way, newest first; when not empty the chain ends before
    /// the checkpoint asked for.
    pub corrupt: Vec<CorruptCheckpoint>,
}

/// What [`Store::prune`] deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub deleted: Vec<Uuid>,
    pub freed_bytes: u64,
}

/// The corrupt checkpoints met while restoring, each reported once.
#[derive(Debug, Default)]
struct CorruptFound {
    list: Vec<CorruptCheckpoint>,
    ids: HashSet<Uuid>,
}

impl CorruptFound {
    fn report(&mut self, execution_id: ExecutionId, checkpoint_id: Uuid, reason: String) {
        if self.ids.insert(checkpoint_id) {
            tracing::warn!(%execution_id, %checkpoint_id, %reason, "corrupt checkpoint skipped");
            self.list.push(CorruptCheckpoint {
                checkpoint_id,
                reason,
            });
        }
    }
}

/// Returns the ids of the checkpoint chain ending at `id`, from `id` back to its full checkpoint,
/// or why there is no such chain.
fn chain_ids(
    by_id: &HashMap<Uuid, &CheckpointMetadata>,
    id: Uuid,
) -> Result<Vec<Uuid>, (Uuid, String)> {
    let mut res = vec![id];
    let mut current = id;
    // Every link is a distinct checkpoint, so a longer walk is a loop.
    while res.len() <= by_id.len() {
        let Some(meta) = by_id.get(&current) else {
            return Err((current, "not stored".to_owned()));
        };
        match meta.base_checkpoint_id {
            None => return Ok(res),
            Some(base) => {
                if !by_id.contains_key(&base) {
                    return Err((current, format!("its base checkpoint {base} is missing")));
                }
                res.push(base);
                current = base;
            }
        }
    }
    Err((id, "its chain of bases loops".to_owned()))
}

/// Returns the checkpoints to delete so that only the newest `keep` full checkpoints remain with
/// everything built on them, and every checkpoint newer than the oldest kept full one stays
/// restorable (with its whole chain).
pub fn plan_prune(metadata: &[CheckpointMetadata], keep: usize) -> Vec<Uuid> {
    let by_id: HashMap<Uuid, &CheckpointMetadata> = metadata
        .iter()
        .map(|meta| (meta.checkpoint_id, meta))
        .collect();
    let mut fulls: Vec<Uuid> = metadata
        .iter()
        .filter(|meta| meta.kind == CheckpointKind::Full)
        .map(|meta| meta.checkpoint_id)
        .collect();
    if fulls.len() <= keep || keep == 0 {
        return Vec::new();
    }
    fulls.sort_unstable_by(|a, b| b.cmp(a));
    let kept_fulls: HashSet<Uuid> = fulls[..keep].iter().copied().collect();
    let oldest_kept = fulls[keep - 1];
    let mut kept: HashSet<Uuid> = HashSet::new();
    for meta in metadata {
        let chain = chain_ids(&by_id, meta.checkpoint_id);
        let rooted_in_kept = chain
            .as_ref()
            .ok()
            .and_then(|chain| chain.last())
            .is_some_and(|root| kept_fulls.contains(root));
        if rooted_in_kept {
            kept.insert(meta.checkpoint_id);
        } else if meta.checkpoint_id > oldest_kept {
            kept.insert(meta.checkpoint_id);
            if let Ok(chain) = chain {
                kept.extend(chain);
            }
        }
    }
    metadata
        .iter()
        .map(|meta| meta.checkpoint_id)
        .filter(|id| !kept.contains(id))
        .collect()
}

impl dyn Store {
    /// Stores a verified checkpoint (see [`verify_new`]) and returns its metadata. Storing the same
    /// checkpoint again is a no-op; the same id with other content is `AlreadyExists`.
    pub async fn create_checkpoint(
        &self,
        checkpoint: &Checkpoint,
    ) -> Result<CheckpointMetadata, Error> {
        let meta = &checkpoint.metadata;
        match self.insert_checkpoint(checkpoint).await? {
            Inserted::Created => Ok(meta.clone()),
            Inserted::Existing(existing) => {
                let same = existing.execution_id == meta.execution_id
                    && existing.kind == meta.kind
                    && existing.base_checkpoint_id == meta.base_checkpoint_id
                    && existing.event_sequence == meta.event_sequence
                    && existing.checksum_sha256 == meta.checksum_sha256;
                if same {
                    Ok(existing)
                } else {
                    Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!(
                            "checkpoint {} is already stored with other content",
                            meta.checkpoint_id
                        ),
                    ))
                }
            }
        }
    }

    /// Returns one checkpoint, verified: `NotFound` when it is not stored, `DataLoss` when its
    /// bytes no longer match their checksum.
    pub async fn verified_checkpoint(&self, checkpoint_id: Uuid) -> Result<Checkpoint, Error> {
        let checkpoint = self
            .get_checkpoint(checkpoint_id)
            .await?
            .ok_or_else(|| Error::not_found(format!("no checkpoint {checkpoint_id}")))?;
        verify_stored(&checkpoint).map_err(|reason| {
            tracing::warn!(%checkpoint_id, %reason, "corrupt checkpoint");
            Error::new(
                ErrorKind::DataLoss,
                format!("checkpoint {checkpoint_id} is corrupt: {reason}"),
            )
        })?;
        Ok(checkpoint)
    }

    /// Returns the verified chain that restores `checkpoint_id` (the execution's latest when
    /// `None`). A corrupt link is reported (in the answer and at warn level) and the newest earlier
    /// checkpoint whose whole chain verifies is restored instead. `NotFound` when the execution
    /// has no checkpoint, or none verifies: the caller then replays the log from sequence 1.
    pub async fn restore(
        &self,
        execution_id: ExecutionId,
        checkpoint_id: Option<Uuid>,
    ) -> Result<Restored, Error> {
        let metadata = self.checkpoint_metadata(execution_id).await?;
        let Some(latest) = metadata.last() else {
            if let Some(checkpoint_id) = checkpoint_id {
                self.check_owner(execution_id, checkpoint_id).await?;
            }
            return Err(Error::not_found(format!(
                "execution {execution_id} has no checkpoint: replay its log from sequence 1"
            )));
        };
        let by_id: HashMap<Uuid, &CheckpointMetadata> = metadata
            .iter()
            .map(|meta| (meta.checkpoint_id, meta))
            .collect();
        let target = match checkpoint_id {
            None => latest.checkpoint_id,
            Some(id) if by_id.contains_key(&id) => id,
            Some(id) => {
                self.check_owner(execution_id, id).await?;
                return Err(Error::not_found(format!("no checkpoint {id}")));
            }
        };
        let mut loaded: HashMap<Uuid, Checkpoint> = HashMap::new();
        let mut corrupt = CorruptFound::default();
        'candidates: for candidate in metadata
            .iter()
            .rev()
            .filter(|meta| meta.checkpoint_id <= target)
        {
            let chain = match chain_ids(&by_id, candidate.checkpoint_id) {
                Ok(chain) => chain,
                Err((id, reason)) => {
                    corrupt.report(execution_id, id, reason);
                    continue;
                }
            };
            // Newest link first: a corrupt delta is found before loading its older links.
            for &id in &chain {
                if corrupt.ids.contains(&id) {
                    continue 'candidates;
                }
                if loaded.contains_key(&id) {
                    continue;
                }
                match self.get_checkpoint(id).await? {
                    None => {
                        corrupt.report(execution_id, id, "deleted while restoring".to_owned());
                        continue 'candidates;
                    }
                    Some(checkpoint) => {
                        let stored_meta = by_id.get(&id).copied();
                        let verdict = verify_stored(&checkpoint).and_then(|()| {
                            if stored_meta == Some(&checkpoint.metadata) {
                                Ok(())
                            } else {
                                Err("changed while restoring".to_owned())
                            }
                        });
                        match verdict {
                            Ok(()) => {
                                loaded.insert(id, checkpoint);
                            }
                            Err(reason) => {
                                corrupt.report(execution_id, id, reason);
                                continue 'candidates;
                            }
                        }
                    }
                }
            }
            let mut res = Vec::with_capacity(chain.len());
            for id in chain.iter().rev() {
                // Every link was loaded and verified just above (or on an earlier candidate).
                if let Some(checkpoint) = loaded.remove(id) {
                    res.push(checkpoint);
                }
            }
            return Ok(Restored {
                chain: res,
                replay_from_sequence: candidate.event_sequence.saturating_add(1),
                corrupt: corrupt.list,
            });
        }
        let reasons: Vec<String> = corrupt
            .list
            .iter()
            .map(|c| format!("{}: {}", c.checkpoint_id, c.reason))
            .collect();
        Err(Error::not_found(format!(
            "no checkpoint of execution {execution_id} up to {target} verifies ({}): replay its log from sequence 1",
            reasons.join("; ")
        )))
    }

    /// Fails with `InvalidArgument` when `checkpoint_id` is stored for another execution.
    async fn check_owner(
        &self,
        execution_id: ExecutionId,
        checkpoint_id: Uuid,
    ) -> Result<(), Error> {
        match self.get_checkpoint(checkpoint_id).await? {
            Some(other) if other.metadata.execution_id != execution_id => {
                Err(Error::invalid(format!(
                    "checkpoint {checkpoint_id} belongs to execution {}, not {execution_id}",
                    other.metadata.execution_id
                )))
            }
            _ => Ok(()),
        }
    }

    /// Returns one page of an execution's checkpoints, newest first, and the key of the next page.
    pub async fn list(
        &self,
        execution_id: ExecutionId,
        after: Option<Uuid>,
        page_size: u32,
    ) -> Result<(Vec<CheckpointMetadata>, Option<Uuid>), Error> {
        let limit = page_limit(page_size);
        let mut page = self
            .list_checkpoints(
                execution_id,
                Page {
                    after,
                    limit: limit + 1,
                },
            )
            .await?;
        let next = if page.len() > limit as usize {
            page.truncate(limit as usize);
            page.last().map(|meta| meta.checkpoint_id)
        } else {
            None
        };
        Ok((page, next))
    }

    /// Deletes all but the newest `keep` full checkpoints of an execution, with the deltas built on
    /// them (see [`plan_prune`]); `keep` must be at least 1.
    pub async fn prune(&self, execution_id: ExecutionId, keep: u32) -> Result<Pruned, Error> {
        if keep == 0 {
            return Err(Error::invalid(
                "keep: must be at least 1 (an execution keeps its newest full checkpoint)",
            ));
        }
        let metadata = self.checkpoint_metadata(execution_id).await?;
        let deleted = plan_prune(&metadata, keep as usize);
        let sizes: HashMap<Uuid, u64> = metadata
            .iter()
            .map(|meta| (meta.checkpoint_id, meta.size_bytes))
            .collect();
        self.delete_checkpoints(&deleted).await?;
        let freed_bytes = deleted.iter().filter_map(|id| sizes.get(id)).sum();
        if !deleted.is_empty() {
            tracing::info!(%execution_id, deleted = deleted.len(), freed_bytes, "checkpoints pruned");
        }
        Ok(Pruned {
            deleted,
            freed_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> Uuid {
        // UUIDv7s built from the counter, so ids sort like `n`.
        uuid::Builder::from_unix_timestamp_millis(u64::from(n), &[0; 10]).into_uuid()
    }

    fn meta(n: u8, base: Option<u8>) -> CheckpointMetadata {
        CheckpointMetadata {
            checkpoint_id: id(n),
            execution_id: ExecutionId::nil(),
            event_sequence: u64::from(n),
            stream_sequence: 0,
            kind: if base.is_some() {
                CheckpointKind::Delta
            } else {
                CheckpointKind::Full
            },
            base_checkpoint_id: base.map(id),
            checksum_sha256: vec![0; 32],
            created_at_ms: 0,
            size_bytes: 1,
            state_format_version: 1,
        }
    }

    fn check_prune(metadata: &[CheckpointMetadata], keep: usize, expected: &[u8]) {
        let mut deleted = plan_prune(metadata, keep);
        deleted.sort();
        let expected: Vec<Uuid> = expected.iter().map(|n| id(*n)).collect();
        assert_eq!(deleted, expected);
    }

    #[test]
    fn prune_keeps_newest_fulls_with_their_deltas() {
        // 1 full, 2-3 deltas; 4 full, 5 delta; 6 full, 7-8 deltas.
        let metadata = [
            meta(1, None),
            meta(2, Some(1)),
            meta(3, Some(2)),
            meta(4, None),
            meta(5, Some(4)),
            meta(6, None),
            meta(7, Some(6)),
            meta(8, Some(7)),
        ];
        check_prune(&metadata, 1, &[1, 2, 3, 4, 5]);
        check_prune(&metadata, 2, &[1, 2, 3]);
        check_prune(&metadata, 3, &[]);
        check_prune(&metadata, 9, &[]);
    }

    #[test]
    fn prune_keeps_the_chain_of_a_newer_delta_on_an_old_base() {
        // Delta 5 was built on full 1 although full 4 is newer: it stays restorable.
        let metadata = [
            meta(1, None),
            meta(2, Some(1)),
            meta(4, None),
            meta(5, Some(1)),
        ];
        check_prune(&metadata, 1, &[2]);
    }

    #[test]
    fn chains_report_missing_bases_and_loops() {
        let mut looped = meta(3, Some(2));
        looped.base_checkpoint_id = Some(id(3));
        let metadata = [meta(1, None), meta(2, Some(9)), looped];
        let by_id: HashMap<Uuid, &CheckpointMetadata> = metadata
            .iter()
            .map(|meta| (meta.checkpoint_id, meta))
            .collect();
        assert_eq!(chain_ids(&by_id, id(1)), Ok(vec![id(1)]));
        assert!(chain_ids(&by_id, id(2)).is_err_and(|(_, reason)| reason.contains("missing")));
        assert!(chain_ids(&by_id, id(3)).is_err_and(|(_, reason)| reason.contains("loops")));
    }

    fn request(state: &[u8]) -> v1::Checkpoint {
        v1::Checkpoint {
            metadata: Some(v1::CheckpointMetadata {
                checkpoint_id: id(1).to_string(),
                execution_id: Uuid::now_v7().to_string(),
                event_sequence: 3,
                stream_sequence: 0,
                kind: v1::CheckpointKind::Full.into(),
                base_checkpoint_id: String::new(),
                checksum_sha256: sha256(state).to_vec(),
                created_at_unix_ms: 5,
                size_bytes: state.len() as u64,
                state_format_version: 1,
            }),
            state: state.to_vec(),
        }
    }

    fn check_rejected(edit: impl FnOnce(&mut v1::Checkpoint), expected: &str) {
        let mut checkpoint = request(b"state");
        edit(&mut checkpoint);
        let err = verify_new(checkpoint, 0)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains(expected),
            "{err:?} does not contain {expected:?}"
        );
    }

    #[test]
    fn new_checkpoints_are_verified() {
        assert!(verify_new(request(b"state"), 0).is_ok());
        check_rejected(|c| c.metadata = None, "checkpoint.metadata: missing");
        check_rejected(|c| c.state.push(b'!'), "size_bytes");
        check_rejected(
            |c| {
                c.state = b"STATE".to_vec();
            },
            "is not the SHA-256 of the state",
        );
        check_rejected(
            |c| {
                if let Some(m) = c.metadata.as_mut() {
                    m.checkpoint_id = "nope".into();
                }
            },
            "checkpoint_id: invalid uuid",
        );
        check_rejected(
            |c| {
                if let Some(m) = c.metadata.as_mut() {
                    m.checkpoint_id = uuid::Builder::from_random_bytes([7; 16])
                        .into_uuid()
                        .to_string();
                }
            },
            "not a UUIDv7",
        );
        check_rejected(
            |c| {
                if let Some(m) = c.metadata.as_mut() {
                    m.kind = 0;
                }
            },
            "kind: must not be unspecified",
        );
        check_rejected(
            |c| {
                if let Some(m) = c.metadata.as_mut() {
                    m.kind = v1::CheckpointKind::Delta.into();
                }
            },
            "a delta needs its base",
        );
        check_rejected(
            |c| {
                if let Some(m) = c.metadata.as_mut() {
                    m.base_checkpoint_id = id(0).to_string();
                }
            },
            "a full checkpoint has no base",
        );
        check_rejected(
            |c| {
                if let Some(m) = c.metadata.as_mut() {
                    m.checksum_sha256.pop();
                }
            },
            "must be 32 bytes",
        );
        check_rejected(
            |c| {
                if let Some(m) = c.metadata.as_mut() {
                    m.event_sequence = 0;
                }
            },
            "event_sequence",
        );
    }

    #[test]
    fn page_sizes_are_bounded() {
        assert_eq!(page_limit(0), DEFAULT_PAGE_SIZE);
        assert_eq!(page_limit(7), 7);
        assert_eq!(page_limit(100_000), MAX_PAGE_SIZE);
    }
}
