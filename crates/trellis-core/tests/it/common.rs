//! Fixtures: plans built directly (without the spec compiler) and a simulator that plays worker,
//! coordinator clock and user against an [`Execution`].

use std::sync::Arc;
use std::time::Duration;

use trellis_core::ids::ExecutionId;
use trellis_core::machine::{Applied, Event, EventBody, Execution};
use trellis_core::plan::{Plan, PlanOptions, Task, TaskIdx};
use trellis_core::policy::EscalationChain;

/// Builds plans for tests.
pub struct PlanBuilder {
    options: PlanOptions,
    tasks: Vec<Task>,
    deps: Vec<Vec<TaskIdx>>,
    conflicts: Vec<(TaskIdx, TaskIdx)>,
}

impl PlanBuilder {
    pub fn new() -> Self {
        Self {
            options: PlanOptions::default(),
            tasks: Vec::new(),
            deps: Vec::new(),
            conflicts: Vec::new(),
        }
    }

    pub fn options(mut self, f: impl FnOnce(&mut PlanOptions)) -> Self {
        f(&mut self.options);
        self
    }

    /// Adds a `noop` task depending on the named earlier tasks.
    pub fn task(mut self, id: &str, deps: &[&str]) -> Self {
        let deps = deps
            .iter()
            .map(|d| {
                self.tasks
                    .iter()
                    .position(|t| t.id == *d)
                    .expect("dependency declared earlier")
            })
            .collect();
        self.tasks.push(task(id));
        self.deps.push(deps);
        self
    }

    pub fn edit(mut self, id: &str, f: impl FnOnce(&mut Task)) -> Self {
        let task = self
            .tasks
            .iter_mut()
            .find(|t| t.id == id)
            .expect("task exists");
        f(task);
        self
    }

    pub fn conflict(mut self, a: &str, b: &str) -> Self {
        let a = self.idx(a);
        let b = self.idx(b);
        self.conflicts.push((a, b));
        self
    }

    pub fn idx(&self, id: &str) -> TaskIdx {
        self.tasks
            .iter()
            .position(|t| t.id == id)
            .expect("task exists")
    }

    pub fn build(self) -> Arc<Plan> {
        build_plan(self.options, self.tasks, self.deps, &self.conflicts)
    }
}

pub fn task(id: &str) -> Task {
    Task::new(id, "noop")
}

pub fn build_plan(
    options: PlanOptions,
    tasks: Vec<Task>,
    deps: Vec<Vec<TaskIdx>>,
    conflicts: &[(TaskIdx, TaskIdx)],
) -> Arc<Plan> {
    let n = tasks.len();
    let mut dependents = vec![Vec::new(); n];
    for (t, ds) in deps.iter().enumerate() {
        for &d in ds {
            dependents[d].push(t);
        }
    }
    let mut conflict_lists = vec![Vec::new(); n];
    for &(a, b) in conflicts {
        if a != b && !conflict_lists[a].contains(&b) {
            conflict_lists[a].push(b);
            conflict_lists[b].push(a);
        }
    }
    let index = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.clone(), i))
        .collect();
    Arc::new(Plan {
        name: "test".to_owned(),
        options,
        tasks,
        deps,
        dependents,
        conflicts: conflict_lists,
        index,
        shape: Default::default(),
    })
}

pub fn chain(steps: Vec<trellis_core::policy::FailureAction>) -> EscalationChain {
    EscalationChain { steps }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Drives an execution and records every event it applies, the way the coordinator's log would.
pub struct Sim {
    pub exec: Execution,
    pub log: Vec<Event>,
    pub now: u64,
}

pub const T0: u64 = 1_700_000_000_000;

impl Sim {
    pub fn new(plan: Arc<Plan>) -> Self {
        let exec = Execution::start(ExecutionId::v7(T0, [7; 10]), plan, 1, T0);
        Self {
            exec,
            log: Vec::new(),
            now: T0,
        }
    }

    /// Applies an event; on success it joins the log.
    pub fn apply(&mut self, body: EventBody) -> Result<Applied, trellis_core::machine::ApplyError> {
        let event = Event {
            at_ms: self.now,
            body,
        };
        let applied = self.exec.apply(&event)?;
        self.log.push(event);
        Ok(applied)
    }

    /// Runs `decide` and applies every command; a refused decision is a bug.
    pub fn decide(&mut self) -> usize {
        let commands = self.exec.decide(self.now);
        let n = commands.len();
        for command in commands {
            let event = command.into_event(self.now);
            if let Err(err) = self.exec.apply(&event) {
                panic!("decision {:?} refused: {err}", event.body);
            }
            self.log.push(event);
        }
        n
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    /// Replays the log on a fresh execution and returns it.
    pub fn replay(&self) -> Execution {
        let mut fresh = Execution::start(self.exec.id(), Arc::clone(self.exec.plan()), 1, T0);
        for event in &self.log {
            if let Err(err) = fresh.apply(event) {
                panic!("replay refused {:?}: {err}", event.body);
            }
        }
        fresh
    }
}
