//! A monitor that forwards its callers' tokens to a coordinator started with an access file: no
//! token is 401, another namespace's execution is 404 for every read and control (the live
//! projection and the checkpoints included, which the monitor serves itself), and a refused
//! control changes nothing. The monitor's metrics count each of those answers by route.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use trellis_grpc::access::token_digest;
use trellis_grpc::{AccessPolicy, ClientSecurity, ServerSecurity};
use trellis_telemetry::redact::Secret;
use trellis_testkit::NatsServer;

const TOKEN_A: &str = "monitor-team-a-6f0b";
const TOKEN_B: &str = "monitor-team-b-1d93";
const TOKEN_SERVICES: &str = "monitor-services-a27c";

const PLAN: &str = "name: watched\ntasks:\n  - {id: ask, type: question, input: {text: go?}}\n";

async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("its address");
    (listener, addr.to_string())
}

async fn call(method: &str, url: &str, token: Option<&str>) -> (u16, Value) {
    let client = reqwest::Client::new();
    let mut request = match method {
        "POST" => client.post(url).json(&json!({})),
        _ => client.get(url),
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("the monitor answers");
    let status = response.status().as_u16();
    let is_json = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let body = if is_json {
        response.json().await.unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_tokens_keep_each_namespace_to_itself() {
    let access = AccessPolicy::parse(
        &format!(
            "namespaces: {{team-a: {{}}, team-b: {{}}}}\n\
             tokens:\n\
             \x20 - {{name: a, namespace: team-a, sha256: {}}}\n\
             \x20 - {{name: b, namespace: team-b, sha256: {}}}\n\
             \x20 - {{name: services, namespace: \"*\", sha256: {}}}\n",
            token_digest(TOKEN_A),
            token_digest(TOKEN_B),
            token_digest(TOKEN_SERVICES),
        ),
        "access.yaml",
    )
    .map(Arc::new)
    .expect("a valid access file");
    let security = ServerSecurity {
        access: Some(access),
        ..ServerSecurity::default()
    };
    let services = ClientSecurity {
        token: Some(Secret::new(TOKEN_SERVICES)),
        ..ClientSecurity::default()
    };
    let nats = NatsServer::start().expect("a nats-server (apt-get install nats-server)");
    let shutdown = CancellationToken::new();
    let dir = tempfile::tempdir().expect("a temporary directory");

    let (store_listener, store_addr) = listener().await;
    let store_config = trellis_checkpoint_store::Config {
        security: security.clone(),
        ..trellis_checkpoint_store::Config::new(
            format!(
                "sqlite://{}?mode=rwc",
                dir.path().join("store.db").display()
            ),
            nats.url(),
        )
    };
    tokio::spawn(trellis_checkpoint_store::run(
        store_config,
        store_listener,
        shutdown.child_token(),
    ));
    let (coordinator_listener, coordinator_addr) = listener().await;
    let coordinator_config = trellis_coordinator::Config {
        nats: trellis_bus::NatsOptions::new(nats.url()),
        checkpoint_store: Some(format!("http://{store_addr}")),
        security,
        store_client: services.clone(),
        ..trellis_coordinator::Config::default()
    };
    tokio::spawn(trellis_coordinator::run(
        coordinator_config,
        coordinator_listener,
        shutdown.child_token(),
    ));
    let worker_token = shutdown.child_token();
    let worker_config = trellis_agent_worker::Config::new(nats.url());
    tokio::spawn(async move {
        let registry = trellis_agent_worker::HandlerRegistry::with_builtins();
        let _ = trellis_agent_worker::run(worker_config, registry, worker_token).await;
    });
    let (monitor_listener, monitor_addr) = listener().await;
    let monitor_config = trellis_monitor::Config {
        checkpoint_store_url: Some(format!("http://{store_addr}")),
        forward_tokens: true,
        client: services.clone(),
        ..trellis_monitor::Config::new(&nats.url(), &format!("http://{coordinator_addr}"))
    };
    let monitor_metrics = monitor_config.telemetry.registry.clone();
    tokio::spawn(trellis_monitor::run(
        monitor_config,
        monitor_listener,
        shutdown.child_token(),
    ));
    let base = format!("http://{monitor_addr}");

    // Team A starts an execution through the coordinator; it waits at its question.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut coordinator = loop {
        let a = ClientSecurity {
            token: Some(Secret::new(TOKEN_A)),
            ..ClientSecurity::default()
        };
        if let Ok(channel) = a.connect(&format!("http://{coordinator_addr}")).await {
            break trellis_proto::v1::coordinator_client::CoordinatorClient::new(channel);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the coordinator did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let id = coordinator
        .start_execution(trellis_proto::v1::StartExecutionRequest {
            plan_source: Some(
                trellis_proto::v1::start_execution_request::PlanSource::Spec(
                    trellis_proto::v1::PlanSpec {
                        text: PLAN.to_owned(),
                        format: trellis_proto::v1::PlanFormat::Yaml as i32,
                        source_name: "watched.yaml".to_owned(),
                        params: Default::default(),
                    },
                ),
            ),
            options: None,
        })
        .await
        .expect("team A starts its execution")
        .into_inner()
        .execution_id;
    loop {
        let (status, body) =
            call("GET", &format!("{base}/api/executions/{id}"), Some(TOKEN_A)).await;
        if status == 200 && body["execution"]["open_questions"] == json!(1) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the execution never reached its question through the monitor: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (status, config) = call("GET", &format!("{base}/api/config"), None).await;
    assert_eq!((status, &config["token_required"]), (200, &json!(true)));

    let reads = [
        format!("{base}/api/executions"),
        format!("{base}/api/executions/{id}"),
        format!("{base}/api/executions/{id}/plan"),
        format!("{base}/api/executions/{id}/instances"),
        format!("{base}/api/executions/{id}/events"),
        format!("{base}/api/executions/{id}/checkpoints"),
        format!("{base}/api/workers"),
    ];
    // No token: every read is refused.
    for url in &reads {
        let (status, body) = call("GET", url, None).await;
        assert_eq!(status, 401, "{url}: {body}");
    }
    // Team B: its own (empty) list and the workers; team A's execution does not exist.
    for url in &reads {
        let (status, body) = call("GET", url, Some(TOKEN_B)).await;
        let expected = if url.ends_with("/api/executions") || url.ends_with("/workers") {
            200
        } else {
            404
        };
        assert_eq!(status, expected, "{url} as team B: {body}");
        if url.ends_with("/api/executions") {
            assert_eq!(body["executions"], json!([]), "team B sees: {body}");
        }
    }
    let live = |token: &str| format!("{base}/api/executions/{id}/live?access_token={token}");
    assert_eq!(call("GET", &live(TOKEN_B), None).await.0, 404);
    for action in ["pause", "cancel", "retry", "checkpoint"] {
        let url = format!("{base}/api/executions/{id}/{action}");
        let (status, body) = call("POST", &url, Some(TOKEN_B)).await;
        assert_eq!(status, 404, "{action} as team B: {body}");
    }
    // Team A reads everything, the live stream included, and its execution is untouched.
    for url in &reads {
        let (status, body) = call("GET", url, Some(TOKEN_A)).await;
        assert_eq!(status, 200, "{url} as team A: {body}");
    }
    let response = reqwest::get(live(TOKEN_A))
        .await
        .expect("the live stream opens");
    assert_eq!(response.status().as_u16(), 200);
    let scraped = monitor_metrics.encode();
    for line in [
        "trellis_monitor_live_streams 1",
        "trellis_monitor_executions_watched 1",
    ] {
        assert!(
            scraped.lines().any(|l| l == line),
            "no `{line}` while team A watches:\n{scraped}"
        );
    }
    drop(response);
    let (_, body) = call("GET", &format!("{base}/api/executions/{id}"), Some(TOKEN_A)).await;
    assert_eq!(
        body["execution"]["state"],
        json!("waiting_for_human"),
        "{body}"
    );
    let (_, events) = call(
        "GET",
        &format!("{base}/api/executions/{id}/events"),
        Some(TOKEN_A),
    )
    .await;
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .map(|events| events.iter().filter_map(|e| e["kind"].as_str()).collect())
        .unwrap_or_default();
    for control in ["pause_requested", "cancel_requested", "run_started"] {
        assert!(
            !kinds.contains(&control),
            "a refused control was logged: {kinds:?}"
        );
    }
    // Team A's own control goes through.
    let (status, body) = call(
        "POST",
        &format!("{base}/api/executions/{id}/pause"),
        Some(TOKEN_A),
    )
    .await;
    assert_eq!((status, &body["state"]), (200, &json!("paused")), "{body}");

    // Every answer above was counted under its route's pattern, never under an id.
    let scraped = monitor_metrics.encode();
    let requests = |route: &str, method: &str, code: u16| {
        let prefix = format!(
            "trellis_monitor_http_requests_total{{route=\"{route}\",method=\"{method}\",code=\"{code}\"}} "
        );
        scraped
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|count| count.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for (route, method, code, expected) in [
        ("/api/executions/{id}/plan", "GET", 401, 1),
        ("/api/executions/{id}/plan", "GET", 404, 1),
        ("/api/executions/{id}/plan", "GET", 200, 1),
        ("/api/executions/{id}/live", "GET", 404, 1),
        ("/api/executions/{id}/{action}", "POST", 404, 4),
        ("/api/executions/{id}/{action}", "POST", 200, 1),
    ] {
        assert_eq!(
            requests(route, method, code),
            expected,
            "{method} {route} answered {code}:\n{scraped}"
        );
    }
    assert!(
        !scraped.contains(&id),
        "an execution id became a label:\n{scraped}"
    );
    assert!(
        scraped.contains(
            "trellis_monitor_http_request_seconds_count{route=\"/api/executions/{id}/plan\"} 3"
        ),
        "{scraped}"
    );

    shutdown.cancel();
}
