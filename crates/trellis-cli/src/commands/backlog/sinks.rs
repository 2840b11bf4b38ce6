//! `trellis sinks add|list|remove|deliveries`: where a project's questions and ended executions
//! are told.

use std::io::{self, Write};

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tonic::Status;
use trellis_proto::v1;

use super::{Failure, Target, connect, refused};

/// Notification sinks: a webhook or a Telegram-compatible bot told of a project's questions and
/// of its executions completing or failing. Questions' options become buttons; a press answers.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis sinks add ops --webhook https://ops.example.com/trellis\n  \
    trellis sinks add team --telegram-chat -1001234567890 --telegram-token \"$BOT_TOKEN\"\n  \
    trellis sinks add auth-failures --list auth --events failed --webhook https://...\n  \
    trellis sinks list\n  \
    trellis sinks deliveries ops\n\n\
    A webhook gets each event as JSON, signed in X-Trellis-Signature (sha256=<hex HMAC-SHA256 of \
    the body under its secret>), retried with backoff until it answers 2xx. It answers a question \
    by posting {\"question_id\", \"answer\"} signed the same way to the planner's \
    /hooks/webhook/PROJECT/SINK.\n\
    A bot's buttons answer through Telegram's webhook: point setWebhook at the planner's \
    /hooks/telegram/PROJECT/SINK (behind HTTPS) with the secret_token `add` prints.")]
pub struct SinksArgs {
    #[command(subcommand)]
    pub command: SinksCommand,
    #[command(flatten)]
    pub target: Target,
}

