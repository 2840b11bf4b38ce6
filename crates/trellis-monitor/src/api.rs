//! The HTTP API of `API.md`: reads from the coordinator, the checkpoint-store and the live hubs;
//! controls forwarded to the coordinator once the caller's token checks out.
//!
//! Who may do what depends on [`Access`]: with a shared token, reads are open and controls need
//! the token; when forwarding tokens, every call carries the caller's bearer token to the
//! coordinator, which decides (namespaces included), and reads the monitor serves itself (the
//! live projections, checkpoints) are first checked by asking the coordinator for the execution
//! with that token.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use trellis_core::ids::ExecutionId;
use trellis_grpc::AuthChannel;
use trellis_proto::v1;
use trellis_proto::v1::checkpoint_store_client::CheckpointStoreClient;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_telemetry::redact::Secret;

use crate::assets;
use crate::hub::{Hub, HubError, Hubs};

mod backlog;
mod history;
mod logs;
use crate::metrics::{Metrics, Open};
use crate::views::{CheckpointView, ExecutionView, QuestionView, WorkerView};

/// A stream with nothing to send writes a comment this often, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Most events one `/events` page returns.
const MAX_EVENTS_PAGE: usize = 5_000;
/// Most executions one `/api/executions` page returns (the coordinator's own cap).
const MAX_LIST_PAGE: u32 = 1_000;

/// What every handler shares.
#[derive(Clone, Debug)]
pub struct App {
    pub hubs: Arc<Hubs>,
    pub coordinator: CoordinatorClient<AuthChannel>,
    pub store: Option<CheckpointStoreClient<AuthChannel>>,
    /// The planner's backlog; without it `/api/backlog` says so.
    pub backlog: Option<v1::backlog_client::BacklogClient<AuthChannel>>,
    pub access: Access,
    pub shutdown: CancellationToken,
    pub metrics: Metrics,
    pub names: Names,
}

/// Execution names by id, for the workers page's running tasks (a name never changes, so each
/// is asked for once).
#[derive(Clone, Debug, Default)]
pub struct Names(Arc<std::sync::Mutex<HashMap<String, String>>>);

/// Most names kept; past it the cache starts over.
const MAX_NAMES: usize = 10_000;
/// Most names asked for in one `/api/workers` request.
const MAX_NAME_LOOKUPS: usize = 32;

impl Names {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // A panic while holding the map leaves it usable: it is only a cache.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Who may read and control through the monitor.
#[derive(Clone, Debug)]
pub enum Access {
    /// Reads are open; every control is refused.
    ReadOnly,
    /// Reads are open; controls need this token.
    SharedToken(Secret),
    /// Every call needs the caller's bearer token, which the coordinator checks: a token sees
    /// and controls only its namespace's executions.
    ForwardTokens,
}

impl Access {
    fn controls(&self) -> bool {
        !matches!(self, Self::ReadOnly)
    }
}

impl App {
    /// How callers are authorized, for the log (never the token).
    pub fn access_mode(&self) -> &'static str {
        match self.access {
            Access::ReadOnly => "read-only",
            Access::SharedToken(_) => "control token",
            Access::ForwardTokens => "forwarded tokens",
        }
    }
}

/// The caller's bearer token, when the monitor forwards tokens.
#[derive(Debug)]
pub struct Caller(Option<Secret>);

impl axum::extract::FromRequestParts<App> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        app: &App,
    ) -> Result<Self, Self::Rejection> {
        if !matches!(app.access, Access::ForwardTokens) {
            return Ok(Self(None));
        }
        let from_header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|token| !token.is_empty())
            .map(Secret::new);
        // EventSource cannot set headers: the live stream may carry the token in its address.
        let from_query = || {
            Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
                .ok()?
                .0
                .into_iter()
                .find(|(key, _)| key == "access_token")
                .map(|(_, value)| Secret::new(value))
        };
        match from_header.or_else(from_query) {
            Some(token) => Ok(Self(Some(token))),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "this monitor needs your token: send `Authorization: Bearer <token>` (enter it \
                 in the UI's token field)",
            )),
        }
    }
}

