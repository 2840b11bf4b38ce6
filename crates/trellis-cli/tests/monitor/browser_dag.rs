//! The DAG in real headless Chromium, as `browser`: a 2,000-task fan-out folded into one node
//! that counts its members and opens their grid, arrowheads, zoom, fit and the minimap; a plan too
//! big to draw node by node drawn per wave, a wave opening its grid; and the tabs, kept in the
//! address.

use std::fmt::Write as _;
use std::time::Duration;

use fantoccini::{Client, Locator};
use serde_json::{Value, json};

use crate::page::{
    browser_with_token, choose, click, screenshot, start_driver, tab, text, wait_page,
};
use crate::start_dev;

/// `prepare` → 2,000 `shards` (member 1200 fails every attempt) → `merge`.
fn shards_plan() -> String {
    let mut items = String::new();
    for n in 0..2000 {
        let times = if n == 1200 { 99 } else { 0 };
        let _ = write!(
            items,
            "{}{{times: {times}}}",
            if n == 0 { "" } else { ", " }
        );
    }
    format!(
        "name: shards-plan\ntasks:\n\
         - {{id: prepare, type: noop}}\n\
         - {{id: shards, type: fail, for_each: [{items}], input: {{times: '${{item.times}}'}}, \
            depends_on: [prepare]}}\n\
         - {{id: merge, type: noop, depends_on: [shards]}}\n"
    )
}

/// 160 pairs `a-i` → `b-i`: every task has a dependency or a dependent of its own, so nothing
/// folds and 320 nodes are too many to draw one by one.
fn pairs_plan() -> String {
    let mut text = "name: pairs-plan\ntasks:\n".to_owned();
    for i in 0..160 {
        let _ = writeln!(text, "- {{id: a-{i}, type: noop}}");
        let _ = writeln!(text, "- {{id: b-{i}, type: noop, depends_on: [a-{i}]}}");
    }
    text
}

async fn run_js(client: &Client, script: &str) -> Value {
    client
        .execute(script, vec![])
        .await
        .unwrap_or_else(|e| panic!("the page runs `{script}`: {e}"))
}

