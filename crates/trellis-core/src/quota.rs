//! Namespace quotas: what an operator lets the executions of one namespace do. Seed 003's license
//! tiers (§5, "Feature Tiers") are presets of it:
//!
//! | tier | concurrency | failure actions | checkpoints |
//! |---|---|---|---|
//! | `core` | 1 | retry | no |
//! | `writer_pro` | 3 | retry | yes |
//! | `teams` | 10 | all six | yes |
//! | `enterprise` | unlimited | all six | yes |
//!
//! A quota caps each execution's `max_concurrency` (a plan asking for more, or for no limit, runs
//! with the cap: "enforced at runtime", as the seed says), refuses a plan whose failure policy or
//! escalation chains use an action it does not allow (with every place that does), and says
//! whether checkpoints may be taken.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::plan::Plan;
use crate::policy::FailureAction;

/// The kinds of failure action (docs/design.md §5), without their parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    Retry,
    Reassign,
    Skip,
    Pause,
    Abort,
    Fallback,
}

impl ActionKind {
    /// Every kind, in the order docs/design.md lists them.
    pub const ALL: [ActionKind; 6] = [
        ActionKind::Retry,
        ActionKind::Reassign,
        ActionKind::Skip,
        ActionKind::Pause,
        ActionKind::Abort,
        ActionKind::Fallback,
    ];

    /// Returns the kind of `action`.
    pub fn of(action: &FailureAction) -> Self {
        match action {
            FailureAction::Retry { .. } => Self::Retry,
            FailureAction::Reassign => Self::Reassign,
            FailureAction::Skip => Self::Skip,
            FailureAction::Pause => Self::Pause,
            FailureAction::Abort => Self::Abort,
            FailureAction::Fallback { .. } => Self::Fallback,
        }
    }

    /// Returns the name plans use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Reassign => "reassign",
            Self::Skip => "skip",
            Self::Pause => "pause",
            Self::Abort => "abort",
            Self::Fallback => "fallback",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of failure action kinds.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ActionSet(u8);

impl ActionSet {
    /// Every action.
    pub const ALL: ActionSet = ActionSet(0b11_1111);

    /// Returns the set holding `kinds`.
    pub fn of(kinds: impl IntoIterator<Item = ActionKind>) -> Self {
        Self(kinds.into_iter().fold(0, |bits, kind| bits | kind.bit()))
    }

    /// Returns whether `kind` is in the set.
    pub fn contains(self, kind: ActionKind) -> bool {
        self.0 & kind.bit() != 0
    }

    /// Returns the kinds in the set, in [`ActionKind::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = ActionKind> {
        ActionKind::ALL
            .into_iter()
            .filter(move |k| self.contains(*k))
    }
}

impl fmt::Debug for ActionSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl fmt::Display for ActionSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(ActionKind::name).collect();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(", "))
        }
    }
}

/// Seed 003's license tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Core,
    WriterPro,
    Teams,
    Enterprise,
}

impl Tier {
    /// Returns the tier's quota.
    pub fn quota(self) -> Quota {
        match self {
            Self::Core => Quota {
                max_concurrency: Some(1),
                failure_actions: ActionSet::of([ActionKind::Retry]),
                checkpoints: false,
            },
            Self::WriterPro => Quota {
                max_concurrency: Some(3),
                failure_actions: ActionSet::of([ActionKind::Retry]),
                checkpoints: true,
            },
            Self::Teams => Quota {
                max_concurrency: Some(10),
                failure_actions: ActionSet::ALL,
                checkpoints: true,
            },
            Self::Enterprise => Quota::UNLIMITED,
        }
    }

    /// Returns the name configuration files use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::WriterPro => "writer_pro",
            Self::Teams => "teams",
            Self::Enterprise => "enterprise",
        }
    }
}

/// What the executions of one namespace may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Most task instances one execution runs at once; `None` = no cap.
    pub max_concurrency: Option<u32>,
    /// The failure actions plans may use.
    pub failure_actions: ActionSet,
    /// Whether executions may be checkpointed.
    pub checkpoints: bool,
}

impl Default for Quota {
    fn default() -> Self {
        Self::UNLIMITED
    }
}

/// One use of a failure action a quota does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaViolation {
    /// Where the plan uses it, e.g. `options.failure.default_action` or
    /// `tasks[2] (deploy).on_failure[1]`.
    pub path: String,
    pub action: ActionKind,
    pub allowed: ActionSet,
}

impl fmt::Display for QuotaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: failure action `{}` is not allowed in this namespace (allowed: {})",
            self.path,
            self.action.name(),
            self.allowed
        )
    }
}

impl Quota {
    /// No limit of any kind.
    pub const UNLIMITED: Quota = Quota {
        max_concurrency: None,
        failure_actions: ActionSet::ALL,
        checkpoints: true,
    };