impl Caller {
    /// A request to a service, carrying the caller's token when there is one.
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, ApiError> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.0 {
            trellis_grpc::client::on_behalf_of(&mut request, token)?;
        }
        Ok(request)
    }
}

/// An error answer: `{"error": message}` with a status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(json!({ "error": self.message }))).into_response()
    }
}

impl ApiError {
    /// The answer for a failed call to `service` (`coordinator`, `checkpoint-store`).
    fn upstream(service: &str, status: tonic::Status) -> Self {
        use tonic::Code;
        let code = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            // `DataLoss`: the execution's log does not replay; it needs attention.
            Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted | Code::DataLoss => {
                StatusCode::CONFLICT
            }
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable | Code::DeadlineExceeded | Code::Unknown => StatusCode::BAD_GATEWAY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = if code == StatusCode::BAD_GATEWAY {
            format!("the {service} did not answer: {}", status.message())
        } else {
            status.message().to_owned()
        };
        Self::new(code, message)
    }
}

/// Most calls go to the coordinator.
impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        Self::upstream("coordinator", status)
    }
}

impl From<HubError> for ApiError {
    fn from(err: HubError) -> Self {
        let status = match err {
            HubError::Unknown(_) => StatusCode::NOT_FOUND,
            HubError::Log { .. } | HubError::Replay(_) => StatusCode::BAD_GATEWAY,
        };
        Self::new(status, err.to_string())
    }
}

type ApiResult = Result<Response, ApiError>;

/// The routes of the UI and the API; every request runs in its own span and is counted.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/assets/{file}", get(assets::file))
        .route(
            "/api/health",
            get(|| async { axum::Json(json!({ "ok": true })) }),
        )
        .route("/api/config", get(config))
        .route("/api/executions", get(list_executions))
        .route("/api/executions/{id}", get(get_execution))
        .route("/api/executions/{id}/plan", get(plan))
        .route("/api/executions/{id}/instances", get(instances))
        .route("/api/executions/{id}/instances/{instance}", get(instance))
        .route("/api/executions/{id}/events", get(events))
        .route("/api/executions/{id}/checkpoints", get(checkpoints))
        .route("/api/executions/{id}/logs", get(logs::logs))
        .route("/api/executions/{id}/logs/live", get(logs::logs_live))
        .route("/api/executions/{id}/live", get(live))
        .route("/api/plans/{name}/history", get(history::plan_history))
        .route("/api/workers", get(workers))
        .route("/api/cluster", get(cluster))
        .route("/api/pauses", get(pauses))
        .route("/api/backlog", get(backlog::backlog))
        .route(
            "/api/backlog/suggestions/{id}/{action}",
            post(backlog::resolve),
        )
        .route("/api/executions/{id}/{action}", post(control))
        .route(
            "/api/executions/{id}/questions/{question}/answer",
            post(answer),
        )
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such page or endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            app.metrics.clone(),
            crate::metrics::track,
        ))
        .with_state(app)
}

fn json(value: &impl serde::Serialize) -> Response {
    axum::Json(value).into_response()
}

/// Parses an execution id from the path.
fn execution_id(text: &str) -> Result<ExecutionId, ApiError> {
    text.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "execution id `{text}` is not a UUID (copy it from the executions list)"
        ))
    })
}

