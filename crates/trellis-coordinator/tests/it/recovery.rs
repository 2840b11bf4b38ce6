//! Recovery, failover and runs, end to end: coordinators are stopped mid-execution and others
//! (or the same one again) finish the work from the event log.

use std::collections::HashMap;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use trellis_agent_worker::HandlerRegistry;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_proto::v1::{self, ExecutionState};
use trellis_testkit::NatsServer;

use crate::cluster::spec;

/// Shards of the coordinators here: more than one, so results are routed per shard.
const SHARDS: u32 = 4;

/// Starts one in-process worker that knows the shard count (workers that honour the assignment's
/// shard do not need it).
fn spawn_worker(
    nats_url: &str,
    worker_id: &str,
    registry: HandlerRegistry,
    token: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut config = trellis_agent_worker::Config::new(nats_url.to_owned());
    config.worker_id = Some(worker_id.to_owned());
    config.slots = 64;
    config.shards = SHARDS;
    config.queues = registry.task_types();
    tokio::spawn(async move {
        if let Err(err) = trellis_agent_worker::run(config, registry, token).await {
            panic!("worker failed: {err}");
        }
    })
}

/// One coordinator process stand-in: its own token, so it can be stopped alone.
struct Coordinator {
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    client: CoordinatorClient<Channel>,
}

impl Coordinator {
    async fn start(nats_url: &str, id: &str, lease_ttl: Duration) -> Coordinator {
        Self::start_with(nats_url, id, lease_ttl, |_| {}).await
    }

