//! The planner service over real gRPC on a loopback port: compile, analyse, errors as answers,
//! malformed requests refused, health reported.

mod backlog;

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use trellis_core::plan::Limits;
use trellis_proto::v1;
use trellis_proto::v1::planner_client::PlannerClient;

/// A planner on a free port, stopped on drop.
struct Served {
    client: PlannerClient<Channel>,
    channel: Channel,
    shutdown: CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn serve(limits: Limits) -> Served {
    serve_config(trellis_planner::Config {
        limits,
        ..trellis_planner::Config::default()
    })
    .await
}

async fn serve_config(config: trellis_planner::Config) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move { trellis_planner::run(listener, config, token).await });
    let endpoint = Channel::from_shared(format!("http://{addr}")).expect("a valid URL");
    let mut tries = 0;
    let channel = loop {
        match endpoint.connect().await {
            Ok(channel) => break channel,
            Err(e) if tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = e;
            }
            Err(e) => panic!("the planner did not start: {e}"),
        }
    };
    Served {
        client: PlannerClient::new(channel.clone()),
        channel,
        shutdown,
    }
}

fn spec(text: &str) -> v1::PlanSpec {
    v1::PlanSpec {
        text: text.to_owned(),
        format: v1::PlanFormat::Yaml.into(),
        source_name: "test.yaml".to_owned(),
        params: Default::default(),
    }
}

const PLAN: &str = "name: svc\ntasks:\n\
    - {id: schema, type: noop, files: [{path: db.sql, op: UPDATE}]}\n\
    - {id: api, type: noop, depends_on: [schema], files: [{path: api.rs, op: UPDATE}]}\n\
    - {id: ui, type: noop, depends_on: [schema], files: [{path: api.rs, op: UPDATE}]}\n";

#[tokio::test]
async fn compiles_a_valid_plan_into_its_wire_form() {
    let mut served = serve(Limits::default()).await;
    let response = served
        .client
        .compile_plan(v1::CompilePlanRequest {
            spec: Some(spec(PLAN)),
        })
        .await
        .expect("a well-formed request")
        .into_inner();
    let Some(v1::compile_plan_response::Result::Plan(plan)) = response.result else {
        panic!("expected a plan, got {response:?}");
    };
    assert_eq!(plan.name, "svc");
    let ids: Vec<&str> = plan.tasks.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["schema", "api", "ui"]);
    assert_eq!(plan.tasks[2].depends_on, ["schema"]);
}

#[tokio::test]
async fn returns_every_error_with_its_path_as_an_answer() {
    let mut served = serve(Limits::default()).await;
    let broken = "name: broken\ntasks:\n\
        - {id: a, type: noop, depends_on: [b]}\n\
        - {id: a, type: noop}\n\
        - {id: c, type: noop, timeout: soon}\n";
    let response = served
        .client
        .compile_plan(v1::CompilePlanRequest {
            spec: Some(spec(broken)),
        })
        .await
        .expect("a broken plan is an answer, not a gRPC error")
        .into_inner();
    let Some(v1::compile_plan_response::Result::Errors(errors)) = response.result else {
        panic!("expected errors, got {response:?}");
    };
    let paths: Vec<&str> = errors.errors.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"tasks[0].depends_on[0]"), "{paths:?}");
    assert!(paths.contains(&"tasks[1].id"), "{paths:?}");
    assert!(paths.contains(&"tasks[2].timeout"), "{paths:?}");
}

