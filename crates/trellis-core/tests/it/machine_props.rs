//! Property tests of docs/design.md §10 invariants 1–4 on random plans, with worker results delivered in
//! random order, duplicated, late, and interleaved with pause, resume and cancel, plus replay:
//! the event log rebuilds the identical state.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use trellis_core::ids::{GroupId, QuestionId, TaskInstanceId, WorkerId};
use trellis_core::machine::{
    Applied, EventBody, Execution, ExecutionState, GroupRule, PauseMode, PauseScope, Question,
    SubtaskSpec, TimeoutAction, Usage,
};
use trellis_core::plan::{Plan, PlanOptions, TaskIdx};
use trellis_core::policy::{Backoff, BackoffKind, FailureAction, FailurePolicy};
use trellis_core::record::TaskState;

use crate::common::{Sim, build_plan, chain, ms, task};

#[derive(Clone, Debug)]
struct PlanShape {
    n_tasks: usize,
    dep_masks: Vec<u16>,
    conflicts: Vec<(usize, usize)>,
    max_concurrency: Option<u32>,
    continue_on_partial_failure: bool,
    max_retries: u32,
    chain_task0: bool,
    /// Every task's timeout, in milliseconds.
    task_timeout: Option<u64>,
    /// The execution's global timeout, in milliseconds.
    global_timeout: Option<u64>,
}

fn plan_shape() -> impl Strategy<Value = PlanShape> {
    (1usize..10)
        .prop_flat_map(|n| {
            (
                Just(n),
                prop::collection::vec(any::<u16>(), n),
                prop::collection::vec((0..n, 0..n), 0..4),
                prop::option::of(1u32..4),
                any::<bool>(),
                0u32..3,
                any::<bool>(),
                prop::option::weighted(0.3, 100u64..2_000),
                prop::option::weighted(0.2, 500u64..20_000),
            )
        })
        .prop_map(
            |(
                n_tasks,
                dep_masks,
                conflicts,
                max_concurrency,
                continue_on_partial_failure,
                max_retries,
                chain_task0,
                task_timeout,
                global_timeout,
            )| {
                PlanShape {
                    n_tasks,
                    dep_masks,
                    conflicts,
                    max_concurrency,
                    continue_on_partial_failure,
                    max_retries,
                    chain_task0,
                    task_timeout,
                    global_timeout,
                }
            },
        )
}

fn make_plan(shape: &PlanShape) -> Arc<Plan> {
    let backoff = Backoff {
        kind: BackoffKind::Exponential,
        base: ms(50),
        cap: ms(400),
        jitter_pct: 30,
    };
    let retry = FailureAction::Retry {
        max: shape.max_retries,
        backoff: backoff.clone(),
    };
    let options = PlanOptions {
        max_concurrency: shape.max_concurrency,
        global_timeout: shape.global_timeout.map(ms),
        failure: FailurePolicy {
            default_action: retry.clone(),
            continue_on_partial_failure: shape.continue_on_partial_failure,
            task_type_overrides: Vec::new(),
        },
        ..PlanOptions::default()
    };
    let mut tasks = Vec::new();
    let mut deps = Vec::new();
    for i in 0..shape.n_tasks {
        let mut t = task(&format!("t{i}"));
        t.on_failure = chain(vec![retry.clone()]);
        t.timeout = shape.task_timeout.map(ms);
        tasks.push(t);
        // Sparse random edges to earlier tasks keep the graph acyclic.
        let mask = shape.dep_masks[i] & shape.dep_masks[(i + 1) % shape.n_tasks];
        deps.push(
            (0..i)
                .filter(|j| mask & (1 << j) != 0)
                .collect::<Vec<TaskIdx>>(),
        );
    }
    if shape.chain_task0 {
        let mut fallback = task("fallback");
        fallback.is_fallback_only = true;
        tasks.push(fallback);
        deps.push(Vec::new());
        let fallback_idx = tasks.len() - 1;
        tasks[0].fallback = Some(fallback_idx);
        tasks[0].on_failure = chain(vec![
            FailureAction::Retry { max: 1, backoff },
            FailureAction::Reassign,
            FailureAction::Fallback { task: fallback_idx },
            FailureAction::Pause,
            FailureAction::Skip,
        ]);
    }
    build_plan(options, tasks, deps, &shape.conflicts)
}

