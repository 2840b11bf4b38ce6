//! The `http` handler: one HTTP request; a 4xx status fails for good, a 5xx or a transport error
//! fails retryably.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::sdk::{Outcome, TaskContext};

/// Most bytes of a response body kept in the output.
const BODY_LIMIT: usize = 1024 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpInput {
    #[serde(default = "default_method")]
    method: String,
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// A string is sent as is; any other JSON value is sent as JSON.
    #[serde(default)]
    body: Option<Value>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

fn default_method() -> String {
    "GET".to_owned()
}

/// One client per process, so connections are pooled across tasks.
pub(crate) fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default()
    })
}

/// Sends the request and completes with `{status, headers, body}`; `body` is JSON when the
/// response parses as JSON, text otherwise.
pub(super) async fn run(ctx: TaskContext) -> Outcome {
    let HttpInput {
        method,
        url,
        headers,
        body,
        timeout_ms,
    } = match super::input(&ctx) {
        Ok(input) => input,
        Err(outcome) => return outcome,
    };
    let method = match reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()) {
        Ok(method) => method,
        Err(_) => return Outcome::failed(format!("invalid http method {method:?}"), false),
    };
    let mut request = client()
        .request(method, &url)
        .header("Idempotency-Key", ctx.idempotency_key())
        .timeout(Duration::from_millis(timeout_ms.unwrap_or(30_000)));
    for (name, value) in &headers {
        request = request.header(name, value);
    }
    request = match body {
        None | Some(Value::Null) => request,
        Some(Value::String(text)) => request.body(text),
        Some(value) => request.json(&value),
    };
    ctx.progress(0, format!("requesting {url}"));
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(error) if error.is_builder() => {
            return Outcome::failed(format!("invalid http request: {error}"), false);
        }
        Err(error) => {
            return Outcome::failed(format!("http request to {url} failed: {error}"), true);
        }
    };
    let status = response.status();
    let response_headers: BTreeMap<String, String> = response
        .headers()
        .iter()
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
        .collect();
    let mut body = Vec::new();
    let mut truncated = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = BODY_LIMIT - body.len();
                if chunk.len() > room {
                    truncated = true;
                    body.extend_from_slice(&chunk[..room]);
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(error) => {
                return Outcome::failed(
                    format!("reading the response of {url} failed: {error}"),
                    true,
                );
            }
        }
    }
    let body_value = serde_json::from_slice::<Value>(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    if status.is_client_error() || status.is_server_error() {
        let text: String = String::from_utf8_lossy(&body).chars().take(200).collect();
        return Outcome::failed(
            format!("{url} answered {status}: {text}"),
            status.is_server_error(),
        );
    }
    Outcome::Completed(json!({
        "status": status.as_u16(),
        "headers": response_headers,
        "body": body_value,
        "body_truncated": truncated,
    }))
}
