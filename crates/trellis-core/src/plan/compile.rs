//! The plan compiler: text → [`PlanSpec`] → validated [`Plan`].
//!
//! Parsing stops at the first syntax or type error (that is all a parser can do), but once the spec
//! is well-formed the compiler checks everything and reports every problem it finds, each with the
//! path of the offending value (`tasks[3].depends_on[0]: unknown task "api"`).
//!
//! Every pass is linear in the size of the plan (plus the number of conflict pairs, which is the
//! size of the output): ids go through a hash index, cycles are found with Kahn's algorithm and an
//! iterative walk, file conflicts through a path index. Nothing recurses, so a 100,000-task chain
//! compiles like any other plan.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use super::spec::{
    ActionSpec, BackoffKindSpec, BackoffSpec, BudgetActionSpec, FileOpSpec, JitterSpec, PlanSpec,
    TaskSpec,
};
use super::{
    Budget, BudgetAction, Condition, FileImpact, FileOp, NotRun, Plan, PlanOptions, Relationship,
    RelationshipKind, RouteCase, Task, TaskIdx,
};
use crate::policy::{Backoff, BackoffKind, EscalationChain, FailureAction, FailurePolicy};

/// The task index held by a plan-wide `fallback` action (`options.failure`) that stands for "the
/// failing task's own `fallback`". Compiled tasks never hold it: their `on_failure` chains carry
/// the resolved index.
pub const OWN_FALLBACK: usize = usize::MAX;

/// Size limits applied while parsing and compiling, so a hostile or mistaken input is rejected
/// quickly and with a clear message instead of exhausting memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted input, checked before parsing.
    pub max_input_bytes: usize,
    pub max_tasks: usize,
    pub max_id_len: usize,
    /// Most `depends_on` entries one task may declare.
    pub max_depends_on: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_input_bytes: 64 * 1024 * 1024,
            max_tasks: 200_000,
            max_id_len: 128,
            max_depends_on: 10_000,
        }
    }
}

/// What kind of problem a [`PlanError`] reports, for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanErrorKind {
    /// The input is over [`Limits`].
    TooLarge,
    /// The input is not UTF-8 text.
    Encoding,
    /// The input is empty.
    Empty,
    /// The text is not a well-formed spec: YAML/JSON syntax, a wrong type, an unknown or missing
    /// field.
    Parse,
    /// A task id is empty, too long or uses characters outside `[A-Za-z0-9_.-]`.
    InvalidId,
    DuplicateId,
    /// A reference names no task of the plan.
    UnknownTask,
    /// A task depends on, falls back to or relates to itself.
    SelfReference,
    /// Dependencies (or subtask parents) form a cycle.
    Cycle,
    /// A value is out of range or malformed (durations, counts, confidence, jitter, ...).
    InvalidValue,
    /// A `${...}` reference or a `use:` names no declared param, template or item field, or a
    /// value was given for a param the plan does not declare.
    UnknownReference,
    /// A required param (one without a default) was given no value.
    MissingParam,
    /// Declarations contradict each other (a subtask with dependencies, a task superseded twice,
    /// a `fallback` action with nothing to fall back to, ...).
    Contradiction,
}

/// A position in the input text, 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Location {
    pub line: usize,
    pub column: usize,
}

