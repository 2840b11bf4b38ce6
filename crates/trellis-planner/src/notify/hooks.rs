//! Answers coming back: an HTTP server (the planner's `--hooks-listen`) with one endpoint per sink.
//!
//! - `POST /hooks/telegram/<project>/<sink>`: a bot's update (Telegram's webhook). It must carry
//!   the sink's `X-Telegram-Bot-Api-Secret-Token`; a button's `callback_data` must carry the
//!   sink's MAC and come from the sink's chat. The reply is Telegram's `answerCallbackQuery`
//!   method in the webhook's response, so the person sees at once whether the answer was taken.
//! - `POST /hooks/webhook/<project>/<sink>`: `{"question_id", "answer", "answered_by"}`, signed
//!   like the sink's notifications (`X-Trellis-Signature`).
//!
//! Either way the question must be one of the sink's project (and list) and still pending; the
//! coordinator then accepts one answer per question, so a second one (through a button, a webhook
//! or `trellis answer`) is refused. A refused call changes nothing.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use trellis_checkpoint_store::store::Store as ReadModel;
use trellis_checkpoint_store::store::backlog::Backlog;
use trellis_checkpoint_store::store::notify::{SinkKind, SinkRow, StoredQuestion};
use uuid::Uuid;

use super::message::{self, SIGNATURE_HEADER, Scope, TELEGRAM_SECRET_HEADER};
use crate::backlog::runs::Coordinator;

/// What the endpoints need.
#[derive(Clone, Debug)]
pub struct Hooks {
    pub store: Arc<dyn Backlog>,
    pub read_model: Arc<dyn ReadModel>,
    /// Where answers go; `None`: every answer is refused (the planner has no `--coordinator`).
    pub coordinator: Option<Coordinator>,
}

/// A refusal: its status and a message saying what, where and why.
struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

