//! The JSON shapes of the API (`API.md`), built from the coordinator's protobuf messages and from
//! the domain model. Field names are the API's; nothing here does I/O.

use std::collections::BTreeMap;

use crate::layout::{PlanGraph, plan_graph};
use serde::Serialize;
use trellis_core::analysis;
use trellis_core::machine::{Execution as Machine, StateCounts};
use trellis_core::plan::Plan;
use trellis_core::record::{AttemptRecord, CheckResult, TaskState, TaskStatusRecord};
use trellis_proto::v1;
use trellis_wire::log::Started;
use trellis_wire::read;

mod history;
pub use history::{HistoryColumn, PlanHistory, final_task_states};

/// One execution: its state, progress and times.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ExecutionView {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub state: &'static str,
    pub run_number: u32,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    pub reason: String,
    pub counts: BTreeMap<&'static str, u64>,
    pub total: u64,
    pub done: u64,
    pub percent: f64,
    pub eta_ms: Option<u64>,
    pub wave: u32,
    pub waves: u32,
    pub labels: BTreeMap<String, String>,
    pub open_questions: u64,
}

/// The snake_case name of a wire execution state.
pub(crate) fn execution_state_name(state: i32) -> &'static str {
    read::execution_state_from_proto(state)
        .map(|s| s.as_str())
        .unwrap_or("pending")
}

fn counts_by_name(counts: &StateCounts) -> BTreeMap<&'static str, u64> {
    TaskState::ALL
        .iter()
        .map(|&state| (state.as_str(), counts.get(state)))
        .collect()
}

impl ExecutionView {
    /// The view of the coordinator's summary of an execution.
    pub fn from_proto(execution: &v1::Execution) -> Self {
        let counts = execution
            .counts
            .as_ref()
            .map(read::counts_from_proto)
            .unwrap_or_default();
        // The coordinator always sends its progress with a summary.
        let progress = execution.progress.clone().unwrap_or_default();
        Self {
            id: execution.execution_id.clone(),
            name: execution.name.clone(),
            namespace: if execution.namespace.is_empty() {
                "default".to_owned()
            } else {
                execution.namespace.clone()
            },
            state: execution_state_name(execution.state),
            run_number: execution.run_number,
            created_at_ms: execution.created_at_unix_ms,
            started_at_ms: execution.started_at_unix_ms,
            ended_at_ms: execution.ended_at_unix_ms,
            reason: execution.reason.clone(),
            counts: counts_by_name(&counts),
            total: progress.total,
            done: progress.done,
            percent: progress.percent,
            eta_ms: progress.eta_ms,
            wave: progress.wave,
            waves: progress.waves,
            labels: execution.labels.clone().into_iter().collect(),
            open_questions: execution.open_questions.len() as u64,
        }
    }

    /// The view of an execution rebuilt from its log.
    pub fn from_machine(machine: &Machine, started: &Started, now_ms: u64) -> Self {
        let progress = machine.progress(now_ms);
        let (started_at, ended_at) = machine.times_ms();
        Self {
            id: machine.id().to_string(),
            name: machine.plan().name.clone(),
            namespace: started.namespace().to_owned(),
            state: progress.state.as_str(),
            run_number: machine.run_number(),
            created_at_ms: started.started_at_ms as i64,
            started_at_ms: Some(started_at as i64),
            ended_at_ms: ended_at.map(|t| t as i64),
            reason: progress.reason.as_deref().unwrap_or_default().to_owned(),
            open_questions: progress.counts.get(TaskState::WaitingForHuman),
            counts: counts_by_name(&progress.counts),
            total: progress.total,
            done: progress.done,
            percent: progress.percent,
            eta_ms: progress.eta_ms,
            wave: progress.wave,
            waves: progress.waves,
            labels: started.labels.clone(),
        }
    }
}

/// A question waiting for an answer.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QuestionView {
    pub question_id: String,
    pub task_instance_id: String,
    pub task_id: String,
    #[serde(rename = "type")]
    pub question_type: String,
    /// critical, high, medium, low; empty when the asker gave none.
    pub priority: String,
    pub text: String,
    pub options: Vec<String>,
    pub asked_at_ms: i64,
    pub expires_at_ms: Option<i64>,
}

