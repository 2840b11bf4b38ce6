//! Serving a Trellis gRPC service: TLS (and mTLS), authentication of bearer tokens against the
//! access file, a tracing span per call (a child of the caller's), per-method metrics, gRPC health
//! and reflection, `TCP_NODELAY`, and graceful shutdown.

use std::path::PathBuf;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic::service::Routes;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tonic::{Request, Status};
use trellis_telemetry::Registry;
use trellis_telemetry::metrics::{HistogramFamily, Labels1, Labels2, latency_family};

use crate::access::{AccessPolicy, Principal};
use crate::{Error, read_file};

/// The flags of a gRPC server's security.
#[derive(Clone, Debug, Default, clap::Args)]
#[group(id = "server_security")]
#[command(next_help_heading = "Security of the gRPC port")]
pub struct ServerArgs {
    /// PEM certificate chain of this server: serve TLS (needs --tls-key).
    #[arg(
        long,
        env = "TRELLIS_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(
        long,
        env = "TRELLIS_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): clients must present a certificate signed by one (mutual TLS).
    #[arg(
        long,
        env = "TRELLIS_TLS_CLIENT_CA",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_client_ca: Option<PathBuf>,
    /// The access file (YAML): namespaces with their quotas, the SHA-256 of each bearer token
    /// and the namespace it acts in, size limits. With it every call needs
    /// `authorization: Bearer <token>`; without it calls are not authenticated.
    #[arg(long, env = "TRELLIS_ACCESS_FILE", value_name = "FILE")]
    pub access_file: Option<PathBuf>,
}

/// A server's security, loaded.
#[derive(Clone, Debug, Default)]
pub struct ServerSecurity {
    pub tls: Option<ServerTlsConfig>,
    /// Whether clients must present a certificate.
    pub mutual_tls: bool,
    /// Token authentication; `None` lets every call through as [`Principal::anonymous`].
    pub access: Option<Arc<AccessPolicy>>,
}

impl ServerArgs {
    /// Reads the files the flags name.
    pub fn load(&self) -> Result<ServerSecurity, Error> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let identity = Identity::from_pem(read_file(cert)?, read_file(key)?);
                let mut tls = ServerTlsConfig::new().identity(identity);
                if let Some(ca) = &self.tls_client_ca {
                    tls = tls.client_ca_root(Certificate::from_pem(read_file(ca)?));
                }
                Some(tls)
            }
            (None, None) => None,
            _ => {
                return Err(Error::Config(
                    "--tls-cert and --tls-key go together".to_owned(),
                ));
            }
        };
        let access = self
            .access_file
            .as_deref()
            .map(AccessPolicy::load)
            .transpose()
            .map_err(|err| Error::Config(err.to_string()))?
            .map(Arc::new);
        Ok(ServerSecurity {
            tls,
            mutual_tls: self.tls_client_ca.is_some(),
            access,
        })
    }
}

/// Checks each call's bearer token and puts the caller's [`Principal`] in its extensions.
#[derive(Clone)]
pub struct Authenticate {
    access: Option<Arc<AccessPolicy>>,
    /// Every caller when there is no access file (built once: it is cloned per call).
    anonymous: Principal,
    refused: Family<Labels1, Counter>,
    /// Refuse tokens of one namespace: for services only other services call.
    all_namespaces_only: bool,
}

impl std::fmt::Debug for Authenticate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticate")
            .field("enabled", &self.access.is_some())
            .finish()
    }
}

impl Authenticate {
    /// Authenticates against `access`; lets everything through as anonymous without one.
    pub fn new(access: Option<Arc<AccessPolicy>>, registry: &Registry) -> Self {
        let refused = registry.metric(
            "trellis_grpc_unauthenticated",
            "Calls refused for a missing or unknown bearer token, by reason.",
            Family::default,
        );
        Self {
            access,
            anonymous: Principal::anonymous(),
            refused,
            all_namespaces_only: false,
        }
    }

    /// Lets only tokens of every namespace (`"*"`) in: for the checkpoint-store, whose
    /// checkpoints and read model span namespaces and which only the services call.
    pub fn all_namespaces_only(mut self) -> Self {
        self.all_namespaces_only = true;
        self
    }