#[derive(Clone, Debug)]
enum Op {
    Decide(u16),
    Complete(u16),
    Fail(u16, bool),
    Spawn(u16, u8, u8),
    Ask(u16, bool),
    Answer(u16),
    Lost(u16),
    Start(u16),
    Duplicate(u16),
    Pause,
    Resume,
    Cancel,
    /// Pause plan task `t<i % 10>` on its own, in preempt mode or not.
    Hold(u8, bool),
    Release(u8),
    Preempted(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => any::<u16>().prop_map(|t| Op::Decide(t % 300)),
        8 => any::<u16>().prop_map(Op::Complete),
        3 => (any::<u16>(), any::<bool>()).prop_map(|(i, r)| Op::Fail(i, r)),
        2 => (any::<u16>(), 1u8..5, any::<u8>()).prop_map(|(i, n, r)| Op::Spawn(i, n, r)),
        1 => (any::<u16>(), any::<bool>()).prop_map(|(i, e)| Op::Ask(i, e)),
        1 => any::<u16>().prop_map(Op::Answer),
        1 => any::<u16>().prop_map(Op::Lost),
        1 => any::<u16>().prop_map(Op::Start),
        4 => any::<u16>().prop_map(Op::Duplicate),
        1 => Just(Op::Pause),
        2 => Just(Op::Resume),
        1 => Just(Op::Cancel),
        1 => (any::<u8>(), any::<bool>()).prop_map(|(i, p)| Op::Hold(i, p)),
        2 => any::<u8>().prop_map(Op::Release),
        1 => any::<u16>().prop_map(Op::Preempted),
    ]
}

struct Harness {
    sim: Sim,
    applied_results: HashMap<(TaskInstanceId, u32), u32>,
    questions: Vec<QuestionId>,
    counter: u128,
}

impl Harness {
    fn running(&self) -> Vec<TaskInstanceId> {
        let mut running: Vec<_> = self.sim.exec.instances_in(TaskState::Running).collect();
        running.sort();
        running
    }

    fn pick(&self, i: u16) -> Option<(TaskInstanceId, u32)> {
        let running = self.running();
        let instance = *running.get(usize::from(i) % running.len().max(1))?;
        Some((instance, self.sim.exec.attempt(instance)?))
    }

    fn result(&mut self, body: EventBody) {
        let key = match &body {
            EventBody::TaskCompleted {
                instance, attempt, ..
            }
            | EventBody::TaskFailed {
                instance, attempt, ..
            }
            | EventBody::SubtasksSpawned {
                instance, attempt, ..
            }
            | EventBody::QuestionAsked {
                instance, attempt, ..
            } => Some((*instance, *attempt)),
            _ => None,
        };
        match self.sim.apply(body) {
            Ok(Applied::Changed { .. }) => {
                if let Some(key) = key {
                    let count = self.applied_results.entry(key).or_default();
                    *count += 1;
                    assert_eq!(*count, 1, "a result of {key:?} was applied twice");
                }
            }
            Ok(Applied::Ignored(_)) => {}
            Err(err) => panic!("a result for a running attempt was refused: {err}"),
        }
    }

