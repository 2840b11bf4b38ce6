# Trellis recipes. CI runs `.ci/run`, which runs `scripts/test` as `just test` does.

# List the recipes.
default:
    @just --list

# Run every test (the README's test command), after installing and starting what they need;
# options go to `cargo test`, e.g. `just test -p trellis-core`.
test *args:
    scripts/test {{args}}

# Format the code.
fmt:
    cargo fmt --all

# Formatting and clippy, warnings are errors.
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings

# Everything CI checks, and the lints.
verify: lint test

# Micro-benchmarks of the pure core (plan compile + analyze, state machine, graph builder).
bench:
    cargo bench -p trellis-core

# Fuzz one target for ten minutes, e.g. `just fuzz nats_task_result` (needs cargo-fuzz).
fuzz target:
    cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none {{target}} corpus/{{target}} seeds/{{target}} -- -max_total_time=600 -rss_limit_mb=2048 -timeout=10

# The main job: a plan run end to end on a local cluster, then its execution tree.
demo:
    cargo run -p trellis-cli -- demo