impl QuestionView {
    pub fn from_proto(open: &v1::OpenQuestion) -> Self {
        let question = open.question.clone().unwrap_or_default();
        Self {
            question_id: question.question_id,
            task_instance_id: open.task_instance_id.clone(),
            task_id: open.task_id.clone(),
            question_type: question.question_type,
            priority: question.priority,
            text: question.text,
            options: question.options,
            asked_at_ms: open.asked_at_unix_ms,
            expires_at_ms: question.expires_at_unix_ms,
        }
    }
}

/// One task instance (the seed's `TaskStatusRecord`), without its output.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct InstanceView {
    pub id: String,
    pub task_id: String,
    pub parent: Option<String>,
    pub group: Option<String>,
    pub resumed_after: Option<String>,
    pub continues: Option<String>,
    pub run: u32,
    pub attempt: u32,
    pub state: &'static str,
    pub worker: Option<String>,
    pub created_ms: u64,
    /// When the current attempt was handed to the task queue.
    pub dispatched_ms: Option<u64>,
    /// When a worker took it: from dispatched to started it waited in the queue.
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    pub error: Option<String>,
    /// The attempts before the current one, oldest first.
    pub earlier_attempts: Vec<AttemptRecord>,
    /// The current attempt's `validate:` checks, once they ran.
    pub validation: Vec<CheckResult>,
}

impl From<&TaskStatusRecord> for InstanceView {
    fn from(record: &TaskStatusRecord) -> Self {
        Self {
            id: record.task_instance_id.to_string(),
            task_id: record.task_id.clone(),
            parent: record.parent_task_instance_id.map(|id| id.to_string()),
            group: record.subtask_group_id.map(|id| id.to_string()),
            resumed_after: record
                .resumed_after_subtasks_group_id
                .map(|id| id.to_string()),
            continues: record.continues_task_instance_id.map(|id| id.to_string()),
            run: record.run_number,
            attempt: record.attempt,
            state: record.state.as_str(),
            worker: record.worker_id.as_ref().map(ToString::to_string),
            created_ms: record.created_at_ms,
            dispatched_ms: record.dispatched_at_ms,
            started_ms: record.started_at_ms,
            ended_ms: record.ended_at_ms,
            error: record.error.clone(),
            earlier_attempts: record.earlier_attempts.clone(),
            validation: record.validation.clone(),
        }
    }
}

/// One task instance in full, for the task drawer: its record, the input it was given and its
/// output (or, for an output stored by reference, where it is and how big: `trellis output`
/// fetches it).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct InstanceDetail {
    #[serde(flatten)]
    pub instance: InstanceView,
    pub input: Option<serde_json::Value>,
    pub output: Option<serde_json::Value>,
    /// `{object, size, sha256}` of an output stored by reference.
    pub output_ref: Option<serde_json::Value>,
    /// The questions asked in the task's turn (by this instance or those it continues), oldest
    /// first, with their outcome.
    pub questions: Vec<AskedQuestionView>,
}

/// A question as the task drawer shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AskedQuestionView {
    pub question_id: String,
    #[serde(rename = "type")]
    pub question_type: String,
    pub text: String,
    pub options: Vec<String>,
    /// `open`, `answered`, `expired`, or `withdrawn` (the asking instance was cancelled).
    pub outcome: &'static str,
    pub answer: Option<String>,
}

impl AskedQuestionView {
    /// A question just asked.
    pub fn asked(question: &v1::Question) -> Self {
        Self {
            question_id: question.question_id.clone(),
            question_type: question.question_type.clone(),
            text: question.text.clone(),
            options: question.options.clone(),
            outcome: "open",
            answer: None,
        }
    }
}

