//! The encoded form of a [`Plan`]: private structs whose field order is the format, written by
//! `rmp-serde` as MessagePack arrays (see `encoding.rs` for how to evolve them).
//!
//! They are kept apart from the public types on purpose: a change to `Plan` or to a type it
//! holds cannot change the bytes unnoticed, and the encoding leaves out what decoding derives:
//! `dependents` and `index` (rebuilt from `deps` and the ids), a task's queue when it is its type,
//! and a task's failure chain when it is the one the plan's policy gives its type (see
//! [`policy_chain`]). Task types are written once, in a table the tasks point into. Small enums
//! are one-byte codes; an unknown code is an error naming the task and field.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::errors::PlanDecodeError;
use super::model::{
    Budget, BudgetAction, Check, CheckLevel, Condition, FileImpact, FileOp, NotRun, OWN_FALLBACK,
    Plan, PlanOptions, Probe, Relationship, RelationshipKind, RouteCase, ShapeCache, Task, TaskIdx,
};
use crate::policy::{Backoff, BackoffKind, EscalationChain, FailureAction, FailurePolicy};

/// A plan. Field order is the encoding.
#[derive(Serialize, Deserialize)]
pub(super) struct EncodedPlan<'a> {
    /// Checked before the rest is decoded (`encoding::read_format`).
    pub(super) format: u32,
    name: Cow<'a, str>,
    options: EncodedOptions<'a>,
    /// Every task type, once, in order of first use.
    types: Vec<Cow<'a, str>>,
    tasks: Vec<EncodedTask<'a>>,
}

#[derive(Serialize, Deserialize)]
struct EncodedOptions<'a> {
    max_concurrency: Option<u32>,
    global_timeout: Option<Duration>,
    pause_on_human_review: bool,
    failure: EncodedPolicy<'a>,
    budget: EncodedBudget,
    min_conflict_confidence: f32,
}

#[derive(Serialize, Deserialize)]
struct EncodedPolicy<'a> {
    default_action: EncodedAction,
    continue_on_partial_failure: bool,
    task_type_overrides: Vec<(Cow<'a, str>, EncodedAction)>,
}

#[derive(Serialize, Deserialize)]
struct EncodedBudget {
    max_tokens: Option<u64>,
    max_cost: Option<f64>,
    /// [`budget_action_code`].
    on_exhausted: u8,
}

/// A failure action; variants are written by name, as `rmp-serde` does.
#[derive(PartialEq, Serialize, Deserialize)]
enum EncodedAction {
    #[serde(rename = "retry")]
    Retry(u32, EncodedBackoff),
    #[serde(rename = "reassign")]
    Reassign,
    #[serde(rename = "skip")]
    Skip,
    #[serde(rename = "pause")]
    Pause,
    #[serde(rename = "abort")]
    Abort,
    /// The task index; in the plan's policy, `u64::MAX` is [`OWN_FALLBACK`].
    #[serde(rename = "fallback")]
    Fallback(u64),
}

#[derive(PartialEq, Serialize, Deserialize)]
struct EncodedBackoff {
    /// [`backoff_kind_code`].
    kind: u8,
    base: Duration,
    cap: Duration,
    jitter_pct: u8,
}

/// A task. Field order is the encoding.
#[derive(Serialize, Deserialize)]
struct EncodedTask<'a> {
    id: Cow<'a, str>,
    /// Index in [`EncodedPlan::types`].
    task_type: u32,
    input: Cow<'a, Value>,
    deps: Cow<'a, [TaskIdx]>,
    /// `None` when all of it is at its default, as for most tasks: a simple task then costs its
    /// id, its input and a few bytes.
    more: Option<EncodedTaskMore<'a>>,
}

