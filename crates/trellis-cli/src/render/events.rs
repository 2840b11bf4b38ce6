//! Everything the CLI knows about the kinds of `Event`: their names, what each one means for a
//! person (one line) and for a program (one JSON object), and which ones end an execution or change
//! its state.
//!
//! The event log mirrors the state machine one event for one (`trellis_core::machine::EventBody`),
//! so a single event is small and means one thing: `task_dispatched` is an attempt sent to a
//! worker (attempt 2 and later: a retry of the same instance), `subtasks_spawned` is a group with
//! its rule and members, a parent resumed after its group is the `task_dispatched` of a new
//! instance. This is the only module that matches on `event::Kind`, and it does so exhaustively,
//! so a kind added to the contract does not compile until it is described here.

use std::fmt::Write as _;

use serde_json::{Map, Value, json};
use trellis_proto::v1::event::Kind;
use trellis_proto::v1::{
    CompletionRule, CompletionRuleKind, Event, ExecutionOutcome, ExecutionState, PlanFormat,
    Question, QuestionTimeoutAction, SubtaskGroup, Usage,
};

use super::{format_time, one_line, short_name, usage_json};

/// Longest value shown in a text line; JSON keeps everything.
const MAX_TEXT_VALUE: usize = 80;

/// Width of the kind column of a text line: the longest kind name (`execution_timed_out`).
const KIND_WIDTH: usize = 19;

/// The execution entering a state, as an event tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionChange {
    pub state: ExecutionState,
    /// Why it paused, failed or was cancelled, when the event says; empty otherwise.
    pub reason: String,
}

/// Returns the oneof name of an event's kind in snake case (`task_completed`), the same name the
/// state machine gives the event; `unknown` when the kind is not set (a sender newer than this
/// build).
pub fn kind_name(kind: Option<&Kind>) -> &'static str {
    let Some(kind) = kind else {
        return "unknown";
    };
    match kind {
        Kind::ExecutionStarted(_) => "execution_started",
        Kind::TaskStarted(_) => "task_started",
        Kind::TaskValidated(_) => "task_validated",
        Kind::TaskCompleted(_) => "task_completed",
        Kind::TaskFailed(_) => "task_failed",
        Kind::SubtasksSpawned(_) => "subtasks_spawned",
        Kind::QuestionAsked(_) => "question_asked",
        Kind::StepCheckpointed(_) => "step_checkpointed",
        Kind::TaskLost(_) => "task_lost",
        Kind::TaskPreempted(_) => "task_preempted",
        Kind::PauseRequested(_) => "pause_requested",
        Kind::ResumeRequested(_) => "resume_requested",
        Kind::CancelRequested(_) => "cancel_requested",
        Kind::QuestionAnswered(_) => "question_answered",
        Kind::TaskDispatched(_) => "task_dispatched",
        Kind::TaskTimedOut(_) => "task_timed_out",
        Kind::QuestionExpired(_) => "question_expired",
        Kind::BudgetExhausted(_) => "budget_exhausted",
        Kind::ExecutionTimedOut(_) => "execution_timed_out",
        Kind::ExecutionFinished(_) => "execution_finished",
        Kind::RunStarted(_) => "run_started",
        Kind::ExecutionClaimed(_) => "execution_claimed",
    }
}

