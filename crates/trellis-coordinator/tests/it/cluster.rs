//! A whole Trellis in one test process: a private nats-server, a coordinator on a free port and
//! in-process agent-workers, plus helpers to run plans and read their event logs.

use std::collections::HashMap;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use trellis_agent_worker::HandlerRegistry;
use trellis_grpc::{AuthChannel, ClientSecurity, ServerSecurity};
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::{self, event::Kind};
use trellis_telemetry::Telemetry;
use trellis_testkit::NatsServer;

/// At most two clusters run at once: each is a nats-server plus services, and the machine has two
/// cores; more only makes every test slower and timing-sensitive.
static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// How many messages the stream `name` ever stored (its last sequence).
pub async fn stored(nats: &async_nats::Client, name: &str) -> u64 {
    let js = async_nats::jetstream::new(nats.clone());
    let mut stream = js.get_stream(name).await.expect("the stream exists");
    stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence
}

pub struct Cluster {
    _slot: tokio::sync::SemaphorePermit<'static>,
    pub nats: NatsServer,
    /// A client with [`Setup::client`]'s credentials.
    pub client: CoordinatorClient<AuthChannel>,
    pub shutdown: CancellationToken,
    /// The coordinator's gRPC address.
    pub url: String,
    /// One per worker; aborting one drops the worker mid-flight, like a crash.
    pub workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts NATS, a coordinator and `workers` workers with the built-in handlers, reporting
/// their metrics to the returned telemetry.
pub async fn start_measured(workers: usize) -> (Cluster, Telemetry) {
    let telemetry = Telemetry::new();
    let setup = Setup {
        telemetry: telemetry.clone(),
        ..Setup::default()
    };
    let cluster = start_setup(workers, HandlerRegistry::with_builtins, setup).await;
    (cluster, telemetry)
}

/// Starts NATS, a coordinator and `workers` workers with the built-in handlers.
pub async fn start(workers: usize) -> Cluster {
    start_with(workers, HandlerRegistry::with_builtins).await
}

pub async fn start_with(workers: usize, registry: impl Fn() -> HandlerRegistry) -> Cluster {
    start_setup(workers, registry, Setup::default()).await
}

/// What a test sets beyond the defaults.
#[derive(Default)]
pub struct Setup {
    /// The coordinator's TLS and authentication.
    pub security: ServerSecurity,
    /// The metrics and health the coordinator and the workers report to.
    pub telemetry: Telemetry,
    /// The credentials of [`Cluster::client`].
    pub client: ClientSecurity,
    /// The coordinator's gRPC URL scheme: `https` when `security` has TLS.
    pub https: bool,
    /// The checkpoint-store the coordinator calls, if any.
    pub checkpoint_store: Option<String>,
    /// The workers take no offered assignment: every task comes from the tasks stream.
    pub workers_take_no_offers: bool,
    /// The coordinator's dispatch window, when not its default.
    pub dispatch_window: Option<u32>,
}

/// Starts NATS, a coordinator with `setup` and `workers` workers.
pub async fn start_setup(
    workers: usize,
    registry: impl Fn() -> HandlerRegistry,
    setup: Setup,
) -> Cluster {
    let slot = SLOTS
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .try_init();
    let nats =
        NatsServer::start().expect("a nats-server for the test (apt-get install nats-server)");
    let shutdown = CancellationToken::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let addr = listener.local_addr().expect("bound address");
    let config = trellis_coordinator::Config {
        nats: trellis_bus::NatsOptions::new(nats.url()),
        shards: 1,
        security: setup.security,
        telemetry: setup.telemetry.clone(),
        checkpoint_store: setup.checkpoint_store,
        dispatch_window: setup
            .dispatch_window
            .unwrap_or(trellis_coordinator::turn::DEFAULT_DISPATCH_WINDOW),
        ..trellis_coordinator::Config::default()
    };
    let token = shutdown.child_token();
    tokio::spawn(async move {
        if let Err(err) = trellis_coordinator::run(config, listener, token).await {
            panic!("coordinator failed: {err}");
        }
    });
    let mut handles = Vec::new();
    for i in 0..workers {
        let offers = !setup.workers_take_no_offers;
        handles.push(spawn_worker_tuned(
            &nats.url(),
            &format!("worker-{i}"),
            registry(),
            setup.telemetry.clone(),
            shutdown.child_token(),
            |config| config.offers = offers,
        ));
    }
    let url = if setup.https {
        format!("https://localhost:{}", addr.port())
    } else {
        format!("http://{addr}")
    };
    let mut last_error = String::new();
    for _ in 0..100 {
        match setup.client.connect(&url).await.map(CoordinatorClient::new) {
            Ok(client) => {
                return Cluster {
                    _slot: slot,
                    nats,
                    client,
                    shutdown,
                    url: url.clone(),
                    workers: handles,
                };
            }
            Err(err) => last_error = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the coordinator did not come up at {url}: {last_error}");
}

/// Starts one in-process worker.
pub fn spawn_worker(
    nats_url: &str,
    worker_id: &str,
    registry: HandlerRegistry,
    token: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    spawn_worker_with(nats_url, worker_id, registry, Telemetry::default(), token)
}

/// Starts one in-process worker reporting to `telemetry`.
pub fn spawn_worker_with(
    nats_url: &str,
    worker_id: &str,
    registry: HandlerRegistry,
    telemetry: Telemetry,
    token: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    spawn_worker_tuned(nats_url, worker_id, registry, telemetry, token, |_| {})
}

/// [`spawn_worker_with`], with `tune` applied to the worker's configuration.
pub fn spawn_worker_tuned(
    nats_url: &str,
    worker_id: &str,
    registry: HandlerRegistry,
    telemetry: Telemetry,
    token: CancellationToken,
    tune: impl FnOnce(&mut trellis_agent_worker::Config),
) -> tokio::task::JoinHandle<()> {
    let mut config = trellis_agent_worker::Config::new(nats_url.to_owned());
    config.telemetry = telemetry;
    config.worker_id = Some(worker_id.to_owned());
    config.slots = 64;
    // A worker consumes the queues of every handler it has.
    config.queues = registry.task_types();
    tune(&mut config);
    tokio::spawn(async move {
        if let Err(err) = trellis_agent_worker::run(config, registry, token).await {
            panic!("worker failed: {err}");
        }
    })
}

/// The outcome of a plan run to its end.
pub struct Run {
    pub id: String,
    pub execution: v1::Execution,
    pub events: Vec<v1::Event>,
    pub graph: v1::ExecutionGraph,
}

impl Run {
    pub fn state(&self) -> v1::ExecutionState {
        v1::ExecutionState::try_from(self.execution.state)
            .unwrap_or(v1::ExecutionState::Unspecified)
    }

    /// Asserts the execution completed; the failure message is its reason.
    #[track_caller]
    pub fn assert_completed(&self) {
        assert_eq!(
            self.state(),
            v1::ExecutionState::Completed,
            "{:?}",
            self.execution.reason
        );
    }

    /// The log's first `TaskCompleted`; panics when there is none.
    pub fn first_completed(&self) -> v1::TaskCompleted {
        self.events
            .iter()
            .find_map(|e| match e.kind.as_ref()? {
                Kind::TaskCompleted(c) => Some(c.clone()),
                _ => None,
            })
            .expect("a completion in the log")
    }

    /// Task id of every instance, from the graph.
    pub fn task_of(&self) -> HashMap<String, String> {
        self.graph
            .nodes
            .iter()
            .filter_map(|n| n.record.as_ref())
            .map(|r| (r.task_instance_id.clone(), r.task_id.clone()))
            .collect()
    }

    /// `(task id, "dispatched" | "completed" | "failed" ...)` in log order.
    pub fn timeline(&self) -> Vec<(String, &'static str)> {
        let task_of = self.task_of();
        let name = |id: &str| task_of.get(id).cloned().unwrap_or_else(|| id.to_owned());
        self.events
            .iter()
            .filter_map(|e| match e.kind.as_ref()? {
                Kind::TaskDispatched(d) => Some((name(&d.task_instance_id), "dispatched")),
                Kind::TaskStarted(d) => Some((name(&d.task_instance_id), "started")),
                Kind::TaskCompleted(c) => Some((name(&c.task_instance_id), "completed")),
                Kind::TaskFailed(f) => Some((name(&f.task_instance_id), "failed")),
                Kind::SubtasksSpawned(s) => Some((name(&s.task_instance_id), "spawned")),
                _ => None,
            })
            .collect()
    }

    /// The most task attempts running at once, by the log.
    pub fn max_running(&self, filter: impl Fn(&str) -> bool) -> usize {
        let mut running = 0usize;
        let mut max = 0;
        for (task, what) in self.timeline() {
            if !filter(&task) {
                continue;
            }
            match what {
                "dispatched" => running += 1,
                "started" => {}
                _ => running = running.saturating_sub(1),
            }
            max = max.max(running);
        }
        max
    }

    pub fn count(&self, task: &str, what: &str) -> usize {
        self.timeline()
            .iter()
            .filter(|(t, w)| t == task && *w == what)
            .count()
    }
}

/// The start of the YAML plan `yaml` in `namespace` under idempotency key `key` (each empty:
/// the default, none).
pub fn spec(yaml: &str, namespace: &str, key: &str) -> v1::StartExecutionRequest {
    v1::StartExecutionRequest {
        plan_source: Some(v1::start_execution_request::PlanSource::Spec(
            v1::PlanSpec {
                text: yaml.to_owned(),
                format: v1::PlanFormat::Yaml as i32,
                source_name: "test.yaml".to_owned(),
                params: Default::default(),
            },
        )),
        options: Some(v1::ExecutionOptions {
            namespace: namespace.to_owned(),
            idempotency_key: key.to_owned(),
            ..v1::ExecutionOptions::default()
        }),
    }
}

impl Cluster {
    pub async fn start_plan(&mut self, yaml: &str) -> String {
        let request = spec(yaml, "", "");
        self.client
            .start_execution(request)
            .await
            .expect("execution starts")
            .into_inner()
            .execution_id
    }

    /// Follows the execution to its end (within `timeout`) and collects what it did.
    pub async fn wait(&mut self, id: &str, timeout: Duration) -> Run {
        let observe = async {
            let request = v1::ObserveExecutionRequest {
                execution_id: id.to_owned(),
                from_sequence: 1,
                progress_only: false,
            };
            let mut stream = self
                .client
                .observe_execution(request)
                .await
                .expect("observe")
                .into_inner();
            let mut events = Vec::new();
            while let Some(item) = stream.message().await.expect("event stream") {
                if let Some(event) = item.event {
                    events.push(event);
                }
            }
            events
        };
        let events = tokio::time::timeout(timeout, observe)
            .await
            .unwrap_or_else(|_| panic!("execution {id} did not end within {timeout:?}"));
        let execution = self
            .client
            .get_execution(v1::GetExecutionRequest {
                execution_id: id.to_owned(),
            })
            .await
            .expect("get execution")
            .into_inner()
            .execution
            .expect("execution");
        let graph = self.graph(id).await;
        Run {
            id: id.to_owned(),
            execution,
            events,
            graph,
        }
    }

    pub async fn execution(&mut self, id: &str) -> v1::Execution {
        self.client
            .get_execution(v1::GetExecutionRequest {
                execution_id: id.to_owned(),
            })
            .await
            .expect("get execution")
            .into_inner()
            .execution
            .expect("execution")
    }

    /// Waits until the execution's summary satisfies `condition`.
    pub async fn wait_until(
        &mut self,
        id: &str,
        what: &str,
        condition: impl Fn(&v1::Execution) -> bool,
    ) -> v1::Execution {
        for _ in 0..1200 {
            let execution = self.execution(id).await;
            if condition(&execution) {
                return execution;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("execution {id}: {what} did not happen within 60 s");
    }

    /// The execution graph of `id` (every run), as `GetExecutionGraph` answers it.
    pub async fn graph(&mut self, id: &str) -> v1::ExecutionGraph {
        self.client
            .get_execution_graph(v1::GetExecutionGraphRequest {
                execution_id: id.to_owned(),
                run_number: 0,
            })
            .await
            .expect("graph")
            .into_inner()
            .graph
            .expect("graph")
    }

    pub async fn run(&mut self, yaml: &str) -> Run {
        let id = self.start_plan(yaml).await;
        self.wait(&id, Duration::from_secs(60)).await
    }
}
