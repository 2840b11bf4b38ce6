//! The event log on the wire (docs/design.md §2): each execution's log is a sequence of `Event`s,
//! published on `trellis.events.<execution_id>` as `EventBatch` messages.
//!
//! The log is the source of truth, so [`event_to_proto`] and [`event_from_proto`] are exact
//! inverses: every [`EventBody`] decodes to the value that was encoded, which is what lets a replay
//! rebuild the state that was live. The log's `Event` mirrors `EventBody` one for one, plus
//! `ExecutionStarted` ([`Started`], sequence 1), which carries the spec text and the compiled plan's
//! canonical encoding, so that a replay decodes the identical plan ([`Started::plan`]).
//!
//! Nothing read from the log is trusted: decoding checks every id, enum value, instant and JSON
//! payload and returns a [`ConvertError`] naming the field
//! (`event.task_dispatched.task_instance_id: invalid uuid "x"`), never panics. A member of a `oneof`
//! is a field of its message, and a missing `oneof` is named itself (`event.kind: missing`).

use std::collections::BTreeMap;

use prost::Message;
use trellis_core::ids::{ExecutionId, TaskInstanceId, WorkerId};
use trellis_core::machine::{Event, EventBody, Outcome, PauseMode, PauseScope};
use trellis_proto::v1;

use crate::common::{
    check_results_from_proto, check_results_to_proto, instant_to_proto, json_to_bytes,
    question_from_proto, question_to_proto, subtask_group_from_proto, subtask_group_to_proto,
    usage_from_proto, usage_to_proto,
};
use crate::error::{
    At, ConvertError, ConvertErrorKind, non_empty, parse_enum, parse_id, parse_instant, parse_json,
    required,
};

/// One decoded entry of an execution's log.
#[derive(Clone, Debug, PartialEq)]
pub enum LogEntry {
    /// Sequence 1: what is needed to rebuild the state machine.
    Started(Started),
    /// A state machine event, to apply in sequence order.
    Event(Event),
}

/// The `ExecutionStarted` event: the first entry of every log.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Started {
    pub plan_name: String,
    pub run_number: u32,
    /// The plan spec text exactly as it was compiled; compiling it again gives the same plan.
    pub spec: String,
    pub format: v1::PlanFormat,
    pub started_at_ms: u64,
    /// The caller's idempotency key; empty when none was given.
    pub idempotency_key: String,
    pub labels: BTreeMap<String, String>,
    /// The namespace the execution runs in; empty in logs written before namespaces, read as
    /// `default`.
    pub namespace: String,
    /// The namespace quota's cap on running task instances, when lower than the plan's.
    pub max_concurrency_cap: Option<u32>,
    /// The W3C `traceparent` of the call that started the execution; empty when not traced.
    pub traceparent: String,
    /// The compiled plan, cap applied, as [`trellis_core::plan::encode`] writes it; empty in
    /// logs written before it was recorded.
    pub compiled_plan: Vec<u8>,
}

impl Started {
    /// Returns the plan the execution runs, quota cap applied: decoded from its recorded
    /// encoding, without compiling. Logs written before the encoding was recorded compile the
    /// spec again (the log already accepted it, so the deployment's size limits do not apply
    /// again: they may have changed since) and apply the cap.
    pub fn plan(&self) -> Result<trellis_core::plan::Plan, String> {
        if !self.compiled_plan.is_empty() {
            return trellis_core::plan::decode(&self.compiled_plan)
                .map_err(|err| format!("its recorded plan does not decode: {err}"));
        }
        let limits = trellis_core::plan::Limits {
            max_input_bytes: usize::MAX,
            max_tasks: usize::MAX,
            ..trellis_core::plan::Limits::default()
        };
        let mut plan = trellis_core::plan::compile_str(&self.spec, &limits).map_err(|errors| {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("its spec no longer compiles: {}", errors.join("; "))
        })?;
        if let Some(cap) = self.max_concurrency_cap {
            plan.options.max_concurrency = Some(cap);
        }
        Ok(plan)
    }

