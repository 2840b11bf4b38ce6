//! `observers`: many live streams of the monitor on one running execution, and how late each
//! event reaches them.

use std::time::{Duration, Instant};

use serde_json::json;
use tonic::transport::Channel;
use trellis_proto::v1::coordinator_client::CoordinatorClient;

use super::{Fields, round, start_plan, wait_completed};
use crate::local;

/// `s` live streams of the monitor (`/api/executions/{id}/live`, as browsers open them) on one
/// running `throughput` execution of `n` tasks. The tasks wait for a 2-second `sleep` task so that
/// every stream is open before the first of them runs. Each event delivered to a stream counts
/// once: its latency runs from its append (the time JetStream stored the log message holding it)
/// to its arrival; `created_p95_ms` runs from the coordinator's own timestamp on the event
/// instead, which also counts the coordinator's batching before the append. Streams carry at most
/// the newest 100 events of each 50 ms batch; the others are counted as `omitted_per_stream`.
pub(super) async fn observers(
    local: &local::Local,
    client: CoordinatorClient<Channel>,
    n: usize,
    s: usize,
) -> Result<Fields, String> {
    let monitor = local
        .monitor_url
        .clone()
        .ok_or("no monitor is running in this process")?;
    let mut plan = String::with_capacity(n * 48);
    plan.push_str("name: bench-observers\ntasks:\n- {id: gate, type: sleep, input: {ms: 2000}}\n");
    for i in 0..n {
        plan.push_str(&format!("- {{id: t{i}, type: noop, depends_on: [gate]}}\n"));
    }
    let mut starter = client.clone();
    let id = start_plan(&mut starter, plan).await?;
    let addr = monitor.trim_start_matches("http://").to_owned();
    let path = format!("/api/executions/{id}/live?records=0");
    let start = Instant::now();
    let mut streams = Vec::with_capacity(s);
    for _ in 0..s {
        let stream = open_live(&addr, &path).await?;
        streams.push(tokio::spawn(observe(stream)));
    }
    let opened_ms = start.elapsed().as_millis();
    let mut latencies = Vec::new();
    let mut since_created = Vec::new();
    let mut omitted = 0u64;
    for stream in streams {
        let watched = stream
            .await
            .map_err(|e| format!("a stream reader failed: {e}"))??;
        latencies.extend(watched.latencies_ms);
        since_created.extend(watched.since_created_ms);
        omitted += watched.omitted;
    }
    let seconds = start.elapsed().as_secs_f64();
    wait_completed(client, id).await?;
    if latencies.is_empty() {
        return Err("no stream received an event".to_owned());
    }
    latencies.sort_unstable();
    since_created.sort_unstable();
    let at = |sorted: &[i64], q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    Ok(vec![
        ("s", json!(s)),
        ("event_p95_ms", json!(at(&latencies, 0.95))),
        ("event_p50_ms", json!(at(&latencies, 0.50))),
        ("event_max_ms", json!(at(&latencies, 1.0))),
        ("created_p95_ms", json!(at(&since_created, 0.95))),
        ("events_per_stream", json!(latencies.len() / s.max(1))),
        ("omitted_per_stream", json!(omitted / s.max(1) as u64)),
        ("streams_open_ms", json!(opened_ms)),
        ("seconds", json!(round(seconds, 3))),
    ])
}

/// The fields a live update is scanned for.
struct Keys {
    appended: memchr::memmem::Finder<'static>,
    created: memchr::memmem::Finder<'static>,
    omitted: memchr::memmem::Finder<'static>,
}

impl Keys {
    fn new() -> Self {
        Self {
            appended: memchr::memmem::Finder::new(b"\"appended_ms\":"),
            created: memchr::memmem::Finder::new(b"\"ts_ms\":"),
            omitted: memchr::memmem::Finder::new(b"\"events_omitted\":"),
        }
    }
}

/// What one live stream saw.
struct Watched {
    /// From each event's append to its arrival.
    latencies_ms: Vec<i64>,
    /// From each event's creation by the coordinator to its arrival.
    since_created_ms: Vec<i64>,
    omitted: u64,
}

