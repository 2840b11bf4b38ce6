//! `trellis logs`: task log lines as text (one line each, with the time, the task and attempt,
//! and where the line came from) and as JSON (one object per line).

use serde_json::{Value, json};
use trellis_proto::v1::{LogLine, LogSource, TaskLogBatch};

/// A line's time of day (UTC) with milliseconds: `14:03:07.125`.
fn time_of_day(unix_ms: i64) -> String {
    let ms = unix_ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// The short name of a line's source.
fn source_name(source: i32) -> &'static str {
    LogSource::label_of(source)
}

/// The text lines of one batch: `14:03:07.125 build#1 stdout| compiling`, a cut line ending
/// in `… [cut from N bytes]`, and a note before them when lines were dropped.
pub fn text(batch: &TaskLogBatch, task: &str) -> Vec<String> {
    let who = format!("{task}#{}", batch.attempt);
    let mut out = Vec::with_capacity(batch.lines.len() + 1);
    if batch.dropped_before > 0 {
        let at = batch.lines.first().map_or(0, |line| line.at_unix_ms);
        out.push(format!(
            "{} {who} ------| {} lines dropped here: the task wrote faster than its worker could publish",
            time_of_day(at),
            batch.dropped_before
        ));
    }
    for line in &batch.lines {
        let mut text = format!(
            "{} {who} {:>6}| {}",
            time_of_day(line.at_unix_ms),
            source_name(line.source),
            line.text
        );
        if let Some(length) = line.cut_from_bytes {
            text.push_str(&format!(" … [cut from {length} bytes]"));
        }
        out.push(text);
    }
    out
}

/// The JSON objects of one batch, one per line (and one `{"dropped": n}` before them when lines
/// were dropped).
pub fn json(batch: &TaskLogBatch, task: &str) -> Vec<Value> {
    let common = |extra: Value| {
        let mut object = json!({
            "execution_id": batch.execution_id,
            "task_instance_id": batch.task_instance_id,
            "task_id": task,
            "attempt": batch.attempt,
            "worker_id": batch.worker_id,
        });
        if let (Some(object), Value::Object(extra)) = (object.as_object_mut(), extra) {
            object.extend(extra);
        }
        object
    };
    let mut out = Vec::with_capacity(batch.lines.len() + 1);
    if batch.dropped_before > 0 {
        out.push(common(json!({ "dropped": batch.dropped_before })));
    }
    out.extend(batch.lines.iter().map(|line: &LogLine| {
        common(json!({
            "at_unix_ms": line.at_unix_ms,
            "source": source_name(line.source),
            "text": line.text,
            "cut_from_bytes": line.cut_from_bytes,
        }))
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> TaskLogBatch {
        TaskLogBatch {
            execution_id: "e".to_owned(),
            task_instance_id: "i".to_owned(),
            attempt: 2,
            worker_id: "w".to_owned(),
            lines: vec![
                LogLine {
                    at_unix_ms: 1_764_338_587_125,
                    source: LogSource::Stdout as i32,
                    text: "compiling".to_owned(),
                    cut_from_bytes: None,
                },
                LogLine {
                    at_unix_ms: 1_764_338_587_126,
                    source: LogSource::Stderr as i32,
                    text: "xxxx".to_owned(),
                    cut_from_bytes: Some(40_000),
                },
            ],
            dropped_before: 3,
            batch: 1,
        }
    }

    #[test]
    fn text_lines_name_time_task_attempt_and_source() {
        assert_eq!(
            text(&batch(), "build"),
            vec![
                "14:03:07.125 build#2 ------| 3 lines dropped here: the task wrote faster than its worker could publish",
                "14:03:07.125 build#2 stdout| compiling",
                "14:03:07.126 build#2 stderr| xxxx … [cut from 40000 bytes]",
            ]
        );
    }

    #[test]
    fn json_objects_carry_everything() {
        let objects = json(&batch(), "build");
        assert_eq!(objects.len(), 3);
        assert_eq!(objects[0]["dropped"], 3);
        assert_eq!(objects[2]["source"], "stderr");
        assert_eq!(objects[2]["cut_from_bytes"], 40_000);
        assert_eq!(objects[1]["task_id"], "build");
        assert_eq!(objects[1]["worker_id"], "w");
        assert_eq!(objects[1]["at_unix_ms"], 1_764_338_587_125_i64);
    }
}
