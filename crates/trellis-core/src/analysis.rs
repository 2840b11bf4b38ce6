//! Plan analysis: waves, conflict pairs, critical path and maximum parallelism (seed 001's
//! `parallelism_analysis`), for display and planning.
//!
//! Waves do not drive dispatch (the coordinator starts a task as soon as its dependencies are met);
//! they show the shape of a plan and where an execution stands ("wave 3 of 7").
//! Everything here is linear in the plan's size plus the number of conflict pairs.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::plan::{FileOp, Plan, Task, TaskIdx};

/// The analysis of a compiled plan; indices refer to [`Plan::tasks`]. [`Analysis::report`] gives
/// the serialisable form, with task ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Analysis {
    /// `waves[0]` holds the tasks with no dependencies; a task is in the wave right after the
    /// latest wave of its dependencies. Declaration order inside a wave. Fallback-only tasks and
    /// subtasks are not in any wave: they run only in their role.
    pub waves: Vec<Vec<TaskIdx>>,
    /// For each task, its index in `waves`, `None` for tasks listed apart.
    pub wave_of: Vec<Option<usize>>,
    /// Tasks that run only as another task's fallback.
    pub fallback_only: Vec<TaskIdx>,
    /// Tasks that run as members of their parent's static subtask group.
    pub subtasks: Vec<TaskIdx>,
    /// Every pair of tasks that may not run together, each once, `a < b`, ordered by `(a, b)`.
    pub conflict_pairs: Vec<ConflictPair>,
    pub critical_path: CriticalPath,
    pub max_parallelism: Parallelism,
    /// Tasks that wait for a conflicting task of their own wave: scanning each wave in
    /// declaration order, a task that conflicts with one taken before it is blocked by those.
    /// Ordered by wave, then declaration.
    pub blocked: Vec<Blocked>,
}

/// A task held back in its wave by conflicting tasks declared before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub task: TaskIdx,
    /// The tasks of the same wave, taken before it, that it conflicts with (declaration order).
    pub by: Vec<TaskIdx>,
}

/// Two tasks that may not run at the same time, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConflictPair {
    pub a: TaskIdx,
    pub b: TaskIdx,
    /// Sorted: file reasons by path, then a declared `conflicts_with`.
    pub reasons: Vec<ConflictReason>,
}

/// Why two tasks conflict.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConflictReason {
    /// Both touch `path` with a conflicting pair of operations (`op_a` is task `a`'s).
    File {
        path: String,
        op_a: FileOp,
        op_b: FileOp,
    },
    /// One declares `conflicts_with` the other.
    Declared,
}

/// The longest dependency chain among the tasks in waves.
///
/// Chains are measured in tasks, unless every task in a wave declares a `timeout`: then they are
/// measured by the sum of timeouts (the worst-case duration) and `total_timeout` holds it. Ties go
/// to the chain ending at, and passing through, the lowest task indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CriticalPath {
    /// From the first task to the last; empty only for a plan with no task in a wave.
    pub tasks: Vec<TaskIdx>,
    pub total_timeout: Option<Duration>,
}

/// How many tasks could run at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Parallelism {
    /// The size of the widest wave.
    pub widest_wave: usize,
    /// Its index in [`Analysis::waves`] (the first one, on ties).
    pub widest_wave_idx: usize,
    /// The most tasks of one wave that may run together once conflicting tasks are serialised.
    /// Picking the largest conflict-free set is NP-hard, so each wave is scanned greedily in
    /// declaration order (a task joins unless it conflicts with one already taken): this is a
    /// lower bound of the true figure, and exact when a wave has no conflicts.
    pub without_conflicts: usize,
    pub without_conflicts_wave_idx: usize,
}

/// Analyses a compiled plan.
pub fn analyze(plan: &Plan) -> Analysis {
    let order = topological_order(plan);
    let apart = |t: TaskIdx| plan.tasks[t].is_fallback_only || plan.tasks[t].subtask_of.is_some();
    let Waves {
        waves,
        wave_of,
        fallback_only,
        subtasks,
    } = waves_in_order(plan, &order);
    let (max_parallelism, blocked) = parallelism(plan, &waves);
    Analysis {
        conflict_pairs: conflict_pairs(plan),
        critical_path: critical_path(plan, &order, &apart),
        max_parallelism,
        blocked,
        waves,
        wave_of,
        fallback_only,
        subtasks,
    }
}

/// The waves of a plan: wave k (0-based here) holds the tasks whose dependencies all sit in
/// earlier waves. Fallback-only tasks and static subtasks are listed apart and belong to no wave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waves {
    pub waves: Vec<Vec<TaskIdx>>,
    pub wave_of: Vec<Option<usize>>,
    pub fallback_only: Vec<TaskIdx>,
    pub subtasks: Vec<TaskIdx>,
}