/// Opens a live stream as a plain HTTP/1.0 request on its own connection, so the body arrives
/// as bare Server-Sent Events (no chunked encoding), and returns the connection after the
/// response head.
async fn open_live(addr: &str, path: &str) -> Result<(tokio::net::TcpStream, Vec<u8>), String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot reach the monitor at {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nAccept: text/event-stream\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("cannot ask for a live stream: {e}"))?;
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("cannot read the live stream's answer: {e}"))?;
        if n == 0 {
            return Err("the monitor closed the live stream before answering".to_owned());
        }
        received.extend_from_slice(&chunk[..n]);
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&received[..end]).into_owned();
            let status = head.lines().next().unwrap_or_default();
            if !status.contains(" 200 ") {
                return Err(format!("the live stream answered {status}"));
            }
            let rest = received.split_off(end + 4);
            return Ok((stream, rest));
        }
    }
}

/// Reads one live stream to its `end` event. The frames are scanned for their timestamps rather
/// than decoded whole: a thousand readers share this process's two cores with the services, and
/// what is measured is delivery, not JSON decoding.
async fn observe(
    (mut stream, mut buffer): (tokio::net::TcpStream, Vec<u8>),
) -> Result<Watched, String> {
    use tokio::io::AsyncReadExt as _;
    let mut watched = Watched {
        latencies_ms: Vec::new(),
        since_created_ms: Vec::new(),
        omitted: 0,
    };
    let keys = Keys::new();
    let deadline = Duration::from_secs(300);
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        // Every complete frame in the buffer, then what is left of it moved to the front once.
        let mut consumed = 0;
        while let Some(end) = find_frame_end(&buffer[consumed..]) {
            let frame = &buffer[consumed..consumed + end];
            consumed += end + 2;
            if frame.starts_with(b"event: end") {
                return Ok(watched);
            }
            if !frame.starts_with(b"event: update") {
                continue;
            }
            watched.omitted += numbers_after(frame, &keys.omitted).sum::<i64>() as u64;
            let (appended_before, created_before) =
                (watched.latencies_ms.len(), watched.since_created_ms.len());
            watched
                .latencies_ms
                .extend(numbers_after(frame, &keys.appended).map(|t| (now - t).max(0)));
            watched
                .since_created_ms
                .extend(numbers_after(frame, &keys.created).map(|t| (now - t).max(0)));
            if watched.latencies_ms.len() - appended_before
                != watched.since_created_ms.len() - created_before
            {
                return Err("a live update is not what API.md says".to_owned());
            }
        }
        buffer.drain(..consumed);
        let n = match tokio::time::timeout(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) => return Err("a live stream ended before the execution did".to_owned()),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(format!("a live stream broke: {e}")),
            Err(_) => return Err(format!("a live stream was silent for {deadline:?}")),
        };
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// Where the first Server-Sent-Events frame of `bytes` ends (its blank line), if it is complete.
fn find_frame_end(bytes: &[u8]) -> Option<usize> {
    memchr::memmem::find(bytes, b"\n\n")
}

/// The integers that follow each occurrence of the finder's key in `text`.
fn numbers_after<'a>(
    text: &'a [u8],
    key: &'a memchr::memmem::Finder<'a>,
) -> impl Iterator<Item = i64> + 'a {
    key.find_iter(text).filter_map(move |at| {
        let rest = &text[at + key.needle().len()..];
        let digits = rest
            .iter()
            .position(|b| !b.is_ascii_digit())
            .unwrap_or(rest.len());
        std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_end_at_their_blank_line() {
        assert_eq!(find_frame_end(b"event: a\ndata: 1\n\nevent: b"), Some(16));
        assert_eq!(find_frame_end(b"event: a\ndata: 1\n"), None);
        assert_eq!(find_frame_end(b""), None);
    }

    #[test]
    fn frames_are_scanned_for_their_numbers() {
        let frame = br#"event: update
data: {"events":[{"seq":1,"ts_ms":10,"appended_ms":12},{"seq":2,"ts_ms":11,"appended_ms":12}],"events_omitted":7}"#;
        let keys = Keys::new();
        assert_eq!(
            numbers_after(frame, &keys.created).collect::<Vec<_>>(),
            [10, 11]
        );
        assert_eq!(
            numbers_after(frame, &keys.appended).collect::<Vec<_>>(),
            [12, 12]
        );
        assert_eq!(numbers_after(frame, &keys.omitted).collect::<Vec<_>>(), [7]);
    }
}
