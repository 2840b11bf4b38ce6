//! A private PostgreSQL cluster per test ([`Postgres`]): `initdb` in a temporary directory, trust
//! authentication, a free loopback port, and a postmaster the test can stop, kill and restart.
//!
//! The postmaster runs as a direct child of the test process rather than daemonized by
//! `pg_ctl start`, so [`Postgres::kill`] reaps it at once: a daemonized postmaster killed with
//! SIGKILL lingers as a zombie until init gets round to it, and a new postmaster refuses the data
//! directory while the old pid still exists.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (as they do in CI), `initdb`,
//! `postgres` and `pg_ctl` run as the `postgres` OS user, which owns the temporary directory.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a starting postmaster may take to accept connections, crash recovery included.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The superuser `initdb` creates; trust authentication lets it in without a password.
const SUPERUSER: &str = "postgres";

/// What to install when the server binaries are missing.
const INSTALL_HINT: &str = "install them with `apt-get install -y postgresql`";

/// A PostgreSQL cluster in a temporary directory, listening on a free loopback port, with trust
/// authentication. The postmaster is killed and the directory removed when the value is dropped.
#[derive(Debug)]
pub struct Postgres {
    child: Option<Child>,
    bin_dir: PathBuf,
    /// The OS user (uid, gid) the server runs as; `None` runs it as the current user.
    run_as: Option<(u32, u32)>,
    port: u16,
    /// Whether the server speaks only TLS and checks client certificates ([`Postgres::start_tls`]).
    tls: bool,
    // Kept for its `Drop`, which removes the cluster and the log.
    dir: tempfile::TempDir,
}

impl Postgres {
    /// Creates a cluster with `initdb` and starts it; returns once it accepts connections.
    ///
    /// Fails, naming the fix, when no PostgreSQL server binaries are found under
    /// `/usr/lib/postgresql/*/bin` or on `PATH`.
    pub fn start() -> anyhow::Result<Postgres> {
        Self::start_with(None)
    }

    /// Like [`Postgres::start`], for a server that refuses every connection without TLS: it
    /// presents `pki`'s server certificate (for `localhost` and `127.0.0.1`) and lets in only
    /// clients presenting a certificate signed by `pki`'s CA (then with trust authentication).
    ///
    /// [`Postgres::create_database`] needs a client certificate there and is not available: use the
    /// `postgres` database.
    pub fn start_tls(pki: &crate::TestPki) -> anyhow::Result<Postgres> {
        Self::start_with(Some(pki))
    }

