//! One attempt at one delivery: a webhook's signed POST, or a bot's `sendMessage`.

use std::time::Duration;

use serde_json::{Value, json};
use trellis_checkpoint_store::store::notify::{DeliveryRow, SinkKind, SinkRow};

use super::message::{self, DELIVERY_HEADER, SIGNATURE_HEADER};

/// How long one attempt may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// How one attempt went.
#[derive(Debug, PartialEq, Eq)]
pub enum Sent {
    /// Accepted (a 2xx answer, or a bot's `ok: true`).
    Delivered { status: u16 },
    /// Not accepted; `retry` when another attempt may fare better.
    Refused {
        status: Option<u16>,
        error: String,
        retry: bool,
    },
}

/// Whether an HTTP status may fare better later: server errors, timeouts, too many requests.
fn retryable(status: u16) -> bool {
    status >= 500 || status == 408 || status == 425 || status == 429
}

/// Makes one attempt at `delivery` to `sink`.
pub async fn attempt(http: &reqwest::Client, sink: &SinkRow, delivery: &DeliveryRow) -> Sent {
    match &sink.kind {
        SinkKind::Webhook { url, secret } => {
            let body = delivery.payload.clone().into_bytes();
            let request = http
                .post(url)
                .timeout(ATTEMPT_TIMEOUT)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(SIGNATURE_HEADER, message::sign(secret, &body))
                .header(DELIVERY_HEADER, delivery.delivery_id.to_string())
                .body(body);
            match request.send().await {
                Ok(response) if response.status().is_success() => Sent::Delivered {
                    status: response.status().as_u16(),
                },
                Ok(response) => {
                    let status = response.status().as_u16();
                    let text = response.text().await.unwrap_or_default();
                    Sent::Refused {
                        status: Some(status),
                        error: format!("{url} answered {status}: {}", clip(&text)),
                        retry: retryable(status),
                    }
                }
                Err(err) => Sent::Refused {
                    status: None,
                    error: format!("cannot reach {url}: {err}"),
                    retry: true,
                },
            }
        }
        SinkKind::Telegram {
            base_url,
            token,
            chat_id,
            callback_secret,
        } => {
            let event: Value = match serde_json::from_str(&delivery.payload) {
                Ok(event) => event,
                Err(err) => {
                    return Sent::Refused {
                        status: None,
                        error: format!("the stored event is not JSON: {err}"),
                        retry: false,
                    };
                }
            };
            let (text, buttons) = message::chat_message(&event, callback_secret);
            let mut body = json!({ "chat_id": chat_id, "text": text });
            if !buttons.is_empty() {
                // One button per row: options can be long.
                let rows: Vec<Value> = buttons
                    .into_iter()
                    .map(|(label, data)| json!([{ "text": label, "callback_data": data }]))
                    .collect();
                body["reply_markup"] = json!({ "inline_keyboard": rows });
            }
            let base = base_url.trim_end_matches('/');
            let url = format!("{base}/bot{token}/sendMessage");
            // The token is part of the URL: errors name the base URL only.
            match http
                .post(&url)
                .timeout(ATTEMPT_TIMEOUT)
                .json(&body)
                .send()
                .await
            {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let answer: Value = response.json().await.unwrap_or(Value::Null);
                    if answer["ok"] == json!(true) {
                        Sent::Delivered { status }
                    } else {
                        let description = answer["description"]
                            .as_str()
                            .map_or_else(|| format!("status {status}"), str::to_owned);
                        Sent::Refused {
                            status: Some(status),
                            error: format!("{base} sendMessage refused: {}", clip(&description)),
                            retry: retryable(status),
                        }
                    }
                }
                Err(err) => Sent::Refused {
                    status: None,
                    error: format!(
                        "cannot reach {base}: {}",
                        err.without_url()
                            .to_string()
                            .replace(token.as_str(), "<token>")
                    ),
                    retry: true,
                },
            }
        }
    }
}

/// At most 200 characters of a peer's text, for the record.
fn clip(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
