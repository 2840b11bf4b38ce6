//! What [`super::decode`] checks of a decoded plan before anyone runs it: everything the state
//! machine relies on without checking, so that bytes from a log cannot make it panic or hang.
//! Every task index in range (dependencies, conflicts, fallbacks, failure chains, `subtask_of`,
//! `tests`, relationship targets, route routers, `not_run` targets), unique task ids, conflicts
//! symmetric and never with oneself, a route's router among its task's dependencies, and no cycle
//! of dependencies or of `subtask_of` links. Then it derives `dependents` and `index`, exactly as
//! the compiler does.
//!
//! Linear in the size of the plan, except the symmetry of conflicts (a sort of the conflict
//! pairs); nothing recurses.

use std::collections::HashMap;

use super::cycles::{dependency_cycles, parent_loops};
use super::errors::PlanDecodeError;
use super::model::{NotRun, OWN_FALLBACK, Plan, TaskIdx};
use crate::policy::FailureAction;

/// Checks a decoded plan (with `dependents` and `index` not yet derived) and derives them.
pub(super) fn finish(mut plan: Plan) -> Result<Plan, PlanDecodeError> {
    let n = plan.tasks.len();
    if n == 0 {
        return Err(PlanDecodeError::InvalidPlan {
            field: "tasks".to_owned(),
            message: "plan has no tasks".to_owned(),
        });
    }
    check_options(&plan)?;
    for task in 0..n {
        check_references(&plan, task)?;
    }
    check_conflicts(&plan)?;
    plan.index = index_ids(&plan)?;
    let mut dependents: Vec<Vec<TaskIdx>> = vec![Vec::new(); n];
    for (t, list) in plan.deps.iter().enumerate() {
        for &d in list {
            dependents[d].push(t);
        }
    }
    plan.dependents = dependents;
    check_cycles(&plan)?;
    Ok(plan)
}

/// Returns the error of `task`'s `field`.
fn invalid(plan: &Plan, task: TaskIdx, field: String, message: String) -> PlanDecodeError {
    PlanDecodeError::InvalidTask {
        task,
        id: plan.tasks[task].id.clone(),
        field,
        message,
    }
}

/// Returns an error unless `target` indexes a task.
fn in_range(
    plan: &Plan,
    task: TaskIdx,
    field: impl Fn() -> String,
    target: TaskIdx,
) -> Result<(), PlanDecodeError> {
    if target < plan.tasks.len() {
        return Ok(());
    }
    let message = format!(
        "task index {target} is out of range (the plan has {} tasks)",
        plan.tasks.len()
    );
    Err(invalid(plan, task, field(), message))
}

fn check_options(plan: &Plan) -> Result<(), PlanDecodeError> {
    let failure = &plan.options.failure;
    if plan.options.max_concurrency == Some(0) {
        return Err(PlanDecodeError::InvalidPlan {
            field: "options.max_concurrency".to_owned(),
            message: "must be at least 1: nothing could ever run".to_owned(),
        });
    }
    let actions = std::iter::once(("default_action".to_owned(), &failure.default_action)).chain(
        failure
            .task_type_overrides
            .iter()
            .enumerate()
            .map(|(k, (_, action))| (format!("task_type_overrides[{k}]"), action)),
    );
    for (field, action) in actions {
        // A plan-wide fallback names a task, or stands for each task's own (`OWN_FALLBACK`).
        if let FailureAction::Fallback { task } = *action
            && task != OWN_FALLBACK
            && task >= plan.tasks.len()
        {
            return Err(PlanDecodeError::InvalidPlan {
                field: format!("options.failure.{field}"),
                message: format!(
                    "fallback task index {task} is out of range (the plan has {} tasks)",
                    plan.tasks.len()
                ),
            });
        }
    }
    Ok(())
}

/// Checks every task index `task` holds, and that a route's router is one of its dependencies.
fn check_references(plan: &Plan, task: TaskIdx) -> Result<(), PlanDecodeError> {
    let t = &plan.tasks[task];
    // Decoding gives `deps` and `conflicts` one list per task.
    let deps = &plan.deps[task];
    for (k, &dep) in deps.iter().enumerate() {
        in_range(plan, task, || format!("deps[{k}]"), dep)?;
    }
    for (k, &other) in plan.conflicts[task].iter().enumerate() {
        in_range(plan, task, || format!("conflicts[{k}]"), other)?;
    }
    if let Some(fallback) = t.fallback {
        in_range(plan, task, || "fallback".to_owned(), fallback)?;
    }
    for (k, step) in t.on_failure.steps.iter().enumerate() {
        if let FailureAction::Fallback { task: target } = *step {
            in_range(plan, task, || format!("on_failure[{k}].fallback"), target)?;
        }
    }
    if let Some(parent) = t.subtask_of {
        in_range(plan, task, || "subtask_of".to_owned(), parent)?;
    }
    for (k, &target) in t.tests.iter().enumerate() {
        in_range(plan, task, || format!("tests[{k}]"), target)?;
    }
    for (k, relationship) in t.relationships.iter().enumerate() {
        let field = || format!("relationships[{k}].target");
        in_range(plan, task, field, relationship.target)?;
    }
    if let Some(condition) = &t.condition {
        in_range(
            plan,
            task,
            || "condition.router".to_owned(),
            condition.router,
        )?;
        if !deps.contains(&condition.router) {
            let message = format!(
                "router tasks[{}] is not one of the task's dependencies",
                condition.router
            );
            return Err(invalid(plan, task, "condition.router".to_owned(), message));
        }
    }
    match t.not_run {
        Some(NotRun::SupersededBy(target) | NotRun::DuplicateOf(target)) => {
            in_range(plan, task, || "not_run".to_owned(), target)
        }
        None => Ok(()),
    }
}