    /// Returns the caller presenting `metadata`'s token, or the status refusing the call.
    pub fn check(&self, metadata: &tonic::metadata::MetadataMap) -> Result<Principal, Status> {
        let Some(access) = &self.access else {
            return Ok(self.anonymous.clone());
        };
        let refuse = |reason: &'static str, message: &str| {
            self.refused
                .get_or_create(&[("reason", reason.to_owned())])
                .inc();
            Status::unauthenticated(message.to_owned())
        };
        let Some(value) = metadata.get("authorization") else {
            return Err(refuse(
                "missing",
                "this server needs a bearer token: send `authorization: Bearer <token>` (the \
                 trellis CLI sends $TRELLIS_TOKEN)",
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| {
                refuse(
                    "malformed",
                    "the authorization header must be `Bearer <token>`",
                )
            })?;
        match access.authenticate(token) {
            Some(principal)
                if self.all_namespaces_only && principal.scope != crate::access::Scope::All =>
            {
                self.refused
                    .get_or_create(&[("reason", "namespace_token".to_owned())])
                    .inc();
                Err(Status::permission_denied(format!(
                    "the token {:?} acts in one namespace; this service takes only tokens of \
                     every namespace (\"*\"), the services' own",
                    principal.name
                )))
            }
            Some(principal) => Ok(principal.clone()),
            None => Err(refuse(
                "unknown",
                "the bearer token is not valid here: nothing was done",
            )),
        }
    }
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let principal = self.check(request.metadata())?;
        request.extensions_mut().insert(principal);
        Ok(request)
    }
}

/// Returns the caller of a request that passed [`Authenticate`]. A request that did not (a
/// service added without it) is refused rather than served anonymously.
pub fn principal<T>(request: &Request<T>) -> Result<Principal, Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::internal("the call was not authenticated"))
}

/// Serves `routes` on `listener` until `shutdown`, with health (`service` and "" SERVING until
/// shutdown), reflection, per-call spans and metrics, and the TLS of `security`.
pub async fn serve<S: NamedService>(
    listener: TcpListener,
    routes: Routes,
    security: &ServerSecurity,
    registry: &Registry,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<S>().await;
    let not_serving = shutdown.clone();
    tokio::spawn(async move {
        not_serving.cancelled().await;
        health.set_not_serving::<S>().await;
    });
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(trellis_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|err| Error::Config(format!("cannot build the reflection service: {err}")))?;
    let routes = routes.add_service(health_service).add_service(reflection);
    // Small request/response frames must not wait for Nagle's algorithm (a 40 ms stall against
    // delayed ACKs); tonic sets TCP_NODELAY only on listeners it binds itself.
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |stream| {
            stream.inspect(|s| {
                let _ = s.set_nodelay(true);
            })
        },
    );
    let mut builder = tonic::transport::Server::builder()
        .trace_fn(trellis_telemetry::propagation::grpc_server_span)
        .layer(CallMetricsLayer::new(registry));
    if let Some(tls) = &security.tls {
        builder = builder
            .tls_config(tls.clone())
            .map_err(|err| Error::Config(format!("invalid TLS configuration: {err}")))?;
    }
    builder
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .map_err(Error::Serve)
}

/// Counts calls by method and status code and times them.
#[derive(Clone, Debug)]
pub struct CallMetricsLayer {
    calls: Family<Labels2, Counter>,
    seconds: HistogramFamily<Labels1>,
}

impl CallMetricsLayer {
    fn new(registry: &Registry) -> Self {
        Self {
            calls: registry.metric(
                "trellis_grpc_calls",
                "gRPC calls served, by method and status code.",
                Family::default,
            ),
            seconds: registry.metric(
                "trellis_grpc_call_seconds",
                "Time from a gRPC call's arrival to its response headers, by method.",
                latency_family,
            ),
        }
    }
}

impl<S> tower::Layer<S> for CallMetricsLayer {
    type Service = CallMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallMetrics {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`CallMetricsLayer`] makes.
#[derive(Clone, Debug)]
pub struct CallMetrics<S> {
    inner: S,
    layer: CallMetricsLayer,
}

impl<S, B, R> tower::Service<http::Request<B>> for CallMetrics<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().trim_start_matches('/').to_owned();
        // The ready service handles this call; a fresh clone waits for the next poll_ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let started = Instant::now();
        Box::pin(async move {
            let response = inner.call(request).await;
            // Health checks and reflection are not the services' traffic.
            if !method.starts_with("grpc.") {
                let code = match &response {
                    // A failed unary call answers with its status in the headers; a response
                    // without one carries its body, the call went through.
                    Ok(response) => response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i32>().ok())
                        .map_or(tonic::Code::Ok, tonic::Code::from_i32),
                    Err(_) => tonic::Code::Unavailable,
                };
                layer
                    .calls
                    .get_or_create(&[("method", method.clone()), ("code", format!("{code:?}"))])
                    .inc();
                layer
                    .seconds
                    .get_or_create(&[("method", method)])
                    .observe(started.elapsed().as_secs_f64());
            }
            response
        })
    }
}
