//! One execution at a time: started (alone, or with its observer in one `RunExecution` call)
//! and followed through its progress to its end.

use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use tonic::Status;
use tonic::transport::Channel;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::{self, ExecutionState};
use trellis_telemetry::hops;

/// Starts one execution and returns the time until it completed.
pub(super) async fn run_one(
    client: CoordinatorClient<Channel>,
    plan: String,
) -> Result<Duration, String> {
    run_one_split(client, plan).await.map(|(_, _, took)| took)
}

/// Runs one plan to its end in one `RunExecution` call: its execution's id, how long until the
/// call named it, and until it completed.
pub(super) async fn run_one_split(
    mut client: CoordinatorClient<Channel>,
    plan: String,
) -> Result<(String, Duration, Duration), String> {
    let start = Instant::now();
    let request = v1::RunExecutionRequest {
        start: Some(start_request(plan)),
        progress_only: true,
    };
    let mut stream = client
        .run_execution(request)
        .await
        .map_err(|s| s.message().to_owned())?
        .into_inner();
    let id = stream
        .message()
        .await
        .map_err(|s| s.message().to_owned())?
        .and_then(|first| first.started)
        .map(|started| started.execution_id)
        .ok_or_else(|| "the RunExecution stream did not begin with the execution".to_owned())?;
    let started = start.elapsed();
    let observed = stream.map(|item| {
        item.and_then(|item| {
            item.observed
                .ok_or_else(|| Status::internal("a RunExecution item without `observed`"))
        })
    });
    follow_to_end(client, id.clone(), observed).await?;
    Ok((id, started, start.elapsed()))
}

/// The start of `text`, a YAML plan.
fn start_request(text: String) -> v1::StartExecutionRequest {
    v1::StartExecutionRequest {
        plan_source: Some(v1::start_execution_request::PlanSource::Spec(
            v1::PlanSpec {
                text,
                format: v1::PlanFormat::Yaml as i32,
                source_name: "bench".to_owned(),
                params: Default::default(),
            },
        )),
        options: None,
    }
}

pub(super) async fn start_plan(
    client: &mut CoordinatorClient<Channel>,
    text: String,
) -> Result<String, String> {
    client
        .start_execution(start_request(text))
        .await
        .map(|r| r.into_inner().execution_id)
        .map_err(|s| s.message().to_owned())
}

/// Follows the execution's progress to its end and checks it completed: its events are not
/// needed, as a caller waiting for an end (`trellis submit --wait`) needs none.
pub(super) async fn wait_completed(
    mut client: CoordinatorClient<Channel>,
    id: String,
) -> Result<(), String> {
    let request = v1::ObserveExecutionRequest {
        execution_id: id.clone(),
        from_sequence: 1,
        progress_only: true,
    };
    let stream = client
        .observe_execution(request)
        .await
        .map_err(|s| s.message().to_owned())?
        .into_inner();
    follow_to_end(client, id, stream).await
}

/// Reads a progress-only observer's `stream` of execution `id` to its end and checks the
/// execution completed.
async fn follow_to_end(
    mut client: CoordinatorClient<Channel>,
    id: String,
    mut stream: impl Stream<Item = Result<v1::ObserveExecutionResponse, Status>> + Unpin,
) -> Result<(), String> {
    let mut last_state = None;
    let mut ended = false;
    while let Some(item) = stream.next().await {
        let item = item.map_err(|s| s.message().to_owned())?;
        if let Some(progress) = item.progress {
            if !ended
                && ExecutionState::try_from(progress.state).is_ok_and(crate::render::is_terminal)
            {
                // The caller knows how the execution ended; the stream's close follows.
                hops::mark_any("bench.ended", hops::id_bits(&id));
                ended = true;
            }
            last_state = Some(progress.state);
        }
    }
    if !ended {
        // A stream closed without the final progress (the execution moved to another
        // coordinator, or a coordinator that sends none): the close is the end, and the state is
        // asked for below.
        hops::mark_any("bench.ended", hops::id_bits(&id));
    }
    match last_state.and_then(|s| ExecutionState::try_from(s).ok()) {
        Some(ExecutionState::Completed) => Ok(()),
        other => {
            let execution = super::get(&mut client, &id).await?;
            if execution.state == ExecutionState::Completed as i32 {
                Ok(())
            } else {
                Err(format!(
                    "execution {id} ended {other:?}: {}",
                    execution.reason
                ))
            }
        }
    }
}
