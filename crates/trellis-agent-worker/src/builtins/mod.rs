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
    GroupRule, GroupSummary, HandlerRegistry, HumanAnswer, Outcome, Question, Subtask, TaskContext,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuestionInput {
    text: String,
    #[serde(default)]
    options: Vec<String>,
}

/// First run: asks `text` with `options`. Resumed with an answer: completes with `{answer}`.
async fn question(ctx: TaskContext) -> Outcome {
    question_outcome(Given::of(&ctx))
}

fn question_outcome(given: Given<'_>) -> Outcome {
    if let Some(answer) = given.answer {
        return Outcome::Completed(json!({ "answer": answer.answer }));
    }
    match given.input::<QuestionInput>() {
        Ok(QuestionInput { text, options }) => Outcome::Ask(Question::new(text, options)),
        Err(outcome) => outcome,
    }
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
