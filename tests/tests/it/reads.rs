//! The read path survives restarts: lists come from the checkpoint-store's read model, not from a
//! coordinator's memory.

use std::collections::BTreeSet;
use std::time::Duration;

use trellis_proto::v1;

use crate::system::{Fault, Options, SHARDS, System};

/// Executions the list test runs: one `noop` task each.
const LISTED: usize = 1000;
/// How long they may take to run and reach the read model.
const LISTED_WITHIN: Duration = Duration::from_secs(120);

/// Lists every execution through coordinator `idx`, page by page; returns the ids in the order
/// listed and how many pages it took.
async fn list_all(
    system: &System,
    idx: usize,
    page_size: u32,
) -> anyhow::Result<(Vec<v1::Execution>, usize)> {
    let mut client = system.client(idx)?;
    let mut executions = Vec::new();
    let mut page_token = String::new();
    let mut pages = 0;
    loop {
        let response = client
            .list_executions(v1::ListExecutionsRequest {
                page: Some(v1::PageRequest {
                    page_size,
                    page_token,
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        pages += 1;
        anyhow::ensure!(
            response.executions.len() <= page_size as usize,
            "a page of {page_size} held {}",
            response.executions.len()
        );
        executions.extend(response.executions);
        page_token = response.page.unwrap_or_default().next_page_token;
        if page_token.is_empty() {
            return Ok((executions, pages));
        }
        anyhow::ensure!(pages <= 10_000, "the pages never end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_coordinator_lists_a_thousand_finished_executions_paged_from_the_read_model()
-> anyhow::Result<()> {
    let system = System::start(Options {
        coordinators: vec!["coordinator-a"],
        workers: 1,
        shards: SHARDS,
        ..Options::default()
    })
    .await?;
    system
        .run(async |system: &mut System| {
            let mut started = BTreeSet::new();
            let mut client = system.client(0)?;
            for n in 0..LISTED {
                let yaml = format!("name: listed-{n}\ntasks:\n- {{id: t, type: noop}}\n");
                let id = client
                    .start_execution(crate::system::start_request(&yaml))
                    .await?
                    .into_inner()
                    .execution_id;
                started.insert(id);
            }
            // Every one finished and reached the read model.
            let deadline = tokio::time::Instant::now() + LISTED_WITHIN;
            loop {
                let (listed, _) = list_all(system, 0, 1000).await?;
                let completed = listed
                    .iter()
                    .filter(|e| e.state == v1::ExecutionState::Completed as i32)
                    .count();
                if completed == LISTED {
                    break;
                }
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "{completed} of {LISTED} executions listed as completed within {LISTED_WITHIN:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            // A restart empties the coordinator's memory; the list does not change.
            system.inject(Fault::Coordinator(0)).await?;
            let (listed, pages) = list_all(system, 0, 100).await?;
            let ids: Vec<&str> = listed.iter().map(|e| e.execution_id.as_str()).collect();
            let mut newest_first = ids.clone();
            newest_first.sort_unstable_by(|a, b| b.cmp(a));
            anyhow::ensure!(ids == newest_first, "the list is not newest first");
            let unique: BTreeSet<String> = ids.iter().map(|id| (*id).to_owned()).collect();
            anyhow::ensure!(
                unique == started,
                "after the restart the list holds {} executions ({} distinct), {} of them started here",
                ids.len(),
                unique.len(),
                unique.intersection(&started).count()
            );
            anyhow::ensure!(pages == LISTED / 100, "{pages} pages of 100 for {LISTED}");
            // Filters apply in the read model too.
            let named = client
                .list_executions(v1::ListExecutionsRequest {
                    name_contains: "listed-99".to_owned(),
                    ..Default::default()
                })
                .await?
                .into_inner()
                .executions;
            anyhow::ensure!(
                named.len() == 11,
                "name_contains \"listed-99\" should match listed-99 and listed-990..999, got {}",
                named.len()
            );
            Ok(())
        })
        .await
}
