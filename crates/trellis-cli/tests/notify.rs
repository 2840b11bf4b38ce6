//! Questions that reach people, end to end through `trellis dev`: a question sent to a fake
//! Telegram Bot API and answered once by its button (a forged press and a second press refused),
//! an expired question applying its timeout action, and a webhook that fails twice retried until
//! it takes the notification, whose signed answer is taken and whose forged one is not.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hmac::{Hmac, Mac as _};
use serde_json::{Value, json};
use sha2::Sha256;
use support::Dev;

/// A request a fake server got: its `X-Trellis-Signature`, its body as sent and as JSON.
#[derive(Clone, Debug)]
struct Got {
    signature: String,
    raw: Vec<u8>,
    body: Value,
}

/// An HTTP server in this process that records what is posted to it and fails the first
/// `failures` requests with 503.
struct Fake {
    runtime: tokio::runtime::Runtime,
    url: String,
    got: Arc<Mutex<Vec<Got>>>,
}

#[derive(Clone)]
struct FakeState {
    got: Arc<Mutex<Vec<Got>>>,
    failures: Arc<Mutex<u32>>,
    /// The answer to a request taken.
    reply: Value,
}

async fn record(
    State(state): State<FakeState>,
    headers: HeaderMap,
    raw: axum::body::Bytes,
) -> (StatusCode, Json<Value>) {
    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let signature = headers
        .get("x-trellis-signature")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    state.got.lock().expect("not poisoned").push(Got {
        signature,
        raw: raw.to_vec(),
        body,
    });
    let mut failures = state.failures.lock().expect("not poisoned");
    if *failures > 0 {
        *failures -= 1;
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ok": false, "description": "try later"})),
        );
    }
    (StatusCode::OK, Json(state.reply.clone()))
}

impl Fake {
    /// Serves `path` (an axum route) answering `reply` once `failures` requests failed.
    fn start(path: &str, failures: u32, reply: Value) -> Fake {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let got = Arc::new(Mutex::new(Vec::new()));
        let state = FakeState {
            got: got.clone(),
            failures: Arc::new(Mutex::new(failures)),
            reply,
        };
        let router = axum::Router::new()
            .route(path, post(record))
            .with_state(state);
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        runtime.spawn(async move { axum::serve(listener, router).await });
        Fake { runtime, url, got }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().expect("not poisoned").clone()
    }

