//! A whole Trellis of processes: a private `nats-server -js`, a private PostgreSQL, a
//! checkpoint-store, one or more coordinators and several agent-workers, each service its own
//! `sys-*` process; plus the faults the tests inject and the checks they run on the outcome.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use prost::Message as _;
use tonic::transport::Channel;
use trellis_proto::subjects;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::{self, ExecutionState, TaskState, event};
use trellis_testkit::{NatsServer, Postgres};

use crate::harness::{self, Ready, Service, Spec};

/// Result shards of the systems most tests start; every coordinator and worker is started with
/// the same number.
pub const SHARDS: u32 = 2;

/// The coordinators' shard lease TTL: the others take a dead coordinator's shards once it lapses.
pub const LEASE_TTL: Duration = Duration::from_secs(3);

/// How many handlers a worker runs at once.
pub const WORKER_SLOTS: usize = 32;

/// The gRPC service name the coordinator reports healthy once it serves.
const COORDINATOR_SERVICE: &str = "trellis.v1.Coordinator";

/// How long a worker may take to send its first heartbeat (it sends one every two seconds).
const HEARTBEAT_WAIT: Duration = Duration::from_secs(15);

/// A `GetExecutionGraph` of 10,000 instances is a few MiB, past tonic's 4 MiB default.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// One system at a time: each is eight processes on a two-core machine, and the fault tests are
/// timing-sensitive enough without a second one competing.
static SLOT: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// The coordinators' `--id`s, started in this order, each waited for before the next: they
    /// spread the shards between them as they join.
    pub coordinators: Vec<&'static str>,
    /// How many workers, with ids `worker-1`, `worker-2`, ...
    pub workers: usize,
    /// Result shards of every coordinator and worker.
    pub shards: u32,
    /// More flags of every worker.
    pub worker_flags: Vec<(&'static str, String)>,
    /// Create the task stream before any service, with this de-duplication window instead of
    /// the two minutes the services give it: a test of a long task then needs seconds, not
    /// minutes, to reach past the window.
    pub tasks_duplicate_window: Option<Duration>,
    /// More environment of the first coordinator (`TRELLIS_FAILPOINT`).
    pub coordinator_env: Vec<(&'static str, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            coordinators: vec!["coordinator-1"],
            workers: 2,
            shards: SHARDS,
            worker_flags: Vec::new(),
            tasks_duplicate_window: None,
            coordinator_env: Vec::new(),
        }
    }
}

/// A coordinator process (named by its `--id`) and its gRPC address.
#[derive(Debug)]
pub struct Coordinator {
    pub addr: SocketAddr,
    /// Its admin server: `/metrics`, `/readyz`.
    pub admin: SocketAddr,
    pub service: Service,
}

/// A fault the tests inject while an execution runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the coordinator at this index and start it again with the same id and port.
    Coordinator(usize),
    /// SIGKILL the worker at this index and start it again with the same id.
    Worker(usize),
    /// SIGKILL the checkpoint-store and start it again.
    Store,
    /// SIGKILL `nats-server` and start it again on the same port with the same store.
    Nats,
    /// Stop PostgreSQL (fast shutdown, clients cut off) and start it again.
    Postgres,
    /// SIGKILL PostgreSQL's postmaster (as an OOM kill would) and start it again: crash
    /// recovery.
    PostgresKilled,
    /// SIGKILL the monitor and start it again on the same port.
    Monitor,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Coordinator(idx) => write!(f, "SIGKILL + restart of coordinator {idx}"),
            Fault::Worker(idx) => write!(f, "SIGKILL + restart of worker {idx}"),
            Fault::Store => write!(f, "SIGKILL + restart of the checkpoint-store"),
            Fault::Nats => write!(f, "restart of nats-server"),
            Fault::Postgres => write!(f, "restart of PostgreSQL"),
            Fault::PostgresKilled => write!(f, "SIGKILL + restart of PostgreSQL's postmaster"),
            Fault::Monitor => write!(f, "SIGKILL + restart of the monitor"),
        }
    }
}

/// Every process of one system; dropping it kills them all.
#[derive(Debug)]
pub struct System {
    // Field order is drop order: services first, then the servers they talk to.
    pub monitor: Service,
    /// The monitor's HTTP address.
    pub monitor_addr: SocketAddr,
    pub workers: Vec<Service>,
    pub coordinators: Vec<Coordinator>,
    pub store: Service,
    pub store_addr: SocketAddr,
    shards: u32,
    pub postgres: Postgres,
    pub nats: NatsServer,
    /// The services' logs; kept on disk when a test failed.
    logs: Option<tempfile::TempDir>,
    keep_logs: bool,
    _slot: tokio::sync::SemaphorePermit<'static>,
}

