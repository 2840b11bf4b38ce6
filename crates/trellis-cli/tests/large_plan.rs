//! A plan larger than a gRPC client decodes by default, run end to end through `trellis dev`:
//! `trellis submit --wait` follows its execution to the end and `trellis events` reads its
//! first event, which carries the plan whole (before, both failed: "decoded message length too
//! large").

mod support;

use std::io::Write as _;

use support::Dev;

/// Past the 4 MiB a tonic client decodes unless told otherwise: the plan's first event holds its
/// text and its compiled form, so twice this, within the 8 MiB a NATS message of the log may hold.
const INPUT_BYTES: usize = 3 * 1024 * 1024;

#[test]
fn a_plan_of_six_megabytes_in_its_log_runs_and_its_history_reads_back() {
    let dev = Dev::start();
    // A task input is part of the plan, which the execution's first event keeps (comments are
    // not: the plan is sent compiled).
    let plan = format!(
        "name: large\ntasks:\n- {{id: first, type: noop, input: {{blob: {}}}}}\n\
         - {{id: second, type: noop, depends_on: [first]}}\n",
        "x".repeat(INPUT_BYTES)
    );
    let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
    file.write_all(plan.as_bytes())
        .expect("the plan is written");
    let path = file.path().to_str().expect("a UTF-8 path").to_owned();

    let stdout = dev.ok(&["submit", "--wait", &path]);
    let mut lines = stdout.lines();
    let id = lines.next().expect("the execution's id first").to_owned();
    let outcome = lines.next().unwrap_or_default();
    assert!(
        outcome.starts_with("completed in "),
        "submit --wait did not see the end: {stdout}"
    );

    let events = dev.ok(&["events", "--json", &id]);
    let kinds: Vec<String> = events
        .lines()
        .map(|line| {
            let event: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
            event["kind"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("execution_started"),
        "the history begins with the start that carries the plan: {kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("execution_finished"),
        "{kinds:?}"
    );
}
