//! The built-in handlers of docs/design.md §11: `noop`, `sleep` and `fail` for tests and benchmarks,
//! `fanout` to exercise subtask groups, `steps` to exercise durable steps, `shell` and `http` for
//! real work, and `question` for the human in the loop.
//!
//! Each reads its input as JSON; an input of the wrong shape fails the attempt, not retryable.

mod http;
mod shell;

pub(crate) use http::client as http_client;
pub(crate) use shell::{Group, tie_to_worker};

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::sdk::{
    GroupRule, GroupSummary, HandlerRegistry, HumanAnswer, Outcome, Question,
    QuestionTimeoutAction, Subtask, TaskContext,
};

pub(crate) fn register(registry: &mut HandlerRegistry) {
    registry
        .register("noop", noop)
        .register("sleep", sleep)
        .register("log", log)
        .register("fail", fail)
        .register("fanout", fanout)
        .register("steps", steps)
        .register("shell", shell::run)
        .register("http", http::run)
        .register("question", question);
}

/// Parses the input as `T`, or returns the failed outcome that says why not.
#[expect(
    clippy::result_large_err,
    reason = "the outcome is the handler's answer, returned once per task, not a hot path"
)]
pub(crate) fn input<T: DeserializeOwned>(ctx: &TaskContext) -> Result<T, Outcome> {
    ctx.input_as::<T>().map_err(|error| {
        Outcome::failed(format!("invalid {} input: {error}", ctx.task_type()), false)
    })
}

/// What the handlers that do no I/O decide from: the parts of an attempt's [`TaskContext`] they
/// read. Keeping their decisions pure lets tests and fuzzing check every outcome they can give.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Given<'a> {
    pub(crate) task_type: &'a str,
    pub(crate) input: &'a [u8],
    pub(crate) attempt: u32,
    pub(crate) summary: Option<&'a GroupSummary>,
    pub(crate) answer: Option<&'a HumanAnswer>,
}

impl<'a> Given<'a> {
    fn of(ctx: &'a TaskContext) -> Given<'a> {
        Given {
            task_type: ctx.task_type(),
            input: ctx.raw_input(),
            attempt: ctx.attempt(),
            summary: ctx.group_summary(),
            answer: ctx.answer(),
        }
    }

    /// Parses the input as `T` (an empty input is `null`), or returns the failed outcome that
    /// says why not.
    #[expect(
        clippy::result_large_err,
        reason = "the outcome is the handler's answer, returned once per task, not a hot path"
    )]
    fn input<T: DeserializeOwned>(&self) -> Result<T, Outcome> {
        let parsed = if self.input.is_empty() {
            serde_json::from_value(Value::Null)
        } else {
            serde_json::from_slice(self.input)
        };
        parsed.map_err(|error| {
            Outcome::failed(format!("invalid {} input: {error}", self.task_type), false)
        })
    }
}

#[cfg(any(test, feature = "fuzzing"))]
/// Returns the outcome of a built-in handler that does no I/O (`noop`, `fail`, `fanout`,
/// `question`) for `given`, or `None` for any other task type.
pub(crate) fn pure_outcome(given: Given<'_>) -> Option<Outcome> {
    Some(match given.task_type {
        "noop" => noop_outcome(given),
        "fail" => fail_outcome(given),
        "fanout" => fanout_outcome(given),
        "question" => question_outcome(given),
        _ => return None,
    })
}

/// Completes with its input, untouched (no parse, no sleep).
async fn noop(ctx: TaskContext) -> Outcome {
    let input = ctx.raw_input();
    if input.is_empty() {
        Outcome::CompletedJson(bytes::Bytes::from_static(b"null"))
    } else {
        Outcome::CompletedJson(input.clone())
    }
}