/// Returns what an event means, in words: `instance 0190… attempt 1: boom (retryable)`.
pub fn describe(kind: Option<&Kind>) -> String {
    let Some(kind) = kind else {
        return "an event this version of trellis does not know".to_owned();
    };
    let attempt = |instance: &str, attempt: u32| format!("instance {instance} attempt {attempt}");
    match kind {
        Kind::ExecutionStarted(e) => {
            let mut text = format!("plan {:?} started as run {}", e.plan_name, e.run_number);
            let options = e.options.clone().unwrap_or_default();
            if !options.idempotency_key.is_empty() {
                let _ = write!(text, ", idempotency key {:?}", options.idempotency_key);
            }
            if !options.labels.is_empty() {
                let mut labels: Vec<String> = options
                    .labels
                    .iter()
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect();
                labels.sort();
                let _ = write!(text, ", labels {}", labels.join(" "));
            }
            text
        }
        Kind::TaskDispatched(e) => {
            let mut text = format!(
                "{} sent to a worker",
                attempt(&e.task_instance_id, e.attempt)
            );
            // Every attempt after the first one of an instance follows a failure, a lost worker or
            // a timeout of the attempt before.
            if e.attempt > 1 {
                text.push_str(" (retry)");
            }
            text
        }
        Kind::TaskStarted(e) => format!(
            "{} started on worker {}",
            attempt(&e.task_instance_id, e.attempt),
            e.worker_id
        ),
        Kind::TaskValidated(e) => {
            let passed = e.results.iter().filter(|r| r.passed).count();
            let failed: Vec<&str> = e
                .results
                .iter()
                .filter(|r| !r.passed)
                .map(|r| r.name.as_str())
                .collect();
            let mut text = format!(
                "{} checked: {passed} of {} checks passed",
                attempt(&e.task_instance_id, e.attempt),
                e.results.len()
            );
            if !failed.is_empty() {
                text.push_str(&format!(", failed: {}", failed.join(", ")));
            }
            text
        }
        Kind::TaskCompleted(e) => {
            let mut text = format!("{} completed", attempt(&e.task_instance_id, e.attempt));
            if !e.output.is_empty() {
                let output = json_bytes(&e.output).to_string();
                let _ = write!(text, ": {}", one_line(&output, MAX_TEXT_VALUE));
            }
            text.push_str(&usage_text(e.usage.as_ref()));
            text
        }
        Kind::TaskFailed(e) => format!(
            "{}: {} ({}){}",
            attempt(&e.task_instance_id, e.attempt),
            one_line(&e.error, MAX_TEXT_VALUE),
            if e.retryable {
                "retryable"
            } else {
                "not retryable"
            },
            usage_text(e.usage.as_ref()),
        ),
        Kind::SubtasksSpawned(e) => {
            let group = e.group.clone().unwrap_or_default();
            format!(
                "{} spawned group {}: {}, {}",
                attempt(&e.task_instance_id, e.attempt),
                group.group_id,
                members_text(&group),
                rule_name(group.rule.as_ref())
            )
        }
        Kind::QuestionAsked(e) => {
            let question = e.question.clone().unwrap_or_default();
            let mut text = format!(
                "{} asks question {}: {:?}",
                attempt(&e.task_instance_id, e.attempt),
                question.question_id,
                one_line(&question.text, MAX_TEXT_VALUE)
            );
            if !question.options.is_empty() {
                let _ = write!(text, " [{}]", question.options.join(" | "));
            }
            text
        }
        Kind::StepCheckpointed(e) => format!(
            "{} finished step {:?}",
            attempt(&e.task_instance_id, e.attempt),
            e.step
        ),
        Kind::TaskLost(e) => format!(
            "{} lost: its worker stopped heartbeating",
            attempt(&e.task_instance_id, e.attempt)
        ),
        Kind::TaskPreempted(e) => format!(
            "{} stopped at a step boundary, preempted by a pause; it continues after the resume",
            attempt(&e.task_instance_id, e.attempt)
        ),
        Kind::PauseRequested(e) => {
            with_reason(&pause_text(&e.task_id, &e.group_id, e.mode), &e.reason)
        }
        Kind::ResumeRequested(e) => match pause_scope(&e.task_id, &e.group_id) {
            scope if scope.is_empty() => "resume requested".to_owned(),
            scope => format!("resume of {scope} requested"),
        },
        Kind::CancelRequested(e) => with_reason("cancel requested, execution cancelled", &e.reason),
        Kind::QuestionAnswered(e) => format!(
            "question {} answered {:?}",
            e.question_id,
            one_line(&e.answer, MAX_TEXT_VALUE)
        ),
        Kind::TaskTimedOut(e) => format!(
            "{} ran past its deadline",
            attempt(&e.task_instance_id, e.attempt)
        ),
        Kind::QuestionExpired(e) => format!("question {} expired unanswered", e.question_id),
        Kind::BudgetExhausted(e) => with_reason("budget exhausted", &e.reason),
        Kind::ExecutionTimedOut(_) => "execution ran past its global timeout, failed".to_owned(),
        Kind::ExecutionFinished(e) => format!("execution {}", outcome_name(e.outcome)),
        Kind::RunStarted(e) => format!(
            "run {} started: what did not complete runs again",
            e.run_number
        ),
        Kind::ExecutionClaimed(e) => {
            format!("coordinator {} took the execution over", e.coordinator)
        }
    }
}

