//! Harnesses: a store on a temporary SQLite file or on a fresh PostgreSQL database (dropped
//! afterwards), with raw SQL access to damage rows as a disk would; and a running service.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::Connection as _;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use trellis_checkpoint_store::{Config, Store};
use trellis_proto::v1::checkpoint_store_client::CheckpointStoreClient;
use uuid::Uuid;

/// Runs each named test (an `async fn(TestStore) -> anyhow::Result<()>` of the calling module)
/// against both backends: a module `sqlite` and a module `postgres` of `#[tokio::test]`s.
macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() -> anyhow::Result<()> {
                    super::$name(crate::support::TestStore::sqlite().await?).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() -> anyhow::Result<()> {
                    super::$name(crate::support::TestStore::postgres().await?).await
                }
            )*
        }
    };
}
pub(crate) use store_suite;

/// Where the tests find PostgreSQL: `TRELLIS_TEST_POSTGRES_URL`, or the local server.
fn postgres_admin_url() -> String {
    std::env::var("TRELLIS_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// What to run when PostgreSQL is not reachable.
const START_POSTGRES: &str =
    "start PostgreSQL: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start";

/// A PostgreSQL database of its own for one test, dropped (with its connections) on drop.
#[derive(Debug)]
pub struct PgDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl PgDatabase {
    /// Creates `trellis_test_<uuid>` on the server of [`postgres_admin_url`]. Fails, naming the
    /// fix, when the server cannot be reached: these tests never skip.
    pub async fn create() -> anyhow::Result<Self> {
        let admin_url = postgres_admin_url();
        let mut admin = sqlx::PgConnection::connect(&admin_url)
            .await
            .with_context(|| format!("cannot reach PostgreSQL at {admin_url}; {START_POSTGRES}"))?;
        let name = format!("trellis_test_{}", Uuid::now_v7().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .with_context(|| format!("cannot create database {name}"))?;
        let _ = admin.close().await;
        let base = admin_url
            .split('?')
            .next()
            .and_then(|url| url.rsplit_once('/'))
            .map(|(base, _)| base)
            .context("the PostgreSQL URL names no database")?;
        let url = format!("{base}/{name}");
        Ok(Self {
            admin_url,
            name,
            url,
        })
    }

    /// Returns the database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime, which cannot block on itself: use a thread with a
        // runtime of its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut admin = sqlx::PgConnection::connect(&admin_url).await.ok()?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(_))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}

/// Raw access to a store's database, for damaging rows.
#[derive(Debug)]
pub enum Raw {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

/// What keeps a store's database alive.
#[derive(Debug)]
enum Keep {
    Dir(#[allow(dead_code)] tempfile::TempDir),
    Postgres(#[allow(dead_code)] PgDatabase),
}

/// A store on a database of its own.
#[derive(Debug)]
pub struct TestStore {
    pub store: Arc<dyn Store>,
    pub url: String,
    raw: Raw,
    // Dropped last: the database outlives the pools above.
    _keep: Keep,
}

impl TestStore {
    /// A store on a new SQLite file.
    pub async fn sqlite() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("trellis-store-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let url = format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("store.db").display()
        );
        let store = trellis_checkpoint_store::store::connect(&url).await?;
        let raw = Raw::Sqlite(sqlx::SqlitePool::connect(&url).await?);
        Ok(Self {
            store,
            url,
            raw,
            _keep: Keep::Dir(dir),
        })
    }

    /// A store on a new PostgreSQL database.
    pub async fn postgres() -> anyhow::Result<Self> {
        let database = PgDatabase::create().await?;
        let url = database.url().to_owned();
        let store = trellis_checkpoint_store::store::connect(&url).await?;
        let raw = Raw::Postgres(sqlx::PgPool::connect(&url).await?);
        Ok(Self {
            store,
            url,
            raw,
            _keep: Keep::Postgres(database),
        })
    }

    /// Replaces a checkpoint's stored state bytes, leaving its checksum as it was.
    pub async fn damage_state(&self, checkpoint_id: Uuid, state: &[u8]) -> anyhow::Result<()> {
        let sql = "UPDATE checkpoints SET state = $1 WHERE checkpoint_id = $2";
        let updated = match &self.raw {
            Raw::Sqlite(pool) => sqlx::query(sql)
                .bind(state)
                .bind(checkpoint_id)
                .execute(pool)
                .await?
                .rows_affected(),
            Raw::Postgres(pool) => sqlx::query(sql)
                .bind(state)
                .bind(checkpoint_id)
                .execute(pool)
                .await?
                .rows_affected(),
        };
        anyhow::ensure!(updated == 1, "no checkpoint {checkpoint_id} to damage");
        Ok(())
    }

    /// Returns the number of rows of `table` (a name from the schema).
    pub async fn count(&self, table: &str) -> anyhow::Result<i64> {
        self.scalar(&format!("SELECT COUNT(*) FROM {table}")).await
    }

    /// Runs one statement as is, bypassing the store (what another client could send).
    pub async fn execute(&self, sql: &str) -> anyhow::Result<u64> {
        Ok(match &self.raw {
            Raw::Sqlite(pool) => sqlx::query(sql).execute(pool).await?.rows_affected(),
            Raw::Postgres(pool) => sqlx::query(sql).execute(pool).await?.rows_affected(),
        })
    }

    /// Returns the BIGINT a query answers with.
    pub async fn scalar(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(match &self.raw {
            Raw::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
            Raw::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
        })
    }
}

/// A checkpoint-store service running in this process.
#[derive(Debug)]
pub struct Service {
    pub addr: std::net::SocketAddr,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), trellis_checkpoint_store::Error>>>,
}

impl Service {
    /// Starts `run` on a free port.
    pub async fn start(config: Config) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(trellis_checkpoint_store::run(
            config,
            listener,
            shutdown.clone(),
        ));
        let service = Self {
            addr,
            shutdown,
            task: Some(task),
        };
        // Serving once a connection goes through.
        let endpoint = format!("http://{addr}");
        trellis_testkit::wait_for(
            || {
                let endpoint = endpoint.clone();
                async move { CheckpointStoreClient::connect(endpoint).await.is_ok() }
            },
            Duration::from_secs(20),
        )
        .await
        .context("the checkpoint-store did not start serving")?;
        Ok(service)
    }

    /// Returns a client of the service.
    pub async fn client(&self) -> anyhow::Result<CheckpointStoreClient<tonic::transport::Channel>> {
        Ok(
            CheckpointStoreClient::connect(format!("http://{}", self.addr))
                .await?
                .max_decoding_message_size(usize::MAX),
        )
    }

    /// Stops the service and waits for it, failing when it failed.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            trellis_testkit::within(
                "the checkpoint-store to stop",
                Duration::from_secs(20),
                task,
            )
            .await???;
        }
        Ok(())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
