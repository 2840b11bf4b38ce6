//! The admin server as Prometheus, a load balancer and Kubernetes' probes see it.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use trellis_telemetry::Telemetry;
use trellis_telemetry::metrics::Labels1;

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.expect("the admin server answers");
    let status = response.status().as_u16();
    (status, response.text().await.expect("a text body"))
}

async fn grpc_status(addr: std::net::SocketAddr, service: &str) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid address")
        .connect()
        .await
        .expect("gRPC connects to the admin port over plain HTTP/2");
    let mut client = HealthClient::new(channel);
    let response = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .expect("the health check answers");
    response.into_inner().status()
}

#[tokio::test]
async fn metrics_health_and_readiness_are_served_on_one_plain_port() {
    let telemetry = Telemetry::new();
    let tasks: Family<Labels1, Counter> =
        telemetry
            .registry
            .metric("trellis_test_tasks", "Tasks seen.", Family::default);
    tasks
        .get_or_create(&[("queue", "noop".to_owned())])
        .inc_by(3);
    let engine = telemetry.health.component("engine");
    let consumers = telemetry.health.component("consumers");
    let shutdown = CancellationToken::new();
    let addr = trellis_telemetry::admin::spawn(
        "127.0.0.1:0".parse().expect("an address"),
        telemetry.clone(),
        shutdown.clone(),
    )
    .await
    .expect("the admin server starts");
    let base = format!("http://{addr}");

    let (status, metrics) = get(&format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("trellis_test_tasks_total{queue=\"noop\"} 3"),
        "{metrics}"
    );
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");

    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(status, 503);
    assert_eq!(body, "not ready: engine, consumers\n");
    assert_eq!(grpc_status(addr, "").await, ServingStatus::Serving);
    assert_eq!(grpc_status(addr, "ready").await, ServingStatus::NotServing);

    engine.set(true);
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!((status, body.as_str()), (503, "not ready: consumers\n"));
    consumers.set(true);
    assert_eq!(get(&format!("{base}/readyz")).await.0, 200);
    // The gRPC status is published in the background, within moments.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while grpc_status(addr, "ready").await != ServingStatus::Serving {
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness never reached gRPC health"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Stopping: no longer ready, still alive while it drains.
    telemetry.health.stopping().await;
    let (status, body) = get(&format!("{base}/readyz")).await;
    assert_eq!(
        (status, body.as_str()),
        (503, "not ready: the process is stopping\n")
    );
    assert_eq!(grpc_status(addr, "ready").await, ServingStatus::NotServing);
    assert_eq!(grpc_status(addr, "").await, ServingStatus::Serving);

    shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        reqwest::get(format!("{base}/healthz")).await.is_err(),
        "stopped with its shutdown"
    );
}

#[tokio::test]
async fn an_address_in_use_is_refused_with_the_flag_to_change() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = taken.local_addr().expect("its address");
    let err = trellis_telemetry::admin::spawn(addr, Telemetry::new(), CancellationToken::new())
        .await
        .expect_err("the port is taken");
    let message = err.to_string();
    assert!(
        message.contains(&addr.to_string()) && message.contains("--admin-addr"),
        "{message}"
    );
}
