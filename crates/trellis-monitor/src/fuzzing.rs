//! What the monitor does with the event log messages it reads, up to the first I/O, for the
//! fuzz targets in `fuzz/` (feature `fuzzing`; not a stable API).

use trellis_core::ids::ExecutionId;

/// Feeds event log messages of execution `id` (`trellis.events.<id>`) to a fresh hub, the
/// monitor's live projection of one execution, as its reader does, and reads back what its
/// streams and pages serve. Returns whether the hub still follows the log (false: the log did
/// not replay, and the hub answers with the execution and the sequence).
pub fn follow_event_log(id: ExecutionId, payloads: &[&[u8]]) -> bool {
    crate::hub::fuzzing::follow(id, payloads)
}
