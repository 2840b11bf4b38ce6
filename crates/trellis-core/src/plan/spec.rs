//! The plan spec as people write it (YAML or JSON, docs/design.md §11), before any validation.
//!
//! These types mirror the file format one to one: every struct denies unknown fields, task
//! references are still ids, durations are still text. [`super::compile`] checks all of it and
//! lowers it into a [`super::Plan`]. Values that need checking beyond their type (durations, ids,
//! jitter) stay loosely typed here so the compiler can report every problem with its path instead
//! of stopping at the first.

use std::collections::BTreeMap;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// The plan spec as written.
///
/// `params`, `templates` and the tasks' `use` and `for_each` are the plan language's shorthands:
/// [`super::expand`] rewrites them away into a flat spec, which is what [`super::compile`]
/// validates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    pub name: String,
    /// Values the plan is parameterised by, referenced as `${params.<name>}` in task strings.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, ParamSpec>,
    /// Partial tasks that tasks start from with `use: <name>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub templates: BTreeMap<String, TemplateSpec>,
    #[serde(default)]
    pub options: OptionsSpec,
    pub tasks: Vec<TaskSpec>,
}

/// `params.<name>:` — one declared parameter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParamSpec {
    /// The JSON type a value must have; absent = any.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub param_type: Option<ParamType>,
    /// The value used when none is given; absent (or `null`) = the param is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `templates.<name>:` — any task fields but `id`, `use` and `for_each`, checked when expanded.
///
/// A task that says `use: <name>` starts from these fields; its own fields replace them, except
/// `input`, where the two objects merge (the task's keys win). A list field the task leaves empty
/// (`depends_on`, `files`, `relationships`) is taken from the template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct TemplateSpec(pub serde_json::Map<String, serde_json::Value>);

/// The JSON type of a param.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParamType {
    String,
    /// Any JSON number.
    Number,
    /// A whole number.
    Integer,
    Boolean,
    List,
    Object,
}

impl ParamType {
    /// Returns the name used in plans.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::String => "string",
            Self::Number => "number",
            Self::Integer => "integer",
            Self::Boolean => "boolean",
            Self::List => "list",
            Self::Object => "object",
        }
    }

    /// Returns the name with its article, for messages ("an integer", "a list").
    pub fn with_article(self) -> &'static str {
        match self {
            Self::String => "a string",
            Self::Number => "a number",
            Self::Integer => "an integer",
            Self::Boolean => "a boolean",
            Self::List => "a list",
            Self::Object => "an object",
        }
    }

    /// Returns true when `value` has this type.
    pub fn accepts(self, value: &serde_json::Value) -> bool {
        use serde_json::Value;
        match self {
            Self::String => value.is_string(),
            Self::Number => value.is_number(),
            Self::Integer => value.is_i64() || value.is_u64(),
            Self::Boolean => value.is_boolean(),
            Self::List => value.is_array(),
            Self::Object => matches!(value, Value::Object(_)),
        }
    }
}

/// `options:` — execution-wide settings, all optional.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OptionsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// A humantime duration such as `30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_on_human_review: Option<bool>,
    /// File impacts less certain than this (0.0–1.0) create no conflicts; default 0.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_conflict_confidence: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
}

/// `options.failure:` — the plan's failure policy (docs/design.md §5).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailureSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_action: Option<ActionSpec>,
    /// The retry count of a `retry` action that gives none (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// The backoff of a `retry` action that gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_on_partial_failure: Option<bool>,
    /// Task type → the action for tasks of that type.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, ActionSpec>,
}

/// `options.budget:` — resource limits of one execution.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exhausted: Option<BudgetActionSpec>,
}

/// `on_exhausted:` — `pause` or `fail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BudgetActionSpec {
    Pause,
    Fail,
}

