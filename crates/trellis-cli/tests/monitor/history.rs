//! The executions list's paging and case-insensitive names, and a plan's history grid, over the
//! JSON API.

use std::time::Duration;

use serde_json::{Value, json};

use crate::api::get;
use crate::{Dev, start_dev};

/// `Nightly-Build` with a `flaky` task after `compile`: `flaky` given as `task` (its type and
/// input).
pub(crate) fn nightly_plan(flaky: &str) -> String {
    format!(
        "name: Nightly-Build\ntasks:\n- {{id: compile, type: noop}}\n\
         - {{id: flaky, {flaky}, depends_on: [compile]}}\n"
    )
}

/// A `flaky` that succeeds and one that fails on every attempt.
pub(crate) const FLAKY_OK: &str = "type: noop";
pub(crate) const FLAKY_FAILS: &str = "type: fail, input: {times: 99}";

/// Starts three runs of `Nightly-Build`, the middle one failing, and waits for each to end;
/// returns their ids, oldest first.
pub(crate) async fn three_nightly_runs(dev: &Dev) -> Vec<String> {
    let mut ids = Vec::new();
    for flaky in [FLAKY_OK, FLAKY_FAILS, FLAKY_OK] {
        let id = dev.start(&nightly_plan(flaky)).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let state = dev.execution(&id).await.state;
            if state == trellis_proto::v1::ExecutionState::Completed as i32
                || state == trellis_proto::v1::ExecutionState::Failed as i32
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "run {} of Nightly-Build did not end within 60 s",
                ids.len() + 1
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ids.push(id);
    }
    ids
}

fn ids_of(list: &Value) -> Vec<String> {
    list["executions"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|row| row["id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The list filters plan names ignoring case and pages newest first with the coordinator's
/// tokens; bad page sizes are refused precisely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pages_and_filters_names_in_any_case() {
    let dev = start_dev();
    let other = dev
        .start("name: unrelated\ntasks:\n- {id: only, type: noop}\n")
        .await;
    let runs = three_nightly_runs(&dev).await;
    let newest_first: Vec<String> = runs.iter().rev().cloned().collect();
    let base = format!("{}/api/executions", dev.monitor);

    let (status, list) = get(&format!("{base}?name=nIGHTLY-b")).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        ids_of(&list),
        newest_first,
        "any case finds the plan: {list}"
    );
    assert!(list["next_page_token"].is_null(), "one page: {list}");
    let (_, all) = get(&base).await;
    assert!(ids_of(&all).contains(&other), "{all}");

    let (status, first) = get(&format!("{base}?name=nightly&page_size=2")).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(ids_of(&first), newest_first[..2], "{first}");
    let token = first["next_page_token"]
        .as_str()
        .unwrap_or_else(|| panic!("a token for the next page: {first}"))
        .to_owned();
    let (status, second) = get(&format!(
        "{base}?name=nightly&page_size=2&page_token={token}"
    ))
    .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(ids_of(&second), newest_first[2..], "{second}");
    assert!(
        second["next_page_token"].is_null(),
        "the last page: {second}"
    );

    for (size, says) in [
        ("0", "page_size 0 is out of range: ask for 1 to 1000"),
        ("1001", "page_size 1001 is out of range: ask for 1 to 1000"),
        (
            "ten",
            "page_size `ten` is not a whole number: ask for 1 to 1000",
        ),
    ] {
        let (status, body) = get(&format!("{base}?page_size={size}")).await;
        assert_eq!((status, &body["error"]), (400, &json!(says)), "{body}");
    }
}

/// A plan's history grid: its executions newest first by its tasks, the failed run's cell
/// failed; names match exactly; bad limits are refused precisely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_history_shows_the_run_where_a_task_failed() {
    let dev = start_dev();
    dev.start("name: Nightly-Build-2\ntasks:\n- {id: other, type: noop}\n")
        .await;
    let runs = three_nightly_runs(&dev).await;
    let newest_first: Vec<String> = runs.iter().rev().cloned().collect();
    let url = format!("{}/api/plans/Nightly-Build/history", dev.monitor);
    // The read model follows the log a moment behind: wait for the last run's cells.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let history = loop {
        let (status, body) = get(&url).await;
        assert_eq!(status, 200, "{body}");
        if body["cells"]["flaky"][0] == "completed" {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the newest run's flaky cell is not completed after 30 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(history["plan"], "Nightly-Build", "{history}");
    assert_eq!(
        ids_of(&history),
        newest_first,
        "only this plan's: {history}"
    );
    assert_eq!(history["executions"][1]["state"], "failed", "{history}");
    assert_eq!(history["tasks"], json!(["compile", "flaky"]), "{history}");
    assert_eq!(
        history["cells"]["flaky"],
        json!(["completed", "failed", "completed"]),
        "{history}"
    );
    assert_eq!(
        history["cells"]["compile"],
        json!(["completed", "completed", "completed"]),
        "{history}"
    );

    let (status, two) = get(&format!("{url}?limit=2")).await;
    assert_eq!(status, 200, "{two}");
    assert_eq!(ids_of(&two), newest_first[..2], "{two}");
    assert_eq!(
        two["cells"]["flaky"],
        json!(["completed", "failed"]),
        "{two}"
    );

    // Exact names: another case, or a part, is another plan, with no executions.
    for name in ["nightly-build", "Nightly"] {
        let (status, empty) = get(&format!("{}/api/plans/{name}/history", dev.monitor)).await;
        assert_eq!(status, 200, "{empty}");
        assert_eq!(
            (&empty["executions"], &empty["tasks"], &empty["cells"]),
            (&json!([]), &json!([]), &json!({})),
            "{name}: {empty}"
        );
    }
    for (limit, says) in [
        ("0", "limit 0 is out of range: ask for 1 to 100"),
        ("101", "limit 101 is out of range: ask for 1 to 100"),
        ("-1", "limit `-1` is not a whole number: ask for 1 to 100"),
    ] {
        let (status, body) = get(&format!("{url}?limit={limit}")).await;
        assert_eq!((status, &body["error"]), (400, &json!(says)), "{body}");
    }
    let (status, body) = get(&format!("{}/api/plans/%20/history", dev.monitor)).await;
    assert_eq!(status, 400, "{body}");
}
