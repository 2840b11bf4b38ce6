//! The read model end to end: a real execution's log, published as the coordinator publishes it
//! onto a private `nats-server -js`, consumed by the running service into SQLite, read back with
//! `QueryTaskInstances` and `GetExecutionRecord`.

use std::time::Duration;

use anyhow::Context;
use async_nats::HeaderMap;
use prost::Message as _;
use trellis_checkpoint_store::Config;
use trellis_proto::{subjects, v1};
use trellis_testkit::NatsServer;

use crate::driver::{Driver, SPEC};

type Client = v1::checkpoint_store_client::CheckpointStoreClient<tonic::transport::Channel>;
use crate::support::{Service, TestStore};

/// Publishes a batch on the execution's subject, with the coordinator's message id unless
/// `msg_id` says otherwise (a duplicate with another id is stored again by JetStream, so the store
/// sees it).
async fn publish(
    js: &async_nats::jetstream::Context,
    batch: &v1::EventBatch,
    msg_id: Option<String>,
) -> anyhow::Result<()> {
    let first = batch.events.first().context("empty batch")?;
    let mut headers = HeaderMap::new();
    headers.insert(
        subjects::MSG_ID_HEADER,
        msg_id
            .unwrap_or_else(|| subjects::event_msg_id(&first.execution_id, first.sequence))
            .as_str(),
    );
    js.publish_with_headers(
        subjects::events(&first.execution_id),
        headers,
        batch.encode_to_vec().into(),
    )
    .await?
    .await?;
    Ok(())
}

/// Runs the driver's execution to its end, publishing each batch as the coordinator would.
async fn publish_to_the_end(
    js: &async_nats::jetstream::Context,
    driver: &mut Driver,
) -> anyhow::Result<()> {
    let mut steps = 0;
    while !driver.finished() {
        driver.step()?;
        if let Some(batch) = driver.take_batch() {
            publish(js, &batch, None).await?;
        }
        steps += 1;
        anyhow::ensure!(steps < 50, "the execution did not finish");
    }
    Ok(())
}

async fn nats() -> anyhow::Result<(NatsServer, async_nats::jetstream::Context)> {
    let server = NatsServer::start()?;
    let client = trellis_bus::connect(&server.url(), "read-model-test").await?;
    let js = async_nats::jetstream::new(client);
    // The test plays the coordinator, which creates the streams.
    trellis_bus::ensure_streams(&js, 1).await?;
    Ok((server, js))
}