impl System {
    /// Starts NATS, PostgreSQL, the checkpoint-store, the coordinators in order, then the workers,
    /// each waited for until it answers (workers: until their first heartbeat).
    pub async fn start(options: Options) -> anyhow::Result<System> {
        let slot = SLOT
            .acquire()
            .await
            .context("the system semaphore is never closed")?;
        let logs = tempfile::Builder::new()
            .prefix("trellis-system-")
            .tempdir()
            .context("failed to create the log directory")?;
        let nats = NatsServer::start().context(
            "failed to start a private nats-server (install it with `apt-get install -y nats-server`)",
        )?;
        let postgres = Postgres::start().context(
            "failed to start a private PostgreSQL (install it with `apt-get install -y postgresql`)",
        )?;
        let database_url = postgres.create_database("trellis")?;
        if let Some(window) = options.tasks_duplicate_window {
            create_task_stream(&nats.url(), window).await?;
        }

        let store_addr = harness::free_addr()?;
        let store = Service::start(
            service_spec(
                "checkpoint-store",
                env!("CARGO_BIN_EXE_sys-checkpoint-store"),
                harness::free_addr()?,
            )
            .flag("--database-url", database_url)
            .flag("--nats-url", nats.url())
            .flag("--listen", store_addr.to_string())
            .ready(Ready::GrpcHealth {
                addr: store_addr,
                service: "",
            }),
            logs.path(),
        )
        .await?;

        let mut coordinators = Vec::new();
        for (idx, id) in options.coordinators.iter().enumerate() {
            let envs: &[(&str, String)] = if idx == 0 {
                &options.coordinator_env
            } else {
                &[]
            };
            coordinators.push(
                start_coordinator(
                    id,
                    &nats.url(),
                    store_addr,
                    options.shards,
                    envs,
                    logs.path(),
                )
                .await?,
            );
        }

        // The monitor reads the log on NATS and asks the first coordinator for lists.
        let monitor_addr = harness::free_addr()?;
        let monitor = Service::start(
            service_spec(
                "monitor",
                env!("CARGO_BIN_EXE_sys-monitor"),
                harness::free_addr()?,
            )
            .flag("--nats-url", nats.url())
            .flag("--listen", monitor_addr.to_string())
            .flag("--coordinator", format!("http://{}", coordinators[0].addr))
            .flag("--checkpoint-store", format!("http://{store_addr}"))
            .ready(Ready::Http {
                addr: monitor_addr,
                path: "/api/health",
            }),
            logs.path(),
        )
        .await?;

        let mut workers = Vec::new();
        for idx in 1..=options.workers {
            let worker_id = format!("worker-{idx}");
            let mut spec = service_spec(
                &worker_id,
                env!("CARGO_BIN_EXE_sys-agent-worker"),
                harness::free_addr()?,
            )
            .flag("--nats-url", nats.url())
            .flag("--worker-id", worker_id.as_str())
            .flag("--queues", "fanout,sleep,noop,steps,shell")
            .flag("--slots", WORKER_SLOTS.to_string())
            .flag("--shards", options.shards.to_string());
            for (flag, value) in &options.worker_flags {
                spec = spec.flag(flag, value);
            }
            let service = Service::start(spec, logs.path()).await?;
            workers.push(service);
        }
        let system = System {
            monitor,
            monitor_addr,
            workers,
            coordinators,
            store,
            store_addr,
            shards: options.shards,
            postgres,
            nats,
            logs: Some(logs),
            keep_logs: false,
            _slot: slot,
        };
        for idx in 0..system.workers.len() {
            system.wait_for_heartbeat(idx).await?;
        }
        Ok(system)
    }

