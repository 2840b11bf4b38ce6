//! What the coordinator must not trust: duplicate and corrupt results (alone and in batches)
//! and corrupt heartbeats change nothing.

use std::time::Duration;

use prost::Message as _;
use trellis_proto::v1::{self, ExecutionState};

use crate::cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_and_corrupt_results_change_nothing() {
    let mut cluster = cluster::start(1).await;
    let run = cluster
        .run("name: dup\ntasks:\n- {id: a, type: noop}\n")
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    let completed = run.first_completed();
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    let js = async_nats::jetstream::new(nats);
    let duplicate = v1::TaskResult {
        execution_id: run.id.clone(),
        task_instance_id: completed.task_instance_id.clone(),
        attempt: completed.attempt,
        worker_id: "intruder".into(),
        usage: None,
        sent_at_unix_ms: 0,
        started_at_unix_ms: None,
        validation: Vec::new(),
        outcome: Some(v1::task_result::Outcome::Completed(
            v1::task_result::Completed {
                output: b"{\"again\":true}".to_vec(),
            },
        )),
    };
    let subject = trellis_proto::subjects::results(0);
    for payload in [
        duplicate.encode_to_vec(),
        b"\xff\x00 not protobuf".to_vec(),
        duplicate.encode_to_vec(),
    ] {
        js.publish(subject.clone(), payload.into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    // The same, as a worker's batch: the duplicate twice in one message, and a message marked a
    // batch that is none (set aside, the coordinator going on).
    let entry = v1::task_result_batch::Entry {
        result: duplicate.encode_to_vec(),
        msg_id: String::new(),
        traceparent: String::new(),
    };
    for (n, payload) in [
        (
            "2",
            trellis_proto::results::pack(vec![entry.clone(), entry]),
        ),
        ("3", b"\xff\x00 not a batch".to_vec()),
    ] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(trellis_proto::subjects::RESULT_BATCH_HEADER, n);
        js.publish_with_headers(subject.clone(), headers, payload.into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    // The coordinator keeps working and the first execution's log did not grow.
    let second = cluster
        .run("name: after\ntasks:\n- {id: b, type: noop}\n")
        .await;
    assert_eq!(second.state(), ExecutionState::Completed);
    let again = cluster.wait(&run.id, Duration::from_secs(10)).await;
    assert_eq!(
        again.events.len(),
        run.events.len(),
        "duplicates were not applied"
    );
    // Every one of them was acknowledged or set aside: none waits to be delivered again.
    let results = js
        .get_stream(trellis_proto::subjects::RESULTS_STREAM)
        .await
        .expect("results stream");
    let left = || async {
        results
            .get_info()
            .await
            .map_or(u64::MAX, |info| info.state.messages)
    };
    let emptied =
        trellis_testkit::wait_for(|| async { left().await == 0 }, Duration::from_secs(10));
    if emptied.await.is_err() {
        panic!("{} result messages still in the stream", left().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_heartbeats_are_ignored_and_live_workers_are_listed() {
    let mut cluster = cluster::start(1).await;
    let nats = async_nats::connect(cluster.nats.url()).await.expect("nats");
    nats.publish(
        "trellis.workers.heartbeat.bogus",
        "\u{1}not a heartbeat".into(),
    )
    .await
    .expect("publish");
    nats.flush().await.expect("flush");
    let mut listed = Vec::new();
    for _ in 0..100 {
        let request = v1::ListWorkersRequest {
            queue: String::new(),
            include_terminated: false,
        };
        listed = cluster
            .client
            .list_workers(request)
            .await
            .expect("list workers")
            .into_inner()
            .workers;
        if !listed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids: Vec<_> = listed.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(
        ids,
        ["worker-0"],
        "the real worker, not the corrupt message"
    );
}