async fn config(State(app): State<App>) -> Response {
    json(&json!({
        "controls": app.access.controls(),
        // Every call needs the caller's token: the UI asks for it before reading.
        "token_required": matches!(app.access, Access::ForwardTokens),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// When tokens are forwarded, checks with the coordinator that the caller may see execution
/// `id` (another namespace's execution is not found, as for the coordinator itself).
async fn authorize_read(app: &App, caller: &Caller, id: ExecutionId) -> Result<(), ApiError> {
    if caller.0.is_none() {
        return Ok(());
    }
    app.coordinator
        .clone()
        .get_execution(caller.request(v1::GetExecutionRequest {
            execution_id: id.to_string(),
        })?)
        .await?;
    Ok(())
}

async fn list_executions(
    State(mut app): State<App>,
    caller: Caller,
    // Pairs rather than a struct: `state` may repeat.
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(pairs) = query.map_err(|err| ApiError::bad_request(err.body_text()))?;
    let mut states = Vec::new();
    let mut name = String::new();
    let mut page_size = MAX_LIST_PAGE;
    let mut page_token = String::new();
    for (key, value) in pairs {
        match key.as_str() {
            "page_size" => page_size = whole_number_in("page_size", &value, 1, MAX_LIST_PAGE)?,
            "page_token" => page_token = value,
            "state" if !value.is_empty() => {
                let state = execution_state_from_name(&value).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "state `{value}` is not an execution state (pending, running, paused, \
                         waiting_for_human, completed, failed, cancelled)"
                    ))
                })?;
                states.push(state as i32);
            }
            "name" => name = value,
            _ => {}
        }
    }
    let response = app
        .coordinator
        .list_executions(caller.request(v1::ListExecutionsRequest {
            states,
            name_contains: name,
            page: Some(v1::PageRequest {
                page_size,
                page_token,
            }),
            ..Default::default()
        })?)
        .await?
        .into_inner();
    let executions: Vec<ExecutionView> = response
        .executions
        .iter()
        .map(ExecutionView::from_proto)
        .collect();
    let next_page_token = response
        .page
        .map(|page| page.next_page_token)
        .filter(|token| !token.is_empty());
    Ok(json(
        &json!({ "executions": executions, "next_page_token": next_page_token }),
    ))
}

/// Parses query parameter `key` as a whole number from `min` to `max`.
fn whole_number_in(key: &str, value: &str, min: u32, max: u32) -> Result<u32, ApiError> {
    match value.trim().parse::<u32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(n) => Err(ApiError::bad_request(format!(
            "{key} {n} is out of range: ask for {min} to {max}"
        ))),
        Err(_) => Err(ApiError::bad_request(format!(
            "{key} `{value}` is not a whole number: ask for {min} to {max}"
        ))),
    }
}

/// The wire state named `name` (`running`, `waiting_for_human`, ...).
fn execution_state_from_name(name: &str) -> Option<v1::ExecutionState> {
    v1::ExecutionState::from_str_name(&format!("EXECUTION_STATE_{}", name.to_ascii_uppercase()))
        .filter(|state| *state != v1::ExecutionState::Unspecified)
}