/// Checks that conflicts are symmetric, listed once and never with the task itself: the pairs
/// each lower task lists must be exactly the pairs each higher task lists.
fn check_conflicts(plan: &Plan) -> Result<(), PlanDecodeError> {
    // (lower task, higher task, the lister's position in its list)
    let mut by_lower: Vec<(TaskIdx, TaskIdx, usize)> = Vec::new();
    let mut by_higher: Vec<(TaskIdx, TaskIdx, usize)> = Vec::new();
    for (a, list) in plan.conflicts.iter().enumerate() {
        for (k, &b) in list.iter().enumerate() {
            match a.cmp(&b) {
                std::cmp::Ordering::Less => by_lower.push((a, b, k)),
                std::cmp::Ordering::Greater => by_higher.push((b, a, k)),
                std::cmp::Ordering::Equal => {
                    let message = "a task cannot conflict with itself".to_owned();
                    return Err(invalid(plan, a, format!("conflicts[{k}]"), message));
                }
            }
        }
    }
    by_lower.sort_unstable();
    by_higher.sort_unstable();
    for (pairs, lister_is_lower) in [(&by_lower, true), (&by_higher, false)] {
        for w in pairs.windows(2) {
            if (w[0].0, w[0].1) == (w[1].0, w[1].1) {
                let (lister, other) = if lister_is_lower {
                    (w[1].0, w[1].1)
                } else {
                    (w[1].1, w[1].0)
                };
                let message = format!("lists tasks[{other}] twice");
                return Err(invalid(
                    plan,
                    lister,
                    format!("conflicts[{}]", w[1].2),
                    message,
                ));
            }
        }
    }
    let mut lower = by_lower.iter().peekable();
    let mut higher = by_higher.iter().peekable();
    loop {
        // The first pair only one side lists; `None` once both sides agree to the end.
        let unmatched = match (lower.peek(), higher.peek()) {
            (None, None) => return Ok(()),
            (Some(&&l), Some(&&h)) if (l.0, l.1) == (h.0, h.1) => {
                lower.next();
                higher.next();
                continue;
            }
            (Some(&&l), Some(&&h)) if (l.0, l.1) < (h.0, h.1) => (l.0, l.1, l.2),
            (Some(&&l), None) => (l.0, l.1, l.2),
            (_, Some(&&h)) => (h.1, h.0, h.2),
        };
        let (lister, other, k) = unmatched;
        let message = format!(
            "conflicts with tasks[{other}] ({:?}), which does not list it back",
            plan.tasks[other].id
        );
        return Err(invalid(plan, lister, format!("conflicts[{k}]"), message));
    }
}

/// Returns the id → index map, refusing an id used twice.
fn index_ids(plan: &Plan) -> Result<HashMap<String, TaskIdx>, PlanDecodeError> {
    let mut index = HashMap::with_capacity(plan.tasks.len());
    for (i, task) in plan.tasks.iter().enumerate() {
        if let Some(first) = index.insert(task.id.clone(), i) {
            let message = format!("duplicate task id (first used by tasks[{first}])");
            return Err(invalid(plan, i, "id".to_owned(), message));
        }
    }
    Ok(index)
}

/// Refuses a dependency cycle or a loop of `subtask_of` links, naming the lowest task on it.
fn check_cycles(plan: &Plan) -> Result<(), PlanDecodeError> {
    let path = |cycle: &[TaskIdx]| {
        let mut ids: Vec<&str> = cycle.iter().map(|&t| plan.tasks[t].id.as_str()).collect();
        ids.extend(cycle.first().map(|&t| plan.tasks[t].id.as_str()));
        ids.join(" -> ")
    };
    if let Some(cycle) = dependency_cycles(&plan.deps, &plan.dependents).first()
        && let Some(&first) = cycle.first()
    {
        let message = format!("dependency cycle: {}", path(cycle));
        return Err(invalid(plan, first, "deps".to_owned(), message));
    }
    let parent: Vec<Option<TaskIdx>> = plan.tasks.iter().map(|t| t.subtask_of).collect();
    if let Some(cycle) = parent_loops(&parent).first()
        && let Some(&first) = cycle.first()
    {
        let message = format!("subtask cycle: {}", path(cycle));
        return Err(invalid(plan, first, "subtask_of".to_owned(), message));
    }
    Ok(())
}
