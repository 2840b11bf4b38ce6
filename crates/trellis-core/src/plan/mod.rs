//! Plans: the spec people write (YAML or JSON, docs/design.md §11), its compiler, and the compiled,
//! validated task graph the state machine runs.
//!
//! A [`Plan`] is built by [`compile`], or read back by [`decode`] from what [`encode`] wrote of a
//! compiled plan: every index in it is in range, dependencies form a DAG, and relationship
//! semantics are already lowered to edges, so later code never re-checks them.
//!
//! The modules, from the bottom up (each uses only modules listed before it):
//! - `model`: the compiled [`Plan`]; `limits`, `errors`: size limits and the errors of parsing,
//!   compiling and decoding; `spec`: the spec as written; `suggest`: "did you mean" hints;
//! - `parse`: text to a spec; `expand`: params, templates and `for_each` to a flat spec;
//!   `cycles`: cycle detection on the task graph;
//! - `compiler`: the compiler's working state; `options` and `task`: lowering of `options:`,
//!   failure actions, tasks and routes; `checks`: lowering of `validate:`; `compile`: the whole-plan passes, spec to plan;
//! - `encoded`: the private encoded form of a plan; `verify`: what decoding checks; `encoding`:
//!   [`encode`] and [`decode`].

mod checks;
mod compile;
mod compiler;
mod cycles;
mod encoded;
mod encoding;
mod errors;
mod expand;
mod limits;
mod lint;
mod model;
mod options;
mod parse;
pub mod spec;
mod suggest;
mod task;
pub use task::check_queue_name;
mod verify;

pub use compile::{compile, compile_bytes, compile_str, compile_with_params};
pub use encoding::{PLAN_FORMAT_VERSION, decode, encode};
pub use errors::{Location, PlanDecodeError, PlanError, PlanErrorKind, PlanErrors};
pub use expand::{escape_references, expand, expand_with_limits};
pub use limits::Limits;
pub use model::{
    Budget, BudgetAction, Check, CheckLevel, Condition, FileImpact, FileOp, NotRun, OWN_FALLBACK,
    Plan, PlanOptions, Probe, Relationship, RelationshipKind, RouteCase, Shape, ShapeCache, Task,
    TaskIdx, case_matches,
};
pub use parse::{parse_param_values, parse_spec, parse_spec_bytes};
pub use spec::PlanSpec;

/// Returns the JSON Schema (draft 2020-12) of the plan spec as written: what editors and other
/// front ends can check a plan file against. The compiler checks more (ids resolve, no cycles,
/// durations parse), so a plan that fits the schema may still be refused, never the reverse.
pub fn json_schema() -> serde_json::Value {
    schemars::schema_for!(PlanSpec).to_value()
}
