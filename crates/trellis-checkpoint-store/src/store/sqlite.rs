//! The SQLite backend (the embedded default): a file or in-memory database, the migrations of
//! `migrations/sqlite`, and the shared SQL of `sql.rs`.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::{Mutex, MutexGuard};

// `BTreeMap`, `Error` and `ErrorKind` come with the imports of `sql.rs`.
use super::{Backend as BackendKind, redact};

type Db = sqlx::Sqlite;
type StoreImpl = SqliteStore;

const BACKEND: BackendKind = BackendKind::Sqlite;
const CONTAINS_FN: &str = "instr";

/// Connections in the pool of a file database: readers run alongside the writer (WAL).
const MAX_CONNECTIONS: u32 = 4;

/// How often the write-ahead log of a file database is copied back into the database file.
///
/// SQLite does this itself by default, inside whichever commit pushes the log past 1,000 pages:
/// with checkpoints of a megabyte or more, every third or fourth insert then paid for copying
/// and syncing the whole log (35–55 ms instead of 10). Here commits never checkpoint
/// (`wal_autocheckpoint = 0`); a task of the store does it on this period, in `PASSIVE` mode, so
/// it never waits for or blocks a writer.
const WAL_CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// Held while a store of this process opens its database and applies the migrations.
///
/// Two stores of one process on one new file (`trellis dev`'s checkpoint-store and planner) must
/// not do that at the same time: each connection switches the file to WAL, which needs it alone,
/// and SQLite refuses one of two such switches at once (`database is locked`) rather than wait,
/// since waiting could deadlock; and SQLite's migrator takes no lock, so the second would fail on
/// the tables the first created.
static OPENING: Mutex<()> = Mutex::const_new(());

/// The write queues of the database files this process has open, by path: two stores on one
/// file queue their write transactions behind each other as one store's do (see
/// [`SqliteStore::writes`]).
static WRITE_QUEUES: std::sync::Mutex<BTreeMap<PathBuf, Weak<Mutex<()>>>> =
    std::sync::Mutex::new(BTreeMap::new());

/// The write queue of the file at `path`, shared with every other store of this process on it.
fn write_queue(path: PathBuf) -> Arc<Mutex<()>> {
    // A poisoned map only means a thread panicked while holding it; the map itself is whole.
    let mut queues = WRITE_QUEUES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    queues.retain(|_, queue| queue.strong_count() > 0);
    if let Some(queue) = queues.get(&path).and_then(Weak::upgrade) {
        return queue;
    }
    let queue = Arc::new(Mutex::new(()));
    queues.insert(path, Arc::downgrade(&queue));
    queue
}

/// A [`super::Store`] on SQLite.
#[derive(Debug)]
pub struct SqliteStore {
    pool: sqlx::SqlitePool,
    /// SQLite has one writer at a time; a transaction that reads first and writes later can fail
    /// at once (`SQLITE_BUSY`) when another took the write lock meanwhile. The stores of this
    /// process are the only writers of their file, so they queue their write transactions here
    /// instead (one queue per file).
    writes: Arc<Mutex<()>>,
    /// Copies the write-ahead log into the database file in the background (file databases
    /// only); stopped when the store is dropped.
    wal_checkpointer: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        if let Some(task) = self.wal_checkpointer.take() {
            task.abort();
        }
    }
}

impl SqliteStore {
    /// Opens the database of `url` (`sqlite://path` creates the file when missing, as `?mode=rwc`
    /// does; `sqlite::memory:` lives as long as the store) and applies the migrations.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|source| {
                Error::database(format!("invalid SQLite URL {url:?}"), source)
                    .with_kind(ErrorKind::InvalidArgument)
            })?
            .foreign_keys(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10));
        // A path names the file to use: create it when missing, unless the URL sets a `mode` of
        // its own (`ro`, `rw`, `rwc`, `memory`), which the parsing above has applied.
        let options = if url.contains("mode=") {
            options
        } else {
            options.create_if_missing(true)
        };
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let file = (!in_memory).then(|| options.get_filename().to_path_buf());
        let options = if in_memory {
            options
        } else {
            options.pragma("wal_autocheckpoint", "0")
        };
        let pool_options = if in_memory {
            // An in-memory database lives in its connections: keep exactly one, forever.
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(MAX_CONNECTIONS)
        };
        let _opening = OPENING.lock().await;
        let pool = pool_options
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(|source| {
                Error::database(format!("cannot open SQLite database {url}"), source)
                    .with_kind(ErrorKind::Unavailable)
            })?;
        sqlx::migrate!("./migrations/sqlite")
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
        let wal_checkpointer = (!in_memory).then(|| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(WAL_CHECKPOINT_EVERY);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    if pool.is_closed() {
                        return;
                    }
                    // A failed checkpoint leaves the log as it was, to be copied next time.
                    if let Err(err) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                        .execute(&pool)
                        .await
                    {
                        tracing::debug!(%err, "WAL checkpoint failed; retried next period");
                    }
                }
            })
        });
        // One file may be named by several paths (relative, through links): the canonical one
        // names it once it exists, as it does now.
        let writes = match file {
            Some(file) => write_queue(std::fs::canonicalize(&file).unwrap_or(file)),
            None => Arc::new(Mutex::new(())),
        };
        Ok(Self {
            pool,
            writes,
            wal_checkpointer,
        })
    }

    fn pool(&self) -> &sqlx::SqlitePool {
        &self.pool
    }

    async fn lock_writes(&self) -> Option<MutexGuard<'_, ()>> {
        Some(self.writes.lock().await)
    }

    /// Begins a transaction that writes, holding SQLite's write lock from its first statement
    /// (`BEGIN IMMEDIATE`, waiting up to the busy timeout for it).
    ///
    /// A plain `BEGIN` takes the lock only at the first write, after the transaction has read:
    /// if another connection to the file (another process's, or one this process opens) holds
    /// it or has written since that read, SQLite answers `database is locked` at once instead
    /// of waiting, since a reader waiting to write could deadlock. The stores of this process
    /// queue their writes (`lock_writes`), so the wait is only ever for someone else's.
    async fn begin_write(&self) -> Result<sqlx::Transaction<'static, Db>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }
}

/// SQLite stores any string as is.
fn text(value: &str) -> String {
    value.to_owned()
}

include!("sql.rs");
include!("backlog_sql.rs");
include!("notify_sql.rs");
include!("templates_sql.rs");

#[cfg(test)]
mod tests {
    use sqlx::Row as _;

    use super::*;

    /// An update of a stored instance rewrites its entry in one secondary index, the state's:
    /// the statement assigns no other indexed column. With every column assigned (as before),
    /// SQLite's program deletes and inserts an entry in each of the four.
    #[tokio::test]
    async fn an_instance_update_rewrites_only_its_state_index_entry() {
        let store = SqliteStore::connect("sqlite::memory:")
            .await
            .expect("an in-memory store");
        let placeholders = vec!["?"; INSTANCE_COLUMNS.split(',').count()].join(", ");
        let sql = format!(
            "EXPLAIN INSERT INTO task_instances ({INSTANCE_COLUMNS}) VALUES ({placeholders})\
             {INSTANCES_ON_CONFLICT}"
        );
        let program = sqlx::query(&sql)
            .fetch_all(&store.pool)
            .await
            .expect("SQLite explains the upsert");
        let index_deletes = program
            .iter()
            .filter(|row| row.get::<String, _>("opcode") == "IdxDelete")
            .count();
        assert_eq!(
            index_deletes, 1,
            "the upsert's update deletes {index_deletes} index entries:\n{sql}"
        );
    }
}
