//! The one place that creates the gRPC clients of the coordinator and the planner and turns
//! transport failures and gRPC statuses into messages that say what to do. Every call carries the
//! credentials `main` loaded once ([`init`]): the bearer token and the TLS settings.

use std::error::Error as _;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tonic::{Code, Status};
use trellis_grpc::{AuthChannel, ClientSecurity};
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::planner_client::PlannerClient;
use trellis_proto::v1::{self, ObserveExecutionRequest, ObserveExecutionResponse};

use crate::commands::Failure;

/// Where `trellis` looks for a coordinator when neither `--coordinator` nor `TRELLIS_COORDINATOR`
/// says otherwise; `trellis dev` listens there.
pub const DEFAULT_COORDINATOR: &str = "http://127.0.0.1:7400";

/// How long to wait for the TCP connection before saying nobody is there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How many times in a row a broken event stream is reopened before giving up.
const MAX_REOPENS: u32 = 5;

/// An observer's items, from `ObserveExecution` or the rest of a `RunExecution`.
type Items = Pin<Box<dyn Stream<Item = Result<ObserveExecutionResponse, Status>> + Send>>;

/// The credentials of this process's calls.
static SECURITY: OnceLock<ClientSecurity> = OnceLock::new();

/// Sets the credentials every call of this process carries; the first call wins.
pub fn init(security: ClientSecurity) {
    let _ = SECURITY.set(security);
}

fn security() -> ClientSecurity {
    SECURITY.get().cloned().unwrap_or_default()
}

