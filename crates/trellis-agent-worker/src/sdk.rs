//! The handler SDK: what a task handler implements ([`TaskHandler`]), what it is given
//! ([`TaskContext`]) and what it returns ([`Outcome`]).
//!
//! A handler is any `Fn(TaskContext) -> impl Future<Output = Outcome>` (or a type implementing
//! [`TaskHandler`]); it is registered under a task type in a [`HandlerRegistry`]. The worker owns
//! everything around it: acknowledgement, heartbeats, cancellation, deadlines and result publishing.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use trellis_proto::v1::{self, TaskAssignment};

use trellis_proto::v1::resume_context::ResumedAfter;
pub use trellis_proto::v1::{GroupSummary, HumanAnswer, QuestionTimeoutAction, RecordedStep};

use crate::logs::AttemptLog;
use crate::publish::{ResultSink, json_bytes};
use crate::steps;

/// A task handler: runs one attempt of one task instance.
///
/// Implemented for every `Fn(TaskContext) -> Fut` where `Fut` is a `Send` future of [`Outcome`],
/// so a closure or an `async fn` is a handler.
pub trait TaskHandler: Send + Sync + 'static {
    /// Runs the attempt described by `ctx`. The future is dropped when the task is cancelled, its
    /// deadline passes or the worker stops, so the handler's resources should clean up on drop.
    fn run(&self, ctx: TaskContext) -> BoxFuture<'static, Outcome>;
}

impl<F, Fut> TaskHandler for F
where
    F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    fn run(&self, ctx: TaskContext) -> BoxFuture<'static, Outcome> {
        Box::pin(self(ctx))
    }
}

/// How an attempt ended its turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Finished with an output.
    Completed(Value),
    /// Finished with an output that is already UTF-8 JSON text (not re-checked), which saves a
    /// parse and a serialisation for handlers that pass data through, like `noop`.
    CompletedJson(Bytes),
    /// Failed; `retryable: false` tells the coordinator another attempt cannot help.
    Failed { error: String, retryable: bool },
    /// Ended its turn by spawning a group of subtasks; the task is resumed as a new instance with
    /// the group's summary ([`TaskContext::group_summary`]) once the group settles.
    Spawn {
        rule: GroupRule,
        members: Vec<Subtask>,
    },
    /// Ended its turn by asking a human; the task is resumed as a new instance with the answer
    /// ([`TaskContext::answer`]).
    Ask(Question),
    /// Stopped before durable step `step` because a pause in `preempt` mode asked it to
    /// ([`TaskContext::step`] returns [`StepError::Preempted`]); the task runs again from that
    /// step once resumed. Uses no retry.
    Preempted { step: String },
    /// Not run: its message had already been delivered `deliveries` times without a result, each
    /// worker that took it having died (a poison task). Reported as the failure "worker lost
    /// `deliveries` times" (retryable: the plan's failure policy decides). Made by the worker when
    /// a delivery is over `--max-deliveries`, not by handlers.
    Lost { deliveries: u32 },
}

impl Outcome {
    /// Returns a failure.
    pub fn failed(error: impl fmt::Display, retryable: bool) -> Outcome {
        Outcome::Failed {
            error: error.to_string(),
            retryable,
        }
    }

    /// Returns the name used in the result's `Nats-Msg-Id`.
    pub(crate) fn msg_id_suffix(&self) -> &'static str {
        match self {
            Outcome::Completed(_) | Outcome::CompletedJson(_) => "completed",
            Outcome::Failed { .. } => "failed",
            Outcome::Spawn { .. } => "spawned",
            Outcome::Ask(_) => "question",
            Outcome::Preempted { .. } => "preempted",
            Outcome::Lost { .. } => "failed",
        }
    }
}

/// When a spawned group is done (docs/design.md §4). In JSON: `"all_settled"`, `"all_succeeded"`,
/// `"first_success"` or `{"quorum": k}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupRule {
    /// Every member terminal.
    #[default]
    AllSettled,
    /// The first failure ends the group.
    AllSucceeded,
    /// `k` successes end the group.
    Quorum(u32),
    /// The first success ends the group.
    FirstSuccess,
}

impl GroupRule {
    pub(crate) fn to_proto(self) -> v1::CompletionRule {
        let (kind, quorum) = match self {
            GroupRule::AllSettled => (v1::CompletionRuleKind::AllSettled, 0),
            GroupRule::AllSucceeded => (v1::CompletionRuleKind::AllSucceeded, 0),
            GroupRule::Quorum(k) => (v1::CompletionRuleKind::Quorum, k),
            GroupRule::FirstSuccess => (v1::CompletionRuleKind::FirstSuccess, 0),
        };
        v1::CompletionRule {
            kind: kind as i32,
            quorum,
        }
    }
}

