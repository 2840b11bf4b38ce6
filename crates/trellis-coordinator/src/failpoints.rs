//! Failpoints: places in the executor where a fault test stops the coordinator at an exact
//! instant, to SIGKILL it there. Compiled only with the cargo feature `failpoints` (which only
//! the system tests enable); without it every call is an empty inline function.
//!
//! `TRELLIS_FAILPOINT=<point>[:<n>]` arms one point: the `n`-th time (1 by default) the executor
//! reaches it, the coordinator writes `failpoint <point> reached` to stderr and stops itself
//! with SIGSTOP, every thread at once, so nothing after the point happens before the test's
//! SIGKILL (or its SIGCONT). The points:
//! - `before-append`: a turn decided and its appends are about to be sent (woken past its
//!   lease, the coordinator sends them to a log another owner has extended since);
//! - `after-append`: a turn's appends are stored; nothing they allow (assignments, cancels,
//!   acknowledgements, answers) is carried out;
//! - `before-ack`: the turn's assignments and cancels are published; the results it consumed
//!   are not acknowledged;
//! - `group-settled`: as `after-append`, in a turn whose appends settled a subtask group (its
//!   last member's result applied and its parent resumed).

/// The points, as `TRELLIS_FAILPOINT` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Point {
    BeforeAppend,
    AfterAppend,
    BeforeAck,
    GroupSettled,
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::Point;

    /// The armed point, the hit it stops at, and the hits so far.
    struct Armed {
        name: String,
        point: Point,
        at: u64,
        hits: AtomicU64,
    }

    fn armed() -> Option<&'static Armed> {
        static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let value = std::env::var("TRELLIS_FAILPOINT").ok()?;
                let (name, at) = value.split_once(':').unwrap_or((value.as_str(), "1"));
                let point = match name {
                    "before-append" => Point::BeforeAppend,
                    "after-append" => Point::AfterAppend,
                    "before-ack" => Point::BeforeAck,
                    "group-settled" => Point::GroupSettled,
                    _ => {
                        eprintln!("TRELLIS_FAILPOINT={value}: unknown point {name}; none armed");
                        return None;
                    }
                };
                let Ok(at) = at.parse() else {
                    eprintln!("TRELLIS_FAILPOINT={value}: {at} is not a count; none armed");
                    return None;
                };
                Some(Armed {
                    name: name.to_owned(),
                    point,
                    at,
                    hits: AtomicU64::new(0),
                })
            })
            .as_ref()
    }

    pub(crate) fn is_armed(point: Point) -> bool {
        armed().is_some_and(|armed| armed.point == point)
    }

    pub(crate) fn reached(point: Point) {
        let Some(armed) = armed().filter(|armed| armed.point == point) else {
            return;
        };
        if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 != armed.at {
            return;
        }
        eprintln!(
            "failpoint {} reached (hit {}): stopping for the test's SIGKILL",
            armed.name, armed.at
        );
        // SAFETY: `raise` only sends a signal to this process; SIGSTOP cannot be caught, so no
        // handler runs. The process stays stopped until SIGKILL (or SIGCONT) arrives.
        #[allow(unsafe_code)]
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
    }
}

/// Returns whether `point` is armed (so a caller computes what only the point needs).
#[cfg(feature = "failpoints")]
pub(crate) fn is_armed(point: Point) -> bool {
    armed::is_armed(point)
}

/// The executor reached `point`.
#[cfg(feature = "failpoints")]
pub(crate) fn reached(point: Point) {
    armed::reached(point);
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn is_armed(_point: Point) -> bool {
    false
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn reached(_point: Point) {}