/// One task as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub id: String,
    /// The handler type; required, but it may come from a template (`use`).
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub task_type: String,
    /// The template this task starts from.
    #[serde(rename = "use", default, skip_serializing_if = "Option::is_none")]
    pub use_template: Option<String>,
    /// Makes this task a generator: one task per item of this list (or of the list a
    /// `${params.x}` names). See [`super::expand`] for ids and references.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default = "empty_object")]
    pub input: serde_json::Value,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// A humantime duration such as `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// The id of the task run in this one's place by a `fallback` action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// This task's escalation chain; absent = the plan policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<Vec<ActionSpec>>,
    /// Shorthand for `on_failure: [{retry: ...}]` followed by the plan policy's action for the
    /// task's type (unless that action is itself a retry, which this one replaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relationships: Vec<RelationshipSpec>,
    /// Makes this task decide which of some later tasks run, by its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteSpec>,
    /// Checks run on the worker after the task's handler succeeds; a failed check fails the
    /// attempt (reason `validation`) and the task's failure policy decides what follows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validate: Vec<CheckSpec>,
}

/// One entry of `validate:` — `{name: lint, level: codebase, command: "cargo clippy", timeout:
/// 5m}` or `{name: health, level: api, http: {url: "http://localhost:8080/health", status:
/// 200}}`.
///
/// A check has exactly one of `command` and `http`. The levels are seed 001's three test levels;
/// `codebase` and `ui` checks run a command, an `api` check a command or an HTTP request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    /// Unique within the task: `[A-Za-z0-9_.-]`, at most 64 characters.
    pub name: String,
    pub level: CheckLevelSpec,
    /// A command: one string runs through `sh -c`, a list is the program and its arguments. It
    /// passes when it exits with status 0. It runs in the worker's working directory, with the
    /// task's output in the file `$TRELLIS_OUTPUT_FILE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpCheckSpec>,
    /// How long the check may run (a humantime duration); default 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// The three levels of seed 001, as written (lowercase).
pub use super::model::CheckLevel as CheckLevelSpec;

/// A check's command as written: `"cargo test --quiet"` (through `sh -c`) or `[cargo, test]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandSpec {
    Shell(String),
    Argv(Vec<String>),
}

/// `http:` of a check: a request and what its answer must be.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpCheckSpec {
    /// `http://` or `https://`.
    pub url: String,
    /// Default `GET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The status the answer must have; default 200.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<i64>,
    /// Text the answer's body must contain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_contains: Option<String>,
}

/// `route:` on a deciding task: `{path: /kind, cases: {bug: [fix], feature: [build]}, default:
/// [triage]}`.
///
/// When the task completes, the value at `path` in its output picks the case: the tasks listed
/// under it run, the tasks of every other case (and of `default`) are skipped; when no case
/// matches, the `default` tasks run instead. A case key matches a string output equal to it, or
/// any other JSON value whose JSON text equals it (`true`, `3`). Every listed task waits for the
/// deciding task (the dependency is implied). A task appears in at most one route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// Where in the output to look: a JSON pointer (`/kind`, `/a/0`) or a dotted path
    /// (`kind`, `a.b`); absent = the whole output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Case value → the tasks that run when the output has it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cases: BTreeMap<String, Vec<String>>,
    /// The tasks that run when no case matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub default: Vec<String>,
}

impl Default for TaskSpec {
    /// Returns a task with an empty id and type and an empty input object.
    fn default() -> Self {
        Self {
            id: String::new(),
            task_type: String::new(),
            use_template: None,
            for_each: None,
            queue: None,
            input: empty_object(),
            files: Vec::new(),
            depends_on: Vec::new(),
            timeout: None,
            fallback: None,
            on_failure: None,
            retry: None,
            relationships: Vec::new(),
            route: None,
            validate: Vec::new(),
        }
    }
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// One file a task touches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    pub path: String,
    pub op: FileOpSpec,
    /// 0.0–1.0, default 1.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f32>,
}

