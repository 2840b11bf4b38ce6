//! The Kubernetes manifests, the NATS Helm values and the image of Trellis live beside this
//! package; it exists for its test, `tests/manifests.rs`, which renders every kustomize overlay
//! with `kubectl kustomize`, validates the result against the Kubernetes schemas with
//! `kubernetes-validate`, and checks what schemas cannot (probes, selectors, autoscaling
//! triggers, the services' environment variables). See `README.md` in this directory.
