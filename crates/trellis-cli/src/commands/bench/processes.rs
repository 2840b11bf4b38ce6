//! The scenarios whose coordinators run as child processes (`trellis coordinator`): `soak`, which
//! reads one's memory, and `scale`, which runs one, two and three; and the child coordinator
//! `recovery` kills.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tonic::transport::Channel;
use trellis_proto::v1;
use trellis_proto::v1::coordinator_client::CoordinatorClient;

use super::{BenchArgs, Fields, ONE_TASK, round, run_one, start_plan, wait_completed};
use crate::local;

/// Shards of the scale scenario's coordinators: 1, 2 and 3 coordinators hold equal shares.
const SCALE_SHARDS: u32 = 6;

/// Plan tasks per execution of the soak scenario.
const SOAK_TASKS: usize = 100;
/// The soak coordinator's `--keep-finished`.
const SOAK_KEEP_FINISHED: Duration = Duration::from_secs(10);
/// The soak's last reading of the coordinator's memory comes this long after the one after
/// `--keep-finished`.
const SOAK_LATER: Duration = Duration::from_secs(30);

/// `n` executions of [`SOAK_TASKS`] tasks each through one coordinator process started with
/// `--keep-finished` [`SOAK_KEEP_FINISHED`]: its resident memory before, at the peak (sampled
/// every 100 ms), at the end of the work, once `--keep-finished` has passed and 30 s after that;
/// and how many executions it still holds then, as it reports in `GetCluster`.
pub(super) async fn soak(args: &BenchArgs, n: usize) -> Result<Fields, String> {
    let local = workers_only(args).await?;
    let port = free_port()?;
    let keep = format!("{}s", SOAK_KEEP_FINISHED.as_secs());
    let coordinator = ChildCoordinator::spawn_with(
        &local.nats_url,
        port,
        "bench-soak",
        &["--keep-finished", &keep],
    )
    .await?;
    let pid = coordinator.child.id();
    let before = rss_bytes(pid)?;
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampling = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let peak = peak.clone();
        let stop = sampling.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(rss) = rss_bytes(pid) {
                    peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let mut plan = String::from("name: bench-soak\ntasks:\n");
    for i in 0..SOAK_TASKS {
        plan.push_str(&format!("- {{id: t{i}, type: noop}}\n"));
    }
    let progress = indicatif::ProgressBar::new(n as u64).with_style(
        indicatif::ProgressStyle::with_template(
            "bench: soak {bar:30} {pos}/{len} executions {per_sec}",
        )
        .map_err(|e| e.to_string())?,
    );
    let start = Instant::now();
    let client = coordinator.client.clone();
    let done: Vec<Result<(), String>> = futures::stream::iter(0..n)
        .map(|_| {
            let mut client = client.clone();
            let plan = plan.clone();
            let progress = progress.clone();
            async move {
                let id = start_plan(&mut client, plan).await?;
                let waited = wait_completed(client, id).await;
                progress.inc(1);
                waited
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    progress.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    sampling.cancel();
    let _ = sampler.await;
    done.into_iter().collect::<Result<Vec<()>, String>>()?;
    let at_end = rss_bytes(pid)?;
    eprintln!("bench: soak: waiting {keep} (--keep-finished) and a few seconds more");
    tokio::time::sleep(SOAK_KEEP_FINISHED + Duration::from_secs(5)).await;
    let after = rss_bytes(pid)?;
    tokio::time::sleep(SOAK_LATER).await;
    let later = rss_bytes(pid)?;
    let in_memory = coordinator
        .client
        .clone()
        .get_cluster(v1::GetClusterRequest {})
        .await
        .map_err(|s| s.message().to_owned())?
        .into_inner()
        .coordinators
        .iter()
        .map(|c| c.executions_in_memory)
        .sum::<u64>();
    drop(coordinator);
    local.stop().await;
    let mb = |bytes: u64| round(bytes as f64 / (1024.0 * 1024.0), 1);
    Ok(vec![
        ("tasks", json!(n * SOAK_TASKS)),
        ("seconds", json!(round(seconds, 3))),
        (
            "tasks_per_s",
            json!(round((n * SOAK_TASKS) as f64 / seconds, 0)),
        ),
        ("keep_finished_s", json!(SOAK_KEEP_FINISHED.as_secs())),
        ("rss_before_mb", json!(mb(before))),
        (
            "rss_peak_mb",
            json!(mb(peak.load(std::sync::atomic::Ordering::Relaxed))),
        ),
        ("rss_at_end_mb", json!(mb(at_end))),
        ("rss_after_mb", json!(mb(after))),
        ("rss_30s_later_mb", json!(mb(later))),
        ("executions_in_memory_after", json!(in_memory)),
    ])
}

/// `throughput` (one execution of `n` tasks) and `executions` (`n / 10` one-task executions,
/// started round-robin through every coordinator) with 1, 2 and 3 coordinator processes over
/// [`SCALE_SHARDS`] shards, the workers in this process. On a machine with fewer cores than
/// processes this shows what spreading costs, not a speed-up.
pub(super) async fn scale(args: &BenchArgs, n: usize) -> Result<Fields, String> {
    let local = workers_only(args).await?;
    let shards = SCALE_SHARDS.to_string();
    let mut fields: Fields = Vec::new();
    let mut plan = String::with_capacity(n * 32);
    plan.push_str("name: bench-scale\ntasks:\n");
    for i in 0..n {
        plan.push_str(&format!("- {{id: t{i}, type: noop}}\n"));
    }
    for count in 1..=3usize {
        let mut coordinators = Vec::new();
        for i in 0..count {
            let port = free_port()?;
            let id = format!("bench-scale-{count}-{i}");
            coordinators.push(
                ChildCoordinator::spawn_with(&local.nats_url, port, &id, &["--shards", &shards])
                    .await?,
            );
        }
        // The shares settle once the former round's leases lapse.
        let share = SCALE_SHARDS as usize / count;
        let mut first = coordinators[0].client.clone();
        let mut balanced = false;
        for _ in 0..300 {
            if let Ok(cluster) = first.get_cluster(v1::GetClusterRequest {}).await {
                let cluster = cluster.into_inner();
                balanced = cluster.unowned_shards.is_empty()
                    && cluster.coordinators.len() == count
                    && cluster.coordinators.iter().all(|c| c.shards.len() == share);
                if balanced {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !balanced {
            return Err(format!(
                "{count} coordinators did not settle on {share} shards each within 30 s"
            ));
        }
        let seconds = run_one(first.clone(), plan.clone()).await?.as_secs_f64();
        fields.push((
            [
                "throughput_tasks_per_s_1",
                "throughput_tasks_per_s_2",
                "throughput_tasks_per_s_3",
            ][count - 1],
            json!(round(n as f64 / seconds, 0)),
        ));
        let clients: Vec<CoordinatorClient<Channel>> =
            coordinators.iter().map(|c| c.client.clone()).collect();
        let m = (n / 10).max(1);
        let start = Instant::now();
        let done: Vec<Result<(), String>> = futures::stream::iter(0..m)
            .map(|i| {
                let mut client = clients[i % clients.len()].clone();
                async move {
                    let id = start_plan(&mut client, ONE_TASK.to_owned()).await?;
                    wait_completed(client, id).await
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        done.into_iter().collect::<Result<Vec<()>, String>>()?;
        let seconds = start.elapsed().as_secs_f64();
        fields.push((
            [
                "executions_per_s_1",
                "executions_per_s_2",
                "executions_per_s_3",
            ][count - 1],
            json!(round(m as f64 / seconds, 0)),
        ));
        eprintln!("bench: scale: {count} coordinator(s) done");
    }
    local.stop().await;
    Ok(fields)
}

/// The resident memory of a process, from `/proc/<pid>/status` (Linux).
fn rss_bytes(pid: u32) -> Result<u64, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("cannot read the memory of process {pid}: {e}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .ok_or_else(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// NATS and the workers in this process, without a coordinator: the scenarios that run their
/// coordinators as child processes start them themselves.
pub(super) async fn workers_only(args: &BenchArgs) -> Result<local::Local, String> {
    local::start(local::Options {
        nats_url: None,
        listen: "127.0.0.1:0".parse().map_err(|_| "bad listen address")?,
        workers: args.workers,
        slots: args.slots,
        coordinator: false,
        monitor: None,
        breakers: local::Breakers::default(),
        sync: args.sync,
        dispatch_window: args.dispatch_window,
        handoff: !args.no_handoff,
        offers: !args.no_offers,
    })
    .await
    .map_err(|f| f.message)
}

/// A free loopback address for a child coordinator.
pub(super) fn free_port() -> Result<std::net::SocketAddr, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))
}

/// A coordinator in a child process (`trellis coordinator`), so it can be killed for real.
pub(super) struct ChildCoordinator {
    child: std::process::Child,
    pub(super) client: CoordinatorClient<Channel>,
}

impl ChildCoordinator {
    pub(super) async fn spawn(nats_url: &str, addr: std::net::SocketAddr) -> Result<Self, String> {
        Self::spawn_with(nats_url, addr, "bench-recovery", &[]).await
    }

    /// A coordinator process with this `--id` and these flags besides.
    async fn spawn_with(
        nats_url: &str,
        addr: std::net::SocketAddr,
        id: &str,
        flags: &[&str],
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let child = std::process::Command::new(exe)
            .args(["coordinator", "--nats-url", nats_url, "--id", id])
            .args(flags)
            .args(["--listen", &addr.to_string(), "--lease-ttl", "3s"])
            .args(["--admin-addr", "off"])
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start a coordinator process: {e}"))?;
        let url = format!("http://{addr}");
        for _ in 0..500 {
            if let Ok(mut client) = CoordinatorClient::connect(url.clone()).await
                && client
                    .list_executions(v1::ListExecutionsRequest::default())
                    .await
                    .is_ok()
            {
                return Ok(Self { child, client });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(format!("the coordinator process did not serve at {url}"))
    }

    /// SIGKILL: no goodbye, no lease released.
    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildCoordinator {
    fn drop(&mut self) {
        self.kill();
    }
}