/// Serves the hooks on `listener` until `shutdown`.
///
/// # Errors
///
/// The server failed while serving.
pub async fn serve(
    listener: TcpListener,
    hooks: Hooks,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let router = axum::Router::new()
        .route("/hooks/telegram/{project}/{sink}", post(telegram))
        .route("/hooks/webhook/{project}/{sink}", post(webhook))
        .with_state(Arc::new(hooks));
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

impl Hooks {
    async fn sink(&self, project: &str, name: &str, kind: &str) -> Result<SinkRow, Refused> {
        match self.store.sink(project, name).await {
            Ok(Some(sink)) if sink.kind.name() == kind => Ok(sink),
            Ok(_) => Err(Refused(
                StatusCode::NOT_FOUND,
                format!("project {project} has no {kind} sink {name}"),
            )),
            Err(err) => Err(Refused(StatusCode::SERVICE_UNAVAILABLE, err.to_string())),
        }
    }

    /// The question, if it is one of `sink`'s executions.
    async fn question(&self, sink: &SinkRow, id: Uuid) -> Result<StoredQuestion, Refused> {
        let unknown = || {
            Refused(
                StatusCode::NOT_FOUND,
                format!("question {id} is not one of sink {}'s", sink.name),
            )
        };
        let stored = self
            .store
            .question(id)
            .await
            .map_err(|err| Refused(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?
            .ok_or_else(unknown)?;
        let execution = self
            .read_model
            .get_execution(stored.row.execution_id)
            .await
            .map_err(|err| Refused(StatusCode::SERVICE_UNAVAILABLE, err.to_string()))?;
        let scope = Scope::of_labels(
            execution
                .as_ref()
                .map_or(&Default::default(), |row| &row.labels),
        );
        let in_scope = scope.project == sink.project
            && sink
                .list
                .as_ref()
                .is_none_or(|list| Some(list) == scope.list.as_ref());
        // A question of another project is answered as unknown: a sink's key reveals nothing of
        // the others.
        if in_scope { Ok(stored) } else { Err(unknown()) }
    }

    /// Gives the answer to the coordinator, once the question is still pending. The coordinator
    /// checks the answer against the options (INVALID_ARGUMENT, a 400 here) and takes one answer
    /// per question; the pending check before it names the answer already given, and holds for
    /// an execution the coordinator no longer keeps in memory.
    async fn answer(
        &self,
        stored: &StoredQuestion,
        answer: &str,
        by: &str,
    ) -> Result<String, Refused> {
        let question = &stored.row.question;
        if stored.status != "pending" {
            let how = match &stored.answer {
                Some(answer) => format!("already answered \"{answer}\""),
                None => format!("already {}", stored.status),
            };
            return Err(Refused(
                StatusCode::CONFLICT,
                format!("question {} was {how}", question.id),
            ));
        }
        let Some(coordinator) = &self.coordinator else {
            return Err(Refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "this planner answers no questions: start it with --coordinator".to_owned(),
            ));
        };
        match coordinator
            .answer(
                &stored.row.execution_id.to_string(),
                &question.id.to_string(),
                answer,
                by,
            )
            .await
        {
            Ok(answered) => {
                tracing::info!(question = %question.id, %by, "question answered through a sink");
                Ok(answered.task_instance_id)
            }
            Err(status) => {
                let code = match status.code() {
                    tonic::Code::FailedPrecondition => StatusCode::CONFLICT,
                    tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                    tonic::Code::NotFound => StatusCode::NOT_FOUND,
                    _ => StatusCode::SERVICE_UNAVAILABLE,
                };
                Err(Refused(code, status.message().to_owned()))
            }
        }
    }
}

/// The parts of a Telegram update a button press has.
#[derive(Debug, Deserialize)]
struct Update {
    callback_query: Option<CallbackQuery>,
}

#[derive(Debug, Deserialize)]
struct CallbackQuery {
    id: String,
    from: Option<User>,
    message: Option<Message>,
    data: Option<String>,
}

#[derive(Debug, Deserialize)]
struct User {
    id: i64,
    username: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Message {
    chat: Chat,
}

#[derive(Debug, Deserialize)]
struct Chat {
    id: i64,
}

fn same_secret(given: &[u8], expected: &str) -> bool {
    // Compared through HMAC tags: constant time, whatever the lengths.
    message::verify(
        expected,
        given,
        &message::sign(expected, expected.as_bytes()),
    )
}

async fn telegram(
    State(hooks): State<Arc<Hooks>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, Refused> {
    let sink = hooks.sink(&project, &name, "telegram").await?;
    let SinkKind::Telegram {
        chat_id,
        callback_secret,
        ..
    } = &sink.kind
    else {
        return Err(Refused(
            StatusCode::NOT_FOUND,
            format!("{name} is not a bot"),
        ));
    };
    let given = headers
        .get(TELEGRAM_SECRET_HEADER)
        .map(|value| value.as_bytes())
        .unwrap_or_default();
    if !same_secret(given, callback_secret) {
        return Err(Refused(
            StatusCode::FORBIDDEN,
            format!(
                "X-Telegram-Bot-Api-Secret-Token: {} sink {name}'s secret (give setWebhook the \
                 secret_token `trellis sinks add` printed)",
                if given.is_empty() {
                    "missing; it must be"
                } else {
                    "does not match"
                }
            ),
        ));
    }
    let update: Update = serde_json::from_slice(&body).map_err(|err| {
        Refused(
            StatusCode::BAD_REQUEST,
            format!("the update is not a Telegram Update: {err}"),
        )
    })?;
    let Some(query) = update.callback_query else {
        return Ok(Json(json!({})));
    };
    let data = query.data.as_deref().unwrap_or_default();
    let (question_id, index) = message::read_button(callback_secret, data)
        .map_err(|err| Refused(StatusCode::FORBIDDEN, err.to_string()))?;
    let chat = query.message.as_ref().map(|message| message.chat.id);
    if chat.map(|id| id.to_string()).as_deref() != Some(chat_id.as_str()) {
        return Err(Refused(
            StatusCode::FORBIDDEN,
            format!(
                "callback_query.message.chat.id: {} is not sink {name}'s chat {chat_id}",
                chat.map_or_else(|| "missing".to_owned(), |id| id.to_string())
            ),
        ));
    }
    let stored = hooks.question(&sink, question_id).await?;
    let Some(option) = stored.row.question.options.get(index) else {
        return Err(Refused(
            StatusCode::BAD_REQUEST,
            format!(
                "callback_data: option {index} of question {question_id}, which has {}",
                stored.row.question.options.len()
            ),
        ));
    };
    let by = match &query.from {
        Some(User {
            username: Some(username),
            ..
        }) => format!("telegram:@{username}"),
        Some(User { id, .. }) => format!("telegram:{id}"),
        None => "telegram".to_owned(),
    };
    // The press is answered in the webhook's response (Telegram runs it as a method call), so
    // the person sees whether the answer was taken.
    let text = match hooks.answer(&stored, option, &by).await {
        Ok(_) => format!("Answered: {option}"),
        Err(Refused(_, why)) => format!("Refused: {why}"),
    };
    Ok(Json(json!({
        "method": "answerCallbackQuery",
        "callback_query_id": query.id,
        "text": text,
    })))
}

/// An answer posted to a webhook sink's endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookAnswer {
    question_id: Uuid,
    answer: String,
    #[serde(default)]
    answered_by: String,
}

async fn webhook(
    State(hooks): State<Arc<Hooks>>,
    Path((project, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, Refused> {
    let sink = hooks.sink(&project, &name, "webhook").await?;
    let SinkKind::Webhook { secret, .. } = &sink.kind else {
        return Err(Refused(
            StatusCode::NOT_FOUND,
            format!("{name} is not a webhook"),
        ));
    };
    let signature = headers
        .get(SIGNATURE_HEADER)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    if signature.is_empty() {
        return Err(Refused(
            StatusCode::UNAUTHORIZED,
            "X-Trellis-Signature: missing (sha256=<hex of HMAC-SHA256 of the body under the \
             sink's secret>)"
                .to_owned(),
        ));
    }
    if !message::verify(secret, &body, signature) {
        return Err(Refused(
            StatusCode::UNAUTHORIZED,
            format!(
                "X-Trellis-Signature: does not match the HMAC-SHA256 of the body under sink \
                 {name}'s secret"
            ),
        ));
    }
    let answer: WebhookAnswer = serde_json::from_slice(&body).map_err(|err| {
        Refused(
            StatusCode::BAD_REQUEST,
            format!(
                "the body is not an answer ({{\"question_id\", \"answer\", \"answered_by\"}}): \
                 {err}"
            ),
        )
    })?;
    let stored = hooks.question(&sink, answer.question_id).await?;
    let by = if answer.answered_by.is_empty() {
        format!("webhook:{name}")
    } else {
        answer.answered_by.clone()
    };
    let instance = hooks.answer(&stored, &answer.answer, &by).await?;
    Ok(Json(json!({
        "answered": true,
        "question_id": answer.question_id.to_string(),
        "task_instance_id": instance,
    })))
}