#[tokio::test]
async fn analyses_specs_and_compiled_plans_alike() {
    let mut served = serve(Limits::default()).await;
    let from_spec = served
        .client
        .analyze_plan(v1::AnalyzePlanRequest {
            plan_source: Some(v1::analyze_plan_request::PlanSource::Spec(spec(PLAN))),
        })
        .await
        .expect("a well-formed request")
        .into_inner();
    let Some(v1::analyze_plan_response::Result::Analysis(analysis)) = from_spec.result else {
        panic!("expected an analysis, got {from_spec:?}");
    };
    let waves: Vec<Vec<&str>> = analysis
        .waves
        .iter()
        .map(|w| w.task_ids.iter().map(String::as_str).collect())
        .collect();
    assert_eq!(waves, vec![vec!["schema"], vec!["api", "ui"]]);
    assert_eq!(analysis.critical_path, ["schema", "api"]);
    assert_eq!(analysis.max_parallelism, 1, "api and ui share api.rs");
    assert_eq!(analysis.blocked.len(), 1);
    assert_eq!(analysis.blocked[0].task_id, "ui");
    assert_eq!(analysis.blocked[0].blocked_by, ["api"]);
    assert_eq!(analysis.blocked[0].wave, 2);

    let plan = trellis_wire::plan::to_proto(
        &trellis_core::plan::compile_str(PLAN, &Limits::default()).expect("compiles"),
    );
    let from_plan = served
        .client
        .analyze_plan(v1::AnalyzePlanRequest {
            plan_source: Some(v1::analyze_plan_request::PlanSource::Plan(plan)),
        })
        .await
        .expect("a well-formed request")
        .into_inner();
    assert_eq!(
        from_plan.result,
        Some(v1::analyze_plan_response::Result::Analysis(analysis))
    );
}

#[tokio::test]
async fn refuses_malformed_requests_and_enforces_limits() {
    let mut served = serve(Limits {
        max_tasks: 2,
        ..Limits::default()
    })
    .await;
    let status = served
        .client
        .compile_plan(v1::CompilePlanRequest { spec: None })
        .await
        .expect_err("no spec");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("spec"), "{}", status.message());
    let status = served
        .client
        .analyze_plan(v1::AnalyzePlanRequest { plan_source: None })
        .await
        .expect_err("no plan source");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    let response = served
        .client
        .compile_plan(v1::CompilePlanRequest {
            spec: Some(spec(PLAN)),
        })
        .await
        .expect("an over-large plan is an answer")
        .into_inner();
    let Some(v1::compile_plan_response::Result::Errors(errors)) = response.result else {
        panic!("expected the task limit to refuse the plan, got {response:?}");
    };
    assert!(
        errors.errors[0].message.contains("limit"),
        "{:?}",
        errors.errors
    );
}

#[tokio::test]
async fn reports_serving_on_grpc_health() {
    let served = serve(Limits::default()).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(served.channel.clone());
    let response = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "trellis.v1.Planner".to_owned(),
        })
        .await
        .expect("the health service answers")
        .into_inner();
    assert_eq!(
        response.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn with_an_access_file_only_holders_of_a_valid_token_compile() {
    let access = trellis_grpc::AccessPolicy::parse(
        &format!(
            "namespaces: {{team-a: {{}}}}\n\
             tokens: [{{name: a, namespace: team-a, sha256: {}}}]\n\
             limits: {{max_tasks: 2}}\n",
            trellis_grpc::access::token_digest("planner-token-1")
        ),
        "access.yaml",
    )
    .expect("a valid access file");
    let limits = access.limits().plan();
    let served = serve_config(trellis_planner::Config {
        limits,
        security: trellis_grpc::ServerSecurity {
            access: Some(std::sync::Arc::new(access)),
            ..trellis_grpc::ServerSecurity::default()
        },
        ..trellis_planner::Config::default()
    })
    .await;
    let request = |token: Option<&str>| {
        let mut request = tonic::Request::new(v1::CompilePlanRequest {
            spec: Some(spec(PLAN)),
        });
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("an ASCII header"),
            );
        }
        request
    };
    for token in [None, Some("not-the-token")] {
        let status = served
            .client
            .clone()
            .compile_plan(request(token))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{token:?}");
    }
    // The holder of the token is served, under the access file's limits: 3 tasks > 2.
    let response = served
        .client
        .clone()
        .compile_plan(request(Some("planner-token-1")))
        .await
        .expect("a valid token is let in")
        .into_inner();
    let Some(v1::compile_plan_response::Result::Errors(errors)) = response.result else {
        panic!("a plan over the access file's max_tasks compiled: {response:?}");
    };
    assert!(
        errors
            .errors
            .iter()
            .any(|e| e.message == "plan has 3 tasks, over the limit of 2"),
        "{errors:?}"
    );
    // Health stays open: load balancers and probes carry no token.
    let mut health = tonic_health::pb::health_client::HealthClient::new(served.channel.clone());
    assert!(
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .is_ok()
    );
}
