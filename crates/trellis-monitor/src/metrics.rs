//! The monitor's metrics (Prometheus names; counters are scraped with `_total`) and the span and
//! count of every HTTP request it answers:
//!
//! - `trellis_monitor_http_requests` by `route` (the route's pattern, such as
//!   `/api/executions/{id}`, so ids never become labels), `method` and `code`: requests answered,
//!   refusals included (401, 403, 404);
//! - `trellis_monitor_http_request_seconds` by `route`: the time from a request's arrival to its
//!   response headers (for a live stream, its opening, not its end);
//! - `trellis_monitor_live_streams`: live streams (`/live`, `/logs/live`) open now;
//! - `trellis_monitor_live_resnapshots`: times a stream fell too far behind and was sent a fresh
//!   snapshot instead of the updates it missed;
//! - `trellis_monitor_executions_watched`: executions with a live projection (a hub) now.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tracing::Instrument as _;
use trellis_telemetry::Registry;
use trellis_telemetry::metrics::{HistogramFamily, Labels1, Labels3, latency_family};

/// The monitor's metric families.
#[derive(Clone, Debug)]
pub struct Metrics {
    requests: Family<Labels3, Counter>,
    request_seconds: HistogramFamily<Labels1>,
    pub(crate) live_streams: Gauge,
    pub(crate) live_resnapshots: Counter,
    pub(crate) executions_watched: Gauge,
}

impl Metrics {
    /// Registers the monitor's families in `registry` (or finds them there).
    pub fn new(registry: &Registry) -> Self {
        Self {
            requests: registry.metric(
                "trellis_monitor_http_requests",
                "HTTP requests answered, by route pattern, method and status code.",
                Family::default,
            ),
            request_seconds: registry.metric(
                "trellis_monitor_http_request_seconds",
                "Time from an HTTP request's arrival to its response headers, by route pattern.",
                latency_family,
            ),
            live_streams: registry.metric(
                "trellis_monitor_live_streams",
                "Live streams open.",
                Gauge::default,
            ),
            live_resnapshots: registry.metric(
                "trellis_monitor_live_resnapshots",
                "Live streams that fell behind and were sent a fresh snapshot.",
                Counter::default,
            ),
            executions_watched: registry.metric(
                "trellis_monitor_executions_watched",
                "Executions with a live projection of their log.",
                Gauge::default,
            ),
        }
    }
}

/// Counts one open thing (a live stream, a hub) for as long as it lives.
#[derive(Debug)]
pub(crate) struct Open(Gauge);

impl Open {
    pub(crate) fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Middleware of every route: runs the request in its own span (a child of the caller's
/// `traceparent`, so the monitor's calls to the coordinator join the caller's trace), then
/// counts and times it by route pattern.
pub(crate) async fn track(
    State(metrics): State<Metrics>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    let method = request.method().clone();
    let span = trellis_telemetry::propagation::http_server_span(&method, &route, request.headers());
    let started = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let code = response.status().as_u16();
    span.record("http.response.status_code", code);
    metrics
        .requests
        .get_or_create(&[
            ("route", route.clone()),
            ("method", method.as_str().to_owned()),
            ("code", code.to_string()),
        ])
        .inc();
    metrics
        .request_seconds
        .get_or_create(&[("route", route)])
        .observe(started.elapsed().as_secs_f64());
    response
}
