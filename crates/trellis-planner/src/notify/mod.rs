//! Notifications: questions and ended executions told to the sinks of their project or list.
//!
//! The notifier reads the read model (the checkpoint-store's tables in the same database) every
//! [`Settings::tick`]: the questions still pending and the executions completed or failed since
//! its cursor. Each event is enqueued once per matching sink (a unique key in the store, so a
//! window scanned twice, a restart or a second planner enqueue it once), then sent: a delivery is
//! claimed for a lease, attempted, and its outcome recorded; a failed attempt is tried again
//! after a backoff that doubles up to [`Settings::max_backoff`], until
//! [`Settings::max_attempts`]. Answers come back through [`hooks`].

pub mod hooks;
pub mod message;
mod send;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use trellis_checkpoint_store::store::backlog::Backlog;
use trellis_checkpoint_store::store::notify::{Attempt, DeliveryRow, SinkRow};
use trellis_checkpoint_store::store::{Error as StoreError, ExecutionRow, Store as ReadModel};
use trellis_core::ids::ExecutionId;
use trellis_core::machine::ExecutionState;
use uuid::Uuid;

use message::Scope;

use crate::backlog::now_ms;
pub use send::ATTEMPT_TIMEOUT;

/// The events a sink can be told of.
pub const EVENTS: [&str; 3] = ["question", "completed", "failed"];

/// How the notifier paces itself.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How often it scans and sends.
    pub tick: Duration,
    /// How far back each scan looks again, for rows the read model wrote late.
    pub overlap: Duration,
    /// The wait after a first failed attempt; each further one doubles it.
    pub backoff: Duration,
    /// The longest wait between attempts.
    pub max_backoff: Duration,
    /// Attempts before a delivery is given up (`failed`).
    pub max_attempts: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tick: Duration::from_millis(500),
            overlap: Duration::from_secs(10),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            max_attempts: 10,
        }
    }
}

