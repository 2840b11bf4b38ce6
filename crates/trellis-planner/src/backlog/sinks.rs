//! The notification sinks of a project: adding (with its checks), listing, removing, and the
//! record of their deliveries. Sending is the notifier's ([`crate::notify`]).

use tonic::{Request, Response, Status};
use trellis_checkpoint_store::store::notify::{DeliveryRow, SinkKind, SinkRow};
use trellis_core::backlog::model::check_slug;

use super::{BacklogService, invalid, now_ms, status};
use crate::notify::{EVENTS, callback_path};

/// Telegram's Bot API, where a bot's messages go unless a sink names another.
pub const TELEGRAM_API: &str = "https://api.telegram.org";

/// Most deliveries `ListDeliveries` returns.
const MAX_DELIVERIES: u32 = 1_000;

fn http_url(field: &str, url: &str) -> Result<String, Status> {
    let url = url.trim();
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => {
            Ok(url.to_owned())
        }
        Ok(parsed) => Err(Status::invalid_argument(format!(
            "{field}: {url:?} is a {} URL; a sink posts to http:// or https://",
            parsed.scheme()
        ))),
        Err(err) => Err(Status::invalid_argument(format!(
            "{field}: {url:?} is not a URL: {err}"
        ))),
    }
}

fn events(given: &[String]) -> Result<Vec<String>, Status> {
    if given.is_empty() {
        return Ok(EVENTS.iter().map(|event| (*event).to_owned()).collect());
    }
    let mut events = Vec::new();
    for (index, event) in given.iter().enumerate() {
        if !EVENTS.contains(&event.as_str()) {
            return Err(Status::invalid_argument(format!(
                "events[{index}]: unknown event {event:?} (choose from {})",
                EVENTS.join(", ")
            )));
        }
        if !events.contains(event) {
            events.push(event.clone());
        }
    }
    Ok(events)
}

pub(super) fn sink_to_proto(sink: &SinkRow) -> trellis_proto::v1::SinkView {
    let (url, chat_id) = match &sink.kind {
        SinkKind::Webhook { url, .. } => (url.clone(), String::new()),
        SinkKind::Telegram {
            base_url, chat_id, ..
        } => (base_url.clone(), chat_id.clone()),
    };
    trellis_proto::v1::SinkView {
        project: sink.project.clone(),
        name: sink.name.clone(),
        list: sink.list.clone().unwrap_or_default(),
        kind: sink.kind.name().to_owned(),
        url,
        chat_id,
        events: sink.events.clone(),
        created_at_unix_ms: sink.created_at_unix_ms,
    }
}

fn delivery_to_proto(delivery: &DeliveryRow) -> trellis_proto::v1::DeliveryView {
    trellis_proto::v1::DeliveryView {
        delivery_id: delivery.delivery_id.to_string(),
        sink: delivery.sink.clone(),
        event_key: delivery.event_key.clone(),
        status: delivery.status.clone(),
        attempts: delivery.attempts,
        last_status: delivery.last_status.map_or(0, u32::from),
        last_error: delivery.last_error.clone(),
        next_attempt_at_unix_ms: if delivery.status == "pending" {
            delivery.next_attempt_at_unix_ms
        } else {
            0
        },
        delivered_at_unix_ms: delivery.delivered_at_unix_ms.unwrap_or(0),
        event_at_unix_ms: delivery.event_at_unix_ms,
        payload: delivery.payload.clone(),
    }
}

