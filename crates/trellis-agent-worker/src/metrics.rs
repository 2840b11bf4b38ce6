//! The worker's metrics (Prometheus names; counters are scraped with `_total`):
//!
//! - `trellis_worker_tasks` by `queue`, `type` and `outcome` (`completed`, `failed`, `spawned`,
//!   `asked`): attempts this process ran to an end;
//! - `trellis_task_duration_seconds` by `queue`, `type` and `outcome`: how long the handler ran;
//! - `trellis_task_queue_wait_seconds` by `queue`: how long an assignment waited on its queue
//!   before this worker took it (first deliveries);
//! - `trellis_worker_tasks_handed_back`: attempts handed back unfinished (shutdown, no slot);
//! - `trellis_worker_running` and `trellis_worker_slots`: handlers running now, and slots;
//! - `trellis_worker_heartbeats`: heartbeats sent;
//! - `trellis_worker_messages_set_aside` by `reason`: task messages that were not assignments;
//! - `trellis_worker_result_handoffs` by `answer` (`done`; `publish`, `unanswered`,
//!   `no_coordinator` and `failed`, each then published to the results stream): messages of
//!   results handed to a coordinator;
//! - `trellis_worker_offers` by `answer` (`taken`, `busy`): assignments a coordinator offered
//!   this worker directly.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use trellis_telemetry::Registry;
use trellis_telemetry::metrics::{HistogramFamily, Labels1, Labels3, latency_family};

/// The worker's metric families; shared by every worker of the process.
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    pub(crate) tasks: Family<Labels3, Counter>,
    pub(crate) duration: HistogramFamily<Labels3>,
    pub(crate) queue_wait: HistogramFamily<Labels1>,
    pub(crate) handed_back: Counter,
    pub(crate) running: Gauge,
    pub(crate) slots: Gauge,
    pub(crate) heartbeats: Counter,
    pub(crate) set_aside: Family<Labels1, Counter>,
    pub(crate) handoffs: Family<Labels1, Counter>,
    pub(crate) offers: Family<Labels1, Counter>,
}

impl Metrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        Self {
            tasks: registry.metric(
                "trellis_worker_tasks",
                "Task attempts run to an end, by queue, task type and outcome.",
                Family::default,
            ),
            duration: registry.metric(
                "trellis_task_duration_seconds",
                "How long task handlers ran, by queue, task type and outcome.",
                latency_family,
            ),
            queue_wait: registry.metric(
                "trellis_task_queue_wait_seconds",
                "How long an assignment waited on its queue before a worker took it, by queue.",
                latency_family,
            ),
            handed_back: registry.metric(
                "trellis_worker_tasks_handed_back",
                "Task attempts handed back unfinished for another delivery.",
                Counter::default,
            ),
            running: registry.metric(
                "trellis_worker_running",
                "Task handlers running now.",
                Gauge::default,
            ),
            slots: registry.metric(
                "trellis_worker_slots",
                "Task handlers the workers of this process run at most at once.",
                Gauge::default,
            ),
            heartbeats: registry.metric(
                "trellis_worker_heartbeats",
                "Heartbeats sent.",
                Counter::default,
            ),
            set_aside: registry.metric(
                "trellis_worker_messages_set_aside",
                "Task messages set aside because they are not valid assignments, by reason.",
                Family::default,
            ),
            handoffs: registry.metric(
                "trellis_worker_result_handoffs",
                "Messages of results handed to a coordinator, by its answer (done, publish, unanswered, no_coordinator, failed).",
                Family::default,
            ),
            offers: registry.metric(
                "trellis_worker_offers",
                "Assignments a coordinator offered this worker directly, by its answer (taken, busy).",
                Family::default,
            ),
        }
    }
}
