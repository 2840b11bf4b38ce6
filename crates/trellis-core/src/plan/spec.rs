//! The plan spec as written (YAML or JSON).

/// The plan spec as written.
#[derive(Debug)]
pub struct PlanSpec;
