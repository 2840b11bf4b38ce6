//! `RunExecution`: a start and its observation in one call.

use std::time::Duration;

use tonic::Code;
use trellis_proto::v1::{self, ExecutionState};

use crate::cluster;

/// What one `RunExecution` stream carried: the start's answer and every later item.
struct Ran {
    started: v1::StartExecutionResponse,
    items: Vec<v1::ObserveExecutionResponse>,
}

impl Ran {
    fn sequences(&self) -> Vec<u64> {
        self.items
            .iter()
            .filter_map(|item| item.event.as_ref().map(|event| event.sequence))
            .collect()
    }

    fn last_state(&self) -> Option<ExecutionState> {
        let progress = self.items.iter().rev().find_map(|i| i.progress.as_ref())?;
        ExecutionState::try_from(progress.state).ok()
    }
}

async fn run(
    cluster: &mut cluster::Cluster,
    start: v1::StartExecutionRequest,
    progress_only: bool,
) -> Result<Ran, tonic::Status> {
    let request = v1::RunExecutionRequest {
        start: Some(start),
        progress_only,
    };
    let mut stream = cluster.client.run_execution(request).await?.into_inner();
    let follow = async {
        let first = stream.message().await?.expect("a first item");
        let started = first.started.expect("the first item names the execution");
        assert!(
            first.observed.is_none(),
            "the first item is the start alone"
        );
        let mut items = Vec::new();
        while let Some(item) = stream.message().await? {
            assert!(
                item.started.is_none(),
                "only the first item names the start"
            );
            items.push(item.observed.expect("every later item is an observer's"));
        }
        Ok(Ran { started, items })
    };
    tokio::time::timeout(Duration::from_secs(20), follow)
        .await
        .expect("the run ends within 20 s")
}

const CHAIN: &str =
    "name: chain\ntasks:\n- {id: a, type: noop}\n- {id: b, type: noop, depends_on: [a]}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_execution_starts_and_follows_every_event_to_the_end() {
    let mut cluster = cluster::start(1).await;
    let ran = run(&mut cluster, cluster::spec(CHAIN, "", ""), false)
        .await
        .expect("the run");
    assert!(ran.started.created);
    assert_eq!(ran.last_state(), Some(ExecutionState::Completed));
    let execution = cluster
        .client
        .get_execution(v1::GetExecutionRequest {
            execution_id: ran.started.execution_id.clone(),
        })
        .await
        .expect("the execution it names")
        .into_inner()
        .execution
        .expect("an execution");
    assert_eq!(execution.state, ExecutionState::Completed as i32);
    let expected: Vec<u64> = (1..=execution.last_sequence).collect();
    assert_eq!(ran.sequences(), expected, "every event once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_execution_with_progress_only_ends_with_the_final_progress() {
    let mut cluster = cluster::start(1).await;
    let ran = run(&mut cluster, cluster::spec(CHAIN, "", ""), true)
        .await
        .expect("the run");
    assert!(
        ran.items.iter().all(|item| item.event.is_none()),
        "no events"
    );
    assert_eq!(ran.last_state(), Some(ExecutionState::Completed));
    let counts = ran.items.last().and_then(|i| i.progress.as_ref()?.counts);
    assert_eq!(counts.map(|c| c.completed), Some(2), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_execution_with_a_used_idempotency_key_follows_the_first_execution() {
    let mut cluster = cluster::start(1).await;
    let first = run(&mut cluster, cluster::spec(CHAIN, "", "nightly"), true)
        .await
        .expect("the first run");
    let again = run(&mut cluster, cluster::spec(CHAIN, "", "nightly"), false)
        .await
        .expect("the same key again");
    assert!(first.started.created && !again.started.created);
    assert_eq!(first.started.execution_id, again.started.execution_id);
    assert_eq!(again.last_state(), Some(ExecutionState::Completed));
    assert_eq!(
        again.sequences().first(),
        Some(&1),
        "its history from the start"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_execution_refuses_a_bad_request_and_starts_nothing() {
    let mut cluster = cluster::start(1).await;
    let missing = cluster
        .client
        .run_execution(v1::RunExecutionRequest {
            start: None,
            progress_only: true,
        })
        .await
        .map(|_| ())
        .expect_err("a run without its start");
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(
        missing.message().starts_with("start: missing"),
        "{missing:?}"
    );
    let bad = run(
        &mut cluster,
        cluster::spec(
            "name: bad\ntasks:\n- {id: a, type: noop, depends_on: [nowhere]}\n",
            "",
            "",
        ),
        true,
    )
    .await
    .map(|_| ())
    .expect_err("a plan with a dangling dependency");
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().contains("nowhere"), "{bad:?}");
    let listed = cluster
        .client
        .list_executions(v1::ListExecutionsRequest::default())
        .await
        .expect("a list")
        .into_inner();
    assert!(listed.executions.is_empty(), "{listed:?}");
}