/// Connects to `url` with the process's credentials.
async fn connect(url: &str) -> Result<AuthChannel, ConnectFailure> {
    let security = security();
    let endpoint = security
        .endpoint(url)
        .map_err(|e| ConnectFailure::BadAddress(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| ConnectFailure::Unreachable(root_cause(&e).to_lowercase()))?;
    Ok(security.wrap(channel))
}

enum ConnectFailure {
    BadAddress(String),
    Unreachable(String),
}

/// A connected coordinator client and the address it was reached at, for messages.
#[derive(Debug, Clone)]
pub struct Coordinator {
    pub url: String,
    pub client: CoordinatorClient<AuthChannel>,
}

impl Coordinator {
    /// Connects to the coordinator at `url`.
    ///
    /// # Errors
    ///
    /// Bad input (exit 2) for a URL that cannot be parsed; a failure naming `trellis dev` when
    /// nothing answers there.
    pub async fn connect(url: &str) -> Result<Self, Failure> {
        let channel = connect(url).await.map_err(|failure| match failure {
            ConnectFailure::BadAddress(why) => Failure::bad_input(format!(
                "invalid coordinator address {url:?}: expected a URL such as \
                 {DEFAULT_COORDINATOR} ({why})"
            )),
            ConnectFailure::Unreachable(cause) => {
                Failure::failed(format!("{} ({cause})", not_running(url)))
            }
        })?;
        Ok(Self {
            url: url.to_owned(),
            // The coordinator's answers may be as large as it sends: an observation's first
            // event carries the plan's text and compiled form (about 8 MB for 200,000 small
            // tasks, the most a plan may have), past the 4 MiB tonic lets a client decode.
            client: CoordinatorClient::new(channel)
                .max_decoding_message_size(trellis_coordinator::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(trellis_coordinator::MAX_MESSAGE_BYTES),
        })
    }

    /// Turns a failed call into a message: `what` names the call's subject, e.g.
    /// `execution 0190…`.
    pub fn status_failure(&self, status: &Status, what: &str) -> Failure {
        let message = status.message();
        match status.code() {
            Code::NotFound => Failure::failed(format!("{what} not found")),
            Code::InvalidArgument | Code::OutOfRange => {
                Failure::bad_input(format!("{what}: {message}"))
            }
            Code::FailedPrecondition => Failure::failed(format!("{what}: {message}")),
            // The message names the execution and where its log broke.
            Code::DataLoss => Failure::failed(message.to_owned()),
            Code::Unauthenticated => Failure::failed(format!(
                "the coordinator at {} refused the call: {message} (set TRELLIS_TOKEN or pass \
                 --token)",
                self.url
            )),
            Code::PermissionDenied => Failure::failed(format!("{what}: not allowed: {message}")),
            Code::Unavailable => Failure::failed(format!("{} ({message})", not_running(&self.url))),
            Code::DeadlineExceeded => Failure::failed(format!(
                "the coordinator at {} did not answer in time: {message}",
                self.url
            )),
            code => Failure::failed(format!("{what}: {code:?}: {message}")),
        }
    }
}

impl Coordinator {
    /// Reads one execution (`GetExecution`); a refusal becomes a message naming it.
    ///
    /// # Errors
    ///
    /// The coordinator's refusal, or an answer without the execution.
    pub async fn execution(&mut self, execution_id: &str) -> Result<v1::Execution, Failure> {
        let what = format!("execution {execution_id}");
        self.client
            .get_execution(v1::GetExecutionRequest {
                execution_id: execution_id.to_owned(),
            })
            .await
            .map_err(|status| self.status_failure(&status, &what))?
            .into_inner()
            .execution
            .ok_or_else(|| Failure::failed(format!("{what} not found")))
    }

    /// Reads an execution's graph (`GetExecutionGraph`) for run `run_number` (0: the latest);
    /// a refusal becomes a message naming it.
    ///
    /// # Errors
    ///
    /// The coordinator's refusal.
    pub async fn graph(
        &mut self,
        execution_id: &str,
        run_number: u32,
    ) -> Result<v1::ExecutionGraph, Failure> {
        let what = format!("execution {execution_id}");
        Ok(self
            .client
            .get_execution_graph(v1::GetExecutionGraphRequest {
                execution_id: execution_id.to_owned(),
                run_number,
            })
            .await
            .map_err(|status| self.status_failure(&status, &what))?
            .into_inner()
            .graph
            .unwrap_or_default())
    }

    /// Follows an execution's events from `from_sequence`, calling `on_item` for each stream item
    /// in order, until the stream ends (after the run's terminal event) or `on_item` breaks.
    ///
    /// A stream that breaks (a restarted coordinator, a dropped connection) is reopened from the
    /// sequence after the last one seen, as `ObserveExecution` allows, so nothing is missed or
    /// repeated.
    ///
    /// # Errors
    ///
    /// The coordinator's refusal (unknown execution, ...), a stream that keeps breaking, or what
    /// `on_item` returns.
    pub async fn observe(
        &mut self,
        execution_id: &str,
        from_sequence: u64,
        on_item: impl FnMut(ObserveExecutionResponse) -> Result<ControlFlow<()>, Failure>,
    ) -> Result<(), Failure> {
        self.follow(execution_id, from_sequence, None, on_item)
            .await
    }

    /// [`Self::observe`], reading `opened` first when there is one (the rest of a
    /// `RunExecution` stream), then observers opened from the sequence after the last one seen.
    async fn follow(
        &mut self,
        execution_id: &str,
        from_sequence: u64,
        mut opened: Option<Items>,
        mut on_item: impl FnMut(ObserveExecutionResponse) -> Result<ControlFlow<()>, Failure>,
    ) -> Result<(), Failure> {
        let what = format!("execution {execution_id}");
        let mut next_sequence = from_sequence.max(1);
        let mut n_reopens = 0;
        loop {
            let stream = match opened.take() {
                Some(stream) => Ok(stream),
                None => {
                    let request = ObserveExecutionRequest {
                        execution_id: execution_id.to_owned(),
                        from_sequence: next_sequence,
                        progress_only: false,
                    };
                    self.client
                        .observe_execution(request)
                        .await
                        .map(|response| -> Items { Box::pin(response.into_inner()) })
                }
            };
            let broken = match stream {
                Ok(mut stream) => loop {
                    match stream.next().await {
                        Some(Ok(item)) => {
                            n_reopens = 0;
                            if let Some(event) = &item.event {
                                next_sequence = event.sequence + 1;
                            }
                            if on_item(item)?.is_break() {
                                return Ok(());
                            }
                        }
                        None => return Ok(()),
                        Some(Err(status)) => break status,
                    }
                },
                Err(status) => status,
            };
            if !is_transient(&broken) || n_reopens >= MAX_REOPENS {
                return Err(self.status_failure(&broken, &what));
            }
            n_reopens += 1;
            tokio::time::sleep(Duration::from_millis(200 << n_reopens)).await;
        }
    }

    /// Starts an execution and follows its events in one `RunExecution` call: `on_started` gets
    /// the start's answer once it is stored, `on_item` each later item as in [`Self::observe`].
    /// A stream that breaks after the start is followed on with `ObserveExecution` from the
    /// sequence after the last one seen; the call itself is never sent twice, which would start
    /// a second execution (but with an idempotency key).
    ///
    /// # Errors
    ///
    /// The coordinator's refusal of the start (an invalid plan, ...), a stream that breaks
    /// before naming the execution or keeps breaking after, or what the callbacks return.
    pub async fn run(
        &mut self,
        start: v1::StartExecutionRequest,
        what: &str,
        on_started: impl FnOnce(&v1::StartExecutionResponse) -> Result<(), Failure>,
        on_item: impl FnMut(ObserveExecutionResponse) -> Result<ControlFlow<()>, Failure>,
    ) -> Result<String, Failure> {
        let request = v1::RunExecutionRequest {
            start: Some(start),
            progress_only: false,
        };
        let mut stream = self
            .client
            .run_execution(request)
            .await
            .map_err(|status| self.status_failure(&status, what))?
            .into_inner();
        let started = match stream.message().await {
            Ok(Some(v1::RunExecutionResponse {
                started: Some(started),
                ..
            })) => started,
            Ok(_) => {
                return Err(Failure::failed(format!(
                    "{what}: the coordinator's answer did not name the execution it started"
                )));
            }
            Err(status) => return Err(self.status_failure(&status, what)),
        };
        on_started(&started)?;
        let execution_id = started.execution_id;
        let observed = stream.filter_map(|item| {
            std::future::ready(match item {
                Ok(item) => item.observed.map(Ok),
                Err(status) => Some(Err(status)),
            })
        });
        self.follow(&execution_id, 1, Some(Box::pin(observed)), on_item)
            .await?;
        Ok(execution_id)
    }
}

/// The message for a coordinator that cannot be reached, naming the fix.
/// Connects to the planner at `url`.
///
/// # Errors
///
/// Bad input (exit 2) for a URL that cannot be parsed; a failure naming `trellis planner` when
/// nothing answers there.
pub async fn planner(url: &str) -> Result<PlannerClient<AuthChannel>, Failure> {
    let channel = planner_channel(url).await?;
    Ok(PlannerClient::new(channel)
        .max_decoding_message_size(trellis_planner::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(trellis_planner::MAX_MESSAGE_BYTES))
}

/// Connects to the planner at `url` (its `Planner` and `Backlog` services share the channel).
///
/// # Errors
///
/// As [`planner`].
pub async fn planner_channel(url: &str) -> Result<AuthChannel, Failure> {
    connect(url).await.map_err(|failure| match failure {
        ConnectFailure::BadAddress(why) => Failure::bad_input(format!(
            "invalid planner address {url:?}: expected a URL such as http://127.0.0.1:7600 \
             ({why})"
        )),
        ConnectFailure::Unreachable(cause) => Failure::failed(format!(
            "no planner at {url}: start one with `trellis planner`, or drop --planner to compile \
             here ({cause})"
        )),
    })
}

fn not_running(url: &str) -> String {
    format!("no coordinator at {url}: start one with `trellis dev`, or pass --coordinator URL")
}

/// Returns the innermost cause of `e` (e.g. "Connection refused"), which says more than tonic's
/// "transport error".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: &(dyn std::error::Error + 'static) = e;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// Returns whether a stream that failed with `status` is worth reopening.
fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Internal | Code::Aborted
    ) || status.source().is_some()
}
