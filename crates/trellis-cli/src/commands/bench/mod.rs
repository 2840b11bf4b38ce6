//! `trellis bench`: the scenarios of docs/bench.md against a cluster this command starts itself (every
//! service, a NATS JetStream server with file storage; durability on, nothing mocked), one JSON
//! object per scenario on stdout, human-readable notes on stderr.

use std::time::{Duration, Instant};

use clap::Args;
use futures::StreamExt;
use serde_json::{Value, json};
use tonic::transport::Channel;
use trellis_proto::v1;
use trellis_proto::v1::coordinator_client::CoordinatorClient;
use trellis_telemetry::hops;

use super::Failure;
use crate::local;

mod checkpoint;
mod disk;
mod floor;
mod latency;
mod observers;
mod one;
mod parked;
mod processes;
mod recovery;
mod stored;
mod turns;

use checkpoint::checkpoint;
use floor::floor;
use latency::{latency, loaded};
use observers::observers;
use one::{run_one, run_one_split, start_plan, wait_completed};
use parked::parked;
use processes::{scale, soak};
use recovery::recovery;

/// A scenario's measurements, in output order.
type Fields = Vec<(&'static str, Value)>;

/// The scenarios, in the order they run by default.
const SCENARIOS: [&str; 12] = [
    "fanout",
    "chain",
    "throughput",
    "logs",
    "executions",
    "latency",
    "loaded",
    "parked",
    "floor",
    "checkpoint",
    "recovery",
    "observers",
];

/// How long a scenario's trailing acknowledgements are waited for before its disk flushes are
/// counted.
const SETTLE_BOUND: Duration = Duration::from_secs(30);

/// Scenarios whose `n` counts tasks: their lines say how many disk flushes each task cost.
const TASK_SCENARIOS: [&str; 7] = [
    "fanout",
    "chain",
    "throughput",
    "logs",
    "latency",
    "loaded",
    "floor",
];

/// Scenarios run only when named: they take minutes.
const LONG_SCENARIOS: [&str; 2] = ["soak", "scale"];

/// Measure Trellis on the scenarios of docs/bench.md.
#[derive(Debug, Args)]
#[command(
    long_about = "Measure Trellis on the scenarios of docs/bench.md.\n\n\
        Starts every service in this process with a NATS JetStream server of its own (file storage, \
        durability on), runs each scenario with `noop` tasks, and prints one JSON object per \
        scenario on stdout, for example\n  \
        {\"system\":\"trellis\",\"scenario\":\"fanout\",\"n\":10000,\"seconds\":0.84,\"tasks_per_s\":11905}\n\
        A scenario that fails prints {\"scenario\":...,\"error\":...} and the command exits 1.\n\n\
        As `trellis dev`, the process and its nats-server share the cores (TOKIO_WORKER_THREADS \
        and GOMAXPROCS override); each line's `threads` says how, and on which scheduler.",
    after_help = "Examples:\n  \
        trellis bench\n  \
        trellis bench --scenario fanout --n 10000\n  \
        trellis bench --scenario latency --scenario chain --workers 2"
)]
pub struct BenchArgs {
    /// A scenario to run (repeatable): fanout, chain, throughput, logs, executions, latency
    /// (with the median of each hop of one task), loaded (latency while throughput runs),
    /// parked (latency while 10,000 executions wait on a question), floor
    /// (the bare JetStream pipeline a task rides on, without Trellis), checkpoint, recovery,
    /// observers; and, only when named, soak (many executions of 100
    /// tasks through one coordinator process, its RSS before, at the peak and after
    /// --keep-finished) and scale (throughput and executions through 1, 2 and 3 coordinator
    /// processes). Default: all but soak and scale.
    #[arg(long = "scenario", value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(SCENARIOS.iter().chain(LONG_SCENARIOS.iter())))]
    pub scenarios: Vec<String>,
    /// The size of each scenario instead of its default.
    #[arg(long)]
    pub n: Option<usize>,
    /// In-process worker count.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Concurrent handlers per worker.
    #[arg(long, default_value_t = 256)]
    pub slots: usize,
    /// Live-stream clients of the observers scenario.
    #[arg(long, default_value_t = 1000)]
    pub observers: usize,
    /// How the nats-server started here writes to disk: `interval` (JetStream's default, a flush
    /// every two minutes) or `always` (every write flushed before it is acknowledged; needs
    /// nats-server 2.10 or newer). Every line says which, and the server's version.
    #[arg(long, value_enum, default_value_t = local::SyncMode::Interval)]
    pub sync: local::SyncMode,
    /// The in-process coordinator's dispatch window: most tasks of one execution dispatched and
    /// not yet started by a worker (0: no limit). Default: 128, or 256 with `--sync always`;
    /// every line says which. The coordinators the recovery, scale and soak scenarios start as
    /// processes take TRELLIS_DISPATCH_WINDOW or their default (128) instead.
    #[arg(long)]
    pub dispatch_window: Option<u32>,
    /// Workers publish every final result to the results stream instead of first handing it to
    /// the coordinator holding its shard (a core NATS request; the stream takes a stored write
    /// and a delivery). Either way a result counts once its events are stored.
    #[arg(long)]
    pub no_handoff: bool,
    /// The coordinator sends every assignment to the tasks stream instead of first offering a
    /// small execution's tasks to an idle worker (a core NATS request).
    #[arg(long)]
    pub no_offers: bool,
    /// Print JSON lines (the default and only format; accepted for compatibility).
    #[arg(long)]
    pub json: bool,
}

