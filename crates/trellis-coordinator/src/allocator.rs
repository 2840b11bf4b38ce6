//! The allocator's settings in a process that hosts a coordinator (`trellis-coordinator`, and
//! `trellis` for `dev`, `demo` and `bench`).
//!
//! mimalloc hands memory freed for [`PURGE_DELAY`] back to the system (its own default is one
//! second) and takes it back on the next allocation that needs it, where the kernel zeroes it
//! again: with transparent huge pages, which mimalloc asks for, a whole 2 MiB page at a time. A
//! coordinator's memory comes and goes with its executions: a 20,000-task execution's state,
//! plan and logs are built, dropped once it ends, and built again for the next a moment later.
//! With the one-second delay, a profile of `trellis bench --scenario loaded` (every service in
//! one process) spent 7.4 % of its samples in the kernel zeroing huge pages on first touch of
//! memory mimalloc had just handed back. Memory idle for longer still goes back, so a
//! coordinator still shrinks once its executions have left it.

use std::time::Duration;

/// How long memory stays freed in mimalloc before it is handed back to the system.
pub const PURGE_DELAY: Duration = Duration::from_secs(10);

/// `mi_option_purge_delay` in mimalloc's `mi_option_t` (the sys crate names no constant for it):
/// milliseconds; 0 hands freed memory back at once, -1 never.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Applies the settings; call it first thing in `main`. A delay set in the environment
/// (`MIMALLOC_PURGE_DELAY`, in milliseconds) is the operator's and stays. Affects mimalloc only:
/// a process whose global allocator is another one is unchanged.
pub fn tune() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    let millis = c_long_of(PURGE_DELAY.as_millis());
    // SAFETY: `mi_option_set` stores a number in mimalloc's table of options (an atomic store);
    // any thread may call it at any time, and mimalloc reads the option afresh at each purge.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, millis);
    }
}

/// The purge delay mimalloc works with now, in milliseconds.
pub fn purge_delay_ms() -> std::os::raw::c_long {
    // SAFETY: `mi_option_get` reads mimalloc's table of options (initializing the option from
    // the environment on first use); any thread may call it at any time.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY)
    }
}

/// `millis` as C's `long`; the delay is seconds, far below its limit.
fn c_long_of(millis: u128) -> std::os::raw::c_long {
    std::os::raw::c_long::try_from(millis).unwrap_or(std::os::raw::c_long::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option set is mimalloc's purge delay: before it is set, it reads as the delay's
    /// documented default (one second in mimalloc 3; no option near it has that default), and
    /// once set, as the delay chosen.
    #[test]
    fn tune_sets_mimalloc_s_purge_delay() {
        if let Ok(set) = std::env::var("MIMALLOC_PURGE_DELAY") {
            tune();
            assert_eq!(
                purge_delay_ms().to_string(),
                set,
                "the environment's delay stays"
            );
            return;
        }
        assert_eq!(purge_delay_ms(), 1000, "mimalloc's default purge delay");
        tune();
        assert_eq!(purge_delay_ms(), 10_000);
    }
}
