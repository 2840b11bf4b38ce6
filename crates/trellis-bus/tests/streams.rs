//! Stream creation is idempotent and safe when several services start at once.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_starting_together_agree_on_the_streams() {
    for _ in 0..5 {
        let nats = trellis_testkit::NatsServer::start()
            .expect("a nats-server (apt-get install nats-server)");
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let url = nats.url();
            tasks.push(tokio::spawn(async move {
                let client = trellis_bus::connect(&url, "test").await.expect("connect");
                let js = async_nats::jetstream::new(client);
                trellis_bus::ensure_streams(&js)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }));
        }
        for task in tasks {
            let result = task.await.expect("task");
            assert!(result.is_ok(), "{result:?}");
        }
    }
}