/// One problem found in a plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanError {
    pub kind: PlanErrorKind,
    /// Where in the spec, like `tasks[3].depends_on[0]`; empty for the whole input.
    pub path: String,
    /// What is wrong, lowercase, without trailing period.
    pub message: String,
    /// Where in the text, when the parser knows.
    pub location: Option<Location>,
    /// How to fix it, when there is something better to say than the message (`did you mean
    /// "schema"?`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl PlanError {
    /// Returns an error of `kind` at `path`, with no location or hint.
    pub fn new(kind: PlanErrorKind, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            path: path.into(),
            message: message.into(),
            location: None,
            hint: None,
        }
    }

    /// Adds a hint on how to fix the problem.
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.path.is_empty(), self.location) {
            (false, Some(at)) => write!(
                f,
                "{}: {} (line {}, column {})",
                self.path, self.message, at.line, at.column
            ),
            (false, None) => write!(f, "{}: {}", self.path, self.message),
            (true, Some(at)) => write!(
                f,
                "line {}, column {}: {}",
                at.line, at.column, self.message
            ),
            (true, None) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PlanError {}

/// All the problems found in a plan (never empty), in the order they were found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanErrors(Vec<PlanError>);

impl PlanErrors {
    /// Returns a list of exactly this error.
    pub fn one(error: PlanError) -> Self {
        Self(vec![error])
    }

    /// Wraps errors found elsewhere in the module; `errors` is never empty.
    pub(crate) fn from_vec(errors: Vec<PlanError>) -> Self {
        Self(errors)
    }

    /// Returns the errors.
    pub fn errors(&self) -> &[PlanError] {
        &self.0
    }

    /// Returns the errors, owned.
    pub fn into_vec(self) -> Vec<PlanError> {
        self.0
    }

    /// Returns an iterator over the errors.
    pub fn iter(&self) -> std::slice::Iter<'_, PlanError> {
        self.0.iter()
    }

    /// Returns the number of errors (at least one).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Returns false: a `PlanErrors` always holds at least one error.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a PlanErrors {
    type Item = &'a PlanError;
    type IntoIter = std::slice::Iter<'a, PlanError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Display for PlanErrors {
    /// Writes one error per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PlanErrors {}

/// Parses raw bytes (checks size and UTF-8 first, skips a byte-order mark) into a spec.
pub fn parse_spec_bytes(bytes: &[u8], limits: &Limits) -> Result<PlanSpec, PlanErrors> {
    check_size(bytes.len(), limits)?;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_spec(text, limits),
        Err(e) => {
            let valid = &bytes[..e.valid_up_to()];
            let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
            let column =
                valid.len() - valid.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + 1;
            Err(PlanErrors::one(PlanError {
                location: Some(Location { line, column }),
                ..PlanError::new(
                    PlanErrorKind::Encoding,
                    "",
                    format!(
                        "input is not valid UTF-8 (invalid byte at offset {})",
                        e.valid_up_to()
                    ),
                )
            }))
        }
    }
}

/// Parses a YAML or JSON spec. Input starting with `{` is read as JSON first, so JSON gets JSON's
/// error messages; if it is not JSON it is read as YAML (flow style).
pub fn parse_spec(text: &str, limits: &Limits) -> Result<PlanSpec, PlanErrors> {
    check_size(text.len(), limits)?;
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.is_empty() {
        return Err(PlanErrors::one(PlanError::new(
            PlanErrorKind::Empty,
            "",
            "plan is empty",
        )));
    }
    if trimmed.starts_with('{') {
        let mut de = serde_json::Deserializer::from_str(trimmed);
        let json_error = match serde_path_to_error::deserialize(&mut de) {
            Ok(spec) => match de.end() {
                Ok(()) => return Ok(spec),
                Err(e) => json_error(String::new(), &e),
            },
            Err(e) if e.inner().is_data() => {
                return Err(PlanErrors::one(json_error(e.path().to_string(), e.inner())));
            }
            Err(e) => json_error(e.path().to_string(), e.inner()),
        };
        // Not JSON; YAML flow style also starts with `{`.
        return parse_yaml(trimmed).map_err(|_| PlanErrors::one(json_error));
    }
    parse_yaml(text).map_err(PlanErrors::one)
}

/// Parses and compiles text.
pub fn compile_str(text: &str, limits: &Limits) -> Result<Plan, PlanErrors> {
    compile(parse_spec(text, limits)?, limits)
}

/// Parses and compiles raw bytes (see [`parse_spec_bytes`]).
pub fn compile_bytes(bytes: &[u8], limits: &Limits) -> Result<Plan, PlanErrors> {
    compile(parse_spec_bytes(bytes, limits)?, limits)
}

