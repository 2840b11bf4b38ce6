//! Outputs stored by reference, end to end on `trellis dev`: a `shell` task writes a 5 MB output,
//! its worker stores it in the Object Store bucket `trellis_outputs`, the task's record carries the
//! reference with its size and SHA-256, the dependent task reads the value through
//! `$TRELLIS_UPSTREAM_DIR`, and `trellis output` fetches it back; once the object is damaged or
//! gone, `trellis output` and a task that depends on it say which object. A task a `route:` skipped
//! is listed by `trellis tree` with why.

use std::process::Command;
use std::time::Duration;

use trellis_proto::v1;

use crate::{Dev, TRELLIS, start_dev};

/// Bytes of the large output: a JSON string of 5,000,000 `a`s and its two quotes.
const SIZE: usize = 5_000_002;

/// `big` writes the large output; `reader` depends on it and prints the size and checksum of what
/// it was given.
const PLAN: &str = r#"name: large-output
tasks:
- id: big
  type: shell
  input: {command: [sh, -c, 'printf "\"" > "$TRELLIS_OUTPUT_FILE"; head -c 5000000 /dev/zero | tr "\0" a >> "$TRELLIS_OUTPUT_FILE"; printf "\"" >> "$TRELLIS_OUTPUT_FILE"']}
- id: reader
  type: shell
  depends_on: [big]
  input: {command: [sh, -c, 'wc -c < "$TRELLIS_UPSTREAM_DIR/big.json"; sha256sum < "$TRELLIS_UPSTREAM_DIR/big.json"']}
"#;

