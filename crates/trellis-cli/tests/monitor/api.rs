//! The JSON API and the live stream, read over HTTP.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use crate::{Dev, TOKEN, start_dev, start_dev_with};

/// A plan that stops at a question: `prepare`, then `ask` (yes/no), then `ship`.
const QUESTION_PLAN: &str = "name: monitor-api\ntasks:\n\
    - {id: prepare, type: sleep, input: {ms: 200}}\n\
    - {id: ask, type: question, depends_on: [prepare], input: {text: Ship it?, options: [yes, no]}}\n\
    - {id: ship, type: noop, depends_on: [ask]}\n";

pub(crate) async fn get(url: &str) -> (u16, Value) {
    let response = reqwest::get(url).await.expect("the monitor answers");
    let status = response.status().as_u16();
    let body = response.json().await.expect("a JSON body");
    (status, body)
}

pub(crate) async fn post(url: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(url).json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("the monitor answers");
    let status = response.status().as_u16();
    let body = response.json().await.expect("a JSON body");
    (status, body)
}

/// Reads Server-Sent Events frames as `(event, data)`.
struct Sse {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: String,
}

impl Sse {
    async fn open(url: &str) -> Sse {
        let response = reqwest::get(url).await.expect("the live stream opens");
        assert_eq!(response.status().as_u16(), 200, "live stream status");
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert_eq!(content_type, "text/event-stream");
        Sse {
            body: Box::pin(response.bytes_stream()),
            buffer: String::new(),
        }
    }