/// Runs `trellis bench`.
pub async fn run(args: BenchArgs) -> Result<(), Failure> {
    let any_port: std::net::SocketAddr = "127.0.0.1:0"
        .parse()
        .map_err(|_| Failure::failed("bad listen address"))?;
    let local = local::start(local::Options {
        nats_url: local::nats_from_env()?,
        listen: any_port,
        workers: args.workers,
        slots: args.slots,
        coordinator: true,
        // The observers scenario watches through the monitor, as browsers do.
        monitor: Some(local::MonitorOptions {
            listen: any_port,
            token: uuid::Uuid::new_v4().simple().to_string(),
        }),
        breakers: local::Breakers::default(),
        sync: args.sync,
        dispatch_window: args.dispatch_window,
        handoff: !args.no_handoff,
        offers: !args.no_offers,
    })
    .await?;
    let client = CoordinatorClient::connect(local.coordinator_url.clone())
        .await
        .map_err(|e| Failure::failed(format!("cannot reach the local coordinator: {e}")))?
        // As the CLI's client (`client::Coordinator`): an observation's first event carries a
        // large plan whole.
        .max_decoding_message_size(trellis_coordinator::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(trellis_coordinator::MAX_MESSAGE_BYTES);
    workers_heard(client.clone(), args.workers).await;
    let scenarios: Vec<&str> = if args.scenarios.is_empty() {
        SCENARIOS.to_vec()
    } else {
        args.scenarios.iter().map(String::as_str).collect()
    };
    // Every line says how durable the run was and on which server.
    let setup: Fields = vec![
        ("sync", json!(local.sync.name())),
        ("dispatch_window", json!(local.dispatch_window)),
        ("handoff", json!(!args.no_handoff)),
        ("offers", json!(!args.no_offers)),
        (
            "nats",
            json!(
                local
                    .nats_version
                    .clone()
                    .unwrap_or_else(|| "NATS_URL".to_owned())
            ),
        ),
        (
            "threads",
            json!({
                "runtime": tokio::runtime::Handle::current().metrics().num_workers(),
                "scheduler": scheduler_name(),
                // `null`: Go's default (every core), or a server given by URL.
                "nats": local.nats_procs,
            }),
        ),
    ];
    // The disk the server stores on; `None` for a server given by URL or a device without the
    // counter, and the lines then say `null`.
    let flushes = local.nats_store().and_then(disk::Flushes::of);
    // The server's streams, asked how many messages each scenario stored, and (when flushes
    // are counted) whether its queues are empty yet (see `disk::settled`).
    let js = async_nats::connect(&local.nats_url)
        .await
        .ok()
        .map(async_nats::jetstream::new);
    let mut failed = false;
    for scenario in scenarios {
        let sizes: Vec<usize> = match (scenario, args.n) {
            (_, Some(n)) => vec![n],
            ("fanout", None) => vec![1000, 10_000],
            ("chain", None) => vec![200],
            ("throughput", None) => vec![20_000],
            ("logs", None) => vec![20_000],
            ("executions", None) => vec![2000],
            ("checkpoint", None) => vec![10_000],
            ("recovery", None) => vec![20_000],
            ("observers", None) => vec![20_000],
            ("floor", None) => vec![20_000],
            ("loaded", None) => vec![1000],
            ("soak", None) => vec![2000],
            ("scale", None) => vec![20_000],
            _ => vec![500],
        };
        for n in sizes {
            if let Some(js) = &js {
                let waited = disk::quiet(js, SETTLE_BOUND).await;
                if waited >= Duration::from_millis(100) {
                    eprintln!(
                        "bench: waited {:.1} s for earlier work to settle",
                        waited.as_secs_f64()
                    );
                }
            }
            eprintln!("bench: {scenario} n={n} ...");
            let flushes_before = flushes.as_ref().and_then(disk::Flushes::read);
            let turns_before = turns::Phases::read(&local.telemetry.registry);
            let stored_before = match &js {
                Some(js) if TASK_SCENARIOS.contains(&scenario) => stored::Sequences::read(js).await,
                _ => stored::Sequences::default(),
            };
            let result = match scenario {
                "fanout" => fanout(client.clone(), n).await,
                "chain" => chain(client.clone(), n).await,
                "throughput" => throughput(client.clone(), n).await,
                "logs" => logs(client.clone(), n).await,
                "executions" => executions(client.clone(), n).await,
                "checkpoint" => checkpoint(&local, n).await,
                "recovery" => recovery(&args, n).await,
                "observers" => observers(&local, client.clone(), n, args.observers).await,
                "soak" => soak(&args, n).await,
                "scale" => scale(&args, n).await,
                "loaded" => loaded(client.clone(), n).await,
                "parked" => parked(client.clone(), js.as_ref(), n).await,
                "floor" => floor(&local.nats_url, n).await,
                _ => latency(client.clone(), n).await,
            };
            let mut fields = result.unwrap_or_else(|error| {
                failed = true;
                vec![("error", json!(error))]
            });
            if TASK_SCENARIOS.contains(&scenario) && !fields.iter().any(|(k, _)| *k == "error") {
                if let (Some(js), Some(_)) = (&js, &flushes) {
                    disk::settled(js, SETTLE_BOUND).await;
                }
                let flushed = flushes_before
                    .zip(flushes.as_ref().and_then(disk::Flushes::read))
                    .map(|(before, after)| after.saturating_sub(before));
                fields.push((
                    "disk_flushes_per_task",
                    flushed.map_or(Value::Null, |f| json!(round(f as f64 / n as f64, 3))),
                ));
                let stored_after = match &js {
                    Some(js) => stored::Sequences::read(js).await,
                    None => stored::Sequences::default(),
                };
                fields.push((
                    "stored_per_task",
                    stored_after.per_task_since(&stored_before, n),
                ));
                if scenario != "floor" {
                    fields.push((
                        "coordinator_turns",
                        turns::Phases::read(&local.telemetry.registry).since(&turns_before),
                    ));
                }
            }
            println!("{}", line(scenario, n, &setup, &fields));
        }
    }
    local.stop().await;
    if failed {
        Err(Failure::silent())
    } else {
        Ok(())
    }
}

/// How long the bench waits for the coordinator to hear from its workers before measuring.
const WORKERS_HEARD_WITHIN: Duration = Duration::from_secs(10);

/// Waits until the coordinator has heard a heartbeat of each of the `n` workers, so the first
/// scenario runs as later ones do: until then the coordinator does not know how many
/// assignments a message may hold, and sends each alone.
async fn workers_heard(mut client: CoordinatorClient<Channel>, n: usize) {
    let started = Instant::now();
    loop {
        let heard = client
            .list_workers(v1::ListWorkersRequest::default())
            .await
            .map_or(0, |response| response.into_inner().workers.len());
        if heard >= n {
            return;
        }
        if started.elapsed() > WORKERS_HEARD_WITHIN {
            eprintln!(
                "bench: the coordinator heard from {heard} of {n} workers within {} s; \
                 measuring anyway",
                WORKERS_HEARD_WITHIN.as_secs()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One JSON object with the fields in docs/bench.md's order (`system`, `scenario`, `n`, the
/// set-up (`sync`, `nats`), then the scenario's own), so lines from different engines read alike.
fn line(scenario: &str, n: usize, setup: &[(&str, Value)], fields: &[(&str, Value)]) -> String {
    let mut line = format!(
        "{{\"system\":\"trellis\",\"scenario\":{},\"n\":{n}",
        json!(scenario)
    );
    for (key, value) in setup.iter().chain(fields) {
        line.push_str(&format!(",{}:{value}", json!(key)));
    }
    line.push('}');
    line
}

/// The scheduler this process's runtime runs on, as the bench lines name it.
fn scheduler_name() -> &'static str {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => "current_thread",
        tokio::runtime::RuntimeFlavor::MultiThread => "multi_thread",
        // A flavor of a later tokio.
        _ => "other",
    }
}

/// The `q` quantile of ascending `sorted` samples (0 for none).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

async fn fanout(client: CoordinatorClient<Channel>, n: usize) -> Result<Fields, String> {
    let plan = format!(
        "name: bench-fanout\ntasks:\n- {{id: fan, type: fanout, input: {{count: {n}, child: {{type: noop, input: {{}}}}}}}}\n"
    );
    let seconds = run_one(client, plan).await?.as_secs_f64();
    Ok(vec![
        ("seconds", json!(round(seconds, 3))),
        ("tasks_per_s", json!(round(n as f64 / seconds, 0))),
    ])
}

async fn chain(client: CoordinatorClient<Channel>, n: usize) -> Result<Fields, String> {
    let mut plan = String::from("name: bench-chain\ntasks:\n- {id: t0, type: noop}\n");
    for i in 1..n {
        plan.push_str(&format!(
            "- {{id: t{i}, type: noop, depends_on: [t{}]}}\n",
            i - 1
        ));
    }
    hops::start();
    let took = run_one(client, plan).await;
    let trace = hops::take();
    let seconds = took?.as_secs_f64();
    let hops = latency::chain_hops(&trace);
    Ok(vec![
        ("seconds", json!(round(seconds, 3))),
        ("per_hop_ms", json!(round(seconds * 1000.0 / n as f64, 3))),
        ("hop_p50_us", hops.medians),
        ("hop_mean_us", hops.means),
        ("hops_whole", json!(hops.whole)),
    ])
}

async fn throughput(client: CoordinatorClient<Channel>, n: usize) -> Result<Fields, String> {
    let seconds = run_one(client, throughput_plan(n)).await?.as_secs_f64();
    Ok(vec![
        ("seconds", json!(round(seconds, 3))),
        ("tasks_per_s", json!(round(n as f64 / seconds, 0))),
    ])
}

/// The plan of `throughput`: `n` independent `noop` tasks.
fn throughput_plan(n: usize) -> String {
    let mut plan = String::with_capacity(n * 32);
    plan.push_str("name: bench-throughput\ntasks:\n");
    for i in 0..n {
        plan.push_str(&format!("- {{id: t{i}, type: noop}}\n"));
    }
    plan
}

/// Lines each task of the `logs` scenario writes.
const LOG_LINES_PER_TASK: u32 = 100;

/// `throughput` with tasks that each write [`LOG_LINES_PER_TASK`] lines to their log (the
/// built-in `log`): what task logs cost, next to `throughput`'s figure.
async fn logs(client: CoordinatorClient<Channel>, n: usize) -> Result<Fields, String> {
    let mut plan = String::with_capacity(n * 56);
    plan.push_str("name: bench-logs\ntasks:\n");
    for i in 0..n {
        plan.push_str(&format!(
            "- {{id: t{i}, type: log, input: {{lines: {LOG_LINES_PER_TASK}}}}}\n"
        ));
    }
    let seconds = run_one(client, plan).await?.as_secs_f64();
    Ok(vec![
        ("seconds", json!(round(seconds, 3))),
        ("tasks_per_s", json!(round(n as f64 / seconds, 0))),
        ("lines_per_task", json!(LOG_LINES_PER_TASK)),
        (
            "lines_per_s",
            json!(round(n as f64 * f64::from(LOG_LINES_PER_TASK) / seconds, 0)),
        ),
    ])
}

async fn get(client: &mut CoordinatorClient<Channel>, id: &str) -> Result<v1::Execution, String> {
    client
        .get_execution(v1::GetExecutionRequest {
            execution_id: id.to_owned(),
        })
        .await
        .map_err(|s| s.message().to_owned())?
        .into_inner()
        .execution
        .ok_or_else(|| "the coordinator answered without the execution".to_owned())
}

const ONE_TASK: &str = "name: bench-one\ntasks:\n- {id: t, type: noop}\n";

async fn executions(client: CoordinatorClient<Channel>, n: usize) -> Result<Fields, String> {
    let start = Instant::now();
    let ids: Vec<Result<String, String>> = futures::stream::iter(0..n)
        .map(|_| {
            let mut client = client.clone();
            async move { start_plan(&mut client, ONE_TASK.to_owned()).await }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let waits: Vec<Result<(), String>> = futures::stream::iter(ids)
        .map(|id| {
            let client = client.clone();
            async move { wait_completed(client, id?).await }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    waits.into_iter().collect::<Result<Vec<()>, String>>()?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(vec![
        ("seconds", json!(round(seconds, 3))),
        ("executions_per_s", json!(round(n as f64 / seconds, 0))),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_keep_bench_md_field_order() {
        let setup = vec![("sync", json!("always")), ("nats", json!("2.15.1"))];
        let fields = vec![("seconds", json!(0.84)), ("tasks_per_s", json!(11905.0))];
        assert_eq!(
            line("fanout", 10_000, &setup, &fields),
            r#"{"system":"trellis","scenario":"fanout","n":10000,"sync":"always","nats":"2.15.1","seconds":0.84,"tasks_per_s":11905.0}"#
        );
    }
}
