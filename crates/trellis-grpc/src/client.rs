//! Calling a Trellis gRPC service: the channel (TLS when the address is `https://` or a CA is
//! given, a client certificate for mutual TLS), the bearer token on every call, and the caller's
//! trace context in the metadata.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};
use trellis_telemetry::redact::Secret;

use crate::{Error, read_file};

/// A channel whose calls carry the token and the trace context.
pub type AuthChannel = InterceptedService<Channel, Credentials>;

/// How long to wait for the TCP (and TLS) connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The flags of a service's calls to other services.
#[derive(Clone, Debug, Default, clap::Args)]
#[group(id = "client_security")]
#[command(next_help_heading = "Calls to Trellis services")]
pub struct ClientArgs {
    /// Bearer token sent with every gRPC call (the services' own token is one of namespace "*").
    #[arg(
        long = "token",
        env = "TRELLIS_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        global = true
    )]
    pub token: Option<Secret>,
    /// A file holding the bearer token (a mounted Secret), instead of --token.
    #[arg(
        long = "token-file",
        env = "TRELLIS_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token",
        global = true
    )]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificate(s) trusted for other services' TLS (default: public CAs).
    #[arg(
        long = "client-tls-ca",
        env = "TRELLIS_CLIENT_TLS_CA",
        value_name = "FILE",
        global = true
    )]
    pub client_tls_ca: Option<PathBuf>,
    /// PEM client certificate presented to services that require mutual TLS.
    #[arg(
        long = "client-tls-cert",
        env = "TRELLIS_CLIENT_TLS_CERT",
        value_name = "FILE",
        requires = "client_tls_key",
        global = true
    )]
    pub client_tls_cert: Option<PathBuf>,
    /// PEM private key of --client-tls-cert.
    #[arg(
        long = "client-tls-key",
        env = "TRELLIS_CLIENT_TLS_KEY",
        value_name = "FILE",
        requires = "client_tls_cert",
        global = true
    )]
    pub client_tls_key: Option<PathBuf>,
}

impl ClientArgs {
    /// Reads the files the flags name.
    pub fn load(&self) -> Result<ClientSecurity, Error> {
        let token = match (&self.token, &self.token_file) {
            (Some(token), _) => Some(token.clone()),
            (None, Some(path)) => {
                let text = String::from_utf8(read_file(path)?).map_err(|_| {
                    Error::Config(format!("{}: the token file is not text", path.display()))
                })?;
                let token = text.trim();
                if token.is_empty() {
                    return Err(Error::Config(format!(
                        "{}: the token file is empty",
                        path.display()
                    )));
                }
                Some(Secret::new(token))
            }
            (None, None) => None,
        };
        let tls = if self.client_tls_ca.is_some() || self.client_tls_cert.is_some() {
            let mut tls = ClientTlsConfig::new();
            tls = match &self.client_tls_ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(read_file(ca)?)),
                None => tls.with_webpki_roots(),
            };
            if let (Some(cert), Some(key)) = (&self.client_tls_cert, &self.client_tls_key) {
                tls = tls.identity(Identity::from_pem(read_file(cert)?, read_file(key)?));
            }
            Some(tls)
        } else {
            None
        };
        Ok(ClientSecurity {
            token,
            tls,
            traceparent: None,
        })
    }
}

/// A client's credentials, loaded.
#[derive(Clone, Debug, Default)]
pub struct ClientSecurity {
    pub token: Option<Secret>,
    /// TLS settings; `None` uses public CAs for `https://` addresses and plain HTTP/2 otherwise.
    pub tls: Option<ClientTlsConfig>,
    /// A fixed `traceparent` every call carries, for a client without spans of its own whose
    /// calls should be one trace (`trellis submit` through a planner, then the coordinator).
    pub traceparent: Option<String>,
}

impl ClientSecurity {
    /// Returns the endpoint of `url` with these TLS settings.
    pub fn endpoint(&self, url: &str) -> Result<Endpoint, Error> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|err| Error::Config(format!("invalid address {url:?}: {err}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let tls = match (&self.tls, url.starts_with("https://")) {
            (Some(tls), _) => Some(tls.clone()),
            (None, true) => Some(ClientTlsConfig::new().with_webpki_roots()),
            (None, false) => None,
        };
        match tls {
            Some(tls) => endpoint
                .tls_config(tls)
                .map_err(|err| Error::Config(format!("invalid TLS settings for {url}: {err}"))),
            None => Ok(endpoint),
        }
    }

    /// Returns a channel to `url` that connects on first use, with the credentials.
    pub fn lazy_channel(&self, url: &str) -> Result<AuthChannel, Error> {
        Ok(self.wrap(self.endpoint(url)?.connect_lazy()))
    }

    /// Connects to `url` now and returns the channel with the credentials.
    pub async fn connect(&self, url: &str) -> Result<AuthChannel, Error> {
        let channel = self
            .endpoint(url)?
            .connect()
            .await
            .map_err(|source| Error::Connect {
                url: url.to_owned(),
                source,
            })?;
        Ok(self.wrap(channel))
    }

    /// Adds the credentials to `channel`'s calls.
    pub fn wrap(&self, channel: Channel) -> AuthChannel {
        InterceptedService::new(channel, self.credentials())
    }

    /// The interceptor adding these credentials.
    pub fn credentials(&self) -> Credentials {
        Credentials {
            authorization: self.token.as_ref().and_then(|token| {
                format!("Bearer {}", token.expose())
                    .parse()
                    .ok()
                    .map(Arc::new)
            }),
            traceparent: self
                .traceparent
                .as_deref()
                .and_then(|traceparent| traceparent.parse().ok())
                .map(Arc::new),
        }
    }
}

/// Adds `authorization: Bearer <token>` (unless the call carries its own, as the monitor's
/// forwarded calls do) and the current trace context to every call.
#[derive(Clone, Default)]
pub struct Credentials {
    authorization: Option<Arc<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>>,
    traceparent: Option<Arc<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.authorization.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.authorization
            && !request.metadata().contains_key("authorization")
        {
            request
                .metadata_mut()
                .insert("authorization", value.as_ref().clone());
        }
        match &self.traceparent {
            Some(traceparent) => {
                request.metadata_mut().insert(
                    trellis_telemetry::propagation::TRACEPARENT,
                    traceparent.as_ref().clone(),
                );
            }
            None => trellis_telemetry::propagation::inject_metadata(
                &trellis_telemetry::propagation::current(),
                request.metadata_mut(),
            ),
        }
        Ok(request)
    }
}

/// Puts `token` on `request` as its bearer token, replacing the channel's own: for calls made on
/// behalf of a caller (the monitor forwards its users' tokens).
pub fn on_behalf_of<T>(request: &mut Request<T>, token: &Secret) -> Result<(), Status> {
    let value = format!("Bearer {}", token.expose()).parse().map_err(|_| {
        Status::unauthenticated("the bearer token holds characters a header cannot")
    })?;
    request.metadata_mut().insert("authorization", value);
    Ok(())
}
