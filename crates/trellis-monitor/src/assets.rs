//! The web UI, embedded in the binary so the monitor needs no files and no network.
//!
//! The UI is plain ES modules (`assets/*.js`, entry `main.js`) served as they are: no bundler, no
//! build step. [`ASSETS`] lists every file of `assets/`; a test keeps the two the same.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../assets/index.html");

/// Every asset but `index.html`: its name under `/assets/` and its content.
macro_rules! assets {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../assets/", $name)))),*]
    };
}

/// The files served under `/assets/`.
pub const ASSETS: &[(&str, &str)] = assets![
    "app.css",
    "api.js",
    "backlog.js",
    "cluster.js",
    "const.js",
    "dag.js",
    "drawer.js",
    "events.js",
    "exec-header.js",
    "execution.js",
    "executions.js",
    "grid.js",
    "history.js",
    "logs.js",
    "main.js",
    "timeline.js",
    "tree.js",
    "util.js",
    "workers.js",
];

/// The single page; the UI routes in the browser (`#/executions/<id>`, `#/workers`).
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `/assets/<file>`.
pub async fn file(Path(file): Path<String>) -> Response {
    let Some((_, body)) = ASSETS.iter().find(|(name, _)| *name == file) else {
        return (StatusCode::NOT_FOUND, format!("no asset `{file}`")).into_response();
    };
    asset(content_type(&file), body)
}

fn content_type(file: &str) -> &'static str {
    if file.ends_with(".css") {
        "text/css; charset=utf-8"
    } else {
        // Module scripts must be served with a JavaScript MIME type or the browser refuses them.
        "text/javascript; charset=utf-8"
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // The assets change with the binary; revalidating costs little on a local network.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::ASSETS;

    /// A module added to `assets/` but not to [`ASSETS`] would be a 404 and a blank page.
    #[test]
    fn every_file_of_the_assets_directory_is_served() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/assets");
        let on_disk: BTreeSet<String> = std::fs::read_dir(dir)
            .expect("the assets directory is part of the crate")
            .map(|entry| {
                entry
                    .expect("a readable directory entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name != "index.html")
            .collect();
        let served: BTreeSet<String> = ASSETS.iter().map(|(name, _)| (*name).to_owned()).collect();
        assert_eq!(on_disk, served);
    }

    /// Every `import ... from './x.js'` names a served module.
    #[test]
    fn every_imported_module_is_served() {
        let served: BTreeSet<&str> = ASSETS.iter().map(|(name, _)| *name).collect();
        for (name, body) in ASSETS {
            for line in body.lines().filter(|l| l.starts_with("import ")) {
                let target = line
                    .rsplit("from './")
                    .next()
                    .and_then(|rest| rest.strip_suffix("';"))
                    .unwrap_or_else(|| panic!("{name}: unexpected import line `{line}`"));
                assert!(
                    served.contains(target),
                    "{name} imports {target}, which is not served"
                );
            }
        }
    }
}