/// What `trellis sinks` does.
#[derive(Debug, Subcommand)]
pub enum SinksCommand {
    /// Add a sink (a webhook or a bot) to the project.
    Add {
        /// Its name (a slug).
        name: String,
        /// Post events here (http:// or https://).
        #[arg(long, conflicts_with_all = ["telegram_chat", "telegram_token"], required_unless_present = "telegram_chat")]
        webhook: Option<String>,
        /// The webhook's HMAC key (default: a new random one, printed once).
        #[arg(
            long,
            requires = "webhook",
            env = "TRELLIS_SINK_SECRET",
            hide_env_values = true
        )]
        secret: Option<String>,
        /// Send to this Telegram chat (its numeric id).
        #[arg(long, requires = "telegram_token", allow_hyphen_values = true)]
        telegram_chat: Option<String>,
        /// The bot's token (from @BotFather).
        #[arg(long, env = "TRELLIS_TELEGRAM_TOKEN", hide_env_values = true)]
        telegram_token: Option<String>,
        /// The Bot API's base URL (a compatible server, or a local fake in tests).
        #[arg(long, default_value = "https://api.telegram.org")]
        telegram_api: String,
        /// Only the runs of this list (default: every execution of the project; executions not
        /// started by a list run belong to the project `default`).
        #[arg(long, default_value = "")]
        list: String,
        /// What it is told of: question, completed, failed (comma-separated; default all).
        #[arg(long, value_delimiter = ',')]
        events: Vec<String>,
    },
    /// List the project's sinks (without their secrets).
    List,
    /// Remove a sink and its deliveries.
    Remove {
        /// Its name.
        name: String,
    },
    /// The newest notifications, with their attempts.
    Deliveries {
        /// Only this sink's.
        sink: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

fn sink_json(sink: &v1::SinkView) -> Value {
    json!({
        "project": sink.project,
        "name": sink.name,
        "list": (!sink.list.is_empty()).then_some(&sink.list),
        "kind": sink.kind,
        "url": sink.url,
        "chat_id": (!sink.chat_id.is_empty()).then_some(&sink.chat_id),
        "events": sink.events,
        "created_at_unix_ms": sink.created_at_unix_ms,
    })
}

fn delivery_json(delivery: &v1::DeliveryView) -> Value {
    let payload: Value = serde_json::from_str(&delivery.payload).unwrap_or(Value::Null);
    json!({
        "delivery_id": delivery.delivery_id,
        "sink": delivery.sink,
        "event_key": delivery.event_key,
        "status": delivery.status,
        "attempts": delivery.attempts,
        "last_status": (delivery.last_status != 0).then_some(delivery.last_status),
        "last_error": delivery.last_error,
        "next_attempt_at_unix_ms": (delivery.next_attempt_at_unix_ms != 0).then_some(delivery.next_attempt_at_unix_ms),
        "delivered_at_unix_ms": (delivery.delivered_at_unix_ms != 0).then_some(delivery.delivered_at_unix_ms),
        "event_at_unix_ms": delivery.event_at_unix_ms,
        "payload": payload,
    })
}

/// `trellis sinks …`.
pub async fn sinks(args: SinksArgs) -> Result<(), Failure> {
    let target = args.target;
    let url = target.planner.as_str();
    let project = target.project.clone();
    let mut client = connect(url).await?;
    let fail = |status: Status| refused(url, &status);
    let mut out = io::stdout().lock();
    match args.command {
        SinksCommand::Add {
            name,
            webhook,
            secret,
            telegram_chat,
            telegram_token,
            telegram_api,
            list,
            events,
        } => {
            let kind = match (webhook, telegram_chat) {
                (Some(url), _) => v1::add_sink_request::Kind::Webhook(v1::WebhookSink {
                    url,
                    secret: secret.unwrap_or_default(),
                }),
                (None, Some(chat_id)) => v1::add_sink_request::Kind::Telegram(v1::TelegramSink {
                    api_url: telegram_api,
                    token: telegram_token.unwrap_or_default(),
                    chat_id,
                }),
                (None, None) => {
                    return Err(Failure::bad_input(
                        "give --webhook URL or --telegram-chat ID (with --telegram-token)",
                    ));
                }
            };
            let added = client
                .add_sink(v1::AddSinkRequest {
                    project,
                    name,
                    list,
                    events,
                    kind: Some(kind),
                })
                .await
                .map_err(fail)?
                .into_inner();
            let sink = added.sink.unwrap_or_default();
            if target.json {
                let mut value = sink_json(&sink);
                value["secret"] = json!(added.secret);
                value["callback_path"] = json!(added.callback_path);
                writeln!(out, "{value}")?;
            } else {
                writeln!(
                    out,
                    "added {} sink {} to project {} (told of {})",
                    sink.kind,
                    sink.name,
                    sink.project,
                    sink.events.join(", ")
                )?;
                if sink.kind == "webhook" {
                    writeln!(
                        out,
                        "  signing secret (shown once): {}\n  answers: POST \
                         {{\"question_id\", \"answer\"}} signed with it to the planner's \
                         --hooks-listen address at {}",
                        added.secret, added.callback_path
                    )?;
                } else {
                    writeln!(
                        out,
                        "  buttons answer through Telegram's webhook; point it at the planner's \
                         --hooks-listen address (behind HTTPS):\n  curl \
                         \"{}/bot$BOT_TOKEN/setWebhook\" -d url=https://YOUR-HOST{} -d \
                         secret_token={}",
                        sink.url, added.callback_path, added.secret
                    )?;
                }
            }
        }
        SinksCommand::List => {
            let sinks = client
                .list_sinks(v1::ListSinksRequest { project })
                .await
                .map_err(fail)?
                .into_inner()
                .sinks;
            if target.json {
                let sinks: Vec<Value> = sinks.iter().map(sink_json).collect();
                writeln!(out, "{}", json!({ "sinks": sinks }))?;
            } else if sinks.is_empty() {
                writeln!(out, "no sinks yet: trellis sinks add NAME --webhook URL")?;
            } else {
                for sink in sinks {
                    let target = if sink.kind == "telegram" {
                        format!("chat {} via {}", sink.chat_id, sink.url)
                    } else {
                        sink.url.clone()
                    };
                    let scope = if sink.list.is_empty() {
                        "whole project".to_owned()
                    } else {
                        format!("list {}", sink.list)
                    };
                    writeln!(
                        out,
                        "{:<20} {:<9} {:<28} {scope}  {target}",
                        sink.name,
                        sink.kind,
                        sink.events.join(",")
                    )?;
                }
            }
        }
        SinksCommand::Remove { name } => {
            let removed = client
                .remove_sink(v1::RemoveSinkRequest {
                    project: project.clone(),
                    name: name.clone(),
                })
                .await
                .map_err(fail)?
                .into_inner()
                .removed;
            if !removed {
                return Err(Failure::bad_input(format!(
                    "project {project} has no sink {name} (trellis sinks list)"
                )));
            }
            writeln!(out, "removed sink {name}")?;
        }
        SinksCommand::Deliveries { sink, limit } => {
            let deliveries = client
                .list_deliveries(v1::ListDeliveriesRequest {
                    project,
                    sink: sink.unwrap_or_default(),
                    limit,
                })
                .await
                .map_err(fail)?
                .into_inner()
                .deliveries;
            if target.json {
                let deliveries: Vec<Value> = deliveries.iter().map(delivery_json).collect();
                writeln!(out, "{}", json!({ "deliveries": deliveries }))?;
            } else if deliveries.is_empty() {
                writeln!(out, "no notifications yet")?;
            } else {
                for delivery in deliveries {
                    let last = if delivery.last_error.is_empty() {
                        String::new()
                    } else {
                        format!("  last: {}", delivery.last_error)
                    };
                    writeln!(
                        out,
                        "{:<14} {:<10} {:<60} {} attempt(s){last}",
                        delivery.sink, delivery.status, delivery.event_key, delivery.attempts
                    )?;
                }
            }
        }
    }
    Ok(())
}