impl Settings {
    /// The wait after `attempts` failed attempts.
    pub fn backoff_after(&self, attempts: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempts.saturating_sub(1));
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// Most events read per scan, and deliveries sent per tick.
const BATCH: u32 = 200;

/// How long a claimed delivery is kept from other notifiers: past an attempt's timeout.
const LEASE: Duration = Duration::from_secs(60);

/// The path a sink's answers come back to, behind the planner's hooks address.
pub fn callback_path(sink: &SinkRow) -> String {
    format!("/hooks/{}/{}/{}", sink.kind.name(), sink.project, sink.name)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The notifier of one planner.
#[derive(Clone, Debug)]
pub struct Notifier {
    store: Arc<dyn Backlog>,
    read_model: Arc<dyn ReadModel>,
    http: reqwest::Client,
    settings: Settings,
}

/// Where the scan stands: the cursor, and the events of the overlap window already handled
/// (`question/<id>`, `execution/<id>`, with when they happened), which a rescan skips before
/// reading anything more of them.
#[derive(Debug, Default)]
struct Scan {
    cursor: Option<i64>,
    handled: HashMap<String, i64>,
}

impl Notifier {
    /// A notifier of the sinks in `store`, reading events from `read_model`.
    pub fn new(
        store: Arc<dyn Backlog>,
        read_model: Arc<dyn ReadModel>,
        settings: Settings,
    ) -> Notifier {
        Notifier {
            store,
            read_model,
            http: reqwest::Client::new(),
            settings,
        }
    }

    /// Scans and sends every tick until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut scan = Scan::default();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.settings.tick) => {}
            }
            let sinks = match self.store.sinks(None).await {
                Ok(sinks) => sinks,
                Err(err) => {
                    tracing::warn!(error = %err, "notifications: cannot read the sinks");
                    continue;
                }
            };
            // Without sinks there is nothing to do: deliveries go with their sink.
            if sinks.is_empty() {
                continue;
            }
            if let Err(err) = self.enqueue_new(&sinks, &mut scan).await {
                tracing::warn!(error = %err, "notifications: cannot read new events");
            }
            if let Err(err) = self.send_due(&sinks).await {
                tracing::warn!(error = %err, "notifications: cannot send");
            }
        }
    }

    /// Enqueues a delivery per new event and matching sink of `sinks` (not empty).
    async fn enqueue_new(&self, sinks: &[SinkRow], scan: &mut Scan) -> Result<(), StoreError> {
        let overlap = millis(self.settings.overlap);
        let since = match scan.cursor {
            Some(cursor) => cursor,
            None => match self.store.newest_enqueued_event().await? {
                Some(newest) => newest - overlap,
                None => sinks
                    .iter()
                    .map(|sink| sink.created_at_unix_ms - 1)
                    .min()
                    .unwrap_or(0),
            },
        };
        let until = now_ms();
        let mut next = (until - overlap).max(since);
        let mut executions: HashMap<ExecutionId, Option<ExecutionRow>> = HashMap::new();
        let mut deliveries = Vec::new();
        let mut handled = Vec::new();

        let questions = self
            .store
            .questions_asked_between(since, until, BATCH)
            .await?;
        if questions.len() == BATCH as usize
            && let Some(last) = questions.last()
        {
            next = next.min(i64::try_from(last.asked_at_ms).unwrap_or(i64::MAX) - 1);
        }
        for asked in &questions {
            let key = format!("question/{}", asked.question.id);
            if scan.handled.contains_key(&key) {
                continue;
            }
            let execution = self.execution(&mut executions, asked.execution_id).await?;
            let scope = Scope::of_labels(execution.map_or(&BTreeMap::new(), |row| &row.labels));
            let name = execution.map_or("", |row| row.name.as_str());
            let at = i64::try_from(asked.asked_at_ms).unwrap_or(i64::MAX);
            for sink in matching(sinks, &scope, "question", at) {
                let id = Uuid::now_v7();
                let event = message::question_event(id, &scope, name, asked, &callback_path(sink));
                deliveries.push(delivery(sink, id, key.clone(), at, &event));
            }
            handled.push((key, at));
        }

        let ended = self
            .read_model
            .finished_between(
                u64::try_from(since).unwrap_or(0),
                u64::try_from(until).unwrap_or(0),
                BATCH,
            )
            .await?;
        if ended.len() == BATCH as usize
            && let Some((_, last)) = ended.last()
        {
            next = next.min(i64::try_from(*last).unwrap_or(i64::MAX) - 1);
        }
        for (execution_id, ended_at) in ended {
            let key = format!("execution/{execution_id}");
            if scan.handled.contains_key(&key) {
                continue;
            }
            let Some(execution) = self.execution(&mut executions, execution_id).await? else {
                continue;
            };
            let at = i64::try_from(ended_at).unwrap_or(i64::MAX);
            let outcome = match execution.state {
                ExecutionState::Completed => "completed",
                ExecutionState::Failed => "failed",
                _ => {
                    handled.push((key, at));
                    continue;
                }
            };
            let scope = Scope::of_labels(&execution.labels);
            for sink in matching(sinks, &scope, outcome, at) {
                let id = Uuid::now_v7();
                let event = message::execution_event(id, &scope, outcome, execution);
                deliveries.push(delivery(sink, id, format!("{key}/{outcome}"), at, &event));
            }
            handled.push((key, at));
        }

        let added = self.store.enqueue_deliveries(&deliveries).await?;
        if added > 0 {
            tracing::debug!(added, "notifications enqueued");
        }
        // Handled once enqueued: a failed write leaves them to the next scan.
        scan.handled.extend(handled);
        scan.cursor = Some(next.max(since));
        scan.handled.retain(|_, at| *at > next - overlap);
        Ok(())
    }

    /// An execution's row, read once per scan.
    async fn execution<'a>(
        &self,
        seen: &'a mut HashMap<ExecutionId, Option<ExecutionRow>>,
        id: ExecutionId,
    ) -> Result<Option<&'a ExecutionRow>, StoreError> {
        if let std::collections::hash_map::Entry::Vacant(vacant) = seen.entry(id) {
            vacant.insert(self.read_model.get_execution(id).await?);
        }
        Ok(seen.get(&id).and_then(Option::as_ref))
    }

    /// Sends the deliveries due now to their sinks among `sinks`, side by side, and records how
    /// each went.
    async fn send_due(&self, sinks: &[SinkRow]) -> Result<(), StoreError> {
        let now = now_ms();
        let due = self
            .store
            .claim_deliveries(now, now + millis(LEASE), BATCH)
            .await?;
        if due.is_empty() {
            return Ok(());
        }
        let sinks: HashMap<(&str, &str), &SinkRow> = sinks
            .iter()
            .map(|sink| ((sink.project.as_str(), sink.name.as_str()), sink))
            .collect();
        let mut attempts = tokio::task::JoinSet::new();
        for delivery in due {
            let Some(sink) = sinks
                .get(&(delivery.project.as_str(), delivery.sink.as_str()))
                .map(|sink| (*sink).clone())
            else {
                continue;
            };
            let http = self.http.clone();
            attempts.spawn(async move {
                let sent = send::attempt(&http, &sink, &delivery).await;
                (delivery, sent)
            });
        }
        while let Some(joined) = attempts.join_next().await {
            let Ok((delivery, sent)) = joined else {
                continue;
            };
            let attempt = self.outcome(&delivery, sent);
            if let Attempt::Failed { error, .. } = &attempt {
                tracing::warn!(
                    delivery = %delivery.delivery_id,
                    sink = %delivery.sink,
                    attempts = delivery.attempts + 1,
                    %error,
                    "notification not delivered"
                );
            }
            self.store
                .record_attempt(delivery.delivery_id, &attempt, now_ms())
                .await?;
        }
        Ok(())
    }

    /// What an attempt's outcome means for its delivery.
    fn outcome(&self, delivery: &DeliveryRow, sent: send::Sent) -> Attempt {
        match sent {
            send::Sent::Delivered { status } => Attempt::Delivered { status },
            send::Sent::Refused {
                status,
                error,
                retry,
            } => {
                let attempts = delivery.attempts + 1;
                let retry_at_unix_ms = (retry && attempts < self.settings.max_attempts)
                    .then(|| now_ms() + millis(self.settings.backoff_after(attempts)));
                Attempt::Failed {
                    status,
                    error,
                    retry_at_unix_ms,
                }
            }
        }
    }
}