    fn start_with(pki: Option<&crate::TestPki>) -> anyhow::Result<Postgres> {
        let bin_dir = find_bin_dir()?;
        let run_as = if running_as_root()? {
            Some(postgres_user()?)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("trellis-pg-")
            .tempdir()
            .context("failed to create the PostgreSQL directory")?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).with_context(|| {
                format!(
                    "failed to hand {} to the postgres user",
                    dir.path().display()
                )
            })?;
        }
        let port = crate::free_port()?;
        let mut postgres = Postgres {
            child: None,
            bin_dir,
            run_as,
            port,
            tls: pki.is_some(),
            dir,
        };
        postgres.init_db()?;
        if let Some(pki) = pki {
            postgres.require_tls(pki)?;
        }
        postgres.spawn()?;
        Ok(postgres)
    }

    /// Returns the port the server listens on (it survives [`Postgres::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Returns the URL of `database` as the superuser:
    /// `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Returns the data directory (it survives [`Postgres::restart`]).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs `sql` in `database` with `psql` and returns its unaligned output: one line per row,
    /// columns separated by `|`, no header.
    pub fn query(&self, database: &str, sql: &str) -> anyhow::Result<String> {
        let output = self
            .client("psql")
            .args(["-d", database])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .context("failed to run psql")?;
        if !output.status.success() {
            bail!(
                "psql failed with {} on `{sql}`: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Creates an empty database and returns its URL.
    pub fn create_database(&self, name: &str) -> anyhow::Result<String> {
        let output = self
            .client("createdb")
            .args(["--", name])
            .output()
            .context("failed to run createdb")?;
        if !output.status.success() {
            bail!(
                "createdb {name} failed with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(self.url(name))
    }

    /// Returns whether the postmaster is running (it may have been stopped, killed or have
    /// crashed).
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

    /// Stops the server with a fast shutdown (clients are disconnected, in-progress transactions
    /// rolled back, then a clean checkpoint) and waits for it to exit. Does nothing when it is not
    /// running.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        let output = self
            .command("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "fast", "-w", "-t", "30"])
            .stdin(Stdio::null())
            .output()
            .context("failed to run pg_ctl stop")?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
            self.kill();
            bail!(
                "pg_ctl stop failed with {} (the server was killed instead): {stderr}",
                output.status
            );
        }
        if let Some(mut child) = self.child.take() {
            child
                .wait()
                .context("failed to wait for the stopped postmaster")?;
        }
        Ok(())
    }

    /// Kills the postmaster with SIGKILL, like an OOM kill, and waits for it to exit. Its backends
    /// notice and exit on their own; the next start runs crash recovery. Does nothing when it is
    /// not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // An error means the child already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server (fast) if it runs, then starts it again on the same port with the same
    /// data directory; returns once it accepts connections.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        self.spawn()
    }

    fn init_db(&self) -> anyhow::Result<()> {
        let log_path = self.dir.path().join("initdb.log");
        let log = File::create(&log_path)
            .with_context(|| format!("failed to create {}", log_path.display()))?;
        let log_err = log.try_clone().context("failed to share the log file")?;
        let status = self
            .command("initdb")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .status()
            .context("failed to run initdb")?;
        if !status.success() {
            bail!(
                "initdb failed with {status}; its log:\n{}",
                tail(&log_path, 20)
            );
        }
        Ok(())
    }

    /// Copies `pki`'s server certificate, key and CA where the server's OS user can read them (the
    /// key private to it, as PostgreSQL demands) and replaces `pg_hba.conf`: TLS with a client
    /// certificate signed by the CA, nothing else.
    fn require_tls(&self, pki: &crate::TestPki) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let (cert, key) = pki.server();
        for (from, name, mode) in [
            (cert, "server.pem", 0o644),
            (key, "server.key", 0o600),
            (pki.ca(), "ca.pem", 0o644),
        ] {
            let to = self.dir.path().join(name);
            std::fs::copy(&from, &to).with_context(|| {
                format!("failed to copy {} to {}", from.display(), to.display())
            })?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("failed to set the mode of {}", to.display()))?;
            if let Some((uid, gid)) = self.run_as {
                std::os::unix::fs::chown(&to, Some(uid), Some(gid))
                    .with_context(|| format!("failed to hand {} to postgres", to.display()))?;
            }
        }
        let hba = self.data_dir().join("pg_hba.conf");
        std::fs::write(
            &hba,
            "hostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n\
             hostnossl all all 127.0.0.1/32 reject\n",
        )
        .with_context(|| format!("failed to write {}", hba.display()))
    }

    /// Starts the postmaster and waits until it accepts connections. A postmaster that exits at
    /// once is started again until the deadline: after a kill, the old backends may still hold
    /// the shared memory for a moment, and the new postmaster refuses to start until they are gone.
    fn spawn(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let tls_settings = if self.tls {
            let file = |name: &str| self.dir.path().join(name).display().to_string();
            vec![
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", file("server.pem")),
                format!("ssl_key_file={}", file("server.key")),
                format!("ssl_ca_file={}", file("ca.pem")),
            ]
        } else {
            Vec::new()
        };
        loop {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.log_path())
                .with_context(|| format!("failed to open {}", self.log_path().display()))?;
            let log_err = log.try_clone().context("failed to share the log file")?;
            let child = self
                .command("postgres")
                .arg("-D")
                .arg(self.data_dir())
                .args(["-p", &self.port.to_string()])
                .args(["-c", "listen_addresses=127.0.0.1"])
                // TCP only: a socket under a long temporary path would exceed the 107-byte limit.
                .args(["-c", "unix_socket_directories="])
                // The tests kill processes, not the machine: what reached the OS survives, so
                // flushing to disk only costs time. A commit must still reach the OS before it
                // is answered (`synchronous_commit` stays on): off, a SIGKILLed postmaster loses
                // the commits its WAL writer had not written yet.
                .args(["-c", "fsync=off"])
                .args(["-c", "full_page_writes=off"])
                .args(
                    tls_settings
                        .iter()
                        .flat_map(|setting| ["-c", setting.as_str()]),
                )
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                .spawn()
                .with_context(|| {
                    format!("failed to spawn {}", self.binary("postgres").display())
                })?;
            self.child = Some(child);
            match self.wait_until_ready(started)? {
                Ready::Accepting => return Ok(()),
                Ready::Exited(_) if started.elapsed() < START_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ready::Exited(status) => bail!(
                    "postgres exited with {status} before accepting connections; its log:\n{}",
                    tail(&self.log_path(), 20)
                ),
            }
        }
    }

    /// Polls with `pg_isready` until the server accepts connections or the postmaster exits.
    fn wait_until_ready(&mut self, started: Instant) -> anyhow::Result<Ready> {
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait().context("failed to poll postgres")?
            {
                self.child = None;
                return Ok(Ready::Exited(status));
            }
            let ready = Command::new(self.binary("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", SUPERUSER, "-t", "1"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .context("failed to run pg_isready")?;
            if ready.success() {
                return Ok(Ready::Accepting);
            }
            if started.elapsed() > START_TIMEOUT {
                self.kill();
                bail!(
                    "postgres did not accept connections on port {} within {START_TIMEOUT:?}; its log:\n{}",
                    self.port,
                    tail(&self.log_path(), 20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Returns a command running one of the client binaries (`psql`, `createdb`) against this
    /// server as the superuser.
    fn client(&self, name: &str) -> Command {
        let mut command = Command::new(self.binary(name));
        command
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", SUPERUSER])
            .stdin(Stdio::null());
        command
    }

    /// Returns a command running one of the server binaries as the server's OS user.
    fn command(&self, name: &str) -> Command {
        use std::os::unix::process::CommandExt as _;
        let mut command = Command::new(self.binary(name));
        command.current_dir(self.dir.path());
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn binary(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// Returns the server's log file (kept across restarts), to show when a test fails.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How a start attempt ended.
enum Ready {
    Accepting,
    Exited(std::process::ExitStatus),
}

/// Returns the last `n` lines of a log file (empty when it cannot be read).
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Finds the directory holding `initdb`, `postgres` and `pg_ctl`: the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout), else the real directory of an `initdb`
/// on `PATH`.
fn find_bin_dir() -> anyhow::Result<PathBuf> {
    let has_server = |dir: &Path| {
        ["initdb", "postgres", "pg_ctl", "pg_isready", "createdb"]
            .iter()
            .all(|name| dir.join(name).is_file())
    };
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_server(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    let path_dirs = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .iter()
        .map(|dir| dir.join("initdb"))
        .filter(|initdb| initdb.is_file())
        // `/usr/local/bin/initdb` is often a link into the real directory, where `postgres` is.
        .filter_map(|initdb| std::fs::canonicalize(initdb).ok())
        .filter_map(|initdb| initdb.parent().map(Path::to_path_buf))
        .find(|dir| has_server(dir))
        .with_context(|| {
            format!(
                "no PostgreSQL server binaries (initdb, postgres, pg_ctl) under /usr/lib/postgresql/*/bin or on PATH; {INSTALL_HINT}"
            )
        })
}

/// Returns whether the effective user is root, from `/proc/self/status`.
fn running_as_root() -> anyhow::Result<bool> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("failed to read /proc/self/status")?;
    let effective_uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .context("no effective uid in /proc/self/status")?;
    Ok(effective_uid == "0")
}

/// Returns the uid and gid of the `postgres` OS user, from `/etc/passwd`.
fn postgres_user() -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").context("failed to read /etc/passwd")?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.first() != Some(&"postgres") {
                return None;
            }
            let uid = fields.get(2)?.parse().ok()?;
            let gid = fields.get(3)?.parse().ok()?;
            Some((uid, gid))
        })
        .with_context(|| {
            format!(
                "the tests run as root, which PostgreSQL refuses, and there is no `postgres` user to run it as; {INSTALL_HINT} (it creates the user)"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn select_one(url: &str) -> anyhow::Result<i32> {
        use sqlx::Connection as _;
        let mut connection = sqlx::PgConnection::connect(url)
            .await
            .with_context(|| format!("failed to connect to {url}"))?;
        let one: i32 = sqlx::query_scalar("select 1")
            .fetch_one(&mut connection)
            .await?;
        connection.close().await?;
        Ok(one)
    }

    #[tokio::test]
    async fn starts_restarts_survives_a_kill_and_is_removed() -> anyhow::Result<()> {
        let mut postgres = Postgres::start()?;
        let url = postgres.create_database("trellis_test")?;
        assert_eq!(url, postgres.url("trellis_test"));
        assert_eq!(select_one(&url).await?, 1);
        let again = postgres
            .create_database("trellis_test")
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default();
        assert!(again.contains("already exists"), "{again}");

        let port = postgres.port();
        postgres.restart()?;
        assert_eq!(postgres.port(), port);
        assert_eq!(
            select_one(&url).await?,
            1,
            "the database survives a restart"
        );

        postgres.kill();
        assert!(!postgres.is_running());
        assert!(
            select_one(&url).await.is_err(),
            "a killed server refuses connections"
        );
        postgres.restart()?;
        assert_eq!(
            select_one(&url).await?,
            1,
            "crash recovery after SIGKILL keeps the database"
        );

        postgres.stop()?;
        assert!(select_one(&url).await.is_err());
        let data_dir = postgres.data_dir();
        assert!(data_dir.exists());
        drop(postgres);
        assert!(!data_dir.exists(), "the cluster is removed on drop");
        Ok(())
    }
}