    /// The namespace, `default` for logs written before namespaces.
    pub fn namespace(&self) -> &str {
        if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        }
    }
}

/// Returns the log entry (always sequence 1) recording the start of an execution.
pub fn started_to_proto(execution_id: ExecutionId, started: &Started) -> v1::Event {
    v1::Event {
        execution_id: execution_id.to_string(),
        sequence: 1,
        timestamp_unix_ms: instant_to_proto(started.started_at_ms),
        kind: Some(v1::event::Kind::ExecutionStarted(v1::ExecutionStarted {
            plan_name: started.plan_name.clone(),
            run_number: started.run_number,
            spec: started.spec.clone(),
            format: started.format.into(),
            options: Some(v1::ExecutionOptions {
                idempotency_key: started.idempotency_key.clone(),
                labels: started
                    .labels
                    .iter()
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect(),
                namespace: started.namespace.clone(),
            }),
            started_at_unix_ms: instant_to_proto(started.started_at_ms),
            max_concurrency_cap: started.max_concurrency_cap,
            traceparent: started.traceparent.clone(),
            compiled_plan: started.compiled_plan.clone(),
        })),
    }
}

/// Returns the log entry of a state machine event at position `sequence` of the execution's log.
pub fn event_to_proto(execution_id: ExecutionId, sequence: u64, event: &Event) -> v1::Event {
    v1::Event {
        execution_id: execution_id.to_string(),
        sequence,
        timestamp_unix_ms: instant_to_proto(event.at_ms),
        kind: Some(event_body_to_proto(&event.body)),
    }
}

/// Returns the batch of consecutive log entries `first_sequence`, `first_sequence + 1`, ... for
/// `events`, published as one message.
pub fn event_batch_to_proto(
    execution_id: ExecutionId,
    first_sequence: u64,
    events: &[Event],
) -> v1::EventBatch {
    v1::EventBatch {
        events: events
            .iter()
            .zip(first_sequence..)
            .map(|(event, sequence)| event_to_proto(execution_id, sequence, event))
            .collect(),
    }
}

