//! The plan compiler: [`PlanSpec`] → validated [`Plan`].
//!
//! Once the spec is well-formed (parsing, `parse.rs`) and expanded (`expand.rs`), the compiler
//! checks everything and reports every problem it finds, each with the path of the offending
//! value (`tasks[3].depends_on[0]: unknown task "api"`). Each task is lowered on its own
//! (`task.rs`, `options.rs`); this file runs the passes that need the whole plan: ids, fallback
//! and subtask roles, the dependency lists, cycles (`cycles.rs`) and conflicts.
//!
//! Every pass is linear in the size of the plan (plus the number of conflict pairs, which is the
//! size of the output): ids go through a hash index, cycles are found with Kahn's algorithm and an
//! iterative walk, file conflicts through a path index. Nothing recurses, so a 100,000-task chain
//! compiles like any other plan.

use std::collections::{BTreeMap, HashMap};

use super::compiler::{Compiler, Edge, MAX_HINTS, Origin};
use super::cycles::{dependency_cycles, parent_loops};
use super::errors::{PlanErrorKind, PlanErrors};
use super::expand::expand_inner;
use super::limits::Limits;
use super::model::{NotRun, OWN_FALLBACK, Plan, ShapeCache, Task, TaskIdx};
use super::options::compile_options;
use super::parse::{parse_spec, parse_spec_bytes};
use super::spec::PlanSpec;
use super::task::{compile_routes, compile_task};
use crate::policy::FailureAction;

/// Parses and compiles text.
pub fn compile_str(text: &str, limits: &Limits) -> Result<Plan, PlanErrors> {
    compile(parse_spec(text, limits)?, limits)
}

/// Parses and compiles raw bytes (see [`parse_spec_bytes`]).
pub fn compile_bytes(bytes: &[u8], limits: &Limits) -> Result<Plan, PlanErrors> {
    compile(parse_spec_bytes(bytes, limits)?, limits)
}

/// Compiles a spec into a plan, reporting every problem found: expands it (see
/// [`super::expand`]) with no param values given, then validates the flat spec.
pub fn compile(spec: PlanSpec, limits: &Limits) -> Result<Plan, PlanErrors> {
    compile_with_params(spec, &BTreeMap::new(), limits)
}

/// Compiles a spec with values for its params (a param without a value takes its default).
/// Errors point at the spec as written, also for tasks made by `for_each`.
pub fn compile_with_params(
    spec: PlanSpec,
    params: &BTreeMap<String, serde_json::Value>,
    limits: &Limits,
) -> Result<Plan, PlanErrors> {
    let (flat, source_map) = expand_inner(spec, params, limits)?;
    validate(flat, limits).map_err(|errors| source_map.rewrite(errors))
}