async fn zoom(client: &Client) -> f64 {
    let value = run_js(
        client,
        "return Number(document.querySelector('#dag .dag-stage').dataset.zoom)",
    )
    .await;
    value.as_f64().unwrap_or(f64::NAN)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_draws_a_big_plan_folded_zoomable_and_gridded() {
    let driver = start_driver();
    let dev = start_dev();
    let client = browser_with_token(&driver, &dev.monitor).await;

    let id = dev.start(&shards_plan()).await;
    client
        .goto(&format!("{}/#/executions/{id}?tab=graph", dev.monitor))
        .await
        .expect("the execution's graph tab opens");
    wait_page(
        &client,
        "the fan-out is one node",
        Duration::from_secs(30),
        || async { text(&client, "#dag g.node.group .group-name").await == "shards ×2,000" },
    )
    .await;
    let nodes = run_js(
        &client,
        "return document.querySelectorAll('#dag g.node').length",
    )
    .await;
    assert_eq!(nodes, json!(3), "prepare, the fan-out and merge");
    let arrows = run_js(
        &client,
        "return [...document.querySelectorAll('#dag path.edge')]\
         .filter((p) => p.getAttribute('marker-end') === 'url(#dag-arrow)').length",
    )
    .await;
    assert_eq!(
        arrows,
        json!(2),
        "one arrow into the fan-out, one out of it"
    );
    wait_page(
        &client,
        "the fan-out counts its members, one failed",
        Duration::from_secs(120),
        || async {
            let counts = text(&client, "#dag g.node.group .group-counts").await;
            counts == "(1,999 done, 1 failed)"
        },
    )
    .await;
    assert_eq!(
        text(&client, "#execution-state").await,
        "failed",
        "a member failed, so did the run"
    );
    screenshot(&client, "12-dag-fanout").await;

    // Zoom in, fit back, and the minimap follows.
    let fitted = zoom(&client).await;
    click(&client, "#dag-zoom-in").await;
    let zoomed = zoom(&client).await;
    assert!(zoomed > fitted * 1.2, "zoomed in: {fitted} → {zoomed}");
    let view_width = || async {
        run_js(
            &client,
            "return Number(document.querySelector('#dag-minimap .mini-view').getAttribute('width'))",
        )
        .await
        .as_f64()
        .unwrap_or(f64::NAN)
    };
    let narrow = view_width().await;
    click(&client, "#dag-fit").await;
    assert!(
        (zoom(&client).await - fitted).abs() < 1e-3,
        "fit restores the fitted scale"
    );
    assert!(
        view_width().await > narrow,
        "the minimap's view widens when zoomed out"
    );

    // The fan-out opens the grid of its members; "failed" leaves one, which opens in the drawer.
    click(&client, "#dag g.node.group").await;
    wait_page(
        &client,
        "the grid of 2,000 members",
        Duration::from_secs(10),
        || async { text(&client, "#task-grid .grid-title").await == "shards ×2,000" },
    )
    .await;
    let cells = run_js(
        &client,
        "return document.querySelectorAll('#grid-cells .grid-cell').length",
    )
    .await;
    assert_eq!(cells, json!(2000));
    screenshot(&client, "13-grid").await;
    choose(&client, "#grid-state-filter", "failed").await;
    let shown = run_js(
        &client,
        "return [...document.querySelectorAll('#grid-cells .grid-cell')]\
         .filter((c) => !c.hidden).map((c) => c.dataset.taskId + ':' + c.dataset.state)",
    )
    .await;
    let shown: Vec<String> = serde_json::from_value(shown).expect("a list of cells");
    assert_eq!(shown, ["shards-1200:failed"], "the failed member");
    let failed_id = "shards-1200".to_owned();
    click(&client, "#grid-cells .grid-cell[data-state=failed]").await;
    wait_page(
        &client,
        "the failed member in the drawer",
        Duration::from_secs(10),
        || async {
            text(&client, "#task-drawer:not([hidden]) #drawer-title").await == failed_id
                && text(&client, "#drawer-attempts")
                    .await
                    .contains("fails on purpose")
        },
    )
    .await;
    click(&client, "#task-drawer .drawer-close").await;

    // The tab is in the address and survives a reload.
    tab(&client, "timeline").await;
    let hash = run_js(&client, "return location.hash").await;
    assert_eq!(hash, json!(format!("#/executions/{id}?tab=timeline")));
    client.refresh().await.expect("the page reloads");
    wait_page(
        &client,
        "the timeline tab after a reload",
        Duration::from_secs(10),
        || async {
            client
                .find(Locator::Css("#tab-timeline.active"))
                .await
                .is_ok()
                && client
                    .find(Locator::Css("#pane-graph[hidden]"))
                    .await
                    .is_ok()
        },
    )
    .await;

    // Too many nodes to draw one by one: a bar per wave, and a wave opens its grid.
    let pairs = dev.start(&pairs_plan()).await;
    client
        .goto(&format!("{}/#/executions/{pairs}?tab=graph", dev.monitor))
        .await
        .expect("the pairs plan's graph opens");
    wait_page(
        &client,
        "the plan drawn per wave",
        Duration::from_secs(30),
        || async {
            client
                .find(Locator::Css("#dag g.wave[data-wave=\"2\"]"))
                .await
                .is_ok()
        },
    )
    .await;
    click(&client, "#dag g.wave[data-wave=\"2\"] rect.hit").await;
    wait_page(
        &client,
        "the grid of wave 2",
        Duration::from_secs(10),
        || async {
            text(&client, "#task-grid .grid-title").await == "Wave 2"
                && text(&client, "#task-grid .grid-counts")
                    .await
                    .starts_with("160 tasks")
        },
    )
    .await;
    let first = run_js(
        &client,
        "return document.querySelector('#grid-cells .grid-cell').dataset.taskId",
    )
    .await;
    assert_eq!(first, json!("b-0"), "wave 2 holds the b tasks");
    screenshot(&client, "14-wave-grid").await;
    client.close().await.expect("the browser closes");
}
