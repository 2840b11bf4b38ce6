//! `checkpoint`: what creating and restoring a checkpoint of a large execution costs, through
//! the local checkpoint-store, exactly as a coordinator does it.

use std::time::Instant;

use serde_json::json;
use trellis_proto::v1;

use super::{Fields, percentile, round};
use crate::local;

/// An execution of `n` tasks with half of them completed, checkpointed through the local
/// checkpoint-store and restored, 50 times: a create is snapshot + SHA-256 + `CreateCheckpoint`
/// (stored in SQLite); a restore is `RestoreCheckpoint` + checksum check + `Execution::restore`,
/// exactly what a coordinator does. Each restored state is compared with the live one.
pub(super) async fn checkpoint(local: &local::Local, n: usize) -> Result<Fields, String> {
    use std::sync::Arc;
    use trellis_core::ids::{ExecutionId, WorkerId};
    use trellis_core::machine::{Event, EventBody, Execution, SNAPSHOT_FORMAT_VERSION, Usage};
    use trellis_core::record::TaskState;
    use trellis_proto::v1::checkpoint_store_client::CheckpointStoreClient;

    const ROUNDS: usize = 50;
    let mut plan = String::with_capacity(n * 32);
    plan.push_str("name: bench-checkpoint\ntasks:\n");
    for i in 0..n {
        plan.push_str(&format!("- {{id: t{i}, type: noop}}\n"));
    }
    let plan = trellis_core::plan::compile_str(&plan, &trellis_core::plan::Limits::default())
        .map_err(|e| format!("bench plan: {e:?}"))?;
    let plan = Arc::new(plan);
    let id = ExecutionId(uuid::Uuid::now_v7());
    let t0 = 1_700_000_000_000;
    let mut execution = Execution::start(id, Arc::clone(&plan), 1, t0);
    let queued: Vec<_> = execution.instances_in(TaskState::Queued).collect();
    let apply = |execution: &mut Execution, body| {
        execution
            .apply(&Event {
                at_ms: t0 + 1,
                body,
            })
            .map(|_| ())
            .map_err(|e| format!("building the execution: {e}"))
    };
    for (k, instance) in queued.iter().enumerate() {
        apply(
            &mut execution,
            EventBody::TaskDispatched {
                instance: *instance,
                attempt: 1,
            },
        )?;
        apply(
            &mut execution,
            EventBody::TaskStarted {
                instance: *instance,
                attempt: 1,
                worker: WorkerId::from("bench-worker"),
            },
        )?;
        if k % 2 == 0 {
            apply(
                &mut execution,
                EventBody::TaskCompleted {
                    instance: *instance,
                    attempt: 1,
                    output: json!({"k": k}),
                    usage: Usage::default(),
                },
            )?;
        }
    }
    let mut client = CheckpointStoreClient::connect(local.store_url.clone())
        .await
        .map_err(|e| format!("cannot reach the checkpoint-store: {e}"))?;
    let mut creates = Vec::with_capacity(ROUNDS);
    let mut restores = Vec::with_capacity(ROUNDS);
    let mut bytes = 0;
    for round in 0..ROUNDS {
        let started = Instant::now();
        let state = execution.snapshot();
        bytes = state.len();
        let checkpoint = v1::Checkpoint {
            metadata: Some(v1::CheckpointMetadata {
                checkpoint_id: uuid::Uuid::now_v7().to_string(),
                execution_id: id.to_string(),
                event_sequence: round as u64 + 1,
                stream_sequence: 0,
                kind: v1::CheckpointKind::Full.into(),
                base_checkpoint_id: String::new(),
                checksum_sha256: trellis_core::checksum::sha256(&state).to_vec(),
                created_at_unix_ms: 0,
                size_bytes: state.len() as u64,
                state_format_version: SNAPSHOT_FORMAT_VERSION,
            }),
            state,
        };
        client
            .create_checkpoint(v1::CreateCheckpointRequest {
                checkpoint: Some(checkpoint),
            })
            .await
            .map_err(|s| format!("create: {}", s.message()))?;
        creates.push(started.elapsed().as_secs_f64() * 1000.0);

        let started = Instant::now();
        let chain = client
            .restore_checkpoint(v1::RestoreCheckpointRequest {
                execution_id: id.to_string(),
                checkpoint_id: String::new(),
            })
            .await
            .map_err(|s| format!("restore: {}", s.message()))?
            .into_inner()
            .chain;
        let full = chain.first().ok_or("restore returned no checkpoint")?;
        let metadata = full
            .metadata
            .as_ref()
            .ok_or("a checkpoint without metadata")?;
        if !trellis_core::checksum::verify(&full.state, &metadata.checksum_sha256) {
            return Err("the restored checkpoint does not match its checksum".to_owned());
        }
        let restored = Execution::restore(Arc::clone(&plan), &full.state)
            .map_err(|e| format!("restore: {e}"))?;
        restores.push(started.elapsed().as_secs_f64() * 1000.0);
        if restored != execution {
            return Err("the restored state differs from the live one".to_owned());
        }
        // Keep the store small between rounds; not timed.
        client
            .prune_checkpoints(v1::PruneCheckpointsRequest {
                execution_id: id.to_string(),
                keep: 1,
            })
            .await
            .map_err(|s| format!("prune: {}", s.message()))?;
    }
    let p95 = |samples: &mut Vec<f64>| {
        samples.sort_by(f64::total_cmp);
        percentile(samples, 0.95)
    };
    Ok(vec![
        ("bytes", json!(bytes)),
        ("create_p95_ms", json!(round(p95(&mut creates), 3))),
        ("restore_p95_ms", json!(round(p95(&mut restores), 3))),
    ])
}
