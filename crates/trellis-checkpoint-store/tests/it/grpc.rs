//! The gRPC API through a real tonic server on a free port: precise errors for bad requests
//! (which change nothing), the checkpoint calls, health.

use prost::Message as _;
use tonic::Code;
use trellis_checkpoint_store::Config;
use trellis_checkpoint_store::checkpoint::sha256;
use trellis_proto::v1;
use trellis_testkit::NatsServer;
use uuid::Uuid;

use crate::support::{Service, TestStore};

fn checkpoint(
    execution_id: &str,
    base: Option<&str>,
    sequence: u64,
    state: &[u8],
) -> v1::Checkpoint {
    v1::Checkpoint {
        metadata: Some(v1::CheckpointMetadata {
            checkpoint_id: Uuid::now_v7().to_string(),
            execution_id: execution_id.to_owned(),
            event_sequence: sequence,
            stream_sequence: 0,
            kind: if base.is_some() {
                v1::CheckpointKind::Delta
            } else {
                v1::CheckpointKind::Full
            }
            .into(),
            base_checkpoint_id: base.unwrap_or_default().to_owned(),
            checksum_sha256: sha256(state).to_vec(),
            created_at_unix_ms: 0,
            size_bytes: state.len() as u64,
            state_format_version: 1,
        }),
        state: state.to_vec(),
    }
}

fn check_code<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, text: &str) {
    match result {
        Err(status) => {
            assert_eq!(status.code(), code, "{status:?}");
            assert!(
                status.message().contains(text),
                "{:?} lacks {text:?}",
                status.message()
            );
        }
        Ok(value) => panic!("expected {code:?}, got {value:?}"),
    }
}

