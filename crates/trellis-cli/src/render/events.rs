//! Everything the CLI knows about the kinds of `Event`: their names, their one-line and JSON forms,
//! and what each one does to task instances and to the execution (for progress).
//!
//! This is the only module that matches on `event::Kind`, so a change of the event log's shape is
//! adapted here. A kind without a description of its own is still shown: by its oneof name and its
//! Debug form.

use serde_json::{Map, Value, json};
use trellis_proto::v1::event::Kind;
use trellis_proto::v1::{
    BudgetAction, BudgetKind, CompletionRule, CompletionRuleKind, Event, ExecutionState,
    GroupOutcome, QuestionTimeoutAction, TaskState, TaskStateCounts,
};

use super::{format_time, one_line, short_name};

/// Longest value shown in a text line; JSON keeps everything.
const MAX_TEXT_VALUE: usize = 80;

/// A task instance entering a state, as an event tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceChange {
    pub task_instance_id: String,
    /// The plan task id, when the event names it (the first event of an instance does).
    pub task_id: Option<String>,
    pub state: TaskState,
}

/// The execution entering a state, as an event tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionChange {
    pub state: ExecutionState,
    /// Why it paused, failed or was cancelled; empty otherwise.
    pub reason: String,
    /// The final counts, carried by the events that end a run.
    pub counts: Option<TaskStateCounts>,
}

/// Returns the oneof name of an event's kind in snake case (`task_completed`), read from its Debug
/// form so that kinds added later are named too; `unknown` when the kind is not set or not known
/// to this build.
pub fn kind_name(kind: Option<&Kind>) -> String {
    let Some(kind) = kind else {
        return "unknown".to_owned();
    };
    let debug = format!("{kind:?}");
    let camel = debug.split(['(', ' ', '{']).next().unwrap_or("");
    let mut name = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                name.push('_');
            }
            name.extend(c.to_lowercase());
        } else {
            name.push(c);
        }
    }
    name
}

