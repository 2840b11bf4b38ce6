//! NATS subjects, JetStream stream names and header keys of docs/design.md §3, in one place so no
//! service spells a subject by hand.
//!
//! Subject tokens (queue names, shard numbers, ids) must not contain `.`, `*`, `>` or whitespace;
//! ids are UUIDs and queue names are checked where plans are compiled
//! (`trellis_core::plan::check_queue_name`) and by workers, so the builders do not re-check.

/// JetStream stream holding every execution's event log (`trellis.events.>`, limits retention).
pub const EVENTS_STREAM: &str = "TRELLIS_EVENTS";
/// JetStream stream of task assignments (`trellis.tasks.>`, work-queue retention).
pub const TASKS_STREAM: &str = "TRELLIS_TASKS";
/// JetStream stream of task results (`trellis.results.>`).
pub const RESULTS_STREAM: &str = "TRELLIS_RESULTS";
/// JetStream stream of task log lines (`trellis.logs.>`, limits retention: bounded by age and
/// size, oldest dropped first).
pub const LOGS_STREAM: &str = "TRELLIS_LOGS";

/// JetStream KV bucket where workers keep the durable steps of running task instances, keyed by
/// instance id (`RecordedSteps` values), so a redelivered attempt resumes after them.
pub const STEPS_BUCKET: &str = "trellis_steps";

/// JetStream KV bucket of fencing epochs, keyed by execution id (decimal `u64` values): written by
/// a coordinator that takes an execution over with attempts running, read (watched) by every
/// worker, which refuses an assignment whose `fence` is below its execution's entry.
pub const FENCES_BUCKET: &str = "trellis_fences";

/// Prefix of task subjects; a queue's subject is `trellis.tasks.<queue>`.
pub const TASKS_PREFIX: &str = "trellis.tasks";
/// Prefix of result subjects; a shard's subject is `trellis.results.<shard>`.
pub const RESULTS_PREFIX: &str = "trellis.results";
/// Prefix of the subjects a worker hands a shard's final results to its coordinator on directly
/// (core NATS request): `trellis.handoff.<shard>`. Outside [`RESULTS_WILDCARD`], so no stream
/// stores them.
pub const HANDOFF_PREFIX: &str = "trellis.handoff";
/// Queue group the coordinators hear hand-offs in: one of them takes each.
pub const HANDOFF_QUEUE_GROUP: &str = "coordinators";
/// A coordinator's reply to a hand-off whose results it is done with: their events are stored
/// (or the results were set aside). Any other reply, or none, leaves them to the worker, which
/// publishes them to `trellis.results.<shard>` instead.
pub const HANDOFF_DONE: &[u8] = b"done";
/// A coordinator's reply to a hand-off it did not store: publish the results to the stream.
pub const HANDOFF_PUBLISH: &[u8] = b"publish";
/// Prefix of offer subjects: a queue's idle workers hear `trellis.offer.<queue>`.
pub const OFFER_PREFIX: &str = "trellis.offer";
/// Queue group a queue's workers hear offers in: one of them gets each.
pub const OFFER_QUEUE_GROUP: &str = "workers";
/// A worker's reply to an offer it took: the attempt is started there.
pub const OFFER_TAKEN: &[u8] = b"taken";
/// A worker's reply to an offer it has no free slot for (or takes none while draining).
pub const OFFER_BUSY: &[u8] = b"busy";
/// Prefix of event subjects; an execution's subject is `trellis.events.<execution_id>`.
pub const EVENTS_PREFIX: &str = "trellis.events";
/// Prefix of log subjects; an instance's lines go to `trellis.logs.<execution_id>.<instance_id>`.
pub const LOGS_PREFIX: &str = "trellis.logs";
/// Prefix of progress subjects; an execution's subject is `trellis.progress.<execution_id>`.
pub const PROGRESS_PREFIX: &str = "trellis.progress";
/// Prefix of heartbeat subjects; a worker's subject is `trellis.workers.heartbeat.<worker_id>`.
pub const HEARTBEAT_PREFIX: &str = "trellis.workers.heartbeat";
/// Prefix of cancel subjects; an instance's subject is `trellis.cancel.<task_instance_id>`.
pub const CANCEL_PREFIX: &str = "trellis.cancel";
/// Prefix of the drain requests to one worker (`DrainWorker`, core NATS).
pub const DRAIN_PREFIX: &str = "trellis.workers.drain";
/// Prefix of circuit breaker transitions; a queue's are on `trellis.breakers.<queue>`.
pub const BREAKERS_PREFIX: &str = "trellis.breakers";