/// What most tasks leave at its default. Field order is the encoding.
#[derive(Default, PartialEq, Serialize, Deserialize)]
struct EncodedTaskMore<'a> {
    /// `None` when the queue is the type.
    queue: Option<Cow<'a, str>>,
    conflicts: Cow<'a, [TaskIdx]>,
    files: Vec<EncodedFile<'a>>,
    timeout: Option<Duration>,
    /// `None` when the chain is [`policy_chain`] of the task.
    on_failure: Option<Vec<EncodedAction>>,
    fallback: Option<TaskIdx>,
    is_fallback_only: bool,
    not_run: Option<EncodedNotRun>,
    subtask_of: Option<TaskIdx>,
    tests: Cow<'a, [TaskIdx]>,
    /// ([`relationship_code`], target).
    relationships: Vec<(u8, TaskIdx)>,
    condition: Option<EncodedCondition<'a>>,
    /// Since format 2; left out when empty, so a plan without checks keeps format 1's layout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    validate: Vec<EncodedCheck<'a>>,
}

/// A check of `validate:`. Field order is the encoding.
#[derive(PartialEq, Serialize, Deserialize)]
struct EncodedCheck<'a> {
    name: Cow<'a, str>,
    /// [`check_level_code`].
    level: u8,
    probe: EncodedProbe<'a>,
    timeout: Duration,
}

#[derive(PartialEq, Serialize, Deserialize)]
enum EncodedProbe<'a> {
    #[serde(rename = "command")]
    Command(Vec<Cow<'a, str>>),
    #[serde(rename = "http")]
    Http(Cow<'a, str>, Cow<'a, str>, u16, Option<Cow<'a, str>>),
}

#[derive(PartialEq, Serialize, Deserialize)]
struct EncodedFile<'a> {
    path: Cow<'a, str>,
    /// [`file_op_code`].
    op: u8,
    confidence: f32,
}

#[derive(PartialEq, Serialize, Deserialize)]
enum EncodedNotRun {
    #[serde(rename = "superseded_by")]
    SupersededBy(TaskIdx),
    #[serde(rename = "duplicate_of")]
    DuplicateOf(TaskIdx),
}

#[derive(PartialEq, Serialize, Deserialize)]
struct EncodedCondition<'a> {
    router: TaskIdx,
    pointer: Cow<'a, str>,
    case: EncodedRouteCase<'a>,
}

