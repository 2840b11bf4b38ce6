//! Lowering of `options:` (concurrency, global timeout, human review, conflict confidence,
//! budget) and of failure actions, plan-wide (`options.failure`) and in a task's own chain.

use super::compiler::Compiler;
use super::errors::PlanErrorKind;
use super::model::{Budget, BudgetAction, OWN_FALLBACK, PlanOptions, TaskIdx};
use super::spec::{
    ActionSpec, BackoffKindSpec, BackoffSpec, BudgetActionSpec, JitterSpec, PlanSpec,
};
use crate::policy::{Backoff, BackoffKind, FailureAction, FailurePolicy};

/// The policy values a `retry` without arguments takes.
pub(super) struct RetryDefaults {
    pub(super) max: u32,
    pub(super) backoff: Backoff,
}

impl Compiler<'_> {
    /// Lowers a backoff, starting from `base` for what it leaves out.
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
    pub(super) fn action(
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
}

/// Lowers `options:`; returns them with the values a `retry` without arguments takes.
pub(super) fn compile_options(
    c: &mut Compiler<'_>,
    spec: &PlanSpec,
) -> (PlanOptions, RetryDefaults) {
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