/// Returns the fields worth showing for an event, in display order.
pub fn fields(kind: Option<&Kind>) -> Vec<(&'static str, Value)> {
    let Some(kind) = kind else {
        return Vec::new();
    };
    match kind {
        Kind::ExecutionStarted(e) => vec![
            (
                "plan",
                json!(e.plan.as_ref().map(|p| p.name.as_str()).unwrap_or("")),
            ),
            ("tasks", json!(e.plan.as_ref().map_or(0, |p| p.tasks.len()))),
            ("run", json!(e.run_number)),
        ],
        Kind::TaskQueued(e) => vec![
            ("task", json!(e.task_id)),
            ("instance", json!(e.task_instance_id)),
            ("attempt", json!(e.attempt)),
        ],
        Kind::TaskBlocked(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("by", json!(e.conflicting_task_instance_id)),
            ("path", json!(e.path)),
        ],
        Kind::TaskDispatched(e) => vec![
            ("task", json!(e.task_id)),
            ("instance", json!(e.task_instance_id)),
            ("attempt", json!(e.attempt)),
            ("queue", json!(e.queue)),
        ],
        Kind::TaskStarted(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("attempt", json!(e.attempt)),
            ("worker", json!(e.worker_id)),
        ],
        Kind::TaskCompleted(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("attempt", json!(e.attempt)),
            ("output", json_bytes(&e.output)),
        ],
        Kind::TaskFailed(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("attempt", json!(e.attempt)),
            ("error", json!(e.error)),
            ("retryable", json!(e.retryable)),
        ],
        Kind::FailureActionTaken(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("action", json!(e.action)),
            ("reason", json!(e.reason)),
        ],
        Kind::TaskRetryScheduled(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("next_attempt", json!(e.next_attempt)),
            ("at", json!(format_time(e.not_before_unix_ms))),
        ],
        Kind::TaskSkipped(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("reason", json!(e.reason)),
        ],
        Kind::TaskCancelled(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("reason", json!(e.reason)),
        ],
        Kind::TaskTimedOut(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("attempt", json!(e.attempt)),
        ],
        Kind::TaskReassigned(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("attempt", json!(e.attempt)),
            ("from_worker", json!(e.from_worker_id)),
            ("reason", json!(e.reason)),
        ],
        Kind::SubtaskGroupSpawned(e) => vec![
            ("group", json!(e.group_id)),
            ("parent", json!(e.parent_task_instance_id)),
            ("members", json!(e.member_count)),
            ("rule", json!(rule_name(e.rule.as_ref()))),
        ],
        Kind::SubtaskGroupSettled(e) => vec![
            ("group", json!(e.group_id)),
            (
                "outcome",
                json!(enum_name(
                    e.outcome,
                    "GROUP_OUTCOME_",
                    GroupOutcome::as_str_name
                )),
            ),
            ("succeeded", json!(e.succeeded)),
            ("failed", json!(e.failed)),
            ("cancelled", json!(e.cancelled)),
        ],
        Kind::ParentResumed(e) => vec![
            ("group", json!(e.group_id)),
            ("parent", json!(e.parent_task_instance_id)),
            ("instance", json!(e.new_task_instance_id)),
        ],
        Kind::HumanReviewRequested(e) => {
            let question = e.question.clone().unwrap_or_default();
            vec![
                ("instance", json!(e.task_instance_id)),
                ("question", json!(question.question_id)),
                ("text", json!(question.text)),
                ("options", json!(question.options)),
            ]
        }
        Kind::HumanReviewAnswered(e) => {
            let answer = e.answer.clone().unwrap_or_default();
            vec![
                ("instance", json!(e.task_instance_id)),
                ("question", json!(answer.question_id)),
                ("answer", json!(answer.answer)),
                ("by", json!(answer.answered_by)),
                ("continued_by", json!(e.new_task_instance_id)),
            ]
        }
        Kind::QuestionExpired(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("question", json!(e.question_id)),
            (
                "action",
                json!(enum_name(
                    e.timeout_action,
                    "QUESTION_TIMEOUT_ACTION_",
                    QuestionTimeoutAction::as_str_name,
                )),
            ),
        ],
        Kind::StepCheckpointed(e) => vec![
            ("instance", json!(e.task_instance_id)),
            ("attempt", json!(e.attempt)),
            ("step", json!(e.step)),
            ("next_step", json!(e.next_step)),
        ],
        Kind::BudgetExhausted(e) => vec![
            (
                "budget",
                json!(enum_name(e.budget, "BUDGET_KIND_", BudgetKind::as_str_name)),
            ),
            ("used", json!(e.used)),
            ("limit", json!(e.limit)),
            (
                "action",
                json!(enum_name(
                    e.action,
                    "BUDGET_ACTION_",
                    BudgetAction::as_str_name
                )),
            ),
        ],
        Kind::ExecutionPaused(e) => vec![("reason", json!(e.reason))],
        Kind::ExecutionResumed(e) => vec![("reason", json!(e.reason))],
        Kind::ExecutionCancelled(e) => vec![("reason", json!(e.reason))],
        Kind::ExecutionCompleted(e) => {
            vec![("counts", super::counts_json(&e.counts.unwrap_or_default()))]
        }
        Kind::ExecutionFailed(e) => vec![
            ("reason", json!(e.reason)),
            ("counts", super::counts_json(&e.counts.unwrap_or_default())),
        ],
        // The generic form: everything the message holds, as Debug text.
        other => vec![("details", json!(debug_body(other)))],
    }
}

/// Returns an event as one line: sequence, time, kind, then `key=value` fields.
pub fn line(event: &Event) -> String {
    let kind = event.kind.as_ref();
    let mut res = format!(
        "{:>6}  {}  {:<22}",
        event.sequence,
        format_time(event.timestamp_unix_ms),
        kind_name(kind)
    );
    for (key, value) in fields(kind) {
        let text = match &value {
            Value::String(s) if s.is_empty() => continue,
            Value::Array(items) if items.is_empty() => continue,
            Value::String(s) if s.contains(char::is_whitespace) || s.is_empty() => {
                format!("{:?}", one_line(s, MAX_TEXT_VALUE))
            }
            Value::String(s) => one_line(s, MAX_TEXT_VALUE),
            Value::Object(map) if key == "counts" => compact_counts(map),
            other => one_line(&other.to_string(), MAX_TEXT_VALUE),
        };
        res.push(' ');
        res.push_str(key);
        res.push('=');
        res.push_str(&text);
    }
    res.truncate(res.trim_end().len());
    res
}

