//! W3C trace context (`traceparent`, `tracestate`) across process boundaries: NATS headers, gRPC
//! metadata, and the text recorded in an execution's `ExecutionStarted` event, so that the spans
//! of one execution — the call that started it, every dispatch, every worker's run, every result
//! applied — are one trace, also after the coordinator that started it was replaced.
//!
//! Per-message work (making a span, writing headers) happens only when [`enabled`]: a process
//! that exports no traces pays nothing per task for them.

use std::sync::atomic::{AtomicBool, Ordering};

pub use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing::Subscriber;
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt as _};
use tracing_subscriber::registry::LookupSpan;

/// The header (NATS) and metadata key (gRPC) of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Returns whether spans go anywhere. Until [`install`] runs, it is false and the helpers below
/// that make spans or headers do nothing.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Makes `provider` the process's tracer provider, sets the W3C propagator, turns per-message
/// tracing on, and returns the layer that sends `tracing` spans to `provider`. [`crate::init`]
/// calls it for the OTLP exporter; a test calls it with an in-memory exporter.
pub fn install<S>(
    provider: &SdkTracerProvider,
    service: &'static str,
) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_tracer_provider(provider.clone());
    ENABLED.store(true, Ordering::Relaxed);
    tracing_opentelemetry::layer().with_tracer(provider.tracer(service))
}

/// Returns the OpenTelemetry context of the current `tracing` span.
pub fn current() -> Context {
    tracing::Span::current().context()
}

/// Returns the context of `span`.
pub fn context_of(span: &tracing::Span) -> Context {
    span.context()
}

/// Makes `parent` the parent of `span` when it carries a valid span context; a span whose parent
/// is unknown stays a root.
pub fn set_parent(span: &tracing::Span, parent: Context) {
    if parent.span().span_context().is_valid() {
        // Fails only for a span that already started, which callers never pass.
        let _ = span.set_parent(parent);
    }
}

/// Returns the `traceparent` text of `cx`, if it holds a valid span context.
pub fn traceparent(cx: &Context) -> Option<String> {
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = Carrier::default();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.traceparent
}

/// Returns the context a `traceparent` text names; an empty or malformed text gives an empty
/// context (a root).
pub fn from_traceparent(traceparent: &str) -> Context {
    if traceparent.is_empty() {
        return Context::new();
    }
    let carrier = Carrier {
        traceparent: Some(traceparent.to_owned()),
    };
    TraceContextPropagator::new().extract(&carrier)
}

/// Returns a fresh root `traceparent` (random trace and span ids, sampled), for a client that
/// exports no spans of its own but wants the calls it makes to be one trace: the `trellis`
/// command line sends it with every call of one command.
pub fn new_root_traceparent() -> String {
    use opentelemetry::trace::{SpanContext, TraceFlags, TraceState};
    use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};
    let ids = RandomIdGenerator::default();
    let span_context = SpanContext::new(
        ids.new_trace_id(),
        ids.new_span_id(),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    traceparent(&Context::new().with_remote_span_context(span_context)).unwrap_or_default()
}

/// Writes `cx` into NATS headers, when tracing is on and `cx` holds a span.
pub fn inject_nats(cx: &Context, headers: &mut async_nats::HeaderMap) {
    if enabled() && cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(cx, &mut NatsHeaders(headers));
    }
}

/// Reads the context a NATS message carries; empty when it carries none.
pub fn extract_nats(headers: Option<&async_nats::HeaderMap>) -> Context {
    match headers {
        Some(headers) if enabled() => {
            TraceContextPropagator::new().extract(&NatsHeadersRef(headers))
        }
        _ => Context::new(),
    }
}

/// Writes `cx` into gRPC request metadata, when tracing is on and `cx` holds a span.
pub fn inject_metadata(cx: &Context, metadata: &mut tonic::metadata::MetadataMap) {
    if enabled() && cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(cx, &mut Metadata(metadata));
    }
}

/// Reads the context HTTP/2 request headers carry (gRPC metadata are headers).
pub fn extract_http(headers: &http::HeaderMap) -> Context {
    if !enabled() {
        return Context::new();
    }
    TraceContextPropagator::new().extract(&HttpHeaders(headers))
}

/// The span of one gRPC call a server handles, a child of the caller's span when the request
/// carries one. For `tonic::transport::Server::trace_fn`.
pub fn grpc_server_span(request: &http::Request<()>) -> tracing::Span {
    let path = request.uri().path();
    let (service, method) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or(("", path));
    let span = tracing::info_span!(
        "grpc",
        otel.name = %path.trim_start_matches('/'),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
    );
    if enabled() {
        set_parent(&span, extract_http(request.headers()));
    }
    span
}

/// The span of one HTTP request a server handles (the monitor's), a child of the caller's span
/// when the request carries a `traceparent`. `route` is the matched route's pattern
/// (`/api/executions/{id}`), not the path, so span names stay few. The status code is recorded
/// in the field `http.response.status_code` once known.
pub fn http_server_span(
    method: &http::Method,
    route: &str,
    headers: &http::HeaderMap,
) -> tracing::Span {
    let span = tracing::info_span!(
        "http",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    if enabled() {
        set_parent(&span, extract_http(headers));
    }
    span
}

/// A `traceparent`-only carrier, for the text recorded in the event log.
#[derive(Default)]
struct Carrier {
    traceparent: Option<String>,
}

impl Injector for Carrier {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.traceparent = Some(value);
        }
    }
}

impl Extractor for Carrier {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT)
            .then_some(self.traceparent.as_deref())
            .flatten()
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

struct NatsHeaders<'a>(&'a mut async_nats::HeaderMap);

impl Injector for NatsHeaders<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct NatsHeadersRef<'a>(&'a async_nats::HeaderMap);

impl Extractor for NatsHeadersRef<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|value| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_ref()).collect()
    }
}

struct Metadata<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for Metadata<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct HttpHeaders<'a>(&'a http::HeaderMap);

impl Extractor for HttpHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    use super::*;

    fn remote() -> Context {
        let span_context = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("a valid trace id"),
            SpanId::from_hex("00f067aa0ba902b7").expect("a valid span id"),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        Context::new().with_remote_span_context(span_context)
    }

    #[test]
    fn traceparent_text_round_trips() {
        let text = traceparent(&remote()).expect("a valid context has a traceparent");
        assert_eq!(
            text,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let back = from_traceparent(&text);
        assert_eq!(
            back.span().span_context().trace_id(),
            remote().span().span_context().trace_id()
        );
        assert!(traceparent(&Context::new()).is_none());
        assert!(!from_traceparent("").span().span_context().is_valid());
        assert!(
            !from_traceparent("not-a-traceparent")
                .span()
                .span_context()
                .is_valid()
        );
    }

    #[test]
    fn new_roots_are_valid_and_differ() {
        let (one, two) = (new_root_traceparent(), new_root_traceparent());
        assert_ne!(one, two);
        assert!(
            from_traceparent(&one).span().span_context().is_valid(),
            "{one}"
        );
        assert!(one.starts_with("00-") && one.ends_with("-01"), "{one}");
    }
}
