//! State-machine throughput: events applied per second on one core.
//!
//! The event logs are produced once by driving executions to completion (the decisions and the
//! worker results a coordinator would record); each iteration replays a log on a fresh execution,
//! which is exactly the work `apply` does live and during recovery.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use trellis_core::ids::{ExecutionId, GroupId, TaskInstanceId};
use trellis_core::machine::{Event, EventBody, Execution, GroupRule, SubtaskSpec, Usage};
use trellis_core::plan::{Plan, PlanOptions, Task};
use trellis_core::record::TaskState;

/// `n` tasks; with `chain`, each depends on the previous one.
fn plan(n: usize, chain: bool) -> Arc<Plan> {
    let tasks: Vec<Task> = (0..n).map(|i| Task::new(format!("t{i}"), "noop")).collect();
    let deps: Vec<Vec<usize>> = (0..n)
        .map(|i| if chain && i > 0 { vec![i - 1] } else { vec![] })
        .collect();
    let mut dependents = vec![Vec::new(); n];
    for (t, ds) in deps.iter().enumerate() {
        for &d in ds {
            dependents[d].push(t);
        }
    }
    let index = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.id.clone(), i))
        .collect();
    Arc::new(Plan {
        name: "bench".into(),
        options: PlanOptions::default(),
        tasks,
        deps,
        dependents,
        conflicts: vec![Vec::new(); n],
        index,
        shape: Default::default(),
    })
}

const T0: u64 = 1_700_000_000_000;

/// Runs the execution to the end, spawning a group of `fanout` members from the first task if
/// asked, and returns the log.
fn record(plan: Arc<Plan>, fanout: usize) -> Vec<Event> {
    let mut exec = Execution::start(ExecutionId::v7(T0, [1; 10]), plan, 1, T0);
    let mut log = Vec::new();
    let mut spawned = false;
    let mut now = T0;
    let apply = |exec: &mut Execution, log: &mut Vec<Event>, event: Event| {
        exec.apply(&event).expect("valid event");
        log.push(event);
    };
    while !exec.state().is_terminal() {
        now += 1;
        for command in exec.decide(now) {
            apply(&mut exec, &mut log, command.into_event(now));
        }
        let running: Vec<_> = exec.instances_in(TaskState::Running).collect();
        for instance in running {
            let attempt = exec.attempt(instance).expect("instance exists");
            let body = if fanout > 0 && !spawned {
                spawned = true;
                let members = (0..fanout)
                    .map(|_| SubtaskSpec {
                        task_type: "noop".into(),
                        queue: None,
                        input: serde_json::Value::Null,
                    })
                    .collect();
                let group = GroupId::derived(now, 1);
                EventBody::SubtasksSpawned {
                    instance,
                    attempt,
                    group,
                    rule: GroupRule::AllSettled,
                    members,
                }
            } else {
                let output = serde_json::Value::Null;
                EventBody::TaskCompleted {
                    instance,
                    attempt,
                    output,
                    usage: Usage::default(),
                }
            };
            apply(&mut exec, &mut log, Event { at_ms: now, body });
        }
    }
    log
}