    /// Returns a client of the coordinator at `idx`; it reconnects by itself after a restart.
    pub fn client(&self, idx: usize) -> anyhow::Result<CoordinatorClient<Channel>> {
        let coordinator = self
            .coordinators
            .get(idx)
            .with_context(|| format!("no coordinator {idx}"))?;
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", coordinator.addr))?
                .connect_timeout(Duration::from_secs(1))
                .timeout(Duration::from_secs(10))
                .connect_lazy();
        Ok(CoordinatorClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE))
    }

    /// Injects `fault` and returns once the restarted part answers again.
    pub async fn inject(&mut self, fault: Fault) -> anyhow::Result<()> {
        match fault {
            Fault::Coordinator(idx) => {
                let coordinator = self
                    .coordinators
                    .get_mut(idx)
                    .with_context(|| format!("no coordinator {idx}"))?;
                coordinator.service.kill9()?;
                coordinator.service.restart().await?;
            }
            Fault::Worker(idx) => {
                let worker = self
                    .workers
                    .get_mut(idx)
                    .with_context(|| format!("no worker {idx}"))?;
                worker.kill9()?;
                worker.restart().await?;
                self.wait_for_heartbeat(idx).await?;
            }
            Fault::Store => {
                self.store.kill9()?;
                self.store.restart().await?;
            }
            // The servers' restarts block (they poll with short sleeps); this runtime has other
            // threads for the test's own tasks meanwhile.
            Fault::Nats => tokio::task::block_in_place(|| self.nats.restart())?,
            Fault::Postgres => tokio::task::block_in_place(|| self.postgres.restart())?,
            Fault::PostgresKilled => tokio::task::block_in_place(|| {
                self.postgres.kill();
                self.postgres.restart()
            })?,
            Fault::Monitor => {
                self.monitor.kill9()?;
                self.monitor.restart().await?;
            }
        }
        Ok(())
    }

    /// Starts one more coordinator with this `--id`; returns its index.
    pub async fn add_coordinator(&mut self, id: &str) -> anyhow::Result<usize> {
        let logs = self
            .logs
            .as_ref()
            .context("the log directory lives as long as the system")?
            .path()
            .to_owned();
        let coordinator = start_coordinator(
            id,
            &self.nats.url(),
            self.store_addr,
            self.shards,
            &[],
            &logs,
        )
        .await?;
        self.coordinators.push(coordinator);
        Ok(self.coordinators.len() - 1)
    }

    /// Waits until `GetCluster` through coordinator `idx` shows exactly the coordinators of
    /// `expected`, each holding that many shards, and no shard unheld.
    pub async fn wait_for_balance(
        &self,
        idx: usize,
        expected: &[(&str, usize)],
        within: Duration,
    ) -> anyhow::Result<v1::GetClusterResponse> {
        let deadline = tokio::time::Instant::now() + within;
        let mut client = self.client(idx)?;
        loop {
            let last = match client.get_cluster(v1::GetClusterRequest {}).await {
                Ok(cluster) => {
                    let cluster = cluster.into_inner();
                    let held: BTreeMap<&str, usize> = cluster
                        .coordinators
                        .iter()
                        .map(|c| (c.coordinator_id.as_str(), c.shards.len()))
                        .collect();
                    let want: BTreeMap<&str, usize> = expected.iter().copied().collect();
                    if held == want && cluster.unowned_shards.is_empty() {
                        return Ok(cluster);
                    }
                    format!("held {held:?}, unheld {:?}", cluster.unowned_shards)
                }
                Err(status) => format!("GetCluster failed: {status}"),
            };
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the shards were not spread as {expected:?} within {within:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the coordinator at `idx` with SIGKILL and leaves it dead.
    pub fn kill_coordinator(&mut self, idx: usize) -> anyhow::Result<()> {
        self.coordinators
            .get_mut(idx)
            .with_context(|| format!("no coordinator {idx}"))?
            .service
            .kill9()
    }

    /// Waits for a heartbeat of the worker at `idx`, which proves it is connected and consuming.
    pub async fn wait_for_heartbeat(&self, idx: usize) -> anyhow::Result<()> {
        let worker_id = format!("worker-{}", idx + 1);
        let client = async_nats::connect(self.nats.url()).await?;
        let mut beats = client.subscribe(subjects::heartbeat(&worker_id)).await?;
        let wait = HEARTBEAT_WAIT;
        match tokio::time::timeout(wait, beats.next()).await {
            Ok(Some(_)) => Ok(()),
            _ => {
                let log = self
                    .workers
                    .get(idx)
                    .map(|worker| worker.log_tail(harness::LOG_TAIL_LINES))
                    .unwrap_or_default();
                bail!("no heartbeat of {worker_id} within {wait:?}; its log:\n{log}")
            }
        }
    }

    /// Starts an execution of `yaml` through the coordinator at `idx`; returns its id.
    pub async fn start_plan(&self, idx: usize, yaml: &str) -> anyhow::Result<String> {
        let response = self
            .client(idx)?
            .start_execution(start_request(yaml))
            .await
            .context("StartExecution failed")?;
        Ok(response.into_inner().execution_id)
    }

    /// Polls `GetExecution` at the coordinator `idx` until `condition` holds or `deadline`
    /// passes. Errors (a coordinator restarting, NATS away) are retried; the last one is in the
    /// failure message.
    pub async fn wait_until(
        &self,
        idx: usize,
        execution_id: &str,
        deadline: tokio::time::Instant,
        what: &str,
        condition: impl Fn(&v1::Execution) -> bool,
    ) -> anyhow::Result<v1::Execution> {
        let mut client = self.client(idx)?;
        loop {
            let request = v1::GetExecutionRequest {
                execution_id: execution_id.to_owned(),
            };
            let last = match client.get_execution(request).await {
                Ok(response) => match response.into_inner().execution {
                    Some(execution) if condition(&execution) => return Ok(execution),
                    Some(execution) => describe(&execution),
                    None => "GetExecution answered without an execution".to_owned(),
                },
                Err(status) => format!("GetExecution failed: {status}"),
            };
            if tokio::time::Instant::now() >= deadline {
                bail!("{what} did not happen in time at coordinator {idx}; last seen: {last}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the execution of `plan` ends (asking coordinator `idx`), then checks from its
    /// graph and its log that it lost and doubled nothing ([`check_outcome`]); returns what was
    /// read.
    pub async fn check_end(
        &self,
        idx: usize,
        execution_id: &str,
        plan: &FanoutPlan,
        deadline: tokio::time::Instant,
    ) -> anyhow::Result<Ended> {
        let execution = self
            .wait_until(
                idx,
                execution_id,
                deadline,
                "the end of the execution",
                is_terminal,
            )
            .await?;
        let graph = self.graph(idx, execution_id).await?;
        let events = self.event_log(execution_id).await?;
        check_outcome(plan, &execution, &graph, &events)?;
        Ok(Ended {
            execution,
            graph,
            events,
        })
    }

    /// Injects each fault once `fraction` of the work of `plan` completed (as coordinator 0
    /// reports it); fails when the execution ends before a fault could land.
    pub async fn inject_in_turn(
        &mut self,
        execution_id: &str,
        plan: &FanoutPlan,
        faults: &[(Fault, f64)],
        deadline: tokio::time::Instant,
    ) -> anyhow::Result<()> {
        for &(fault, fraction) in faults {
            let threshold = (plan.n_completed() as f64 * fraction) as u64;
            let execution = self
                .wait_until(
                    0,
                    execution_id,
                    deadline,
                    &format!("{threshold} completed instances before the {fault}"),
                    |execution| completed(execution) >= threshold || is_terminal(execution),
                )
                .await?;
            anyhow::ensure!(
                !is_terminal(&execution),
                "the execution ended before the {fault} could be injected ({}); the faults must \
                 land while it runs, so make the subtasks slower",
                describe(&execution)
            );
            eprintln!(
                "injecting the {fault} at {} completed instances",
                completed(&execution)
            );
            self.inject(fault).await?;
        }
        Ok(())
    }

    /// The monitor's view of an execution: the `execution` of the first frame of its live stream,
    /// rebuilt by the monitor from the event log.
    pub async fn monitor_view(&self, execution_id: &str) -> anyhow::Result<serde_json::Value> {
        let url = format!(
            "http://{}/api/executions/{execution_id}/live?records=0",
            self.monitor_addr
        );
        let response = reqwest::get(&url)
            .await
            .with_context(|| format!("the monitor does not answer at {url}"))?;
        anyhow::ensure!(
            response.status().is_success(),
            "the monitor answered {} for {url}",
            response.status()
        );
        let mut body = response.bytes_stream();
        let mut text = String::new();
        while !text.contains("\n\n") {
            let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
                .await
                .context("the monitor sent no snapshot within 10 s")?
                .context("the live stream ended before its snapshot")??;
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        let data = text
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .context("the snapshot frame has no data")?;
        let snapshot: serde_json::Value = serde_json::from_str(data)?;
        Ok(snapshot["execution"].clone())
    }

    /// Returns the execution graph from the coordinator at `idx`.
    pub async fn graph(
        &self,
        idx: usize,
        execution_id: &str,
    ) -> anyhow::Result<v1::ExecutionGraph> {
        self.client(idx)?
            .get_execution_graph(v1::GetExecutionGraphRequest {
                execution_id: execution_id.to_owned(),
                run_number: 0,
            })
            .await
            .context("GetExecutionGraph failed")?
            .into_inner()
            .graph
            .context("GetExecutionGraph answered without a graph")
    }

    /// Reads the execution's whole event log from JetStream (`trellis.events.<id>`).
    pub async fn event_log(&self, execution_id: &str) -> anyhow::Result<Vec<v1::Event>> {
        use async_nats::jetstream::consumer::{DeliverPolicy, pull};
        let client = async_nats::connect(self.nats.url()).await?;
        let js = async_nats::jetstream::new(client);
        let stream = js
            .get_stream(subjects::EVENTS_STREAM)
            .await
            .context("cannot open the events stream")?;
        let subject = subjects::events(execution_id);
        let consumer = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: subject.clone(),
                deliver_policy: DeliverPolicy::All,
                ..pull::OrderedConfig::default()
            })
            .await
            .context("cannot read the event log")?;
        let mut messages = consumer.messages().await?;
        let mut events = Vec::new();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .with_context(|| format!("{subject} stopped delivering"))?
                .with_context(|| format!("{subject} ended"))??;
            let batch = v1::EventBatch::decode(message.payload.as_ref())
                .with_context(|| format!("a message on {subject} is not an EventBatch"))?;
            events.extend(batch.events);
            let pending = message
                .info()
                .map_err(|error| anyhow::anyhow!("no JetStream info on {subject}: {error}"))?
                .pending;
            if pending == 0 {
                return Ok(events);
            }
        }
    }

    /// Prints the tail of every log (services, nats-server, PostgreSQL) and keeps the log
    /// directory, for a test that failed.
    pub fn dump_logs(&mut self) {
        self.keep_logs = true;
        let mut services: Vec<&Service> = vec![&self.store];
        services.extend(
            self.coordinators
                .iter()
                .map(|coordinator| &coordinator.service),
        );
        services.extend(self.workers.iter());
        for service in services {
            eprintln!(
                "----- {} ({}) -----\n{}",
                service.name(),
                service.log_path().display(),
                service.log_tail(harness::LOG_TAIL_LINES)
            );
        }
        for (name, path) in [
            ("nats-server", self.nats.log_path()),
            ("postgres", self.postgres.log_path()),
        ] {
            eprintln!(
                "----- {name} -----\n{}",
                harness::tail(&path, harness::LOG_TAIL_LINES)
            );
        }
    }

    /// Runs `scenario`, and when it fails prints every log before returning its error.
    pub async fn run<F>(mut self, scenario: F) -> anyhow::Result<()>
    where
        F: AsyncFnOnce(&mut System) -> anyhow::Result<()>,
    {
        let result = scenario(&mut self).await;
        if let Err(error) = &result {
            eprintln!("system test failed: {error:#}");
            self.dump_logs();
        }
        result
    }
}

impl Drop for System {
    fn drop(&mut self) {
        if (self.keep_logs || std::thread::panicking())
            && let Some(logs) = self.logs.take()
        {
            let path: PathBuf = logs.keep();
            eprintln!("service logs kept in {}", path.display());
        }
    }
}

/// A spec of a service binary with the log level of the test run (`RUST_LOG`, default `info`).
impl System {
    /// Checks that coordinator `idx` answers `/readyz` on its admin port as `ready` says (200, or
    /// 503 naming the coordinator), within a few seconds.
    pub async fn expect_ready(&self, idx: usize, ready: bool) -> anyhow::Result<()> {
        let coordinator = self
            .coordinators
            .get(idx)
            .ok_or_else(|| anyhow::anyhow!("no coordinator {idx}"))?;
        let url = format!("http://{}/readyz", coordinator.admin);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let response = reqwest::get(&url).await?;
            let status = response.status().as_u16();
            let body = response.text().await?;
            let as_expected = if ready {
                status == 200
            } else {
                status == 503 && body.contains("coordinator")
            };
            if as_expected {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "coordinator {idx} should {}be ready; GET /readyz answered {status} {body:?}",
                if ready { "" } else { "not " }
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Creates the task stream as the services would, but with a de-duplication window of `window`.
async fn create_task_stream(nats_url: &str, window: Duration) -> anyhow::Result<()> {
    use async_nats::jetstream::stream;
    let js = async_nats::jetstream::new(async_nats::connect(nats_url).await?);
    js.create_stream(stream::Config {
        name: subjects::TASKS_STREAM.to_owned(),
        subjects: vec![subjects::TASKS_WILDCARD.to_owned()],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        duplicate_window: window,
        ..Default::default()
    })
    .await
    .context("cannot create the task stream")?;
    Ok(())
}

/// Starts a coordinator process with this `--id` and waits until it serves.
async fn start_coordinator(
    id: &str,
    nats_url: &str,
    store_addr: SocketAddr,
    shards: u32,
    envs: &[(&str, String)],
    logs: &std::path::Path,
) -> anyhow::Result<Coordinator> {
    let addr = harness::free_addr()?;
    let admin = harness::free_addr()?;
    let mut spec = service_spec(id, env!("CARGO_BIN_EXE_sys-coordinator"), admin);
    for (key, value) in envs {
        spec = spec.env(key, value);
    }
    let service = Service::start(
        spec.flag("--nats-url", nats_url)
            .flag("--listen", addr.to_string())
            .flag("--shards", shards.to_string())
            .flag("--id", id)
            .flag("--checkpoint-store", format!("http://{store_addr}"))
            .flag("--lease-ttl", format!("{}s", LEASE_TTL.as_secs()))
            .ready(Ready::GrpcHealth {
                addr,
                service: COORDINATOR_SERVICE,
            }),
        logs,
    )
    .await?;
    Ok(Coordinator {
        addr,
        admin,
        service,
    })
}

/// A service process with its admin server (metrics, health) on `admin`: several services of
/// one kind run on this host, so none may take its default admin port.
fn service_spec(name: &str, binary: &str, admin: SocketAddr) -> Spec {
    let log_level = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned());
    Spec::new(name, binary)
        .env("RUST_LOG", log_level)
        .flag("--admin-addr", admin.to_string())
}

/// Returns a `StartExecution` request for the plan `yaml`.
pub fn start_request(yaml: &str) -> v1::StartExecutionRequest {
    v1::StartExecutionRequest {
        plan_source: Some(v1::start_execution_request::PlanSource::Spec(
            v1::PlanSpec {
                text: yaml.to_owned(),
                format: v1::PlanFormat::Yaml as i32,
                source_name: "system-test.yaml".to_owned(),
                params: Default::default(),
            },
        )),
        options: None,
    }
}

/// One line about an execution for failure messages.
pub fn describe(execution: &v1::Execution) -> String {
    let counts = execution.counts.unwrap_or_default();
    format!(
        "state {:?}, {} completed, {} running, {} queued, {} waiting for subtasks, {} failed, reason {:?}",
        execution.state(),
        counts.completed,
        counts.running,
        counts.queued,
        counts.waiting_for_subtasks,
        counts.failed,
        execution.reason
    )
}

/// Returns whether the execution has ended, whichever way.
pub fn is_terminal(execution: &v1::Execution) -> bool {
    matches!(
        execution.state(),
        ExecutionState::Completed | ExecutionState::Failed | ExecutionState::Cancelled
    )
}

/// Returns how many instances have completed.
pub fn completed(execution: &v1::Execution) -> u64 {
    execution
        .counts
        .as_ref()
        .map(|counts| counts.completed)
        .unwrap_or(0)
}

/// An execution that ended, as [`System::check_end`] read it.
#[derive(Debug)]
pub struct Ended {
    pub execution: v1::Execution,
    pub graph: v1::ExecutionGraph,
    pub events: Vec<v1::Event>,
}

/// The plan of the fault tests: `parents` plan tasks of type `fanout`, each spawning a group of
/// `members` `sleep` subtasks.
#[derive(Debug, Clone, Copy)]
pub struct FanoutPlan {
    pub parents: usize,
    pub members: usize,
    /// How long each subtask sleeps: the run must last long enough for the faults to land in it.
    pub member_ms: u64,
}

impl FanoutPlan {
    /// Returns the plan's YAML.
    pub fn yaml(&self) -> String {
        let mut yaml = String::from("name: system-faults\ntasks:\n");
        for idx in 0..self.parents {
            yaml.push_str(&format!(
                "- {{id: fan-{idx}, type: fanout, input: {{count: {}, child: {{type: sleep, input: {{ms: {}}}}}}}}}\n",
                self.members, self.member_ms
            ));
        }
        yaml
    }

    /// Returns how many subtasks the execution runs in all.
    pub fn n_members(&self) -> usize {
        self.parents * self.members
    }

    /// Returns how many instances complete in a good run: every member, each parent, and each
    /// parent's one resumed instance.
    pub fn n_completed(&self) -> u64 {
        (self.n_members() + 2 * self.parents) as u64
    }
}

/// Checks a finished execution of `plan` lost nothing and doubled nothing: from the graph, every
/// member and every resumed parent completed and each group resumed its parent exactly once; from
/// the event log, no gaps or repeats in the sequence, and exactly one `TaskCompleted` for each
/// member and resumed parent of the graph and for nothing else.
/// Reports every violation at once.
pub fn check_outcome(
    plan: &FanoutPlan,
    execution: &v1::Execution,
    graph: &v1::ExecutionGraph,
    events: &[v1::Event],
) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    if execution.state() != ExecutionState::Completed {
        problems.push(format!(
            "the execution did not complete: {}",
            describe(execution)
        ));
    }

    // The graph. Its root record stands for the execution; the root's group holds the plan
    // tasks' first instances (here the fanout parents), the other groups are the spawned ones.
    let root_idx = graph.root_indices.first().copied();
    let root_group = root_idx
        .and_then(|idx| graph.nodes.get(idx as usize))
        .and_then(|root| match root.next {
            Some(v1::graph_node::Next::GroupIndex(group_idx)) => {
                graph.groups.get(group_idx as usize)
            }
            _ => None,
        })
        .map(|group| group.group_id.as_str());
    if root_group.is_none() {
        problems.push("the graph has no root whose group holds the plan tasks".to_owned());
    }
    let records: Vec<&v1::TaskInstance> = graph
        .nodes
        .iter()
        .enumerate()
        .filter(|(idx, _)| Some(*idx as u32) != root_idx)
        .filter_map(|(_, node)| node.record.as_ref())
        .collect();
    let mut n_plan_tasks = 0;
    let mut members_by_group: HashMap<&str, usize> = HashMap::new();
    let mut resumed_by_group: HashMap<&str, usize> = HashMap::new();
    let mut not_completed: BTreeMap<String, usize> = BTreeMap::new();
    // Members and resumed parents end with a `TaskCompleted` of their own; a parent that spawned
    // a group completes through its resumed instance instead.
    let mut completed_by_a_worker: HashSet<&str> = HashSet::new();
    for record in &records {
        match record.subtask_group_id.as_deref() {
            Some(group) if Some(group) == root_group => n_plan_tasks += 1,
            Some(group) => {
                *members_by_group.entry(group).or_default() += 1;
                completed_by_a_worker.insert(&record.task_instance_id);
            }
            None => {}
        }
        if let Some(group) = record.resumed_after_subtasks_group_id.as_deref() {
            *resumed_by_group.entry(group).or_default() += 1;
            completed_by_a_worker.insert(&record.task_instance_id);
        }
        if record.state() != TaskState::Completed {
            *not_completed
                .entry(format!("{:?}", record.state()))
                .or_default() += 1;
        }
    }
    if n_plan_tasks != plan.parents {
        problems.push(format!(
            "the graph has {n_plan_tasks} plan task instances, the plan has {}",
            plan.parents
        ));
    }
    let n_members: usize = members_by_group.values().sum();
    if n_members != plan.n_members() {
        problems.push(format!(
            "the graph has {n_members} subtasks, the plan spawns {}",
            plan.n_members()
        ));
    }
    if members_by_group.len() != plan.parents {
        problems.push(format!(
            "the graph has {} subtask groups, the plan spawns {}",
            members_by_group.len(),
            plan.parents
        ));
    }
    for (group, n) in &members_by_group {
        if *n != plan.members {
            problems.push(format!(
                "group {group} has {n} members, not {}",
                plan.members
            ));
        }
        match resumed_by_group.get(group) {
            Some(1) => {}
            Some(n) => problems.push(format!("group {group} resumed its parent {n} times")),
            None => problems.push(format!("group {group} never resumed its parent")),
        }
    }
    for group in resumed_by_group.keys() {
        if !members_by_group.contains_key(group) {
            problems.push(format!(
                "an instance resumed after {group}, a group with no members"
            ));
        }
    }
    if !not_completed.is_empty() {
        problems.push(format!(
            "instances not completed, by state: {not_completed:?}"
        ));
    }
    let completed_in_graph: HashSet<&str> = records
        .iter()
        .filter(|record| record.state() == TaskState::Completed)
        .map(|record| record.task_instance_id.as_str())
        .collect();
    if completed_in_graph.len() as u64 != plan.n_completed() {
        problems.push(format!(
            "{} instances completed, a good run completes {}",
            completed_in_graph.len(),
            plan.n_completed()
        ));
    }

    // The event log.
    let mut completions: HashMap<&str, usize> = HashMap::new();
    let mut spawns: HashMap<&str, usize> = HashMap::new();
    let mut sequence_problems = Vec::new();
    for (idx, event) in events.iter().enumerate() {
        let expected = idx as u64 + 1;
        if event.sequence != expected && sequence_problems.len() < 5 {
            sequence_problems.push(format!(
                "event {idx} has sequence {}, expected {expected}",
                event.sequence
            ));
        }
        match &event.kind {
            Some(event::Kind::TaskCompleted(completed)) => {
                *completions.entry(&completed.task_instance_id).or_default() += 1;
            }
            Some(event::Kind::SubtasksSpawned(spawned)) => {
                *spawns.entry(&spawned.task_instance_id).or_default() += 1;
            }
            _ => {}
        }
    }
    if events.is_empty() {
        problems.push("the event log is empty".to_owned());
    }
    if !sequence_problems.is_empty() {
        problems.push(format!(
            "the event log has gaps or repeats: {}",
            sequence_problems.join("; ")
        ));
    }
    let twice: Vec<(&&str, &usize)> = completions.iter().filter(|(_, n)| **n > 1).collect();
    if !twice.is_empty() {
        problems.push(format!(
            "{} instances have more than one TaskCompleted in the log, e.g. {:?}",
            twice.len(),
            twice.iter().take(3).collect::<Vec<_>>()
        ));
    }
    let logged: HashSet<&str> = completions.keys().copied().collect();
    if logged != completed_by_a_worker {
        problems.push(format!(
            "the log completes {} instances, the graph has {} members and resumed parents ({} only in the log, {} only in the graph)",
            logged.len(),
            completed_by_a_worker.len(),
            logged.difference(&completed_by_a_worker).count(),
            completed_by_a_worker.difference(&logged).count()
        ));
    }
    if spawns.len() != plan.parents || spawns.values().any(|n| *n != 1) {
        problems.push(format!(
            "the log has SubtasksSpawned from {} instances ({} in all), expected one from each of {} parents",
            spawns.len(),
            spawns.values().sum::<usize>(),
            plan.parents
        ));
    }
    match events.last().and_then(|event| event.kind.as_ref()) {
        Some(event::Kind::ExecutionFinished(_)) => {}
        other => problems.push(format!(
            "the log does not end with ExecutionFinished but with {other:?}"
        )),
    }

    if problems.is_empty() {
        Ok(())
    } else {
        bail!(
            "the execution lost or doubled work:\n- {}",
            problems.join("\n- ")
        )
    }
}

mod tests {
    use super::*;

    /// What the check reads: the execution, its graph and its log.
    type Run = (v1::Execution, v1::ExecutionGraph, Vec<v1::Event>);

    const PLAN: FanoutPlan = FanoutPlan {
        parents: 2,
        members: 3,
        member_ms: 0,
    };

    fn record(id: String, state: TaskState) -> v1::TaskInstance {
        v1::TaskInstance {
            task_instance_id: id,
            state: state as i32,
            ..v1::TaskInstance::default()
        }
    }

    fn node(record: v1::TaskInstance, next: Option<v1::graph_node::Next>) -> v1::GraphNode {
        v1::GraphNode {
            record: Some(record),
            next,
        }
    }

    fn event(kind: event::Kind) -> v1::Event {
        v1::Event {
            kind: Some(kind),
            ..v1::Event::default()
        }
    }

    fn completed_event(id: &str) -> v1::Event {
        event(event::Kind::TaskCompleted(v1::TaskCompleted {
            task_instance_id: id.to_owned(),
            ..v1::TaskCompleted::default()
        }))
    }

    /// A good run of `PLAN`: its execution, graph and log.
    fn good_run() -> Run {
        let mut nodes = vec![node(
            record("root".to_owned(), TaskState::Completed),
            Some(v1::graph_node::Next::GroupIndex(0)),
        )];
        let mut groups = vec![v1::GraphGroup {
            group_id: "plan".to_owned(),
            ..v1::GraphGroup::default()
        }];
        let mut events = vec![event(event::Kind::ExecutionStarted(
            v1::ExecutionStarted::default(),
        ))];
        for parent in 0..PLAN.parents {
            let group = format!("g{parent}");
            let group_idx = groups.len() as u32;
            groups[0].node_indices.push(nodes.len() as u32);
            let mut parent_record = record(format!("p{parent}"), TaskState::Completed);
            parent_record.subtask_group_id = Some("plan".to_owned());
            nodes.push(node(
                parent_record,
                Some(v1::graph_node::Next::GroupIndex(group_idx)),
            ));
            events.push(event(event::Kind::SubtasksSpawned(v1::SubtasksSpawned {
                task_instance_id: format!("p{parent}"),
                ..v1::SubtasksSpawned::default()
            })));
            let mut spawned = v1::GraphGroup {
                group_id: group.clone(),
                ..v1::GraphGroup::default()
            };
            for member in 0..PLAN.members {
                let id = format!("m{parent}-{member}");
                let mut member_record = record(id.clone(), TaskState::Completed);
                member_record.subtask_group_id = Some(group.clone());
                spawned.node_indices.push(nodes.len() as u32);
                nodes.push(node(member_record, None));
                events.push(completed_event(&id));
            }
            let mut resumed = record(format!("r{parent}"), TaskState::Completed);
            resumed.resumed_after_subtasks_group_id = Some(group);
            spawned.next_node_index = Some(nodes.len() as u32);
            nodes.push(node(resumed, None));
            events.push(completed_event(&format!("r{parent}")));
            groups.push(spawned);
        }
        events.push(event(event::Kind::ExecutionFinished(
            v1::ExecutionFinished::default(),
        )));
        for (idx, event) in events.iter_mut().enumerate() {
            event.sequence = idx as u64 + 1;
        }
        let execution = v1::Execution {
            state: ExecutionState::Completed as i32,
            ..v1::Execution::default()
        };
        let graph = v1::ExecutionGraph {
            nodes,
            groups,
            root_indices: vec![0],
        };
        (execution, graph, events)
    }

    /// Runs the check and returns its complaint, empty when it found none.
    fn complaint(run: &Run) -> String {
        check_outcome(&PLAN, &run.0, &run.1, &run.2)
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_good_run_passes_the_check() {
        assert_eq!(complaint(&good_run()), "");
    }

    #[test]
    fn the_check_catches_lost_and_doubled_work() {
        let check = |what: &str, spoil: &dyn Fn(&mut Run), expected: &str| {
            let mut run = good_run();
            spoil(&mut run);
            let complaint = complaint(&run);
            assert!(complaint.contains(expected), "{what}: {complaint:?}");
        };
        check(
            "a second resumed parent",
            &|run| {
                let mut again = record("r0-again".to_owned(), TaskState::Completed);
                again.resumed_after_subtasks_group_id = Some("g0".to_owned());
                run.1.nodes.push(node(again, None));
                run.2.push(completed_event("r0-again"));
            },
            "resumed its parent 2 times",
        );
        check(
            "a lost member",
            &|run| {
                let lost = run.1.nodes.iter_mut().find_map(|node| {
                    node.record
                        .as_mut()
                        .filter(|record| record.task_instance_id == "m1-2")
                });
                if let Some(lost) = lost {
                    lost.state = TaskState::Running as i32;
                }
                run.2.retain(|event| match &event.kind {
                    Some(event::Kind::TaskCompleted(completed)) => {
                        completed.task_instance_id != "m1-2"
                    }
                    _ => true,
                });
            },
            "instances not completed",
        );
        check(
            "a completion logged twice",
            &|run| {
                let last = run.2.len() - 1;
                run.2.insert(last, completed_event("m0-0"));
            },
            "more than one TaskCompleted",
        );
        check(
            "a repeated sequence",
            &|run| run.2[3].sequence = 3,
            "gaps or repeats",
        );
        check(
            "an execution that failed",
            &|run| run.0.state = ExecutionState::Failed as i32,
            "did not complete",
        );
    }
}
