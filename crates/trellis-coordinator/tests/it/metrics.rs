//! `/metrics` after an execution counts what happened in it, as Prometheus scrapes it from the
//! admin server of the process that ran the coordinator and a worker.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cluster;

const PLAN: &str = "name: counted\ntasks:\n\
    - {id: a, type: noop}\n\
    - {id: b, type: noop}\n\
    - {id: c, type: noop, depends_on: [a, b]}\n\
    - {id: flaky, type: fail, input: {times: 1, retryable: true}, retry: {max: 2, backoff: {kind: constant, base: 10ms}}}\n";

/// One scrape: `name{label="value",...}` (labels sorted) → value.
struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn parse(text: &str) -> Self {
        let mut samples = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let key = match series.split_once('{') {
                Some((name, labels)) => {
                    let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                    labels.sort_unstable();
                    format!("{name}{{{}}}", labels.join(","))
                }
                None => series.to_owned(),
            };
            if let Ok(value) = value.parse() {
                samples.insert(key, value);
            }
        }
        Self(samples)
    }

    fn get(&self, series: &str) -> Option<f64> {
        self.0.get(series).copied()
    }
}

async fn scrape(url: &str) -> Scrape {
    let response = reqwest::get(url).await.expect("the admin server answers");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    Scrape::parse(&response.text().await.expect("a text body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_an_execution_counts_its_tasks_events_and_workers() {
    let (mut cluster, telemetry) = cluster::start_measured(1).await;
    let admin = trellis_telemetry::admin::spawn(
        "127.0.0.1:0".parse().expect("an address"),
        telemetry,
        cluster.shutdown.child_token(),
    )
    .await
    .expect("the admin server starts");
    let url = format!("http://{admin}/metrics");

    let run = cluster.run(PLAN).await;
    assert_eq!(run.state(), trellis_proto::v1::ExecutionState::Completed);

    // Some series settle a moment after the execution does (the finished count on the next
    // turn, queue depths every 5 s, workers on the heartbeat sweep): wait for them, then check
    // every expected value at once.
    let expected: Vec<(&str, f64)> = vec![
        (
            r#"trellis_tasks_dispatched_total{queue="noop",type="noop"}"#,
            3.0,
        ),
        (
            r#"trellis_tasks_completed_total{queue="noop",type="noop"}"#,
            3.0,
        ),
        (
            r#"trellis_tasks_dispatched_total{queue="fail",type="fail"}"#,
            2.0,
        ),
        (
            r#"trellis_tasks_failed_total{queue="fail",type="fail"}"#,
            1.0,
        ),
        (
            r#"trellis_tasks_completed_total{queue="fail",type="fail"}"#,
            1.0,
        ),
        (
            r#"trellis_task_dispatch_latency_seconds_count{queue="noop"}"#,
            3.0,
        ),
        (
            r#"trellis_task_dispatch_latency_seconds_count{queue="fail"}"#,
            1.0,
        ),
        (
            r#"trellis_task_queue_wait_seconds_count{queue="noop"}"#,
            3.0,
        ),
        (
            r#"trellis_worker_tasks_total{outcome="completed",queue="noop",type="noop"}"#,
            3.0,
        ),
        (
            r#"trellis_worker_tasks_total{outcome="failed",queue="fail",type="fail"}"#,
            1.0,
        ),
        (
            r#"trellis_worker_tasks_total{outcome="completed",queue="fail",type="fail"}"#,
            1.0,
        ),
        (
            r#"trellis_task_duration_seconds_count{outcome="completed",queue="noop",type="noop"}"#,
            3.0,
        ),
        ("trellis_events_appended_total", run.events.len() as f64),
        (
            r#"trellis_executions_started_total{namespace="default"}"#,
            1.0,
        ),
        (
            r#"trellis_executions_finished_total{namespace="default",state="completed"}"#,
            1.0,
        ),
        (
            r#"trellis_grpc_calls_total{code="Ok",method="trellis.v1.Coordinator/StartExecution"}"#,
            1.0,
        ),
        (r#"trellis_queue_depth{queue="noop"}"#, 0.0),
        (r#"trellis_queue_in_flight{queue="noop"}"#, 0.0),
        ("trellis_workers_alive", 1.0),
        ("trellis_worker_slots", 64.0),
        ("trellis_worker_running", 0.0),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let scrape = loop {
        let scrape = scrape(&url).await;
        let wrong: Vec<String> = expected
            .iter()
            .filter(|(series, value)| scrape.get(series) != Some(*value))
            .map(|(series, value)| format!("{series}: {:?}, expected {value}", scrape.get(series)))
            .collect();
        if wrong.is_empty() {
            break scrape;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after the execution, /metrics shows:\n{}\n(all samples: {:#?})",
            wrong.join("\n"),
            scrape.0
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Counted at least once, whatever the timing: heartbeats, appends, the log's ingest side,
    // the results handed to the coordinator (how many share a message varies).
    for series in [
        "trellis_worker_heartbeats_total",
        r#"trellis_worker_result_handoffs_total{answer="done"}"#,
        "trellis_event_append_seconds_count",
        r#"trellis_coordinator_turn_seconds_count{phase="decide"}"#,
        r#"trellis_coordinator_turn_seconds_count{phase="append"}"#,
        r#"trellis_coordinator_turn_seconds_count{phase="effects"}"#,
        r#"trellis_grpc_call_seconds_count{method="trellis.v1.Coordinator/GetExecution"}"#,
    ] {
        assert!(
            scrape.get(series).unwrap_or(0.0) >= 1.0,
            "{series}: {:?}",
            scrape.get(series)
        );
    }
    // Nothing was refused or set aside, and every hand-off was taken.
    assert_eq!(scrape.get("trellis_results_set_aside_total"), None);
    for answer in ["publish", "unanswered", "no_coordinator", "failed"] {
        let series = format!(r#"trellis_worker_result_handoffs_total{{answer="{answer}"}}"#);
        assert_eq!(scrape.get(&series), None, "{series}");
    }
}