fn replay(c: &mut Criterion, name: &str, plan: Arc<Plan>, log: &[Event]) {
    let mut group = c.benchmark_group("machine");
    group.throughput(Throughput::Elements(log.len() as u64));
    group.sample_size(10);
    group.bench_function(name, |b| {
        b.iter(|| {
            let mut exec = Execution::start(ExecutionId::v7(T0, [1; 10]), Arc::clone(&plan), 1, T0);
            for event in log {
                let _ = black_box(exec.apply(event));
            }
            exec
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    let independent = plan(100_000, false);
    let log = record(Arc::clone(&independent), 0);
    replay(c, "apply_100k_independent_tasks", independent, &log);

    let chain = plan(10_000, true);
    let log = record(Arc::clone(&chain), 0);
    replay(c, "apply_10k_chain", chain, &log);

    let single = plan(1, false);
    let log = record(Arc::clone(&single), 100_000);
    replay(c, "apply_fanout_100k", single, &log);

    // A new execution of 20,000 independent tasks (the `throughput` scenario's): its state
    // built, every task ready, then the first decision with a dispatch window of 256.
    let wide = plan(20_000, false);
    c.bench_function("machine/start_20k", |b| {
        b.iter(|| {
            let exec = Execution::start(ExecutionId::v7(T0, [1; 10]), Arc::clone(&wide), 1, T0);
            let decided = exec.decide_holding(T0 + 1, 256, &mut |_, _| false).len();
            black_box((exec, decided))
        })
    });

    // Dropping that execution once every task completed with a small output: what leaving
    // memory costs a finished execution of the `throughput` scenario's size.
    c.bench_function("machine/drop_20k_done", |b| {
        b.iter_batched(
            || {
                let mut exec =
                    Execution::start(ExecutionId::v7(T0, [1; 10]), Arc::clone(&wide), 1, T0);
                let queued: Vec<_> = exec.instances_in(TaskState::Queued).collect();
                for (k, instance) in queued.into_iter().enumerate() {
                    run_attempt(&mut exec, instance, Some(k));
                }
                for command in exec.decide(T0 + 2) {
                    let event = command.into_event(T0 + 2);
                    exec.apply(&event).expect("the machine's own decision");
                }
                assert!(exec.state().is_terminal(), "every task completed");
                exec
            },
            drop,
            BatchSize::LargeInput,
        )
    });

    let independent = plan(100_000, false);
    let exec = Execution::start(ExecutionId::v7(T0, [1; 10]), independent, 1, T0);
    c.bench_function("machine/decide_100k_ready", |b| {
        b.iter(|| black_box(exec.decide(T0 + 1)).len())
    });
    // Every candidate held by the callback (a fleet pause; a full dispatch window once cost
    // this too), and no room at all (a full dispatch window now).
    c.bench_function("machine/decide_100k_ready_all_held", |b| {
        b.iter(|| black_box(exec.decide_holding(T0 + 1, u32::MAX, &mut |_, _| true)).len())
    });
    c.bench_function("machine/decide_100k_ready_no_room", |b| {
        b.iter(|| black_box(exec.decide_holding(T0 + 1, 0, &mut |_, _| true)).len())
    });

    // The state a checkpoint of the `checkpoint` scenario holds: 10,000 tasks, half completed
    // with a small output, half running.
    let tasks = plan(10_000, false);
    let mut exec = Execution::start(ExecutionId::v7(T0, [1; 10]), Arc::clone(&tasks), 1, T0);
    let queued: Vec<_> = exec.instances_in(TaskState::Queued).collect();
    for (k, instance) in queued.into_iter().enumerate() {
        run_attempt(&mut exec, instance, (k % 2 == 0).then_some(k));
    }
    let bytes = exec.snapshot();
    let mut group = c.benchmark_group("snapshot");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function("create_10k_half_done", |b| {
        b.iter(|| black_box(exec.snapshot()))
    });
    group.bench_function("sha256_10k_half_done", |b| {
        b.iter(|| black_box(trellis_core::checksum::sha256(&bytes)))
    });
    group.bench_function("restore_10k_half_done", |b| {
        b.iter(|| Execution::restore(Arc::clone(&tasks), black_box(&bytes)).expect("restores"))
    });
    group.finish();
}

/// Records `instance`'s first attempt dispatched and started, and completed with the output
/// `{"k": k}` when `completed` is `Some(k)` (else left running).
fn run_attempt(exec: &mut Execution, instance: TaskInstanceId, completed: Option<usize>) {
    let mut apply = |body| {
        exec.apply(&Event {
            at_ms: T0 + 1,
            body,
        })
        .expect("valid event")
    };
    apply(EventBody::TaskDispatched {
        instance,
        attempt: 1,
    });
    apply(EventBody::TaskStarted {
        instance,
        attempt: 1,
        worker: "bench-worker".into(),
    });
    if let Some(k) = completed {
        apply(EventBody::TaskCompleted {
            instance,
            attempt: 1,
            output: serde_json::json!({ "k": k }),
            usage: Usage::default(),
        });
    }
}

criterion_group!(machine, benches);
criterion_main!(machine);
