//! `trellis-agent-worker --drain`: asks the worker named by `--worker-id`, running in another
//! process (in Kubernetes, the pod's own worker, from its `preStop` hook), to drain, and returns
//! once it has exited, so the SIGTERM that follows finds it idle. The request is the `DrainWorker`
//! of `trellis drain` (`trellis.workers.drain.<id>`); the worker's heartbeats tell when it is done.

use futures::StreamExt as _;
use prost::Message as _;
use trellis_bus::{HEARTBEAT_INTERVAL, NatsOptions};
use trellis_proto::{subjects, v1};

use crate::Error;

/// Heartbeats missed before the worker is taken to have exited.
const SILENT_BEATS: u32 = 3;

/// Sends the drain request and waits until the worker says it terminated, or falls silent.
pub(crate) async fn drain_and_wait(nats: &NatsOptions, worker_id: &str) -> Result<(), Error> {
    let client =
        trellis_bus::connect_with(nats, &format!("trellis-agent-worker --drain {worker_id}"))
            .await?;
    let subject = subjects::heartbeat(worker_id);
    let mut beats = client
        .subscribe(subject.clone())
        .await
        .map_err(|source| Error::Subscribe { subject, source })?;
    let request = v1::DrainWorker {
        worker_id: worker_id.to_owned(),
        reason: "preStop: the pod is stopping".to_owned(),
    };
    let publish = client
        .publish(subjects::drain(worker_id), request.encode_to_vec().into())
        .await;
    if let Err(error) = publish
        .map_err(|e| e.to_string())
        .and(client.flush().await.map_err(|e| e.to_string()))
    {
        return Err(Error::Config(format!(
            "cannot send the drain request: {error}"
        )));
    }
    eprintln!("trellis-agent-worker: asked worker {worker_id} to drain; waiting for it to exit");
    let silence = HEARTBEAT_INTERVAL * SILENT_BEATS;
    loop {
        match tokio::time::timeout(silence, beats.next()).await {
            Ok(Some(message)) => {
                let Ok(beat) = v1::WorkerHeartbeat::decode(message.payload.as_ref()) else {
                    continue;
                };
                if beat.state == v1::WorkerState::Terminated as i32 {
                    eprintln!("trellis-agent-worker: worker {worker_id} drained and stopped");
                    return Ok(());
                }
                eprintln!(
                    "trellis-agent-worker: worker {worker_id} drains: {} tasks running",
                    beat.running.len()
                );
            }
            Ok(None) => return Ok(()),
            Err(_) => {
                eprintln!(
                    "trellis-agent-worker: no heartbeat from {worker_id} for {} s; it has stopped",
                    silence.as_secs()
                );
                return Ok(());
            }
        }
    }
}