/// Returns the wire form of a state machine event's body, the `kind` of its log entry.
fn event_body_to_proto(body: &EventBody) -> v1::event::Kind {
    use v1::event::Kind;
    let id = |instance: &TaskInstanceId| instance.to_string();
    match body {
        EventBody::TaskStarted {
            instance,
            attempt,
            worker,
        } => Kind::TaskStarted(v1::TaskStarted {
            task_instance_id: id(instance),
            attempt: *attempt,
            worker_id: worker.0.clone(),
        }),
        EventBody::TaskValidated {
            instance,
            attempt,
            results,
        } => Kind::TaskValidated(v1::TaskValidated {
            task_instance_id: id(instance),
            attempt: *attempt,
            results: check_results_to_proto(results),
        }),
        EventBody::TaskCompleted {
            instance,
            attempt,
            output,
            usage,
        } => Kind::TaskCompleted(v1::TaskCompleted {
            task_instance_id: id(instance),
            attempt: *attempt,
            output: json_to_bytes(output),
            usage: Some(usage_to_proto(*usage)),
        }),
        EventBody::TaskFailed {
            instance,
            attempt,
            error,
            retryable,
            usage,
        } => Kind::TaskFailed(v1::TaskFailed {
            task_instance_id: id(instance),
            attempt: *attempt,
            error: error.clone(),
            retryable: *retryable,
            usage: Some(usage_to_proto(*usage)),
        }),
        EventBody::SubtasksSpawned {
            instance,
            attempt,
            group,
            rule,
            members,
        } => Kind::SubtasksSpawned(v1::SubtasksSpawned {
            task_instance_id: id(instance),
            attempt: *attempt,
            group: Some(subtask_group_to_proto(*group, *rule, members)),
        }),
        EventBody::QuestionAsked {
            instance,
            attempt,
            question,
        } => Kind::QuestionAsked(v1::QuestionAsked {
            task_instance_id: id(instance),
            attempt: *attempt,
            question: Some(question_to_proto(question)),
        }),
        EventBody::StepCheckpointed {
            instance,
            attempt,
            step,
            state,
        } => Kind::StepCheckpointed(v1::StepCheckpointed {
            task_instance_id: id(instance),
            attempt: *attempt,
            step: step.clone(),
            state: json_to_bytes(state),
        }),
        EventBody::TaskLost { instance, attempt } => Kind::TaskLost(v1::TaskLost {
            task_instance_id: id(instance),
            attempt: *attempt,
        }),
        EventBody::TaskPreempted { instance, attempt } => Kind::TaskPreempted(v1::TaskPreempted {
            task_instance_id: id(instance),
            attempt: *attempt,
        }),
        EventBody::PauseRequested {
            reason,
            scope,
            mode,
        } => {
            let (task_id, group_id) = scope_to_proto(scope);
            Kind::PauseRequested(v1::PauseRequested {
                reason: reason.clone(),
                task_id,
                group_id,
                mode: pause_mode_to_proto(*mode) as i32,
            })
        }
        EventBody::ResumeRequested { scope } => {
            let (task_id, group_id) = scope_to_proto(scope);
            Kind::ResumeRequested(v1::ResumeRequested { task_id, group_id })
        }
        EventBody::CancelRequested { reason } => Kind::CancelRequested(v1::CancelRequested {
            reason: reason.clone(),
        }),
        EventBody::QuestionAnswered { question, answer } => {
            Kind::QuestionAnswered(v1::QuestionAnswered {
                question_id: question.to_string(),
                answer: answer.clone(),
            })
        }
        EventBody::TaskDispatched { instance, attempt } => {
            Kind::TaskDispatched(v1::TaskDispatched {
                task_instance_id: id(instance),
                attempt: *attempt,
            })
        }
        EventBody::TaskTimedOut { instance, attempt } => Kind::TaskTimedOut(v1::TaskTimedOut {
            task_instance_id: id(instance),
            attempt: *attempt,
        }),
        EventBody::QuestionExpired { question } => Kind::QuestionExpired(v1::QuestionExpired {
            question_id: question.to_string(),
        }),
        EventBody::BudgetExhausted { reason } => Kind::BudgetExhausted(v1::BudgetExhausted {
            reason: reason.clone(),
        }),
        EventBody::ExecutionTimedOut => Kind::ExecutionTimedOut(v1::ExecutionTimedOut {}),
        EventBody::ExecutionFinished { outcome } => {
            let outcome = match outcome {
                Outcome::Completed => v1::ExecutionOutcome::Completed,
                Outcome::Failed => v1::ExecutionOutcome::Failed,
                Outcome::Cancelled => v1::ExecutionOutcome::Cancelled,
            };
            Kind::ExecutionFinished(v1::ExecutionFinished {
                outcome: outcome.into(),
            })
        }
        EventBody::RunStarted { run } => Kind::RunStarted(v1::RunStarted { run_number: *run }),
        EventBody::ExecutionClaimed { coordinator } => {
            Kind::ExecutionClaimed(v1::ExecutionClaimed {
                coordinator: coordinator.clone(),
            })
        }
    }
}

/// Reads one log entry. The envelope's `execution_id` must be a UUID; its `sequence` is left to
/// the caller, who knows which one it expects.
pub fn event_from_proto(event: &v1::Event) -> Result<LogEntry, ConvertError> {
    decode_event(&At::root("event"), event)
}

