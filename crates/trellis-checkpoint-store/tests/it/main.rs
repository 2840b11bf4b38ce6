//! Tests of the checkpoint-store against real parts: SQLite files, a fresh PostgreSQL database per
//! test, a private `nats-server -js` per test, and the tonic server on a free port. Nothing is
//! mocked.

mod backlog;
mod conformance;
mod driver;
mod grpc;
mod notify;
mod read_model;
mod support;
mod tls;

#[tokio::test]
async fn a_sqlite_url_without_a_mode_creates_its_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("new.db");
    trellis_checkpoint_store::store::connect(&format!("sqlite://{}", path.display())).await?;
    assert!(path.exists(), "no database file at {}", path.display());
    // A mode of its own is kept: read-only does not create the file.
    let missing = dir.path().join("missing.db");
    let read_only = format!("sqlite://{}?mode=ro", missing.display());
    assert!(
        trellis_checkpoint_store::store::connect(&read_only)
            .await
            .is_err()
    );
    assert!(!missing.exists());
    Ok(())
}
