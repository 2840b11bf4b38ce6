//! Assignments offered to idle workers (`trellis.offer.<queue>`): a small execution runs
//! without the tasks stream, and an offered attempt that no worker runs is found lost by the
//! coordinator's watch (no heartbeat names it) and dispatched again.

use std::time::Duration;

use trellis_agent_worker::HandlerRegistry;
use trellis_proto::subjects;
use trellis_proto::v1::{ExecutionState, event::Kind};

use crate::cluster::{self, Setup};

const CHAIN: &str = "name: offered\ntasks:\n- {id: a, type: noop}\n\
                     - {id: b, type: noop, depends_on: [a]}\n- {id: c, type: noop, depends_on: [b]}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_execution_runs_on_offers_without_the_tasks_stream() {
    let (mut cluster, telemetry) = cluster::start_measured(2).await;
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    // The first run may meet workers not yet listening for offers, after which the coordinator
    // offers that queue nothing for 5 s; the run after that may not.
    assert_eq!(cluster.run(CHAIN).await.state(), ExecutionState::Completed);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let before = cluster::stored(&nats, subjects::TASKS_STREAM).await;
    let run = cluster.run(CHAIN).await;
    assert_eq!(run.state(), ExecutionState::Completed);
    assert_eq!(
        cluster::stored(&nats, subjects::TASKS_STREAM).await,
        before,
        "every task of the second run was offered and taken"
    );
    let metrics = telemetry.registry.encode();
    let taken: f64 = metrics
        .lines()
        .filter(|line| {
            line.starts_with("trellis_task_offers_total{") && line.contains("answer=\"taken\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        taken >= 3.0,
        "the coordinator counts the second run's three offers taken:\n{metrics}"
    );
}

/// A "worker" that answers the first offer `taken` and never runs it, then `busy`: the
/// attempt is lost once no heartbeat has named it for the lapse, and its next attempt,
/// refused, goes to the stream, where the real worker (which takes no offers) runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offered_attempt_no_worker_runs_is_lost_and_run_again() {
    let mut cluster = cluster::start_setup(
        1,
        HandlerRegistry::with_builtins,
        Setup {
            workers_take_no_offers: true,
            ..Setup::default()
        },
    )
    .await;
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    let mut offers = nats
        .queue_subscribe(
            subjects::offer("noop"),
            subjects::OFFER_QUEUE_GROUP.to_owned(),
        )
        .await
        .expect("subscribed");
    nats.flush().await.expect("flushed");
    let answering = nats.clone();
    let taker = tokio::spawn(async move {
        use futures::StreamExt as _;
        let mut n = 0;
        while let Some(offer) = offers.next().await {
            n += 1;
            let answer = if n == 1 {
                subjects::OFFER_TAKEN
            } else {
                subjects::OFFER_BUSY
            };
            if let Some(reply) = offer.reply {
                let _ = answering.publish(reply, answer.into()).await;
            }
        }
    });
    let run = tokio::time::timeout(
        Duration::from_secs(60),
        cluster.run("name: dropped\ntasks:\n- {id: a, type: noop}\n"),
    )
    .await
    .expect("the execution ended: the dropped attempt was found lost and run again");
    taker.abort();
    assert_eq!(run.state(), ExecutionState::Completed);
    let lost = run
        .events
        .iter()
        .filter(|event| matches!(event.kind, Some(Kind::TaskLost(_))))
        .count();
    assert_eq!(lost, 1, "the attempt taken and dropped is recorded lost");
}
