//! One execution is one trace: the spans of a plan compiled by the planner, started on the
//! coordinator, dispatched over NATS, run by a worker, whose results come back over NATS, whose
//! log the checkpoint-store ingests and whose checkpoint it stores, all belong to the trace of
//! the client's call, each with the parent it should have. A browser's request to the monitor
//! joins the trace its `traceparent` names, and so do the monitor's calls to the coordinator.
//!
//! Every service runs in this process with a real nats-server; spans go to an in-memory
//! exporter. This is its own test binary: the tracer and the subscriber are process-wide.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use trellis_grpc::ClientSecurity;
use trellis_proto::v1;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::planner_client::PlannerClient;
use trellis_telemetry::propagation;
use trellis_testkit::NatsServer;

const PLAN: &str = "name: traced\ntasks:\n  - {id: first, type: noop}\n  - {id: second, type: noop, depends_on: [first]}\n";

/// Every span the exporter has, by span id.
struct Spans(Vec<SpanData>);

impl Spans {
    fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a SpanData> + 'a {
        self.0.iter().filter(move |span| span.name == name)
    }

    fn one<'a>(&'a self, name: &'a str) -> &'a SpanData {
        let found: Vec<&SpanData> = self.named(name).collect();
        assert_eq!(found.len(), 1, "spans named {name}: {:#?}", self.names());
        found[0]
    }

    fn names(&self) -> Vec<String> {
        self.0.iter().map(|span| span.name.to_string()).collect()
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// Asserts `child` is a span of `trace` whose parent is `parent`.
fn child_of(child: &SpanData, parent: SpanId, trace: TraceId) {
    assert_eq!(
        child.span_context.trace_id(),
        trace,
        "span {} is not in the execution's trace",
        child.name
    );
    assert_eq!(
        child.parent_span_id, parent,
        "span {} has parent {} where {parent} was expected",
        child.name, child.parent_span_id
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_execution_is_one_trace_across_planner_coordinator_worker_and_store() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let otel = propagation::install(&provider, "trellis-test");
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(otel)
        .init();

    let nats = NatsServer::start().expect("a nats-server (apt-get install nats-server)");
    let shutdown = CancellationToken::new();
    let store_dir = tempfile::tempdir().expect("a temporary directory");
    let store_nats = nats.url();
    let store_db = format!(
        "sqlite://{}?mode=rwc",
        store_dir.path().join("store.db").display()
    );
    let store_url = serve(&shutdown, |listener, token| async move {
        let config = trellis_checkpoint_store::Config::new(store_db, store_nats);
        (trellis_checkpoint_store::run(config, listener, token).await).map_err(|e| e.to_string())
    })
    .await;
    let planner_url = serve(&shutdown, |listener, token| async move {
        trellis_planner::run(listener, trellis_planner::Config::default(), token)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let nats_url = nats.url();
    let store = store_url.clone();
    let coordinator_url = serve(&shutdown, |listener, token| async move {
        let config = trellis_coordinator::Config {
            nats: trellis_bus::NatsOptions::new(nats_url),
            checkpoint_store: Some(store),
            ..trellis_coordinator::Config::default()
        };
        trellis_coordinator::run(config, listener, token)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let monitor_nats = nats.url();
    let monitor_coordinator = coordinator_url.clone();
    let monitor_url = serve(&shutdown, |listener, token| async move {
        let config = trellis_monitor::Config::new(&monitor_nats, &monitor_coordinator);
        trellis_monitor::run(config, listener, token)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let mut worker = trellis_agent_worker::Config::new(nats.url());
    worker.worker_id = Some("traced-worker".to_owned());
    let token = shutdown.child_token();
    tokio::spawn(async move {
        let registry = trellis_agent_worker::HandlerRegistry::with_builtins();
        if let Err(err) = trellis_agent_worker::run(worker, registry, token).await {
            panic!("worker failed: {err}");
        }
    });

    // The client: one span around compiling through the planner and starting the execution.
    let client = ClientSecurity::default();
    let root = tracing::info_span!("client.submit");
    let root_context = propagation::context_of(&root);
    let trace = root_context.span().span_context().trace_id();
    let root_id = root_context.span().span_context().span_id();
    let execution_id = async {
        let mut planner = PlannerClient::new(client.connect(&planner_url).await.expect("planner"));
        let compiled = planner
            .compile_plan(v1::CompilePlanRequest {
                spec: Some(v1::PlanSpec {
                    text: PLAN.to_owned(),
                    format: v1::PlanFormat::Yaml as i32,
                    source_name: "traced.yaml".to_owned(),
                    params: Default::default(),
                }),
            })
            .await
            .expect("the plan compiles")
            .into_inner();
        let Some(v1::compile_plan_response::Result::Plan(plan)) = compiled.result else {
            panic!("the planner answered {compiled:?}");
        };
        let mut coordinator =
            CoordinatorClient::new(client.connect(&coordinator_url).await.expect("coordinator"));
        coordinator
            .start_execution(v1::StartExecutionRequest {
                plan_source: Some(v1::start_execution_request::PlanSource::Plan(plan)),
                options: None,
            })
            .await
            .expect("the execution starts")
            .into_inner()
            .execution_id
    }
    .instrument(root.clone())
    .await;
    drop(root);

    let mut coordinator =
        CoordinatorClient::new(client.connect(&coordinator_url).await.expect("coordinator"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let execution = coordinator
            .get_execution(v1::GetExecutionRequest {
                execution_id: execution_id.clone(),
            })
            .await
            .expect("the execution is known")
            .into_inner()
            .execution
            .expect("a summary");
        if execution.state == v1::ExecutionState::Completed as i32 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not completed: {execution:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    coordinator
        .checkpoint_execution(v1::CheckpointExecutionRequest {
            execution_id: execution_id.clone(),
        })
        .await
        .expect("a checkpoint is taken");

    // A browser asks the monitor about the execution, in a trace of its own.
    let browser = tracing::info_span!("browser.get");
    let browser_context = propagation::context_of(&browser);
    let browser_trace = browser_context.span().span_context().trace_id();
    let browser_id = browser_context.span().span_context().span_id();
    let traceparent = propagation::traceparent(&browser_context).expect("a valid span context");
    let execution_url = format!("{monitor_url}/api/executions/{execution_id}");
    loop {
        let status = reqwest::Client::new()
            .get(&execution_url)
            .header(propagation::TRACEPARENT, &traceparent)
            .send()
            .await
            .map(|response| response.status().as_u16());
        if status.as_ref().is_ok_and(|status| *status == 200) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the monitor never answered for the execution: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(browser);

    // The read model takes the log in on its own time: wait for its spans of this execution. A
    // server span may end after the client's span of the same call (the response is on its way
    // before the server's span closes): wait for the store's side of every checkpoint too.
    let spans = loop {
        let _ = provider.force_flush();
        let spans = Spans(exporter.get_finished_spans().expect("the spans so far"));
        let ingested = spans
            .named("events.ingest")
            .any(|span| attribute(span, "execution_id").as_deref() == Some(&execution_id));
        let stored = spans.named("checkpoint.create").all(|checkpoint| {
            spans
                .named("trellis.v1.CheckpointStore/CreateCheckpoint")
                .any(|span| span.parent_span_id == checkpoint.span_context.span_id())
        });
        if ingested && stored {
            break spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the checkpoint-store never ingested the log (ingested: {ingested}) or stored every \
             checkpoint (stored: {stored}); spans: {:?}",
            spans.names()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // The client's call reaches the planner and the coordinator as children of its span.
    let compile = spans.one("trellis.v1.Planner/CompilePlan");
    child_of(compile, root_id, trace);
    let start = spans.one("trellis.v1.Coordinator/StartExecution");
    child_of(start, root_id, trace);
    let start_id = start.span_context.span_id();

    // Each task: dispatched by the coordinator (child of the start), run by the worker (child
    // of its dispatch, across NATS), its result applied by the coordinator (child of the run,
    // across NATS again).
    let of_execution = |name: &'static str| {
        spans
            .named(name)
            .filter(|span| attribute(span, "execution_id").as_deref() == Some(&execution_id))
            .collect::<Vec<_>>()
    };
    let dispatches = of_execution("task.dispatch");
    assert_eq!(
        dispatches.len(),
        2,
        "one dispatch per task: {dispatches:#?}"
    );
    let runs: HashMap<String, &SpanData> = of_execution("task.run")
        .into_iter()
        .map(|span| {
            (
                attribute(span, "task_instance_id").unwrap_or_default(),
                span,
            )
        })
        .collect();
    let results: HashMap<String, &SpanData> = of_execution("task.result")
        .into_iter()
        .map(|span| {
            (
                attribute(span, "task_instance_id").unwrap_or_default(),
                span,
            )
        })
        .collect();
    for dispatch in dispatches {
        child_of(dispatch, start_id, trace);
        let instance = attribute(dispatch, "task_instance_id").expect("an instance id");
        let run = runs
            .get(&instance)
            .unwrap_or_else(|| panic!("no task.run span of {instance}"));
        child_of(run, dispatch.span_context.span_id(), trace);
        assert_eq!(
            attribute(run, "worker_id").as_deref(),
            Some("traced-worker")
        );
        let result = results
            .get(&instance)
            .unwrap_or_else(|| panic!("no task.result span of {instance}"));
        child_of(result, run.span_context.span_id(), trace);
    }

    // The log: each append is a child of the start, and the store's ingestion of a message a
    // child of its append.
    let appends = of_execution("events.append");
    assert!(!appends.is_empty(), "no events.append span");
    for append in &appends {
        child_of(append, start_id, trace);
    }
    for ingest in of_execution("events.ingest") {
        assert!(
            appends
                .iter()
                .any(|append| ingest.parent_span_id == append.span_context.span_id()),
            "events.ingest is not a child of an append: {ingest:#?}"
        );
        assert_eq!(ingest.span_context.trace_id(), trace);
    }

    // The checkpoint: taken in the execution's trace, and the store's side of the call a child
    // of it, across gRPC.
    let checkpoints = of_execution("checkpoint.create");
    assert!(!checkpoints.is_empty(), "no checkpoint.create span");
    for checkpoint in checkpoints {
        child_of(checkpoint, start_id, trace);
        let stored = spans
            .named("trellis.v1.CheckpointStore/CreateCheckpoint")
            .find(|span| span.parent_span_id == checkpoint.span_context.span_id())
            .unwrap_or_else(|| {
                panic!("the store's CreateCheckpoint is not a child of {checkpoint:#?}")
            });
        assert_eq!(stored.span_context.trace_id(), trace);
    }

    // The monitor's request is a child of the browser's span, and its call to the coordinator a
    // child of the request, across gRPC.
    let request = spans
        .named("GET /api/executions/{id}")
        .find(|span| {
            span.parent_span_id == browser_id
                && attribute(span, "http.response.status_code").as_deref() == Some("200")
        })
        .unwrap_or_else(|| {
            panic!(
                "no monitor request answered in the browser's trace: {:?}",
                spans.names()
            )
        });
    child_of(request, browser_id, browser_trace);
    assert_eq!(
        attribute(request, "http.route").as_deref(),
        Some("/api/executions/{id}")
    );
    let asked = spans
        .named("trellis.v1.Coordinator/GetExecution")
        .find(|span| span.parent_span_id == request.span_context.span_id())
        .unwrap_or_else(|| panic!("the coordinator's GetExecution is not a child of {request:#?}"));
    assert_eq!(asked.span_context.trace_id(), browser_trace);

    shutdown.cancel();
}

/// Starts a service on a free port; returns its address.
async fn serve<F, Fut>(shutdown: &CancellationToken, run: F) -> String
where
    F: FnOnce(TcpListener, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("its address");
    let service = run(listener, shutdown.child_token());
    tokio::spawn(async move {
        if let Err(err) = service.await {
            panic!("a service failed: {err}");
        }
    });
    format!("http://{addr}")
}