#[derive(PartialEq, Serialize, Deserialize)]
enum EncodedRouteCase<'a> {
    #[serde(rename = "case")]
    Case(Cow<'a, str>),
    #[serde(rename = "default")]
    Default(Vec<Cow<'a, str>>),
}

/// Returns the failure chain a task of `task_type` whose own fallback is `fallback` gets from the
/// plan's policy, as the compiler resolves it: the policy's chain for the type, with a bare
/// `fallback` ([`OWN_FALLBACK`]) standing for the task's own. A task holding exactly this chain
/// is encoded without it.
fn policy_chain(
    policy: &FailurePolicy,
    task_type: &str,
    fallback: Option<TaskIdx>,
) -> EscalationChain {
    with_own_fallback(policy.chain_for(task_type), fallback)
}

/// Returns `chain` with its bare `fallback` steps resolved to the task's own `fallback`.
fn with_own_fallback(mut chain: EscalationChain, fallback: Option<TaskIdx>) -> EscalationChain {
    if let Some(own) = fallback {
        for step in &mut chain.steps {
            if let FailureAction::Fallback { task } = step
                && *task == OWN_FALLBACK
            {
                *task = own;
            }
        }
    }
    chain
}

impl<'a> EncodedPlan<'a> {
    /// Returns the encoded form of `plan`, borrowing its strings, inputs and index lists.
    pub(super) fn of(plan: &'a Plan, format: u32) -> Self {
        let mut type_index: HashMap<&str, u32> = HashMap::new();
        let mut types = Vec::new();
        let tasks = plan
            .tasks
            .iter()
            .enumerate()
            .map(|(i, task)| {
                let next = types.len() as u32;
                let task_type = *type_index
                    .entry(task.task_type.as_str())
                    .or_insert_with(|| {
                        types.push(Cow::Borrowed(task.task_type.as_str()));
                        next
                    });
                EncodedTask::of(plan, i, task, task_type)
            })
            .collect();
        let o = &plan.options;
        EncodedPlan {
            format,
            name: Cow::Borrowed(&plan.name),
            options: EncodedOptions {
                max_concurrency: o.max_concurrency,
                global_timeout: o.global_timeout,
                pause_on_human_review: o.pause_on_human_review,
                failure: EncodedPolicy {
                    default_action: action_of(&o.failure.default_action),
                    continue_on_partial_failure: o.failure.continue_on_partial_failure,
                    task_type_overrides: o
                        .failure
                        .task_type_overrides
                        .iter()
                        .map(|(ty, action)| (Cow::Borrowed(ty.as_str()), action_of(action)))
                        .collect(),
                },
                budget: EncodedBudget {
                    max_tokens: o.budget.max_tokens,
                    max_cost: o.budget.max_cost,
                    on_exhausted: budget_action_code(o.budget.on_exhausted),
                },
                min_conflict_confidence: o.min_conflict_confidence,
            },
            types,
            tasks,
        }
    }

    /// Returns the plan, without `dependents` and `index` (left empty for `verify` to derive once
    /// it checked what they are derived from). Fails on a code or type index out of range.
    pub(super) fn into_plan(self) -> Result<Plan, PlanDecodeError> {
        let o = self.options;
        let failure = FailurePolicy {
            default_action: action_from(
                o.failure.default_action,
                "options.failure.default_action",
            )?,
            continue_on_partial_failure: o.failure.continue_on_partial_failure,
            task_type_overrides: o
                .failure
                .task_type_overrides
                .into_iter()
                .enumerate()
                .map(|(k, (ty, action))| {
                    let field = format!("options.failure.task_type_overrides[{k}]");
                    Ok((ty.into_owned(), action_from(action, &field)?))
                })
                .collect::<Result<_, PlanDecodeError>>()?,
        };
        let options = PlanOptions {
            max_concurrency: o.max_concurrency,
            global_timeout: o.global_timeout,
            pause_on_human_review: o.pause_on_human_review,
            failure,
            budget: Budget {
                max_tokens: o.budget.max_tokens,
                max_cost: o.budget.max_cost,
                on_exhausted: budget_action_from(o.budget.on_exhausted)?,
            },
            min_conflict_confidence: o.min_conflict_confidence,
        };
        // Each type with the policy's chain for it, looked up once rather than per task.
        let types: Vec<(String, EscalationChain)> = self
            .types
            .into_iter()
            .map(|ty| {
                let chain = options.failure.chain_for(&ty);
                (ty.into_owned(), chain)
            })
            .collect();
        let n = self.tasks.len();
        let mut tasks = Vec::with_capacity(n);
        let mut deps = Vec::with_capacity(n);
        let mut conflicts = Vec::with_capacity(n);
        for (i, task) in self.tasks.into_iter().enumerate() {
            let (task, task_deps, task_conflicts) = task.into_task(i, &types)?;
            tasks.push(task);
            deps.push(task_deps);
            conflicts.push(task_conflicts);
        }
        Ok(Plan {
            name: self.name.into_owned(),
            options,
            tasks,
            deps,
            dependents: Vec::new(),
            conflicts,
            index: HashMap::new(),
            shape: ShapeCache::default(),
        })
    }
}

impl<'a> EncodedTask<'a> {
    /// Returns the encoded form of task `i` of `plan`, whose type is `task_type` in the table.
    fn of(plan: &'a Plan, i: TaskIdx, task: &'a Task, task_type: u32) -> Self {
        let default_chain = policy_chain(&plan.options.failure, &task.task_type, task.fallback);
        let more = EncodedTaskMore {
            queue: (task.queue != task.task_type).then_some(Cow::Borrowed(&task.queue)),
            conflicts: Cow::Borrowed(list(&plan.conflicts, i)),
            files: task
                .files
                .iter()
                .map(|f| EncodedFile {
                    path: Cow::Borrowed(&f.path),
                    op: file_op_code(f.op),
                    confidence: f.confidence,
                })
                .collect(),
            timeout: task.timeout,
            on_failure: (task.on_failure != default_chain)
                .then(|| task.on_failure.steps.iter().map(action_of).collect()),
            fallback: task.fallback,
            is_fallback_only: task.is_fallback_only,
            not_run: task.not_run.as_ref().map(|n| match *n {
                NotRun::SupersededBy(by) => EncodedNotRun::SupersededBy(by),
                NotRun::DuplicateOf(of) => EncodedNotRun::DuplicateOf(of),
            }),
            subtask_of: task.subtask_of,
            tests: Cow::Borrowed(&task.tests),
            relationships: task
                .relationships
                .iter()
                .map(|r| (relationship_code(r.kind), r.target))
                .collect(),
            condition: task.condition.as_ref().map(|c| EncodedCondition {
                router: c.router,
                pointer: Cow::Borrowed(&c.pointer),
                case: match &c.case {
                    RouteCase::Case(key) => EncodedRouteCase::Case(Cow::Borrowed(key)),
                    RouteCase::Default(keys) => EncodedRouteCase::Default(
                        keys.iter().map(|k| Cow::Borrowed(k.as_str())).collect(),
                    ),
                },
            }),
            validate: task.validate.iter().map(EncodedCheck::of).collect(),
        };
        EncodedTask {
            id: Cow::Borrowed(&task.id),
            task_type,
            input: Cow::Borrowed(&task.input),
            deps: Cow::Borrowed(list(&plan.deps, i)),
            more: (more != EncodedTaskMore::default()).then_some(more),
        }
    }

    /// Returns task `i` with its dependencies and conflicts; `types` holds each type with the
    /// policy's chain for it. Fails on a code or type index out of range.
    fn into_task(
        self,
        i: TaskIdx,
        types: &[(String, EscalationChain)],
    ) -> Result<(Task, Vec<TaskIdx>, Vec<TaskIdx>), PlanDecodeError> {
        let id = self.id.into_owned();
        let invalid = |field: String, message: String| PlanDecodeError::InvalidTask {
            task: i,
            id: id.clone(),
            field,
            message,
        };
        let Some((task_type, type_chain)) = types.get(self.task_type as usize) else {
            let message = format!(
                "type index {} is out of range (the plan has {} types)",
                self.task_type,
                types.len()
            );
            return Err(invalid("type".to_owned(), message));
        };
        let more = self.more.unwrap_or_default();
        let on_failure = match more.on_failure {
            None => with_own_fallback(type_chain.clone(), more.fallback),
            Some(steps) => {
                let mut chain = EscalationChain {
                    steps: Vec::with_capacity(steps.len()),
                };
                for (k, step) in steps.into_iter().enumerate() {
                    match action_from(step, &format!("on_failure[{k}]")) {
                        Ok(action) => chain.steps.push(action),
                        Err(PlanDecodeError::InvalidPlan { field, message }) => {
                            return Err(invalid(field, message));
                        }
                        Err(other) => return Err(other),
                    }
                }
                chain
            }
        };
        let mut files = Vec::with_capacity(more.files.len());
        for (j, f) in more.files.into_iter().enumerate() {
            let Some(op) = file_op_from(f.op) else {
                let message = format!("unknown file operation code {}", f.op);
                return Err(invalid(format!("files[{j}].op"), message));
            };
            files.push(FileImpact {
                path: f.path.into_owned(),
                op,
                confidence: f.confidence,
            });
        }
        let mut relationships = Vec::with_capacity(more.relationships.len());
        for (k, (code, target)) in more.relationships.into_iter().enumerate() {
            let Some(kind) = relationship_from(code) else {
                let message = format!("unknown relationship code {code}");
                return Err(invalid(format!("relationships[{k}].kind"), message));
            };
            relationships.push(Relationship { kind, target });
        }
        let mut validate = Vec::with_capacity(more.validate.len());
        for (k, check) in more.validate.into_iter().enumerate() {
            let Some(level) = check_level_from(check.level) else {
                let message = format!("unknown check level code {}", check.level);
                return Err(invalid(format!("validate[{k}].level"), message));
            };
            validate.push(check.into_check(level));
        }
        let task = Task {
            queue: more
                .queue
                .map_or_else(|| task_type.clone(), Cow::into_owned),
            id,
            task_type: task_type.clone(),
            input: self.input.into_owned(),
            files,
            timeout: more.timeout,
            on_failure,
            fallback: more.fallback,
            is_fallback_only: more.is_fallback_only,
            not_run: more.not_run.map(|n| match n {
                EncodedNotRun::SupersededBy(by) => NotRun::SupersededBy(by),
                EncodedNotRun::DuplicateOf(of) => NotRun::DuplicateOf(of),
            }),
            subtask_of: more.subtask_of,
            tests: more.tests.into_owned(),
            relationships,
            condition: more.condition.map(|c| Condition {
                router: c.router,
                pointer: c.pointer.into_owned(),
                case: match c.case {
                    EncodedRouteCase::Case(key) => RouteCase::Case(key.into_owned()),
                    EncodedRouteCase::Default(keys) => {
                        RouteCase::Default(keys.into_iter().map(Cow::into_owned).collect())
                    }
                },
            }),
            validate,
        };
        Ok((task, self.deps.into_owned(), more.conflicts.into_owned()))
    }
}

impl<'a> EncodedCheck<'a> {
    fn of(check: &'a Check) -> Self {
        EncodedCheck {
            name: Cow::Borrowed(&check.name),
            level: check_level_code(check.level),
            probe: match &check.probe {
                Probe::Command(argv) => {
                    EncodedProbe::Command(argv.iter().map(|a| Cow::Borrowed(a.as_str())).collect())
                }
                Probe::Http {
                    method,
                    url,
                    status,
                    body_contains,
                } => EncodedProbe::Http(
                    Cow::Borrowed(method),
                    Cow::Borrowed(url),
                    *status,
                    body_contains.as_deref().map(Cow::Borrowed),
                ),
            },
            timeout: check.timeout,
        }
    }

    fn into_check(self, level: CheckLevel) -> Check {
        Check {
            name: self.name.into_owned(),
            level,
            probe: match self.probe {
                EncodedProbe::Command(argv) => {
                    Probe::Command(argv.into_iter().map(Cow::into_owned).collect())
                }
                EncodedProbe::Http(method, url, status, body_contains) => Probe::Http {
                    method: method.into_owned(),
                    url: url.into_owned(),
                    status,
                    body_contains: body_contains.map(Cow::into_owned),
                },
            },
            timeout: self.timeout,
        }
    }
}

fn check_level_code(level: CheckLevel) -> u8 {
    match level {
        CheckLevel::Codebase => 0,
        CheckLevel::Api => 1,
        CheckLevel::Ui => 2,
    }
}

fn check_level_from(code: u8) -> Option<CheckLevel> {
    match code {
        0 => Some(CheckLevel::Codebase),
        1 => Some(CheckLevel::Api),
        2 => Some(CheckLevel::Ui),
        _ => None,
    }
}

/// Returns list `i` of a per-task list. A compiled plan has one per task; a plan built by hand
/// with fewer is encoded as if the missing ones were empty, rather than panicking.
fn list(lists: &[Vec<TaskIdx>], i: usize) -> &[TaskIdx] {
    lists.get(i).map_or(&[], Vec::as_slice)
}

fn action_of(action: &FailureAction) -> EncodedAction {
    match action {
        FailureAction::Retry { max, backoff } => EncodedAction::Retry(
            *max,
            EncodedBackoff {
                kind: backoff_kind_code(backoff.kind),
                base: backoff.base,
                cap: backoff.cap,
                jitter_pct: backoff.jitter_pct,
            },
        ),
        FailureAction::Reassign => EncodedAction::Reassign,
        FailureAction::Skip => EncodedAction::Skip,
        FailureAction::Pause => EncodedAction::Pause,
        FailureAction::Abort => EncodedAction::Abort,
        FailureAction::Fallback { task } => EncodedAction::Fallback(if *task == OWN_FALLBACK {
            u64::MAX
        } else {
            *task as u64
        }),
    }
}

/// Returns the action; an error names `field` (a plan-wide one, which a task's caller renames).
fn action_from(action: EncodedAction, field: &str) -> Result<FailureAction, PlanDecodeError> {
    Ok(match action {
        EncodedAction::Retry(max, b) => FailureAction::Retry {
            max,
            backoff: Backoff {
                kind: backoff_kind_from(b.kind).ok_or_else(|| PlanDecodeError::InvalidPlan {
                    field: format!("{field}.retry.backoff.kind"),
                    message: format!("unknown backoff kind code {}", b.kind),
                })?,
                base: b.base,
                cap: b.cap,
                jitter_pct: b.jitter_pct,
            },
        },
        EncodedAction::Reassign => FailureAction::Reassign,
        EncodedAction::Skip => FailureAction::Skip,
        EncodedAction::Pause => FailureAction::Pause,
        EncodedAction::Abort => FailureAction::Abort,
        // `u64::MAX` is `OWN_FALLBACK`; so is, on a 32-bit platform, any index past `usize`,
        // which `verify` refuses in a task's chain like any index out of range.
        EncodedAction::Fallback(task) => FailureAction::Fallback {
            task: usize::try_from(task).unwrap_or(OWN_FALLBACK),
        },
    })
}

fn file_op_code(op: FileOp) -> u8 {
    match op {
        FileOp::Create => 0,
        FileOp::Update => 1,
        FileOp::Delete => 2,
        FileOp::Read => 3,
    }
}

fn file_op_from(code: u8) -> Option<FileOp> {
    Some(match code {
        0 => FileOp::Create,
        1 => FileOp::Update,
        2 => FileOp::Delete,
        3 => FileOp::Read,
        _ => return None,
    })
}

fn relationship_code(kind: RelationshipKind) -> u8 {
    match kind {
        RelationshipKind::DependsOn => 0,
        RelationshipKind::Blocks => 1,
        RelationshipKind::ConflictsWith => 2,
        RelationshipKind::Supersedes => 3,
        RelationshipKind::DuplicateOf => 4,
        RelationshipKind::SubtaskOf => 5,
        RelationshipKind::Tests => 6,
        RelationshipKind::RelatedTo => 7,
        RelationshipKind::Implements => 8,
        RelationshipKind::Enables => 9,
        RelationshipKind::InspiredBy => 10,
    }
}

fn relationship_from(code: u8) -> Option<RelationshipKind> {
    Some(match code {
        0 => RelationshipKind::DependsOn,
        1 => RelationshipKind::Blocks,
        2 => RelationshipKind::ConflictsWith,
        3 => RelationshipKind::Supersedes,
        4 => RelationshipKind::DuplicateOf,
        5 => RelationshipKind::SubtaskOf,
        6 => RelationshipKind::Tests,
        7 => RelationshipKind::RelatedTo,
        8 => RelationshipKind::Implements,
        9 => RelationshipKind::Enables,
        10 => RelationshipKind::InspiredBy,
        _ => return None,
    })
}

fn backoff_kind_code(kind: BackoffKind) -> u8 {
    match kind {
        BackoffKind::Constant => 0,
        BackoffKind::Linear => 1,
        BackoffKind::Exponential => 2,
    }
}

fn backoff_kind_from(code: u8) -> Option<BackoffKind> {
    Some(match code {
        0 => BackoffKind::Constant,
        1 => BackoffKind::Linear,
        2 => BackoffKind::Exponential,
        _ => return None,
    })
}

fn budget_action_code(action: BudgetAction) -> u8 {
    match action {
        BudgetAction::Pause => 0,
        BudgetAction::Fail => 1,
    }
}

fn budget_action_from(code: u8) -> Result<BudgetAction, PlanDecodeError> {
    match code {
        0 => Ok(BudgetAction::Pause),
        1 => Ok(BudgetAction::Fail),
        _ => Err(PlanDecodeError::InvalidPlan {
            field: "options.budget.on_exhausted".to_owned(),
            message: format!("unknown budget action code {code}"),
        }),
    }
}
