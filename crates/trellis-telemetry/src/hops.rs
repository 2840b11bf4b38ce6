//! Where one task's time goes: a process-wide trace of named points on the hot path (the
//! coordinator took a request, an append was stored, a worker received a task, ...), recorded
//! only while a benchmark asks for it.
//!
//! `trellis bench` hosts every service in one process, so their marks share one monotonic clock:
//! it [`start`]s a trace, runs one task, [`take`]s the marks and reads the time between
//! consecutive points of the path ([`Path::split`]). When no trace is on, a mark is one relaxed
//! atomic load: the services call [`mark`] unconditionally.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Whether marks are recorded.
static ON: AtomicBool = AtomicBool::new(false);
/// The marks of the current trace, in the order they were made.
static TRACE: Mutex<Vec<(&'static str, Instant)>> = Mutex::new(Vec::new());
/// Most marks one trace keeps: a trace left on by mistake cannot grow without bound.
const MAX_MARKS: usize = 4096;

/// Records that the hot path reached `point` now, if a trace is on.
#[inline]
pub fn mark(point: &'static str) {
    if ON.load(Ordering::Relaxed) {
        record(point, Instant::now());
    }
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

/// Starts a new trace, dropping any earlier marks.
pub fn start() {
    TRACE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clear();
    ON.store(true, Ordering::Relaxed);
}

/// Ends the trace and returns its marks in the order they were made.
pub fn take() -> Vec<(&'static str, Instant)> {
    ON.store(false, Ordering::Relaxed);
    std::mem::take(
        &mut *TRACE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    )
}

/// A path through the marks: hops, each named and ending at a point.
#[derive(Clone, Copy, Debug)]
pub struct Path<'a> {
    hops: &'a [(&'static str, &'static str)],
}

impl<'a> Path<'a> {
    /// A path of `(hop, point)` pairs: each hop runs from the previous hop's point (or the
    /// start) to its own.
    pub const fn new(hops: &'a [(&'static str, &'static str)]) -> Self {
        Path { hops }
    }

    /// The names of the hops, in order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.hops.iter().map(|(hop, _)| *hop)
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
        let mut split = Vec::with_capacity(self.hops.len());
        for (hop, point) in self.hops {
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

    const PATH: Path<'static> = Path::new(&[("a", "x"), ("b", "y"), ("c", "x")]);

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

    #[test]
    fn marks_are_kept_only_while_a_trace_is_on() {
        // The one test of this crate that touches the process-wide trace.
        mark("before");
        start();
        mark("during");
        let marks = take();
        mark("after");
        let points: Vec<&str> = marks.iter().map(|(point, _)| *point).collect();
        assert_eq!(points, ["during"]);
        assert!(take().is_empty(), "nothing recorded after the trace ended");
    }
}
