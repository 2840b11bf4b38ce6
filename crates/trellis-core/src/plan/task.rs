//! Lowering of one task (type, queue, files, timeout, dependencies, fallback, relationships,
//! failure chain) and of every `route:` into conditions on the routed tasks. Edges go to the
//! caller with where they were declared; checks that need the whole graph come after, in
//! `compile.rs`.

use std::collections::HashMap;

use super::compiler::{Compiler, Edge, Origin, OriginField};
use super::errors::PlanErrorKind;
use super::model::{
    Condition, FileImpact, FileOp, NotRun, OWN_FALLBACK, Relationship, RelationshipKind, RouteCase,
    Task, TaskIdx,
};
use super::options::RetryDefaults;
use super::spec::{ActionSpec, FileOpSpec, TaskSpec};
use crate::policy::{EscalationChain, FailureAction, FailurePolicy};

/// Lowers every `route:` into conditions on the routed tasks and edges from the deciding task.
pub(super) fn compile_routes(
    c: &mut Compiler<'_>,
    all: &[TaskSpec],
    edges: &mut Vec<Edge>,
) -> Vec<Option<Condition>> {
    let mut res: Vec<Option<Condition>> = vec![None; all.len()];
    // Where each routed task was listed, for the error when it is listed twice.
    let mut listed_at: HashMap<TaskIdx, String> = HashMap::new();
    for (i, ts) in all.iter().enumerate() {
        let Some(route) = &ts.route else {
            continue;
        };
        let path = format!("tasks[{i}].route");
        if route.cases.is_empty() && route.default.is_empty() {
            c.error_with_hint(
                PlanErrorKind::InvalidValue,
                &path,
                "route has no cases and no default",
                "list the tasks each output value runs: {path: /kind, cases: {bug: [fix]}, default: [triage]}",
            );
            continue;
        }
        let pointer = match route.path.as_deref().map(str::trim) {
            None | Some("") | Some("/") => String::new(),
            Some(p) if p.starts_with('/') => p.to_owned(),
            Some(p) => p
                .split('.')
                .map(|part| format!("/{}", part.replace('~', "~0").replace('/', "~1")))
                .collect(),
        };
        let keys: Vec<String> = route.cases.keys().cloned().collect();
        let arms = route
            .cases
            .iter()
            .map(|(key, targets)| {
                (
                    format!("{path}.cases.{key}"),
                    RouteCase::Case(key.clone()),
                    targets,
                )
            })
            .chain(std::iter::once((
                format!("{path}.default"),
                RouteCase::Default(keys),
                &route.default,
            )));
        for (arm_path, case, targets) in arms {
            for (k, id) in targets.iter().enumerate() {
                let target_path = format!("{arm_path}[{k}]");
                let Some(target) = c.resolve(id, || target_path.clone()) else {
                    continue;
                };
                if target == i {
                    c.error(
                        PlanErrorKind::SelfReference,
                        &target_path,
                        format!("task {id:?} cannot route to itself"),
                    );
                    continue;
                }
                if let Some(first) = listed_at.get(&target) {
                    c.error_with_hint(
                        PlanErrorKind::Contradiction,
                        &target_path,
                        format!("task {id:?} is already routed at {first}"),
                        "a task belongs to one case of one route; give the other case its own task",
                    );
                    continue;
                }
                listed_at.insert(target, target_path);
                res[target] = Some(Condition {
                    router: i,
                    pointer: pointer.clone(),
                    case: case.clone(),
                });
                edges.push(Edge {
                    dependent: target,
                    dep: i,
                    origin: Origin {
                        task: i,
                        field: OriginField::Route,
                    },
                });
            }
        }
    }
    res
}

