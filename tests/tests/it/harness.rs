//! Trellis services as processes: spawn one of the `sys-*` binaries with its flags and
//! environment, its output appended to a log file, wait until it answers, SIGKILL it, start it
//! again with the same flags (same port, same identity). Dropping a [`Service`] kills it.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// How long a service may take from spawn to answering.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How many log lines a failure report shows per service.
pub const LOG_TAIL_LINES: usize = 60;

/// When a service counts as started.
#[derive(Debug, Clone)]
pub enum Ready {
    /// `grpc.health.v1.Health/Check` of `service` at `addr` answers `SERVING` (`""` is the server
    /// as a whole).
    GrpcHealth {
        addr: SocketAddr,
        service: &'static str,
    },
    /// `GET path` at `addr` answers 200.
    Http {
        addr: SocketAddr,
        path: &'static str,
    },
    /// The process runs; the caller waits for whatever proves it works (a worker's heartbeat).
    Spawned,
}

/// What to run: a binary, its flags and environment, and how to tell it is up.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Name in logs and failure reports, also the log file's stem: `coordinator-a`, `worker-1`.
    pub name: String,
    pub binary: PathBuf,
    pub args: Vec<OsString>,
    pub envs: Vec<(OsString, OsString)>,
    pub ready: Ready,
}

impl Spec {
    /// Returns a spec of `binary` with no flags, ready once spawned.
    pub fn new(name: impl Into<String>, binary: impl Into<PathBuf>) -> Spec {
        Spec {
            name: name.into(),
            binary: binary.into(),
            args: Vec::new(),
            envs: Vec::new(),
            ready: Ready::Spawned,
        }
    }

    /// Adds a flag and its value.
    pub fn flag(mut self, flag: &str, value: impl Into<OsString>) -> Spec {
        self.args.push(flag.into());
        self.args.push(value.into());
        self
    }

    /// Sets an environment variable of the process.
    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Spec {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Sets how to tell the service is up.
    pub fn ready(mut self, ready: Ready) -> Spec {
        self.ready = ready;
        self
    }
}

/// One service process, started again on demand with the same spec.
#[derive(Debug)]
pub struct Service {
    spec: Spec,
    log_path: PathBuf,
    child: Option<Child>,
    /// How many times it was spawned.
    starts: u32,
}

impl Service {
    /// Spawns the service, its output appended to `<log_dir>/<name>.log`, and waits until it is
    /// ready.
    pub async fn start(spec: Spec, log_dir: &Path) -> anyhow::Result<Service> {
        let log_path = log_dir.join(format!("{}.log", spec.name));
        let mut service = Service {
            spec,
            log_path,
            child: None,
            starts: 0,
        };
        service.spawn()?;
        service.wait_ready().await?;
        Ok(service)
    }

    /// Returns the name given in the spec.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Returns the log file, which keeps the output of every start.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Returns the process id, or `None` when the service is not running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Returns whether the process runs; reaps it when it has exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// Drops an environment variable from the spec, for the next start.
    pub fn remove_env(&mut self, key: &str) {
        self.spec.envs.retain(|(k, _)| k != key);
    }

