//! A whole Trellis of processes: a private `nats-server -js`, a private PostgreSQL, a
//! checkpoint-store, one or more coordinators and several agent-workers, each service its own
//! `sys-*` process; plus the faults the tests inject (the checks of the outcome are in
//! `outcome.rs`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use prost::Message as _;
use tonic::transport::Channel;
use trellis_proto::subjects;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::{self, ExecutionState};
use trellis_testkit::{NatsServer, Postgres};

use crate::harness::{self, Ready, Service, Spec};
pub use crate::outcome::{Ended, FanoutPlan, check_outcome};

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

    /// Returns a metric of coordinator `idx`'s `/metrics`, summed over its labels (0 when it has
    /// no sample).
    pub async fn coordinator_metric(&self, idx: usize, name: &str) -> anyhow::Result<f64> {
        let text = reqwest::get(format!("http://{}/metrics", self.coordinators[idx].admin))
            .await?
            .text()
            .await?;
        Ok(text
            .lines()
            .filter(|line| line.starts_with(name))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// Reads an execution's log message by message, as stored (a message that is not an event
    /// batch included): `(stream sequence, payload)`.
    pub async fn raw_log(&self, execution_id: &str) -> anyhow::Result<Vec<(u64, bytes::Bytes)>> {
        let js = async_nats::jetstream::new(async_nats::connect(self.nats.url()).await?);
        let stream = js.get_stream(subjects::EVENTS_STREAM).await?;
        let subject = subjects::events(execution_id);
        let last = stream
            .get_last_raw_message_by_subject(&subject)
            .await
            .with_context(|| format!("{subject} is empty"))?
            .sequence;
        let mut messages = Vec::new();
        let mut next = 1;
        while next <= last {
            let message = stream
                .get_first_raw_message_by_subject(&subject, next)
                .await
                .with_context(|| format!("cannot read {subject} from stream sequence {next}"))?;
            next = message.sequence + 1;
            messages.push((message.sequence, message.payload));
        }
        Ok(messages)
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