/// Returns the fields of an event for programs, in a stable order; values are complete (not cut).
pub fn fields(kind: Option<&Kind>) -> Vec<(&'static str, Value)> {
    let Some(kind) = kind else {
        return Vec::new();
    };
    let attempt = |instance: &str, attempt: u32| {
        vec![("instance", json!(instance)), ("attempt", json!(attempt))]
    };
    match kind {
        Kind::ExecutionStarted(e) => {
            let options = e.options.clone().unwrap_or_default();
            vec![
                ("plan", json!(e.plan_name)),
                ("run", json!(e.run_number)),
                ("started_at_unix_ms", json!(e.started_at_unix_ms)),
                ("idempotency_key", json!(options.idempotency_key)),
                ("labels", json!(options.labels)),
                (
                    "format",
                    json!(enum_name(e.format, "PLAN_FORMAT_", PlanFormat::as_str_name)),
                ),
                ("spec", json!(e.spec)),
            ]
        }
        Kind::TaskDispatched(e) => attempt(&e.task_instance_id, e.attempt),
        Kind::TaskStarted(e) => {
            let mut res = attempt(&e.task_instance_id, e.attempt);
            res.push(("worker", json!(e.worker_id)));
            res
        }
        Kind::TaskValidated(e) => {
            let mut res = attempt(&e.task_instance_id, e.attempt);
            let results: Vec<Value> = e
                .results
                .iter()
                .map(|r| {
                    json!({
                        "name": r.name,
                        "level": trellis_proto::v1::CheckLevel::label_of(r.level),
                        "passed": r.passed,
                        "duration_ms": r.duration_ms,
                        "output": r.output,
                    })
                })
                .collect();
            res.push(("results", Value::Array(results)));
            res
        }
        Kind::TaskCompleted(e) => {
            let mut res = attempt(&e.task_instance_id, e.attempt);
            res.push(("output", json_bytes(&e.output)));
            res.push(("usage", usage_json(e.usage.as_ref())));
            res
        }
        Kind::TaskFailed(e) => {
            let mut res = attempt(&e.task_instance_id, e.attempt);
            res.push(("error", json!(e.error)));
            res.push(("retryable", json!(e.retryable)));
            res.push(("usage", usage_json(e.usage.as_ref())));
            res
        }
        Kind::SubtasksSpawned(e) => {
            let group = e.group.clone().unwrap_or_default();
            let members: Vec<Value> = group
                .members
                .iter()
                .map(|member| {
                    json!({
                        "task_type": member.task_type,
                        "queue": member.queue.as_deref().unwrap_or(&member.task_type),
                        "input": json_bytes(&member.input),
                    })
                })
                .collect();
            let mut res = attempt(&e.task_instance_id, e.attempt);
            res.push(("group", json!(group.group_id)));
            res.push(("rule", json!(rule_name(group.rule.as_ref()))));
            res.push(("members", Value::Array(members)));
            res
        }
        Kind::QuestionAsked(e) => {
            let mut res = attempt(&e.task_instance_id, e.attempt);
            res.extend(question_fields(&e.question.clone().unwrap_or_default()));
            res
        }
        Kind::StepCheckpointed(e) => {
            let mut res = attempt(&e.task_instance_id, e.attempt);
            res.push(("step", json!(e.step)));
            res.push(("state", json_bytes(&e.state)));
            res
        }
        Kind::TaskLost(e) => attempt(&e.task_instance_id, e.attempt),
        Kind::TaskPreempted(e) => attempt(&e.task_instance_id, e.attempt),
        Kind::TaskTimedOut(e) => attempt(&e.task_instance_id, e.attempt),
        Kind::PauseRequested(e) => vec![
            ("reason", json!(e.reason)),
            ("task", json!(e.task_id)),
            ("group", json!(e.group_id)),
            ("mode", json!(pause_mode_name(e.mode))),
        ],
        Kind::CancelRequested(e) => vec![("reason", json!(e.reason))],
        Kind::BudgetExhausted(e) => vec![("reason", json!(e.reason))],
        Kind::QuestionAnswered(e) => vec![
            ("question", json!(e.question_id)),
            ("answer", json!(e.answer)),
        ],
        Kind::QuestionExpired(e) => vec![("question", json!(e.question_id))],
        Kind::ResumeRequested(e) => vec![("task", json!(e.task_id)), ("group", json!(e.group_id))],
        Kind::ExecutionTimedOut(_) => Vec::new(),
        Kind::ExecutionFinished(e) => vec![("outcome", json!(outcome_name(e.outcome)))],
        Kind::RunStarted(e) => vec![("run_number", json!(e.run_number))],
        Kind::ExecutionClaimed(e) => vec![("coordinator", json!(e.coordinator))],
    }
}