    async fn next(&mut self) -> (String, Value) {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                let mut event = String::new();
                let mut data = String::new();
                for line in frame.lines() {
                    if let Some(rest) = line.strip_prefix("event: ") {
                        event = rest.to_owned();
                    } else if let Some(rest) = line.strip_prefix("data: ") {
                        data = rest.to_owned();
                    }
                }
                if event.is_empty() {
                    continue; // a keep-alive comment
                }
                let data = serde_json::from_str(&data).expect("frame data is JSON");
                return (event, data);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.body.next())
                .await
                .expect("the live stream sends within 30 s")
                .expect("the live stream stays open")
                .expect("the live stream reads");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

async fn open_question(dev: &Dev, id: &str) -> Value {
    let url = format!("{}/api/executions/{id}", dev.monitor);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = get(&url).await;
        let question = body["questions"][0].clone();
        if !question.is_null() {
            return question;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no question after 30 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_streams_an_execution_and_guards_its_controls() {
    let dev = start_dev();
    let base = format!("{}/api", dev.monitor);
    let (status, config) = get(&format!("{base}/config")).await;
    assert_eq!((status, &config["controls"]), (200, &json!(true)));

    // One coordinator, holding the one shard of `trellis dev`.
    let (status, cluster) = get(&format!("{base}/cluster")).await;
    assert_eq!(status, 200, "{cluster}");
    assert_eq!(cluster["shards"], json!(1), "{cluster}");
    assert_eq!(
        cluster["coordinators"][0]["shards"],
        json!([0]),
        "{cluster}"
    );
    assert_eq!(cluster["unowned_shards"], json!([]), "{cluster}");

    let id = dev.start(QUESTION_PLAN).await;
    let execution = format!("{base}/executions/{id}");

    // The list and the plan by waves.
    let (status, list) = get(&format!("{base}/executions")).await;
    assert_eq!(status, 200);
    assert!(
        list["executions"]
            .as_array()
            .expect("an array")
            .iter()
            .any(|e| e["id"] == json!(id) && e["name"] == json!("monitor-api")),
        "the list shows the execution: {list}"
    );
    let (_, plan) = get(&format!("{execution}/plan")).await;
    assert_eq!(
        plan["waves"],
        json!([["prepare"], ["ask"], ["ship"]]),
        "plan: {plan}"
    );

    // The live stream starts with a snapshot, then updates as the execution moves.
    let mut live = Sse::open(&format!("{execution}/live")).await;
    let (event, snapshot) = live.next().await;
    assert_eq!(event, "snapshot");
    assert_eq!(snapshot["execution"]["id"], json!(id));
    let question = open_question(&dev, &id).await;
    assert_eq!(question["text"], json!("Ship it?"));
    assert_eq!(question["options"], json!(["yes", "no"]));
    let question_id = question["question_id"].as_str().expect("a question id");

    // Without the token, or with a wrong one, controls are refused and change nothing.
    let before = dev.execution(&id).await;
    for token in [None, Some("wrong-token")] {
        let (status, body) = post(&format!("{execution}/pause"), token, json!({})).await;
        assert_eq!(status, 401, "pause with {token:?}: {body}");
        assert!(body["error"].as_str().is_some_and(|e| e.contains("token")));
        let (status, _) = post(&format!("{execution}/cancel"), token, json!({})).await;
        assert_eq!(status, 401);
        let answer = format!("{execution}/questions/{question_id}/answer");
        let (status, _) = post(&answer, token, json!({ "answer": "yes" })).await;
        assert_eq!(status, 401);
    }
    let after = dev.execution(&id).await;
    assert_eq!(
        after.state, before.state,
        "refused controls changed the state"
    );
    assert_eq!(
        after.last_sequence, before.last_sequence,
        "refused controls appended events"
    );
    assert_eq!(after.open_questions.len(), 1, "the question is still open");

    // Bad input is named and changes nothing.
    let answer_url = format!("{execution}/questions/{question_id}/answer");
    let (status, body) = post(&answer_url, Some(TOKEN), json!({ "answer": 3 })).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(&answer_url, Some(TOKEN), json!({ "answer": "maybe" })).await;
    assert_eq!(status, 400, "an answer outside the options: {body}");
    let (status, body) = post(&format!("{execution}/explode"), Some(TOKEN), json!({})).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = get(&format!("{base}/executions/not-an-id/plan")).await;
    assert_eq!(status, 400, "{body}");
    let unknown = "0192f1d0-0000-7000-8000-000000000000";
    let (status, body) = get(&format!("{base}/executions/{unknown}/plan")).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        dev.execution(&id).await.last_sequence,
        after.last_sequence,
        "bad input appended events"
    );

    // With the token: a checkpoint, then the answer; the task resumes and the execution ends.
    let (status, body) = post(&format!("{execution}/checkpoint"), Some(TOKEN), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (_, checkpoints) = get(&format!("{execution}/checkpoints")).await;
    assert!(
        !checkpoints["checkpoints"]
            .as_array()
            .expect("an array")
            .is_empty(),
        "{checkpoints}"
    );
    let (status, body) = post(&answer_url, Some(TOKEN), json!({ "answer": "yes" })).await;
    assert_eq!(status, 200, "{body}");
    let resumed = body["task_instance_id"]
        .as_str()
        .expect("the new instance")
        .to_owned();

    let mut states = std::collections::HashMap::new();
    let mut kinds = Vec::new();
    loop {
        let (event, data) = live.next().await;
        match event.as_str() {
            "update" => {
                for instance in data["instances"].as_array().expect("instances") {
                    states.insert(
                        instance["id"].as_str().unwrap_or_default().to_owned(),
                        instance["state"].as_str().unwrap_or_default().to_owned(),
                    );
                }
                kinds.extend(
                    data["events"]
                        .as_array()
                        .expect("events")
                        .iter()
                        .map(|e| e["kind"].as_str().unwrap_or_default().to_owned()),
                );
            }
            "end" => break,
            other => panic!("unexpected frame {other}: {data}"),
        }
    }
    assert_eq!(states.get(&resumed).map(String::as_str), Some("completed"));
    assert!(kinds.contains(&"question_answered".to_owned()), "{kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("execution_finished"));
    let (_, done) = get(&execution).await;
    assert_eq!(done["execution"]["state"], json!("completed"), "{done}");

    // The log pages without gaps.
    let mut from = 1;
    let mut seqs = Vec::new();
    loop {
        let (status, page) = get(&format!("{execution}/events?from={from}&limit=2")).await;
        assert_eq!(status, 200, "{page}");
        let events = page["events"].as_array().expect("events");
        assert!(events.len() <= 2);
        seqs.extend(events.iter().map(|e| e["seq"].as_u64().expect("a seq")));
        match page["next"].as_u64() {
            Some(next) => from = next,
            None => break,
        }
    }
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected);
    assert_eq!(
        seqs.len() as u64,
        dev.execution(&id).await.last_sequence,
        "every event is listed"
    );
    let (status, body) = get(&format!("{execution}/events?limit=0")).await;
    assert_eq!(status, 400, "{body}");

    // Instances and workers.
    let (_, instances) = get(&format!("{execution}/instances")).await;
    let tasks: Vec<&str> = instances["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|i| i["task_id"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        tasks.iter().filter(|t| **t == "ask").count(),
        2,
        "{tasks:?}"
    );
    let (_, workers) = get(&format!("{base}/workers")).await;
    assert!(
        !workers["workers"].as_array().expect("workers").is_empty(),
        "{workers}"
    );
}

/// A `shell` task that prints a line every 100 ms for two seconds.
const TICKING_PLAN: &str = "name: monitor-logs\ntasks:\n\
    - {id: tick, type: shell, input: {command: [sh, -c, 'i=0; while [ $i -lt 20 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done; echo done >&2']}}\n";

/// `trellis logs -f` prints a task's lines as they are written and exits once the execution
/// ended; `trellis logs` reads them back, also once the stream no longer holds them; the monitor
/// serves them page by page and live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trellis_logs_follows_a_running_task_and_the_monitor_serves_its_lines() {
    use std::io::BufRead as _;
    let dev = start_dev();
    let id = dev.start(TICKING_PLAN).await;
    let mut follow = std::process::Command::new(crate::TRELLIS)
        .args(["--coordinator", &dev.coordinator, "logs", "-f", &id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("trellis logs -f starts");
    let stdout = follow.stdout.take().expect("piped stdout");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let first = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("a first line within 30 s");
    assert!(first.ends_with(" tick#1 stdout| tick 0"), "{first}");
    let state = dev.execution(&id).await.state;
    assert_eq!(
        state,
        trellis_proto::v1::ExecutionState::Running as i32,
        "the first line is printed while the task runs"
    );
    // It exits by itself after the execution ended, having printed every line.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = follow.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "trellis logs -f still runs 60 s later"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "trellis logs -f exited with {status}");
    let mut followed = vec![first];
    followed.extend(lines.try_iter());
    let expected: Vec<String> = (0..20).map(|n| format!("tick {n}")).collect();
    let texts: Vec<String> = followed
        .iter()
        .filter(|line| line.contains(" stdout| "))
        .filter_map(|line| line.split(" stdout| ").nth(1).map(str::to_owned))
        .collect();
    assert_eq!(texts, expected, "followed:\n{}", followed.join("\n"));
    assert!(
        followed
            .iter()
            .any(|line| line.ends_with(" tick#1 stderr| done")),
        "{followed:?}"
    );

    // Read back afterwards, one task by its plan id.
    let output = std::process::Command::new(crate::TRELLIS)
        .args(["--coordinator", &dev.coordinator, "logs", &id, "tick"])
        .output()
        .expect("trellis logs runs");
    assert!(output.status.success());
    let out = String::from_utf8_lossy(&output.stdout);
    assert_eq!(out.lines().count(), 21, "{out}");

    // The monitor's page of lines, then the rest after the first five.
    let logs = format!("{}/api/executions/{id}/logs", dev.monitor);
    let (status, body) = get(&logs).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["next"], 21, "{body}");
    assert_eq!(body["lines"][0]["text"], "tick 0");
    assert_eq!(body["lines"][0]["source"], "stdout");
    assert_eq!(body["lines"][20]["source"], "stderr");
    let (_, rest) = get(&format!("{logs}?after=5")).await;
    assert_eq!(rest["lines"][0]["text"], "tick 5", "{rest}");
    assert_eq!(rest["next"], 21);
    let (status, body) = get(&format!("{logs}?instance=nope")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("not a task instance id")),
        "{body}"
    );

    // Live in the monitor: a running task's lines arrive as Server-Sent Events while it runs,
    // every line once and in order, then `end` once the execution has ended.
    let running = dev.start(TICKING_PLAN).await;
    let live = format!("{}/api/executions/{running}/logs/live", dev.monitor);
    let (frames, state_at_first) =
        read_events(&live, async || dev.execution(&running).await.state).await;
    assert_eq!(
        state_at_first,
        trellis_proto::v1::ExecutionState::Running as i32,
        "the first lines arrive while the task runs"
    );
    let texts = frame_texts(&frames);
    let mut expected: Vec<String> = (0..20).map(|n| format!("tick {n}")).collect();
    expected.push("done".to_owned());
    assert_eq!(texts, expected, "{frames:?}");
    let (last, data) = frames.last().expect("frames");
    assert_eq!(
        (last.as_str(), &data["next"]),
        ("end", &json!(21)),
        "{frames:?}"
    );
    // Reconnecting after the first five lines: the rest, none twice.
    let (frames, _) = read_events(&format!("{live}?after=5"), async || 0).await;
    assert_eq!(frame_texts(&frames), expected[5..], "{frames:?}");

    // The store's copy: once the stream no longer holds the lines, `trellis logs` still reads
    // them (from the embedded SQLite checkpoint-store).
    let js = async_nats::jetstream::new(
        async_nats::connect(dev.nats.url())
            .await
            .expect("NATS answers"),
    );
    js.get_stream("TRELLIS_LOGS")
        .await
        .expect("the log stream exists")
        .purge()
        .await
        .expect("purged");
    let output = std::process::Command::new(crate::TRELLIS)
        .args(["--coordinator", &dev.coordinator, "logs", &id, "tick"])
        .output()
        .expect("trellis logs runs");
    let after_purge = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(after_purge, out, "the same lines, from the store");
}

/// Reads the Server-Sent Events of `url` until an `end` event or the stream's end, as `(event,
/// data)`; `at_first`
/// runs when the first `lines` event arrives, and its answer is returned beside them.
async fn read_events<T: Default>(
    url: &str,
    at_first: impl AsyncFnOnce() -> T,
) -> (Vec<(String, Value)>, T) {
    let response = reqwest::get(url).await.expect("the monitor answers");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "an event stream"
    );
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let mut frames = Vec::new();
    let mut at_first = Some(at_first);
    let mut first = T::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Some(chunk) = tokio::time::timeout_at(deadline, body.next())
        .await
        .expect("the live log ends within 60 s")
    {
        text.push_str(&String::from_utf8_lossy(&chunk.expect("a chunk")));
        while let Some(end) = text.find("\n\n") {
            let frame: String = text.drain(..end + 2).collect();
            let mut event = None;
            let mut data = None;
            for line in frame.lines() {
                if let Some(name) = line.strip_prefix("event: ") {
                    event = Some(name.to_owned());
                } else if let Some(json) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str::<Value>(json).expect("JSON data"));
                }
            }
            let (Some(event), Some(data)) = (event, data) else {
                continue; // a keep-alive comment
            };
            if event == "lines"
                && let Some(at_first) = at_first.take()
            {
                first = at_first().await;
            }
            let end = event == "end";
            frames.push((event, data));
            if end {
                return (frames, first);
            }
        }
    }
    (frames, first)
}