impl InstanceDetail {
    pub fn new(record: &TaskStatusRecord, input: Option<serde_json::Value>) -> Self {
        let reference = record
            .output
            .as_ref()
            .and_then(trellis_bus::OutputRef::from_value);
        Self {
            instance: InstanceView::from(record),
            input,
            output: if reference.is_some() {
                None
            } else {
                record.output.clone()
            },
            output_ref: reference.map(|reference| {
                serde_json::json!({
                    "object": reference.location(),
                    "size": reference.size,
                    "sha256": reference.sha256,
                })
            }),
            questions: Vec::new(),
        }
    }
}

/// One plan task, placed in its wave.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PlanTaskView {
    pub id: String,
    #[serde(rename = "type")]
    pub task_type: String,
    /// 0-based; `None` for fallback-only tasks and static subtasks, which belong to no wave.
    pub wave: Option<usize>,
    pub depends_on: Vec<String>,
}

/// A plan laid out by waves.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PlanView {
    pub name: String,
    pub tasks: Vec<PlanTaskView>,
    pub waves: Vec<Vec<String>>,
    pub conflicts: Vec<[String; 2]>,
    /// The drawing, fan-outs folded; `None` when it has too many nodes to draw one by one.
    pub graph: Option<PlanGraph>,
}

impl From<&Plan> for PlanView {
    fn from(plan: &Plan) -> Self {
        let waves = analysis::waves(plan);
        let id = |idx: usize| plan.tasks[idx].id.clone();
        let tasks = plan
            .tasks
            .iter()
            .enumerate()
            .map(|(idx, task)| PlanTaskView {
                id: task.id.clone(),
                task_type: task.task_type.clone(),
                wave: waves.wave_of[idx],
                depends_on: plan.deps[idx].iter().map(|&d| id(d)).collect(),
            })
            .collect();
        let conflicts = plan
            .conflicts
            .iter()
            .enumerate()
            .flat_map(|(a, others)| {
                others
                    .iter()
                    .filter(move |&&b| a < b)
                    .map(move |&b| [id(a), id(b)])
            })
            .collect();
        Self {
            name: plan.name.clone(),
            tasks,
            waves: waves
                .waves
                .iter()
                .map(|wave| wave.iter().map(|&t| id(t)).collect())
                .collect(),
            conflicts,
            graph: plan_graph(plan, &waves),
        }
    }
}

/// One entry of an execution's event log.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct EventView {
    pub seq: u64,
    /// When the coordinator made the event.
    pub ts_ms: i64,
    /// When JetStream stored the log message holding it (the append).
    pub appended_ms: i64,
    pub kind: &'static str,
    pub instance: Option<String>,
    pub attempt: Option<u32>,
    pub detail: String,
}