#[tokio::test]
async fn checkpoints_through_grpc() -> anyhow::Result<()> {
    let server = NatsServer::start()?;
    let store = TestStore::postgres().await?;
    let service = Service::start(Config::new(store.url.clone(), server.url())).await?;
    let mut client = service.client().await?;
    let execution_id = Uuid::now_v7().to_string();

    // Bad requests: precise errors, nothing stored.
    let mut bad_checksum = checkpoint(&execution_id, None, 1, b"state");
    bad_checksum.state = b"STATE".to_vec();
    check_code(
        client
            .create_checkpoint(v1::CreateCheckpointRequest {
                checkpoint: Some(bad_checksum),
            })
            .await,
        Code::InvalidArgument,
        "checkpoint.metadata.checksum_sha256",
    );
    check_code(
        client
            .create_checkpoint(v1::CreateCheckpointRequest { checkpoint: None })
            .await,
        Code::InvalidArgument,
        "checkpoint: missing",
    );
    check_code(
        client
            .create_checkpoint(v1::CreateCheckpointRequest {
                checkpoint: Some(checkpoint(
                    &execution_id,
                    Some(&Uuid::now_v7().to_string()),
                    2,
                    b"delta",
                )),
            })
            .await,
        Code::FailedPrecondition,
        "is not stored",
    );
    assert_eq!(store.count("checkpoints").await?, 0);
    check_code(
        client
            .get_checkpoint(v1::GetCheckpointRequest {
                checkpoint_id: "not-a-uuid".to_owned(),
            })
            .await,
        Code::InvalidArgument,
        "checkpoint_id: invalid uuid",
    );
    check_code(
        client
            .restore_checkpoint(v1::RestoreCheckpointRequest {
                execution_id: execution_id.clone(),
                checkpoint_id: String::new(),
            })
            .await,
        Code::NotFound,
        "replay its log from sequence 1",
    );
    check_code(
        client
            .list_checkpoints(v1::ListCheckpointsRequest {
                execution_id: execution_id.clone(),
                page: Some(v1::PageRequest {
                    page_size: 1,
                    page_token: "garbage".to_owned(),
                }),
            })
            .await,
        Code::InvalidArgument,
        "page.page_token",
    );
    check_code(
        client
            .prune_checkpoints(v1::PruneCheckpointsRequest {
                execution_id: execution_id.clone(),
                keep: 0,
            })
            .await,
        Code::InvalidArgument,
        "keep",
    );
    check_code(
        client
            .query_task_instances(v1::QueryTaskInstancesRequest {
                execution_id: execution_id.clone(),
                states: vec![99],
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "states[0]",
    );
    check_code(
        client
            .get_execution_record(v1::GetExecutionRecordRequest {
                execution_id: execution_id.clone(),
            })
            .await,
        Code::NotFound,
        "no execution",
    );

    // A full checkpoint and two deltas.
    let full = checkpoint(&execution_id, None, 10, b"full");
    let full_id = full
        .metadata
        .as_ref()
        .map(|m| m.checkpoint_id.clone())
        .unwrap_or_default();
    let created = client
        .create_checkpoint(v1::CreateCheckpointRequest {
            checkpoint: Some(full.clone()),
        })
        .await?
        .into_inner();
    assert!(created.metadata.is_some_and(|m| m.created_at_unix_ms > 0));
    // The same checkpoint again: a no-op.
    client
        .create_checkpoint(v1::CreateCheckpointRequest {
            checkpoint: Some(full),
        })
        .await?;
    let delta = checkpoint(&execution_id, Some(&full_id), 20, b"delta one");
    let delta_id = delta
        .metadata
        .as_ref()
        .map(|m| m.checkpoint_id.clone())
        .unwrap_or_default();
    client
        .create_checkpoint(v1::CreateCheckpointRequest {
            checkpoint: Some(delta),
        })
        .await?;
    let delta_2 = checkpoint(&execution_id, Some(&delta_id), 30, b"delta two");
    let delta_2_id = delta_2
        .metadata
        .as_ref()
        .map(|m| m.checkpoint_id.clone())
        .unwrap_or_default();
    client
        .create_checkpoint(v1::CreateCheckpointRequest {
            checkpoint: Some(delta_2),
        })
        .await?;

    let got = client
        .get_checkpoint(v1::GetCheckpointRequest {
            checkpoint_id: delta_id.clone(),
        })
        .await?
        .into_inner()
        .checkpoint
        .unwrap_or_default();
    assert_eq!(got.state, b"delta one");
    assert_eq!(
        got.metadata.map(|m| m.base_checkpoint_id),
        Some(full_id.clone())
    );

    let restored = client
        .restore_checkpoint(v1::RestoreCheckpointRequest {
            execution_id: execution_id.clone(),
            checkpoint_id: String::new(),
        })
        .await?
        .into_inner();
    let chain: Vec<String> = restored
        .chain
        .iter()
        .filter_map(|c| c.metadata.as_ref().map(|m| m.checkpoint_id.clone()))
        .collect();
    assert_eq!(
        chain,
        [full_id.clone(), delta_id.clone(), delta_2_id.clone()]
    );
    assert_eq!(restored.replay_from_sequence, 31);
    assert!(restored.corrupt.is_empty());

    // Damage the middle delta: restore falls back to the full one and says why.
    store
        .damage_state(Uuid::parse_str(&delta_id)?, b"delta ONE")
        .await?;
    let restored = client
        .restore_checkpoint(v1::RestoreCheckpointRequest {
            execution_id: execution_id.clone(),
            checkpoint_id: delta_2_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(restored.chain.len(), 1);
    assert_eq!(restored.replay_from_sequence, 11);
    assert_eq!(restored.corrupt.len(), 1);
    assert_eq!(restored.corrupt[0].checkpoint_id, delta_id);
    assert!(restored.corrupt[0].reason.contains("checksum mismatch"));
    check_code(
        client
            .get_checkpoint(v1::GetCheckpointRequest {
                checkpoint_id: delta_id.clone(),
            })
            .await,
        Code::DataLoss,
        "corrupt",
    );

    let listed = client
        .list_checkpoints(v1::ListCheckpointsRequest {
            execution_id: execution_id.clone(),
            page: Some(v1::PageRequest {
                page_size: 2,
                page_token: String::new(),
            }),
        })
        .await?
        .into_inner();
    let ids: Vec<String> = listed
        .checkpoints
        .iter()
        .map(|m| m.checkpoint_id.clone())
        .collect();
    assert_eq!(ids, [delta_2_id.clone(), delta_id.clone()]);
    let token = listed.page.map(|p| p.next_page_token).unwrap_or_default();
    let rest = client
        .list_checkpoints(v1::ListCheckpointsRequest {
            execution_id: execution_id.clone(),
            page: Some(v1::PageRequest {
                page_size: 2,
                page_token: token,
            }),
        })
        .await?
        .into_inner();
    assert_eq!(rest.checkpoints.len(), 1);
    assert_eq!(rest.page.map(|p| p.next_page_token), Some(String::new()));

    let second_full = checkpoint(&execution_id, None, 40, b"full two");
    client
        .create_checkpoint(v1::CreateCheckpointRequest {
            checkpoint: Some(second_full),
        })
        .await?;
    let pruned = client
        .prune_checkpoints(v1::PruneCheckpointsRequest {
            execution_id: execution_id.clone(),
            keep: 1,
        })
        .await?
        .into_inner();
    assert_eq!(pruned.deleted_checkpoint_ids.len(), 3);
    assert_eq!(pruned.freed_bytes, 4 + 9 + 9);

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", service.addr))?
        .connect()
        .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "trellis.v1.CheckpointStore".to_owned(),
        })
        .await?
        .into_inner();
    assert_eq!(
        serving.status,
        i32::from(tonic_health::pb::health_check_response::ServingStatus::Serving)
    );
    service.stop().await?;
    Ok(())
}

#[tokio::test]
async fn execution_records_are_listed_and_paged() -> anyhow::Result<()> {
    use trellis_checkpoint_store::store::{
        ExecutionRow, ExecutionWrite, ProgressRow, ReadModelBatch,
    };
    use trellis_core::ids::ExecutionId;
    use trellis_core::machine::{ExecutionState, Usage};

    let server = NatsServer::start()?;
    let store = TestStore::sqlite().await?;
    let mut ids = Vec::new();
    for n in 0..3u64 {
        let execution_id = ExecutionId(Uuid::now_v7());
        ids.push(execution_id.to_string());
        store
            .store
            .write_read_model(&ReadModelBatch {
                executions: vec![ExecutionWrite::Row(Box::new(ExecutionRow {
                    execution_id,
                    name: format!("plan-{n}"),
                    state: if n == 1 {
                        ExecutionState::Failed
                    } else {
                        ExecutionState::Completed
                    },
                    run_number: 1,
                    created_at_ms: 1_000 + n,
                    started_at_ms: Some(1_000 + n),
                    ended_at_ms: Some(2_000),
                    reason: if n == 1 {
                        "task x failed".to_owned()
                    } else {
                        String::new()
                    },
                    idempotency_key: String::new(),
                    namespace: "default".to_owned(),
                    labels: [("n".to_owned(), n.to_string())].into_iter().collect(),
                    last_sequence: 7,
                    usage: Usage::default(),
                    progress: ProgressRow::default(),
                }))],
                ..ReadModelBatch::default()
            })
            .await?;
    }
    let service = Service::start(Config::new(store.url.clone(), server.url())).await?;
    let mut client = service.client().await?;
    let failed = client
        .list_execution_records(v1::ListExecutionRecordsRequest {
            states: vec![v1::ExecutionState::Failed.into()],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(failed.executions.len(), 1);
    let record = &failed.executions[0];
    assert_eq!(record.execution_id, ids[1]);
    assert_eq!(record.reason, "task x failed");
    assert_eq!(
        record.progress.as_ref().and_then(|p| p.reason.clone()),
        Some("task x failed".to_owned())
    );
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_execution_records(v1::ListExecutionRecordsRequest {
                page: Some(v1::PageRequest {
                    page_size: 1,
                    page_token: token,
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        seen.extend(page.executions.into_iter().map(|e| e.execution_id));
        token = page.page.map(|p| p.next_page_token).unwrap_or_default();
        if token.is_empty() {
            break;
        }
    }
    ids.reverse();
    assert_eq!(seen, ids);
    check_code(
        client
            .list_execution_records(v1::ListExecutionRecordsRequest {
                created_after_unix_ms: -1,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "created_after_unix_ms",
    );
    let got = client
        .get_execution_record(v1::GetExecutionRecordRequest {
            execution_id: ids[0].clone(),
        })
        .await?
        .into_inner()
        .execution
        .unwrap_or_default();
    assert_eq!(got.name, "plan-2");
    assert_eq!(got.labels.get("n").map(String::as_str), Some("2"));
    // Encoded and decoded like any message a client receives.
    assert_eq!(v1::Execution::decode(got.encode_to_vec().as_slice())?, got);
    service.stop().await?;
    Ok(())
}

#[test]
fn bad_arguments_exit_with_status_two() {
    let code = trellis_checkpoint_store::main_from(
        ["trellis-checkpoint-store", "--no-such-flag"].map(Into::into),
    );
    assert_eq!(code, std::process::ExitCode::from(2));
}

/// The store's checkpoints and read model span namespaces, and only services call it: with an
/// access file, only tokens of every namespace are let in.
#[tokio::test]
async fn only_tokens_of_every_namespace_are_let_in() -> anyhow::Result<()> {
    use trellis_grpc::access::token_digest;
    let server = NatsServer::start()?;
    let store = TestStore::sqlite().await?;
    let access = trellis_grpc::AccessPolicy::parse(
        &format!(
            "namespaces: {{team-a: {{}}}}\n\
             tokens:\n\
             \x20 - {{name: a, namespace: team-a, sha256: {}}}\n\
             \x20 - {{name: services, namespace: \"*\", sha256: {}}}\n",
            token_digest("store-team-token"),
            token_digest("store-services-token"),
        ),
        "access.yaml",
    )?;
    let service = Service::start(Config {
        security: trellis_grpc::ServerSecurity {
            access: Some(std::sync::Arc::new(access)),
            ..trellis_grpc::ServerSecurity::default()
        },
        ..Config::new(store.url.clone(), server.url())
    })
    .await?;
    let mut client = service.client().await?;
    let list = |token: Option<&str>| {
        let mut request = tonic::Request::new(v1::ListCheckpointsRequest {
            execution_id: Uuid::now_v7().to_string(),
            page: None,
        });
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("an ASCII header"),
            );
        }
        request
    };
    for (token, code) in [
        (None, Code::Unauthenticated),
        (Some("not-a-token"), Code::Unauthenticated),
        (Some("store-team-token"), Code::PermissionDenied),
    ] {
        let status = client
            .list_checkpoints(list(token))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), code, "{token:?}: {}", status.message());
    }
    let listed = client
        .list_checkpoints(list(Some("store-services-token")))
        .await?
        .into_inner();
    assert!(listed.checkpoints.is_empty());
    service.stop().await?;
    Ok(())
}