/// `CREATE | UPDATE | DELETE | READ`, lowercase accepted too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileOpSpec {
    #[serde(rename = "CREATE", alias = "create")]
    Create,
    #[serde(rename = "UPDATE", alias = "update")]
    Update,
    #[serde(rename = "DELETE", alias = "delete")]
    Delete,
    #[serde(rename = "READ", alias = "read")]
    Read,
}

/// `{type: conflicts_with, target: ui}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RelationshipSpec {
    #[serde(rename = "type")]
    pub kind: RelationshipKindSpec,
    pub target: String,
}

/// The 11 relationship types as written (snake_case): the compiled kind, read directly.
pub use super::model::RelationshipKind as RelationshipKindSpec;

/// A failure action as written: a bare name (`reassign`, `retry`, `fallback`) or a one-key map
/// with arguments (`{retry: {max: 3, backoff: exponential}}`, `{fallback: api-fallback}`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionSpec {
    Retry(RetrySpec),
    Reassign,
    Skip,
    Pause,
    Abort,
    /// The target task id; `None` means the task's own `fallback`.
    Fallback(Option<String>),
}

/// The arguments of `retry`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffSpec>,
}

const ACTION_NAMES: &[&str] = &["retry", "reassign", "skip", "pause", "abort", "fallback"];

impl<'de> Deserialize<'de> for ActionSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ActionVisitor;

        impl<'de> Visitor<'de> for ActionVisitor {
            type Value = ActionSpec;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a failure action: one of retry, reassign, skip, pause, abort, fallback, or a one-key map such as {retry: {max: 3}} or {fallback: task-id}")
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<ActionSpec, E> {
                match name {
                    "retry" => Ok(ActionSpec::Retry(RetrySpec::default())),
                    "reassign" => Ok(ActionSpec::Reassign),
                    "skip" => Ok(ActionSpec::Skip),
                    "pause" => Ok(ActionSpec::Pause),
                    "abort" => Ok(ActionSpec::Abort),
                    "fallback" => Ok(ActionSpec::Fallback(None)),
                    other => Err(E::unknown_variant(other, ACTION_NAMES)),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ActionSpec, A::Error> {
                let Some(name) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(
                        "expected a failure action, found an empty map",
                    ));
                };
                let action = match name.as_str() {
                    "retry" => ActionSpec::Retry(
                        map.next_value::<Option<RetrySpec>>()?.unwrap_or_default(),
                    ),
                    "fallback" => ActionSpec::Fallback(map.next_value::<Option<String>>()?),
                    "reassign" | "skip" | "pause" | "abort" => {
                        // `{pause: null}` is accepted as a spelling of `pause`; any argument is not.
                        map.next_value::<Option<NoArgument>>()?;
                        self.visit_str::<A::Error>(&name)?
                    }
                    other => return Err(de::Error::unknown_variant(other, ACTION_NAMES)),
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "a failure action is a map with exactly one key, found also `{extra}`"
                    )));
                }
                Ok(action)
            }
        }

        deserializer.deserialize_any(ActionVisitor)
    }
}

/// Accepts nothing but a null (deserialised through `Option`), for actions that take no argument.
struct NoArgument;

impl<'de> Deserialize<'de> for NoArgument {
    fn deserialize<D: Deserializer<'de>>(_deserializer: D) -> Result<Self, D::Error> {
        Err(de::Error::custom("this failure action takes no argument"))
    }
}

/// A retry backoff as written: a kind name (`constant`, `linear`, `exponential`) or a map
/// `{kind, base: 100ms, cap: 1m, jitter: 20%}` (jitter also as a ratio such as `0.2`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BackoffSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<BackoffKindSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<JitterSpec>,
}

/// How backoff delays grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackoffKindSpec {
    Constant,
    Linear,
    Exponential,
}

/// Jitter as written: `"20%"` or a ratio such as `0.2`; checked by the compiler.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum JitterSpec {
    Percent(String),
    Ratio(f64),
}