/// Waits until the execution is terminal and returns it.
async fn ended(dev: &Dev, id: &str) -> v1::Execution {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let execution = dev.execution(id).await;
        let terminal = [
            v1::ExecutionState::Completed,
            v1::ExecutionState::Failed,
            v1::ExecutionState::Cancelled,
        ]
        .iter()
        .any(|state| execution.state == *state as i32);
        if terminal {
            return execution;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "execution {id} did not end within 90 s: {execution:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The record of the last instance of plan task `task`.
async fn record(dev: &Dev, id: &str, task: &str) -> v1::TaskInstance {
    dev.client()
        .await
        .get_execution_graph(v1::GetExecutionGraphRequest {
            execution_id: id.to_owned(),
            run_number: 0,
        })
        .await
        .expect("the graph")
        .into_inner()
        .graph
        .expect("a graph")
        .nodes
        .into_iter()
        .filter_map(|node| node.record)
        .rfind(|record| record.task_id == task)
        .unwrap_or_else(|| panic!("no record of {task}"))
}

fn trellis(dev: &Dev, args: &[&str]) -> std::process::Output {
    Command::new(TRELLIS)
        .args(["--coordinator", &dev.coordinator])
        .args(args)
        .output()
        .expect("trellis runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mb_output_is_stored_by_reference_read_by_its_dependent_and_fetched() {
    let dev = start_dev();
    let id = dev.start(PLAN).await;
    let execution = ended(&dev, &id).await;
    assert_eq!(
        execution.state,
        v1::ExecutionState::Completed as i32,
        "{execution:?}"
    );
    let expected = {
        let mut bytes = vec![b'a'; SIZE];
        bytes[0] = b'"';
        bytes[SIZE - 1] = b'"';
        bytes
    };
    let checksum = trellis_bus::sha256_hex(&expected);

    // The record holds a reference with the size and checksum, not the 5 MB.
    let big = record(&dev, &id, "big").await;
    let output: serde_json::Value =
        serde_json::from_slice(big.output.as_deref().expect("big has an output")).expect("json");
    let reference = &output["$trellis_ref"];
    assert_eq!(reference["bucket"], "trellis_outputs", "{output}");
    assert_eq!(reference["size"], SIZE as u64, "{output}");
    assert_eq!(reference["sha256"], checksum.as_str(), "{output}");
    let object = reference["object"]
        .as_str()
        .expect("an object name")
        .to_owned();
    assert!(object.starts_with(&format!("{id}/")), "{object}");

    // The monitor's task drawer shows where the output is and how big, not the 5 MB.
    let drawer = |instance: &str| {
        let url = format!("{}/api/executions/{id}/instances/{instance}", dev.monitor);
        async move {
            let response = reqwest::get(&url).await.expect("the monitor answers");
            let status = response.status().as_u16();
            (
                status,
                response.json::<serde_json::Value>().await.expect("JSON"),
            )
        }
    };
    let (status, detail) = drawer(&big.task_instance_id).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["task_id"], "big", "{detail}");
    assert!(detail["output"].is_null(), "no 5 MB in the drawer");
    assert_eq!(detail["output_ref"]["size"], SIZE as u64, "{detail}");
    assert_eq!(
        detail["output_ref"]["object"],
        format!("trellis_outputs/{object}"),
        "{detail}"
    );
    assert!(
        detail["input"]["command"].is_array(),
        "the input it was given: {detail}"
    );
    let (status, body) = drawer("0190a5c4-7d1e-7000-8000-0000000000ff").await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = drawer("nope").await;
    assert_eq!(status, 400, "{body}");

    // The dependent was handed the value itself.
    let reader = record(&dev, &id, "reader").await;
    let reader_output: serde_json::Value =
        serde_json::from_slice(reader.output.as_deref().expect("reader has an output"))
            .expect("json");
    let stdout = reader_output["stdout"].as_str().expect("stdout");
    assert!(
        stdout.contains(&SIZE.to_string()) && stdout.contains(&checksum),
        "the dependent read {stdout:?}"
    );

    // `trellis output` fetches the bytes (to a file) and the reference.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("big.json");
    let fetched = trellis(
        &dev,
        &["output", &id, "big", "-o", file.to_str().expect("utf-8")],
    );
    assert!(
        fetched.status.success(),
        "{}",
        String::from_utf8_lossy(&fetched.stderr)
    );
    assert!(
        std::fs::read(&file).expect("the file") == expected,
        "the fetched bytes are the output"
    );
    let shown = trellis(&dev, &["output", "--reference", &id, "big"]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains(&checksum));
    let small = trellis(&dev, &["output", &id, "reader"]);
    assert!(
        String::from_utf8_lossy(&small.stdout).contains("\"exit_code\":0"),
        "an inline output is printed as is: {}",
        String::from_utf8_lossy(&small.stdout)
    );
    let unknown = trellis(&dev, &["output", &id, "nope"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&unknown.stderr)
            .contains("has no task \"nope\" (its tasks: big, reader)"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );

    // Damaged, then gone: each is an error that names the object.
    let js = async_nats::jetstream::new(
        async_nats::connect(dev.nats.url())
            .await
            .expect("the test's NATS"),
    );
    let store = js
        .get_object_store("trellis_outputs")
        .await
        .expect("the outputs bucket exists");
    store
        .put(object.as_str(), &mut &b"\"tampered\""[..])
        .await
        .expect("overwrite");
    let damaged = trellis(&dev, &["output", &id, "big"]);
    let said = String::from_utf8_lossy(&damaged.stderr);
    assert!(
        !damaged.status.success()
            && said.contains(&format!(
                "output object trellis_outputs/{object} is corrupt"
            )),
        "{said}"
    );
    store.delete(object.as_str()).await.expect("delete");
    let missing = trellis(&dev, &["output", &id, "big"]);
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(
        !missing.status.success()
            && said.contains(&format!(
                "output object trellis_outputs/{object} is missing"
            )),
        "{said}"
    );

    // A task whose dependency's output is gone fails and names it: in a second run `reader` also
    // waits for `wait` (3 s), and `big`'s object is deleted in between.
    let blocked = PLAN.replace("  depends_on: [big]\n", "  depends_on: [big, wait]\n")
        + "- id: wait\n  type: shell\n  input: {command: [sh, -c, 'sleep 3']}\n";
    let id = dev.start(&blocked).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let object = loop {
        let big = record(&dev, &id, "big").await;
        if let Some(output) = big.output.as_deref() {
            let output: serde_json::Value = serde_json::from_slice(output).expect("json");
            break output["$trellis_ref"]["object"]
                .as_str()
                .expect("an object")
                .to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "big did not complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    store.delete(object.as_str()).await.expect("delete");
    let execution = ended(&dev, &id).await;
    assert_eq!(execution.state, v1::ExecutionState::Failed as i32);
    let reader = record(&dev, &id, "reader").await;
    let error = reader.error.unwrap_or_default();
    assert!(
        error.contains(&format!(
            "the output of task \"big\": output object trellis_outputs/{object} is missing"
        )),
        "{error}"
    );
}

/// `classify` decides by its output (`{"kind": "bug"}`) which routed task runs.
const TRIAGE: &str = r#"name: triage
tasks:
- id: classify
  type: shell
  input: {command: [sh, -c, 'echo "{\"kind\": \"bug\"}" > "$TRELLIS_OUTPUT_FILE"']}
  route: {path: /kind, cases: {bug: [fix], feature: [build]}}
- {id: fix, type: noop}
- {id: build, type: noop}
"#;

/// A task a route skipped never gets an instance: `trellis tree` lists it after the tree with the
/// route's reason, and `--json` under `skipped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trellis_tree_lists_the_tasks_a_route_skipped_with_why() {
    let dev = start_dev();
    let id = dev.start(TRIAGE).await;
    let execution = ended(&dev, &id).await;
    assert_eq!(
        execution.state,
        v1::ExecutionState::Completed as i32,
        "{execution:?}"
    );
    let tree = |json: bool| {
        let mut args = vec!["--coordinator", dev.coordinator.as_str(), "tree"];
        if json {
            args.push("--json");
        }
        args.push(id.as_str());
        let output = Command::new(TRELLIS)
            .args(&args)
            .output()
            .expect("trellis tree runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let text = tree(false);
    assert!(text.contains("fix [completed]"), "{text}");
    assert!(!text.contains("build ["), "build never ran: {text}");
    assert!(
        text.ends_with(
            "not run (routed out):\n  build: not routed: route of \"classify\" chose by output \
             /kind = \"bug\"\n"
        ),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&tree(true)).expect("JSON");
    assert_eq!(json["skipped"][0]["task_id"], "build", "{json}");
    assert_eq!(json["skipped"].as_array().map(Vec::len), Some(1), "{json}");
}
