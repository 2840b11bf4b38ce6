//! A coordinator started with an access file: calls without a valid token are refused, a token
//! of one namespace can neither see nor control another's executions, quotas and limits hold,
//! and the gRPC port speaks TLS with client certificates. Every refusal changes nothing.

use std::sync::Arc;
use std::time::Duration;

use tonic::Code;
use trellis_agent_worker::HandlerRegistry;
use trellis_grpc::access::{AccessPolicy, token_digest};
use trellis_grpc::{AuthChannel, ClientSecurity, ServerSecurity};
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::{self, ExecutionState, event::Kind};
use trellis_telemetry::redact::Secret;

use crate::cluster::{self, Cluster, Setup, spec};

const TOKEN_A: &str = "token-of-team-a-7d1e";
const TOKEN_B: &str = "token-of-team-b-03c9";
const TOKEN_SMALL: &str = "token-of-small-5b2f";
const TOKEN_TINY: &str = "token-of-tiny-e81a";
const TOKEN_OPS: &str = "token-of-ops-92ad";

fn access() -> Arc<AccessPolicy> {
    let text = format!(
        "namespaces:\n\
         \x20 team-a: {{tier: teams}}\n\
         \x20 team-b: {{tier: teams}}\n\
         \x20 small: {{tier: writer_pro, max_concurrency: 2}}\n\
         \x20 tiny: {{tier: core}}\n\
         tokens:\n\
         \x20 - {{name: a, namespace: team-a, sha256: {}}}\n\
         \x20 - {{name: b, namespace: team-b, sha256: {}}}\n\
         \x20 - {{name: small, namespace: small, sha256: {}}}\n\
         \x20 - {{name: tiny, namespace: tiny, sha256: {}}}\n\
         \x20 - {{name: ops, namespace: \"*\", sha256: {}}}\n\
         limits: {{max_payload_bytes: 1024}}\n",
        token_digest(TOKEN_A),
        token_digest(TOKEN_B),
        token_digest(TOKEN_SMALL),
        token_digest(TOKEN_TINY),
        token_digest(TOKEN_OPS),
    );
    Arc::new(AccessPolicy::parse(&text, "access.yaml").expect("a valid access file"))
}

fn security(token: Option<&str>) -> ClientSecurity {
    ClientSecurity {
        token: token.map(Secret::new),
        ..ClientSecurity::default()
    }
}

/// A cluster whose coordinator authenticates; its own client acts for team-a.
async fn start() -> Cluster {
    cluster::start_setup(
        1,
        HandlerRegistry::with_builtins,
        Setup {
            security: ServerSecurity {
                access: Some(access()),
                ..ServerSecurity::default()
            },
            client: security(Some(TOKEN_A)),
            // Nothing listens there: a checkpoint the quota allows would wait for it, one it
            // forbids is refused before.
            checkpoint_store: Some("http://127.0.0.1:9".to_owned()),
            ..Setup::default()
        },
    )
    .await
}

async fn client(cluster: &Cluster, token: Option<&str>) -> CoordinatorClient<AuthChannel> {
    CoordinatorClient::new(
        security(token)
            .connect(&cluster.url)
            .await
            .expect("the coordinator accepts connections"),
    )
}

const SLOW: &str = "name: slow\ntasks:\n  - {id: nap, type: sleep, input: {ms: 1500}}\n  - {id: ask, type: question, input: {text: go?}, depends_on: [nap]}\n";