    /// Returns the `max_concurrency` an execution runs with when its plan asks for `asked`: the
    /// smaller of the two, the cap when the plan asks for no limit.
    pub fn cap_concurrency(&self, asked: Option<u32>) -> Option<u32> {
        match (asked, self.max_concurrency) {
            (Some(asked), Some(cap)) => Some(asked.min(cap)),
            (None, cap) => cap,
            (asked, None) => asked,
        }
    }

    /// Returns every place `plan` uses a failure action this quota does not allow: the plan's
    /// default action and per-type overrides (which also govern spawned subtasks), and each
    /// task's own escalation chain. Empty when the plan is allowed.
    pub fn check_plan(&self, plan: &Plan) -> Vec<QuotaViolation> {
        let mut violations = Vec::new();
        if self.failure_actions == ActionSet::ALL {
            return violations;
        }
        let mut check = |path: String, action: &FailureAction| {
            let kind = ActionKind::of(action);
            if !self.failure_actions.contains(kind) {
                violations.push(QuotaViolation {
                    path,
                    action: kind,
                    allowed: self.failure_actions,
                });
            }
        };
        let policy = &plan.options.failure;
        check(
            "options.failure.default_action".to_owned(),
            &policy.default_action,
        );
        for (task_type, action) in &policy.task_type_overrides {
            check(format!("options.failure.overrides.{task_type}"), action);
        }
        for (task_idx, task) in plan.tasks.iter().enumerate() {
            // A chain equal to the policy's for its type came from the policy, reported above.
            if task.on_failure == policy.chain_for(&task.task_type) {
                continue;
            }
            for (step_idx, action) in task.on_failure.steps.iter().enumerate() {
                check(
                    format!("tasks[{task_idx}] ({}).on_failure[{step_idx}]", task.id),
                    action,
                );
            }
        }
        violations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Limits, compile_str};

    fn plan(text: &str) -> Plan {
        match compile_str(text, &Limits::default()) {
            Ok(plan) => plan,
            Err(errors) => panic!("test plan does not compile: {errors:?}"),
        }
    }

    #[test]
    fn tiers_are_the_seed_table() {
        let rows: Vec<(Tier, Option<u32>, String, bool)> =
            [Tier::Core, Tier::WriterPro, Tier::Teams, Tier::Enterprise]
                .into_iter()
                .map(|tier| {
                    let q = tier.quota();
                    (
                        tier,
                        q.max_concurrency,
                        q.failure_actions.to_string(),
                        q.checkpoints,
                    )
                })
                .collect();
        let all = "retry, reassign, skip, pause, abort, fallback".to_owned();
        assert_eq!(
            rows,
            vec![
                (Tier::Core, Some(1), "retry".to_owned(), false),
                (Tier::WriterPro, Some(3), "retry".to_owned(), true),
                (Tier::Teams, Some(10), all.clone(), true),
                (Tier::Enterprise, None, all, true),
            ]
        );
    }

    #[test]
    fn concurrency_is_capped_never_raised() {
        let quota = Tier::WriterPro.quota();
        assert_eq!(quota.cap_concurrency(None), Some(3));
        assert_eq!(quota.cap_concurrency(Some(8)), Some(3));
        assert_eq!(quota.cap_concurrency(Some(2)), Some(2));
        assert_eq!(Quota::UNLIMITED.cap_concurrency(None), None);
        assert_eq!(Quota::UNLIMITED.cap_concurrency(Some(5)), Some(5));
    }

    #[test]
    fn a_default_plan_passes_every_tier() {
        let plan = plan("name: p\ntasks:\n  - {id: a, type: noop}\n");
        for tier in [Tier::Core, Tier::WriterPro, Tier::Teams, Tier::Enterprise] {
            assert_eq!(tier.quota().check_plan(&plan), vec![], "{tier:?}");
        }
    }

    #[test]
    fn every_disallowed_use_is_reported_with_its_place() {
        let plan = plan(
            "name: p\n\
             options:\n  failure: {default_action: skip, overrides: {shell: abort}}\n\
             tasks:\n\
             \x20 - {id: a, type: noop}\n\
             \x20 - {id: b, type: noop, on_failure: [{retry: {max: 2}}, reassign, pause]}\n",
        );
        let messages: Vec<String> = Tier::WriterPro
            .quota()
            .check_plan(&plan)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            messages,
            vec![
                "options.failure.default_action: failure action `skip` is not allowed in this namespace (allowed: retry)",
                "options.failure.overrides.shell: failure action `abort` is not allowed in this namespace (allowed: retry)",
                "tasks[1] (b).on_failure[1]: failure action `reassign` is not allowed in this namespace (allowed: retry)",
                "tasks[1] (b).on_failure[2]: failure action `pause` is not allowed in this namespace (allowed: retry)",
            ]
        );
        assert_eq!(Tier::Teams.quota().check_plan(&plan), vec![]);
    }
}