impl EventView {
    /// The view of `event`, appended to the log at `appended_ms`.
    pub fn new(event: &v1::Event, appended_ms: i64) -> Self {
        use v1::event::Kind;
        let mut view = Self {
            seq: event.sequence,
            ts_ms: event.timestamp_unix_ms,
            appended_ms,
            kind: "unknown",
            instance: None,
            attempt: None,
            detail: String::new(),
        };
        let mut on = |kind: &'static str, instance: &str, attempt: u32, detail: String| {
            view.kind = kind;
            view.instance = Some(instance.to_owned());
            view.attempt = Some(attempt);
            view.detail = detail;
        };
        match &event.kind {
            Some(Kind::TaskDispatched(e)) => on(
                "task_dispatched",
                &e.task_instance_id,
                e.attempt,
                String::new(),
            ),
            Some(Kind::TaskStarted(e)) => on(
                "task_started",
                &e.task_instance_id,
                e.attempt,
                format!("on {}", e.worker_id),
            ),
            Some(Kind::TaskValidated(e)) => {
                let passed = e.results.iter().filter(|r| r.passed).count();
                let detail = format!("{passed} of {} checks passed", e.results.len());
                on("task_validated", &e.task_instance_id, e.attempt, detail)
            }
            Some(Kind::TaskCompleted(e)) => on(
                "task_completed",
                &e.task_instance_id,
                e.attempt,
                preview(&e.output),
            ),
            Some(Kind::TaskFailed(e)) => on(
                "task_failed",
                &e.task_instance_id,
                e.attempt,
                format!(
                    "{}{}",
                    e.error,
                    if e.retryable { " (retryable)" } else { "" }
                ),
            ),
            Some(Kind::SubtasksSpawned(e)) => {
                let detail = e.group.as_ref().map_or_else(String::new, |g| {
                    format!(
                        "group {} of {} subtasks",
                        short(&g.group_id),
                        g.members.len()
                    )
                });
                on("subtasks_spawned", &e.task_instance_id, e.attempt, detail)
            }
            Some(Kind::QuestionAsked(e)) => {
                let text = e
                    .question
                    .as_ref()
                    .map(|q| q.text.clone())
                    .unwrap_or_default();
                on("question_asked", &e.task_instance_id, e.attempt, text)
            }
            Some(Kind::StepCheckpointed(e)) => on(
                "step_checkpointed",
                &e.task_instance_id,
                e.attempt,
                format!("step {}", e.step),
            ),
            Some(Kind::TaskLost(e)) => on(
                "task_lost",
                &e.task_instance_id,
                e.attempt,
                "its worker stopped answering".to_owned(),
            ),
            Some(Kind::TaskPreempted(e)) => on(
                "task_preempted",
                &e.task_instance_id,
                e.attempt,
                "stopped at a step boundary by a pause; continues after the resume".to_owned(),
            ),
            Some(Kind::TaskTimedOut(e)) => on(
                "task_timed_out",
                &e.task_instance_id,
                e.attempt,
                String::new(),
            ),
            Some(kind) => {
                let (name, detail) = match kind {
                    Kind::ExecutionStarted(e) => (
                        "execution_started",
                        format!("plan {}, run {}", e.plan_name, e.run_number),
                    ),
                    Kind::PauseRequested(e) => (
                        "pause_requested",
                        pause_detail(&e.task_id, &e.group_id, Some(e.mode), &e.reason),
                    ),
                    Kind::ResumeRequested(e) => (
                        "resume_requested",
                        pause_detail(&e.task_id, &e.group_id, None, ""),
                    ),
                    Kind::CancelRequested(e) => ("cancel_requested", e.reason.clone()),
                    Kind::QuestionAnswered(e) => (
                        "question_answered",
                        format!("{}: {}", short(&e.question_id), e.answer),
                    ),
                    Kind::QuestionExpired(e) => ("question_expired", short(&e.question_id)),
                    Kind::BudgetExhausted(e) => ("budget_exhausted", e.reason.clone()),
                    Kind::ExecutionTimedOut(_) => ("execution_timed_out", String::new()),
                    Kind::ExecutionFinished(e) => (
                        "execution_finished",
                        match v1::ExecutionOutcome::try_from(e.outcome) {
                            Ok(v1::ExecutionOutcome::Completed) => "completed".to_owned(),
                            Ok(v1::ExecutionOutcome::Failed) => "failed".to_owned(),
                            Ok(v1::ExecutionOutcome::Cancelled) => "cancelled".to_owned(),
                            _ => String::new(),
                        },
                    ),
                    Kind::RunStarted(e) => ("run_started", format!("run {}", e.run_number)),
                    Kind::ExecutionClaimed(e) => (
                        "execution_claimed",
                        format!("taken over by coordinator {}", e.coordinator),
                    ),
                    // Instance events are matched above.
                    _ => ("unknown", String::new()),
                };
                view.kind = name;
                view.detail = detail;
            }
            None => {}
        }
        view
    }
}

/// The last 8 hex digits of an id, as the UI shows it (UUIDv7 ids made close together share
/// their leading, timestamp digits).
fn short(id: &str) -> String {
    let digits: Vec<char> = id.chars().filter(|c| *c != '-').collect();
    digits[digits.len().saturating_sub(8)..].iter().collect()
}