/// Lowers task `i`; its edges, declared conflicts, `not_run` and `subtask_of` go to the slices
/// given, which the caller resolves once every task is lowered.
#[allow(clippy::too_many_arguments)] // The compiler's per-task outputs; a struct would only rename them.
pub(super) fn compile_task(
    c: &mut Compiler<'_>,
    i: TaskIdx,
    all: &[TaskSpec],
    policy: &FailurePolicy,
    defaults: &RetryDefaults,
    edges: &mut Vec<Edge>,
    declared_conflicts: &mut Vec<(TaskIdx, TaskIdx)>,
    not_run: &mut [Option<(NotRun, Origin)>],
    subtask_of: &mut [Option<(TaskIdx, Origin)>],
) -> Task {
    let ts = &all[i];
    if ts.task_type.trim().is_empty() {
        c.error_with_hint(
            PlanErrorKind::InvalidValue,
            format!("tasks[{i}].type"),
            "task type must not be empty",
            "give the task `type:` (a handler such as shell, http, noop), or `use:` a template that has one",
        );
    }
    let queue = match &ts.queue {
        Some(q) if q.trim().is_empty() => {
            c.error(
                PlanErrorKind::InvalidValue,
                format!("tasks[{i}].queue"),
                "queue must not be empty (leave it out to use the task type)",
            );
            ts.task_type.clone()
        }
        Some(q) => q.clone(),
        None => ts.task_type.clone(),
    };
    // An empty type or queue is reported above.
    if let Some(why) = (!queue.trim().is_empty())
        .then(|| check_queue_name(&queue).err())
        .flatten()
    {
        let field = if ts.queue.is_some() { "queue" } else { "type" };
        c.error_with_hint(
            PlanErrorKind::InvalidValue,
            format!("tasks[{i}].{field}"),
            format!("queue {queue:?} {why}"),
            "a queue is one name without `.`, spaces, `*` or `>`, such as gpu-large",
        );
    }

    let mut files = Vec::with_capacity(ts.files.len());
    for (j, f) in ts.files.iter().enumerate() {
        if f.path.trim().is_empty() {
            c.error(
                PlanErrorKind::InvalidValue,
                format!("tasks[{i}].files[{j}].path"),
                "file path must not be empty",
            );
        }
        let confidence = f.confidence.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&confidence) {
            c.error(
                PlanErrorKind::InvalidValue,
                format!("tasks[{i}].files[{j}].confidence"),
                format!("confidence {confidence} is outside 0.0–1.0"),
            );
        }
        files.push(FileImpact {
            path: f.path.clone(),
            op: match f.op {
                FileOpSpec::Create => FileOp::Create,
                FileOpSpec::Update => FileOp::Update,
                FileOpSpec::Delete => FileOp::Delete,
                FileOpSpec::Read => FileOp::Read,
            },
            confidence,
        });
    }

    let timeout = ts
        .timeout
        .as_ref()
        .and_then(|text| c.duration(text, || format!("tasks[{i}].timeout")));

    let origin = |field| Origin { task: i, field };
    if ts.depends_on.len() > c.limits.max_depends_on {
        c.error(
            PlanErrorKind::TooLarge,
            format!("tasks[{i}].depends_on"),
            format!(
                "{} dependencies, over the limit of {}",
                ts.depends_on.len(),
                c.limits.max_depends_on
            ),
        );
    } else {
        for (j, id) in ts.depends_on.iter().enumerate() {
            let Some(dep) = c.resolve(id, || format!("tasks[{i}].depends_on[{j}]")) else {
                continue;
            };
            if dep == i {
                c.error(
                    PlanErrorKind::SelfReference,
                    format!("tasks[{i}].depends_on[{j}]"),
                    format!("task {id:?} depends on itself"),
                );
                continue;
            }
            edges.push(Edge {
                dependent: i,
                dep,
                origin: origin(OriginField::DependsOn),
            });
        }
    }

    let fallback = ts
        .fallback
        .as_ref()
        .and_then(|id| c.resolve(id, || format!("tasks[{i}].fallback")));

    let mut relationships = Vec::with_capacity(ts.relationships.len());
    let mut tests = Vec::new();
    for (k, rel) in ts.relationships.iter().enumerate() {
        let path = || format!("tasks[{i}].relationships[{k}]");
        let Some(target) = c.resolve(&rel.target, || format!("{}.target", path())) else {
            continue;
        };
        let kind = rel.kind;
        if target == i {
            c.error(
                PlanErrorKind::SelfReference,
                path(),
                format!("task {:?} cannot be {} itself", ts.id, kind_phrase(kind)),
            );
            continue;
        }
        relationships.push(Relationship { kind, target });
        let here = origin(OriginField::Relationship(k));
        match kind {
            RelationshipKind::DependsOn => edges.push(Edge {
                dependent: i,
                dep: target,
                origin: here,
            }),
            RelationshipKind::Blocks => edges.push(Edge {
                dependent: target,
                dep: i,
                origin: here,
            }),
            RelationshipKind::ConflictsWith => declared_conflicts.push((i, target)),
            RelationshipKind::Supersedes => {
                if let Some((previous, at)) = &not_run[target] {
                    let message = format!(
                        "task {:?} is already not run ({}, declared at {})",
                        rel.target,
                        not_run_phrase(previous, all),
                        at.path()
                    );
                    c.error(PlanErrorKind::Contradiction, path(), message);
                } else {
                    not_run[target] = Some((NotRun::SupersededBy(i), here));
                    edges.push(Edge {
                        dependent: target,
                        dep: i,
                        origin: here,
                    });
                }
            }
            RelationshipKind::DuplicateOf => {
                if let Some((previous, at)) = &not_run[i] {
                    let message = format!(
                        "task {:?} is already not run ({}, declared at {})",
                        ts.id,
                        not_run_phrase(previous, all),
                        at.path()
                    );
                    c.error(PlanErrorKind::Contradiction, path(), message);
                } else {
                    not_run[i] = Some((NotRun::DuplicateOf(target), here));
                    edges.push(Edge {
                        dependent: i,
                        dep: target,
                        origin: here,
                    });
                }
            }
            RelationshipKind::SubtaskOf => {
                if let Some((parent, at)) = subtask_of[i] {
                    let message = format!(
                        "task {:?} is already a subtask of {:?} (declared at {})",
                        ts.id,
                        all[parent].id,
                        at.path()
                    );
                    c.error(PlanErrorKind::Contradiction, path(), message);
                } else {
                    subtask_of[i] = Some((target, here));
                }
            }
            RelationshipKind::Tests => {
                tests.push(target);
                edges.push(Edge {
                    dependent: i,
                    dep: target,
                    origin: here,
                });
            }
            RelationshipKind::RelatedTo
            | RelationshipKind::Implements
            | RelationshipKind::Enables
            | RelationshipKind::InspiredBy => {}
        }
    }
    tests.dedup();

    let plan_chain = |c: &mut Compiler<'_>| {
        let mut chain = policy.chain_for(&ts.task_type);
        for step in &mut chain.steps {
            if let FailureAction::Fallback { task } = step
                && *task == OWN_FALLBACK
            {
                match fallback {
                    Some(f) => *task = f,
                    None => c.error_with_hint(
                        PlanErrorKind::Contradiction,
                        format!("tasks[{i}]"),
                        format!(
                            "the plan's failure policy falls back for tasks of type {:?}, but task {:?} declares no fallback",
                            ts.task_type, ts.id
                        ),
                        "give the task `fallback: task-id`, or its own `on_failure` chain",
                    ),
                }
            }
        }
        chain
    };
    let on_failure = match (&ts.on_failure, &ts.retry) {
        (Some(_), Some(_)) => {
            c.error_with_hint(
                PlanErrorKind::Contradiction,
                format!("tasks[{i}].retry"),
                "a task gives either `retry` or `on_failure`, not both",
                "put the retry in the chain: on_failure: [{retry: {max: 3}}, ...]",
            );
            EscalationChain { steps: Vec::new() }
        }
        (Some(steps), None) => {
            let mut chain = EscalationChain {
                steps: Vec::with_capacity(steps.len()),
            };
            for (k, step) in steps.iter().enumerate() {
                let path = || format!("tasks[{i}].on_failure[{k}]");
                if let Some(action) = c.action(step, defaults, Some(fallback), &path) {
                    chain.steps.push(action);
                }
            }
            chain
        }
        (None, Some(retry)) => {
            let path = || format!("tasks[{i}]");
            let mut chain = EscalationChain { steps: Vec::new() };
            let spec = ActionSpec::Retry(retry.clone());
            if let Some(action) = c.action(&spec, defaults, Some(fallback), &path) {
                chain.steps.push(action);
            }
            let then = plan_chain(c);
            chain.steps.extend(
                then.steps
                    .into_iter()
                    .filter(|step| !matches!(step, FailureAction::Retry { .. })),
            );
            chain
        }
        (None, None) => plan_chain(c),
    };

    Task {
        id: ts.id.clone(),
        task_type: ts.task_type.clone(),
        queue,
        input: ts.input.clone(),
        files,
        timeout,
        on_failure,
        fallback,
        is_fallback_only: false,
        not_run: None,
        subtask_of: None,
        tests,
        relationships,
        condition: None,
        validate: super::checks::compile_checks(c, i, &ts.validate),
    }
}

