//! Plans on the wire: compiled plans, their analyses and validation errors.
//!
//! A wire [`v1::Plan`] is a compiled plan with every default made explicit (durations in
//! milliseconds, queues resolved, each task's escalation chain written out when it differs from
//! the plan policy's). Nothing on the wire is trusted, so a received plan is never used as is:
//! [`from_proto`] turns it back into a flat [`PlanSpec`], which the receiver compiles (and so
//! validates) like any spec. [`to_proto`] and [`from_proto`] round-trip: compiling the
//! spec of the wire form of a plan gives that plan again.

use trellis_core::analysis::{Analysis, ConflictReason};
use trellis_core::plan::spec::{
    ActionSpec, BackoffKindSpec, BackoffSpec, BudgetActionSpec, BudgetSpec, CheckSpec, CommandSpec,
    FailureSpec, FileOpSpec, FileSpec, HttpCheckSpec, JitterSpec, OptionsSpec, PlanSpec,
    RelationshipSpec, RetrySpec, RouteSpec, TaskSpec,
};
use trellis_core::plan::{
    BudgetAction, FileOp, Limits, Plan, PlanError, PlanErrorKind, PlanErrors, Probe,
    RelationshipKind, RouteCase, compile, compile_with_params, escape_references,
    parse_param_values, parse_spec,
};
use trellis_core::policy::{Backoff, BackoffKind, FailureAction};
use trellis_proto::v1;

use crate::common::{check_from_proto, check_to_proto, json_to_bytes};
use crate::error::{At, ConvertError, ConvertErrorKind, parse_enum, parse_json};

// ------------------------------------------------------------------------------------------------
// Core to wire
// ------------------------------------------------------------------------------------------------

/// Returns the wire form of a compiled plan.
pub fn to_proto(plan: &Plan) -> v1::Plan {
    let options = &plan.options;
    let failure = &options.failure;
    let mut routes = routes_to_proto(plan);
    v1::Plan {
        name: plan.name.clone(),
        options: Some(v1::PlanOptions {
            max_concurrency: options.max_concurrency,
            global_timeout_ms: options.global_timeout.map(millis),
            pause_on_human_review: options.pause_on_human_review,
            failure: Some(v1::FailurePolicy {
                default_action: Some(action_to_proto(plan, &failure.default_action)),
                continue_on_partial_failure: failure.continue_on_partial_failure,
                task_type_overrides: failure
                    .task_type_overrides
                    .iter()
                    .map(|(task_type, action)| v1::TaskTypeOverride {
                        task_type: task_type.clone(),
                        action: Some(action_to_proto(plan, action)),
                    })
                    .collect(),
            }),
            min_conflict_confidence: options.min_conflict_confidence,
            budget: Some(v1::Budget {
                max_tokens: options.budget.max_tokens,
                max_cost: options.budget.max_cost,
                on_exhausted: match options.budget.on_exhausted {
                    BudgetAction::Pause => v1::BudgetAction::Pause,
                    BudgetAction::Fail => v1::BudgetAction::Fail,
                }
                .into(),
            }),
        }),
        tasks: plan
            .tasks
            .iter()
            .enumerate()
            .map(|(t, task)| {
                let chain = &task.on_failure;
                let own_chain = *chain != failure.chain_for(&task.task_type);
                v1::Task {
                    id: task.id.clone(),
                    task_type: task.task_type.clone(),
                    queue: task.queue.clone(),
                    input: json_to_bytes(&task.input),
                    depends_on: plan.deps[t]
                        .iter()
                        .map(|&d| plan.tasks[d].id.clone())
                        .collect(),
                    files: task
                        .files
                        .iter()
                        .map(|file| v1::FileImpact {
                            path: file.path.clone(),
                            op: file_op_to_proto(file.op).into(),
                            confidence: file.confidence,
                        })
                        .collect(),
                    timeout_ms: task.timeout.map(millis),
                    fallback: task.fallback.map(|f| plan.tasks[f].id.clone()),
                    on_failure: if own_chain {
                        chain
                            .steps
                            .iter()
                            .map(|action| action_to_proto(plan, action))
                            .collect()
                    } else {
                        Vec::new()
                    },
                    relationships: task
                        .relationships
                        .iter()
                        .map(|r| v1::Relationship {
                            kind: relationship_to_proto(r.kind).into(),
                            target: plan.tasks[r.target].id.clone(),
                        })
                        .collect(),
                    route: routes.remove(&t),
                    validate: task.validate.iter().map(check_to_proto).collect(),
                }
            })
            .collect(),
    }
}