fn check_size(len: usize, limits: &Limits) -> Result<(), PlanErrors> {
    if len > limits.max_input_bytes {
        return Err(PlanErrors::one(PlanError::new(
            PlanErrorKind::TooLarge,
            "",
            format!(
                "input is {len} bytes, over the limit of {} bytes",
                limits.max_input_bytes
            ),
        )));
    }
    Ok(())
}

fn parse_yaml(text: &str) -> Result<PlanSpec, PlanError> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let location = e.inner().location().map(|l| Location {
            line: l.line(),
            column: l.column(),
        });
        parse_error(e.path().to_string(), e.inner().to_string(), location)
    })
}

fn json_error(path: String, inner: &serde_json::Error) -> PlanError {
    let location = (inner.line() > 0).then(|| Location {
        line: inner.line(),
        column: inner.column(),
    });
    parse_error(path, inner.to_string(), location)
}

/// Builds a parse error, removing from the parser's message the path and location it repeats.
fn parse_error(path: String, mut message: String, location: Option<Location>) -> PlanError {
    if let Some(at) = location {
        let suffix = format!(" at line {} column {}", at.line, at.column);
        if message.ends_with(&suffix) {
            message.truncate(message.len() - suffix.len());
        }
    }
    // `?` marks a position the parser could not name (a syntax error inside a value).
    let mut path = path;
    while let Some(rest) = path.strip_suffix('?') {
        path = rest.strip_suffix('.').unwrap_or(rest).to_owned();
    }
    let path = if path == "." { String::new() } else { path };
    // serde_yaml_ng starts its messages with its own path, which may stop short of ours (for an
    // unknown field it names the map, we name the field).
    if let Some((prefix, rest)) = message.split_once(": ")
        && !prefix.is_empty()
        && path.starts_with(prefix)
    {
        message = rest.to_owned();
    }
    let hint = super::suggest::unknown_name_hint(&message);
    PlanError {
        location,
        hint,
        ..PlanError::new(PlanErrorKind::Parse, path, message)
    }
}

/// Where an edge of the dependency graph was declared, to point errors at it.
#[derive(Clone, Copy, Debug)]
struct Origin {
    task: TaskIdx,
    field: OriginField,
}

#[derive(Clone, Copy, Debug)]
enum OriginField {
    DependsOn,
    Relationship(usize),
    Route,
}

impl Origin {
    fn path(self) -> String {
        match self.field {
            OriginField::DependsOn => format!("tasks[{}].depends_on", self.task),
            OriginField::Relationship(k) => format!("tasks[{}].relationships[{k}]", self.task),
            OriginField::Route => format!("tasks[{}].route", self.task),
        }
    }
}

/// An edge `dependent` waits for `dep`.
#[derive(Clone, Copy, Debug)]
struct Edge {
    dependent: TaskIdx,
    dep: TaskIdx,
    origin: Origin,
}

/// The policy values a `retry` without arguments takes.
struct RetryDefaults {
    max: u32,
    backoff: Backoff,
}

struct Compiler<'a> {
    limits: &'a Limits,
    errors: Vec<PlanError>,
    index: HashMap<String, TaskIdx>,
    /// Task ids in declaration order, the candidates of "did you mean" hints.
    ids: Vec<&'a str>,
    /// Hints still to be given: each costs a pass over the ids, so a plan with thousands of
    /// unknown references gets hints for the first few only.
    hints_left: usize,
}

/// Most "did you mean" hints computed for one plan.
const MAX_HINTS: usize = 100;

