//! Results handed off by workers (`trellis.handoff.<shard>`): they complete executions without
//! the results stream, and the coordinator answers every hand-off it took, `done` for one it set
//! aside or found a duplicate of what is stored.

use std::time::Duration;

use prost::Message as _;
use trellis_proto::subjects;
use trellis_proto::v1::{self, ExecutionState, event::Kind};

use crate::cluster;

/// A completed result of `attempt` of `instance` in `execution`, sent by `worker`.
fn completed(execution: &str, instance: &str, attempt: u32, worker: &str) -> v1::TaskResult {
    v1::TaskResult {
        execution_id: execution.to_owned(),
        task_instance_id: instance.to_owned(),
        attempt,
        worker_id: worker.to_owned(),
        outcome: Some(v1::task_result::Outcome::Completed(
            v1::task_result::Completed {
                output: b"{\"again\":true}".to_vec(),
            },
        )),
        ..Default::default()
    }
}

/// Hands `payload` off to shard 0's coordinator as a worker would; its answer.
async fn hand_off(
    nats: &async_nats::Client,
    headers: Option<async_nats::HeaderMap>,
    payload: Vec<u8>,
) -> Result<bytes::Bytes, async_nats::RequestError> {
    let mut request = async_nats::Request::new()
        .payload(payload.into())
        .timeout(Some(Duration::from_secs(10)));
    if let Some(headers) = headers {
        request = request.headers(headers);
    }
    nats.send_request(subjects::handoff(0), request)
        .await
        .map(|reply| reply.payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_off_results_complete_an_execution_without_the_stream() {
    let mut cluster = cluster::start(2).await;
    let run = cluster
        .run(
            "name: handed\ntasks:\n- {id: a, type: noop}\n- {id: b, type: noop, depends_on: [a]}\n\
             - {id: c, type: noop, depends_on: [a]}\n- {id: d, type: noop, depends_on: [b, c]}\n",
        )
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    let completed = run
        .events
        .iter()
        .filter(|event| matches!(event.kind, Some(Kind::TaskCompleted(_))))
        .count();
    assert_eq!(completed, 4, "every task's completion is in the log");
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    assert_eq!(
        cluster::stored(&nats, subjects::RESULTS_STREAM).await,
        0,
        "results went through the stream instead of being handed off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_and_corrupt_hand_offs_are_answered_done_and_change_nothing() {
    let mut cluster = cluster::start(1).await;
    let run = cluster
        .run("name: dup\ntasks:\n- {id: a, type: noop}\n")
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    let done = run.first_completed();
    let duplicate = completed(&run.id, &done.task_instance_id, done.attempt, "intruder");
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    let mut batch_header = async_nats::HeaderMap::new();
    batch_header.insert(subjects::RESULT_BATCH_HEADER, "2");
    for (what, headers, payload) in [
        ("a duplicate", None, duplicate.encode_to_vec()),
        (
            "a message marked a batch that is none",
            Some(batch_header),
            b"\xff\x00 not a batch".to_vec(),
        ),
    ] {
        let reply = hand_off(&nats, headers, payload)
            .await
            .unwrap_or_else(|error| panic!("{what} handed off got no answer: {error}"));
        assert_eq!(
            reply.as_ref(),
            subjects::HANDOFF_DONE,
            "{what} handed off was answered {:?}",
            String::from_utf8_lossy(&reply)
        );
    }
    let again = cluster.wait(&run.id, Duration::from_secs(10)).await;
    assert_eq!(
        again.events.len(),
        run.events.len(),
        "a hand-off changed the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_the_coordinator_puts_off_is_answered_publish() {
    let cluster = cluster::start(1).await;
    // An execution this coordinator does not know: its log must be read first, so the result
    // is put off (the turn asks for it again later) and the worker must publish it.
    let payload = completed(
        &uuid::Uuid::now_v7().to_string(),
        &uuid::Uuid::now_v7().to_string(),
        1,
        "stranger",
    )
    .encode_to_vec();
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    let hand_off_stranger = || hand_off(&nats, None, payload.clone());
    // Until the coordinator has recovered the shard, nobody hears its hand-offs.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let first = loop {
        match hand_off_stranger().await {
            Ok(reply) => break reply,
            Err(error) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(%error, "no coordinator hears the shard yet");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("no coordinator answered a hand-off within 30 s: {error}"),
        }
    };
    assert_eq!(
        first.as_ref(),
        subjects::HANDOFF_PUBLISH,
        "a result for an execution being loaded was answered {:?}",
        String::from_utf8_lossy(&first)
    );
    // Once the coordinator has found no log, the same result is set aside: done with.
    let settled = trellis_testkit::wait_for(
        || async {
            hand_off_stranger()
                .await
                .is_ok_and(|reply| reply.as_ref() == subjects::HANDOFF_DONE)
        },
        Duration::from_secs(10),
    );
    settled
        .await
        .expect("a result for an execution with no log was never set aside");
}