/// Reads one log entry at path `at` (an event alone, or one of a batch).
fn decode_event(at: &At<'_>, event: &v1::Event) -> Result<LogEntry, ConvertError> {
    parse_id::<ExecutionId>(&at.field("execution_id"), &event.execution_id)?;
    let at_ms = parse_instant(&at.field("timestamp_unix_ms"), event.timestamp_unix_ms)?;
    let kind = required(&at.field("kind"), &event.kind)?;
    let body = match kind {
        v1::event::Kind::ExecutionStarted(started) => {
            let at = at.field("execution_started");
            let options = started.options.clone().unwrap_or_default();
            return Ok(LogEntry::Started(Started {
                plan_name: started.plan_name.clone(),
                run_number: started.run_number,
                spec: started.spec.clone(),
                format: parse_enum(&at.field("format"), started.format)?,
                started_at_ms: parse_instant(
                    &at.field("started_at_unix_ms"),
                    started.started_at_unix_ms,
                )?,
                idempotency_key: options.idempotency_key,
                labels: options.labels.into_iter().collect(),
                namespace: options.namespace,
                max_concurrency_cap: match started.max_concurrency_cap {
                    Some(0) => {
                        return Err(at.field("max_concurrency_cap").error(
                            ConvertErrorKind::Inconsistent("a concurrency cap of 0 runs nothing"),
                        ));
                    }
                    cap => cap,
                },
                traceparent: started.traceparent.clone(),
                compiled_plan: started.compiled_plan.clone(),
            }));
        }
        v1::event::Kind::TaskStarted(started) => {
            let at = at.field("task_started");
            EventBody::TaskStarted {
                instance: parse_id(&at.field("task_instance_id"), &started.task_instance_id)?,
                attempt: started.attempt,
                worker: WorkerId(non_empty(&at.field("worker_id"), &started.worker_id)?.to_owned()),
            }
        }
        v1::event::Kind::TaskValidated(validated) => {
            let at = at.field("task_validated");
            EventBody::TaskValidated {
                instance: parse_id(&at.field("task_instance_id"), &validated.task_instance_id)?,
                attempt: validated.attempt,
                results: check_results_from_proto(&at.field("results"), &validated.results)?,
            }
        }
        v1::event::Kind::TaskCompleted(completed) => {
            let at = at.field("task_completed");
            EventBody::TaskCompleted {
                instance: parse_id(&at.field("task_instance_id"), &completed.task_instance_id)?,
                attempt: completed.attempt,
                output: parse_json(&at.field("output"), &completed.output)?,
                usage: usage_from_proto(&at, completed.usage.as_ref())?,
            }
        }
        v1::event::Kind::TaskFailed(failed) => {
            let at = at.field("task_failed");
            EventBody::TaskFailed {
                instance: parse_id(&at.field("task_instance_id"), &failed.task_instance_id)?,
                attempt: failed.attempt,
                error: failed.error.clone(),
                retryable: failed.retryable,
                usage: usage_from_proto(&at, failed.usage.as_ref())?,
            }
        }
        v1::event::Kind::SubtasksSpawned(spawned) => {
            let at = at.field("subtasks_spawned");
            let group_at = at.field("group");
            let (group, rule, members) =
                subtask_group_from_proto(&group_at, required(&group_at, &spawned.group)?)?;
            EventBody::SubtasksSpawned {
                instance: parse_id(&at.field("task_instance_id"), &spawned.task_instance_id)?,
                attempt: spawned.attempt,
                group,
                rule,
                members,
            }
        }
        v1::event::Kind::QuestionAsked(asked) => {
            let at = at.field("question_asked");
            let question_at = at.field("question");
            EventBody::QuestionAsked {
                instance: parse_id(&at.field("task_instance_id"), &asked.task_instance_id)?,
                attempt: asked.attempt,
                question: question_from_proto(
                    &question_at,
                    required(&question_at, &asked.question)?,
                )?,
            }
        }
        v1::event::Kind::StepCheckpointed(step) => {
            let at = at.field("step_checkpointed");
            EventBody::StepCheckpointed {
                instance: parse_id(&at.field("task_instance_id"), &step.task_instance_id)?,
                attempt: step.attempt,
                step: step.step.clone(),
                state: parse_json(&at.field("state"), &step.state)?,
            }
        }
        v1::event::Kind::TaskLost(lost) => EventBody::TaskLost {
            instance: parse_id(
                &at.field("task_lost").field("task_instance_id"),
                &lost.task_instance_id,
            )?,
            attempt: lost.attempt,
        },
        v1::event::Kind::TaskPreempted(preempted) => EventBody::TaskPreempted {
            instance: parse_id(
                &at.field("task_preempted").field("task_instance_id"),
                &preempted.task_instance_id,
            )?,
            attempt: preempted.attempt,
        },
        v1::event::Kind::PauseRequested(pause) => EventBody::PauseRequested {
            reason: pause.reason.clone(),
            scope: scope_from_proto(
                &at.field("pause_requested"),
                &pause.task_id,
                &pause.group_id,
            )?,
            mode: pause_mode_from_proto(pause.mode),
        },
        v1::event::Kind::ResumeRequested(resume) => EventBody::ResumeRequested {
            scope: scope_from_proto(
                &at.field("resume_requested"),
                &resume.task_id,
                &resume.group_id,
            )?,
        },
        v1::event::Kind::CancelRequested(cancel) => EventBody::CancelRequested {
            reason: cancel.reason.clone(),
        },
        v1::event::Kind::QuestionAnswered(answered) => EventBody::QuestionAnswered {
            question: parse_id(
                &at.field("question_answered").field("question_id"),
                &answered.question_id,
            )?,
            answer: answered.answer.clone(),
        },
        v1::event::Kind::TaskDispatched(dispatched) => EventBody::TaskDispatched {
            instance: parse_id(
                &at.field("task_dispatched").field("task_instance_id"),
                &dispatched.task_instance_id,
            )?,
            attempt: dispatched.attempt,
        },
        v1::event::Kind::TaskTimedOut(timed_out) => EventBody::TaskTimedOut {
            instance: parse_id(
                &at.field("task_timed_out").field("task_instance_id"),
                &timed_out.task_instance_id,
            )?,
            attempt: timed_out.attempt,
        },
        v1::event::Kind::QuestionExpired(expired) => EventBody::QuestionExpired {
            question: parse_id(
                &at.field("question_expired").field("question_id"),
                &expired.question_id,
            )?,
        },
        v1::event::Kind::BudgetExhausted(exhausted) => EventBody::BudgetExhausted {
            reason: exhausted.reason.clone(),
        },
        v1::event::Kind::ExecutionTimedOut(v1::ExecutionTimedOut {}) => {
            EventBody::ExecutionTimedOut
        }
        v1::event::Kind::ExecutionFinished(finished) => {
            let finished_at = at.field("execution_finished");
            let outcome_at = finished_at.field("outcome");
            let outcome = match parse_enum(&outcome_at, finished.outcome)? {
                v1::ExecutionOutcome::Unspecified => {
                    return Err(outcome_at.error(ConvertErrorKind::Unspecified));
                }
                v1::ExecutionOutcome::Completed => Outcome::Completed,
                v1::ExecutionOutcome::Failed => Outcome::Failed,
                v1::ExecutionOutcome::Cancelled => Outcome::Cancelled,
            };
            EventBody::ExecutionFinished { outcome }
        }
        v1::event::Kind::RunStarted(started) => {
            if started.run_number < 2 {
                return Err(at.field("run_started").field("run_number").error(
                    ConvertErrorKind::Inconsistent("runs after the first are numbered from 2"),
                ));
            }
            EventBody::RunStarted {
                run: started.run_number,
            }
        }
        v1::event::Kind::ExecutionClaimed(claimed) => EventBody::ExecutionClaimed {
            coordinator: claimed.coordinator.clone(),
        },
    };
    Ok(LogEntry::Event(Event { at_ms, body }))
}

