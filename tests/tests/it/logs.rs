//! Task logs against separate processes (a coordinator, a worker, a real NATS): a `shell` task's
//! stdout and stderr lines are read back in order, followed live while it runs, and what it wrote
//! before its worker was SIGKILLed stays readable beside what the next run wrote; once the stream
//! no longer holds them, the checkpoint-store's copy serves the same lines.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use trellis_proto::v1;

use crate::system::{Fault, Options, System, is_terminal};

/// How long each step may take.
const WAIT: Duration = Duration::from_secs(60);

/// One line read back: `(source, text, task_instance_id, worker_id)`.
type Line = (i32, String, String, String);

/// Reads a `GetTaskLogs` stream to its end.
async fn collect_lines(
    mut stream: tonic::Streaming<v1::GetTaskLogsResponse>,
) -> anyhow::Result<Vec<Line>> {
    let mut lines = Vec::new();
    while let Some(item) = stream.message().await? {
        let Some(batch) = item.batch else { continue };
        for line in batch.lines {
            lines.push((
                line.source,
                line.text,
                batch.task_instance_id.clone(),
                batch.worker_id.clone(),
            ));
        }
    }
    Ok(lines)
}

/// The task log batches of `id` the checkpoint-store has copied so far.
async fn stored_batches(system: &System, id: &str) -> anyhow::Result<Vec<v1::TaskLogBatch>> {
    let mut store = v1::checkpoint_store_client::CheckpointStoreClient::connect(format!(
        "http://{}",
        system.store_addr
    ))
    .await
    .context("connecting to the checkpoint-store")?;
    let page = store
        .list_task_logs(v1::ListTaskLogsRequest {
            execution_id: id.to_owned(),
            limit: 1000,
            ..Default::default()
        })
        .await
        .context("ListTaskLogs failed")?
        .into_inner();
    Ok(page.batches.into_iter().filter_map(|b| b.batch).collect())
}

/// Waits for the end of `id` and checks that it completed.
async fn completed(system: &System, id: &str, what: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let ended = system
        .wait_until(0, id, deadline, "the end of the execution", is_terminal)
        .await?;
    ensure!(
        ended.state == v1::ExecutionState::Completed as i32,
        "{what} did not complete: {}",
        ended.reason
    );
    Ok(())
}

