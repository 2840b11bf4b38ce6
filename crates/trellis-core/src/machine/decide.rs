//! What should happen now: [`Execution::decide`] reads the state and a clock value and proposes
//! [`Command`]s (dispatches within `max_concurrency` and path locks, timeouts, expiries, the
//! budget, the end of the execution). Pure: it changes nothing, so calling it twice returns the
//! same commands.

use super::{Command, Execution, ExecutionState, InstIdx, Outcome};
use crate::plan::TaskIdx;

impl Execution {
    /// Returns what should happen now. Pure: calling it twice without applying anything returns the
    /// same commands. Dispatches respect `max_concurrency` and path locks, retries wait for their
    /// backoff, and nothing is dispatched while the execution is paused or waiting for a human.
    pub fn decide(&self, now_ms: u64) -> Vec<Command> {
        self.decide_holding(now_ms, u32::MAX, &mut |_, _| false)
    }

    /// [`Execution::decide`] with at most `room` dispatches (a limit kept outside the execution,
    /// like the coordinator's dispatch window, on top of `max_concurrency`), holding back
    /// dispatches that `held` names by queue and task type as well (a pause of a queue, a
    /// namespace or the whole fleet, an open circuit breaker: what lives outside the execution).
    /// `held` is asked once per candidate that would otherwise be dispatched, in dispatch order.
    /// Plan tasks and subtask groups paused in the execution are always held back.
    ///
    /// With no room left no candidate is looked at, so a large execution whose window is full
    /// costs nothing per decision however many of its tasks are ready.
    pub fn decide_holding(
        &self,
        now_ms: u64,
        room: u32,
        held: &mut dyn FnMut(&str, &str) -> bool,
    ) -> Vec<Command> {
        let mut commands = Vec::new();
        if self.state.is_terminal() {
            if self.finish_due
                && let Some(outcome) = Outcome::of(self.state)
            {
                commands.push(Command::Finish { outcome });
            }
            return commands;
        }
        if let Some(timeout) = self.plan.options.global_timeout
            && now_ms
                >= self
                    .run_started_at_ms
                    .saturating_add(timeout.as_millis() as u64)
        {
            commands.push(Command::TimeOutExecution);
            return commands;
        }
        for &(deadline, idx) in &self.deadlines {
            if deadline > now_ms {
                break;
            }
            let inst = &self.instances[idx as usize];
            commands.push(Command::TimeOut {
                instance: inst.id,
                attempt: inst.attempt,
            });
        }
        for &(expiry, question) in &self.expiries {
            if expiry > now_ms {
                break;
            }
            commands.push(Command::ExpireQuestion { question });
        }
        if let Some(reason) = self.budget_exceeded() {
            commands.push(Command::ExhaustBudget { reason });
        }
        if self.open_slots == 0 {
            let outcome = if self.failed_slots > 0 {
                Outcome::Failed
            } else {
                Outcome::Completed
            };
            commands.push(Command::Finish { outcome });
            return commands;
        }
        if self.state != ExecutionState::Running || !commands.is_empty() {
            return commands;
        }
        let mut free = match self.plan.options.max_concurrency {
            Some(limit) => limit.saturating_sub(self.running),
            None => u32::MAX,
        }
        .min(room);
        let mut locked_now: Vec<TaskIdx> = Vec::new();
        let candidates = self
            .retries
            .iter()
            .take_while(|(not_before, _)| *not_before <= now_ms)
            .map(|&(_, idx)| idx)
            .chain(self.ready.iter().map(|(_, idx)| idx));
        for idx in candidates {
            if free == 0 {
                break;
            }
            if self.held(idx).is_some() {
                continue;
            }
            let mut takes_lock = None;
            if let Some(lock) = self.lock_task_of(idx)
                && !self.slots[lock].locked
            {
                let conflicts = &self.plan.conflicts[lock];
                if conflicts
                    .iter()
                    .any(|&c| self.slots[c].locked || locked_now.contains(&c))
                {
                    continue;
                }
                takes_lock = Some(lock);
            }
            // Asked last, about a candidate that would otherwise go: a hold that lets one
            // dispatch through (a breaker's probe) is not spent on one that cannot.
            let work = &self.instances[idx as usize].work;
            if held(self.queue_of(work), self.type_of(work)) {
                continue;
            }
            locked_now.extend(takes_lock);
            let inst = &self.instances[idx as usize];
            commands.push(Command::Dispatch {
                instance: inst.id,
                attempt: inst.attempt + 1,
            });
            free -= 1;
        }
        commands
    }

    /// Returns the earliest clock value after `now_ms` at which [`Execution::decide`] may propose
    /// something it does not propose at `now_ms`, were nothing applied meanwhile: the global
    /// timeout, an attempt's deadline, a question's expiry or a retry's backoff. `None` when no
    /// later clock value changes what it decides (a finished execution, or nothing timed ahead).
    /// A caller that decides again only on an applied event, on a change outside the execution
    /// (a pause, a breaker) or at this clock value misses nothing.
    pub fn next_wake(&self, now_ms: u64) -> Option<u64> {
        if self.state.is_terminal() {
            return None;
        }
        let after = |at: &u64| *at > now_ms;
        let timeout = self.plan.options.global_timeout.map(|timeout| {
            self.run_started_at_ms
                .saturating_add(timeout.as_millis() as u64)
        });
        // Retries held back by the concurrency limits may be many and already due: they wait for
        // an event that frees room, not for the clock.
        let retry = self
            .retries
            .range((now_ms.saturating_add(1), InstIdx::MIN)..)
            .next()
            .map(|&(at, _)| at);
        [
            timeout.filter(after),
            self.deadlines.iter().map(|&(at, _)| at).find(after),
            self.expiries.iter().map(|&(at, _)| at).find(after),
            retry,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    pub(super) fn budget_exceeded(&self) -> Option<String> {
        if self.budget_tripped {
            return None;
        }
        let budget = &self.plan.options.budget;
        // Each resume after the budget paused the execution grants one more budget.
        let budgets = 1 + u64::from(self.budget_grants);
        let granted = if self.budget_grants == 0 {
            String::new()
        } else {
            format!(
                " ({budgets} budgets: resumed {} after exhausting it)",
                times(self.budget_grants)
            )
        };
        if let Some(max) = budget.max_tokens {
            let limit = max.saturating_mul(budgets);
            if self.usage.tokens_used >= limit {
                return Some(format!(
                    "token budget exhausted: {} of {limit} tokens used{granted}",
                    self.usage.tokens_used
                ));
            }
        }
        if let Some(max) = budget.max_cost {
            let limit = max * budgets as f64;
            if self.usage.cost >= limit {
                return Some(format!(
                    "cost budget exhausted: {:.4} of {limit:.4} spent{granted}",
                    self.usage.cost
                ));
            }
        }
        None
    }
}

/// "once", "twice", "3 times".
fn times(n: u32) -> String {
    match n {
        1 => "once".to_owned(),
        2 => "twice".to_owned(),
        n => format!("{n} times"),
    }
}