    /// Kills the process with SIGKILL (no shutdown, no flush, nothing) and reaps it.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("{} is not running, there is nothing to kill", self.name());
        };
        // `Child::kill` is SIGKILL on Unix. It fails only when the child was already reaped,
        // which `take` above rules out; an exited but unreaped child is reaped by `wait`.
        let _ = child.kill();
        child
            .wait()
            .with_context(|| format!("failed to reap {}", self.spec.name))?;
        self.note("killed with SIGKILL by the test")?;
        Ok(())
    }

    /// Starts the service again with the same flags and environment (so the same port and
    /// identity), killing it first with SIGKILL if it still runs, and waits until it is ready.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.is_running() {
            self.kill9()?;
        }
        self.spawn()?;
        self.wait_ready().await
    }

    /// Returns the last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log_path, n)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        self.note(&format!(
            "start {} of {} {}",
            self.starts,
            self.spec.binary.display(),
            self.spec
                .args
                .iter()
                .map(|arg| arg.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        ))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("failed to open {}", self.log_path.display()))?;
        let log_err = log.try_clone().context("failed to share the log file")?;
        let child = Command::new(&self.spec.binary)
            .args(&self.spec.args)
            .envs(self.spec.envs.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("failed to spawn {}", self.spec.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the spec's readiness holds; fails with the log's tail when the process exits
    /// first or the deadline passes.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child
                    .try_wait()
                    .with_context(|| format!("failed to poll {}", self.spec.name))?
            {
                self.child = None;
                bail!(
                    "{} exited with {status} before it was ready; its log:\n{}",
                    self.spec.name,
                    self.log_tail(LOG_TAIL_LINES)
                );
            }
            let last_error = match &self.spec.ready {
                Ready::Spawned => return Ok(()),
                Ready::GrpcHealth { addr, service } => match health(*addr, service).await {
                    Ok(()) => return Ok(()),
                    Err(error) => format!("{error:#}"),
                },
                Ready::Http { addr, path } => {
                    match reqwest::get(format!("http://{addr}{path}")).await {
                        Ok(response) if response.status().is_success() => return Ok(()),
                        Ok(response) => format!("GET {path} answered {}", response.status()),
                        Err(error) => format!("GET {path}: {error}"),
                    }
                }
            };
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "{} was not ready within {READY_TIMEOUT:?} (last check: {last_error}); its log:\n{}",
                    self.spec.name,
                    self.log_tail(LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Appends a line of the test's own to the log, so restarts and kills read in place.
    fn note(&self, what: &str) -> anyhow::Result<()> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("failed to open {}", self.log_path.display()))?;
        writeln!(log, "===== test: {what} =====")
            .with_context(|| format!("failed to write {}", self.log_path.display()))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Errors mean the child is already gone, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Asks `grpc.health.v1.Health/Check` for `service` at `addr`; succeeds only on `SERVING`.
pub async fn health(addr: SocketAddr, service: &str) -> anyhow::Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .with_context(|| format!("health check of {service:?} at {addr} failed"))?
        .into_inner();
    if response.status != ServingStatus::Serving as i32 {
        bail!("{service:?} at {addr} is {:?}", response.status());
    }
    Ok(())
}

/// Returns the last `n` lines of a file (empty when it cannot be read).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Returns a loopback address on a port that was free a moment ago.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(SocketAddr::from((
        [127, 0, 0, 1],
        trellis_testkit::free_port()?,
    )))
}

mod tests {
    use super::*;

    #[tokio::test]
    async fn a_service_that_exits_at_once_is_reported_with_its_log() -> anyhow::Result<()> {
        let logs = tempfile::tempdir()?;
        // A monitor given a flush interval out of range refuses to start, naming the flag.
        let addr = free_addr()?;
        let spec = Spec::new("monitor", env!("CARGO_BIN_EXE_sys-monitor"))
            .flag("--flush-ms", "0")
            .ready(Ready::Http {
                addr,
                path: "/api/health",
            });
        let error = Service::start(spec, logs.path())
            .await
            .err()
            .map(|error| format!("{error:#}"))
            .unwrap_or_default();
        assert!(error.contains("exited with"), "{error}");
        assert!(error.contains("--flush-ms"), "{error}");
        Ok(())
    }

    #[tokio::test]
    async fn a_service_is_killed_restarted_and_killed_on_drop() -> anyhow::Result<()> {
        let nats = trellis_testkit::NatsServer::start()?;
        let logs = tempfile::tempdir()?;
        let coordinator = free_addr()?;
        let spec = Spec::new("coordinator", env!("CARGO_BIN_EXE_sys-coordinator"))
            .flag("--admin-addr", "off")
            .flag("--nats-url", nats.url())
            .flag("--listen", coordinator.to_string())
            .ready(Ready::GrpcHealth {
                addr: coordinator,
                service: "",
            });
        let mut service = Service::start(spec, logs.path()).await?;
        let first = service.pid().context("a started service has a pid")?;
        health(coordinator, "").await?;

        service.kill9()?;
        assert!(!service.is_running());
        assert!(
            health(coordinator, "").await.is_err(),
            "a killed service answers nothing"
        );
        assert!(
            service.kill9().is_err(),
            "killing twice is a mistake the harness reports"
        );

        service.restart().await?;
        let second = service.pid().context("a restarted service has a pid")?;
        assert_ne!(first, second);
        health(coordinator, "").await?;
        let log = std::fs::read_to_string(service.log_path())?;
        assert!(log.contains("killed with SIGKILL"), "{log}");
        assert!(log.contains("start 2 of"), "{log}");

        drop(service);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            health(coordinator, "").await.is_err(),
            "dropping kills the service"
        );
        Ok(())
    }
}