    fn run(&mut self, op: Op) {
        let sim_now = self.sim.now;
        match op {
            Op::Decide(advance) => {
                self.sim.advance(u64::from(advance));
                self.sim.decide();
            }
            Op::Complete(i) => {
                if let Some((instance, attempt)) = self.pick(i) {
                    let usage = Usage {
                        tokens_used: 10,
                        cost: 0.01,
                    };
                    self.result(EventBody::TaskCompleted {
                        instance,
                        attempt,
                        output: serde_json::json!(i),
                        usage,
                    });
                }
            }
            Op::Fail(i, retryable) => {
                if let Some((instance, attempt)) = self.pick(i) {
                    let error = "boom".to_owned();
                    self.result(EventBody::TaskFailed {
                        instance,
                        attempt,
                        error,
                        retryable,
                        usage: Usage::default(),
                    });
                }
            }
            Op::Spawn(i, n, rule) => {
                if self.sim.exec.n_instances() > 150 {
                    return;
                }
                if let Some((instance, attempt)) = self.pick(i) {
                    self.counter += 1;
                    let rule = match rule % 4 {
                        0 => GroupRule::AllSettled,
                        1 => GroupRule::AllSucceeded,
                        2 if n > 0 => GroupRule::Quorum(u32::from(rule % n) + 1),
                        _ => GroupRule::FirstSuccess,
                    };
                    let members = (0..n)
                        .map(|m| SubtaskSpec {
                            task_type: "noop".into(),
                            queue: None,
                            input: serde_json::json!(m),
                        })
                        .collect();
                    let group = GroupId::derived(sim_now, self.counter);
                    self.result(EventBody::SubtasksSpawned {
                        instance,
                        attempt,
                        group,
                        rule,
                        members,
                    });
                }
            }
            Op::Ask(i, expires) => {
                if let Some((instance, attempt)) = self.pick(i) {
                    self.counter += 1;
                    let question = Question {
                        id: QuestionId::derived(sim_now, self.counter),
                        question_type: "approval".into(),
                        priority: "low".into(),
                        text: "ok?".into(),
                        options: vec![],
                        expires_at_ms: expires.then_some(sim_now + 500),
                        timeout_action: TimeoutAction::Answer("default".into()),
                    };
                    self.questions.push(question.id);
                    self.result(EventBody::QuestionAsked {
                        instance,
                        attempt,
                        question,
                    });
                }
            }
            Op::Answer(i) => {
                if let Some(&question) = self
                    .questions
                    .get(usize::from(i) % self.questions.len().max(1))
                {
                    let _ = self.sim.apply(EventBody::QuestionAnswered {
                        question,
                        answer: "yes".into(),
                    });
                }
            }
            Op::Lost(i) => {
                if let Some((instance, attempt)) = self.pick(i) {
                    self.result(EventBody::TaskLost { instance, attempt });
                }
            }
            Op::Start(i) => {
                if let Some((instance, attempt)) = self.pick(i) {
                    let worker = WorkerId(format!("w{}", i % 3));
                    self.result(EventBody::TaskStarted {
                        instance,
                        attempt,
                        worker,
                    });
                }
            }
            Op::Duplicate(i) => {
                let past: Vec<_> = self
                    .sim
                    .log
                    .iter()
                    .filter(|e| {
                        matches!(
                            e.body,
                            EventBody::TaskCompleted { .. }
                                | EventBody::TaskFailed { .. }
                                | EventBody::SubtasksSpawned { .. }
                                | EventBody::QuestionAsked { .. }
                                | EventBody::TaskDispatched { .. }
                        )
                    })
                    .map(|e| e.body.clone())
                    .collect();
                if let Some(body) = past.get(usize::from(i) % past.len().max(1)).cloned() {
                    let again = self.sim.apply(body.clone());
                    assert!(
                        matches!(again, Ok(Applied::Ignored(_))),
                        "redelivered {body:?} gave {again:?}"
                    );
                }
            }
            Op::Pause => {
                let _ = self.sim.apply(EventBody::pause("test"));
            }
            Op::Resume => {
                let _ = self.sim.apply(EventBody::resume());
            }
            Op::Cancel => {
                let _ = self.sim.apply(EventBody::CancelRequested {
                    reason: "test".into(),
                });
            }
            Op::Hold(i, preempt) => {
                let _ = self.sim.apply(EventBody::PauseRequested {
                    reason: "test".into(),
                    scope: PauseScope::Task(format!("t{}", i % 10)),
                    mode: if preempt {
                        PauseMode::Preempt
                    } else {
                        PauseMode::Drain
                    },
                });
            }
            Op::Release(i) => {
                let _ = self.sim.apply(EventBody::ResumeRequested {
                    scope: PauseScope::Task(format!("t{}", i % 10)),
                });
            }
            Op::Preempted(i) => {
                if let Some((instance, attempt)) = self.pick(i) {
                    self.result(EventBody::TaskPreempted { instance, attempt });
                }
            }
        }
        self.check_invariants();
    }