/// Opens `GetTaskLogs` of every task of `id`.
async fn logs(
    system: &System,
    id: &str,
    follow: bool,
) -> anyhow::Result<tonic::Streaming<v1::GetTaskLogsResponse>> {
    Ok(system
        .client(0)?
        .get_task_logs(v1::GetTaskLogsRequest {
            execution_id: id.to_owned(),
            follow,
            ..Default::default()
        })
        .await
        .context("GetTaskLogs failed")?
        .into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_lines_are_read_back_followed_live_and_kept_across_a_worker_kill()
-> anyhow::Result<()> {
    let system = System::start(Options {
        workers: 1,
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            // Read back: stdout and stderr, in the order written, after the task completed.
            let id = system
                .start_plan(
                    0,
                    "name: printed\ntasks:\n- {id: print, type: shell, input: {command: [sh, -c, 'for i in 1 2 3; do echo out $i; echo err $i >&2; sleep 0.05; done']}}\n",
                )
                .await?;
            completed(system, &id, "the printing task").await?;
            let lines = collect_lines(logs(system, &id, false).await?).await?;
            let out: Vec<&str> = lines
                .iter()
                .filter(|l| l.0 == v1::LogSource::Stdout as i32)
                .map(|l| l.1.as_str())
                .collect();
            let err: Vec<&str> = lines
                .iter()
                .filter(|l| l.0 == v1::LogSource::Stderr as i32)
                .map(|l| l.1.as_str())
                .collect();
            ensure!(
                out == ["out 1", "out 2", "out 3"] && err == ["err 1", "err 2", "err 3"],
                "read back: stdout {out:?}, stderr {err:?}"
            );
            ensure!(
                lines.iter().all(|l| l.3 == "worker-1"),
                "every line names its worker: {lines:?}"
            );

            // Followed live, then the worker is SIGKILLed mid-task: the task runs again on the
            // restarted worker, and the first run's lines stay.
            let id = system
                .start_plan(
                    0,
                    "name: ticking\ntasks:\n- {id: tick, type: shell, input: {command: [sh, -c, 'echo run $$; i=0; while [ $i -lt 30 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done']}}\n",
                )
                .await?;
            let mut live = logs(system, &id, true).await?;
            let mut seen = Vec::new();
            let deadline = tokio::time::Instant::now() + WAIT;
            while !seen.iter().any(|text: &String| text == "tick 5") {
                let item = tokio::time::timeout_at(deadline, live.message())
                    .await
                    .context("no live line within 60 s")??
                    .context("the live stream ended before tick 5")?;
                seen.extend(item.batch.into_iter().flat_map(|b| b.lines).map(|l| l.text));
            }
            let execution = system
                .wait_until(0, &id, deadline, "an answer", |_| true)
                .await?;
            ensure!(
                !is_terminal(&execution),
                "tick 5 should arrive while the task still runs"
            );
            system.inject(Fault::Worker(0)).await?;
            // The follower ends by itself once the execution has ended.
            let rest = tokio::time::timeout(WAIT * 2, async {
                let mut rest = Vec::new();
                while let Some(item) = live.message().await? {
                    rest.extend(item.batch.into_iter().flat_map(|b| b.lines).map(|l| l.text));
                }
                anyhow::Ok(rest)
            })
            .await
            .context("the live stream did not end after the execution")??;
            seen.extend(rest);
            ensure!(
                seen.iter().filter(|text| *text == "tick 29").count() == 1,
                "followed: the rerun's last tick arrives once: {seen:?}"
            );
            completed(system, &id, "the ticking task, after its worker died,").await?;
            let lines = collect_lines(logs(system, &id, false).await?).await?;
            let texts: Vec<&str> = lines.iter().map(|l| l.1.as_str()).collect();
            let runs: Vec<usize> = texts
                .iter()
                .enumerate()
                .filter(|(_, text)| text.starts_with("run "))
                .map(|(n, _)| n)
                .collect();
            ensure!(
                runs.len() == 2 && texts[runs[0]] != texts[runs[1]],
                "two runs, each named by its shell's pid: {texts:?}"
            );
            let first_run = &texts[runs[0]..runs[1]];
            ensure!(
                (0..=5).all(|n| first_run.contains(&format!("tick {n}").as_str())),
                "the killed run's lines up to tick 5 are kept: {first_run:?}"
            );
            ensure!(
                texts[runs[1]..].contains(&"tick 29"),
                "the second run wrote to the end: {texts:?}"
            );
            // The checkpoint-store keeps a copy: once the stream has dropped the lines (here:
            // purged), the same lines still come back, in the same order, with their workers.
            let before = collect_lines(logs(system, &id, false).await?).await?;
            let copied = stored_batches(system, &id).await?;
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                let stored = stored_batches(system, &id).await?;
                let lines: usize = stored.iter().map(|b| b.lines.len()).sum();
                if lines == before.len() {
                    break;
                }
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "the store copied {lines} of {} lines within 60 s (first look: {} batches)",
                    before.len(),
                    copied.len()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let js = async_nats::jetstream::new(async_nats::connect(system.nats.url()).await?);
            js.get_stream("TRELLIS_LOGS")
                .await?
                .purge()
                .await
                .context("purging TRELLIS_LOGS")?;
            let after = collect_lines(logs(system, &id, false).await?).await?;
            ensure!(
                after == before,
                "after the purge, from the store:\n{after:?}\nbefore:\n{before:?}"
            );
            // Lines written after the purge follow the stored ones, in order, none twice.
            let third = system
                .start_plan(
                    0,
                    "name: after-purge\ntasks:\n- {id: one, type: shell, input: {command: [sh, -c, 'echo one']}}\n- {id: two, type: shell, depends_on: [one], input: {command: [sh, -c, 'echo two']}}\n",
                )
                .await?;
            completed(system, &third, "the plan after the purge").await?;
            let texts: Vec<String> = collect_lines(logs(system, &third, false).await?)
                .await?
                .into_iter()
                .map(|l| l.1)
                .collect();
            ensure!(texts == ["one", "two"], "after the purge: {texts:?}");

            // An execution that does not exist is not found, not an empty log.
            let unknown = system
                .client(0)?
                .get_task_logs(v1::GetTaskLogsRequest {
                    execution_id: "0190a5c4-7d1e-7000-8000-000000000001".to_owned(),
                    ..Default::default()
                })
                .await;
            ensure!(
                unknown.as_ref().err().map(tonic::Status::code) == Some(tonic::Code::NotFound),
                "logs of an unknown execution: {:?}",
                unknown.map(|_| ())
            );
            Ok(())
        })
        .await
}