/// Subjects captured by [`TASKS_STREAM`].
pub const TASKS_WILDCARD: &str = "trellis.tasks.>";
/// Subjects captured by [`RESULTS_STREAM`].
pub const RESULTS_WILDCARD: &str = "trellis.results.>";
/// Subjects captured by [`EVENTS_STREAM`].
pub const EVENTS_WILDCARD: &str = "trellis.events.>";
/// Subjects captured by [`LOGS_STREAM`].
pub const LOGS_WILDCARD: &str = "trellis.logs.>";
/// Every progress subject, for observers of all executions.
pub const PROGRESS_WILDCARD: &str = "trellis.progress.>";
/// Every heartbeat subject, which the coordinator subscribes to.
pub const HEARTBEAT_WILDCARD: &str = "trellis.workers.heartbeat.>";

/// JetStream's de-duplication header.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// Header marking a message on a results subject as a `TaskResultBatch`; its value is the number
/// of results (a reader may count them without decoding). Without it the message is one
/// `TaskResult`.
pub const RESULT_BATCH_HEADER: &str = "Trellis-Result-Batch";
/// Header marking a message on a task subject as a `TaskAssignmentBatch`; its value is the
/// number of assignments. Without it the message is one `TaskAssignment`.
pub const ASSIGNMENT_BATCH_HEADER: &str = "Trellis-Assignment-Batch";
/// Most bytes of entries one batch message (a `TaskResultBatch`, a `TaskAssignmentBatch`)
/// carries; an entry larger than that goes alone. Well under the 1 MiB a default NATS server
/// accepts in one message.
pub const BATCH_BYTES: usize = 256 * 1024;
/// W3C trace-context header carried on every message so one execution is one trace.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// Returns the subject a worker hears drain requests on.
pub fn drain(worker_id: impl std::fmt::Display) -> String {
    format!("{DRAIN_PREFIX}.{worker_id}")
}

/// Returns the subject a `TaskAssignment` for `queue` is published on: `trellis.tasks.<queue>`.
pub fn tasks(queue: &str) -> String {
    format!("{TASKS_PREFIX}.{queue}")
}

/// Returns the subject of `queue`'s fast lane: `trellis.tasks.~.<queue>` (one token more than
/// any queue's subject, so no queue's). The first few tasks in flight of each execution go
/// there, and workers take them beside the queue's others, so a small execution's task does not
/// wait behind a large one's.
pub fn fast_tasks(queue: &str) -> String {
    format!("{TASKS_PREFIX}.~.{queue}")
}

/// Returns the subject a `TaskResult` for coordinator shard `shard` is published on:
/// `trellis.results.<shard>`.
pub fn results(shard: u32) -> String {
    format!("{RESULTS_PREFIX}.{shard}")
}

/// Returns the subject a worker hands final results for coordinator shard `shard` over on,
/// bypassing the results stream: `trellis.handoff.<shard>`.
pub fn handoff(shard: u32) -> String {
    format!("{HANDOFF_PREFIX}.{shard}")
}

/// Returns the subject assignments of `queue` are offered on: `trellis.offer.<queue>`.
pub fn offer(queue: &str) -> String {
    format!("{OFFER_PREFIX}.{queue}")
}

/// Returns the subject of an execution's event log: `trellis.events.<execution_id>`.
pub fn events(execution_id: impl std::fmt::Display) -> String {
    format!("{EVENTS_PREFIX}.{execution_id}")
}

/// Returns the subject a task instance's log lines go to:
/// `trellis.logs.<execution_id>.<task_instance_id>`.
pub fn logs(
    execution_id: impl std::fmt::Display,
    task_instance_id: impl std::fmt::Display,
) -> String {
    format!("{LOGS_PREFIX}.{execution_id}.{task_instance_id}")
}

/// Returns the filter matching the log lines of every instance of an execution:
/// `trellis.logs.<execution_id>.*`.
pub fn execution_logs(execution_id: impl std::fmt::Display) -> String {
    format!("{LOGS_PREFIX}.{execution_id}.*")
}

/// Returns the subject of an execution's progress snapshots: `trellis.progress.<execution_id>`.
pub fn progress(execution_id: impl std::fmt::Display) -> String {
    format!("{PROGRESS_PREFIX}.{execution_id}")
}

/// Returns the subject a worker's heartbeats go to: `trellis.workers.heartbeat.<worker_id>`.
pub fn heartbeat(worker_id: impl std::fmt::Display) -> String {
    format!("{HEARTBEAT_PREFIX}.{worker_id}")
}

/// Returns the subject asking the worker of a task instance to stop it:
/// `trellis.cancel.<task_instance_id>`.
pub fn cancel(task_instance_id: impl std::fmt::Display) -> String {
    format!("{CANCEL_PREFIX}.{task_instance_id}")
}

/// Returns the subject a queue's circuit breaker transitions go to (core NATS).
pub fn breakers(queue: &str) -> String {
    format!("{BREAKERS_PREFIX}.{queue}")
}

