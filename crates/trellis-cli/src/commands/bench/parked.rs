//! `parked`: one task at a time while many executions wait on a human, as a fleet of agents
//! waiting for approvals does. A waiting execution should cost its coordinator nothing until
//! something of it is due.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tonic::transport::Channel;
use trellis_proto::v1::{self, coordinator_client::CoordinatorClient};

use super::{Fields, SETTLE_BOUND, disk, get, latency, round, start_plan};

/// Executions left waiting on a question while the samples are taken.
const PARKED: usize = 10_000;
/// Calls in flight at once while the parked executions are started, looked at and cancelled.
const IN_FLIGHT: usize = 64;
/// How long the parked executions' questions may take to be asked.
const ASKED_WITHIN: Duration = Duration::from_secs(120);
/// How long this process's CPU time is watched with nothing running but the parked executions.
const IDLE_FOR: Duration = Duration::from_secs(2);

/// An execution of one task that asks a question and waits for its answer.
const ASKS: &str = "name: bench-parked\ntasks:\n\
    - {id: ask, type: question, input: {text: \"go on?\"}}\n";

/// Starts [`PARKED`] executions that each wait on a question, watches what this process (every
/// service but the nats-server) spends on them for [`IDLE_FOR`] once everything else is done,
/// then measures `latency` over `n` one-task executions beside them; the parked ones are
/// cancelled after.
pub(super) async fn parked(
    client: CoordinatorClient<Channel>,
    js: Option<&async_nats::jetstream::Context>,
    n: usize,
) -> Result<Fields, String> {
    let started = Instant::now();
    let ids = each(
        &client,
        (0..PARKED).map(|_| ()),
        |mut client, ()| async move { start_plan(&mut client, ASKS.to_owned()).await },
    )
    .await?;
    // Every one has asked its question: from here on none has anything to do.
    each(&client, ids.clone(), |mut client, id| async move {
        let deadline = Instant::now() + ASKED_WITHIN;
        loop {
            if !get(&mut client, &id).await?.open_questions.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "execution {id} asked no question within {ASKED_WITHIN:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await?;
    let parked_in = started.elapsed();
    if let Some(js) = js {
        disk::quiet(js, SETTLE_BOUND).await;
    }
    let before = cpu_time();
    tokio::time::sleep(IDLE_FOR).await;
    let idle_cpu = before.zip(cpu_time()).map(|(before, after)| {
        let used = after.saturating_sub(before);
        used.as_secs_f64() / IDLE_FOR.as_secs_f64()
    });
    let measured = latency(client.clone(), n).await;
    let cancelled = each(&client, ids, |mut client, id| async move {
        let request = v1::CancelExecutionRequest {
            execution_id: id,
            reason: "bench: parked scenario over".to_owned(),
        };
        client
            .cancel_execution(request)
            .await
            .map(drop)
            .map_err(|s| s.message().to_owned())
    })
    .await;
    let mut fields = measured?;
    cancelled?;
    fields.insert(0, ("parked", json!(PARKED)));
    fields.insert(1, ("parked_in_s", json!(round(parked_in.as_secs_f64(), 1))));
    let idle_cpu_pct = idle_cpu.map_or(serde_json::Value::Null, |share| {
        json!(round(share * 100.0, 1))
    });
    fields.insert(2, ("idle_cpu_pct", idle_cpu_pct));
    Ok(fields)
}

/// The CPU time this process has used, user and system, from `/proc/self/stat`; `None` where
/// there is no such file.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name, in parentheses, may hold spaces: the fields after it start with the
    // third (the state), so utime and stime (the 14th and 15th) are the 12th and 13th there.
    let (_, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // In clock ticks of 1/100 s: Linux's USER_HZ on every architecture it runs on.
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Calls `call` with a client for every item, [`IN_FLIGHT`] at a time; returns the answers in
/// the items' order, or the first error.
async fn each<I, T, F, Fut>(
    client: &CoordinatorClient<Channel>,
    items: I,
    call: F,
) -> Result<Vec<T>, String>
where
    I: IntoIterator,
    F: Fn(CoordinatorClient<Channel>, I::Item) -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    futures::stream::iter(items)
        .map(|item| call(client.clone(), item))
        .buffered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}