/// Returns an event as one JSON object: `sequence`, `timestamp_unix_ms`, `execution_id`, `kind`,
/// then the kind's fields.
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

/// Returns the task instances an event moves to a new state. Progress counts are built from these.
pub fn instance_changes(kind: Option<&Kind>) -> Vec<InstanceChange> {
    let change = |id: &str, task_id: Option<&str>, state: TaskState| InstanceChange {
        task_instance_id: id.to_owned(),
        task_id: task_id.map(str::to_owned),
        state,
    };
    let Some(kind) = kind else {
        return Vec::new();
    };
    match kind {
        Kind::TaskQueued(e) => vec![change(
            &e.task_instance_id,
            Some(&e.task_id),
            TaskState::Queued,
        )],
        Kind::TaskBlocked(e) => vec![change(&e.task_instance_id, None, TaskState::Blocked)],
        Kind::TaskDispatched(e) => vec![change(
            &e.task_instance_id,
            Some(&e.task_id),
            TaskState::Running,
        )],
        Kind::TaskStarted(e) => vec![change(&e.task_instance_id, None, TaskState::Running)],
        Kind::TaskCompleted(e) => vec![change(&e.task_instance_id, None, TaskState::Completed)],
        Kind::TaskFailed(e) => vec![change(&e.task_instance_id, None, TaskState::Failed)],
        Kind::TaskRetryScheduled(e) => {
            vec![change(&e.task_instance_id, None, TaskState::RetryScheduled)]
        }
        Kind::TaskSkipped(e) => vec![change(&e.task_instance_id, None, TaskState::Skipped)],
        Kind::TaskCancelled(e) => vec![change(&e.task_instance_id, None, TaskState::Cancelled)],
        Kind::SubtaskGroupSpawned(e) => {
            let mut changes = vec![change(
                &e.parent_task_instance_id,
                None,
                TaskState::WaitingForSubtasks,
            )];
            changes.extend(e.members.iter().map(|member| {
                change(
                    &member.task_instance_id,
                    Some(&member.task_type),
                    TaskState::Queued,
                )
            }));
            changes
        }
        // The waiting instance's turn is over; its task goes on as the new instance, which is
        // counted from its own `TaskQueued`/`TaskDispatched`.
        Kind::ParentResumed(e) => vec![change(
            &e.parent_task_instance_id,
            None,
            TaskState::Completed,
        )],
        Kind::HumanReviewRequested(e) => vec![change(
            &e.task_instance_id,
            None,
            TaskState::WaitingForHuman,
        )],
        Kind::HumanReviewAnswered(e) => {
            vec![change(&e.task_instance_id, None, TaskState::Completed)]
        }
        _ => Vec::new(),
    }
}

/// Returns how an event changes the execution's own state, if it does.
pub fn execution_change(kind: Option<&Kind>) -> Option<ExecutionChange> {
    let change = |state, reason: &str, counts: Option<TaskStateCounts>| ExecutionChange {
        state,
        reason: reason.to_owned(),
        counts,
    };
    match kind? {
        Kind::ExecutionStarted(_) | Kind::ExecutionResumed(_) => {
            Some(change(ExecutionState::Running, "", None))
        }
        Kind::ExecutionPaused(e) => Some(change(ExecutionState::Paused, &e.reason, None)),
        Kind::ExecutionCancelled(e) => Some(change(ExecutionState::Cancelled, &e.reason, None)),
        Kind::ExecutionCompleted(e) => Some(change(ExecutionState::Completed, "", e.counts)),
        Kind::ExecutionFailed(e) => Some(change(ExecutionState::Failed, &e.reason, e.counts)),
        _ => None,
    }
}