/// One member of a spawned group.
#[derive(Debug, Clone, PartialEq)]
pub struct Subtask {
    /// Handler type of the subtask.
    pub task_type: String,
    /// Its input.
    pub input: Value,
    /// The queue to publish it on; `None` means the queue named like `task_type`.
    pub queue: Option<String>,
}

/// A question for a human (docs/design.md §7).
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    /// The question, shown as is.
    pub text: String,
    /// The allowed answers; empty means free text.
    pub options: Vec<String>,
    /// What kind of decision is asked for (free text, e.g. `approval`, `choice`).
    pub question_type: String,
    /// How urgent it is (free text; seed 001 names `critical`, `high`, `medium`, `low`).
    pub priority: String,
    /// When it expires; `None` means never.
    pub expires_at_unix_ms: Option<i64>,
    /// What happens when it expires.
    pub timeout_action: QuestionTimeoutAction,
    /// The answer used by [`QuestionTimeoutAction::AnswerDefault`].
    pub default_answer: String,
}

impl Question {
    /// Returns a plain question with the given options, no expiry.
    pub fn new(text: impl Into<String>, options: Vec<String>) -> Question {
        Question {
            text: text.into(),
            options,
            question_type: String::new(),
            priority: String::new(),
            expires_at_unix_ms: None,
            timeout_action: QuestionTimeoutAction::Unspecified,
            default_answer: String::new(),
        }
    }
}

/// The handlers a worker runs, by task type.
#[derive(Clone, Default)]
pub struct HandlerRegistry {
    handlers: HashMap<String, Arc<dyn TaskHandler>>,
}

impl fmt::Debug for HandlerRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut types: Vec<&String> = self.handlers.keys().collect();
        types.sort();
        f.debug_struct("HandlerRegistry")
            .field("types", &types)
            .finish()
    }
}

impl HandlerRegistry {
    /// Returns an empty registry.
    pub fn new() -> HandlerRegistry {
        HandlerRegistry::default()
    }

    /// Returns a registry holding the built-in handlers of docs/design.md §11: `noop`, `sleep`,
    /// `fail`, `fanout`, `shell`, `http` and `question`, and `steps` (durable steps, seed 002).
    pub fn with_builtins() -> HandlerRegistry {
        let mut registry = HandlerRegistry::new();
        crate::builtins::register(&mut registry);
        registry
    }

    /// Registers `handler` for `task_type`, replacing any earlier one.
    pub fn register(
        &mut self,
        task_type: impl Into<String>,
        handler: impl TaskHandler,
    ) -> &mut Self {
        self.handlers.insert(task_type.into(), Arc::new(handler));
        self
    }

    /// Returns the registry with `handler` registered for `task_type`.
    pub fn with(mut self, task_type: impl Into<String>, handler: impl TaskHandler) -> Self {
        self.register(task_type, handler);
        self
    }

    /// Returns the handler of `task_type`.
    pub fn get(&self, task_type: &str) -> Option<&Arc<dyn TaskHandler>> {
        self.handlers.get(task_type)
    }

    /// Returns the registered task types, sorted.
    pub fn task_types(&self) -> Vec<String> {
        let mut types: Vec<String> = self.handlers.keys().cloned().collect();
        types.sort();
        types
    }
}

/// What the worker tracks for one running attempt; shared by the handler's context, the
/// heartbeat loop and the cancel listener.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) execution_id: String,
    pub(crate) task_instance_id: String,
    /// The instance's task id, for heartbeats.
    pub(crate) task_id: String,
    pub(crate) attempt: u32,
    pub(crate) started_at_unix_ms: i64,
    pub(crate) progress_percent: AtomicU32,
    pub(crate) current_step: Mutex<String>,
    pub(crate) cancel: CancellationToken,
    pub(crate) cancel_reason: Mutex<String>,
    /// A pause in `preempt` mode asked the attempt to stop before its next durable step.
    pub(crate) preempt: AtomicBool,
    pub(crate) usage: Mutex<v1::Usage>,
    /// The task message's reply subject, where `AckProgress` goes while the handler runs.
    pub(crate) progress_subject: Option<async_nats::Subject>,
    /// Where this attempt's results go, `trellis.results.<shard>`.
    pub(crate) results_subject: async_nats::Subject,
    /// That `<shard>`, which its final result may be handed off to instead.
    pub(crate) results_shard: u32,
    /// Set once the steps bucket may hold an entry for the instance (this attempt read or wrote
    /// one), so that only such attempts delete it when they end.
    pub(crate) steps_stored: AtomicBool,
    /// The W3C `traceparent` of the attempt's run span, sent with its results; `None` when
    /// tracing is off.
    pub(crate) traceparent: Option<String>,
    /// Log lines written and not published yet.
    pub(crate) log: AttemptLog,
    /// The `validate:` checks run on the handler's output, once they ran.
    pub(crate) validation: Mutex<Vec<v1::CheckResult>>,
}