/// A task output as a short text: the JSON, cut at 120 characters; an output stored by
/// reference as its size, checksum and object (`trellis output` fetches it).
fn preview(output: &[u8]) -> String {
    const MAX: usize = 120;
    if let Some(reference) = trellis_bus::OutputRef::from_output(output) {
        return format!(
            "stored output: {} bytes, sha256 {}…, in {}",
            reference.size,
            reference.sha256.get(..12).unwrap_or(&reference.sha256),
            reference.location()
        );
    }
    let text = String::from_utf8_lossy(output);
    if text.chars().count() <= MAX {
        text.into_owned()
    } else {
        let mut cut: String = text.chars().take(MAX).collect();
        cut.push('…');
        cut
    }
}

/// A worker and its last heartbeat.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WorkerView {
    pub id: String,
    pub host: String,
    pub state: &'static str,
    pub queues: Vec<String>,
    pub slots: u32,
    pub running: Vec<RunningView>,
    pub memory_bytes: u64,
    pub cpu_percent: f32,
    pub last_heartbeat_ms: i64,
    pub interval_ms: u64,
    pub missed_heartbeats: u32,
    pub tasks_completed: u64,
    pub tasks_failed: u64,
}

/// A task a worker reports running.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunningView {
    pub execution_id: String,
    /// The execution's name, when the monitor could read it.
    pub execution_name: Option<String>,
    pub instance: String,
    /// The instance's task id; empty from workers that do not send it.
    pub task_id: String,
    pub attempt: u32,
    pub progress: u32,
    pub step: String,
    pub started_ms: i64,
}

impl WorkerView {
    pub fn from_proto(worker: &v1::WorkerInfo) -> Self {
        let beat = worker.last_heartbeat.clone().unwrap_or_default();
        let state = match v1::WorkerState::try_from(worker.state) {
            Ok(v1::WorkerState::Spawning) => "spawning",
            Ok(v1::WorkerState::Idle) => "idle",
            Ok(v1::WorkerState::Running) => "running",
            Ok(v1::WorkerState::Draining) => "draining",
            Ok(v1::WorkerState::Terminated) => "terminated",
            _ => "unknown",
        };
        Self {
            id: worker.worker_id.clone(),
            host: beat.host,
            state,
            queues: beat.queues,
            slots: beat.slots,
            running: beat
                .running
                .into_iter()
                .map(|r| RunningView {
                    execution_id: r.execution_id,
                    execution_name: None,
                    instance: r.task_instance_id,
                    task_id: r.task_id,
                    attempt: r.attempt,
                    progress: r.progress_percent,
                    step: r.current_step,
                    started_ms: r.started_at_unix_ms,
                })
                .collect(),
            memory_bytes: beat.memory_bytes,
            cpu_percent: beat.cpu_percent,
            last_heartbeat_ms: beat.sent_at_unix_ms,
            interval_ms: beat.interval_ms,
            missed_heartbeats: worker.missed_heartbeats,
            tasks_completed: worker.tasks_completed,
            tasks_failed: worker.tasks_failed,
        }
    }
}

/// A stored checkpoint.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CheckpointView {
    pub id: String,
    pub sequence: u64,
    pub kind: &'static str,
    pub created_at_ms: i64,
    pub size_bytes: u64,
    pub sha256: String,
}

impl CheckpointView {
    pub fn from_proto(checkpoint: &v1::CheckpointMetadata) -> Self {
        let kind = match v1::CheckpointKind::try_from(checkpoint.kind) {
            Ok(v1::CheckpointKind::Full) => "full",
            Ok(v1::CheckpointKind::Delta) => "delta",
            _ => "unknown",
        };
        Self {
            id: checkpoint.checkpoint_id.clone(),
            sequence: checkpoint.event_sequence,
            kind,
            created_at_ms: checkpoint.created_at_unix_ms,
            size_bytes: checkpoint.size_bytes,
            sha256: checkpoint
                .checksum_sha256
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        }
    }
}