impl<'de> Deserialize<'de> for BackoffSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The map form; a separate type so the derive checks its fields.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct BackoffMap {
            #[serde(default)]
            kind: Option<BackoffKindSpec>,
            #[serde(default)]
            base: Option<String>,
            #[serde(default)]
            cap: Option<String>,
            #[serde(default)]
            jitter: Option<JitterSpec>,
        }

        struct BackoffVisitor;

        impl<'de> Visitor<'de> for BackoffVisitor {
            type Value = BackoffSpec;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a backoff: constant, linear, exponential, or a map {kind, base, cap, jitter}",
                )
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<BackoffSpec, E> {
                let kind =
                    BackoffKindSpec::deserialize(de::value::StrDeserializer::<E>::new(name))?;
                Ok(BackoffSpec {
                    kind: Some(kind),
                    ..BackoffSpec::default()
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<BackoffSpec, A::Error> {
                let m = BackoffMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(BackoffSpec {
                    kind: m.kind,
                    base: m.base,
                    cap: m.cap,
                    jitter: m.jitter,
                })
            }
        }

        deserializer.deserialize_any(BackoffVisitor)
    }
}

impl<'de> Deserialize<'de> for JitterSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct JitterVisitor;

        impl Visitor<'_> for JitterVisitor {
            type Value = JitterSpec;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a jitter: a percentage such as \"20%\" or a ratio such as 0.2")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<JitterSpec, E> {
                Ok(JitterSpec::Percent(v.to_owned()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<JitterSpec, E> {
                Ok(JitterSpec::Ratio(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<JitterSpec, E> {
                Ok(JitterSpec::Ratio(v as f64))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<JitterSpec, E> {
                Ok(JitterSpec::Ratio(v as f64))
            }
        }

        deserializer.deserialize_any(JitterVisitor)
    }
}

// Schemas of the types with hand-written deserialisers, saying what those accept.

impl JsonSchema for FileOpSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "FileOpSpec".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "What a task does to a file; upper or lower case.",
            "enum": ["CREATE", "UPDATE", "DELETE", "READ", "create", "update", "delete", "read"]
        })
    }
}

impl JsonSchema for ActionSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ActionSpec".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let retry = generator.subschema_for::<Option<RetrySpec>>();
        json_schema!({
            "description": "A failure action: a bare name, or a one-key map with its argument.",
            "oneOf": [
                {"enum": ACTION_NAMES},
                {
                    "type": "object",
                    "properties": {"retry": retry},
                    "required": ["retry"],
                    "additionalProperties": false
                },
                {
                    "type": "object",
                    "properties": {"fallback": {"type": ["string", "null"]}},
                    "required": ["fallback"],
                    "additionalProperties": false
                },
                {
                    "type": "object",
                    "properties": {
                        "reassign": {"type": "null"},
                        "skip": {"type": "null"},
                        "pause": {"type": "null"},
                        "abort": {"type": "null"}
                    },
                    "minProperties": 1,
                    "maxProperties": 1,
                    "additionalProperties": false
                }
            ]
        })
    }
}

impl JsonSchema for BackoffSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "BackoffSpec".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let kind = generator.subschema_for::<BackoffKindSpec>();
        let jitter = generator.subschema_for::<JitterSpec>();
        json_schema!({
            "description": "A retry backoff: a kind name, or a map {kind, base, cap, jitter}.",
            "oneOf": [
                kind.clone(),
                {
                    "type": "object",
                    "properties": {
                        "kind": kind,
                        "base": {"type": "string", "description": "a duration such as 100ms"},
                        "cap": {"type": "string", "description": "a duration such as 1m"},
                        "jitter": jitter
                    },
                    "additionalProperties": false
                }
            ]
        })
    }
}

impl JsonSchema for JitterSpec {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "JitterSpec".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A percentage such as \"20%\" or a ratio such as 0.2.",
            "type": ["string", "number"]
        })
    }
}
