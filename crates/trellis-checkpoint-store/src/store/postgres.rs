//! The PostgreSQL backend (production): a connection pool, the migrations of
//! `migrations/postgres`, and the shared SQL of `sql.rs`.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

// `Error` and `ErrorKind` come with the imports of `sql.rs`.
use super::{Backend as BackendKind, redact};

type Db = sqlx::Postgres;
type StoreImpl = PostgresStore;

const BACKEND: BackendKind = BackendKind::Postgres;
const CONTAINS_FN: &str = "strpos";

/// Connections in the pool: the read-model writer, checkpoint calls and queries in parallel.
const MAX_CONNECTIONS: u32 = 16;

/// A [`super::Store`] on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: sqlx::PgPool,
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host:port/database`) and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(|source| {
                Error::database(
                    format!("cannot connect to PostgreSQL at {}", redact(url)),
                    source,
                )
                .with_kind(ErrorKind::Unavailable)
            })?;
        sqlx::migrate!("./migrations/postgres")
            .run(&pool)
            .await
            .map_err(|source| {
                Error::new(
                    ErrorKind::Internal,
                    format!(
                        "failed to apply the migrations to {}: {source}",
                        redact(url)
                    ),
                )
            })?;
        Ok(Self { pool })
    }

    fn pool(&self) -> &sqlx::PgPool {
        &self.pool
    }

    /// PostgreSQL runs concurrent write transactions itself.
    async fn lock_writes(&self) -> Option<()> {
        None
    }

    /// Begins a transaction that writes (PostgreSQL locks the rows it writes as it goes).
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, Db>, sqlx::Error> {
        self.pool.begin().await
    }
}

/// PostgreSQL's text cannot hold NUL characters; a worker's error message or task id could, and a
/// refused row would stall the read model, so NUL is replaced (by U+FFFD).
fn text(value: &str) -> String {
    if value.contains('\0') {
        value.replace('\0', "\u{fffd}")
    } else {
        value.to_owned()
    }
}

include!("sql.rs");
include!("backlog_sql.rs");
include!("notify_sql.rs");
include!("templates_sql.rs");