/// The sinks told of an event of `kind` at `at` in `scope`: of its project, of its list or of the
/// whole project, asking for the kind, and added before it happened.
fn matching<'a>(
    sinks: &'a [SinkRow],
    scope: &'a Scope,
    kind: &'a str,
    at: i64,
) -> impl Iterator<Item = &'a SinkRow> + 'a {
    sinks.iter().filter(move |sink| {
        sink.project == scope.project
            && sink
                .list
                .as_ref()
                .is_none_or(|list| Some(list) == scope.list.as_ref())
            && sink.events.iter().any(|event| event == kind)
            && sink.created_at_unix_ms <= at
    })
}

fn delivery(
    sink: &SinkRow,
    id: Uuid,
    event_key: String,
    at: i64,
    event: &serde_json::Value,
) -> DeliveryRow {
    let now = now_ms();
    DeliveryRow {
        delivery_id: id,
        project: sink.project.clone(),
        sink: sink.name.clone(),
        event_key,
        event_at_unix_ms: at,
        payload: event.to_string(),
        status: "pending".to_owned(),
        attempts: 0,
        next_attempt_at_unix_ms: now,
        last_status: None,
        last_error: String::new(),
        delivered_at_unix_ms: None,
        created_at_unix_ms: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trellis_checkpoint_store::store::notify::SinkKind;

    fn sink(name: &str, list: Option<&str>, events: &[&str], created: i64) -> SinkRow {
        SinkRow {
            project: "web".to_owned(),
            name: name.to_owned(),
            list: list.map(str::to_owned),
            kind: SinkKind::Webhook {
                url: "http://127.0.0.1:1/".to_owned(),
                secret: "k".to_owned(),
            },
            events: events.iter().map(|e| (*e).to_owned()).collect(),
            created_at_unix_ms: created,
        }
    }

    #[test]
    fn an_event_reaches_the_sinks_of_its_project_list_and_kind_added_before_it() {
        let sinks = [
            sink("all", None, &EVENTS, 0),
            sink("auth-only", Some("auth"), &EVENTS, 0),
            sink("failures", None, &["failed"], 0),
            sink("late", None, &EVENTS, 50),
        ];
        let scope = Scope {
            project: "web".to_owned(),
            list: Some("ui".to_owned()),
        };
        let names = |kind, at| -> Vec<&str> {
            matching(&sinks, &scope, kind, at)
                .map(|sink| sink.name.as_str())
                .collect()
        };
        assert_eq!(names("question", 10), ["all"]);
        assert_eq!(names("failed", 10), ["all", "failures"]);
        assert_eq!(names("completed", 60), ["all", "late"]);
        let other = Scope {
            project: "default".to_owned(),
            list: None,
        };
        assert_eq!(matching(&sinks, &other, "question", 10).count(), 0);
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let settings = Settings::default();
        let waits: Vec<u64> = (1..=10)
            .map(|attempts| settings.backoff_after(attempts).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
    }
}