/// Returns the plan's waves.
pub fn waves(plan: &Plan) -> Waves {
    waves_in_order(plan, &topological_order(plan))
}

fn waves_in_order(plan: &Plan, order: &[TaskIdx]) -> Waves {
    let n = plan.tasks.len();
    // Levels over the whole graph, so an ordering through a task listed apart still counts.
    let mut level = vec![0usize; n];
    for &t in order {
        level[t] = plan.deps[t]
            .iter()
            .map(|&d| level[d] + 1)
            .max()
            .unwrap_or(0);
    }
    let mut placed = vec![false; n];
    for &t in order {
        placed[t] = true;
    }
    let n_levels = order.iter().map(|&t| level[t] + 1).max().unwrap_or(0);
    let mut by_level: Vec<Vec<TaskIdx>> = vec![Vec::new(); n_levels];
    let mut fallback_only = Vec::new();
    let mut subtasks = Vec::new();
    for t in 0..n {
        if plan.tasks[t].is_fallback_only {
            fallback_only.push(t);
        } else if plan.tasks[t].subtask_of.is_some() {
            subtasks.push(t);
        } else if placed[t] {
            by_level[level[t]].push(t);
        }
    }
    // A level holding only tasks listed apart leaves no empty wave behind.
    let waves: Vec<Vec<TaskIdx>> = by_level.into_iter().filter(|w| !w.is_empty()).collect();
    let mut wave_of = vec![None; n];
    for (w, wave) in waves.iter().enumerate() {
        for &t in wave {
            wave_of[t] = Some(w);
        }
    }
    Waves {
        waves,
        wave_of,
        fallback_only,
        subtasks,
    }
}

/// Returns the tasks in an order where every task comes after its dependencies (Kahn's algorithm,
/// first-in first-out, so the order is deterministic). A compiled plan has no cycle; should one be
/// built by hand, the tasks on or behind a cycle are left out rather than looping.
pub fn topological_order(plan: &Plan) -> Vec<TaskIdx> {
    let n = plan.tasks.len();
    let mut remaining: Vec<usize> = plan.deps.iter().map(Vec::len).collect();
    let mut order: Vec<TaskIdx> = (0..n).filter(|&t| remaining[t] == 0).collect();
    let mut next = 0;
    while let Some(&t) = order.get(next) {
        next += 1;
        for &d in &plan.dependents[t] {
            remaining[d] -= 1;
            if remaining[d] == 0 {
                order.push(d);
            }
        }
    }
    order
}

/// Calls `f(a, op_a, b, op_b, path)` for every pair of distinct tasks whose impacts on one path
/// conflict (seed 001's matrix), going through a path index so that tasks sharing no path are
/// never compared and readers are never paired with each other.
///
/// A pair is reported once per conflicting impact pair, so callers deduplicate. Impacts whose
/// confidence is below `min_confidence` are ignored (`options.min_conflict_confidence`).
pub fn for_each_file_conflict(
    tasks: &[Task],
    min_confidence: f32,
    mut f: impl FnMut(TaskIdx, FileOp, TaskIdx, FileOp, &str),
) {
    // Path → the tasks touching it, one list per operation (CREATE, UPDATE, DELETE, READ).
    let mut by_path: HashMap<&str, [Vec<TaskIdx>; 4]> = HashMap::new();
    for (t, task) in tasks.iter().enumerate() {
        for impact in task.files.iter().filter(|i| i.confidence >= min_confidence) {
            by_path.entry(impact.path.as_str()).or_default()[op_slot(impact.op)].push(t);
        }
    }
    const OPS: [FileOp; 4] = [FileOp::Create, FileOp::Update, FileOp::Delete, FileOp::Read];
    for (path, lists) in &by_path {
        for (x, &op_x) in OPS.iter().enumerate() {
            for (y, &op_y) in OPS.iter().enumerate().skip(x) {
                if !op_x.conflicts_with(op_y) {
                    continue;
                }
                let (xs, ys) = (&lists[x], &lists[y]);
                for (i, &a) in xs.iter().enumerate() {
                    // Same operation: each unordered pair once.
                    let partners = if x == y { &ys[i + 1..] } else { &ys[..] };
                    for &b in partners {
                        if a != b {
                            f(a, op_x, b, op_y, path);
                        }
                    }
                }
            }
        }
    }
}

fn op_slot(op: FileOp) -> usize {
    match op {
        FileOp::Create => 0,
        FileOp::Update => 1,
        FileOp::Delete => 2,
        FileOp::Read => 3,
    }
}

