//! Cycles in the task graph, found without recursion so a 100,000-task chain is handled like any
//! other plan: loops of `subtask_of` links, and dependency cycles (Kahn's algorithm removes
//! everything not on or behind a cycle, an iterative Tarjan finds the strongly connected
//! components of what is left). The compiler reports what these return; decoding refuses a plan
//! for which they return anything.

use super::model::TaskIdx;

/// Returns every loop of parent links (`parent[t]` is the parent of `t`, its `subtask_of`), each
/// starting at its lowest task and followed parent by parent, in the order of their lowest task's
/// first walk. Every index in `parent` must be in range.
pub(super) fn parent_loops(parent: &[Option<TaskIdx>]) -> Vec<Vec<TaskIdx>> {
    // 0 = unvisited, 1 = on the current walk, 2 = done.
    let mut state = vec![0u8; parent.len()];
    let mut res = Vec::new();
    for start in 0..parent.len() {
        let mut walk = Vec::new();
        let mut v = start;
        while state[v] == 0 {
            state[v] = 1;
            walk.push(v);
            match parent[v] {
                Some(p) => v = p,
                None => break,
            }
        }
        if state[v] == 1 && parent[v].is_some() {
            // `v` is on this walk: the part of the walk from `v` on is a loop.
            let pos = walk.iter().position(|&w| w == v).unwrap_or(0);
            res.push(from_lowest(&walk[pos..]));
        }
        for w in walk {
            state[w] = 2;
        }
    }
    res
}

/// Returns one dependency cycle per strongly connected component that has one (none for a DAG),
/// ordered by lowest task: each starts at its lowest task and lists the tasks in the order
/// `deps` follows them (each task depends on the next, the last on the first). A task that
/// depends on itself is a cycle of one. Every index in `deps` and `dependents` (the reverse of
/// `deps`) must be in range.
pub(super) fn dependency_cycles(
    deps: &[Vec<TaskIdx>],
    dependents: &[Vec<TaskIdx>],
) -> Vec<Vec<TaskIdx>> {
    let n = deps.len();
    let mut remaining_deps: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut ready: Vec<TaskIdx> = (0..n).filter(|&t| remaining_deps[t] == 0).collect();
    let mut n_done = 0;
    while let Some(t) = ready.pop() {
        n_done += 1;
        for &d in &dependents[t] {
            remaining_deps[d] -= 1;
            if remaining_deps[d] == 0 {
                ready.push(d);
            }
        }
    }
    if n_done == n {
        return Vec::new();
    }
    let active: Vec<bool> = remaining_deps.iter().map(|&r| r > 0).collect();
    let components = strongly_connected(deps, &active);
    let mut component_of = vec![usize::MAX; n];
    for (k, component) in components.iter().enumerate() {
        for &t in component {
            component_of[t] = k;
        }
    }
    let mut res = Vec::with_capacity(components.len());
    let mut pos_in_walk = vec![usize::MAX; n];
    for (k, component) in components.iter().enumerate() {
        let Some(&start) = component.iter().min() else {
            continue;
        };
        let mut walk = Vec::new();
        let mut v = start;
        let cycle = loop {
            if pos_in_walk[v] != usize::MAX {
                break &walk[pos_in_walk[v]..];
            }
            pos_in_walk[v] = walk.len();
            walk.push(v);
            // Every member of a component with a cycle has a dependency inside it.
            match deps[v].iter().find(|&&d| component_of[d] == k) {
                Some(&next) => v = next,
                None => break &walk[..0],
            }
        };
        if !cycle.is_empty() {
            res.push(from_lowest(cycle));
        }
    }
    res
}

/// Returns the cycle rotated to start at its lowest task.
fn from_lowest(cycle: &[TaskIdx]) -> Vec<TaskIdx> {
    let at = cycle
        .iter()
        .enumerate()
        .min_by_key(|&(_, &t)| t)
        .map_or(0, |(at, _)| at);
    cycle[at..].iter().chain(&cycle[..at]).copied().collect()
}

/// Returns the strongly connected components among the `active` tasks that hold a cycle (two or
/// more tasks, or one that depends on itself), ordered by their lowest task index (Tarjan's
/// algorithm with an explicit stack).
fn strongly_connected(deps: &[Vec<TaskIdx>], active: &[bool]) -> Vec<Vec<TaskIdx>> {
    const UNSEEN: usize = usize::MAX;
    let n = deps.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0usize; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<TaskIdx> = Vec::new();
    let mut calls: Vec<(TaskIdx, usize)> = Vec::new();
    let mut counter = 0;
    let mut res = Vec::new();
    for root in 0..n {
        if !active[root] || index[root] != UNSEEN {
            continue;
        }
        index[root] = counter;
        low[root] = counter;
        counter += 1;
        stack.push(root);
        on_stack[root] = true;
        calls.push((root, 0));
        while let Some((v, pos)) = calls.last_mut() {
            let v = *v;
            if let Some(&w) = deps[v].get(*pos) {
                *pos += 1;
                if !active[w] {
                    continue;
                }
                if index[w] == UNSEEN {
                    index[w] = counter;
                    low[w] = counter;
                    counter += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    calls.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 || deps[v].contains(&v) {
                    res.push(component);
                }
            }
        }
    }
    res.sort_unstable_by_key(|component| component.iter().min().copied());
    res
}