async fn get_execution(
    State(mut app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult {
    let id = execution_id(&id)?;
    let execution = app
        .coordinator
        .get_execution(caller.request(v1::GetExecutionRequest {
            execution_id: id.to_string(),
        })?)
        .await?
        .into_inner()
        .execution
        .ok_or_else(|| {
            ApiError::new(StatusCode::BAD_GATEWAY, "the coordinator sent no execution")
        })?;
    let questions: Vec<QuestionView> = execution
        .open_questions
        .iter()
        .map(QuestionView::from_proto)
        .collect();
    let holds: Vec<Value> = execution
        .holds
        .iter()
        .map(|hold| {
            let scope = if hold.task_id.is_empty() {
                format!("group {}", hold.group_id)
            } else {
                format!("task {}", hold.task_id)
            };
            json!({
                "scope": scope,
                "task_id": hold.task_id,
                "group_id": hold.group_id,
                "mode": pause_mode_name(hold.mode),
                "reason": hold.reason,
                "since_ms": hold.since_unix_ms,
            })
        })
        .collect();
    Ok(json(&json!({
        "execution": ExecutionView::from_proto(&execution),
        "questions": questions,
        "holds": holds,
    })))
}

/// The snake_case name of a wire pause mode.
fn pause_mode_name(mode: i32) -> &'static str {
    trellis_wire::log::pause_mode_from_proto(mode).as_str()
}

/// The pauses of queues, namespaces and the fleet in force: what holds work back and why.
async fn pauses(State(mut app): State<App>, caller: Caller) -> ApiResult {
    use v1::pause_target::Target;
    let response = app
        .coordinator
        .list_pauses(caller.request(v1::ListPausesRequest {})?)
        .await?
        .into_inner();
    let pauses: Vec<Value> = response
        .pauses
        .iter()
        .map(|pause| {
            let (kind, name, target) = match pause.target.as_ref().and_then(|t| t.target.as_ref()) {
                Some(Target::Queue(queue)) => ("queue", queue.clone(), format!("queue {queue}")),
                Some(Target::Namespace(ns)) => ("namespace", ns.clone(), format!("namespace {ns}")),
                Some(Target::All(_)) | None => ("all", String::new(), "the whole fleet".to_owned()),
            };
            json!({
                "kind": kind,
                "name": name,
                "target": target,
                "mode": pause_mode_name(pause.mode),
                "reason": pause.reason,
                "since_ms": pause.since_unix_ms,
                "by": pause.by,
            })
        })
        .collect();
    Ok(json(&json!({ "pauses": pauses })))
}

/// The live projection of execution `id`, once the caller may see it.
async fn hub(app: &App, caller: &Caller, id: &str) -> Result<Arc<Hub>, ApiError> {
    let id = execution_id(id)?;
    authorize_read(app, caller, id).await?;
    Ok(app.hubs.get(id).await?)
}

async fn plan(State(app): State<App>, caller: Caller, Path(id): Path<String>) -> ApiResult {
    let hub = hub(&app, &caller, &id).await?;
    let plan = tokio::task::spawn_blocking(move || hub.plan())
        .await
        .map_err(|err| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("drawing the plan failed: {err}"),
            )
        })?;
    let plan = plan.ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "the execution's plan is not loaded",
        )
    })?;
    Ok(json(&*plan))
}

async fn instances(State(app): State<App>, caller: Caller, Path(id): Path<String>) -> ApiResult {
    let hub = hub(&app, &caller, &id).await?;
    let (seq, instances) = hub.instances();
    Ok(json(&json!({ "seq": seq, "instances": instances })))
}

/// One instance in full, for the task drawer.
async fn instance(
    State(app): State<App>,
    caller: Caller,
    Path((id, instance)): Path<(String, String)>,
) -> ApiResult {
    let instance_id: trellis_core::ids::TaskInstanceId = instance.parse().map_err(|_| {
        ApiError::bad_request(format!("instance `{instance}` is not a task instance id"))
    })?;
    let hub = hub(&app, &caller, &id).await?;
    let detail = hub.instance(instance_id).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!("execution {id} has no task instance {instance}"),
        )
    })?;
    Ok(json(&detail))
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    from: Option<u64>,
    limit: Option<usize>,
}

async fn events(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|err| {
        ApiError::bad_request(format!(
            "{}: `from` and `limit` must be whole numbers",
            err.body_text()
        ))
    })?;
    let limit = query.limit.unwrap_or(500);
    if limit == 0 || limit > MAX_EVENTS_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit {limit} is out of range: ask for 1 to {MAX_EVENTS_PAGE} events"
        )));
    }
    let hub = hub(&app, &caller, &id).await?;
    let (events, next) = app
        .hubs
        .events(&hub, query.from.unwrap_or(1), limit)
        .await?;
    Ok(json(&json!({ "events": events, "next": next })))
}

/// A response of Server-Sent Events with `body` as its frames.
fn event_stream(body: Body) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

