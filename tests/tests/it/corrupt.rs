//! A corrupt log, against separate processes (a coordinator, a worker, the checkpoint-store and
//! the monitor, a real NATS and PostgreSQL): a message that is not an event batch is written to
//! a running execution's log. The execution is held as needing attention, with the sequence
//! that failed, in `GetExecution` (what `trellis status` shows), the monitor and `/metrics`,
//! across a restart of the coordinator; no other execution is affected.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use trellis_proto::{subjects, v1};

use crate::system::{Options, System, describe, is_terminal};

/// How long each step may take.
const WAIT: Duration = Duration::from_secs(60);

/// What is written to the log: bytes that do not decode as an `EventBatch`.
const GARBAGE: &[u8] = b"\xff\xff\xff\xff this is not an event batch";

/// Two `shell` tasks one after the other, each sleeping `seconds`.
fn chain_plan(name: &str, seconds: u32) -> String {
    format!(
        "name: {name}\ntasks:\n\
         - {{id: first, type: shell, input: {{command: [sleep, '{seconds}']}}}}\n\
         - {{id: second, type: shell, depends_on: [first], input: {{command: [sleep, '{seconds}']}}}}\n"
    )
}

/// Returns the highest event sequence of the log messages stored before `garbage` (its stream
/// sequence): the sequence after it is where the log breaks.
async fn last_good_sequence(system: &System, id: &str, garbage: u64) -> anyhow::Result<u64> {
    use prost::Message as _;
    let mut last = 0;
    for (stream_seq, payload) in system.raw_log(id).await? {
        if stream_seq >= garbage {
            break;
        }
        let batch = v1::EventBatch::decode(payload.as_ref())
            .with_context(|| format!("stream message {stream_seq} is not an event batch"))?;
        last = batch
            .events
            .iter()
            .map(|e| e.sequence)
            .max()
            .unwrap_or(last);
    }
    Ok(last)
}

/// Waits until `GetExecution` of `id` is refused as needing attention; returns the message.
async fn wait_for_attention(system: &System, id: &str) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut client = system.client(0)?;
    loop {
        let request = v1::GetExecutionRequest {
            execution_id: id.to_owned(),
        };
        let last = match client.get_execution(request).await {
            Ok(response) => match response.into_inner().execution {
                Some(execution) => describe(&execution),
                None => "no execution".to_owned(),
            },
            Err(status) if status.code() == tonic::Code::DataLoss => {
                return Ok(status.message().to_owned());
            }
            Err(status) => format!("GetExecution failed: {status}"),
        };
        if tokio::time::Instant::now() >= deadline {
            bail!("{id} was not held as needing attention within {WAIT:?}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_log_holds_its_execution_as_needing_attention_and_spares_the_others()
-> anyhow::Result<()> {
    let system = System::start(Options {
        coordinators: vec!["coordinator-a"],
        workers: 1,
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let broken = system.start_plan(0, &chain_plan("to-be-broken", 2)).await?;
            let deadline = tokio::time::Instant::now() + WAIT;
            system
                .wait_until(0, &broken, deadline, "its first task running", |e| {
                    e.counts.as_ref().is_some_and(|c| c.running > 0)
                })
                .await?;

            // A black-box client writes to the running execution's log.
            let js = async_nats::jetstream::new(async_nats::connect(system.nats.url()).await?);
            let ack = js
                .publish(subjects::events(&broken), GARBAGE.into())
                .await?
                .await
                .context("the events stream did not store the garbage")?;
            let sequence = last_good_sequence(system, &broken, ack.sequence).await? + 1;
            let expected = format!("sequence {sequence}");

            // Another execution, started after, runs to the end.
            let other = system.start_plan(0, &chain_plan("bystander", 1)).await?;
            let deadline = tokio::time::Instant::now() + WAIT;
            let execution = system
                .wait_until(0, &other, deadline, "the bystander's end", is_terminal)
                .await?;
            ensure!(
                execution.state == v1::ExecutionState::Completed as i32,
                "the bystander did not complete: {}",
                describe(&execution)
            );

            // The broken one is held once its owner next appends (its first task's end), with
            // the sequence that failed.
            let message = wait_for_attention(system, &broken).await?;
            ensure!(
                message.contains("needs attention") && message.contains(&expected),
                "GetExecution of {broken} does not name {expected}: {message}"
            );
            let held = system
                .coordinator_metric(0, "trellis_executions_needing_attention")
                .await?;
            ensure!(
                held == 1.0,
                "trellis_executions_needing_attention is {held}, not 1"
            );

            // The monitor says the same.
            let url = format!("http://{}/api/executions/{broken}", system.monitor_addr);
            let response = reqwest::get(&url).await?;
            let status = response.status();
            let body = response.text().await?;
            ensure!(
                status == reqwest::StatusCode::CONFLICT && body.contains(&expected),
                "the monitor answered {status} for {url}: {body}"
            );

            // Not forgotten across a restart: recovery holds it again.
            system.coordinators[0].service.kill9()?;
            system.coordinators[0].service.restart().await?;
            let message = wait_for_attention(system, &broken).await?;
            ensure!(
                message.contains(&expected),
                "after a restart, GetExecution of {broken} does not name {expected}: {message}"
            );
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let held = system
                    .coordinator_metric(0, "trellis_executions_needing_attention")
                    .await
                    .unwrap_or(0.0);
                if held == 1.0 {
                    break;
                }
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "after a restart, trellis_executions_needing_attention is {held}, not 1"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(())
        })
        .await
}