/// The entries of one `EventBatch` message.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedBatch {
    pub execution_id: ExecutionId,
    /// The sequence of `entries[0]`; the others follow without gaps.
    pub first_sequence: u64,
    pub entries: Vec<LogEntry>,
}

/// Decodes an `EventBatch` as published on `trellis.events.<execution_id>`: at least one event,
/// all of one execution, with consecutive sequences.
pub fn decode_event_batch(bytes: &[u8]) -> Result<DecodedBatch, ConvertError> {
    let at = At::root("event_batch");
    let batch = v1::EventBatch::decode(bytes)
        .map_err(|err| at.error(ConvertErrorKind::Decode(err.to_string())))?;
    let events_at = at.field("events");
    let first = batch.events.first().ok_or_else(|| events_at.missing())?;
    let first_at = events_at.index(0);
    let execution_id = parse_id(&first_at.field("execution_id"), &first.execution_id)?;
    if first.sequence == 0 {
        return Err(first_at
            .field("sequence")
            .error(ConvertErrorKind::Inconsistent("sequences start at 1")));
    }
    let mut entries = Vec::with_capacity(batch.events.len());
    for (event_idx, event) in batch.events.iter().enumerate() {
        let event_at = events_at.index(event_idx);
        // Checked: a batch that starts near `u64::MAX` would otherwise wrap (or panic in a
        // debug build) instead of being refused.
        let expected_sequence = u64::try_from(event_idx)
            .ok()
            .and_then(|offset| first.sequence.checked_add(offset));
        if event.execution_id != first.execution_id {
            return Err(event_at
                .field("execution_id")
                .error(ConvertErrorKind::Inconsistent(
                    "every event of a batch belongs to the execution of the first",
                )));
        }
        if Some(event.sequence) != expected_sequence {
            return Err(event_at
                .field("sequence")
                .error(ConvertErrorKind::Inconsistent(
                    "the sequences of a batch follow each other without gaps",
                )));
        }
        entries.push(decode_event(&event_at, event)?);
    }
    Ok(DecodedBatch {
        execution_id,
        first_sequence: first.sequence,
        entries,
    })
}