/// `noop` as [`pure_outcome`] gives it; the handler itself passes its `Bytes` on without a copy.
#[cfg(any(test, feature = "fuzzing"))]
fn noop_outcome(given: Given<'_>) -> Outcome {
    if given.input.is_empty() {
        Outcome::CompletedJson(bytes::Bytes::from_static(b"null"))
    } else {
        Outcome::CompletedJson(bytes::Bytes::copy_from_slice(given.input))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SleepInput {
    ms: u64,
}

/// Sleeps `ms` milliseconds, then completes with `{slept_ms}`.
async fn sleep(ctx: TaskContext) -> Outcome {
    let SleepInput { ms } = match input(&ctx) {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    ctx.progress(0, "sleeping");
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Outcome::Completed(json!({ "slept_ms": ms }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogInput {
    lines: u32,
    #[serde(default = "default_log_text")]
    text: String,
}

fn default_log_text() -> String {
    "line".to_owned()
}

/// Writes `lines` lines (`<text> <n>`, from 1) to the task's log, then completes with `{lines}`.
async fn log(ctx: TaskContext) -> Outcome {
    let LogInput { lines, text } = match input(&ctx) {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    for n in 1..=lines {
        ctx.log(format!("{text} {n}"));
    }
    Outcome::Completed(json!({ "lines": lines }))
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailInput {
    #[serde(default)]
    times: u32,
    #[serde(default = "default_true")]
    retryable: bool,
}

/// Fails attempts `1..=times` (judged by the assignment's attempt), then completes with `{attempt}`.
async fn fail(ctx: TaskContext) -> Outcome {
    fail_outcome(Given::of(&ctx))
}

fn fail_outcome(given: Given<'_>) -> Outcome {
    let FailInput { times, retryable } = match given.input() {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    let attempt = given.attempt;
    if attempt <= times {
        return Outcome::failed(
            format!("attempt {attempt} of the first {times} fails on purpose"),
            retryable,
        );
    }
    Outcome::Completed(json!({ "attempt": attempt }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChildSpec {
    #[serde(rename = "type")]
    task_type: String,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    queue: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FanoutInput {
    count: u32,
    child: ChildSpec,
    #[serde(default)]
    rule: GroupRule,
}

/// Most subtasks one `fanout` may spawn: every member is built in memory and sent in one result.
pub(crate) const MAX_FANOUT: u32 = 100_000;

/// First run: spawns `count` subtasks of the child type. Resumed after the group: completes with
/// `{members, completed, failed, cancelled}`.
async fn fanout(ctx: TaskContext) -> Outcome {
    fanout_outcome(Given::of(&ctx))
}

/// The checks are the coordinator's: a group it would refuse fails the attempt here, with the
/// reason, instead of leaving the task running with a result nobody accepts. Resumed after its
/// group, it completes with the group's counts when the group met its rule, and fails (not
/// retryable: the same group would fail it again) when it did not, so an `all_succeeded` or
/// quorum group that failed fails its parent and holds back the parent's dependents.
fn fanout_outcome(given: Given<'_>) -> Outcome {
    if let Some(summary) = given.summary {
        if !summary.succeeded {
            return Outcome::failed(
                format!(
                    "the subtask group did not meet its rule: {} of {} members completed, {} failed, {} cancelled",
                    summary.completed, summary.member_count, summary.failed, summary.cancelled
                ),
                false,
            );
        }
        return Outcome::Completed(json!({
            "succeeded": summary.succeeded,
            "members": summary.member_count,
            "completed": summary.completed,
            "failed": summary.failed,
            "cancelled": summary.cancelled,
        }));
    }
    let FanoutInput { count, child, rule } = match given.input() {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    if count == 0 {
        return Outcome::failed("fanout count must be at least 1", false);
    }
    if count > MAX_FANOUT {
        return Outcome::failed(
            format!("fanout count {count} is over the limit of {MAX_FANOUT}"),
            false,
        );
    }
    if child.task_type.is_empty() {
        return Outcome::failed("fanout child.type must not be empty", false);
    }
    if let GroupRule::Quorum(k) = rule
        && (k == 0 || k > count)
    {
        return Outcome::failed(
            format!("fanout quorum {k} must be between 1 and the count, {count}"),
            false,
        );
    }
    let members = (0..count)
        .map(|_| Subtask {
            task_type: child.task_type.clone(),
            input: child.input.clone(),
            queue: child.queue.clone(),
        })
        .collect();
    Outcome::Spawn { rule, members }
}

/// Most steps one `steps` task may run: every checkpoint carries the merged state, which grows
/// with each step.
const MAX_STEPS: u32 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepsInput {
    count: u32,
    #[serde(default)]
    ms: u64,
}

/// Runs `count` durable steps named `step-1`, `step-2`, ..., each taking `ms` milliseconds and
/// merging `{"done": {"<i>": true}, "trace": ["step-<i>"], "last": "step-<i>"}` into the state,
/// then completes with the merged state. Run again after a crash, it skips the steps recorded
/// before it, so the state shows every step exactly once.
async fn steps(ctx: TaskContext) -> Outcome {
    let StepsInput { count, ms } = match input(&ctx) {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    if count > MAX_STEPS {
        return Outcome::failed(format!("steps count must be at most {MAX_STEPS}"), false);
    }
    for step_idx in 1..=count {
        let name = format!("step-{step_idx}");
        let step = ctx.step(&name, |_state| async {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, std::convert::Infallible>(json!({
                "done": { step_idx.to_string(): true },
                "trace": [name.as_str()],
                "last": name.as_str(),
            }))
        });
        if let Err(error) = step.await {
            return error.into();
        }
        ctx.progress(step_idx * 100 / count, name);
    }
    Outcome::Completed(ctx.step_state())
}

/// The question types seed 001 names.
const QUESTION_TYPES: [&str; 4] = ["validation", "approval", "duplicate_merge", "decision"];

/// The priorities seed 001 names, most urgent first.
const QUESTION_PRIORITIES: [&str; 4] = ["critical", "high", "medium", "low"];

/// What an expired question does, as the input names it.
const TIMEOUT_ACTIONS: [&str; 3] = ["fail", "skip", "answer"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuestionInput {
    text: String,
    #[serde(default)]
    options: Vec<String>,
    #[serde(default, rename = "type")]
    question_type: Option<String>,
    #[serde(default)]
    priority: Option<String>,
    /// How long it waits for an answer, from when it is asked (`30s`, `15m`, `2h`).
    #[serde(default)]
    expires_in: Option<String>,
    #[serde(default)]
    timeout_action: Option<String>,
    #[serde(default)]
    default_answer: Option<String>,
}

/// First run: asks `text` with `options` (and seed 001's type, priority, expiry and timeout
/// action). Resumed with an answer: completes with `{answer}`.
async fn question(ctx: TaskContext) -> Outcome {
    question_outcome(Given::of(&ctx))
}

fn question_outcome(given: Given<'_>) -> Outcome {
    if let Some(answer) = given.answer {
        return Outcome::Completed(json!({ "answer": answer.answer }));
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        });
    match given.input::<QuestionInput>() {
        Ok(input) => match ask(input, now_ms) {
            Ok(question) => Outcome::Ask(question),
            Err(error) => Outcome::failed(format!("invalid question input: {error}"), false),
        },
        Err(outcome) => outcome,
    }
}

/// The question `input` asks at `now_ms`, or what is wrong with it.
fn ask(input: QuestionInput, now_ms: i64) -> Result<Question, String> {
    let one_of = |field: &str, value: Option<String>, choices: &[&str], default: &str| {
        let value = value.unwrap_or_else(|| default.to_owned());
        if choices.contains(&value.as_str()) {
            Ok(value)
        } else {
            Err(format!(
                "{field}: unknown {field} {value:?} (choose from {})",
                choices.join(", ")
            ))
        }
    };
    let question_type = one_of("type", input.question_type, &QUESTION_TYPES, "decision")?;
    let priority = one_of("priority", input.priority, &QUESTION_PRIORITIES, "medium")?;
    let expires_at_unix_ms = match &input.expires_in {
        None => None,
        Some(text) => {
            let wait = humantime::parse_duration(text).map_err(|err| {
                format!("expires_in: {text:?} is not a duration ({err}); write 30s, 15m or 2h")
            })?;
            if wait.is_zero() {
                return Err("expires_in: must be longer than 0s".to_owned());
            }
            Some(now_ms.saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)))
        }
    };
    let action = match &input.timeout_action {
        None => None,
        Some(action) => Some(one_of(
            "timeout_action",
            Some(action.clone()),
            &TIMEOUT_ACTIONS,
            "",
        )?),
    };
    if action.is_some() && expires_at_unix_ms.is_none() {
        return Err(
            "timeout_action: needs expires_in (a question that never expires never times out)"
                .to_owned(),
        );
    }
    let (timeout_action, default_answer) = match (action.as_deref(), input.default_answer) {
        (Some("answer"), Some(answer)) => {
            if !input.options.is_empty() && !input.options.contains(&answer) {
                return Err(format!(
                    "default_answer: {answer:?} is not one of the options ({})",
                    input.options.join(", ")
                ));
            }
            (QuestionTimeoutAction::AnswerDefault, answer)
        }
        (Some("answer"), None) => {
            return Err("default_answer: missing (timeout_action answer gives it)".to_owned());
        }
        (_, Some(_)) => {
            return Err("default_answer: only with timeout_action answer".to_owned());
        }
        (Some("skip"), None) => (QuestionTimeoutAction::Skip, String::new()),
        (Some(_), None) => (QuestionTimeoutAction::Fail, String::new()),
        (None, None) => (QuestionTimeoutAction::Unspecified, String::new()),
    };
    Ok(Question {
        question_type,
        priority,
        expires_at_unix_ms,
        timeout_action,
        default_answer,
        ..Question::new(input.text, input.options)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given<'a>(task_type: &'a str, input: &'a str) -> Given<'a> {
        Given {
            task_type,
            input: input.as_bytes(),
            attempt: 1,
            summary: None,
            answer: None,
        }
    }

    fn failure(outcome: Option<Outcome>) -> String {
        match outcome {
            Some(Outcome::Failed { error, retryable }) => {
                assert!(!retryable, "a bad input cannot get better on retry");
                error
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    fn asked(input: &str) -> Result<Question, String> {
        let input: QuestionInput = serde_json::from_str(input).map_err(|err| err.to_string())?;
        ask(input, 1_000)
    }

    #[test]
    fn a_question_takes_the_seed_fields() {
        let question = asked(
            r#"{"text": "Merge T-3 into T-1?", "options": ["merge", "keep"], "type": "duplicate_merge",
                "priority": "high", "expires_in": "2s", "timeout_action": "answer",
                "default_answer": "keep"}"#,
        )
        .expect("a valid question");
        assert_eq!(question.question_type, "duplicate_merge");
        assert_eq!(question.priority, "high");
        assert_eq!(question.expires_at_unix_ms, Some(3_000));
        assert_eq!(
            question.timeout_action,
            QuestionTimeoutAction::AnswerDefault
        );
        assert_eq!(question.default_answer, "keep");
        let plain = asked(r#"{"text": "Why?"}"#).expect("a plain question");
        assert_eq!(
            (plain.question_type.as_str(), plain.priority.as_str()),
            ("decision", "medium")
        );
        assert_eq!(plain.expires_at_unix_ms, None);
    }

    #[test]
    fn a_question_with_bad_seed_fields_is_refused_precisely() {
        let cases = [
            (
                r#"{"text": "?", "type": "vote"}"#,
                "type: unknown type \"vote\" (choose from validation, approval, duplicate_merge, decision)",
            ),
            (
                r#"{"text": "?", "priority": "urgent"}"#,
                "priority: unknown priority \"urgent\"",
            ),
            (
                r#"{"text": "?", "expires_in": "soon"}"#,
                "expires_in: \"soon\" is not a duration",
            ),
            (
                r#"{"text": "?", "timeout_action": "skip"}"#,
                "timeout_action: needs expires_in",
            ),
            (
                r#"{"text": "?", "expires_in": "1m", "timeout_action": "pause"}"#,
                "timeout_action: unknown timeout_action \"pause\"",
            ),
            (
                r#"{"text": "?", "expires_in": "1m", "timeout_action": "answer"}"#,
                "default_answer: missing",
            ),
            (
                r#"{"text": "?", "options": ["a"], "expires_in": "1m", "timeout_action": "answer", "default_answer": "b"}"#,
                "default_answer: \"b\" is not one of the options (a)",
            ),
            (
                r#"{"text": "?", "expires_in": "1m", "default_answer": "b"}"#,
                "default_answer: only with timeout_action answer",
            ),
        ];
        for (input, expected) in cases {
            let error = asked(input).expect_err(input);
            assert!(error.starts_with(expected), "{input}: {error}");
        }
    }

    #[test]
    fn fanout_refuses_groups_the_coordinator_would_refuse() {
        let child = r#""child": {"type": "noop"}"#;
        let cases = [
            (format!(r#"{{"count": 0, {child}}}"#), "at least 1"),
            (
                format!(r#"{{"count": 4000000000, {child}}}"#),
                "over the limit of 100000",
            ),
            (
                r#"{"count": 2, "child": {"type": ""}}"#.to_owned(),
                "child.type must not be empty",
            ),
            (
                format!(r#"{{"count": 2, {child}, "rule": {{"quorum": 3}}}}"#),
                "quorum 3 must be between 1 and the count, 2",
            ),
            (
                format!(r#"{{"count": 2, {child}, "rule": {{"quorum": 0}}}}"#),
                "quorum 0 must be between 1 and the count, 2",
            ),
        ];
        for (input, expected) in cases {
            let error = failure(pure_outcome(given("fanout", &input)));
            assert!(error.contains(expected), "{input}: {error}");
        }
        let spawned = pure_outcome(given(
            "fanout",
            r#"{"count": 2, "child": {"type": "noop"}, "rule": {"quorum": 2}}"#,
        ));
        assert!(
            matches!(&spawned, Some(Outcome::Spawn { rule: GroupRule::Quorum(2), members }) if members.len() == 2),
            "{spawned:?}"
        );
    }

    #[test]
    fn a_resumed_fanout_completes_only_when_its_group_met_its_rule() {
        let summary = |succeeded: bool| GroupSummary {
            succeeded,
            member_count: 3,
            completed: if succeeded { 3 } else { 1 },
            failed: if succeeded { 0 } else { 2 },
            ..GroupSummary::default()
        };
        let met = summary(true);
        let resumed = Given {
            summary: Some(&met),
            ..given("fanout", "")
        };
        assert_eq!(
            pure_outcome(resumed),
            Some(Outcome::Completed(json!({
                "succeeded": true, "members": 3, "completed": 3, "failed": 0, "cancelled": 0,
            })))
        );
        let missed = summary(false);
        let resumed = Given {
            summary: Some(&missed),
            ..given("fanout", "")
        };
        assert_eq!(
            failure(pure_outcome(resumed)),
            "the subtask group did not meet its rule: 1 of 3 members completed, 2 failed, 0 cancelled"
        );
    }

    #[test]
    fn pure_handlers_answer_and_others_are_not_pure() {
        assert_eq!(
            pure_outcome(given("noop", "")),
            Some(Outcome::CompletedJson(bytes::Bytes::from_static(b"null")))
        );
        let error = failure(pure_outcome(given(
            "fail",
            r#"{"times": 1, "retryable": false}"#,
        )));
        assert_eq!(error, "attempt 1 of the first 1 fails on purpose");
        assert!(
            failure(pure_outcome(given("question", "[]"))).starts_with("invalid question input")
        );
        assert_eq!(pure_outcome(given("sleep", r#"{"ms": 1}"#)), None);
    }
}
