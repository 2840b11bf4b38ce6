//! The plan compiler.

use super::{Plan, PlanSpec};

/// Size limits applied while parsing and compiling.
#[derive(Clone, Debug)]
pub struct Limits;

/// One validation error.
#[derive(Clone, Debug)]
pub struct PlanError;

/// All validation errors of a plan.
#[derive(Clone, Debug)]
pub struct PlanErrors;

/// Parses a spec.
pub fn parse_spec(_text: &str, _limits: &Limits) -> Result<PlanSpec, PlanErrors> {
    Err(PlanErrors)
}

/// Compiles a spec.
pub fn compile(_spec: PlanSpec, _limits: &Limits) -> Result<Plan, PlanErrors> {
    Err(PlanErrors)
}

/// Parses and compiles.
pub fn compile_str(_text: &str, _limits: &Limits) -> Result<Plan, PlanErrors> {
    Err(PlanErrors)
}
