//! `trellis bench` end to end: each scenario's line on a nats-server of the bench's own.

use std::process::Command;

const TRELLIS: &str = env!("CARGO_BIN_EXE_trellis");

/// Runs `trellis bench` with these arguments on a nats-server of its own and returns its JSON
/// lines; a failed run fails the test with its stderr.
fn bench(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(TRELLIS)
        .arg("bench")
        .args(args)
        .env_remove("NATS_URL")
        .env("RUST_LOG", "warn")
        .output()
        .expect("trellis bench runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "trellis bench failed: {stderr}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// A bench line's hops under `key` (`[name, µs]` pairs): their names in order and their sum in µs.
fn hop_list<'a>(line: &'a serde_json::Value, key: &str) -> (Vec<&'a str>, f64) {
    let hops = line[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is a list: {line}"));
    let names = hops.iter().filter_map(|hop| hop[0].as_str()).collect();
    let sum = hops.iter().filter_map(|hop| hop[1].as_f64()).sum();
    (names, sum)
}

/// The hops a new execution takes from its first turn to its caller, idle or under load.
const FROM_INDEX: [&str; 14] = [
    "index",
    "append",
    "dispatch",
    "fetch",
    "start",
    "handler",
    "result",
    "consume",
    "take",
    "decide_result",
    "append_result",
    "notify",
    "observe",
    "close",
];

/// `latency` says where each task's time went, hop by hop in path order, and `chain` where each
/// hop of a chain went; `floor` measures the bare JetStream pipeline; `loaded` samples latency
/// while throughput runs and splits each sample by its own execution's marks. Each of them counts
/// the disk's flushes per task, and the two that run the engine the coordinator's turns.
#[test]
fn bench_splits_a_task_into_hops_and_measures_the_floor() {
    let lines = bench(&[
        "--scenario",
        "latency",
        "--scenario",
        "floor",
        "--scenario",
        "loaded",
        "--scenario",
        "chain",
        "--n",
        "30",
    ]);
    assert_eq!(lines.len(), 4, "one line per scenario: {lines:?}");
    let [latency, floor, loaded, chain] = &lines[..] else {
        unreachable!("four lines, checked above")
    };
    // 30 tasks make 29 hops from one task's result to the next one's, each seen whole.
    assert_eq!(chain["hops_whole"], 29, "{chain}");
    let (names, hop_us) = hop_list(chain, "hop_p50_us");
    assert_eq!(
        names,
        [
            "take",
            "decide_result",
            "append_result",
            "dispatch",
            "fetch",
            "start",
            "handler",
            "result",
            "consume"
        ],
        "{chain}"
    );
    let seconds = chain["seconds"].as_f64().expect("seconds");
    assert!(
        hop_us > 0.0 && hop_us <= seconds * 1e6,
        "a hop's parts add up to less than the whole chain: {chain}"
    );
    // The mean hop times the hops seen whole is time the chain spent in them, within its whole
    // (each part's mean rounded to a microsecond: 9 × 0.5 µs per hop at most).
    let (mean_names, mean_us) = hop_list(chain, "hop_mean_us");
    assert_eq!(mean_names, names, "{chain}");
    assert!(
        mean_us > 0.0 && (mean_us - 4.5) * 29.0 <= seconds * 1e6,
        "the hops' mean parts, over 29 hops, fit in the chain: {chain}"
    );
    assert_eq!(
        latency["unsplit"], 0,
        "every sample read along its path: {latency}"
    );
    let (names, total_us) = hop_list(latency, "hop_p50_us");
    assert_eq!(
        names,
        [&["submit", "prepare", "decide"][..], &FROM_INDEX].concat(),
        "{latency}"
    );
    let (tail_names, tail_us) = hop_list(latency, "hop_tail_us");
    assert_eq!(
        tail_names, names,
        "the tail's hops are the path's: {latency}"
    );
    assert!(
        tail_us > 0.0,
        "the slowest samples' hops were measured: {latency}"
    );
    let p99_us = latency["p99_ms"].as_f64().expect("p99_ms") * 1000.0;
    assert!(
        total_us > 0.0 && total_us <= p99_us + 1000.0,
        "the hops' medians add up to no more than a slow task: {latency}"
    );
    for line in &lines {
        assert!(line.get("error").is_none(), "{line}");
        assert_eq!(line["dispatch_window"], 128, "the default window: {line}");
        assert!(
            line["disk_flushes_per_task"].is_null()
                || line["disk_flushes_per_task"].as_f64() >= Some(0.0),
            "flushes per task counted where the disk counts them: {line}"
        );
    }
    assert!(floor["tasks_per_s"].as_f64() > Some(0.0), "{floor}");
    assert_eq!(floor["samples"], 500, "{floor}");
    assert!(floor["p50_ms"].as_f64() > Some(0.0), "{floor}");
    assert!(loaded["load_tasks_per_s"].as_f64() > Some(0.0), "{loaded}");
    assert_eq!(loaded["samples"], 30, "every sample taken: {loaded}");
    // A sample is split only when the trace watched its own execution: a load execution started
    // in the same instant may take the watch now and then, seldom most of thirty.
    let unsplit = loaded["unsplit"].as_u64().expect("unsplit");
    assert!(
        unsplit < 15,
        "most samples split along their path: {loaded}"
    );
    let (names, loaded_us) = hop_list(loaded, "hop_p50_us");
    assert_eq!(
        names,
        [&["until_turn"][..], &FROM_INDEX].concat(),
        "{loaded}"
    );
    let loaded_max_us = loaded["max_ms"].as_f64().expect("max_ms") * 1000.0;
    assert!(
        loaded_us > 0.0 && loaded_us <= loaded_max_us + 1000.0,
        "a sample's hops add up to no more than the slowest sample: {loaded}"
    );
    // The coordinator's turns: each of 30 one-task executions takes a few turns with work, and
    // every phase ran in some of them.
    for line in [latency, loaded] {
        let turns = &line["coordinator_turns"];
        assert!(turns["turns"].as_f64() >= Some(30.0), "{line}");
        for phase in ["decide_ms", "append_ms", "effects_ms"] {
            assert!(turns[phase].as_f64() > Some(0.0), "{phase}: {line}");
        }
    }
    assert!(floor.get("coordinator_turns").is_none(), "{floor}");
    assert!(
        loaded["p999_ms"].as_f64() >= loaded["p50_ms"].as_f64(),
        "{loaded}"
    );
}

/// `trellis bench --sync always` runs on a server that flushes every write and says so on every
/// line, with the server's version. Needs nats-server 2.10 or newer first on PATH (scripts/test
/// installs one); with an older one the command refuses, naming the fix.
#[test]
fn bench_with_sync_always_says_so_on_every_line() {
    let lines = bench(&[
        "--scenario",
        "latency",
        "--scenario",
        "chain",
        "--n",
        "20",
        "--sync",
        "always",
    ]);
    assert_eq!(lines.len(), 2, "one line per scenario: {lines:?}");
    for line in &lines {
        assert_eq!(line["sync"], "always", "{line}");
        assert_eq!(
            line["dispatch_window"], 256,
            "the window that shares each flush among more tasks: {line}"
        );
        let version = line["nats"].as_str().unwrap_or_default();
        let minor: u32 = version
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or_default();
        assert!(
            version.starts_with("2.") && minor >= 10,
            "a nats-server that can sync every write: {line}"
        );
        assert!(line.get("error").is_none(), "{line}");
        assert!(
            line["disk_flushes_per_task"].is_null()
                || line["disk_flushes_per_task"].as_f64() > Some(0.0),
            "every task costs the disk flushes when every write is synced: {line}"
        );
    }
}

/// `parked` takes `latency`'s samples beside 10,000 executions waiting on a question, and says
/// so: how many, how long they took to be asked, and the samples' hops as `latency`'s.
#[test]
fn bench_samples_latency_beside_parked_executions() {
    let lines = bench(&["--scenario", "parked", "--n", "20"]);
    assert_eq!(lines.len(), 1, "one line per scenario: {lines:?}");
    let parked = &lines[0];
    assert!(parked.get("error").is_none(), "{parked}");
    assert_eq!(parked["scenario"], "parked", "{parked}");
    assert_eq!(parked["parked"], 10_000, "{parked}");
    assert!(parked["parked_in_s"].as_f64() > Some(0.0), "{parked}");
    let (p50, p99) = (parked["p50_ms"].as_f64(), parked["p99_ms"].as_f64());
    assert!(p50 > Some(0.0) && p50 <= p99, "{parked}");
    let (names, _) = hop_list(parked, "hop_p50_us");
    assert_eq!(
        names,
        [&["submit", "prepare", "decide"][..], &FROM_INDEX].concat(),
        "{parked}"
    );
}
