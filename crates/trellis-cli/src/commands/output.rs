//! `trellis output`: one task's output, read from its record and, when it was stored by
//! reference, fetched from the outputs bucket (`GetTaskOutput`) and checked against the
//! reference's size and SHA-256.

use std::collections::BTreeSet;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;
use tonic::Code;
use trellis_bus::OutputRef;
use trellis_proto::v1::{self, GetTaskOutputRequest};

use super::Failure;
use crate::client::Coordinator;

/// Print a task's output, fetching it when it was stored by reference.
///
/// Outputs larger than the worker's inline limit (256 KiB by default) are kept in the JetStream
/// Object Store bucket `trellis_outputs`; the task's record holds a reference with the size and
/// the SHA-256, and this command reads the bytes back and checks both. A plan task id picks its
/// last completed instance; a task instance id picks that instance.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    trellis output 0190a5c4-7d1e-7000-8000-000000000001 build\n  \
    trellis output 0190a5c4-7d1e-7000-8000-000000000001 build -o build.json\n  \
    trellis output --reference 0190a5c4-7d1e-7000-8000-000000000001 build")]
pub struct OutputArgs {
    /// The execution id.
    pub execution_id: String,
    /// The task: a plan task id or a task instance id.
    pub task: String,
    /// Write the output's bytes to FILE instead of stdout.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print where the output is stored (bucket, object, size, SHA-256) instead of the output;
    /// fails for an output kept inline.
    #[arg(long)]
    pub reference: bool,
}

pub async fn run(coordinator_url: &str, args: OutputArgs) -> Result<(), Failure> {
    let mut coordinator = Coordinator::connect(coordinator_url).await?;
    let what = format!("execution {}", args.execution_id);
    let graph = coordinator.graph(&args.execution_id, 0).await?;
    let name = coordinator.execution(&args.execution_id).await?.name;
    // The graph's first root is a record named after the plan that stands for the execution
    // itself: it has no output and is not a task of the plan.
    let root = graph.root_indices.first().copied();
    let records: Vec<v1::TaskInstance> = graph
        .nodes
        .into_iter()
        .enumerate()
        .filter_map(|(idx, node)| {
            let record = node.record?;
            let is_root = root == Some(idx as u32) && record.task_id == name;
            (!is_root).then_some(record)
        })
        .collect();
    let output = pick(&records, &args.task, &what)?;
    let reference = OutputRef::from_output(output);
    if args.reference {
        let Some(reference) = reference else {
            return Err(Failure::failed(format!(
                "the output of {} is kept inline ({} bytes), not by reference",
                args.task,
                output.len()
            )));
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&reference.to_value()).unwrap_or_default()
        );
        return Ok(());
    }
    let bytes = match reference {
        None => output.to_vec(),
        Some(reference) => fetch(&mut coordinator, &args.execution_id, &reference, &what).await?,
    };
    match &args.output {
        Some(path) => std::fs::write(path, &bytes).map_err(|error| {
            Failure::failed(format!("cannot write {}: {error}", path.display()))
        })?,
        None => {
            let mut out = io::stdout().lock();
            let pretty = io::stdout().is_terminal() && bytes.len() <= 1024 * 1024;
            match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Ok(value) if pretty => {
                    writeln!(
                        out,
                        "{}",
                        serde_json::to_string_pretty(&value).unwrap_or_default()
                    )?;
                }
                _ => {
                    out.write_all(&bytes)?;
                    writeln!(out)?;
                }
            }
            out.flush()?;
        }
    }
    Ok(())
}

/// Returns the output of the instance `task` names: a task instance id, or the last completed
/// instance of a plan task.
fn pick<'a>(records: &'a [v1::TaskInstance], task: &str, what: &str) -> Result<&'a [u8], Failure> {
    let of_task: Vec<&v1::TaskInstance> = records
        .iter()
        .filter(|record| record.task_instance_id == task || record.task_id == task)
        .collect();
    if of_task.is_empty() {
        let known: BTreeSet<&str> = records
            .iter()
            .map(|record| record.task_id.as_str())
            .collect();
        return Err(Failure::bad_input(format!(
            "{what} has no task {task:?} (its tasks: {})",
            known.into_iter().collect::<Vec<_>>().join(", ")
        )));
    }
    of_task
        .iter()
        .filter(|record| record.state == v1::TaskState::Completed as i32)
        .filter_map(|record| {
            let output = record.output.as_deref()?;
            Some((record.ended_at_unix_ms.unwrap_or(0), output))
        })
        .max_by_key(|(ended, _)| *ended)
        .map(|(_, output)| output)
        .ok_or_else(|| {
            let states: BTreeSet<&str> = of_task
                .iter()
                .map(|record| {
                    v1::TaskState::try_from(record.state)
                        .map_or("unknown", |state| state.as_str_name())
                })
                .collect();
            Failure::failed(format!(
                "task {task:?} of {what} has no output yet (its state: {})",
                states
                    .into_iter()
                    .map(|state| state.trim_start_matches("TASK_STATE_").to_ascii_lowercase())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// Streams the object `reference` names and checks its size and checksum on arrival.
async fn fetch(
    coordinator: &mut Coordinator,
    execution_id: &str,
    reference: &OutputRef,
    what: &str,
) -> Result<Vec<u8>, Failure> {
    let request = GetTaskOutputRequest {
        execution_id: execution_id.to_owned(),
        reference: Some(reference.to_proto()),
    };
    let failure = |coordinator: &Coordinator, status: &tonic::Status| match status.code() {
        // The message names the object and why it cannot be read.
        Code::NotFound | Code::DataLoss => Failure::failed(status.message().to_owned()),
        _ => coordinator.status_failure(status, what),
    };
    let mut stream = match coordinator.client.get_task_output(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Err(failure(coordinator, &status)),
    };
    let mut bytes = Vec::with_capacity(usize::try_from(reference.size).unwrap_or(0));
    loop {
        match stream.message().await {
            Ok(Some(item)) => bytes.extend_from_slice(&item.chunk),
            Ok(None) => break,
            Err(status) => return Err(failure(coordinator, &status)),
        }
    }
    let sha256 = trellis_bus::sha256_hex(&bytes);
    if bytes.len() as u64 != reference.size || sha256 != reference.sha256 {
        return Err(Failure::failed(format!(
            "output object {} arrived damaged: {} bytes with SHA-256 {sha256}, the reference \
             says {} bytes with {}",
            reference.location(),
            bytes.len(),
            reference.size,
            reference.sha256
        )));
    }
    Ok(bytes)
}