    fn check_invariants(&self) {
        let exec = &self.sim.exec;
        let plan = exec.plan();
        // 2. concurrency and path locks.
        let running = self.running();
        if let Some(limit) = plan.options.max_concurrency {
            assert!(
                exec.running() <= limit,
                "{} running, limit {limit}",
                exec.running()
            );
        }
        assert_eq!(exec.running() as usize, running.len());
        // Those of them with no start recorded are the ones still waiting for a worker.
        let unstarted = running
            .iter()
            .filter(|i| exec.record(**i).is_some_and(|r| r.worker_id.is_none()))
            .count();
        assert_eq!(exec.unstarted() as usize, unstarted);
        let locks: Vec<TaskIdx> = running.iter().filter_map(|i| exec.lock_task(*i)).collect();
        for (k, a) in locks.iter().enumerate() {
            for b in &locks[k + 1..] {
                assert!(
                    !plan.conflicts[*a].contains(b),
                    "conflicting tasks {a} and {b} run together"
                );
            }
        }
        // 1. dependencies first.
        for instance in &running {
            if let Some(task_idx) = exec.instance_task(*instance) {
                for &dep in &plan.deps[task_idx] {
                    let outcome = exec.task_outcome(dep);
                    assert!(
                        matches!(outcome, Some(TaskState::Completed | TaskState::Skipped)),
                        "task {task_idx} runs while its dependency {dep} is {outcome:?}"
                    );
                }
            }
        }
        // An open question waits on an instance that waits for it: a cancelled asker takes its
        // question with it, or an answer would continue work nothing waits for.
        for open in exec.open_questions() {
            assert_eq!(
                exec.instance_state(open.instance),
                Some(TaskState::WaitingForHuman),
                "question {} is open on an instance that is not waiting",
                open.question.id
            );
        }
        // Nothing the machine decides changes before its next wake: a coordinator that decides
        // again only then (or on an event) misses nothing.
        let now = self.sim.now;
        let decided = exec.decide(now);
        match exec.next_wake(now) {
            Some(at) => {
                assert!(at > now, "next wake {at} is not after now ({now})");
                assert_eq!(
                    exec.decide(at - 1),
                    decided,
                    "decisions changed before the next wake at {at} (now {now})"
                );
            }
            None => assert_eq!(
                exec.decide(now + 10 * 365 * 86_400_000),
                decided,
                "decisions changed with the clock though nothing is timed"
            ),
        }
        // Progress counts the instances kept as their states change: as many in each state as
        // counting them again (a restored copy counts them), and the queued ones a conflicting
        // task holds back as blocked, as their records show them.
        let restored = Execution::restore(Arc::clone(plan), &exec.snapshot());
        assert!(restored.is_ok_and(|r| r == *exec), "restore diverged");
        let counts = exec.progress(now).counts;
        let records = exec.records();
        let shown = |state| records[1..].iter().filter(|r| r.state == state).count() as u64;
        for state in [TaskState::Queued, TaskState::Blocked] {
            assert_eq!(
                counts.get(state),
                shown(state),
                "{state:?} instances miscounted"
            );
        }
        // 3. at most one resumption per group, at any time.
        for (group, _, _, _) in exec.groups() {
            assert!(
                exec.resumptions_of(group) <= 1,
                "group {group} resumed twice"
            );
        }
    }