/// The texts of every line of the `lines` events.
fn frame_texts(frames: &[(String, Value)]) -> Vec<String> {
    frames
        .iter()
        .filter(|(event, _)| event == "lines")
        .flat_map(|(_, data)| data["lines"].as_array().cloned().unwrap_or_default())
        .map(|line| line["text"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// With `trellis dev --breaker-failures 2`, two failed attempts of one task type open its circuit
/// breaker: the monitor's `/api/workers` lists it open with its probe time, and `trellis workers`
/// prints it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_breaker_is_on_the_workers_page() {
    let dev = start_dev_with(&["--breaker-failures", "2", "--breaker-cooldown", "10m"]);
    let (_, before) = get(&format!("{}/api/workers", dev.monitor)).await;
    assert_eq!(before["breakers"], json!([]), "none before: {before}");
    dev.start(
        "name: breaking\ntasks:\n- {id: a, type: fail, input: {times: 99}}\n\
         - {id: b, type: fail, input: {times: 99}}\n",
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let breaker = loop {
        let (status, body) = get(&format!("{}/api/workers", dev.monitor)).await;
        assert_eq!(status, 200, "{body}");
        let open = body["breakers"]
            .as_array()
            .and_then(|breakers| breakers.iter().find(|b| b["state"] == "open").cloned());
        if let Some(open) = open {
            break open;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no open breaker within 30 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(breaker["task_type"], "fail", "{breaker}");
    assert!(
        breaker["queue"]
            .as_str()
            .is_some_and(|queue| !queue.is_empty()),
        "{breaker}"
    );
    let probe_at = breaker["retry_at_ms"]
        .as_i64()
        .expect("an open breaker has a probe time");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default();
    assert!(
        probe_at > now + 9 * 60 * 1000,
        "the probe waits the 10 minute cooldown: {breaker}"
    );
    let output = std::process::Command::new(crate::TRELLIS)
        .args(["--coordinator", &dev.coordinator, "workers"])
        .output()
        .expect("trellis workers runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("circuit breakers") && text.contains("open"),
        "{text}"
    );
}

/// A failed execution ends its live stream, and does not read as finished work: the list counts
/// the task that never ran (1 of 2 done, 50%) and shows no ETA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_execution_ends_live_and_counts_what_never_ran() {
    let dev = start_dev();
    let id = dev
        .start(
            "name: failing\ntasks:\n- {id: a, type: fail, input: {times: 99}}\n\
             - {id: b, type: noop, depends_on: [a]}\n",
        )
        .await;
    let (frames, ()) = read_events(
        &format!("{}/api/executions/{id}/live", dev.monitor),
        async || (),
    )
    .await;
    assert_eq!(
        frames.last().map(|(event, _)| event.as_str()),
        Some("end"),
        "the live stream ends: {frames:?}"
    );
    let (status, list) = get(&format!("{}/api/executions", dev.monitor)).await;
    assert_eq!(status, 200, "{list}");
    let row = list["executions"]
        .as_array()
        .and_then(|rows| rows.iter().find(|row| row["id"] == id.as_str()))
        .unwrap_or_else(|| panic!("the execution is listed: {list}"));
    assert_eq!(row["state"], "failed", "{row}");
    assert_eq!(
        (&row["done"], &row["total"]),
        (&json!(1), &json!(2)),
        "{row}"
    );
    assert_eq!(row["percent"], json!(50.0), "{row}");
    assert!(row["eta_ms"].is_null(), "{row}");
}

/// The workers page names what each worker runs: the task id and the execution's name, not only
/// an instance id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_page_names_the_running_tasks() {
    let dev = start_dev();
    let id = dev
        .start("name: napping\ntasks:\n- {id: nap, type: sleep, input: {ms: 20000}}\n")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let running = loop {
        let (status, body) = get(&format!("{}/api/workers", dev.monitor)).await;
        assert_eq!(status, 200, "{body}");
        let found = body["workers"].as_array().and_then(|workers| {
            workers
                .iter()
                .flat_map(|w| w["running"].as_array().cloned().unwrap_or_default())
                .find(|r| r["execution_id"] == id.as_str())
        });
        if let Some(found) = found {
            break found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no worker reports the task within 30 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(running["task_id"], "nap", "{running}");
    assert_eq!(running["execution_name"], "napping", "{running}");
    assert_eq!(
        running["progress"], 0,
        "a sleep reports no progress: {running}"
    );
    assert!(
        running["started_ms"].as_i64().is_some_and(|t| t > 0),
        "{running}"
    );
}
