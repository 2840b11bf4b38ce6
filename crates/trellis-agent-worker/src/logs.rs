//! Task logs: the lines an attempt writes (`TaskContext::log`, a `shell` command's stdout and
//! stderr) kept in the attempt's buffer and published in batches on
//! `trellis.logs.<execution_id>.<task_instance_id>` (stream `TRELLIS_LOGS`).
//!
//! Writing a line never waits: it joins the attempt's buffer, and a buffer over
//! [`MAX_BUFFERED_BYTES`] drops lines and counts them (the next batch says how many), so a task
//! that floods its log slows down neither itself nor the worker. A line over [`MAX_LINE_BYTES`] is
//! cut and says how long it was. The worker publishes every attempt's buffered lines each
//! [`FLUSH_EVERY`] (what a worker killed mid-task already wrote is kept), and an attempt's last
//! lines before its result, waiting for JetStream to store them: once a result is recorded, its
//! attempt's log is complete.

use std::future::IntoFuture;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream;
use prost::Message as _;
use trellis_proto::{subjects, v1};

use crate::publish::now_unix_ms;
use crate::sdk::{Running, lock};

/// Longest line kept, in bytes; a longer one is cut (at a character boundary) and marked.
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// Most bytes an attempt's buffer holds between two flushes; lines past it are dropped and
/// counted.
pub const MAX_BUFFERED_BYTES: usize = 4 * 1024 * 1024;
/// Most bytes of lines in one published batch.
const MAX_BATCH_BYTES: usize = 256 * 1024;
/// How often buffered lines are published.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// How long an attempt's last lines may take to be stored before its result goes anyway.
const LAST_LINES_WAIT: Duration = Duration::from_secs(2);

/// The lines of one attempt not published yet.
#[derive(Debug, Default)]
pub(crate) struct AttemptLog {
    buffer: Mutex<Buffer>,
    /// Held while a flush takes and publishes, so two flushes of one attempt (the periodic one
    /// and its last one) publish their batches in order.
    publishing: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Buffer {
    lines: Vec<v1::LogLine>,
    bytes: usize,
    /// Lines dropped since the last batch.
    dropped: u64,
    /// Batches published so far.
    batches: u64,
}

impl AttemptLog {
    /// Adds `text` from `source`, one line per line of it.
    pub(crate) fn write(&self, source: v1::LogSource, text: &str) {
        let text = text.strip_suffix('\n').unwrap_or(text);
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            let (kept, cut_from) = cut(line);
            self.push(source, kept.to_owned(), cut_from);
        }
    }

    /// Adds one line, already cut to [`MAX_LINE_BYTES`]; `cut_from` is its length before.
    pub(crate) fn push(&self, source: v1::LogSource, text: String, cut_from: Option<u64>) {
        let mut buffer = lock(&self.buffer);
        if buffer.bytes + text.len() > MAX_BUFFERED_BYTES {
            buffer.dropped += 1;
            return;
        }
        buffer.bytes += text.len();
        buffer.lines.push(v1::LogLine {
            at_unix_ms: now_unix_ms(),
            source: source as i32,
            text,
            cut_from_bytes: cut_from,
        });
    }

    /// True when something waits to be published.
    fn is_empty(&self) -> bool {
        let buffer = lock(&self.buffer);
        buffer.lines.is_empty() && buffer.dropped == 0
    }

    /// Takes what is buffered as batches of at most [`MAX_BATCH_BYTES`] of lines.
    fn take(&self, running: &Running, worker_id: &str) -> Vec<v1::TaskLogBatch> {
        let mut buffer = lock(&self.buffer);
        let lines = std::mem::take(&mut buffer.lines);
        let mut dropped = std::mem::take(&mut buffer.dropped);
        buffer.bytes = 0;
        let mut batches = Vec::new();
        let mut current: Vec<v1::LogLine> = Vec::new();
        let mut bytes = 0;
        let mut seal = |lines: Vec<v1::LogLine>, dropped: &mut u64, buffer: &mut Buffer| {
            buffer.batches += 1;
            batches.push(v1::TaskLogBatch {
                execution_id: running.execution_id.clone(),
                task_instance_id: running.task_instance_id.clone(),
                attempt: running.attempt,
                worker_id: worker_id.to_owned(),
                lines,
                dropped_before: std::mem::take(dropped),
                batch: buffer.batches,
            });
        };
        for line in lines {
            if bytes + line.text.len() > MAX_BATCH_BYTES && !current.is_empty() {
                seal(std::mem::take(&mut current), &mut dropped, &mut buffer);
                bytes = 0;
            }
            bytes += line.text.len();
            current.push(line);
        }
        if !current.is_empty() || dropped > 0 {
            seal(current, &mut dropped, &mut buffer);
        }
        batches
    }
}

/// Cuts `line` to at most [`MAX_LINE_BYTES`] at a character boundary; returns what is kept and,
/// when it was cut, the length it had.
fn cut(line: &str) -> (&str, Option<u64>) {
    if line.len() <= MAX_LINE_BYTES {
        return (line, None);
    }
    let mut end = MAX_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    (&line[..end], Some(line.len() as u64))
}

/// Splits the bytes a command prints into lines for the log: each line at most
/// [`MAX_LINE_BYTES`] (the rest of a longer one is counted, not kept), invalid UTF-8 replaced.
#[derive(Debug, Default)]
pub(crate) struct LineSplitter {
    current: Vec<u8>,
    /// The current line's whole length so far.
    len: u64,
}

