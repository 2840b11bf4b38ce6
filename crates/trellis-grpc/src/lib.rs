//! What every Trellis gRPC server and client shares.
//!
//! - [`access`]: the access file — namespaces and their quotas (seed 003's tiers as operator
//!   configuration), the SHA-256 of each bearer token with the namespace it acts in, and the
//!   deployment's size limits.
//! - [`server`]: serving a service with TLS or mutual TLS, token authentication
//!   ([`server::Authenticate`] puts the caller's [`access::Principal`] in each request),
//!   health, reflection, a span and metrics per call.
//! - [`client`]: channels with TLS, a client certificate, the bearer token and the trace context.
//!
//! **Invariant:** a call without a valid token, or one acting outside its namespace, is refused
//! before any handler reads or changes anything.

pub mod access;
pub mod client;
pub mod server;

use std::path::Path;

pub use access::{AccessPolicy, Limits, Principal, Scope};
pub use client::{AuthChannel, ClientArgs, ClientSecurity};
pub use server::{ServerArgs, ServerSecurity};

/// Why a server or a channel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("gRPC server failed: {0}")]
    Serve(#[source] tonic::transport::Error),
}

fn read_file(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })
}