impl Compiler<'_> {
    fn error(&mut self, kind: PlanErrorKind, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(PlanError::new(kind, path, message));
    }

    fn error_with_hint(
        &mut self,
        kind: PlanErrorKind,
        path: impl Into<String>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.errors
            .push(PlanError::new(kind, path, message).with_hint(hint));
    }

    fn resolve(&mut self, id: &str, path: impl FnOnce() -> String) -> Option<TaskIdx> {
        let found = self.index.get(id).copied();
        if found.is_none() {
            let mut error = PlanError::new(
                PlanErrorKind::UnknownTask,
                path(),
                format!("unknown task {id:?}"),
            );
            if self.hints_left > 0 {
                self.hints_left -= 1;
                error.hint = super::suggest::did_you_mean(id, self.ids.iter().copied());
            }
            self.errors.push(error);
        }
        found
    }

    fn duration(&mut self, text: &str, path: impl FnOnce() -> String) -> Option<Duration> {
        match humantime::parse_duration(text.trim()) {
            Ok(d) if d.is_zero() => {
                self.error(
                    PlanErrorKind::InvalidValue,
                    path(),
                    "duration must be greater than zero",
                );
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                let reason = e.to_string().to_lowercase();
                self.error_with_hint(
                    PlanErrorKind::InvalidValue,
                    path(),
                    format!("invalid duration {text:?}: {reason} (use e.g. 500ms, 30s, 5m, 1h)"),
                    "a duration is a number and a unit: ms, s, m, h, d; parts add up (1h 30m)",
                );
                None
            }
        }
    }

    fn backoff(&mut self, spec: &BackoffSpec, base: &Backoff, path: &str) -> Backoff {
        let mut res = base.clone();
        if let Some(kind) = spec.kind {
            res.kind = match kind {
                BackoffKindSpec::Constant => BackoffKind::Constant,
                BackoffKindSpec::Linear => BackoffKind::Linear,
                BackoffKindSpec::Exponential => BackoffKind::Exponential,
            };
        }
        if let Some(text) = &spec.base
            && let Some(d) = self.duration(text, || format!("{path}.base"))
        {
            res.base = d;
        }
        if let Some(text) = &spec.cap
            && let Some(d) = self.duration(text, || format!("{path}.cap"))
        {
            res.cap = d;
        }
        if res.cap < res.base {
            self.error(
                PlanErrorKind::InvalidValue,
                format!("{path}.cap"),
                format!(
                    "cap {} is less than base {}",
                    humantime::format_duration(res.cap),
                    humantime::format_duration(res.base)
                ),
            );
        }
        if let Some(jitter) = &spec.jitter {
            let pct = match jitter {
                JitterSpec::Percent(text) => text
                    .trim()
                    .strip_suffix('%')
                    .and_then(|n| n.trim().parse::<f64>().ok()),
                JitterSpec::Ratio(r) => Some(r * 100.0),
            };
            match pct {
                Some(p) if (0.0..=100.0).contains(&p) => res.jitter_pct = p.round() as u8,
                _ => self.error(
                    PlanErrorKind::InvalidValue,
                    format!("{path}.jitter"),
                    "jitter must be a percentage from 0% to 100% or a ratio from 0 to 1",
                ),
            }
        }
        res
    }

    /// Lowers one action. `own_fallback` is `None` for plan-wide actions (a bare `fallback` then
    /// means [`OWN_FALLBACK`]) and `Some(task's fallback)` for a task's chain.
    fn action(
        &mut self,
        spec: &ActionSpec,
        defaults: &RetryDefaults,
        own_fallback: Option<Option<TaskIdx>>,
        path: &dyn Fn() -> String,
    ) -> Option<FailureAction> {
        Some(match spec {
            ActionSpec::Retry(retry) => FailureAction::Retry {
                max: retry.max.unwrap_or(defaults.max),
                backoff: match &retry.backoff {
                    Some(b) => {
                        self.backoff(b, &defaults.backoff, &format!("{}.retry.backoff", path()))
                    }
                    None => defaults.backoff.clone(),
                },
            },
            ActionSpec::Reassign => FailureAction::Reassign,
            ActionSpec::Skip => FailureAction::Skip,
            ActionSpec::Pause => FailureAction::Pause,
            ActionSpec::Abort => FailureAction::Abort,
            ActionSpec::Fallback(Some(id)) => FailureAction::Fallback {
                task: self.resolve(id, || format!("{}.fallback", path()))?,
            },
            ActionSpec::Fallback(None) => match own_fallback {
                None => FailureAction::Fallback { task: OWN_FALLBACK },
                Some(Some(task)) => FailureAction::Fallback { task },
                Some(None) => {
                    self.error_with_hint(
                        PlanErrorKind::Contradiction,
                        path(),
                        "fallback action without a target, and the task declares no fallback",
                        "name the target ({fallback: task-id}) or give the task `fallback: task-id`",
                    );
                    return None;
                }
            },
        })
    }

    fn check_id(&mut self, i: usize, id: &str) {
        let path = || format!("tasks[{i}].id");
        if id.is_empty() {
            self.error(
                PlanErrorKind::InvalidId,
                path(),
                "task id must not be empty",
            );
        } else if id.len() > self.limits.max_id_len {
            self.error(
                PlanErrorKind::InvalidId,
                path(),
                format!(
                    "task id is {} bytes long, over the limit of {}",
                    id.len(),
                    self.limits.max_id_len
                ),
            );
        } else if let Some(c) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            self.error(
                PlanErrorKind::InvalidId,
                path(),
                format!("task id {id:?} contains {c:?}; ids use only A-Z a-z 0-9 _ . -"),
            );
        }
    }
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
    let (flat, source_map) = super::expand::expand_inner(spec, params, limits)?;
    validate(flat, limits).map_err(|errors| source_map.rewrite(errors))
}