/// Calls every RPC about execution `id` (and the lists) with `client`; returns the status code of
/// each, or `Ok` for a call that went through.
async fn every_call(
    client: &mut CoordinatorClient<AuthChannel>,
    id: &str,
) -> Vec<(&'static str, Code)> {
    let id = id.to_owned();
    let code = |result: Result<(), tonic::Status>| result.err().map_or(Code::Ok, |s| s.code());
    vec![
        (
            "StartExecution",
            code(client.start_execution(spec(SLOW, "", "")).await.map(drop)),
        ),
        (
            "ListExecutions",
            code(
                client
                    .list_executions(v1::ListExecutionsRequest::default())
                    .await
                    .map(drop),
            ),
        ),
        (
            "GetExecution",
            code(
                client
                    .get_execution(v1::GetExecutionRequest {
                        execution_id: id.clone(),
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "PauseExecution",
            code(
                client
                    .pause_execution(v1::PauseExecutionRequest {
                        execution_id: id.clone(),
                        reason: "intruder".to_owned(),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "ResumeExecution",
            code(
                client
                    .resume_execution(v1::ResumeExecutionRequest {
                        execution_id: id.clone(),
                        reason: String::new(),
                        ..Default::default()
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "CancelExecution",
            code(
                client
                    .cancel_execution(v1::CancelExecutionRequest {
                        execution_id: id.clone(),
                        reason: "intruder".to_owned(),
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "RetryExecution",
            code(
                client
                    .retry_execution(v1::RetryExecutionRequest {
                        execution_id: id.clone(),
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "CheckpointExecution",
            code(
                client
                    .checkpoint_execution(v1::CheckpointExecutionRequest {
                        execution_id: id.clone(),
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "ObserveExecution",
            code(
                client
                    .observe_execution(v1::ObserveExecutionRequest {
                        execution_id: id.clone(),
                        from_sequence: 1,
                        progress_only: false,
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "GetExecutionGraph",
            code(
                client
                    .get_execution_graph(v1::GetExecutionGraphRequest {
                        execution_id: id.clone(),
                        run_number: 0,
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "AnswerQuestion",
            code(
                client
                    .answer_question(v1::AnswerQuestionRequest {
                        execution_id: id.clone(),
                        question_id: uuid::Uuid::now_v7().to_string(),
                        answer: "yes".to_owned(),
                        answered_by: "intruder".to_owned(),
                    })
                    .await
                    .map(drop),
            ),
        ),
        (
            "ListWorkers",
            code(
                client
                    .list_workers(v1::ListWorkersRequest::default())
                    .await
                    .map(drop),
            ),
        ),
    ]
}

/// Every execution the operators' token sees.
async fn all_executions(cluster: &Cluster) -> Vec<v1::Execution> {
    client(cluster, Some(TOKEN_OPS))
        .await
        .list_executions(v1::ListExecutionsRequest::default())
        .await
        .expect("the operators' token lists everything")
        .into_inner()
        .executions
}

/// The kinds of event the log of `id` holds, read by team-a.
async fn event_kinds(cluster: &mut Cluster, id: &str) -> Vec<&'static str> {
    let mut stream = cluster
        .client
        .observe_execution(v1::ObserveExecutionRequest {
            execution_id: id.to_owned(),
            from_sequence: 1,
            progress_only: false,
        })
        .await
        .expect("team-a observes its execution")
        .into_inner();
    let mut kinds = Vec::new();
    // The history arrives at once; the live part is not needed.
    while let Ok(Ok(Some(item))) =
        tokio::time::timeout(Duration::from_millis(300), stream.message()).await
    {
        if let Some(kind) = item.event.and_then(|e| e.kind) {
            kinds.push(match kind {
                Kind::PauseRequested(_) => "pause_requested",
                Kind::ResumeRequested(_) => "resume_requested",
                Kind::CancelRequested(_) => "cancel_requested",
                Kind::QuestionAnswered(_) => "question_answered",
                Kind::RunStarted(_) => "run_started",
                Kind::ExecutionClaimed(_) => "execution_claimed",
                _ => "other",
            });
        }
    }
    kinds
}

/// Waits for team-a's execution to ask its question, proving it ran on untouched.
async fn reaches_its_question(cluster: &mut Cluster, id: &str) {
    let execution = cluster
        .wait_until(id, "its question", |e| !e.open_questions.is_empty())
        .await;
    assert_eq!(execution.reason, "", "{execution:?}");
    let kinds = event_kinds(cluster, id).await;
    for control in [
        "pause_requested",
        "resume_requested",
        "cancel_requested",
        "question_answered",
        "run_started",
    ] {
        assert!(
            !kinds.contains(&control),
            "a refused call left {control} in the log: {kinds:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_valid_token_are_refused_and_change_nothing() {
    let mut cluster = start().await;
    let id = cluster.start_plan(SLOW).await;
    for token in [None, Some("not-a-token"), Some("")] {
        let mut intruder = client(&cluster, token).await;
        for (call, code) in every_call(&mut intruder, &id).await {
            assert_eq!(code, Code::Unauthenticated, "{call} with token {token:?}");
        }
    }
    // The message says what to send, and the refusal is counted.
    let status = client(&cluster, None)
        .await
        .get_execution(v1::GetExecutionRequest {
            execution_id: id.clone(),
        })
        .await
        .expect_err("no token");
    assert!(
        status.message().contains("authorization: Bearer"),
        "{}",
        status.message()
    );
    // Nothing was started, and the execution runs on untouched.
    assert_eq!(all_executions(&cluster).await.len(), 1);
    reaches_its_question(&mut cluster, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_another_namespace_neither_sees_nor_controls_an_execution() {
    let mut cluster = start().await;
    let id = cluster.start_plan(SLOW).await;
    let unknown = uuid::Uuid::now_v7().to_string();
    let mut b = client(&cluster, Some(TOKEN_B)).await;
    for (call, code) in every_call(&mut b, &id).await {
        let expected = match call {
            // B may start its own executions and list its own (and the workers).
            "StartExecution" | "ListExecutions" | "ListWorkers" => Code::Ok,
            _ => Code::NotFound,
        };
        assert_eq!(code, expected, "{call} by team-b on team-a's execution");
    }
    // Not found exactly as an unknown id is: the answer tells B nothing.
    let message = |id: &str| {
        let mut b = b.clone();
        let id = id.to_owned();
        async move {
            let status = b
                .get_execution(v1::GetExecutionRequest {
                    execution_id: id.clone(),
                })
                .await
                .expect_err("not found");
            (status.code(), status.message().replace(&id, "ID"))
        }
    };
    assert_eq!(message(&id).await, message(&unknown).await);
    // B lists only the execution it started just now; A only its own.
    let listed = |executions: Vec<v1::Execution>| {
        executions
            .into_iter()
            .map(|e| (e.name, e.namespace))
            .collect::<Vec<_>>()
    };
    let b_list = b
        .list_executions(v1::ListExecutionsRequest::default())
        .await
        .expect("B lists")
        .into_inner()
        .executions;
    assert_eq!(
        listed(b_list),
        vec![("slow".to_owned(), "team-b".to_owned())]
    );
    let a_list = cluster
        .client
        .list_executions(v1::ListExecutionsRequest::default())
        .await
        .expect("A lists")
        .into_inner()
        .executions;
    assert_eq!(
        listed(a_list),
        vec![("slow".to_owned(), "team-a".to_owned())]
    );
    // B cannot start an execution in A's namespace; nothing is started.
    let refused = b
        .start_execution(spec(SLOW, "team-a", ""))
        .await
        .expect_err("B acts in team-b only");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(all_executions(&cluster).await.len(), 2);
    // The operators' token sees both, and may filter by namespace.
    let mut ops = client(&cluster, Some(TOKEN_OPS)).await;
    let only_a = ops
        .list_executions(v1::ListExecutionsRequest {
            namespace: "team-a".to_owned(),
            ..v1::ListExecutionsRequest::default()
        })
        .await
        .expect("ops lists")
        .into_inner()
        .executions;
    assert_eq!(only_a.len(), 1);
    assert_eq!(only_a[0].execution_id, id);
    // Idempotency keys are per namespace: the same key in B is another execution.
    let first = cluster
        .client
        .start_execution(spec(
            "name: keyed\ntasks:\n  - {id: a, type: noop}\n",
            "",
            "release-42",
        ))
        .await
        .expect("A starts")
        .into_inner();
    let again = cluster
        .client
        .start_execution(spec(
            "name: keyed\ntasks:\n  - {id: a, type: noop}\n",
            "",
            "release-42",
        ))
        .await
        .expect("A starts again")
        .into_inner();
    assert_eq!(
        (again.execution_id.as_str(), again.created),
        (first.execution_id.as_str(), false)
    );
    let in_b = b
        .start_execution(spec(
            "name: keyed\ntasks:\n  - {id: a, type: noop}\n",
            "",
            "release-42",
        ))
        .await
        .expect("B starts")
        .into_inner();
    assert!(
        in_b.created && in_b.execution_id != first.execution_id,
        "{in_b:?}"
    );
    reaches_its_question(&mut cluster, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_cap_concurrency_refuse_failure_actions_and_checkpoints() {
    let mut cluster = start().await;
    let mut small = client(&cluster, Some(TOKEN_SMALL)).await;
    // writer_pro allows retry only: every other action is named where the plan uses it.
    let refused = small
        .start_execution(spec(
            "name: escalating\noptions: {failure: {default_action: skip}}\ntasks:\n  - {id: a, type: noop, on_failure: [{retry: {max: 1}}, reassign]}\n",
            "",
            "",
        ))
        .await
        .expect_err("reassign and skip are not allowed in small");
    assert_eq!(refused.code(), Code::PermissionDenied);
    for place in [
        "options.failure.default_action: failure action `skip`",
        "tasks[0] (a).on_failure[1]: failure action `reassign`",
    ] {
        assert!(refused.message().contains(place), "{}", refused.message());
    }
    // A plan asking for 8 at once runs with the quota's 2.
    let tasks: String = (0..6)
        .map(|i| format!("  - {{id: t{i}, type: sleep, input: {{ms: 200}}}}\n"))
        .collect();
    let started = small
        .start_execution(spec(
            &format!("name: wide\noptions: {{max_concurrency: 8}}\ntasks:\n{tasks}"),
            "",
            "",
        ))
        .await
        .expect("the plan is allowed")
        .into_inner();
    let mut ops_cluster_client = client(&cluster, Some(TOKEN_OPS)).await;
    std::mem::swap(&mut cluster.client, &mut ops_cluster_client);
    let run = cluster
        .wait(&started.execution_id, Duration::from_secs(60))
        .await;
    std::mem::swap(&mut cluster.client, &mut ops_cluster_client);
    assert_eq!(run.state(), ExecutionState::Completed);
    assert_eq!(run.max_running(|_| true), 2, "{:?}", run.timeline());
    let Some(Kind::ExecutionStarted(recorded)) = run.events[0].kind.clone() else {
        panic!("the log starts with ExecutionStarted");
    };
    assert_eq!(recorded.max_concurrency_cap, Some(2));
    assert_eq!(
        recorded.options.map(|o| o.namespace),
        Some("small".to_owned())
    );
    // core allows no checkpoints: refused at once, before any call to the store.
    let mut tiny = client(&cluster, Some(TOKEN_TINY)).await;
    let id = tiny
        .start_execution(spec("name: t\ntasks:\n  - {id: a, type: noop}\n", "", ""))
        .await
        .expect("core may run sequential plans")
        .into_inner()
        .execution_id;
    let refused = tiny
        .checkpoint_execution(v1::CheckpointExecutionRequest { execution_id: id })
        .await
        .expect_err("core has no checkpoints");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains("checkpoints are not enabled for namespace \"tiny\""),
        "{}",
        refused.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_over_the_limit_are_refused_or_fail_their_attempt() {
    let mut cluster = start().await;
    // noop completes with its input as output: 2,000 bytes against a limit of 1,024.
    let big = "x".repeat(2000);
    let run = cluster
        .run(&format!(
            "name: big\ntasks:\n  - {{id: echo, type: noop, input: {{text: {big}}}}}\n"
        ))
        .await;
    assert_eq!(run.state(), ExecutionState::Failed, "{:?}", run.execution);
    let error = run
        .graph
        .nodes
        .iter()
        .filter_map(|n| n.record.as_ref())
        .find(|r| r.task_id == "echo")
        .and_then(|r| r.error.clone())
        .unwrap_or_default();
    assert!(
        error.contains("over the deployment's limit of 1024 bytes"),
        "{error}"
    );
    // An answer over the limit is refused and the question stays open.
    let id = cluster.start_plan(SLOW).await;
    let execution = cluster
        .wait_until(&id, "its question", |e| !e.open_questions.is_empty())
        .await;
    let question = execution.open_questions[0]
        .question
        .as_ref()
        .map(|q| q.question_id.clone())
        .unwrap_or_default();
    let refused = cluster
        .client
        .answer_question(v1::AnswerQuestionRequest {
            execution_id: id.clone(),
            question_id: question,
            answer: "y".repeat(1025),
            answered_by: "test".to_owned(),
        })
        .await
        .expect_err("too long");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().contains("limits.max_payload_bytes"),
        "{}",
        refused.message()
    );
    assert_eq!(cluster.execution(&id).await.open_questions.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_port_speaks_tls_and_requires_client_certificates() {
    let pki = trellis_testkit::TestPki::new().expect("test certificates");
    let server = trellis_grpc::ServerArgs {
        tls_cert: Some(pki.server().0),
        tls_key: Some(pki.server().1),
        tls_client_ca: Some(pki.ca()),
        access_file: None,
    }
    .load()
    .expect("the certificates load");
    let trusted = trellis_grpc::ClientArgs {
        client_tls_ca: Some(pki.ca()),
        client_tls_cert: Some(pki.client().0),
        client_tls_key: Some(pki.client().1),
        ..trellis_grpc::ClientArgs::default()
    };
    let mut cluster = cluster::start_setup(
        1,
        HandlerRegistry::with_builtins,
        Setup {
            security: server,
            client: trusted.load().expect("the client certificates load"),
            https: true,
            ..Setup::default()
        },
    )
    .await;
    let run = cluster
        .run("name: secure\ntasks:\n  - {id: a, type: noop}\n")
        .await;
    assert_eq!(run.state(), ExecutionState::Completed);
    let port = cluster
        .url
        .rsplit(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    // Plain HTTP/2, an untrusted client certificate, or none: no call goes through.
    let attempts = [
        (
            format!("http://127.0.0.1:{port}"),
            trellis_grpc::ClientArgs::default(),
        ),
        (
            cluster.url.clone(),
            trellis_grpc::ClientArgs {
                client_tls_ca: Some(pki.ca()),
                ..trellis_grpc::ClientArgs::default()
            },
        ),
        (
            cluster.url.clone(),
            trellis_grpc::ClientArgs {
                client_tls_ca: Some(pki.ca()),
                client_tls_cert: Some(pki.stranger().0),
                client_tls_key: Some(pki.stranger().1),
                ..trellis_grpc::ClientArgs::default()
            },
        ),
    ];
    for (url, args) in attempts {
        let security = args.load().expect("the files load");
        let outcome = match security.connect(&url).await {
            Err(err) => Err(err.to_string()),
            Ok(channel) => CoordinatorClient::new(channel)
                .list_executions(v1::ListExecutionsRequest::default())
                .await
                .map(drop)
                .map_err(|status| status.to_string()),
        };
        assert!(outcome.is_err(), "{url} with {args:?} went through");
    }
}