impl LineSplitter {
    /// Feeds bytes; each line they complete goes to `emit` with its length before a cut.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(String, Option<u64>)) {
        while let Some(newline) = bytes.iter().position(|b| *b == b'\n') {
            self.take(&bytes[..newline]);
            let (line, cut_from) = self.finish();
            emit(line, cut_from);
            bytes = &bytes[newline + 1..];
        }
        self.take(bytes);
    }

    /// Emits the last line when the output did not end with a line break.
    pub(crate) fn end(&mut self, emit: &mut impl FnMut(String, Option<u64>)) {
        if self.len > 0 {
            let (line, cut_from) = self.finish();
            emit(line, cut_from);
        }
    }

    fn take(&mut self, part: &[u8]) {
        let room = MAX_LINE_BYTES.saturating_sub(self.current.len());
        self.current
            .extend_from_slice(&part[..part.len().min(room)]);
        self.len += part.len() as u64;
    }

    fn finish(&mut self) -> (String, Option<u64>) {
        let mut kept = std::mem::take(&mut self.current);
        let len = std::mem::take(&mut self.len);
        let cut_from = (len > kept.len() as u64).then_some(len);
        if cut_from.is_none() && kept.last() == Some(&b'\r') {
            kept.pop();
        }
        let mut line = String::from_utf8_lossy(&kept).into_owned();
        if cut_from.is_some() {
            // A character split by the cut shows as one replacement character at the end; the
            // text stays within the limit.
            while line.len() > MAX_LINE_BYTES {
                line.pop();
            }
        }
        (line, cut_from)
    }
}

/// Publishes attempts' log lines for one worker.
#[derive(Debug, Clone)]
pub(crate) struct LogPublisher {
    js: jetstream::Context,
    worker_id: String,
}

impl LogPublisher {
    pub(crate) fn new(js: jetstream::Context, worker_id: String) -> LogPublisher {
        LogPublisher { js, worker_id }
    }

    /// Publishes what the attempt buffered. With `last`, waits (at most [`LAST_LINES_WAIT`])
    /// until JetStream stored it: called before the attempt's result is published.
    pub(crate) async fn flush(&self, running: &Running, last: bool) {
        let _publishing = running.log.publishing.lock().await;
        if running.log.is_empty() {
            return;
        }
        // Boxed: most attempts log nothing (see `validate`).
        Box::pin(self.publish(running, last)).await;
    }

    /// Publishes the buffered lines; the caller holds the log's `publishing` lock.
    async fn publish(&self, running: &Running, last: bool) {
        let subject = subjects::logs(&running.execution_id, &running.task_instance_id);
        let mut acks = Vec::new();
        for batch in running.log.take(running, &self.worker_id) {
            match self
                .js
                .publish(subject.clone(), batch.encode_to_vec().into())
                .await
            {
                Ok(ack) => acks.push(ack),
                Err(err) => {
                    tracing::debug!(task_instance_id = %running.task_instance_id, %err, "task log lines not published");
                }
            }
        }
        if last {
            let stored = tokio::time::timeout(
                LAST_LINES_WAIT,
                futures::future::join_all(acks.into_iter().map(IntoFuture::into_future)),
            );
            match stored.await {
                Ok(acks) => {
                    if let Some(Err(err)) = acks.into_iter().find(Result::is_err) {
                        tracing::warn!(task_instance_id = %running.task_instance_id, %err, "the last task log lines were not stored");
                    }
                }
                Err(_) => {
                    tracing::warn!(task_instance_id = %running.task_instance_id, "the last task log lines were not stored in time")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<(String, Option<u64>)> {
        let mut lines = Vec::new();
        let mut splitter = LineSplitter::default();
        let mut emit = |line, cut| lines.push((line, cut));
        for chunk in chunks {
            splitter.feed(chunk, &mut emit);
        }
        splitter.end(&mut emit);
        lines
    }

    #[test]
    fn output_splits_into_lines_across_reads() {
        assert_eq!(
            split(&[b"one\ntw", b"o\r\n", b"\nlast"]),
            vec![
                ("one".to_owned(), None),
                ("two".to_owned(), None),
                (String::new(), None),
                ("last".to_owned(), None),
            ]
        );
        assert_eq!(split(&[b"ends\n"]), vec![("ends".to_owned(), None)]);
    }

    #[test]
    fn a_line_over_the_limit_is_cut_and_says_how_long_it_was() {
        let long = vec![b'x'; MAX_LINE_BYTES * 3 + 5];
        let lines = split(&[&long[..10_000], &long[10_000..], b"\nnext\n"]);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].0.len(), MAX_LINE_BYTES);
        assert_eq!(lines[0].1, Some((MAX_LINE_BYTES * 3 + 5) as u64));
        assert_eq!(lines[1], ("next".to_owned(), None));
        // A multi-byte character across the cut does not push the line past the limit.
        let mut text = "é".repeat(MAX_LINE_BYTES);
        let (kept, cut_from) = cut(&text);
        assert!(kept.len() <= MAX_LINE_BYTES && kept.len() % 2 == 0);
        assert_eq!(cut_from, Some(text.len() as u64));
        text.truncate(0);
    }

    #[test]
    fn a_flood_is_dropped_and_counted_not_buffered() {
        let log = AttemptLog::default();
        let line = "y".repeat(1024);
        for _ in 0..(MAX_BUFFERED_BYTES / 1024 + 100) {
            log.write(v1::LogSource::Stdout, &line);
        }
        let buffer = lock(&log.buffer);
        assert_eq!(buffer.lines.len(), MAX_BUFFERED_BYTES / 1024);
        assert_eq!(buffer.dropped, 100);
    }
}