    /// Waits up to 30 s for the requests `until` is happy with.
    fn wait_for(&self, what: &str, until: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = self.got();
            if until(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within 30 s; got {got:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Posts `body` with `headers` to `url`; returns the status and the JSON answer.
    fn post(&self, url: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, Value) {
        self.runtime.block_on(async {
            let mut request = reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_vec());
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            let response = request.send().await.expect("the planner's hooks answer");
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
    }
}

fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(body);
    let tag: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("sha256={tag}")
}

/// Writes a plan with one question task and submits it; returns the execution id.
fn submit_question(dev: &Dev, name: &str, input: &str) -> String {
    submit_plan(
        dev,
        &format!("name: {name}\ntasks:\n  - id: ask\n    type: question\n    input: {input}\n"),
    )
}

/// Writes `plan` to a file and submits it; returns the execution id.
fn submit_plan(dev: &Dev, text: &str) -> String {
    let dir = tempfile::tempdir().expect("a temp dir");
    let plan = dir.path().join("plan.yaml");
    std::fs::write(&plan, text).expect("the plan is written");
    let submitted = dev.json(&["submit", plan.to_str().expect("a UTF-8 path")]);
    submitted["execution_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no execution_id in {submitted}"))
        .to_owned()
}

/// Waits up to 30 s for the execution to end; returns its state.
fn ended(dev: &Dev, execution: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = dev.json(&["status", execution]);
        let state = status["state"].as_str().unwrap_or_default().to_owned();
        if ["completed", "failed", "cancelled"].contains(&state.as_str()) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "still {state} after 30 s: {status}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `answer` the question task completed with.
fn answer(dev: &Dev, execution: &str) -> Value {
    let output = dev.ok(&["output", execution, "ask"]);
    let output: Value =
        serde_json::from_str(output.trim()).unwrap_or_else(|e| panic!("{e}: {output}"));
    output["answer"].clone()
}

#[test]
fn a_question_reaches_a_bot_and_one_button_press_answers_it() {
    let dev = Dev::start();
    let telegram = Fake::start(
        "/{bot}/sendMessage",
        0,
        json!({"ok": true, "result": {"message_id": 7}}),
    );
    let added = dev.json(&[
        "sinks",
        "add",
        "team",
        "--telegram-chat",
        "-10042",
        "--telegram-token",
        "T0KEN",
        "--telegram-api",
        &telegram.url,
        "--events",
        "question",
    ]);
    let secret = added["secret"].as_str().expect("a secret").to_owned();
    let hook = format!(
        "{}{}",
        dev.hooks,
        added["callback_path"].as_str().expect("a path")
    );
    assert!(hook.ends_with("/hooks/telegram/default/team"), "{hook}");

    let execution = submit_question(
        &dev,
        "release",
        r#"{text: "Ship 1.4?", options: [yes, no], type: approval, priority: high}"#,
    );
    let sent = telegram.wait_for("sendMessage", |got| !got.is_empty());
    let message = &sent[0].body;
    assert_eq!(message["chat_id"], "-10042", "{message}");
    let text = message["text"].as_str().expect("a text");
    assert!(
        text.contains("[high approval]") && text.contains("Ship 1.4?"),
        "{text}"
    );
    let buttons = message["reply_markup"]["inline_keyboard"]
        .as_array()
        .expect("buttons");
    let labels: Vec<&Value> = buttons.iter().map(|row| &row[0]["text"]).collect();
    assert_eq!(labels, [&json!("yes"), &json!("no")]);
    let data = |index: usize| {
        buttons[index][0]["callback_data"]
            .as_str()
            .expect("data")
            .to_owned()
    };
    let press = |data: &str| {
        serde_json::to_vec(&json!({
            "update_id": 1,
            "callback_query": {
                "id": "cb-1",
                "from": {"id": 5, "username": "ana"},
                "message": {"message_id": 7, "chat": {"id": -10_042}},
                "data": data,
            }
        }))
        .expect("JSON")
    };
    let secret_header = [("x-telegram-bot-api-secret-token", secret.as_str())];

    // Forged: without the sink's secret token, or with a button changed to the other option.
    let (status, body) = telegram.post(
        &hook,
        &[("x-telegram-bot-api-secret-token", "guess")],
        &press(&data(0)),
    );
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("X-Telegram-Bot-Api-Secret-Token: does not match"),
        "{body}"
    );
    let yes = data(0);
    let forged = yes.replacen(".0.", ".1.", 1);
    let (status, body) = telegram.post(&hook, &secret_header, &press(&forged));
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("does not carry this sink's signature"),
        "{body}"
    );
    // Nothing changed: the execution still waits for its answer.
    let state = dev.json(&["status", &execution])["state"].clone();
    assert_ne!(state, "completed", "a forged press answered the question");

    // The real press answers it, once.
    let (status, body) = telegram.post(&hook, &secret_header, &press(&yes));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["method"], "answerCallbackQuery", "{body}");
    assert_eq!(body["callback_query_id"], "cb-1", "{body}");
    assert_eq!(body["text"], "Answered: yes", "{body}");
    assert_eq!(ended(&dev, &execution), "completed");
    assert_eq!(answer(&dev, &execution), "yes");

    let (status, body) = telegram.post(&hook, &secret_header, &press(&data(1)));
    assert_eq!(status, 200, "{body}");
    let text = body["text"].as_str().unwrap_or_default();
    assert!(
        text.starts_with("Refused: ") && text.contains("already answered"),
        "{body}"
    );
    assert_eq!(
        answer(&dev, &execution),
        "yes",
        "the second press changed the answer"
    );
}

#[test]
fn an_expired_question_applies_its_timeout_action() {
    let dev = Dev::start();
    let execution = submit_question(
        &dev,
        "nightly",
        r#"{text: "Deploy tonight?", options: [yes, no], expires_in: 1s, timeout_action: answer, default_answer: "no"}"#,
    );
    assert_eq!(ended(&dev, &execution), "completed");
    assert_eq!(answer(&dev, &execution), "no");

    // Skipped: its dependents proceed, and under `continue_on_partial_failure` the execution
    // completes (without it, a skipped task fails the execution, as any task not completed).
    let skipped = submit_plan(
        &dev,
        "name: optional\noptions:\n  failure: {continue_on_partial_failure: true}\ntasks:\n  \
         - id: ask\n    type: question\n    \
         input: {text: \"Anything to add?\", expires_in: 1s, timeout_action: skip}\n  \
         - id: after\n    type: noop\n    depends_on: [ask]\n",
    );
    let state = ended(&dev, &skipped);
    let shown = dev.json(&["status", &skipped]);
    assert_eq!(state, "completed", "{shown}");
    assert_eq!(shown["counts"]["skipped"], 1, "{shown}");
    assert_eq!(shown["counts"]["completed"], 1, "{shown}");
}