/// Returns an event as one line for people: sequence, time, kind, then what it means.
///
/// `#12     2026-11-02 14:03:07Z  task_failed          instance i-1 attempt 1: boom (retryable)`
pub fn line(event: &Event) -> String {
    let kind = event.kind.as_ref();
    let sequence = format!("#{}", event.sequence);
    let res = format!(
        "{sequence:<7} {}  {:<KIND_WIDTH$}  {}",
        format_time(event.timestamp_unix_ms),
        kind_name(kind),
        describe(kind)
    );
    res.trim_end().to_owned()
}

/// Returns an event as one JSON object: `sequence`, `timestamp_unix_ms`, `execution_id`, `kind`,
/// then the kind's [`fields`].
pub fn json(event: &Event) -> Value {
    let kind = event.kind.as_ref();
    let mut object = Map::new();
    object.insert("sequence".to_owned(), json!(event.sequence));
    object.insert(
        "timestamp_unix_ms".to_owned(),
        json!(event.timestamp_unix_ms),
    );
    object.insert("execution_id".to_owned(), json!(event.execution_id));
    object.insert("kind".to_owned(), json!(kind_name(kind)));
    for (key, value) in fields(kind) {
        object.insert(key.to_owned(), value);
    }
    Value::Object(object)
}

/// Returns the state an event puts the execution in, when the event alone tells: a start, a pause
/// or resume request, and the three ways an execution ends (finished, timed out, cancelled). Other
/// changes (a budget that pauses or fails, a question that waits for a human) come with the
/// coordinator's progress snapshots.
pub fn execution_change(kind: Option<&Kind>) -> Option<ExecutionChange> {
    let change = |state, reason: &str| ExecutionChange {
        state,
        reason: reason.to_owned(),
    };
    match kind? {
        Kind::ExecutionStarted(_) => Some(change(ExecutionState::Running, "")),
        // A pause of one task or group leaves the execution as it was.
        Kind::ResumeRequested(e) if e.task_id.is_empty() && e.group_id.is_empty() => {
            Some(change(ExecutionState::Running, ""))
        }
        Kind::PauseRequested(e) if e.task_id.is_empty() && e.group_id.is_empty() => {
            Some(change(ExecutionState::Paused, &e.reason))
        }
        Kind::RunStarted(_) => Some(change(ExecutionState::Running, "")),
        Kind::CancelRequested(e) => Some(change(ExecutionState::Cancelled, &e.reason)),
        Kind::ExecutionTimedOut(_) => {
            Some(change(ExecutionState::Failed, "global timeout exceeded"))
        }
        Kind::ExecutionFinished(e) => match ExecutionOutcome::try_from(e.outcome) {
            Ok(ExecutionOutcome::Completed) => Some(change(ExecutionState::Completed, "")),
            Ok(ExecutionOutcome::Failed) => Some(change(ExecutionState::Failed, "")),
            Ok(ExecutionOutcome::Cancelled) => Some(change(ExecutionState::Cancelled, "")),
            // An outcome this build does not know still ends the execution.
            Ok(ExecutionOutcome::Unspecified) | Err(_) => {
                Some(change(ExecutionState::Failed, "unknown outcome"))
            }
        },
        _ => None,
    }
}

/// Names what a pause or resume covers: ``, `task build`, `group 0190…` (the whole execution
/// goes without saying).
fn pause_scope(task_id: &str, group_id: &str) -> String {
    match (task_id, group_id) {
        ("", "") => String::new(),
        (task, "") => format!("task {task}"),
        (_, group) => format!("group {group}"),
    }
}