/// Returns the `Nats-Msg-Id` of a task assignment, `<task_instance_id>:<attempt>`, which is also
/// the handler's idempotency key: JetStream drops a second publish of the same attempt.
pub fn task_msg_id(task_instance_id: impl std::fmt::Display, attempt: u32) -> String {
    format!("{task_instance_id}:{attempt}")
}

/// Returns the `Nats-Msg-Id` of an event batch, `<execution_id>:<sequence>` where `sequence` is
/// the batch's first event, so a coordinator that re-publishes after a crash does not append the
/// events twice.
pub fn event_msg_id(execution_id: impl std::fmt::Display, sequence: u64) -> String {
    format!("{execution_id}:{sequence}")
}

/// Returns the `Nats-Msg-Id` of a task result, `<task_instance_id>:<attempt>:<outcome>`, where
/// `outcome` is `started`, `completed`, `failed`, `spawned`, `question` or `step:<step name>` (an
/// attempt sends several step checkpoints but only one final outcome).
pub fn result_msg_id(
    task_instance_id: impl std::fmt::Display,
    attempt: u32,
    outcome: &str,
) -> String {
    format!("{task_instance_id}:{attempt}:{outcome}")
}

/// Returns the `Nats-Msg-Id` of a batch of results or of assignments, `batch:<id>` (`id` unique
/// per batch: a UUID).
pub fn batch_msg_id(id: impl std::fmt::Display) -> String {
    format!("batch:{id}")
}

/// Returns the shard of an execution among `n_shards`: a stable hash (FNV-1a, 64 bit) of the
/// execution id's text, so every process agrees without coordination.
///
/// Returns 0 when `n_shards` is 0, which a validated configuration never has.
pub fn shard_of(execution_id: &str, n_shards: u32) -> u32 {
    if n_shards == 0 {
        return 0;
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in execution_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // The remainder is below `n_shards`, itself a `u32`, so the conversion cannot fail.
    u32::try_from(hash % u64::from(n_shards)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXECUTION_ID: &str = "01968f3e-7b2a-7c4d-9e1f-0a1b2c3d4e5f";
    const INSTANCE_ID: &str = "01968f3e-7b2a-7c4d-9e1f-aaaaaaaaaaaa";

    fn check(actual: String, expected: &str) {
        assert_eq!(actual, expected);
    }

    #[test]
    fn subjects_follow_design() {
        check(tasks("shell"), "trellis.tasks.shell");
        check(results(3), "trellis.results.3");
        check(handoff(3), "trellis.handoff.3");
        check(
            events(EXECUTION_ID),
            "trellis.events.01968f3e-7b2a-7c4d-9e1f-0a1b2c3d4e5f",
        );
        check(
            progress(EXECUTION_ID),
            "trellis.progress.01968f3e-7b2a-7c4d-9e1f-0a1b2c3d4e5f",
        );
        check(heartbeat("worker-7"), "trellis.workers.heartbeat.worker-7");
        check(
            cancel(INSTANCE_ID),
            "trellis.cancel.01968f3e-7b2a-7c4d-9e1f-aaaaaaaaaaaa",
        );
    }

    #[test]
    fn message_ids_follow_design() {
        check(
            task_msg_id(INSTANCE_ID, 2),
            "01968f3e-7b2a-7c4d-9e1f-aaaaaaaaaaaa:2",
        );
        check(
            event_msg_id(EXECUTION_ID, 42),
            "01968f3e-7b2a-7c4d-9e1f-0a1b2c3d4e5f:42",
        );
        check(
            result_msg_id(INSTANCE_ID, 1, "step:collect"),
            "01968f3e-7b2a-7c4d-9e1f-aaaaaaaaaaaa:1:step:collect",
        );
    }

    #[test]
    fn wildcards_cover_their_subjects() {
        for (wildcard, prefix) in [
            (TASKS_WILDCARD, TASKS_PREFIX),
            (RESULTS_WILDCARD, RESULTS_PREFIX),
            (EVENTS_WILDCARD, EVENTS_PREFIX),
            (PROGRESS_WILDCARD, PROGRESS_PREFIX),
            (HEARTBEAT_WILDCARD, HEARTBEAT_PREFIX),
        ] {
            assert_eq!(wildcard, format!("{prefix}.>"));
        }
    }

    #[test]
    fn shard_of_is_stable_and_in_range() {
        // Pinned values: changing the hash would move running executions to other shards.
        assert_eq!(shard_of("", 7), (0xcbf2_9ce4_8422_2325_u64 % 7) as u32);
        assert_eq!(shard_of(EXECUTION_ID, 1), 0);
        assert_eq!(shard_of(EXECUTION_ID, 0), 0);
        for n_shards in 1..=16 {
            let shard = shard_of(EXECUTION_ID, n_shards);
            assert!(shard < n_shards);
            assert_eq!(shard, shard_of(EXECUTION_ID, n_shards));
        }
    }
}
