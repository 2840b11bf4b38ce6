//! Checks of the turn that need no execution.

/// The turn's sources, as compiled.
const SOURCES: [(&str, &str); 12] = [
    ("mod.rs", include_str!("mod.rs")),
    ("contract.rs", include_str!("contract.rs")),
    ("tests.rs", include_str!("tests.rs")),
    ("admission.rs", include_str!("admission.rs")),
    ("checkpoint.rs", include_str!("checkpoint.rs")),
    ("error.rs", include_str!("error.rs")),
    ("flush.rs", include_str!("flush.rs")),
    ("live.rs", include_str!("live.rs")),
    ("requests.rs", include_str!("requests.rs")),
    ("results.rs", include_str!("results.rs")),
    ("shards.rs", include_str!("shards.rs")),
    ("workers.rs", include_str!("workers.rs")),
];

/// What the turn must not touch: I/O, the clock, randomness, threads.
const FORBIDDEN: [&str; 12] = [
    "tokio",
    "async_nats",
    "tonic::",
    "SystemTime",
    "Instant::now",
    "now_v7",
    "new_v4",
    "std::thread",
    "std::fs",
    "std::net",
    "async fn",
    ".await",
];

#[test]
fn the_turn_does_no_io_and_reads_no_clock() {
    let mut found = Vec::new();
    for (file, source) in SOURCES {
        for (line_idx, line) in source.lines().enumerate() {
            // This file names the forbidden words in its own test.
            if file == "tests.rs" && line.contains('"') && line.trim_start().starts_with('"') {
                continue;
            }
            let code = line.split("//").next().unwrap_or("");
            for word in FORBIDDEN {
                if code.contains(word) {
                    found.push(format!("turn/{file}:{}: {word}", line_idx + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the pure turn touches the outside world:\n{}",
        found.join("\n")
    );
}
