//! The web UI, embedded in the binary so the monitor needs no files and no network.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");

/// The single page; the UI routes in the browser (`#/executions/<id>`, `#/workers`).
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `/assets/<file>`.
pub async fn file(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "app.js" => asset("text/javascript; charset=utf-8", APP_JS),
        "app.css" => asset("text/css; charset=utf-8", APP_CSS),
        _ => (StatusCode::NOT_FOUND, format!("no asset `{file}`")).into_response(),
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