impl Running {
    pub(crate) fn new(
        assignment: &TaskAssignment,
        started_at_unix_ms: i64,
        progress_subject: Option<async_nats::Subject>,
        (results_shard, results_subject): (u32, async_nats::Subject),
        traceparent: Option<String>,
    ) -> Running {
        Running {
            traceparent,
            execution_id: assignment.execution_id.clone(),
            task_instance_id: assignment.task_instance_id.clone(),
            task_id: assignment.task_id.clone(),
            attempt: assignment.attempt,
            started_at_unix_ms,
            progress_percent: AtomicU32::new(0),
            current_step: Mutex::new(String::new()),
            cancel: CancellationToken::new(),
            cancel_reason: Mutex::new(String::new()),
            preempt: AtomicBool::new(false),
            usage: Mutex::new(v1::Usage::default()),
            progress_subject,
            results_subject,
            results_shard,
            steps_stored: AtomicBool::new(false),
            log: AttemptLog::default(),
            validation: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn usage(&self) -> v1::Usage {
        *lock(&self.usage)
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it: every value guarded here
/// stays consistent whatever point a panic interrupted.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a durable step did not complete.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The step's own code failed.
    #[error("step {step} failed: {message}")]
    Failed { step: String, message: String },
    /// The step ran but its checkpoint was not accepted by JetStream.
    #[error("failed to checkpoint step {step}: {message}")]
    Checkpoint { step: String, message: String },
    /// The step did not start: a pause in `preempt` mode asked the task to stop here.
    #[error("preempted before step {step}")]
    Preempted { step: String },
}

impl From<StepError> for Outcome {
    /// A failed step is retryable: running the task again resumes at that step. A preempted one
    /// reports [`Outcome::Preempted`].
    fn from(error: StepError) -> Outcome {
        match error {
            StepError::Preempted { step } => Outcome::Preempted { step },
            error => Outcome::failed(error, true),
        }
    }
}

/// Everything a handler gets for one attempt.
pub struct TaskContext {
    assignment: TaskAssignment,
    input: Bytes,
    input_value: OnceLock<Value>,
    running: Arc<Running>,
    sink: Arc<ResultSink>,
    steps: Mutex<StepLog>,
}

impl fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("task_instance_id", &self.assignment.task_instance_id)
            .field("task_type", &self.assignment.task_type)
            .field("attempt", &self.assignment.attempt)
            .finish_non_exhaustive()
    }
}

/// The durable steps of this attempt: those recorded before it and those it has run.
#[derive(Debug, Default)]
pub(crate) struct StepLog {
    pub(crate) done: HashSet<String>,
    /// Every step recorded so far, in order, as the steps bucket keeps them.
    pub(crate) recorded: Vec<RecordedStep>,
    pub(crate) state: Value,
}

impl StepLog {
    /// The steps an attempt starts with: those its assignment carries (`resume.steps`), with the
    /// merged state of the last one. A state that is not JSON starts empty, with a warning.
    pub(crate) fn of(assignment: &TaskAssignment) -> StepLog {
        let mut step_log = StepLog {
            done: HashSet::new(),
            recorded: Vec::new(),
            state: Value::Object(Default::default()),
        };
        if let Some(recorded) = assignment.resume.as_ref().filter(|r| !r.steps.is_empty()) {
            step_log
                .done
                .extend(recorded.steps.iter().map(|step| step.step.clone()));
            step_log.recorded.clone_from(&recorded.steps);
            // Each recorded step carries the merged state after it; the last one is current.
            let merged_state = recorded
                .steps
                .last()
                .map(|step| step.state.as_slice())
                .unwrap_or_default();
            if !merged_state.is_empty() {
                match serde_json::from_slice(merged_state) {
                    Ok(state) => step_log.state = state,
                    Err(error) => tracing::warn!(
                        task_instance_id = %assignment.task_instance_id,
                        %error,
                        "recorded step state is not json; starting from an empty state"
                    ),
                }
            }
        }
        step_log
    }
}

impl TaskContext {
    pub(crate) fn new(
        mut assignment: TaskAssignment,
        running: Arc<Running>,
        sink: Arc<ResultSink>,
    ) -> TaskContext {
        let input = Bytes::from(std::mem::take(&mut assignment.input));
        let step_log = StepLog::of(&assignment);
        TaskContext {
            assignment,
            input,
            input_value: OnceLock::new(),
            running,
            sink,
            steps: Mutex::new(step_log),
        }
    }

