//! What a notification says, without I/O: the event as JSON (a webhook's body), the same event as
//! a chat message with a question's options as buttons, the signatures of both directions, and
//! the `callback_data` of a button, which names the question and the option and carries a MAC so
//! a forged one is refused before anything is looked up.

use hmac::{Hmac, Mac as _};
use serde_json::{Value, json};
use sha2::Sha256;
use trellis_checkpoint_store::store::QuestionRow;
use trellis_core::machine::TimeoutAction;
use trellis_core::time::utc;
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

/// The header a webhook's body (and an answer posted back) is signed in: `sha256=<hex>`.
pub const SIGNATURE_HEADER: &str = "x-trellis-signature";

/// The header naming a delivery, so a receiver can drop a repeat.
pub const DELIVERY_HEADER: &str = "x-trellis-delivery";

/// The header Telegram puts the webhook's `secret_token` in.
pub const TELEGRAM_SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

/// Bytes of a button's MAC (hex in `callback_data`, whose limit is 64 bytes).
const BUTTON_MAC_BYTES: usize = 10;

/// Which project (and list) an execution's notifications belong to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub project: String,
    pub list: Option<String>,
}

impl Scope {
    /// The scope of an execution from its labels: a list run's project and list (the labels the
    /// backlog starts runs with), else the project `default`.
    pub fn of_labels(labels: &std::collections::BTreeMap<String, String>) -> Scope {
        match labels.get("backlog-project") {
            Some(project) => Scope {
                project: project.clone(),
                list: labels.get("backlog-list").cloned(),
            },
            None => Scope {
                project: crate::backlog::DEFAULT_PROJECT.to_owned(),
                list: None,
            },
        }
    }
}

/// The event of a question, JSON.
pub fn question_event(
    delivery_id: Uuid,
    scope: &Scope,
    execution_name: &str,
    asked: &QuestionRow,
    answer_path: &str,
) -> Value {
    let question = &asked.question;
    let (timeout_action, default_answer) = match &question.timeout_action {
        TimeoutAction::Fail => ("fail", None),
        TimeoutAction::Skip => ("skip", None),
        TimeoutAction::Answer(answer) => ("answer", Some(answer.as_str())),
    };
    json!({
        "event": "question",
        "delivery_id": delivery_id.to_string(),
        "project": scope.project,
        "list": scope.list,
        "execution_id": asked.execution_id.to_string(),
        "execution_name": execution_name,
        "task_id": asked.task_id,
        "question": {
            "id": question.id.to_string(),
            "type": question.question_type,
            "priority": question.priority,
            "text": question.text,
            "options": question.options,
            "expires_at_unix_ms": question.expires_at_ms,
            "timeout_action": timeout_action,
            "default_answer": default_answer,
        },
        "asked_at_unix_ms": asked.asked_at_ms,
        "answer_path": answer_path,
    })
}

/// The event of an execution that ended: `completed` or `failed`.
pub fn execution_event(
    delivery_id: Uuid,
    scope: &Scope,
    outcome: &str,
    execution: &trellis_checkpoint_store::store::ExecutionRow,
) -> Value {
    json!({
        "event": outcome,
        "delivery_id": delivery_id.to_string(),
        "project": scope.project,
        "list": scope.list,
        "execution_id": execution.execution_id.to_string(),
        "execution_name": execution.name,
        "reason": execution.reason,
        "ended_at_unix_ms": execution.ended_at_ms,
    })
}