    /// Plays a well-behaved user and workers until the execution ends.
    fn drain(&mut self) {
        for _ in 0..2_000 {
            if self.sim.exec.state().is_terminal() {
                return;
            }
            let _ = self.sim.apply(EventBody::resume());
            let held: Vec<PauseScope> = self.sim.exec.holds().map(|(scope, _)| scope).collect();
            for scope in held {
                let _ = self.sim.apply(EventBody::ResumeRequested { scope });
            }
            for question in self.questions.clone() {
                let _ = self.sim.apply(EventBody::QuestionAnswered {
                    question,
                    answer: "yes".into(),
                });
            }
            self.sim.advance(100);
            self.sim.decide();
            for (n, instance) in self.running().into_iter().enumerate() {
                self.run(Op::Complete(n as u16));
                let _ = instance;
            }
            self.check_invariants();
        }
        panic!(
            "execution did not end in run {}: {:?}",
            self.sim.exec.run_number(),
            self.sim.exec.progress(self.sim.now)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_and_replay_rebuilds_the_state(shape in plan_shape(), ops in prop::collection::vec(op(), 0..120)) {
        let plan = make_plan(&shape);
        let mut harness = Harness {
            sim: Sim::new(plan),
            applied_results: HashMap::new(),
            questions: Vec::new(),
            counter: 0,
        };
        for op in ops {
            harness.run(op);
        }
        // 6. A snapshot taken mid-way restores the identical state, and the events after it bring
        // the restored copy to the final state.
        let snapshot = harness.sim.exec.snapshot();
        let snapshot_at = harness.sim.log.len();
        let restored = Execution::restore(Arc::clone(harness.sim.exec.plan()), &snapshot);
        prop_assert!(restored.as_ref().is_ok_and(|r| *r == harness.sim.exec), "restore diverged");
        prop_assert_eq!(restored.as_ref().map(Execution::snapshot).ok(), Some(snapshot.clone()), "snapshot bytes are not deterministic");
        harness.drain();
        if let Ok(mut restored) = restored {
            for event in &harness.sim.log[snapshot_at..] {
                prop_assert!(restored.apply(event).is_ok(), "event after the snapshot refused");
            }
            prop_assert!(restored == harness.sim.exec, "restore + replay diverged");
        }
        let exec = &harness.sim.exec;
        prop_assert!(exec.state().is_terminal());
        if exec.state() == ExecutionState::Completed {
            // 3. every group of a completed execution resumed its parent exactly once.
            for (group, _, settled, abandoned) in exec.groups() {
                prop_assert!(settled);
                let expected = usize::from(!abandoned);
                prop_assert_eq!(exec.resumptions_of(group), expected, "group {} resumed wrongly", group);
            }
        }
        // The instances always form one seed-000 tree.
        let records = exec.records();
        let n_records = records.len();
        let graph = trellis_core::graph::build(records);
        prop_assert!(graph.is_ok(), "{:?}", graph.err());
        prop_assert_eq!(graph.map(|g| g.n_nodes()).unwrap_or(0), n_records);
        // Replaying the log (duplicates included) rebuilds the identical state.
        let replayed = harness.sim.replay();
        prop_assert!(replayed == *exec, "replay diverged");
        // A reader that keeps only the changed records ends with every record as it is.
        let mut reader = Execution::start(exec.id(), Arc::clone(exec.plan()), 1, crate::common::T0);
        let mut kept = HashMap::new();
        for record in reader.take_changed_records() {
            kept.insert(record.task_instance_id, record);
        }
        for (n, event) in harness.sim.log.iter().enumerate() {
            prop_assert!(reader.apply(event).is_ok());
            if n % 3 == 0 || n + 1 == harness.sim.log.len() {
                for record in reader.take_changed_records() {
                    kept.insert(record.task_instance_id, record);
                }
            }
        }
        let all = exec.records();
        prop_assert_eq!(kept.len(), all.len());
        for record in &all {
            prop_assert_eq!(kept.get(&record.task_instance_id), Some(record));
        }

        // A failed or cancelled execution runs again: tasks that completed keep their outcome, the
        // others run in run 2, and the execution ends again.
        if matches!(exec.state(), ExecutionState::Failed | ExecutionState::Cancelled) {
            let n_tasks = exec.plan().tasks.len();
            let before: Vec<_> = (0..n_tasks).map(|t| exec.task_outcome(t)).collect();
            let applied = harness.sim.apply(EventBody::RunStarted { run: 2 });
            prop_assert!(applied.is_ok(), "run 2 refused: {:?}", applied.err());
            prop_assert_eq!(harness.sim.exec.run_number(), 2);
            harness.drain();
            let exec = &harness.sim.exec;
            prop_assert!(exec.state().is_terminal());
            for (t, outcome) in before.iter().enumerate() {
                if *outcome == Some(TaskState::Completed) {
                    prop_assert_eq!(exec.task_outcome(t), Some(TaskState::Completed), "task {} completed in run 1 changed", t);
                }
            }
            let graph = trellis_core::graph::build(exec.records());
            prop_assert!(graph.is_ok(), "{:?}", graph.err());
            let replayed = harness.sim.replay();
            prop_assert!(replayed == *exec, "replay across runs diverged");
        }
    }

    /// Snapshot bytes that were damaged are refused or restored, never a panic.
    #[test]
    fn damaged_snapshots_never_panic(shape in plan_shape(), ops in prop::collection::vec(op(), 0..60), flips in prop::collection::vec((any::<u32>(), any::<u8>()), 1..8), cut in any::<u32>()) {
        let plan = make_plan(&shape);
        let mut harness = Harness {
            sim: Sim::new(Arc::clone(&plan)),
            applied_results: HashMap::new(),
            questions: Vec::new(),
            counter: 0,
        };
        for op in ops {
            harness.run(op);
        }
        let mut bytes = harness.sim.exec.snapshot();
        for (at, xor) in flips {
            let len = bytes.len();
            bytes[at as usize % len] ^= xor.max(1);
        }
        let _ = Execution::restore(Arc::clone(&plan), &bytes);
        let len = bytes.len();
        bytes.truncate(cut as usize % len);
        prop_assert!(Execution::restore(plan, &bytes).is_err() || bytes.is_empty());
    }
}
