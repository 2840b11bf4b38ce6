//! Warnings about plans that compile but may not do what their author meant: the plan runs as
//! written, and `trellis plan validate` (and the commands that start a plan) print these.

use super::Plan;
use crate::policy::FailureAction;

impl Plan {
    /// Returns one line per surprise in this plan, naming the task and the option to change.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if !self.options.failure.continue_on_partial_failure {
            for task in &self.tasks {
                if task.on_failure.steps.contains(&FailureAction::Skip) {
                    warnings.push(format!(
                        "task {}: `skip` marks it skipped, but with `failure.continue_on_partial_failure: false` \
                         (the default) a skipped task fails the execution and cancels what runs; \
                         set `options.failure.continue_on_partial_failure: true` to let its dependents proceed",
                        task.id
                    ));
                }
            }
        }
        warnings
    }
}