fn conflict_pairs(plan: &Plan) -> Vec<ConflictPair> {
    let mut reasons: HashMap<(TaskIdx, TaskIdx), Vec<ConflictReason>> = HashMap::new();
    let min_confidence = plan.options.min_conflict_confidence;
    for_each_file_conflict(&plan.tasks, min_confidence, |a, op_a, b, op_b, path| {
        let (a, op_a, b, op_b) = if a < b {
            (a, op_a, b, op_b)
        } else {
            (b, op_b, a, op_a)
        };
        reasons
            .entry((a, b))
            .or_default()
            .push(ConflictReason::File {
                path: path.to_owned(),
                op_a,
                op_b,
            });
    });
    for (t, task) in plan.tasks.iter().enumerate() {
        for rel in &task.relationships {
            if rel.kind == crate::plan::RelationshipKind::ConflictsWith {
                let key = (t.min(rel.target), t.max(rel.target));
                reasons
                    .entry(key)
                    .or_default()
                    .push(ConflictReason::Declared);
            }
        }
    }
    let mut res: Vec<ConflictPair> = reasons
        .into_iter()
        .map(|((a, b), mut reasons)| {
            reasons.sort();
            reasons.dedup();
            ConflictPair { a, b, reasons }
        })
        .collect();
    res.sort_unstable_by_key(|pair| (pair.a, pair.b));
    res
}

fn critical_path(plan: &Plan, order: &[TaskIdx], apart: &dyn Fn(TaskIdx) -> bool) -> CriticalPath {
    let n = plan.tasks.len();
    let by_timeout = order
        .iter()
        .filter(|&&t| !apart(t))
        .all(|&t| plan.tasks[t].timeout.is_some());
    let weight = |t: TaskIdx| -> u128 {
        match plan.tasks[t].timeout {
            Some(d) if by_timeout => d.as_nanos(),
            _ => 1,
        }
    };
    // dist[t]: the heaviest chain ending at t; pred[t]: the previous task on it.
    let mut dist = vec![0u128; n];
    let mut pred: Vec<Option<TaskIdx>> = vec![None; n];
    let mut best: Option<TaskIdx> = None;
    for &t in order {
        if apart(t) {
            continue;
        }
        let mut longest: Option<TaskIdx> = None;
        for &d in &plan.deps[t] {
            if apart(d) {
                continue;
            }
            // `deps` is sorted, so on ties the lowest index wins.
            if longest.is_none_or(|l| dist[d] > dist[l]) {
                longest = Some(d);
            }
        }
        dist[t] = weight(t) + longest.map_or(0, |l| dist[l]);
        pred[t] = longest;
        if best.is_none_or(|b| dist[t] > dist[b] || (dist[t] == dist[b] && t < b)) {
            best = Some(t);
        }
    }
    let mut tasks = Vec::new();
    let mut cursor = best;
    while let Some(t) = cursor {
        tasks.push(t);
        cursor = pred[t];
    }
    tasks.reverse();
    let total_timeout = (by_timeout && !tasks.is_empty())
        .then(|| tasks.iter().filter_map(|&t| plan.tasks[t].timeout).sum());
    CriticalPath {
        tasks,
        total_timeout,
    }
}

fn parallelism(plan: &Plan, waves: &[Vec<TaskIdx>]) -> (Parallelism, Vec<Blocked>) {
    let mut res = Parallelism::default();
    let mut blocked = Vec::new();
    // taken[t] == w + 1 when task t was taken in wave w: no clearing between waves.
    let mut taken = vec![0usize; plan.tasks.len()];
    for (w, wave) in waves.iter().enumerate() {
        if wave.len() > res.widest_wave {
            res.widest_wave = wave.len();
            res.widest_wave_idx = w;
        }
        let mut n_taken = 0;
        for &t in wave {
            let mut by: Vec<TaskIdx> = plan.conflicts[t]
                .iter()
                .copied()
                .filter(|&c| taken[c] == w + 1)
                .collect();
            if by.is_empty() {
                taken[t] = w + 1;
                n_taken += 1;
            } else {
                by.sort_unstable();
                blocked.push(Blocked { task: t, by });
            }
        }
        if n_taken > res.without_conflicts {
            res.without_conflicts = n_taken;
            res.without_conflicts_wave_idx = w;
        }
    }
    (res, blocked)
}

/// The serialisable form of an [`Analysis`], naming tasks by id.
#[derive(Clone, Debug, Serialize)]
pub struct Report<'a> {
    pub plan: &'a str,
    pub n_tasks: usize,
    pub waves: Vec<Vec<&'a str>>,
    pub fallback_only: Vec<&'a str>,
    pub subtasks: Vec<SubtaskReport<'a>>,
    pub conflicts: Vec<ConflictReport<'a>>,
    pub critical_path: CriticalPathReport<'a>,
    pub max_parallelism: ParallelismReport,
    /// Tasks held back in their wave by conflicting tasks declared before them.
    pub blocked: Vec<BlockedReport<'a>>,
}