async fn wait_for_sequence(
    client: &mut Client,
    execution_id: &str,
    sequence: u64,
) -> anyhow::Result<v1::Execution> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let found = client
            .get_execution_record(v1::GetExecutionRecordRequest {
                execution_id: execution_id.to_owned(),
            })
            .await;
        if let Ok(response) = found
            && let Some(execution) = response.into_inner().execution
            && execution.last_sequence >= sequence
        {
            return Ok(execution);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the read model did not reach sequence {sequence} of {execution_id}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn all_instances(
    client: &mut Client,
    request: v1::QueryTaskInstancesRequest,
) -> anyhow::Result<Vec<v1::TaskInstance>> {
    let mut res = Vec::new();
    let mut token = String::new();
    loop {
        let mut request = request.clone();
        request.page = Some(v1::PageRequest {
            page_size: 2,
            page_token: token,
        });
        let page = client.query_task_instances(request).await?.into_inner();
        res.extend(page.task_instances);
        token = page
            .page
            .map(|page| page.next_page_token)
            .unwrap_or_default();
        if token.is_empty() {
            return Ok(res);
        }
    }
}

#[tokio::test]
async fn a_real_execution_log_becomes_queryable_task_instances() -> anyhow::Result<()> {
    let (server, js) = nats().await?;
    let store = TestStore::sqlite().await?;
    let service = Service::start(Config::new(store.url.clone(), server.url())).await?;
    let mut client = service.client().await?;

    let mut driver = Driver::start(SPEC, &[("team", "infra")])?;
    let execution_id = driver.id.to_string();
    let mut published: Vec<v1::EventBatch> = Vec::new();
    let mut steps = 0;
    while !driver.finished() {
        driver.step()?;
        if steps == 1 {
            driver.record_unknown();
        }
        if let Some(batch) = driver.take_batch() {
            publish(&js, &batch, None).await?;
            // Redelivered work: the same batch again (another message id, so JetStream keeps it),
            // and a batch overlapping what was already sent.
            publish(&js, &batch, Some(format!("again-{steps}"))).await?;
            if let Some(previous) = published.last() {
                let mut overlap = previous.clone();
                overlap.events.extend(batch.events.iter().take(1).cloned());
                publish(&js, &overlap, Some(format!("overlap-{steps}"))).await?;
            }
            published.push(batch);
        }
        steps += 1;
        anyhow::ensure!(steps < 50, "the execution did not finish");
    }

    let execution = wait_for_sequence(&mut client, &execution_id, driver.sequence).await?;
    assert_eq!(execution.last_sequence, driver.sequence);
    assert_eq!(execution.state, i32::from(v1::ExecutionState::Completed));
    assert_eq!(execution.name, "store-read-model");
    assert_eq!(
        execution.labels.get("team").map(String::as_str),
        Some("infra")
    );
    assert!(execution.ended_at_unix_ms.is_some());
    let progress = driver.machine.progress(driver.now_ms);
    assert_eq!(
        execution.counts,
        Some(trellis_wire::read::counts_to_proto(&progress.counts))
    );
    assert_eq!(execution.counts.map(|counts| counts.completed), Some(8));
    assert_eq!(
        execution.usage,
        Some(trellis_wire::common::usage_to_proto(driver.machine.usage()))
    );

    let all = all_instances(
        &mut client,
        v1::QueryTaskInstancesRequest {
            execution_id: execution_id.clone(),
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(all, driver.expected_records());

    let members: Vec<&v1::TaskInstance> = all
        .iter()
        .filter(|record| record.task_id == "noop")
        .collect();
    assert_eq!(members.len(), 3);
    let group = members[0].subtask_group_id.clone();
    let by_group = all_instances(
        &mut client,
        v1::QueryTaskInstancesRequest {
            execution_id: execution_id.clone(),
            subtask_group_id: group,
            states: vec![v1::TaskState::Completed.into()],
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(by_group.len(), 3);
    let fan = all_instances(
        &mut client,
        v1::QueryTaskInstancesRequest {
            execution_id: execution_id.clone(),
            task_id: Some("fan".to_owned()),
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(fan.len(), 2, "the spawner and its resumed instance");

    // Every event once, duplicates and overlaps skipped, the unknown one kept as such.
    assert_eq!(store.count("events").await?, driver.sequence as i64);
    service.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_restarted_store_rebuilds_its_replica_from_the_log() -> anyhow::Result<()> {
    let (server, js) = nats().await?;
    let store = TestStore::sqlite().await?;
    let config = Config::new(store.url.clone(), server.url());
    let service = Service::start(config.clone()).await?;
    let mut client = service.client().await?;
    let mut driver = Driver::start(SPEC, &[])?;
    let execution_id = driver.id.to_string();
    for _ in 0..2 {
        driver.step()?;
    }
    if let Some(batch) = driver.take_batch() {
        publish(&js, &batch, None).await?;
    }
    wait_for_sequence(&mut client, &execution_id, driver.sequence).await?;
    service.stop().await?;

    // The rest of the execution happens while the store is down.
    publish_to_the_end(&js, &mut driver).await?;

    let service = Service::start(config).await?;
    let mut client = service.client().await?;
    let execution = wait_for_sequence(&mut client, &execution_id, driver.sequence).await?;
    assert_eq!(execution.state, i32::from(v1::ExecutionState::Completed));
    let all = all_instances(
        &mut client,
        v1::QueryTaskInstancesRequest {
            execution_id,
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(all, driver.expected_records());
    assert_eq!(store.count("events").await?, driver.sequence as i64);
    service.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_new_run_of_a_cancelled_execution_is_followed() -> anyhow::Result<()> {
    use trellis_core::machine::EventBody;

    let (server, js) = nats().await?;
    let store = TestStore::sqlite().await?;
    let service = Service::start(Config::new(store.url.clone(), server.url())).await?;
    let mut client = service.client().await?;
    let mut driver = Driver::start(SPEC, &[])?;
    let execution_id = driver.id.to_string();
    driver.step()?;
    driver.record(EventBody::CancelRequested {
        reason: "operator".to_owned(),
    })?;
    anyhow::ensure!(driver.finished(), "the cancel ended the run");
    if let Some(batch) = driver.take_batch() {
        publish(&js, &batch, None).await?;
    }
    let cancelled = wait_for_sequence(&mut client, &execution_id, driver.sequence).await?;
    assert_eq!(cancelled.state, i32::from(v1::ExecutionState::Cancelled));
    assert_eq!(cancelled.reason, "operator");

    // The store dropped the finished execution's replica; the new run makes it rebuild one.
    driver.record(EventBody::RunStarted { run: 2 })?;
    let mut steps = 0;
    while !driver.finished() {
        driver.step()?;
        steps += 1;
        anyhow::ensure!(steps < 50, "run 2 did not finish");
    }
    if let Some(batch) = driver.take_batch() {
        publish(&js, &batch, None).await?;
    }
    let completed = wait_for_sequence(&mut client, &execution_id, driver.sequence).await?;
    assert_eq!(completed.state, i32::from(v1::ExecutionState::Completed));
    assert_eq!(completed.run_number, 2);
    assert_eq!(completed.reason, "");
    let all = all_instances(
        &mut client,
        v1::QueryTaskInstancesRequest {
            execution_id: execution_id.clone(),
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(all, driver.expected_records());
    let run_two = all_instances(
        &mut client,
        v1::QueryTaskInstancesRequest {
            execution_id,
            run_number: 2,
            ..Default::default()
        },
    )
    .await?;
    assert!(!run_two.is_empty() && run_two.len() < all.len());
    service.stop().await?;
    Ok(())
}

/// A group of 5,000 subtasks: every instance reaches PostgreSQL through runs of many messages.
#[tokio::test]
async fn a_large_group_reaches_postgres() -> anyhow::Result<()> {
    let (server, js) = nats().await?;
    let store = TestStore::postgres().await?;
    let service = Service::start(Config::new(store.url.clone(), server.url())).await?;
    let mut client = service.client().await?;
    let mut driver = Driver::start(SPEC, &[])?.with_members(5_000);
    let execution_id = driver.id.to_string();
    let started = std::time::Instant::now();
    let mut steps = 0;
    while !driver.finished() {
        driver.step()?;
        if let Some(batch) = driver.take_batch() {
            // The coordinator splits its appends; so does the test, in messages of 500 events.
            for events in batch.events.chunks(500) {
                let events = events.to_vec();
                publish(&js, &v1::EventBatch { events }, None).await?;
            }
        }
        steps += 1;
        anyhow::ensure!(steps < 50, "the execution did not finish");
    }
    let execution = wait_for_sequence(&mut client, &execution_id, driver.sequence).await?;
    eprintln!(
        "{} events of 5,000 subtasks in the read model after {:?}",
        driver.sequence,
        started.elapsed()
    );
    assert_eq!(execution.state, i32::from(v1::ExecutionState::Completed));
    assert_eq!(
        store.count("task_instances").await?,
        driver.expected_records().len() as i64
    );
    let mut request = v1::QueryTaskInstancesRequest {
        execution_id,
        page: Some(v1::PageRequest {
            page_size: 1000,
            page_token: String::new(),
        }),
        ..Default::default()
    };
    let mut all = Vec::new();
    loop {
        let page = client
            .query_task_instances(request.clone())
            .await?
            .into_inner();
        all.extend(page.task_instances);
        let token = page
            .page
            .map(|page| page.next_page_token)
            .unwrap_or_default();
        if token.is_empty() {
            break;
        }
        request.page = Some(v1::PageRequest {
            page_size: 1000,
            page_token: token,
        });
    }
    assert_eq!(all, driver.expected_records());
    service.stop().await?;
    Ok(())
}

/// Heartbeats on core NATS become worker rows, written every few seconds, not once per beat.
#[tokio::test]
async fn heartbeats_become_workers() -> anyhow::Result<()> {
    let (server, _js) = nats().await?;
    let store = TestStore::postgres().await?;
    let service = Service::start(Config::new(store.url.clone(), server.url())).await?;
    let nats = trellis_bus::connect(&server.url(), "heartbeat-test").await?;
    // Heartbeats are core NATS messages: the ones sent before the store subscribed are lost, as
    // they would be in production, so workers keep sending until they show up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    while store.count("workers").await? < 2 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no worker rows after {sent} heartbeats"
        );
        for n in 0..2 {
            let worker_id = format!("worker-{n}");
            let heartbeat = v1::WorkerHeartbeat {
                worker_id: worker_id.clone(),
                host: "host-1".to_owned(),
                queues: vec!["noop".to_owned()],
                slots: 2,
                state: v1::WorkerState::Idle.into(),
                interval_ms: 2_000,
                ..Default::default()
            };
            nats.publish(
                subjects::heartbeat(&worker_id),
                heartbeat.encode_to_vec().into(),
            )
            .await?;
            sent += 1;
        }
        // A corrupt heartbeat is ignored.
        nats.publish(subjects::heartbeat("worker-x"), vec![0xff, 0xff].into())
            .await?;
        nats.flush().await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let beats = store
        .scalar("SELECT COALESCE(SUM(heartbeat_count), 0)::BIGINT FROM workers")
        .await?;
    assert!(beats >= 2 && beats <= sent, "{beats} of {sent} heartbeats");
    assert_eq!(store.count("workers").await?, 2);
    service.stop().await?;
    Ok(())
}

/// Returns the holder of the ingest lease (`<id>#<token>`), once one holds it.
async fn ingest_leader(js: &async_nats::jetstream::Context) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(bucket) = js
            .get_key_value(trellis_checkpoint_store::LEADER_BUCKET)
            .await
            && let Ok(Some(value)) = bucket.get("ingest").await
        {
            return Ok(String::from_utf8_lossy(&value).into_owned());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no replica took the ingest lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn two_replicas_ingest_through_one_and_the_other_takes_over_when_it_stops()
-> anyhow::Result<()> {
    let (server, js) = nats().await?;
    let store = TestStore::postgres().await?;
    let replica = |id: &str| Config {
        id: id.to_owned(),
        ingest_lease_ttl: Duration::from_secs(1),
        ..Config::new(store.url.clone(), server.url())
    };
    let a = Service::start(replica("store-a")).await?;
    let leader = ingest_leader(&js).await?;
    anyhow::ensure!(
        leader.starts_with("store-a#"),
        "the first replica leads: {leader}"
    );
    let b = Service::start(replica("store-b")).await?;
    let mut through_b = b.client().await?;

    // Half the execution, ingested by the leader and read through the other replica.
    let mut driver = Driver::start(SPEC, &[])?;
    let execution_id = driver.id.to_string();
    for _ in 0..3 {
        driver.step()?;
        if let Some(batch) = driver.take_batch() {
            publish(&js, &batch, None).await?;
        }
    }
    wait_for_sequence(&mut through_b, &execution_id, driver.sequence).await?;
    anyhow::ensure!(
        ingest_leader(&js).await?.starts_with("store-a#"),
        "the leader stays while it lives"
    );

    // The leader stops; the rest arrives meanwhile and the other replica ingests it.
    a.stop().await?;
    publish_to_the_end(&js, &mut driver).await?;
    let execution = wait_for_sequence(&mut through_b, &execution_id, driver.sequence).await?;
    let leader = ingest_leader(&js).await?;
    anyhow::ensure!(
        leader.starts_with("store-b#"),
        "the other replica leads: {leader}"
    );
    assert_eq!(execution.state, i32::from(v1::ExecutionState::Completed));
    let all = all_instances(
        &mut through_b,
        v1::QueryTaskInstancesRequest {
            execution_id,
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(all, driver.expected_records());
    // Every event once; one consumer of the event log is left, the new leader's.
    assert_eq!(store.count("events").await?, driver.sequence as i64);
    let events = js.get_stream(subjects::EVENTS_STREAM).await?;
    let mut names = events.consumer_names();
    let mut consumers = Vec::new();
    while let Some(name) = futures::StreamExt::next(&mut names).await {
        // Ordered consumers rebuilding replicas have generated names and come and go.
        let name = name?;
        if name.starts_with("checkpoint-store") {
            consumers.push(name);
        }
    }
    anyhow::ensure!(
        consumers.len() == 1 && consumers[0].starts_with("checkpoint-store-"),
        "one consumer of the new term is left: {consumers:?}"
    );
    b.stop().await?;
    Ok(())
}

/// Returns how many messages the event log holds for an execution.
async fn logged(js: &async_nats::jetstream::Context, execution_id: &str) -> anyhow::Result<u64> {
    let events = js.get_stream(subjects::EVENTS_STREAM).await?;
    let mut info = events
        .info_with_subjects(subjects::events(execution_id))
        .await?;
    let mut count = 0;
    while let Some(entry) = futures::StreamExt::next(&mut info).await {
        count += entry?.1 as u64;
    }
    Ok(count)
}

#[tokio::test]
async fn finished_executions_leave_the_log_after_the_retention_and_stay_in_the_read_model()
-> anyhow::Result<()> {
    let (server, js) = nats().await?;
    let store = TestStore::sqlite().await?;
    let config = Config {
        events_retention: Some(Duration::from_secs(1)),
        ..Config::new(store.url.clone(), server.url())
    };
    let service = Service::start(config).await?;
    let mut client = service.client().await?;
    // One execution runs to its end, another stays unfinished.
    let mut finished = Driver::start(SPEC, &[])?;
    publish_to_the_end(&js, &mut finished).await?;
    let mut unfinished = Driver::start(SPEC, &[])?;
    for _ in 0..2 {
        unfinished.step()?;
        if let Some(batch) = unfinished.take_batch() {
            publish(&js, &batch, None).await?;
        }
    }
    let finished_id = finished.id.to_string();
    let unfinished_id = unfinished.id.to_string();
    // Checked at once: with a one-second retention, a slow wait for the read model below may
    // outlast it.
    anyhow::ensure!(
        logged(&js, &finished_id).await? > 0,
        "the log holds it at first"
    );
    wait_for_sequence(&mut client, &finished_id, finished.sequence).await?;
    wait_for_sequence(&mut client, &unfinished_id, unfinished.sequence).await?;

    // Gone from the log within a few sweeps of the retention; still whole in the read model.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while logged(&js, &finished_id).await? > 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the finished execution's messages are still in the log"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let record = wait_for_sequence(&mut client, &finished_id, finished.sequence).await?;
    assert_eq!(record.state, i32::from(v1::ExecutionState::Completed));
    assert_eq!(record.last_sequence, finished.sequence);
    // (The two drivers derive the same instance ids from the same spec and clock, so instances
    // are not compared here; every event of both is.)
    assert_eq!(
        store.count("events").await?,
        (finished.sequence + unfinished.sequence) as i64
    );
    // The unfinished one keeps every message, however old.
    tokio::time::sleep(Duration::from_secs(2)).await;
    anyhow::ensure!(
        logged(&js, &unfinished_id).await? > 0,
        "an unfinished execution's messages were removed"
    );
    service.stop().await?;
    Ok(())
}