#[test]
fn a_webhook_is_retried_until_it_takes_the_notification_and_only_signed_answers_count() {
    let dev = Dev::start();
    let webhook = Fake::start("/trellis", 2, json!({"received": true}));
    let url = format!("{}/trellis", webhook.url);
    let added = dev.json(&["sinks", "add", "ops", "--webhook", &url, "--secret", "k3y"]);
    assert_eq!(added["secret"], "k3y");
    let hook = format!(
        "{}{}",
        dev.hooks,
        added["callback_path"].as_str().expect("a path")
    );

    let execution = submit_question(&dev, "deploy", r#"{text: "Roll out?", options: [yes, no]}"#);
    // Two 503s, then taken: three attempts of the same delivery, each signed.
    let got = webhook.wait_for("a third attempt", |got| got.len() >= 3);
    let ids: Vec<&Value> = got.iter().map(|g| &g.body["delivery_id"]).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{got:#?}");
    for attempt in &got {
        assert_eq!(
            attempt.signature,
            signature("k3y", &attempt.raw),
            "{attempt:?}"
        );
    }
    let event = &got[0].body;
    assert_eq!(event["event"], "question");
    assert_eq!(event["question"]["text"], "Roll out?");
    let question = event["question"]["id"].as_str().expect("an id").to_owned();
    let deliveries = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listed = dev.json(&["sinks", "deliveries", "ops"]);
            let first = listed["deliveries"][0].clone();
            if first["status"] == "delivered" || Instant::now() > deadline {
                break first;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert_eq!(deliveries["status"], "delivered", "{deliveries}");
    assert_eq!(deliveries["attempts"], 3, "{deliveries}");
    assert_eq!(deliveries["last_status"], 200, "{deliveries}");

    // A forged answer (signed with another key, or not at all) is refused and changes nothing.
    let answer_body =
        serde_json::to_vec(&json!({"question_id": question, "answer": "yes"})).expect("JSON");
    let (status, body) = webhook.post(
        &hook,
        &[("x-trellis-signature", &signature("guess", &answer_body))],
        &answer_body,
    );
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("X-Trellis-Signature: does not match"),
        "{body}"
    );
    let (status, body) = webhook.post(&hook, &[], &answer_body);
    assert_eq!(status, 401, "{body}");
    assert_ne!(dev.json(&["status", &execution])["state"], "completed");

    // Signed with the sink's key: taken, and the execution's end is told too.
    let (status, body) = webhook.post(
        &hook,
        &[("x-trellis-signature", &signature("k3y", &answer_body))],
        &answer_body,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["answered"], true, "{body}");
    assert_eq!(ended(&dev, &execution), "completed");
    assert_eq!(answer(&dev, &execution), "yes");
    webhook.wait_for("the completed event", |got| {
        got.iter()
            .any(|g| g.body["event"] == "completed" && g.body["execution_id"] == execution.as_str())
    });
    // A second answer is refused.
    let (status, body) = webhook.post(
        &hook,
        &[("x-trellis-signature", &signature("k3y", &answer_body))],
        &answer_body,
    );
    assert_eq!(status, 409, "{body}");
}

#[test]
fn bad_sinks_are_refused_with_their_place_and_add_nothing() {
    let dev = Dev::start();
    let cases: [(&[&str], &str); 4] = [
        (
            &["sinks", "add", "ops", "--webhook", "ftp://example.com/x"],
            "webhook.url: \"ftp://example.com/x\" is a ftp URL",
        ),
        (
            &[
                "sinks",
                "add",
                "ops",
                "--webhook",
                "http://127.0.0.1:1/",
                "--events",
                "question,paused",
            ],
            "events[1]: unknown event \"paused\"",
        ),
        (
            &[
                "sinks",
                "add",
                "team",
                "--telegram-chat",
                "general",
                "--telegram-token",
                "T",
            ],
            "telegram.chat_id: \"general\" is not a chat id",
        ),
        (
            &[
                "sinks",
                "add",
                "ops",
                "--webhook",
                "http://127.0.0.1:1/",
                "--list",
                "nope",
            ],
            "list nope",
        ),
    ];
    for (args, expected) in cases {
        let (code, stdout, stderr) = dev.trellis(args);
        assert_ne!(code, 0, "{args:?} was taken: {stdout}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    let listed = dev.json(&["sinks", "list"]);
    assert_eq!(listed["sinks"], json!([]), "{listed}");
}