/// A blocked task and the tasks it waits for.
#[derive(Clone, Debug, Serialize)]
pub struct BlockedReport<'a> {
    pub task: &'a str,
    pub by: Vec<&'a str>,
}

/// A subtask and its parent.
#[derive(Clone, Debug, Serialize)]
pub struct SubtaskReport<'a> {
    pub task: &'a str,
    pub parent: &'a str,
}

/// A conflict pair with its reasons.
#[derive(Clone, Debug, Serialize)]
pub struct ConflictReport<'a> {
    pub a: &'a str,
    pub b: &'a str,
    pub reasons: Vec<ReasonReport<'a>>,
}

/// One reason of a conflict.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReasonReport<'a> {
    /// `ops` are task `a`'s and task `b`'s operations on `path`.
    File {
        path: &'a str,
        ops: [&'static str; 2],
    },
    ConflictsWith,
}

/// The critical path.
#[derive(Clone, Debug, Serialize)]
pub struct CriticalPathReport<'a> {
    pub tasks: Vec<&'a str>,
    /// `"tasks"` (chain length) or `"timeout"` (sum of timeouts).
    pub weighted_by: &'static str,
    /// The sum of the path's timeouts, in humantime form (`1h 5m`), when weighted by timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_timeout: Option<String>,
}

/// The parallelism figures, waves numbered from 1.
#[derive(Clone, Debug, Serialize)]
pub struct ParallelismReport {
    pub widest_wave: usize,
    pub widest_wave_number: usize,
    pub without_conflicts: usize,
    pub without_conflicts_wave_number: usize,
}

/// Returns the name of a file operation as written in plans (`CREATE`, ...).
pub fn op_name(op: FileOp) -> &'static str {
    match op {
        FileOp::Create => "CREATE",
        FileOp::Update => "UPDATE",
        FileOp::Delete => "DELETE",
        FileOp::Read => "READ",
    }
}

impl Analysis {
    /// Returns the serialisable form of this analysis of `plan`, naming tasks by id.
    pub fn report<'a>(&self, plan: &'a Plan) -> Report<'a> {
        let id = |t: TaskIdx| plan.tasks[t].id.as_str();
        Report {
            plan: &plan.name,
            n_tasks: plan.tasks.len(),
            waves: self
                .waves
                .iter()
                .map(|wave| wave.iter().map(|&t| id(t)).collect())
                .collect(),
            fallback_only: self.fallback_only.iter().map(|&t| id(t)).collect(),
            subtasks: self
                .subtasks
                .iter()
                .filter_map(|&t| {
                    plan.tasks[t].subtask_of.map(|p| SubtaskReport {
                        task: id(t),
                        parent: id(p),
                    })
                })
                .collect(),
            conflicts: self
                .conflict_pairs
                .iter()
                .map(|pair| ConflictReport {
                    a: id(pair.a),
                    b: id(pair.b),
                    reasons: pair
                        .reasons
                        .iter()
                        .map(|reason| match reason {
                            ConflictReason::File { path, op_a, op_b } => ReasonReport::File {
                                path: plan_path(plan, pair.a, path),
                                ops: [op_name(*op_a), op_name(*op_b)],
                            },
                            ConflictReason::Declared => ReasonReport::ConflictsWith,
                        })
                        .collect(),
                })
                .collect(),
            critical_path: CriticalPathReport {
                tasks: self.critical_path.tasks.iter().map(|&t| id(t)).collect(),
                weighted_by: if self.critical_path.total_timeout.is_some() {
                    "timeout"
                } else {
                    "tasks"
                },
                total_timeout: self
                    .critical_path
                    .total_timeout
                    .map(|d| humantime::format_duration(d).to_string()),
            },
            max_parallelism: ParallelismReport {
                widest_wave: self.max_parallelism.widest_wave,
                widest_wave_number: self.max_parallelism.widest_wave_idx + 1,
                without_conflicts: self.max_parallelism.without_conflicts,
                without_conflicts_wave_number: self.max_parallelism.without_conflicts_wave_idx + 1,
            },
            blocked: self
                .blocked
                .iter()
                .map(|b| BlockedReport {
                    task: id(b.task),
                    by: b.by.iter().map(|&t| id(t)).collect(),
                })
                .collect(),
        }
    }
}

/// Returns the plan's own copy of `path` (borrowed for the report's lifetime), as task `t` wrote it.
fn plan_path<'a>(plan: &'a Plan, t: TaskIdx, path: &str) -> &'a str {
    plan.tasks[t]
        .files
        .iter()
        .find(|impact| impact.path == path)
        .map_or("", |impact| impact.path.as_str())
}
