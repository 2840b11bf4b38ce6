//! Measures how many `noop` tasks per second one worker turns into stored results, against a
//! `nats-server -js` it starts itself: `cargo run -p trellis-agent-worker --example
//! noop_throughput -- [n_tasks] [slots]`.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use prost::Message as _;
use trellis_agent_worker::v1::TaskAssignment;
use trellis_agent_worker::{CancellationToken, Config, HandlerRegistry};
use trellis_proto::subjects;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let n_tasks: usize = args.next().map_or(Ok(20_000), |arg| arg.parse())?;
    let slots: usize = args.next().map_or(Ok(16), |arg| arg.parse())?;
    let server = trellis_testkit::NatsServer::start()?;
    let client = async_nats::connect(server.url()).await?;
    let js = jetstream::new(client.clone());
    trellis_bus::ensure_streams(&js, 1).await?;

    let publish_started = Instant::now();
    let mut acks = Vec::with_capacity(n_tasks);
    for task_idx in 0..n_tasks {
        let assignment = TaskAssignment {
            execution_id: "bench".to_owned(),
            task_instance_id: format!("task-{task_idx}"),
            task_type: "noop".to_owned(),
            queue: "noop".to_owned(),
            input: b"{\"n\":1}".to_vec(),
            attempt: 1,
            ..TaskAssignment::default()
        };
        acks.push(
            js.publish(subjects::tasks("noop"), assignment.encode_to_vec().into())
                .await?,
        );
        // Await acks in chunks: the JetStream context bounds publishes awaiting their ack.
        if acks.len() == 1000 {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks {
        ack.await?;
    }
    println!(
        "published {n_tasks} tasks in {:?}",
        publish_started.elapsed()
    );

    let shutdown = CancellationToken::new();
    let config = Config {
        queues: vec!["noop".to_owned()],
        slots,
        ..Config::new(server.url())
    };
    let started = Instant::now();
    let worker = tokio::spawn(trellis_agent_worker::run(
        config,
        HandlerRegistry::with_builtins(),
        shutdown.clone(),
    ));
    // A task message is acknowledged (and leaves the work queue) once its result is stored;
    // results may share messages, so the emptied queue is what says they all are.
    let mut stream = js.get_stream(subjects::TASKS_STREAM).await?;
    loop {
        let info = stream.info().await?;
        if info.state.messages == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    println!(
        "{n_tasks} noop results stored in {elapsed:?}: {:.0} tasks/s (slots {slots})",
        n_tasks as f64 / elapsed.as_secs_f64()
    );
    shutdown.cancel();
    worker.await??;
    Ok(())
}