async fn checkpoints(State(app): State<App>, caller: Caller, Path(id): Path<String>) -> ApiResult {
    let id = execution_id(&id)?;
    // The store serves every namespace to the monitor's own token: the caller's is checked first.
    authorize_read(&app, &caller, id).await?;
    let Some(mut store) = app.store.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no checkpoint-store configured: start the monitor with --checkpoint-store URL",
        ));
    };
    let response = store
        .list_checkpoints(v1::ListCheckpointsRequest {
            execution_id: id.to_string(),
            page: Some(v1::PageRequest {
                page_size: 1000,
                page_token: String::new(),
            }),
        })
        .await
        .map_err(|status| ApiError::upstream("checkpoint-store", status))?
        .into_inner();
    let checkpoints: Vec<CheckpointView> = response
        .checkpoints
        .iter()
        .map(CheckpointView::from_proto)
        .collect();
    Ok(json(&json!({ "checkpoints": checkpoints })))
}

async fn workers(State(mut app): State<App>, caller: Caller) -> ApiResult {
    let response = app
        .coordinator
        .list_workers(caller.request(v1::ListWorkersRequest {
            queue: String::new(),
            include_terminated: true,
        })?)
        .await?
        .into_inner();
    let mut workers: Vec<WorkerView> = response
        .workers
        .iter()
        .map(WorkerView::from_proto)
        .collect();
    name_running_executions(&app, &caller, &mut workers).await;
    let breakers: Vec<Value> = response.breakers.iter().map(breaker_view).collect();
    Ok(json(&json!({ "workers": workers, "breakers": breakers })))
}

/// Fills in the names of the executions the workers run tasks of: from the cache, else asked of
/// the coordinator with the caller's token (at most [`MAX_NAME_LOOKUPS`] at once; one it will not
/// answer stays unnamed).
async fn name_running_executions(app: &App, caller: &Caller, workers: &mut [WorkerView]) {
    let unknown: std::collections::BTreeSet<String> = {
        let names = app.names.lock();
        workers
            .iter()
            .flat_map(|worker| &worker.running)
            .map(|running| &running.execution_id)
            .filter(|id| !names.contains_key(*id))
            .take(MAX_NAME_LOOKUPS)
            .cloned()
            .collect()
    };
    let lookups = unknown.into_iter().filter_map(|id| {
        let request = caller
            .request(v1::GetExecutionRequest {
                execution_id: id.clone(),
            })
            .ok()?;
        let mut coordinator = app.coordinator.clone();
        Some(async move {
            let name = coordinator
                .get_execution(request)
                .await
                .ok()?
                .into_inner()
                .execution?
                .name;
            Some((id, name))
        })
    });
    let found: Vec<(String, String)> = futures::future::join_all(lookups)
        .await
        .into_iter()
        .flatten()
        .collect();
    let mut names = app.names.lock();
    if names.len() + found.len() > MAX_NAMES {
        names.clear();
    }
    names.extend(found);
    for running in workers
        .iter_mut()
        .flat_map(|worker| worker.running.iter_mut())
    {
        running.execution_name = names.get(&running.execution_id).cloned();
    }
}

/// A circuit breaker as the workers page shows it: `{queue, task_type, state (closed|open|
/// half_open), consecutive_failures, retry_at_ms (null unless open), coordinator}`.
fn breaker_view(breaker: &v1::CircuitBreaker) -> Value {
    json!({
        "queue": breaker.queue,
        "task_type": breaker.task_type,
        "state": v1::BreakerState::label_of(breaker.state),
        "consecutive_failures": breaker.consecutive_failures,
        "retry_at_ms": breaker.retry_at_unix_ms,
        "coordinator": breaker.coordinator_id,
    })
}

/// The coordinators, as `GetCluster` through the configured coordinator reports them.
async fn cluster(State(mut app): State<App>, caller: Caller) -> ApiResult {
    let response = app
        .coordinator
        .get_cluster(caller.request(v1::GetClusterRequest {})?)
        .await?
        .into_inner();
    let coordinators: Vec<Value> = response
        .coordinators
        .iter()
        .map(|c| {
            json!({
                "id": c.coordinator_id,
                "address": c.address,
                "shards": c.shards,
                "executions_in_memory": c.executions_in_memory,
                "lag": c.lag,
                "reported_at_ms": c.reported_at_unix_ms,
                "started_at_ms": c.started_at_unix_ms,
            })
        })
        .collect();
    Ok(json(&json!({
        "shards": response.shards,
        "coordinators": coordinators,
        "unowned_shards": response.unowned_shards,
        "answered_by": response.answered_by,
    })))
}