    /// Writes `text` to the task's log, one line per line of it: `trellis logs` and the monitor
    /// show it with the time it was written and the attempt. Never waits: a line over 16 KiB is
    /// cut (and says so), and lines written faster than the worker publishes them (past 4 MiB
    /// waiting) are dropped and counted.
    pub fn log(&self, text: impl AsRef<str>) {
        self.running
            .log
            .write(v1::LogSource::Handler, text.as_ref());
    }

    /// Writes one line of a command's output (`source` stdout or stderr), already cut.
    pub(crate) fn log_output(&self, source: v1::LogSource, line: String, cut_from: Option<u64>) {
        self.running.log.push(source, line, cut_from);
    }

    /// Returns the input, parsed once on first use; `null` when it is empty or not JSON.
    pub fn input(&self) -> &Value {
        self.input_value.get_or_init(|| {
            if self.input.is_empty() {
                return Value::Null;
            }
            serde_json::from_slice(&self.input).unwrap_or_else(|error| {
                tracing::warn!(task_instance_id = %self.assignment.task_instance_id, %error, "task input is not json");
                Value::Null
            })
        })
    }

    /// Deserialises the input into `T`.
    pub fn input_as<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        if self.input.is_empty() {
            serde_json::from_value(Value::Null)
        } else {
            serde_json::from_slice(&self.input)
        }
    }

    /// Returns the input as received: UTF-8 JSON text, possibly empty.
    pub fn raw_input(&self) -> &Bytes {
        &self.input
    }

    /// Returns the attempt, from 1.
    pub fn attempt(&self) -> u32 {
        self.assignment.attempt
    }

    /// Returns the task instance id.
    pub fn task_instance_id(&self) -> &str {
        &self.assignment.task_instance_id
    }

    /// Returns the execution id.
    pub fn execution_id(&self) -> &str {
        &self.assignment.execution_id
    }

    /// Returns the plan task id (or the handler type of a dynamic subtask).
    pub fn task_id(&self) -> &str {
        &self.assignment.task_id
    }

    /// Returns the handler type.
    pub fn task_type(&self) -> &str {
        &self.assignment.task_type
    }

    /// Returns the key for the handler's own side effects, the same for every delivery of this
    /// attempt (`<task_instance_id>:<attempt>`).
    pub fn idempotency_key(&self) -> &str {
        &self.assignment.idempotency_key
    }

    /// Returns the attempt's deadline, 0 when it has none.
    pub fn deadline_unix_ms(&self) -> i64 {
        self.assignment.deadline_unix_ms.unwrap_or(0)
    }

    /// Returns the assignment as received (its `input` moved out into [`TaskContext::raw_input`]).
    pub fn assignment(&self) -> &TaskAssignment {
        &self.assignment
    }

    /// Returns the summary of the group this instance was resumed after, if it was.
    pub fn group_summary(&self) -> Option<&GroupSummary> {
        match self.assignment.resume.as_ref()?.resumed_after.as_ref()? {
            ResumedAfter::GroupSummary(summary) => Some(summary),
            ResumedAfter::HumanAnswer(_) => None,
        }
    }

    /// Returns the output of the plan task `task_id` this task depends on, parsed; `None` when it
    /// is not a dependency, did not complete, or was left out (see [`TaskContext::upstream_truncated`]).
    /// An output stored by reference has already been read back and checked.
    pub fn upstream(&self, task_id: &str) -> Option<Value> {
        let upstream = self
            .assignment
            .upstream
            .iter()
            .find(|upstream| upstream.task_id == task_id)?;
        serde_json::from_slice(&upstream.output).ok()
    }

    /// Returns the outputs of the plan tasks this task depends on that completed, as UTF-8 JSON,
    /// in the order of its dependencies.
    pub fn upstream_outputs(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.assignment
            .upstream
            .iter()
            .map(|upstream| (upstream.task_id.as_str(), upstream.output.as_slice()))
    }

