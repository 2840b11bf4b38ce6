//! `trellis cluster`: the deployment's coordinators, their addresses and shards.

use std::io::{self, BufWriter, Write};

use clap::Args;
use serde_json::{Value, json};
use trellis_proto::v1::{CoordinatorInfo, GetClusterRequest, GetClusterResponse};

use super::Failure;
use crate::client::Coordinator;
use crate::render;

/// Show the coordinators: each one's address, the shards it holds, the executions in its memory
/// and its lag (inputs waiting for its turn loop), as each last reported itself.
#[derive(Debug, Args)]
#[command(
    after_help = "Any coordinator answers: it reads every coordinator's record from NATS.\n\n\
    Examples:\n  \
    trellis cluster\n  \
    trellis cluster --json | jq '.coordinators[] | {id, shards}'"
)]
pub struct ClusterArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `trellis cluster`.
pub async fn run(coordinator_url: &str, args: ClusterArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let cluster = coordinator
        .client
        .get_cluster(GetClusterRequest {})
        .await
        .map_err(|status| coordinator.status_failure(&status, "cluster"))?
        .into_inner();
    let mut out = BufWriter::new(io::stdout().lock());
    if args.json {
        writeln!(out, "{}", cluster_json(&cluster))?;
    } else {
        out.write_all(cluster_text(&cluster).as_bytes())?;
    }
    Ok(out.flush()?)
}

fn coordinator_json(coordinator: &CoordinatorInfo) -> Value {
    json!({
        "id": coordinator.coordinator_id,
        "address": coordinator.address,
        "shards": coordinator.shards,
        "executions_in_memory": coordinator.executions_in_memory,
        "lag": coordinator.lag,
        "reported_at_unix_ms": coordinator.reported_at_unix_ms,
        "started_at_unix_ms": coordinator.started_at_unix_ms,
    })
}

fn cluster_json(cluster: &GetClusterResponse) -> Value {
    let coordinators: Vec<Value> = cluster.coordinators.iter().map(coordinator_json).collect();
    json!({
        "shards": cluster.shards,
        "coordinators": coordinators,
        "unowned_shards": cluster.unowned_shards,
        "answered_by": cluster.answered_by,
    })
}

/// Shard numbers as ranges: `0-3,7`.
fn ranges(shards: &[u32]) -> String {
    let mut sorted = shards.to_vec();
    sorted.sort_unstable();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(",")
    }
}

fn cluster_text(cluster: &GetClusterResponse) -> String {
    let header = [
        "COORDINATOR",
        "ADDRESS",
        "SHARDS",
        "HELD",
        "IN MEMORY",
        "LAG",
        "REPORTED",
    ]
    .map(str::to_owned);
    let rows: Vec<[String; 7]> = cluster
        .coordinators
        .iter()
        .map(|c| {
            [
                c.coordinator_id.clone(),
                c.address.clone(),
                ranges(&c.shards),
                c.shards.len().to_string(),
                c.executions_in_memory.to_string(),
                c.lag.to_string(),
                render::format_time(c.reported_at_unix_ms),
            ]
        })
        .collect();
    let mut text = render::table(&header, &rows);
    let unowned = if cluster.unowned_shards.is_empty() {
        "none".to_owned()
    } else {
        ranges(&cluster.unowned_shards)
    };
    text.push_str(&format!(
        "{} coordinators over {} shards; unheld: {unowned} (answered by {})\n",
        cluster.coordinators.len(),
        cluster.shards,
        cluster.answered_by
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_read_as_ranges() {
        assert_eq!(ranges(&[3, 0, 1, 2, 7, 9, 10]), "0-3,7,9-10");
        assert_eq!(ranges(&[]), "-");
    }

    #[test]
    fn the_table_shows_each_coordinator_and_the_unheld_shards() {
        let cluster = GetClusterResponse {
            shards: 12,
            coordinators: vec![CoordinatorInfo {
                coordinator_id: "coordinator-0".to_owned(),
                address: "http://10.0.0.7:7400".to_owned(),
                shards: vec![0, 1, 2, 3],
                executions_in_memory: 17,
                lag: 2,
                reported_at_unix_ms: 1_793_628_187_000,
                started_at_unix_ms: 1_793_628_100_000,
            }],
            unowned_shards: vec![4, 5],
            answered_by: "coordinator-0".to_owned(),
        };
        assert_eq!(
            cluster_text(&cluster),
            "COORDINATOR    ADDRESS               SHARDS  HELD  IN MEMORY  LAG  REPORTED\n\
             coordinator-0  http://10.0.0.7:7400  0-3     4     17         2    2026-11-02 14:03:07Z\n\
             1 coordinators over 12 shards; unheld: 4-5 (answered by coordinator-0)\n"
        );
        assert_eq!(
            cluster_json(&cluster)["coordinators"][0]["shards"],
            json!([0, 1, 2, 3])
        );
    }
}