fn new_secret() -> String {
    // Two v4 UUIDs: 244 random bits, as letters and digits Telegram's secret_token allows.
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

impl BacklogService {
    pub(super) async fn add_sink_now(
        &self,
        request: Request<trellis_proto::v1::AddSinkRequest>,
    ) -> Result<Response<trellis_proto::v1::AddSinkResponse>, Status> {
        use trellis_proto::v1::add_sink_request::Kind;
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        check_slug("name", &request.name).map_err(invalid)?;
        let list = if request.list.is_empty() {
            None
        } else {
            Some(self.list_row(&project.project, &request.list).await?.name)
        };
        let events = events(&request.events)?;
        let (kind, secret) = match request.kind {
            Some(Kind::Webhook(webhook)) => {
                let url = http_url("webhook.url", &webhook.url)?;
                let secret = if webhook.secret.is_empty() {
                    new_secret()
                } else {
                    webhook.secret
                };
                (
                    SinkKind::Webhook {
                        url,
                        secret: secret.clone(),
                    },
                    secret,
                )
            }
            Some(Kind::Telegram(telegram)) => {
                let base_url = if telegram.api_url.is_empty() {
                    TELEGRAM_API.to_owned()
                } else {
                    http_url("telegram.api_url", &telegram.api_url)?
                };
                if telegram.token.trim().is_empty() {
                    return Err(Status::invalid_argument(
                        "telegram.token: missing (the bot's token from @BotFather)",
                    ));
                }
                let chat_id = telegram.chat_id.trim();
                if chat_id.parse::<i64>().is_err() {
                    return Err(Status::invalid_argument(format!(
                        "telegram.chat_id: {chat_id:?} is not a chat id (a number, such as \
                         -1001234567890 for a group)"
                    )));
                }
                let callback_secret = new_secret();
                (
                    SinkKind::Telegram {
                        base_url,
                        token: telegram.token.trim().to_owned(),
                        chat_id: chat_id.to_owned(),
                        callback_secret: callback_secret.clone(),
                    },
                    callback_secret,
                )
            }
            None => {
                return Err(Status::invalid_argument(
                    "kind: missing (set webhook or telegram)",
                ));
            }
        };
        let sink = SinkRow {
            project: project.project,
            name: request.name,
            list,
            kind,
            events,
            created_at_unix_ms: now_ms(),
        };
        self.store.create_sink(&sink).await.map_err(status)?;
        Ok(Response::new(trellis_proto::v1::AddSinkResponse {
            sink: Some(sink_to_proto(&sink)),
            secret,
            callback_path: callback_path(&sink),
        }))
    }

    pub(super) async fn list_sinks_now(
        &self,
        request: Request<trellis_proto::v1::ListSinksRequest>,
    ) -> Result<Response<trellis_proto::v1::ListSinksResponse>, Status> {
        let project = self.project(&request.into_inner().project).await?;
        let sinks = self
            .store
            .sinks(Some(&project.project))
            .await
            .map_err(status)?;
        Ok(Response::new(trellis_proto::v1::ListSinksResponse {
            sinks: sinks.iter().map(sink_to_proto).collect(),
        }))
    }

    pub(super) async fn remove_sink_now(
        &self,
        request: Request<trellis_proto::v1::RemoveSinkRequest>,
    ) -> Result<Response<trellis_proto::v1::RemoveSinkResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        check_slug("name", &request.name).map_err(invalid)?;
        let removed = self
            .store
            .delete_sink(&project.project, &request.name)
            .await
            .map_err(status)?;
        Ok(Response::new(trellis_proto::v1::RemoveSinkResponse {
            removed,
        }))
    }

    pub(super) async fn list_deliveries_now(
        &self,
        request: Request<trellis_proto::v1::ListDeliveriesRequest>,
    ) -> Result<Response<trellis_proto::v1::ListDeliveriesResponse>, Status> {
        let request = request.into_inner();
        let project = self.project(&request.project).await?;
        let sink = (!request.sink.is_empty()).then_some(request.sink.as_str());
        let limit = match request.limit {
            0 => 50,
            limit => limit.min(MAX_DELIVERIES),
        };
        let deliveries = self
            .store
            .deliveries(&project.project, sink, limit)
            .await
            .map_err(status)?;
        Ok(Response::new(trellis_proto::v1::ListDeliveriesResponse {
            deliveries: deliveries.iter().map(delivery_to_proto).collect(),
        }))
    }
}