/// Returns the `(task_id, group_id)` of a pause's scope (both empty: the execution).
pub fn scope_to_proto(scope: &PauseScope) -> (String, String) {
    match scope {
        PauseScope::Execution => (String::new(), String::new()),
        PauseScope::Task(task) => (task.clone(), String::new()),
        PauseScope::Group(group) => (String::new(), group.to_string()),
    }
}

/// Reads a pause's scope from its `task_id` and `group_id` (at most one set).
pub(crate) fn scope_from_proto(
    at: &At<'_>,
    task_id: &str,
    group_id: &str,
) -> Result<PauseScope, ConvertError> {
    match (task_id, group_id) {
        ("", "") => Ok(PauseScope::Execution),
        (task, "") => Ok(PauseScope::Task(task.to_owned())),
        ("", group) => Ok(PauseScope::Group(parse_id(&at.field("group_id"), group)?)),
        _ => Err(at.error(ConvertErrorKind::Inconsistent(
            "names both a task and a group; a pause covers one of them",
        ))),
    }
}

/// Reads the scope of a pause or resume request: `task_id` and `group_id`, at most one set.
pub fn pause_scope(task_id: &str, group_id: &str) -> Result<PauseScope, ConvertError> {
    scope_from_proto(&At::root("request"), task_id, group_id)
}

/// Returns the wire form of a pause mode.
pub fn pause_mode_to_proto(mode: PauseMode) -> v1::PauseMode {
    match mode {
        PauseMode::Drain => v1::PauseMode::Drain,
        PauseMode::Preempt => v1::PauseMode::Preempt,
    }
}

/// Reads a pause mode; unset or unknown values drain, the mode that stops nothing running.
pub fn pause_mode_from_proto(mode: i32) -> PauseMode {
    match v1::PauseMode::try_from(mode) {
        Ok(v1::PauseMode::Preempt) => PauseMode::Preempt,
        _ => PauseMode::Drain,
    }
}