    /// A coordinator with settings of its own besides.
    async fn start_with(
        nats_url: &str,
        id: &str,
        lease_ttl: Duration,
        adjust: impl FnOnce(&mut trellis_coordinator::Config),
    ) -> Coordinator {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .try_init();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("bound address");
        let mut config = trellis_coordinator::Config {
            nats: trellis_bus::NatsOptions::new(nats_url),
            shards: SHARDS,
            id: id.to_owned(),
            lease_ttl,
            ..trellis_coordinator::Config::default()
        };
        adjust(&mut config);
        let token = CancellationToken::new();
        let run_token = token.clone();
        let task = tokio::spawn(async move {
            if let Err(err) = trellis_coordinator::run(config, listener, run_token).await {
                panic!("coordinator failed: {err}");
            }
        });
        let url = format!("http://{addr}");
        for _ in 0..200 {
            if let Ok(mut client) = CoordinatorClient::connect(url.clone()).await {
                // Any answer means it serves, which it does once its first lease round is done.
                let answered = client
                    .list_executions(v1::ListExecutionsRequest::default())
                    .await
                    .is_ok();
                if answered {
                    return Coordinator {
                        token,
                        task,
                        client,
                    };
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("coordinator {id} did not come up at {url}");
    }

    /// Stops it while it works: its gRPC task is aborted and its executor and lease keeper see
    /// the token cancelled, so its leases are released as on SIGTERM (the system tests SIGKILL
    /// coordinator processes for the other case).
    fn crash(self) {
        self.task.abort();
        self.token.cancel();
    }
}

async fn get(client: &mut CoordinatorClient<Channel>, id: &str) -> Option<v1::Execution> {
    client
        .get_execution(v1::GetExecutionRequest {
            execution_id: id.to_owned(),
        })
        .await
        .ok()
        .and_then(|r| r.into_inner().execution)
}

async fn wait_for(
    client: &mut CoordinatorClient<Channel>,
    id: &str,
    what: &str,
    condition: impl Fn(&v1::Execution) -> bool,
) -> v1::Execution {
    for _ in 0..1200 {
        if let Some(execution) = get(client, id).await
            && condition(&execution)
        {
            return execution;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("execution {id}: {what} did not happen within 60 s");
}

fn terminal(e: &v1::Execution) -> bool {
    matches!(
        ExecutionState::try_from(e.state),
        Ok(ExecutionState::Completed | ExecutionState::Failed | ExecutionState::Cancelled)
    )
}

fn completed_count(e: &v1::Execution) -> u64 {
    e.progress.as_ref().map_or(0, |p| p.done)
}

/// Checks the finished tree: every instance completed, and every group resumed its parent
/// exactly once.
async fn check_tree(client: &mut CoordinatorClient<Channel>, id: &str, expected: usize) {
    let graph = client
        .get_execution_graph(v1::GetExecutionGraphRequest {
            execution_id: id.to_owned(),
            run_number: 0,
        })
        .await
        .expect("graph")
        .into_inner()
        .graph
        .expect("graph");
    let records: Vec<_> = graph
        .nodes
        .iter()
        .filter_map(|n| n.record.as_ref())
        .collect();
    let completed = records
        .iter()
        .filter(|r| r.state == v1::TaskState::Completed as i32)
        .count();
    assert_eq!(
        completed, expected,
        "every task instance (and the root) completed, none lost"
    );
    let mut resumed: HashMap<&str, usize> = HashMap::new();
    for record in &records {
        if let Some(group) = record.resumed_after_subtasks_group_id.as_deref() {
            *resumed.entry(group).or_default() += 1;
        }
    }
    assert!(!resumed.is_empty(), "the plan has groups");
    for (group, n) in resumed {
        assert_eq!(n, 1, "group {group} resumed its parent {n} times");
    }
}

/// 8 parents × 250 subtasks, each parent resumed after its group: 2,017 instances with the root.
const FANOUT_PLAN: &str = "name: fan\ntasks:\n\
- {id: p1, type: fanout, input: {count: 250, child: {type: sleep, input: {ms: 2}}}}\n\
- {id: p2, type: fanout, input: {count: 250, child: {type: sleep, input: {ms: 2}}}}\n\
- {id: p3, type: fanout, input: {count: 250, child: {type: sleep, input: {ms: 2}}}}\n\
- {id: p4, type: fanout, input: {count: 250, child: {type: sleep, input: {ms: 2}}}}\n\
- {id: p5, type: fanout, input: {count: 250, child: {type: sleep, input: {ms: 2}}}}\n\
- {id: p6, type: fanout, input: {count: 250, child: {type: sleep, input: {ms: 2}}}}\n\
- {id: p7, type: fanout, input: {count: 250, child: {type: sleep, input: {ms: 2}}}}\n\
- {id: p8, type: fanout, input: {count: 250, child: {type: sleep, input: {ms: 2}}}}\n";
const FANOUT_INSTANCES: usize = 1 + 8 + 8 * 250 + 8;

/// The same fan-out, each subtask sleeping 300 ms: about five seconds of work for two workers of
/// 64 slots, long enough to run through a coordinator joining and another stopping.
fn slow_fanout_plan() -> String {
    FANOUT_PLAN.replace("ms: 2}", "ms: 300}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_coordinator_recovers_its_executions_from_the_log() {
    let nats =
        NatsServer::start().expect("a nats-server for the test (apt-get install nats-server)");
    let shutdown = CancellationToken::new();
    let _guard = shutdown.clone().drop_guard();
    for i in 0..2 {
        spawn_worker(
            &nats.url(),
            &format!("worker-{i}"),
            HandlerRegistry::with_builtins(),
            shutdown.child_token(),
        );
    }
    let mut first = Coordinator::start(&nats.url(), "coordinator-a", Duration::from_secs(2)).await;
    let id = first
        .client
        .start_execution(spec(FANOUT_PLAN, "", ""))
        .await
        .expect("execution starts")
        .into_inner()
        .execution_id;
    wait_for(&mut first.client, &id, "a third of the work", |e| {
        completed_count(e) > (FANOUT_INSTANCES / 3) as u64
    })
    .await;
    first.crash();

    // The same coordinator comes back: it takes its leases back at once and recovers.
    let mut second = Coordinator::start(&nats.url(), "coordinator-a", Duration::from_secs(2)).await;
    let done = wait_for(&mut second.client, &id, "the end", terminal).await;
    assert_eq!(
        ExecutionState::try_from(done.state),
        Ok(ExecutionState::Completed),
        "{}",
        done.reason
    );
    check_tree(&mut second.client, &id, FANOUT_INSTANCES).await;
    second.token.cancel();
}

/// Runs `start` with `RunExecution` to its end: the start's answer and the last progress's state.
async fn run_keyed(
    client: &mut CoordinatorClient<Channel>,
    start: v1::StartExecutionRequest,
) -> (v1::StartExecutionResponse, Option<i32>) {
    let request = v1::RunExecutionRequest {
        start: Some(start),
        progress_only: true,
    };
    let mut stream = client
        .run_execution(request)
        .await
        .expect("a keyed run")
        .into_inner();
    let started = stream
        .message()
        .await
        .expect("the run's stream")
        .and_then(|first| first.started)
        .expect("the first item names the execution");
    let mut last_state = None;
    while let Some(item) = stream.message().await.expect("the run's stream") {
        if let Some(progress) = item.observed.and_then(|observed| observed.progress) {
            last_state = Some(progress.state);
        }
    }
    (started, last_state)
}

/// Observes an execution to its `ExecutionFinished`, reopening the stream from the next sequence
/// whenever it breaks (as `trellis events --follow` does); returns the sequences received and how
/// many times the stream was reopened.
async fn follow(mut client: CoordinatorClient<Channel>, id: String) -> (Vec<u64>, usize) {
    let mut sequences = Vec::new();
    let mut reopened = 0;
    loop {
        let from = sequences.last().map_or(1, |last| last + 1);
        let request = v1::ObserveExecutionRequest {
            execution_id: id.clone(),
            from_sequence: from,
            progress_only: false,
        };
        if let Ok(response) = client.observe_execution(request).await {
            let mut stream = response.into_inner();
            while let Ok(Some(item)) = stream.message().await {
                let Some(event) = item.event else { continue };
                sequences.push(event.sequence);
                if matches!(event.kind, Some(v1::event::Kind::ExecutionFinished(_))) {
                    return (sequences, reopened);
                }
            }
        }
        reopened += 1;
        assert!(reopened < 100, "the stream of {id} broke 100 times");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `GetCluster` through `client` shows each coordinator of `ids` holding `each`
/// shards and no shard unheld.
async fn wait_for_balance(client: &mut CoordinatorClient<Channel>, ids: &[&str], each: usize) {
    let mut last = None;
    for _ in 0..400 {
        if let Ok(cluster) = client.get_cluster(v1::GetClusterRequest {}).await {
            let cluster = cluster.into_inner();
            let held: Vec<(String, usize)> = cluster
                .coordinators
                .iter()
                .map(|c| (c.coordinator_id.clone(), c.shards.len()))
                .collect();
            let balanced = cluster.unowned_shards.is_empty()
                && held.len() == ids.len()
                && held
                    .iter()
                    .all(|(id, n)| ids.contains(&id.as_str()) && *n == each);
            if balanced {
                return;
            }
            last = Some(held);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the shards were not spread {each} to each of {ids:?} within 20 s: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_coordinator_takes_half_the_shards_answers_for_the_first_and_finishes_its_work() {
    let nats =
        NatsServer::start().expect("a nats-server for the test (apt-get install nats-server)");
    let shutdown = CancellationToken::new();
    let _guard = shutdown.clone().drop_guard();
    for i in 0..2 {
        spawn_worker(
            &nats.url(),
            &format!("worker-{i}"),
            HandlerRegistry::with_builtins(),
            shutdown.child_token(),
        );
    }
    let ttl = Duration::from_millis(1500);
    let mut first = Coordinator::start(&nats.url(), "coordinator-a", ttl).await;
    wait_for_balance(&mut first.client, &["coordinator-a"], SHARDS as usize).await;
    // The fan-out runs on shard 0 or 1, which the first keeps when it hands its highest shards
    // over: an observer through the second is then forwarded to the first until it crashes.
    let id = loop {
        let id = first
            .client
            .start_execution(spec(&slow_fanout_plan(), "", ""))
            .await
            .expect("execution starts")
            .into_inner()
            .execution_id;
        if trellis_proto::subjects::shard_of(&id, SHARDS) < SHARDS / 2 {
            break id;
        }
        first
            .client
            .cancel_execution(v1::CancelExecutionRequest {
                execution_id: id,
                reason: "on a shard the first coordinator hands over".to_owned(),
            })
            .await
            .expect("cancel");
    };
    // A second coordinator joins while it runs: the first hands half its shards over.
    let mut second = Coordinator::start(&nats.url(), "coordinator-b", ttl).await;
    wait_for_balance(
        &mut second.client,
        &["coordinator-a", "coordinator-b"],
        SHARDS as usize / 2,
    )
    .await;
    // A start with an idempotency key lands on the key's shard, whichever coordinator is
    // asked: the second ask finds the first's execution.
    for key in ["key-1", "key-2", "key-3"] {
        let keyed = spec("name: keyed\ntasks:\n- {id: t, type: noop}\n", "", key);
        let once = first
            .client
            .start_execution(keyed.clone())
            .await
            .expect("a keyed start")
            .into_inner();
        let again = second
            .client
            .start_execution(keyed.clone())
            .await
            .expect("the same keyed start elsewhere")
            .into_inner();
        assert!(
            once.created && !again.created,
            "{key}: {once:?} then {again:?}"
        );
        assert_eq!(once.execution_id, again.execution_id, "{key}");
        // So does a run, forwarded when the other holds the key's shard, and followed there.
        let (started, last_state) = run_keyed(&mut second.client, keyed).await;
        assert!(!started.created, "{key}: {started:?}");
        assert_eq!(started.execution_id, once.execution_id, "{key}");
        assert_eq!(last_state, Some(ExecutionState::Completed as i32), "{key}");
    }
    // An observer through the second coordinator follows the fan-out to its end, through the
    // crash below, resuming from the last sequence it saw whenever its stream breaks.
    let observer = tokio::spawn(follow(second.client.clone(), id.clone()));
    // Either coordinator answers for any execution: started through the second one, read
    // through the first, whichever holds its shard.
    let mut through_second = Vec::new();
    for n in 0..8 {
        let started = second
            .client
            .start_execution(spec(
                &format!("name: small-{n}\ntasks:\n- {{id: t, type: noop}}\n"),
                "",
                "",
            ))
            .await
            .expect("a start through either coordinator lands on a held shard")
            .into_inner();
        assert!(started.created);
        through_second.push(started.execution_id);
    }
    for small in &through_second {
        let done = wait_for(
            &mut first.client,
            small,
            "the end, read through the first",
            terminal,
        )
        .await;
        assert_eq!(
            ExecutionState::try_from(done.state),
            Ok(ExecutionState::Completed)
        );
    }
    let running = wait_for(&mut second.client, &id, "a third of the work", |e| {
        completed_count(e) > (FANOUT_INSTANCES / 3) as u64
    })
    .await;
    assert!(
        !terminal(&running),
        "the fan-out ended before the first coordinator stopped; make its subtasks slower"
    );
    first.crash();

    // The survivor takes every shard once the stopped one released them, and finishes.
    wait_for_balance(&mut second.client, &["coordinator-b"], SHARDS as usize).await;
    let done = wait_for(&mut second.client, &id, "the end on the survivor", terminal).await;
    assert_eq!(
        ExecutionState::try_from(done.state),
        Ok(ExecutionState::Completed),
        "{}",
        done.reason
    );
    check_tree(&mut second.client, &id, FANOUT_INSTANCES).await;
    let (sequences, reopened) = tokio::time::timeout(Duration::from_secs(60), observer)
        .await
        .expect("the observer reaches the end")
        .expect("the observer task");
    assert!(
        reopened > 0,
        "the observer's stream went through the first coordinator, which stopped: it must have \
         been reopened"
    );
    let expected: Vec<u64> = (1..=done.last_sequence).collect();
    assert_eq!(
        sequences, expected,
        "the observer saw every event once, in order ({reopened} reopenings)"
    );
    eprintln!(
        "the observer saw {} events, reopening its stream {reopened} times",
        sequences.len()
    );
    second.token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_runs_again_only_what_did_not_complete() {
    let nats =
        NatsServer::start().expect("a nats-server for the test (apt-get install nats-server)");
    let shutdown = CancellationToken::new();
    let _guard = shutdown.clone().drop_guard();
    spawn_worker(
        &nats.url(),
        "worker-0",
        HandlerRegistry::with_builtins(),
        shutdown.child_token(),
    );
    let mut coordinator = Coordinator::start(&nats.url(), "solo", Duration::from_secs(2)).await;
    let plan = "name: runs\ntasks:\n\
- {id: quick, type: noop}\n\
- {id: slow, type: sleep, input: {ms: 400}, depends_on: [quick]}\n";
    let id = coordinator
        .client
        .start_execution(spec(plan, "", ""))
        .await
        .expect("execution starts")
        .into_inner()
        .execution_id;
    wait_for(&mut coordinator.client, &id, "quick done", |e| {
        completed_count(e) >= 1
    })
    .await;
    coordinator
        .client
        .cancel_execution(v1::CancelExecutionRequest {
            execution_id: id.clone(),
            reason: "test".to_owned(),
        })
        .await
        .expect("cancel");
    wait_for(&mut coordinator.client, &id, "cancelled", terminal).await;

    let run = coordinator
        .client
        .retry_execution(v1::RetryExecutionRequest {
            execution_id: id.clone(),
        })
        .await
        .expect("retry")
        .into_inner()
        .run_number;
    assert_eq!(run, 2);
    let done = wait_for(&mut coordinator.client, &id, "run 2 ends", terminal).await;
    assert_eq!(
        ExecutionState::try_from(done.state),
        Ok(ExecutionState::Completed),
        "{}",
        done.reason
    );
    assert_eq!(done.run_number, 2);

    // `quick` ran once, in run 1; `slow` was cancelled in run 1 and completed in run 2.
    let graph = coordinator
        .client
        .get_execution_graph(v1::GetExecutionGraphRequest {
            execution_id: id.clone(),
            run_number: 0,
        })
        .await
        .expect("graph")
        .into_inner()
        .graph
        .expect("graph");
    let runs_of = |task: &str| -> Vec<(u32, i32)> {
        let mut runs: Vec<_> = graph
            .nodes
            .iter()
            .filter_map(|n| n.record.as_ref())
            .filter(|r| r.task_id == task)
            .map(|r| (r.run_number, r.state))
            .collect();
        runs.sort();
        runs
    };
    assert_eq!(runs_of("quick"), [(1, v1::TaskState::Completed as i32)]);
    assert_eq!(
        runs_of("slow"),
        [
            (1, v1::TaskState::Cancelled as i32),
            (2, v1::TaskState::Completed as i32)
        ]
    );

    // A completed execution has nothing to run again.
    let refused = coordinator
        .client
        .retry_execution(v1::RetryExecutionRequest {
            execution_id: id.clone(),
        })
        .await
        .expect_err("nothing to retry");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    coordinator.token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_whose_messages_left_the_event_log_is_read_from_the_read_model() {
    let nats =
        NatsServer::start().expect("a nats-server for the test (apt-get install nats-server)");
    let shutdown = CancellationToken::new();
    let _guard = shutdown.clone().drop_guard();
    spawn_worker(
        &nats.url(),
        "worker-0",
        HandlerRegistry::with_builtins(),
        shutdown.child_token(),
    );
    // A store that removes a finished execution's messages a second after it ended.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let database = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("store.db").display()
    );
    let store_listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let store_url = format!("http://{}", store_listener.local_addr().expect("bound"));
    let store_config = trellis_checkpoint_store::Config {
        events_retention: Some(Duration::from_secs(1)),
        ..trellis_checkpoint_store::Config::new(database, nats.url())
    };
    let store_token = shutdown.child_token();
    tokio::spawn(async move {
        if let Err(err) =
            trellis_checkpoint_store::run(store_config, store_listener, store_token).await
        {
            panic!("checkpoint-store failed: {err}");
        }
    });
    // A coordinator that lets finished executions leave its memory at once.
    let mut coordinator = Coordinator::start_with(
        &nats.url(),
        "coordinator-a",
        Duration::from_secs(2),
        |config| {
            config.checkpoint_store = Some(store_url);
            config.keep_finished = Duration::ZERO;
        },
    )
    .await;
    let id = coordinator
        .client
        .start_execution(spec(
            "name: purged\ntasks:\n- {id: t, type: noop}\n",
            "",
            "",
        ))
        .await
        .expect("execution starts")
        .into_inner()
        .execution_id;
    wait_for(&mut coordinator.client, &id, "the end", terminal).await;

    // Its messages leave the log...
    let client = async_nats::connect(nats.url()).await.expect("NATS");
    let events = async_nats::jetstream::new(client)
        .get_stream(trellis_proto::subjects::EVENTS_STREAM)
        .await
        .expect("the event stream");
    let subject = trellis_proto::subjects::events(&id);
    let mut purged = false;
    for _ in 0..200 {
        let mut subjects = events
            .info_with_subjects(&subject)
            .await
            .expect("stream info");
        let mut messages = 0;
        while let Some(entry) = futures::StreamExt::next(&mut subjects).await {
            messages += entry.expect("a subject count").1;
        }
        if messages == 0 {
            purged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        purged,
        "the finished execution's messages stayed in the log"
    );
    // ...and it has left the coordinator's memory (finished ones are swept every second): the
    // read model answers for it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let execution = get(&mut coordinator.client, &id)
        .await
        .expect("GetExecution answers from the read model");
    assert_eq!(
        ExecutionState::try_from(execution.state),
        Ok(ExecutionState::Completed)
    );
    assert_eq!(execution.execution_id, id);
    coordinator.token.cancel();
}
