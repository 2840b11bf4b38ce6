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
                trellis_bus::ensure_streams(&js, 1)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_starting_together_agree_on_the_steps_bucket() -> anyhow::Result<()> {
    let nats = trellis_testkit::NatsServer::start()?;
    let client = trellis_bus::connect(&nats.url(), "test").await?;
    let js = async_nats::jetstream::new(client);
    assert!(
        trellis_bus::steps_bucket(&js).await.is_err(),
        "the bucket exists before anyone created it"
    );
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let js = js.clone();
        tasks.push(tokio::spawn(async move {
            trellis_bus::ensure_steps_bucket(&js, 1)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }));
    }
    for task in tasks {
        let result = task.await?;
        assert!(result.is_ok(), "{result:?}");
    }
    let store = trellis_bus::steps_bucket(&js).await?;
    store.put("instance", "steps".into()).await?;
    let status = store.status().await?;
    assert_eq!(status.history(), 1);
    assert_eq!(status.max_age(), trellis_bus::STEPS_MAX_AGE);
    assert_eq!(
        store.get("instance").await?.as_deref(),
        Some(b"steps".as_slice())
    );
    Ok(())
}