/// Rebuilds each router's route from the conditions of the tasks it picks.
fn routes_to_proto(plan: &Plan) -> std::collections::HashMap<usize, v1::Route> {
    let mut routes: std::collections::HashMap<usize, v1::Route> = Default::default();
    for task in &plan.tasks {
        let Some(condition) = &task.condition else {
            continue;
        };
        let route = routes.entry(condition.router).or_insert_with(|| v1::Route {
            path: condition.pointer.clone(),
            ..v1::Route::default()
        });
        match &condition.case {
            RouteCase::Case(key) => route
                .cases
                .entry(key.clone())
                .or_default()
                .task_ids
                .push(task.id.clone()),
            RouteCase::Default(keys) => {
                route.default.push(task.id.clone());
                // A case no task is picked by still keeps the default from running.
                for key in keys {
                    route.cases.entry(key.clone()).or_default();
                }
            }
        }
    }
    routes
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn action_to_proto(plan: &Plan, action: &FailureAction) -> v1::FailureAction {
    use v1::failure_action::Action;
    let action = match action {
        FailureAction::Retry { max, backoff } => Action::Retry(v1::RetryAction {
            max_retries: *max,
            backoff: Some(backoff_to_proto(backoff)),
        }),
        FailureAction::Reassign => Action::Reassign(v1::ReassignAction {}),
        FailureAction::Skip => Action::Skip(v1::SkipAction {}),
        FailureAction::Pause => Action::Pause(v1::PauseAction {}),
        FailureAction::Abort => Action::Abort(v1::AbortAction {}),
        FailureAction::Fallback { task } => Action::Fallback(v1::FallbackAction {
            task_id: plan.tasks[*task].id.clone(),
        }),
    };
    v1::FailureAction {
        action: Some(action),
    }
}

fn backoff_to_proto(backoff: &Backoff) -> v1::Backoff {
    v1::Backoff {
        kind: match backoff.kind {
            BackoffKind::Constant => v1::BackoffKind::Constant,
            BackoffKind::Linear => v1::BackoffKind::Linear,
            BackoffKind::Exponential => v1::BackoffKind::Exponential,
        }
        .into(),
        base_ms: millis(backoff.base),
        cap_ms: millis(backoff.cap),
        jitter_percent: u32::from(backoff.jitter_pct),
    }
}

/// Returns the wire value of a file operation.
pub fn file_op_to_proto(op: FileOp) -> v1::FileOp {
    match op {
        FileOp::Create => v1::FileOp::Create,
        FileOp::Update => v1::FileOp::Update,
        FileOp::Delete => v1::FileOp::Delete,
        FileOp::Read => v1::FileOp::Read,
    }
}

fn relationship_to_proto(kind: RelationshipKind) -> v1::RelationshipKind {
    use v1::RelationshipKind as K;
    match kind {
        RelationshipKind::DependsOn => K::DependsOn,
        RelationshipKind::Blocks => K::Blocks,
        RelationshipKind::ConflictsWith => K::ConflictsWith,
        RelationshipKind::Supersedes => K::Supersedes,
        RelationshipKind::DuplicateOf => K::DuplicateOf,
        RelationshipKind::SubtaskOf => K::SubtaskOf,
        RelationshipKind::Tests => K::Tests,
        RelationshipKind::RelatedTo => K::RelatedTo,
        RelationshipKind::Implements => K::Implements,
        RelationshipKind::Enables => K::Enables,
        RelationshipKind::InspiredBy => K::InspiredBy,
    }
}

/// Returns the wire form of every validation error of a plan.
pub fn errors_to_proto(errors: &PlanErrors) -> v1::PlanValidationErrors {
    v1::PlanValidationErrors {
        errors: errors
            .iter()
            .map(|error| v1::PlanValidationError {
                path: error.path.clone(),
                message: error.message.clone(),
                hint: error.hint.clone().unwrap_or_default(),
                line: error
                    .location
                    .map_or(0, |l| u32::try_from(l.line).unwrap_or(u32::MAX)),
                column: error
                    .location
                    .map_or(0, |l| u32::try_from(l.column).unwrap_or(u32::MAX)),
            })
            .collect(),
    }
}

/// Returns the wire form of the analysis of `plan`.
pub fn analysis_to_proto(plan: &Plan, analysis: &Analysis) -> v1::PlanAnalysis {
    let id = |t: usize| plan.tasks[t].id.clone();
    let ids = |tasks: &[usize]| tasks.iter().map(|&t| id(t)).collect::<Vec<_>>();
    v1::PlanAnalysis {
        waves: analysis
            .waves
            .iter()
            .enumerate()
            .map(|(w, wave)| v1::Wave {
                number: u32::try_from(w + 1).unwrap_or(u32::MAX),
                task_ids: ids(wave),
            })
            .collect(),
        conflicts: analysis
            .conflict_pairs
            .iter()
            .map(|pair| {
                let reasons: Vec<v1::ConflictReason> = pair
                    .reasons
                    .iter()
                    .map(|reason| v1::ConflictReason {
                        reason: Some(match reason {
                            ConflictReason::File { path, op_a, op_b } => {
                                v1::conflict_reason::Reason::File(v1::FileConflict {
                                    path: path.clone(),
                                    first_op: file_op_to_proto(*op_a).into(),
                                    second_op: file_op_to_proto(*op_b).into(),
                                })
                            }
                            ConflictReason::Declared => {
                                let a = &plan.tasks[pair.a];
                                let declared_by = if a.relationships.iter().any(|r| {
                                    r.kind == RelationshipKind::ConflictsWith && r.target == pair.b
                                }) {
                                    pair.a
                                } else {
                                    pair.b
                                };
                                v1::conflict_reason::Reason::Declared(v1::DeclaredConflict {
                                    declared_by: id(declared_by),
                                })
                            }
                        }),
                    })
                    .collect();
                v1::ConflictPair {
                    first_task_id: id(pair.a),
                    second_task_id: id(pair.b),
                    reason: reasons.first().cloned(),
                    reasons,
                }
            })
            .collect(),
        critical_path: ids(&analysis.critical_path.tasks),
        max_parallelism: u32::try_from(analysis.max_parallelism.without_conflicts)
            .unwrap_or(u32::MAX),
        blocked: analysis
            .blocked
            .iter()
            .map(|b| v1::BlockedTask {
                task_id: id(b.task),
                blocked_by: ids(&b.by),
                wave: analysis.wave_of[b.task]
                    .map_or(0, |w| u32::try_from(w + 1).unwrap_or(u32::MAX)),
            })
            .collect(),
        fallback_only: ids(&analysis.fallback_only),
        subtasks: ids(&analysis.subtasks),
        widest_wave: u32::try_from(analysis.max_parallelism.widest_wave).unwrap_or(u32::MAX),
    }
}

// ------------------------------------------------------------------------------------------------
// Wire to core
// ------------------------------------------------------------------------------------------------

/// Returns the flat spec a wire plan describes, for the receiver to compile (and so validate).
///
/// # Errors
///
/// A [`ConvertError`] naming the field for what a spec cannot express: a missing `oneof`, an
/// unknown enum value, input that is not JSON.
pub fn from_proto(plan: &v1::Plan) -> Result<PlanSpec, ConvertError> {
    let at = At::root("plan");
    let options = match &plan.options {
        None => OptionsSpec::default(),
        Some(options) => options_from_proto(&at.field("options"), options)?,
    };
    let tasks_at = at.field("tasks");
    let tasks = plan
        .tasks
        .iter()
        .enumerate()
        .map(|(i, task)| task_from_proto(&tasks_at.index(i), task))
        .collect::<Result<_, _>>()?;
    Ok(PlanSpec {
        name: plan.name.clone(),
        options,
        tasks,
        ..PlanSpec::default()
    })
}

fn duration_text(ms: u64) -> String {
    format!("{ms}ms")
}

fn options_from_proto(at: &At<'_>, options: &v1::PlanOptions) -> Result<OptionsSpec, ConvertError> {
    let failure = match &options.failure {
        None => None,
        Some(failure) => {
            let at = at.field("failure");
            let overrides_at = at.field("task_type_overrides");
            let mut overrides = std::collections::BTreeMap::new();
            for (i, o) in failure.task_type_overrides.iter().enumerate() {
                let at = overrides_at.index(i);
                let action = o
                    .action
                    .as_ref()
                    .ok_or_else(|| at.field("action").missing())?;
                overrides.insert(
                    o.task_type.clone(),
                    action_from_proto(&at.field("action"), action)?,
                );
            }
            Some(FailureSpec {
                default_action: failure
                    .default_action
                    .as_ref()
                    .map(|a| action_from_proto(&at.field("default_action"), a))
                    .transpose()?,
                // Every wire `retry` carries its count and backoff, so no default is needed.
                max_retries: None,
                backoff: None,
                continue_on_partial_failure: Some(failure.continue_on_partial_failure),
                overrides,
            })
        }
    };
    let budget = match &options.budget {
        None => None,
        Some(budget) => Some(BudgetSpec {
            max_tokens: budget.max_tokens,
            max_cost: budget.max_cost,
            on_exhausted: match parse_enum::<v1::BudgetAction>(
                &at.field("budget").field("on_exhausted"),
                budget.on_exhausted,
            )? {
                v1::BudgetAction::Unspecified => None,
                v1::BudgetAction::Pause => Some(BudgetActionSpec::Pause),
                v1::BudgetAction::Fail => Some(BudgetActionSpec::Fail),
            },
        }),
    };
    Ok(OptionsSpec {
        max_concurrency: options.max_concurrency,
        global_timeout: options.global_timeout_ms.map(duration_text),
        pause_on_human_review: Some(options.pause_on_human_review),
        failure,
        budget,
        min_conflict_confidence: (options.min_conflict_confidence != 0.0)
            .then_some(options.min_conflict_confidence),
    })
}

fn action_from_proto(at: &At<'_>, action: &v1::FailureAction) -> Result<ActionSpec, ConvertError> {
    use v1::failure_action::Action;
    Ok(
        match action
            .action
            .as_ref()
            .ok_or_else(|| at.field("action").missing())?
        {
            Action::Retry(retry) => ActionSpec::Retry(RetrySpec {
                max: Some(retry.max_retries),
                backoff: retry
                    .backoff
                    .as_ref()
                    .map(|b| backoff_from_proto(&at.field("retry").field("backoff"), b))
                    .transpose()?,
            }),
            Action::Reassign(_) => ActionSpec::Reassign,
            Action::Skip(_) => ActionSpec::Skip,
            Action::Pause(_) => ActionSpec::Pause,
            Action::Abort(_) => ActionSpec::Abort,
            Action::Fallback(fallback) => ActionSpec::Fallback(if fallback.task_id.is_empty() {
                None
            } else {
                Some(fallback.task_id.clone())
            }),
        },
    )
}

fn backoff_from_proto(at: &At<'_>, backoff: &v1::Backoff) -> Result<BackoffSpec, ConvertError> {
    Ok(BackoffSpec {
        kind: match parse_enum::<v1::BackoffKind>(&at.field("kind"), backoff.kind)? {
            v1::BackoffKind::Unspecified => None,
            v1::BackoffKind::Constant => Some(BackoffKindSpec::Constant),
            v1::BackoffKind::Linear => Some(BackoffKindSpec::Linear),
            v1::BackoffKind::Exponential => Some(BackoffKindSpec::Exponential),
        },
        base: Some(duration_text(backoff.base_ms)),
        cap: Some(duration_text(backoff.cap_ms)),
        jitter: Some(JitterSpec::Percent(format!("{}%", backoff.jitter_percent))),
    })
}

fn task_from_proto(at: &At<'_>, task: &v1::Task) -> Result<TaskSpec, ConvertError> {
    let files_at = at.field("files");
    let files = task
        .files
        .iter()
        .enumerate()
        .map(|(i, file)| {
            let at = files_at.index(i);
            Ok(FileSpec {
                path: file.path.clone(),
                op: match parse_enum::<v1::FileOp>(&at.field("op"), file.op)? {
                    v1::FileOp::Unspecified => {
                        return Err(at.field("op").error(ConvertErrorKind::Unspecified));
                    }
                    v1::FileOp::Create => FileOpSpec::Create,
                    v1::FileOp::Update => FileOpSpec::Update,
                    v1::FileOp::Delete => FileOpSpec::Delete,
                    v1::FileOp::Read => FileOpSpec::Read,
                },
                confidence: Some(file.confidence),
            })
        })
        .collect::<Result<_, _>>()?;
    let on_failure_at = at.field("on_failure");
    let on_failure: Vec<ActionSpec> = task
        .on_failure
        .iter()
        .enumerate()
        .map(|(i, action)| action_from_proto(&on_failure_at.index(i), action))
        .collect::<Result<_, _>>()?;
    let relationships_at = at.field("relationships");
    let relationships = task
        .relationships
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let at = relationships_at.index(i);
            let at = at.field("kind");
            Ok(RelationshipSpec {
                kind: relationship_from_proto(&at, r.kind)?,
                target: r.target.clone(),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(TaskSpec {
        id: task.id.clone(),
        task_type: task.task_type.clone(),
        queue: (!task.queue.is_empty()).then(|| task.queue.clone()),
        input: if task.input.is_empty() {
            serde_json::Value::Object(serde_json::Map::new())
        } else {
            parse_json(&at.field("input"), &task.input)?
        },
        files,
        depends_on: task.depends_on.clone(),
        timeout: task.timeout_ms.map(duration_text),
        fallback: task.fallback.clone(),
        on_failure: (!on_failure.is_empty()).then_some(on_failure),
        relationships,
        route: task.route.as_ref().map(|route| RouteSpec {
            path: (!route.path.is_empty()).then(|| route.path.clone()),
            cases: route
                .cases
                .iter()
                .map(|(key, targets)| (key.clone(), targets.task_ids.clone()))
                .collect(),
            default: route.default.clone(),
        }),
        validate: task
            .validate
            .iter()
            .enumerate()
            .map(|(i, check)| check_spec_from_proto(&at.field("validate").index(i), check))
            .collect::<Result<_, _>>()?,
        ..TaskSpec::default()
    })
}

/// Returns the `validate:` entry a wire check stands for (checked as a worker checks it; the
/// compiler then checks it again as any spec).
fn check_spec_from_proto(at: &At<'_>, check: &v1::Check) -> Result<CheckSpec, ConvertError> {
    let check = check_from_proto(at, check)?;
    let (command, http) = match check.probe {
        Probe::Command(argv) => (Some(CommandSpec::Argv(argv)), None),
        Probe::Http {
            method,
            url,
            status,
            body_contains,
        } => (
            None,
            Some(HttpCheckSpec {
                url,
                method: Some(method),
                status: Some(i64::from(status)),
                body_contains,
            }),
        ),
    };
    Ok(CheckSpec {
        name: check.name,
        level: check.level,
        command,
        http,
        timeout: Some(duration_text(
            u64::try_from(check.timeout.as_millis()).unwrap_or(u64::MAX),
        )),
    })
}

fn relationship_from_proto(at: &At<'_>, kind: i32) -> Result<RelationshipKind, ConvertError> {
    use v1::RelationshipKind as K;
    Ok(match parse_enum::<K>(at, kind)? {
        K::Unspecified => return Err(at.error(ConvertErrorKind::Unspecified)),
        K::DependsOn => RelationshipKind::DependsOn,
        K::Blocks => RelationshipKind::Blocks,
        K::ConflictsWith => RelationshipKind::ConflictsWith,
        K::Supersedes => RelationshipKind::Supersedes,
        K::DuplicateOf => RelationshipKind::DuplicateOf,
        K::SubtaskOf => RelationshipKind::SubtaskOf,
        K::Tests => RelationshipKind::Tests,
        K::RelatedTo => RelationshipKind::RelatedTo,
        K::Implements => RelationshipKind::Implements,
        K::Enables => RelationshipKind::Enables,
        K::InspiredBy => RelationshipKind::InspiredBy,
    })
}

// ------------------------------------------------------------------------------------------------
// Compiling what arrives
// ------------------------------------------------------------------------------------------------

/// Compiles a wire spec: its text with its `params` values (each a JSON text, or a plain string).
///
/// # Errors
///
/// Every problem of the plan, each with its path.
pub fn compile_wire_spec(spec: &v1::PlanSpec, limits: &Limits) -> Result<Plan, PlanErrors> {
    let parsed = parse_spec(&spec.text, limits)?;
    if spec.params.is_empty() {
        return compile(parsed, limits);
    }
    let pairs: Vec<(String, String)> = spec
        .params
        .iter()
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let values = parse_param_values(&pairs)?;
    compile_with_params(parsed, &values, limits)
}

/// Compiles a wire plan: its flat spec (see [`from_proto`]), validated like any spec; a plan
/// the spec cannot express is reported as one error naming the field.
///
/// # Errors
///
/// Every problem of the plan, each with its path.
pub fn compile_wire_plan(plan: &v1::Plan, limits: &Limits) -> Result<Plan, PlanErrors> {
    compile(flat_spec_from_proto(plan)?, limits)
}

/// The spec of a wire plan, with every literal `${` escaped so that compiling it (which expands
/// references) keeps the plan's strings as they are.
fn flat_spec_from_proto(plan: &v1::Plan) -> Result<PlanSpec, PlanErrors> {
    let spec = from_proto(plan).map_err(|e| {
        PlanErrors::one(PlanError::new(
            PlanErrorKind::InvalidValue,
            e.path().to_owned(),
            e.kind().to_string(),
        ))
    })?;
    escape_references(spec)
}

/// Returns the canonical JSON spec of a compiled plan: flat (no params, templates or generators
/// left), every default explicit. Compiling it gives the same plan, so it is what an event log
/// records for a plan that did not arrive as plain spec text.
pub fn canonical_spec_json(plan: &Plan) -> String {
    match flat_spec_from_proto(&to_proto(plan)) {
        // A `PlanSpec` always serializes: its maps have string keys and its numbers are finite
        // (confidences and costs passed the compiler's range checks).
        Ok(spec) => serde_json::to_string(&spec).unwrap_or_default(),
        // The wire form of a compiled plan uses only values the contract defines.
        Err(_) => String::new(),
    }
}