    /// True when some dependencies' outputs were left out to keep the assignment small (over 1,000
    /// dependencies, or over 1 MiB of outputs kept inline).
    pub fn upstream_truncated(&self) -> bool {
        self.assignment.upstream_truncated
    }

    /// Returns the human's answer this instance was resumed with, if it was.
    pub fn answer(&self) -> Option<&HumanAnswer> {
        match self.assignment.resume.as_ref()?.resumed_after.as_ref()? {
            ResumedAfter::HumanAnswer(answer) => Some(answer),
            ResumedAfter::GroupSummary(_) => None,
        }
    }

    /// Returns the durable steps recorded before this attempt (each with the merged state after
    /// it); empty when none.
    pub fn recorded_steps(&self) -> &[RecordedStep] {
        self.assignment
            .resume
            .as_ref()
            .map_or(&[], |resume| resume.steps.as_slice())
    }

    /// Returns a token cancelled when the task is cancelled, times out or the worker stops for
    /// good. The handler's future is dropped at that moment anyway; the token is for work the
    /// handler started elsewhere (spawned tasks, child processes).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.running.cancel
    }

    /// Reports progress (0 to 100, clamped) and a free-form step label, shown in heartbeats.
    pub fn progress(&self, percent: u32, step: impl Into<String>) {
        self.running
            .progress_percent
            .store(percent.min(100), Ordering::Relaxed);
        *lock(&self.running.current_step) = step.into();
    }

    /// Reports what the attempt consumed so far (cumulative, not a delta), for budgets. A cost
    /// that is not a finite, non-negative number is dropped with a warning (the coordinator would
    /// refuse the result that carries it); the tokens still count.
    pub fn usage(&self, tokens_used: u64, cost: f64) {
        let mut usage = lock(&self.running.usage);
        let cost = if cost.is_finite() && cost >= 0.0 {
            cost
        } else {
            tracing::warn!(task_instance_id = %self.assignment.task_instance_id, cost, "invalid cost reported; keeping the last valid one");
            usage.cost
        };
        *usage = v1::Usage { tokens_used, cost };
    }

    /// Returns the merged state of the durable steps run or recorded so far (a JSON object).
    pub fn step_state(&self) -> Value {
        lock(&self.steps).state.clone()
    }

    /// Runs durable step `name` (seed 002).
    ///
    /// A step recorded before this attempt is skipped and the recorded merged state is returned.
    /// A step not recorded yet does not start when a pause in `preempt` mode asked the attempt to
    /// stop: it returns [`StepError::Preempted`], which the handler returns as its outcome
    /// (`?` or `.into()`), and the task runs again from this step once resumed.
    /// Otherwise `f` gets the merged state so far and returns its update, which is merged in
    /// (maps merge, `messages` and `trace` lists append, other fields replace); the worker then
    /// checkpoints the step (a `step_checkpoint` result accepted by JetStream) before returning
    /// the new merged state. The step is also kept in the steps bucket under the instance id, so
    /// that a redelivery of this very attempt (its worker died) resumes after it.
    pub async fn step<F, Fut, E>(&self, name: &str, f: F) -> Result<Value, StepError>
    where
        F: FnOnce(Value) -> Fut,
        Fut: Future<Output = Result<Value, E>>,
        E: fmt::Display,
    {
        let state = {
            let step_log = lock(&self.steps);
            if step_log.done.contains(name) {
                return Ok(step_log.state.clone());
            }
            step_log.state.clone()
        };
        if self.running.preempt.load(Ordering::Acquire) {
            return Err(StepError::Preempted {
                step: name.to_owned(),
            });
        }
        *lock(&self.running.current_step) = name.to_owned();
        let update = f(state).await.map_err(|error| StepError::Failed {
            step: name.to_owned(),
            message: error.to_string(),
        })?;
        let (merged, recorded) = {
            let mut step_log = lock(&self.steps);
            steps::merge(&mut step_log.state, update);
            step_log.done.insert(name.to_owned());
            let merged = step_log.state.clone();
            step_log.recorded.push(RecordedStep {
                step: name.to_owned(),
                state: json_bytes(&merged),
            });
            (merged, step_log.recorded.clone())
        };
        self.sink
            .checkpoint(&self.assignment, &self.running, recorded)
            .await
            .map_err(|message| StepError::Checkpoint {
                step: name.to_owned(),
                message,
            })?;
        Ok(merged)
    }
}
