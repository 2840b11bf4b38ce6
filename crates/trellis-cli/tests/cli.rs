//! `trellis` end to end: the binary's output and exit codes on good and bad plans.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use std::sync::atomic::{AtomicUsize, Ordering};
use trellis_proto::v1::PauseMode;

const TRELLIS: &str = env!("CARGO_BIN_EXE_trellis");

fn example(name: &str) -> String {
    format!("{}/../../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Output {
    Command::new(TRELLIS)
        .args(args)
        .output()
        .expect("trellis runs")
}

fn run_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(TRELLIS)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trellis runs");
    let mut stdin = child.stdin.take().expect("piped stdin");
    // The CLI may stop reading early (input over the limit); a broken pipe is fine then.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().expect("trellis finishes")
}

/// Writes `content` to a fresh temporary file and returns its path.
fn temp_file(content: &[u8]) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("trellis-cli-test-{}-{n}.yaml", std::process::id()));
    std::fs::write(&path, content).expect("temp file written");
    path
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Validates `content` as a file; expects exit code 2 and returns the error lines of stderr
/// without the file prefix (the `  hint:` lines under them left out; see [`hints`]).
fn bad_plan(content: &[u8]) -> Vec<String> {
    bad_plan_lines(content)
        .into_iter()
        .filter(|line| !line.starts_with("  hint: "))
        .collect()
}

/// The hints `trellis plan validate` prints under the errors of `content`.
fn hints(content: &[u8]) -> Vec<String> {
    bad_plan_lines(content)
        .into_iter()
        .filter_map(|line| line.strip_prefix("  hint: ").map(str::to_owned))
        .collect()
}

fn bad_plan_lines(content: &[u8]) -> Vec<String> {
    let path = temp_file(content);
    let path_text = path.to_str().expect("utf-8 temp path").to_owned();
    let output = run(&["plan", "validate", &path_text]);
    let _ = std::fs::remove_file(&path);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(&output).is_empty());
    err.lines()
        .map(|line| {
            if line.starts_with("  hint: ") {
                return line.to_owned();
            }
            line.strip_prefix(&format!("{path_text}: "))
                .unwrap_or_else(|| panic!("every line names the file or is a hint: {line}"))
                .to_owned()
        })
        .collect()
}

#[test]
fn validate_warns_about_skip_that_fails_the_execution() {
    let path = temp_file(b"name: w\ntasks:\n- {id: lint, type: noop, on_failure: [skip]}\n");
    let path_text = path.to_str().expect("utf-8 temp path").to_owned();
    let output = run(&["plan", "validate", &path_text]);
    let _ = std::fs::remove_file(&path);
    let err = stderr(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "a warning is not an error: {err}"
    );
    assert!(stdout(&output).starts_with("ok: plan \"w\""));
    assert!(
        err.starts_with(&format!(
            "{path_text}: warning: task lint: `skip` marks it skipped"
        )),
        "{err}"
    );
    assert!(err.contains("continue_on_partial_failure: true"), "{err}");
}

#[test]
fn errors_come_with_hints() {
    let plan = b"name: p\ntasks:\n- {id: schema, type: noop}\n- {id: api, type: noop, depends_on: [shcema]}\n";
    assert_eq!(
        bad_plan(plan),
        ["tasks[1].depends_on[0]: unknown task \"shcema\""]
    );
    assert_eq!(hints(plan), ["did you mean \"schema\"?"]);
}

