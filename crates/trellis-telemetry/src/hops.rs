//! Where one task's time goes: a process-wide trace of named points on the hot path (the
//! coordinator took a request, an append was stored, a worker received a task, ...), recorded
//! only while a benchmark asks for it.
//!
//! `trellis bench` hosts every service in one process, so their marks share one monotonic clock:
//! it [`start`]s a trace, runs one task, [`take`]s the marks and reads the time between
//! consecutive points of the path ([`Path::split`]). When no trace is on, a mark is one relaxed
//! atomic load: the services call [`mark`] unconditionally.
//!
//! Under load the marks of many executions interleave. A trace that [`watch`]es keeps only one
//! execution's: the points that know their execution mark with [`mark_for`] (or [`mark_any`]
//! for a batch of several), the first new execution the coordinator appends after the trace
//! starts [`claim`]s it, and the marks of every other execution, and unkeyed marks, are dropped.
//!
//! ```
//! use trellis_telemetry::hops::{self, Path};
//!
//! hops::start();
//! hops::mark("request");
//! hops::mark("appended");
//! let trace = hops::take();
//! let path = Path::new(&[("append", "appended")]);
//! let split = path.split("request", &trace).expect("every point was reached");
//! assert_eq!(split.len(), 1);
//! assert_eq!(split[0].0, "append");
//! ```

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Whether marks are recorded.
static ON: AtomicBool = AtomicBool::new(false);
/// The marks of the current trace, in the order they were made.
static TRACE: Mutex<Vec<(&'static str, Instant)>> = Mutex::new(Vec::new());
/// Whose marks the trace keeps: [`OPEN`], every mark; [`UNCLAIMED`], none until an execution
/// is [`claim`]ed; otherwise the [`key`] of the one execution watched.
static WATCHED: AtomicU64 = AtomicU64::new(OPEN);
const OPEN: u64 = u64::MAX;
const UNCLAIMED: u64 = 0;
/// Most marks one trace keeps: a trace left on by mistake cannot grow without bound.
const MAX_MARKS: usize = 4096;

/// Whether a trace is on: a point can skip finding its execution's id when none is.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Records that the hot path reached `point` now, if a trace is on and watches no execution.
#[inline]
pub fn mark(point: &'static str) {
    if ON.load(Ordering::Relaxed) && WATCHED.load(Ordering::Relaxed) == OPEN {
        record(point, Instant::now());
    }
}

/// Records that execution `id` (a UUID's 128 bits) reached `point` now, if a trace is on and
/// keeps its marks.
#[inline]
pub fn mark_for(point: &'static str, id: u128) {
    mark_any(point, std::iter::once(id));
}

/// Records that a batch of executions (`ids`) reached `point` now, if a trace is on and keeps the
/// marks of one of them. `ids` is only iterated while a trace watches an execution: a lazy
/// iterator costs nothing otherwise.
#[inline]
pub fn mark_any(point: &'static str, ids: impl IntoIterator<Item = u128>) {
    if ON.load(Ordering::Relaxed) {
        let watched = WATCHED.load(Ordering::Relaxed);
        if watched == OPEN || ids.into_iter().any(|id| key(id) == watched) {
            record(point, Instant::now());
        }
    }
}

/// Makes the first of `new` (executions whose first events are about to be appended) the one
/// the trace watches, if it watches none yet. `new` is only iterated then.
#[inline]
pub fn claim(new: impl IntoIterator<Item = u128>) {
    if ON.load(Ordering::Relaxed)
        && WATCHED.load(Ordering::Relaxed) == UNCLAIMED
        && let Some(id) = new.into_iter().next()
    {
        // Another thread's claim may have come first: the trace keeps that one.
        let _ = WATCHED.compare_exchange(UNCLAIMED, key(id), Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Whether the trace watches execution `id`: the one that [`claim`]ed it may be another than the
/// caller started.
pub fn watches(id: u128) -> bool {
    WATCHED.load(Ordering::Relaxed) == key(id)
}

/// The 64 bits a watch compares: never [`OPEN`] or [`UNCLAIMED`].
fn key(id: u128) -> u64 {
    match (id as u64) ^ ((id >> 64) as u64) {
        OPEN | UNCLAIMED => 1,
        key => key,
    }
}

/// An execution id's text (a UUID, with or without hyphens) as the 128 bits marks take; `None`
/// if it is not one.
pub fn id_bits(id: &str) -> Option<u128> {
    let mut hex = [0u8; 32];
    let mut n = 0;
    for byte in id.bytes().filter(|byte| *byte != b'-') {
        if !byte.is_ascii_hexdigit() {
            return None;
        }
        *hex.get_mut(n)? = byte;
        n += 1;
    }
    if n != hex.len() {
        return None;
    }
    u128::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()
}

#[cold]
fn record(point: &'static str, at: Instant) {
    // A poisoned lock only means a thread panicked while pushing: the marks are still usable.
    let mut trace = TRACE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if trace.len() < MAX_MARKS {
        trace.push((point, at));
    }
}

/// Starts a new trace of every mark, dropping any earlier marks.
pub fn start() {
    begin(OPEN);
}

/// Starts a new trace of one execution's marks: the first that [`claim`]s it.
pub fn watch() {
    begin(UNCLAIMED);
}

fn begin(watched: u64) {
    TRACE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clear();
    WATCHED.store(watched, Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
}

/// Ends the trace and returns its marks in the order they were made.
pub fn take() -> Vec<(&'static str, Instant)> {
    ON.store(false, Ordering::Relaxed);
    WATCHED.store(OPEN, Ordering::Relaxed);
    std::mem::take(
        &mut *TRACE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    )
}

/// A path through the marks: hops, each named and ending at a point.
#[derive(Clone, Copy, Debug)]
pub struct Path<'a> {
    head: &'a [(&'static str, &'static str)],
    tail: &'a [(&'static str, &'static str)],
}

impl<'a> Path<'a> {
    /// A path of `(hop, point)` pairs: each hop runs from the previous hop's point (or the
    /// start) to its own.
    pub const fn new(hops: &'a [(&'static str, &'static str)]) -> Self {
        Path {
            head: hops,
            tail: &[],
        }
    }

    /// The hops of `head`, then those of `tail`: paths that end alike share their ends.
    pub const fn joined(
        head: &'a [(&'static str, &'static str)],
        tail: &'a [(&'static str, &'static str)],
    ) -> Self {
        Path { head, tail }
    }

    fn hops(&self) -> impl Iterator<Item = &(&'static str, &'static str)> + '_ {
        self.head.iter().chain(self.tail)
    }

    /// The names of the hops, in order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.hops().map(|(hop, _)| *hop)
    }

    /// Splits a trace along the path: from the first mark of `from`, each hop lasts until the
    /// first mark of its point made after the previous hop's. Marks the path does not name (a
    /// heartbeat's append, another request) are passed over. `None` if a point was never
    /// reached after its predecessor.
    pub fn split(
        &self,
        from: &'static str,
        trace: &[(&'static str, Instant)],
    ) -> Option<Vec<(&'static str, Duration)>> {
        let mut at = trace.iter().position(|(point, _)| *point == from)?;
        let mut split = Vec::with_capacity(self.head.len() + self.tail.len());
        for (hop, point) in self.hops() {
            let next = at + 1 + trace[at + 1..].iter().position(|(p, _)| p == point)?;
            split.push((*hop, trace[next].1.duration_since(trace[at].1)));
            at = next;
        }
        Some(split)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: Path<'static> = Path::joined(&[("a", "x")], &[("b", "y"), ("c", "x")]);

    fn trace(points: &[&'static str]) -> Vec<(&'static str, Instant)> {
        let start = Instant::now();
        points
            .iter()
            .enumerate()
            .map(|(i, point)| (*point, start + Duration::from_micros(10 * i as u64)))
            .collect()
    }

    #[test]
    fn a_hop_runs_from_the_previous_point_to_the_next_mark_of_its_own() {
        let marks = trace(&["noise", "start", "x", "noise", "y", "x", "x"]);
        let split = PATH.split("start", &marks).expect("all reached");
        let micros: Vec<(&str, u128)> = split
            .iter()
            .map(|(hop, took)| (*hop, took.as_micros()))
            .collect();
        assert_eq!(micros, [("a", 10), ("b", 20), ("c", 10)]);
    }

    #[test]
    fn a_point_reached_only_before_its_predecessor_is_not_reached() {
        assert!(PATH.split("start", &trace(&["start", "y", "x"])).is_none());
        assert!(PATH.split("start", &trace(&["x", "y", "x"])).is_none());
    }

    fn points(marks: &[(&'static str, Instant)]) -> Vec<&'static str> {
        marks.iter().map(|(point, _)| *point).collect()
    }

    #[test]
    fn marks_are_kept_only_while_a_trace_is_on_and_a_watch_keeps_one_executions() {
        // The one test of this crate that touches the process-wide trace: its parts run in turn.
        mark("before");
        start();
        mark("during");
        mark_for("keyed", 7);
        let marks = take();
        mark("after");
        assert_eq!(points(&marks), ["during", "keyed"]);
        assert!(take().is_empty(), "nothing recorded after the trace ended");

        watch();
        mark_for("before the claim", 7);
        claim(std::iter::empty());
        claim([7, 8]);
        claim([8]);
        mark("unkeyed");
        mark_for("watched", 7);
        mark_for("another", 8);
        mark_any("a batch with it", [8, 7]);
        mark_any("a batch without it", [8, 9]);
        assert!(watches(7) && !watches(8));
        let marks = take();
        assert_eq!(points(&marks), ["watched", "a batch with it"]);
        assert!(!watches(7), "the watch ends with its trace");
    }

    #[test]
    fn an_id_reads_as_its_uuid_bits() {
        let bits = 0x67e5_5044_10b1_426f_9247_bb68_0e5f_e0c8;
        assert_eq!(id_bits("67e55044-10b1-426f-9247-bb680e5fe0c8"), Some(bits));
        assert_eq!(id_bits("67E5504410B1426F9247BB680E5FE0C8"), Some(bits));
        assert_eq!(id_bits("67e55044-10b1-426f-9247-bb680e5fe0c"), None);
        assert_eq!(id_bits("67e55044-10b1-426f-9247-bb680e5fe0c80"), None);
        assert_eq!(id_bits("g7e55044-10b1-426f-9247-bb680e5fe0c8"), None);
        assert_eq!(id_bits("+7e55044-10b1-426f-9247-bb680e5fe0c8"), None);
        assert_eq!(id_bits(""), None);
    }

    #[test]
    fn no_id_keys_as_open_or_unclaimed() {
        assert_ne!(key(u128::from(u64::MAX)), OPEN);
        assert_ne!(key(0), UNCLAIMED);
        assert_ne!(key(5 << 64 | 5), UNCLAIMED);
    }
}