/// Validates a flat spec (one [`super::expand`] returned) and lowers it into a plan.
fn validate(spec: PlanSpec, limits: &Limits) -> Result<Plan, PlanErrors> {
    let mut c = Compiler {
        limits,
        errors: Vec::new(),
        index: HashMap::with_capacity(spec.tasks.len()),
        ids: Vec::new(),
        hints_left: MAX_HINTS,
    };
    let n_tasks = spec.tasks.len();
    if spec.name.trim().is_empty() {
        c.error(
            PlanErrorKind::InvalidValue,
            "name",
            "plan name must not be empty",
        );
    }
    if n_tasks == 0 {
        c.error(PlanErrorKind::Empty, "tasks", "plan has no tasks");
        return Err(PlanErrors::from_vec(c.errors));
    }
    if n_tasks > limits.max_tasks {
        c.error(
            PlanErrorKind::TooLarge,
            "tasks",
            format!(
                "plan has {n_tasks} tasks, over the limit of {}",
                limits.max_tasks
            ),
        );
        return Err(PlanErrors::from_vec(c.errors));
    }

    // Ids first: every reference below resolves through the index.
    c.ids = spec.tasks.iter().map(|t| t.id.as_str()).collect();
    for (i, task) in spec.tasks.iter().enumerate() {
        c.check_id(i, &task.id);
        if let Some(&first) = c.index.get(&task.id) {
            c.error_with_hint(
                PlanErrorKind::DuplicateId,
                format!("tasks[{i}].id"),
                format!(
                    "duplicate task id {:?} (first declared at tasks[{first}])",
                    task.id
                ),
                "task ids are unique in a plan: rename one of the two",
            );
        } else {
            c.index.insert(task.id.clone(), i);
        }
    }

    let (options, retry_defaults) = compile_options(&mut c, &spec);

    let mut edges: Vec<Edge> = Vec::with_capacity(n_tasks * 2);
    let mut declared_conflicts: Vec<(TaskIdx, TaskIdx)> = Vec::new();
    let mut not_run: Vec<Option<(NotRun, Origin)>> = vec![None; n_tasks];
    let mut subtask_of: Vec<Option<(TaskIdx, Origin)>> = vec![None; n_tasks];
    let mut fallback_of: Vec<Option<TaskIdx>> = vec![None; n_tasks];
    let mut tasks: Vec<Task> = Vec::with_capacity(n_tasks);
    let conditions = compile_routes(&mut c, &spec.tasks, &mut edges);

    for i in 0..n_tasks {
        let task = compile_task(
            &mut c,
            i,
            &spec.tasks,
            &options.failure,
            &retry_defaults,
            &mut edges,
            &mut declared_conflicts,
            &mut not_run,
            &mut subtask_of,
        );
        tasks.push(task);
    }

    // Fallback roles: a task named as anyone's fallback runs only in that role.
    for (i, task) in tasks.iter().enumerate() {
        let named = task
            .fallback
            .into_iter()
            .chain(task.on_failure.steps.iter().filter_map(|step| match step {
                FailureAction::Fallback { task } if *task != OWN_FALLBACK => Some(*task),
                _ => None,
            }));
        for target in named {
            if target == i {
                c.error(
                    PlanErrorKind::SelfReference,
                    format!("tasks[{i}]"),
                    format!("task {:?} cannot be its own fallback", task.id),
                );
            } else if fallback_of[target].is_none() {
                fallback_of[target] = Some(i);
            }
        }
    }
    for (task, condition) in tasks.iter_mut().zip(conditions) {
        task.condition = condition;
    }
    for (i, task) in tasks.iter_mut().enumerate() {
        task.not_run = not_run[i].as_ref().map(|(n, _)| n.clone());
        task.subtask_of = subtask_of[i].map(|(p, _)| p);
        task.is_fallback_only = fallback_of[i].is_some();
    }

    // Subtasks and fallbacks run only in their role: nothing may order them on their own.
    for edge in &edges {
        let Edge {
            dependent, origin, ..
        } = *edge;
        let id = &tasks[dependent].id;
        if let Some(parent) = tasks[dependent].subtask_of {
            c.error_with_hint(
                PlanErrorKind::Contradiction,
                origin.path(),
                format!(
                    "task {id:?} is a subtask of {:?} and cannot have dependencies (it runs in its parent's subtask group)",
                    tasks[parent].id
                ),
                "declare the dependencies on the parent task instead",
            );
        } else if let Some(owner) = fallback_of[dependent] {
            c.error_with_hint(
                PlanErrorKind::Contradiction,
                origin.path(),
                format!(
                    "task {id:?} is the fallback of {:?} and cannot have dependencies (it runs only in that role)",
                    tasks[owner].id
                ),
                "declare the dependencies on the task it stands in for",
            );
        }
    }
    check_subtask_cycles(&mut c, &tasks, &subtask_of);

    let mut deps: Vec<Vec<TaskIdx>> = vec![Vec::new(); n_tasks];
    for edge in &edges {
        deps[edge.dependent].push(edge.dep);
    }
    for list in &mut deps {
        list.sort_unstable();
        list.dedup();
    }
    let mut dependents: Vec<Vec<TaskIdx>> = vec![Vec::new(); n_tasks];
    for (t, list) in deps.iter().enumerate() {
        for &d in list {
            dependents[d].push(t);
        }
    }
    check_cycles(&mut c, &tasks, &deps, &dependents, &edges);

    let mut conflicts: Vec<Vec<TaskIdx>> = vec![Vec::new(); n_tasks];
    let min_confidence = options.min_conflict_confidence;
    crate::analysis::for_each_file_conflict(&tasks, min_confidence, |a, _, b, _, _| {
        conflicts[a].push(b);
        conflicts[b].push(a);
    });
    for (a, b) in declared_conflicts {
        conflicts[a].push(b);
        conflicts[b].push(a);
    }
    for list in &mut conflicts {
        list.sort_unstable();
        list.dedup();
    }

    if !c.errors.is_empty() {
        return Err(PlanErrors::from_vec(c.errors));
    }
    Ok(Plan {
        name: spec.name,
        options,
        tasks,
        deps,
        dependents,
        conflicts,
        index: c.index,
        shape: ShapeCache::default(),
    })
}

/// Reports `subtask_of` chains that loop (a subtask of b, b a subtask of a).
fn check_subtask_cycles(
    c: &mut Compiler<'_>,
    tasks: &[Task],
    subtask_of: &[Option<(TaskIdx, Origin)>],
) {
    let parent: Vec<Option<TaskIdx>> = subtask_of.iter().map(|s| s.map(|(p, _)| p)).collect();
    for cycle in parent_loops(&parent) {
        let Some(&first) = cycle.first() else {
            continue;
        };
        let origin = subtask_of[first].map(|(_, o)| o.path()).unwrap_or_default();
        c.error_with_hint(
            PlanErrorKind::Cycle,
            origin,
            format!("subtask cycle: {}", cycle_text(tasks, &cycle)),
            "a task cannot be (indirectly) a subtask of its own subtask",
        );
    }
}

/// Writes a cycle back to its first task: `a -> b -> c -> a`.
fn cycle_text(tasks: &[Task], cycle: &[TaskIdx]) -> String {
    let mut res = String::new();
    for &t in cycle {
        res.push_str(&tasks[t].id);
        res.push_str(" -> ");
    }
    if let Some(&first) = cycle.first() {
        res.push_str(&tasks[first].id);
    }
    res
}

/// Reports dependency cycles, one per strongly connected component, each at the declaration of
/// the dependency that leaves its lowest task.
fn check_cycles(
    c: &mut Compiler<'_>,
    tasks: &[Task],
    deps: &[Vec<TaskIdx>],
    dependents: &[Vec<TaskIdx>],
    edges: &[Edge],
) {
    let cycles = dependency_cycles(deps, dependents);
    if cycles.is_empty() {
        return;
    }
    let origins: HashMap<(TaskIdx, TaskIdx), Origin> = edges
        .iter()
        .rev()
        .map(|e| ((e.dependent, e.dep), e.origin))
        .collect();
    for cycle in cycles {
        let Some(&first) = cycle.first() else {
            continue;
        };
        let second = cycle.get(1).copied().unwrap_or(first);
        let path = origins
            .get(&(first, second))
            .map_or_else(|| format!("tasks[{first}]"), |o| o.path());
        c.error_with_hint(
            PlanErrorKind::Cycle,
            path,
            format!("dependency cycle: {}", cycle_text(tasks, &cycle)),
            "no task on a cycle can ever start: remove one of its dependencies",
        );
    }
}