#[derive(Debug, Deserialize)]
struct LiveQuery {
    records: Option<String>,
}

/// The live stream: a snapshot, then every update of the execution's hub, as Server-Sent Events.
async fn live(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<LiveQuery>,
) -> ApiResult {
    let records = !matches!(query.records.as_deref(), Some("0" | "false"));
    let hub = hub(&app, &caller, &id).await?;
    let (snapshot, receiver) = hub.subscribe(records);
    struct Live {
        hub: Arc<Hub>,
        receiver: tokio::sync::broadcast::Receiver<Bytes>,
        first: Option<Bytes>,
        records: bool,
        shutdown: CancellationToken,
        resnapshots: prometheus_client::metrics::counter::Counter,
        _open: Open,
    }
    let state = Live {
        hub,
        receiver,
        first: Some(snapshot),
        records,
        shutdown: app.shutdown.clone(),
        resnapshots: app.metrics.live_resnapshots.clone(),
        _open: Open::new(&app.metrics.live_streams),
    };
    let frames = futures::stream::unfold(state, |mut live| async move {
        if let Some(first) = live.first.take() {
            return Some((Ok::<Bytes, Infallible>(first), live));
        }
        let frame = tokio::select! {
            () = live.shutdown.cancelled() => return None,
            received = tokio::time::timeout(KEEP_ALIVE, live.receiver.recv()) => match received {
                Ok(Ok(frame)) => frame,
                // Too far behind: start again from a fresh snapshot rather than skip updates.
                Ok(Err(RecvError::Lagged(_))) => {
                    live.resnapshots.inc();
                    let (snapshot, receiver) = live.hub.subscribe(live.records);
                    live.receiver = receiver;
                    snapshot
                }
                Ok(Err(RecvError::Closed)) => return None,
                Err(_) => Bytes::from_static(b": keep-alive\n\n"),
            },
        };
        Some((Ok(frame), live))
    });
    Ok(event_stream(Body::from_stream(frames)))
}

/// Checks the bearer token of a control request against the shared token; when tokens are
/// forwarded, the coordinator checks the caller's instead.
fn authorize(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let expected = match &app.access {
        Access::ForwardTokens => return Ok(()),
        Access::SharedToken(token) => token.expose(),
        Access::ReadOnly => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "controls are disabled: this monitor was started without --monitor-token",
            ));
        }
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "this control needs the monitor's token: send `Authorization: Bearer <token>`",
            )
        })?;
    if constant_time_eq(given.trim().as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "the token is wrong: nothing was changed",
        ))
    }
}

/// Compares without stopping at the first difference, so timing tells nothing of the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The JSON body of a control: `{}`, empty, or an object with string fields.
fn body_fields(body: &Bytes) -> Result<HashMap<String, String>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(HashMap::new());
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("the request body is not JSON: {err}")))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    fields
        .into_iter()
        .map(|(key, value)| match value {
            Value::String(text) => Ok((key, text)),
            other => Err(ApiError::bad_request(format!(
                "field `{key}` must be a string, not {other}"
            ))),
        })
        .collect()
}

