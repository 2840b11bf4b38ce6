# Trellis recipes. CI runs `.ci/run`, which runs the same test command as `just test`.

# List the recipes.
default:
    @just --list

# Run every test (the README's test command).
test:
    cargo test --workspace

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

# The main job: a plan run end to end on a local cluster, then its execution tree.
demo:
    cargo run -p trellis-cli -- demo