/// Returns the group id and completion rule of a `SubtaskGroupSpawned` event.
pub fn group_rule(kind: Option<&Kind>) -> Option<(String, String)> {
    match kind? {
        Kind::SubtaskGroupSpawned(e) => Some((e.group_id.clone(), rule_name(e.rule.as_ref()))),
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

/// Names a protobuf enum value by its wire name minus `prefix` (`succeeded` for
/// `GROUP_OUTCOME_SUCCEEDED`); a number this build does not know prints as the number.
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

/// Returns the Debug form of a kind's message, without the variant wrapper.
fn debug_body(kind: &Kind) -> String {
    let debug = format!("{kind:?}");
    match (debug.find('('), debug.rfind(')')) {
        (Some(open), Some(close)) if open < close => debug[open + 1..close].to_owned(),
        _ => debug,
    }
}

/// Writes a counts object as `completed:3,failed:1`, leaving out zeros.
fn compact_counts(map: &Map<String, Value>) -> String {
    let parts: Vec<String> = map
        .iter()
        .filter(|(_, n)| n.as_u64().is_some_and(|n| n > 0))
        .map(|(state, n)| format!("{state}:{n}"))
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use trellis_proto::v1::{
        CheckpointCreated, ExecutionFailed, SubtaskGroupSpawned, TaskCompleted, TaskFailed,
    };

    use super::*;

    fn event(sequence: u64, kind: Kind) -> Event {
        Event {
            execution_id: "exec-1".to_owned(),
            sequence,
            timestamp_unix_ms: 1_793_628_187_000,
            kind: Some(kind),
        }
    }

    #[test]
    fn completed_line_and_json() {
        let completed = event(
            7,
            Kind::TaskCompleted(TaskCompleted {
                task_instance_id: "i-1".to_owned(),
                attempt: 2,
                output: br#"{"ok":true}"#.to_vec(),
                usage: None,
            }),
        );
        assert_eq!(
            line(&completed),
            r#"     7  2026-11-02 14:03:07Z  task_completed         instance=i-1 attempt=2 output={"ok":true}"#
        );
        let object = json(&completed);
        assert_eq!(object["kind"], "task_completed");
        assert_eq!(object["sequence"], 7);
        assert_eq!(object["output"]["ok"], true);
        assert_eq!(object["execution_id"], "exec-1");
    }

    #[test]
    fn text_values_with_spaces_are_quoted_and_cut() {
        let failed = event(
            8,
            Kind::TaskFailed(TaskFailed {
                task_instance_id: "i-1".to_owned(),
                attempt: 1,
                error: format!("exit status 1\n{}", "x".repeat(200)),
                retryable: true,
                usage: None,
            }),
        );
        assert_eq!(
            line(&failed),
            "     8  2026-11-02 14:03:07Z  task_failed            instance=i-1 attempt=1 \
             error=\"exit status 1…\" retryable=true"
        );
    }

    #[test]
    fn final_counts_are_compact() {
        let failed = event(
            9,
            Kind::ExecutionFailed(ExecutionFailed {
                reason: "task api failed".to_owned(),
                counts: Some(TaskStateCounts {
                    completed: 3,
                    failed: 1,
                    ..TaskStateCounts::default()
                }),
                usage: None,
            }),
        );
        assert!(
            line(&failed).ends_with(
                "execution_failed       reason=\"task api failed\" counts=completed:3,failed:1"
            ),
            "{}",
            line(&failed)
        );
    }

    #[test]
    fn kinds_without_a_description_show_their_debug_form() {
        let checkpoint = event(
            3,
            Kind::CheckpointCreated(CheckpointCreated {
                checkpoint_id: "c-1".to_owned(),
                sequence: 2,
            }),
        );
        assert_eq!(kind_name(checkpoint.kind.as_ref()), "checkpoint_created");
        let text = line(&checkpoint);
        assert!(text.contains("checkpoint_created"), "{text}");
        assert!(text.contains("checkpoint_id"), "{text}");
        assert_eq!(kind_name(None), "unknown");
    }

    #[test]
    fn spawned_group_changes_parent_and_members() {
        let spawned = Kind::SubtaskGroupSpawned(SubtaskGroupSpawned {
            group_id: "g".to_owned(),
            parent_task_instance_id: "p".to_owned(),
            rule: Some(CompletionRule {
                kind: CompletionRuleKind::Quorum as i32,
                quorum: 2,
            }),
            member_count: 1,
            members: vec![trellis_proto::v1::SpawnedMember {
                task_instance_id: "m".to_owned(),
                task_type: "noop".to_owned(),
                ..Default::default()
            }],
        });
        let changes = instance_changes(Some(&spawned));
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].state, TaskState::WaitingForSubtasks);
        assert_eq!(changes[1].task_instance_id, "m");
        assert_eq!(
            group_rule(Some(&spawned)),
            Some(("g".to_owned(), "quorum 2".to_owned()))
        );
    }
}