#[test]
fn graph_draws_mermaid_and_dot() {
    let output = run(&["plan", "graph", &example("feature-x.yaml")]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    assert!(out.contains("flowchart LR"), "{out}");
    assert!(out.contains("subgraph wave1[\"wave 1\"]"), "{out}");
    assert!(out.contains(" --> "), "{out}");
    let output = run(&[
        "plan",
        "graph",
        "--format",
        "dot",
        &example("feature-x.yaml"),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    assert!(out.starts_with("digraph "), "{out}");
    assert!(out.contains("rank=same"), "{out}");
    let output = run(&[
        "plan",
        "graph",
        "--format",
        "svg",
        &example("feature-x.yaml"),
    ]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "an unknown format is bad usage"
    );
}

#[test]
fn params_are_given_on_the_command_line() {
    let services = example("services.yaml");
    let output = run(&["plan", "validate", &services]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).starts_with("ok: plan \"services-staging\""),
        "the default"
    );
    let output = run(&[
        "plan",
        "analyze",
        "--param",
        "env=prod",
        "--param",
        "services=[\"api\",\"web\",\"worker\"]",
        &services,
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    assert!(out.starts_with("plan \"services-prod\""), "{out}");
    assert!(out.contains("deploy-worker"), "{out}");
    let output = run(&["plan", "validate", "--param", "replicas=many", &services]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("replicas"), "{}", stderr(&output));
    let output = run(&["plan", "validate", "--param", "noequals", &services]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("NAME=VALUE"),
        "{}",
        stderr(&output)
    );
}

/// A `trellis planner` child process on a free port, killed on drop.
struct PlannerChild {
    child: std::process::Child,
    url: String,
}

impl Drop for PlannerChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_planner() -> PlannerChild {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    // Owned by the guard at once, so it is killed and waited for on every path.
    let planner = PlannerChild {
        child: Command::new(TRELLIS)
            .args(["planner", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-addr", "off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("trellis planner starts"),
        url: format!("http://127.0.0.1:{port}"),
    };
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return planner;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("trellis planner did not listen on port {port}");
}

#[test]
fn plans_compile_through_a_planner_service() {
    let planner = start_planner();
    let output = run(&[
        "plan",
        "validate",
        "--planner",
        &planner.url,
        "--param",
        "env=prod",
        &example("services.yaml"),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stdout(&output).starts_with("ok: plan \"services-prod\""));

    let path = temp_file(b"name: p\ntasks:\n- {id: schema, type: noop}\n- {id: api, type: noop, depends_on: [shcema]}\n");
    let path_text = path.to_str().expect("utf-8 temp path").to_owned();
    let output = run(&["plan", "validate", "--planner", &planner.url, &path_text]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        stderr(&output),
        format!(
            "{path_text}: tasks[1].depends_on[0]: unknown task \"shcema\"\n  hint: did you mean \"schema\"?\n"
        )
    );
}

#[test]
fn an_unreachable_planner_is_named_with_the_fix() {
    let output = run(&[
        "plan",
        "validate",
        "--planner",
        &dead_coordinator(),
        &example("seed-001.yaml"),
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("trellis planner"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn analyze_shows_seed_001_waves() {
    let output = run(&["plan", "analyze", &example("seed-001.yaml")]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    for line in [
        "wave 1: T-001, T-002",
        "wave 2: T-003, T-004",
        "wave 3: T-005",
        "critical path: T-001 -> T-003 -> T-005 (3 tasks)",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
}

#[test]
fn analyze_json_is_one_object_with_ids() {
    let output = run(&["plan", "analyze", "--json", &example("feature-x.yaml")]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json output");
    assert_eq!(report["plan"], "feature-x");
    assert_eq!(report["waves"][0], serde_json::json!(["schema"]));
    assert_eq!(report["fallback_only"], serde_json::json!(["api-fallback"]));
    assert_eq!(report["conflicts"][0]["a"], "api");
    assert_eq!(report["conflicts"][0]["b"], "ui");
}

#[test]
fn every_example_is_valid() {
    let dir = format!("{}/../../examples", env!("CARGO_MANIFEST_DIR"));
    let mut n_examples = 0;
    for entry in std::fs::read_dir(dir).expect("examples dir") {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            n_examples += 1;
            let output = run(&["plan", "validate", path.to_str().expect("utf-8 path")]);
            assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
            assert!(
                stdout(&output).starts_with("ok: plan "),
                "{}",
                stdout(&output)
            );
        }
    }
    assert!(n_examples >= 3);
}

#[test]
fn validate_reads_stdin() {
    let output = run_stdin(
        &["plan", "validate", "-"],
        b"name: s\ntasks: [{id: a, type: noop}, {id: b, type: noop, depends_on: [a]}]\n",
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "ok: plan \"s\" — 2 tasks, 2 waves\n");
    let output = run_stdin(&["plan", "validate", "-"], b"name: s\ntasks: []\n");
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(stderr(&output), "<stdin>: tasks: plan has no tasks\n");
}

#[test]
fn invalid_yaml() {
    assert_eq!(
        bad_plan(b"name: p\ntasks:\n  - id: a\n    type: x: y\n"),
        ["tasks[0]: mapping values are not allowed in this context (line 4, column 12)"]
    );
}

#[test]
fn unknown_field() {
    let errors = bad_plan(b"name: p\ntasks:\n  - {id: a, type: noop, dependson: [b]}\n");
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0].starts_with("tasks[0].dependson: unknown field `dependson`, expected one of"),
        "{errors:?}"
    );
}

#[test]
fn cycle() {
    let errors = bad_plan(
        b"name: p\ntasks:\n  - {id: a, type: noop, depends_on: [c]}\n  - {id: b, type: noop, depends_on: [a]}\n  - {id: c, type: noop, depends_on: [b]}\n",
    );
    assert_eq!(
        errors,
        ["tasks[0].depends_on: dependency cycle: a -> c -> b -> a"]
    );
}

#[test]
fn unknown_dependency() {
    let errors = bad_plan(
        b"name: p\ntasks:\n  - {id: a, type: noop}\n  - {id: b, type: noop}\n  - {id: c, type: noop}\n  - {id: d, type: noop, depends_on: [api]}\n",
    );
    assert_eq!(errors, [r#"tasks[3].depends_on[0]: unknown task "api""#]);
}

#[test]
fn duplicate_id() {
    let errors = bad_plan(
        b"name: p\ntasks:\n  - {id: a, type: noop}\n  - {id: api, type: noop}\n  - {id: b, type: noop}\n  - {id: c, type: noop}\n  - {id: api, type: noop}\n",
    );
    assert_eq!(
        errors,
        [r#"tasks[4].id: duplicate task id "api" (first declared at tasks[1])"#]
    );
}

#[test]
fn empty_file() {
    assert_eq!(bad_plan(b""), ["plan is empty"]);
}

#[test]
fn ten_megabytes_of_garbage() {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let garbage: Vec<u8> = (0..10 * 1024 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect();
    let errors = bad_plan(&garbage);
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("not valid UTF-8"), "{errors:?}");
    // The same garbage squeezed into printable ASCII gets past the UTF-8 check to the parser.
    let ascii: Vec<u8> = garbage.iter().map(|b| b % 95 + 32).collect();
    let errors = bad_plan(&ascii);
    assert_eq!(errors.len(), 1, "{errors:?}");
}

#[test]
fn oversized_input_is_refused() {
    let output = run_stdin(
        &["plan", "validate", "-"],
        &vec![b'#'; 64 * 1024 * 1024 + 10],
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("over the limit of 67108864 bytes"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn unreadable_file_and_bad_usage() {
    let output = run(&["plan", "validate", "/nonexistent/plan.yaml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).starts_with("/nonexistent/plan.yaml: cannot open: no such file"),
        "{}",
        stderr(&output)
    );
    let output = run(&["plan", "validate", "/"]);
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(output.status.code(), run(&["plan"]).status.code());
    assert_eq!(run(&["plan", "frobnicate"]).status.code(), Some(2));
    assert_eq!(run(&[]).status.code(), Some(2));
}

#[test]
fn help_teaches_with_examples() {
    let output = run(&["--help"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(stdout(&output).contains("trellis plan analyze examples/seed-001.yaml"));
    let output = run(&["plan", "analyze", "--help"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(stdout(&output).contains("--json"));
}

/// Returns a loopback address where nothing listens: a port the OS just handed out and took back.
fn dead_coordinator() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = listener.local_addr().expect("local addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[test]
fn submit_of_an_invalid_plan_exits_2_without_contacting_the_coordinator() {
    // A listener that would see any connection attempt.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.set_nonblocking(true).expect("nonblocking");
    let url = format!("http://{}", listener.local_addr().expect("local addr"));
    let path = temp_file(b"name: p\ntasks:\n  - {id: a, type: noop, depends_on: [missing]}\n");
    let path_text = path.to_str().expect("utf-8 temp path").to_owned();
    let output = run(&["--coordinator", &url, "submit", "--wait", &path_text]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!("{path_text}: tasks[0].depends_on[0]: unknown task \"missing\"\n")
    );
    assert!(stdout(&output).is_empty());
    assert_eq!(
        listener.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "submit connected to the coordinator"
    );
}

#[test]
fn no_coordinator_exits_1_naming_trellis_dev() {
    let url = dead_coordinator();
    for args in [
        vec!["status", "0190a5c4-7d1e-7000-8000-000000000001"],
        vec!["list"],
        vec!["workers"],
        vec!["cluster"],
        vec!["submit", "--wait"],
    ] {
        let mut args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        if args[0] == "submit" {
            args.push(example("feature-x.yaml"));
        }
        let mut full = vec!["--coordinator".to_owned(), url.clone()];
        full.extend(args);
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        let output = run(&full);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{full:?}: {err}");
        assert!(
            err.starts_with(&format!(
                "trellis: no coordinator at {url}: start one with `trellis dev`"
            )),
            "{full:?}: {err}"
        );
    }
    // The environment variable names the coordinator too.
    let output = Command::new(TRELLIS)
        .args(["status", "x"])
        .env("TRELLIS_COORDINATOR", &url)
        .output()
        .expect("trellis runs");
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains(&url), "{}", stderr(&output));
}

#[test]
fn bad_coordinator_address_or_label_is_bad_input() {
    let output = run(&["--coordinator", "not a url", "status", "x"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let output = run(&["submit", "--label", "novalue", &example("feature-x.yaml")]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("KEY=VALUE"), "{}", stderr(&output));
}

#[test]
fn help_of_every_command_shows_an_example() {
    for command in [
        "submit", "status", "list", "tree", "events", "logs", "pause", "resume", "cancel",
        "answer", "workers", "cluster", "plan", "planner",
    ] {
        let output = run(&[command, "--help"]);
        assert_eq!(output.status.code(), Some(0), "{command}");
        let out = stdout(&output);
        assert!(out.contains("Example"), "{command} --help:\n{out}");
        assert!(
            out.contains(&format!("trellis {command} ")),
            "{command} --help has no example of itself:\n{out}"
        );
    }
    let out = stdout(&run(&["--help"]));
    assert!(out.contains("TRELLIS_COORDINATOR"), "{out}");
    assert!(out.contains("trellis submit --wait"), "{out}");
}

/// A coordinator that serves one canned execution, enough to drive the remote commands end to end.
mod fake {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use tonic::codegen::tokio_stream;
    use tonic::transport::Server;
    use tonic::transport::server::TcpIncoming;
    use tonic::{Request, Response, Status};
    use trellis_proto::v1::coordinator_server::{Coordinator, CoordinatorServer};
    use trellis_proto::v1::event::Kind;
    use trellis_proto::v1::graph_node::Next;
    use trellis_proto::v1::start_execution_request::PlanSource;
    use trellis_proto::v1::*;

    pub const EXECUTION_ID: &str = "0190a5c4-7d1e-7000-8000-000000000001";
    /// The group `build` spawns.
    pub const GROUP_ID: &str = "0190a5c4-7d1e-7000-8000-0000000000a0";

    #[derive(Debug, Default)]
    pub struct Fake {
        /// The last `StartExecution` request.
        pub started: Mutex<Option<StartExecutionRequest>>,
        /// How many times `GetExecution` was called.
        pub n_get_execution: AtomicUsize,
        /// How many times `RunExecution` was called.
        pub n_run_execution: AtomicUsize,
        /// Whether the first event stream was already broken on purpose.
        broke_once: AtomicBool,
        /// The last `PauseExecution` and `PauseFleet` requests.
        pub paused: Mutex<Option<PauseExecutionRequest>>,
        pub fleet_paused: Mutex<Option<PauseFleetRequest>>,
    }

    /// Sequences are `1..`, timestamps `START_MS + sequence * 100`.
    const START_MS: i64 = 1_793_628_187_000;

    impl Fake {
        /// Whether the started plan's spec contains `word`: `doomed` makes the execution fail,
        /// `mute` makes the coordinator send no progress snapshots and close the stream before the
        /// last event.
        fn spec_says(&self, word: &str) -> bool {
            let started = self.started.lock().expect("lock");
            matches!(
                started.as_ref().and_then(|r| r.plan_source.as_ref()),
                Some(PlanSource::Spec(spec)) if spec.text.contains(word)
            )
        }

        /// The log: `build` spawns two `noop` subtasks (the second fails once and is retried),
        /// then resumes as a new instance that completes (or fails, when doomed).
        fn events(&self) -> Vec<Event> {
            let instance = |id: &str| id.to_owned();
            let doomed = self.spec_says("doomed");
            let started = self
                .started
                .lock()
                .expect("lock")
                .clone()
                .unwrap_or_default();
            let spec = match started.plan_source {
                Some(PlanSource::Spec(spec)) => spec,
                _ => PlanSpec::default(),
            };
            let dispatched = |id: &str, attempt| {
                Kind::TaskDispatched(TaskDispatched {
                    task_instance_id: instance(id),
                    attempt,
                })
            };
            let completed = |id: &str, attempt| {
                Kind::TaskCompleted(TaskCompleted {
                    task_instance_id: instance(id),
                    attempt,
                    ..TaskCompleted::default()
                })
            };
            let failed = |id: &str, error: &str, retryable| {
                Kind::TaskFailed(TaskFailed {
                    task_instance_id: instance(id),
                    attempt: 1,
                    error: error.to_owned(),
                    retryable,
                    usage: None,
                })
            };
            let kinds = vec![
                Kind::ExecutionStarted(ExecutionStarted {
                    plan_name: if doomed { "doomed" } else { "seed-001" }.to_owned(),
                    run_number: 1,
                    spec: spec.text,
                    format: spec.format,
                    options: started.options,
                    started_at_unix_ms: START_MS + 100,
                    ..ExecutionStarted::default()
                }),
                dispatched("i-build", 1),
                Kind::TaskStarted(TaskStarted {
                    task_instance_id: instance("i-build"),
                    attempt: 1,
                    worker_id: "w-1".to_owned(),
                }),
                Kind::SubtasksSpawned(SubtasksSpawned {
                    task_instance_id: instance("i-build"),
                    attempt: 1,
                    group: Some(SubtaskGroup {
                        group_id: GROUP_ID.to_owned(),
                        rule: Some(CompletionRule {
                            kind: CompletionRuleKind::AllSettled as i32,
                            quorum: 0,
                        }),
                        members: vec![
                            SubtaskSpec {
                                task_type: "noop".to_owned(),
                                ..SubtaskSpec::default()
                            };
                            2
                        ],
                    }),
                }),
                dispatched("m1", 1),
                dispatched("m2", 1),
                completed("m1", 1),
                failed("m2", "flaky", true),
                dispatched("m2", 2),
                completed("m2", 2),
                // The parent resumes as a new instance.
                dispatched("i-build-2", 1),
                if doomed {
                    failed("i-build-2", "boom", false)
                } else {
                    completed("i-build-2", 1)
                },
                Kind::ExecutionFinished(ExecutionFinished {
                    outcome: if doomed {
                        ExecutionOutcome::Failed
                    } else {
                        ExecutionOutcome::Completed
                    } as i32,
                }),
            ];
            kinds
                .into_iter()
                .zip(1..)
                .map(|(kind, sequence)| Event {
                    execution_id: EXECUTION_ID.to_owned(),
                    sequence,
                    timestamp_unix_ms: START_MS + i64::try_from(sequence).expect("small") * 100,
                    kind: Some(kind),
                })
                .collect()
        }

        /// The coordinator's snapshot after `sequence`: running until the last event, then the
        /// final counts and, when it failed, the reason (which no event carries).
        fn progress(&self, sequence: u64) -> Progress {
            let n_events = u64::try_from(self.events().len()).expect("small");
            let doomed = self.spec_says("doomed");
            let (state, counts, reason) = if sequence < n_events {
                let counts = TaskStateCounts {
                    completed: sequence / 4,
                    running: 1,
                    pending: 3 - sequence / 4,
                    ..TaskStateCounts::default()
                };
                (ExecutionState::Running, counts, None)
            } else if doomed {
                let counts = TaskStateCounts {
                    completed: 3,
                    failed: 1,
                    ..TaskStateCounts::default()
                };
                let reason = Some("task build failed: boom".to_owned());
                (ExecutionState::Failed, counts, reason)
            } else {
                let counts = TaskStateCounts {
                    completed: 4,
                    ..TaskStateCounts::default()
                };
                (ExecutionState::Completed, counts, None)
            };
            let done = counts.completed + counts.failed;
            Progress {
                execution_id: EXECUTION_ID.to_owned(),
                run_number: 1,
                state: state as i32,
                counts: Some(counts),
                total: 4,
                done,
                percent: done as f64 * 25.0,
                eta_ms: None,
                wave: 1,
                waves: 1,
                reason,
                sequence,
                sent_at_unix_ms: START_MS + i64::try_from(sequence).expect("small") * 100,
            }
        }

        fn check_id(id: &str) -> Result<(), Status> {
            if id == EXECUTION_ID {
                Ok(())
            } else {
                Err(Status::not_found(format!("no execution {id}")))
            }
        }
    }

    #[tonic::async_trait]
    impl Coordinator for Fake {
        async fn start_execution(
            &self,
            request: Request<StartExecutionRequest>,
        ) -> Result<Response<StartExecutionResponse>, Status> {
            *self.started.lock().expect("lock") = Some(request.into_inner());
            Ok(Response::new(StartExecutionResponse {
                execution_id: EXECUTION_ID.to_owned(),
                created: true,
            }))
        }

        async fn pause_execution(
            &self,
            request: Request<PauseExecutionRequest>,
        ) -> Result<Response<PauseExecutionResponse>, Status> {
            let request = request.into_inner();
            if request.task_id.is_empty() && request.group_id.is_empty() {
                return Err(Status::failed_precondition("execution is completed"));
            }
            *self.paused.lock().expect("lock") = Some(request);
            Ok(Response::new(PauseExecutionResponse {
                state: ExecutionState::Running as i32,
            }))
        }

        async fn pause_fleet(
            &self,
            request: Request<PauseFleetRequest>,
        ) -> Result<Response<PauseFleetResponse>, Status> {
            *self.fleet_paused.lock().expect("lock") = Some(request.into_inner());
            Ok(Response::new(PauseFleetResponse { pause: None }))
        }

        async fn resume_fleet(
            &self,
            request: Request<ResumeFleetRequest>,
        ) -> Result<Response<ResumeFleetResponse>, Status> {
            let gpu = PauseTarget {
                target: Some(pause_target::Target::Queue("gpu".to_owned())),
            };
            Ok(Response::new(ResumeFleetResponse {
                resumed: request.into_inner().target == Some(gpu),
            }))
        }

        async fn list_pauses(
            &self,
            _: Request<ListPausesRequest>,
        ) -> Result<Response<ListPausesResponse>, Status> {
            Ok(Response::new(ListPausesResponse {
                pauses: vec![FleetPause {
                    target: Some(PauseTarget {
                        target: Some(pause_target::Target::Queue("gpu".to_owned())),
                    }),
                    mode: PauseMode::Preempt as i32,
                    reason: "driver upgrade".to_owned(),
                    since_unix_ms: START_MS,
                    by: "ops".to_owned(),
                }],
            }))
        }

        async fn drain_worker(
            &self,
            request: Request<DrainWorkerRequest>,
        ) -> Result<Response<DrainWorkerResponse>, Status> {
            if request.get_ref().worker_id == "w-1" {
                Ok(Response::new(DrainWorkerResponse {}))
            } else {
                Err(Status::not_found("no live worker"))
            }
        }

        async fn resume_execution(
            &self,
            request: Request<ResumeExecutionRequest>,
        ) -> Result<Response<ResumeExecutionResponse>, Status> {
            Self::check_id(&request.get_ref().execution_id)?;
            Ok(Response::new(ResumeExecutionResponse {
                state: ExecutionState::Running as i32,
            }))
        }

        /// Cancels only with a reason, so that tests see the reason arrive.
        async fn cancel_execution(
            &self,
            request: Request<CancelExecutionRequest>,
        ) -> Result<Response<CancelExecutionResponse>, Status> {
            let request = request.into_inner();
            Self::check_id(&request.execution_id)?;
            if request.reason.is_empty() {
                return Err(Status::invalid_argument("a reason is required"));
            }
            Ok(Response::new(CancelExecutionResponse {
                state: ExecutionState::Cancelled as i32,
            }))
        }

        async fn retry_execution(
            &self,
            request: Request<RetryExecutionRequest>,
        ) -> Result<Response<RetryExecutionResponse>, Status> {
            Self::check_id(&request.get_ref().execution_id)?;
            Ok(Response::new(RetryExecutionResponse { run_number: 2 }))
        }

        async fn checkpoint_execution(
            &self,
            request: Request<CheckpointExecutionRequest>,
        ) -> Result<Response<CheckpointExecutionResponse>, Status> {
            Self::check_id(&request.get_ref().execution_id)?;
            Ok(Response::new(CheckpointExecutionResponse {
                checkpoint: Some(CheckpointMetadata {
                    checkpoint_id: "0190a5c4-7d1e-7000-8000-0000000000c1".to_owned(),
                    execution_id: EXECUTION_ID.to_owned(),
                    event_sequence: 13,
                    kind: CheckpointKind::Full as i32,
                    checksum_sha256: vec![0xab, 0x01],
                    size_bytes: 1234,
                    ..CheckpointMetadata::default()
                }),
            }))
        }

        async fn get_execution(
            &self,
            request: Request<GetExecutionRequest>,
        ) -> Result<Response<GetExecutionResponse>, Status> {
            Self::check_id(&request.get_ref().execution_id)?;
            self.n_get_execution.fetch_add(1, Ordering::SeqCst);
            let last_sequence = u64::try_from(self.events().len()).expect("small");
            let progress = self.progress(last_sequence);
            Ok(Response::new(GetExecutionResponse {
                execution: Some(Execution {
                    execution_id: EXECUTION_ID.to_owned(),
                    name: "seed-001".to_owned(),
                    state: progress.state,
                    run_number: 1,
                    counts: progress.counts,
                    reason: progress.reason.clone().unwrap_or_default(),
                    last_sequence,
                    progress: Some(progress),
                    ..Execution::default()
                }),
            }))
        }

        async fn list_executions(
            &self,
            _: Request<ListExecutionsRequest>,
        ) -> Result<Response<ListExecutionsResponse>, Status> {
            Err(Status::unimplemented("list"))
        }

        type ObserveExecutionStream =
            tokio_stream::Iter<std::vec::IntoIter<Result<ObserveExecutionResponse, Status>>>;

        type GetTaskLogsStream =
            tokio_stream::Iter<std::vec::IntoIter<Result<GetTaskLogsResponse, Status>>>;

        type GetTaskOutputStream =
            tokio_stream::Iter<std::vec::IntoIter<Result<GetTaskOutputResponse, Status>>>;

        async fn get_task_output(
            &self,
            _request: Request<GetTaskOutputRequest>,
        ) -> Result<Response<Self::GetTaskOutputStream>, Status> {
            Err(Status::unimplemented("get_task_output"))
        }

        /// Two batches of `build` (instance b1: one line, then a cut line after two dropped),
        /// one of a `noop` member (b2); filtered by instance and attempt as the coordinator does.
        async fn get_task_logs(
            &self,
            request: Request<GetTaskLogsRequest>,
        ) -> Result<Response<Self::GetTaskLogsStream>, Status> {
            let request = request.into_inner();
            Self::check_id(&request.execution_id)?;
            let line = |at: i64, source: LogSource, text: &str, cut: Option<u64>| LogLine {
                at_unix_ms: START_MS + at,
                source: source as i32,
                text: text.to_owned(),
                cut_from_bytes: cut,
            };
            let batch = |n: u32, attempt: u32, lines: Vec<LogLine>, dropped_before: u64| {
                GetTaskLogsResponse {
                    batch: Some(TaskLogBatch {
                        execution_id: EXECUTION_ID.to_owned(),
                        task_instance_id: format!("0190a5c4-7d1e-7000-8000-0000000000b{n}"),
                        attempt,
                        worker_id: "w-1".to_owned(),
                        lines,
                        dropped_before,
                        batch: 1,
                    }),
                }
            };
            let batches = vec![
                batch(1, 1, vec![line(1, LogSource::Stdout, "compiling", None)], 0),
                batch(
                    2,
                    1,
                    vec![line(2, LogSource::Handler, "member says hi", None)],
                    0,
                ),
                batch(
                    1,
                    2,
                    vec![line(3, LogSource::Stderr, "xxx", Some(20_000))],
                    2,
                ),
            ];
            let items: Vec<_> = batches
                .into_iter()
                .filter(|item| {
                    let batch = item.batch.as_ref().expect("set above");
                    (request.task_instance_id.is_empty()
                        || batch.task_instance_id == request.task_instance_id)
                        && (request.attempt == 0 || batch.attempt == request.attempt)
                })
                .map(Ok)
                .collect();
            Ok(Response::new(tokio_stream::iter(items)))
        }

        async fn observe_execution(
            &self,
            request: Request<ObserveExecutionRequest>,
        ) -> Result<Response<Self::ObserveExecutionStream>, Status> {
            let request = request.into_inner();
            Self::check_id(&request.execution_id)?;
            let from = request.from_sequence.max(1);
            let events = self.events();
            let last_sequence = u64::try_from(events.len()).expect("small");
            let mute = self.spec_says("mute");
            let mut items: Vec<Result<ObserveExecutionResponse, Status>> = events
                .into_iter()
                .filter(|event| event.sequence >= from)
                .map(|event| {
                    // A snapshot every fourth event, and always with the last one.
                    let sequence = event.sequence;
                    let progress = (!mute && (sequence % 4 == 0 || sequence == last_sequence))
                        .then(|| self.progress(sequence));
                    Ok(ObserveExecutionResponse {
                        event: Some(event),
                        progress,
                    })
                })
                .collect();
            if mute {
                // The stream closes before the last event.
                items.pop();
            }
            // The first stream breaks after three events, as when a coordinator restarts.
            if !self.broke_once.swap(true, Ordering::SeqCst) {
                items.truncate(3);
                items.push(Err(Status::unavailable("coordinator restarting")));
            }
            Ok(Response::new(tokio_stream::iter(items)))
        }

        type RunExecutionStream =
            tokio_stream::Iter<std::vec::IntoIter<Result<RunExecutionResponse, Status>>>;

        /// `start_execution`, then `observe_execution`'s items from the first event (which
        /// break once, as there).
        async fn run_execution(
            &self,
            request: Request<RunExecutionRequest>,
        ) -> Result<Response<Self::RunExecutionStream>, Status> {
            use tokio_stream::StreamExt as _;
            self.n_run_execution.fetch_add(1, Ordering::SeqCst);
            let request = request.into_inner();
            let start = request
                .start
                .ok_or_else(|| Status::invalid_argument("start: missing"))?;
            let started = self
                .start_execution(Request::new(start))
                .await?
                .into_inner();
            let observe = ObserveExecutionRequest {
                execution_id: started.execution_id.clone(),
                from_sequence: 1,
                progress_only: request.progress_only,
            };
            let observed = self.observe_execution(Request::new(observe)).await?;
            let mut items = vec![Ok(RunExecutionResponse {
                started: Some(started),
                observed: None,
            })];
            items.extend(
                observed
                    .into_inner()
                    .map(|item| {
                        item.map(|observed| RunExecutionResponse {
                            started: None,
                            observed: Some(observed),
                        })
                    })
                    .collect::<Vec<_>>()
                    .await,
            );
            Ok(Response::new(tokio_stream::iter(items)))
        }

        async fn get_execution_graph(
            &self,
            request: Request<GetExecutionGraphRequest>,
        ) -> Result<Response<GetExecutionGraphResponse>, Status> {
            Self::check_id(&request.get_ref().execution_id)?;
            // The graph the coordinator's builder makes of `build`, its group of two and its
            // resumed instance: ids are UUIDs and members point at their parent and group.
            let node = |n: u32, task_id: &str, next: Option<Next>| GraphNode {
                record: Some(TaskInstance {
                    task_instance_id: format!("0190a5c4-7d1e-7000-8000-0000000000b{n}"),
                    task_id: task_id.to_owned(),
                    correlation_id: EXECUTION_ID.to_owned(),
                    state: TaskState::Completed as i32,
                    attempt: 1,
                    created_at_unix_ms: START_MS + i64::from(n),
                    ..TaskInstance::default()
                }),
                next,
            };
            let member = |n: u32| {
                let mut member = node(n, "noop", None);
                if let Some(record) = member.record.as_mut() {
                    record.parent_task_instance_id =
                        Some("0190a5c4-7d1e-7000-8000-0000000000b1".to_owned());
                    record.subtask_group_id = Some(GROUP_ID.to_owned());
                }
                member
            };
            let mut resumed = node(4, "build", None);
            if let Some(record) = resumed.record.as_mut() {
                record.resumed_after_subtasks_group_id = Some(GROUP_ID.to_owned());
            }
            Ok(Response::new(GetExecutionGraphResponse {
                graph: Some(ExecutionGraph {
                    nodes: vec![
                        node(1, "build", Some(Next::GroupIndex(0))),
                        member(2),
                        member(3),
                        resumed,
                    ],
                    groups: vec![GraphGroup {
                        group_id: GROUP_ID.to_owned(),
                        node_indices: vec![1, 2],
                        next_node_index: Some(3),
                    }],
                    root_indices: vec![0],
                }),
            }))
        }

        async fn answer_question(
            &self,
            request: Request<AnswerQuestionRequest>,
        ) -> Result<Response<AnswerQuestionResponse>, Status> {
            let request = request.into_inner();
            if request.question_id == "nope" {
                return Err(Status::not_found("no question nope"));
            }
            if request.answer != "yes" {
                return Err(Status::invalid_argument("answer must be one of: yes, no"));
            }
            Ok(Response::new(AnswerQuestionResponse {
                sequence: 12,
                task_instance_id: format!("continued-by-{}", request.answered_by),
            }))
        }

        async fn list_workers(
            &self,
            _: Request<ListWorkersRequest>,
        ) -> Result<Response<ListWorkersResponse>, Status> {
            Ok(Response::new(ListWorkersResponse::default()))
        }

        async fn get_cluster(
            &self,
            _: Request<GetClusterRequest>,
        ) -> Result<Response<GetClusterResponse>, Status> {
            let member = |id: &str, port: u16, shards: Vec<u32>| CoordinatorInfo {
                coordinator_id: id.to_owned(),
                address: format!("http://10.0.0.1:{port}"),
                shards,
                executions_in_memory: 3,
                lag: 0,
                reported_at_unix_ms: START_MS,
                started_at_unix_ms: START_MS,
            };
            Ok(Response::new(GetClusterResponse {
                shards: 4,
                coordinators: vec![
                    member("c-0", 7400, vec![0, 1]),
                    member("c-1", 7401, vec![3]),
                ],
                unowned_shards: vec![2],
                answered_by: "c-0".to_owned(),
            }))
        }
    }

    /// Serves a fresh fake on a loopback port from a background thread; returns its URL.
    pub fn start() -> (String, Arc<Fake>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let fake = Arc::new(Fake::default());
        let served = Arc::clone(&fake);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                Server::builder()
                    .add_service(CoordinatorServer::from_arc(served))
                    .serve_with_incoming(TcpIncoming::from(listener))
                    .await
                    .expect("fake coordinator serves");
            });
        });
        (url, fake)
    }
}

#[test]
fn submit_wait_json_follows_every_event_across_a_broken_stream() {
    let (url, fake) = fake::start();
    let output = run(&[
        "--coordinator",
        &url,
        "submit",
        "--wait",
        "--json",
        "--label",
        "team=infra",
        &example("seed-001.yaml"),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines: Vec<serde_json::Value> = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    let (summary, events) = lines.split_last().expect("lines");
    let sequences: Vec<u64> = events
        .iter()
        .map(|e| e["sequence"].as_u64().expect("sequence"))
        .collect();
    assert_eq!(
        sequences,
        (1..=13).collect::<Vec<u64>>(),
        "no gap, no repeat"
    );
    assert_eq!(events[0]["kind"], "execution_started");
    assert_eq!(events[0]["plan"], "seed-001");
    assert_eq!(events[0]["labels"]["team"], "infra");
    assert_eq!(events[3]["kind"], "subtasks_spawned");
    assert_eq!(events[3]["instance"], "i-build");
    assert_eq!(events[3]["group"], fake::GROUP_ID);
    assert_eq!(events[3]["rule"], "all_settled");
    assert_eq!(events[3]["members"].as_array().map(Vec::len), Some(2));
    assert_eq!(events[7]["kind"], "task_failed");
    assert_eq!(events[7]["retryable"], true);
    assert_eq!(events[8]["kind"], "task_dispatched");
    assert_eq!(events[8]["instance"], "m2");
    assert_eq!(events[8]["attempt"], 2);
    assert_eq!(events[12]["kind"], "execution_finished");
    assert_eq!(events[12]["outcome"], "completed");
    assert_eq!(summary["execution_id"], fake::EXECUTION_ID);
    assert_eq!(summary["state"], "completed");
    assert_eq!(summary["counts"]["completed"], 4);
    assert_eq!(summary["seconds"], 1.2);
    assert_eq!(summary["last_sequence"], 13);
    assert_eq!(
        fake.n_get_execution.load(Ordering::SeqCst),
        0,
        "the snapshot of the last event says how it ended"
    );
    assert_eq!(
        fake.n_run_execution.load(Ordering::SeqCst),
        1,
        "one call starts and follows; the broken stream is followed on with ObserveExecution"
    );

    let started = fake.started.lock().expect("lock").clone().expect("started");
    assert_eq!(started.options.expect("options").labels["team"], "infra");
    match started.plan_source {
        Some(trellis_proto::v1::start_execution_request::PlanSource::Spec(spec)) => {
            assert!(spec.text.contains("T-001"), "{}", spec.text);
            assert_eq!(spec.format, trellis_proto::v1::PlanFormat::Yaml as i32);
        }
        other => panic!("expected a spec, got {other:?}"),
    }
}

#[test]
fn submit_wait_of_a_failing_execution_exits_1_with_the_reason() {
    let (url, fake) = fake::start();
    let path = temp_file(b"name: doomed\ntasks: [{id: build, type: noop}]\n");
    let path_text = path.to_str().expect("utf-8 temp path").to_owned();
    let output = run(&["--coordinator", &url, "submit", "--wait", &path_text]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    // stdout is a pipe here, so no bar: the id, then the outcome.
    assert_eq!(
        stdout(&output),
        format!(
            "{}\nfailed in 1.2s: task build failed: boom (3 completed · 0 running · 1 failed · 0 pending · 100%)\n",
            fake::EXECUTION_ID
        )
    );
    assert_eq!(fake.n_get_execution.load(Ordering::SeqCst), 0);
}

#[test]
fn submit_wait_asks_for_the_summary_when_the_stream_ends_early() {
    let (url, fake) = fake::start();
    let path = temp_file(b"name: mute\ntasks: [{id: build, type: noop}]\n");
    let path_text = path.to_str().expect("utf-8 temp path").to_owned();
    let output = run(&["--coordinator", &url, "submit", "--wait", &path_text]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // Events 1 to 12 took 1.1s; the counts come from `GetExecution`.
    assert_eq!(
        stdout(&output),
        format!(
            "{}\ncompleted in 1.1s: 4 completed · 0 running · 0 pending · 100%\n",
            fake::EXECUTION_ID
        )
    );
    assert_eq!(fake.n_get_execution.load(Ordering::SeqCst), 1);
}

#[test]
fn logs_name_each_line_by_task_and_attempt() {
    let (url, _fake) = fake::start();
    let id = fake::EXECUTION_ID;
    let output = run(&["--coordinator", &url, "logs", id]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[0].ends_with(" build#1 stdout| compiling"), "{out}");
    assert!(
        lines[1].ends_with(" noop#1    log| member says hi"),
        "{out}"
    );
    assert!(
        lines[2].contains(" build#2 ------| 2 lines dropped here"),
        "{out}"
    );
    assert!(
        lines[3].ends_with(" build#2 stderr| xxx … [cut from 20000 bytes]"),
        "{out}"
    );

    // One plan task, one attempt, as JSON.
    let output = run(&[
        "--coordinator",
        &url,
        "logs",
        "--attempt",
        "1",
        "--json",
        id,
        "build",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    let objects: Vec<serde_json::Value> = out
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(objects.len(), 1, "{out}");
    assert_eq!(objects[0]["task_id"], "build");
    assert_eq!(objects[0]["text"], "compiling");
    assert_eq!(objects[0]["source"], "stdout");

    // A task the execution does not have is bad input that names the ones it has.
    let output = run(&["--coordinator", &url, "logs", id, "deploy"]);
    assert_eq!(output.status.code(), Some(2));
    let err = stderr(&output);
    assert!(
        err.contains("has no task \"deploy\" (its tasks: build, noop)"),
        "{err}"
    );
}

#[test]
fn tree_events_status_and_answer_against_a_coordinator() {
    let (url, _fake) = fake::start();
    let id = fake::EXECUTION_ID;
    let output = run(&["--coordinator", &url, "tree", id]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        format!(
            "build [completed] attempt 1\n\
             ├─ group {} (2 subtasks, all_settled)\n\
             │  ├─ noop [completed] attempt 1\n\
             │  └─ noop [completed] attempt 1\n\
             └─ resumed: build [completed] attempt 1\n",
            fake::GROUP_ID
        )
    );

    let output = run(&["--coordinator", &url, "events", "--from", "8", id]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    for (line, (sequence, kind, meaning)) in lines.iter().zip([
        (8, "task_failed", "instance m2 attempt 1: flaky (retryable)"),
        (
            9,
            "task_dispatched",
            "instance m2 attempt 2 sent to a worker (retry)",
        ),
        (10, "task_completed", "instance m2 attempt 2 completed"),
        (
            11,
            "task_dispatched",
            "instance i-build-2 attempt 1 sent to a worker",
        ),
        (
            12,
            "task_completed",
            "instance i-build-2 attempt 1 completed",
        ),
        (13, "execution_finished", "execution completed"),
    ]) {
        assert!(line.starts_with(&format!("#{sequence} ")), "{line}");
        assert!(line.ends_with(&format!("{kind:<19}  {meaning}")), "{line}");
    }

    let output = run(&["--coordinator", &url, "status", "nope"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(stderr(&output), "trellis: execution nope not found\n");

    let output = run(&["--coordinator", &url, "pause", id]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("execution is completed"),
        "{}",
        stderr(&output)
    );

    let output = run(&[
        "--coordinator",
        &url,
        "answer",
        "--by",
        "alice",
        id,
        "q-1",
        "yes",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("continued-by-alice"),
        "{}",
        stdout(&output)
    );
    let output = run(&["--coordinator", &url, "answer", id, "q-1", "maybe"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("one of: yes, no"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn control_commands_say_what_happened_and_exit_accordingly() {
    let (url, _fake) = fake::start();
    let id = fake::EXECUTION_ID;
    // (arguments, exit code, stdout, stderr)
    let cases: [(&[&str], i32, String, String); 8] = [
        (
            &["resume", id],
            0,
            format!("execution {id} is running\n"),
            String::new(),
        ),
        (
            &["cancel", "--reason", "wrong branch", id],
            0,
            format!("execution {id} is cancelled\n"),
            String::new(),
        ),
        (
            &["cancel", id],
            2,
            String::new(),
            format!("trellis: execution {id}: a reason is required\n"),
        ),
        (
            &["retry", id],
            0,
            format!("execution {id} is running again as run 2: only what did not complete runs\n"),
            String::new(),
        ),
        (
            &["checkpoint", id],
            0,
            format!(
                "checkpoint 0190a5c4-7d1e-7000-8000-0000000000c1 of execution {id}: full, up to \
                 event 13, 1234 bytes, sha256 ab01\n"
            ),
            String::new(),
        ),
        (
            &["pause", id],
            1,
            String::new(),
            format!("trellis: execution {id}: execution is completed\n"),
        ),
        (
            &["retry", "nope"],
            1,
            String::new(),
            "trellis: execution nope not found\n".to_owned(),
        ),
        (
            &["answer", id, "nope", "yes"],
            1,
            String::new(),
            format!("trellis: question nope of execution {id} not found\n"),
        ),
    ];
    for (args, code, out, err) in cases {
        let output = run(&[&["--coordinator", url.as_str()], args].concat());
        assert_eq!(
            output.status.code(),
            Some(code),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(stdout(&output), out, "{args:?}");
        assert_eq!(stderr(&output), err, "{args:?}");
    }
}

#[test]
fn token_new_prints_a_fresh_token_and_the_line_that_lets_it_in() {
    let first = run(&[
        "token",
        "new",
        "--name",
        "ci-team-a",
        "--namespace",
        "team-a",
    ]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let token = stdout(&first).trim().to_owned();
    assert!(token.starts_with("trellis_") && token.len() > 40, "{token}");
    // The line for the access file carries the token's SHA-256, never the token.
    let hashed = run_stdin(&["token", "hash"], token.as_bytes());
    assert_eq!(hashed.status.code(), Some(0), "{}", stderr(&hashed));
    let digest = stdout(&hashed).trim().to_owned();
    assert_eq!(digest.len(), 64, "{digest}");
    let line = stderr(&first);
    assert!(
        line.contains(&format!(
            "- {{name: ci-team-a, namespace: team-a, sha256: {digest}}}"
        )),
        "{line}"
    );
    assert!(
        !line.contains(&token),
        "the token is printed on stderr too: {line}"
    );
    // Every token is new.
    let second = run(&["token", "new", "--name", "x", "--namespace", "*"]);
    assert_ne!(stdout(&second).trim(), token);
    assert!(
        stderr(&second).contains("namespace: \"*\""),
        "{}",
        stderr(&second)
    );
    // Bad names are bad input.
    let bad = run(&["token", "new", "--name", "x", "--namespace", "Team A"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("is not a namespace name"),
        "{}",
        stderr(&bad)
    );
    let empty = run_stdin(&["token", "hash"], b"");
    assert_eq!(empty.status.code(), Some(2), "{}", stderr(&empty));
}

#[test]
fn calls_to_a_coordinator_that_wants_a_token_say_how_to_give_one() {
    // A coordinator that authenticates: started through `trellis coordinator` with an access file.
    let nats =
        trellis_testkit::NatsServer::start().expect("a nats-server (apt-get install nats-server)");
    let dir = tempfile::tempdir().expect("a directory");
    let access = dir.path().join("access.yaml");
    std::fs::write(
        &access,
        "namespaces: {team: {}}\ntokens:\n  - {name: t, namespace: team, sha256: \
         ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad}\n",
    )
    .expect("the access file is written");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut coordinator = ChildGuard(
        Command::new(TRELLIS)
            .args(["coordinator", "--admin-addr", "off", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--nats-url", &nats.url(), "--access-file"])
            .arg(&access)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("trellis coordinator starts"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let mut refused = None;
    for _ in 0..100 {
        let output = run(&["list", "--coordinator", &url]);
        if stderr(&output).contains("refused the call") {
            refused = Some(output);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let refused = refused.expect("the coordinator answers and refuses the call");
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("TRELLIS_TOKEN"),
        "{}",
        stderr(&refused)
    );
    // The token whose SHA-256 the file holds ("abc") is let in.
    let output = Command::new(TRELLIS)
        .args(["list", "--coordinator", &url])
        .env("TRELLIS_TOKEN", "abc")
        .output()
        .expect("trellis list runs");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let _ = coordinator.0.kill();
}

/// Kills the child on drop.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn cluster_shows_each_coordinator_its_shards_and_the_unheld_ones() {
    let (url, _fake) = fake::start();
    let output = run(&["--coordinator", &url, "cluster"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let out = stdout(&output);
    assert!(out.starts_with("COORDINATOR  ADDRESS"), "{out}");
    assert!(
        out.contains("c-0          http://10.0.0.1:7400  0-1"),
        "{out}"
    );
    assert!(
        out.ends_with("2 coordinators over 4 shards; unheld: 2 (answered by c-0)\n"),
        "{out}"
    );
    let output = run(&["--coordinator", &url, "cluster", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).expect("one JSON object");
    assert_eq!(json["coordinators"][1]["shards"], serde_json::json!([3]));
    assert_eq!(json["unowned_shards"], serde_json::json!([2]));
}

#[test]
fn pause_reaches_a_task_a_queue_or_the_fleet_and_says_what_it_does() {
    let (url, fake) = fake::start();
    let output = run(&[
        "--coordinator",
        &url,
        "pause",
        "--task",
        "build",
        "--mode",
        "preempt",
        fake::EXECUTION_ID,
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).starts_with(&format!(
            "paused task build of execution {}: nothing new starts; running tasks stop",
            fake::EXECUTION_ID
        )),
        "{}",
        stdout(&output)
    );
    let sent = fake.paused.lock().expect("lock").take().expect("a pause");
    assert_eq!(
        (sent.task_id.as_str(), sent.mode),
        ("build", PauseMode::Preempt as i32)
    );

    let output = run(&["--coordinator", &url, "pause", "--queue", "gpu"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output)
            .contains("paused queue gpu: nothing new starts; running tasks finish (drain)")
    );
    let sent = fake
        .fleet_paused
        .lock()
        .expect("lock")
        .take()
        .expect("a fleet pause");
    assert_eq!(sent.mode, PauseMode::Drain as i32);

    let output = run(&["--coordinator", &url, "resume", "--queue", "gpu"]);
    assert!(
        stdout(&output).contains("resumed queue gpu"),
        "{}",
        stdout(&output)
    );
    let output = run(&["--coordinator", &url, "resume", "--all"]);
    assert!(
        stdout(&output).contains("the whole fleet was not paused"),
        "{}",
        stdout(&output)
    );

    let output = run(&["--coordinator", &url, "pauses"]);
    let out = stdout(&output);
    assert!(out.starts_with("TARGET"), "{out}");
    assert!(
        out.contains("queue      gpu") && out.contains("preempt") && out.contains("driver upgrade"),
        "{out}"
    );
    let output = run(&["--coordinator", &url, "pauses", "--json"]);
    let json: serde_json::Value = serde_json::from_str(stdout(&output).trim()).expect("JSON");
    assert_eq!(json["name"], "gpu");

    let output = run(&["--coordinator", &url, "drain", "w-1"]);
    assert!(
        stdout(&output).contains("worker w-1 is draining"),
        "{}",
        stdout(&output)
    );
    let output = run(&["--coordinator", &url, "drain", "w-9"]);
    assert_ne!(output.status.code(), Some(0));
}

#[test]
fn a_pause_without_a_target_or_with_two_is_refused_before_any_call() {
    for args in [
        vec!["pause"],
        vec!["pause", "--task", "build"],
        vec!["pause", "--queue", "gpu", "--all"],
        vec![
            "pause",
            "--namespace",
            "a",
            "0190a5c4-7d1e-7000-8000-000000000001",
        ],
        vec!["pause", "--all", "--mode", "sideways"],
    ] {
        let mut full = vec!["--coordinator", "http://127.0.0.1:1"];
        full.extend(args.iter().copied());
        let output = run(&full);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stdout(&output).is_empty() || stderr(&output).contains("error"),
            "{args:?}"
        );
    }
}

/// The pids of the processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                // The fields after the command name (which may hold spaces) start after ") ".
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Whether `pid` runs (a zombie does not count).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'))
    })
}

#[test]
fn dev_refuses_to_promise_sync_always_for_a_nats_server_it_does_not_start() {
    let out = Command::new(TRELLIS)
        .args(["dev", "--sync", "always", "--listen", "127.0.0.1:0"])
        .env("NATS_URL", "nats://127.0.0.1:4222")
        .output()
        .expect("trellis dev runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains("--sync always applies to the nats-server trellis starts")
            && stderr.contains("NATS_URL=nats://127.0.0.1:4222"),
        "says what and why: {stderr}"
    );
    assert!(
        !stderr.contains("coordinator at"),
        "nothing started: {stderr}"
    );
}

/// A service of `trellis dev` that stops on its own stops the whole cluster: dev says which and
/// why, and exits non-zero, instead of serving on without it. Here the checkpoint-store (and
/// the planner, on the same file) cannot create their SQLite file: TMPDIR is a file.
#[test]
fn dev_stops_when_one_of_its_services_stops_on_its_own() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, b"").expect("a file");
    // A NATS that dev starts would keep its store in TMPDIR too: give it one of the test's.
    let nats =
        trellis_testkit::NatsServer::start().expect("a nats-server (apt-get install nats-server)");
    let mut dev = Command::new(TRELLIS)
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--admin-addr",
            "off",
        ])
        .env("TMPDIR", &not_a_dir)
        .env("NATS_URL", nats.url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trellis dev starts");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = dev.try_wait().expect("dev's status") {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = dev.kill();
            panic!("trellis dev still runs 60 s after its store could not open");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut dev.stderr.take().expect("piped"), &mut stderr)
        .expect("dev's stderr");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("stopped: cannot open SQLite database")
            && stderr.contains("the cluster was stopped with it"),
        "names the service and why: {stderr}"
    );
}

#[test]
fn dev_stopped_with_sigterm_stops_its_nats_server_and_removes_its_store() {
    use std::io::BufRead as _;
    let mut dev = Command::new(TRELLIS)
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--monitor",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--admin-addr",
            "off",
            "--sync",
            "always",
        ])
        .env_remove("NATS_URL")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trellis dev starts");
    let pid = dev.id();
    let stderr = dev.stderr.take().expect("piped stderr");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines.send(line);
        }
    });
    let mut seen = Vec::new();
    loop {
        let Ok(line) = received.recv_timeout(std::time::Duration::from_secs(60)) else {
            let _ = dev.kill();
            panic!(
                "trellis dev did not start within 60 s:\n{}",
                seen.join("\n")
            );
        };
        let ready = line.contains("coordinator at ");
        seen.push(line);
        if ready {
            break;
        }
    }
    let nats: Vec<u32> = children_of(pid)
        .into_iter()
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/comm"))
                .is_ok_and(|comm| comm.trim() == "nats-server")
        })
        .collect();
    assert_eq!(
        nats.len(),
        1,
        "trellis dev runs one nats-server child: {nats:?}"
    );
    let store_prefix = format!("trellis-nats-{pid}-");
    let stores = || -> Vec<PathBuf> {
        std::fs::read_dir(std::env::temp_dir())
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&store_prefix))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(stores().len(), 1, "its store is in the temporary directory");
    let started = seen.last().cloned().unwrap_or_default();
    assert!(
        started.contains(", sync always)"),
        "the start line says how NATS writes: {started}"
    );
    let config = std::fs::read_to_string(stores()[0].join("nats.conf")).expect("its config");
    assert!(
        config.contains("sync_interval: always"),
        "--sync always reaches the server: {config}"
    );
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = dev.try_wait().expect("wait for trellis dev") {
            break exit;
        }
        if std::time::Instant::now() > deadline {
            let _ = dev.kill();
            panic!("trellis dev still runs 30 s after SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(exit.success(), "trellis dev exited with {exit}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!alive(nats[0]), "its nats-server {} outlived it", nats[0]);
    assert_eq!(
        stores(),
        Vec::<PathBuf>::new(),
        "its NATS store was left behind"
    );
}
