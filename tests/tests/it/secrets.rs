//! Secrets never reach a log line or a help text: the coordinator, checkpoint-store, worker and
//! monitor run as processes at log level debug with a NATS password (as a flag's variable and
//! inside the URL), an access file, bearer tokens and a monitor token, and are made to use them
//! (an execution is started and runs, a call without a token is refused); then no secret appears
//! in any of their logs, nor in `--help` printed with the variables set.

use std::process::Command;

use trellis_grpc::ClientSecurity;
use trellis_grpc::access::token_digest;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_telemetry::redact::Secret;

use crate::harness::{self, Ready, Service, Spec};
use crate::system::start_request;

const NATS_PASSWORD: &str = "nats-pw-c0ffee71";
const URL_PASSWORD: &str = "url-pw-5ea5ide";
const SERVICE_TOKEN: &str = "svc-token-b16b00b5";
const USER_TOKEN: &str = "user-token-decafbad";
const MONITOR_TOKEN: &str = "monitor-token-0ddba11";

const SECRETS: [&str; 5] = [
    NATS_PASSWORD,
    URL_PASSWORD,
    SERVICE_TOKEN,
    USER_TOKEN,
    MONITOR_TOKEN,
];

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{what} shows a secret ({secret}):\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_or_a_help_text() -> anyhow::Result<()> {
    // Two NATS users: one authenticated by the variable, one inside the URL.
    let nats = trellis_testkit::NatsServer::start_with_config(&format!(
        "authorization {{ users: [ {{user: trellis, password: \"{NATS_PASSWORD}\"}}, \
         {{user: monitor, password: \"{URL_PASSWORD}\"}} ] }}"
    ))?;
    let dir = tempfile::tempdir()?;
    let access = dir.path().join("access.yaml");
    std::fs::write(
        &access,
        format!(
            "namespaces: {{team: {{}}}}\n\
             tokens:\n\
             \x20 - {{name: services, namespace: \"*\", sha256: {}}}\n\
             \x20 - {{name: user, namespace: team, sha256: {}}}\n",
            token_digest(SERVICE_TOKEN),
            token_digest(USER_TOKEN)
        ),
    )?;
    let logs = tempfile::tempdir()?;
    let with_secrets = |spec: Spec| {
        spec.env("RUST_LOG", "debug")
            .env("TRELLIS_NATS_USER", "trellis")
            .env("TRELLIS_NATS_PASSWORD", NATS_PASSWORD)
            .env("TRELLIS_TOKEN", SERVICE_TOKEN)
            .flag("--nats-url", nats.url())
            .flag("--admin-addr", "off")
    };

    let store_addr = harness::free_addr()?;
    let database = dir.path().join("store.db");
    let store = Service::start(
        with_secrets(Spec::new(
            "checkpoint-store",
            env!("CARGO_BIN_EXE_sys-checkpoint-store"),
        ))
        .flag(
            "--database-url",
            format!("sqlite://{}?mode=rwc", database.display()),
        )
        .flag("--listen", store_addr.to_string())
        .env("TRELLIS_ACCESS_FILE", &access)
        .ready(Ready::GrpcHealth {
            addr: store_addr,
            service: "",
        }),
        logs.path(),
    )
    .await?;
    let coordinator_addr = harness::free_addr()?;
    let coordinator = Service::start(
        with_secrets(Spec::new(
            "coordinator",
            env!("CARGO_BIN_EXE_sys-coordinator"),
        ))
        .flag("--listen", coordinator_addr.to_string())
        .flag("--checkpoint-store", format!("http://{store_addr}"))
        .flag("--checkpoint-every", "100ms")
        .env("TRELLIS_ACCESS_FILE", &access)
        .ready(Ready::GrpcHealth {
            addr: coordinator_addr,
            service: "",
        }),
        logs.path(),
    )
    .await?;
    let worker = Service::start(
        with_secrets(Spec::new("worker", env!("CARGO_BIN_EXE_sys-agent-worker"))),
        logs.path(),
    )
    .await?;
    let monitor_addr = harness::free_addr()?;
    let port = nats.port();
    let monitor = Service::start(
        Spec::new("monitor", env!("CARGO_BIN_EXE_sys-monitor"))
            .env("RUST_LOG", "debug")
            .env("TRELLIS_TOKEN", SERVICE_TOKEN)
            .env("TRELLIS_MONITOR_TOKEN", MONITOR_TOKEN)
            .flag(
                "--nats-url",
                format!("nats://monitor:{URL_PASSWORD}@127.0.0.1:{port}"),
            )
            .flag("--admin-addr", "off")
            .flag("--listen", monitor_addr.to_string())
            .flag("--coordinator", format!("http://{coordinator_addr}"))
            .ready(Ready::Http {
                addr: monitor_addr,
                path: "/api/health",
            }),
        logs.path(),
    )
    .await?;

    // Use the secrets: a user's execution runs to its end (checkpointed on the way), a call
    // without a token is refused, a monitor control with a wrong token too.
    let user = ClientSecurity {
        token: Some(Secret::new(USER_TOKEN)),
        ..ClientSecurity::default()
    };
    let mut client =
        CoordinatorClient::new(user.connect(&format!("http://{coordinator_addr}")).await?);
    let id = client
        .start_execution(start_request(
            "name: quiet\ntasks:\n  - {id: a, type: sleep, input: {ms: 300}}\n  - {id: b, type: noop, depends_on: [a]}\n",
        ))
        .await?
        .into_inner()
        .execution_id;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let execution = client
            .get_execution(trellis_proto::v1::GetExecutionRequest {
                execution_id: id.clone(),
            })
            .await?
            .into_inner()
            .execution
            .unwrap_or_default();
        if execution.state == trellis_proto::v1::ExecutionState::Completed as i32 {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the execution did not complete: {execution:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let anonymous = ClientSecurity::default();
    let refused = CoordinatorClient::new(
        anonymous
            .connect(&format!("http://{coordinator_addr}"))
            .await?,
    )
    .list_executions(trellis_proto::v1::ListExecutionsRequest::default())
    .await;
    anyhow::ensure!(refused.is_err(), "a call without a token went through");
    let wrong = reqwest::Client::new()
        .post(format!("http://{monitor_addr}/api/executions/{id}/pause"))
        .bearer_auth("not-the-monitor-token")
        .json(&serde_json::json!({}))
        .send()
        .await?;
    anyhow::ensure!(wrong.status().as_u16() == 401, "{}", wrong.status());

    for service in [&store, &coordinator, &worker, &monitor] {
        // The harness's own lines (the command it ran) are not the service's.
        let log: String = std::fs::read_to_string(service.log_path())?
            .lines()
            .filter(|line| !line.starts_with("===== test:"))
            .map(|line| format!("{line}\n"))
            .collect();
        anyhow::ensure!(!log.is_empty(), "{} logged nothing", service.name());
        assert_no_secret(&format!("the log of {}", service.name()), &log);
    }

    // `--help` lists the variables each flag reads, never their values.
    for binary in [
        env!("CARGO_BIN_EXE_sys-coordinator"),
        env!("CARGO_BIN_EXE_sys-checkpoint-store"),
        env!("CARGO_BIN_EXE_sys-agent-worker"),
        env!("CARGO_BIN_EXE_sys-monitor"),
    ] {
        let output = Command::new(binary)
            .arg("--help")
            .env("TRELLIS_NATS_PASSWORD", NATS_PASSWORD)
            .env("TRELLIS_NATS_TOKEN", USER_TOKEN)
            .env("TRELLIS_TOKEN", SERVICE_TOKEN)
            .env("TRELLIS_MONITOR_TOKEN", MONITOR_TOKEN)
            .env(
                "TRELLIS_DATABASE_URL",
                format!("postgres://u:{URL_PASSWORD}@db/x"),
            )
            .output()?;
        let help = String::from_utf8_lossy(&output.stdout);
        anyhow::ensure!(
            help.contains("TRELLIS_NATS_PASSWORD"),
            "{binary} --help:\n{help}"
        );
        assert_no_secret(&format!("{binary} --help"), &help);
    }
    Ok(())
}