/// Returns "<kind> " phrased to read before "itself" ("a subtask of itself").
fn kind_phrase(kind: RelationshipKind) -> String {
    match kind {
        RelationshipKind::SubtaskOf => "a subtask of".to_owned(),
        RelationshipKind::DuplicateOf => "a duplicate of".to_owned(),
        other => format!("in a {} relationship with", other.as_str()),
    }
}

fn not_run_phrase(not_run: &NotRun, all: &[TaskSpec]) -> String {
    let id_of = |idx: TaskIdx| format!("{:?}", all[idx].id);
    match *not_run {
        NotRun::SupersededBy(by) => format!("superseded by {}", id_of(by)),
        NotRun::DuplicateOf(of) => format!("a duplicate of {}", id_of(of)),
    }
}

/// Why `queue` cannot name a queue, if it cannot: it becomes one token of NATS subjects
/// (`trellis.tasks.<queue>`, its fast lane `trellis.tasks.~.<queue>`) and of consumer names, so
/// it must be non-empty, without `.`, whitespace or the wildcards `*` and `>` (the rule workers
/// apply to the queues they consume).
pub fn check_queue_name(queue: &str) -> Result<(), &'static str> {
    if queue.is_empty() {
        return Err("is empty");
    }
    if queue.contains('.') {
        return Err("contains `.`");
    }
    if queue.chars().any(char::is_whitespace) {
        return Err("contains whitespace");
    }
    if queue.contains(['*', '>']) {
        return Err("contains a NATS wildcard (`*` or `>`)");
    }
    Ok(())
}

#[cfg(test)]
mod queue_name_tests {
    use super::check_queue_name;

    #[test]
    fn a_queue_name_is_one_subject_token() {
        for good in ["shell", "gpu-large", "agent_v2", "a:b", "~"] {
            assert_eq!(check_queue_name(good), Ok(()), "{good}");
        }
        for bad in ["", "gpu.large", "a b", "a\tb", "a*", ">", "."] {
            assert!(check_queue_name(bad).is_err(), "{bad:?}");
        }
    }
}