/// `pause requested`, `pause of task build requested (preempt)`: scope and mode when either is
/// not the default (the whole execution, drain).
fn pause_text(task_id: &str, group_id: &str, mode: i32) -> String {
    let scope = pause_scope(task_id, group_id);
    let of = if scope.is_empty() {
        String::new()
    } else {
        format!(" of {scope}")
    };
    match pause_mode_name(mode) {
        "drain" => format!("pause{of} requested"),
        mode => format!("pause{of} requested ({mode})"),
    }
}

/// Returns a pause mode's name.
pub fn pause_mode_name(mode: i32) -> &'static str {
    trellis_wire::log::pause_mode_from_proto(mode).as_str()
}

/// Returns the group id and completion rule of a `SubtasksSpawned` event.
pub fn group_rule(kind: Option<&Kind>) -> Option<(String, String)> {
    match kind? {
        Kind::SubtasksSpawned(e) => {
            let group = e.group.as_ref()?;
            Some((group.group_id.clone(), rule_name(group.rule.as_ref())))
        }
        _ => None,
    }
}

/// Names a completion rule as plans write it: `all_settled`, `quorum 3`.
pub fn rule_name(rule: Option<&CompletionRule>) -> String {
    let rule = rule.copied().unwrap_or_default();
    match CompletionRuleKind::try_from(rule.kind) {
        Ok(CompletionRuleKind::Quorum) => format!("quorum {}", rule.quorum),
        Ok(CompletionRuleKind::Unspecified) | Err(_) => "all_settled".to_owned(),
        Ok(kind) => short_name(kind.as_str_name(), "COMPLETION_RULE_KIND_"),
    }
}

/// Names how an execution ended: `completed`, `failed`.
fn outcome_name(outcome: i32) -> String {
    enum_name(outcome, "EXECUTION_OUTCOME_", ExecutionOutcome::as_str_name)
}

/// Summarizes a group's members: `3 subtasks (lint ×2, test)`.
fn members_text(group: &SubtaskGroup) -> String {
    let mut types: Vec<(&str, usize)> = Vec::new();
    for member in &group.members {
        match types.iter_mut().find(|(t, _)| *t == member.task_type) {
            Some((_, n)) => *n += 1,
            None => types.push((&member.task_type, 1)),
        }
    }
    let types: Vec<String> = types
        .iter()
        .map(|&(t, n)| {
            if n > 1 {
                format!("{t} ×{n}")
            } else {
                t.to_owned()
            }
        })
        .collect();
    let n = group.members.len();
    format!(
        "{n} subtask{} ({})",
        if n == 1 { "" } else { "s" },
        one_line(&types.join(", "), MAX_TEXT_VALUE)
    )
}

/// The fields of a question, for JSON.
fn question_fields(question: &Question) -> Vec<(&'static str, Value)> {
    vec![
        ("question", json!(question.question_id)),
        ("question_type", json!(question.question_type)),
        ("priority", json!(question.priority)),
        ("text", json!(question.text)),
        ("options", json!(question.options)),
        ("expires_at_unix_ms", json!(question.expires_at_unix_ms)),
        (
            "timeout_action",
            json!(enum_name(
                question.timeout_action,
                "QUESTION_TIMEOUT_ACTION_",
                QuestionTimeoutAction::as_str_name,
            )),
        ),
        ("default_answer", json!(question.default_answer)),
    ]
}

/// Returns `: reason` after `what`, or `what` alone when there is no reason.
fn with_reason(what: &str, reason: &str) -> String {
    if reason.is_empty() {
        what.to_owned()
    } else {
        format!("{what}: {}", one_line(reason, MAX_TEXT_VALUE))
    }
}

/// Returns ` (1200 tokens, cost 0.0300)` for what an attempt consumed, or nothing when it consumed
/// nothing.
fn usage_text(usage: Option<&Usage>) -> String {
    match usage {
        Some(usage) if usage.tokens_used > 0 || usage.cost > 0.0 => {
            format!(" ({} tokens, cost {:.4})", usage.tokens_used, usage.cost)
        }
        _ => String::new(),
    }
}

/// Names a protobuf enum value by its wire name minus `prefix` (`completed` for
/// `EXECUTION_OUTCOME_COMPLETED`); a number this build does not know prints as the number.
fn enum_name<E: TryFrom<i32>>(
    value: i32,
    prefix: &str,
    name: impl Fn(&E) -> &'static str,
) -> String {
    E::try_from(value).map_or_else(|_| value.to_string(), |v| short_name(name(&v), prefix))
}

