# syntax=docker/dockerfile:1.7
#
# One image holding every Trellis binary; each Kubernetes Deployment picks its binary with
# `command:` (see deploy/). Build with BuildKit (the default builder of current Docker):
#
#   docker build -t registry.example.com/trellis:0.1.0 .
#
# The protobuf contracts compile with protox (pure Rust), so the builder needs no protoc.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder
WORKDIR /src
COPY . .
# The registry and the target directory live in cache mounts, so a rebuild compiles only what
# changed. A cache mount is not part of the image: the binaries are copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked \
        --package trellis-cli \
        --package trellis-coordinator \
        --package trellis-agent-worker \
        --package trellis-checkpoint-store \
        --package trellis-planner \
        --package trellis-monitor \
        --bins \
 && mkdir -p /out \
 && for bin in trellis trellis-coordinator trellis-agent-worker trellis-checkpoint-store \
        trellis-planner trellis-monitor; do \
        cp "target/release/$bin" /out/; \
    done

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="trellis" \
      org.opencontainers.image.description="Trellis: a distributed, durable engine for task graphs (coordinator, agent-worker, checkpoint-store, planner, monitor and the trellis CLI)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/debian:${DEBIAN_RELEASE}-slim"
# ca-certificates: TLS to NATS, PostgreSQL, an OTLP collector and the http task handler's targets.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# A fixed, numeric non-root user: Kubernetes can only verify runAsNonRoot against a numeric USER.
RUN groupadd --system --gid 10001 trellis \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin trellis
COPY --from=builder /out/ /usr/local/bin/
USER 10001:10001
WORKDIR /tmp
# No entrypoint: each Deployment sets its command (trellis-coordinator, trellis-agent-worker, ...).
CMD ["trellis", "--help"]
