//! Circuit breakers against separate processes: three failed attempts of one task type open its
//! breaker, so the retries wait (they do not fail) through the cooldown; then one probe goes,
//! succeeds and closes the breaker, and the rest follow. `ListWorkers` shows the open breaker,
//! and every transition is published on `trellis.breakers.<queue>`.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use futures::StreamExt as _;
use prost::Message as _;
use trellis_proto::v1;

use crate::system::{Options, System, is_terminal};

/// How long the execution may take.
const WAIT: Duration = Duration::from_secs(60);

/// The cooldown the coordinator is started with.
const COOLDOWN: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_opens_after_failures_holds_dispatches_and_closes_after_a_good_probe()
-> anyhow::Result<()> {
    let system = System::start(Options {
        workers: 1,
        coordinator_env: vec![
            ("TRELLIS_BREAKER_FAILURES", "3".to_owned()),
            ("TRELLIS_BREAKER_COOLDOWN", "2s".to_owned()),
        ],
        ..Options::default()
    })
    .await?;
    let nats = async_nats::connect(system.nats.url()).await?;
    let mut transitions = nats.subscribe("trellis.breakers.noop").await?;
    nats.flush().await?;
    system
        .run(async |system: &mut System| {
            // Each task's first attempt fails; its retry (attempt 2) would pass. (The workers
            // serve the queue `noop`, and run any handler a task on it names.)
            let id = system
                .start_plan(
                    0,
                    "name: flaky-service\n\
                     tasks:\n\
                     - {id: a, type: fail, queue: noop, input: {times: 1}, retry: {max: 3, backoff: {kind: constant, base: 10ms}}}\n\
                     - {id: b, type: fail, queue: noop, input: {times: 1}, retry: {max: 3, backoff: {kind: constant, base: 10ms}}}\n\
                     - {id: c, type: fail, queue: noop, input: {times: 1}, retry: {max: 3, backoff: {kind: constant, base: 10ms}}}\n",
                )
                .await?;
            // Open: the coordinator lists it, and nothing is retried meanwhile.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let open = loop {
                let answer = system
                    .client(0)?
                    .list_workers(v1::ListWorkersRequest::default())
                    .await?
                    .into_inner();
                if let Some(breaker) = answer
                    .breakers
                    .into_iter()
                    .find(|b| b.state == v1::BreakerState::Open as i32)
                {
                    break breaker;
                }
                if tokio::time::Instant::now() >= deadline {
                    let events = system.event_log(&id).await?;
                    anyhow::bail!("the breaker never opened; the log: {events:?}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            ensure!(
                open.queue == "noop" && open.task_type == "fail" && open.retry_at_unix_ms.is_some(),
                "the open breaker: {open:?}"
            );
            let deadline = tokio::time::Instant::now() + WAIT;
            let ended = system
                .wait_until(0, &id, deadline, "the end of the execution", is_terminal)
                .await?;
            ensure!(
                ended.state == v1::ExecutionState::Completed as i32,
                "the retries pass once the breaker lets them: {}",
                ended.reason
            );

            // The log: three failures, then (after the cooldown) one probe dispatched alone,
            // and the other retries only once it completed.
            let events = system.event_log(&id).await?;
            let at = |kind: fn(&v1::event::Kind) -> bool| -> Vec<i64> {
                events
                    .iter()
                    .filter(|e| e.kind.as_ref().is_some_and(kind))
                    .map(|e| e.timestamp_unix_ms)
                    .collect()
            };
            let failed = at(|k| matches!(k, v1::event::Kind::TaskFailed(_)));
            let retries = at(|k| matches!(k, v1::event::Kind::TaskDispatched(d) if d.attempt == 2));
            let completed = at(|k| matches!(k, v1::event::Kind::TaskCompleted(_)));
            ensure!(
                failed.len() == 3 && retries.len() == 3 && completed.len() == 3,
                "three failures, three retries, three completions: {events:?}"
            );
            let opened = failed.iter().max().copied().unwrap_or_default();
            let cooldown = i64::try_from(COOLDOWN.as_millis())?;
            ensure!(
                retries[0] >= opened + cooldown - 100,
                "the probe waited for the cooldown: opened at {opened}, probe at {}",
                retries[0]
            );
            ensure!(
                retries[1] >= completed[0] && retries[2] >= completed[0],
                "the other retries waited for the probe's success: retries {retries:?}, \
                 completions {completed:?}"
            );

            // Each transition was published.
            let mut path = Vec::new();
            while path.len() < 3 {
                let message = tokio::time::timeout(WAIT, transitions.next())
                    .await
                    .context("no breaker transition within 60 s")?
                    .context("the subscription ended")?;
                let transition = v1::BreakerTransition::decode(message.payload)?;
                path.push((transition.from, transition.to, transition.reason));
            }
            let states: Vec<(i32, i32)> = path.iter().map(|p| (p.0, p.1)).collect();
            let (closed, open, half_open) = (
                v1::BreakerState::Closed as i32,
                v1::BreakerState::Open as i32,
                v1::BreakerState::HalfOpen as i32,
            );
            ensure!(
                states == [(closed, open), (open, half_open), (half_open, closed)],
                "transitions: {path:?}"
            );
            ensure!(
                path[0].2 == "3 consecutive attempts failed",
                "why it opened: {path:?}"
            );
            Ok(())
        })
        .await
}