async fn control(
    State(mut app): State<App>,
    caller: Caller,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    authorize(&app, &headers)?;
    let id = execution_id(&id)?;
    let fields = body_fields(&body)?;
    let reason = fields
        .get("reason")
        .cloned()
        .unwrap_or_else(|| "from the monitor".to_owned());
    let execution_id = id.to_string();
    let state_of = |state: i32| json!({ "state": crate::views::execution_state_name(state) });
    let answer = match action.as_str() {
        "pause" => {
            let r = app
                .coordinator
                .pause_execution(caller.request(v1::PauseExecutionRequest {
                    execution_id,
                    reason,
                    ..Default::default()
                })?)
                .await?;
            state_of(r.into_inner().state)
        }
        "resume" => {
            let r = app
                .coordinator
                .resume_execution(caller.request(v1::ResumeExecutionRequest {
                    execution_id,
                    reason,
                    ..Default::default()
                })?)
                .await?;
            state_of(r.into_inner().state)
        }
        "cancel" => {
            let r = app
                .coordinator
                .cancel_execution(caller.request(v1::CancelExecutionRequest {
                    execution_id,
                    reason,
                })?)
                .await?;
            state_of(r.into_inner().state)
        }
        "retry" => {
            let r = app
                .coordinator
                .retry_execution(caller.request(v1::RetryExecutionRequest { execution_id })?)
                .await?;
            json!({ "run_number": r.into_inner().run_number })
        }
        "checkpoint" => {
            let r = app
                .coordinator
                .checkpoint_execution(
                    caller.request(v1::CheckpointExecutionRequest { execution_id })?,
                )
                .await?
                .into_inner();
            json!({ "checkpoint": r.checkpoint.as_ref().map(CheckpointView::from_proto) })
        }
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no control `{other}`: use pause, resume, cancel, retry or checkpoint"),
            ));
        }
    };
    tracing::info!(%id, %action, "control applied");
    Ok(json(&answer))
}

async fn answer(
    State(mut app): State<App>,
    caller: Caller,
    Path((id, question)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult {
    authorize(&app, &headers)?;
    let id = execution_id(&id)?;
    let mut fields = body_fields(&body)?;
    let answer = fields
        .remove("answer")
        .filter(|a| !a.trim().is_empty())
        .ok_or_else(|| ApiError::bad_request("field `answer` is missing or empty"))?;
    let response = app
        .coordinator
        .answer_question(
            caller.request(v1::AnswerQuestionRequest {
                execution_id: id.to_string(),
                question_id: question.clone(),
                answer,
                answered_by: fields
                    .remove("answered_by")
                    .unwrap_or_else(|| "monitor".to_owned()),
            })?,
        )
        .await?
        .into_inner();
    tracing::info!(%id, %question, "question answered");
    Ok(json(&json!({
        "sequence": response.sequence,
        "task_instance_id": response.task_instance_id,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"s3cret", b"s3cret"));
        assert!(!constant_time_eq(b"s3cret", b"s3cres"));
        assert!(!constant_time_eq(b"s3cret", b"s3cret!"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn query_pairs_are_decoded_and_may_repeat() {
        let uri: axum::http::Uri = "/api/executions?state=running&state=paused&name=build%20x+y"
            .parse()
            .expect("a URI");
        let Query(pairs) =
            Query::<Vec<(String, String)>>::try_from_uri(&uri).expect("a query of pairs");
        assert_eq!(
            pairs,
            vec![
                ("state".to_owned(), "running".to_owned()),
                ("state".to_owned(), "paused".to_owned()),
                ("name".to_owned(), "build x y".to_owned()),
            ]
        );
        assert_eq!(
            execution_state_from_name("waiting_for_human"),
            Some(v1::ExecutionState::WaitingForHuman)
        );
        assert_eq!(execution_state_from_name("unspecified"), None);
        assert_eq!(execution_state_from_name("runing"), None);
    }

    #[test]
    fn control_bodies_are_objects_of_strings() {
        assert!(
            body_fields(&Bytes::new())
                .expect("empty is fine")
                .is_empty()
        );
        let fields = body_fields(&Bytes::from_static(br#"{"answer":"yes"}"#)).expect("an object");
        assert_eq!(fields.get("answer").map(String::as_str), Some("yes"));
        let err = body_fields(&Bytes::from_static(br#"{"answer":3}"#)).expect_err("a number");
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(err.message.contains("`answer`"), "{}", err.message);
        assert!(body_fields(&Bytes::from_static(b"[1]")).is_err());
        assert!(body_fields(&Bytes::from_static(b"{")).is_err());
    }
}
