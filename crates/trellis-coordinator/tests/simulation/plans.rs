//! Random plans with every feature the turn must get right: dependencies, file conflicts, retries
//! with backoff, fallbacks, timeouts, questions, and subtask groups nested in subtask groups with
//! each completion rule. Every plan is built to complete, so an execution that does not is a bug.
//!
//! What a task does when a simulated worker runs it is written in its input, under `"sim"`:
//! `fail` (attempts that fail first, retryably), `slow` (the first attempt overruns the task's
//! timeout), `ask` (asks a question, then completes once answered), `spawn` (a group of subtasks,
//! each with a behaviour of its own).

use serde_json::{Value, json};

use crate::rng::Rng;

/// The queue (and handler type) of every simulated task.
pub const QUEUE: &str = "sim";

/// Returns a random plan as JSON spec text.
pub fn plan(rng: &mut Rng, name: &str) -> String {
    let n_tasks = rng.between(2, 8) as usize;
    let mut tasks = Vec::new();
    let mut fallbacks = Vec::new();
    for idx in 0..n_tasks {
        let id = format!("t{idx}");
        let mut task = json!({ "id": id, "type": QUEUE });
        let mut depends_on = Vec::new();
        for earlier in 0..idx {
            if rng.percent(30) {
                depends_on.push(format!("t{earlier}"));
            }
        }
        if !depends_on.is_empty() {
            task["depends_on"] = json!(depends_on);
        }
        if rng.percent(30) {
            // Tasks creating the same file conflict: never run together.
            task["files"] = json!([{ "path": format!("f{}", rng.below(2)), "op": "CREATE" }]);
        }
        let mut behaviour = behaviour(rng, 0);
        if rng.percent(15) {
            // Always fails: its fallback runs in its place.
            let fallback = format!("t{idx}-fallback");
            behaviour = json!({ "fail": 100 });
            task["fallback"] = json!(fallback);
            task["on_failure"] = json!([{ "fallback": fallback }]);
            // The fallback ends the task's escalation chain: it must not fail.
            let mut fallback_behaviour = self::behaviour(rng, 1);
            if let Some(fields) = fallback_behaviour.as_object_mut() {
                fields.remove("fail");
            }
            fallbacks.push(json!({
                "id": fallback,
                "type": QUEUE,
                "input": { "sim": fallback_behaviour },
            }));
        } else if rng.percent(15) {
            behaviour["slow"] = json!(true);
            task["timeout"] = json!("40ms");
            // Attempts also time out while waiting for a worker when workers die: plenty of
            // retries, so the plan still completes.
            task["on_failure"] = json!([{ "retry": { "max": 100, "backoff": { "kind": "constant", "base": "10ms" } } }]);
        }
        task["input"] = json!({ "sim": behaviour });
        tasks.push(task);
    }
    tasks.extend(fallbacks);
    let max_concurrency = rng.between(1, 6);
    json!({
        "name": name,
        "options": {
            "max_concurrency": max_concurrency,
            "pause_on_human_review": rng.percent(50),
            "failure": {
                "default_action": "retry",
                "max_retries": 4,
                "backoff": { "kind": "constant", "base": "10ms" },
            },
        },
        "tasks": tasks,
    })
    .to_string()
}

/// Returns what a task (or a subtask at `depth`) does.
fn behaviour(rng: &mut Rng, depth: u32) -> Value {
    let mut behaviour = json!({});
    if depth > 0 && rng.percent(15) {
        // A subtask that never succeeds: its group's rule decides what that means.
        behaviour["fail"] = json!(100);
    } else if rng.percent(20) {
        behaviour["fail"] = json!(rng.between(1, 2));
    }
    if rng.percent(15) {
        behaviour["ask"] = json!(true);
    } else if depth < 2 && rng.percent(30) {
        let n_members = rng.between(1, 4);
        let members: Vec<Value> = (0..n_members)
            .map(|_| self::behaviour(rng, depth + 1))
            .collect();
        let rule = match rng.below(4) {
            0 => json!("all_settled"),
            1 => json!("all_succeeded"),
            2 => json!({ "quorum": rng.between(1, n_members) }),
            _ => json!("first_success"),
        };
        behaviour["spawn"] = json!({ "rule": rule, "members": members });
    }
    behaviour
}
