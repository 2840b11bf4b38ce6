//! The notifications' storage seam: sinks (where notifications go) and deliveries (each
//! notification to each sink, with its attempts), and the read model's questions as the notifier
//! and the answer callbacks need them. The SQL is in `notify_sql.rs`, compiled once per backend.
//!
//! A delivery is enqueued at most once per sink and event (a unique key), so a notifier that
//! scans the same window twice, or two planners side by side, enqueue it once; a delivery is
//! claimed for a lease before it is sent, so two planners do not send it together.

use async_trait::async_trait;
use uuid::Uuid;

use super::{Error, QuestionRow};

/// What a sink is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkKind {
    /// JSON posted to `url`, signed with HMAC-SHA256 of `secret`.
    Webhook { url: String, secret: String },
    /// Messages through a Telegram-compatible Bot API at `base_url`.
    Telegram {
        base_url: String,
        token: String,
        chat_id: String,
        /// The `secret_token` the bot's updates must carry; also the key of its buttons' MACs.
        callback_secret: String,
    },
}

impl SinkKind {
    /// `webhook` or `telegram`.
    pub fn name(&self) -> &'static str {
        match self {
            SinkKind::Webhook { .. } => "webhook",
            SinkKind::Telegram { .. } => "telegram",
        }
    }
}

/// Where a project's (or one list's) notifications go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkRow {
    pub project: String,
    /// The sink's slug, unique in its project.
    pub name: String,
    /// `None`: every execution of the project; else only the runs of this list.
    pub list: Option<String>,
    pub kind: SinkKind,
    /// What it is told of: `question`, `completed`, `failed`.
    pub events: Vec<String>,
    pub created_at_unix_ms: i64,
}

/// One notification to one sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryRow {
    pub delivery_id: Uuid,
    pub project: String,
    pub sink: String,
    /// `question/<id>` or `execution/<id>/<completed|failed>`.
    pub event_key: String,
    pub event_at_unix_ms: i64,
    /// The event, JSON.
    pub payload: String,
    /// `pending`, `delivered` or `failed` (out of attempts).
    pub status: String,
    pub attempts: u32,
    pub next_attempt_at_unix_ms: i64,
    /// The HTTP status of the last attempt, if it got a response.
    pub last_status: Option<u16>,
    pub last_error: String,
    pub delivered_at_unix_ms: Option<i64>,
    pub created_at_unix_ms: i64,
}

/// How one attempt went, for [`Notifications::record_attempt`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    Delivered {
        status: u16,
    },
    /// Failed; tried again at `retry_at_unix_ms`, or never (`None`: out of attempts, or a
    /// failure no retry can mend).
    Failed {
        status: Option<u16>,
        error: String,
        retry_at_unix_ms: Option<i64>,
    },
}

/// A question of the read model with how it stands: `pending`, `answered` or `expired`.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredQuestion {
    pub row: QuestionRow,
    pub status: String,
    pub answer: Option<String>,
}

/// The notifications' tables. Every method is one transaction: on an error nothing was changed.
#[async_trait]
pub trait Notifications: Send + Sync {
    /// Stores a new sink; `AlreadyExists` when its name is taken, `NotFound` without its project.
    async fn create_sink(&self, sink: &SinkRow) -> Result<(), Error>;

    /// Returns one sink.
    async fn sink(&self, project: &str, name: &str) -> Result<Option<SinkRow>, Error>;

    /// Returns the sinks of `project`, or of every project, by project and name.
    async fn sinks(&self, project: Option<&str>) -> Result<Vec<SinkRow>, Error>;

    /// Deletes a sink and its deliveries; false when there was none.
    async fn delete_sink(&self, project: &str, name: &str) -> Result<bool, Error>;

    /// Enqueues each delivery unless its sink already has one for its event; returns how many
    /// were new.
    async fn enqueue_deliveries(&self, deliveries: &[DeliveryRow]) -> Result<usize, Error>;

    /// Claims up to `limit` pending deliveries due at `now_ms`, oldest first: each is not due
    /// again before `lease_until_ms`, so no other notifier sends it meanwhile.
    async fn claim_deliveries(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>, Error>;

    /// Records one attempt of a delivery.
    async fn record_attempt(
        &self,
        delivery_id: Uuid,
        attempt: &Attempt,
        now_ms: i64,
    ) -> Result<(), Error>;

    /// Returns the newest deliveries of a project (of one sink when `sink` is set), at most
    /// `limit`.
    async fn deliveries(
        &self,
        project: &str,
        sink: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>, Error>;

    /// The newest event time among the deliveries enqueued, where a restarted notifier picks up.
    async fn newest_enqueued_event(&self) -> Result<Option<i64>, Error>;

    /// Returns the questions still pending that were asked after `after_ms` and at or before
    /// `until_ms`, oldest first, at most `limit`; a question whose asking instance was cancelled
    /// is withdrawn, not pending.
    async fn questions_asked_between(
        &self,
        after_ms: i64,
        until_ms: i64,
        limit: u32,
    ) -> Result<Vec<QuestionRow>, Error>;

    /// Returns one question of the read model, whatever its status.
    async fn question(&self, question_id: Uuid) -> Result<Option<StoredQuestion>, Error>;
}
