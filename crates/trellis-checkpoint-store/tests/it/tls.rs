//! The store on a PostgreSQL that speaks only TLS and wants a client certificate: the database
//! URL's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` are honoured, and every way of getting
//! them wrong is refused before a single statement runs.

use anyhow::Context as _;
use sqlx::Connection as _;
use trellis_checkpoint_store::checkpoint::{self, sha256};
use trellis_checkpoint_store::store::{self, Error};
use trellis_proto::v1;
use trellis_testkit::{Postgres, TestPki};
use uuid::Uuid;

/// A TLS-only cluster and the certificates around it.
struct TlsPostgres {
    pki: TestPki,
    // Dropped last: the server outlives the pools of a test.
    postgres: Postgres,
}

impl TlsPostgres {
    async fn start() -> anyhow::Result<Self> {
        tokio::task::spawn_blocking(|| {
            let pki = TestPki::new()?;
            let postgres =
                Postgres::start_tls(&pki).context("cannot start a TLS-only PostgreSQL")?;
            Ok(Self { pki, postgres })
        })
        .await?
    }

    /// The `postgres` database on `host` (`localhost` or `127.0.0.1`, both named by the server's
    /// certificate) with `query` appended.
    fn url(&self, host: &str, query: &str) -> String {
        format!(
            "postgres://postgres@{host}:{}/postgres?{query}",
            self.postgres.port()
        )
    }

    /// The query that verifies the server against `root` and presents `client`.
    fn verified(
        &self,
        root: &std::path::Path,
        client: (std::path::PathBuf, std::path::PathBuf),
    ) -> String {
        format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            root.display(),
            client.0.display(),
            client.1.display()
        )
    }

    /// Connecting to `url` must fail, and the message must contain `expected`.
    async fn refused(&self, url: &str, expected: &str) -> anyhow::Result<()> {
        let error: Error = match store::connect(url).await {
            Ok(_) => anyhow::bail!("the store connected to {url}, which had to be refused"),
            Err(error) => error,
        };
        // The message holds the driver's error after what failed.
        let message = error.to_string();
        anyhow::ensure!(
            message.contains("cannot connect to PostgreSQL") && message.contains(expected),
            "refusing {url}: expected a connection error mentioning {expected:?}, got {message:?}"
        );
        Ok(())
    }
}

#[tokio::test]
async fn the_store_connects_over_verified_tls_with_a_client_certificate() -> anyhow::Result<()> {
    let server = TlsPostgres::start().await?;
    let pki = &server.pki;
    let url = server.url("localhost", &server.verified(&pki.ca(), pki.client()));

    let store = store::connect(&url).await?;
    let state = b"state over TLS";
    let request = v1::Checkpoint {
        metadata: Some(v1::CheckpointMetadata {
            checkpoint_id: Uuid::now_v7().to_string(),
            execution_id: Uuid::now_v7().to_string(),
            event_sequence: 7,
            stream_sequence: 9,
            kind: v1::CheckpointKind::Full.into(),
            base_checkpoint_id: String::new(),
            checksum_sha256: sha256(state).to_vec(),
            created_at_unix_ms: 1_750_000_000_000,
            size_bytes: state.len() as u64,
            state_format_version: 1,
        }),
        state: state.to_vec(),
    };
    let checkpoint = checkpoint::verify_new(request, 0)?;
    let created = store.create_checkpoint(&checkpoint).await?;
    let read = store.verified_checkpoint(created.checkpoint_id).await?;
    assert_eq!(read, checkpoint);

    // Every backend serving the store is encrypted, and the server saw the client certificate.
    let mut observer = sqlx::PgConnection::connect(
        &server.url("127.0.0.1", &server.verified(&pki.ca(), pki.client())),
    )
    .await?;
    let (backends, encrypted, with_certificate): (i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(*) FILTER (WHERE s.ssl), \
                COUNT(*) FILTER (WHERE s.client_dn IS NOT NULL) \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.datname = 'postgres' AND a.backend_type = 'client backend'",
    )
    .fetch_one(&mut observer)
    .await?;
    assert!(
        backends >= 2,
        "expected the store's pool and the observer connected, saw {backends} backends"
    );
    assert_eq!(encrypted, backends, "a backend without TLS");
    assert_eq!(
        with_certificate, backends,
        "a backend without a client certificate"
    );
    Ok(())
}

#[tokio::test]
async fn every_wrong_tls_setting_is_refused() -> anyhow::Result<()> {
    let server = TlsPostgres::start().await?;
    let pki = &server.pki;

    // The server refuses plain connections.
    server
        .refused(&server.url("127.0.0.1", "sslmode=disable"), "no encryption")
        .await?;
    // The client refuses a server its root certificate did not sign.
    server
        .refused(
            &server.url(
                "localhost",
                &server.verified(&pki.untrusted_ca(), pki.client()),
            ),
            "UnknownIssuer",
        )
        .await?;
    // The server refuses a client without a certificate, and one signed by a CA it does not trust.
    let no_certificate = format!("sslmode=verify-full&sslrootcert={}", pki.ca().display());
    server
        .refused(
            &server.url("localhost", &no_certificate),
            "requires a valid client certificate",
        )
        .await?;
    server
        .refused(
            &server.url("localhost", &server.verified(&pki.ca(), pki.stranger())),
            "UnknownCA",
        )
        .await?;
    // A missing root certificate is named.
    server
        .refused(
            &server.url(
                "localhost",
                "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            ),
            "/nonexistent/ca.pem",
        )
        .await?;

    // Nothing was created by the refused attempts: the migrations never ran.
    let mut observer = sqlx::PgConnection::connect(
        &server.url("localhost", &server.verified(&pki.ca(), pki.client())),
    )
    .await?;
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'public'",
    )
    .fetch_one(&mut observer)
    .await?;
    assert_eq!(tables, 0, "a refused connection created tables");
    Ok(())
}