/// A chat message made from an event: its text, and one button per option of a question, each
/// `(label, callback_data)`.
pub fn chat_message(event: &Value, callback_secret: &str) -> (String, Vec<(String, String)>) {
    let name = event["execution_name"].as_str().unwrap_or_default();
    let execution = event["execution_id"].as_str().unwrap_or_default();
    match event["event"].as_str().unwrap_or_default() {
        "question" => {
            let question = &event["question"];
            let mut header = Vec::new();
            for field in ["priority", "type"] {
                if let Some(value) = question[field].as_str().filter(|v| !v.is_empty()) {
                    header.push(value.to_owned());
                }
            }
            let task = event["task_id"].as_str().unwrap_or_default();
            let mut text = format!(
                "❓ {}Question from task {task} of {name} ({execution})\n\n{}",
                if header.is_empty() {
                    String::new()
                } else {
                    format!("[{}] ", header.join(" "))
                },
                question["text"].as_str().unwrap_or_default()
            );
            if let Some(expires) = question["expires_at_unix_ms"].as_i64() {
                let then = match question["timeout_action"].as_str() {
                    Some("answer") => format!(
                        "answered \"{}\"",
                        question["default_answer"].as_str().unwrap_or_default()
                    ),
                    Some("skip") => "the task is skipped".to_owned(),
                    _ => "the task fails".to_owned(),
                };
                text.push_str(&format!(
                    "\n\nExpires at {} UTC; then {then}.",
                    utc(expires)
                ));
            }
            let id = question["id"]
                .as_str()
                .and_then(|id| Uuid::parse_str(id).ok());
            let options: Vec<&str> = question["options"]
                .as_array()
                .map(|options| options.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            match id {
                Some(id) if !options.is_empty() => {
                    let buttons = options
                        .iter()
                        .enumerate()
                        .map(|(index, option)| {
                            (
                                (*option).to_owned(),
                                button_data(callback_secret, id, index),
                            )
                        })
                        .collect();
                    (text, buttons)
                }
                _ => {
                    text.push_str(&format!(
                        "\n\nAnswer with: trellis answer {execution} {} \"...\"",
                        question["id"].as_str().unwrap_or_default()
                    ));
                    (text, Vec::new())
                }
            }
        }
        "completed" => (format!("✅ {name} ({execution}) completed"), Vec::new()),
        outcome => {
            let reason = event["reason"].as_str().unwrap_or_default();
            let reason = if reason.is_empty() {
                String::new()
            } else {
                format!(": {reason}")
            };
            (
                format!("❌ {name} ({execution}) {outcome}{reason}"),
                Vec::new(),
            )
        }
    }
}

fn mac(key: &str) -> HmacSha256 {
    // HMAC takes a key of any length, so this cannot fail.
    HmacSha256::new_from_slice(key.as_bytes()).expect("HMAC accepts any key length")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

/// The `X-Trellis-Signature` of a body: `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(body);
    format!("sha256={}", hex(&mac.finalize().into_bytes()))
}

/// Checks an `X-Trellis-Signature` in constant time.
pub fn verify(secret: &str, body: &[u8], signature: &str) -> bool {
    let Some(tag) = signature.strip_prefix("sha256=").and_then(unhex) else {
        return false;
    };
    let mut mac = mac(secret);
    mac.update(body);
    mac.verify_slice(&tag).is_ok()
}

/// The `callback_data` of the button answering `question` with its option `index`:
/// `a.<question id, hex>.<index>.<MAC, hex>` (57 bytes at most, under Telegram's 64).
pub fn button_data(secret: &str, question: Uuid, index: usize) -> String {
    let signed = format!("a.{}.{index}", question.simple());
    let mut mac = mac(secret);
    mac.update(signed.as_bytes());
    let tag = mac.finalize().into_bytes();
    format!("{signed}.{}", hex(&tag[..BUTTON_MAC_BYTES]))
}

/// Why a button's `callback_data` was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ButtonError {
    #[error("callback_data {0:?} is not a Trellis answer button (a.<question>.<option>.<mac>)")]
    Malformed(String),
    #[error("callback_data {0:?} does not carry this sink's signature: forged or for another bot")]
    Forged(String),
}

/// Reads a button's `callback_data`: the question and the option's index, once its MAC holds.
pub fn read_button(secret: &str, data: &str) -> Result<(Uuid, usize), ButtonError> {
    let malformed = || ButtonError::Malformed(data.to_owned());
    let mut parts = data.split('.');
    let (Some("a"), Some(id), Some(index), Some(tag), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(malformed());
    };
    let tag = unhex(tag)
        .filter(|tag| tag.len() == BUTTON_MAC_BYTES)
        .ok_or_else(malformed)?;
    let mut mac = mac(secret);
    mac.update(format!("a.{id}.{index}").as_bytes());
    mac.verify_truncated_left(&tag)
        .map_err(|_| ButtonError::Forged(data.to_owned()))?;
    let id = Uuid::try_parse(id).map_err(|_| malformed())?;
    let index = index.parse().map_err(|_| malformed())?;
    Ok((id, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_button_reads_back_and_a_changed_one_is_refused() {
        let id = Uuid::now_v7();
        let data = button_data("s3cret", id, 1);
        assert!(data.len() <= 64, "{data} is over Telegram's 64 bytes");
        assert_eq!(read_button("s3cret", &data), Ok((id, 1)));
        // Another option with the first one's MAC.
        let other = data.replacen(".1.", ".0.", 1);
        assert_eq!(
            read_button("s3cret", &other),
            Err(ButtonError::Forged(other.clone()))
        );
        // Another bot's key.
        assert!(matches!(
            read_button("other", &data),
            Err(ButtonError::Forged(_))
        ));
        assert!(matches!(
            read_button("s3cret", "yes"),
            Err(ButtonError::Malformed(_))
        ));
    }

    #[test]
    fn a_signature_verifies_only_its_own_body_and_key() {
        let signature = sign("key", b"{\"a\":1}");
        assert!(signature.starts_with("sha256="));
        assert!(verify("key", b"{\"a\":1}", &signature));
        assert!(!verify("key", b"{\"a\":2}", &signature));
        assert!(!verify("other", b"{\"a\":1}", &signature));
        assert!(!verify("key", b"{\"a\":1}", "sha256=zz"));
        assert!(!verify("key", b"{\"a\":1}", ""));
    }

    #[test]
    fn instants_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_796_000_000_000), "2026-11-30 00:53:20");
    }

    #[test]
    fn a_question_becomes_a_message_with_one_button_per_option() {
        let event = json!({
            "event": "question",
            "execution_id": "e-1",
            "execution_name": "deploy",
            "task_id": "ask",
            "question": {
                "id": Uuid::nil().to_string(),
                "type": "approval",
                "priority": "high",
                "text": "Ship it?",
                "options": ["yes", "no"],
                "expires_at_unix_ms": 0,
                "timeout_action": "answer",
                "default_answer": "no",
            },
        });
        let (text, buttons) = chat_message(&event, "k");
        assert!(text.contains("[high approval]"), "{text}");
        assert!(text.contains("Ship it?"), "{text}");
        assert!(text.contains("then answered \"no\""), "{text}");
        let labels: Vec<&str> = buttons.iter().map(|(label, _)| label.as_str()).collect();
        assert_eq!(labels, ["yes", "no"]);
        assert_eq!(read_button("k", &buttons[1].1), Ok((Uuid::nil(), 1)));
    }
}