/// Reads `name=value` pairs given on a command line or in a request: each value is parsed as
/// JSON (`3`, `true`, `["api","web"]`, `"quoted"`) and, when it is not JSON, taken as a plain
/// string (so `env=prod` works). A name given twice is an error.
pub fn parse_param_values(
    pairs: &[(String, String)],
) -> Result<BTreeMap<String, serde_json::Value>, PlanErrors> {
    let mut res = BTreeMap::new();
    let mut errors = Vec::new();
    for (name, text) in pairs {
        let value =
            serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.clone()));
        if res.insert(name.clone(), value).is_some() {
            errors.push(PlanError::new(
                PlanErrorKind::InvalidValue,
                format!("params.{name}"),
                format!("param {name:?} is given more than once"),
            ));
        }
    }
    if errors.is_empty() {
        Ok(res)
    } else {
        Err(PlanErrors(errors))
    }
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
        return Err(PlanErrors(c.errors));
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
        return Err(PlanErrors(c.errors));
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
        return Err(PlanErrors(c.errors));
    }
    Ok(Plan {
        name: spec.name,
        options,
        tasks,
        deps,
        dependents,
        conflicts,
        index: c.index,
    })
}

/// Lowers every `route:` into conditions on the routed tasks and edges from the deciding task.
fn compile_routes(
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

fn compile_options(c: &mut Compiler<'_>, spec: &PlanSpec) -> (PlanOptions, RetryDefaults) {
    let o = &spec.options;
    let mut options = PlanOptions::default();
    match o.max_concurrency {
        Some(0) => c.error(
            PlanErrorKind::InvalidValue,
            "options.max_concurrency",
            "must be at least 1 (leave it out for no limit)",
        ),
        v => options.max_concurrency = v,
    }
    if let Some(text) = &o.global_timeout {
        options.global_timeout = c.duration(text, || "options.global_timeout".to_owned());
    }
    if let Some(v) = o.pause_on_human_review {
        options.pause_on_human_review = v;
    }
    if let Some(v) = o.min_conflict_confidence {
        if (0.0..=1.0).contains(&v) {
            options.min_conflict_confidence = v;
        } else {
            c.error_with_hint(
                PlanErrorKind::InvalidValue,
                "options.min_conflict_confidence",
                format!("min_conflict_confidence {v} is outside 0.0–1.0"),
                "0.0 (the default) lets every file estimate count; 1.0 only certain ones",
            );
        }
    }
    let failure = o.failure.clone().unwrap_or_default();
    let mut defaults = RetryDefaults {
        max: failure.max_retries.unwrap_or(3),
        backoff: Backoff::default(),
    };
    if let Some(b) = &failure.backoff {
        defaults.backoff = c.backoff(b, &Backoff::default(), "options.failure.backoff");
    }
    let mut policy = FailurePolicy {
        continue_on_partial_failure: failure.continue_on_partial_failure.unwrap_or(false),
        ..FailurePolicy::default()
    };
    let default_spec = failure
        .default_action
        .clone()
        .unwrap_or(ActionSpec::Retry(Default::default()));
    if let Some(action) = c.action(&default_spec, &defaults, None, &|| {
        "options.failure.default_action".to_owned()
    }) {
        policy.default_action = action;
    }
    for (task_type, spec) in &failure.overrides {
        let path = || format!("options.failure.overrides.{task_type}");
        if let Some(action) = c.action(spec, &defaults, None, &path) {
            policy.task_type_overrides.push((task_type.clone(), action));
        }
    }
    options.failure = policy;
    if let Some(b) = &o.budget {
        if let Some(cost) = b.max_cost
            && !(cost.is_finite() && cost >= 0.0)
        {
            c.error(
                PlanErrorKind::InvalidValue,
                "options.budget.max_cost",
                "must be a finite number, zero or more",
            );
        }
        options.budget = Budget {
            max_tokens: b.max_tokens,
            max_cost: b.max_cost,
            on_exhausted: match b.on_exhausted {
                Some(BudgetActionSpec::Fail) => BudgetAction::Fail,
                Some(BudgetActionSpec::Pause) | None => BudgetAction::Pause,
            },
        };
    }
    (options, defaults)
}

#[allow(clippy::too_many_arguments)] // The compiler's per-task outputs; a struct would only rename them.
fn compile_task(
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

/// Reports `subtask_of` chains that loop (a subtask of b, b a subtask of a); walks are iterative.
fn check_subtask_cycles(
    c: &mut Compiler<'_>,
    tasks: &[Task],
    subtask_of: &[Option<(TaskIdx, Origin)>],
) {
    // 0 = unvisited, 1 = on the current walk, 2 = done.
    let mut state = vec![0u8; tasks.len()];
    for start in 0..tasks.len() {
        let mut walk = Vec::new();
        let mut v = start;
        while state[v] == 0 {
            state[v] = 1;
            walk.push(v);
            match subtask_of[v] {
                Some((parent, _)) => v = parent,
                None => break,
            }
        }
        if state[v] == 1 && subtask_of[v].is_some() {
            // `v` is on this walk: the part of the walk from `v` on is a loop.
            let pos = walk.iter().position(|&w| w == v).unwrap_or(0);
            let cycle = &walk[pos..];
            let first = cycle.iter().copied().min().unwrap_or(v);
            let origin = subtask_of[first].map(|(_, o)| o.path()).unwrap_or_default();
            c.error_with_hint(
                PlanErrorKind::Cycle,
                origin,
                format!("subtask cycle: {}", cycle_text(tasks, cycle, first)),
                "a task cannot be (indirectly) a subtask of its own subtask",
            );
        }
        for w in walk {
            state[w] = 2;
        }
    }
}

/// Writes a cycle starting at `first`, back to `first`: `a -> b -> c -> a`.
fn cycle_text(tasks: &[Task], cycle: &[TaskIdx], first: TaskIdx) -> String {
    let at = cycle.iter().position(|&t| t == first).unwrap_or(0);
    let mut res = String::new();
    for &t in cycle[at..].iter().chain(&cycle[..at]) {
        res.push_str(&tasks[t].id);
        res.push_str(" -> ");
    }
    res.push_str(&tasks[first].id);
    res
}

/// Reports dependency cycles without recursion, one per strongly connected component: Kahn's
/// algorithm first removes everything that is not on or behind a cycle, an iterative Tarjan finds
/// the components of what is left, and inside a component following any dependency that stays in
/// it must close a loop.
fn check_cycles(
    c: &mut Compiler<'_>,
    tasks: &[Task],
    deps: &[Vec<TaskIdx>],
    dependents: &[Vec<TaskIdx>],
    edges: &[Edge],
) {
    let n = deps.len();
    let mut remaining_deps: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut ready: Vec<TaskIdx> = (0..n).filter(|&t| remaining_deps[t] == 0).collect();
    let mut n_done = 0;
    while let Some(t) = ready.pop() {
        n_done += 1;
        for &d in &dependents[t] {
            remaining_deps[d] -= 1;
            if remaining_deps[d] == 0 {
                ready.push(d);
            }
        }
    }
    if n_done == n {
        return;
    }
    let active: Vec<bool> = remaining_deps.iter().map(|&r| r > 0).collect();
    let components = strongly_connected(deps, &active);
    let origins: HashMap<(TaskIdx, TaskIdx), Origin> = edges
        .iter()
        .rev()
        .map(|e| ((e.dependent, e.dep), e.origin))
        .collect();
    let mut component_of = vec![usize::MAX; n];
    for (k, component) in components.iter().enumerate() {
        for &t in component {
            component_of[t] = k;
        }
    }
    let mut pos_in_walk = vec![usize::MAX; n];
    for (k, component) in components.iter().enumerate() {
        let Some(&start) = component.iter().min() else {
            continue;
        };
        let mut walk = Vec::new();
        let mut v = start;
        let cycle = loop {
            if pos_in_walk[v] != usize::MAX {
                break &walk[pos_in_walk[v]..];
            }
            pos_in_walk[v] = walk.len();
            walk.push(v);
            // Every member of a component of two or more has a dependency inside it.
            match deps[v].iter().find(|&&d| component_of[d] == k) {
                Some(&next) => v = next,
                None => break &walk[..0],
            }
        };
        if let Some(&first) = cycle.iter().min() {
            let at = cycle.iter().position(|&t| t == first).unwrap_or(0);
            let second = cycle[(at + 1) % cycle.len()];
            let path = origins
                .get(&(first, second))
                .map_or_else(|| format!("tasks[{first}]"), |o| o.path());
            c.error_with_hint(
                PlanErrorKind::Cycle,
                path,
                format!("dependency cycle: {}", cycle_text(tasks, cycle, first)),
                "no task on a cycle can ever start: remove one of its dependencies",
            );
        }
    }
}

/// Returns the strongly connected components of two or more tasks among the `active` ones
/// (Tarjan's algorithm with an explicit stack), ordered by their lowest task index.
fn strongly_connected(deps: &[Vec<TaskIdx>], active: &[bool]) -> Vec<Vec<TaskIdx>> {
    const UNSEEN: usize = usize::MAX;
    let n = deps.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0usize; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<TaskIdx> = Vec::new();
    let mut calls: Vec<(TaskIdx, usize)> = Vec::new();
    let mut counter = 0;
    let mut res = Vec::new();
    for root in 0..n {
        if !active[root] || index[root] != UNSEEN {
            continue;
        }
        index[root] = counter;
        low[root] = counter;
        counter += 1;
        stack.push(root);
        on_stack[root] = true;
        calls.push((root, 0));
        while let Some((v, pos)) = calls.last_mut() {
            let v = *v;
            if let Some(&w) = deps[v].get(*pos) {
                *pos += 1;
                if !active[w] {
                    continue;
                }
                if index[w] == UNSEEN {
                    index[w] = counter;
                    low[w] = counter;
                    counter += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    calls.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    res.push(component);
                }
            }
        }
    }
    res.sort_unstable_by_key(|component| component.iter().min().copied());
    res
}
