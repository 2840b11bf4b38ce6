//! The built-in handlers of DESIGN.md §11: `noop`, `sleep` and `fail` for tests and benchmarks,
//! `fanout` to exercise subtask groups, `steps` to exercise durable steps, `shell` and `http` for
//! real work, and `question` for the human in the loop.
//!
//! Each reads its input as JSON; an input of the wrong shape fails the attempt, not retryable.

mod http;
mod shell;

use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::sdk::{GroupRule, HandlerRegistry, Outcome, Question, Subtask, TaskContext};

pub(crate) fn register(registry: &mut HandlerRegistry) {
    registry
        .register("noop", noop)
        .register("sleep", sleep)
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

/// Completes with its input, untouched (no parse, no sleep).
async fn noop(ctx: TaskContext) -> Outcome {
    let input = ctx.raw_input();
    if input.is_empty() {
        Outcome::CompletedJson(bytes::Bytes::from_static(b"null"))
    } else {
        Outcome::CompletedJson(input.clone())
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
    let FailInput { times, retryable } = match input(&ctx) {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    let attempt = ctx.attempt();
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

/// First run: spawns `count` subtasks of the child type. Resumed after the group: completes with
/// `{members, completed, failed, cancelled}`.
async fn fanout(ctx: TaskContext) -> Outcome {
    if let Some(summary) = ctx.group_summary() {
        return Outcome::Completed(json!({
            "members": summary.member_count,
            "completed": summary.completed,
            "failed": summary.failed,
            "cancelled": summary.cancelled,
        }));
    }
    let FanoutInput { count, child, rule } = match input(&ctx) {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    if count == 0 {
        return Outcome::failed("fanout count must be at least 1", false);
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
    if let Some(answer) = ctx.answer() {
        return Outcome::Completed(json!({ "answer": answer.answer }));
    }
    match input::<QuestionInput>(&ctx) {
        Ok(QuestionInput { text, options }) => Outcome::Ask(Question::new(text, options)),
        Err(outcome) => outcome,
    }
}