/// Returns a handler's JSON bytes as a JSON value, or as text when they are not JSON.
fn json_bytes(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    use trellis_core::ids::{ExecutionId, GroupId, QuestionId, TaskInstanceId, WorkerId};
    use trellis_core::machine::{self, EventBody, GroupRule, Outcome, SubtaskSpec, TimeoutAction};
    use trellis_proto::v1::{
        CancelRequested, ExecutionFinished, ExecutionOptions, ExecutionStarted, SubtasksSpawned,
        TaskCompleted, TaskDispatched, TaskFailed,
    };
    use trellis_wire::log::{Started, event_to_proto, started_to_proto};

    use super::*;

    fn event(sequence: u64, kind: Kind) -> Event {
        Event {
            execution_id: "exec-1".to_owned(),
            sequence,
            timestamp_unix_ms: 1_793_628_187_000,
            kind: Some(kind),
        }
    }

    fn dispatched(instance: &str, attempt: u32) -> Kind {
        Kind::TaskDispatched(TaskDispatched {
            task_instance_id: instance.to_owned(),
            attempt,
        })
    }

    #[test]
    fn completed_line_and_json() {
        let completed = event(
            7,
            Kind::TaskCompleted(TaskCompleted {
                task_instance_id: "i-1".to_owned(),
                attempt: 2,
                output: br#"{"ok":true}"#.to_vec(),
                usage: Some(Usage {
                    tokens_used: 1200,
                    cost: 0.03,
                }),
            }),
        );
        assert_eq!(
            line(&completed),
            r#"#7      2026-11-02 14:03:07Z  task_completed       instance i-1 attempt 2 completed: {"ok":true} (1200 tokens, cost 0.0300)"#
        );
        let object = json(&completed);
        assert_eq!(object["kind"], "task_completed");
        assert_eq!(object["sequence"], 7);
        assert_eq!(object["instance"], "i-1");
        assert_eq!(object["attempt"], 2);
        assert_eq!(object["output"]["ok"], true);
        assert_eq!(object["usage"]["tokens_used"], 1200);
        assert_eq!(object["execution_id"], "exec-1");
    }

    #[test]
    fn failure_says_whether_it_is_retryable_and_cuts_the_error() {
        let failed = |retryable| {
            event(
                12,
                Kind::TaskFailed(TaskFailed {
                    task_instance_id: "i-1".to_owned(),
                    attempt: 1,
                    error: format!("exit status 1\n{}", "x".repeat(200)),
                    retryable,
                    usage: None,
                }),
            )
        };
        assert_eq!(
            line(&failed(true)),
            "#12     2026-11-02 14:03:07Z  task_failed          \
             instance i-1 attempt 1: exit status 1… (retryable)"
        );
        assert!(
            line(&failed(false)).ends_with(": exit status 1… (not retryable)"),
            "{}",
            line(&failed(false))
        );
        let object = json(&failed(false));
        assert_eq!(object["retryable"], false);
        assert_eq!(
            object["error"].as_str().map(str::len),
            Some("exit status 1\n".len() + 200),
            "JSON keeps the whole error"
        );
    }

    #[test]
    fn a_second_dispatch_of_an_instance_is_a_retry() {
        assert_eq!(
            describe(Some(&dispatched("i-1", 1))),
            "instance i-1 attempt 1 sent to a worker"
        );
        assert_eq!(
            describe(Some(&dispatched("i-1", 2))),
            "instance i-1 attempt 2 sent to a worker (retry)"
        );
        let object = json(&event(3, dispatched("i-1", 2)));
        assert_eq!(object["kind"], "task_dispatched");
        assert_eq!(object["attempt"], 2);
    }

    #[test]
    fn spawned_group_names_its_rule_and_members() {
        let member = |task_type: &str| trellis_proto::v1::SubtaskSpec {
            task_type: task_type.to_owned(),
            input: br#"{"file":"a.rs"}"#.to_vec(),
            queue: None,
        };
        let spawned = Kind::SubtasksSpawned(SubtasksSpawned {
            task_instance_id: "p".to_owned(),
            attempt: 1,
            group: Some(SubtaskGroup {
                group_id: "g".to_owned(),
                rule: Some(CompletionRule {
                    kind: CompletionRuleKind::Quorum as i32,
                    quorum: 2,
                }),
                members: vec![member("lint"), member("test"), member("lint")],
            }),
        });
        assert_eq!(
            describe(Some(&spawned)),
            "instance p attempt 1 spawned group g: 3 subtasks (lint ×2, test), quorum 2"
        );
        let object = json(&event(4, spawned.clone()));
        assert_eq!(object["kind"], "subtasks_spawned");
        assert_eq!(object["group"], "g");
        assert_eq!(object["rule"], "quorum 2");
        assert_eq!(object["members"].as_array().map(Vec::len), Some(3));
        assert_eq!(object["members"][1]["task_type"], "test");
        assert_eq!(object["members"][1]["queue"], "test");
        assert_eq!(object["members"][1]["input"]["file"], "a.rs");
        assert_eq!(
            group_rule(Some(&spawned)),
            Some(("g".to_owned(), "quorum 2".to_owned()))
        );
        assert_eq!(group_rule(Some(&dispatched("p", 1))), None);
    }

    #[test]
    fn start_names_plan_run_and_options() {
        let started = Kind::ExecutionStarted(ExecutionStarted {
            plan_name: "feature-x".to_owned(),
            run_number: 1,
            spec: "name: feature-x\n".to_owned(),
            format: PlanFormat::Yaml as i32,
            options: Some(ExecutionOptions {
                idempotency_key: "k-1".to_owned(),
                labels: [("team", "infra"), ("env", "ci")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
                ..ExecutionOptions::default()
            }),
            started_at_unix_ms: 1_793_628_187_000,
            ..ExecutionStarted::default()
        });
        assert_eq!(
            describe(Some(&started)),
            "plan \"feature-x\" started as run 1, idempotency key \"k-1\", labels env=ci team=infra"
        );
        let object = json(&event(1, started));
        assert_eq!(object["plan"], "feature-x");
        assert_eq!(object["format"], "yaml");
        assert_eq!(object["labels"]["team"], "infra");
        assert_eq!(object["spec"], "name: feature-x\n");
    }

    #[test]
    fn events_that_end_or_steer_the_execution() {
        let state = |kind: Kind| execution_change(Some(&kind)).map(|c| (c.state, c.reason));
        let finished = |outcome: ExecutionOutcome| {
            Kind::ExecutionFinished(ExecutionFinished {
                outcome: outcome as i32,
            })
        };
        assert_eq!(
            state(finished(ExecutionOutcome::Completed)),
            Some((ExecutionState::Completed, String::new()))
        );
        assert_eq!(
            state(finished(ExecutionOutcome::Failed)).map(|(s, _)| s),
            Some(ExecutionState::Failed)
        );
        assert_eq!(
            state(Kind::CancelRequested(CancelRequested {
                reason: "wrong branch".to_owned(),
            })),
            Some((ExecutionState::Cancelled, "wrong branch".to_owned()))
        );
        assert_eq!(
            state(Kind::ExecutionTimedOut(Default::default())).map(|(s, _)| s),
            Some(ExecutionState::Failed)
        );
        assert_eq!(state(dispatched("i", 1)), None);
        assert_eq!(
            line(&event(20, finished(ExecutionOutcome::Completed))),
            "#20     2026-11-02 14:03:07Z  execution_finished   execution completed"
        );
    }

    /// Every event the state machine records, as the coordinator sends it.
    fn every_machine_event() -> Vec<EventBody> {
        let instance = TaskInstanceId::derived(1, 1);
        let question = QuestionId::derived(1, 2);
        let usage = machine::Usage {
            tokens_used: 10,
            cost: 0.5,
        };
        vec![
            EventBody::TaskStarted {
                instance,
                attempt: 1,
                worker: WorkerId::from("w-1"),
            },
            EventBody::TaskCompleted {
                instance,
                attempt: 1,
                output: serde_json::json!({"ok": true}),
                usage,
            },
            EventBody::TaskFailed {
                instance,
                attempt: 1,
                error: "boom".to_owned(),
                retryable: true,
                usage,
            },
            EventBody::SubtasksSpawned {
                instance,
                attempt: 1,
                group: GroupId::derived(1, 3),
                rule: GroupRule::FirstSuccess,
                members: vec![SubtaskSpec {
                    task_type: "lint".to_owned(),
                    queue: Some("fast".to_owned()),
                    input: serde_json::json!(null),
                }],
            },
            EventBody::QuestionAsked {
                instance,
                attempt: 1,
                question: machine::Question {
                    id: question,
                    question_type: "approval".to_owned(),
                    priority: "high".to_owned(),
                    text: "Ship it?".to_owned(),
                    options: vec!["yes".to_owned(), "no".to_owned()],
                    expires_at_ms: Some(5),
                    timeout_action: TimeoutAction::Answer("no".to_owned()),
                },
            },
            EventBody::StepCheckpointed {
                instance,
                attempt: 1,
                step: "fetch".to_owned(),
                state: serde_json::json!({"n": 1}),
            },
            EventBody::TaskLost {
                instance,
                attempt: 1,
            },
            EventBody::pause("lunch".to_owned()),
            EventBody::resume(),
            EventBody::CancelRequested {
                reason: "stop".to_owned(),
            },
            EventBody::QuestionAnswered {
                question,
                answer: "yes".to_owned(),
            },
            EventBody::TaskDispatched {
                instance,
                attempt: 2,
            },
            EventBody::TaskTimedOut {
                instance,
                attempt: 2,
            },
            EventBody::QuestionExpired { question },
            EventBody::BudgetExhausted {
                reason: "tokens 110 of 100".to_owned(),
            },
            EventBody::ExecutionTimedOut,
            EventBody::ExecutionFinished {
                outcome: Outcome::Failed,
            },
        ]
    }

    #[test]
    fn every_kind_is_named_as_the_state_machine_names_it_and_described() {
        let execution_id = ExecutionId::derived(1, 0);
        let mut wire = vec![(
            "execution_started",
            started_to_proto(execution_id, &Started::default()),
        )];
        for (sequence, body) in (2..).zip(every_machine_event()) {
            let event = machine::Event { at_ms: 7, body };
            wire.push((
                event.body.name(),
                event_to_proto(execution_id, sequence, &event),
            ));
        }
        assert_eq!(wire.len(), 18, "one per kind of the oneof");
        for (name, event) in &wire {
            assert_eq!(kind_name(event.kind.as_ref()), *name);
            assert_eq!(json(event)["kind"], *name);
            let text = line(event);
            assert!(text.contains(name), "{text}");
            assert!(
                !describe(event.kind.as_ref()).is_empty(),
                "{name} has no description"
            );
        }
        let described: Vec<String> = wire
            .iter()
            .map(|(_, event)| describe(event.kind.as_ref()))
            .collect();
        let instance = TaskInstanceId::derived(1, 1).to_string();
        assert!(described.contains(&format!(
            "instance {instance} attempt 1 started on worker w-1"
        )));
        assert!(described.contains(&format!(
            "instance {instance} attempt 1 asks question {}: \"Ship it?\" [yes | no]",
            QuestionId::derived(1, 2)
        )));
        assert!(described.contains(&"pause requested: lunch".to_owned()));
        assert!(described.contains(&"budget exhausted: tokens 110 of 100".to_owned()));
        assert!(described.contains(&"execution failed".to_owned()));

        let asked = json(&wire[5].1);
        assert_eq!(asked["kind"], "question_asked");
        assert_eq!(asked["timeout_action"], "answer_default");
        assert_eq!(asked["default_answer"], "no");
        let spawned = json(&wire[4].1);
        assert_eq!(spawned["rule"], "first_success");
        assert_eq!(spawned["members"][0]["queue"], "fast");
    }

    #[test]
    fn an_unknown_kind_is_still_a_line() {
        let unknown = Event {
            kind: None,
            ..event(5, dispatched("i", 1))
        };
        assert_eq!(kind_name(None), "unknown");
        assert!(line(&unknown).contains("unknown"), "{}", line(&unknown));
        assert_eq!(json(&unknown)["kind"], "unknown");
    }

    #[test]
    fn pauses_of_part_of_an_execution_name_their_scope_and_mode() {
        assert_eq!(pause_text("", "", 1), "pause requested");
        assert_eq!(
            pause_text("build", "", 2),
            "pause of task build requested (preempt)"
        );
        assert_eq!(pause_text("", "g-1", 0), "pause of group g-1 requested");
    }
}
