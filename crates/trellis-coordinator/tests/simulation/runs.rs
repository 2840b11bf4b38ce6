//! The check that no task attempt runs twice at once (`World::no_double_runs`), after every
//! step of the simulation.

use std::collections::BTreeMap;

use trellis_core::ids::ExecutionId;
use trellis_core::machine::EventBody;
use trellis_wire::log;

use crate::world::World;

impl World {
    /// No attempt runs on two live workers at once, and no attempt a former owner of the
    /// execution sent runs beside one of a later owner (a takeover sent nothing again that a
    /// worker still ran). Two attempts of one owner may overlap only when a worker died between
    /// storing an attempt's result and acknowledging its message: JetStream delivers that attempt
    /// again while the next one runs (at-least-once delivery; the coordinator ignores its result).
    /// Across owners, two overlaps are not a takeover's doing, and pass: a run again of an attempt
    /// whose result a coordinator had acknowledged before the run began (the redelivery came
    /// before the later owner's fence was stored), and a run of an attempt the log records as
    /// timed out (its cancel is sent once, after the append, and a crash in between loses it; a
    /// timeout ends an attempt whatever its worker does).
    pub(crate) fn no_double_runs(&self) -> Result<(), String> {
        let mut running: BTreeMap<&str, Vec<(usize, u32, u64, u64)>> = BTreeMap::new();
        for worker in self.workers.iter().filter(|worker| worker.up) {
            for run in &worker.runs {
                let instance = run.assignment.task_instance_id.as_str();
                let here = (
                    worker.idx,
                    run.assignment.attempt,
                    run.assignment.fence,
                    run.started_at,
                );
                let others = running.entry(instance).or_default();
                let clash = others.iter().find(|other| {
                    other.1 == here.1
                        || (other.2 != here.2
                            && !self.ended_apart(&run.assignment.execution_id, instance, other)
                            && !self.ended_apart(&run.assignment.execution_id, instance, &here))
                });
                if let Some(other) = clash {
                    return Err(format!(
                        "{}: instance {instance} runs twice at once: (worker, attempt, fence, \
                         started) {other:?} and {here:?}",
                        self.now
                    ));
                }
                others.push(here);
            }
        }
        Ok(())
    }

    /// Whether a run (worker, attempt, fence, started) of `instance` runs an attempt that had
    /// ended apart from it: its result acknowledged before the run began, or timed out in the log.
    fn ended_apart(&self, execution: &str, instance: &str, run: &(usize, u32, u64, u64)) -> bool {
        let (_, attempt, _, started) = *run;
        let acked_before = self
            .nats
            .acked_results
            .get(&(instance.to_owned(), attempt))
            .is_some_and(|acked| *acked <= started);
        acked_before || self.timed_out(execution, instance, attempt)
    }

    /// Whether the log of `execution` records `attempt` of `instance` as timed out.
    fn timed_out(&self, execution: &str, instance: &str, attempt: u32) -> bool {
        let Ok(id) = execution.parse::<ExecutionId>() else {
            return false;
        };
        let mut entries = self
            .nats
            .events
            .log(id)
            .into_iter()
            .filter_map(|record| log::decode_event_batch(&record.payload).ok())
            .flat_map(|batch| batch.entries);
        entries.any(|entry| match entry {
            log::LogEntry::Event(event) => matches!(
                event.body,
                EventBody::TaskTimedOut { instance: timed_out, attempt: ended }
                    if ended == attempt && timed_out.to_string() == instance
            ),
            log::LogEntry::Started(_) => false,
        })
    }
}