/// What a pause or resume event covers, how, and why: `task build, preempt: gpu upgrade`; the
/// execution's own pause shows its reason only. A resume has no mode.
fn pause_detail(task_id: &str, group_id: &str, mode: Option<i32>, reason: &str) -> String {
    let scope = match (task_id, group_id) {
        ("", "") => String::new(),
        (task, "") => format!("task {task}"),
        (_, group) => format!("group {}", short(group)),
    };
    let mode = mode.map_or("", |mode| {
        trellis_wire::log::pause_mode_from_proto(mode).as_str()
    });
    let head = [
        scope.as_str(),
        if scope.is_empty() && mode == "drain" {
            ""
        } else {
            mode
        },
    ]
    .into_iter()
    .filter(|part| !part.is_empty())
    .collect::<Vec<_>>()
    .join(", ");
    match (head.is_empty(), reason.is_empty()) {
        (true, _) => reason.to_owned(),
        (false, true) => head,
        (false, false) => format!("{head}: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_events_name_their_instance_and_attempt() {
        let event = v1::Event {
            execution_id: "e".to_owned(),
            sequence: 7,
            timestamp_unix_ms: 1_000,
            kind: Some(v1::event::Kind::TaskFailed(v1::TaskFailed {
                task_instance_id: "0192-abc".to_owned(),
                attempt: 2,
                error: "exit status 1".to_owned(),
                retryable: true,
                usage: None,
            })),
        };
        let view = EventView::new(&event, 1_002);
        assert_eq!(view.kind, "task_failed");
        assert_eq!(view.instance.as_deref(), Some("0192-abc"));
        assert_eq!(view.attempt, Some(2));
        assert_eq!(view.detail, "exit status 1 (retryable)");
        assert_eq!((view.seq, view.ts_ms, view.appended_ms), (7, 1_000, 1_002));
    }

    #[test]
    fn execution_events_carry_no_instance() {
        let event = v1::Event {
            kind: Some(v1::event::Kind::PauseRequested(v1::PauseRequested {
                reason: "deploy freeze".to_owned(),
                ..v1::PauseRequested::default()
            })),
            ..v1::Event::default()
        };
        let view = EventView::new(&event, 1_002);
        assert_eq!(view.kind, "pause_requested");
        assert_eq!(view.instance, None);
        assert_eq!(view.detail, "deploy freeze");
    }

    #[test]
    fn short_ids_are_the_last_eight_digits() {
        assert_eq!(short("01a20e1c-0c7b-70e5-891b-43333c372e3e"), "3c372e3e");
        assert_eq!(short("abc"), "abc");
    }

    #[test]
    fn stored_outputs_show_their_size_checksum_and_object() {
        let reference = trellis_bus::OutputRef {
            bucket: "trellis_outputs".to_owned(),
            object: "exec/inst/1".to_owned(),
            size: 5_000_002,
            sha256: "ab".repeat(32),
        };
        assert_eq!(
            preview(&reference.to_output()),
            "stored output: 5000002 bytes, sha256 abababababab…, in trellis_outputs/exec/inst/1"
        );
        assert_eq!(
            preview(br#"{"a":1}"#),
            r#"{"a":1}"#,
            "an ordinary output as it is"
        );
    }

    #[test]
    fn long_outputs_are_cut() {
        let output = format!("\"{}\"", "x".repeat(500));
        let text = preview(output.as_bytes());
        assert_eq!(text.chars().count(), 121);
        assert!(text.ends_with('…'));
    }

    #[test]
    fn plan_view_places_tasks_in_waves_and_lists_conflicts_once() {
        let text = "name: p\ntasks:\n\
            - {id: a, type: noop, files: [{path: x.rs, op: UPDATE}]}\n\
            - {id: b, type: noop, files: [{path: x.rs, op: UPDATE}]}\n\
            - {id: c, type: noop, depends_on: [a, b]}\n";
        let plan = trellis_core::plan::compile_str(text, &trellis_core::plan::Limits::default())
            .expect("the plan compiles");
        let view = PlanView::from(&plan);
        assert_eq!(view.waves.len(), 2);
        assert_eq!(view.waves[1], vec!["c".to_owned()]);
        assert_eq!(view.conflicts, vec![["a".to_owned(), "b".to_owned()]]);
        let c = view.tasks.iter().find(|t| t.id == "c").expect("task c");
        assert_eq!(c.depends_on, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(c.wave, Some(1));
    }
}
